// Drives a crescent server with the official `openai` npm client (tools/npm): completions,
// chat, streaming of both, models, n = 3, best_of, guided_regex, logit_bias, min_tokens, and
// error cases. Exits non-zero on the first mismatch.
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

// n = 3: three choices indexed 0..2, usage summing their tokens; sampled with a seed they
// differ (choice i samples with seed + i, as vLLM); greedy they are equal.
const three = await client.chat.completions.create({
  model, messages, max_completion_tokens: 6, temperature: 1, seed: 7, n: 3, ignore_eos: true,
});
check(three.choices.length === 3 && three.choices.every((c, i) => c.index === i),
      "n=3: three choices indexed 0, 1, 2");
check(three.usage.completion_tokens === 18, "n=3: usage.completion_tokens = 3 x 6");
const texts = three.choices.map((c) => c.message.content);
check(new Set(texts).size > 1, "n=3 sampled with a seed: the choices differ");
const greedy = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 8, temperature: 0, n: 3, ignore_eos: true,
});
check(greedy.choices.every((c) => c.text === completion.choices[0].text),
      "n=3 greedy: every choice equals the n=1 answer");
const byIndex = ["", "", ""];
const finishes = [null, null, null];
const nstream = await client.chat.completions.create({
  model, messages, max_completion_tokens: 6, temperature: 1, seed: 7, n: 3, ignore_eos: true,
  stream: true,
});
for await (const chunk of nstream) {
  for (const c of chunk.choices) {
    byIndex[c.index] += c.delta?.content ?? "";
    if (c.finish_reason) finishes[c.index] = c.finish_reason;
  }
}
check(byIndex.every((t) => t.length > 0) && new Set(byIndex).size > 1
      && finishes.every((f) => f === "length"),
      "n=3 streamed: every index gets its own text and one finish_reason");

// best_of = 4, n = 2: the two of n = 4's choices (same seed: choice i samples with seed + i)
// with the highest cumulative logprob, best first, and usage counting only those two.
const sampled = { model, prompt: "Once upon a time", max_tokens: 6, temperature: 1, seed: 11,
                  ignore_eos: true, logprobs: 0 };
const four = await client.completions.create({ ...sampled, n: 4 });
const ranked = four.choices
    .map((c) => ({ text: c.text, sum: c.logprobs.token_logprobs.reduce((a, b) => a + b, 0) }))
    .sort((a, b) => b.sum - a.sum);
const best = await client.completions.create({ ...sampled, n: 2, best_of: 4 });
check(best.choices.length === 2 && best.choices.every((c, i) => c.index === i),
      "best_of=4 n=2: two choices indexed 0, 1");
check(best.choices[0].text === ranked[0].text && best.choices[1].text === ranked[1].text,
      "best_of=4 n=2: the two highest cumulative logprobs of the four, best first");
check(best.usage.completion_tokens === 12, "best_of=4 n=2: usage counts the two returned");

// guided_regex (vLLM's): every sampled answer matches the whole pattern and stops by itself.
for (let seed = 0; seed < 8; ++seed) {
  const r = await client.completions.create({
    model, prompt: "Code:", max_tokens: 20, temperature: 1, seed,
    guided_regex: "[a-z]{3}-\\d{2,4}(!|\\?)",
  });
  const text = r.choices[0].text;
  check(/^[a-z]{3}-\d{2,4}(!|\?)$/.test(text) && r.choices[0].finish_reason === "stop",
        `guided_regex seed ${seed}: ${JSON.stringify(text)} matches and stops`);
}

// logit_bias: +100 on one token makes greedy decoding write only it.
const tokenized = await fetch(baseURL.replace(/\/v1$/, "") + "/tokenize", {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, prompt: " fox" }),
}).then((r) => r.json());
const fox = tokenized.tokens[tokenized.tokens.length - 1];
const biased = await client.completions.create({
  model, prompt: "The quick brown", max_tokens: 4, temperature: 0, ignore_eos: true,
  logit_bias: { [fox]: 100 },
});
const detok = await fetch(baseURL.replace(/\/v1$/, "") + "/detokenize", {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, tokens: [fox, fox, fox, fox] }),
}).then((r) => r.json());
check(biased.choices[0].text === detok.prompt, "logit_bias +100: greedy writes only that token");

// min_tokens: with EOS pushed up by logit_bias the answer is EOS at once; min_tokens 5 holds
// EOS back for exactly 5 tokens.
const eos = (await fetch(baseURL.replace(/\/v1$/, "") + "/tokenize", {
  method: "POST", headers: { "Content-Type": "application/json" },
  body: JSON.stringify({ model, prompt: "<|endoftext|>" }),
}).then((r) => r.json())).tokens[0];
const eager = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 12, temperature: 0, logit_bias: { [eos]: 100 },
});
check(eager.usage.completion_tokens === 1 && eager.choices[0].finish_reason === "stop",
      "logit_bias on EOS: the answer stops at once");
const minTokens = await client.completions.create({
  model, prompt: "The quick brown fox", max_tokens: 12, temperature: 0, logit_bias: { [eos]: 100 },
  min_tokens: 5,
});
// EOS counts as a generated token (as in vLLM): 5 tokens, then EOS.
check(minTokens.usage.completion_tokens === 6 && minTokens.choices[0].finish_reason === "stop",
      "min_tokens 5: EOS waits for 5 tokens");

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
