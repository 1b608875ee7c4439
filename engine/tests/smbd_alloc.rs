//! SMB Direct's hot path allocates nothing: after warm-up, thousands of
//! messages segmented, sent, checked and reassembled make no allocation
//! beyond what the endpoint makes (none, endpoint_alloc.rs shows).

use crate::common;

use common::span;
use efapoll::device::Access;
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::endpoint::{Config as EpConfig, Endpoint};
use efapoll::mem::allocations_on_this_thread;
use efapoll::ulp::smbd::{Config, Connection, Event, Params};

#[test]
fn the_steady_state_allocates_nothing() {
    let fabric = SimFabric::new(SimConfig::default());
    let mut eps = [
        Endpoint::new(fabric.device(), EpConfig::default()).unwrap(),
        Endpoint::new(fabric.device(), EpConfig::default()).unwrap(),
    ];
    let to =
        [eps[0].insert_peer(&eps[1].addr()).unwrap(), eps[1].insert_peer(&eps[0].addr()).unwrap()];
    // Few credits, so that stalls, requests for a response and empty
    // messages are part of the steady state.
    let params = Params::symmetric(1364, 1 << 20, 8);
    // 64-byte messages lent and given back, the others into buffers.
    let cfg = Config { lend_max: 100, ..Config::default() };
    let mut c: Vec<Connection> =
        (0..2).map(|i| Connection::new(&mut eps[i], to[i], params, cfg).unwrap()).collect();
    let sizes = [0u64, 64, 1340, 1341, 20_000];
    let src = eps[0].register(20_000, Access::empty()).unwrap();
    let dst = eps[1].register(20_000, Access::empty()).unwrap();
    let round = |eps: &mut [Endpoint<_>; 2], c: &mut Vec<Connection>, n: usize| {
        let (mut sent, mut got, mut want) = (0, 0, 0);
        for batch in (0..n).step_by(8) {
            for i in batch..batch + 8 {
                let len = sizes[i % sizes.len()];
                if len > 100 {
                    c[1].recv(&mut eps[1], span(&dst, 0, len), i as u64).unwrap();
                }
                want += (len > 0) as usize;
                c[0].send(&mut eps[0], span(&src, 0, len), None, i as u64).unwrap();
            }
            while sent < batch + 8 || got < want {
                for i in 0..2 {
                    eps[i].progress();
                    while let Some(comp) = eps[i].poll_cq() {
                        assert!(c[i].handle_completion(&mut eps[i], &comp));
                    }
                    c[i].progress(&mut eps[i]);
                    while let Some(e) = c[i].poll_event() {
                        match e {
                            Event::Sent { .. } => sent += 1,
                            Event::Received { .. } => got += 1,
                            Event::Lent { loan, .. } => {
                                c[i].give_back(loan).unwrap();
                                got += 1;
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                }
            }
        }
    };
    round(&mut eps, &mut c, 400);
    let before = allocations_on_this_thread();
    round(&mut eps, &mut c, 4000);
    assert_eq!(allocations_on_this_thread() - before, 0, "allocations in the steady state");
    let (a, b) = (c[0].stats(), c[1].stats());
    assert!(a.credit_stalls > 0 && b.empty_sent > 0, "credits were part of it: {a:?} {b:?}");
    assert_eq!(b.lent, 4400 / 5, "every 64-byte message lent: {b:?}");
}
