//! How many measured iterations each size of a flow has.
//!
//! With `-I` (or its default) the counts are in the plan both sides were
//! given. With `-D` (duration mode) the active side ends each size when
//! its time is up, and the passive side, which follows the plan by itself,
//! must learn the count before the size's last message reaches it (it
//! posts each receive for the size it expects). So the active side
//! *announces* the count, waits until it is *confirmed* (at once when the
//! passive side runs in this process and shares these counts; across
//! processes once the peer's control thread has stored it and answered),
//! and only then sends what remains of the size.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;

use super::Params;
use super::oob::ToPeer;

/// A count not known yet.
pub const UNKNOWN: u64 = u64::MAX;

/// One flow's measured iterations per size, shared by the sides (and the
/// control thread) that need them.
#[derive(Debug)]
pub struct Counts {
    flow: usize,
    measured: Vec<AtomicU64>,
    confirmed: Vec<AtomicBool>,
    /// Across processes: where announcements go (the control link).
    to_peer: Option<mpsc::Sender<ToPeer>>,
}

impl Counts {
    /// The counts of flow `flow` of a run of `params`: its iterations, or
    /// in duration mode none known yet.
    pub fn new(params: &Params, flow: usize) -> Counts {
        let known = params.duration_ms.is_none();
        let measured = params
            .iterations
            .iter()
            .map(|&n| AtomicU64::new(if known { n } else { UNKNOWN }))
            .collect();
        let confirmed = params.sizes.iter().map(|_| AtomicBool::new(known)).collect();
        Counts { flow, measured, confirmed, to_peer: None }
    }

    /// The same, for a side whose peer is in another process: its
    /// announcements go over the control link.
    pub fn remote(params: &Params, flow: usize, to_peer: mpsc::Sender<ToPeer>) -> Counts {
        Counts { to_peer: Some(to_peer), ..Counts::new(params, flow) }
    }

    /// The measured iterations of size `k`, or [`UNKNOWN`].
    #[inline]
    pub fn measured(&self, k: usize) -> u64 {
        self.measured[k].load(Ordering::Acquire)
    }

    /// Warmup and measured iterations of size `k` of `params`, or
    /// [`UNKNOWN`].
    #[inline]
    pub fn total(&self, params: &Params, k: usize) -> u64 {
        match self.measured(k) {
            UNKNOWN => UNKNOWN,
            n => params.warmup_for(k) + n,
        }
    }

    /// The active side fixes size `k`'s count (duration mode).
    pub fn announce(&self, k: usize, n: u64) {
        self.measured[k].store(n, Ordering::Release);
        match &self.to_peer {
            Some(to_peer) => {
                // A peer gone is the control link's to report; the wait
                // for the confirmation ends with the run's stop.
                let _ = to_peer.send(ToPeer::Count { flow: self.flow, k, n });
            }
            None => self.confirmed[k].store(true, Ordering::Release),
        }
    }

    /// Whether the passive side knows size `k`'s count.
    #[inline]
    pub fn confirmed(&self, k: usize) -> bool {
        self.confirmed[k].load(Ordering::Acquire)
    }

    /// The peer's count of size `k`, as its control message gave it;
    /// false for a size beyond the plan.
    pub fn store(&self, k: usize, n: u64) -> bool {
        let Some(slot) = self.measured.get(k) else { return false };
        slot.store(n, Ordering::Release);
        self.confirmed[k].store(true, Ordering::Release);
        true
    }

    /// The peer confirmed size `k`'s count; false for a size beyond the
    /// plan.
    pub fn confirm(&self, k: usize) -> bool {
        let Some(flag) = self.confirmed.get(k) else { return false };
        flag.store(true, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(duration_ms: Option<u64>) -> Params {
        Params {
            app: "pingpong".into(),
            device: "sim".into(),
            op: "send".into(),
            sizes: vec![64, 4096],
            iterations: vec![100, 50],
            warmup: 10,
            window: 1,
            verify: false,
            flows: 1,
            duration_ms,
            prime: true,
        }
    }

    #[test]
    fn fixed_counts_are_known_and_confirmed_from_the_start() {
        let p = params(None);
        let c = Counts::new(&p, 0);
        assert_eq!((c.measured(0), c.measured(1)), (100, 50));
        assert!(c.confirmed(0) && c.confirmed(1));
        // The first size warms up over at least 4096 packets.
        assert_eq!(c.total(&p, 0), p.warmup_for(0) + 100);
        assert_eq!(c.total(&p, 1), 10 + 50);
    }

    #[test]
    fn in_one_process_an_announced_count_is_confirmed_at_once() {
        let p = params(Some(1000));
        let c = Counts::new(&p, 0);
        assert_eq!((c.measured(1), c.total(&p, 1)), (UNKNOWN, UNKNOWN));
        assert!(!c.confirmed(1));
        c.announce(1, 7);
        assert!(c.confirmed(1));
        assert_eq!(c.total(&p, 1), 17);
    }

    #[test]
    fn across_processes_a_count_waits_for_the_peer() {
        let p = params(Some(1000));
        let (tx, rx) = mpsc::channel();
        let active = Counts::remote(&p, 3, tx);
        active.announce(0, 42);
        assert!(!active.confirmed(0), "not before the peer has it");
        let Ok(ToPeer::Count { flow: 3, k: 0, n: 42 }) = rx.try_recv() else {
            panic!("the announcement goes to the control link")
        };
        // The peer's control thread stores it in its side's counts ...
        let passive = Counts::new(&p, 3);
        assert!(passive.store(0, 42));
        assert_eq!(passive.measured(0), 42);
        // ... and its answer confirms it here.
        assert!(active.confirm(0));
        assert!(active.confirmed(0));
        assert!(!passive.store(2, 1) && !active.confirm(2), "no size 2 in the plan");
    }
}
