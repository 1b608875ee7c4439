//! Every protocol of the endpoint across each device that has a wire,
//! clean and through the wire's faults: the sim's fabric and the udp
//! device's sockets (on loopback) take their faults from one layer
//! (`device::fault`), and the endpoint must come through them alike,
//! whichever device repairs what (SRD's model in the sim; the udp
//! device's acknowledgements and resends). Each scenario is written once,
//! over a [`Wire`], and runs on both (`sim::` and `udp::`), and with the
//! `efa` feature on the efa device over softefa (`efa::`: the test runs
//! again in a child with softefa preloaded; softefa's QPs are udp devices,
//! so the same fault layer sits under the verbs). What only one
//! device does stays with it: the sim's model faults in `endpoint_msg.rs`
//! and `endpoint_hostile.rs`, udp's sessions in `device::udp`.

use crate::common;

use std::time::{Duration, Instant};

use common::{Mem, iov, pattern, span};
use efapoll::device::fault::{FaultStats, Faults};
use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::udp::{UdpConfig, UdpDevice, UdpStats};
use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{
    AtomicOp, Completion, Config, Datatype, DropReason, Endpoint, Error, Op, PeerId, Status,
    TagMatch,
};

/// A device with a wire, as the scenarios see it.
trait Wire: Sized {
    type Dev: Device;

    /// Two devices on a wire with `faults`, with or without RDMA.
    fn pair(faults: Faults, rdma: bool) -> (Self, [Self::Dev; 2]);

    /// After a round in which nothing happened: the sim moves its virtual
    /// clock to what the wire holds back, or on by a millisecond (timers);
    /// udp's clock moves by itself.
    fn idle(&self);

    /// Ends the pair: what the wire's faults did, and how many datagrams
    /// the devices dropped themselves (the endpoints count the rest).
    fn finish(self, eps: [Endpoint<Self::Dev>; 2]) -> (FaultStats, u64);

    /// The device drops the wire's copies itself (udp's window); the
    /// sim's fabric hands them to the endpoint, as SRD may.
    const DROPS_COPIES: bool;
}

struct Sim(SimFabric);

impl Wire for Sim {
    type Dev = SimDevice;

    fn pair(faults: Faults, rdma: bool) -> (Sim, [SimDevice; 2]) {
        let sim = SimConfig {
            seed: faults.seed,
            faults,
            rdma_read: rdma,
            rdma_write: rdma,
            ..SimConfig::default()
        };
        let fabric = SimFabric::new(sim);
        let devs = [fabric.device(), fabric.device()];
        (Sim(fabric), devs)
    }

    fn idle(&self) {
        if !self.0.skip_to_next_due() && self.0.pending_total() == 0 {
            self.0.advance(Duration::from_millis(1));
        }
    }

    fn finish(self, _: [Endpoint<SimDevice>; 2]) -> (FaultStats, u64) {
        (self.0.fault_stats(), 0)
    }

    const DROPS_COPIES: bool = false;
}

struct Udp;

impl Wire for Udp {
    type Dev = UdpDevice;

    fn pair(faults: Faults, rdma: bool) -> (Udp, [UdpDevice; 2]) {
        let cfg = UdpConfig {
            rdma_read: rdma,
            rdma_write: rdma,
            faults,
            min_rto: Duration::from_micros(300),
            ..UdpConfig::default()
        };
        (Udp, [UdpDevice::new(cfg).unwrap(), UdpDevice::new(cfg).unwrap()])
    }

    fn idle(&self) {}

    fn finish(self, eps: [Endpoint<UdpDevice>; 2]) -> (FaultStats, u64) {
        let [a, b] = eps.each_ref().map(|ep| ep.device().fault_stats());
        let stats = FaultStats {
            dropped: a.dropped + b.dropped,
            duplicated: a.duplicated + b.duplicated,
            reordered: a.reordered + b.reordered,
            delayed: a.delayed + b.delayed,
            corrupted: a.corrupted + b.corrupted,
            truncated: a.truncated + b.truncated,
            refused: a.refused + b.refused,
        };
        let counters = eps.iter().flat_map(|ep| ep.device().counters());
        let own = UdpStats::DROPS;
        (stats, counters.filter(|(k, _)| own.contains(k)).map(|(_, v)| v).sum())
    }

