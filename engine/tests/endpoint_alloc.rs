//! The steady state allocates nothing: after warm-up, thousands of
//! messages of every protocol, with reordering, make no allocation.

use crate::common;

use common::span;
use efapoll::device::Access;
use efapoll::device::fault::Faults;
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::endpoint::{Config, Endpoint, TagMatch};
use efapoll::mem::allocations_on_this_thread;

#[test]
fn steady_state_allocates_nothing() {
    let fabric = SimFabric::new(SimConfig {
        seed: 3,
        faults: Faults::reorder(3, 8),
        ..SimConfig::default()
    });
    let mut a = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let mut b = Endpoint::new(fabric.device(), Config::default()).unwrap();
    let to_b = a.insert_peer(&b.addr()).unwrap();
    let sizes = [64u64, 20_000, 300_000];
    let src = a.register(300_000, Access::empty()).unwrap();
    let dst = b.register(300_000, Access::empty()).unwrap();
    // Eight messages in flight at a time, so that the window reorders
    // whole messages and not only segments.
    let round = |a: &mut Endpoint<_>, b: &mut Endpoint<_>, n: usize| {
        let (mut sent, mut got) = (0, 0);
        for batch in (0..n).step_by(8) {
            for i in batch..batch + 8 {
                let len = sizes[i % sizes.len()];
                let tag = TagMatch { tag: i as u64, ignore: 0 };
                b.trecv(span(&dst, 0, len), tag, None, i as u64).unwrap();
                a.tsend(to_b, span(&src, 0, len), i as u64, i as u64).unwrap();
            }
            while sent < batch + 8 || got < batch + 8 {
                a.progress();
                b.progress();
                while a.poll_cq().is_some() {
                    sent += 1;
                }
                while b.poll_cq().is_some() {
                    got += 1;
                }
            }
        }
    };
    // Warm-up: the handshake, the reorder buffer, hash tables reaching
    // their working size.
    round(&mut a, &mut b, 304);
    let before = allocations_on_this_thread();
    round(&mut a, &mut b, 3000);
    assert_eq!(allocations_on_this_thread() - before, 0, "allocations in the steady state");
    assert!(b.counters().reordered > 0, "reordering happened");
}

/// Operations that wait on their peer (atomics, emulated reads) are
/// watched by the response timer: a long stream of them, far more than
/// the endpoint holds at once, neither allocates nor grows the timer.
#[test]
fn watched_operations_allocate_nothing_in_the_steady_state() {
    use common::iov;
    use efapoll::endpoint::{AtomicOp, Datatype};
    let sim = SimConfig { rdma_read: false, rdma_write: false, ..SimConfig::default() };
    let fabric = SimFabric::new(sim);
    // Few operations at once, so that the stream outnumbers them many
    // times over; a timeout the stream never reaches.
    let cfg = Config {
        tx_ops: 64,
        rx_ops: 64,
        response_timeout: std::time::Duration::from_secs(60),
        ..Config::default()
    };
    let mut a = Endpoint::new(fabric.device(), cfg).unwrap();
    let mut b = Endpoint::new(fabric.device(), cfg).unwrap();
    let to_b = a.insert_peer(&b.addr()).unwrap();
    let local = a.register(4096, Access::empty()).unwrap();
    let target = b.register(4096, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    let mut done = 0u64;
    let mut run = |a: &mut Endpoint<_>, b: &mut Endpoint<_>, n: u64| {
        for i in 0..n {
            if i % 2 == 0 {
                let (operand, result) = (span(&local, 0, 8), span(&local, 8, 8));
                let remote = iov(&target, 0, 8);
                a.fetch_atomic(to_b, AtomicOp::Sum, Datatype::Uint64, operand, result, remote, i)
            } else {
                a.read(to_b, span(&local, 64, 1024), iov(&target, 64, 1024), i)
            }
            .unwrap_or_else(|e| panic!("op {i}: {e:?}"));
            loop {
                b.progress();
                a.progress();
                if let Some(c) = a.poll_cq() {
                    assert!(c.status.is_ok(), "{c:?}");
                    done += 1;
                    break;
                }
            }
        }
    };
    // Warm-up: the handshake (the first read asks for it) and every pool.
    while a.read(to_b, span(&local, 0, 8), iov(&target, 0, 8), 0).is_err() {
        a.progress();
        b.progress();
    }
    while a.poll_cq().is_none() {
        b.progress();
        a.progress();
    }
    run(&mut a, &mut b, 200);
    let before = allocations_on_this_thread();
    run(&mut a, &mut b, 20_000);
    assert_eq!(allocations_on_this_thread() - before, 0, "allocations in the steady state");
    assert_eq!(done, 20_200);
}
