//! Two-sided messaging between endpoints on the sim device, in one thread:
//! the engine's own cost, with a device that costs almost nothing.

use std::hint::black_box;
use std::time::{Duration, Instant};

use efapoll::device::fault::Faults;
use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{Config, Endpoint, Op, PeerId, Span, TagMatch};

use super::{Kind, Runner, Unit, Workload};

pub(super) type Ep = Endpoint<SimDevice>;

pub(super) const KIB: u64 = 1 << 10;
pub(super) const MIB: u64 = 1 << 20;

/// Two endpoints that know each other, on any device whose endpoints can
/// share a thread.
pub(super) struct Pair<D: Device = SimDevice> {
    /// What must outlive the endpoints (the sim fabric).
    _keep: Option<SimFabric>,
    pub a: Endpoint<D>,
    pub b: Endpoint<D>,
    pub to_b: PeerId,
    pub to_a: PeerId,
}

impl Pair {
    /// Two endpoints on a sim fabric of their own.
    pub fn new(sim: SimConfig, cfg: Config) -> Pair {
        let fabric = SimFabric::new(sim);
        let a = Endpoint::new(fabric.device(), cfg).unwrap();
        let b = Endpoint::new(fabric.device(), cfg).unwrap();
        Pair::connect(a, b, Some(fabric))
    }
}

impl<D: Device> Pair<D> {
    /// Introduces `a` and `b` to each other; with `handshake_on_insert`,
    /// returns once both HANDSHAKEs are in.
    pub fn connect(mut a: Endpoint<D>, mut b: Endpoint<D>, keep: Option<SimFabric>) -> Self {
        let to_b = a.insert_peer(&b.addr()).unwrap();
        let to_a = b.insert_peer(&a.addr()).unwrap();
        let handshake = a.config().handshake_on_insert;
        let mut p = Pair { _keep: keep, a, b, to_b, to_a };
        if handshake {
            while !p.a.peer_handshake_received(p.to_b) || !p.b.peer_handshake_received(p.to_a) {
                p.progress();
            }
        }
        p
    }

    pub fn progress(&mut self) {
        self.a.progress();
        self.b.progress();
    }

    pub fn packets_sent(&self) -> Vec<u64> {
        packets_sent([&self.a, &self.b])
    }
}

/// Packets sent by all of `eps`, by type id.
pub(super) fn packets_sent<'a, D: Device + 'a>(
    eps: impl IntoIterator<Item = &'a Endpoint<D>>,
) -> Vec<u64> {
    let mut sum = vec![0u64; 256];
    for ep in eps {
        for (s, n) in sum.iter_mut().zip(ep.counters().tx_by_type.iter()) {
            *s += n;
        }
    }
    sum
}

/// A region both peers may read, write and update atomically.
pub(super) fn region<D: Device>(ep: &mut Endpoint<D>, len: u64) -> Mr {
    ep.register(len, Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC).unwrap()
}

/// Messages of one size from a to b, `window` in flight.
pub(super) struct Stream<D: Device = SimDevice> {
    p: Pair<D>,
    len: u64,
    window: u64,
    src: Mr,
    dst: Mr,
}

impl<D: Device> Stream<D> {
    pub(super) fn new(mut p: Pair<D>, len: u64, window: u64) -> Self {
        let src = region(&mut p.a, len);
        let dst = region(&mut p.b, len);
        let mut s = Stream { p, len, window, src, dst };
        // Warm-up: the HANDSHAKE is in and every pool has been used.
        s.run(2 * window + 2);
        s
    }
}

impl<D: Device> Runner for Stream<D> {
    fn run(&mut self, n: u64) {
        let Stream { p, len, window, src, dst } = self;
        let (len, window) = (*len, *window);
        let (mut posted, mut sent, mut recvd, mut sdone) = (0u64, 0u64, 0u64, 0u64);
        while recvd < n || sdone < n {
            while posted < n && posted - recvd < window {
                p.b.recv(Span::new(dst, 0, len), None, posted).unwrap();
                posted += 1;
            }
            while sent < n
                && sent - sdone < window
                && p.a.send(p.to_b, Span::new(src, 0, len), sent).is_ok()
            {
                sent += 1;
            }
            p.progress();
            while let Some(c) = p.a.poll_cq() {
                debug_assert!(c.status.is_ok());
                sdone += 1;
            }
            while let Some(c) = p.b.poll_cq() {
                black_box(c);
                recvd += 1;
            }
        }
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.p.packets_sent()
    }
}

fn stream(name: &str, len: u64, iters: u64, sim: SimConfig, cfg: Config) -> Workload {
    let unit = if len <= 64 { Unit::Ops } else { Unit::Bytes(len) };
    // Large messages one at a time: each is a pipeline of its own.
    let window = if len <= 64 * KIB { 64 } else { 1 };
    Workload::new(format!("sim/{name}"), unit, Kind::Rate, iters, move || {
        Box::new(Stream::new(Pair::new(sim, cfg), len, window))
    })
}