    const DROPS_COPIES: bool = true;
}

/// The efa device on softefa, in a child process (`common::softefa`):
/// each pair tells softefa its RDMA caps and faults before it opens its
/// devices, and reads what the faults did once its QPs are destroyed.
#[cfg(feature = "efa")]
struct Efa;

#[cfg(feature = "efa")]
impl Wire for Efa {
    type Dev = efapoll::device::efa::EfaDevice;

    fn pair(faults: Faults, rdma: bool) -> (Efa, [Self::Dev; 2]) {
        use efapoll::device::efa::{EfaConfig, EfaDevice};
        common::softefa::configure(rdma, faults);
        let dev = || EfaDevice::new(EfaConfig::default()).expect("softefa's device");
        let devs = [dev(), dev()];
        assert_eq!(devs[0].caps().rdma_read, rdma, "softefa took the control file");
        (Efa, devs)
    }

    fn idle(&self) {}

    fn finish(self, eps: [Endpoint<Self::Dev>; 2]) -> (FaultStats, u64) {
        // Destroying the QPs makes softefa write their stats.
        drop(eps);
        common::softefa::stats()
    }

    // softefa's udp devices drop copies in their windows.
    const DROPS_COPIES: bool = true;
}

/// Endpoint 0 and endpoint 1 on a faulty wire, driven on one thread.
struct Pair<W: Wire> {
    wire: W,
    eps: [Endpoint<W::Dev>; 2],
    done: [Vec<Completion>; 2],
    to_b: PeerId,
}

impl<W: Wire> Pair<W> {
    fn new(faults: Faults, rdma: bool, cfg: Config) -> Pair<W> {
        let (wire, devs) = W::pair(faults, rdma);
        let mut eps = devs.map(|d| Endpoint::new(d, cfg).unwrap());
        let b = eps[1].addr();
        let to_b = eps[0].insert_peer(&b).unwrap();
        Pair { wire, eps, done: [Vec::new(), Vec::new()], to_b }
    }

    /// One round: each endpoint progresses and its completions are kept.
    fn step(&mut self) {
        let mut did = false;
        for (ep, d) in self.eps.iter_mut().zip(self.done.iter_mut()) {
            did |= ep.progress();
            while let Some(c) = ep.poll_cq() {
                d.push(c);
                did = true;
            }
        }
        if !did {
            self.wire.idle();
        }
    }

    /// Steps until `cond` holds, or for `limit` of wall-clock time.
    fn drive_for(&mut self, limit: Duration, mut cond: impl FnMut(&Self) -> bool) -> bool {
        let end = Instant::now() + limit;
        while !cond(self) {
            if Instant::now() > end {
                return false;
            }
            self.step();
        }
        true
    }

    fn drive(&mut self, what: &str, cond: impl FnMut(&Self) -> bool) {
        let done = self.drive_for(Duration::from_secs(120), cond);
        assert!(done, "{what}: not done: {:?}", self.done);
    }

    /// Retries `f` on endpoint 0 while it pushes back.
    fn post(&mut self, mut f: impl FnMut(&mut Endpoint<W::Dev>) -> Result<(), Error>) {
        loop {
            match f(&mut self.eps[0]) {
                Ok(()) => return,
                Err(Error::Again) => self.step(),
                Err(e) => panic!("post: {e}"),
            }
        }
    }

    /// Posts `f` on endpoint 0 and waits for its completion, which must
    /// be a success.
    fn complete(&mut self, what: &str, f: impl FnMut(&mut Endpoint<W::Dev>) -> Result<(), Error>) {
        let n0 = self.done[0].len();
        self.post(f);
        self.drive(what, |p| p.done[0].len() > n0);
        assert_eq!(self.done[0][n0].status, Status::Ok, "{what}");
    }

