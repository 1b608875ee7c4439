//! The stop flag every poll loop honours, and the Ctrl-C/SIGTERM handler that raises it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A shared flag asking every lcore to leave its poll loop. Clones share one flag.
///
/// Raising it is sticky: nothing lowers it again, so a loop that saw it stops for good.
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A new, lowered flag.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every loop watching this flag to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether a stop was asked.
    #[inline]
    pub fn is_stopped(&self) -> bool {
        // Relaxed: the flag publishes no data, it only ends loops; joining the thread is what
        // orders the loop's results before whoever reads them.
        self.0.load(Ordering::Relaxed)
    }

    fn is_same(&self, other: &StopFlag) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the Ctrl-C/SIGTERM handler: {0}")]
pub struct SignalError(#[from] ctrlc::Error);

/// Exit status after a second Ctrl-C: 128 + SIGINT, what shells report for an interrupt.
const FORCED_EXIT_STATUS: i32 = 130;

struct SignalState {
    installed: bool,
    flags: Vec<StopFlag>,
}

static SIGNAL_STATE: Mutex<SignalState> =
    Mutex::new(SignalState { installed: false, flags: Vec::new() });
static SIGNALS_SEEN: AtomicUsize = AtomicUsize::new(0);

/// Raises `stop` on Ctrl-C, SIGTERM or SIGHUP.
///
/// Idempotent: the process-wide handler is installed once, and each distinct flag passed
/// here is raised by it (passing the same flag again changes nothing). The first signal
/// raises the flags so the loops wind down cleanly; a second one exits the process at once
/// with status 130, for when a loop does not stop.
///
/// Fails if something else in the process already installed a `ctrlc` handler.
pub fn install_ctrlc_handler(stop: &StopFlag) -> Result<(), SignalError> {
    // The handler runs on ctrlc's own thread, not in signal context, so a mutex is fine here.
    let mut state = SIGNAL_STATE.lock().unwrap_or_else(|e| e.into_inner());
    if !state.installed {
        ctrlc::set_handler(on_signal)?;
        state.installed = true;
    }
    if !state.flags.iter().any(|flag| flag.is_same(stop)) {
        state.flags.push(stop.clone());
    }
    Ok(())
}

fn on_signal() {
    if SIGNALS_SEEN.fetch_add(1, Ordering::Relaxed) > 0 {
        std::process::exit(FORCED_EXIT_STATUS);
    }
    let state = SIGNAL_STATE.lock().unwrap_or_else(|e| e.into_inner());
    for flag in &state.flags {
        flag.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_one_flag() {
        let stop = StopFlag::new();
        let other = stop.clone();
        assert!(!other.is_stopped());
        stop.stop();
        assert!(other.is_stopped());
        assert!(!StopFlag::new().is_stopped());
    }
}
