#!/usr/bin/env bash
# cluster.sh: what the nginx consistent-hash tier (deploy/nginx) costs, and how many keys move
# when a node joins.
#
#   cargo build --release              # once: the script runs target/release/{larder,larder-bench}
#   bench/cluster.sh                   # 10 s per run, 2 rounds, 20,000 GET keys
#   DURATION=20s ROUNDS=3 bench/cluster.sh
#
# 1. GET of 4 KiB values with wrk (bench/wrk/get.lua, one thread, 64 connections) through
#    nginx to 3 nodes (deploy/nginx/run-cluster) and directly to one larder node, alternating,
#    medians. nginx and the 3 nodes, or the single node, are pinned to core 1 and wrk to core 0:
#    the same CPU on both sides, so the ratio is the price of the proxy hop. The keys fit in
#    the memory tier on both sides (each key read twice before the runs).
# 2. MOVE_KEYS (10,000) keys PUT through a 3-node cluster, which is then restarted with 4 nodes
#    on the same data directories; a GET of each key through nginx that answers 404 went to the
#    new, empty node: the key moved. Consistent hashing predicts about 1/4. owner.py's
#    prediction is printed next to it, and every answer's X-Larder-Node is checked against it.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-2}
KEYS=${KEYS:-20000}
SIZE=${SIZE:-4096}
MOVE_KEYS=${MOVE_KEYS:-10000}
LARDER_PORT=${LARDER_PORT:-18240}
CLUSTER_PORT=${CLUSTER_PORT:-18250} # nodes on the next 3 ports
MOVE_PORT=${MOVE_PORT:-18260}       # nodes on the next 4 ports

scripts/install-bench-deps.sh
for b in larder larder-bench; do
  [ -x "target/release/$b" ] || { echo "target/release/$b missing: run cargo build --release first" >&2; exit 1; }
done
export LARDER_BIN=$PWD/target/release/larder NGINX=${NGINX:-/usr/sbin/nginx}

. bench/lib.sh

# start_cluster N PORT DIR: run-cluster on DIR (kept, so a restart reuses the data) with
# nginx and the nodes on core 1; returns once it printed "cluster ready".
cluster_pid=
start_cluster() {
  local out=$3.out
  CLUSTER_DIR=$3 PIN_CPUS=1 deploy/nginx/run-cluster "$1" "$2" -- --log-level error >"$out" 2>&1 &
  cluster_pid=$!
  pids+=($!)
  for _ in $(seq 300); do
    grep -qx 'cluster ready' "$out" && return
    kill -0 "$cluster_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$out" >&2
  echo "run-cluster $1 $2 did not come up" >&2
  exit 1
}
stop_cluster() {
  kill -TERM "$cluster_pid"
  wait "$cluster_pid"
}

# 1. Throughput through nginx vs direct.
start_cluster 3 "$CLUSTER_PORT" "$work/c3"
start_larder single target/release/larder "$LARDER_PORT"
for port in $CLUSTER_PORT $LARDER_PORT; do
  echo "preloading $KEYS keys of $SIZE B through port $port, then reading each twice" >&2
  preload "$port" "$KEYS" "$SIZE" 2
done

results="$work/results.txt"
: >"$results"
for round in $(seq "$ROUNDS"); do
  wrk_run GET nginx+3 "$CLUSTER_PORT" "$round" "$results"
  wrk_run GET larder "$LARDER_PORT" "$round" "$results"
done
stop_cluster

python3 - "$results" "$SIZE" <<'EOF'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, "bench/wrk")
from medians import medians
size = int(sys.argv[2])
rounds = sum(1 for _ in open(sys.argv[1])) // 2
med = medians(sys.argv[1])
c, l = med[("GET", "nginx+3")], med[("GET", "larder")]
print(f"| GET {size} B | nginx + 3 nodes req/s | 1 larder node req/s | nginx+3 / larder | nginx+3 p50 / p99 ms | larder p50 / p99 ms |")
print("|---|---|---|---|---|---|")
print(f"| uniform, {rounds} rounds | {c[0]:,.0f} | {l[0]:,.0f} | {c[0] / l[0]:.2f} | {c[1]:.2f} / {c[2]:.2f} | {l[1]:.2f} / {l[2]:.2f} |")
EOF

# 2. Key movement from 3 to 4 nodes on the same data.
echo "key movement: $MOVE_KEYS keys through 3 nodes, then 4" >&2
start_cluster 3 "$MOVE_PORT" "$work/move"
python3 - put "$MOVE_PORT" "$MOVE_KEYS" <<'EOF'
import http.client, sys
port, n = int(sys.argv[2]), int(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
for i in range(n):
    c.request("PUT", f"/m/{i}", body=b"v%d" % i)
    r = c.getresponse(); r.read()
    if r.status != 200:
        sys.exit(f"PUT /m/{i} answered {r.status}")
EOF
stop_cluster
start_cluster 4 "$MOVE_PORT" "$work/move"
python3 - "$MOVE_PORT" "$MOVE_KEYS" <<'EOF'
import http.client, sys
sys.dont_write_bytecode = True  # no __pycache__ in the repository
sys.path.insert(0, "deploy/nginx")
from owner import Ring
port, n = int(sys.argv[1]), int(sys.argv[2])
new = f"127.0.0.1:{port + 4}"
ring = Ring([(f"127.0.0.1:{port + k}", 1) for k in range(1, 5)])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
moved = predicted = agree = wrong = 0
for i in range(n):
    path = f"/m/{i}"
    c.request("GET", path)
    r = c.getresponse(); body = r.read()
    owner = ring.owner(path.encode())
    agree += r.getheader("X-Larder-Node") == owner
    predicted += owner == new
    if r.status == 404:
        moved += 1
    elif r.status != 200 or body != b"v%d" % i:
        sys.exit(f"GET {path} answered {r.status} {body[:40]!r}")
    wrong += (r.status == 404) != (owner == new)  # a miss must be exactly a key of the new node
print(f"keys moved from 3 to 4 nodes: {moved} of {n} = {moved / n:.3f} (owner.py predicts {predicted / n:.3f}; 1/4 = 0.250)")
print(f"X-Larder-Node matches owner.py for {agree} of {n} keys; misses outside the new node's keys or hits on it: {wrong}")
EOF
stop_cluster
