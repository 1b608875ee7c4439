//! The context an lcore runs with, and its poll loop.

use std::marker::PhantomData;

use crate::corelist::LcoreId;
use crate::idle::{IdleStrategy, Idler};
use crate::stats::{Accounting, LcoreStatsSnapshot, LoopCounts, StatsSlots, new_slots};
use crate::stop::StopFlag;
use crate::sys::Clock;

/// What one step of a poll loop did.
///
/// Steps usually return a `bool` (work done or not), which converts into this; `Done` is for
/// an lcore that has finished its own job (a benchmark's last iteration) without asking the
/// other lcores to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The step did work: its time counts as busy.
    Worked,
    /// The step found nothing to do: its time counts as idle, and the idle strategy waits.
    Idle,
    /// The step did work and this lcore's loop should end.
    Done,
}

impl From<bool> for Step {
    fn from(worked: bool) -> Self {
        if worked { Step::Worked } else { Step::Idle }
    }
}

/// What an lcore's code gets: its id, the stop flag, its statistics slot and its idle
/// strategy.
///
/// A context is created on the lcore's own thread and cannot leave it (it is neither `Send`
/// nor `Sync`), so its statistics have exactly one writer:
///
/// ```compile_fail
/// fn moves_to_another_thread<T: Send>() {}
/// moves_to_another_thread::<efapoll_lcores::LcoreCtx>();
/// ```
#[derive(Debug)]
pub struct LcoreCtx {
    lcore: LcoreId,
    index: usize,
    stop: StopFlag,
    slots: StatsSlots,
    idle: IdleStrategy,
    accounting: Accounting,
    clock: Clock,
    // Pins the context to the thread that made it (see the type's doc).
    _single_thread: PhantomData<*const ()>,
}

impl LcoreCtx {
    pub(crate) fn new(
        lcore: LcoreId,
        index: usize,
        stop: StopFlag,
        slots: StatsSlots,
        idle: IdleStrategy,
        accounting: Accounting,
    ) -> Self {
        let clock = Clock::new();
        Self { lcore, index, stop, slots, idle, accounting, clock, _single_thread: PhantomData }
    }

    /// A context outside any [`Lcores`](crate::Lcores) launch, for embedders that manage
    /// their own threads: the calling thread is not pinned, and the statistics are only
    /// readable through [`stats`](Self::stats).
    pub fn standalone(lcore: LcoreId, stop: StopFlag, idle: IdleStrategy) -> Self {
        Self::new(lcore, 0, stop, new_slots(1), idle, Accounting::default())
    }

    /// The core this lcore runs on.
    pub fn lcore_id(&self) -> LcoreId {
        self.lcore
    }

    /// This lcore's position in the core list (DPDK's lcore index): dense, from 0, for
    /// indexing per-lcore arrays.
    pub fn lcore_index(&self) -> usize {
        self.index
    }

    /// The stop flag shared by every lcore of the launch.
    pub fn stop_flag(&self) -> &StopFlag {
        &self.stop
    }

    /// Whether a stop was asked; loops written by hand should check it each iteration.
    #[inline]
    pub fn should_stop(&self) -> bool {
        self.stop.is_stopped()
    }

    /// What the poll loop does after an iteration without work.
    pub fn idle_strategy(&self) -> IdleStrategy {
        self.idle
    }

    /// What this lcore's poll loops count.
    pub fn accounting(&self) -> Accounting {
        self.accounting
    }

    /// Makes the next poll loops count `accounting`'s way.
    pub fn set_accounting(&mut self, accounting: Accounting) {
        self.accounting = accounting;
    }

    /// This lcore's counters so far, over every poll loop it ran.
    pub fn stats(&self) -> LcoreStatsSnapshot {
        self.slots[self.index].snapshot(self.lcore)
    }

    /// Runs `step` over and over until the stop flag is raised or a step returns
    /// [`Step::Done`], and returns the counters of this run alone.
    ///
    /// Each step returns whether it did work (a `bool` or a [`Step`]). With
    /// [`Accounting::Cycles`] (the default) the loop reads the cycle counter once per
    /// iteration and charges the ticks since the previous reading to busy or idle, so the idle
    /// strategy's waiting counts as idle; with [`Accounting::Iterations`] it reads no clock and
    /// counts iterations alone. The counters are published every iteration for the main lcore
    /// to read.
    pub fn run_until_stopped<S: Into<Step>>(
        &mut self,
        mut step: impl FnMut() -> S,
    ) -> LcoreStatsSnapshot {
        let slot = &*self.slots[self.index];
        let start = slot.load();
        let mut counts = start;
        let mut idler = Idler::new(self.idle);
        // One loop for both ways of counting, so that the step is inlined into it once.
        let cycles = self.accounting == Accounting::Cycles;
        let mut last_tick = if cycles { self.clock.now() } else { 0 };
        while !self.stop.is_stopped() {
            let outcome = step().into();
            counts.iterations += 1;
            let idle = outcome == Step::Idle;
            if idle {
                idler.idle();
            } else {
                idler.reset();
                counts.busy_iterations += 1;
            }
            if cycles {
                let now = self.clock.now();
                // Saturating: an unpinned (standalone) thread may move to a core whose TSC
                // is slightly behind.
                let ticks = now.saturating_sub(last_tick);
                last_tick = now;
                if idle {
                    counts.idle_cycles += ticks;
                } else {
                    counts.busy_cycles += ticks;
                }
            }
            slot.publish(&counts);
            if outcome == Step::Done {
                break;
            }
        }
        snapshot_between(self.lcore, &start, &counts)
    }
}

