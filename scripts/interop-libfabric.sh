#!/usr/bin/env bash
# Live interop with libfabric's EFA provider, on softefa (the software EFA
# verbs provider, preloaded): fi_pingpong (Debian's libfabric-bin, 1.17)
# and `efapoll pingpong --peer fi_pingpong -p efa` in every pairing, with
# data verification (-c), RDMA read on and off, then the two side by side
# for speed. Prints a pass/fail table. Where tcpdump can capture on lo (as
# root), the table also shows the message packets each side sent (c>s:
# the client's, s>c: the server's), and a run whose sides did not both
# use the size's protocol fails; a failed run shows its last output and
# the first EFA packet that differs from what libfabric itself sends at
# that point: in type, or else in any field but the run's own
# identifiers (connids, addresses, keys, send/recv ids), decoded with
# `efapoll decode`.
#
# Pairs (server <- client):
#   lf-lf   fi_pingpong <- fi_pingpong (the reference: softefa is EFA)
#   ef-lf   efapoll     <- fi_pingpong
#   lf-ef   fi_pingpong <- efapoll
#   ef-ef   efapoll     <- efapoll (both on fi_pingpong's control link)
# RDMA read: on = softefa's caps have it and FI_EFA_USE_DEVICE_RDMA=1
# (1.17 leaves it off on part 0xefa1); off = SOFTEFA_RDMA_READ=0 and
# FI_EFA_USE_DEVICE_RDMA=0.
# Sizes: one per protocol (1 B eager, 16 KiB medium, 128 KiB long-CTS,
# 1 MiB long-read or long-CTS), each pair and RDMA mode;
# then fi_pingpong's -S all (46 sizes, 0 B to 6 MiB) once each way
# between libfabric and efapoll, RDMA read on.
#
# Usage: scripts/interop-libfabric.sh [-q] [-P]
#   -q  quick: the per-protocol sizes only (no -S all)
#   -P  no performance table
# Exit status: 0 all passed (or skipped: libfabric-bin or rdma-core's
# development files absent, said on stdout), 1 a run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
perf=1
while getopts "qPh" opt; do
  case "$opt" in
    q) quick=1 ;;
    P) perf=0 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done

skip() { echo "interop-libfabric: SKIP: $*"; exit 0; }
command -v fi_pingpong >/dev/null 2>&1 ||
  skip "fi_pingpong not found; install libfabric's tools: apt-get install libfabric-bin"
pkg-config --exists libibverbs 2>/dev/null || [ -e /usr/include/infiniband/efadv.h ] ||
  skip "rdma-core's development files are missing (apt-get install libibverbs-dev): softefa and -p efa need them"

target="${CARGO_TARGET_DIR:-target}"
# One build of both, as CI's and netns-test.sh's: built apart, softefa's
# dependencies unify their features differently, and efapoll is built
# (and linked, whole-program) a second time.
cargo build --release --quiet -p efapoll-apps -p softefa --features efapoll-apps/efa
efapoll="$target/release/efapoll"
softefa="$(realpath "$target/release/libsoftefa.so")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# An address of lo of our own, so that a capture sees our packets only.
addr="127.0.$((RANDOM % 200 + 20)).$((RANDOM % 200 + 20))"
port=$((47600 + RANDOM % 300))

capture=0
if command -v tcpdump >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
  capture=1
fi

export FI_PROVIDER=efa FI_EFA_ENABLE_SHM_TRANSFER=0 SOFTEFA_ADDR="$addr"
export SOFTEFA_SYSFS="$work/sysfs"
LD_PRELOAD="$softefa" timeout 30 fi_info -p efa >/dev/null 2>&1 ||
  skip "fi_info -p efa lists no EFA domain under softefa (is libfabric built with its EFA provider?)"

# server/client command lines of each program; $1 = sizes (-S value).
lf_server() { echo fi_pingpong -p efa -e rdm -c -B "$port" -S "$1" ${2:+-I $2}; }
lf_client() { echo fi_pingpong -p efa -e rdm -c -P "$port" -S "$1" ${2:+-I $2} "$addr"; }
ef_server() { echo "$efapoll" pingpong --peer fi_pingpong -p efa -c --timeout 60 --server -B "$port" -S "$1" ${2:+-I $2}; }
ef_client() { echo "$efapoll" pingpong --peer fi_pingpong -p efa -c --timeout 60 -B "$port" -S "$1" ${2:+-I $2} "$addr"; }

