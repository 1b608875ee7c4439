//! The engine's own cost: endpoints on the sim device in one thread.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::{Access, Mr};
use efapoll::endpoint::{Config, Endpoint, PeerId, Span, TagMatch};

type Ep = Endpoint<SimDevice>;

fn pair(sim: SimConfig) -> (SimFabric, Ep, Ep, PeerId, PeerId) {
    let fabric = SimFabric::new(sim);
    let mut a = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let mut b = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let to_b = a.insert_peer(&b.addr()).unwrap();
    let to_a = b.insert_peer(&a.addr()).unwrap();
    (fabric, a, b, to_b, to_a)
}

fn mr(ep: &mut Ep, len: u64) -> Mr {
    ep.register(len, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap()
}

/// A sender, a receiver and their buffers.
struct Flow {
    a: Ep,
    b: Ep,
    to_b: PeerId,
    src: Mr,
    dst: Mr,
}

impl Flow {
    fn new(len: u64) -> (SimFabric, Flow) {
        let (f, mut a, mut b, to_b, _) = pair(SimConfig::default());
        let src = mr(&mut a, len);
        let dst = mr(&mut b, len);
        (f, Flow { a, b, to_b, src, dst })
    }

    /// Streams `n` messages of `len` bytes from a to b, `window` in flight.
    fn stream(&mut self, len: u64, n: u64, window: u64) {
        let Flow { a, b, to_b, src, dst } = self;
        let (mut posted, mut sent, mut recvd, mut sdone) = (0u64, 0u64, 0u64, 0u64);
        while recvd < n || sdone < n {
            while posted < n && posted - recvd < window {
                b.recv(Span::new(dst, 0, len), None, posted).unwrap();
                posted += 1;
            }
            while sent < n
                && sent - sdone < window
                && a.send(*to_b, Span::new(src, 0, len), sent).is_ok()
            {
                sent += 1;
            }
            a.progress();
            b.progress();
            while a.poll_cq().is_some() {
                sdone += 1;
            }
            while let Some(c) = b.poll_cq() {
                black_box(c);
                recvd += 1;
            }
        }
    }
}

fn eager_stream(c: &mut Criterion) {
    let (_f, mut flow) = Flow::new(64);
    flow.stream(64, 1000, 64);
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(1));
    g.bench_function("eager_64B_stream", |bench| {
        bench.iter_custom(|iters| {
            let t = Instant::now();
            flow.stream(64, iters, 64);
            t.elapsed()
        })
    });
    g.finish();
}

fn pingpong(c: &mut Criterion) {
    let (_f, mut a, mut b, to_b, to_a) = pair(SimConfig::default());
    let (sa, sb) = (mr(&mut a, 64), mr(&mut b, 64));
    let round_trip = |a: &mut Ep, b: &mut Ep| {
        b.recv(Span::new(&sb, 0, 64), None, 0).unwrap();
        a.recv(Span::new(&sa, 0, 64), None, 0).unwrap();
        a.send(to_b, Span::new(&sa, 0, 64), 1).unwrap();
        let mut got_b = false;
        while !got_b {
            a.progress();
            b.progress();
            while let Some(c) = b.poll_cq() {
                got_b |= c.op == efapoll::endpoint::Op::Recv;
            }
        }
        b.send(to_a, Span::new(&sb, 0, 64), 2).unwrap();
        let mut got_a = false;
        while !got_a {
            b.progress();
            a.progress();
            while let Some(c) = a.poll_cq() {
                got_a |= c.op == efapoll::endpoint::Op::Recv;
            }
        }
        while b.poll_cq().is_some() {}
    };
    for _ in 0..100 {
        round_trip(&mut a, &mut b);
    }
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(1));
    g.bench_function("pingpong_64B_round_trip", |bench| bench.iter(|| round_trip(&mut a, &mut b)));
    g.finish();
}

