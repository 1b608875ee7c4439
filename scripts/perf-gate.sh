#!/usr/bin/env bash
# The performance regression gate (perf/README.md): builds the release
# binaries, then runs `efapoll-perf gate` with this script's arguments.
#
#   scripts/perf-gate.sh                          instruction counts of the small suite
#                                                 against perf/baselines/instructions.json
#   scripts/perf-gate.sh --mode instructions --update-baseline
#                                                 write that baseline (after a deliberate change)
#                                                 and its table in perf/README.md
#   scripts/perf-gate.sh --mode wall --machine c7gn.metal
#   scripts/perf-gate.sh --mode app --machine c7gn.metal
#                                                 efapoll pingpong/streaming --json
#   scripts/perf-gate.sh --help                   every option
#
# Exit status: 0 pass, 1 error (missing valgrind, no baseline, a failed
# run), 2 bad arguments, 3 a metric regressed or a baseline metric is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# App mode runs the efapoll binary: build it too.
packages=(-p efapoll-perf)
prev=""
for arg in "$@"; do
  if [ "$arg" = "--mode=app" ] || { [ "$prev" = "--mode" ] && [ "$arg" = "app" ]; }; then
    packages+=(-p efapoll-apps)
  fi
  prev="$arg"
done

cargo build --release --quiet "${packages[@]}"
exec "${CARGO_TARGET_DIR:-target}/release/efapoll-perf" gate "$@"
