// Drives a crescent server with the official `openai` npm client (tools/npm): completions,
// chat, streaming of both, models, and an error case. Exits non-zero on the first mismatch.
// Usage: node openai_conformance.mjs BASE_URL MODEL
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../tools/npm/package.json"));
const OpenAI = require("openai").default ?? require("openai");

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL:", what);
    process.exit(1);
  }
  console.log("ok:", what);
}

const models = await client.models.list();
check(models.data.some((m) => m.id === model), `models.list has ${model}`);

const completion = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 8, temperature: 0, ignore_eos: true,
});
check(completion.object === "text_completion", "completion object");
check(completion.usage.completion_tokens === 8, "completion usage.completion_tokens = 8");
check(completion.choices[0].finish_reason === "length", "completion finish_reason length");

let streamed = "";
let usage = null;
const cstream = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 8, temperature: 0, ignore_eos: true,
  stream: true, stream_options: { include_usage: true },
});
for await (const chunk of cstream) {
  if (chunk.choices.length > 0) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
check(streamed === completion.choices[0].text, "streamed completion text equals whole text");
check(usage && usage.completion_tokens === 8, "streamed completion usage");

const messages = [{ role: "user", content: "Say something." }];
const chat = await client.chat.completions.create({
  model, messages, max_completion_tokens: 6, temperature: 0, ignore_eos: true,
});
check(chat.object === "chat.completion", "chat object");
check(chat.choices[0].message.role === "assistant", "chat message role");
check(chat.usage.completion_tokens === 6, "chat usage.completion_tokens = 6");

let chatText = "";
const chstream = await client.chat.completions.create({
  model, messages, max_completion_tokens: 6, temperature: 0, ignore_eos: true, stream: true,
});
let finish = null;
for await (const chunk of chstream) {
  const c = chunk.choices[0];
  if (c?.delta?.content) chatText += c.delta.content;
  if (c?.finish_reason) finish = c.finish_reason;
}
check(chatText === chat.choices[0].message.content, "streamed chat text equals whole text");
check(finish === "length", "streamed chat finish_reason length");

try {
  await client.completions.create({ model, prompt: "x", max_tokens: -5 });
  check(false, "negative max_tokens is refused");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError, `negative max_tokens -> BadRequestError (${e.status})`);
  check(typeof e.message === "string" && e.message.includes("max_tokens"), "error message names max_tokens");
}
try {
  await client.chat.completions.create({ model: "no-such-model", messages });
  check(false, "unknown model is refused");
} catch (e) {
  check(e instanceof OpenAI.NotFoundError, `unknown model -> NotFoundError (${e.status})`);
}
console.log("openai conformance: ok");