fn snapshot_between(lcore: LcoreId, start: &LoopCounts, end: &LoopCounts) -> LcoreStatsSnapshot {
    LcoreStatsSnapshot {
        lcore,
        iterations: end.iterations - start.iterations,
        busy_iterations: end.busy_iterations - start.busy_iterations,
        busy_cycles: end.busy_cycles - start.busy_cycles,
        idle_cycles: end.idle_cycles - start.idle_cycles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that raises the stop flag after `iterations` calls, reporting `worked` each time.
    fn stop_after(iterations: u64, stop: StopFlag, worked: bool) -> impl FnMut() -> bool {
        let mut calls = 0;
        move || {
            calls += 1;
            if calls == iterations {
                stop.stop();
            }
            worked
        }
    }

    /// A step that works every fourth call and raises the stop flag after `iterations`.
    fn every_fourth_busy(iterations: u64, stop: StopFlag) -> impl FnMut() -> bool {
        let mut calls = 0u64;
        move || {
            calls += 1;
            if calls == iterations {
                stop.stop();
            }
            calls.is_multiple_of(4)
        }
    }

    #[test]
    fn a_step_that_always_works_is_all_busy() {
        let stop = StopFlag::new();
        let mut ctx = LcoreCtx::standalone(0, stop.clone(), IdleStrategy::Spin);
        let run = ctx.run_until_stopped(stop_after(10_000, stop, true));
        assert_eq!(run.iterations, 10_000);
        assert_eq!(run.busy_iterations, 10_000);
        assert_eq!(run.idle_cycles, 0);
        assert!(run.busy_cycles > 0);
        assert_eq!(run.busy_percent(), 100.0);
        assert_eq!(ctx.stats(), run);
    }

    #[test]
    fn a_step_that_never_works_has_no_busy_cycles() {
        for idle in
            [IdleStrategy::Spin, IdleStrategy::Pause, IdleStrategy::Yield, IdleStrategy::Backoff]
        {
            let stop = StopFlag::new();
            let mut ctx = LcoreCtx::standalone(0, stop.clone(), idle);
            let run = ctx.run_until_stopped(stop_after(1_000, stop, false));
            assert_eq!(run.iterations, 1_000, "{idle}");
            assert_eq!(run.busy_iterations, 0, "{idle}");
            assert_eq!(run.busy_cycles, 0, "{idle}");
            assert!(run.idle_cycles > 0, "{idle}");
            assert_eq!(run.busy_percent(), 0.0, "{idle}");
        }
    }

    #[test]
    fn mixed_steps_split_iterations() {
        let stop = StopFlag::new();
        let mut ctx = LcoreCtx::standalone(3, stop.clone(), IdleStrategy::Spin);
        let run = ctx.run_until_stopped(every_fourth_busy(1_000, stop.clone()));
        assert_eq!(run.lcore, 3);
        assert_eq!(run.iterations, 1_000);
        assert_eq!(run.busy_iterations, 250);
        assert_eq!(run.idle_iterations(), 750);
    }

    #[test]
    fn done_ends_only_this_loop_and_counters_accumulate_across_runs() {
        let stop = StopFlag::new();
        let mut ctx = LcoreCtx::standalone(0, stop.clone(), IdleStrategy::Spin);
        for _ in 0..2 {
            let mut left = 5;
            let run = ctx.run_until_stopped(|| {
                left -= 1;
                if left == 0 { Step::Done } else { Step::Worked }
            });
            assert_eq!(run.iterations, 5);
            assert_eq!(run.busy_iterations, 5);
        }
        assert!(!stop.is_stopped());
        assert_eq!(ctx.stats().iterations, 10);
    }

    #[test]
    fn counting_iterations_reads_no_clock_and_leaves_the_cycles_alone() {
        let stop = StopFlag::new();
        let mut ctx = LcoreCtx::standalone(0, stop.clone(), IdleStrategy::Spin);
        let mut left = 100;
        let cycles = ctx.run_until_stopped(|| {
            left -= 1;
            if left == 0 { Step::Done } else { Step::Worked }
        });
        assert!(cycles.busy_cycles > 0);
        ctx.set_accounting(Accounting::Iterations);
        assert_eq!(ctx.accounting(), Accounting::Iterations);
        let run = ctx.run_until_stopped(every_fourth_busy(1_000, stop.clone()));
        assert_eq!((run.iterations, run.busy_iterations), (1_000, 250));
        assert_eq!((run.busy_cycles, run.idle_cycles), (0, 0));
        let total = ctx.stats();
        assert_eq!((total.iterations, total.busy_iterations), (1_100, 350));
        assert_eq!(total.busy_cycles, cycles.busy_cycles);
        assert_eq!(total.idle_cycles, cycles.idle_cycles);
    }

    #[test]
    fn a_raised_flag_runs_no_step() {
        let stop = StopFlag::new();
        stop.stop();
        let mut ctx = LcoreCtx::standalone(0, stop, IdleStrategy::Spin);
        let run = ctx.run_until_stopped(|| -> bool { unreachable!("the loop must not step") });
        assert_eq!(run.iterations, 0);
    }
}
