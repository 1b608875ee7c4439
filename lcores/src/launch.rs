//! Launching work on pinned lcores and waiting for it, after DPDK's EAL
//! (`rte_eal_remote_launch`, `rte_eal_mp_wait_lcore`).
//!
//! The main lcore is the thread that built [`Lcores`]; it is pinned there and runs its own
//! work through [`Lcores::run_on_main`], typically printing the workers' statistics on a timer
//! while they poll. Every other lcore of the list is a worker: [`Lcores::remote_launch`] starts
//! a thread pinned to it, and [`Lcores::wait_all`] joins them.

use std::any::Any;
use std::thread::{self, JoinHandle};

use crate::corelist::{CoreList, LcoreId, LcoreMap};
use crate::ctx::LcoreCtx;
use crate::idle::IdleStrategy;
use crate::pin::{PinError, check_cores_exist, pin_current_thread};
use crate::stats::{Accounting, LcoreStatsSnapshot, StatsReader, StatsSlots, new_slots};
use crate::stop::StopFlag;

/// What a launch runs on: the cores, which one is main, how idle loops wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LcoresConfig {
    /// Every lcore of the launch, main included, and the CPU each runs on (DPDK's `-l`, or
    /// `--lcores` when lcores share CPUs).
    pub lcores: LcoreMap,
    /// The main lcore (DPDK's `--main-lcore`); `None` means the first core of the list.
    pub main_lcore: Option<LcoreId>,
    /// What poll loops do after an iteration without work.
    pub idle: IdleStrategy,
    /// What poll loops count (each lcore may change it: [`LcoreCtx::set_accounting`]).
    pub accounting: Accounting,
}

impl LcoresConfig {
    /// A configuration with the first core as main, the default (spinning) idle strategy and
    /// cycle accounting.
    pub fn new(lcores: impl Into<LcoreMap>) -> Self {
        Self {
            lcores: lcores.into(),
            main_lcore: None,
            idle: IdleStrategy::default(),
            accounting: Accounting::default(),
        }
    }
}

/// Why [`Lcores::new`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LcoresError {
    /// The requested main lcore is not in the core list.
    #[error("main lcore {main} is not in the core list {cores}")]
    MainNotInList {
        /// The requested main lcore.
        main: LcoreId,
        /// The core list.
        cores: CoreList,
    },
    /// A core does not exist, or the main thread could not be pinned.
    #[error(transparent)]
    Pin(#[from] PinError),
}

/// Why [`Lcores::remote_launch`] refused to start work.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The lcore is not in the core list.
    #[error("lcore {lcore} is not one of the launch's lcores {lcores}")]
    UnknownLcore {
        /// The lcore asked for.
        lcore: LcoreId,
        /// The launch's lcores.
        lcores: CoreList,
    },
    /// The main lcore runs on the calling thread, through [`Lcores::run_on_main`].
    #[error("lcore {lcore} is the main lcore; run its work with run_on_main")]
    MainLcore {
        /// The lcore asked for.
        lcore: LcoreId,
    },
    /// Work launched on the lcore earlier has not been waited for.
    #[error("lcore {lcore} is busy: wait for its current work first")]
    Busy {
        /// The lcore asked for.
        lcore: LcoreId,
    },
    /// The operating system could not start a thread.
    #[error("cannot start a thread for lcore {lcore}: {source}")]
    Spawn {
        /// The lcore asked for.
        lcore: LcoreId,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// Why an lcore's work produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LcoreError {
    /// The work panicked; the panic stopped at the lcore's thread.
    #[error("lcore {lcore} panicked: {message}")]
    Panicked {
        /// The lcore whose work panicked.
        lcore: LcoreId,
        /// The panic's message, when it was a string.
        message: String,
    },
    /// The worker thread could not be pinned to its core, so the work did not run.
    #[error("lcore {lcore} did not run: {source}")]
    Pin {
        /// The lcore that was launched.
        lcore: LcoreId,
        /// Why pinning failed.
        source: PinError,
    },
}

