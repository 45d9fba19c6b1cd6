# Shared by the bench scripts that run larder servers side by side: source it after `cd`
# to the repository root. Servers are pinned to core 1; loaders go on core 0.

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# start_larder NAME BINARY PORT [larder serve args...]: starts a server on a fresh data
# directory and waits until it is healthy; its pid is in $work/NAME.pid. With LAUNCH set
# (e.g. a valgrind command line), the server runs under it.
start_larder() {
  local name=$1 bin=$2 port=$3
  shift 3
  # shellcheck disable=SC2086 # LAUNCH is a command line, split on purpose
  taskset -c 1 ${LAUNCH:-} "$bin" serve --data-dir "$work/$name" --listen "127.0.0.1:$port" --log-level error "$@" >/dev/null &
  pids+=($!)
  echo $! >"$work/$name.pid"
  for _ in $(seq 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/_larder/health" && return
    sleep 0.1
  done
  echo "larder ($name) did not start" >&2
  exit 1
}

# cpu_ticks NAME: user + system CPU time of server NAME so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1.pid")/stat"; }

# preload PORT KEYS SIZE [READS]: PUTs KEYS values of SIZE bytes under /g0, /g1, … and reads
# each READS times (default 1; the default --promote-after needs 2 to fill the memory tier).
preload() {
  local reads=${4:-1}
  for w in put $(yes get | head -n "$reads"); do
    taskset -c 0 target/release/larder-bench http "http://127.0.0.1:$1/g" --workload $w --distribution sequential \
      --keys "$2" --requests "$2" --value-size "$3" --connections 16 --quiet
  done
}

# start_nginx PORT: Debian's nginx with the peer configuration (bench/nginx.conf.in) on PORT,
# its files under $work/ngx.
start_nginx() {
  mkdir -p "$work/ngx/logs" "$work/ngx/tmp" "$work/ngx/root"
  sed "s#@DIR@#$work/ngx#g; s#@PORT@#$1#g" bench/nginx.conf.in >"$work/ngx/nginx.conf"
  taskset -c 1 "${NGINX:-/usr/sbin/nginx}" -c "$work/ngx/nginx.conf" &
  pids+=($!)
}

# wrk_run WORKLOAD TARGET PORT ROUND RESULTS: one `wrk -t1 -c64` run of PUT (fresh keys per
# round, $SIZE bytes) or GET ($KEYS preloaded keys under /g) for $DURATION on core 0; appends
# "WORKLOAD TARGET req/s p50 p99" to RESULTS. A run with any non-2xx answer is invalid.
wrk_run() {
  local workload=$1 target=$2 port=$3 round=$4 results=$5 out rps p50 p99
  if [ "$workload" = PUT ]; then
    out=$(START=$((round * 100000000)) SIZE=$SIZE PREFIX=/p taskset -c 0 \
      wrk -t1 -c64 -d"$DURATION" --latency -s bench/wrk/put.lua "http://127.0.0.1:$port")
  else
    out=$(N=$KEYS PREFIX=/g taskset -c 0 wrk -t1 -c64 -d"$DURATION" --latency -s bench/wrk/get.lua "http://127.0.0.1:$port")
  fi
  if grep -q "Non-2xx" <<<"$out"; then
    echo "$workload against $target had non-2xx responses: run invalid" >&2
    echo "$out" >&2
    exit 1
  fi
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  echo "$workload $target $rps $p50 $p99" >>"$results"
  echo "round $round $workload $target: $rps req/s p50 $p50 p99 $p99" >&2
}
