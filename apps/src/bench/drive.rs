//! Running sides in an lcore's poll loop.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use efapoll_lcores::{LcoreCtx, Step};

use super::{ActiveSide, Params, PassiveSide, Phase, RunError, Sample};

/// Idle steps between looks at the clock for the stall timeout: a clock
/// read per idle step would slow the poll loop for nothing.
const IDLE_STEPS_PER_CHECK: u32 = 4096;

/// Runs `step` in the lcore's poll loop until it says the phase is done;
/// returns the lcore's counters over the phase. An error, or `stall`
/// without any work, raises the launch's stop flag so the other lcores end
/// too.
pub fn run_phase(
    ctx: &mut LcoreCtx,
    stall: Duration,
    mut step: impl FnMut() -> Result<Phase, RunError>,
) -> Result<efapoll_lcores::LcoreStatsSnapshot, RunError> {
    let stop = ctx.stop_flag().clone();
    let mut outcome = None;
    let mut idle_steps = 0u32;
    let mut idle_since: Option<Instant> = None;
    let stats = ctx.run_until_stopped(|| match step() {
        Ok(Phase::Done) => {
            outcome = Some(Ok(()));
            Step::Done
        }
        Ok(Phase::Worked) => {
            idle_steps = 0;
            idle_since = None;
            Step::Worked
        }
        Ok(Phase::Idle) => {
            idle_steps = idle_steps.wrapping_add(1);
            if idle_steps.is_multiple_of(IDLE_STEPS_PER_CHECK) {
                let now = Instant::now();
                let since = *idle_since.get_or_insert(now);
                if now - since > stall {
                    let secs = stall.as_secs_f64();
                    let e = RunError::Timeout(format!("nothing moved for {secs} s"));
                    outcome = Some(Err(e));
                    stop.stop();
                    return Step::Done;
                }
            }
            Step::Idle
        }
        Err(e) => {
            outcome = Some(Err(e));
            stop.stop();
            Step::Done
        }
    });
    match outcome {
        Some(Ok(())) => Ok(stats),
        Some(Err(e)) => Err(e),
        None => Err(RunError::Stopped),
    }
}

/// A side that has nothing to do: the active side runs alone.
#[derive(Debug)]
pub struct Nobody;

impl PassiveSide for Nobody {
    fn step(&mut self) -> Result<bool, RunError> {
        Ok(false)
    }
    fn is_done(&self) -> bool {
        true
    }
}

/// Runs the active side through the plan, with `passive` stepped in the
/// same loop when both ends live in this thread (the sim device). Each
/// size's sample goes to `sink` as soon as it is measured.
pub fn drive_active<A: ActiveSide, P: PassiveSide>(
    ctx: &mut LcoreCtx,
    params: &Params,
    stall: Duration,
    active: &mut A,
    passive: &mut P,
    live: bool,
    sink: &mut dyn FnMut(usize, Sample) -> Result<(), RunError>,
) -> Result<(), RunError> {
    let mut line = LiveLine::new(live);
    for (k, &size) in params.sizes.iter().enumerate() {
        active.start(k);
        line.start(size);
        run_phase(ctx, stall, || both(active, passive, &mut line))?;
        active.start_measured();
        let stats = run_phase(ctx, stall, || both(active, passive, &mut line))?;
        line.clear();
        let sample = active.sample(stats.busy_percent());
        sink(k, sample)?;
    }
    run_phase(ctx, stall, || {
        let worked = passive.step()?;
        if passive.is_done() { Ok(Phase::Done) } else { Ok(worked.into()) }
    })?;
    Ok(())
}

// Always inlined: the poll loop's step, a call less per step.
#[inline(always)]
fn both<A: ActiveSide, P: PassiveSide>(
    active: &mut A,
    passive: &mut P,
    line: &mut LiveLine,
) -> Result<Phase, RunError> {
    let passive_worked = passive.step()?;
    let phase = active.step()?;
    line.tick(|| active.progress());
    Ok(match phase {
        Phase::Idle if passive_worked => Phase::Worked,
        p => p,
    })
}

/// Runs a passive side through the whole plan. A side that cannot see
/// the peer's traffic never stalls: it waits for the stop flag.
pub fn drive_passive<P: PassiveSide>(
    ctx: &mut LcoreCtx,
    stall: Duration,
    passive: &mut P,
) -> Result<(), RunError> {
    let stall = if passive.sees_traffic() { stall } else { Duration::MAX };
    run_phase(ctx, stall, || {
        let worked = passive.step()?;
        if passive.is_done() { Ok(Phase::Done) } else { Ok(worked.into()) }
    })?;
    Ok(())
}

/// Steps between looks at the clock for the progress line.
const STEPS_PER_TICK: u32 = 1 << 16;

/// The live progress line on stderr, while a size runs for more than a
/// second; only when stderr is a terminal.
#[derive(Debug)]
struct LiveLine {
    enabled: bool,
    steps: u32,
    size: u64,
    start: Instant,
    last: Option<Instant>,
}

impl LiveLine {
    fn new(wanted: bool) -> LiveLine {
        let enabled = wanted && std::io::stderr().is_terminal();
        LiveLine { enabled, steps: 0, size: 0, start: Instant::now(), last: None }
    }

    fn start(&mut self, size: u64) {
        self.size = size;
        self.start = Instant::now();
    }

    /// Counts a step; every [`STEPS_PER_TICK`] steps, shows the line if
    /// due. Inlined, what shows it not: this runs every step.
    #[inline(always)]
    fn tick(&mut self, progress: impl FnOnce() -> (u64, u64)) {
        if !self.enabled {
            return;
        }
        self.steps = self.steps.wrapping_add(1);
        if self.steps.is_multiple_of(STEPS_PER_TICK) {
            self.show(progress());
        }
    }

    /// Shows `(done, total)` if the size has run for over a second and
    /// the line was not just drawn.
    #[inline(never)]
    fn show(&mut self, (done, total): (u64, u64)) {
        let now = Instant::now();
        let due = now - self.start > Duration::from_secs(1)
            && self.last.is_none_or(|t| now - t > Duration::from_millis(250));
        if due {
            let secs = (now - self.start).as_secs();
            eprint!("\r\x1b[K  {} B: {done}/{total} ({secs} s)", self.size);
            let _ = std::io::stderr().flush();
            self.last = Some(now);
        }
    }

    fn clear(&mut self) {
        if self.last.take().is_some() {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }
}
