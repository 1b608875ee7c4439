//! What a poll loop does on an iteration that found no work.

use std::fmt;
use std::str::FromStr;

/// How an lcore waits after a step that did no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Poll again at once, as a DPDK poll loop does: lowest latency, the core stays at 100%.
    #[default]
    Spin,
    /// Poll again after a CPU spin hint (x86 PAUSE): kinder to a hyperthread sharing the core
    /// and to a slow link between cores, at the price of finding work that much later (what
    /// it costs and gains, measured: perf/README.md).
    Pause,
    /// Give the core to another runnable thread, if any: for shared or oversubscribed cores.
    Yield,
    /// Spin with exponentially more hints on each idle iteration, then yield; any work resets
    /// it. Low latency under load, polite when idle.
    Backoff,
}

impl IdleStrategy {
    /// The accepted spellings, in the order [`FromStr`] documents them.
    pub const NAMES: [&'static str; 4] = ["spin", "pause", "yield", "backoff"];

    /// The strategy's name as [`FromStr`] accepts it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Spin => "spin",
            Self::Pause => "pause",
            Self::Yield => "yield",
            Self::Backoff => "backoff",
        }
    }
}

impl fmt::Display for IdleStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An idle strategy name that is not one of `spin`, `pause`, `yield`, `backoff`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown idle strategy `{given}`; expected one of: spin, pause, yield, backoff")]
pub struct UnknownIdleStrategy {
    /// The name as given.
    pub given: String,
}

impl FromStr for IdleStrategy {
    type Err = UnknownIdleStrategy;

    /// Parses `spin`, `pause`, `yield` or `backoff`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "spin" => Ok(Self::Spin),
            "pause" => Ok(Self::Pause),
            "yield" => Ok(Self::Yield),
            "backoff" => Ok(Self::Backoff),
            _ => Err(UnknownIdleStrategy { given: name.into() }),
        }
    }
}

/// After this many doublings (2^6 = 64 spin hints) backoff yields instead of spinning more:
/// the same limit crossbeam's `Backoff` uses.
const BACKOFF_SPIN_LIMIT: u32 = 6;

/// An idle strategy with the state it keeps between iterations (the backoff step).
#[derive(Debug, Clone)]
pub(crate) struct Idler {
    strategy: IdleStrategy,
    backoff_step: u32,
}

impl Idler {
    pub(crate) fn new(strategy: IdleStrategy) -> Self {
        Self { strategy, backoff_step: 0 }
    }

    /// Waits once, after an iteration that did no work.
    #[inline]
    pub(crate) fn idle(&mut self) {
        match self.strategy {
            IdleStrategy::Spin => {}
            IdleStrategy::Pause => core::hint::spin_loop(),
            IdleStrategy::Yield => std::thread::yield_now(),
            IdleStrategy::Backoff => {
                if self.backoff_step <= BACKOFF_SPIN_LIMIT {
                    for _ in 0..1u32 << self.backoff_step {
                        core::hint::spin_loop();
                    }
                    self.backoff_step += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Forgets the backoff after an iteration that did work.
    #[inline]
    pub(crate) fn reset(&mut self) {
        self.backoff_step = 0;
    }

    #[cfg(test)]
    fn backoff_step(&self) -> u32 {
        self.backoff_step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for name in IdleStrategy::NAMES {
            let strategy: IdleStrategy = name.parse().unwrap();
            assert_eq!(strategy.to_string(), name);
        }
        assert_eq!(IdleStrategy::default(), IdleStrategy::Spin);
    }

    #[test]
    fn unknown_name_lists_the_accepted_ones() {
        let err = "sleep".parse::<IdleStrategy>().unwrap_err();
        assert_eq!(err.given, "sleep");
        let message = err.to_string();
        for name in IdleStrategy::NAMES {
            assert!(message.contains(name), "{message}");
        }
        assert!("Spin".parse::<IdleStrategy>().is_err());
    }

    #[test]
    fn backoff_grows_to_its_limit_and_resets_on_work() {
        let mut idler = Idler::new(IdleStrategy::Backoff);
        for _ in 0..20 {
            idler.idle();
        }
        assert_eq!(idler.backoff_step(), BACKOFF_SPIN_LIMIT + 1);
        idler.reset();
        assert_eq!(idler.backoff_step(), 0);
        idler.idle();
        assert_eq!(idler.backoff_step(), 1);
    }
}
