//! Registered memory at the endpoint: a region in use cannot be
//! deregistered (on any device), an endpoint drains and closes, the
//! caller's own memory can be registered, and a domain's registration
//! serves every endpoint on it. With the `efa` feature, on the efa device
//! over softefa too (`*_on_efa`: the test runs again in a child with
//! softefa preloaded, see `common::softefa`).

use crate::common;

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use common::{Mem, World, span};
use efapoll::device::fault::Faults;
use efapoll::device::shm::{ShmConfig, ShmDevice, ShmDomain};
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::device::udp::{UdpConfig, UdpDevice, UdpDomain};
use efapoll::device::{Access, Device, DeviceError, Domain};
use efapoll::endpoint::{AtomicOp, Config, Datatype, Endpoint, Error, Op, Status};

/// Steps a pair of endpoints on any device until `cond` holds.
fn drive<D: Device>(
    eps: &mut [Endpoint<D>; 2],
    done: &mut [Vec<efapoll::endpoint::Completion>; 2],
    mut cond: impl FnMut(&[Vec<efapoll::endpoint::Completion>; 2]) -> bool,
) {
    for _ in 0..1_000_000 {
        if cond(done) {
            return;
        }
        for (ep, d) in eps.iter_mut().zip(done.iter_mut()) {
            ep.progress();
            while let Some(c) = ep.poll_cq() {
                d.push(c);
            }
        }
    }
    panic!("condition not reached: {done:?}");
}

/// A posted receive holds its region; the packet that later lands in it
/// lands whole, and the region deregisters once the receive completed.
/// The same for a long-read: the sender's source and the receiver's
/// buffer are both busy until the transfer is over.
fn busy_regions_refuse_deregistration<D: Device>(mut eps: [Endpoint<D>; 2]) {
    let mut done = [Vec::new(), Vec::new()];
    let to_b = eps[0].insert_peer(&eps[1].addr()).unwrap();
    let len = 200_000u64;
    let src = eps[0].register(len, Access::REMOTE_READ).unwrap();
    let dst = eps[1].register(len, Access::REMOTE_WRITE).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    eps[0].write_mem(src.id, 0, &bytes).unwrap();

    // A small message into a posted receive.
    eps[1].recv(span(&dst, 0, 64), None, 1).unwrap();
    assert_eq!(eps[1].deregister(dst.id), Err(Error::Busy), "a posted receive uses it");
    eps[0].send(to_b, span(&src, 0, 64), 2).unwrap();
    drive(&mut eps, &mut done, |d| d[1].iter().any(|c| c.ctx == 1));
    assert_eq!(eps[1].mem(dst.id)[..64], bytes[..64], "landed whole");

    // A large message: long-read with on-host thresholds, long-CTS or
    // medium with the provider's, each holding both regions meanwhile.
    eps[1].recv(span(&dst, 0, len), None, 3).unwrap();
    eps[0].send(to_b, span(&src, 0, len), 4).unwrap();
    eps[0].flush();
    assert_eq!(eps[0].deregister(src.id), Err(Error::Busy), "the send reads it");
    assert_eq!(eps[1].deregister(dst.id), Err(Error::Busy), "the receive writes it");
    drive(&mut eps, &mut done, |d| {
        d[1].iter().any(|c| c.ctx == 3) && d[0].iter().any(|c| c.ctx == 4)
    });
    let recv = done[1].iter().find(|c| c.ctx == 3).unwrap();
    assert_eq!((recv.op, recv.status, recv.len), (Op::Recv, Status::Ok, len));
    assert!(eps[1].mem(dst.id) == bytes, "byte-exact");

    // Everything is over: both deregister, and the handles are gone.
    while !eps[0].drain() || !eps[1].drain() {}
    assert_eq!(eps[0].deregister(src.id), Ok(()));
    assert_eq!(eps[1].deregister(dst.id), Ok(()));
    assert_eq!(eps[1].deregister(dst.id), Err(Error::BadSpan), "already gone");
    let mut b = [0u8; 1];
    assert_eq!(eps[1].read_mem(dst.id, 0, &mut b), Err(Error::BadSpan));
}

