#!/usr/bin/env bash
# The whole test suite: every crate's unit, integration and doc tests.
# Run from anywhere; extra arguments go to cargo (e.g. -p efapoll).
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
  cargo test --workspace --doc "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
