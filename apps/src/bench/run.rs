//! Where the sides of each flow run.
//!
//! * `-p sim`: one flow per lcore, both of its endpoints in that lcore's
//!   thread (a sim fabric is single-threaded): the engine's own cost.
//! * self-contained shm: one flow per lcore pair `(a, b)`: the active side
//!   on `a`, the passive one on `b`, each on a shm device of its own made
//!   on its thread; they swap addresses in-process.
//! * `--server` / `HOST`: the server runs the passive side of each pair on
//!   `b`, the client the active side on `a` (so the same `-l` on both ends
//!   of one host keeps them on distinct cores); cards go over Relink.
//!
//! The main lcore runs flow 0's side (the active one unless serving) and
//! prints: each size's row once every flow has measured it. A client also
//! sends each row to the server, whose control thread prints it.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant, SystemTime};

use efapoll::device::Device;
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};
use efapoll::device::udp::{UdpConfig, UdpDevice, Window};
use efapoll::endpoint::{Config, Endpoint};
use efapoll::relink::Conn;
use efapoll_lcores::{
    Accounting, CoreList, IdleStrategy, LcoreCtx, LcoreError, LcoreId, LcoreMap, Lcores,
    LcoresConfig, StopFlag, install_ctrlc_handler,
};

use super::counts::Counts;
use super::drive::{Nobody, drive_active, drive_passive};
use super::oob::{self, Card, Control, ToPeer};
use super::op::{Io, OpKind};
use super::probe::{self, CoreToCore};
use super::report::{self, Report, Row};
use super::target::Target;
use super::{
    ActiveSide, App, Params, PassiveSide, RunError, Sample, Side, VERIFY_BYTES, meta, pingpong,
    plot, streaming,
};

/// The devices the apps run on now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Sim,
    Shm,
    Udp,
    /// Only in a build with the `efa` feature.
    Efa,
}

/// Where this process's sides talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Both sides in this process.
    SelfContained,
    Server,
    Client(String),
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub app: App,
    pub mode: Mode,
    pub device: DeviceKind,
    pub op: OpKind,
    pub params: Params,
    pub lcores: LcoreMap,
    pub idle: IdleStrategy,
    pub port: u16,
    /// Where a server listens.
    pub bind: IpAddr,
    /// Where udp devices bind: loopback in one process, else the address
    /// of this host that the control connection uses.
    pub udp_ip: IpAddr,
    /// The udp devices' window.
    pub udp_window: Window,
    /// No progress for this long fails the run.
    pub timeout: Duration,
    pub json: Option<PathBuf>,
    /// The results as CSV.
    pub csv: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    /// Bandwidth columns in Gbit/s (`--report_gbits`).
    pub gbits: bool,
    /// When the run began: the report's `meta.timestamp`.
    pub started: SystemTime,
    /// The core-to-core look before the run (both sides here only).
    pub probe: Option<CoreToCore>,
    /// Where this process's sides wait for each other before polling.
    pub gate: Arc<SetupGate>,
}

/// How this process's lcores set up. The costly part (devices and
/// endpoints: rings, pools, slabs) is done by one lcore of each CPU at a
/// time, holding its CPU's permit, so that with many lcores on a CPU each
/// finishes its set-up at once instead of all of them sharing the CPU to
/// the end (a signal then ends set-up within a step). Then every side
/// waits, set up and connected, until all are: none polls while others
/// still set up (polling sides would take turns with those setting up,
/// and set-up would grow with the square of the lcores).
#[derive(Debug, Default)]
pub struct SetupGate {
    sides: usize,
    ready: Mutex<usize>,
    all_ready: Condvar,
    /// The CPUs whose permit is taken.
    busy_cpus: Mutex<Vec<LcoreId>>,
    permit_free: Condvar,
    /// Sides whose device and endpoint are made, for the error of a
    /// set-up slower than `--timeout`.
    set_up: std::sync::atomic::AtomicUsize,
}

/// A CPU's permit to set up a device and an endpoint, given back when
/// dropped.
#[derive(Debug)]
pub struct SetupPermit<'a>(&'a SetupGate, LcoreId);

impl Drop for SetupPermit<'_> {
    fn drop(&mut self) {
        self.0.set_up.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.busy_cpus.lock().unwrap_or_else(|e| e.into_inner()).retain(|&c| c != self.1);
        self.0.permit_free.notify_all();
    }
}

impl SetupGate {
    /// A gate for `sides` sides.
    pub fn new(sides: usize) -> Arc<SetupGate> {
        Arc::new(SetupGate { sides, ..SetupGate::default() })
    }

    /// Waits for the permit of `cpu` (the lcore's) to set up; the run's
    /// end ends the wait.
    fn permit(&self, ctx: &LcoreCtx, cpu: LcoreId) -> Result<SetupPermit<'_>, RunError> {
        let mut busy = self.busy_cpus.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(&cpu) {
            still_running(ctx)?;
            busy = self
                .permit_free
                .wait_timeout(busy, WAIT_SLICE)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        still_running(ctx)?;
        busy.push(cpu);
        Ok(SetupPermit(self, cpu))
    }

