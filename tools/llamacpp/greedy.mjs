// llama.cpp's greedy continuation of prompts on one GGUF file, as token ids, for comparing
// with `crescent generate --temperature 0 --logprobs 2` on the same file (scripts/
// llamacpp_check.sh). Each prompt is tokenized by llama.cpp from the file's own vocabulary, so
// the ids check crescent's GGUF tokenizer too. Prints one JSON line per prompt: prompt_ids, ids,
// and per step the two most likely tokens with their log-probabilities (how close a tie was
// where the engines part).
//
// usage: node greedy.mjs --model FILE.gguf --prompt TEXT [--prompt TEXT...] [--max-tokens 16]
//        [--threads 2]
import {loadCpuModel} from "./llama_cpu.mjs";

const args = process.argv.slice(2);
const flag = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const modelPath = flag("--model", "");
const prompts = args.flatMap((a, i) => (a === "--prompt" && i + 1 < args.length ? [args[i + 1]] : []));
const maxTokens = Number(flag("--max-tokens", "16"));
const threads = Number(flag("--threads", "2"));
if (modelPath === "" || prompts.length === 0 || !(maxTokens > 0) || !(threads > 0)) {
  console.error("usage: node greedy.mjs --model FILE.gguf --prompt TEXT... [--max-tokens 16] [--threads 2]");
  process.exit(2);
}

const {model} = await loadCpuModel({modelPath, threads});
const context = await model.createContext({contextSize: 512, threads: {ideal: threads, min: threads}});
for (const promptText of prompts) {
  const sequence = context.getSequence();
  const promptIds = Array.from(model.tokenize(promptText, /*specialTokens=*/false));
  const ids = [];
  const top = [];
  for await (const step of sequence.evaluateWithMetadata(promptIds, {probabilities: true},
                                                          {temperature: 0})) {
    ids.push(step.token);
    const best = [...step.probabilities.entries()].sort((a, b) => b[1] - a[1]).slice(0, 2);
    top.push(best.map(([id, p]) => [id, Math.log(p)]));
    if (ids.length >= maxTokens) break;
  }
  console.log(JSON.stringify({prompt: promptText, prompt_ids: promptIds, ids, top}));
  sequence.dispose();
}
await context.dispose();
await model.dispose();
