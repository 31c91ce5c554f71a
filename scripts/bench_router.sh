#!/usr/bin/env bash
# KV-aware routing against round-robin, in one run (docs/proxy.md#routing-round_robin-and-kv_aware).
#
# For each router (round_robin, then kv_aware) starts on 127.0.0.1 two `crescent serve --role
# prefill` (each hosting its bootstrap server), one `--role decode` and `crescent proxy
# --router ROUTER`, runs the same prefix-sharing load through the proxy (`crescent bench serve
# --dataset-name random --random-prefix-len L --random-num-prefixes N`: each prompt starts with
# one of N long prefixes), stops them, and prints both mean TTFTs and their ratio. Fresh
# servers for each router: no cache carries over.
#
# usage: scripts/bench_router.sh [BUILD_DIR]        (default build/release)
# env: ROUTER_MODEL (a model directory; default: make-model --preset small into the run dir),
#      ROUTER_NUM_PROMPTS (96), ROUTER_RATE (requests/s, 6), ROUTER_PREFIX_LEN (512),
#      ROUTER_NUM_PREFIXES (12), ROUTER_INPUT_LEN (16), ROUTER_OUTPUT_LEN (4),
#      ROUTER_KV_CACHE_MB (per prefill, 8: 256 blocks of the small model, room for about 7 of the
#      12 prefixes, so that round-robin, which sends every prefix to both, keeps evicting them
#      while kv_aware splits them between the two), ROUTER_MAX_MODEL_LEN (1024),
#      ROUTER_SEED (0), ROUTER_RUN_DIR (a temp dir)
set -euo pipefail

build_dir="${1:-build/release}"
bin="$build_dir/apps/crescent"
[[ -x "$bin" ]] || { echo "bench_router: no $bin (build the crescent target)" >&2; exit 1; }
: "${ROUTER_NUM_PROMPTS:=96}" "${ROUTER_RATE:=6}" "${ROUTER_PREFIX_LEN:=512}"
: "${ROUTER_NUM_PREFIXES:=12}" "${ROUTER_INPUT_LEN:=16}" "${ROUTER_OUTPUT_LEN:=4}"
: "${ROUTER_KV_CACHE_MB:=8}" "${ROUTER_MAX_MODEL_LEN:=1024}" "${ROUTER_SEED:=0}"
run_dir="${ROUTER_RUN_DIR:-$(mktemp -d /tmp/crescent-bench-router.XXXXXX)}"
mkdir -p "$run_dir"
model="${ROUTER_MODEL:-}"
if [[ -z "$model" ]]; then
  model="$run_dir/model-small"
  [[ -d "$model" ]] || "$bin" make-model --preset small --out "$model" > "$run_dir/make-model.log"
fi

pids=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap stop_all EXIT

# The port after PATTERN in LOG, waiting up to 120 s.
port_in() {
  local log="$1" pattern="$2" port="" i
  for ((i = 0; i < 1200; ++i)); do
    port=$(grep -o -m1 "$pattern[0-9]*" "$log" 2>/dev/null | sed 's/.*://' || true)
    [[ -n "$port" ]] && { echo "$port"; return 0; }
    sleep 0.1
  done
  echo "bench_router: no '$pattern' line in $log:" >&2
  tail -n 20 "$log" >&2
  return 1
}

# Waits until GET http://127.0.0.1:PORT/health answers 200 (bash's /dev/tcp).
wait_healthy() {
  local port="$1" i code
  for ((i = 0; i < 600; ++i)); do
    code=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
      printf "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" >&3
      read -r _ c _ <&3 && echo "$c"' "$port" 2>/dev/null || echo 000)
    [[ "$code" == 200 ]] && return 0
    sleep 0.2
  done
  echo "bench_router: :$port never answered /health 200" >&2
  return 1
}

serve_args=(serve --model "$model" --served-model-name small --host 127.0.0.1 --port 0
            --io-threads 1 --threads 1)
