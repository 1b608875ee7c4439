//! Launching work on pinned lcores, waiting for it, stopping it and counting its cycles.
//!
//! Only the cores this machine has are used (two, main and one worker), and the tests take a
//! lock so that no more than two polling threads run at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use efapoll_lcores::{
    CoreList, IdleStrategy, LaunchError, LcoreError, LcoreMap, LcoreState, Lcores, LcoresConfig,
    LcoresError, MAX_LCORE_ID, PinError, Step, available_cores,
};

/// Serialises the tests: each runs a main lcore and at most one worker.
fn cores_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first two available cores (main, worker), or `None` on a one-core machine.
fn two_cores() -> Option<CoreList> {
    let available = available_cores().expect("CPU affinity is readable");
    if available.len() < 2 {
        eprintln!("skipped: needs two cores, this machine has {available}");
        return None;
    }
    Some(CoreList::from_cores(available.iter().take(2)).unwrap())
}

fn lcores_on_two_cores<R: Send + 'static>(idle: IdleStrategy) -> Option<(Lcores<R>, usize)> {
    let cores = two_cores()?;
    let lcores: Lcores<R> = Lcores::new(LcoresConfig { idle, ..LcoresConfig::new(cores) }).unwrap();
    let worker = lcores.worker_lcores().next().unwrap();
    Some((lcores, worker))
}

/// The cores the calling thread may run on, as the kernel sees them now.
fn current_affinity() -> Vec<usize> {
    core_affinity::get_core_ids().unwrap().into_iter().map(|id| id.id).collect()
}

/// Waits (politely: the caller is not a polling lcore) until `done` holds.
fn wait_until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("the condition never held");
}

#[test]
fn work_runs_pinned_on_its_lcore_and_returns_its_result() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) =
        lcores_on_two_cores::<(usize, usize, Vec<usize>)>(IdleStrategy::Yield)
    else {
        return;
    };
    let main = lcores.main_lcore();
    assert_eq!(current_affinity(), [main], "the calling thread is pinned to main");
    lcores
        .remote_launch(worker, |ctx| (ctx.lcore_id(), ctx.lcore_index(), current_affinity()))
        .unwrap();
    let results = lcores.wait_all();
    assert_eq!(results.len(), 1);
    let (lcore, result) = &results[0];
    assert_eq!(*lcore, worker);
    assert_eq!(result.as_ref().unwrap(), &(worker, 1, vec![worker]));
    assert_eq!(lcores.state(worker), Some(LcoreState::Wait));
    assert!(lcores.wait_all().is_empty(), "nothing left to wait for");
}

#[test]
fn an_lcore_can_be_launched_again_after_wait() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<u32>(IdleStrategy::Spin) else {
        return;
    };
    for round in 0..3 {
        lcores.remote_launch(worker, move |_| round).unwrap();
        assert_eq!(lcores.wait(worker).unwrap().unwrap(), round);
    }
    assert!(lcores.wait(worker).is_none());
}

#[test]
fn a_panicking_lcore_is_reported_as_an_error() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<()>(IdleStrategy::Spin) else {
        return;
    };
    lcores
        .remote_launch(worker, |ctx| panic!("lcore {} lost its endpoint", ctx.lcore_id()))
        .unwrap();
    wait_until(|| lcores.state(worker) == Some(LcoreState::Finished));
    let results = lcores.wait_all();
    assert_eq!(
        results,
        [(
            worker,
            Err(LcoreError::Panicked {
                lcore: worker,
                message: format!("lcore {worker} lost its endpoint"),
            })
        )]
    );
}

#[test]
fn launching_on_an_unknown_main_or_busy_lcore_is_refused() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<()>(IdleStrategy::Yield) else {
        return;
    };
    let main = lcores.main_lcore();
    assert!(matches!(
        lcores.remote_launch(MAX_LCORE_ID, |_| ()),
        Err(LaunchError::UnknownLcore { lcore: MAX_LCORE_ID, .. })
    ));
    assert!(matches!(
        lcores.remote_launch(main, |_| ()),
        Err(LaunchError::MainLcore { lcore }) if lcore == main
    ));

    lcores
        .remote_launch(worker, |ctx| {
            ctx.run_until_stopped(|| false);
        })
        .unwrap();
    assert_eq!(lcores.state(worker), Some(LcoreState::Running));
    let refused = lcores.remote_launch(worker, |_| ());
    assert!(matches!(refused, Err(LaunchError::Busy { lcore }) if lcore == worker), "{refused:?}");
    lcores.stop();
    let results = lcores.wait_all();
    assert!(results[0].1.is_ok());
}

#[test]
fn a_finished_but_unwaited_lcore_is_still_busy() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<()>(IdleStrategy::Spin) else {
        return;
    };
    lcores.remote_launch(worker, |_| ()).unwrap();
    wait_until(|| lcores.state(worker) == Some(LcoreState::Finished));
    assert!(matches!(lcores.remote_launch(worker, |_| ()), Err(LaunchError::Busy { .. })));
    lcores.wait_all();
}

#[test]
fn the_stop_flag_ends_a_running_loop_and_idle_time_is_not_busy() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores(IdleStrategy::Spin) else {
        return;
    };
    lcores.remote_launch(worker, |ctx| ctx.run_until_stopped(|| false)).unwrap();
    wait_until(|| lcores.stats(worker).unwrap().iterations > 1_000);
    lcores.stop();
    let (_, result) = lcores.wait_all().pop().unwrap();
    let run = result.unwrap();
    assert!(run.iterations > 1_000);
    assert_eq!(run.busy_iterations, 0);
    assert_eq!(run.busy_cycles, 0);
    assert!(run.idle_cycles > 0);
    assert_eq!(lcores.stats(worker).unwrap(), run, "the main lcore reads the same counts");
}