    fn register(&mut self, ep: usize, len: u64) -> Mr {
        self.eps[ep].register(len, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap()
    }

    fn fill(&mut self, ep: usize, mr: &Mr, seed: u64) -> Vec<u8> {
        let bytes: Vec<u8> = (0..mr.len).map(|i| pattern(seed, i)).collect();
        self.eps[ep].write_mem(mr.id, 0, &bytes).unwrap();
        bytes
    }

    /// Ends the pair: what the wire's faults did, and the datagrams
    /// dropped as copies, damaged or stale, by the endpoints and by the
    /// devices themselves.
    fn finish(self) -> (FaultStats, u64) {
        let by_endpoints: u64 = self.eps.iter().map(|ep| ep.counters().drops_total()).sum();
        let (stats, by_devices) = self.wire.finish(self.eps);
        (stats, by_endpoints + by_devices)
    }

    /// Sends a tagged message of each size (all receives posted first),
    /// and checks that each landed whole in its own receive, exactly once,
    /// and that messages of one packet completed in send order.
    fn messages(&mut self, sizes: &[u64]) {
        let total: u64 = sizes.iter().sum();
        let src = self.register(0, total.max(1));
        let dst = self.register(1, total.max(1));
        let want = self.fill(0, &src, total);
        let (s0, r0) = (self.done[0].len(), self.done[1].len());
        let mut at = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let tag = TagMatch { tag: 5, ignore: 0 };
            self.eps[1].trecv(span(&dst, at, len), tag, None, i as u64).unwrap();
            let to_b = self.to_b;
            self.post(|ep| ep.tsend(to_b, span(&src, at, len), 5, i as u64));
            at += len;
        }
        let n = sizes.len();
        self.drive("messages", |p| p.done[0].len() - s0 == n && p.done[1].len() - r0 == n);
        let recvs = &self.done[1][r0..];
        let small: Vec<u64> = recvs.iter().filter(|c| c.len < 4096).map(|c| c.ctx).collect();
        assert!(small.is_sorted(), "one-packet messages in send order: {small:?}");
        let mut recvs = recvs.to_vec();
        recvs.sort_by_key(|c| c.ctx);
        for (i, c) in recvs.iter().enumerate() {
            assert_eq!((c.op, c.status, c.ctx, c.len), (Op::Recv, Status::Ok, i as u64, sizes[i]));
        }
        let sends = &self.done[0][s0..];
        assert!(sends.iter().all(|c| c.status == Status::Ok), "{sends:?}");
        assert!(self.eps[1].mem(dst.id) == want, "byte-exact");
    }

    /// Writes and reads of each size to and from the peer's memory, then
    /// a fetching atomic.
    fn one_sided(&mut self, sizes: &[u64]) {
        let max = *sizes.iter().max().unwrap();
        let local = self.register(0, max);
        let remote = self.register(1, max);
        let to_b = self.to_b;
        for (k, &len) in sizes.iter().enumerate() {
            let (n, what) = (len as usize, format!("of {len}"));
            let want = self.fill(0, &local, 100 + k as u64);
            self.complete(&what, |ep| {
                ep.write(to_b, span(&local, 0, len), iov(&remote, 0, len), 1)
            });
            assert!(self.eps[1].mem(remote.id)[..n] == want[..n], "write {what}");
            let back = self.fill(1, &remote, 200 + k as u64);
            self.complete(&what, |ep| ep.read(to_b, span(&local, 0, len), iov(&remote, 0, len), 2));
            assert!(self.eps[0].mem(local.id)[..n] == back[..n], "read {what}");
        }
        // A sum, fetched: the old value comes back, the new one stays.
        let operand = self.register(0, 16);
        self.eps[0].write_mem(operand.id, 0, &5u64.to_le_bytes()).unwrap();
        self.eps[1].write_mem(remote.id, 0, &37u64.to_le_bytes()).unwrap();
        let (sum, u64) = (AtomicOp::Sum, Datatype::Uint64);
        let (src, result, target) =
            (span(&operand, 0, 8), span(&operand, 8, 8), iov(&remote, 0, 8));
        self.complete("atomic", |ep| ep.fetch_atomic(to_b, sum, u64, src, result, target, 3));
        let (mut old, mut now) = ([0u8; 8], [0u8; 8]);
        self.eps[0].read_mem(operand.id, 8, &mut old).unwrap();
        self.eps[1].read_mem(remote.id, 0, &mut now).unwrap();
        assert_eq!((u64::from_le_bytes(old), u64::from_le_bytes(now)), (37, 42));
    }
}