    /// What a side that waited too long for another says: how far set-up
    /// got, which is why.
    fn too_slow(&self, timeout: Duration) -> String {
        let done = self.set_up.load(std::sync::atomic::Ordering::Relaxed);
        format!(
            "{done} of {} sides had made their device and endpoint after {} s (one per CPU at a \
             time): setting up this many lcores takes longer than --timeout; raise it",
            self.sides,
            timeout.as_secs_f64()
        )
    }

    /// Counts this side ready and waits for the others, up to `timeout`;
    /// `stop` (another side's failure, a signal) ends the wait.
    fn pass(&self, timeout: Duration, stop: &StopFlag) -> Result<(), RunError> {
        let start = Instant::now();
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        *ready += 1;
        if *ready >= self.sides {
            self.all_ready.notify_all();
            return Ok(());
        }
        while *ready < self.sides {
            if stop.is_stopped() || interrupted() {
                return Err(RunError::Stopped);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                stop.stop();
                return Err(RunError::Timeout(self.too_slow(timeout)));
            }
            let slice = left.min(WAIT_SLICE);
            ready = self.all_ready.wait_timeout(ready, slice).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Active,
    Passive,
}

/// An endpoint's counters, by name.
type Counters = Vec<(String, u64)>;

/// What a flow's lcore hands back: the counters of each side it ran.
type FlowResult = Result<Vec<(Role, Counters)>, RunError>;

/// Where measured samples go.
type Sink<'a> = &'a mut dyn FnMut(usize, Sample) -> Result<(), RunError>;

/// The lcores of each flow: `(active, passive)`.
pub fn pairs(lcores: &CoreList) -> Vec<(LcoreId, LcoreId)> {
    lcores.as_slice().chunks_exact(2).map(|p| (p[0], p[1])).collect()
}

/// Runs the benchmark; rows go to stdout as sizes complete. A signal ends
/// it wherever it is, with [`RunError::Interrupted`].
pub fn run(a: &RunArgs) -> Result<(), RunError> {
    ctrlc(interrupt());
    let cpus = probe_cpus(a);
    let probe = cpus.and_then(CoreToCore::before);
    let line = match (&probe, cpus) {
        (Some(p), _) => Some(format!(
            "# core-to-core: {:.0} ns one way between CPUs {} and {} (a cache line, before the run)",
            p.before_ns, p.cpus.0, p.cpus.1
        )),
        (None, Some((x, y))) => Some(format!(
            "# core-to-core: not measured between CPUs {x} and {y} (the threads could not be \
             pinned there, or did not run at once within {} ms)",
            probe::BUDGET.as_millis()
        )),
        (None, None) => None,
    };
    if let Some(line) = line {
        let _ = writeln!(std::io::stdout().lock(), "{line}");
    }
    // Both sides here: every lcore runs a side (or with -p sim a pair).
    let gate = SetupGate::new(a.lcores.lcores().len());
    let a = &RunArgs { probe, gate, ..a.clone() };
    let result = match (&a.mode, a.device) {
        (Mode::SelfContained, DeviceKind::Sim) => run_sim(a),
        (Mode::SelfContained, DeviceKind::Shm | DeviceKind::Udp | DeviceKind::Efa) => run_local(a),
        (Mode::Server, DeviceKind::Shm | DeviceKind::Udp | DeviceKind::Efa) => run_server(a),
        (Mode::Client(host), DeviceKind::Shm | DeviceKind::Udp | DeviceKind::Efa) => {
            run_client(a, host)
        }
        (_, DeviceKind::Sim) => Err(RunError::Setup("sim runs in one process".into())),
    };
    // Whatever the lcores or the peer made of it, the signal is the cause.
    if interrupted() { Err(RunError::Interrupted) } else { result }
}

/// The CPUs whose core-to-core time says whether a run's cores kept
/// still: the first flow's two, or with `-p sim` its one and another this
/// process may use. None across processes (the peer's are elsewhere), or
/// where the flow's lcores share a CPU.
fn probe_cpus(a: &RunArgs) -> Option<(LcoreId, LcoreId)> {
    if a.mode != Mode::SelfContained {
        return None;
    }
    let lcores = a.lcores.lcores().as_slice();
    let first = a.lcores.cpu_of(lcores[0])?;
    let second = match a.device {
        DeviceKind::Sim => {
            efapoll_lcores::available_cores().ok()?.iter().find(|&cpu| cpu != first)?
        }
        DeviceKind::Shm | DeviceKind::Udp | DeviceKind::Efa => a.lcores.cpu_of(*lcores.get(1)?)?,
    };
    (first != second).then_some((first, second))
}

/// Raised by a signal only (the lcores' flags also by failures).
fn interrupt() -> &'static StopFlag {
    static INTERRUPT: OnceLock<StopFlag> = OnceLock::new();
    INTERRUPT.get_or_init(StopFlag::new)
}

/// Whether a signal asked the run to end.
pub fn interrupted() -> bool {
    interrupt().is_stopped()
}

/// How often set-up waits look at the stop flags.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);

/// `rx.recv_timeout(timeout)` in slices, ended early by `stop` or a signal.
fn recv_or_stop<T>(
    rx: &mpsc::Receiver<T>,
    timeout: Duration,
    stop: Option<&StopFlag>,
) -> Result<T, mpsc::RecvTimeoutError> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match rx.recv_timeout(left.min(WAIT_SLICE)) {
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                if interrupted() || stop.is_some_and(StopFlag::is_stopped) {
                    return Err(mpsc::RecvTimeoutError::Disconnected);
                }
            }
            r => return r,
        }
    }
}

