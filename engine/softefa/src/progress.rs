//! The NIC's own progress. An EFA device acknowledges, retransmits and
//! serves RDMA reads whatever its program does; a softefa QP is a udp
//! device, which does all that only when polled. A program that takes its
//! packet and then blocks elsewhere (fi_pingpong, in its control socket's
//! sync) would leave the acknowledgement owed until its next poll, and the
//! sender would give up ("unresponsive receiver").
//!
//! So one thread per process, started with the first QP, sweeps the live
//! QPs and drives each one its CQ has not driven for [`IDLE`]: it polls
//! the QP's udp device (which sends what is owed, resends what timed out,
//! serves peers' reads) and keeps what completed in the QP until its CQ is
//! polled. The program's polls stay the fast path: a QP counts them in an
//! atomic its lock holder writes and the thread only reads, and the thread
//! takes a QP's lock only when free (a QP in use is being driven by its
//! user: the sweep skips it).
//!
//! Between sweeps the thread sleeps, never spins: [`BUSY`] while a QP it
//! drives has work in flight (its timers run), else until a datagram
//! reaches a QP it drives (their sockets, in `ppoll`) or [`WATCH`] passed,
//! to see whether a polled QP stopped being polled ([`QUIET`] when none is
//! polled either). A process whose QPs all wait costs a wakeup per
//! [`QUIET`]; one whose program polls, a wakeup per [`WATCH`].
//!
//! A child process after `fork` has no thread (fork copies only the
//! calling one): its first QP starts one of its own, as a NIC drives a
//! child's QPs too. The parent's QPs leave the child's list at the fork:
//! their sockets are the parent's, whose datagrams the child must not take.
//!
//! `SOFTEFA_PROGRESS=0` starts no thread: a QP then makes progress only
//! while its CQ is polled.

use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::lock::{Guard, SpinLock};
use crate::qp::Qp;

/// A QP its CQ has not driven for this long is driven by the thread: long
/// enough that a polling program does not meet the thread on its QP,
/// short against the sender's retransmission backoff and peer timeout.
const IDLE: Duration = Duration::from_millis(1);
/// The sweep's period while a QP it drives has work in flight.
const BUSY: Duration = Duration::from_micros(200);
/// The longest wait while a QP is polled by its program.
const WATCH: Duration = Duration::from_millis(1);
/// The longest wait while no QP is polled by its program and none it
/// drives has work: only a datagram (or a QP made since) needs the thread.
const QUIET: Duration = Duration::from_millis(10);

/// A live QP, and the sweep's last view of it: its count of CQ polls, and
/// since when that count has not moved.
struct Entry {
    qp: *const Qp,
    polls: u64,
    since: Instant,
}

struct Live(Vec<Entry>);

// SAFETY: the pointers are of live QPs (a QP leaves the list, under the
// list's lock, before it is freed), which are Sync.
unsafe impl Send for Live {}

/// A spin lock rather than a Mutex: the fork handlers take it in one call
/// and release it in another.
static LIVE: SpinLock<Live> = SpinLock::new(Live(Vec::new()));

fn live() -> Guard<'static, Live> {
    LIVE.lock()
}

/// The process whose thread runs: a child after `fork` has none.
static STARTED_IN: AtomicU32 = AtomicU32::new(0);

/// A QP made: the thread drives it when its CQ does not (the thread starts
/// with the process's first QP).
pub(crate) fn add(qp: *const Qp) {
    if !crate::config().progress {
        return;
    }
    static AT_FORK: Once = Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: the handlers are functions of this library, which is
        // never unloaded (preloaded, or linked into a test).
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            eprintln!("softefa: pthread_atfork: {rc}: a child after fork may hang in a QP");
        }
    });
    let pid = std::process::id();
    if STARTED_IN.swap(pid, Ordering::AcqRel) != pid {
        let t = std::thread::Builder::new().name("softefa-progress".into()).spawn(run);
        if let Err(e) = t {
            eprintln!("softefa: no progress thread ({e}): QPs progress only while polled");
        }
    }
    // SAFETY: the caller's QP, just made.
    let polls = unsafe { &*qp }.polls();
    live().0.push(Entry { qp, polls, since: Instant::now() });
}

/// Before a fork: the list is held, so that no sweep is half done in it
/// (the child would find it locked for good).
extern "C" fn prepare() {
    LIVE.raw_lock();
}

extern "C" fn parent() {
    // SAFETY: `prepare` took the lock in this thread, which holds no
    // reference to the list.
    unsafe { LIVE.raw_unlock() };
}

/// In the child: the parent's QPs are not its own to drive.
extern "C" fn child() {
    // SAFETY: `prepare` took the lock (the child's copy of it held) and
    // this is the reference to the list until it is released below.
    unsafe { LIVE.data() }.0.clear();
    // SAFETY: as in `parent`.
    unsafe { LIVE.raw_unlock() };
}

/// A QP about to be freed: once this returns, no sweep reaches it.
pub(crate) fn remove(qp: *const Qp) {
    live().0.retain(|e| e.qp != qp);
}

fn run() {
    let mut fds = Vec::new();
    loop {
        let wait = sweep(Instant::now(), &mut fds);
        if fds.is_empty() {
            std::thread::sleep(wait);
            continue;
        }
        let ts = libc::timespec { tv_sec: 0, tv_nsec: wait.as_nanos() as libc::c_long };
        // SAFETY: `fds` holds `fds.len()` pollfds; the timeout is a valid
        // timespec and no signal mask is given. A descriptor whose QP was
        // destroyed meanwhile at worst wakes us early (or not at all):
        // the wait is bounded and nothing is read from it here.
        unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    }
}

/// Drives the QPs whose CQ let them idle, those not in use right now;
/// returns how long to wait before the next sweep, and in `fds` the
/// sockets of the QPs it drove that wait for a datagram.
fn sweep(now: Instant, fds: &mut Vec<libc::pollfd>) -> Duration {
    fds.clear();
    let mut wait = QUIET;
    let mut live = live();
    for e in &mut live.0 {
        // SAFETY: in the list, so live: a QP leaves it (under the lock held
        // here) before it is freed.
        let qp = unsafe { &*e.qp };
        let polls = qp.polls();
        if polls != e.polls {
            e.polls = polls;
            e.since = now;
        }
        let idle = now.duration_since(e.since);
        if idle < IDLE {
            // Polled by its program, lately: look again when it may idle.
            wait = wait.min(WATCH.min(IDLE - idle));
            continue;
        }
        match qp.try_progress() {
            // Its program holds it: it is about to be polled, or was.
            None => wait = wait.min(WATCH),
            Some((true, fd)) => fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
            Some((false, _)) => wait = wait.min(BUSY),
        }
    }
    wait
}