fn long_cts(c: &mut Criterion) {
    const LEN: u64 = 8 << 20;
    let (_f, mut flow) = Flow::new(LEN);
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Bytes(LEN));
    g.sample_size(20);
    g.bench_function("longcts_8MiB", |bench| bench.iter(|| flow.stream(LEN, 1, 1)));
    g.finish();
}

/// One receiver, `n` senders taking turns: the receiver's cost per message
/// should not grow with its address vector.
fn many_peers(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim_peers");
    g.throughput(Throughput::Elements(1));
    for &n in &[1usize, 32, 1024] {
        let small =
            SimConfig { bufs: 32, mtu: 1024, tx_depth: 8, rx_depth: 8, ..SimConfig::default() };
        let fabric = SimFabric::new(SimConfig { rx_depth: 512, ..small });
        let cfg = Config { tx_ops: 16, rx_ops: 16, ..Config::default() };
        let mut rx = Endpoint::new(fabric.device(), Config::default()).unwrap();
        let mut senders: Vec<(Ep, PeerId, Mr)> = (0..n)
            .map(|_| {
                let mut s = Endpoint::new(fabric.device(), cfg).unwrap();
                let p = s.insert_peer(&rx.addr()).unwrap();
                let m = s.register(64, Access::empty()).unwrap();
                (s, p, m)
            })
            .collect();
        let dst = rx.register(64, Access::empty()).unwrap();
        let mut turn = 0usize;
        let mut run = |iters: u64, rx: &mut Ep| -> Duration {
            let t = Instant::now();
            for i in 0..iters {
                let (s, p, m) = &mut senders[turn];
                turn = (turn + 1) % n;
                rx.recv(Span::new(&dst, 0, 64), None, i).unwrap();
                s.send(*p, Span::new(m, 0, 64), i).unwrap();
                s.progress();
                let mut got = false;
                while !got {
                    rx.progress();
                    got = rx.poll_cq().is_some();
                }
                s.progress();
                while s.poll_cq().is_some() {}
            }
            t.elapsed()
        };
        // Warm-up: every sender's handshake done.
        run(4 * n as u64, &mut rx);
        g.bench_function(BenchmarkId::from_parameter(n), |bench| {
            bench.iter_custom(|iters| run(iters, &mut rx))
        });
    }
    g.finish();
}

/// Matching cost with 1 to 10,000 distinct tags posted.
fn posted_tags(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim_posted_tags");
    g.throughput(Throughput::Elements(1));
    for &n in &[1u64, 1000, 10_000] {
        let (_f, mut a, mut b, to_b, _) = pair(SimConfig::default());
        let src = mr(&mut a, 64);
        let dst = mr(&mut b, 64);
        for t in 0..n {
            b.trecv(Span::new(&dst, 0, 64), TagMatch { tag: t, ignore: 0 }, None, t).unwrap();
        }
        let mut x = 0x9e37_79b9u64;
        let mut run = |iters: u64, a: &mut Ep, b: &mut Ep| -> Duration {
            let t0 = Instant::now();
            for _ in 0..iters {
                // A pseudo-random tag among those posted; its receive is
                // posted again so that n stay posted.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let tag = x % n;
                a.tsend(to_b, Span::new(&src, 0, 64), tag, 0).unwrap();
                let mut got = None;
                while got.is_none() {
                    a.progress();
                    b.progress();
                    got = b.poll_cq();
                }
                b.trecv(Span::new(&dst, 0, 64), TagMatch { tag, ignore: 0 }, None, tag).unwrap();
                while a.poll_cq().is_some() {}
            }
            t0.elapsed()
        };
        run(1000, &mut a, &mut b);
        g.bench_function(BenchmarkId::from_parameter(n), |bench| {
            bench.iter_custom(|iters| run(iters, &mut a, &mut b))
        });
    }
    g.finish();
}

criterion_group!(benches, eager_stream, pingpong, long_cts, many_peers, posted_tags);
criterion_main!(benches);
