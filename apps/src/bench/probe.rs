//! How long a cache line takes from one CPU to another, looked at before
//! and after a run: a quiet machine with pinned cores keeps it, so a run
//! whose figure moved (a VM's vCPUs that changed host cores, another load
//! on the cores) is said to be suspect, as its wide spread would say.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use efapoll_lcores::{LcoreId, pin_current_thread};

/// Round trips of the line per measurement, and measurements (the median
/// is the figure): a few milliseconds in all even where a crossing takes
/// 200 ns.
const ROUND_TRIPS: u64 = 2000;
const ROUNDS: usize = 5;

/// The longest a look may take. Crossings make it a few milliseconds
/// even at 200 ns; a look past this times a scheduler, not a cache line:
/// the two threads did not run at once (another load on the CPUs, or a
/// tool that runs threads one at a time, as valgrind does, where it would
/// hold the run for minutes).
pub const BUDGET: Duration = Duration::from_millis(200);

/// Spins of a wait between looks at the clock: rare enough to leave a
/// crossing's time alone, often enough to keep to [`BUDGET`] when the
/// echo does not run.
const SPINS_PER_CLOCK: u64 = 1024;

/// An `after` more than this many times `before` (or less than its
/// inverse) is a move worth a warning: the VM's modes differ by 2.4x and
/// more, noise between two quiet looks by far less.
pub const MOVED: f64 = 1.5;

/// The line, alone on its 128 bytes (the adjacent-line prefetcher's
/// pair), and whether either thread gave up (it could not be pinned, or
/// the look ran out of time).
#[repr(align(128))]
struct Shared {
    line: AtomicU64,
    failed: AtomicBool,
}

/// The median one-way time between CPUs `a` and `b`, ns; `None` where a
/// thread cannot be pinned there, or the look takes longer than
/// [`BUDGET`].
pub fn one_way_ns(a: LcoreId, b: LcoreId) -> Option<f64> {
    one_way_within(a, b, BUDGET)
}

/// [`one_way_ns`], giving up after `budget`.
fn one_way_within(a: LcoreId, b: LcoreId, budget: Duration) -> Option<f64> {
    if a == b {
        return None;
    }
    let shared = Arc::new(Shared { line: AtomicU64::new(0), failed: AtomicBool::new(false) });
    let total = ROUND_TRIPS * ROUNDS as u64;
    let echo = {
        let s = shared.clone();
        std::thread::spawn(move || {
            if pin_current_thread(b).is_err() {
                s.failed.store(true, Ordering::Release);
                return;
            }
            // Each odd value is answered with the next even one.
            let mut want = 1;
            while want < 2 * total && !s.failed.load(Ordering::Relaxed) {
                if s.line.load(Ordering::Acquire) == want {
                    s.line.store(want + 1, Ordering::Release);
                    want += 2;
                }
                std::hint::spin_loop();
            }
        })
    };
    let s = shared;
    let times = std::thread::spawn(move || {
        if pin_current_thread(a).is_err() {
            s.failed.store(true, Ordering::Release);
            return None;
        }
        let deadline = Instant::now() + budget;
        // Out of time: the echo is told to stop too.
        let give_up = || {
            s.failed.store(true, Ordering::Release);
            None
        };
        let mut rounds = Vec::with_capacity(ROUNDS);
        let (mut next, mut spins) = (1, 0u64);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for _ in 0..ROUND_TRIPS {
                s.line.store(next, Ordering::Release);
                while s.line.load(Ordering::Acquire) != next + 1 {
                    if s.failed.load(Ordering::Relaxed) {
                        return None;
                    }
                    spins += 1;
                    if spins.is_multiple_of(SPINS_PER_CLOCK) && Instant::now() > deadline {
                        return give_up();
                    }
                    std::hint::spin_loop();
                }
                next += 2;
            }
            let end = Instant::now();
            if end > deadline {
                return give_up();
            }
            rounds.push((end - start).as_nanos() as f64 / (2 * ROUND_TRIPS) as f64);
        }
        Some(median(&mut rounds))
    })
    .join()
    .ok()
    .flatten();
    let _ = echo.join();
    times
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The look before a run and the one after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreToCore {
    pub cpus: (LcoreId, LcoreId),
    pub before_ns: f64,
    pub after_ns: Option<f64>,
}

impl CoreToCore {
    /// Looks before the run.
    pub fn before(cpus: (LcoreId, LcoreId)) -> Option<CoreToCore> {
        let before_ns = one_way_ns(cpus.0, cpus.1)?;
        Some(CoreToCore { cpus, before_ns, after_ns: None })
    }

    /// Looks again, after the run.
    pub fn after(self) -> CoreToCore {
        CoreToCore { after_ns: one_way_ns(self.cpus.0, self.cpus.1), ..self }
    }

    /// The warning when the two looks differ by more than [`MOVED`].
    pub fn warning(&self) -> Option<String> {
        let after = self.after_ns?;
        let ratio = after / self.before_ns;
        (!(1.0 / MOVED..=MOVED).contains(&ratio)).then(|| {
            format!(
                "warning: a cache line took {:.0} ns one way between CPUs {} and {} before the \
                 run and {after:.0} ns after it: the cores moved (a VM's vCPUs on other host \
                 cores) or another load ran, so this run's figures may mix both; compare runs \
                 that kept it",
                self.before_ns, self.cpus.0, self.cpus.1
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_beyond_the_bound_is_warned_of() {
        let look = |after| CoreToCore { cpus: (0, 1), before_ns: 40.0, after_ns: Some(after) };
        assert_eq!(look(50.0).warning(), None);
        assert_eq!(look(30.0).warning(), None);
        let w = look(200.0).warning().expect("a fivefold move");
        assert!(w.contains("40 ns") && w.contains("200 ns") && w.contains("CPUs 0 and 1"), "{w}");
        assert!(look(20.0).warning().is_some(), "faster by half is a move too");
        let unknown = CoreToCore { after_ns: None, ..look(40.0) };
        assert_eq!(unknown.warning(), None);
    }

    #[test]
    fn a_line_crosses_between_two_cpus_and_not_within_one() {
        let cores = efapoll_lcores::available_cores().unwrap();
        assert_eq!(one_way_ns(cores.as_slice()[0], cores.as_slice()[0]), None);
        if cores.len() >= 2 {
            // A budget a loaded test machine keeps to.
            let long = Duration::from_secs(60);
            let ns = one_way_within(cores.as_slice()[0], cores.as_slice()[1], long);
            let ns = ns.expect("two cores");
            assert!(ns > 0.0 && ns.is_finite(), "{ns}");
        }
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn a_look_past_its_budget_gives_up() {
        let cores = efapoll_lcores::available_cores().unwrap();
        let cores = cores.as_slice();
        if cores.len() >= 2 {
            // No round ends within no time: the look gives up, and returns
            // (its echo thread stopped and joined) rather than times.
            assert_eq!(one_way_within(cores[0], cores[1], Duration::ZERO), None);
        }
    }
}