/// Every protocol's sizes: eager (one packet before and after the
/// handshake), medium, long-CTS or long-read (with RDMA read), runting,
/// each side of its thresholds.
const SIZES: [u64; 10] =
    [1, 64, 8000, 8193, 20_000, 65_536, 65_537, 307_201, 1 << 20, (1 << 20) + 1];

/// A response slowed by the faults is not given up.
fn patient() -> Config {
    Config { response_timeout: Duration::from_secs(60), ..Config::default() }
}

fn every_protocol_crosses_a_clean_wire<W: Wire>() {
    for rdma in [true, false] {
        for cfg in [Config::default(), Config::on_host()] {
            let mut p = Pair::<W>::new(Faults::NONE, rdma, cfg);
            p.messages(&SIZES);
            p.messages(&[4 << 20, 16 << 20]);
            p.one_sided(&[1, 8193, 300_000]);
            let c = p.eps[0].counters();
            assert!(c.nonzero().iter().any(|(k, _)| k.starts_with("tx.")), "{c:?}");
        }
    }
}

/// Drops (repaired by the device: the sim delivers again after SRD's
/// retransmission delay, udp resends), delays, duplicates, reordering and
/// refused posts, all at once: every protocol lands once, byte-exact.
fn every_protocol_lands_intact_through_a_lossy_wire<W: Wire>() {
    let mut total = FaultStats::default();
    for (seed, drop_ppm) in [(1u64, 100_000u32), (2, 500_000)] {
        for rdma in [true, false] {
            let faults = Faults {
                seed: seed * 31 + rdma as u64,
                drop_ppm,
                delay_ppm: 100_000,
                delay_max_ns: 200_000,
                duplicate_ppm: 20_000,
                queue_full_ppm: 50_000,
                reorder_window: 8,
                ..Faults::NONE
            };
            let mut p = Pair::<W>::new(faults, rdma, patient());
            let sizes: &[u64] = if drop_ppm >= 500_000 { &[1, 8193, 307_201] } else { &SIZES };
            p.messages(sizes);
            p.one_sided(&[1, 8193, 100_000]);
            let (s, _) = p.finish();
            total.dropped += s.dropped;
            total.delayed += s.delayed;
            total.duplicated += s.duplicated;
            total.refused += s.refused;
            total.reordered += s.reordered;
        }
    }
    let FaultStats { dropped, delayed, duplicated, refused, reordered, .. } = total;
    assert!(dropped > 50 && delayed > 50 && duplicated > 5, "{total:?}");
    assert!(refused > 20 && reordered > 50, "{total:?}");
}

/// One datagram in twenty delivered twice, reordered: a copy never counts
/// as data that arrived (a message would complete with a hole), nor is it
/// delivered again; whoever drops it (the endpoint, by its msg_id and
/// segment offsets, or the device's window) counts it.
fn copies_are_dropped_and_every_protocol_lands_intact<W: Wire>() {
    let (mut drops, mut segments) = (0, 0);
    for seed in 1..=2 {
        let faults = Faults { seed, duplicate_ppm: 50_000, ..Faults::reorder(seed, 8) };
        let mut p = Pair::<W>::new(faults, seed == 1, patient());
        p.messages(&SIZES);
        p.messages(&[3; 40]);
        segments += p.eps[1].counters().drops(DropReason::Duplicate);
        let (s, dropped) = p.finish();
        assert!(s.duplicated > 5, "copies made: {s:?}");
        drops += dropped;
    }
    assert!(drops > 10, "copies arrived and were dropped: {drops}");
    // Where the endpoint sees them, copies of segments, not only of whole
    // eager messages (which their msg_id drops), were among them.
    assert!(W::DROPS_COPIES || segments > 0, "duplicate segments dropped: {segments}");
}

