#!/usr/bin/env bash
# fsync-vs-fio.sh: 1 MiB PUTs to larder with `--fsync always` (every PUT durable before its
# 200, concurrent PUTs sharing one fdatasync) next to what the disk gives fio for sequential
# 1 MiB buffered writes made durable with fsync, on the same file system, alternating.
#
#   bench/fsync-vs-fio.sh                    # ROUNDS=2 MIB=2048, under $TMPDIR or /tmp
#
# fio, two ways: `end_fsync` (buffered writes, one fsync at the end: the disk's sequential
# bandwidth) and `fdatasync=1` (an fdatasync after every 1 MiB write, one writer: what a
# store without group commit gets). larder: PUTs of 1 MiB new keys from larder-bench http,
# 64 connections; the server on core 1, the loader and fio on core 0.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
MIB=${MIB:-2048}
PORT=${LARDER_PORT:-18237}

scripts/install-bench-deps.sh
command -v fio >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio; }
cargo build --release -p larder-server -p larder-bench -q
BENCH=target/release/larder-bench

work=$(mktemp -d "${TMPDIR:-/tmp}/larder-fsync.XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
results="$work/results.txt"
: >"$results"

fio_run() { # name extra-args...
  local name=$1
  shift
  local out
  out=$(taskset -c 0 fio --name="$name" --filename="$work/fio.dat" --rw=write --bs=1M --size="${MIB}M" \
    --ioengine=psync --direct=0 "$@" --output-format=json)
  rm -f "$work/fio.dat"
  python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1048576)' <<<"$out"
}

larder_run() {
  rm -rf "$work/larder"
  taskset -c 1 target/release/larder serve --data-dir "$work/larder" --listen "127.0.0.1:$PORT" \
    --fsync always --volume-size 1GiB --volume-count 4 --log-level error >/dev/null &
  pid=$!
  until curl -s -o /dev/null "http://127.0.0.1:$PORT/_larder/health"; do sleep 0.1; done
  taskset -c 0 $BENCH http "http://127.0.0.1:$PORT/p" --workload put --distribution sequential \
    --keys 1000000 --value-size 1MiB --connections 64 --requests "$MIB" --json "$work/run.json" --quiet
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mb_per_s"] * 1e6 / 1048576)' "$work/run.json"
}

for round in $(seq "$ROUNDS"); do
  for what in fio-end-fsync fio-fdatasync larder; do
    case $what in
      fio-end-fsync) v=$(fio_run seq --end_fsync=1) ;;
      fio-fdatasync) v=$(fio_run seq --fdatasync=1) ;;
      larder) v=$(larder_run) ;;
    esac
    echo "$what $v" >>"$results"
    printf 'round %s %-14s %8.0f MiB/s\n' "$round" "$what" "$v" >&2
  done
done

python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {w: statistics.median(float(r[1]) for r in rows if r[0] == w) for w in ("fio-end-fsync", "fio-fdatasync", "larder")}
print("| 1 MiB sequential writes, durable | MiB/s (median) | larder / this |")
print("|---|---|---|")
print(f"| fio, buffered, fsync at end | {med['fio-end-fsync']:.0f} | {med['larder'] / med['fio-end-fsync']:.2f} |")
print(f"| fio, buffered, fdatasync after each write | {med['fio-fdatasync']:.0f} | {med['larder'] / med['fio-fdatasync']:.2f} |")
print(f"| larder PUT 1 MiB, --fsync always, 64 connections | {med['larder']:.0f} | 1.00 |")
EOF
