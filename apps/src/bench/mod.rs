//! The benchmark apps: pingpong and streaming.
//!
//! A run is a set of independent flows. Each flow has two sides over one
//! endpoint each: the *active* side (pingpong's initiator, streaming's
//! sender) measures, size by size, in a warmup then a measured phase; the
//! *passive* side (responder, receiver) follows the same plan by itself.
//! Every side busy-polls its endpoint from its lcore's run loop; a step
//! says whether it did work, so the lcore's busy/idle counters are real
//! utilisation. Where the sides run is [`run`]'s business. The passive
//! side of a one-sided run is a [`target::Target`] in either app.

/// Implements [`Side`] for a side struct with an `io: Io<D>` field and the
/// `Mr` field of the buffer the peer may reach.
macro_rules! impl_side {
    ($side:ident, $data:ident) => {
        impl<D: efapoll::device::Device> $crate::bench::Side for $side<D> {
            fn addr(&self) -> efapoll::wire::RawAddr {
                self.io.ep.addr()
            }
            fn data_mem(&self) -> $crate::bench::oob::MemDesc {
                $crate::bench::oob::MemDesc::of(&self.$data)
            }
            fn connect(
                &mut self,
                peer: &efapoll::wire::RawAddr,
                mem: $crate::bench::oob::MemDesc,
                keep_waiting: &mut dyn FnMut() -> Result<(), RunError>,
            ) -> Result<(), RunError> {
                self.io.connect(peer, mem, keep_waiting)
            }
            fn counters(&self) -> Vec<(String, u64)> {
                self.io.counters()
            }
        }
    };
}

pub mod counts;
pub mod drive;
pub mod meta;
pub mod oob;
pub mod op;
pub mod pingpong;
pub mod plot;
pub mod probe;
pub mod report;
pub mod run;
pub mod sizes;
pub mod streaming;
pub mod target;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use report::Sample;

/// Which app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    Pingpong,
    Streaming,
}

impl App {
    pub fn name(self) -> &'static str {
        match self {
            App::Pingpong => "pingpong",
            App::Streaming => "streaming",
        }
    }

    /// The Relink endpoint name a server of this app answers to.
    pub fn endpoint_name(self) -> &'static str {
        match self {
            App::Pingpong => "efapoll-pingpong",
            App::Streaming => "efapoll-streaming",
        }
    }
}

/// Packets the first size's warmup moves at least: more than the
/// devices' pools hold (2048 buffers).
pub const PRIME_PACKETS: u64 = 4096;

/// Roughly what one packet carries, to count packets per message.
const PACKET_PAYLOAD: u64 = 8000;

/// With `-c`, each side's buffers of distinct messages are capped at this
/// many bytes; streaming's window shrinks to fit large sizes under it.
pub const VERIFY_BYTES: u64 = 64 << 20;

/// What both sides of a run must agree on; the out-of-band exchange
/// compares them before any traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    pub app: String,
    pub device: String,
    pub op: String,
    pub sizes: Vec<u64>,
    /// Measured iterations, per size.
    pub iterations: Vec<u64>,
    pub warmup: u64,
    /// Streaming: operations in flight (pingpong: 1).
    pub window: u32,
    pub verify: bool,
    pub flows: usize,
    /// Duration mode (`-D`): each size's measured phase runs this long and
    /// its count is whatever fit ([`counts`]); `iterations` are then 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Whether the first size warms up over [`PRIME_PACKETS`]: not when
    /// lcores share CPUs, a functional run where the pools' first touch
    /// skews no timing that matters, and where with hundreds of flows
    /// taking turns on a CPU those packets would take minutes.
    #[serde(default = "yes")]
    pub prime: bool,
}

fn yes() -> bool {
    true
}

impl Params {
    /// Unmeasured iterations before size `k`. The first size warms up for
    /// at least [`PRIME_PACKETS`] packets, so that the first touch of every
    /// packet buffer of the devices' pools (a page fault each) happens
    /// before anything is measured.
    pub fn warmup_for(&self, k: usize) -> u64 {
        if k > 0 || !self.prime {
            return self.warmup;
        }
        let packets_per_message = self.sizes[0] / PACKET_PAYLOAD + 1;
        self.warmup.max(PRIME_PACKETS.div_ceil(packets_per_message))
    }

    /// Iterations of size `k`, warmup included (not known in advance in
    /// duration mode: see [`counts::Counts::total`]).
    pub fn total(&self, k: usize) -> u64 {
        self.warmup_for(k) + self.iterations[k]
    }

    /// Duration mode's measured time per size.
    pub fn duration(&self) -> Option<std::time::Duration> {
        self.duration_ms.map(std::time::Duration::from_millis)
    }

    /// The largest size.
    pub fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Streaming: operations in flight at `size`. Verifying keeps a buffer
    /// per operation in flight, so large sizes get fewer.
    pub fn window_for(&self, size: u64) -> u64 {
        let window = self.window as u64;
        if self.verify { window.min((VERIFY_BYTES / size.max(1)).max(1)) } else { window }
    }

    /// Bytes of a buffer for `per_size(size)` messages of each size: one
    /// message's worth without `-c`, where every message shares it.
    pub fn buffer_len(&self, per_size: impl Fn(u64) -> u64) -> u64 {
        if !self.verify {
            return self.max_size();
        }
        self.sizes.iter().map(|&s| per_size(s) * s).max().unwrap_or(0)
    }

