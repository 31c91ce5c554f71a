#!/usr/bin/env bash
# The one-command demo: disaggregated prefill/decode (1P1D) against one colocated server, on
# this machine, with the same benchmark.
#
#   bash scripts/demo.sh
#
# 1. Installs what is missing (scripts/setup.sh), builds the release `crescent` binary, and
#    makes the default `small` model (deterministic random weights, real Qwen vocabulary) in
#    models/small if it is absent.
# 2. Starts on 127.0.0.1: a standalone `crescent bootstrap`; one `crescent serve --role prefill`
#    that registers with it (--bootstrap-addr); one `--role decode`; and `crescent proxy` in
#    front of them. The cores are split: prefill and decode get half each.
# 3. Runs `crescent bench serve` through the proxy, then stops the cluster: the load
#    disaggregation is for, short requests decoding while long prompts keep arriving (a
#    second `bench serve` sends those beside the first), with goodput under SLOs.
# 4. Starts one `crescent serve --role both` with all the cores and runs the same benchmark
#    against it, then stops it.
# 5. Prints the two reports side by side (`crescent bench compare`) with a sentence on what
#    differs, goodput first.
# Every process it starts is stopped when it ends, fails or is interrupted (Ctrl-C); if one of
# them dies, the demo names it, prints the end of its log and exits 1. Logs, results and charts
# are kept in build/demo-logs/<time>/ (printed at the start and the end).
#
# Knobs (environment):
#   DEMO_NUM_PROMPTS (60)  DEMO_INPUT_LEN (64)  DEMO_OUTPUT_LEN (128)  DEMO_REQUEST_RATE (2)
#   DEMO_MAX_CONCURRENCY (none)  DEMO_SEED (0)
#   DEMO_GOODPUT ('ttft:3000 tpot:50 itl:250'): bench serve's --goodput SLOs in ms (itl: a
#       request's longest gap between two chunks); empty: none.
#   DEMO_LONG_INPUT_LEN (2048; 0: off) DEMO_LONG_OUTPUT_LEN (16) DEMO_LONG_NUM_PROMPTS (15): the
#       second stream of long prompts sent beside the main one (spread evenly over the same
#       time), whose prefills stall a colocated server's running decodes; its own reports are
#       printed too.
#   DEMO_CORES (nproc): compute threads in all; prefill gets half, decode the rest, the
#       colocated server all of them.
#   DEMO_MODEL_DIR (models/small)  DEMO_MODEL_PRESET (small): made with make-model if absent.
#   DEMO_SKIP_BUILD=1: no setup and no build; run CRESCENT_BIN (default build/release/apps/crescent).
#   DEMO_LOG_DIR (build/demo-logs): the run directory is DEMO_LOG_DIR/<time>.
#   DEMO_BOOTSTRAP_PORT DEMO_PREFILL_PORT DEMO_DECODE_PORT DEMO_PROXY_PORT DEMO_BOTH_PORT
#       (0: a free port chosen by each process)
#   DEMO_KV_TRANSPORT (shm)  DEMO_STARTUP_TIMEOUT_S (90)  DEMO_BENCH_TIMEOUT_S (600)
# Exit status: 0 when both runs completed every request; 1 otherwise (the reason is printed).
#
#   bash scripts/demo.sh sweep
#
# The same two set-ups and load at each of DEMO_SWEEP_RATES ('1 2 3 4' req/s), DEMO_SWEEP_SECONDS
# (20) of requests at each (the long prompts in the default's proportion, one per four short
# ones), one cluster start per set-up; then `crescent bench sweep-report`: goodput, TPOT/ITL p99
# and TTFT median per rate, a sentence naming where the goodput winner changes, and sweep.svg.
#
#   bash scripts/demo.sh epd
#
# The EPD demo (DESIGN.md §2b): encoder, prefill and decode workers (1E1P1D, each pinned with
# taskset to its own cores, plus a bootstrap server and `crescent proxy --encode`) against one
# colocated `--role both` server pinned to the same cores, under the same image-heavy load
# (`crescent bench serve --dataset-name random-mm`); prints TTFT/TPOT/ITL side by side, where
# the time went (encode, EC pull), and a sentence computed from the two runs. Its model is
# tiny-qwen2-vl with Qwen2-VL's own pixel budget (max_pixels 12845056 in
# preprocessor_config.json instead of the preset's 64 merged patches), so that a 720x1280 image
# is 1196 embedding rows and its encoding costs a visible fraction of a second on one core,
# while decode steps take about a millisecond. See docs/epd_benchmark.md.
# Knobs (environment), besides DEMO_SKIP_BUILD, CRESCENT_BIN, DEMO_LOG_DIR, DEMO_SEED,
# DEMO_STARTUP_TIMEOUT_S, DEMO_BENCH_TIMEOUT_S and DEMO_CORES (how many of this process's CPUs):
#   DEMO_NUM_PROMPTS (32)  DEMO_INPUT_LEN (64)  DEMO_OUTPUT_LEN (64)  DEMO_REQUEST_RATE (0.8)
#   DEMO_MAX_CONCURRENCY (none)
#   DEMO_MM_BUCKETS ('{(720, 1280, 1): 1.0}')  DEMO_MM_ITEMS (1): images per request
#   DEMO_MODEL_DIR (models/tiny-qwen2-vl-qwen-pixels)
#   DEMO_E_CPUS DEMO_P_CPUS DEMO_D_CPUS: taskset lists (default: D gets the last CPU; E and P
#       share the others, split in two when there are at least two)
#   DEMO_EC_TRANSPORT (shm)  DEMO_KV_TRANSPORT (shm)
#   DEMO_FRONT_CPUS (E's and P's CPUs): taskset list for the proxy and the benchmark client
#       (the client runs under it against both set-ups); empty: unpinned
#   DEMO_PROXY_CPUS (DEMO_FRONT_CPUS): the proxy's alone  DEMO_PROXY_IO_THREADS (2)
#   DEMO_E_NICE (10) DEMO_P_NICE (5): niceness of E and P ('idle': chrt --idle 0)
#   DEMO_PREFILL_IMAGES (ref): the proxy's --prefill-images (full: P gets the images, can
#       fall back to encoding them; ref: only ec:// references, as D)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode="${1:-pd}"
case "$mode" in
  pd | epd | sweep) ;;
  *)
    echo "usage: bash scripts/demo.sh [epd|sweep]" >&2
    exit 2
    ;;