fn new_lcores(lcores: LcoreMap, a: &RunArgs) -> Result<Lcores<FlowResult>, RunError> {
    // Pingpong reports no busy share, and a clock read per poll-loop
    // iteration would be on its round trip.
    let accounting = match a.app {
        App::Pingpong => Accounting::Iterations,
        App::Streaming => Accounting::Cycles,
    };
    Lcores::new(LcoresConfig { lcores, main_lcore: None, idle: a.idle, accounting })
        .map_err(|e| RunError::Setup(format!("lcores: {e}")))
}

/// Runs `work` on `lcore`; its failure stops the other lcores, wherever
/// they are (set-up included).
fn launch(
    lcores: &mut Lcores<FlowResult>,
    lcore: LcoreId,
    work: impl FnOnce(&mut LcoreCtx) -> FlowResult + Send + 'static,
) -> Result<(), RunError> {
    let work = move |ctx: &mut LcoreCtx| {
        let result = work(ctx);
        if result.is_err() {
            ctx.stop_flag().stop();
        }
        result
    };
    lcores.remote_launch(lcore, work).map_err(|e| RunError::Setup(format!("launch: {e}")))
}

/// Fails with [`RunError::Stopped`] once the run is ending: set-up steps
/// look before each costly one, so that a signal or another lcore's
/// failure ends a large set-up at once.
fn still_running(ctx: &LcoreCtx) -> Result<(), RunError> {
    if ctx.should_stop() || interrupted() { Err(RunError::Stopped) } else { Ok(()) }
}

/// What `Side::connect` asks while the peer has not let us in (a stopped
/// shm peer): go on until the run ends or `timeout` passes.
fn keep_waiting(ctx: &LcoreCtx, timeout: Duration) -> impl FnMut() -> Result<(), RunError> + '_ {
    let deadline = Instant::now() + timeout;
    move || {
        still_running(ctx)?;
        if Instant::now() < deadline {
            return Ok(());
        }
        let secs = timeout.as_secs_f64();
        Err(RunError::PeerGone(format!("the peer did not let us in within --timeout {secs} s")))
    }
}

fn ctrlc(stop: &StopFlag) {
    if let Err(e) = install_ctrlc_handler(stop) {
        eprintln!("efapoll: {e}; Ctrl-C will not stop the run cleanly");
    }
}

fn run_sim(a: &RunArgs) -> Result<(), RunError> {
    let mut lcores = new_lcores(a.lcores.clone(), a)?;
    ctrlc(lcores.stop_flag());
    let (sample_tx, sample_rx) = mpsc::channel();
    for (flow, lcore) in a.lcores.lcores().iter().enumerate().skip(1) {
        let (args, tx) = (a.clone(), sample_tx.clone());
        launch(&mut lcores, lcore, move |ctx| {
            sim_flow(ctx, &args, flow, &mut |k, s| send_sample(&tx, flow, k, s), false)
        })?;
    }
    drop(sample_tx);
    let mut out = Collector::new(a, a.lcores.lcores().len(), sample_rx, lcores.stop_flag().clone());
    let main = lcores
        .run_on_main(|ctx| sim_flow(ctx, a, 0, &mut |k, s| out.add(k, s), true))
        .map_err(|e| RunError::Setup(format!("main lcore: {e}")))?;
    let rest = lcores.wait_all();
    out.finish(main, rest, Role::Active)
}

/// One flow with both endpoints on a sim fabric of its own.
fn sim_flow(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    flow: usize,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    let permit = a.gate.permit(ctx, a.lcores.cpu_of(ctx.lcore_id()).unwrap_or_default())?;
    let fabric = SimFabric::new(SimConfig::default());
    let counts = Arc::new(Counts::new(&a.params, flow));
    let io = || -> Result<Io<_>, RunError> {
        let ep = Endpoint::new(fabric.device(), a.op.config(Config::default()))
            .map_err(|e| RunError::Setup(format!("sim endpoint: {e}")))?;
        Io::new(ep, a.op, &a.params)
    };
    let (active, passive) = (io()?, io()?);
    drop(permit);
    match a.app {
        App::Pingpong => {
            let active = pingpong::Initiator::new(active, &a.params, counts.clone())?;
            sim_with(ctx, a, active, passive, counts, sink, live)
        }
        App::Streaming => {
            let active = streaming::Sender::new(active, &a.params, counts.clone())?;
            sim_with(ctx, a, active, passive, counts, sink, live)
        }
    }
}

/// Whether the passive side is a one-sided run's [`Target`] rather than
/// the app's own (pingpong's writes are answered by writes).
fn passive_is_target(a: &RunArgs) -> bool {
    match a.app {
        App::Pingpong => !a.op.echoes(),
        App::Streaming => a.op.is_one_sided(),
    }
}

