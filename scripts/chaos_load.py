#!/usr/bin/env python3
"""Concurrent streaming load for scripts/chaos.sh (Python standard library only).

Sends streamed /v1/completions requests to URL from N threads for a given time and sorts every
request into one of:
  ok       200, the stream ended with [DONE] and no error event
  clear    failed with a clear error: a non-200 answer whose JSON body has error.message, an
           SSE `data: {"error": ...}` event, or a refused/reset connection (the process is down)
  hung     no end within --hang-s (the socket read timed out)
  cut      a 200 stream whose connection closed before [DONE] without an error event (right
           only when the process the client talks to, the proxy, died)
  unclear  anything else (a cut stream without an error event, a body that is not JSON)
and writes one JSON object with the counts, the seconds each failure took, and examples.
"""

import argparse
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse


def one_request(host, port, body, hang_s):
    """Returns (kind, seconds, detail)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=hang_s)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raw = resp.read()
            try:
                message = json.loads(raw)["error"]["message"]
                return "clear", time.monotonic() - started, f"{resp.status}: {message}"
            except (ValueError, KeyError, TypeError):
                return "unclear", time.monotonic() - started, f"{resp.status}: {raw[:200]!r}"
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[len(b"data: "):]
            if data == b"[DONE]":
                done = True
                continue
            try:
                event = json.loads(data)
            except ValueError:
                return "unclear", time.monotonic() - started, f"bad event {data[:200]!r}"
            if "error" in event:
                message = event["error"].get("message", "") if isinstance(event["error"], dict) else ""
                kind = "clear" if message else "unclear"
                return kind, time.monotonic() - started, f"stream error: {message}"
        if done:
            return "ok", time.monotonic() - started, ""
        return "cut", time.monotonic() - started, "stream cut without an error event"
    except socket.timeout:
        return "hung", time.monotonic() - started, f"nothing for {hang_s} s"
    except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError) as e:
        return "clear", time.monotonic() - started, f"connection: {e.__class__.__name__}"
    except http.client.RemoteDisconnected as e:
        return "clear", time.monotonic() - started, f"connection: {e}"
    except (http.client.HTTPException, OSError) as e:
        return "unclear", time.monotonic() - started, f"{e.__class__.__name__}: {e}"
    finally:
        conn.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the proxy, e.g. http://127.0.0.1:18400")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--seconds", type=float, required=True, help="how long to send")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hang-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args()

    url = urllib.parse.urlparse(args.url)
    deadline = time.monotonic() + args.seconds
    lock = threading.Lock()
    counts = {"ok": 0, "clear": 0, "hung": 0, "cut": 0, "unclear": 0}
    fail_seconds = []
    examples = {}

    def worker(index):
        rng = random.Random(args.seed * 1000 + index)
        while time.monotonic() < deadline:
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"])
                             for _ in range(rng.randint(8, 120)))
            body = {"model": args.model, "prompt": words, "stream": True, "ignore_eos": True,
                    "max_tokens": rng.randint(4, args.max_tokens), "temperature": 0}
            kind, seconds, detail = one_request(url.hostname, url.port, body, args.hang_s)
            with lock:
                counts[kind] += 1
                if kind != "ok":
                    fail_seconds.append(seconds)
                    examples.setdefault(kind, []).append(detail)
            if kind != "ok":
                time.sleep(0.05)  # something is down: do not spin on its refusals

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fail_seconds.sort()
    result = {
        "counts": counts,
        "fail_seconds_median": fail_seconds[len(fail_seconds) // 2] if fail_seconds else 0.0,
        "fail_seconds_max": fail_seconds[-1] if fail_seconds else 0.0,
        "examples": {k: sorted(set(v))[:5] for k, v in examples.items()},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
