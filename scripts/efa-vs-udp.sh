#!/usr/bin/env bash
# The efa device on softefa against the udp device it rides on: efapoll
# pingpong and streaming, a server and a client process on this host,
# `-p udp` and `-p efa` (softefa preloaded) alternating, RUNS times each;
# prints the medians side by side and their ratio:
#   pingpong   t_p50 of a half round trip, µs; x = efa / udp
#              (the target: at most 1.2)
#   streaming  64 B: messages/s (M), larger: MB/s; x = udp / efa, so that
#              above 1 is efa's cost here too (the target: at most 1.2)
# Both run the udp device with the same fixed window (softefa's QPs take
# it from SOFTEFA_UDP_WINDOW).
#
# Usage: scripts/efa-vs-udp.sh [-r RUNS] [-P SIZES] [-S SIZES] [-B PORT] [-L LIB]
#   -r  runs of each device per measure (default 5, at least 5)
#   -P  pingpong sizes (default 64,1m)
#   -S  streaming sizes (default 64,1m)
#   -B  TCP port of the control link (default 19340)
#   -L  the softefa library (default: the release build's libsoftefa.so)
# Exit status: 0 done, 1 a run failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
prog=efa-vs-udp
. scripts/lib/compare.sh

runs=5
pp_sizes=64,1m
st_sizes=64,1m
port=19340
lib=""
window=64
while getopts "r:P:S:B:L:h" opt; do
  case "$opt" in
    r) runs="$OPTARG" ;;
    P) pp_sizes="$OPTARG" ;;
    S) st_sizes="$OPTARG" ;;
    B) port="$OPTARG" ;;
    L) lib="$OPTARG" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
check_runs "$runs"

cargo build --release --quiet -p softefa -p efapoll-apps --features efapoll-apps/efa
bin="${CARGO_TARGET_DIR:-target}/release"
lib="${lib:-$bin/libsoftefa.so}"
make_tmp

# The first value of `key` in a JSON report.
field() {
  sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" "$1" | head -1
}

# One run of `app` at `size` on `provider`, server and client; the
# client's report in $tmp/$provider.json.
run() {
  local app=$1 prov=$2 size=$3 iters=$4 pre=""
  [ "$prov" = efa ] && pre="$lib"
  local args=(-p "$prov" -S "$size" -I "$iters" -B "$port" --udp-window "$window" --timeout 30)
  LD_PRELOAD="$pre" SOFTEFA_UDP_WINDOW="$window" timeout 120 \
    "$bin/efapoll" "$app" --server "${args[@]}" >"$tmp/server.out" 2>&1 &
  local server=$!
  if ! LD_PRELOAD="$pre" SOFTEFA_UDP_WINDOW="$window" timeout 120 \
    "$bin/efapoll" "$app" 127.0.0.1 "${args[@]}" --json "$tmp/$prov.json" >"$tmp/client.out" 2>&1; then
    echo "efa-vs-udp: $app -p $prov -S $size failed:" >&2
    cat "$tmp/client.out" "$tmp/server.out" >&2
    kill "$server" 2>/dev/null || true
    exit 1
  fi
  wait "$server" || true
}

# One measure: `app size key iterations`; prints a row.
measure() {
  local app=$1 size=$2 key=$3 iters=$4 u_all="" e_all="" unit
  for _ in $(seq "$runs"); do
    run "$app" udp "$size" "$iters"
    u_all+=" $(field "$tmp/udp.json" "$key")"
    run "$app" efa "$size" "$iters"
    e_all+=" $(field "$tmp/efa.json" "$key")"
  done
  case "$key" in
    t_p50_us) unit="p50 µs" ;; mmsg_per_s) unit="Mmsg/s" ;; *) unit="MB/s" ;;
  esac
  awk -v app="$app" -v s="$size" -v u="$unit" -v k="$key" -v a="$(echo "$u_all" | median)" \
    -v b="$(echo "$e_all" | median)" 'BEGIN {
    x = (k == "t_p50_us") ? b / a : a / b
    printf "%-10s %8s %-7s %10.4g %10.4g %6.2f\n", app, s, u, a, b, x }'
}

echo "# $(date -u +%Y-%m-%d) $(uname -n): $(lscpu | sed -n 's/^Model name: *//p' | head -1)," \
  "$(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg); udp window $window;" \
  "$runs runs each, alternating, medians"
printf '%-10s %8s %-7s %10s %10s %6s\n' app bytes measure udp efa x
IFS=',' read -r -a list <<<"$pp_sizes"
for size in "${list[@]}"; do
  case "$size" in
    64|64b|64B|[0-9]|[0-9][0-9]|[0-9][0-9][0-9]) measure pingpong "$size" t_p50_us 20000 ;;
    *) measure pingpong "$size" t_p50_us 300 ;;
  esac
done
IFS=',' read -r -a list <<<"$st_sizes"
for size in "${list[@]}"; do
  case "$size" in
    64|64b|64B) measure streaming "$size" mmsg_per_s 50000 ;;
    *) measure streaming "$size" bw_avg_mb_s 300 ;;
  esac
done
