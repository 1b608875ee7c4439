//! Every protocol of the endpoint across the udp device, unchanged: two
//! endpoints on loopback sockets, driven on one thread, with and without
//! the device's RDMA, through seeded faults on the wire (drops,
//! duplicates, reordering, delays), byte-exact and exactly once.

mod common;

use std::time::{Duration, Instant};

use common::{Mem, iov, pattern, span};
use efapoll::device::fault::Faults;
use efapoll::device::udp::{UdpConfig, UdpDevice};
use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{
    AtomicOp, Completion, Config, Datatype, Endpoint, Error, Op, PeerId, Status, TagMatch,
};

struct Pair {
    eps: [Endpoint<UdpDevice>; 2],
    done: [Vec<Completion>; 2],
    to_b: PeerId,
}

impl Pair {
    fn new(udp: UdpConfig, cfg: Config) -> Pair {
        let mut eps = [
            Endpoint::new(UdpDevice::new(udp).unwrap(), cfg).unwrap(),
            Endpoint::new(UdpDevice::new(udp).unwrap(), cfg).unwrap(),
        ];
        let b = eps[1].addr();
        let to_b = eps[0].insert_peer(&b).unwrap();
        Pair { eps, done: [Vec::new(), Vec::new()], to_b }
    }

    fn step(&mut self) {
        for (ep, d) in self.eps.iter_mut().zip(self.done.iter_mut()) {
            ep.progress();
            while let Some(c) = ep.poll_cq() {
                d.push(c);
            }
        }
    }

    fn drive(&mut self, what: &str, mut cond: impl FnMut(&[Vec<Completion>; 2]) -> bool) {
        let end = Instant::now() + Duration::from_secs(120);
        while !cond(&self.done) {
            assert!(Instant::now() < end, "{what}: not done: {:?}", self.done);
            self.step();
        }
    }

    /// Retries `f` while the endpoint pushes back.
    fn post(&mut self, mut f: impl FnMut(&mut Endpoint<UdpDevice>) -> Result<(), Error>) {
        loop {
            match f(&mut self.eps[0]) {
                Ok(()) => return,
                Err(Error::Again) => self.step(),
                Err(e) => panic!("post: {e}"),
            }
        }
    }

