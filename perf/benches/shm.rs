//! The shm device in one thread: the ring (post_send into a peer's ring,
//! poll it out into receive buffers, reap the send completions) and a
//! one-sided copy.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::{Access, BufId, Cqe, Device, RdmaOp, RdmaWr, SendWr};

fn pair() -> (ShmDevice, ShmDevice) {
    let cfg = ShmConfig::default();
    (ShmDevice::new(cfg).unwrap(), ShmDevice::new(cfg).unwrap())
}

/// 64-byte packets from one device to another, in bursts of 1 and 32;
/// the cost is per packet, both ends and the send completion included.
fn ring_64b(c: &mut Criterion) {
    let (mut a, mut b) = pair();
    let ah = a.insert_addr(&b.addr()).unwrap();
    b.insert_addr(&a.addr()).unwrap();
    let mut g = c.benchmark_group("shm_ring_64B");
    for burst in [1usize, 32] {
        let wrs: Vec<SendWr> = (0..burst as u32)
            .map(|i| SendWr { ah, buf: i, len: 64, data: None, wr_id: i as u64 })
            .collect();
        let bufs: Vec<BufId> = (1000..1000 + burst as u32).collect();
        let mut out = [Cqe::default(); 32];
        g.throughput(Throughput::Elements(burst as u64));
        g.bench_function(format!("burst{burst}"), |bch| {
            bch.iter(|| {
                assert_eq!(a.post_send(black_box(&wrs)), burst);
                b.post_recv(&bufs);
                assert_eq!(b.poll(&mut out), burst);
                black_box(&out[..burst]);
                assert_eq!(a.poll(&mut out), burst);
            })
        });
    }
    g.finish();
}

/// RDMA write of 1 MiB into a peer's registered region.
fn rdma_write_1mib(c: &mut Criterion) {
    const LEN: u64 = 1 << 20;
    let (mut a, mut b) = pair();
    let ah = a.insert_addr(&b.addr()).unwrap();
    let local = a.register(LEN, Access::LOCAL).unwrap();
    a.region_mut(local.id).fill(0x5a);
    let remote = b.register(LEN, Access::REMOTE_WRITE).unwrap();
    let wr = RdmaWr {
        op: RdmaOp::Write { imm: None },
        ah,
        local: local.id,
        local_offset: 0,
        len: LEN,
        remote_addr: remote.addr,
        remote_key: remote.key,
        wr_id: 1,
    };
    let mut out = [Cqe::default(); 1];
    let mut g = c.benchmark_group("shm_rdma");
    g.throughput(Throughput::Bytes(LEN));
    g.bench_function("write_1MiB", |bch| {
        bch.iter(|| {
            assert_eq!(a.post_rdma(black_box(&[wr])), 1);
            assert_eq!(a.poll(&mut out), 1);
        })
    });
    g.finish();
    assert!(b.region(remote.id).iter().all(|&x| x == 0x5a));
}

criterion_group!(benches, ring_64b, rdma_write_1mib);
criterion_main!(benches);