# run NAME PAIR RDMA SIZES [ITERS]: one server and one client (two busy
# pollers at most), captured where possible. Leaves $work/NAME.{srv,cli,pcap}.
run() {
  local name="$1" pair="$2" rdma="$3" sizes="$4" iters="${5:-}"
  local srv cli read_env
  case "$pair" in
    lf-lf) srv="$(lf_server "$sizes" "$iters")"; cli="$(lf_client "$sizes" "$iters")" ;;
    ef-lf) srv="$(ef_server "$sizes" "$iters")"; cli="$(lf_client "$sizes" "$iters")" ;;
    lf-ef) srv="$(lf_server "$sizes" "$iters")"; cli="$(ef_client "$sizes" "$iters")" ;;
    ef-ef) srv="$(ef_server "$sizes" "$iters")"; cli="$(ef_client "$sizes" "$iters")" ;;
  esac
  if [ "$rdma" = on ]; then read_env="SOFTEFA_RDMA_READ=1 FI_EFA_USE_DEVICE_RDMA=1"
  else read_env="SOFTEFA_RDMA_READ=0 FI_EFA_USE_DEVICE_RDMA=0"; fi
  local cap_pid=""
  if [ "$capture" = 1 ]; then
    tcpdump -i lo --immediate-mode -U -s 0 -w "$work/$name.pcap" "udp and host $addr" >/dev/null 2>"$work/$name.cap" &
    cap_pid=$!
    # Capturing once it says so (a busy machine takes its time); in
    # immediate mode, or what is still in the ring when it stops is lost.
    local waited=0
    until grep -q "listening on" "$work/$name.cap" 2>/dev/null || [ "$waited" -ge 100 ]; do
      sleep 0.05
      waited=$((waited + 1))
    done
  fi
  # shellcheck disable=SC2086
  env LD_PRELOAD="$softefa" $read_env timeout 300 $srv >"$work/$name.srv" 2>&1 &
  local srv_pid=$!
  sleep 0.5
  local rc=0
  # shellcheck disable=SC2086
  env LD_PRELOAD="$softefa" $read_env timeout 300 $cli >"$work/$name.cli" 2>&1 || rc=$?
  wait "$srv_pid" || rc=$((rc ? rc : $?))
  if [ -n "$cap_pid" ]; then
    sleep 0.5
    kill -INT "$cap_pid" 2>/dev/null || true
    wait "$cap_pid" 2>/dev/null || true
  fi
  return "$rc"
}

# packets PCAP: "dir name<TAB>decoded" per EFA packet, dir c>s or s>c
# (the client sends the first), each udp-device datagram of type Send
# (the EFA packet after its 40-byte header) once, retransmissions skipped.
packets() {
  tcpdump -r "$1" -nn -xx 2>/dev/null | awk '
    /^[0-9]/ { if (hex != "") print hex; hex = ""; next }
    { for (i = 2; i <= NF; i++) hex = hex $i }
    END { if (hex != "") print hex }' |
  awk '{
    # Ethernet 14 + IPv4 20 + UDP 8 = 42 bytes; the device header 40.
    sport = substr($0, 69, 4); dev_type = substr($0, 87, 2); seq = substr($0, 109, 8)
    if (dev_type != "03") next
    if (seen[sport seq]++) next
    if (client == "") client = sport
    dir = (sport == client) ? "c>s" : "s>c"
    print dir, substr($0, 165)
  }' >"$1.hex"
  # One decoder for every packet (it reads one per line).
  cut -d' ' -f2 "$1.hex" | "$efapoll" decode >"$1.json" 2>/dev/null || true
  paste -d' ' <(cut -d' ' -f1 "$1.hex") "$1.json" |
    sed 's/^\([cs]>[cs]\) \({"name":"\([A-Z_]*\)".*\)$/\1 \3\t\2/'
}

# pkts NAME: the run's packets (see `packets`), made once.
pkts() {
  [ -e "$work/$1.pkts" ] || packets "$work/$1.pcap" >"$work/$1.pkts"
  cat "$work/$1.pkts"
}

# sent NAME DIR: the message packets (…_MSGRTM, …_TAGRTM) one direction
# sent, each type once, joined by '+'.
sent() {
  pkts "$1" | cut -f1 | awk -v dir="$2" '$1 == dir && $2 ~ /_(MSG|TAG)RTM$/ && !seen[$2]++ { print $2 }' |
    paste -sd+ -
}

# fields: a decoded packet without the run's own identifiers, which two
# correct runs need not share.
fields() {
  sed -E 's/"(connid|raw_addr[a-z_]*|addr|key|send_id|recv_id)":("[^"]*"|[0-9]+),?//g'
}

# first_diff FAILED REF: per direction, the first packet whose type is not
# the reference run's at the same place; where every type matches, the
# first whose fields differ (identifiers aside).
first_diff() {
  local failed="$1" ref="$2"
  if [ "$capture" = 0 ] || [ ! -s "$work/$failed.pcap" ] || [ ! -s "$work/$ref.pcap" ]; then
    echo "    (no capture: tcpdump and root are needed for the first differing packet)"
    return
  fi
  local dir found=0
  for dir in "c>s" "s>c"; do
    local line="" what=""
    for what in type fields; do
      local col=1 filter=cat
      [ "$what" = fields ] && col=2 filter=fields
      line="$(paste -d'\n' <(pkts "$failed" | grep "^$dir " | cut -f"$col" | $filter) \
                           <(pkts "$ref" | grep "^$dir " | cut -f"$col" | $filter) |
              awk 'NR % 2 { a = $0; next } a != $0 { print (NR / 2); exit }')"
      [ -n "$line" ] && break
    done
    if [ -n "$line" ]; then
      found=1
      echo "    first packet $dir differing in $what, #$line of that direction:"
      echo "      this run:   $(pkts "$failed" | grep "^$dir " | sed -n "${line}p" | cut -f2 | cut -c1-400)"
      echo "      libfabric:  $(pkts "$ref" | grep "^$dir " | sed -n "${line}p" | cut -f2 | cut -c1-400)"
    fi
  done
  if [ "$found" = 0 ]; then
    echo "    every packet matches libfabric's run (identifiers aside); the last packets of this run:"
    pkts "$failed" | tail -n 4 | cut -f2 | cut -c1-300 | sed 's/^/      /'
  fi
}

