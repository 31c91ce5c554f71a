// llama.cpp's prompt processing and generation speed on one GGUF file, measured the way
// `crescent bench engine` measures crescent's: one prompt of --prompt-len tokens in a fresh
// sequence (prefill), then --decode-steps greedy tokens after a --decode-context-token prompt
// (batch-1 decode), best of --reps. Prints one JSON line. llama.cpp runs on --threads threads
// (its thread pool, as `llama-bench -t`), CPU only, with its flash attention off and on (the
// faster kept, as llama-bench's default "auto" would pick on this CPU).
//
// usage: node bench.mjs --model FILE.gguf [--threads 2] [--prompt-len 512]
//        [--decode-context 128] [--decode-steps 32] [--reps 3]
import {loadCpuModel} from "./llama_cpu.mjs";

function parseArgs(argv) {
  const options = {model: "", threads: 2, promptLen: 512, decodeContext: 128, decodeSteps: 32,
                   reps: 3};
  const names = {"--model": "model", "--threads": "threads", "--prompt-len": "promptLen",
                 "--decode-context": "decodeContext", "--decode-steps": "decodeSteps",
                 "--reps": "reps"};
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (key === undefined || i + 1 >= argv.length) {
      throw new Error(`unknown or incomplete flag '${argv[i]}' (see the usage at the top)`);
    }
    options[key] = key === "model" ? argv[i + 1] : Number(argv[i + 1]);
    if (key !== "model" && !(Number.isInteger(options[key]) && options[key] > 0)) {
      throw new Error(`${argv[i]} needs a positive integer, not '${argv[i + 1]}'`);
    }
  }
  if (options.model === "") throw new Error("--model FILE.gguf is required");
  return options;
}

const options = parseArgs(process.argv.slice(2));
const logs = [];
const {llama, model} = await loadCpuModel({
  modelPath: options.model, threads: options.threads, logger: (level, message) => logs.push(message),
});
// Token ids spread over the vocabulary: the speed does not depend on the text.
const vocab = 30000;  // ids below every supported vocabulary size
const prompt = (n, salt) => Array.from({length: n}, (_, i) => 100 + ((i + salt) * 7919) % vocab);

async function measure(flashAttention) {
  const context = await model.createContext({
    contextSize: Math.max(options.promptLen, options.decodeContext + options.decodeSteps) + 16,
    batchSize: options.promptLen, threads: {ideal: options.threads, min: options.threads},
    flashAttention,
  });
  let prefill = 0, decode = 0;
  for (let rep = 0; rep < options.reps; ++rep) {
    let sequence = context.getSequence();
    let start = performance.now();
    await sequence.evaluateWithoutGeneratingNewTokens(prompt(options.promptLen, rep));
    prefill = Math.max(prefill, options.promptLen / ((performance.now() - start) / 1000));
    sequence.dispose();

    sequence = context.getSequence();
    const history = prompt(options.decodeContext, 1000 + rep);
    await sequence.evaluateWithoutGeneratingNewTokens(history.slice(0, -1));
    let steps = 0;
    start = performance.now();
    for await (const token of sequence.evaluate(history.slice(-1), {temperature: 0})) {
      if (++steps >= options.decodeSteps) break;
    }
    decode = Math.max(decode, steps / ((performance.now() - start) / 1000));
    sequence.dispose();
  }
  await context.dispose();
  return {prefill, decode};
}

const off = await measure(false);
const on = await measure(true);
const backend = logs.map(m => /libggml-cpu-([a-z0-9]+)\.so/.exec(m)).find(m => m)?.[1] ?? "?";
console.log(JSON.stringify({
  engine: "llama.cpp", node_llama_cpp: "3.22.1", cpu_backend: backend, threads: options.threads,
  system_info: llama.systemInfo.trim(),
  file_type: model.fileInfo.metadata.general?.file_type ?? null,
  prompt_len: options.promptLen, decode_context: options.decodeContext,
  decode_steps: options.decodeSteps, reps: options.reps,
  prefill_tokens_per_s: Math.max(off.prefill, on.prefill),
  decode_tokens_per_s: Math.max(off.decode, on.decode),
  flash_attention: {off, on},
}));
await model.dispose();