/// Pairs `active` with the passive side the run needs, over `io`.
fn sim_with<A: ActiveSide + Side>(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    active: A,
    io: Io<SimDevice>,
    counts: Arc<Counts>,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    let (p, c) = (&a.params, counts);
    match a.app {
        _ if passive_is_target(a) => sim_pair(ctx, a, active, Target::new(io, p, c)?, sink, live),
        App::Pingpong => sim_pair(ctx, a, active, pingpong::Responder::new(io, p, c)?, sink, live),
        App::Streaming => sim_pair(ctx, a, active, streaming::Receiver::new(io, p, c)?, sink, live),
    }
}

fn sim_pair<A: ActiveSide + Side, P: PassiveSide + Side>(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    mut active: A,
    mut passive: P,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    active.connect(&passive.addr(), passive.data_mem(), &mut keep_waiting(ctx, a.timeout))?;
    passive.connect(&active.addr(), active.data_mem(), &mut keep_waiting(ctx, a.timeout))?;
    a.gate.pass(a.timeout, ctx.stop_flag())?;
    drive_active(ctx, &a.params, a.timeout, &mut active, &mut passive, live, sink)?;
    Ok(vec![(Role::Active, active.counters()), (Role::Passive, passive.counters())])
}

/// Runs one side of a flow on a device made on this thread (shm, or udp
/// at `a.udp_ip`); `exchange` trades our card for the peer's.
fn device_side(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    role: Role,
    counts: Arc<Counts>,
    exchange: impl FnOnce(Card) -> Result<Card, RunError>,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    let permit = a.gate.permit(ctx, a.lcores.cpu_of(ctx.lcore_id()).unwrap_or_default())?;
    #[cfg(feature = "efa")]
    if a.device == DeviceKind::Efa {
        use efapoll::device::Domain;
        let dev =
            efa_domain()?.device().map_err(|e| RunError::Setup(format!("efa device: {e}")))?;
        still_running(ctx)?;
        // As udp: across hosts, the provider's thresholds.
        let ep = Endpoint::new(dev, a.op.config(Config::default()))
            .map_err(|e| RunError::Setup(format!("efa endpoint: {e}")))?;
        drop(permit);
        return side_on(ctx, a, ep, role, counts, exchange, sink, live);
    }
    if a.device == DeviceKind::Udp {
        let cfg = UdpConfig {
            bind: SocketAddr::new(a.udp_ip, 0),
            window: a.udp_window,
            // Keys an efa peer (on softefa) can name: EFA's rkeys are 32 bits.
            short_keys: true,
            ..UdpConfig::default()
        };
        let dev = UdpDevice::new(cfg).map_err(|e| RunError::Setup(format!("udp device: {e}")))?;
        still_running(ctx)?;
        // Across hosts, as EFA: the provider's thresholds.
        let ep = Endpoint::new(dev, a.op.config(Config::default()))
            .map_err(|e| RunError::Setup(format!("udp endpoint: {e}")))?;
        drop(permit);
        return side_on(ctx, a, ep, role, counts, exchange, sink, live);
    }
    // One peer sends to each device: two lanes (one spare for a peer that
    // restarts) instead of the default sixteen: 2 MiB of rings a device
    // at most, 1 MiB a sender (a lane is made when granted).
    // A peer that does not answer holds set-up no longer than a signal
    // may wait (`keep_waiting` decides whether to ask again).
    let hello_wait = Duration::from_millis(50);
    let dev = ShmDevice::new(ShmConfig { lanes: 2, hello_wait, ..ShmConfig::default() })
        .map_err(|e| RunError::Setup(format!("shm device: {e}")))?;
    still_running(ctx)?;
    // Large messages by one copy out of the peer's mapping: shm's read.
    let ep = Endpoint::new(dev, a.op.config(Config::on_host()))
        .map_err(|e| RunError::Setup(format!("shm endpoint: {e}")))?;
    drop(permit);
    side_on(ctx, a, ep, role, counts, exchange, sink, live)
}

/// The process's EFA protection domain, opened by the first lcore that
/// needs it: every lcore's queue is made in it (one PD, one address
/// handle per peer host).
#[cfg(feature = "efa")]
pub(crate) fn efa_domain() -> Result<efapoll::device::efa::EfaDomain, RunError> {
    use efapoll::device::efa::{EfaConfig, EfaDomain};
    static DOMAIN: OnceLock<Result<EfaDomain, String>> = OnceLock::new();
    let opened =
        DOMAIN.get_or_init(|| EfaDomain::open(EfaConfig::default()).map_err(|e| e.to_string()));
    opened.clone().map_err(|e| RunError::Setup(format!("efa: {e}")))
}

/// Runs one side of a flow on endpoint `ep`.
#[allow(clippy::too_many_arguments)]
fn side_on<D: Device>(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    ep: Endpoint<D>,
    role: Role,
    counts: Arc<Counts>,
    exchange: impl FnOnce(Card) -> Result<Card, RunError>,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    still_running(ctx)?;
    let io = Io::new(ep, a.op, &a.params)?;
    let (p, c) = (&a.params, counts);
    match (a.app, role) {
        (App::Pingpong, Role::Active) => {
            active_side(ctx, a, pingpong::Initiator::new(io, p, c)?, exchange, sink, live)
        }
        (App::Streaming, Role::Active) => {
            active_side(ctx, a, streaming::Sender::new(io, p, c)?, exchange, sink, live)
        }
        (_, Role::Passive) if passive_is_target(a) => {
            passive_side(ctx, a, Target::new(io, p, c)?, exchange)
        }
        (App::Pingpong, Role::Passive) => {
            passive_side(ctx, a, pingpong::Responder::new(io, p, c)?, exchange)
        }
        (App::Streaming, Role::Passive) => {
            passive_side(ctx, a, streaming::Receiver::new(io, p, c)?, exchange)
        }
    }
}