    fn register(&mut self, ep: usize, len: u64) -> Mr {
        self.eps[ep].register(len, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap()
    }

    fn fill(&mut self, ep: usize, mr: &Mr, seed: u64) -> Vec<u8> {
        let bytes: Vec<u8> = (0..mr.len).map(|i| pattern(seed, i)).collect();
        self.eps[ep].write_mem(mr.id, 0, &bytes).unwrap();
        bytes
    }
}

fn faults(seed: u64, drop_ppm: u32) -> Faults {
    Faults {
        seed,
        drop_ppm,
        duplicate_ppm: 20_000,
        reorder_window: 4,
        delay_ppm: 20_000,
        delay_max_ns: 300_000,
        ..Faults::default()
    }
}

fn udp(rdma: bool, faults: Faults) -> UdpConfig {
    UdpConfig {
        rdma_read: rdma,
        rdma_write: rdma,
        faults,
        min_rto: Duration::from_micros(300),
        ..UdpConfig::default()
    }
}

/// Sends a message of each size, tagged, and checks each landed whole
/// in its receive, exactly once.
fn messages(p: &mut Pair, sizes: &[u64]) {
    let total: u64 = sizes.iter().sum();
    let src = p.register(0, total.max(1));
    let dst = p.register(1, total.max(1));
    let want = p.fill(0, &src, total);
    let (s0, r0) = (p.done[0].len(), p.done[1].len());
    let mut at = 0;
    for (i, &len) in sizes.iter().enumerate() {
        p.eps[1]
            .trecv(span(&dst, at, len), TagMatch { tag: 5, ignore: 0 }, None, i as u64)
            .unwrap();
        let to_b = p.to_b;
        p.post(|ep| ep.tsend(to_b, span(&src, at, len), 5, i as u64));
        at += len;
    }
    let n = sizes.len();
    p.drive("messages", |d| d[0].len() - s0 == n && d[1].len() - r0 == n);
    // Matched in send order; long transfers may complete out of it.
    let mut recvs = p.done[1][r0..].to_vec();
    recvs.sort_by_key(|c| c.ctx);
    for (i, c) in recvs.iter().enumerate() {
        assert_eq!((c.op, c.status, c.ctx, c.len), (Op::Recv, Status::Ok, i as u64, sizes[i]));
    }
    assert!(p.done[0][s0..].iter().all(|c| c.status == Status::Ok), "{:?}", &p.done[0][s0..]);
    assert!(p.eps[1].mem(dst.id) == want, "byte-exact");
}

/// Writes, reads and atomics of each size to the peer's memory.
fn one_sided(p: &mut Pair, sizes: &[u64]) {
    let max = *sizes.iter().max().unwrap();
    let local = p.register(0, max);
    let remote = p.register(1, max);
    let to_b = p.to_b;
    for (k, &len) in sizes.iter().enumerate() {
        let want = p.fill(0, &local, 100 + k as u64);
        let n0 = p.done[0].len();
        p.post(|ep| ep.write(to_b, span(&local, 0, len), iov(&remote, 0, len), 1));
        p.drive("write", |d| d[0].len() > n0);
        assert_eq!(p.done[0][n0].status, Status::Ok, "write of {len}");
        assert!(p.eps[1].mem(remote.id)[..len as usize] == want[..len as usize], "write of {len}");

        let back = p.fill(1, &remote, 200 + k as u64);
        let n0 = p.done[0].len();
        p.post(|ep| ep.read(to_b, span(&local, 0, len), iov(&remote, 0, len), 2));
        p.drive("read", |d| d[0].len() > n0);
        assert_eq!(p.done[0][n0].status, Status::Ok, "read of {len}");
        assert!(p.eps[0].mem(local.id)[..len as usize] == back[..len as usize], "read of {len}");
    }
    // An atomic sum, fetched: the old value comes back, the new one stays.
    let operand = p.register(0, 16);
    p.eps[0].write_mem(operand.id, 0, &5u64.to_le_bytes()).unwrap();
    p.eps[1].write_mem(remote.id, 0, &37u64.to_le_bytes()).unwrap();
    let n0 = p.done[0].len();
    p.post(|ep| {
        ep.fetch_atomic(
            to_b,
            AtomicOp::Sum,
            Datatype::Uint64,
            span(&operand, 0, 8),
            span(&operand, 8, 8),
            iov(&remote, 0, 8),
            3,
        )
    });
    p.drive("atomic", |d| d[0].len() > n0);
    assert_eq!(p.done[0][n0].status, Status::Ok);
    let mut old = [0u8; 8];
    p.eps[0].read_mem(operand.id, 8, &mut old).unwrap();
    let mut now = [0u8; 8];
    p.eps[1].read_mem(remote.id, 0, &mut now).unwrap();
    assert_eq!((u64::from_le_bytes(old), u64::from_le_bytes(now)), (37, 42));
}

const SIZES: [u64; 10] =
    [1, 64, 8000, 8193, 65_536, 65_537, 307_201, 1 << 20, (1 << 20) + 1, 4 << 20];

#[test]
fn every_protocol_crosses_a_clean_wire() {
    for rdma in [true, false] {
        for cfg in [Config::default(), Config::on_host()] {
            let mut p = Pair::new(udp(rdma, Faults::default()), cfg);
            messages(&mut p, &SIZES);
            messages(&mut p, &[16 << 20]);
            one_sided(&mut p, &[1, 8193, 300_000]);
            let c = p.eps[0].counters();
            assert!(c.nonzero().iter().any(|(k, _)| k.starts_with("tx.")), "{c:?}");
        }
    }
}

#[test]
fn every_protocol_survives_drops_duplicates_reordering_and_delays() {
    for (seed, drop_ppm) in [(11u64, 10_000u32), (12, 100_000), (13, 500_000)] {
        for rdma in [true, false] {
            let cfg = Config { response_timeout: Duration::from_secs(60), ..Config::default() };
            let mut p = Pair::new(udp(rdma, faults(seed, drop_ppm)), cfg);
            let sizes: &[u64] = if drop_ppm >= 500_000 {
                &[1, 8193, 65_537, 307_201, (1 << 20) + 1]
            } else {
                &SIZES
            };
            messages(&mut p, sizes);
            one_sided(&mut p, &[1, 8193, 100_000]);
            let retransmits: u64 = p
                .eps
                .iter()
                .flat_map(|ep| ep.device().counters())
                .filter(|(k, _)| *k == "retransmits")
                .map(|(_, v)| v)
                .sum();
            assert!(retransmits > 0, "drop {drop_ppm}: something was resent");
        }
    }
}
