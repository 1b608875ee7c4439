//! The cycle counter the poll loop reads once per iteration.
//!
//! On x86_64 it is the time-stamp counter (`rdtsc`): one instruction, no system call, and
//! constant-rate on every CPU this engine targets. Elsewhere it is the monotonic clock in
//! nanoseconds. Either way only differences taken on one thread are meaningful, and busy
//! percentages are ratios of them, so the unit never matters.
#![allow(unsafe_code)]

/// Reads the cycle counter. The unit is "ticks": TSC cycles on x86_64, nanoseconds elsewhere.
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    #[cfg(not(target_arch = "x86_64"))]
    epoch: std::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(not(target_arch = "x86_64"))]
            epoch: std::time::Instant::now(),
        }
    }

    /// The current tick count.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        // SAFETY: rdtsc is part of the x86_64 baseline; it reads a counter and touches no
        // memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// The current tick count.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        // u64 nanoseconds last 584 years from the clock's creation.
        self.epoch.elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance() {
        let clock = Clock::new();
        let start = clock.now();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(clock.now() > start);
    }
}
