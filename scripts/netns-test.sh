#!/usr/bin/env bash
# Two hosts on one machine: `efapoll pingpong|streaming -p udp` between
# two network namespaces joined by a veth pair (192.0.2.1 and .2,
# fd00:e:fa::1 and ::2), as the app runs across hosts:
#   - at MTU 1500 (the udp device's 8 KiB datagrams are IP-fragmented)
#     and 9000, pingpong and streaming -c from 1 B to 1 MiB; one run over
#     IPv6; each side must exit 0 and its --json name the sizes run;
#     pingpong and streaming -o smbd -c (SMB Direct) at MTU 1500;
#   - `-p efa` under softefa (LD_PRELOAD, SOFTEFA_ADDR the namespace's
#     address), pingpong and streaming -c, efa<->efa and efa<->udp, and
#     streaming -o smbd -c from efa to udp;
#   - a side killed (-9) mid-run: the other exits 1 within --timeout
#     plus a margin, both ways; then the link cut mid-run (no FIN, no
#     RST: the timeout path): both exit 1 alike.
# One run at a time: never more than two busy-polling processes.
#
# Usage: scripts/netns-test.sh    (as root; EFAPOLL=path skips the build)
# The efa steps need an efapoll built with `--features efa` and softefa's
# library: SOFTEFA_LIB=path, or libsoftefa.so beside efapoll. Where
# pkg-config finds libibverbs, a missing one fails the script; elsewhere
# the efa steps are skipped, saying so.
# Exit status: 0 passed, or skipped where the test cannot run (not root,
# no `ip`, namespaces not permitted, one core; one line says why); 1 a
# step failed (both sides' output is shown).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "netns-test: $*"; }
skip() {
  say "skipped: $*"
  exit 0
}
fail() {
  say "$*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need it)"
command -v ip >/dev/null 2>&1 || skip "no \`ip\` command (iproute2)"
# Each side busy-polls a core of its own, cores 0 and 1.
[ "$(nproc)" -ge 2 ] || skip "one core; the two sides busy-poll two"

if [ -n "${EFAPOLL:-}" ]; then
  efapoll="$(realpath -- "$EFAPOLL")"
  [ -x "$efapoll" ] || fail "EFAPOLL=$EFAPOLL is not an executable"
else
  if pkg-config --exists libibverbs 2>/dev/null; then
    cargo build --release --quiet -p efapoll-apps -p softefa --features efapoll-apps/efa
  else
    cargo build --release --quiet -p efapoll-apps
  fi
  efapoll="$(realpath -- "${CARGO_TARGET_DIR:-target}/release/efapoll")"
fi
softefa="${SOFTEFA_LIB:-$(dirname -- "$efapoll")/libsoftefa.so}"
info="$("$efapoll" info 2>&1 || true)"
if [ -f "$softefa" ] && [[ "$info" != *"no efa feature"* ]]; then
  softefa="$(realpath -- "$softefa")"
elif pkg-config --exists libibverbs 2>/dev/null; then
  fail "rdma-core is here, but no efa run is possible: $softefa missing or $efapoll built without --features efa"
else
  softefa=""
fi

ns_a="efapoll-a-$$"
ns_b="efapoll-b-$$"
ip_a=192.0.2.1
ip_b=192.0.2.2
ip6_b=fd00:e:fa::2
sizes=1,64,4096,65536,1m
sizes_bytes="1 64 4096 65536 1048576"
# A run that passes takes seconds; past this it is hung.
run_limit_s=60
# The kill tests' --timeout, and how much longer a survivor may take.
kill_timeout_s=5
kill_margin_s=5

tmp=""
made_ns=""
server_pid=""
client_pid=""
declare -A old_sysctl=()

cleanup() {
  local rc=$?
  set +e
  # A namespace lives on while a process is in it: end ours first.
  for pid in $server_pid $client_pid; do
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [ -n "$made_ns" ]; then
    # Deleting a namespace deletes its end of the veth pair, and with it
    # the other end.
    ip netns del "$ns_a" 2>/dev/null
    ip netns del "$ns_b" 2>/dev/null
  fi
  for key in "${!old_sysctl[@]}"; do
    echo "${old_sysctl[$key]}" >"/proc/sys/net/core/$key"
  done
  [ -z "$tmp" ] || rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
# A signal ends the script through the EXIT trap, so cleanup still runs.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

tmp="$(mktemp -d)"

# The udp device asks for 4 MiB socket buffers each way; without
# CAP_NET_ADMIN the kernel grants at most these limits. They are global
# and read-only inside a namespace: raise them here, first.
min_buffer=$((8 << 20))
for key in rmem_max wmem_max; do
  file="/proc/sys/net/core/$key"
  old="$(cat "$file")"
  if [ "$old" -lt "$min_buffer" ]; then
    if echo "$min_buffer" 2>/dev/null >"$file"; then
      old_sysctl[$key]="$old"
    else
      say "note: net.core.$key stays $old (read-only here); root's devices force their buffers past it"
    fi
  fi
done

# Each veth end is made inside its namespace, so an interrupted set-up
# leaves nothing in this one.
if ! err="$(ip netns add "$ns_a" 2>&1)"; then
  skip "cannot create a network namespace: ${err%%$'\n'*}"
fi
made_ns=1
ip netns add "$ns_b"
if ! err="$(ip -n "$ns_a" link add va type veth peer name vb netns "$ns_b" 2>&1)"; then
  skip "cannot create a veth pair: ${err%%$'\n'*}"
fi
ip -n "$ns_a" addr add "$ip_a/24" dev va
ip -n "$ns_b" addr add "$ip_b/24" dev vb
# nodad: an address under duplicate detection cannot be bound for a second or two.
ip -n "$ns_a" addr add fd00:e:fa::1/64 dev va nodad
ip -n "$ns_b" addr add "$ip6_b/64" dev vb nodad
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set va up
ip -n "$ns_b" link set vb up
say "namespaces $ns_a ($ip_a) and $ns_b ($ip_b), veth pair: ok"

now_us() { echo "${EPOCHREALTIME/./}"; }

# Waits for process $1 up to $2 seconds; sets `status` to its exit
# status, or to "hung" after killing it.
await() {
  local pid=$1 limit_us=$(($2 * 1000000)) start
  start="$(now_us)"
  while kill -0 "$pid" 2>/dev/null; do
    if (($(now_us) - start > limit_us)); then
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      status=hung
      return
    fi
    sleep 0.05
  done
  status=0
  wait "$pid" || status=$?
}

# How a side ended, from await's `status`.
outcome() {
  if [ "$1" = hung ]; then echo "hung (killed after $run_limit_s s)"; else echo "exit $1"; fi
}

# The command lines of the last run's sides, for show_outputs.
server_cmd=""
client_cmd=""

show_outputs() {
  {
    echo "--- server: $server_cmd"
    cat "$tmp/server.out"
    echo "--- client: $client_cmd"
    cat "$tmp/client.out"
  } >&2
}

# The sizes a --json report names, in order.
json_sizes() {
  grep -o '"bytes": *[0-9]*' "$1" | grep -o '[0-9]*$' | tr '\n' ' ' | sed 's/ $//'
}

# IPv$2 datagrams reassembled from fragments so far in namespace $1.
reassembled() {
  ip netns exec "$1" cat /proc/net/snmp /proc/net/snmp6 | awk -v family="$2" '
    family == 4 && $1 == "Ip:" && !seen { for (i = 2; i <= NF; i++) col[$i] = i; seen = 1; next }
    family == 4 && $1 == "Ip:" { n = $col["ReasmOKs"] }
    family == 6 && $1 == "Ip6ReasmOKs" { n = $2 }
    END { print n + 0 }'
}

# Starts the server in namespace B with the caller's `server_args`, and
# the client in A with its `client_args`; the client retries a refused
# connection, so it need not wait for the server to listen.
# Each side's environment: `server_env` and `client_env` (softefa's).
server_env=()
client_env=()
start_sides() {
  server_cmd="${server_env[*]} efapoll ${server_args[*]}"
  client_cmd="${client_env[*]} efapoll ${client_args[*]}"
  ip netns exec "$ns_b" env "${server_env[@]}" "$efapoll" "${server_args[@]}" >"$tmp/server.out" 2>&1 &
  server_pid=$!
  ip netns exec "$ns_a" env "${client_env[@]}" "$efapoll" "${client_args[@]}" >"$tmp/client.out" 2>&1 &
  client_pid=$!
}

port=9228
# The devices of the server and of the client (pair's -p).
server_dev=udp
client_dev=udp
# Runs app $2 between the namespaces, the client to address $3 and the
# server bound to $4, with the remaining arguments on both sides; both
# must exit 0 and report the sizes run. $1 names the step.
pair() {
  local name=$1 app=$2 to=$3 bind=$4
  shift 4
  port=$((port + 1))
  local common=(-B "$port" -c -S "$sizes" "$@")
  rm -f "$tmp/server.json" "$tmp/client.json"
  local server_args=("$app" -p "$server_dev" "${common[@]}" --server --bind "$bind" --json "$tmp/server.json")
  local client_args=("$app" -p "$client_dev" "${common[@]}" "$to" --json "$tmp/client.json")
  start_sides
  local client server
  await "$client_pid" "$run_limit_s"
  client=$status
  client_pid=""
  await "$server_pid" "$run_limit_s"
  server=$status
  server_pid=""
  if [ "$client" != 0 ] || [ "$server" != 0 ]; then
    show_outputs
    fail "$name: FAILED (client $(outcome "$client"), server $(outcome "$server"))"
  fi
  local side got
  for side in server client; do
    got="$(json_sizes "$tmp/$side.json")"
    if [ "$got" != "$sizes_bytes" ]; then
      show_outputs
      fail "$name: FAILED: the $side's --json names sizes [$got], not [$sizes_bytes]"
    fi
    local dev=$server_dev
    [ "$side" = server ] || dev=$client_dev
    if ! grep -q "\"device\": *\"$dev\"" "$tmp/$side.json"; then
      show_outputs
      fail "$name: FAILED: the $side's --json does not say it ran on $dev"
    fi
  done
}

set_mtu() {
  ip -n "$ns_a" link set va mtu "$1"
  ip -n "$ns_b" link set vb mtu "$1"
}

# Runs step $1 (the rest: pair's arguments) and says how many IPv$2
# datagrams namespace B reassembled; at MTU 1500 there must be some: the
# udp device's datagrams hold 8 KiB and its headers, so the larger sizes
# cross the link as IP fragments.
pair_counting() {
  local name=$1 family=$2 mtu=$3 before frags
  shift 3
  before="$(reassembled "$ns_b" "$family")"
  pair "$name" "$@"
  frags=$(($(reassembled "$ns_b" "$family") - before))
  if [ "$mtu" = 1500 ] && [ "$frags" -eq 0 ]; then
    show_outputs
    fail "$name: FAILED: no IPv$family datagram came in fragments; the step is meant to fragment"
  fi
  say "$name: ok ($frags IPv$family datagrams reassembled from fragments)"
}

for mtu in 1500 9000; do
  set_mtu "$mtu"
  for app in pingpong streaming; do
    pair_counting "mtu $mtu $app -c" 4 "$mtu" "$app" "$ip_b" 0.0.0.0 -I 100
  done
done

set_mtu 1500
pair_counting "ipv6 mtu 1500 pingpong -c" 6 1500 pingpong "$ip6_b" :: -I 100
# Messages framed as SMB Direct, reassembled and checked across the link.
for app in pingpong streaming; do
  pair_counting "mtu 1500 $app -o smbd -c" 4 1500 "$app" "$ip_b" 0.0.0.0 -I 100 -o smbd
done

# softefa's environment for a side on device $1 in the namespace of
# address $2: preloaded, its QPs bound to that address.
efa_env() {
  if [ "$1" = efa ]; then echo "LD_PRELOAD=$softefa SOFTEFA_ADDR=$2"; fi
}

if [ -n "$softefa" ]; then
  for devs in efa:efa efa:udp udp:efa; do
    server_dev=${devs%:*}
    client_dev=${devs#*:}
    read -ra server_env <<<"$(efa_env "$server_dev" "$ip_b")"
    read -ra client_env <<<"$(efa_env "$client_dev" "$ip_a")"
    for app in pingpong streaming; do
      pair "$server_dev server, $client_dev client: $app -c" "$app" "$ip_b" 0.0.0.0 -I 100
      say "$server_dev server, $client_dev client: $app -c: ok"
    done
  done
  # SMB Direct between the efa device and the udp one.
  server_env=()
  read -ra client_env <<<"$(efa_env efa "$ip_a")"
  server_dev=udp
  client_dev=efa
  pair "udp server, efa client: streaming -o smbd -c" streaming "$ip_b" 0.0.0.0 -I 100 -o smbd
  say "udp server, efa client: streaming -o smbd -c: ok"
  server_dev=udp
  client_dev=udp
  server_env=()
  client_env=()
else
  say "efa steps skipped: no rdma-core here (pkg-config libibverbs), so no softefa"
fi

# The side a cut kills, if any.
victim=""

pid_of() { [ "$1" = server ] && echo "$server_pid" || echo "$client_pid"; }

# Side $1 was reaped: nothing for the cleanup to kill.
forget() { [ "$1" = server ] && server_pid="" || client_pid=""; }

# Kills side $1 and reaps it at once, before bash reports its death.
kill_side() {
  victim=$1
  kill -9 "$(pid_of "$1")"
  { wait "$(pid_of "$1")"; } 2>/dev/null || true
  forget "$1"
}

ms_as_s() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

# A long streaming run, cut after a second by function $1; every side it
# leaves running must then exit 1 within the timeout plus the margin. $2
# names the step.
cut() {
  local how=$1 name=$2
  port=$((port + 1))
  local common=(streaming -p udp -B "$port" -S 1m -I 1000000 --timeout "$kill_timeout_s")
  local server_args=("${common[@]}" --server) client_args=("${common[@]}" "$ip_b")
  start_sides
  sleep 1
  local side
  for side in server client; do
    if ! kill -0 "$(pid_of "$side")" 2>/dev/null; then
      show_outputs
      fail "$name: FAILED: the $side ended before the cut"
    fi
  done
  local start limit_ms=$(((kill_timeout_s + kill_margin_s) * 1000)) result="" took_ms
  start="$(now_us)"
  "$how"
  for side in server client; do
    [ "$side" != "$victim" ] || continue
    await "$(pid_of "$side")" "$run_limit_s"
    took_ms=$((($(now_us) - start) / 1000))
    forget "$side"
    if [ "$status" != 1 ] || [ "$took_ms" -ge "$limit_ms" ]; then
      show_outputs
      fail "$name: FAILED: the $side: $(outcome "$status") after $(ms_as_s "$took_ms") s" \
        "(want 1 within $(ms_as_s "$limit_ms") s)"
    fi
    result+="${result:+, }$side exit 1 after $(ms_as_s "$took_ms") s"
  done
  say "$name: ok ($result)"
}

kill_server() { kill_side server; }
kill_client() { kill_side client; }
# No FIN, no RST: each side learns of it by its timeout alone.
link_down() {
  victim=""
  ip -n "$ns_a" link set va down
}

cut kill_server "kill -9 the server mid-run"
cut kill_client "kill -9 the client mid-run"
# Last: a link set down loses its IPv6 addresses.
cut link_down "link down mid-run"

say "all passed"
