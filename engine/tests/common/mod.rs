//! A harness for endpoint tests on the sim device: endpoints on one
//! fabric, driven step by step on one thread.
#![allow(dead_code)]

#[cfg(feature = "efa")]
pub mod softefa;

use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::{Access, Device, Mr, MrId};
use efapoll::endpoint::{Completion, Config, Endpoint, PeerId, Span};
use efapoll::wire::RmaIov;

pub struct World {
    pub fabric: SimFabric,
    pub eps: Vec<Endpoint<SimDevice>>,
    /// Completions polled so far, per endpoint.
    pub done: Vec<Vec<Completion>>,
}

impl World {
    pub fn new(n: usize, sim: SimConfig, cfg: Config) -> World {
        let fabric = SimFabric::new(sim);
        let eps = (0..n).map(|_| Endpoint::new(fabric.device(), cfg).unwrap()).collect();
        World { fabric, eps, done: vec![Vec::new(); n] }
    }

    pub fn pair(sim: SimConfig, cfg: Config) -> World {
        World::new(2, sim, cfg)
    }

    /// Inserts endpoint `b`'s address at `a`.
    pub fn connect(&mut self, a: usize, b: usize) -> PeerId {
        let addr = self.eps[b].addr();
        self.eps[a].insert_peer(&addr).unwrap()
    }

    /// One round: every endpoint progresses once and its completions are
    /// collected. A round that did nothing moves virtual time to the next
    /// packet the wire's faults held back, if one is.
    pub fn step(&mut self) -> bool {
        let mut did = false;
        for (i, ep) in self.eps.iter_mut().enumerate() {
            did |= ep.progress();
            while let Some(c) = ep.poll_cq() {
                self.done[i].push(c);
                did = true;
            }
        }
        did || self.fabric.skip_to_next_due()
    }

    /// Steps until `cond` holds; panics after `max` rounds.
    pub fn drive_until(&mut self, max: usize, mut cond: impl FnMut(&World) -> bool) {
        for _ in 0..max {
            if cond(self) {
                return;
            }
            self.step();
        }
        if !cond(self) {
            for (i, ep) in self.eps.iter().enumerate().take(4) {
                eprintln!(
                    "endpoint {i}: {} completions, {:?}",
                    self.done[i].len(),
                    ep.counters().nonzero()
                );
            }
            panic!("condition not reached in {max} rounds");
        }
    }

    /// Steps until `cond` holds, on virtual time: a round in which nothing
    /// happened moves the fabric's clock by a millisecond, so operations
    /// waiting on a silent peer time out after as many idle rounds as
    /// their timeout has milliseconds, whatever the wall clock does.
    /// Panics once `limit` of virtual time has passed.
    pub fn drive_for(&mut self, limit: std::time::Duration, mut cond: impl FnMut(&World) -> bool) {
        let end = self.fabric.now_ns() + limit.as_nanos() as u64;
        while !cond(self) {
            if !self.step() && self.fabric.pending_total() == 0 {
                self.fabric.advance(std::time::Duration::from_millis(1));
            }
            if self.fabric.now_ns() > end {
                for (i, ep) in self.eps.iter().enumerate().take(4) {
                    eprintln!(
                        "endpoint {i}: {} completions, {:?}",
                        self.done[i].len(),
                        ep.counters().nonzero()
                    );
                }
                panic!("condition not reached in {limit:?} of virtual time");
            }
        }
    }

    /// Steps until nothing happens for a few rounds.
    pub fn settle(&mut self) {
        let mut quiet = 0;
        for _ in 0..1_000_000 {
            if self.step() || self.fabric.pending_total() > 0 {
                quiet = 0;
            } else {
                quiet += 1;
                if quiet > 3 {
                    return;
                }
            }
        }
        panic!("never settled");
    }

    pub fn register(&mut self, ep: usize, len: u64) -> Mr {
        self.eps[ep].register(len, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap()
    }

    /// Fills `mr` with a pattern seeded by `seed`.
    pub fn fill(&mut self, ep: usize, mr: &Mr, seed: u64) {
        let bytes: Vec<u8> = (0..mr.len).map(|i| pattern(seed, i)).collect();
        self.eps[ep].write_mem(mr.id, 0, &bytes).unwrap();
    }
}

/// A copy of a whole region (registered memory is reached only through
/// copies).
pub trait Mem {
    fn mem(&self, mr: MrId) -> Vec<u8>;
}

impl<D: Device> Mem for Endpoint<D> {
    fn mem(&self, mr: MrId) -> Vec<u8> {
        let mut out = vec![0; self.mr(mr).expect("registered").len as usize];
        self.read_mem(mr, 0, &mut out).unwrap();
        out
    }
}

pub fn pattern(seed: u64, i: u64) -> u8 {
    let x = (seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (x >> 56) as u8
}

pub fn span(mr: &Mr, offset: u64, len: u64) -> Span {
    Span::new(mr, offset, len)
}

/// The remote iov of `len` bytes of `mr` from `offset`.
pub fn iov(mr: &Mr, offset: u64, len: u64) -> RmaIov {
    RmaIov { addr: mr.addr_at(offset), len, key: mr.key }
}