fn card_of(side: &impl Side, params: &Params) -> Card {
    Card { addr: side.addr(), mem: side.data_mem(), params: params.clone() }
}

fn active_side<A: ActiveSide + Side>(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    mut side: A,
    exchange: impl FnOnce(Card) -> Result<Card, RunError>,
    sink: Sink<'_>,
    live: bool,
) -> FlowResult {
    let peer = exchange(card_of(&side, &a.params))?;
    side.connect(&peer.addr, peer.mem, &mut keep_waiting(ctx, a.timeout))?;
    a.gate.pass(a.timeout, ctx.stop_flag())?;
    drive_active(ctx, &a.params, a.timeout, &mut side, &mut Nobody, live, sink)?;
    Ok(vec![(Role::Active, side.counters())])
}

fn passive_side<P: PassiveSide + Side>(
    ctx: &mut LcoreCtx,
    a: &RunArgs,
    mut side: P,
    exchange: impl FnOnce(Card) -> Result<Card, RunError>,
) -> FlowResult {
    let peer = exchange(card_of(&side, &a.params))?;
    side.connect(&peer.addr, peer.mem, &mut keep_waiting(ctx, a.timeout))?;
    a.gate.pass(a.timeout, ctx.stop_flag())?;
    drive_passive(ctx, a.timeout, &mut side)?;
    Ok(vec![(Role::Passive, side.counters())])
}

/// One end of an in-process card exchange.
#[derive(Debug)]
struct CardLink {
    to_peer: mpsc::Sender<Card>,
    from_peer: mpsc::Receiver<Card>,
    timeout: Duration,
    /// This end's lcore and the peer's, for the error.
    lcores: (LcoreId, LcoreId),
}

impl CardLink {
    /// The two ends of the exchange between lcores `a` and `b`.
    fn pair(timeout: Duration, a: LcoreId, b: LcoreId) -> (CardLink, CardLink) {
        let (a_tx, a_rx) = mpsc::channel();
        let (b_tx, b_rx) = mpsc::channel();
        (
            CardLink { to_peer: a_tx, from_peer: b_rx, timeout, lcores: (a, b) },
            CardLink { to_peer: b_tx, from_peer: a_rx, timeout, lcores: (b, a) },
        )
    }

    fn exchange(self, mine: Card, gate: &SetupGate) -> Result<Card, RunError> {
        // A peer gone before its card failed its setup, and says so itself.
        self.to_peer.send(mine).map_err(|_| RunError::Stopped)?;
        recv_or_stop(&self.from_peer, self.timeout, None).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => RunError::Timeout(format!(
                "lcore {}: no card from lcore {}: {}",
                self.lcores.0,
                self.lcores.1,
                gate.too_slow(self.timeout)
            )),
            mpsc::RecvTimeoutError::Disconnected => RunError::Stopped,
        })
    }
}

fn send_sample(
    tx: &mpsc::Sender<(usize, usize, Sample)>,
    flow: usize,
    k: usize,
    s: Sample,
) -> Result<(), RunError> {
    tx.send((flow, k, s)).map_err(|_| RunError::Stopped)
}

fn run_local(a: &RunArgs) -> Result<(), RunError> {
    let pairs = pairs(a.lcores.lcores());
    let mut lcores = new_lcores(a.lcores.clone(), a)?;
    ctrlc(lcores.stop_flag());
    let (sample_tx, sample_rx) = mpsc::channel();
    let mut main_link = None;
    let mut main_counts = None;
    for (flow, &(active, passive)) in pairs.iter().enumerate() {
        let (mine, theirs) = CardLink::pair(a.timeout, active, passive);
        let (args, counts) = (a.clone(), Arc::new(Counts::new(&a.params, flow)));
        let passive_counts = counts.clone();
        launch(&mut lcores, passive, move |ctx| {
            device_side(
                ctx,
                &args,
                Role::Passive,
                passive_counts,
                |c| theirs.exchange(c, &args.gate),
                &mut |_, _| Ok(()),
                false,
            )
        })?;
        if flow == 0 {
            main_link = Some(mine);
            main_counts = Some(counts);
            continue;
        }
        let (args, tx) = (a.clone(), sample_tx.clone());
        launch(&mut lcores, active, move |ctx| {
            let mut sink = |k, s| send_sample(&tx, flow, k, s);
            let exchange = |c| mine.exchange(c, &args.gate);
            device_side(ctx, &args, Role::Active, counts, exchange, &mut sink, false)
        })?;
    }
    drop(sample_tx);
    let (link, counts) = main_link.zip(main_counts).expect("at least one pair");
    let mut out = Collector::new(a, pairs.len(), sample_rx, lcores.stop_flag().clone());
    let main = lcores
        .run_on_main(|ctx| {
            let (exchange, mut sink) = (|c| link.exchange(c, &a.gate), |k, s| out.add(k, s));
            device_side(ctx, a, Role::Active, counts, exchange, &mut sink, true)
        })
        .map_err(|e| RunError::Setup(format!("main lcore: {e}")))?;
    let rest = lcores.wait_all();
    out.finish(main, rest, Role::Active)
}