/// Where an lcore is in its launch cycle (DPDK's `rte_lcore_state_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LcoreState {
    /// Nothing launched: ready for [`Lcores::remote_launch`].
    Wait,
    /// Its work is running.
    Running,
    /// Its work returned (or panicked) and awaits [`Lcores::wait`].
    Finished,
}

/// A set of lcores: the main one (the calling thread) and workers to launch work on.
///
/// `R` is what worker functions return. Dropping an `Lcores` whose workers still run raises
/// the stop flag and joins them, so no pinned busy loop outlives it.
#[derive(Debug)]
pub struct Lcores<R: Send + 'static = ()> {
    cores: CoreList,
    /// The CPU of each lcore, by lcore index.
    cpus: Vec<LcoreId>,
    main: LcoreId,
    main_index: usize,
    idle: IdleStrategy,
    accounting: Accounting,
    stop: StopFlag,
    slots: StatsSlots,
    /// Indexed by lcore index; `Some` from launch until waited for.
    workers: Vec<Option<JoinHandle<Result<R, LcoreError>>>>,
}

impl<R: Send + 'static> Lcores<R> {
    /// Checks that every lcore's CPU exists on this machine and pins the calling thread to the
    /// main lcore's, as DPDK's EAL initialisation does.
    pub fn new(config: LcoresConfig) -> Result<Self, LcoresError> {
        let cores = config.lcores.lcores().clone();
        let main = config.main_lcore.unwrap_or(cores.main_lcore());
        let Some(main_cpu) = config.lcores.cpu_of(main) else {
            return Err(LcoresError::MainNotInList { main, cores });
        };
        check_cores_exist(&config.lcores.cpus())?;
        pin_current_thread(main_cpu)?;
        let count = cores.len();
        Ok(Self {
            main,
            main_index: cores.index_of(main).unwrap_or_default(),
            idle: config.idle,
            accounting: config.accounting,
            stop: StopFlag::new(),
            slots: new_slots(count),
            workers: (0..count).map(|_| None).collect(),
            cpus: cores.iter().filter_map(|l| config.lcores.cpu_of(l)).collect(),
            cores,
        })
    }

    /// Every lcore, main included.
    pub fn lcores(&self) -> &CoreList {
        &self.cores
    }

    /// The main lcore.
    pub fn main_lcore(&self) -> LcoreId {
        self.main
    }

    /// The lcores work can be launched on: every lcore but main, ascending.
    pub fn worker_lcores(&self) -> impl Iterator<Item = LcoreId> + '_ {
        self.cores.iter().filter(move |&lcore| lcore != self.main)
    }

    /// The stop flag every lcore's context carries; pass it to
    /// [`install_ctrlc_handler`](crate::install_ctrlc_handler) to stop on Ctrl-C.
    pub fn stop_flag(&self) -> &StopFlag {
        &self.stop
    }

    /// Raises the stop flag: every poll loop ends after its current step.
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// Starts `work` on a new thread pinned to `lcore`'s CPU (`rte_eal_remote_launch`).
    ///
    /// Refused for an lcore outside the list, for the main lcore, and for an lcore whose
    /// previous work was not waited for.
    pub fn remote_launch<F>(&mut self, lcore: LcoreId, work: F) -> Result<(), LaunchError>
    where
        F: FnOnce(&mut LcoreCtx) -> R + Send + 'static,
    {
        let Some(index) = self.cores.index_of(lcore) else {
            return Err(LaunchError::UnknownLcore { lcore, lcores: self.cores.clone() });
        };
        if lcore == self.main {
            return Err(LaunchError::MainLcore { lcore });
        }
        if self.workers[index].is_some() {
            return Err(LaunchError::Busy { lcore });
        }
        let (stop, slots) = (self.stop.clone(), self.slots.clone());
        let (idle, accounting) = (self.idle, self.accounting);
        let cpu = self.cpus[index];
        let handle = thread::Builder::new()
            .name(format!("lcore-{lcore}"))
            .spawn(move || {
                pin_current_thread(cpu).map_err(|source| LcoreError::Pin { lcore, source })?;
                let mut ctx = LcoreCtx::new(lcore, index, stop, slots, idle, accounting);
                Ok(work(&mut ctx))
            })
            .map_err(|source| LaunchError::Spawn { lcore, source })?;
        self.workers[index] = Some(handle);
        Ok(())
    }

    /// Runs `work` on the calling thread as the main lcore, pinned to it, with the main
    /// lcore's context.
    pub fn run_on_main<T>(&mut self, work: impl FnOnce(&mut LcoreCtx) -> T) -> Result<T, PinError> {
        // Pin again: this value may have moved to another thread since `new`.
        pin_current_thread(self.cpus[self.main_index])?;
        let mut ctx = LcoreCtx::new(
            self.main,
            self.main_index,
            self.stop.clone(),
            self.slots.clone(),
            self.idle,
            self.accounting,
        );
        Ok(work(&mut ctx))
    }

    /// Where `lcore` is in its launch cycle, or `None` if it is not in the list. The main
    /// lcore is always [`LcoreState::Wait`].
    pub fn state(&self, lcore: LcoreId) -> Option<LcoreState> {
        let index = self.cores.index_of(lcore)?;
        Some(match &self.workers[index] {
            None => LcoreState::Wait,
            Some(handle) if handle.is_finished() => LcoreState::Finished,
            Some(_) => LcoreState::Running,
        })
    }

    /// Waits for the work launched on `lcore` and returns its result, or `None` if nothing
    /// was launched there (`rte_eal_wait_lcore`). The lcore is then free for a new launch.
    pub fn wait(&mut self, lcore: LcoreId) -> Option<Result<R, LcoreError>> {
        let index = self.cores.index_of(lcore)?;
        let handle = self.workers[index].take()?;
        Some(join(lcore, handle))
    }

    /// Waits for every launched lcore and returns each one's result, in core order
    /// (`rte_eal_mp_wait_lcore`). A panic in an lcore's work is its result's error; it does
    /// not reach the caller.
    pub fn wait_all(&mut self) -> Vec<(LcoreId, Result<R, LcoreError>)> {
        let launched: Vec<LcoreId> = self
            .cores
            .iter()
            .zip(&self.workers)
            .filter(|(_, worker)| worker.is_some())
            .map(|(lcore, _)| lcore)
            .collect();
        launched.into_iter().filter_map(|lcore| Some((lcore, self.wait(lcore)?))).collect()
    }

    /// A reader of every lcore's counters, to move into the main lcore's reporting code.
    pub fn stats_reader(&self) -> StatsReader {
        StatsReader::new(self.cores.clone(), self.slots.clone())
    }

    /// The counters of `lcore`, if it is in the list.
    pub fn stats(&self, lcore: LcoreId) -> Option<LcoreStatsSnapshot> {
        let index = self.cores.index_of(lcore)?;
        Some(self.slots[index].snapshot(lcore))
    }

    /// The counters of every lcore, in core order.
    pub fn stats_all(&self) -> Vec<LcoreStatsSnapshot> {
        self.cores.iter().zip(self.slots.iter()).map(|(lcore, slot)| slot.snapshot(lcore)).collect()
    }
}

impl<R: Send + 'static> Drop for Lcores<R> {
    fn drop(&mut self) {
        if self.workers.iter().any(Option::is_some) {
            self.stop.stop();
            // Results and panics of work nobody waited for have no one to go to.
            let _ = self.wait_all();
        }
    }
}

fn join<R>(lcore: LcoreId, handle: JoinHandle<Result<R, LcoreError>>) -> Result<R, LcoreError> {
    handle.join().unwrap_or_else(|payload| {
        Err(LcoreError::Panicked { lcore, message: panic_message(payload.as_ref()) })
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}
