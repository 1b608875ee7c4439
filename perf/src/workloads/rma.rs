//! One-sided operations on the sim device, both endpoints in one thread,
//! one operation in flight: each emulated protocol (the device cannot do
//! RDMA, or only reads) and the direct ones.

use std::hint::black_box;

use efapoll::device::Mr;
use efapoll::device::sim::SimConfig;
use efapoll::endpoint::{AtomicOp, Config, Datatype, Error, Span};
use efapoll::wire::RmaIov;

use super::sim::{KIB, MIB, Pair, region};
use super::{Kind, Runner, Unit, Workload};

#[derive(Debug, Clone, Copy)]
enum Op {
    Write,
    Read,
    /// WRITE_RTA: an add with no result.
    Atomic,
    /// FETCH_RTA: an add that brings the old value back.
    Fetch,
    /// COMPARE_RTA: a compare-and-swap.
    Compare,
}

/// `a` operating on `b`'s memory.
struct Rma {
    p: Pair,
    op: Op,
    len: u64,
    local: Mr,
    remote: Mr,
}

impl Rma {
    fn new(sim: SimConfig, op: Op, len: u64) -> Rma {
        // The HANDSHAKE first: which protocol a one-sided operation takes
        // depends on what the peer supports.
        let mut p = Pair::new(sim, Config { handshake_on_insert: true, ..Config::default() });
        // Atomics need room for operand, compare and result.
        let local = region(&mut p.a, len.max(24));
        let remote = region(&mut p.b, len);
        let mut r = Rma { p, op, len, local, remote };
        r.run(4);
        r
    }

    fn start(&mut self) -> Result<(), Error> {
        let Rma { p, op, len, local, remote } = self;
        let remote = RmaIov { addr: remote.addr, len: *len, key: remote.key };
        let (operand, compare, result) =
            (Span::new(local, 0, 8), Span::new(local, 8, 8), Span::new(local, 16, 8));
        let (sum, u64) = (AtomicOp::Sum, Datatype::Uint64);
        match op {
            Op::Write => p.a.write(p.to_b, Span::new(local, 0, *len), remote, 1),
            Op::Read => p.a.read(p.to_b, Span::new(local, 0, *len), remote, 1),
            Op::Atomic => p.a.atomic(p.to_b, sum, u64, operand, remote, 1),
            Op::Fetch => p.a.fetch_atomic(p.to_b, sum, u64, operand, result, remote, 1),
            Op::Compare => {
                let cswap = AtomicOp::Cswap;
                p.a.compare_atomic(p.to_b, cswap, u64, operand, compare, result, remote, 1)
            }
        }
    }
}

impl Runner for Rma {
    fn run(&mut self, n: u64) {
        for _ in 0..n {
            while let Err(e) = self.start() {
                assert_eq!(e, Error::Again, "{:?}", self.op);
                self.p.progress();
            }
            // Posted at once, then each side progresses in the order the
            // request and its answer travel: the round trip's critical
            // path, as two endpoints on their own cores run it.
            self.p.a.flush();
            loop {
                self.p.b.progress();
                self.p.a.progress();
                if let Some(c) = self.p.a.poll_cq() {
                    debug_assert!(c.status.is_ok(), "{c:?}");
                    black_box(c);
                    break;
                }
            }
        }
    }

    fn packets_sent(&self) -> Vec<u64> {
        self.p.packets_sent()
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    let direct = SimConfig::default();
    // The target can read but not be written: writes from 64 KiB go
    // long-read (the target pulls the data).
    let read_only = SimConfig { rdma_write: false, ..direct };
    let emulated = SimConfig { rdma_read: false, rdma_write: false, ..direct };
    let rma = |name: &str, sim: SimConfig, op: Op, len: u64, kind: Kind, iters: u64| {
        let unit = if len > 8 { Unit::Bytes(len) } else { Unit::Ops };
        Workload::new(format!("rma/{name}"), unit, kind, iters, move || {
            Box::new(Rma::new(sim, op, len))
        })
    };
    v.push(rma("write_eager_4KiB", emulated, Op::Write, 4 * KIB, Kind::Rate, 85_000).small());
    v.push(rma("write_longcts_1MiB", emulated, Op::Write, MIB, Kind::Rate, 450));
    v.push(rma("write_longread_1MiB", read_only, Op::Write, MIB, Kind::Rate, 1400).small());
    v.push(rma("write_direct_1MiB", direct, Op::Write, MIB, Kind::Rate, 1400));
    v.push(rma("read_short_4KiB", emulated, Op::Read, 4 * KIB, Kind::Rate, 60_000).small());
    v.push(rma("read_longcts_1MiB", emulated, Op::Read, MIB, Kind::Rate, 480));
    v.push(rma("read_direct_1MiB", direct, Op::Read, MIB, Kind::Rate, 1400));
    v.push(rma("atomic_write_u64", direct, Op::Atomic, 8, Kind::Rate, 130_000));
    v.push(rma("atomic_fetch_u64", direct, Op::Fetch, 8, Kind::Latency, 150_000).small());
    v.push(rma("atomic_compare_u64", direct, Op::Compare, 8, Kind::Latency, 150_000));
}
