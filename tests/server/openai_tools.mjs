// Tool calling with the official `openai` npm client (tools/npm). Exits non-zero on the first
// mismatch.
// Usage: node openai_tools.mjs BASE_URL MODEL scripted|real|disabled
//   scripted: a server whose engine answers a prompt with "weather" in it with two hermes
//             <tool_call> blocks after "Let me check.\n" (openai_tools_node_test.cc); the calls
//             must come back as tool_calls, whole and streamed (raw chunks and the client's
//             own stream helper), and a round trip with the tool's result must work.
//   real:     `crescent serve --enable-auto-tool-choice --tool-call-parser hermes` on a
//             random-weight model: tools are accepted and its words come back as content.
//   disabled: a server without the flags: tools with tool_choice "auto" are a 400 naming
//             the flags, "none" is accepted, and a named function and "required" (guided
//             decoding, no parser needed) give calls whose arguments follow the schema.
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../../tools/npm/package.json"));
const OpenAI = require("openai").default ?? require("openai");

const [baseURL, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL:", what);
    process.exit(1);
  }
  console.log("ok:", what);
}

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {} } } },
];
const messages = [{ role: "user", content: "what is the weather in Zürich" }];

function checkCalls(calls, what) {
  check(Array.isArray(calls) && calls.length === 2, `${what}: two tool_calls`);
  check(calls[0].type === "function" && calls[0].id.startsWith("chatcmpl-tool-"),
        `${what}: call id and type`);
  check(calls[0].function.name === "get_weather", `${what}: first call's name`);
  const args = JSON.parse(calls[0].function.arguments);
  check(args.city === "Zürich" && args.days[1] === 2, `${what}: first call's arguments`);
  check(calls[1].function.name === "get_time" && calls[1].function.arguments === "{}",
        `${what}: second call`);
  check(calls[0].id !== calls[1].id, `${what}: distinct ids`);
}

