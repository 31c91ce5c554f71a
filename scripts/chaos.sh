#!/usr/bin/env bash
# A fault-and-load run an operator can repeat: starts a standalone bootstrap, one prefill and one
# decode worker and the proxy (tiny model, 127.0.0.1), and in rounds sends concurrent streaming
# load through the proxy while one fault hits at a random moment: kill -9 (then a restart on the
# same port) of P, D, the bootstrap or the proxy, SIGSTOP for a few seconds (then SIGCONT) of P,
# D or the bootstrap, or
# a SIGTERM restart of P or D. After each round the load stops and the run checks that P and D
# hold no KV blocks once idle, and notes every process's RSS. At the end it prints requests
# ok / failed with a clear error / hung / unclear (a stream cut without an error event counts as
# clear only in a round that killed the proxy), the seconds failures took, blocks leaked and
# RSS growth, and exits 1 if any request hung, any answer was unclear or any block leaked.
#
#   scripts/chaos.sh [--minutes 10] [--round-s 30] [--concurrency 8] [--seed N] [--etcd]
#                    [--crescent build/release/apps/crescent] [--work-dir DIR] [--port-base 18400]
#
# --etcd: etcd (tools/etcd/etcd, or $CRESCENT_ETCD_BINARY) takes the bootstrap's place: P
# registers with --bootstrap-addr etcd://..., P and D publish themselves with --cluster, and the
# proxy finds both with --discover only. The bootstrap's faults then hit etcd (kill -9 and a
# restart on the same ports and data dir, or SIGSTOP).
#
# Not part of scripts/test.sh: it runs for as long as it is told (bounded by --minutes).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
minutes=10
round_s=30
concurrency=8
seed=$RANDOM
crescent="$repo/build/release/apps/crescent"
work_dir=""
port_base=18400
lease_ttl=3
idle_timeout_s=20
use_etcd=0
etcd_binary="${CRESCENT_ETCD_BINARY:-$repo/tools/etcd/etcd}"

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  exit 2
}
while (($#)); do
  case "$1" in
    --minutes) minutes="${2:?}"; shift 2 ;;
    --round-s) round_s="${2:?}"; shift 2 ;;
    --concurrency) concurrency="${2:?}"; shift 2 ;;
    --seed) seed="${2:?}"; shift 2 ;;
    --crescent) crescent="${2:?}"; shift 2 ;;
    --work-dir) work_dir="${2:?}"; shift 2 ;;
    --port-base) port_base="${2:?}"; shift 2 ;;
    --etcd) use_etcd=1; shift ;;
    -h|--help) usage ;;
    *) echo "chaos: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -x "$crescent" ]] || { echo "chaos: $crescent is not an executable (build it first)" >&2; exit 2; }
[[ "$minutes" =~ ^[0-9]+$ && "$round_s" =~ ^[0-9]+$ && "$round_s" -ge 10 ]] || { echo "chaos: --minutes must be a whole number and --round-s one >= 10" >&2; exit 2; }
if ((use_etcd)); then
  [[ -x "$etcd_binary" ]] || { echo "chaos: --etcd needs $etcd_binary (scripts/setup.sh)" >&2; exit 2; }
fi
RANDOM=$seed
work_dir="${work_dir:-$(mktemp -d /tmp/crescent-chaos.XXXXXX)}"
mkdir -p "$work_dir"

declare -A port_of pid_of
port_of[bootstrap]=$port_base
port_of[prefill]=$((port_base + 1))
port_of[decode]=$((port_base + 2))
port_of[proxy]=$((port_base + 3))
model="$work_dir/model"

etcd_peer="http://127.0.0.1:$((port_base + 4))"
etcd_url="etcd://127.0.0.1:${port_of[bootstrap]}/chaos"