/// A 64-byte message to b and one back, each to a posted receive, on any
/// device whose endpoints can share a thread.
pub(super) struct PingPong<D: Device> {
    p: Pair<D>,
    sa: Mr,
    sb: Mr,
}

impl<D: Device> PingPong<D> {
    pub(super) fn new(mut p: Pair<D>) -> Self {
        let sa = p.a.register(64, Access::empty()).unwrap();
        let sb = p.b.register(64, Access::empty()).unwrap();
        let mut pp = PingPong { p, sa, sb };
        pp.run(100);
        pp
    }

    fn round_trip(&mut self) {
        let PingPong { p: Pair { a, b, to_b, to_a, .. }, sa, sb } = self;
        // As `efapoll pingpong` drives it: each message posted at once
        // (`flush`), then only the side waiting for it progresses; each
        // side's send completes at its next turn.
        b.recv(Span::new(sb, 0, 64), None, 0).unwrap();
        a.recv(Span::new(sa, 0, 64), None, 0).unwrap();
        a.send(*to_b, Span::new(sa, 0, 64), 1).unwrap();
        a.flush();
        let mut got = false;
        while !got {
            b.progress();
            while let Some(c) = b.poll_cq() {
                got |= c.op == Op::Recv;
            }
        }
        b.send(*to_a, Span::new(sb, 0, 64), 2).unwrap();
        b.flush();
        let mut got = false;
        while !got {
            a.progress();
            while let Some(c) = a.poll_cq() {
                got |= c.op == Op::Recv;
            }
        }
    }
}

impl<D: Device> Runner for PingPong<D> {
    fn run(&mut self, n: u64) {
        (0..n).for_each(|_| self.round_trip());
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.p.packets_sent()
    }
}

/// A message to one of `n` distinct posted tags, pseudo-random; its receive
/// is posted again so that `n` stay posted.
struct PostedTags {
    p: Pair,
    n: u64,
    src: Mr,
    dst: Mr,
    /// xorshift state: the next tag.
    x: u64,
}

impl PostedTags {
    fn new(n: u64) -> PostedTags {
        let cfg = Config { rx_ops: n as usize + 64, ..Config::default() };
        let mut p = Pair::new(SimConfig::default(), cfg);
        let src = region(&mut p.a, 64);
        let dst = region(&mut p.b, 64);
        for t in 0..n {
            p.b.trecv(Span::new(&dst, 0, 64), TagMatch { tag: t, ignore: 0 }, None, t).unwrap();
        }
        let mut s = PostedTags { p, n, src, dst, x: 0x9e37_79b9 };
        s.run(1000);
        s
    }
}

impl Runner for PostedTags {
    fn run(&mut self, iters: u64) {
        let PostedTags { p, n, src, dst, x } = self;
        for _ in 0..iters {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let tag = *x % *n;
            p.a.tsend(p.to_b, Span::new(src, 0, 64), tag, 0).unwrap();
            let mut got = None;
            while got.is_none() {
                p.progress();
                got = p.b.poll_cq();
            }
            black_box(got);
            p.b.trecv(Span::new(dst, 0, 64), TagMatch { tag, ignore: 0 }, None, tag).unwrap();
            while p.a.poll_cq().is_some() {}
        }
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.p.packets_sent()
    }
}

/// Messages a batch of senders posts before the receiver takes them: two
/// bursts of the receiver's poll, so that the two clock reads around a
/// batch cost under 1 ns a message (with 8 they were some 5 ns, a sixth
/// of the figure).
const PEER_BATCH: u64 = 64;

/// One receiver, `n` senders taking turns, a batch of messages at a time:
/// the receiver's cost per message should not grow with its address
/// vector. Only the receiver is timed: the senders stand for other hosts.
struct Peers {
    _fabric: SimFabric,
    rx: Ep,
    dst: Mr,
    senders: Vec<(Ep, PeerId, Mr)>,
    turn: usize,
}

impl Peers {
    fn new(n: usize) -> Peers {
        // Every device of a fabric has its config. Small packets, so that
        // a thousand senders fit in memory; each sender can have its share
        // of a batch in flight beside its HANDSHAKE, and the receiver,
        // whose TX takes half its buffers at most, a whole batch posted
        // (a packet that finds no buffer waits in the fabric, and its
        // delivery would land in the receiver's time).
        let share = PEER_BATCH.div_ceil(n as u64) as usize;
        let bufs = (4 * share).max(2 * PEER_BATCH as usize + 64) as u32;
        let sim = SimConfig {
            bufs,
            mtu: 1024,
            tx_depth: 2 * share,
            rx_depth: 512,
            ..SimConfig::default()
        };
        let fabric = SimFabric::new(sim);
        let cfg = Config { tx_ops: 2 * share, rx_ops: 16, ..Config::default() };
        let mut rx = Endpoint::new(fabric.device(), Config::default()).unwrap();
        let senders = (0..n)
            .map(|_| {
                let mut s = Endpoint::new(fabric.device(), cfg).unwrap();
                let p = s.insert_peer(&rx.addr()).unwrap();
                let m = s.register(64, Access::empty()).unwrap();
                (s, p, m)
            })
            .collect();
        let dst = rx.register(64, Access::empty()).unwrap();
        let mut p = Peers { _fabric: fabric, rx, dst, senders, turn: 0 };
        // Warm-up: every sender's HANDSHAKE done.
        p.run(4 * n as u64);
        p
    }

