// --api-key through the official `openai` npm client (tools/npm), against `crescent proxy`
// (or any crescent server) started with a key. Exits non-zero on the first mismatch.
// Usage: node openai_api_key.mjs BASE_URL MODEL KEY
//   with KEY: completions and chat, whole and streamed, and models.list succeed;
//   with a wrong key: every call fails with the client's AuthenticationError (401).
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../tools/npm/package.json"));
const OpenAI = require("openai").default ?? require("openai");

const [baseURL, model, key] = process.argv.slice(2);

function check(cond, what) {
  if (!cond) {
    console.error("FAIL:", what);
    process.exit(1);
  }
  console.log("ok:", what);
}

const good = new OpenAI({ baseURL, apiKey: key, maxRetries: 0, timeout: 60_000 });
const completion = await good.completions.create({
  model, prompt: "The capital of France is", max_tokens: 4, temperature: 0,
});
check(completion.choices.length === 1 && typeof completion.choices[0].text === "string",
  "completion with the key");
const chat = await good.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 4, temperature: 0,
  ignore_eos: true,
});
check(chat.choices[0].message.role === "assistant", "chat with the key");
let text = "";
let usage = null;
const stream = await good.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 4, temperature: 0,
  ignore_eos: true, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? "";
  usage = chunk.usage ?? usage;
}
check(usage !== null && usage.completion_tokens === 4, "streamed chat with the key");
check(text === chat.choices[0].message.content, "streamed text equals the whole one");
const models = await good.models.list();
check(models.data.some((m) => m.id === model), "models.list with the key");

const bad = new OpenAI({ baseURL, apiKey: key + "-wrong", maxRetries: 0, timeout: 60_000 });
for (const [what, call] of [
  ["completion", () => bad.completions.create({ model, prompt: "x", max_tokens: 1 })],
  ["chat", () => bad.chat.completions.create({ model, messages: [{ role: "user", content: "x" }] })],
  ["models.list", () => bad.models.list()],
]) {
  let error = null;
  try {
    await call();
  } catch (e) {
    error = e;
  }
  check(error instanceof OpenAI.AuthenticationError && error.status === 401,
    `${what} with a wrong key is an AuthenticationError (got ${error?.constructor?.name} ${error?.status})`);
  check(!String(error.message).includes(key), `${what}: the key is not in the message`);
}
console.log("openai api key: ok");
