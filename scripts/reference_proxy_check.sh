#!/usr/bin/env bash
# Runs the reference proxy (vLLM's Mooncake connector proxy, Python) unmodified in front of a
# real crescent prefill server (hosting the bootstrap) and decode server, sends completions and
# chat requests through it, and checks that every answer equals a `crescent serve --role both`
# run of the same request. This is the proof that crescent's kv_transfer_params and bootstrap
# server are wire-compatible with the reference (DESIGN.md §3).
#
# The proxy's source is not part of this repository: it is cut at run time out of the seed
# document ../shared/seeds/004_*.txt (beside the checkout). It needs Debian's python3-fastapi,
# python3-httpx and python3-uvicorn (scripts/setup.sh).
#
#   scripts/reference_proxy_check.sh --crescent build/release/apps/crescent \
#       [--model DIR] [--work-dir DIR] [--seeds DIR] [--transport tcp|shm|ucx] [--keep]
#
# Exit status: 0 all answers equal, 1 a difference or a failure, 2 usage or a missing
# prerequisite (the reference document or its Python packages; the reason is printed). ctest
# registers this check only where the seed document exists beside the checkout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
crescent=""
model=""
work_dir=""
seeds="$repo/../shared/seeds"
transport="tcp"
keep=0

usage() {
  sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
}
while (($#)); do
  case "$1" in
    --crescent) crescent="${2:?}"; shift 2 ;;
    --model) model="${2:?}"; shift 2 ;;
    --work-dir) work_dir="${2:?}"; shift 2 ;;
    --seeds) seeds="${2:?}"; shift 2 ;;
    --transport) transport="${2:?}"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    *) echo "reference_proxy_check: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n "$crescent" ]] || { echo "reference_proxy_check: --crescent BINARY is required" >&2; exit 2; }
[[ -x "$crescent" ]] || { echo "reference_proxy_check: $crescent is not an executable" >&2; exit 1; }

fail_setup() {
  echo "reference_proxy_check: $*" >&2
  exit 2
}

