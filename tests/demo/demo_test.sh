#!/usr/bin/env bash
# Tests of scripts/demo.sh and `crescent bench compare`, run by ctest (tests/demo/CMakeLists.txt).
#
#   tests/demo/demo_test.sh --scenario NAME --crescent BIN --work-dir DIR [--sanitized]
#
# Scenarios:
#   short         the demo shortened (tiny model, a handful of prompts, DEMO_SKIP_BUILD=1 with
#                 BIN): exit 0, both reports and the side-by-side table printed, the comparison
#                 sentence, the run directory's files, and no process it started left running.
#   sweep-short   `demo.sh sweep` over two rates: four reports, the sweep table, its sentence,
#                 sweep.svg and the per-rate results, nothing left running.
#   process-dies  the decode server cannot start (its port is taken): the demo names it, shows
#                 its log, exits 1 and leaves nothing running.
#   interrupted   SIGINT to the demo (as Ctrl-C) during the 1P1D benchmark: exit 130, nothing
#                 left running.
#   bad-knobs     bad DEMO_* values are refused with a message before anything starts.
#   compare       `crescent bench compare` on hand-written results: the table's values and
#                 ratios, the sentence's directions, setting differences, and bad input.
# --sanitized: the binary is an ASan/TSan build (several times slower): fewer, shorter prompts.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
scenario=""
crescent=""
work_dir=""
sanitized=0
while (($#)); do
  case "$1" in
    --scenario) scenario="${2:?}"; shift 2 ;;
    --crescent) crescent="${2:?}"; shift 2 ;;
    --work-dir) work_dir="${2:?}"; shift 2 ;;
    --sanitized) sanitized=1; shift ;;
    *) echo "demo_test: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$scenario" && -n "$crescent" && -n "$work_dir" ]] ||
  { echo "demo_test: --scenario, --crescent and --work-dir are required" >&2; exit 2; }
[[ -x "$crescent" ]] || { echo "demo_test: $crescent is not an executable" >&2; exit 1; }
mkdir -p "$work_dir"
work_dir="$(cd "$work_dir" && pwd)"
out_dir="$work_dir/$scenario"
rm -rf "$out_dir"
mkdir -p "$out_dir"

fail() {
  echo "demo_test ($scenario): FAIL: $*" >&2
  exit 1
}
expect_in() {  # expect_in FILE PATTERN WHAT
  grep -q -E -- "$2" "$1" || fail "$3 (no line matching '$2' in $1)"
}

# The pids the demo announced ("(pid N, log ...)"); each must be gone once it has exited.
check_nothing_left() {
  local output="$1" pids pid
  pids=$(grep -o '(pid [0-9]*' "$output" | sed 's/(pid //' || true)
  [[ -n "$pids" ]] || fail "the demo announced no pids"
  for pid in $pids; do
    if kill -0 "$pid" 2>/dev/null && grep -q crescent "/proc/$pid/cmdline" 2>/dev/null; then
      fail "process $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline")) is still running after the demo exited"
    fi
  done
  # And nothing at all on the test's own model directory (every server names it in --model).
  if pgrep -f -- "--model $model_dir" >/dev/null; then
    fail "a crescent process on $model_dir is still running: $(pgrep -a -f -- "--model $model_dir")"
  fi
}

# The model: the tiny preset, made by the demo itself (under a second), in this scenario's own
# directory. Own, not the tree's shared test-models/: ctest runs scenarios (and other tests
# serving the tiny model) in parallel, so a shared path would let the "nothing left on the
# model directory" check below see their processes, and two demos could write it at once.
model_dir="$out_dir/model"
common_env=(DEMO_SKIP_BUILD=1 CRESCENT_BIN="$crescent" DEMO_MODEL_DIR="$model_dir"
            DEMO_MODEL_PRESET=tiny DEMO_LOG_DIR="$out_dir/logs" DEMO_CORES=2
            DEMO_INPUT_LEN=32 DEMO_OUTPUT_LEN=8 DEMO_LONG_INPUT_LEN=96)
if ((sanitized)); then
  common_env+=(DEMO_NUM_PROMPTS=3 DEMO_REQUEST_RATE=inf DEMO_STARTUP_TIMEOUT_S=120
               DEMO_LONG_NUM_PROMPTS=1)