#[test]
fn a_step_that_always_works_is_counted_all_busy() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores(IdleStrategy::Spin) else {
        return;
    };
    lcores.remote_launch(worker, |ctx| ctx.run_until_stopped(|| true)).unwrap();
    let reader = lcores.stats_reader();
    wait_until(|| reader.snapshot(worker).unwrap().iterations > 1_000);
    lcores.stop();
    let run = lcores.wait(worker).unwrap().unwrap();
    assert_eq!(run.busy_iterations, run.iterations);
    assert_eq!(run.idle_cycles, 0);
    assert!(run.busy_cycles > 0);
    assert_eq!(run.busy_percent(), 100.0);
}

#[test]
fn the_main_lcore_runs_on_the_calling_thread_with_its_own_stats() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<()>(IdleStrategy::Backoff) else {
        return;
    };
    let main = lcores.main_lcore();
    let caller = std::thread::current().id();
    let (lcore, idle, same_thread, run) = lcores
        .run_on_main(|ctx| {
            let mut left = 100;
            let run = ctx.run_until_stopped(|| {
                left -= 1;
                if left == 0 { Step::Done } else { Step::Idle }
            });
            (ctx.lcore_id(), ctx.idle_strategy(), std::thread::current().id() == caller, run)
        })
        .unwrap();
    assert_eq!((lcore, idle, same_thread), (main, IdleStrategy::Backoff, true));
    assert_eq!((run.iterations, run.busy_iterations), (100, 1));
    let all = lcores.stats_all();
    assert_eq!(all.iter().map(|s| s.lcore).collect::<Vec<_>>(), [main, worker]);
    assert_eq!(all[0].iterations, 100);
    assert_eq!(all[1].iterations, 0, "the worker never ran");
}

#[test]
fn main_lcore_can_be_chosen() {
    let _lock = cores_lock();
    let Some(cores) = two_cores() else {
        return;
    };
    let (first, second) = (cores.as_slice()[0], cores.as_slice()[1]);
    let lcores: Lcores =
        Lcores::new(LcoresConfig { main_lcore: Some(second), ..LcoresConfig::new(cores) }).unwrap();
    assert_eq!(lcores.main_lcore(), second);
    assert_eq!(lcores.worker_lcores().collect::<Vec<_>>(), [first]);
}

#[test]
fn dropping_lcores_stops_and_joins_running_workers() {
    let _lock = cores_lock();
    let Some((mut lcores, worker)) = lcores_on_two_cores::<()>(IdleStrategy::Spin) else {
        return;
    };
    let left_loop = Arc::new(AtomicBool::new(false));
    let flag = left_loop.clone();
    lcores
        .remote_launch(worker, move |ctx| {
            ctx.run_until_stopped(|| false);
            flag.store(true, Ordering::Relaxed);
        })
        .unwrap();
    drop(lcores);
    assert!(left_loop.load(Ordering::Relaxed));
}

#[test]
fn a_core_that_does_not_exist_is_refused_by_name() {
    let available = available_cores().unwrap();
    let cores = CoreList::from_cores([available.main_lcore(), MAX_LCORE_ID]).unwrap();
    let err = Lcores::<()>::new(LcoresConfig::new(cores)).unwrap_err();
    assert_eq!(err, LcoresError::Pin(PinError::NoSuchCore { core: MAX_LCORE_ID, available }));
}

#[test]
fn a_main_lcore_outside_the_list_is_refused() {
    let cores: CoreList = "0".parse().unwrap();
    let err =
        Lcores::<()>::new(LcoresConfig { main_lcore: Some(1), ..LcoresConfig::new(cores.clone()) })
            .unwrap_err();
    assert_eq!(err, LcoresError::MainNotInList { main: 1, cores });
}

#[test]
fn lcores_mapped_to_one_cpu_run_there_under_their_own_ids() {
    let _lock = cores_lock();
    let cpu = available_cores().unwrap().main_lcore();
    // Lcores 7 and 9, both on the first CPU (DPDK's `--lcores 7@c,9@c`).
    let map: LcoreMap = format!("7@{cpu},9@{cpu}").parse().unwrap();
    let config = LcoresConfig { idle: IdleStrategy::Yield, ..LcoresConfig::new(map) };
    let mut lcores: Lcores<(usize, Vec<usize>)> = Lcores::new(config).unwrap();
    assert_eq!(lcores.main_lcore(), 7);
    lcores.remote_launch(9, |ctx| (ctx.lcore_id(), current_affinity())).unwrap();
    let (lcore, affinity) = lcores.wait(9).unwrap().unwrap();
    assert_eq!((lcore, affinity), (9, vec![cpu]));
    let on_main = lcores.run_on_main(|ctx| (ctx.lcore_id(), current_affinity())).unwrap();
    assert_eq!(on_main, (7, vec![cpu]));
}

#[test]
fn a_mapped_cpu_that_does_not_exist_is_refused_by_name() {
    let available = available_cores().unwrap();
    let map: LcoreMap = format!("0@{},1@{MAX_LCORE_ID}", available.main_lcore()).parse().unwrap();
    let err = Lcores::<()>::new(LcoresConfig::new(map)).unwrap_err();
    assert_eq!(err, LcoresError::Pin(PinError::NoSuchCore { core: MAX_LCORE_ID, available }));
}
