//! One-sided operations on the sim device in one thread: each emulated and direct
//! write and read protocol, and the atomics.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn rma(c: &mut criterion::Criterion) {
    common::bench_area(c, "rma");
}

criterion::criterion_group!(benches, rma);
criterion::criterion_main!(benches);
