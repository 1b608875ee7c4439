#!/usr/bin/env bash
# The whole test suite: every crate's unit, integration and doc tests.
# Run from anywhere; extra arguments go to cargo (e.g. -p efapoll).
# Where pkg-config finds rdma-core's libibverbs, the efa device (feature
# efa) and softefa are built and tested too; elsewhere they are left out,
# so the suite needs no rdma-core. The efa tests of the engine and the apps
# run under softefa's library, which the workspace's test build makes
# (target/<profile>/deps); with `-p efapoll` alone, build `-p softefa`
# too, or those tests fail saying so. The engine's tests run twice: as
# built, then with every fast path off (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
if pkg-config --exists libibverbs 2>/dev/null; then
  scope=(--workspace --features efapoll/efa,efapoll-apps/efa)
else
  echo "test.sh: no libibverbs (pkg-config): the efa device and softefa are not tested" >&2
  scope=(--workspace --exclude softefa)
fi
if [ "$#" -gt 0 ] && [[ " $* " == *" -p "* ]]; then
  scope=()
fi
# Then the engine's suites again with every fast path off (feature
# general-paths: header prediction, eager without an entry, the inline
# head, the sim's land_now, shm's one-lane receive, udp's lone datagram...;
# the list is at FAST_PATHS in engine/src/lib.rs), so that a fast path that
# no longer does what its general path does fails a test. Not with `-p`,
# which picks its own scope.
general=(-p efapoll --features efapoll/general-paths)
if [ "${#scope[@]}" -gt 0 ] && [[ " ${scope[*]} " == *" efapoll/efa"* ]]; then
  general+=(--features efapoll/efa)
fi
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run "${scope[@]}" --no-fail-fast "$@" || status=$?
  cargo test "${scope[@]}" --doc "$@" || status=$?
  if [ "${#scope[@]}" -gt 0 ]; then
    echo "test.sh: the engine again, fast paths off (general-paths)" >&2
    cargo nextest run "${general[@]}" --no-fail-fast "$@" || status=$?
  fi
else
  cargo test "${scope[@]}" --no-fail-fast "$@" || status=$?
  if [ "${#scope[@]}" -gt 0 ]; then
    echo "test.sh: the engine again, fast paths off (general-paths)" >&2
    cargo test "${general[@]}" --no-fail-fast "$@" || status=$?
  fi
fi
exit "$status"