#[test]
fn a_region_in_use_is_busy_on_sim() {
    for cfg in [Config::default(), Config::on_host()] {
        let w = World::pair(SimConfig::default(), cfg);
        let [a, b]: [_; 2] = w.eps.try_into().unwrap();
        busy_regions_refuse_deregistration([a, b]);
    }
}

#[test]
fn a_region_in_use_is_busy_on_shm() {
    let dev = || ShmDevice::new(ShmConfig { bufs: 512, ..ShmConfig::default() }).unwrap();
    for cfg in [Config::default(), Config::on_host()] {
        let eps = [Endpoint::new(dev(), cfg).unwrap(), Endpoint::new(dev(), cfg).unwrap()];
        busy_regions_refuse_deregistration(eps);
    }
}

#[test]
fn a_region_in_use_is_busy_on_udp() {
    let dev = || UdpDevice::new(UdpConfig::default()).unwrap();
    for cfg in [Config::default(), Config::on_host()] {
        let eps = [Endpoint::new(dev(), cfg).unwrap(), Endpoint::new(dev(), cfg).unwrap()];
        busy_regions_refuse_deregistration(eps);
    }
}

#[test]
fn an_eager_send_gathering_from_a_region_holds_it_until_it_completes() {
    // No receive buffer at the peer: the packet waits in the fabric, and
    // its payload is still read from the sender's region.
    let mut w = World::pair(SimConfig::default(), Config::default());
    let to_b = w.connect(0, 1);
    let src = w.register(0, 4096);
    let dst = w.register(1, 4096);
    w.fill(0, &src, 9);
    w.eps[0].send(to_b, span(&src, 0, 4000), 1).unwrap();
    w.eps[0].flush();
    assert_eq!(w.eps[0].deregister(src.id), Err(Error::Busy));
    w.eps[1].recv(span(&dst, 0, 4096), None, 2).unwrap();
    w.drive_until(1000, |w| w.done[0].iter().any(|c| c.ctx == 1));
    assert_eq!(w.eps[1].mem(dst.id)[..4000], w.eps[0].mem(src.id)[..4000]);
    assert_eq!(w.eps[0].deregister(src.id), Ok(()));
}

#[test]
fn drain_says_when_nothing_is_in_flight_and_close_gives_the_device_back() {
    let mut w = World::pair(
        SimConfig { faults: Faults::reorder(1, 4), ..SimConfig::default() },
        Config::default(),
    );
    let to_b = w.connect(0, 1);
    let src = w.register(0, 1 << 20);
    let dst = w.register(1, 1 << 20);
    assert!(w.eps[0].in_flight().is_idle(), "a new endpoint is idle");
    w.eps[1].recv(span(&dst, 0, 1 << 20), None, 1).unwrap();
    assert!(w.eps[1].in_flight().is_idle(), "a posted receive is not in flight");
    w.eps[0].send(to_b, span(&src, 0, 1 << 20), 2).unwrap();
    let busy = w.eps[0].in_flight();
    assert_eq!(busy.sends, 1, "{busy:?}");
    assert!(!w.eps[0].drain(), "a 1 MiB send is not over at once");
    // An endpoint still busy comes back from close, to drain further.
    let a = w.eps.remove(0);
    let mut a = a.close().expect_err("busy");
    let mut rounds = 0;
    while !a.drain() {
        w.eps[0].progress();
        rounds += 1;
        assert!(rounds < 100_000, "drained");
    }
    assert!(a.in_flight().is_idle());
    let c = a.poll_cq().expect("the send's completion");
    assert_eq!((c.op, c.ctx, c.status), (Op::Send, 2, Status::Ok));
    let dev = a.close().expect("idle");
    assert_eq!(dev.fabric().pending_total(), 0, "nothing left in the fabric");
}

