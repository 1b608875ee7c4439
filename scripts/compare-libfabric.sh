#!/usr/bin/env bash
# Side by side with libfabric: fi_pingpong (Debian's libfabric-bin) and
# `efapoll pingpong` on the same device class, the same sizes and
# iterations, back to back, alternating, RUNS times each; prints the
# medians per size:
#   fi_avg    fi_pingpong's usec/xfer: elapsed / iterations / 2, the
#             average half round trip (all fi_pingpong reports), µs
#   ef_avg    efapoll's t_avg, the same average, µs
#   avg_x     fi_avg / ef_avg: how many times faster efapoll is, average
#             against average (like with like)
#   ef_p50    efapoll's t_p50, µs, for reference: no ratio, since
#             fi_pingpong has no median to set against it
#
# fi_pingpong's server runs on core 1 and its client on core 0 (taskset);
# efapoll pins its two lcores, 0 and 1, itself. Never more than two busy
# threads at a time.
#
# Usage: scripts/compare-libfabric.sh [-p shm|udp|efa] [-S 64,4096,...] [-r RUNS] [-I ITERS] [-o FILE]
#   -p  fi_pingpong's provider and efapoll's device (default shm); udp is
#       libfabric's `udp;ofi_rxd` (RDM over UDP) against efapoll's udp
#       device, both on this host
#   -S  sizes in bytes, k/m/g suffixes binary (default 64,256,1k,4k,16k,64k,1m)
#   -r  runs of each program per size (default 5, at least 5)
#   -I  iterations per run (default ten times fabtests': 100000, from
#       64 KiB 10000, from 1 MiB 1000, so that start-up costs vanish)
#   -o  also write the medians to FILE in Bencher Metric Format:
#       `compare/<provider>/<bytes>B/libfabric` and `.../efapoll` with
#       `latency`, the average half round trip in ns, and
#       `.../efapoll-p50` with efapoll's median as its `latency`
# Exit status: 0 done, 1 a run failed, 2 bad arguments or fi_pingpong
# absent.
set -euo pipefail
cd "$(dirname "$0")/.."
prog=compare-libfabric
. scripts/lib/compare.sh

provider=shm
sizes=64,256,1k,4k,16k,64k,1m
runs=5
iters=""
bmf=""
while getopts "p:S:r:I:o:h" opt; do
  case "$opt" in
    p) provider="$OPTARG" ;;
    S) sizes="$OPTARG" ;;
    r) runs="$OPTARG" ;;
    I) iters="$OPTARG" ;;
    o) bmf="$OPTARG" ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
check_runs "$runs"
if ! command -v fi_pingpong >/dev/null 2>&1; then
  echo "compare-libfabric: fi_pingpong not found; install libfabric's tools:" >&2
  echo "  apt-get install libfabric-bin" >&2
  exit 2
fi

cargo build --release --quiet -p efapoll-apps
efapoll="${CARGO_TARGET_DIR:-target}/release/efapoll"
make_tmp

iters_for() {
  if [ -n "$iters" ]; then echo "$iters"
  elif [ "$1" -ge 1048576 ]; then echo 1000
  elif [ "$1" -ge 65536 ]; then echo 10000
  else echo 100000
  fi
}

# A TCP port nothing listens on, for fi_pingpong's control connection.
free_port() {
  local port
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "compare-libfabric: no free TCP port found" >&2
  exit 1
}

# fi_pingpong's usec/xfer for one size.
fi_run() {
  local size=$1 n=$2 port out
  port="$(free_port)"
  taskset -c 1 timeout 120 fi_pingpong -p "$provider" -e rdm -S "$size" -I "$n" -B "$port" \
    >"$tmp/server" 2>&1 &
  local server=$! ok=""
  # The server takes the first connection to its port as its client, so
  # the client itself must be what finds it listening: retry it.
  for _ in $(seq 20); do
    sleep 0.2
    if out="$(taskset -c 0 timeout 120 fi_pingpong -p "$provider" -e rdm -S "$size" -I "$n" \
      -P "$port" 127.0.0.1 2>&1)"; then
      ok=1
      break
    fi
    kill -0 "$server" 2>/dev/null || break
  done
  if [ -z "$ok" ]; then
    echo "compare-libfabric: fi_pingpong -S $size failed:" >&2
    echo "$out" >&2
    cat "$tmp/server" >&2
    kill "$server" 2>/dev/null || true
    exit 1
  fi
  wait "$server" || true
  # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec, with the
  # bytes as fabtests abbreviates them (1k, 1m): the row after the header.
  local us
  us="$(echo "$out" | awk '$1 == "bytes" { getline; print $7; exit }')"
  if [ -z "$us" ]; then
    echo "compare-libfabric: no usec/xfer in fi_pingpong's output:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "$us"
}

# efapoll's t_avg_us and t_p50_us for one size.
efapoll_run() {
  local size=$1 n=$2
  if ! "$efapoll" pingpong -p "$provider" -S "$size" -I "$n" --json "$tmp/ef.json" \
    >"$tmp/ef.out" 2>&1; then
    echo "compare-libfabric: efapoll pingpong -S $size failed:" >&2
    cat "$tmp/ef.out" >&2
    exit 1
  fi
  local avg p50
  avg="$(sed -n 's/.*"t_avg_us": *\([0-9.eE+-]*\).*/\1/p' "$tmp/ef.json" | head -1)"
  p50="$(sed -n 's/.*"t_p50_us": *\([0-9.eE+-]*\).*/\1/p' "$tmp/ef.json" | head -1)"
  echo "$avg $p50"
}

echo "# $(date -u +%Y-%m-%d) $(uname -n): $(lscpu | sed -n 's/^Model name: *//p' | head -1)," \
  "$(nproc) cores; $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: /libfabric /p')"
echo "# provider/device $provider, $runs runs each, alternating; times in µs (half round trips)"
printf '%9s %8s %9s %9s %8s %9s\n' bytes iters fi_avg ef_avg avg_x ef_p50
IFS=',' read -r -a size_list <<<"$sizes"
entries=()
for spec in "${size_list[@]}"; do
  size="$(to_bytes "$spec")"
  n="$(iters_for "$size")"
  fi_all="" avg_all="" p50_all=""
  for _ in $(seq "$runs"); do
    fi_us="$(fi_run "$size" "$n")"
    ef="$(efapoll_run "$size" "$n")"
    read -r avg p50 <<<"$ef"
    fi_all+=" $fi_us" avg_all+=" $avg" p50_all+=" $p50"
  done
  fi_avg="$(echo "$fi_all" | median)"
  ef_avg="$(echo "$avg_all" | median)"
  ef_p50="$(echo "$p50_all" | median)"
  awk -v b="$size" -v n="$n" -v f="$fi_avg" -v a="$ef_avg" -v p="$ef_p50" 'BEGIN {
    printf "%9d %8d %9.2f %9.2f %8.2f %9.2f\n", b, n, f, a, f / a, p }'
  entries+=("$(awk -v pr="$provider" -v b="$size" -v f="$fi_avg" -v a="$ef_avg" -v p="$ef_p50" 'BEGIN {
    printf "  \"compare/%s/%dB/libfabric\": {\"latency\": {\"value\": %.1f}},\n", pr, b, f * 1000
    printf "  \"compare/%s/%dB/efapoll\": {\"latency\": {\"value\": %.1f}},\n", pr, b, a * 1000
    printf "  \"compare/%s/%dB/efapoll-p50\": {\"latency\": {\"value\": %.1f}}", pr, b, p * 1000 }')")
done
if [ -n "$bmf" ]; then
  write_bmf "$bmf" "${entries[@]}"
fi
