#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang++-14, -fsanitize=fuzzer,address,undefined) in
# build/fuzz and runs each over a copy of its corpus. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'USAGE'
usage: scripts/fuzz.sh [--seconds N] [--jobs J] [--update-corpus] [--no-setup] [TARGET...]

Builds build/fuzz (a standalone CMake project in fuzz/, compiled with clang++-14 and
-fsanitize=fuzzer,address,undefined) and runs each TARGET for N seconds over a COPY of its
corpus fuzz/corpus/TARGET (in build/fuzz/work/TARGET), with fuzz/dict/TARGET.dict when there
is one. Targets: http_request_fuzz json_request_fuzz control_frame_fuzz (default: all).

  --seconds N       how long each target runs (default 60)
  --jobs J          build with J jobs and run up to J targets at once (default 1)
  --update-corpus   after the runs, minimize the repo corpus plus what the runs found
                    (libFuzzer -set_cover_merge=1) and write the result back into
                    fuzz/corpus/TARGET (otherwise the repo is not touched)
  --no-setup        do not run scripts/setup.sh first (it is idempotent but needs apt)
  -h, --help        this text

Prints per target: runs, execs/s, coverage (cov: edges, ft: features), corpus size and new
corpus entries. Exits non-zero when any target crashes, leaks, times out (10 s per input) or
runs out of memory (2 GiB); the crashing input is kept under build/fuzz/artifacts/TARGET/ and
its path printed. Reproduce with: build/fuzz/TARGET PATH
USAGE
}

seconds=60
jobs=1
update_corpus=0
setup=1
targets=()
while (($# > 0)); do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --jobs) jobs="${2:?--jobs needs a value}"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    --update-corpus) update_corpus=1; shift ;;
    --no-setup) setup=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all_targets=(http_request_fuzz json_request_fuzz control_frame_fuzz)
if ((${#targets[@]} == 0)); then targets=("${all_targets[@]}"); fi
for t in "${targets[@]}"; do
  if [ ! -f "fuzz/$t.cc" ]; then
    echo "fuzz.sh: unknown target '$t' (one of: ${all_targets[*]})" >&2
    exit 2
  fi
done
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: --seconds must be a positive integer, not '$seconds'" >&2
  exit 2
fi
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: --jobs must be a positive integer, not '$jobs'" >&2
  exit 2
fi

if ((setup)); then bash scripts/setup.sh; fi

build=build/fuzz
echo "== fuzz: configure + build ($build)"
if [ ! -f "$build/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S fuzz -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

# run_one TARGET: fuzzes TARGET for $seconds over a fresh copy of its corpus; the log is
# $build/logs/TARGET.log.
run_one() {
  local t=$1
  local work="$build/work/$t" artifacts="$build/artifacts/$t/" log="$build/logs/$t.log"
  rm -rf "$work"
  mkdir -p "$work" "$artifacts" "$build/logs"
  cp fuzz/corpus/"$t"/* "$work"/
  local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
              -artifact_prefix="$artifacts")
  if [ -f "fuzz/dict/$t.dict" ]; then args+=(-dict="fuzz/dict/$t.dict"); fi
  "$build/$t" "${args[@]}" "$work" >"$log" 2>&1
}

# report TARGET RC: one summary line from the log; the crash and its input when RC != 0.
report() {
  local t=$1 rc=$2 log="$build/logs/$t.log"
  local runs execs done_line seeds corpus
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|NEW|REDUCE|pulse|INITED)' "$log" | tail -1 || true)
  seeds=$(ls fuzz/corpus/"$t" | wc -l)
  corpus=$(ls "$build/work/$t" | wc -l)
  printf '%-20s runs %-10s execs/s %-7s %s %s  corpus %s (%d new)\n' "$t" "${runs:-?}" \
    "${execs:-?}" "$(grep -o 'cov: [0-9]*' <<<"$done_line" || echo 'cov: ?')" \
    "$(grep -o 'ft: [0-9]*' <<<"$done_line" || echo 'ft: ?')" "$corpus" $((corpus - seeds))
  if ((rc != 0)); then
    echo "!! $t FAILED (exit $rc); log: $log"
    grep -E '^==[0-9]+==ERROR|SUMMARY:|Check failed|CHECK failed|deadly signal|timeout after' \
      "$log" | head -5 | sed 's/^/   /'
    grep -E 'Test unit written to' "$log" | sed 's/^/   /' || true
    local input
    input=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    if [ -n "$input" ]; then echo "   reproduce: $build/$t $input"; fi
  fi
}

echo "== fuzz: ${targets[*]} for ${seconds}s each (${jobs} at once)"
failed=0
declare -A pids=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$t" &
  pids[$t]=$!
done
declare -A rcs=()
for t in "${targets[@]}"; do
  rc=0
  wait "${pids[$t]}" || rc=$?
  rcs[$t]=$rc
done
for t in "${targets[@]}"; do
  report "$t" "${rcs[$t]}"
  if ((rcs[$t] != 0)); then failed=1; fi
done

if ((update_corpus)); then
  for t in "${targets[@]}"; do
    merged="$build/merged/$t"
    rm -rf "$merged"
    mkdir -p "$merged"
    "$build/$t" -set_cover_merge=1 "$merged" fuzz/corpus/"$t" "$build/work/$t" \
      >"$build/logs/$t.merge.log" 2>&1
    rm -f fuzz/corpus/"$t"/*
    cp "$merged"/* fuzz/corpus/"$t"/
    echo "== $t: corpus now $(ls fuzz/corpus/"$t" | wc -l) files," \
      "$(cat fuzz/corpus/"$t"/* | wc -c) bytes"
  done
fi

if ((failed)); then
  echo "== fuzz: FAILED"
  exit 1
fi
echo "== fuzz: no crash in ${targets[*]}"