args_of() {
  local bootstrap_url="http://127.0.0.1:${port_of[bootstrap]}"
  if ((use_etcd)); then
    case "$1" in
      bootstrap)
        echo --name chaos --data-dir "$work_dir/etcd" --log-level warn \
          --listen-client-urls "$bootstrap_url" --advertise-client-urls "$bootstrap_url" \
          --listen-peer-urls "$etcd_peer" --initial-advertise-peer-urls "$etcd_peer" \
          --initial-cluster "chaos=$etcd_peer" ;;
      prefill | decode)
        echo serve --model "$model" --served-model-name tiny --threads 1 --max-model-len 1024 \
          --kv-cache-mb 32 --role "$1" --port "${port_of[$1]}" \
          $([[ $1 == prefill ]] && echo --bootstrap-addr "$etcd_url/p0") \
          --cluster "$etcd_url/c1" --bootstrap-lease-ttl "$lease_ttl" --kv-transfer-timeout 10 ;;
      proxy)
        echo proxy --port "${port_of[proxy]}" --discover "$etcd_url/c1" ;;
    esac
    return
  fi
  case "$1" in
    bootstrap)
      echo bootstrap --port "${port_of[bootstrap]}" --bootstrap-lease-ttl "$lease_ttl" ;;
    prefill | decode)
      echo serve --model "$model" --served-model-name tiny --threads 1 --max-model-len 1024 \
        --kv-cache-mb 32 --role "$1" --port "${port_of[$1]}" --bootstrap-addr "$bootstrap_url" \
        --bootstrap-lease-ttl "$lease_ttl" --kv-transfer-timeout 10 ;;
    proxy)
      echo proxy --port "${port_of[proxy]}" \
        --prefill "http://127.0.0.1:${port_of[prefill]}" "${port_of[bootstrap]}" \
        --decode "http://127.0.0.1:${port_of[decode]}" ;;
  esac
}

start() {  # start NAME: runs it and waits until its /health answers 200
  local name=$1 binary=$crescent
  [[ $name == bootstrap ]] && ((use_etcd)) && binary=$etcd_binary
  # shellcheck disable=SC2046
  "$binary" $(args_of "$name") >> "$work_dir/$name.log" 2>&1 &
  pid_of[$name]=$!
  for _ in $(seq 300); do
    if curl -sf -o /dev/null -m 1 "http://127.0.0.1:${port_of[$name]}/health"; then
      return 0
    fi
    kill -0 "${pid_of[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "chaos: $name did not start (see $work_dir/$name.log)" >&2
  tail -n 20 "$work_dir/$name.log" >&2
  exit 1
}

stop_all() {
  for name in proxy decode prefill bootstrap; do
    local pid=${pid_of[$name]:-}
    [[ -n "$pid" ]] || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
  done
  for name in proxy decode prefill bootstrap; do
    local pid=${pid_of[$name]:-}
    [[ -n "$pid" ]] || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap stop_all EXIT
trap 'echo "chaos: line $LINENO failed" >&2' ERR
trap 'exit 130' INT TERM

metric() {  # metric NAME METRIC: the value of one series of NAME's /metrics (empty if down)
  # awk reads to the end (an early exit would fail curl's write, and pipefail the script).
  { curl -s -m 2 "http://127.0.0.1:${port_of[$1]}/metrics" 2>/dev/null || true; } |
    awk -v m="$2" '!found && ($1 == m || index($1, m "{") == 1) { print $2; found = 1 }'
}
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/${pid_of[$1]}/status" 2>/dev/null || echo 0; }

# One fault, chosen at random.
faults=(kill:prefill kill:decode kill:bootstrap kill:proxy stop:prefill stop:decode
        stop:bootstrap term:prefill term:decode)
inject() {
  local fault=$1 name=${1#*:}
  case "$fault" in
    kill:*)
      kill -KILL "${pid_of[$name]}"
      wait "${pid_of[$name]}" 2>/dev/null || true
      sleep 1
      start "$name" ;;
    term:*)
      kill -TERM "${pid_of[$name]}"
      wait "${pid_of[$name]}" 2>/dev/null || true
      start "$name" ;;
    stop:*)
      kill -STOP "${pid_of[$name]}"
      sleep $((2 + RANDOM % 5))
      kill -CONT "${pid_of[$name]}" ;;
  esac
}

if [[ ! -f "$model/config.json" ]]; then
  "$crescent" make-model --preset tiny --out "$model" > "$work_dir/make-model.log" 2>&1
fi
echo "chaos: seed $seed, $minutes min in rounds of ${round_s} s, concurrency $concurrency," \
  "logs in $work_dir"
for name in bootstrap prefill decode proxy; do start "$name"; done

