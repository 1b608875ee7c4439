//! efapoll's benchmark suite and its regression gate.
//!
//! [`workloads`] names every benchmark once; the criterion benches under
//! `benches/` and the [`gate`] (the `efapoll-perf` binary, run by
//! scripts/perf-gate.sh) both measure that list. See perf/README.md.
#![deny(unsafe_code)]

pub mod gate;
pub mod workloads;