fn run_server(a: &RunArgs) -> Result<(), RunError> {
    let listener = TcpListener::bind((a.bind, a.port))
        .map_err(|e| RunError::Setup(format!("cannot listen on {}:{}: {e}", a.bind, a.port)))?;
    // -B 0 lets the OS choose: report the port a client must use.
    let port = listener.local_addr().map_or(a.port, |at| at.port());
    eprintln!("efapoll {}: waiting for a client on port {port}", a.app.name());
    // A client may take its time: only its handshake has a deadline.
    let conn = oob::accept(&listener, a.app, a.timeout, interrupt())?;
    let cores = pairs(a.lcores.lcores()).iter().map(|p| p.1).collect();
    run_remote(a, conn, Role::Passive, cores)
}

fn run_client(a: &RunArgs, host: &str) -> Result<(), RunError> {
    let conn = oob::connect(host, a.port, a.app.endpoint_name(), a.timeout)?;
    let cores = pairs(a.lcores.lcores()).iter().map(|p| p.0).collect();
    run_remote(a, conn, Role::Active, cores)
}

/// One side of every flow here, the other in the peer process; cards go
/// over `conn`, which then watches the peer until the end.
fn run_remote(a: &RunArgs, conn: Conn, role: Role, cores: Vec<LcoreId>) -> Result<(), RunError> {
    // The udp devices listen where the peer reached us (or we it).
    let udp_ip = conn.local_addr().map(|at| at.ip().to_canonical()).unwrap_or(a.udp_ip);
    let gate = SetupGate::new(cores.len());
    let a = &RunArgs { udp_ip, gate, ..a.clone() };
    let flows = cores.len();
    let list = CoreList::from_cores(cores.iter().copied())
        .ok()
        .and_then(|list| a.lcores.restricted_to(&list))
        .ok_or_else(|| RunError::Setup(format!("lcores: {cores:?} not in {}", a.lcores)))?;
    let mut lcores = new_lcores(list, a)?;
    let stop = lcores.stop_flag().clone();
    ctrlc(&stop);
    let (card_tx, card_rx) = mpsc::channel::<(usize, Card)>();
    let (sample_tx, sample_rx) = mpsc::channel();
    let (to_peer, from_main) = mpsc::channel();
    // Duration mode: the active sides' counts cross the control link; the
    // control thread fills the passive sides' in.
    let counts: Vec<Arc<Counts>> = (0..flows)
        .map(|flow| match role {
            Role::Active => Counts::remote(&a.params, flow, to_peer.clone()),
            Role::Passive => Counts::new(&a.params, flow),
        })
        .map(Arc::new)
        .collect();
    let mut replies = Vec::new();
    for (flow, &lcore) in cores.iter().enumerate().skip(1) {
        let (reply_tx, reply_rx) = mpsc::channel();
        replies.push(reply_tx);
        let (args, cards, samples) = (a.clone(), card_tx.clone(), sample_tx.clone());
        let flow_counts = counts[flow].clone();
        launch(&mut lcores, lcore, move |ctx| {
            let exchange = |c| {
                cards.send((flow, c)).map_err(|_| RunError::Stopped)?;
                reply_rx.recv().map_err(|_| RunError::Stopped)
            };
            let mut sink = |k, s| send_sample(&samples, flow, k, s);
            device_side(ctx, &args, role, flow_counts, exchange, &mut sink, false)
        })?;
    }
    drop((card_tx, sample_tx));
    let mut conn = Some(conn);
    let mut control = None;
    let mut out = Collector::new(a, flows, sample_rx, stop.clone());
    if role == Role::Active {
        out.to_peer = Some(to_peer.clone());
    }
    let relay = |mine: Card| -> Result<Card, RunError> {
        let mut cards = vec![mine];
        let mut others: Vec<Option<Card>> = vec![None; flows];
        for _ in 1..flows {
            let (flow, card) =
                recv_or_stop(&card_rx, a.timeout, Some(&stop)).map_err(|e| match e {
                    mpsc::RecvTimeoutError::Timeout => RunError::Timeout(format!(
                        "{} of {flows} flows' lcores set up within {} s",
                        1 + others.iter().flatten().count(),
                        a.timeout.as_secs_f64()
                    )),
                    mpsc::RecvTimeoutError::Disconnected => {
                        RunError::Setup("a flow's lcore failed its setup".into())
                    }
                })?;
            others[flow] = Some(card);
        }
        cards.extend(others.into_iter().skip(1).map(|c| c.expect("every flow's card")));
        let link = conn.as_mut().expect("unused until now");
        let mut theirs = oob::exchange(link, &cards, a.timeout)?.into_iter();
        let first = theirs.next().expect("one card per flow");
        // By value: a failure before this point drops the senders, which
        // ends the workers' wait.
        for (reply, card) in replies.into_iter().zip(theirs) {
            let _ = reply.send(card);
        }
        let link = conn.take().expect("unused until now");
        let outbox = (to_peer, from_main);
        control = Some(Control::spawn(link, stop.clone(), a, counts.clone(), outbox));
        Ok(first)
    };
    let main = lcores
        .run_on_main(|ctx| {
            let mut sink = |k, s| out.add(k, s);
            device_side(ctx, a, role, counts[0].clone(), relay, &mut sink, role == Role::Active)
        })
        .map_err(|e| RunError::Setup(format!("main lcore: {e}")))?;
    if main.is_err() {
        // The workers may still wait for their cards.
        stop.stop();
    }
    let rest = lcores.wait_all();
    let ours = out.conclude(main, rest, role);
    let Some(control) = control else {
        if let (Err(e), Some(conn)) = (&ours, conn) {
            oob::abort(conn, e);
        }
        return ours?.write();
    };
    let told = match &ours {
        Err(_) if interrupted() => Err(RunError::Interrupted),
        r => r.as_ref().map(|_| ()).map_err(Clone::clone),
    };
    let (theirs, peer_rows) = control.finish(&told);
    // Our lcores stop when the peer fails, and find it gone when it
    // exits: its failure, when it told it, is the cause.
    let cause = match (ours.as_ref().err(), theirs) {
        (None | Some(RunError::Stopped | RunError::PeerGone(_)), Err(e @ RunError::Peer(_))) => {
            Some(e)
        }
        (o, t) => RunError::first_cause(o.cloned().into_iter().chain(t.err())),
    };
    if let Some(e) = cause {
        return Err(e);
    }
    let mut ours = ours?;
    if role == Role::Passive {
        // The client measured; its rows are this run's results here too.
        ours.rows = peer_rows;
        note_batches(&ours.rows);
        note_windows(&ours.rows, a.params.window);
        warn_spread(&ours.rows);
        eprintln!(
            "efapoll {}: served {} flow(s) over {} size(s)",
            a.app.name(),
            flows,
            a.params.sizes.len()
        );
    }
    ours.write()
}

