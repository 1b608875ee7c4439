//! The Relink codec: parse and emit of a message and a sequence acknowledgement.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn relink(c: &mut criterion::Criterion) {
    common::bench_area(c, "relink");
}

criterion::criterion_group!(benches, relink);
criterion::criterion_main!(benches);
