#!/usr/bin/env bash
# scale.sh: one node holding KEYS small objects, measured as a user would see it.
#
#   bench/scale.sh                     # 100 million keys of 8 bytes (about 25 minutes to fill)
#   KEYS=10000000 bench/scale.sh       # 10 million (about 3 minutes)
#   KEYS=1000000 SAMPLE=100000 bench/scale.sh
#   DATA=/big/disk/larder bench/scale.sh   # keep the filled directory; run again to measure
#                                          # restarts and reads without filling again
#
# 1. A release larder with the default configuration (a ring of 16 x 1 GiB, no memory tier
#    settings) on core 1 is filled over HTTP with KEYS distinct keys of SIZE bytes, in order,
#    by larder-bench on core 0. Each value starts with its key's number, so a read can tell a
#    value served for the wrong key.
# 2. RAM: the server's resident set (VmRSS) before and after the fill; the growth divided by
#    the keys is the whole process's cost per key (index, allocator, everything).
# 3. Reads: SAMPLE uniform GETs over all the keys, each checked for its own value; hit rate,
#    p99, and the disk reads, collision reads and false evictions the server counted.
# 4. Restarts, timed from exec to the first 200 from /_larder/health (polled every 10 ms):
#    kill -9 of the server that was never stopped gracefully (hint files of the sealed volumes,
#    a scan of the whole active one), then a graceful stop and start (hint files and the active
#    volume's checkpoint, no scan); each with the page cache warm, then cold (caches dropped,
#    when run as root). The timed starts have both cores. RSS after the restart is reported.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-100000000}
SIZE=${SIZE:-8}
SAMPLE=${SAMPLE:-1000000}
PORT=${PORT:-18471}
bin=${LARDER:-target/release/larder}
[ -x "$bin" ] && [ -x target/release/larder-bench ] || cargo build --release -p larder-server -p larder-bench
scripts/install-bench-deps.sh >/dev/null
source bench/lib.sh

dir=${DATA:-$work/data}
url=http://127.0.0.1:$PORT
pid=
serve() {
  taskset -c "$1" "$bin" serve --data-dir "$dir" --listen "127.0.0.1:$PORT" --log-level error >/dev/null &
  pid=$!
  pids+=("$pid")
}
healthy() { curl -sf -o /dev/null "$url/_larder/health"; }
took=
start_timed() {
  local t0
  t0=$(date +%s.%N)
  serve 0-1
  until healthy; do
    kill -0 "$pid" 2>/dev/null || { echo "larder exited during recovery" >&2; exit 1; }
    sleep 0.01
  done
  took=$(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }")
}
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
stat() { curl -sf "$url/_larder/stats" | python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }
cold() { [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }

serve 1
until healthy; do sleep 0.05; done
if [ "$(stat '["keys"]')" -ge "$KEYS" ]; then
  echo "$dir already holds $(stat '["keys"]') keys: no fill; RSS after its start $(($(rss_kib) / 1024)) MiB"
  keys=$(stat '["keys"]')
  # The baseline: an empty server's resident set, measured on the side.
  "$bin" serve --data-dir "$work/empty" --listen "127.0.0.1:$((PORT + 1))" --log-level error >/dev/null &
  p0=$!
  until curl -sf -o /dev/null "http://127.0.0.1:$((PORT + 1))/_larder/health"; do sleep 0.05; done
  rss0=$(awk '/VmRSS/ {print $2}' "/proc/$p0/status")
  kill "$p0"; wait "$p0" 2>/dev/null || true
else
rss0=$(rss_kib)
echo "filling $KEYS keys of $SIZE bytes over HTTP ..."
t0=$(date +%s)
taskset -c 0 target/release/larder-bench http "$url/k" --workload put --distribution sequential --keyed-values \
  --keys "$KEYS" --requests "$KEYS" --value-size "$SIZE" --connections 32 --quiet
fill_s=$(($(date +%s) - t0))
sleep 3 # the sealed volumes' hint files are written, as in a long-running server
rss1=$(rss_kib)
keys=$(stat '["keys"]')
python3 - "$KEYS" "$fill_s" "$rss0" "$rss1" "$keys" "$(stat '["bytes_used"]')" "$(stat '["index_bytes"]')" <<'EOF2'
import sys
n, secs, r0, r1, keys, used, index = map(int, sys.argv[1:])
print(f"fill: {n:,} PUTs in {secs} s ({n / max(secs, 1):,.0f} PUT/s); {keys:,} keys")
print(f"RSS: {r0 / 1024:.1f} MiB before, {r1 / 1024:.1f} MiB after: {(r1 - r0) * 1024 / keys:.2f} B/key "
      f"(index tables {index / keys:.2f} B/key); disk {used / keys:.1f} B/key")
EOF2
fi

sample() {
  local before after
  before=$(curl -sf "$url/_larder/stats")
  taskset -c 0 target/release/larder-bench http "$url/k" --workload get --distribution uniform --keyed-values \
    --allow-misses --max-error-ratio 0 --keys "$KEYS" --requests "$SAMPLE" --value-size "$SIZE" --seed "$1" \
    --quiet --json "$work/sample.json"
  after=$(curl -sf "$url/_larder/stats")
  python3 - "$work/sample.json" "$before" "$after" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
b, a = json.loads(sys.argv[2]), json.loads(sys.argv[3])
d = lambda k: a[k] - b[k]
hits = d("hits")
print(f"GET sample: {s['requests']:,} uniform over the keys, {s['errors']} wrong, hit rate "
      f"{1 - s['misses'] / s['requests']:.6f}, p50 {s['latency']['p50_us'] / 1000:.2f} ms, "
      f"p99 {s['latency']['p99_us'] / 1000:.2f} ms; per hit: {d('disk_reads') / max(hits, 1):.4f} disk reads, "
      f"{d('collision_reads') / max(hits, 1):.6f} extra (collision) reads; "
      f"false evictions so far {a['false_evictions']}")
EOF
}
sample 1

restart() { # restart NAME STOP: stops with STOP, then times warm and cold starts
  "$2"
  start_timed
  local warm=$took
  "$2"
  cold || true
  start_timed
  echo "$1 restart to 200: warm $warm s, cold $took s; RSS after $(($(rss_kib) / 1024)) MiB" \
    "($(python3 -c "print(f'{($(rss_kib) - $rss0) * 1024 / $keys:.2f}')") B/key over the empty server's);" \
    "recovery: $(stat '["recovery"]')"
}
# kill -9, and the active volume's checkpoint removed if a graceful stop left one (a directory
# measured again): the worst case, a server that never stopped gracefully since its active
# volume began, whose next start scans all of that volume.
crash() {
  local active
  active=$(stat '["active_volume"]')
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$dir/$(printf 'vol-%05d.hint' "$active")"
}
graceful() { kill -TERM "$pid"; wait "$pid" 2>/dev/null || true; }
# Not a crash restart after a graceful one: that would load the checkpoint, not scan.
restart "kill -9" crash
restart graceful graceful
sample 2
