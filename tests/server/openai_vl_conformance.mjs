// Drives a crescent vision-language server with the official `openai` npm client: an image
// chat (whole and streamed, same text), two images in one message, and a refused image.
// Exits non-zero on the first mismatch.
// Usage: node openai_vl_conformance.mjs BASE_URL MODEL PNG_A PNG_B
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../tools/npm/package.json"));
const OpenAI = require("openai").default ?? require("openai");

const [baseURL, model, pngA, pngB] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL:", what);
    process.exit(1);
  }
  console.log("ok:", what);
}
const dataUrl = (file) => "data:image/png;base64," + fs.readFileSync(file).toString("base64");
const imagePart = (file) => ({ type: "image_url", image_url: { url: dataUrl(file) } });

const messages = [{ role: "user", content: [imagePart(pngA), { type: "text", text: "Describe it." }] }];
const whole = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, ignore_eos: true,
});
check(whole.choices[0].message.role === "assistant", "image chat: assistant message");
check(whole.usage.completion_tokens === 8, "image chat: 8 completion tokens");

let streamed = "";
let usage = null;
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.choices.length > 0 && chunk.choices[0].delta.content) streamed += chunk.choices[0].delta.content;
  if (chunk.usage) usage = chunk.usage;
}
check(streamed === whole.choices[0].message.content, "image chat: streamed text equals whole");
check(usage && usage.prompt_tokens === whole.usage.prompt_tokens, "image chat: streamed usage");

const two = await client.chat.completions.create({
  model, max_tokens: 4, temperature: 0, ignore_eos: true,
  messages: [{ role: "user", content: [imagePart(pngA), imagePart(pngB), { type: "text", text: "Compare." }] }],
});
check(two.usage.prompt_tokens > whole.usage.prompt_tokens, "two images: more prompt tokens");

try {
  await client.chat.completions.create({
    model, max_tokens: 4,
    messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } }] }],
  });
  check(false, "undecodable image refused");
} catch (e) {
  check(e.status === 400, "undecodable image: 400 (" + e.message + ")");
}
console.log("openai vl conformance: ok");
