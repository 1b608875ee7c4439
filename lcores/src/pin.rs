//! Pinning threads to cores through `core_affinity`.

use std::sync::OnceLock;

use crate::corelist::{CoreList, LcoreId};

/// Why a thread could not be pinned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// The operating system did not tell which cores this process may use.
    #[error("cannot read the cores this process may run on (CPU affinity is not supported here)")]
    AffinityUnavailable,
    /// The core is not one this process may run on.
    #[error("core {core} does not exist on this machine; the cores available are {available}")]
    NoSuchCore {
        /// The core asked for.
        core: LcoreId,
        /// The cores this process may run on.
        available: CoreList,
    },
    /// The operating system refused to pin the thread.
    #[error("the operating system refused to pin this thread to core {core}")]
    Refused {
        /// The core asked for.
        core: LcoreId,
    },
}

/// The cores this process may run on (its CPU affinity at first use, so cores excluded with
/// `taskset` or a cpuset are not listed).
///
/// The answer is read once and kept: `core_affinity` reads the *calling thread's* mask, which
/// shrinks to one core as soon as that thread is pinned, so asking again later would lie.
pub fn available_cores() -> Result<CoreList, PinError> {
    static AVAILABLE: OnceLock<Option<CoreList>> = OnceLock::new();
    AVAILABLE
        .get_or_init(|| {
            let ids = core_affinity::get_core_ids()?;
            CoreList::from_cores(ids.into_iter().map(|id| id.id)).ok()
        })
        .clone()
        .ok_or(PinError::AffinityUnavailable)
}

/// Checks that every core of `cores` is available, naming the first one that is not.
pub fn check_cores_exist(cores: &CoreList) -> Result<(), PinError> {
    let available = available_cores()?;
    match cores.iter().find(|&core| !available.contains(core)) {
        Some(core) => Err(PinError::NoSuchCore { core, available }),
        None => Ok(()),
    }
}

/// Pins the calling thread to `core`, after checking the core exists.
pub fn pin_current_thread(core: LcoreId) -> Result<(), PinError> {
    let available = available_cores()?;
    if !available.contains(core) {
        return Err(PinError::NoSuchCore { core, available });
    }
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(PinError::Refused { core })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corelist::MAX_LCORE_ID;

    #[test]
    fn available_cores_are_listed() {
        let available = available_cores().unwrap();
        assert!(!available.is_empty());
        check_cores_exist(&available).unwrap();
    }

    #[test]
    fn a_missing_core_is_named_with_the_cores_that_exist() {
        let available = available_cores().unwrap();
        let err = pin_current_thread(MAX_LCORE_ID).unwrap_err();
        assert_eq!(err, PinError::NoSuchCore { core: MAX_LCORE_ID, available: available.clone() });
        let message = err.to_string();
        assert!(message.contains("core 1023"), "{message}");
        assert!(message.contains(&available.to_string()), "{message}");

        let asked = CoreList::from_cores([available.main_lcore(), MAX_LCORE_ID]).unwrap();
        assert!(matches!(
            check_cores_exist(&asked),
            Err(PinError::NoSuchCore { core: MAX_LCORE_ID, .. })
        ));
    }

    #[test]
    fn pinning_to_an_existing_core_succeeds() {
        let core = available_cores().unwrap().main_lcore();
        // A thread of its own, so the test harness's thread keeps its mask.
        std::thread::spawn(move || pin_current_thread(core)).join().unwrap().unwrap();
    }
}