/// Reordering among sixteen: a stream of mixed sizes, every receive
/// posted first, is matched in send order (receive i gets message i).
fn mixed_messages_are_matched_in_send_order_through_reordering<W: Wire>() {
    for seed in 1..=2 {
        let mut p = Pair::<W>::new(Faults::reorder(seed, 16), true, patient());
        let sizes: Vec<u64> =
            (0..120u64).map(|i| [3, 900, 9000, 70_000, 0, 20_000][(i % 6) as usize]).collect();
        let total: u64 = sizes.iter().sum();
        let src = p.register(0, total);
        let dst = p.register(1, total);
        let want = p.fill(0, &src, seed);
        let mut at = 0;
        for (i, &len) in sizes.iter().enumerate() {
            p.eps[1].recv(span(&dst, at, len), None, i as u64).unwrap();
            let to_b = p.to_b;
            p.post(|ep| ep.send(to_b, span(&src, at, len), i as u64));
            at += len;
        }
        let n = sizes.len();
        p.drive("stream", |p| p.done[1].len() == n && p.done[0].len() == n);
        assert!(p.eps[1].mem(dst.id) == want, "receive i got message i");
        for c in &p.done[1] {
            assert_eq!((c.status, c.len), (Status::Ok, sizes[c.ctx as usize]));
        }
        assert!(p.eps[1].counters().reordered > 0, "the endpoint put back what was reordered");
        assert!(p.finish().0.reordered > 0, "the wire reordered something");
    }
}

/// Corrupted and truncated datagrams: nothing panics, and the damage is
/// counted where it is seen. The sim hands every damaged packet to the
/// endpoint, as a hostile peer's; the udp device (under efa too, on
/// softefa) drops a datagram whose headers or length fail its checksum,
/// as SRD's CRC does, and resends it, and hands damaged payloads on. What
/// damage reaches an endpoint may never complete, so the run is bounded,
/// not awaited.
fn damaged_datagrams_are_counted_and_never_panic<W: Wire>() {
    for seed in 1..=2 {
        let faults = Faults { seed, corrupt_ppm: 200_000, truncate_ppm: 200_000, ..Faults::NONE };
        let mut p = Pair::<W>::new(faults, seed == 1, patient());
        let src = p.register(0, 1 << 16);
        let dst = p.register(1, 1 << 16);
        p.fill(0, &src, seed);
        let to_b = p.to_b;
        for i in 0..40u64 {
            let len = [8, 100, 3000, 20_000][(i % 4) as usize];
            // A receive or send refused (a pool held by what never
            // completes) is skipped: this run only watches.
            let _ = p.eps[1].recv(span(&dst, 0, len), None, i);
            let _ = p.eps[0].send(to_b, span(&src, 0, len), i);
            p.step();
        }
        p.drive_for(Duration::from_millis(300), |p| p.done[0].len() == 40);
        // Damage is dropped and resent, or handed to the receiver: never
        // the sender's failure (a session taken for lost, before the
        // udp device checked its headers).
        let failed: Vec<_> = p.done[0].iter().filter(|c| c.status != Status::Ok).collect();
        assert!(failed.is_empty(), "sends failed: {failed:?}");
        let (s, drops) = p.finish();
        assert!(s.corrupted > 0 && s.truncated > 0, "{s:?}");
        assert!(drops > 0, "damage seen and counted: {s:?}");
    }
}

macro_rules! on_every_wire {
    ($($scenario:ident),* $(,)?) => {
        mod sim {
            $(#[test]
            fn $scenario() {
                super::$scenario::<super::Sim>();
            })*
        }
        mod udp {
            $(#[test]
            fn $scenario() {
                super::$scenario::<super::Udp>();
            })*
        }
        #[cfg(feature = "efa")]
        mod efa {
            $(#[test]
            fn $scenario() {
                let name = concat!(module_path!(), "::", stringify!($scenario));
                super::common::softefa::run(name, super::$scenario::<super::Efa>);
            })*
        }
    };
}

on_every_wire!(
    every_protocol_crosses_a_clean_wire,
    every_protocol_lands_intact_through_a_lossy_wire,
    copies_are_dropped_and_every_protocol_lands_intact,
    mixed_messages_are_matched_in_send_order_through_reordering,
    damaged_datagrams_are_counted_and_never_panic,
);
