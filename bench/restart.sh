#!/usr/bin/env bash
# Start time of a larder holding KEYS keys (default 10 million), from exec until
# /_larder/health answers 200, after three kinds of stop:
#   graceful  SIGTERM: the next start loads the active volume's checkpoint (no scan);
#   crash     kill -9 of a server that never stopped gracefully since its active volume began:
#             the whole active volume is scanned (the worst case);
#   crash+cp  kill -9 after a graceful restart and more writes: the checkpoint, then a scan of
#             what was appended after it.
# Each is measured with the page cache warm (median of RUNS starts) and, when run as root,
# cold (caches dropped before one start). While filling, the server runs on core 1 and the
# loader on core 0; the timed starts have both cores, as a server has in production (recovery
# loads hint files on every core), or only core 1 with PIN=1.
#
#   bench/restart.sh                        # 10M keys of 100 bytes, default ring (16 x 1GiB)
#   KEYS=1000000 RUNS=1 bench/restart.sh    # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-10000000}
SIZE=${SIZE:-100}
RUNS=${RUNS:-3}
MORE=${MORE:-100000}
PORT=${PORT:-18470}
bin=target/release/larder
[ -x "$bin" ] && [ -x target/release/larder-bench ] || cargo build --release -p larder-server -p larder-bench
scripts/install-bench-deps.sh >/dev/null
source bench/lib.sh

dir=$work/data
pid=
cores=0-1
serve() {
  taskset -c "$cores" "$bin" serve --data-dir "$dir" --listen "127.0.0.1:$PORT" --log-level error "$@" >/dev/null &
  pid=$!
  pids+=("$pid")
}
# start_timed: starts the server; sets $took to the seconds until it is healthy. (Not run
# in a subshell: the server's pid must reach this shell.)
took=
start_timed() {
  local t0 t1
  t0=$(date +%s.%N)
  serve
  until curl -sf -o /dev/null "http://127.0.0.1:$PORT/_larder/health"; do
    kill -0 "$pid" 2>/dev/null || { echo "larder exited during recovery" >&2; exit 1; }
    sleep 0.01
  done
  t1=$(date +%s.%N)
  took=$(awk "BEGIN { print $t1 - $t0 }")
}
rss() { awk '/VmRSS/ {printf "%.0f MiB", $2 / 1024}' "/proc/$pid/status"; }
stats() { curl -sf "http://127.0.0.1:$PORT/_larder/stats"; }
recovery() {
  stats | python3 -c 'import json, sys; s = json.load(sys.stdin); r = s["recovery"]
print("keys=%d millis=%d hint_loads=%d checkpoint_loads=%d scans=%d tail_bytes_scanned=%d" % (s["keys"], r["millis"], r["hint_loads"], r["checkpoint_loads"], r["scans"], r["tail_bytes_scanned"]))'
}
stop_times=()
graceful() {
  local t0
  t0=$(date +%s.%N)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  stop_times+=("$(awk "BEGIN { print $(date +%s.%N) - $t0 }")")
}
crash() { kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; }
cold() { [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# measure NAME STOP [PREPARE]: stops the running server with STOP (after PREPARE, run while it
# serves), then times the start; RUNS times warm and once cold.
measure() {
  local name=$1 stop=$2 prepare=${3:-true} times=() t detail
  for _ in $(seq "$RUNS"); do
    $prepare
    $stop
    start_timed
    times+=("$took")
  done
  detail=$(recovery)
  t=$(printf '%s\n' "${times[@]}" | median)
  printf '%-9s warm  %6.2f s (runs: %s)  %s\n' "$name" "$t" "$(printf '%.2f ' "${times[@]}")" "$detail"
  $prepare
  $stop
  if cold; then
    start_timed
    printf '%-9s cold  %6.2f s  %s\n' "$name" "$took" "$(recovery)"
  else
    start_timed
  fi
}

echo "filling $KEYS keys of $SIZE bytes ..."
cores=1
serve
until curl -sf -o /dev/null "http://127.0.0.1:$PORT/_larder/health"; do sleep 0.05; done
fill_t0=$(date +%s)
taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$PORT/r" --workload put --distribution sequential \
  --keys "$KEYS" --requests "$KEYS" --value-size "$SIZE" --connections 32 --quiet
echo "filled in $(($(date +%s) - fill_t0)) s: $(stats | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["keys"], "keys,", s["bytes_used"] >> 20, "MiB in", s["volumes"], "volumes")')"
sleep 3 # let the hint files of the sealed volumes be written, as in a long-running server
[ "${PIN:-0}" = 1 ] || cores=0-1

# A crash of a server that was never stopped gracefully: no checkpoint.
measure crash crash
# A graceful stop.
graceful
start_timed # this start scans once more (the crash above left no checkpoint)
stop_times=()
measure graceful graceful
echo "resident memory after a graceful restart with $KEYS keys (index, nothing read yet): $(rss)"
echo "graceful stops (drain, sync, checkpoint of the active volume) took: $(printf '%.2f s  ' "${stop_times[@]}")"
# A crash after a graceful restart and MORE new keys: the checkpoint plus a scan of the tail.
next=$KEYS
more() {
  taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$PORT/r" --workload put --distribution sequential \
    --keys "$MORE" --start "$next" --requests "$MORE" --value-size "$SIZE" --connections 32 --quiet
  next=$((next + MORE))
}
graceful
start_timed
measure crash+cp crash more
graceful