if (mode === "scripted") {
  const whole = await client.chat.completions.create({ model, messages, tools, max_tokens: 50 });
  const choice = whole.choices[0];
  check(choice.finish_reason === "tool_calls", "finish_reason tool_calls");
  check(choice.message.content === "Let me check.\n", "content before the calls");
  checkCalls(choice.message.tool_calls, "whole");

  // Raw chunks, assembled as the OpenAI docs show.
  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: "auto", max_tokens: 50, stream: true,
  });
  let content = "";
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? "";
    for (const t of c.delta.tool_calls ?? []) {
      calls[t.index] ??= { id: "", type: "", function: { name: "", arguments: "" } };
      if (t.id) calls[t.index].id = t.id;
      if (t.type) calls[t.index].type = t.type;
      if (t.function?.name) calls[t.index].function.name += t.function.name;
      if (t.function?.arguments) calls[t.index].function.arguments += t.function.arguments;
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  check(content === "Let me check.\n", "streamed content (no markup)");
  check(finish === "tool_calls", "streamed finish_reason tool_calls");
  checkCalls(calls, "streamed");

  // The client's own stream helper, which validates the chunk shapes as it assembles them.
  const helper = client.chat.completions.stream({ model, messages, tools, max_tokens: 50 });
  let argumentsDone = 0;
  helper.on("tool_calls.function.arguments.done", () => argumentsDone++);
  const final = await helper.finalChatCompletion();
  checkCalls(final.choices[0].message.tool_calls, "stream helper");
  check(argumentsDone === 2, "stream helper saw both calls' arguments end");

  // The round trip: the calls and their results go back in the history.
  const next = await client.chat.completions.create({
    model, tools, max_tokens: 5,
    messages: [
      ...messages,
      choice.message,
      { role: "tool", tool_call_id: choice.message.tool_calls[0].id, content: "sunny, 21 C" },
      { role: "tool", tool_call_id: choice.message.tool_calls[1].id, content: "12:00" },
    ],
  });
  check(next.choices[0].message.role === "assistant", "round trip with the tool results");
} else if (mode === "real") {
  const whole = await client.chat.completions.create({
    model, messages, tools, max_tokens: 8, temperature: 0,
  });
  const choice = whole.choices[0];
  check(typeof choice.message.content === "string" && choice.message.content.length > 0,
        "random model: its words are content");
  check(!choice.message.tool_calls?.length && choice.finish_reason !== "tool_calls",
        "random model: no tool_calls");
  let streamed = "";
  const stream = await client.chat.completions.create({
    model, messages, tools, max_tokens: 8, temperature: 0, stream: true,
  });
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta.content ?? "";
  check(streamed === choice.message.content, "random model: streamed content is the same");
} else if (mode === "disabled") {
  let error = null;
  try {
    await client.chat.completions.create({ model, messages, tools, max_tokens: 4 });
  } catch (e) {
    error = e;
  }
  check(error?.status === 400 && /--enable-auto-tool-choice/.test(error.message),
        "tool_choice auto without the flags: 400 naming them");
  const none = await client.chat.completions.create({
    model, messages, tools, tool_choice: "none", max_tokens: 4,
  });
  check(typeof none.choices[0].message.content === "string", "tool_choice none is accepted");

  // tool_choice naming a function, and "required": guided decoding makes even a random model
  // call the tool with arguments that follow its schema (maxLength keeps the output short).
  const bounded = [{
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"],
      },
    },
  }];
  const named = { type: "function", function: { name: "get_weather" } };
  const forced = await client.chat.completions.create({
    model, messages, tools: bounded, tool_choice: named, max_tokens: 120, temperature: 0,
  });
  const call = forced.choices[0].message.tool_calls?.[0];
  check(forced.choices[0].message.tool_calls?.length === 1 && call.function.name === "get_weather"
        && call.id.startsWith("chatcmpl-tool-"), "named tool_choice: one call of the function");
  const args = JSON.parse(call.function.arguments);
  check(Object.keys(args).join() === "city" && typeof args.city === "string"
        && [...args.city].length <= 8, "named tool_choice: arguments follow the schema");
  let streamedArgs = "";
  let streamedName = null;
  const forcedStream = await client.chat.completions.create({
    model, messages, tools: bounded, tool_choice: named, max_tokens: 120, temperature: 0,
    stream: true,
  });
  for await (const chunk of forcedStream) {
    for (const t of chunk.choices[0]?.delta.tool_calls ?? []) {
      streamedName = t.function?.name ?? streamedName;
      streamedArgs += t.function?.arguments ?? "";
    }
  }
  check(streamedName === "get_weather" && streamedArgs === call.function.arguments,
        "named tool_choice: streamed call equals the whole one");
  const required = await client.chat.completions.create({
    model, messages, tools: bounded, tool_choice: "required", parallel_tool_calls: false,
    max_tokens: 200, temperature: 0,
  });
  const calls = required.choices[0].message.tool_calls ?? [];
  check(calls.length === 1 && calls.every((c) => c.function.name === "get_weather"
        && typeof JSON.parse(c.function.arguments).city === "string"),
        "tool_choice required: calls of the tool with arguments that follow its schema");

  // "required" with two tools: whichever name is written, its arguments follow that
  // function's own schema (sampled over seeds so both names are likely to appear).
  const two = [...bounded, {
    type: "function",
    function: {
      name: "get_time",
      parameters: {
        type: "object", properties: { zone: { type: "integer" } }, required: ["zone"],
      },
    },
  }];
  const seen = new Set();
  for (let seed = 0; seed < 6; ++seed) {
    const r = await client.chat.completions.create({
      model, messages, tools: two, tool_choice: "required", parallel_tool_calls: false,
      max_tokens: 200, temperature: 1, seed,
    });
    const c = r.choices[0].message.tool_calls ?? [];
    const a = c.length === 1 ? JSON.parse(c[0].function.arguments) : null;
    const ok = a !== null && (c[0].function.name === "get_weather"
        ? Object.keys(a).join() === "city" && typeof a.city === "string"
        : c[0].function.name === "get_time" && Object.keys(a).join() === "zone"
          && Number.isInteger(a.zone));
    check(ok, `tool_choice required, two tools, seed ${seed}: ${c[0]?.function.name} with its own arguments`);
    seen.add(c[0].function.name);
  }
  console.log("required with two tools called:", [...seen].join(", "));
} else {
  check(false, `unknown mode ${mode}`);
}
console.log("openai tools: ok");
