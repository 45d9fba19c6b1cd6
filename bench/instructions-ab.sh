#!/usr/bin/env bash
# instructions-ab.sh: what a change costs a GET in instructions, which, unlike CPU time, do
# not depend on what else the machine is doing. Runs two larder binaries, A and B (by default
# this tree's release build), each under valgrind's callgrind with the same settings, preloads
# the same 4 KiB values, zeroes the counters, sends the same GETs, and prints the server's
# instructions per request for each and B / A. Every instruction the server process executes
# counts (all threads: tokio workers, the blocking pool, the kernel interface excluded).
#
#   bench/instructions-ab.sh ../larder-a/target/release/larder -- --promote-after 1    # memory hits
#   bench/instructions-ab.sh ../larder-a/target/release/larder -- --memory-capacity 0  # page cache
#
# REQUESTS=20000 KEYS=2000 SIZE=4096. Installs valgrind from Debian's packages if missing.
# A_ARGS / B_ARGS: more serve arguments for A or B alone (one build under two settings), e.g.
#   A_ARGS="--slow-request 0" bench/instructions-ab.sh target/release/larder target/release/larder -- --promote-after 1
set -euo pipefail
A=$(realpath "${1:?usage: instructions-ab.sh BINARY_A [BINARY_B] [-- larder serve args]}")
shift
B=target/release/larder
if [ $# -gt 0 ] && [ "$1" != "--" ]; then B=$(realpath "$1"); shift; fi
[ "${1:-}" = "--" ] && shift
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-20000}
KEYS=${KEYS:-2000}
SIZE=${SIZE:-4096}
scripts/install-bench-deps.sh
if ! command -v valgrind >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq valgrind
fi
cargo build --release -p larder-server -p larder-bench -q
. bench/lib.sh

# ir NAME BINARY PORT ARGS...: instructions the server ran for the measured GETs.
ir() {
  local name=$1 bin=$2 port=$3 pid
  shift 3
  LAUNCH="valgrind --tool=callgrind --callgrind-out-file=$work/$name.out --log-file=$work/$name.vg" \
    start_larder "$name" "$bin" "$port" "$@"
  pid=$(cat "$work/$name.pid")
  preload "$port" "$KEYS" "$SIZE" 2 # both tiers warm, as the settings make them
  callgrind_control -z "$pid" >/dev/null
  taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$port/g" --distribution sequential \
    --keys "$KEYS" --value-size "$SIZE" --connections 8 --requests "$REQUESTS" --check-length --quiet
  callgrind_control -d "$pid" >/dev/null
  # The dump asked for after zeroing (`NAME.out.1`; the one at exit comes later, as
  # `NAME.out`) holds exactly the measured GETs.
  awk '/^summary:|^totals:/ {print $2; exit}' "$work/$name.out.1"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2086 # A_ARGS and B_ARGS are argument lists, split on purpose
a=$(ir a "$A" 18261 "$@" ${A_ARGS:-})
# shellcheck disable=SC2086
b=$(ir b "$B" 18262 "$@" ${B_ARGS:-})
settings="$*"
[ -n "${A_ARGS:-}${B_ARGS:-}" ] && settings="$settings; A: ${A_ARGS:-}; B: ${B_ARGS:-}"
python3 - "$a" "$b" "$REQUESTS" "$settings" <<'EOF'
import sys
a, b, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print(f"| GET 4 KiB, `{sys.argv[4] or 'defaults'}` | instructions / request |")
print("|---|---|")
print(f"| A | {a / n:,.0f} |")
print(f"| B | {b / n:,.0f} |")
print(f"\nB / A: instructions per request {b / a:.3f}x")
EOF