/// Two endpoints step until `cond` holds, collecting completions.
/// Bounded by time, not by steps: a condition may wait for an endpoint's
/// timeout (a read no peer answers), which a fast machine's steps outrun.
fn drive_pair<D: Device>(
    a: &mut Endpoint<D>,
    b: &mut Endpoint<D>,
    done: &mut Vec<efapoll::endpoint::Completion>,
    mut cond: impl FnMut(&Endpoint<D>, &Endpoint<D>, &[efapoll::endpoint::Completion]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if cond(a, b, done) {
            return;
        }
        for ep in [&mut *a, &mut *b] {
            ep.progress();
            while let Some(c) = ep.poll_cq() {
                done.push(c);
            }
        }
    }
    panic!("condition not reached: {done:?}");
}

/// `a`'s completion `ctx`, once it came, checked to be a success.
fn completed(done: &[efapoll::endpoint::Completion], ctx: u64) -> bool {
    done.iter().find(|c| c.ctx == ctx).is_some_and(|c| {
        assert_eq!(c.status, Status::Ok, "{c:?}");
        true
    })
}

/// Memory the caller owns, registered on a domain (as `fi_mr_reg`), is
/// what every operation reads and writes: a send into a receive, a write,
/// a read and a fetching atomic, each over the emulated protocols and the
/// device's RDMA. Once deregistered, the caller's own arena holds the
/// results.
fn caller_owned_memory_serves_every_operation<Dm: Domain>(dom_a: Dm, dom_b: Dm, rdma: bool) {
    const LEN: usize = 1 << 19;
    {
        // The caller's arenas, 8-byte aligned for the atomic.
        let mut arena_a = vec![0u64; LEN / 8].into_boxed_slice();
        let mut arena_b = vec![0u64; LEN / 8].into_boxed_slice();
        let sent: Vec<u8> = (0..LEN).map(|i| common::pattern(5, i as u64)).collect();
        for (w, chunk) in arena_a.iter_mut().zip(sent.chunks_exact(8)) {
            *w = u64::from_ne_bytes(chunk.try_into().unwrap());
        }
        arena_b[LEN / 8 - 1] = 40;
        let rights = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let ptr = |arena: &mut [u64]| NonNull::new(arena.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: each arena outlives its registration (deregistered below,
        // before the arena is read or dropped) and is reached meanwhile
        // only through the endpoints' copies.
        let (mra, mrb) = unsafe {
            (
                dom_a.register_external(ptr(&mut arena_a), LEN as u64, rights).unwrap(),
                dom_b.register_external(ptr(&mut arena_b), LEN as u64, rights).unwrap(),
            )
        };
        assert_eq!(mra.addr, arena_a.as_ptr() as u64, "the caller's memory, not a copy");
        let cfg = Config { handshake_on_insert: true, ..Config::default() };
        let mut a = Endpoint::new(dom_a.device().unwrap(), cfg).unwrap();
        let mut b = Endpoint::new(dom_b.device().unwrap(), cfg).unwrap();
        assert!(a.caps().external_memory);
        a.attach(&mra).unwrap();
        b.attach(&mrb).unwrap();
        let to_b = a.insert_peer(&b.addr()).unwrap();
        let to_a = b.insert_peer(&a.addr()).unwrap();
        let mut done = Vec::new();
        drive_pair(&mut a, &mut b, &mut done, |a, b, _| {
            a.peer_handshake_received(to_b) && b.peer_handshake_received(to_a)
        });

        // A small and a large message into b's arena.
        b.recv(span(&mrb, 0, 1000), None, 1).unwrap();
        b.recv(span(&mrb, 1000, 200_000), None, 2).unwrap();
        a.send(to_b, span(&mra, 0, 1000), 3).unwrap();
        a.send(to_b, span(&mra, 1000, 200_000), 4).unwrap();
        drive_pair(&mut a, &mut b, &mut done, |_, _, d| (1..=4).all(|c| completed(d, c)));
        // A write of 100 KB into b's arena, a read of 150 KB of it back.
        let (w_at, r_at) = (300_000u64, 400_000u64);
        a.write(to_b, span(&mra, w_at, 100_000), common::iov(&mrb, w_at, 100_000), 5).unwrap();
        drive_pair(&mut a, &mut b, &mut done, |_, _, d| completed(d, 5));
        a.read(to_b, span(&mra, r_at, 110_000), common::iov(&mrb, 0, 110_000), 6).unwrap();
        // A fetch-add of 2 to b's last word, the old value into a's arena.
        let (operand, result) = (LEN as u64 - 16, LEN as u64 - 8);
        a.write_mem(mra.id, operand, &2u64.to_ne_bytes()).unwrap();
        let target = common::iov(&mrb, LEN as u64 - 8, 8);
        let (op, dt) = (AtomicOp::Sum, Datatype::Uint64);
        let (src, dst) = (span(&mra, operand, 8), span(&mra, result, 8));
        a.fetch_atomic(to_b, op, dt, src, dst, target, 7).unwrap();
        drive_pair(&mut a, &mut b, &mut done, |_, _, d| completed(d, 6) && completed(d, 7));

        // Detached from both endpoints, ended at both domains: the
        // arenas are the caller's again.
        while !a.drain() || !b.drain() {}
        assert_eq!(dom_a.deregister(&mra), Err(DeviceError::Busy), "an endpoint uses it");
        a.deregister(mra.id).unwrap();
        b.deregister(mrb.id).unwrap();
        dom_a.deregister(&mra).unwrap();
        dom_b.deregister(&mrb).unwrap();
        let bytes = |arena: &[u64]| arena.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<_>>();
        let (got_a, got_b) = (bytes(&arena_a), bytes(&arena_b));
        assert!(got_b[..201_000] == sent[..201_000], "both messages (rdma {rdma})");
        assert!(got_b[300_000..400_000] == sent[300_000..400_000], "the write");
        assert!(got_a[400_000..510_000] == sent[..110_000], "the read");
        assert_eq!(arena_b[LEN / 8 - 1], 42, "the atomic's sum");
        assert_eq!(&got_a[LEN - 8..], &40u64.to_ne_bytes(), "the atomic's old value");
    }
}

#[test]
fn caller_owned_memory_serves_every_operation_on_sim() {
    for rdma in [false, true] {
        let sim = SimConfig { rdma_read: rdma, rdma_write: rdma, ..SimConfig::default() };
        let fabric = SimFabric::new(sim);
        caller_owned_memory_serves_every_operation(fabric.domain(), fabric.domain(), rdma);
    }
}

#[test]
fn caller_owned_memory_serves_every_operation_on_udp() {
    for rdma in [false, true] {
        let udp = UdpConfig { rdma_read: rdma, rdma_write: rdma, ..UdpConfig::default() };
        caller_owned_memory_serves_every_operation(UdpDomain::new(udp), UdpDomain::new(udp), rdma);
    }
}

/// Registrations belong to the domain that every lcore's queue shares:
/// two endpoints on one domain use one region, which a peer reaches with
/// one key through either of them; the domain keeps it while either
/// endpoint uses it.
fn one_registration_serves_two_endpoints<Dm: Domain>(shared: Dm, other: Dm::Device, cfg: Config) {
    let mr = shared.register(4096, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    let cfg = Config { handshake_on_insert: true, ..cfg };
    let mut lcore1 = Endpoint::new(shared.device().unwrap(), cfg).unwrap();
    let mut lcore2 = Endpoint::new(shared.device().unwrap(), cfg).unwrap();
    assert_eq!(lcore1.read_mem(mr.id, 0, &mut [0]), Err(Error::BadSpan), "not attached yet");
    lcore1.attach(&mr).unwrap();
    lcore2.attach(&mr).unwrap();
    let mut peer = Endpoint::new(other, cfg).unwrap();
    let local = peer.register(64, Access::empty()).unwrap();

    // What one lcore writes, a peer reads through the other's address.
    lcore1.write_mem(mr.id, 0, b"from lcore 1").unwrap();
    let to_2 = peer.insert_peer(&lcore2.addr()).unwrap();
    let mut done = Vec::new();
    drive_pair(&mut peer, &mut lcore2, &mut done, |p, _, _| p.peer_handshake_received(to_2));
    peer.read(to_2, span(&local, 0, 12), common::iov(&mr, 0, 12), 1).unwrap();
    drive_pair(&mut peer, &mut lcore2, &mut done, |_, _, d| completed(d, 1));
    assert_eq!(&peer.mem(local.id)[..12], b"from lcore 1");

    // What the peer writes through the first lcore, the second sees.
    let to_1 = peer.insert_peer(&lcore1.addr()).unwrap();
    drive_pair(&mut peer, &mut lcore1, &mut done, |p, _, _| p.peer_handshake_received(to_1));
    peer.write_mem(local.id, 0, b"from the peer").unwrap();
    peer.write(to_1, span(&local, 0, 13), common::iov(&mr, 100, 13), 2).unwrap();
    drive_pair(&mut peer, &mut lcore1, &mut done, |_, _, d| completed(d, 2));
    let mut got = [0u8; 13];
    lcore2.read_mem(mr.id, 100, &mut got).unwrap();
    assert_eq!(&got, b"from the peer");

    // The domain holds it until both detached and it is deregistered.
    assert_eq!(shared.deregister(&mr), Err(DeviceError::Busy));
    lcore1.deregister(mr.id).unwrap();
    assert_eq!(lcore1.read_mem(mr.id, 0, &mut [0]), Err(Error::BadSpan), "detached");
    assert_eq!(shared.deregister(&mr), Err(DeviceError::Busy), "the second still uses it");
    lcore2.read_mem(mr.id, 0, &mut got[..12]).unwrap();
    assert_eq!(&got[..12], b"from lcore 1");
    // A device may hold the region until the peer acknowledged the last
    // byte of the read it served (udp does, as a NIC would): Busy, then Ok.
    let mut busy = 0;
    while let Err(e) = lcore2.deregister(mr.id) {
        assert_eq!(e, Error::Busy);
        busy += 1;
        assert!(busy < 1_000_000, "still busy");
        peer.progress();
        lcore2.progress();
    }
    shared.deregister(&mr).unwrap();
    assert_eq!(lcore2.attach(&mr), Err(Error::Device(DeviceError::UnknownHandle)), "gone");
    // A peer's access now fails: the region is gone for it too.
    peer.read(to_2, span(&local, 0, 12), common::iov(&mr, 0, 12), 3).unwrap();
    drive_pair(&mut peer, &mut lcore2, &mut done, |_, _, d| d.iter().any(|c| c.ctx == 3));
    let c = done.iter().find(|c| c.ctx == 3).unwrap();
    assert_ne!(c.status, Status::Ok, "{c:?}");
}

#[test]
fn two_endpoints_on_one_domain_use_one_registration_on_sim() {
    let fabric = SimFabric::new(SimConfig::default());
    one_registration_serves_two_endpoints(fabric.domain(), fabric.device(), Config::default());
}

#[test]
fn two_endpoints_on_one_domain_use_one_registration_on_shm() {
    let cfg = ShmConfig { bufs: 512, ..ShmConfig::default() };
    let other = ShmDevice::new(cfg).unwrap();
    one_registration_serves_two_endpoints(ShmDomain::new(cfg), other, Config::on_host());
}

#[test]
fn two_endpoints_on_one_domain_use_one_registration_on_udp() {
    let cfg = UdpConfig::default();
    let other = UdpDevice::new(cfg).unwrap();
    one_registration_serves_two_endpoints(UdpDomain::new(cfg), other, Config::default());
}

/// A shm domain is shared by lcore threads: each makes its device from a
/// clone and uses the one registration.
#[test]
fn lcore_threads_make_their_devices_from_one_shm_domain() {
    let domain = ShmDomain::new(ShmConfig { bufs: 256, ..ShmConfig::default() });
    let mr = domain.register(64, Access::REMOTE_READ).unwrap();
    let lcores: Vec<_> = (0..2u8)
        .map(|i| {
            let domain = domain.clone();
            std::thread::spawn(move || {
                let mut ep = Endpoint::new(domain.device().unwrap(), Config::on_host()).unwrap();
                ep.attach(&mr).unwrap();
                ep.write_mem(mr.id, i as u64, &[i + 1]).unwrap();
                ep.deregister(mr.id).unwrap();
                ep.addr()
            })
        })
        .collect();
    let addrs: Vec<_> = lcores.into_iter().map(|t| t.join().unwrap()).collect();
    assert_ne!(addrs[0], addrs[1], "a queue pair each");
    let mut check = Endpoint::new(domain.device().unwrap(), Config::on_host()).unwrap();
    check.attach(&mr).unwrap();
    let mut got = [0u8; 2];
    check.read_mem(mr.id, 0, &mut got).unwrap();
    assert_eq!(got, [1, 2], "both wrote the one region");
    check.deregister(mr.id).unwrap();
    domain.deregister(&mr).unwrap();
}

#[cfg(feature = "efa")]
mod on_efa {
    use efapoll::device::efa::{EfaConfig, EfaDomain};

    use super::*;
    use crate::common::softefa;

    fn domain(rdma: bool) -> EfaDomain {
        softefa::configure(rdma, Faults::NONE);
        EfaDomain::open(EfaConfig::default()).expect("softefa's device")
    }

    #[test]
    fn a_region_in_use_is_busy_on_efa() {
        softefa::run(concat!(module_path!(), "::a_region_in_use_is_busy_on_efa"), || {
            for cfg in [Config::default(), Config::on_host()] {
                let dom = domain(true);
                let eps = [dom.device().unwrap(), dom.device().unwrap()];
                busy_regions_refuse_deregistration(eps.map(|d| Endpoint::new(d, cfg).unwrap()));
            }
        });
    }

    #[test]
    fn caller_owned_memory_serves_every_operation_on_efa() {
        softefa::run(
            concat!(module_path!(), "::caller_owned_memory_serves_every_operation_on_efa"),
            || {
                for rdma in [false, true] {
                    caller_owned_memory_serves_every_operation(domain(rdma), domain(rdma), rdma);
                }
            },
        );
    }

    /// With device RDMA the domain's last reference deregisters the MR
    /// while softefa's QP under the second lcore may still hold it for the
    /// read it served (until the reader, here idle, acknowledges its last
    /// byte): ibv_dereg_mr waits for that as a NIC finishes its DMA, and the
    /// region is gone at once after, as on EFA. Without, the read of the
    /// deregistered region is emulated and gets no answer (libfabric's
    /// provider answers none either): the reader times out, sooner here.
    #[test]
    fn two_endpoints_on_one_domain_use_one_registration_on_efa() {
        softefa::run(
            concat!(module_path!(), "::two_endpoints_on_one_domain_use_one_registration_on_efa"),
            || {
                for rdma in [true, false] {
                    let cfg =
                        Config { response_timeout: Duration::from_secs(1), ..Config::default() };
                    let other = domain(rdma).device().unwrap();
                    one_registration_serves_two_endpoints(domain(rdma), other, cfg);
                }
            },
        );
    }
}
