//! The shm device on its own, both devices in one thread: the ring (a
//! packet into the peer's ring, out into a posted receive buffer, its send
//! completion reaped) and a one-sided copy.

use std::hint::black_box;

use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::{Access, BufId, CqStatus, Cqe, Device, RdmaOp, RdmaWr, SendWr};

use efapoll::endpoint::{Config, Endpoint};

use super::sim::{KIB, MIB, Pair, PingPong, Stream};
use super::{Kind, Runner, Unit, Workload};

fn pair() -> (ShmDevice, ShmDevice) {
    let cfg = ShmConfig::default();
    (ShmDevice::new(cfg).unwrap(), ShmDevice::new(cfg).unwrap())
}

/// Two endpoints over shm that know each other.
fn endpoints(cfg: Config) -> Pair<ShmDevice> {
    let (a, b) = pair();
    Pair::connect(Endpoint::new(a, cfg).unwrap(), Endpoint::new(b, cfg).unwrap(), None)
}

/// 64-byte packets from a to b in bursts; one operation is one packet.
struct Ring {
    a: ShmDevice,
    b: ShmDevice,
    wrs: Vec<SendWr>,
    bufs: Vec<BufId>,
    out: [Cqe; 32],
}

impl Ring {
    fn new(burst: usize) -> Ring {
        let (mut a, mut b) = pair();
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.insert_addr(&a.addr()).unwrap();
        let wrs = (0..burst as u32)
            .map(|i| SendWr { ah, buf: BufId(i), len: 64, data: None, wr_id: i as u64 })
            .collect();
        // Receive buffers well clear of the send buffers.
        let bufs = (1000..1000 + burst as u32).map(BufId).collect();
        let mut r = Ring { a, b, wrs, bufs, out: [Cqe::default(); 32] };
        r.run(64 * burst as u64);
        r
    }
}

impl Runner for Ring {
    fn run(&mut self, packets: u64) {
        let burst = self.wrs.len();
        for _ in 0..packets.div_ceil(burst as u64) {
            assert_eq!(self.a.post_send(black_box(&self.wrs)), burst);
            self.b.post_recv(&self.bufs);
            assert_eq!(self.b.poll(&mut self.out), burst);
            black_box(&self.out[..burst]);
            assert_eq!(self.a.poll(&mut self.out), burst);
        }
    }
}

/// RDMA write or read of 1 MiB between a and a region of b.
struct Copy {
    a: ShmDevice,
    /// Owns the region a reads or writes.
    _b: ShmDevice,
    wr: RdmaWr,
}

impl Copy {
    fn new(write: bool) -> Copy {
        let (mut a, mut b) = pair();
        let ah = a.insert_addr(&b.addr()).unwrap();
        let local = a.register(MIB, Access::LOCAL).unwrap();
        a.write_region(local.id, 0, &vec![0x5a; local.len as usize]);
        let remote = b.register(MIB, Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
        let op = if write { RdmaOp::Write { imm: None } } else { RdmaOp::Read };
        let wr = RdmaWr {
            op,
            ah,
            local: local.id,
            local_offset: 0,
            len: MIB,
            remote_addr: remote.addr,
            remote_key: remote.key,
            wr_id: 1,
        };
        let mut c = Copy { a, _b: b, wr };
        // The first maps b's region, once b's thread answers.
        while c.a.post_rdma(&[c.wr]) == 0 {}
        let mut out = [Cqe::default(); 1];
        while c.a.poll(&mut out) == 0 {}
        c.run(2);
        c
    }
}

impl Runner for Copy {
    fn run(&mut self, n: u64) {
        let mut out = [Cqe::default(); 1];
        for _ in 0..n {
            assert_eq!(self.a.post_rdma(black_box(&[self.wr])), 1);
            assert_eq!(self.a.poll(&mut out), 1);
            debug_assert_eq!(out[0].status, CqStatus::Ok);
        }
    }
}

pub(super) fn workloads(v: &mut Vec<Workload>) {
    // The engine over shm, both endpoints in one thread: what a round trip
    // costs the two cores of a pingpong, without the wait between them.
    v.push(
        Workload::new("shm/pingpong_64B", Unit::Ops, Kind::Latency, 100_000, || {
            Box::new(PingPong::new(endpoints(Config::default())))
        })
        .small(),
    );
    // 64-byte messages streamed as `efapoll streaming -S 64` sends them,
    // window 64: the per-message cost of both cores, in one thread.
    v.push(
        Workload::new("shm/stream_64B", Unit::Ops, Kind::Rate, 200_000, || {
            let cfg = Config { handshake_on_insert: true, ..Config::on_host() };
            Box::new(Stream::new(endpoints(cfg), 64, 64))
        })
        .small(),
    );
    // Messages past one packet as the apps send them over shm: read, one
    // copy out of the sender's region (`Config::on_host`).
    v.push(
        Workload::new(
            "shm/stream_64KiB_on_host",
            Unit::Bytes(64 * KIB),
            Kind::Rate,
            15_000,
            || {
                let cfg = Config { handshake_on_insert: true, ..Config::on_host() };
                Box::new(Stream::new(endpoints(cfg), 64 * KIB, 64))
            },
        )
        .small(),
    );
    for burst in [1usize, 32] {
        // Packets: a multiple of 32 * 50, so that every count is whole bursts.
        let w = Workload::new(
            format!("shm/ring_64B/burst{burst}"),
            Unit::Ops,
            Kind::Rate,
            if burst == 1 { 720_000 } else { 1_344_000 },
            move || Box::new(Ring::new(burst)),
        );
        v.push(w.small());
    }
    for (name, write) in [("rdma_write_1MiB", true), ("rdma_read_1MiB", false)] {
        v.push(Workload::new(
            format!("shm/{name}"),
            Unit::Bytes(MIB),
            Kind::Rate,
            2000,
            move || Box::new(Copy::new(write)),
        ));
    }
}