declare -A first_rss
total_ok=0 total_clear=0 total_hung=0 total_unclear=0 leaked=0 worst_fail_s=0
rounds_tsv="$work_dir/rounds.tsv"
printf 'round\tfault\tok\tclear\thung\tunclear\tfail_s_max\tP_blocks\tD_blocks\tP_rss_MiB\tD_rss_MiB\tproxy_rss_MiB\n' \
  > "$rounds_tsv"
end=$(( $(date +%s) + minutes * 60 ))
round=0
while (( $(date +%s) < end )); do
  round=$((round + 1))
  fault=${faults[$((RANDOM % ${#faults[@]}))]}
  python3 "$here/chaos_load.py" --url "http://127.0.0.1:${port_of[proxy]}" --model tiny \
    --seconds "$round_s" --concurrency "$concurrency" --seed "$round" \
    --out "$work_dir/round$round.json" &
  load_pid=$!
  sleep $((3 + RANDOM % (round_s / 2)))
  inject "$fault"
  wait "$load_pid"
  # Idle now: every block must come back (a transfer deadline is 10 s at most).
  p_blocks="" d_blocks=""
  for _ in $(seq $((idle_timeout_s * 5))); do
    p_blocks=$(metric prefill crescent_kv_cache_blocks_used)
    d_blocks=$(metric decode crescent_kv_cache_blocks_used)
    [[ "$p_blocks" == 0 && "$d_blocks" == 0 ]] && break
    sleep 0.2
  done
  [[ "$p_blocks" == 0 && "$d_blocks" == 0 ]] || leaked=$((leaked + 1))
  # A stream cut without an error event is expected only when the proxy itself was killed.
  read -r ok clear hung unclear fail_max < <(python3 -c '
import json, sys
r = json.load(open(sys.argv[1])); c = r["counts"]
proxy_killed = sys.argv[2] == "kill:proxy"
clear = c["clear"] + (c["cut"] if proxy_killed else 0)
unclear = c["unclear"] + (0 if proxy_killed else c["cut"])
print(c["ok"], clear, c["hung"], unclear, round(r["fail_seconds_max"], 2))' \
    "$work_dir/round$round.json" "$fault")
  total_ok=$((total_ok + ok)) total_clear=$((total_clear + clear))
  total_hung=$((total_hung + hung)) total_unclear=$((total_unclear + unclear))
  worst_fail_s=$(python3 -c "print(max($worst_fail_s, $fail_max))")
  rss=()
  for name in prefill decode proxy; do rss+=("$(( $(rss_kib "$name") / 1024 ))"); done
  printf '%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$fault" "$ok" "$clear" \
    "$hung" "$unclear" "$fail_max" "${p_blocks:-down}" "${d_blocks:-down}" "${rss[@]}" \
    >> "$rounds_tsv"
  tail -n 1 "$rounds_tsv"
done

echo
column -t -s $'\t' "$rounds_tsv"
echo
echo "requests: $total_ok ok, $total_clear failed with a clear error, $total_hung hung," \
  "$total_unclear unclear; slowest failure ${worst_fail_s} s"
echo "rounds whose P or D still held KV blocks ${idle_timeout_s} s after the load stopped: $leaked"
python3 - "$rounds_tsv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
# RSS over each process's longest life without a restart (a kill or SIGTERM of it restarts it).
for role, col, tag in (("prefill", "P_rss_MiB", "prefill"), ("decode", "D_rss_MiB", "decode"),
                       ("proxy", "proxy_rss_MiB", "proxy")):
    lives, life = [], []
    for r in rows:
        if r["fault"] in (f"kill:{tag}", f"term:{tag}"):
            lives.append(life); life = []
        life.append(int(r[col]))
    lives.append(life)
    longest = max(lives, key=len)
    if len(longest) >= 3:  # the first round of a life is its warm-up
        print(f"{role}: RSS {longest[1]} -> {longest[-1]} MiB over its longest life "
              f"({len(longest)} rounds, warm-up round excluded)")
    else:
        print(f"{role}: no life of 3 rounds or more to judge RSS growth by")
PY
if ((total_hung > 0 || total_unclear > 0 || leaked > 0)); then
  echo "chaos: FAILED (hung, unclear or leaked: see above and $work_dir)"
  exit 1
fi
echo "chaos: passed"
