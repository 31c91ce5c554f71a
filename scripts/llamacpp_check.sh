#!/usr/bin/env bash
# Does llama.cpp read what `crescent quantize` writes, and does it generate what crescent does?
# (docs/engine.md#against-llamacpp)
#
# Writes `make-model --preset PRESET` (a BF16 safetensors checkout with deterministic random
# weights in real shapes), quantizes it with `crescent quantize --type TYPE` for each TYPE,
# and on each file runs the same greedy continuation of five prompts in both engines:
#   crescent:  `crescent generate --temperature 0 --logprobs 2 --ignore-eos`
#   llama.cpp: tools/llamacpp/greedy.mjs (node-llama-cpp's prebuilt llama.cpp, CPU)
# llama.cpp tokenizes each prompt from the file's vocabulary, so equal prompt lengths and equal
# continuations also check crescent's GGUF tokenizer. Prints per type and prompt whether the
# token ids agree; where they part, the step and each engine's two best log-probabilities
# there (random weights spread the probability over the whole vocabulary, so a near tie that
# activation rounding flips shows as a small gap). Exits 1 when llama.cpp refuses a file or a
# prompt's length differs, 0 otherwise: parting after a near tie is reported, not failed.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/llamacpp_check.sh [--types "q4_k_m q5_k_m q6_k q8_0 ..."] [--max-tokens 16]
                                 [--preset qwen2.5-0.5b] [--threads 2]
                                 [--build-dir build/release] [--run-dir DIR]

  --types T       crescent quantize types (default: "q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k
                  q5_k q6_k q4_k_m q5_k_m iq4_nl bf16")
  --max-tokens N  greedy tokens per prompt (default 16)
  --preset P      make-model preset, a Qwen one (default qwen2.5-0.5b; no BOS token, so both
                  engines see the same ids)
  --kv-cache-dtype D  crescent's KV cache dtype (default auto = bf16; llama.cpp's is f16)
USAGE
}

types="q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k q4_k_m q5_k_m iq4_nl bf16"
max_tokens=16
preset=qwen2.5-0.5b
threads=2
kv_dtype=auto
build_dir=build/release
run_dir=""
while (($# > 0)); do
  case "$1" in
    --types) types="${2:?--types needs a value}"; shift 2 ;;
    --max-tokens) max_tokens="${2:?--max-tokens needs a value}"; shift 2 ;;
    --preset) preset="${2:?--preset needs a value}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a value}"; shift 2 ;;
    --kv-cache-dtype) kv_dtype="${2:?--kv-cache-dtype needs a value}"; shift 2 ;;
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
    --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "llamacpp_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin="$build_dir/apps/crescent"
[[ -x "$bin" ]] || { echo "llamacpp_check: no $bin (build the crescent target first)" >&2; exit 1; }
bash scripts/bench_llamacpp.sh --install-only

run_dir="${run_dir:-$(mktemp -d /tmp/crescent-llamacpp-check.XXXXXX)}"
mkdir -p "$run_dir"
checkout="$run_dir/$preset"
if [[ ! -f "$checkout/config.json" ]]; then
  "$bin" make-model --preset "$preset" --out "$checkout" > "$run_dir/make-model.log" 2>&1 ||
    { cat "$run_dir/make-model.log" >&2; exit 1; }
fi
prompts=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a land far away,"
         "1, 2, 3, 5, 8, 13," "Grüße aus München — 東京の天気は")
echo "llamacpp_check: $preset, types: $types; $max_tokens greedy tokens on ${#prompts[@]} prompts, crescent KV $kv_dtype; logs in $run_dir"
status=0
for type in $types; do
  file="$run_dir/$preset-$type.gguf"
  [[ -f "$file" ]] || "$bin" quantize "$checkout" "$file" --type "$type" > "$run_dir/quantize-$type.log" 2>&1 ||
    { cat "$run_dir/quantize-$type.log" >&2; exit 1; }
  prompt_args=()
  for p in "${prompts[@]}"; do prompt_args+=(--prompt "$p"); done
  if ! node tools/llamacpp/greedy.mjs --model "$file" --max-tokens "$max_tokens" --threads "$threads" \
      "${prompt_args[@]}" > "$run_dir/llamacpp-$type.jsonl" 2> "$run_dir/llamacpp-$type.log"; then
    echo "$type: llama.cpp did not load or run the file:"; tail -5 "$run_dir/llamacpp-$type.log"
    status=1
    continue
  fi
  : > "$run_dir/crescent-$type.txt"
  for p in "${prompts[@]}"; do
    "$bin" generate --model "$file" --prompt "$p" --temperature 0 --logprobs 2 --ignore-eos \
      --max-tokens "$max_tokens" --threads "$threads" --kv-cache-dtype "$kv_dtype" 2>&1 > /dev/null |
      grep -E '^\[(token|[0-9]+ prompt tokens)' >> "$run_dir/crescent-$type.txt" ||
      { echo "$type: crescent generate failed on '$p'"; status=1; }
    echo "--" >> "$run_dir/crescent-$type.txt"
  done
  python3 - "$type" "$run_dir/llamacpp-$type.jsonl" "$run_dir/crescent-$type.txt" <<'PY' || status=1
import json, re, sys
kind, llama_path, crescent_path = sys.argv[1:]
llama = [json.loads(line) for line in open(llama_path)]
blocks = open(crescent_path).read().split("--\n")[: len(llama)]
bad = False
for ref, block in zip(llama, blocks):
    steps = [(int(m.group(1)), [(int(a), float(b)) for a, b in re.findall(r"(\d+):(-?[\d.]+)", m.group(2))])
             for m in re.finditer(r"^\[token (\d+) logprob \S+; top: (.*)\]$", block, re.M)]
    count = re.search(r"^\[(\d+) prompt tokens", block, re.M)
    ids = [s[0] for s in steps]
    label = f"{kind:8} {ref['prompt'][:24]!r:28}"
    if count is None or int(count.group(1)) != len(ref["prompt_ids"]):
        print(f"{label} prompt tokens differ: crescent {count and count.group(1)}, llama.cpp {len(ref['prompt_ids'])}")
        bad = True
        continue
    same = next((i for i, (a, b) in enumerate(zip(ids, ref["ids"])) if a != b), min(len(ids), len(ref["ids"])))
    # Over the steps both took alike: the chosen token's log-probability in each engine.
    dist = max((abs(steps[i][1][0][1] - ref["top"][i][0][1]) for i in range(same)), default=0.0)
    if same == len(ref["ids"]) == len(ids):
        gap = min(t[0][1] - t[1][1] for t in ref["top"])
        print(f"{label} {same}/{len(ids)} tokens equal, max |dlogprob| {dist:.3f} (smallest llama.cpp top-2 gap {gap:.3f})")
    else:
        c = " ".join(f"{a}:{b:.3f}" for a, b in steps[same][1]) if same < len(steps) else "-"
        l = " ".join(f"{a}:{b:.3f}" for a, b in ref["top"][same]) if same < len(ref["top"]) else "-"
        print(f"{label} {same}/{len(ref['ids'])} tokens equal (max |dlogprob| {dist:.3f}), then crescent top-2 {c}; llama.cpp {l}")
sys.exit(1 if bad else 0)
PY
done
exit "$status"
