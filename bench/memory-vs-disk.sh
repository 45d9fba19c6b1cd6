#!/usr/bin/env bash
# memory-vs-disk.sh: is a memory-tier hit cheaper than a read from the volumes (page cache)?
# Two larder servers hold the same 4 KiB values: one with the memory tier (every value
# promoted on its first read, then warmed), one with --memory-capacity 0. The same GET load
# runs against each, alternating, ROUNDS times; the table gives medians of throughput and of
# server CPU time per request (from /proc/<pid>/stat), and the share answered from memory.
#
#   bench/memory-vs-disk.sh            # DURATION=8s ROUNDS=3 KEYS=20000 SIZE=4096
#
# Servers pinned to core 1, the loader (one thread, 64 connections) to core 0.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-20000}
SIZE=${SIZE:-4096}
MEM_PORT=${MEM_PORT:-18241}
DISK_PORT=${DISK_PORT:-18242}

cargo build --release -p larder-server -p larder-bench -q
BENCH=target/release/larder-bench
. bench/lib.sh
start_larder memory target/release/larder "$MEM_PORT" --memory-capacity 256MiB --promote-after 1
start_larder disk target/release/larder "$DISK_PORT" --memory-capacity 0

for port in $MEM_PORT $DISK_PORT; do
  echo "preloading $KEYS keys of $SIZE B on port $port, then reading each once" >&2
  preload "$port" "$KEYS" "$SIZE"
done
entries=$(curl -s "http://127.0.0.1:$MEM_PORT/_larder/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_entries"])')
if [ "$entries" -ne "$KEYS" ]; then
  echo "the memory tier holds $entries of $KEYS keys: run invalid" >&2
  exit 1
fi

stat_field() { curl -s "http://127.0.0.1:$1/_larder/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }
results="$work/results.txt"
: >"$results"
hz=$(getconf CLK_TCK)
for round in $(seq "$ROUNDS"); do
  for name in memory disk; do
    port=$MEM_PORT
    [ "$name" = disk ] && port=$DISK_PORT
    sync
    t0=$(cpu_ticks $name)
    m0=$(stat_field "$port" memory_hits)
    taskset -c 0 $BENCH http "http://127.0.0.1:$port/g" --keys "$KEYS" --value-size "$SIZE" --check-length \
      --connections 64 --duration "$DURATION" --json "$work/run.json" --quiet
    t1=$(cpu_ticks $name)
    m1=$(stat_field "$port" memory_hits)
    read -r rps n < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["req_per_s"], j["requests"])' "$work/run.json")
    cpu=$(python3 -c "print(($t1 - $t0) * 1e6 / $hz / $n)")
    share=$(python3 -c "print(($m1 - $m0) / $n)")
    echo "$name $rps $cpu $share" >>"$results"
    printf 'round %s %-6s %9.0f req/s  %5.1f us CPU/request  %.3f from memory\n' "$round" "$name" "$rps" "$cpu" "$share" >&2
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda name, i: statistics.median(float(r[i]) for r in rows if r[0] == name)
print("| larder GET 4 KiB | req/s (median) | server CPU µs/request (median) | answered from memory |")
print("|---|---|---|---|")
for name, label in (("memory", "memory tier (all keys held)"), ("disk", "--memory-capacity 0 (page cache)")):
    print(f"| {label} | {med(name, 1):,.0f} | {med(name, 2):.1f} | {med(name, 3):.3f} |")
print(f"\nmemory / disk: throughput {med('memory', 1) / med('disk', 1):.2f}x, CPU per request {med('memory', 2) / med('disk', 2):.2f}x")
EOF