esac
if [[ "$mode" == epd ]]; then
  : "${DEMO_NUM_PROMPTS:=32}" "${DEMO_INPUT_LEN:=64}" "${DEMO_OUTPUT_LEN:=64}"
  : "${DEMO_REQUEST_RATE:=0.8}" "${DEMO_MODEL_DIR:=models/tiny-qwen2-vl-qwen-pixels}"
  : "${DEMO_MODEL_PRESET:=tiny-qwen2-vl}"
  : "${DEMO_LONG_INPUT_LEN:=0}" "${DEMO_GOODPUT=}"
fi

num_prompts="${DEMO_NUM_PROMPTS:-60}"
input_len="${DEMO_INPUT_LEN:-64}"
output_len="${DEMO_OUTPUT_LEN:-128}"
request_rate="${DEMO_REQUEST_RATE:-2}"
max_concurrency="${DEMO_MAX_CONCURRENCY:-}"
seed="${DEMO_SEED:-0}"
long_input_len="${DEMO_LONG_INPUT_LEN:-2048}"
long_output_len="${DEMO_LONG_OUTPUT_LEN:-16}"
long_num_prompts="${DEMO_LONG_NUM_PROMPTS:-15}"
goodput="${DEMO_GOODPUT-ttft:3000 tpot:50 itl:250}"
sweep_rates="${DEMO_SWEEP_RATES:-1 2 3 4}"
sweep_seconds="${DEMO_SWEEP_SECONDS:-20}"
default_num_prompts="$num_prompts"
default_long_num_prompts="$long_num_prompts"
cores="${DEMO_CORES:-$(nproc)}"
model="${DEMO_MODEL_DIR:-models/small}"
model_preset="${DEMO_MODEL_PRESET:-small}"
kv_transport="${DEMO_KV_TRANSPORT:-shm}"
startup_timeout_s="${DEMO_STARTUP_TIMEOUT_S:-90}"
bench_timeout_s="${DEMO_BENCH_TIMEOUT_S:-600}"
log_root="${DEMO_LOG_DIR:-build/demo-logs}"

die() {
  echo "demo: error: $*" >&2
  exit 1
}
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
for knob in num_prompts input_len output_len seed long_input_len long_output_len \
            long_num_prompts cores startup_timeout_s bench_timeout_s sweep_seconds; do
  is_uint "${!knob}" || die "$knob must be a whole number, got '${!knob}'"
done
[[ "$request_rate" =~ ^([0-9]+([.][0-9]*)?|inf)$ ]] ||
  die "DEMO_REQUEST_RATE must be a number of requests/s or inf, got '$request_rate'"
for rate in $sweep_rates; do
  if ! [[ "$rate" =~ ^[0-9]+([.][0-9]*)?$ ]] || ! awk -v r="$rate" 'BEGIN { exit !(r > 0) }'; then
    die "DEMO_SWEEP_RATES must be positive numbers of requests/s, got '$rate'"
  fi
done
[[ "$mode" != sweep || -n "$goodput" ]] || die "the sweep compares goodput: DEMO_GOODPUT must not be empty"
[[ -n "${sweep_rates// /}" ]] || die "DEMO_SWEEP_RATES must name at least one rate"
((sweep_seconds > 0)) || die "DEMO_SWEEP_SECONDS must be positive"
if [[ -n "$goodput" ]]; then
  for pair in $goodput; do
    [[ "$pair" =~ ^(ttft|tpot|e2el|itl):[0-9]+([.][0-9]*)?$ ]] ||
      die "DEMO_GOODPUT must be KEY:MS pairs (ttft, tpot, e2el, itl), got '$pair'"
  done
fi
[[ -z "$max_concurrency" ]] || is_uint "$max_concurrency" ||
  die "DEMO_MAX_CONCURRENCY must be a whole number, got '$max_concurrency'"
((num_prompts > 0 && input_len > 0 && output_len > 0)) ||
  die "DEMO_NUM_PROMPTS, DEMO_INPUT_LEN and DEMO_OUTPUT_LEN must be positive"
((cores > 0)) || die "DEMO_CORES must be positive"
for port_knob in DEMO_BOOTSTRAP_PORT DEMO_PREFILL_PORT DEMO_DECODE_PORT DEMO_PROXY_PORT \
                 DEMO_BOTH_PORT; do
  value="${!port_knob:-0}"
  if ! is_uint "$value" || ((value >= 65536)); then
    die "$port_knob must be a port (0..65535), got '$value'"
  fi
done

started_at=$(date +%s)
elapsed() { echo "$(($(date +%s) - started_at)) s"; }

# ---- build and model -----------------------------------------------------------------------
if [[ "${DEMO_SKIP_BUILD:-0}" == 1 ]]; then
  bin="${CRESCENT_BIN:-build/release/apps/crescent}"
  echo "== DEMO_SKIP_BUILD=1: no setup or build; using $bin"
else
  bash scripts/setup.sh
  echo "== build (release): cmake --build --preset release --target crescent"
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$(nproc)" --target crescent
  bin="build/release/apps/crescent"