/// Says, after the table, what its `batch` column means for the sizes
/// timed in batches, each with its batch.
fn note_batches(rows: &[Row]) {
    let batched: Vec<String> = rows
        .iter()
        .filter_map(|row| match row {
            Row::Pingpong(r) if r.batch > 1 => Some(format!("{} B: {}", r.bytes, r.batch)),
            _ => None,
        })
        .collect();
    if !batched.is_empty() {
        eprintln!(
            "note: batch (last column) is round trips timed per clock read. A clock read costs \
             over 0.25% of these sizes' round trips, so they were timed in batches ({}): their \
             t_min to t_max are of batch means, t_avg is exact",
            batched.join(", ")
        );
    }
}

/// Warns of sizes whose round trips spread wider than their median.
fn warn_spread(rows: &[Row]) {
    if let Some(w) = report::spread_warning(rows) {
        eprintln!("{w}");
    }
}

/// Says which sizes ran with fewer operations in flight than `-W` asked
/// (verifying keeps a buffer per operation in flight, at most
/// [`VERIFY_BYTES`] of them), once, after the table.
fn note_windows(rows: &[Row], asked: u32) {
    let fewer: Vec<String> = rows
        .iter()
        .filter_map(|row| match row {
            Row::Streaming(r) if r.window < u64::from(asked) => {
                Some(format!("{} B with {}", r.bytes, r.window))
            }
            _ => None,
        })
        .collect();
    if !fewer.is_empty() {
        eprintln!(
            "note: -W {asked} with -c: verifying keeps a buffer per message in flight, {} MiB \
             at most, so these sizes ran with smaller windows: {}",
            VERIFY_BYTES >> 20,
            fewer.join(", ")
        );
    }
}

/// Gathers every flow's samples of each size on the main lcore, prints
/// the size's row, and writes the reports at the end.
struct Collector<'a> {
    a: &'a RunArgs,
    flows: usize,
    from_flows: mpsc::Receiver<(usize, usize, Sample)>,
    pending: Vec<Vec<Sample>>,
    rows: Vec<Row>,
    stop: StopFlag,
    /// Where rows go to the peer's table (a client's control link).
    to_peer: Option<mpsc::Sender<ToPeer>>,
}

/// A run's outcome on this side, before its files are written.
struct Outcome<'a> {
    a: &'a RunArgs,
    rows: Vec<Row>,
    /// The reporting sides' counters, summed over flows.
    counters: BTreeMap<String, u64>,
    /// The counters of the passive sides that ran in this process, when
    /// active ones report (empty otherwise).
    passive_counters: BTreeMap<String, u64>,
    /// The core-to-core looks before and after.
    probe: Option<CoreToCore>,
}

