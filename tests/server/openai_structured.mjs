// Structured output with the official `openai` npm client, validated by an independent JSON
// Schema validator (ajv). Exits non-zero on the first mismatch.
// Usage: node openai_structured.mjs BASE_URL MODEL
// Against `crescent serve` on a random-weight model, which on its own writes no JSON at all:
//   - 50 prompts of random words, sampled (temperature 1, a seed each), with
//     response_format json_schema: every answer stops by itself, parses, and validates;
//   - the same with json_object (any JSON object) on 10 of them;
//   - streamed answers equal whole ones for the same seed.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../tools/npm/package.json"));
const OpenAI = require("openai").default ?? require("openai");
const Ajv = require("ajv").default ?? require("ajv");

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL:", what);
    process.exit(1);
  }
}

// Bounded strings and arrays keep a random model's answers short enough to finish.
const schema = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 12 },
    age: { type: "integer" },
    score: { type: "number" },
    active: { type: "boolean" },
    role: { enum: ["admin", "user", "guest"] },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
    address: {
      type: "object",
      properties: { city: { type: "string", maxLength: 10 }, zip: { type: ["integer", "null"] } },
      required: ["city"],
      additionalProperties: false,
    },
  },
  required: ["name", "age", "active", "role", "address"],
  additionalProperties: false,
};
const validate = new Ajv({ strict: true }).compile(schema);

// A deterministic word salad per prompt (xorshift), so a failure can be replayed.
const words = ["tell", "me", "about", "a", "person", "city", "blue", "record", "json", "please",
  "quickly", "what", "is", "the", "name", "of", "river", "seven", "data", "form"];
function prompt(i) {
  let x = 2463534242 + i * 97;
  const out = [];
  for (let k = 0; k < 6 + (i % 9); ++k) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    out.push(words[x % words.length]);
  }
  return out.join(" ");
}

const responseFormat = { type: "json_schema", json_schema: { name: "person", schema } };
let tokens = 0;
for (let i = 0; i < 50; ++i) {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: prompt(i) }], response_format: responseFormat,
    max_tokens: 400, temperature: 1, seed: i,
  });
  const choice = r.choices[0];
  check(choice.finish_reason === "stop",
        `prompt ${i}: the answer stops by itself (finish_reason ${choice.finish_reason})`);
  let value;
  try {
    value = JSON.parse(choice.message.content);
  } catch (e) {
    check(false, `prompt ${i}: the answer parses: ${e.message}: ${choice.message.content}`);
  }
  check(validate(value),
        `prompt ${i}: the answer validates: ${JSON.stringify(validate.errors)}: ` +
          choice.message.content);
  tokens += r.usage.completion_tokens;
  if (i < 3) {
    let streamed = "";
    const s = await client.chat.completions.create({
      model, messages: [{ role: "user", content: prompt(i) }], response_format: responseFormat,
      max_tokens: 400, temperature: 1, seed: i, stream: true,
    });
    for await (const chunk of s) streamed += chunk.choices[0]?.delta.content ?? "";
    check(streamed === choice.message.content, `prompt ${i}: streamed equals whole`);
  }
}
console.log(`ok: 50 json_schema answers parse and validate (${tokens} tokens)`);

for (let i = 0; i < 10; ++i) {
  const r = await client.chat.completions.create({
    model, messages: [{ role: "user", content: prompt(100 + i) }],
    response_format: { type: "json_object" }, max_tokens: 60, temperature: 1, seed: i,
  });
  const text = r.choices[0].message.content;
  if (r.choices[0].finish_reason === "stop") {
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      check(false, `json_object ${i}: parses: ${e.message}: ${text}`);
    }
    check(value !== null && typeof value === "object" && !Array.isArray(value),
          `json_object ${i}: an object`);
  } else {
    // Cut by max_tokens: an unbounded object need not end; what there is must be a prefix.
    check(text.trimStart().startsWith("{"), `json_object ${i}: starts an object: ${text}`);
  }
}
console.log("ok: json_object answers are objects");
console.log("openai structured: ok");
