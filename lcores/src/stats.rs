//! Per-lcore poll-loop statistics: busy and idle cycles, iterations.
//!
//! Each lcore's counters sit on cache lines of their own (`CachePadded`), so one lcore's
//! writes never invalidate a line another lcore writes. Only the owning lcore writes them
//! (single writer: plain relaxed stores, no read-modify-write), and the main lcore reads them
//! to report utilisation. A snapshot reads the counters one by one, so it may mix values from
//! two neighbouring iterations; that is fine for reporting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::corelist::{CoreList, LcoreId};

/// What an lcore's poll loop counts.
///
/// Reading the cycle counter costs a few nanoseconds per iteration, on a virtual machine
/// more; a loop whose every nanosecond is latency (a pingpong, a trading path) may count
/// iterations alone, as DPDK's service cores count cycles only when their statistics are
/// enabled (`rte_service_set_stats_enable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accounting {
    /// Iterations and the ticks of busy and idle ones: one cycle-counter read per iteration.
    #[default]
    Cycles,
    /// Iterations and busy iterations only, no clock read: cycles stay as they were, so
    /// [`LcoreStatsSnapshot::busy_percent`] says nothing of such a run.
    Iterations,
}

/// One lcore's counters, written by that lcore only.
#[derive(Debug, Default)]
pub(crate) struct LcoreStats {
    iterations: AtomicU64,
    busy_iterations: AtomicU64,
    busy_cycles: AtomicU64,
    idle_cycles: AtomicU64,
}

/// The counters of every lcore of a launch, indexed by lcore index.
pub(crate) type StatsSlots = Arc<[CachePadded<LcoreStats>]>;

pub(crate) fn new_slots(count: usize) -> StatsSlots {
    (0..count).map(|_| CachePadded::default()).collect()
}

/// The counter values the poll loop keeps in registers and publishes each iteration.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LoopCounts {
    pub(crate) iterations: u64,
    pub(crate) busy_iterations: u64,
    pub(crate) busy_cycles: u64,
    pub(crate) idle_cycles: u64,
}

impl LcoreStats {
    /// Reads the counters; the writer uses this to resume counting where it left off.
    pub(crate) fn load(&self) -> LoopCounts {
        LoopCounts {
            iterations: self.iterations.load(Ordering::Relaxed),
            busy_iterations: self.busy_iterations.load(Ordering::Relaxed),
            busy_cycles: self.busy_cycles.load(Ordering::Relaxed),
            idle_cycles: self.idle_cycles.load(Ordering::Relaxed),
        }
    }

    /// Publishes the counters after an iteration.
    #[inline]
    pub(crate) fn publish(&self, counts: &LoopCounts) {
        self.iterations.store(counts.iterations, Ordering::Relaxed);
        self.busy_iterations.store(counts.busy_iterations, Ordering::Relaxed);
        self.busy_cycles.store(counts.busy_cycles, Ordering::Relaxed);
        self.idle_cycles.store(counts.idle_cycles, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, lcore: LcoreId) -> LcoreStatsSnapshot {
        let counts = self.load();
        LcoreStatsSnapshot {
            lcore,
            iterations: counts.iterations,
            busy_iterations: counts.busy_iterations,
            busy_cycles: counts.busy_cycles,
            idle_cycles: counts.idle_cycles,
        }
    }
}

/// An lcore's poll-loop counters at one moment.
///
/// Cycles are ticks of the loop's clock: TSC cycles on x86_64, nanoseconds elsewhere. An
/// iteration's ticks count as busy when its step did work, idle otherwise (including the
/// time the idle strategy spent waiting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LcoreStatsSnapshot {
    /// The lcore these counters belong to.
    pub lcore: LcoreId,
    /// Loop iterations (steps) run.
    pub iterations: u64,
    /// Iterations whose step did work.
    pub busy_iterations: u64,
    /// Ticks spent in iterations that did work.
    pub busy_cycles: u64,
    /// Ticks spent in iterations that did no work.
    pub idle_cycles: u64,
}

