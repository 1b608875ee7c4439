//! efapoll-lcores: the run loop of efapoll's poll-mode engine, after DPDK's EAL.
//!
//! Pinned worker cores ("lcores") each own one endpoint and busy-poll it. This crate gives
//! the apps and embedders what that needs, and nothing protocol-specific:
//!
//! - [`CoreList`]: core lists in DPDK's `-l` syntax (`0-3,5`), the first core being the main
//!   lcore unless told otherwise;
//! - [`pin_current_thread`] and [`available_cores`]: pinning, with errors that name the core
//!   and the cores that exist;
//! - [`Lcores`]: `remote_launch(lcore, work)` on pinned threads, `run_on_main` on the calling
//!   thread, `wait_all()` for the results (a panic is a result, not a crash);
//! - [`LcoreCtx::run_until_stopped`]: the poll loop, counting busy and idle cycles per lcore
//!   with one cycle-counter read per iteration (or iterations alone: [`Accounting`]),
//!   waiting per an [`IdleStrategy`];
//! - [`LcoreStatsSnapshot`]: per-lcore counters (on their own cache lines) for utilisation
//!   reports by the main lcore;
//! - [`ring`]: a bounded SPSC ring for lcore-to-lcore messages, with bursts and bulks;
//! - [`StopFlag`] and [`install_ctrlc_handler`]: one flag every loop honours, raised on Ctrl-C.
//!
//! ```no_run
//! use efapoll_lcores::{CoreList, Lcores, LcoresConfig, install_ctrlc_handler};
//!
//! let cores: CoreList = "0-1".parse()?;
//! let mut lcores: Lcores<u64> = Lcores::new(LcoresConfig::new(cores))?;
//! install_ctrlc_handler(lcores.stop_flag())?;
//! let workers: Vec<_> = lcores.worker_lcores().collect();
//! for lcore in workers {
//!     lcores.remote_launch(lcore, |ctx| {
//!         let mut packets = 0u64;
//!         ctx.run_until_stopped(|| {
//!             packets += 1; // poll the endpoint here
//!             true
//!         });
//!         packets
//!     })?;
//! }
//! let reader = lcores.stats_reader();
//! lcores.run_on_main(|ctx| {
//!     while !ctx.should_stop() {
//!         std::thread::sleep(std::time::Duration::from_secs(1));
//!         for stats in reader.snapshot_all() {
//!             println!("lcore {}: {:.1}% busy", stats.lcore, stats.busy_percent());
//!         }
//!     }
//! })?;
//! for (lcore, result) in lcores.wait_all() {
//!     println!("lcore {lcore}: {:?}", result);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

mod corelist;
mod ctx;
mod idle;
mod launch;
mod mem;
mod pin;
mod stats;
mod stop;
mod sys;

pub use corelist::{CoreList, CoreListError, LcoreId, LcoreMap, MAX_LCORE_ID};
pub use ctx::{LcoreCtx, Step};
pub use idle::{IdleStrategy, UnknownIdleStrategy};
pub use launch::{LaunchError, LcoreError, LcoreState, Lcores, LcoresConfig, LcoresError};
pub use mem::spsc as ring;
pub use pin::{PinError, available_cores, check_cores_exist, pin_current_thread};
pub use stats::{Accounting, LcoreStatsSnapshot, StatsReader};
pub use stop::{SignalError, StopFlag, install_ctrlc_handler};
