#!/usr/bin/env bash
# soak.sh: sustained mixed load. 90% GETs / 10% PUTs at 64 connections for DURATION against
# a release larder whose ring turns several times, sampling the server's RSS every
# SAMPLE seconds. Passes (exit 0) only with 0 errors (transport errors, 5xx, wrong body
# lengths; a 404 for a key the ring evicted is a miss, counted apart) and an RSS that stays
# within 10% of its value at the end of the first minute (warm-up: the memory tier fills).
#
#   bench/soak.sh                      # DURATION=10m KEYS=200000 SIZE=1024..8192
#   DURATION=2m bench/soak.sh -- --memory-eviction s3fifo
#
# Arguments after `--` go to `larder serve`. Server on core 1, loader on core 0. Results
# are also written to bench/results/soak-latest.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10m}
KEYS=${KEYS:-200000}
SIZE=${SIZE:-1024..8192}
SAMPLE=${SAMPLE:-10}
PORT=${PORT:-18251}
[ "${1:-}" = "--" ] && shift

cargo build --release -p larder-server -p larder-bench -q
. bench/lib.sh
start_larder soak target/release/larder "$PORT" --volume-size 64MiB --volume-count 16 \
  --memory-capacity 256MiB --fsync 1s "$@"
pid=$(cat "$work/soak.pid")
echo "preloading $KEYS keys of $SIZE bytes" >&2
preload "$PORT" "$KEYS" "$SIZE"

# stats FIELD...: the server's stats fields, comma-separated.
stats() {
  curl -s "http://127.0.0.1:$PORT/_larder/stats" |
    python3 -c "import json,sys; s=json.load(sys.stdin); print(','.join(str(s[k]) for k in sys.argv[1:]))" "$@"
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }

taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$PORT/g" --workload mixed --get-ratio 0.9 \
  --keys "$KEYS" --value-size "$SIZE" --connections 64 --duration "$DURATION" --check-length \
  --allow-misses --max-error-ratio 0 --json "$work/soak.json" >"$work/soak.out" 2>&1 &
loader=$!

start=$(date +%s)
echo "seconds,rss_kib,keys,memory_bytes,rotations" >"$work/rss.csv"
while kill -0 "$loader" 2>/dev/null; do
  sleep "$SAMPLE"
  kill -0 "$loader" 2>/dev/null || break
  line="$(($(date +%s) - start)),$(rss_kib),$(stats keys memory_bytes rotations)"
  echo "$line" >>"$work/rss.csv"
  echo "  $line" >&2
done
loader_rc=0
wait "$loader" || loader_rc=$?
cat "$work/soak.out"

mkdir -p bench/results
python3 - "$work/rss.csv" "$work/soak.json" "$loader_rc" "$DURATION" "$*" <<'EOF' | tee bench/results/soak-latest.md
import csv, json, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
try:
    summary = json.load(open(sys.argv[2]))
except (OSError, ValueError):
    summary = {}  # the loader failed before writing it
rss = [(int(r["seconds"]), int(r["rss_kib"])) for r in rows]
warm = [v for t, v in rss if t <= 60]
after = [v for t, v in rss if t > 60]
base = warm[-1] if warm else rss[0][1]
lo, hi = (min(after), max(after)) if after else (base, base)
growth = hi / base - 1
l = summary.get("latency", {})
print(f"## Soak: {sys.argv[4]} of 90% GET / 10% PUT, 64 connections (larder serve {sys.argv[5] or 'defaults'})")
print()
print(f"- requests {summary.get('requests')}, {summary.get('req_per_s', 0):.0f} req/s, "
      f"errors {summary.get('errors')}, misses (ring evictions) {summary.get('misses')}")
print(f"- latency us: p50 {l.get('p50_us')} p99 {l.get('p99_us')} p99.9 {l.get('p999_us')} max {l.get('max_us')}")
print(f"- RSS at 1 min {base / 1024:.1f} MiB; after it min {lo / 1024:.1f} MiB, max {hi / 1024:.1f} MiB "
      f"({growth * 100:+.1f}%); last memory tier {int(rows[-1]['memory_bytes']) / 2**20:.1f} MiB, "
      f"{rows[-1]['keys']} keys, {rows[-1]['rotations']} volumes sealed")
print()
print("| seconds | RSS MiB | keys | memory tier MiB | volumes sealed |")
print("|---:|---:|---:|---:|---:|")
step = max(1, len(rows) // 20)
for r in rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else []):
    print(f"| {r['seconds']} | {int(r['rss_kib']) / 1024:.1f} | {r['keys']} | "
          f"{int(r['memory_bytes']) / 2**20:.1f} | {r['rotations']} |")
ok = summary.get("errors") == 0 and growth <= 0.10
print()
print("**PASS**: 0 errors, RSS flat within 10%" if ok else "**FAIL**")
sys.exit(0 if ok else 1)
EOF
