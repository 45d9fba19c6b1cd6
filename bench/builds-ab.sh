#!/usr/bin/env bash
# builds-ab.sh: does a change cost GET (or PUT) throughput or CPU? Runs two larder binaries, A
# (a baseline build) and B (by default this tree's release build), with the same settings and
# the same 4 KiB values, and the same load against each, alternating A B A B ROUNDS times.
# Prints each run and the medians of throughput and server CPU time per request.
#
#   git worktree add ../larder-a <rev> && (cd ../larder-a && cargo build --release -p larder-server)
#   bench/builds-ab.sh ../larder-a/target/release/larder -- --promote-after 1   # memory hits
#   bench/builds-ab.sh ../larder-a/target/release/larder -- --memory-capacity 0  # page cache
#
#   WORKLOAD=put bench/builds-ab.sh ../larder-a/target/release/larder -- --volume-size 64MiB
#
# DURATION=8s ROUNDS=5 KEYS=20000 SIZE=4096 WORKLOAD=get (or put: overwrites of the same keys).
# PROTOCOL=memcache loads the memcached port (text get and set) instead of HTTP.
# A_ARGS / B_ARGS: more serve arguments for A or B alone, to compare one build with itself
# under two settings, e.g. request tracing off (A) and on (B):
#   A_ARGS="--slow-request 0" bench/builds-ab.sh target/release/larder target/release/larder -- --promote-after 1
# Servers pinned to core 1, the loader to core 0.
#
# TOGETHER=1 loads A and B at the same time instead (two loaders of 32 connections each, on
# core 0, the two servers sharing core 1), so that whatever else slows the machine slows both
# alike: each round's B / A CPU per request is paired, and their median printed. Taking turns,
# these machines drift by ±10% between rounds (A against itself: 0.91x); together is how a
# difference of a few percent is resolved.
set -euo pipefail
A=$(realpath "${1:?usage: builds-ab.sh BINARY_A [BINARY_B] [-- larder serve args]}")
shift
B=target/release/larder
if [ $# -gt 0 ] && [ "$1" != "--" ]; then B=$(realpath "$1"); shift; fi
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-5}
KEYS=${KEYS:-20000}
SIZE=${SIZE:-4096}
WORKLOAD=${WORKLOAD:-get}
PROTOCOL=${PROTOCOL:-http}
check=--check-length
[ "$WORKLOAD" = get ] || check=
cargo build --release -p larder-server -p larder-bench -q
. bench/lib.sh
# shellcheck disable=SC2086 # A_ARGS and B_ARGS are argument lists, split on purpose
start_larder a "$A" 18251 --memcache-listen 127.0.0.1:18351 "$@" ${A_ARGS:-}
# shellcheck disable=SC2086
start_larder b "$B" 18252 --memcache-listen 127.0.0.1:18352 "$@" ${B_ARGS:-}
for port in 18251 18252; do
  if [ "$PROTOCOL" = memcache ]; then
    for w in put get get; do
      taskset -c 0 target/release/larder-bench memcache "127.0.0.1:$((port + 100))" --workload $w \
        --distribution sequential --keys "$KEYS" --requests "$KEYS" --value-size "$SIZE" --quiet
    done
  else
    preload "$port" "$KEYS" "$SIZE" 2
  fi
done
hz=$(getconf CLK_TCK)
results="$work/results.txt"
# load NAME PORT CONNECTIONS: one loader's run against server NAME, its summary in NAME.json.
load() {
  if [ "$PROTOCOL" = memcache ]; then
    taskset -c 0 target/release/larder-bench memcache "127.0.0.1:$(($2 + 100))" --keys "$KEYS" \
      --value-size "$SIZE" --workload "$WORKLOAD" $check --connections "$3" --duration "$DURATION" \
      --json "$work/$1.json" --quiet
  else
    taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$2/g" --keys "$KEYS" --value-size "$SIZE" \
      --workload "$WORKLOAD" $check --connections "$3" --duration "$DURATION" --json "$work/$1.json" --quiet
  fi
}
# cpu_per_request NAME T0 T1: server NAME's CPU µs per request of its last load.
cpu_per_request() {
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(round(j["req_per_s"]), round((int(sys.argv[3]) - int(sys.argv[2])) * 1e6 / int(sys.argv[4]) / j["requests"], 2))' \
    "$work/$1.json" "$2" "$3" "$hz"
}
label=""
[ "$PROTOCOL" = memcache ] && label=" (memcached protocol)"
[ -n "${A_ARGS:-}${B_ARGS:-}" ] && label="$label, A: \`${A_ARGS:-}\`, B: \`${B_ARGS:-}\`"
if [ "${TOGETHER:-0}" = 1 ]; then
  for round in $(seq "$ROUNDS"); do
    a0=$(cpu_ticks a)
    b0=$(cpu_ticks b)
    # Which loader starts first changes each round, so that neither server always leads.
    if [ $((round % 2)) = 1 ]; then
      load a 18251 32 &
      l1=$!
      load b 18252 32 &
    else
      load b 18252 32 &
      l1=$!
      load a 18251 32 &
    fi
    wait "$l1" $!
    a1=$(cpu_ticks a)
    b1=$(cpu_ticks b)
    echo "$round $(cpu_per_request a "$a0" "$a1") $(cpu_per_request b "$b0" "$b1")" | tee -a "$results" >&2
  done
  python3 - "$results" "$*" "$WORKLOAD" "$SIZE" "$label" <<'EOF2'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1])]
print(f"| {sys.argv[3].upper()} {int(sys.argv[4]) // 1024} KiB{sys.argv[5]}, `{sys.argv[2] or 'defaults'}`, together | A req/s | A CPU µs/req | B req/s | B CPU µs/req | B / A CPU |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| round {int(r[0])} | {r[1]:,.0f} | {r[2]:.2f} | {r[3]:,.0f} | {r[4]:.2f} | {r[4] / r[2]:.3f} |")
ratios = sorted(r[4] / r[2] for r in rows)
print(f"\nB / A CPU per request: median {statistics.median(ratios):.3f}x over {len(ratios)} rounds "
      f"(from {ratios[0]:.3f} to {ratios[-1]:.3f}); B / A throughput: median "
      f"{statistics.median(r[3] / r[1] for r in rows):.3f}x")
EOF2
  exit 0
fi
for round in $(seq "$ROUNDS"); do
  for name in a b; do
    port=18251
    [ "$name" = b ] && port=18252
    t0=$(cpu_ticks $name)
    load $name $port 64
    t1=$(cpu_ticks $name)
    echo "$name $(cpu_per_request $name "$t0" "$t1")" | tee -a "$results" >&2
  done
done
python3 - "$results" "$*" "$WORKLOAD" "$SIZE" "$label" <<'EOF2'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda name, i: statistics.median(float(r[i]) for r in rows if r[0] == name)
print(f"| {sys.argv[3].upper()} {int(sys.argv[4]) // 1024} KiB{sys.argv[5]}, `{sys.argv[2] or 'defaults'}` | req/s (median) | server CPU µs/request (median) |")
print("|---|---|---|")
for name in ("a", "b"):
    print(f"| {name.upper()} | {med(name, 1):,.0f} | {med(name, 2):.2f} |")
print(f"\nB / A: throughput {med('b', 1) / med('a', 1):.3f}x, CPU per request {med('b', 2) / med('a', 2):.3f}x")
EOF2
