#!/usr/bin/env bash
# Decode throughput with and without a JSON-schema constraint, on one server in one run
# (docs/engine.md#guided-decoding).
#
# Starts `crescent serve` on 127.0.0.1, then alternates ROUNDS times between an unconstrained
# `crescent bench serve` and the same load with `response_format: json_schema` (an array of
# {"name": string, "n": integer} objects, which a random-weight model keeps writing), and prints
# each round's output throughput, the constrained/unconstrained ratio per round and their
# median. The rounds alternate so that drift on a shared machine hits both sides alike.
#
# usage: scripts/bench_guided.sh [BUILD_DIR]        (default build/release)
# env: GUIDED_MODEL (a model directory; default: make-model --preset small into the run dir),
#      GUIDED_ROUNDS (3), GUIDED_NUM_PROMPTS (8 per side and round), GUIDED_CONCURRENCY (1),
#      GUIDED_INPUT_LEN (64), GUIDED_OUTPUT_LEN (128), GUIDED_THREADS (2), GUIDED_RUN_DIR
set -euo pipefail

build_dir="${1:-build/release}"
bin="$build_dir/apps/crescent"
[[ -x "$bin" ]] || { echo "bench_guided: no $bin (build the crescent target)" >&2; exit 1; }
: "${GUIDED_ROUNDS:=3}" "${GUIDED_NUM_PROMPTS:=8}" "${GUIDED_CONCURRENCY:=1}"
: "${GUIDED_INPUT_LEN:=64}" "${GUIDED_OUTPUT_LEN:=128}" "${GUIDED_THREADS:=2}"
run_dir="${GUIDED_RUN_DIR:-$(mktemp -d /tmp/crescent-bench-guided.XXXXXX)}"
mkdir -p "$run_dir"
model="${GUIDED_MODEL:-}"
if [[ -z "$model" ]]; then
  model="$run_dir/model-small"
  [[ -d "$model" ]] || "$bin" make-model --preset small --out "$model" > "$run_dir/make-model.log" 2>&1
fi

"$bin" serve --model "$model" --served-model-name small --host 127.0.0.1 --port 0 \
  --threads "$GUIDED_THREADS" --max-model-len 1024 > "$run_dir/serve.log" 2>&1 &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true; wait $serve_pid 2>/dev/null || true' EXIT
port=""
for ((i = 0; i < 1200; ++i)); do
  port=$(grep -o -m1 "listening on http://127.0.0.1:[0-9]*" "$run_dir/serve.log" | sed 's/.*://' || true)
  [[ -n "$port" ]] && break
  sleep 0.1
done
[[ -n "$port" ]] || { echo "bench_guided: serve did not start:" >&2; tail "$run_dir/serve.log" >&2; exit 1; }
for ((i = 0; i < 600; ++i)); do
  [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" == 200 ]] && break
  sleep 0.2
done

schema='{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["name","n"]}}'
constrained="{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"rows\",\"schema\":$schema}}}"

# Output tokens/s of one bench serve run; $1 is the label, $2 the --extra-body.
throughput() {
  local label="$1" extra="$2" result="$run_dir/$1.json"
  "$bin" bench serve --base-url "http://127.0.0.1:$port" --model "$model" \
    --dataset-name random --random-input-len "$GUIDED_INPUT_LEN" \
    --random-output-len "$GUIDED_OUTPUT_LEN" --num-prompts "$GUIDED_NUM_PROMPTS" \
    --max-concurrency "$GUIDED_CONCURRENCY" --temperature 1 --seed 0 --no-progress \
    --extra-body "$extra" --label "$label" --save-result "$result" > "$run_dir/$label.log" 2>&1 ||
    { cat "$run_dir/$label.log" >&2; exit 1; }
  [[ "$(jq -r .failed "$result")" == 0 ]] || { echo "bench_guided: $label had failures" >&2; exit 1; }
  jq -r .output_throughput "$result"
}

throughput warmup '{}' > /dev/null
ratios=()
for ((r = 1; r <= GUIDED_ROUNDS; ++r)); do
  free=$(throughput "free-$r" '{}')
  json=$(throughput "json-$r" "$constrained")
  ratio=$(awk -v a="$json" -v b="$free" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$ratio")
  printf "round %d: unconstrained %.1f tok/s, json_schema %.1f tok/s, ratio %s\n" "$r" "$free" "$json" "$ratio"
done
median=$(printf "%s\n" "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "== json_schema / unconstrained output throughput: median $median of ${GUIDED_ROUNDS} rounds" \
  "(concurrency $GUIDED_CONCURRENCY, $GUIDED_OUTPUT_LEN output tokens; run dir $run_dir)"
