//! Two-sided messaging on the sim device in one thread: every message protocol,
//! reordering, tag matching with many receives posted, many peers.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn sim(c: &mut criterion::Criterion) {
    common::bench_area(c, "sim");
}

criterion::criterion_group!(benches, sim);
criterion::criterion_main!(benches);
