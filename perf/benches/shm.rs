//! The shm device in one thread: ring bursts and a one-sided copy.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn shm(c: &mut criterion::Criterion) {
    common::bench_area(c, "shm");
}

criterion::criterion_group!(benches, shm);
criterion::criterion_main!(benches);
