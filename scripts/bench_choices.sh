#!/usr/bin/env bash
# What n > 1 costs on one server (docs/engine.md#scheduling-enginescheduler): one completion
# per n in CHOICES_NS, each with a prompt no earlier request shares (so nothing is cached from
# before), temperature 1 with a seed, CHOICES_OUTPUT_LEN tokens per choice. Prints each
# request's time, its ratio to the n = 1 request of the same run (the baseline: one prompt,
# one choice), and the prompt tokens the prefix cache served to it (from /metrics). With the
# prompt computed once, the ratio stays near 1 + decode; computing it per choice puts it near n.
#
# usage: scripts/bench_choices.sh [BUILD_DIR]        (default build/release)
# env: CHOICES_MODEL (a model directory; default: make-model --preset small into the run dir),
#      CHOICES_NS ("1 4 8"), CHOICES_PROMPT_WORDS (900: about 2,600 tokens), CHOICES_OUTPUT_LEN
#      (16), CHOICES_THREADS (2), CHOICES_ROUNDS (2), CHOICES_RUN_DIR
set -euo pipefail

build_dir="${1:-build/release}"
bin="$build_dir/apps/crescent"
[[ -x "$bin" ]] || { echo "bench_choices: no $bin (build the crescent target)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench_choices: needs python3" >&2; exit 1; }
: "${CHOICES_NS:=1 4 8}" "${CHOICES_PROMPT_WORDS:=900}" "${CHOICES_OUTPUT_LEN:=16}"
: "${CHOICES_THREADS:=2}" "${CHOICES_ROUNDS:=2}"
run_dir="${CHOICES_RUN_DIR:-$(mktemp -d /tmp/crescent-bench-choices.XXXXXX)}"
mkdir -p "$run_dir"
model="${CHOICES_MODEL:-}"
if [[ -z "$model" ]]; then
  model="$run_dir/model-small"
  [[ -d "$model" ]] || "$bin" make-model --preset small --out "$model" > "$run_dir/make-model.log" 2>&1
fi

"$bin" serve --model "$model" --served-model-name m --host 127.0.0.1 --port 0 \
  --threads "$CHOICES_THREADS" > "$run_dir/serve.log" 2>&1 &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true; wait $serve_pid 2>/dev/null || true' EXIT
port=""
for ((i = 0; i < 1200; ++i)); do
  port=$(grep -o -m1 "listening on http://127.0.0.1:[0-9]*" "$run_dir/serve.log" | sed 's/.*://' || true)
  [[ -n "$port" ]] && break
  sleep 0.1
done
[[ -n "$port" ]] || { echo "bench_choices: serve did not start:" >&2; tail "$run_dir/serve.log" >&2; exit 1; }
for ((i = 0; i < 1200; ++i)); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  sleep 0.1
done

PORT="$port" NS="$CHOICES_NS" WORDS="$CHOICES_PROMPT_WORDS" OUT="$CHOICES_OUTPUT_LEN" \
  ROUNDS="$CHOICES_ROUNDS" python3 - <<'PY'
import json, os, re, time, urllib.request

base = "http://127.0.0.1:%s" % os.environ["PORT"]
ns = [int(n) for n in os.environ["NS"].split()]
words = " ".join("word%d" % (i % 97) for i in range(int(os.environ["WORDS"])))
out = int(os.environ["OUT"])

def hits():
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    m = re.search(r"^crescent_prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0

def run(tag, n):
    body = json.dumps({"model": "m", "prompt": tag + " " + words, "max_tokens": out, "n": n,
                       "temperature": 1.0, "seed": 1, "ignore_eos": True}).encode()
    h0 = hits()
    t0 = time.time()
    r = urllib.request.urlopen(urllib.request.Request(
        base + "/v1/completions", body, {"Content-Type": "application/json"}))
    usage = json.loads(r.read())["usage"]
    return time.time() - t0, usage["prompt_tokens"], hits() - h0

run("warm-up", 1)
for rnd in range(int(os.environ["ROUNDS"])):
    base_s = None
    for n in ns:
        s, prompt_tokens, cached = run("round%d-n%d" % (rnd, n), n)
        base_s = s if n == 1 else base_s
        ratio = "%.2fx n=1" % (s / base_s) if base_s else "-"
        print("round %d  n=%-3d %7.3f s  %-11s prompt %d tokens, prefix-cache hits %d tokens"
              % (rnd + 1, n, s, ratio, prompt_tokens, cached), flush=True)
PY
