//! The steady state allocates nothing: after warm-up, thousands of
//! messages of every protocol, with reordering, make no allocation.

mod common;

use common::span;
use efapoll::device::Access;
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::endpoint::{Config, Endpoint, TagMatch};
use efapoll::mem::{CountingAlloc, allocations_on_this_thread};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn steady_state_allocates_nothing() {
    let fabric = SimFabric::new(SimConfig { seed: 3, reorder_window: 8, ..SimConfig::default() });
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