    /// Streaming: receives kept posted at `size`: twice the window, so the
    /// sender never finds none posted (each verified into its own buffer).
    /// With -o smbd, the connection's credits more: its receives are
    /// posted into the buffers of the messages they may carry (direct
    /// placement), which must be posted further ahead than its receives.
    pub fn depth_for(&self, size: u64) -> u64 {
        let mut depth = 2 * self.window as u64;
        if self.op == op::OpKind::Smbd.name() {
            depth += op::smbd_params(self).receive_credit_max as u64;
        }
        if self.verify { depth.min((VERIFY_BYTES / size.max(1)).max(1)) } else { depth }
    }

    /// The differences from the peer's parameters, each naming its option.
    pub fn diff(&self, peer: &Params) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |option: &str, here: String, there: String| {
            if here != there {
                out.push(format!("{option}: here {here}, peer {there}"));
            }
        };
        let list = |v: &[u64]| v.iter().map(|s| sizes::human(*s)).collect::<Vec<_>>().join(",");
        field("app", self.app.clone(), peer.app.clone());
        // efa and udp meet on one wire: softefa carries EFA's verbs over
        // udp's SRD, so an efa side on it talks to a udp peer.
        let wire = |d: &str| if d == "efa" { "udp" } else { d }.to_owned();
        if wire(&self.device) != wire(&peer.device) {
            field("-p", self.device.clone(), peer.device.clone());
        }
        field("-o", self.op.clone(), peer.op.clone());
        field("-S", list(&self.sizes), list(&peer.sizes));
        field("-I", list(&self.iterations), list(&peer.iterations));
        field("-w", self.warmup.to_string(), peer.warmup.to_string());
        field("-W", self.window.to_string(), peer.window.to_string());
        field("-c", self.verify.to_string(), peer.verify.to_string());
        let prime = |p: bool| if p { "4096 packets" } else { "-w only (lcores share CPUs)" };
        field("first size's warmup", prime(self.prime).into(), prime(peer.prime).into());
        let secs =
            |ms: Option<u64>| ms.map_or("none".into(), |ms| format!("{} s", ms as f64 / 1e3));
        field("-D", secs(self.duration_ms), secs(peer.duration_ms));
        field("-l (flows)", self.flows.to_string(), peer.flows.to_string());
        out
    }
}

/// What one step of a side did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Worked,
    /// The phase is complete.
    Done,
}

impl From<bool> for Phase {
    fn from(worked: bool) -> Phase {
        if worked { Phase::Worked } else { Phase::Idle }
    }
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// Creating a device or an endpoint, registering memory, connecting.
    Setup(String),
    /// The engine refused an operation or failed one.
    Engine(String),
    PeerGone(String),
    /// Data or sizes that are not what was sent.
    Verify(String),
    /// Nothing moved for too long.
    Timeout(String),
    /// The two sides were started with different parameters.
    Mismatch(String),
    /// The peer process reported a failure.
    Peer(String),
    /// Stopped by Ctrl-C, or because another lcore failed.
    Stopped,
    /// A signal (SIGINT, SIGTERM, SIGHUP) ended the run.
    Interrupted,
}

impl RunError {
    /// Of several lcores' errors, the one that explains the run: any but
    /// `Stopped`, which only follows another.
    pub fn first_cause(errors: impl IntoIterator<Item = RunError>) -> Option<RunError> {
        let mut first = None;
        for e in errors {
            if e != RunError::Stopped {
                return Some(e);
            }
            first.get_or_insert(e);
        }
        first
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Setup(m) => write!(f, "setup failed: {m}"),
            RunError::Engine(m) => write!(f, "engine error: {m}"),
            RunError::PeerGone(m) => write!(f, "peer gone: {m}"),
            RunError::Verify(m) => write!(f, "verification failed: {m}"),
            RunError::Timeout(m) => write!(f, "timeout: {m}"),
            RunError::Mismatch(m) => write!(f, "parameter mismatch with the peer: {m}"),
            RunError::Peer(m) => write!(f, "the peer failed: {m}"),
            RunError::Stopped => write!(f, "interrupted"),
            RunError::Interrupted => {
                write!(f, "interrupted by a signal (SIGINT, SIGTERM or SIGHUP)")
            }
        }
    }
}

/// The measuring side of a flow.
pub trait ActiveSide {
    /// Starts size `k` of the plan with its warmup.
    fn start(&mut self, k: usize);
    /// Starts the measured iterations of the current size.
    fn start_measured(&mut self);
    fn step(&mut self) -> Result<Phase, RunError>;
    /// Iterations of the current phase done, and its total, for the live
    /// progress line.
    fn progress(&self) -> (u64, u64);
    /// The measurement of the size just finished; `busy_pct` is the
    /// lcore's utilisation over its measured phase.
    fn sample(&mut self, busy_pct: f64) -> Sample;
}

/// The other side: runs the whole plan by itself.
pub trait PassiveSide {
    fn step(&mut self) -> Result<bool, RunError>;
    fn is_done(&self) -> bool;
    /// Whether the peer's traffic shows here, so that silence for the
    /// stall timeout means the peer is gone.
    fn sees_traffic(&self) -> bool {
        true
    }
}

/// What every side has: an endpoint to connect and report on.
pub trait Side {
    /// The endpoint's raw address, for the peer.
    fn addr(&self) -> efapoll::wire::RawAddr;
    /// The buffer the peer may reach.
    fn data_mem(&self) -> oob::MemDesc;
    /// Inserts the peer's address and notes its buffer. While the device
    /// says "not yet" (a shm peer that has not granted our lane), asks
    /// `keep_waiting` whether to try again.
    fn connect(
        &mut self,
        peer: &efapoll::wire::RawAddr,
        mem: oob::MemDesc,
        keep_waiting: &mut dyn FnMut() -> Result<(), RunError>,
    ) -> Result<(), RunError>;
    fn counters(&self) -> Vec<(String, u64)>;
}