impl LcoreStatsSnapshot {
    /// Iterations whose step found no work.
    pub fn idle_iterations(&self) -> u64 {
        // Saturating: a snapshot taken mid-iteration may see the busy count already bumped
        // and the total not yet.
        self.iterations.saturating_sub(self.busy_iterations)
    }

    /// Busy plus idle ticks.
    pub fn total_cycles(&self) -> u64 {
        self.busy_cycles + self.idle_cycles
    }

    /// Core utilisation: busy ticks over all ticks, in percent (0 before the first iteration).
    pub fn busy_percent(&self) -> f64 {
        match self.total_cycles() {
            0 => 0.0,
            total => 100.0 * self.busy_cycles as f64 / total as f64,
        }
    }

    /// The counts accumulated since `earlier` (a previous snapshot of the same lcore), for
    /// per-interval reports.
    pub fn since(&self, earlier: &LcoreStatsSnapshot) -> LcoreStatsSnapshot {
        LcoreStatsSnapshot {
            lcore: self.lcore,
            iterations: self.iterations.saturating_sub(earlier.iterations),
            busy_iterations: self.busy_iterations.saturating_sub(earlier.busy_iterations),
            busy_cycles: self.busy_cycles.saturating_sub(earlier.busy_cycles),
            idle_cycles: self.idle_cycles.saturating_sub(earlier.idle_cycles),
        }
    }
}

/// Read access to every lcore's counters, for the main lcore's reports.
///
/// Cheap to clone and `Send`, so it can move into the closure the main lcore runs.
#[derive(Debug, Clone)]
pub struct StatsReader {
    lcores: CoreList,
    slots: StatsSlots,
}

impl StatsReader {
    pub(crate) fn new(lcores: CoreList, slots: StatsSlots) -> Self {
        Self { lcores, slots }
    }

    /// The lcores whose counters this reads.
    pub fn lcores(&self) -> &CoreList {
        &self.lcores
    }

    /// The counters of `lcore`, if it is one of [`lcores`](Self::lcores).
    pub fn snapshot(&self, lcore: LcoreId) -> Option<LcoreStatsSnapshot> {
        let index = self.lcores.index_of(lcore)?;
        Some(self.slots[index].snapshot(lcore))
    }

    /// The counters of every lcore, in core order.
    pub fn snapshot_all(&self) -> Vec<LcoreStatsSnapshot> {
        self.lcores
            .iter()
            .zip(self.slots.iter())
            .map(|(lcore, slot)| slot.snapshot(lcore))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_percent_is_busy_over_total_cycles() {
        let snapshot = LcoreStatsSnapshot {
            lcore: 1,
            iterations: 10,
            busy_iterations: 4,
            busy_cycles: 300,
            idle_cycles: 100,
        };
        assert_eq!(snapshot.busy_percent(), 75.0);
        assert_eq!(snapshot.idle_iterations(), 6);
        assert_eq!(LcoreStatsSnapshot::default().busy_percent(), 0.0);
    }

    #[test]
    fn since_gives_the_interval() {
        let earlier = LcoreStatsSnapshot {
            lcore: 1,
            iterations: 10,
            busy_iterations: 4,
            busy_cycles: 300,
            idle_cycles: 100,
        };
        let later = LcoreStatsSnapshot {
            iterations: 30,
            busy_iterations: 4,
            busy_cycles: 300,
            idle_cycles: 500,
            ..earlier
        };
        let interval = later.since(&earlier);
        assert_eq!(interval.iterations, 20);
        assert_eq!(interval.busy_cycles, 0);
        assert_eq!(interval.busy_percent(), 0.0);
    }

    #[test]
    fn slots_sit_on_separate_cache_lines() {
        let slots = new_slots(2);
        let first = &*slots[0] as *const LcoreStats as usize;
        let second = &*slots[1] as *const LcoreStats as usize;
        assert!(second - first >= 64);
    }
}
