#!/usr/bin/env bash
# crescent against llama.cpp on the same GGUF files, same threads, same machine, same run
# (docs/engine.md#against-llamacpp).
#
# For each weight type, writes `make-model --preset PRESET --gguf-type TYPE` (deterministic
# random weights in real shapes), then measures on its model.gguf, in turn:
#   crescent:  `crescent bench engine --model FILE --threads N` (prefill of --prompt-len tokens,
#              batch-1 decode after a --decode-context-token prompt, best of --reps)
#   llama.cpp: tools/llamacpp/bench.mjs, the same measurements through node-llama-cpp's prebuilt
#              llama.cpp CPU library (its zen4/sapphirerapids/... build, picked at run time)
# and prints both with the ratio crescent / llama.cpp. --rounds R repeats the pair R times,
# alternating, and reports every round (the machines are shared: compare within a round).
#
# llama.cpp is not in Debian 12's archive; node-llama-cpp carries llama.cpp's own build through
# the npm registry. This script installs it into tools/llamacpp on first use (85 MB, npm only).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/bench_llamacpp.sh [--types "q4_k_m q8_0 q6_k bf16"] [--threads 2] [--rounds 1]
                                 [--reps 3] [--preset qwen2.5-0.5b] [--build-dir build/release]
                                 [--run-dir DIR]

  --types T      GGUF types to compare, any of make-model --gguf-type's (default:
                 "q4_k_m q8_0 q6_k bf16")
  --threads N    threads for both engines (default 2)
  --rounds R     crescent-then-llama.cpp pairs per type (default 1)
  --reps N       repetitions inside each measurement, best kept (default 3)
  --preset P     make-model preset (default qwen2.5-0.5b)
  --build-dir D  where apps/crescent is (default build/release)
  --run-dir DIR  models and logs (default: a new /tmp/crescent-vs-llamacpp.XXXXXX; reused
                 models are not rewritten)
  --install-only install node-llama-cpp into tools/llamacpp if needed, then exit
USAGE
}

types="q4_k_m q8_0 q6_k bf16"
threads=2
rounds=1
reps=3
preset=qwen2.5-0.5b
build_dir=build/release
run_dir=""
install_only=0
while (($# > 0)); do
  case "$1" in
    --types) types="${2:?--types needs a value}"; shift 2 ;;
    --threads) threads="${2:?--threads needs a value}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a value}"; shift 2 ;;
    --reps) reps="${2:?--reps needs a value}"; shift 2 ;;
    --preset) preset="${2:?--preset needs a value}"; shift 2 ;;
    --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
    --run-dir) run_dir="${2:?--run-dir needs a value}"; shift 2 ;;
    --install-only) install_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_llamacpp: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$threads" "$rounds" "$reps"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench_llamacpp: '$n' is not a positive integer" >&2; exit 2; }
done
for tool in node npm jq; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench_llamacpp: needs node, npm and jq, and $tool is missing (bash scripts/setup.sh installs them)" >&2
    exit 1
  fi
done
if [[ ! -f tools/llamacpp/node_modules/.crescent-installed ||
      tools/llamacpp/package.json -nt tools/llamacpp/node_modules/.crescent-installed ]]; then
  echo "bench_llamacpp: installing node-llama-cpp into tools/llamacpp (npm)"
  (cd tools/llamacpp && npm install --omit=optional --no-audit --no-fund --loglevel=error)
  touch tools/llamacpp/node_modules/.crescent-installed
fi
if ((install_only)); then exit 0; fi
bin="$build_dir/apps/crescent"
[[ -x "$bin" ]] || { echo "bench_llamacpp: no $bin (build the crescent target first)" >&2; exit 1; }

run_dir="${run_dir:-$(mktemp -d /tmp/crescent-vs-llamacpp.XXXXXX)}"
mkdir -p "$run_dir"
echo "bench_llamacpp: $preset, $threads threads, types: $types; logs in $run_dir"
printf '%-8s %5s | %12s %12s %6s | %12s %12s %6s\n' type round "crescent pp" "llama.cpp pp" ratio \
  "crescent tg" "llama.cpp tg" ratio
for type in $types; do
  model="$run_dir/$preset-$type"
  if [[ ! -f "$model/model.gguf" ]]; then
    "$bin" make-model --preset "$preset" --gguf-type "$type" --out "$model" \
      > "$run_dir/make-model-$type.log" 2>&1 ||
      { cat "$run_dir/make-model-$type.log" >&2; exit 1; }
  fi
  for ((round = 1; round <= rounds; ++round)); do
    log="$run_dir/crescent-$type-$round.log"
    "$bin" bench engine --model "$model/model.gguf" --threads "$threads" --reps "$reps" \
      --prompt-len 512 --decode-context 128 --decode-steps 32 > "$log" 2>&1 ||
      { cat "$log" >&2; exit 1; }
    c_pp=$(awk '/^prefill/ {for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") print $i; exit}' "$log")
    c_tg=$(awk '/^decode +batch 1:/ {for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") print $i; exit}' "$log")
    json="$run_dir/llamacpp-$type-$round.json"
    node tools/llamacpp/bench.mjs --model "$model/model.gguf" --threads "$threads" --reps "$reps" \
      --prompt-len 512 --decode-context 128 --decode-steps 32 > "$json" 2> "$json.log" ||
      { tail "$json.log" >&2; exit 1; }
    l_pp=$(jq -r '.prefill_tokens_per_s' "$json")
    l_tg=$(jq -r '.decode_tokens_per_s' "$json")
    [[ -n "$c_pp" && -n "$c_tg" ]] || { echo "bench_llamacpp: no figures in $log" >&2; exit 1; }
    awk -v t="$type" -v r="$round" -v cp="$c_pp" -v lp="$l_pp" -v ct="$c_tg" -v lt="$l_tg" \
      'BEGIN { printf "%-8s %5d | %12.1f %12.1f %6.2f | %12.1f %12.1f %6.2f\n", t, r, cp, lp, cp / lp, ct, lt, ct / lt }'
  done
done
echo "pp: prefill tokens/s of a 512-token prompt; tg: batch-1 decode tokens/s after a 128-token"
echo "prompt; ratio = crescent / llama.cpp (> 1: crescent faster). llama.cpp: node-llama-cpp 3.22.1,"
echo "CPU backend $(jq -r .cpu_backend "$json"), the better of its flash-attention off and on."