impl<'a> Collector<'a> {
    fn new(
        a: &'a RunArgs,
        flows: usize,
        from_flows: mpsc::Receiver<(usize, usize, Sample)>,
        stop: StopFlag,
    ) -> Collector<'a> {
        let pending = vec![Vec::new(); a.params.sizes.len()];
        let c = Collector { a, flows, from_flows, pending, rows: Vec::new(), stop, to_peer: None };
        c.print_header();
        c
    }

    fn print_header(&self) {
        let a = self.a;
        let unit = match a.app {
            App::Pingpong if a.op.echoes() => "; times in µs, half round trips".to_owned(),
            App::Pingpong => {
                format!("; times in µs, whole round trips (each {} is one)", a.op.name())
            }
            App::Streaming if a.gbits => "; Gb/s = 10^9 bits/s".to_owned(),
            App::Streaming => "; MB/s = 10^6 bytes/s".to_owned(),
        };
        let unit = match a.params.duration_ms {
            Some(ms) => format!("; {} s per size{unit}", ms as f64 / 1e3),
            None => unit,
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "# efapoll {}: -p {} -o {}, lcores {}, {} flow(s){unit}",
            a.app.name(),
            a.params.device,
            a.params.op,
            a.lcores,
            self.flows
        );
        let _ = writeln!(out, "{}", report::header(a.app, a.gbits));
    }

    /// Our own sample of size `k`: waits for the other flows' and prints.
    fn add(&mut self, k: usize, own: Sample) -> Result<(), RunError> {
        self.pending[k].push(own);
        let start = Instant::now();
        while self.pending[k].len() < self.flows {
            match self.from_flows.recv_timeout(Duration::from_millis(100)) {
                Ok((_, k2, sample)) => self.pending[k2].push(sample),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(RunError::Stopped),
                Err(mpsc::RecvTimeoutError::Timeout) if self.stop.is_stopped() => {
                    return Err(RunError::Stopped);
                }
                Err(mpsc::RecvTimeoutError::Timeout) if start.elapsed() > self.a.timeout => {
                    return Err(RunError::Timeout("another flow stopped measuring".into()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        let row = report::aggregate(&std::mem::take(&mut self.pending[k]));
        let line = report::format_row(&row, self.a.gbits);
        let _ = writeln!(std::io::stdout().lock(), "{line}");
        if let Some(to_peer) = &self.to_peer {
            // A peer gone is the control link's to report.
            let _ = to_peer.send(ToPeer::Row(row.clone()));
        }
        self.rows.push(row);
        Ok(())
    }

    /// The run's outcome: the first real error of any lcore, or the rows
    /// and the counters of the sides in `report_role` (and of the passive
    /// sides run here, when active ones report).
    fn conclude(
        self,
        main: FlowResult,
        rest: Vec<(LcoreId, Result<FlowResult, LcoreError>)>,
        report_role: Role,
    ) -> Result<Outcome<'a>, RunError> {
        let mut errors = Vec::new();
        let (mut counters, mut passive_counters) = (BTreeMap::new(), BTreeMap::new());
        let results = std::iter::once(main).chain(
            rest.into_iter()
                .map(|(_, r)| r.unwrap_or_else(|e| Err(RunError::Engine(e.to_string())))),
        );
        for result in results {
            match result {
                Ok(sides) => {
                    for (role, c) in sides {
                        if role == report_role {
                            report::merge_counters(&mut counters, c);
                        } else if role == Role::Passive {
                            report::merge_counters(&mut passive_counters, c);
                        }
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if let Some(e) = RunError::first_cause(errors) {
            return Err(e);
        }
        note_batches(&self.rows);
        note_windows(&self.rows, self.a.params.window);
        warn_spread(&self.rows);
        // Every lcore has stopped: the look after disturbs nothing.
        let probe = self.a.probe.map(CoreToCore::after);
        if let Some(w) = probe.as_ref().and_then(CoreToCore::warning) {
            eprintln!("{w}");
        }
        Ok(Outcome { a: self.a, rows: self.rows, counters, passive_counters, probe })
    }

    /// [`Collector::conclude`], then the files.
    fn finish(
        self,
        main: FlowResult,
        rest: Vec<(LcoreId, Result<FlowResult, LcoreError>)>,
        report_role: Role,
    ) -> Result<(), RunError> {
        self.conclude(main, rest, report_role)?.write()
    }
}

impl Outcome<'_> {
    /// Writes `--json` and `--plot`, if asked for.
    fn write(&self) -> Result<(), RunError> {
        let a = self.a;
        let report = Report {
            app: a.app,
            device: &a.params.device,
            op: &a.params.op,
            lcores: a.lcores.to_string(),
            window: (a.app == App::Streaming).then_some(u64::from(a.params.window)),
            meta: meta::of_run(a, self.probe.as_ref()),
            rows: &self.rows,
            counters: &self.counters,
            passive_counters: &self.passive_counters,
        };
        let cannot =
            |path: &PathBuf, e| RunError::Setup(format!("cannot write {}: {e}", path.display()));
        if let Some(path) = &a.json {
            report.write(path).map_err(|e| cannot(path, e))?;
        }
        if let Some(path) = &a.csv {
            report.write_csv(path).map_err(|e| cannot(path, e))?;
        }
        if let Some(path) = &a.plot
            && !self.rows.is_empty()
        {
            plot::draw(path, a.app, a.op, &a.params, &self.rows)
                .map_err(|e| RunError::Setup(format!("cannot draw {}: {e}", path.display())))?;
        }
        Ok(())
    }
}
