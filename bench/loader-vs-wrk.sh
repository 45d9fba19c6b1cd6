#!/usr/bin/env bash
# loader-vs-wrk.sh: is `larder-bench http` fast enough not to be the bottleneck? It loads the
# same targets as `wrk -t1 -c64` (GET of 4 KiB values, uniformly random keys), against nginx
# and against larder, alternating the two loaders, and prints both figures side by side.
#
#   bench/loader-vs-wrk.sh                  # DURATION=10s ROUNDS=2 KEYS=100000 SIZE=4096
#
# Servers pinned to core 1, the loader (wrk or larder-bench, one thread, 64 connections) to
# core 0. Peer settings: bench/nginx.conf.in; wrk script: bench/wrk/get.lua.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
KEYS=${KEYS:-100000}
SIZE=${SIZE:-4096}
LARDER_PORT=${LARDER_PORT:-18236}
NGINX_PORT=${NGINX_PORT:-18081}

scripts/install-bench-deps.sh
cargo build --release -p larder-server -p larder-bench -q
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
BENCH=target/release/larder-bench

. bench/lib.sh
start_nginx "$NGINX_PORT"
taskset -c 1 target/release/larder serve --data-dir "$work/larder" --listen "127.0.0.1:$LARDER_PORT" --log-level error >/dev/null &
pids+=($!)
for port in $LARDER_PORT $NGINX_PORT; do
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
done

for port in $LARDER_PORT $NGINX_PORT; do
  echo "preloading $KEYS keys of $SIZE B on port $port" >&2
  taskset -c 0 $BENCH http "http://127.0.0.1:$port/g" --workload put --distribution sequential \
    --keys "$KEYS" --requests "$KEYS" --value-size "$SIZE" --connections 16 --quiet
done

results="$work/results.txt"
: >"$results"
run() { # loader target port round
  local loader=$1 target=$2 port=$3 round=$4 rps
  if [ "$loader" = wrk ]; then
    wrk_run GET "$target" "$port" "$round" "$work/wrk.txt"
    rps=$(tail -n 1 "$work/wrk.txt" | cut -d' ' -f3)
  else
    taskset -c 0 $BENCH http "http://127.0.0.1:$port/g" --keys "$KEYS" --value-size "$SIZE" --check-length \
      --connections 64 --duration "$DURATION" --json "$work/run.json" --quiet
    rps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["req_per_s"])' "$work/run.json")
  fi
  echo "$loader $target $rps" >>"$results"
  printf 'round %s %-12s against %-6s %10.0f req/s\n' "$round" "$loader" "$target" "$rps" >&2
}
for round in $(seq "$ROUNDS"); do
  for target in nginx larder; do
    port=$NGINX_PORT
    [ "$target" = larder ] && port=$LARDER_PORT
    run wrk "$target" "$port" "$round"
    run larder-bench "$target" "$port" "$round"
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| target (GET 4 KiB, 64 connections) | wrk -t1 req/s | larder-bench http req/s | larder-bench / wrk |")
print("|---|---|---|---|")
for t in ("nginx", "larder"):
    med = {l: statistics.median(float(r[2]) for r in rows if r[0] == l and r[1] == t) for l in ("wrk", "larder-bench")}
    print(f"| {t} | {med['wrk']:,.0f} | {med['larder-bench']:,.0f} | {med['larder-bench'] / med['wrk']:.2f} |")
EOF