fi
[[ -x "$bin" ]] || die "$bin is not an executable (build it, or set CRESCENT_BIN)"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

if [[ ! -f "$model/config.json" ]]; then
  echo "== make the model: crescent make-model --preset $model_preset --out $model"
  mkdir -p "$(dirname "$model")"
  tmp_model="$model.tmp.$$"
  "$bin" make-model --preset "$model_preset" --out "$tmp_model"
  if [[ "$mode" == epd ]]; then
    # Qwen2-VL's pixel budget instead of the tiny preset's 64 merged patches (see the top).
    sed -i -e 's/"max_pixels": [0-9]*/"max_pixels": 12845056/' \
      -e 's/"longest_edge": [0-9]*/"longest_edge": 12845056/' "$tmp_model/preprocessor_config.json"
    grep -q '"max_pixels": 12845056' "$tmp_model/preprocessor_config.json" ||
      die "cannot set max_pixels in $tmp_model/preprocessor_config.json"
    echo "   max_pixels 12845056 (Qwen2-VL's) in $tmp_model/preprocessor_config.json"
  fi
  # Another run may have made it meanwhile: keep theirs.
  mv -T "$tmp_model" "$model" 2>/dev/null || rm -rf "$tmp_model"
  echo "   model ready in $model"
fi

run_dir="$log_root/$(date +%Y%m%d-%H%M%S)"
if [[ -e "$run_dir" ]]; then
  run_dir="$run_dir-$$"
fi
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
echo "== logs, results and charts of this run: $run_dir"

# ---- processes -----------------------------------------------------------------------------
declare -A pid_of=() log_of=()
running=()  # names of the processes to watch and stop, in start order

