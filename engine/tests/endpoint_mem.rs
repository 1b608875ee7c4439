//! Registered memory at the endpoint: a region in use cannot be
//! deregistered (on any device), and an endpoint drains and closes.

mod common;

use common::{Mem, World, span};
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::SimConfig;
use efapoll::device::{Access, Device};
use efapoll::endpoint::{Config, Endpoint, Error, Op, Status};

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
    let mut w =
        World::pair(SimConfig { reorder_window: 4, ..SimConfig::default() }, Config::default());
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
