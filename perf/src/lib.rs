//! efapoll's benchmarks: criterion benches under `benches/`, run with
//! `cargo bench -p efapoll-perf`. Each reports a per-operation cost and
//! feeds the same golden inputs as the unit tests.
#![deny(unsafe_code)]
