#!/usr/bin/env bash
# index-memory.sh: bytes of RAM per key, measured as the growth of the server's resident set
# (VmRSS) while loading N keys with 8-byte values, divided by the keys loaded.
#
#   bench/index-memory.sh 1000000 10000000
#
# The load is wrk with bench/wrk/put.lua (distinct keys "/k<counter>"), stopped once
# /_larder/stats reports at least N keys; RSS is read after wrk has exited.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${LARDER_PORT:-18235}
scripts/install-bench-deps.sh
cargo build --release -p larder-server -q

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
keys() { curl -s "http://127.0.0.1:$PORT/_larder/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["keys"])'; }

echo "| keys loaded | RSS before (MiB) | RSS after (MiB) | bytes per key |"
echo "|---|---|---|---|"
for n in "$@"; do
  work=$(mktemp -d)
  taskset -c 1 target/release/larder serve --data-dir "$work" --listen "127.0.0.1:$PORT" >/dev/null &
  pid=$!
  until curl -s -o /dev/null "http://127.0.0.1:$PORT/_larder/health"; do sleep 0.1; done
  before=$(rss_kib $pid)
  SIZE=8 PREFIX=/k taskset -c 0 wrk -t1 -c64 -d3600s -s bench/wrk/put.lua "http://127.0.0.1:$PORT" >/dev/null &
  wrk=$!
  while [ "$(keys)" -lt "$n" ]; do sleep 0.5; done
  kill $wrk; wait $wrk 2>/dev/null || true
  sleep 1
  loaded=$(keys)
  after=$(rss_kib $pid)
  python3 -c "b,a,k=$before,$after,$loaded; print(f'| {k:,} | {b/1024:.1f} | {a/1024:.1f} | {(a-b)*1024/k:.1f} |')"
  kill $pid; wait $pid 2>/dev/null || true
  rm -rf "$work"
done
