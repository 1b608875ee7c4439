#!/usr/bin/env bash
# The udp device against the floor (scripts/udp-floor: bare datagrams, no
# protocol) on this host: the same sizes, back to back, alternating, RUNS
# times each; prints the medians and their ratio:
#   pingpong   t_p50 of a half round trip, µs; x = efapoll / floor
#              (the target: at most 1.2)
#   streaming  64 B: messages/s (M), larger: MB/s; x = efapoll / floor
#              (the targets: at least 0.7)
# efapoll runs with its default udp window (fixed, 64 packets); pass
# `-a adaptive` to measure the device's RTT-driven one.
#
# Usage: scripts/compare-udp-floor.sh [-r RUNS] [-P SIZES] [-S SIZES] [-a WINDOW]
#   -r  runs of each program per measure (default 5, at least 5)
#   -P  pingpong sizes (default 64,4k)
#   -S  streaming sizes (default 64,64k,256k,1m)
#   -a  efapoll's --udp-window (default 64)
# Exit status: 0 done, 1 a run failed, 2 bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
prog=compare-udp-floor
. scripts/lib/compare.sh

runs=5
pp_sizes=64,4k
st_sizes=64,64k,256k,1m
window=64
while getopts "r:P:S:a:h" opt; do
  case "$opt" in
    r) runs="$OPTARG" ;;
    P) pp_sizes="$OPTARG" ;;
    S) st_sizes="$OPTARG" ;;
    a) window="$OPTARG" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
check_runs "$runs"

cargo build --release --quiet -p efapoll-apps -p efapoll-perf
bin="${CARGO_TARGET_DIR:-target}/release"
make_tmp

# The first value of `key` in a JSON report.
field() {
  sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" "$1" | head -1
}

# Runs one program (its arguments after the name); its report in $tmp/$1.json.
run() {
  local name=$1
  shift
  if ! "$@" --json "$tmp/$name.json" >"$tmp/$name.out" 2>&1; then
    echo "compare-udp-floor: $* failed:" >&2
    cat "$tmp/$name.out" >&2
    exit 1
  fi
}

# One measure: `app size floor_key efapoll_key iterations`; prints a row.
measure() {
  local app=$1 size=$2 fkey=$3 ekey=$4 iters=$5 f_all="" e_all="" unit
  for _ in $(seq "$runs"); do
    run floor "$bin/udp-floor" "$app" -S "$size" -I "$iters"
    run efapoll "$bin/efapoll" "$app" -p udp --udp-window "$window" -S "$size" -I "$iters"
    f_all+=" $(field "$tmp/floor.json" "$fkey")"
    e_all+=" $(field "$tmp/efapoll.json" "$ekey")"
  done
  case "$ekey" in
    t_p50_us) unit="p50 µs" ;; mmsg_per_s) unit="Mmsg/s" ;; *) unit="MB/s" ;;
  esac
  awk -v app="$app" -v s="$size" -v u="$unit" -v f="$(echo "$f_all" | median)" \
    -v e="$(echo "$e_all" | median)" 'BEGIN {
    printf "%-10s %8s %-7s %10.4g %10.4g %6.2f\n", app, s, u, f, e, e / f }'
}

echo "# $(date -u +%Y-%m-%d) $(uname -n): $(lscpu | sed -n 's/^Model name: *//p' | head -1)," \
  "$(nproc) cores; udp window $window; $runs runs each, alternating, medians"
printf '%-10s %8s %-7s %10s %10s %6s\n' app bytes measure floor efapoll x
IFS=',' read -r -a list <<<"$pp_sizes"
for size in "${list[@]}"; do
  measure pingpong "$size" t_p50_us t_p50_us 100000
done
IFS=',' read -r -a list <<<"$st_sizes"
for size in "${list[@]}"; do
  case "$size" in
    64|64b|64B) measure streaming "$size" mmsg_s mmsg_per_s 50000 ;;
    *) measure streaming "$size" mb_s bw_avg_mb_s 2000 ;;
  esac
done