# Stops the named processes in the order given (default: all, the last started first), one
# after the other so that none loses a peer it still needs (a prefill still registering with
# the bootstrap server): SIGTERM, up to 10 s to drain and exit, then SIGKILL.
stop_processes() {
  local names=("$@") name pid i
  if ((${#names[@]} == 0)); then
    for ((i = ${#running[@]} - 1; i >= 0; i--)); do
      names+=("${running[$i]}")
    done
  fi
  for name in "${names[@]}"; do
    pid="${pid_of[$name]}"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "demo: $name (pid $pid) still running 10 s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    forget "$name"
  done
}

# Stops watching NAME (it has exited).
forget() {
  local keep=() name
  for name in "${running[@]}"; do
    [[ "$name" == "$1" ]] || keep+=("$name")
  done
  running=("${keep[@]}")
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if ((${#running[@]})); then
    echo "== stopping every process the demo started (the last started first): ${running[*]}"
    stop_processes
  fi
  # Anything else this shell started (a health probe, a timer) goes too.
  pkill -KILL -P $$ 2>/dev/null || true
  wait 2>/dev/null || true
  if ((rc == 130 || rc == 143)); then
    echo "demo: stopped after $(elapsed) (exit $rc); logs in $run_dir"
  elif ((rc != 0)); then
    echo "demo: FAILED after $(elapsed) (exit $rc); logs in $run_dir"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "demo: interrupted"; exit 130' INT
trap 'echo "demo: terminated"; exit 143' TERM

# start NAME ARGS...: runs `crescent ARGS...` in the background, output to RUN_DIR/NAME.log.
start() {
  local name="$1"
  shift
  log_of[$name]="$run_dir/$name.log"
  echo "crescent $*" > "${log_of[$name]}"
  "$bin" "$@" >> "${log_of[$name]}" 2>&1 &
  pid_of[$name]=$!
  running+=("$name")
  echo "   $name: crescent $* (pid ${pid_of[$name]}, log $name.log)"
}

# Exits 1 naming the first watched process that is no longer running, with its log's end.
stage="the start"
check_alive() {
  local name pid rc
  for name in "${running[@]}"; do
    pid="${pid_of[$name]}"
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" 2>/dev/null || rc=$?
      forget "$name"
      echo "demo: $name (pid $pid) exited with status $rc during $stage; last lines of ${log_of[$name]}:" >&2
      tail -n 25 "${log_of[$name]}" | sed 's/^/   | /' >&2
      exit 1
    fi
  done
}

# Sets port_of[NAME] from NAME's "listening on http://127.0.0.1:PORT" line once it is written.
declare -A port_of=()
listening_port() {
  local name="$1" deadline=$(($(date +%s) + startup_timeout_s)) port
  while (($(date +%s) < deadline)); do
    port=$(grep -o -m1 'listening on http://127\.0\.0\.1:[0-9]*' "${log_of[$name]}" | sed 's/.*://' || true)
    if [[ -n "$port" ]]; then
      port_of[$name]="$port"
      return 0
    fi
    check_alive
    sleep 0.1
  done
  die "$name wrote no 'listening on' line within $startup_timeout_s s (see ${log_of[$name]})"
}

# The HTTP status of GET http://127.0.0.1:PORT/PATH, or 000 (bash's /dev/tcp: no curl needed).
http_status() {
  # shellcheck disable=SC2016  # expanded by the inner bash
  timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" "$1" >&3
    read -r _ code _ <&3 && echo "$code"' "$1" "$2" 2>/dev/null || echo 000
}

# Waits until GET PORT/PATH answers 200, while every watched process stays alive.
wait_ready() {
  local name="$1" port="$2" path="$3" deadline=$(($(date +%s) + startup_timeout_s)) code=000
  while (($(date +%s) < deadline)); do
    code=$(http_status "$port" "$path")
    [[ "$code" == 200 ]] && return 0
    check_alive
    sleep 0.2
  done
  die "$name did not answer 200 on http://127.0.0.1:$port$path within $startup_timeout_s s (last: $code; see ${log_of[$name]})"
}

# load_args: bench_args (the main stream) and long_args (the long prompts beside it, if any)
# from num_prompts, request_rate and long_num_prompts.
load_args() {
  # shellcheck disable=SC2054  # "90,99" is one argument
  bench_args=(--model "$model" --dataset-name random --random-input-len "$input_len"
              --random-output-len "$output_len" --num-prompts "$num_prompts"
              --request-rate "$request_rate" --seed "$seed" --no-progress
              --metric-percentiles 90,99 --request-timeout-s "$bench_timeout_s")
  [[ -z "$max_concurrency" ]] || bench_args+=(--max-concurrency "$max_concurrency")
  # shellcheck disable=SC2206  # the SLO pairs are separate arguments
  [[ -z "$goodput" ]] || bench_args+=(--goodput $goodput)
  long_args=()
  if ((long_input_len > 0 && long_num_prompts > 0)); then
    # Spread over the main stream's schedule: num_prompts / rate seconds.
    local long_rate
    long_rate=$(awk -v n="$long_num_prompts" -v m="$num_prompts" -v r="$request_rate" \
      'BEGIN { if (r == "inf") print "inf"; else printf "%.4f", n * r / m }')
    # shellcheck disable=SC2054  # "90,99" is one argument
    long_args=(--model "$model" --dataset-name random --random-input-len "$long_input_len"
               --random-output-len "$long_output_len" --num-prompts "$long_num_prompts"
               --request-rate "$long_rate" --burstiness inf --seed "$((seed + 1))" --no-progress
               --metric-percentiles 90,99 --request-timeout-s "$bench_timeout_s")
    # shellcheck disable=SC2206
    [[ -z "$goodput" ]] || long_args+=(--goodput $goodput)
  fi
}
load_args

# sweep_load RATE: the sweep's load at RATE req/s (DEMO_SWEEP_SECONDS of it), the long prompts
# in the default run's proportion to the short ones.
sweep_load() {
  request_rate="$1"
  num_prompts=$(awk -v r="$1" -v t="$sweep_seconds" 'BEGIN { n = int(r * t + 0.5); print (n < 1 ? 1 : n) }')
  if ((long_input_len > 0)); then
    long_num_prompts=$(awk -v n="$num_prompts" -v l="$default_long_num_prompts" -v m="$default_num_prompts" \
      'BEGIN { k = int(n * l / m + 0.5); print (k < 1 ? 1 : k) }')
  fi
  load_args
}

# any_failed STEM...: whether a benchmark's report (bench-STEM.log) counts a failed request.
any_failed() {
  local stem n
  for stem in "$@"; do
    n=$(sed -n 's/^Failed requests: *\([0-9]*\).*/\1/p' "$run_dir/bench-$stem.log" | head -n1)
    [[ "$n" == 0 ]] || return 0
  done
  return 1
}

# What the benchmark client runs under (the epd mode may pin it with DEMO_FRONT_CPUS).
bench_prefix=()
# bench LABEL FILE_STEM PORT: the benchmark against 127.0.0.1:PORT, watching every process.
bench() {
  local label="$1" stem="$2" port="$3" rc=0 long_pid=""
  local url="http://127.0.0.1:$port"
  echo "== benchmark $label: crescent bench serve --base-url $url ${bench_args[*]} --label $label --save-result $stem.json"
  "${bench_prefix[@]}" "$bin" bench serve --base-url "$url" "${bench_args[@]}" --label "$label" \
    --save-result "$run_dir/$stem.json" --save-detailed > "$run_dir/bench-$stem.log" 2>&1 &
  local bench_pid=$!
  stage="the $label benchmark"
  if [[ "$request_rate" != inf ]]; then
    echo "   (requests are sent for $(awk -v n="$num_prompts" -v r="$request_rate" 'BEGIN { printf "%.0f", n / r }') s;" \
      "the report follows when the last one ends; live output in bench-$stem.log)"
  fi
  if ((${#long_args[@]})); then
    echo "   beside it, long prompts: crescent bench serve --base-url $url ${long_args[*]} --label $label-long --save-result $stem-long.json"
    "$bin" bench serve --base-url "$url" "${long_args[@]}" --label "$label-long" \
      --save-result "$run_dir/$stem-long.json" > "$run_dir/bench-$stem-long.log" 2>&1 &
    long_pid=$!
  fi
  local deadline=$(($(date +%s) + bench_timeout_s + 60))
  while kill -0 "$bench_pid" 2>/dev/null || { [[ -n "$long_pid" ]] && kill -0 "$long_pid" 2>/dev/null; }; do
    check_alive
    (($(date +%s) < deadline)) || die "the $label benchmark did not end within $((bench_timeout_s + 60)) s"
    sleep 0.3
  done
  wait "$bench_pid" || rc=$?
  # The report block, as `vllm bench serve` prints it.
  sed -n '/Serving Benchmark Result/,/^=\{50\}$/p' "$run_dir/bench-$stem.log" | sed 's/ *$//'
  if ((rc != 0)); then
    echo "demo: the $label benchmark failed (exit $rc); last lines of bench-$stem.log:" >&2
    tail -n 25 "$run_dir/bench-$stem.log" | sed 's/^/   | /' >&2
    exit 1
  fi
  if [[ -n "$long_pid" ]]; then
    rc=0
    wait "$long_pid" || rc=$?
    if ((rc != 0)); then
      echo "demo: the $label long-prompt benchmark failed (exit $rc); last lines:" >&2
      tail -n 25 "$run_dir/bench-$stem-long.log" | sed 's/^/   | /' >&2
      exit 1
    fi
  fi
}

p_threads=$((cores / 2 > 0 ? cores / 2 : 1))
d_threads=$((cores - p_threads > 0 ? cores - p_threads : 1))
serve_args=(--model "$model" --host 127.0.0.1 --io-threads 1 --kv-cache-mb 256
            --drain-timeout-s 5)

if [[ "$mode" == epd ]]; then
  # ---- EPD: the same cores, split by taskset ---------------------------------------------------
  command -v taskset >/dev/null || die "the epd demo pins workers with taskset (util-linux)"
  # This process's CPUs as a list ("0-2,5" -> 0 1 2 5), the first $cores of them.
  allowed=()
  IFS=',' read -r -a ranges <<<"$(taskset -pc $$ | sed 's/.*: *//')"
  for range in "${ranges[@]}"; do
    if [[ "$range" == *-* ]]; then
      for ((c = ${range%-*}; c <= ${range#*-}; c++)); do allowed+=("$c"); done
    else
      allowed+=("$range")
    fi
  done
  ((${#allowed[@]} >= cores)) || die "DEMO_CORES=$cores but this process may use ${#allowed[@]} CPU(s)"
  allowed=("${allowed[@]:0:$cores}")
  join() { local IFS=,; echo "$*"; }
  all_cpus=$(join "${allowed[@]}")
  if ((cores == 1)); then
    e_cpus="$all_cpus" p_cpus="$all_cpus" d_cpus="$all_cpus"
  else
    rest=("${allowed[@]:0:cores-1}")
    d_cpus="${allowed[cores - 1]}"
    if ((${#rest[@]} == 1)); then
      e_cpus="${rest[0]}" p_cpus="${rest[0]}"
    else
      half=$(((${#rest[@]} + 1) / 2))
      e_cpus=$(join "${rest[@]:0:half}") p_cpus=$(join "${rest[@]:half}")
    fi
  fi
  e_cpus="${DEMO_E_CPUS:-$e_cpus}" p_cpus="${DEMO_P_CPUS:-$p_cpus}" d_cpus="${DEMO_D_CPUS:-$d_cpus}"
  # The proxy and the benchmark client (pinned the same way in both set-ups) share the CPUs of
  # E and P, not D's: relaying a token is short but must not wait, and D's core is for decode
  # steps (with them unpinned, the proxy's work on each 3.7 MB image request landed on D's
  # core and stalled its steps). E and P run under nice (bulk stages: encoding and prefill
  # take tens of ms each), so the relay on their core goes first.
  default_front="$e_cpus"
  [[ "$p_cpus" == "$e_cpus" ]] || default_front="$e_cpus,$p_cpus"
  [[ "$d_cpus" != "$e_cpus" && "$d_cpus" != "$p_cpus" ]] || default_front=""
  front_cpus="${DEMO_FRONT_CPUS-$default_front}"
  e_nice="${DEMO_E_NICE:-10}" p_nice="${DEMO_P_NICE:-5}"
  prefill_images="${DEMO_PREFILL_IMAGES:-ref}"
  [[ "$prefill_images" == full || "$prefill_images" == ref ]] ||
    die "DEMO_PREFILL_IMAGES must be full or ref, got '$prefill_images'"
  for knob in DEMO_E_NICE:"$e_nice" DEMO_P_NICE:"$p_nice"; do
    value="${knob#*:}"
    [[ "$value" == idle || "$value" =~ ^-?[0-9]+$ ]] ||
      die "${knob%%:*} must be a niceness (-20..19) or idle, got '$value'"
  done
  if [[ -n "$front_cpus" ]]; then bench_prefix=(taskset -c "$front_cpus"); fi
  num_cpus() { taskset -c "$1" nproc; }
  e_threads=$(num_cpus "$e_cpus") p_threads=$(num_cpus "$p_cpus") d_threads=$(num_cpus "$d_cpus")
  ec_transport="${DEMO_EC_TRANSPORT:-shm}"
  default_buckets='{(720, 1280, 1): 1.0}'
  mm_buckets="${DEMO_MM_BUCKETS:-$default_buckets}"
  mm_items="${DEMO_MM_ITEMS:-1}"
  if ! is_uint "$mm_items" || ((mm_items == 0)); then
    die "DEMO_MM_ITEMS must be a positive whole number"
  fi
  # shellcheck disable=SC2054  # "90,99" is one argument
  bench_args=(--model "$model" --endpoint /v1/chat/completions --dataset-name random-mm
              --random-input-len "$input_len" --random-output-len "$output_len"
              --random-mm-base-items-per-request "$mm_items"
              --random-mm-limit-mm-per-prompt "{\"image\": $mm_items}"
              --random-mm-bucket-config "$mm_buckets" --ignore-eos
              --num-prompts "$num_prompts" --request-rate "$request_rate" --seed "$seed"
              --no-progress --metric-percentiles 50,90,99 --request-timeout-s "$bench_timeout_s")
  [[ -z "$max_concurrency" ]] || bench_args+=(--max-concurrency "$max_concurrency")
  long_args=()
  vl_args=(--limit-mm-per-prompt "image=$mm_items")

  # start_pinned NAME CPUS ARGS...: start, under taskset -c CPUS (and nice -n $NICE when the
  # caller sets NICE).
  start_pinned() {
    local name="$1" cpus="$2"
    shift 2
    local prefix=(taskset -c "$cpus")
    if [[ "${NICE:-0}" == idle ]]; then
      prefix=(chrt --idle 0 "${prefix[@]}")
    elif [[ -n "${NICE:-}" && "${NICE:-0}" != 0 ]]; then
      prefix=(nice -n "$NICE" "${prefix[@]}")
    fi
    log_of[$name]="$run_dir/$name.log"
    echo "${prefix[*]} crescent $*" > "${log_of[$name]}"
    "${prefix[@]}" "$bin" "$@" >> "${log_of[$name]}" 2>&1 &
    pid_of[$name]=$!
    running+=("$name")
    echo "   $name: ${prefix[*]} crescent $* (pid ${pid_of[$name]}, log $name.log)"
  }
  # metric PORT NAME: the sum of NAME's series in PORT's /metrics (0 when absent).
  metric() {
    local text
    # shellcheck disable=SC2016  # expanded by the inner bash
    text=$(timeout 5 bash -c '
      exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
      printf "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" >&3
      cat <&3' "$1" 2>/dev/null || true)
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.6f", s + 0 }' <<<"$text"
  }

  echo "== 1E1P1D on 127.0.0.1: encoder on CPU(s) $e_cpus ($e_threads thread(s)), prefill on" \
    "$p_cpus ($p_threads), decode on $d_cpus ($d_threads); the proxy and the benchmark client" \
    "on ${front_cpus:-any CPU}; E at nice $e_nice, P at nice $p_nice; P gets images as" \
    "--prefill-images $prefill_images"
  stage="the start of the 1E1P1D cluster"
  start bootstrap bootstrap --host 127.0.0.1 --port "${DEMO_BOOTSTRAP_PORT:-0}"
  listening_port bootstrap
  bootstrap_port="${port_of[bootstrap]}"
  NICE="$e_nice" start_pinned encode "$e_cpus" serve "${serve_args[@]}" "${vl_args[@]}" --port 0 --role encode \
    --threads "$e_threads" --ec-transport "$ec_transport"
  NICE="$p_nice" start_pinned prefill "$p_cpus" serve "${serve_args[@]}" "${vl_args[@]}" \
    --port "${DEMO_PREFILL_PORT:-0}" --role prefill --threads "$p_threads" \
    --kv-transport "$kv_transport" --ec-transport "$ec_transport" \
    --bootstrap-addr "http://127.0.0.1:$bootstrap_port"
  start_pinned decode "$d_cpus" serve "${serve_args[@]}" "${vl_args[@]}" \
    --port "${DEMO_DECODE_PORT:-0}" --role decode --threads "$d_threads" \
    --kv-transport "$kv_transport"
  for name in encode prefill decode; do
    listening_port "$name"
  done
  for name in encode prefill decode; do
    wait_ready "$name" "${port_of[$name]}" /health
  done
  wait_ready bootstrap "$bootstrap_port" /query
  proxy_cpus="${DEMO_PROXY_CPUS:-$front_cpus}"
  proxy_args=(proxy --host 127.0.0.1 --port "${DEMO_PROXY_PORT:-0}"
              --io-threads "${DEMO_PROXY_IO_THREADS:-2}" --prefill-images "$prefill_images"
              --drain-timeout 5 --encode "http://127.0.0.1:${port_of[encode]}"
              --prefill "http://127.0.0.1:${port_of[prefill]}" "$bootstrap_port"
              --decode "http://127.0.0.1:${port_of[decode]}")
  if [[ -n "$proxy_cpus" ]]; then
    start_pinned proxy "$proxy_cpus" "${proxy_args[@]}"
  else
    start proxy "${proxy_args[@]}"
  fi
  listening_port proxy
  wait_ready proxy "${port_of[proxy]}" /health
  echo "   ready at +$(elapsed): encode :${port_of[encode]}, prefill :${port_of[prefill]}," \
    "decode :${port_of[decode]}, proxy :${port_of[proxy]} (EC over $ec_transport, KV over $kv_transport)"
  bench 1E1P1D epd "${port_of[proxy]}"
  # Where the time went, from the servers' own counters.
  e_images=$(metric "${port_of[encode]}" crescent_encoder_images_total)
  e_seconds=$(metric "${port_of[encode]}" crescent_encoder_seconds_total)
  p_pulled=$(metric "${port_of[prefill]}" crescent_ec_images_pulled_total)
  p_pull_s=$(metric "${port_of[prefill]}" crescent_ec_pull_seconds_total)
  p_pull_bytes=$(metric "${port_of[prefill]}" crescent_ec_pulled_bytes_total)
  p_encoded=$(metric "${port_of[prefill]}" crescent_encoder_images_total)
  p_fallbacks=$(metric "${port_of[prefill]}" crescent_ec_fallback_local_total)
  p_ttft_s=$(metric "${port_of[prefill]}" crescent_time_to_first_token_seconds_sum)
  p_ttft_n=$(metric "${port_of[prefill]}" crescent_time_to_first_token_seconds_count)
  # Token gaps as D wrote them (its own stalls), against those the client saw (which add the
  # proxy's relay and the client's own scheduling).
  itl_name=crescent_inter_token_latency_seconds
  d_itl_n=$(metric "${port_of[decode]}" "${itl_name}_count")
  d_itl_3=$(metric "${port_of[decode]}" "${itl_name}_bucket{le=\"0.003\"}")
  d_itl_5=$(metric "${port_of[decode]}" "${itl_name}_bucket{le=\"0.005\"}")
  echo "== stopping the 1E1P1D cluster"
  stop_processes proxy decode prefill encode bootstrap

  echo "== colocated on 127.0.0.1: one crescent serve --role both on CPU(s) $all_cpus ($cores thread(s))"
  stage="the start of the colocated server"
  start_pinned colocated "$all_cpus" serve "${serve_args[@]}" "${vl_args[@]}" \
    --port "${DEMO_BOTH_PORT:-0}" --role both --threads "$cores"
  listening_port colocated
  wait_ready colocated "${port_of[colocated]}" /health
  echo "   ready at +$(elapsed): colocated :${port_of[colocated]}"
  bench colocated colocated "${port_of[colocated]}"
  c_images=$(metric "${port_of[colocated]}" crescent_encoder_images_total)
  c_seconds=$(metric "${port_of[colocated]}" crescent_encoder_seconds_total)
  c_itl_n=$(metric "${port_of[colocated]}" "${itl_name}_count")
  c_itl_3=$(metric "${port_of[colocated]}" "${itl_name}_bucket{le=\"0.003\"}")
  c_itl_5=$(metric "${port_of[colocated]}" "${itl_name}_bucket{le=\"0.005\"}")
  echo "== stopping the colocated server"
  stop_processes colocated

  echo
  echo "== 1E1P1D (E on $e_cpus, P on $p_cpus, D on $d_cpus) vs colocated (on $all_cpus):" \
    "crescent bench compare --labels 1E1P1D,colocated epd.json colocated.json"
  "$bin" bench compare --labels 1E1P1D,colocated "$run_dir/epd.json" "$run_dir/colocated.json" |
    tee "$run_dir/compare.txt"
  echo
  {
    echo "where the time went (the servers' /metrics):"
    awk -v n="$e_images" -v s="$e_seconds" -v cn="$c_images" -v cs="$c_seconds" \
      -v pn="$p_pulled" -v ps="$p_pull_s" -v pb="$p_pull_bytes" -v pe="$p_encoded" \
      -v pf="$p_fallbacks" -v pts="$p_ttft_s" -v ptn="$p_ttft_n" 'BEGIN {
      printf("  encode per image: %.1f ms on the encoder (%d images), %.1f ms colocated (%d images)\n",
             (n > 0 ? 1e3 * s / n : 0), n, (cn > 0 ? 1e3 * cs / cn : 0), cn)
      printf("  EC pull on the prefill worker: %.2f ms per image, %.2f GB/s (%d images, %.1f MiB in all);",
             (pn > 0 ? 1e3 * ps / pn : 0), (ps > 0 ? pb / ps / 1e9 : 0), pn, pb / 1048576)
      printf(" images the prefill worker encoded itself: %d (fallbacks %d)\n", pe, pf)
      printf("  the prefill worker, arrival to its one token (queue + EC pull + prefill): %.1f ms mean over %d requests\n",
             (ptn > 0 ? 1e3 * pts / ptn : 0), ptn) }'
    awk -v dn="$d_itl_n" -v d3="$d_itl_3" -v d5="$d_itl_5" -v cn="$c_itl_n" -v c3="$c_itl_3" \
      -v c5="$c_itl_5" 'function pct(k, n) { return n > 0 ? 100 * k / n : 0 }
      BEGIN {
      printf("  token gaps as the server wrote them (crescent_inter_token_latency_seconds): over 3 ms %d of %d (%.1f%%) on D, %d of %d (%.1f%%) colocated;",
             dn - d3, dn, pct(dn - d3, dn), cn - c3, cn, pct(cn - c3, cn))
      printf(" over 5 ms %d (%.1f%%) on D, %d (%.1f%%) colocated\n", dn - d5, pct(dn - d5, dn), cn - c5, pct(cn - c5, cn)) }'
    # The verdict, from the two result files: ITL p99 (a decode step stalled by an encode or a
    # prefill shows there first), TPOT p99 and TTFT median. Within 10%: "about the same", the
    # run-to-run spread of this machine (docs/epd_benchmark.md).
    jq -r -s '
      def r(k): if (.[1][k] // 0) > 0 then (.[0][k] / .[1][k]) else null end;
      def word(x): if x == null then "n/a" elif x < 0.9 then "lower" elif x > 1.1 then "higher" else "about the same" end;
      def f(x): if x == null then "n/a" else (x * 100 | round / 100 | tostring) + "x" end;
      def v(i; k): (.[i][k] // 0) * 10 | round / 10 | tostring;
      . as $runs
      | [["ITL p99", "p99_itl_ms"], ["TPOT p99", "p99_tpot_ms"], ["TTFT median", "median_ttft_ms"],
         ["TTFT p99", "p99_ttft_ms"]]
      | map(. as [$name, $k] | ($runs | r($k)) as $x
            | {name: $name, x: $x, text: "\($name) \(word($x)) (\($runs | v(0; $k)) vs \($runs | v(1; $k)) ms, \(f($x)))"})
      | (map(select(.x != null and .x < 0.9) | .name)) as $wins
      | (map(select(.x != null and .x > 1.1) | .name)) as $losses
      | "1E1P1D vs colocated, one run each: " + (map(.text) | join("; ")) + ". "
        + (if ($wins | length) > 0 then "1E1P1D wins on " + ($wins | join(", ")) else "1E1P1D wins on none of these" end)
        + (if ($losses | length) > 0 then "; colocated wins on " + ($losses | join(", ")) else "; colocated wins on none" end)
        + " (differences under 10% read as the same)."
    ' "$run_dir/epd.json" "$run_dir/colocated.json"
  } | tee "$run_dir/verdict.txt"

  failed=0
  if any_failed epd colocated; then failed=1; fi
  echo
  echo "== done in $(elapsed). Every process the demo started has stopped."
  echo "   logs: $run_dir/{bootstrap,encode,prefill,decode,proxy,colocated}.log"
  echo "   benchmark output: bench-epd.log, bench-colocated.log; results: epd.json, colocated.json;" \
    "verdict.txt, compare.txt"
  echo "   The weights are random; the work is real: image decoding and preprocessing, the vision tower," \
    "EC pull, prefill, KV transfer, decode. See docs/epd_benchmark.md."
  ((failed == 0)) || die "some requests failed (see the reports above and the logs in $run_dir)"
  exit 0
fi

# ---- 1P1D: bootstrap, prefill, decode, proxy -----------------------------------------------
echo "== 1P1D on 127.0.0.1: a standalone bootstrap server, prefill ($p_threads thread(s)) registered" \
  "with it, decode ($d_threads thread(s)), proxy"
stage="the start of the 1P1D cluster"
start bootstrap bootstrap --host 127.0.0.1 --port "${DEMO_BOOTSTRAP_PORT:-0}"
listening_port bootstrap
bootstrap_port="${port_of[bootstrap]}"
start prefill serve "${serve_args[@]}" --port "${DEMO_PREFILL_PORT:-0}" --role prefill \
  --threads "$p_threads" --kv-transport "$kv_transport" \
  --bootstrap-addr "http://127.0.0.1:$bootstrap_port"
start decode serve "${serve_args[@]}" --port "${DEMO_DECODE_PORT:-0}" --role decode \
  --threads "$d_threads" --kv-transport "$kv_transport"
listening_port prefill
listening_port decode
prefill_port="${port_of[prefill]}"
decode_port="${port_of[decode]}"
wait_ready prefill "$prefill_port" /health
wait_ready decode "$decode_port" /health
wait_ready bootstrap "$bootstrap_port" /query
start proxy proxy --host 127.0.0.1 --port "${DEMO_PROXY_PORT:-0}" --io-threads 1 \
  --drain-timeout 5 --prefill "http://127.0.0.1:$prefill_port" "$bootstrap_port" \
  --decode "http://127.0.0.1:$decode_port"
listening_port proxy
proxy_port="${port_of[proxy]}"
wait_ready proxy "$proxy_port" /health
echo "   ready at +$(elapsed): bootstrap :$bootstrap_port, prefill :$prefill_port," \
  "decode :$decode_port, proxy :$proxy_port (KV over $kv_transport)"
if [[ "$mode" == sweep ]]; then
  for rate in $sweep_rates; do
    sweep_load "$rate"
    bench 1P1D "1p1d-r$rate" "$proxy_port"
  done
else
  bench 1P1D 1p1d "$proxy_port"
fi
echo "== stopping the 1P1D cluster"
stop_processes proxy decode prefill bootstrap

# ---- colocated: one --role both server on the same cores -----------------------------------
echo "== colocated on 127.0.0.1: one crescent serve --role both with $cores thread(s)"
stage="the start of the colocated server"
start colocated serve "${serve_args[@]}" --port "${DEMO_BOTH_PORT:-0}" --role both \
  --threads "$cores"
listening_port colocated
both_port="${port_of[colocated]}"
wait_ready colocated "$both_port" /health
echo "   ready at +$(elapsed): colocated :$both_port"
if [[ "$mode" == sweep ]]; then
  for rate in $sweep_rates; do
    sweep_load "$rate"
    bench colocated "colocated-r$rate" "$both_port"
  done
else
  bench colocated colocated "$both_port"
fi
echo "== stopping the colocated server"
stop_processes colocated

# ---- the comparison ------------------------------------------------------------------------
if [[ "$mode" == sweep ]]; then
  p_files="" c_files="" stems=()
  for rate in $sweep_rates; do
    p_files+="${p_files:+,}$run_dir/1p1d-r$rate.json"
    c_files+="${c_files:+,}$run_dir/colocated-r$rate.json"
    stems+=("1p1d-r$rate" "colocated-r$rate")
  done
  echo
  echo "== the sweep: crescent bench sweep-report --labels 1P1D,colocated --svg sweep.svg" \
    "1p1d-r*.json colocated-r*.json"
  "$bin" bench sweep-report --labels 1P1D,colocated --svg "$run_dir/sweep.svg" \
    --title "1P1D ($p_threads + $d_threads threads) vs colocated ($cores): $input_len in / $output_len out, ${long_input_len}-token prompts beside" \
    "$p_files" "$c_files" | tee "$run_dir/sweep.txt"
  failed=0
  if any_failed "${stems[@]}"; then failed=1; fi
  echo
  echo "== done in $(elapsed). Every process the demo started has stopped."
  echo "   results: $run_dir/{1p1d,colocated}-r<rate>.json; table and sentence: sweep.txt;"
  echo "   chart (open in a browser): sweep.svg"
  ((failed == 0)) || die "some requests failed (see the reports above and the logs in $run_dir)"
  exit 0
fi
echo
echo "== 1P1D ($p_threads + $d_threads threads, proxy, KV over $kv_transport) vs colocated ($cores threads):" \
  "crescent bench compare --explain pd 1p1d.json colocated.json"
"$bin" bench compare --explain pd "$run_dir/1p1d.json" "$run_dir/colocated.json" |
  tee "$run_dir/compare.txt"
if ((${#long_args[@]})); then
  echo
  echo "== the long prompts sent beside them: crescent bench compare 1p1d-long.json colocated-long.json"
  "$bin" bench compare --explain pd "$run_dir/1p1d-long.json" "$run_dir/colocated-long.json" |
    tee "$run_dir/compare-long.txt"
fi

failed=0
if any_failed 1p1d colocated; then failed=1; fi
echo
echo "== done in $(elapsed). Every process the demo started has stopped."
echo "   logs: $run_dir/{bootstrap,prefill,decode,proxy,colocated}.log"
echo "   benchmark output: bench-1p1d.log, bench-colocated.log; results: 1p1d.json, colocated.json;"
echo "   charts (open in a browser): 1p1d.svg, colocated.svg"
echo "   The weights are random, so the text is not meant to read well; the work is real: tokenizer,"
echo "   paged KV cache, scheduler, kernels, KV transfer between processes. See docs/demo.md."
if ((failed)); then
  die "some requests failed (see the reports above and the logs in $run_dir)"
fi
