#!/usr/bin/env bash
# wrk-compare.sh: PUT and GET of 4 KiB values, larder next to nginx serving the same values as
# static files (WebDAV PUT for one file per key), in one run, alternating A B A B, medians.
#
#   bench/wrk-compare.sh                 # 10 s per run, 2 rounds, 100,000 GET keys
#   DURATION=20s ROUNDS=3 KEYS=200000 bench/wrk-compare.sh
#
# Both servers are pinned to core 1 (only one is loaded at a time), wrk to core 0.
# Peer settings: bench/nginx.conf.in (one worker, access log off, sendfile on).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
KEYS=${KEYS:-100000}
SIZE=${SIZE:-4096}
LARDER_PORT=${LARDER_PORT:-18234}
NGINX_PORT=${NGINX_PORT:-18080}

scripts/install-bench-deps.sh
cargo build --release -p larder-server -q
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

. bench/lib.sh
start_nginx "$NGINX_PORT"
taskset -c 1 target/release/larder serve --data-dir "$work/larder" --listen "127.0.0.1:$LARDER_PORT" >"$work/larder.out" &
pids+=($!)
for port in $LARDER_PORT $NGINX_PORT; do
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
done

echo "preloading $KEYS keys of $SIZE B into each server" >&2
python3 bench/wrk/preload.py 127.0.0.1 "$LARDER_PORT" /g "$KEYS" "$SIZE" 8 >&2
python3 bench/wrk/preload.py 127.0.0.1 "$NGINX_PORT" /g "$KEYS" "$SIZE" 8 >&2

results="$work/results.txt"
: >"$results"
for round in $(seq "$ROUNDS"); do
  for workload in PUT GET; do
    wrk_run "$workload" larder "$LARDER_PORT" "$round" "$results"
    wrk_run "$workload" nginx "$NGINX_PORT" "$round" "$results"
  done
done

python3 - "$results" "$SIZE" <<'EOF'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, "bench/wrk")
from medians import medians
size = int(sys.argv[2])
med = medians(sys.argv[1])
print(f"| workload ({size} B) | larder req/s | nginx req/s | larder/nginx | larder p50 / p99 ms | nginx p50 / p99 ms |")
print("|---|---|---|---|---|---|")
for w in ("PUT", "GET"):
    l, n = med[(w, "larder")], med[(w, "nginx")]
    print(f"| {w} | {l[0]:,.0f} | {n[0]:,.0f} | {l[0] / n[0]:.2f} | {l[1]:.2f} / {l[2]:.2f} | {n[1]:.2f} / {n[2]:.2f} |")
EOF