    /// One batch of `k` messages; returns the receiver's time.
    fn batch(&mut self, k: u64) -> Duration {
        let Peers { rx, dst, senders, turn, .. } = self;
        let n = senders.len();
        let first = *turn;
        for i in 0..k {
            let (s, p, m) = &mut senders[*turn];
            *turn = (*turn + 1) % n;
            s.send(*p, Span::new(m, 0, 64), i).unwrap();
            // Builds what waited for a buffer (its own HANDSHAKE may hold
            // one) and posts it.
            s.progress();
        }
        let t = Instant::now();
        receive_batch(rx, dst, k);
        let took = t.elapsed();
        // The senders reap their completions (and any HANDSHAKE).
        for j in 0..k.min(n as u64) as usize {
            let (s, _, _) = &mut senders[(first + j) % n];
            s.progress();
            while s.poll_cq().is_some() {}
        }
        took
    }
}

/// The receiver's part of a batch: posts `k` receives and takes `k`
/// messages. Out of line, so that a profile can single it out
/// (`valgrind --tool=callgrind --toggle-collect='*receive_batch*'`).
#[inline(never)]
fn receive_batch(rx: &mut Ep, dst: &Mr, k: u64) {
    for i in 0..k {
        rx.recv(Span::new(dst, 0, 64), None, i).unwrap();
    }
    let mut got = 0;
    while got < k {
        rx.progress();
        while rx.poll_cq().is_some() {
            got += 1;
        }
    }
}

impl Runner for Peers {
    fn run(&mut self, iters: u64) {
        self.run_timed(iters);
    }

    fn run_timed(&mut self, iters: u64) -> Duration {
        let mut took = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let k = left.min(PEER_BATCH);
            took += self.batch(k);
            left -= k;
        }
        took
    }

    fn packets_sent(&self) -> Vec<u64> {
        packets_sent(std::iter::once(&self.rx).chain(self.senders.iter().map(|(s, _, _)| s)))
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    let sim = SimConfig::default();
    let cfg = Config::default();
    let handshaken = Config { handshake_on_insert: true, ..cfg };
    let no_rdma = SimConfig { rdma_read: false, rdma_write: false, ..sim };
    v.push(stream("eager_64B_stream", 64, 200_000, sim, cfg).small());
    // The same stream delivered out of order: the reorder buffer's cost.
    for w in [8u32, 64] {
        let reordered = SimConfig { faults: Faults::reorder(1, w), ..sim };
        let s = stream(&format!("eager_64B_reorder/{w}"), 64, 150_000, reordered, cfg);
        v.push(if w == 64 { s.small() } else { s });
    }
    v.push(
        Workload::new("sim/pingpong_64B", Unit::Ops, Kind::Latency, 130_000, || {
            Box::new(PingPong::new(Pair::new(SimConfig::default(), Config::default())))
        })
        .small(),
    );
    v.push(stream("medium_32KiB_stream", 32 * KIB, 12_000, sim, cfg).small());
    // Without device RDMA, large messages go long-CTS.
    v.push(stream("longcts_1MiB", MIB, 400, no_rdma, cfg).small());
    v.push(stream("longcts_8MiB", 8 * MIB, 50, no_rdma, cfg));
    // With it, and the peer's HANDSHAKE in, from 1 MiB: long-read, or
    // runting read (the first runt_size bytes eager).
    let runting = Config { runt_size: 307_200, ..handshaken };
    v.push(stream("longread_8MiB", 8 * MIB, 128, sim, handshaken).small());
    v.push(stream("runtread_1MiB", MIB, 700, sim, runting).small());
    // Matching a tag among 100,000 misses the caches.
    for (n, iters) in [(1u64, 160_000), (1000, 160_000), (10_000, 120_000), (100_000, 50_000)] {
        let w = Workload::new(format!("sim/posted_tags/{n}"), Unit::Ops, Kind::Rate, iters, {
            move || Box::new(PostedTags::new(n))
        });
        v.push(if n == 1000 { w.small() } else { w });
    }
    for (n, iters) in [(1usize, 170_000), (32, 150_000), (1024, 90_000)] {
        let w = Workload::new(format!("sim/peers/{n}"), Unit::Ops, Kind::Rate, iters, move || {
            Box::new(Peers::new(n))
        });
        v.push(if n == 32 { w.small() } else { w });
    }
}