declare -A mean_ttft=()
for router in round_robin kv_aware; do
  echo "== $router: 2 prefill + 1 decode + proxy --router $router"
  urls=()
  for p in 0 1; do
    log="$run_dir/$router-prefill$p.log"
    "$bin" "${serve_args[@]}" --role prefill --bootstrap-port 0 \
      --kv-cache-mb "$ROUTER_KV_CACHE_MB" --max-model-len "$ROUTER_MAX_MODEL_LEN" > "$log" 2>&1 &
    pids+=($!)
  done
  "$bin" "${serve_args[@]}" --role decode --kv-cache-mb 64 \
    --max-model-len "$ROUTER_MAX_MODEL_LEN" > "$run_dir/$router-decode.log" 2>&1 &
  pids+=($!)
  for p in 0 1; do
    log="$run_dir/$router-prefill$p.log"
    port=$(port_in "$log" "listening on http://127.0.0.1:")
    bport=$(port_in "$log" "crescent serve: bootstrap http://127.0.0.1:")
    wait_healthy "$port"
    urls+=(--prefill "http://127.0.0.1:$port" "$bport")
  done
  dport=$(port_in "$run_dir/$router-decode.log" "listening on http://127.0.0.1:")
  wait_healthy "$dport"
  "$bin" proxy --host 127.0.0.1 --port 0 --io-threads 1 "${urls[@]}" \
    --decode "http://127.0.0.1:$dport" --router "$router" > "$run_dir/$router-proxy.log" 2>&1 &
  pids+=($!)
  pport=$(port_in "$run_dir/$router-proxy.log" "listening on http://127.0.0.1:")
  wait_healthy "$pport"
  result="$run_dir/$router.json"
  "$bin" bench serve --base-url "http://127.0.0.1:$pport" --model "$model" \
    --dataset-name random --random-input-len "$ROUTER_INPUT_LEN" \
    --random-output-len "$ROUTER_OUTPUT_LEN" --random-prefix-len "$ROUTER_PREFIX_LEN" \
    --random-num-prefixes "$ROUTER_NUM_PREFIXES" --num-prompts "$ROUTER_NUM_PROMPTS" \
    --request-rate "$ROUTER_RATE" --seed "$ROUTER_SEED" --no-progress \
    --label "$router" --save-result "$result" > "$run_dir/$router-bench.log" 2>&1 ||
    { cat "$run_dir/$router-bench.log" >&2; exit 1; }
  grep -E "Successful|Failed|Mean TTFT|Median TTFT|P99 TTFT" "$run_dir/$router-bench.log" || true
  echo "   proxy: $(curl -s "http://127.0.0.1:$pport/metrics" |
    grep -E '^crescent_proxy_router_(decisions_total|matched_blocks_total|prompt_blocks_total)' |
    tr '\n' ' ')"
  for p in 0 1; do
    port=$(port_in "$run_dir/$router-prefill$p.log" "listening on http://127.0.0.1:")
    echo "   prefill$p: $(curl -s "http://127.0.0.1:$port/metrics" |
      grep -E '^crescent_(prefix_cache_hits_total|prompt_tokens_total)' | sed 's/{[^}]*}//' |
      tr '\n' ' ')"
  done
  mean_ttft[$router]=$(jq -r .mean_ttft_ms "$result")
  failed=$(jq -r .failed "$result" 2>/dev/null || echo 0)
  [[ "$failed" == 0 || "$failed" == null ]] || { echo "bench_router: $failed requests failed" >&2; exit 1; }
  stop_all
done
ratio=$(awk -v k="${mean_ttft[kv_aware]}" -v r="${mean_ttft[round_robin]}" 'BEGIN { printf "%.2f", k / r }')
echo "== mean TTFT: round_robin ${mean_ttft[round_robin]} ms, kv_aware ${mean_ttft[kv_aware]} ms," \
  "kv_aware/round_robin = $ratio (run dir $run_dir)"