# ---- the reference and an interpreter that can run it ---------------------------------------
shopt -s nullglob
seed_files=("$seeds"/004_*.txt)
shopt -u nullglob
((${#seed_files[@]})) || fail_setup "the reference proxy is absent (no $seeds/004_*.txt)"
seed="${seed_files[0]}"

python=""
for candidate in /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import fastapi, httpx, uvicorn' >/dev/null 2>&1; then
    python="$(command -v "$candidate")"
    break
  fi
done
[[ -n "$python" ]] || fail_setup "no python3 with fastapi, httpx and uvicorn (Debian: python3-fastapi python3-httpx python3-uvicorn; scripts/setup.sh installs them)"

if [[ -z "$work_dir" ]]; then
  work_dir="$(mktemp -d /tmp/crescent-refproxy.XXXXXX)"
fi
mkdir -p "$work_dir"
work_dir="$(cd "$work_dir" && pwd)"
run_dir="$work_dir/run.$$"
rm -rf "$run_dir"
mkdir -p "$run_dir"

# The proxy program: from its licence header to its uvicorn.run line, exactly as published.
proxy_py="$run_dir/mooncake_connector_proxy.py"
awk '/^# SPDX-License-Identifier/ { on = 1 } on { print } on && /uvicorn\.run\(/ { exit }' \
  "$seed" > "$proxy_py"
if ! grep -q '_handle_completions' "$proxy_py" || ! grep -q 'uvicorn.run(' "$proxy_py"; then
  echo "reference_proxy_check: could not cut the proxy program out of $seed" >&2
  exit 1
fi
"$python" -m py_compile "$proxy_py" || {
  echo "reference_proxy_check: the proxy cut out of $seed does not compile" >&2
  exit 1
}

# Debian 12's FastAPI (0.92) predates FastAPI(lifespan=...) (0.93) and silently ignores it, so
# the proxy would never set itself up. The launcher hands the lifespan to Starlette's router,
# which has supported it since 0.26, and then runs the proxy file as __main__, unmodified.
launcher_py="$run_dir/run_proxy.py"
cat > "$launcher_py" <<'PY'
import inspect
import runpy
import sys

import fastapi

if "lifespan" not in inspect.signature(fastapi.FastAPI.__init__).parameters:
    _init = fastapi.FastAPI.__init__

    def _init_with_lifespan(self, *args, lifespan=None, **kwargs):
        _init(self, *args, **kwargs)
        if lifespan is not None:
            self.router.lifespan_context = lifespan

    fastapi.FastAPI.__init__ = _init_with_lifespan

path = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(path, run_name="__main__")
PY

# ---- processes -------------------------------------------------------------------------------
pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((rc != 0)); then
    for log in "$run_dir"/*.log; do
      [[ -f "$log" ]] || continue
      echo "---- $(basename "$log") (last 40 lines) ----"
      tail -n 40 "$log"
    done
  fi
  if ((keep == 0)) && ((rc == 0)); then
    rm -rf "$run_dir"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until the log says "listening on http://127.0.0.1:PORT" and prints PORT.
port_from_log() {
  local log="$1" pid="$2"
  for _ in $(seq 600); do
    if port=$(grep -o 'listening on http://127\.0\.0\.1:[0-9]*' "$log" 2>/dev/null | head -n1 |
              sed 's/.*://'); [[ -n "$port" ]]; then
      echo "$port"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { echo "reference_proxy_check: $log: process exited" >&2; return 1; }
    sleep 0.1
  done
  echo "reference_proxy_check: $log: no 'listening on' line in 60 s" >&2
  return 1
}

wait_http_200() {
  local url="$1" what="$2"
  for _ in $(seq 600); do
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" == 200 ]]; then
      return 0
    fi
    sleep 0.1
  done
  echo "reference_proxy_check: $what ($url) not 200 in 60 s" >&2
  return 1
}

if [[ -z "$model" ]]; then
  model="$work_dir/tiny-llama"
  if [[ ! -f "$model/config.json" ]]; then
    tmp_model="$work_dir/tiny-llama.tmp.$$"
    "$crescent" make-model --preset tiny-llama --out "$tmp_model" > "$run_dir/make-model.log" 2>&1
    mv -T "$tmp_model" "$model" 2>/dev/null || rm -rf "$tmp_model"
  fi
fi

common=(--model "$model" --served-model-name tiny --host 127.0.0.1 --port 0 --threads 1
        --io-threads 1 --kv-cache-mb 32 --max-model-len 1024)
bootstrap_port="$(free_port)"
"$crescent" serve "${common[@]}" --role prefill --bootstrap-port "$bootstrap_port" \
  --kv-transport "$transport" --kv-transfer-timeout 20 > "$run_dir/prefill.log" 2>&1 &
prefill_pid=$!
pids+=("$prefill_pid")
"$crescent" serve "${common[@]}" --role decode \
  --kv-transport "$transport" --kv-transfer-timeout 20 > "$run_dir/decode.log" 2>&1 &
decode_pid=$!
pids+=("$decode_pid")
"$crescent" serve "${common[@]}" --role both > "$run_dir/both.log" 2>&1 &
both_pid=$!
pids+=("$both_pid")

prefill_port="$(port_from_log "$run_dir/prefill.log" "$prefill_pid")"
decode_port="$(port_from_log "$run_dir/decode.log" "$decode_pid")"
both_port="$(port_from_log "$run_dir/both.log" "$both_pid")"
wait_http_200 "http://127.0.0.1:$prefill_port/health" "prefill /health"
wait_http_200 "http://127.0.0.1:$decode_port/health" "decode /health"
wait_http_200 "http://127.0.0.1:$both_port/health" "colocated /health"
wait_http_200 "http://127.0.0.1:$bootstrap_port/query" "bootstrap /query"

proxy_port="$(free_port)"
(cd "$run_dir" && exec "$python" "$launcher_py" "$proxy_py" --host 127.0.0.1 --port "$proxy_port" \
  --prefill "http://127.0.0.1:$prefill_port" "$bootstrap_port" \
  --decode "http://127.0.0.1:$decode_port") > "$run_dir/proxy.log" 2>&1 &
pids+=("$!")

echo "reference_proxy_check: prefill :$prefill_port (bootstrap :$bootstrap_port), decode :$decode_port," \
  "colocated :$both_port, reference proxy :$proxy_port, transport $transport"

# ---- requests: through the reference proxy and to the colocated server, compared ------------
"$python" - "$proxy_port" "$both_port" <<'PY'
import json
import sys
import time
import urllib.error
import urllib.request

proxy_port, both_port = int(sys.argv[1]), int(sys.argv[2])


def post(port, path, body, timeout=60):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def answer(status, raw, stream, chat):
    """(text, completion_tokens) of a whole or streamed answer; raises on an error."""
    if status != 200:
        raise RuntimeError(f"status {status}: {raw[:400]}")
    if not stream:
        j = json.loads(raw)
        if "error" in j:
            raise RuntimeError(f"error: {j['error']}")
        c = j["choices"][0]
        return (c["message"]["content"] if chat else c["text"]), j["usage"]["completion_tokens"]
    text, tokens, done = "", None, False
    for line in raw.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            continue
        j = json.loads(data)
        if "error" in j:
            raise RuntimeError(f"SSE error event: {j['error']}")
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
        for c in j.get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
    if not done:
        raise RuntimeError("stream ended without data: [DONE]")
    return text, tokens


# The proxy answers 503 until it has read the prefill's bootstrap.
deadline = time.time() + 60
probe = {"model": "tiny", "prompt": "ready?", "max_tokens": 1, "temperature": 0}
while True:
    try:
        status, raw = post(proxy_port, "/v1/completions", probe, timeout=10)
        if status == 200:
            break
    except OSError as e:
        status, raw = 0, str(e)
    if time.time() > deadline:
        sys.exit(f"reference_proxy_check: the reference proxy never answered 200 (last: {status} {raw[:300]})")
    time.sleep(0.3)

words = "river stone quiet engine paper orange window seven garden silver cloud market".split()
cases = []
for i, n in enumerate([1, 5, 17, 40, 120, 300]):
    prompt = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(n))
    for stream in (False, True):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 3 + 2 * i,
                "temperature": 0, "ignore_eos": True}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        cases.append(("/v1/completions", body, stream, False))
for i, content in enumerate(["Name a colour.", "Tell me about " + " ".join(words * 3)]):
    for stream in (False, True):
        body = {"model": "tiny", "messages": [{"role": "user", "content": content}],
                "max_completion_tokens": 6 + i, "temperature": 0, "ignore_eos": True}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        cases.append(("/v1/chat/completions", body, stream, True))
# The first prompt again: the decode server now holds its prefix.
cases.append(cases[2])

num_passed = num_failed = 0
for path, body, stream, chat in cases:
    label = f"{path} {'streamed' if stream else 'whole'} max_tokens={body.get('max_tokens', body.get('max_completion_tokens'))}"
    try:
        want = answer(*post(both_port, path, body), stream, chat)
        got = answer(*post(proxy_port, path, body), stream, chat)
    except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
        print(f"FAIL {label}: {e}")
        num_failed += 1
        continue
    if got != want:
        print(f"FAIL {label}: through the reference proxy {got!r} != colocated {want!r}")
        num_failed += 1
    else:
        num_passed += 1
print(f"reference proxy check: {num_passed} passed, {num_failed} failed")
sys.exit(1 if num_failed else 0)
PY