failures=0
results=()
# check PAIR RDMA SIZES LABEL [EXPECT [ITERS]]: one run, a row of the
# table; EXPECT, the packet type both sides must send (with a capture).
check() {
  local pair="$1" rdma="$2" sizes="$3" label="$4" expect="${5:-}" iters="${6:-}"
  local name="$pair-$rdma-$sizes" status=pass seen="-"
  run "$name" "$pair" "$rdma" "$sizes" "$iters" || status=FAIL
  if [ "$capture" = 1 ] && [ -s "$work/$name.pcap" ]; then
    local cs sc
    cs="$(sent "$name" "c>s")" sc="$(sent "$name" "s>c")"
    seen="c>s ${cs:--} s>c ${sc:--}"
    if [ -n "$expect" ] && { [[ "+$cs+" != *"+$expect+"* ]] || [[ "+$sc+" != *"+$expect+"* ]]; }; then
      echo "== $name: both sides should have sent $expect; $seen"
      status=FAIL
    fi
  fi
  local rows
  rows="$(grep -cE '^[0-9.]+[kmg]? +[0-9]+[kmb]? +=' "$work/$name.cli" || true)"
  results+=("$(printf '%-6s %-4s %-10s %-24s %-5s %-9s %s' "$pair" "$rdma" "$sizes" "$label" "$status" "$rows sizes" "$seen")")
  if [ "$status" = FAIL ]; then
    failures=$((failures + 1))
    echo "== $name failed; server:"; tail -n 5 "$work/$name.srv" | sed 's/^/    /'
    echo "   client:"; tail -n 5 "$work/$name.cli" | sed 's/^/    /'
    if [ "$pair" != lf-lf ]; then
      [ -e "$work/lf-lf-$rdma-$sizes.srv" ] || run "lf-lf-$rdma-$sizes" lf-lf "$rdma" "$sizes" "$iters" || true
      first_diff "$name" "lf-lf-$rdma-$sizes"
    fi
  fi
}

# Both implementations send system memory LONGREAD from 1 MiB when both
# can read (neither runts it: efapoll's default runt_size is the
# provider's, 0).
declare -A proto_of=([1]="eager" [16384]="medium" [131072]="long-CTS")
declare -A type_of=([1]="EAGER_MSGRTM" [16384]="MEDIUM_MSGRTM" [131072]="LONGCTS_MSGRTM")
for rdma in on off; do
  for size in 1 16384 131072 1048576; do
    label="${proto_of[$size]:-}" expect="${type_of[$size]:-}"
    if [ "$size" = 1048576 ]; then
      label=$([ "$rdma" = on ] && echo "long-read" || echo "long-CTS")
      expect=$([ "$rdma" = on ] && echo "LONGREAD_MSGRTM" || echo "LONGCTS_MSGRTM")
    fi
    for pair in lf-lf ef-lf lf-ef; do
      check "$pair" "$rdma" "$size" "$label" "$expect"
    done
  done
done
if [ "$quick" = 0 ]; then
  for pair in ef-lf lf-ef; do
    check "$pair" on all "every protocol" LONGREAD_MSGRTM
  done
fi

echo
echo "interop with libfabric $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: //p') (EFA provider) under softefa, -c:"
printf '%-6s %-4s %-10s %-24s %-5s %-9s %s\n' pair read size protocol result "" "message packets sent"
printf '%s\n' "${results[@]}"

if [ "$perf" = 1 ]; then
  echo
  echo "speed over softefa, fi_pingpong's measure (usec/xfer: the average half round trip), RDMA read on:"
  printf '%-9s %10s %14s %14s\n' bytes iterations fi_pingpong efapoll
  for spec in 64:2000 4096:2000 65536:500 1048576:50; do
    size="${spec%%:*}" iters="${spec##*:}"
    lf="-" ef="-"
    if run "perf-lf-$size" lf-lf on "$size" "$iters"; then
      lf="$(awk '$1 ~ /^[0-9.]+[kmg]?$/ && $3 ~ /^=/ { print $7 }' "$work/perf-lf-$size.cli")"
    fi
    if run "perf-ef-$size" ef-ef on "$size" "$iters"; then
      ef="$(awk '$1 ~ /^[0-9.]+[kmg]?$/ && $3 ~ /^=/ { print $7 }' "$work/perf-ef-$size.cli")"
    fi
    printf '%-9s %10s %14s %14s\n' "$size" "$iters" "$lf" "$ef"
  done
fi

if [ "$failures" -gt 0 ]; then
  echo "interop-libfabric: $failures run(s) failed"
  exit 1
fi
echo "interop-libfabric: all passed"
