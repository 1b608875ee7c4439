//! The wire codec: parse and emit per packet type, on the unit tests' golden packets.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn codec(c: &mut criterion::Criterion) {
    common::bench_area(c, "codec");
}

criterion::criterion_group!(benches, codec);
criterion::criterion_main!(benches);
