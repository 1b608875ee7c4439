//! The udp device in one thread, over loopback sockets: the engine's
//! pingpong and streams, and bursts of the device on its own.
//! The workloads are `efapoll_perf::workloads`, which the gate measures too.

mod common;

fn udp(c: &mut criterion::Criterion) {
    common::bench_area(c, "udp");
}

criterion::criterion_group!(benches, udp);
criterion::criterion_main!(benches);