else
  common_env+=(DEMO_NUM_PROMPTS=8 DEMO_REQUEST_RATE=16 DEMO_LONG_NUM_PROMPTS=2)
fi

case "$scenario" in
  short)
    rc=0
    env "${common_env[@]}" bash "$repo/scripts/demo.sh" > "$out_dir/output.txt" 2>&1 || rc=$?
    cat "$out_dir/output.txt"
    ((rc == 0)) || fail "the demo exited $rc"
    out="$out_dir/output.txt"
    [[ $(grep -c 'Serving Benchmark Result' "$out") == 2 ]] || fail "expected two benchmark reports"
    expect_in "$out" '^ +1P1D +colocated +A/B$' "the side-by-side table's header"
    expect_in "$out" '^Successful requests +[0-9]+ +[0-9]+' "the side-by-side table"
    expect_in "$out" '^P99 TPOT \(ms\) +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "TPOT p99 in both columns"
    # The sentence names TPOT, TTFT and throughput; the one that differs most comes first, so
    # their order depends on the run (under ASan, TTFT led).
    for topic in TPOT TTFT throughput; do
      expect_in "$out" "^1P1D vs colocated: .*$topic" "the comparison sentence ($topic)"
    done
    expect_in "$out" 'Failed requests: +0$' "no failed request"
    # Under sanitizers a side may have no good request at all: no ratio then ("-").
    expect_in "$out" '^Request goodput \(req/s\) +[0-9.]+ +[0-9.]+ +([0-9.]+x|-)$' \
      "goodput under the default SLOs in both columns"
    expect_in "$out" '^1P1D vs colocated: goodput is ([0-9.]+x|above zero only for 1P1D|zero for both) .* within itl <= 250, tpot <= 50, ttft <= 3000 ms' \
      "the sentence leading with goodput"
    expect_in "$out" '^== the long prompts sent beside them' "the long prompts' own comparison"
    expect_in "$out" '== logs, results and charts of this run: ' "the run directory at the start"
    expect_in "$out" 'a standalone bootstrap server' "what runs"
    run_dir=$(sed -n 's/^== logs, results and charts of this run: //p' "$out")
    for f in bootstrap.log prefill.log decode.log proxy.log colocated.log 1p1d.json colocated.json \
             bench-1p1d.log bench-colocated.log compare.txt; do
      [[ -s "$run_dir/$f" ]] || fail "$run_dir/$f is missing or empty"
    done
    expect_in "$run_dir/prefill.log" '^crescent serve: bootstrap http://127\.0\.0\.1:[0-9]+' \
      "the prefill registered with the standalone bootstrap"
    expect_in "$run_dir/prefill.log" 'kv connector: decode engine .* connected' \
      "the decode engine fetched KV from the prefill engine"
    if grep -l -E 'ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:|ERROR: LeakSanitizer' \
         "$run_dir"/*.log; then
      fail "a sanitizer report in the logs above"
    fi
    check_nothing_left "$out"
    ;;
  sweep-short)
    # scripts/demo.sh sweep over two rates, a second of requests each.
    rc=0
    env "${common_env[@]}" DEMO_SWEEP_RATES="4 8" DEMO_SWEEP_SECONDS=1 \
      bash "$repo/scripts/demo.sh" sweep > "$out_dir/output.txt" 2>&1 || rc=$?
    cat "$out_dir/output.txt"
    ((rc == 0)) || fail "the sweep exited $rc"
    out="$out_dir/output.txt"
    [[ $(grep -c 'Serving Benchmark Result' "$out") == 4 ]] || fail "expected four benchmark reports"
    expect_in "$out" '^Goodput under itl <= 250, tpot <= 50, ttft <= 3000 ms' "the sweep table's SLOs"
    expect_in "$out" '^ +4 +[0-9.]+ +[0-9.]+ +([0-9.]+x|-) ' "the 4 req/s row"
    expect_in "$out" '^ +8 +[0-9.]+ +[0-9.]+ +([0-9.]+x|-) ' "the 8 req/s row"
    expect_in "$out" '^1P1D vs colocated goodput by rate: 4 req/s .*, 8 req/s .*\. (Crossover|No crossover|Within 10% of each other up to)' \
      "the sweep sentence"
    run_dir=$(sed -n 's/^== logs, results and charts of this run: //p' "$out")
    for f in 1p1d-r4.json 1p1d-r8.json colocated-r4.json colocated-r8.json sweep.txt sweep.svg; do
      [[ -s "$run_dir/$f" ]] || fail "$run_dir/$f is missing or empty"
    done
    grep -q '<polyline' "$run_dir/sweep.svg" || fail "sweep.svg has no lines"
    check_nothing_left "$out"
    ;;
  epd-short)
    # scripts/demo.sh epd shortened: small images (224x224) so that sanitized builds encode them
    # in time, a handful of prompts.
    rc=0
    env DEMO_SKIP_BUILD=1 CRESCENT_BIN="$crescent" DEMO_MODEL_DIR="$out_dir/vl-model" \
      DEMO_LOG_DIR="$out_dir/logs" DEMO_CORES=2 DEMO_INPUT_LEN=16 DEMO_OUTPUT_LEN=8 \
      DEMO_NUM_PROMPTS=4 DEMO_REQUEST_RATE=inf DEMO_STARTUP_TIMEOUT_S=120 \
      DEMO_MM_BUCKETS='{(224, 224, 1): 1.0}' bash "$repo/scripts/demo.sh" epd \
      > "$out_dir/output.txt" 2>&1 || rc=$?
    cat "$out_dir/output.txt"
    ((rc == 0)) || fail "the epd demo exited $rc"
    out="$out_dir/output.txt"
    [[ $(grep -c 'Serving Benchmark Result' "$out") == 2 ]] || fail "expected two benchmark reports"
    [[ $(grep -c -E 'Failed requests: +0$' "$out") == 2 ]] || fail "expected no failed request"
    expect_in "$out" '^ +1E1P1D +colocated +A/B$' "the side-by-side table's header"
    expect_in "$out" '^1E1P1D vs colocated, one run each: ITL p99 ' "the verdict sentence"
    expect_in "$out" 'images the prefill worker encoded itself: 0 ' "P pulled every image"
    expect_in "$out" 'token gaps as the server wrote them .* on D, .* colocated' \
      "D's own token gaps against colocated's"
    expect_in "$out" 'P gets images as --prefill-images ref' "what runs"
    run_dir=$(sed -n 's/^== logs, results and charts of this run: //p' "$out")
    for f in bootstrap.log encode.log prefill.log decode.log proxy.log colocated.log epd.json \
             colocated.json compare.txt verdict.txt; do
      [[ -s "$run_dir/$f" ]] || fail "$run_dir/$f is missing or empty"
    done
    if grep -l -E 'ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:|ERROR: LeakSanitizer' \
         "$run_dir"/*.log; then
      fail "a sanitizer report in the logs above"
    fi
    check_nothing_left "$out"
    ;;
  process-dies)
    # A port held by this test (a bootstrap server on a free port): the decode server cannot
    # listen on it.
    "$crescent" bootstrap --host 127.0.0.1 --port 0 > "$out_dir/holder.log" 2>&1 &
    holder_pid=$!
    trap 'kill "$holder_pid" 2>/dev/null || true; wait "$holder_pid" 2>/dev/null || true' EXIT
    taken_port=""
    for _ in $(seq 300); do
      taken_port=$(grep -o -m1 'listening on http://127\.0\.0\.1:[0-9]*' "$out_dir/holder.log" | sed 's/.*://' || true)
      [[ -n "$taken_port" ]] && break
      sleep 0.1
    done
    [[ -n "$taken_port" ]] || fail "the port holder did not start: $(cat "$out_dir/holder.log")"
    rc=0
    env "${common_env[@]}" DEMO_DECODE_PORT="$taken_port" bash "$repo/scripts/demo.sh" \
      > "$out_dir/output.txt" 2>&1 || rc=$?
    cat "$out_dir/output.txt"
    ((rc == 1)) || fail "the demo exited $rc, not 1"
    out="$out_dir/output.txt"
    expect_in "$out" '^demo: decode \(pid [0-9]+\) exited with status [1-9][0-9]* during the start of the 1P1D cluster' \
      "the demo names the dead process"
    expect_in "$out" "^   \\| .*$taken_port" "the tail of its log (which names the port)"
    expect_in "$out" '^demo: FAILED after' "the failure line"
    grep -q 'SIGKILL' "$out" && fail "a process needed SIGKILL: the others must stop on SIGTERM"
    check_nothing_left "$out"
    ;;
  interrupted)
    set -m  # the demo in its own process group, so its SIGINT is not ignored as a background job's
    env "${common_env[@]}" DEMO_NUM_PROMPTS=200 DEMO_REQUEST_RATE=4 \
      bash "$repo/scripts/demo.sh" > "$out_dir/output.txt" 2>&1 &
    demo_pid=$!
    set +m
    out="$out_dir/output.txt"
    for _ in $(seq 1200); do
      grep -q '^== benchmark 1P1D' "$out" && break
      kill -0 "$demo_pid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q '^== benchmark 1P1D' "$out" || { cat "$out"; fail "the 1P1D benchmark never started"; }
    sleep 2
    kill -INT "$demo_pid"
    rc=0
    for _ in $(seq 600); do
      kill -0 "$demo_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$demo_pid" 2>/dev/null && { kill -KILL -- -"$demo_pid"; fail "the demo did not exit within 60 s of SIGINT"; }
    wait "$demo_pid" || rc=$?
    cat "$out"
    ((rc == 130)) || fail "the demo exited $rc after SIGINT, not 130"
    expect_in "$out" '^demo: interrupted' "the interruption is said"
    expect_in "$out" '^== stopping every process the demo started.*prefill' "the processes are stopped"
    expect_in "$out" '^demo: stopped after' "the stop is said"
    grep -q 'SIGKILL' "$out" && fail "a process needed SIGKILL: each must stop on SIGTERM"
    check_nothing_left "$out"
    ;;
  compare)
    a="$out_dir/a.json"
    b="$out_dir/b.json"
    cat > "$a" <<'JSON'
{"label": "disagg", "dataset_name": "random", "num_prompts": 10, "seed": 0, "request_rate": 2.0,
 "burstiness": 1.0, "max_concurrency": null, "duration": 5.0, "completed": 10, "failed": 0,
 "total_input_tokens": 5120, "total_output_tokens": 640, "request_throughput": 2.0,
 "output_throughput": 128.0, "max_concurrent_requests": 4,
 "mean_ttft_ms": 150.0, "median_ttft_ms": 140.0, "p99_ttft_ms": 300.0,
 "mean_tpot_ms": 20.0, "median_tpot_ms": 19.0, "p99_tpot_ms": 30.0,
 "median_itl_ms": 19.0, "p99_itl_ms": 40.0, "mean_e2el_ms": 1400.0, "p99_e2el_ms": 2000.0}
JSON
    cat > "$b" <<'JSON'
{"label": "together", "dataset_name": "random", "num_prompts": 10, "seed": 0, "request_rate": 2.0,
 "burstiness": 1.0, "max_concurrency": null, "duration": 5.1, "completed": 9, "failed": 1,
 "total_input_tokens": 4608, "total_output_tokens": 576, "request_throughput": 1.76,
 "output_throughput": 125.0, "max_concurrent_requests": 5,
 "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0,
 "mean_tpot_ms": 40.0, "median_tpot_ms": 38.0, "p99_tpot_ms": 60.0,
 "median_itl_ms": 38.0, "p99_itl_ms": 400.0, "mean_e2el_ms": 2600.0, "p99_e2el_ms": 4000.0}
JSON
    out="$out_dir/compare.txt"
    "$crescent" bench compare --explain pd "$a" "$b" > "$out" 2>&1 || { cat "$out"; fail "compare exited non-zero"; }
    cat "$out"
    expect_in "$out" '^Benchmark: random prompts, 10 requests, ~512 in / ~64 out tokens each, 2.00 req/s \(Poisson\)$' \
      "the benchmark's shape"
    expect_in "$out" '^ +disagg +together +A/B$' "labels from the files"
    expect_in "$out" '^Median TTFT \(ms\) +140.00 +100.00 +1.40x$' "median TTFT and its ratio"
    expect_in "$out" '^P99 TPOT \(ms\) +30.00 +60.00 +0.50x$' "TPOT p99 and its ratio"
    expect_in "$out" '^Failed requests +0 +1$' "failed requests"
    expect_in "$out" "^disagg vs together: TPOT p99 is 0.50x \\(30.0 vs 60.0 ms, median 0.50x\\): the decode engine's steps never wait behind a prefill; TTFT p99 is 1.50x \\(300.0 vs 200.0 ms, median 1.40x\\): each prompt goes through the proxy" \
      "the sentence: TPOT lower, TTFT higher, each with its reason"
    expect_in "$out" 'output throughput within 10%\.' "throughput about the same"
    expect_in "$out" 'Failed requests: 0 \(disagg\) and 1 \(together\)' "the failures named"
    grep -q 'note: the runs differ' "$out" && fail "the same settings were reported as different"
    grep -q '^P90 ' "$out" && fail "P90 rows shown though neither file has p90 figures"

    # A p90 figure in one file only: its row, with '-' for the other.
    sed 's/"p99_ttft_ms": 300.0/"p90_ttft_ms": 250.0, "p99_ttft_ms": 300.0/' "$a" > "$out_dir/e.json"
    "$crescent" bench compare "$out_dir/e.json" "$b" > "$out" 2>&1 || fail "compare exited non-zero"
    expect_in "$out" '^P90 TTFT \(ms\) +250.00 +- +-$' "an optional row present in one file"

    # Reversed, with --labels and no explanation: directions flip, no reasons.
    "$crescent" bench compare --labels X,Y "$b" "$a" > "$out" 2>&1 || { cat "$out"; fail "compare exited non-zero"; }
    expect_in "$out" '^X vs Y: TPOT p99 is 2.00x \(60.0 vs 30.0 ms, median 2.00x\); TTFT p99 is 0.67x \(200.0 vs 300.0 ms, median 0.71x\); output throughput within 10%\. Failed requests: 1 \(X\) and 0 \(Y\)' \
      "the reversed sentence"
    grep -q 'decode engine' "$out" && fail "reasons printed without --explain pd"

    # Only TTFT p99 differs: it leads, the median follows as a ratio.
    sed -e 's/"median_ttft_ms": 140.0/"median_ttft_ms": 105.0/' "$a" > "$out_dir/d.json"
    "$crescent" bench compare --explain pd "$out_dir/d.json" "$b" > "$out" 2>&1 || fail "compare exited non-zero"
    expect_in "$out" 'TTFT p99 is 1.50x \(300.0 vs 200.0 ms, median 1.05x\)' "TTFT p99 leading when the median is alike"

    # Goodput under the same SLOs in both: it leads, with the SLO whose misses differ most.
    sed -e 's/"max_concurrent_requests": 4,/"max_concurrent_requests": 4, "request_goodput": 1.8, "good_requests": 9, "goodput_slos_ms": {"itl": 500.0, "ttft": 3000.0}, "slo_met_requests": {"itl": 10, "ttft": 9},/' "$a" > "$out_dir/ga.json"
    sed -e 's/"max_concurrent_requests": 5,/"max_concurrent_requests": 5, "request_goodput": 0.59, "good_requests": 3, "goodput_slos_ms": {"itl": 500.0, "ttft": 3000.0}, "slo_met_requests": {"itl": 3, "ttft": 9},/' "$b" > "$out_dir/gb.json"
    "$crescent" bench compare --explain pd "$out_dir/ga.json" "$out_dir/gb.json" > "$out" 2>&1 || { cat "$out"; fail "compare exited non-zero"; }
    expect_in "$out" '^Request goodput \(req/s\) +1.80 +0.59 +3.05x$' "the goodput row"
    expect_in "$out" '^Requests within every SLO +9 +3$' "the good requests row"
    expect_in "$out" "^disagg vs together: goodput is 3.05x \\(1.80 vs 0.59 req/s: 9 of 10 vs 3 of 10 requests within itl <= 500, ttft <= 3000 ms; itl missed by 0 vs 7\\): the decode engine's steps never wait behind a prefill" \
      "the goodput finding leading the sentence"
    # Nobody good on B's side: no ratio, said in words.
    sed -e 's/"request_goodput": 0.59, "good_requests": 3/"request_goodput": 0.0, "good_requests": 0/' "$out_dir/gb.json" > "$out_dir/gz.json"
    "$crescent" bench compare "$out_dir/ga.json" "$out_dir/gz.json" > "$out" 2>&1 || fail "compare exited non-zero"
    expect_in "$out" '^disagg vs together: goodput is above zero only for disagg \(1.80 vs 0.00 req/s: 9 of 10 vs 0 of 10' \
      "a zero goodput on one side"
    # Different SLOs: no goodput finding.
    sed -e 's/"itl": 500.0/"itl": 200.0/' "$out_dir/gb.json" > "$out_dir/gc.json"
    "$crescent" bench compare "$out_dir/ga.json" "$out_dir/gc.json" > "$out" 2>&1 || fail "compare exited non-zero"
    grep -q 'goodput is' "$out" && fail "goodput compared under different SLOs"

    # Different settings are pointed out.
    sed 's/"request_rate": 2.0/"request_rate": 4.0/' "$b" > "$out_dir/c.json"
    "$crescent" bench compare "$a" "$out_dir/c.json" > "$out" 2>&1 || fail "compare exited non-zero"
    expect_in "$out" '^note: the runs differ in request_rate 2.0 vs 4.0' "a setting difference"

    # Bad input: a clear message and a non-zero exit.
    check_error() {  # check_error EXPECTED_RC PATTERN ARGS...
      local want="$1" pattern="$2" rc=0
      shift 2
      "$crescent" bench compare "$@" > "$out" 2>&1 || rc=$?
      ((rc == want)) || { cat "$out"; fail "bench compare $* exited $rc, not $want"; }
      expect_in "$out" "$pattern" "the error message of bench compare $*"
    }
    check_error 1 "cannot open $out_dir/missing.json" "$a" "$out_dir/missing.json"
    echo '{"completed": 1' > "$out_dir/broken.json"
    check_error 1 'is not a JSON object' "$a" "$out_dir/broken.json"
    echo '{"completed": 1}' > "$out_dir/partial.json"
    check_error 1 "has no number 'failed'" "$out_dir/partial.json" "$a"
    check_error 2 'expected two result files' "$a"
    check_error 2 '--labels expects two names' --labels onlyone "$a" "$b"
    check_error 2 '--explain expects none or pd' --explain why "$a" "$b"
    ;;
  bad-knobs)
    # Checked before anything is built or started: a message naming the knob, exit 1.
    check_knob() {  # check_knob PATTERN [MODE] VAR=VALUE...
      local pattern="$1" rc=0 mode=()
      shift
      if [[ "$1" != *=* ]]; then mode=("$1"); shift; fi
      # The epd mode needs a VL model.
      local vl=()
      [[ "${mode[*]}" != epd ]] || vl=(DEMO_MODEL_PRESET=tiny-qwen2-vl DEMO_MODEL_DIR="$out_dir/vl-model")
      env "${common_env[@]}" "${vl[@]}" "$@" bash "$repo/scripts/demo.sh" "${mode[@]}" > "$out_dir/output.txt" 2>&1 || rc=$?
      ((rc == 1)) || { cat "$out_dir/output.txt"; fail "$* gave exit $rc, not 1"; }
      expect_in "$out_dir/output.txt" "$pattern" "the message for $*"
      grep -q '(pid ' "$out_dir/output.txt" && fail "$* started processes"
      return 0
    }
    check_knob "num_prompts must be a whole number, got 'many'" DEMO_NUM_PROMPTS=many
    check_knob "DEMO_REQUEST_RATE must be a number of requests/s or inf, got 'fast'" DEMO_REQUEST_RATE=fast
    check_knob "DEMO_PROXY_PORT must be a port \\(0..65535\\), got '70000'" DEMO_PROXY_PORT=70000
    check_knob "must be positive" DEMO_OUTPUT_LEN=0
    check_knob "DEMO_GOODPUT must be KEY:MS pairs \\(ttft, tpot, e2el, itl\\), got 'fast:1'" DEMO_GOODPUT=fast:1
    check_knob "DEMO_SWEEP_RATES must be positive numbers of requests/s, got '0'" sweep DEMO_SWEEP_RATES=0
    check_knob "the sweep compares goodput: DEMO_GOODPUT must not be empty" sweep DEMO_GOODPUT=
    check_knob "DEMO_PREFILL_IMAGES must be full or ref, got 'some'" epd DEMO_PREFILL_IMAGES=some
    check_knob "DEMO_E_NICE must be a niceness \\(-20..19\\) or idle, got 'low'" epd DEMO_E_NICE=low
    check_knob "is not an executable" CRESCENT_BIN=/nonexistent/crescent
    ;;
  *)
    echo "demo_test: unknown scenario '$scenario'" >&2
    exit 2
    ;;
esac
# The scenario's models (~55 MB each, remade by every run) go; its logs and output stay.
rm -rf "$model_dir" "$out_dir/vl-model"
echo "demo_test ($scenario): PASS"
