//! One-sided operations on the sim device, both endpoints in one thread:
//! direct RDMA write and read, the emulated long-CTS write, and the round
//! trip of a fetch atomic.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::{Access, Mr};
use efapoll::endpoint::{AtomicOp, Config, Datatype, Endpoint, PeerId, Span};
use efapoll::wire::RmaIov;

type Ep = Endpoint<SimDevice>;

const MIB: u64 = 1 << 20;

struct Pair {
    a: Ep,
    b: Ep,
    to_b: PeerId,
    local: Mr,
    remote: Mr,
}

impl Pair {
    fn new(sim: SimConfig, len: u64) -> (SimFabric, Pair) {
        let fabric = SimFabric::new(sim);
        let cfg = Config { handshake_on_insert: true, ..Config::default() };
        let mut a = Endpoint::new(fabric.device(), cfg).unwrap();
        let mut b = Endpoint::new(fabric.device(), cfg).unwrap();
        let to_b = a.insert_peer(&b.addr()).unwrap();
        b.insert_peer(&a.addr()).unwrap();
        let all = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let local = a.register(len, all).unwrap();
        let remote = b.register(len, all).unwrap();
        while !a.peer_handshake_received(to_b) {
            a.progress();
            b.progress();
        }
        (fabric, Pair { a, b, to_b, local, remote })
    }

    fn remote_iov(&self, len: u64) -> RmaIov {
        RmaIov { addr: self.remote.addr, len, key: self.remote.key }
    }

    /// Runs until `a` has a completion; returns it.
    fn wait(&mut self) -> efapoll::endpoint::Completion {
        loop {
            self.a.progress();
            self.b.progress();
            if let Some(c) = self.a.poll_cq() {
                assert!(c.status.is_ok(), "{c:?}");
                return c;
            }
        }
    }
}

fn direct(c: &mut Criterion) {
    let (_f, mut p) = Pair::new(SimConfig::default(), MIB);
    let mut g = c.benchmark_group("sim_rma");
    g.throughput(Throughput::Bytes(MIB));
    g.bench_function("direct_write_1MiB", |bench| {
        bench.iter(|| {
            p.a.write(p.to_b, Span::whole(&p.local), p.remote_iov(MIB), 1).unwrap();
            black_box(p.wait())
        })
    });
    g.bench_function("direct_read_1MiB", |bench| {
        bench.iter(|| {
            p.a.read(p.to_b, Span::whole(&p.local), p.remote_iov(MIB), 1).unwrap();
            black_box(p.wait())
        })
    });
    g.finish();
}

fn emulated(c: &mut Criterion) {
    // No device RDMA: the write goes as LONGCTS_RTW with CTS flow control.
    let sim = SimConfig { rdma_read: false, rdma_write: false, ..SimConfig::default() };
    let (_f, mut p) = Pair::new(sim, MIB);
    let mut g = c.benchmark_group("sim_rma");
    g.throughput(Throughput::Bytes(MIB));
    g.bench_function("emulated_longcts_write_1MiB", |bench| {
        bench.iter(|| {
            p.a.write(p.to_b, Span::whole(&p.local), p.remote_iov(MIB), 1).unwrap();
            black_box(p.wait())
        })
    });
    g.finish();
}

fn fetch_atomic(c: &mut Criterion) {
    let (_f, mut p) = Pair::new(SimConfig::default(), 64);
    let mut g = c.benchmark_group("sim_rma");
    g.throughput(Throughput::Elements(1));
    g.bench_function("fetch_add_u64_round_trip", |bench| {
        bench.iter(|| {
            let operand = Span::new(&p.local, 0, 8);
            let result = Span::new(&p.local, 8, 8);
            p.a.fetch_atomic(
                p.to_b,
                AtomicOp::Sum,
                Datatype::Uint64,
                operand,
                result,
                p.remote_iov(8),
                1,
            )
            .unwrap();
            black_box(p.wait())
        })
    });
    g.finish();
}

criterion_group!(benches, direct, emulated, fetch_atomic);
criterion_main!(benches);
