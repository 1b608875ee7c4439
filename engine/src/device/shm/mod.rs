//! `shm`: endpoints in processes or threads of one host, talking through
//! shared memory.
//!
//! Each [`ShmDevice`] receives through lanes, one per sending peer (see
//! `ring`): a ring each, in a segment of its own made when the lane is
//! granted, an anonymous memory file whose size is sealed, with no name
//! anywhere. Its raw address is this host's GID, a random QPN and a random
//! connid, and it listens on an abstract Unix socket named by that address
//! (see `rendezvous`), where a thread of the device grants lanes and hands
//! over segments. A sender asks for a lane once, at `insert_addr`, gets
//! that lane's descriptor with it (and no other) and maps it; the receiver
//! maps every lane it granted, and keeps who holds which in its own
//! memory. `post_send` copies the packet into the next slot
//! of its lane with plain stores (no locked instruction: the lane has one
//! producer); the receiver's `poll` copies slots into its posted receive
//! buffers. Registered regions are sealed segments of their own, which a
//! peer asks the owner for by key on first use, to do RDMA read and write
//! by copy after checking the key, the bounds and the rights in the
//! region's header. They belong to a [`ShmDomain`]: the devices that
//! lcores of one process make from one domain share its registrations (a
//! peer reaches one through any of them); [`ShmDevice::new`] makes a
//! device in a domain of its own.
//!
//! # Threat model
//!
//! Another local user can neither crash, hang nor impersonate:
//!
//! * nothing is opened by name (no `/dev/shm` files, no sweep of them), so
//!   files planted there (a FIFO, a fake segment, every name) are never
//!   looked at; socket names carry a random 32-bit connid, drawn before
//!   binding, so they cannot be taken ahead of a device or run out;
//! * a segment's size is sealed before anyone sees it, and one handed to
//!   us is mapped only with those seals, so no process can shrink it under
//!   a mapping (a SIGBUS);
//! * a lane is granted only to a process of our user that owns the address
//!   it claims (the kernel's `SO_PEERCRED` of its request, and of the
//!   socket of that address), and the receiver takes a lane's packets as
//!   from the address it granted it to; regions are handed to our user's
//!   processes only. A request that fails a check is counted (`refused`)
//!   and dropped;
//! * segments are taken from our user's processes only: the socket at a
//!   peer's address must be our user's (the kernel's `SO_PEERCRED`, looked
//!   at before a byte goes to it), else the peer is refused
//!   ([`DeviceError::OtherUser`] from `insert_addr`, `RemoteAccess` for an
//!   RDMA operation; counted, `strangers`). So a stranger that a control
//!   link names as the peer, or that binds the name of a peer whose
//!   process went, hands us nothing to map. Root is no exception: a root
//!   device talks to root's devices only;
//! * no socket holds a poller: connecting never waits on a full backlog,
//!   and an RDMA operation on a region not mapped yet waits for the
//!   owner's answer at most 20 ms in the call, then as
//!   back-pressure (`post_rdma` takes fewer) until the answer comes or 30
//!   s pass (`PeerUnreachable`, counted: `ask_timeouts`). Only set-up
//!   waits in a call: `insert_addr`, for a stopped peer up to
//!   `ShmConfig::hello_wait` (then `Again`: call again) and in all 30 s
//!   (`NoAnswer`).
//!
//! A process of the same user cannot write or map another sender's lane
//! (its descriptor went to that sender alone, and lanes have no name), nor
//! what the receiver keeps of its lanes (private memory), nor be taken for
//! another sender: a packet in a lane is from the process the lane was
//! granted to, or is dropped (malformed, counted). Nothing it writes can
//! make the device read or write outside a mapping, or block. It can
//! still: write its own lane (forge, garble or close it: what it sends
//! arrives as its own, and a closed or garbled lane is reclaimed); take
//! lanes as itself until none is left (the next senders are told `Again`
//! until it closes or dies); map, read and write a region whose key it
//! learned (keys are 64 random bits); hold the rendezvous thread up to 5 s
//! a request, which delays others' set-up. A process allowed to trace
//! ours (`/proc/<pid>/mem`, ptrace) can do anything.
//!
//! Semantics follow the sim device:
//!
//! * a send completes when the receiver has taken the packet out of its
//!   ring (the sender watches the head it publishes after each burst), so a
//!   receiver that stops polling, or has no receive buffer posted (counted
//!   as an RNR wait), back-pressures the sender through `tx_depth`; a full
//!   lane makes `post_send` take fewer;
//! * the receiver reports `Source::Known(ah)` only for a sender whose
//!   address (QPN and connid) it inserted, else `Source::Unknown { qpn }`;
//! * RDMA read and write run when posted and complete at the next poll
//!   (the first on a peer's region once the peer handed it over); a
//!   write with immediate data also puts a notice in the target's ring that
//!   consumes a receive buffer there, and completes when it is consumed;
//! * a peer that closed, or whose process died, fails what is outstanding
//!   to it and what is posted to it with `PeerUnreachable`; a sender that
//!   closed or died has what it published delivered, then its lane is
//!   dropped, its place free for the next sender. Death is noticed by a
//!   liveness check (`kill(pid, 0)`) that runs at most once per
//!   millisecond, and only while something is outstanding or a sender
//!   holds a lane.
//!
//! A transmit slot stays taken until its completion is polled, so the
//! completion queue never holds more than `tx_depth` entries and nothing
//! on the send, receive or poll paths allocates or makes a system call.
//!
//! Limits: Linux only (memory files, abstract sockets, `/proc` tells
//! zombies); one user's processes talk (another user's are refused);
//! processes must share a network namespace (abstract socket names live
//! there) and a pid namespace (liveness is a pid check); a region's memory
//! is reserved at registration, a lane's when it is granted, and refused
//! (ENOMEM) beyond what the host has available; a lost peer's mappings
//! stay until the device drops, so
//! that nothing it left behind can fault.

mod map;
mod rendezvous;
mod ring;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use map::{Mapping, hdr, pid_alive};
use rendezvous::{Rendezvous, Serve, Waited};
use ring::{Kind, Lane, LaneState, Record};

use super::mem::frame_stride;
use super::regions::{Attached, Registrations};
use super::{
    Access, Ah, BufId, Caps, CqOp, CqStatus, Cqe, Device, DeviceError, Domain, Mr, MrId, RdmaOp,
    RdmaWr, SendWr, Source, random_u64,
};
use crate::wire::RawAddr;

/// The device's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmConfig {
    /// Largest packet, and the payload of a ring slot.
    pub mtu: usize,
    /// Packet buffers (private memory).
    pub bufs: u32,
    /// Outstanding sends and RDMA operations, completions not yet polled
    /// included.
    pub tx_depth: usize,
    /// Posted receive buffers.
    pub rx_depth: usize,
    /// Senders this device can receive from at once: each is granted a
    /// lane (a ring in a segment of its own, made then), and `insert_addr`
    /// answers `Again` while every lane is taken.
    pub lanes: u32,
    /// Slots of each lane's ring: a power of two, at least 2. Packets that
    /// wait for a receive buffer wait here. A lane holds `ring_slots`
    /// slots of `mtu` bytes.
    pub ring_slots: u32,
    /// Largest RDMA operation.
    pub max_rdma_size: u64,
    /// How long one `insert_addr` call waits for the peer to grant our
    /// lane. A peer that has not answered then (stopped, or its answering
    /// thread starved of a CPU) makes the call answer `Again`, and the
    /// next call for that address waits on the same ask; 30 s after it
    /// was made, `NoAnswer`. The default waits the 30 s in one call; a
    /// program that must stay responsive (to a signal, to its other work)
    /// waits less and calls again.
    pub hello_wait: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            mtu: 8192,
            bufs: 2048,
            tx_depth: 512,
            rx_depth: 512,
            // 16 MiB of slots: sixteen senders at once, each with a ring
            // deeper than the apps' default window (64); 256-slot rings
            // for eight streamed no faster here.
            lanes: 16,
            ring_slots: 128,
            max_rdma_size: 1 << 30,
            hello_wait: rendezvous::ASK_TIMEOUT,
        }
    }
}

/// What happened at one device, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShmStats {
    /// Packets put into peers' rings.
    pub sent: u64,
    /// Packets delivered into this device's receive buffers.
    pub delivered: u64,
    /// Polls that found a packet waiting and no receive buffer posted.
    pub rnr_waits: u64,
    /// Times a peer's ring was full when posting to it.
    pub ring_full: u64,
    /// RDMA operations refused by the target's registration.
    pub remote_access_errors: u64,
    /// Ring slots dropped as malformed (a peer wrote garbage).
    pub malformed: u64,
    /// Lanes freed after their sender closed or died.
    pub lanes_reclaimed: u64,
    /// Liveness checks run.
    pub liveness_checks: u64,
    /// Peers found closed or dead.
    pub peers_lost: u64,
    /// Requests refused at our rendezvous socket: another user, a process
    /// claiming an address not its own, garbage.
    pub refused: u64,
    /// Peers refused at our end: the socket at their address is another
    /// user's (we never asked it for a segment, let alone mapped one).
    pub strangers: u64,
    /// Lanes and regions asked for that no answer came for in time (a
    /// stopped peer): the `insert_addr` or the operations failed.
    pub ask_timeouts: u64,
}

/// Why a device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The configuration is not usable.
    #[error("invalid shm config: {0}")]
    Config(&'static str),
    /// No free address after many random draws (only a host with
    /// billions of devices would see it).
    #[error("no free shm address")]
    NoFreeQpn,
    /// Creating its socket, or the thread that answers on it, failed.
    #[error("shm segment: {0}")]
    Segment(#[from] io::Error),
}

/// Region segments start their data on a page of its own.
const REGION_DATA: usize = 4096;

/// How often, at most, the liveness check runs.
const LIVENESS_PERIOD: Duration = Duration::from_millis(1);

/// How often, at most, the senders holding our lanes are checked for
/// life (a closed sender is seen at every liveness check).
const LANE_PID_PERIOD: Duration = Duration::from_millis(100);

/// Polls with work outstanding between looks at the clock: a spinning
/// poller reads it every few microseconds, not on every spin.
const CLOCK_EVERY_POLLS: u32 = 64;

const NO_PEER: u32 = u32::MAX;

/// How long an RDMA operation waits, the first time, for the answer to
/// its ask for the target's region (a few scheduler ticks of a busy
/// peer's thread); then it waits as back-pressure, not in a call.
const ASK_WAIT: Duration = Duration::from_millis(20);

/// Most lanes a device may grant at once.
const MAX_LANES: u32 = 4096;

/// A GID naming this host: the shm GID prefix and bytes of the machine id,
/// so that an address from another host is refused.
fn host_gid() -> [u8; 16] {
    static GID: OnceLock<[u8; 16]> = OnceLock::new();
    *GID.get_or_init(|| {
        let mut gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, b'S', b'H', 0, 0, 0, 0, 0, 0];
        let id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
        let hex = id.trim().as_bytes();
        for (i, b) in gid[10..].iter_mut().enumerate() {
            let byte = hex.get(2 * i..2 * i + 2).and_then(|h| std::str::from_utf8(h).ok());
            *b = byte.and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0);
        }
        gid
    })
}

/// An operation waiting for its packet to be consumed.
#[derive(Debug, Clone, Copy)]
struct Pending {
    pos: u32,
    op: CqOp,
    wr_id: u64,
}

/// A peer: our lane to it, mapped once, and what we have outstanding to
/// it.
#[derive(Debug)]
struct Peer {
    addr: RawAddr,
    /// Our lane to it, and the position we publish at next.
    lane: Lane,
    tail: u32,
    /// Its head of our lane as we last read it: room up to a lap past it.
    seen_head: u32,
    pid: u32,
    in_book: bool,
    dead: bool,
    /// Its ring was full when we posted: check it is alive.
    suspect: bool,
    /// In `ShmDevice::active`.
    active: bool,
    /// In ring order, which is the order the peer consumes them.
    pending: VecDeque<Pending>,
    /// Its regions we mapped, by key.
    regions: RemoteRegions,
    /// Its regions we asked for and have no answer for yet.
    asks: Vec<RegionAsk>,
}

/// A peer's regions we mapped, by key. An RDMA operation looks its
/// target up here: the last two found are tried first (a stream reads or
/// writes one or two regions over and over: a message's buffer, a framing
/// header's), then a SipHash of the key, which the peer chooses.
#[derive(Debug, Default)]
struct RemoteRegions {
    maps: Vec<(u64, Mapping)>,
    /// Index in `maps` of each key.
    by_key: HashMap<u64, usize>,
    /// Indices in `maps` of the last two found, the latest first. A stale
    /// one (after a removal) holds another key or none, so it misses.
    recent: [usize; 2],
}

impl RemoteRegions {
    /// The index of region `key`, if mapped; it is tried first next time.
    fn find(&mut self, key: u64) -> Option<usize> {
        let [a, b] = self.recent;
        let holds = |i: usize| self.maps.get(i).is_some_and(|&(k, _)| k == key);
        if holds(a) {
            return Some(a);
        }
        let i = if holds(b) { b } else { *self.by_key.get(&key)? };
        self.recent = [i, a];
        Some(i)
    }

    /// The mapping at `i`, from [`RemoteRegions::find`] or an insert.
    fn at(&self, i: usize) -> &Mapping {
        &self.maps[i].1
    }

    /// Adds region `key` (not mapped yet); returns its index.
    fn insert(&mut self, key: u64, map: Mapping) -> usize {
        debug_assert!(!self.by_key.contains_key(&key));
        let i = self.maps.len();
        self.maps.push((key, map));
        self.by_key.insert(key, i);
        self.recent = [i, self.recent[0]];
        i
    }

    /// Forgets region `key`, unmapping it.
    fn remove(&mut self, key: u64) {
        let Some(i) = self.by_key.remove(&key) else { return };
        self.maps.swap_remove(i);
        if let Some(&(moved, _)) = self.maps.get(i) {
            self.by_key.insert(moved, i);
        }
    }
}

/// A peer's region asked for, not yet answered.
#[derive(Debug)]
struct RegionAsk {
    key: u64,
    ask: rendezvous::Pending,
}

/// Why an RDMA operation cannot use a peer's region (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoRegion {
    /// Asked for, not answered yet: the operation waits (back-pressure).
    Waiting,
    /// The operation fails so.
    Failed(CqStatus),
}

impl Peer {
    fn alive(&self) -> bool {
        self.lane.map().u32_at(hdr::STATE).load(Relaxed) == hdr::STATE_READY && pid_alive(self.pid)
    }
}

/// The answer to our ask for region `key` of the peer at `addr`, among
/// `asks` under way to it: started if none is (waiting up to [`ASK_WAIT`]
/// then), else looked at without waiting.
fn region_answer(
    asks: &mut Vec<RegionAsk>,
    addr: RawAddr,
    key: u64,
    stats: &mut ShmStats,
) -> Result<rendezvous::Answer, NoRegion> {
    let (i, wait) = match asks.iter().position(|a| a.key == key) {
        Some(i) => (i, Duration::ZERO),
        None => {
            // Asks that no operation came back for end here.
            asks.retain(|a| !a.ask.expired());
            let ask = rendezvous::Pending::region(addr.qpn, addr.connid, key);
            asks.push(RegionAsk { key, ask });
            (asks.len() - 1, ASK_WAIT)
        }
    };
    let failed = match asks[i].ask.wait(wait) {
        Ok(Waited::NotYet) => return Err(NoRegion::Waiting),
        Ok(Waited::Answer(answer)) => {
            asks.swap_remove(i);
            return Ok(answer);
        }
        Ok(Waited::TimedOut) => {
            stats.ask_timeouts += 1;
            CqStatus::PeerUnreachable
        }
        Err(rendezvous::AskError::Stranger { .. }) => {
            stats.strangers += 1;
            CqStatus::RemoteAccess
        }
        Err(rendezvous::AskError::Io(_)) => CqStatus::RemoteAccess,
    };
    asks.swap_remove(i);
    Err(NoRegion::Failed(failed))
}

/// A region a device uses: the domain's mapping of it.
#[derive(Debug, Clone)]
struct Region {
    map: Arc<Mapping>,
    len: usize,
}

/// What a [`ShmDomain`] keeps of a registration besides the mapping its
/// devices share: the segment's descriptor, handed to peers that ask.
#[derive(Debug)]
struct Segment {
    region: Region,
    fd: OwnedFd,
}

impl Drop for Segment {
    /// The registration ended: peers that mapped it see it closed and
    /// refuse access; no peer gets it any more.
    fn drop(&mut self) {
        self.region.map.u32_at(hdr::STATE).store(hdr::STATE_CLOSED, Release);
    }
}

/// A protection domain on shm: the registrations that the devices of this
/// process made from it share (one region segment, one key, reachable by
/// peers through any of them), as EFA's PD is shared by the QPs of a
/// process's lcores. `Send` and `Sync`: lcores make their devices from
/// clones of it; set-up work takes its lock, the hot path never does.
#[derive(Debug, Clone)]
pub struct ShmDomain {
    cfg: ShmConfig,
    regs: Arc<Mutex<Registrations<Segment>>>,
}

impl ShmDomain {
    /// A domain whose devices take `cfg`.
    pub fn new(cfg: ShmConfig) -> ShmDomain {
        ShmDomain { cfg, regs: Arc::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registrations<Segment>> {
        // A panic elsewhere leaves the table consistent: every change is
        // one slot store.
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates a region segment of `len` bytes and registers it, used by
    /// `queues` devices.
    fn create(&self, len: u64, access: Access, queues: u32) -> Result<(Mr, Region), DeviceError> {
        let data_len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        let seg_len = data_len.checked_add(REGION_DATA).ok_or(DeviceError::Registration)?;
        let access = access | Access::LOCAL;
        let (map, fd) = Mapping::create(seg_len)
            .map_err(|e| DeviceError::os("creating a region's shared memory", &e))?;
        let key = loop {
            // Keys are hard to guess (a peer asks for a region by key) and
            // unique in the domain.
            let key = random_u64();
            if !self.lock().has_key(key) {
                break key;
            }
        };
        let base = map.addr_at(REGION_DATA);
        map.u32_at(hdr::PID).store(std::process::id(), Release);
        map.u64_at(hdr::INCARNATION).store(random_u64(), Relaxed);
        map.u64_at(hdr::KEY).store(key, Relaxed);
        map.u64_at(hdr::LEN).store(len, Relaxed);
        map.u64_at(hdr::BASE).store(base, Relaxed);
        map.u32_at(hdr::ACCESS).store(access.bits(), Relaxed);
        map.u32_at(hdr::VERSION).store(hdr::VERSION_VALUE, Relaxed);
        map.u32_at(hdr::KIND).store(hdr::KIND_REGION, Relaxed);
        map.u32_at(hdr::STATE).store(hdr::STATE_READY, Relaxed);
        map.u64_at(hdr::MAGIC).store(hdr::MAGIC_VALUE, Release);
        let region = Region { map: Arc::new(map), len: data_len };
        let mut mr = Mr { id: MrId(0), key, addr: base, len, access };
        let mut regs = self.lock();
        let segment = regs.insert(queues, |id| {
            mr.id = id;
            (mr, Segment { region, fd })
        });
        Ok((mr, segment.region.clone()))
    }

    /// A device starts using registration `mr`.
    fn attach(&self, mr: &Mr) -> Result<Region, DeviceError> {
        self.lock().attach(mr).map(|s| s.region.clone())
    }

    /// A copy of registration `key`'s descriptor, for a peer that asks.
    fn region_fd(&self, key: u64) -> Option<OwnedFd> {
        let regs = self.lock();
        regs.find_key(key)?.region.fd.try_clone().ok()
    }

    /// A device stops using registration `id`; the registration ends with
    /// its last device unless the domain holds it.
    fn detach(&self, id: MrId) {
        self.lock().detach(id);
    }
}

impl Domain for ShmDomain {
    type Device = ShmDevice;

    fn device(&self) -> Result<ShmDevice, DeviceError> {
        ShmDevice::in_domain(self.clone()).map_err(|e| match e {
            ShmError::Config(_) => DeviceError::NotSupported,
            _ => DeviceError::Again,
        })
    }

    fn register(&self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        self.create(len, access, 0).map(|(mr, _)| mr)
    }

    fn deregister(&self, mr: &Mr) -> Result<(), DeviceError> {
        self.lock().deregister(mr).map(drop)
    }
}

/// A lane a sender holds: where we read it next, and who it is (as the
/// rendezvous thread verified; nothing in the lane says).
#[derive(Debug)]
struct RxLane {
    lane: Lane,
    head: u32,
    qpn: u16,
    connid: u32,
    pid: u32,
}

/// What a device's rendezvous thread answers with: our address and lanes'
/// geometry (to make lanes) and the domain (its registrations).
#[derive(Debug)]
struct Served {
    cfg: ShmConfig,
    qpn: u16,
    connid: u32,
    domain: ShmDomain,
}

impl Serve for Served {
    fn lanes(&self) -> u32 {
        self.cfg.lanes
    }

    fn lane(&self) -> io::Result<(Lane, OwnedFd)> {
        let (lane, fd) = Lane::create(self.cfg.ring_slots, self.cfg.mtu)?;
        let h = lane.map();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        h.u64_at(hdr::INCARNATION).store(now.as_nanos() as u64, Relaxed);
        h.u32_at(hdr::CONNID).store(self.connid, Relaxed);
        h.u32_at(hdr::QPN).store(self.qpn as u32, Relaxed);
        lane.open_for_business();
        Ok((lane, fd))
    }

    fn region(&self, key: u64) -> Option<OwnedFd> {
        self.domain.region_fd(key)
    }
}

/// An endpoint on shared memory. See the module documentation.
#[derive(Debug)]
pub struct ShmDevice {
    /// Its registrations' domain, shared with the other devices made from it.
    domain: ShmDomain,
    caps: Caps,
    cfg: ShmConfig,
    addr: RawAddr,
    /// The lanes senders hold, in the order we take packets from them.
    rx_lanes: Vec<RxLane>,
    /// Our socket and the thread that answers on it, with the lanes it
    /// granted (`grants`).
    rendezvous: Rendezvous,
    /// `rendezvous.grants.generation` when we last took grants up.
    seen_grants: u32,
    /// The lane the next poll reads first (round robin).
    next_lane: usize,
    /// Packet buffers: private memory, `bufs` frames of `mtu` bytes,
    /// `stride` apart.
    pool: Box<[u8]>,
    /// `frame_stride(mtu)`, kept rather than computed for every packet.
    stride: usize,
    posted_rx: VecDeque<BufId>,
    /// Completions of our operations, not yet polled.
    cq: VecDeque<Cqe>,
    /// Operations outstanding or completed and not yet polled.
    tx_used: usize,
    /// By `Ah`.
    peers: Vec<Peer>,
    /// Lanes asked for at `insert_addr` and not granted yet.
    hellos: Vec<(RawAddr, rendezvous::Pending)>,
    /// By QPN: the peer inserted last with that QPN.
    by_qpn: Box<[u32]>,
    /// Peers with pending operations or suspected of death.
    active: Vec<u32>,
    regions: Attached<Region>,
    polls_since_clock: u32,
    last_check: Instant,
    last_lane_check: Instant,
    stats: ShmStats,
}

impl ShmDevice {
    /// Creates a device in a domain of its own: a random address and the
    /// socket and thread that answer on it (lanes are made as granted).
    pub fn new(cfg: ShmConfig) -> Result<ShmDevice, ShmError> {
        ShmDevice::in_domain(ShmDomain::new(cfg))
    }

    /// A device in `domain` (see [`ShmDomain`]), with its configuration.
    fn in_domain(domain: ShmDomain) -> Result<ShmDevice, ShmError> {
        let cfg = domain.cfg;
        if cfg.mtu < 64 || cfg.mtu > u32::MAX as usize / 2 {
            return Err(ShmError::Config("mtu must be at least 64"));
        }
        if cfg.bufs == 0 || cfg.tx_depth == 0 || cfg.rx_depth == 0 {
            return Err(ShmError::Config("bufs, tx_depth and rx_depth must be positive"));
        }
        if cfg.ring_slots < 2 || !cfg.ring_slots.is_power_of_two() {
            return Err(ShmError::Config("ring_slots must be a power of two, at least 2"));
        }
        if cfg.lanes == 0 || cfg.lanes > MAX_LANES {
            return Err(ShmError::Config("lanes must be from 1 to 4096"));
        }
        let stride = frame_stride(cfg.mtu);
        let pool_len =
            stride.checked_mul(cfg.bufs as usize).ok_or(ShmError::Config("bufs * mtu"))?;
        Lane::segment_len(cfg.ring_slots, cfg.mtu).ok_or(ShmError::Config("ring_slots * mtu"))?;
        let (qpn, connid, rendezvous) = ShmDevice::listen(&domain)?;
        let caps = Caps {
            mtu: cfg.mtu,
            bufs: cfg.bufs,
            tx_depth: cfg.tx_depth,
            rx_depth: cfg.rx_depth,
            // Every send is copied when posted.
            inline_size: cfg.mtu,
            max_rdma_size: cfg.max_rdma_size,
            rdma_read: true,
            rdma_write: true,
            device_version: 0x53,
            external_memory: false,
        };
        Ok(ShmDevice {
            domain,
            caps,
            cfg,
            addr: RawAddr { gid: host_gid(), qpn, connid },
            seen_grants: 0,
            rendezvous,
            rx_lanes: Vec::with_capacity(cfg.lanes as usize),
            next_lane: 0,
            pool: vec![0u8; pool_len].into_boxed_slice(),
            stride,
            posted_rx: VecDeque::with_capacity(cfg.rx_depth),
            cq: VecDeque::with_capacity(cfg.tx_depth),
            tx_used: 0,
            peers: Vec::new(),
            hellos: Vec::new(),
            by_qpn: vec![NO_PEER; 1 << 16].into_boxed_slice(),
            active: Vec::new(),
            regions: Attached::default(),
            polls_since_clock: 0,
            last_check: Instant::now(),
            last_lane_check: Instant::now(),
            stats: ShmStats::default(),
        })
    }

    /// Takes an address, random QPN and connid, whose rendezvous socket
    /// no one holds, and starts answering on it. A stranger cannot take
    /// our name ahead of us: the connid is drawn after the QPN, 2^48
    /// names in all (QPNs may repeat on a host: every use checks the
    /// connid too).
    fn listen(domain: &ShmDomain) -> Result<(u16, u32, Rendezvous), ShmError> {
        for _ in 0..64 {
            let r = random_u64();
            let (qpn, connid) = (r as u16, (r >> 32) as u32);
            match Rendezvous::bind(qpn, connid) {
                Ok(l) => {
                    let served = Served { cfg: domain.cfg, qpn, connid, domain: domain.clone() };
                    return Ok((qpn, connid, Rendezvous::start(l, served)?));
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ShmError::NoFreeQpn)
    }

    /// What happened at this device so far.
    pub fn stats(&self) -> ShmStats {
        ShmStats { refused: self.rendezvous.grants.refused.load(Relaxed), ..self.stats }
    }

    /// The device's parameters.
    pub fn config(&self) -> ShmConfig {
        self.cfg
    }

    /// Operations posted and not yet completed, plus completions not yet
    /// polled.
    pub fn tx_outstanding(&self) -> usize {
        self.tx_used
    }

    fn complete(&mut self, op: CqOp, status: CqStatus, wr_id: u64) {
        self.cq.push_back(Cqe { op, status, wr_id, ..Cqe::default() });
    }

    fn activate(&mut self, idx: usize) {
        if !self.peers[idx].active {
            self.peers[idx].active = true;
            self.active.push(idx as u32);
        }
    }

    /// Whether our lane to peer `idx` has a free slot; when it
    /// has not, counts it and watches the peer (a full lane may be a dead
    /// receiver's).
    #[inline(always)]
    fn lane_has_room(&mut self, idx: usize) -> bool {
        let p = &mut self.peers[idx];
        if p.lane.has_room(p.tail, &mut p.seen_head) {
            return true;
        }
        self.stats.ring_full += 1;
        p.suspect = true;
        self.activate(idx);
        false
    }

    /// The peer behind `ah` if it is in the address book; marks it dead if
    /// it closed.
    fn book_peer(&mut self, ah: Ah) -> Result<usize, CqStatus> {
        let idx = ah.0 as usize;
        match self.peers.get(idx) {
            Some(p) if p.in_book && p.dead => Err(CqStatus::PeerUnreachable),
            Some(p) if p.in_book => {
                if p.lane.map().u32_at(hdr::STATE).load(Relaxed) != hdr::STATE_READY {
                    self.lose_peer(idx);
                    return Err(CqStatus::PeerUnreachable);
                }
                Ok(idx)
            }
            _ => Err(CqStatus::LocalError),
        }
    }

    /// The peer is gone: fails what is outstanding to it.
    fn lose_peer(&mut self, idx: usize) {
        let p = &mut self.peers[idx];
        if !p.dead {
            p.dead = true;
            self.stats.peers_lost += 1;
        }
        p.suspect = false;
        p.asks.clear();
        // What the peer consumed before it went was delivered: those
        // complete as such (our lane stays mapped until we drop it).
        while let Some(op) = p.pending.front().copied().filter(|op| p.lane.consumed(op.pos)) {
            p.pending.pop_front();
            self.cq.push_back(Cqe { op: op.op, wr_id: op.wr_id, ..Cqe::default() });
        }
        while let Some(op) = p.pending.pop_front() {
            let cqe = Cqe {
                op: op.op,
                status: CqStatus::PeerUnreachable,
                wr_id: op.wr_id,
                ..Cqe::default()
            };
            self.cq.push_back(cqe);
        }
    }

    /// Moves operations whose packets peers consumed into the CQ; drops
    /// idle peers from the active list. Returns whether any completed.
    fn reap(&mut self) -> bool {
        let mut progressed = false;
        let mut i = 0;
        while i < self.active.len() {
            let idx = self.active[i] as usize;
            let p = &mut self.peers[idx];
            while let Some(front) = p.pending.front() {
                if !p.lane.consumed(front.pos) {
                    break;
                }
                let cqe = Cqe { op: front.op, wr_id: front.wr_id, ..Cqe::default() };
                p.pending.pop_front();
                self.cq.push_back(cqe);
                progressed = true;
            }
            if p.pending.is_empty() && !p.suspect {
                p.active = false;
                self.active.swap_remove(i);
            } else {
                i += 1;
            }
        }
        progressed
    }

    /// Runs the liveness check if it is due: only while something waits on
    /// a peer or a sender holds a lane of ours, at most once per period.
    fn maybe_check_liveness(&mut self) {
        if self.active.is_empty() && self.rx_lanes.is_empty() {
            self.polls_since_clock = 0;
            return;
        }
        self.polls_since_clock += 1;
        if self.polls_since_clock < CLOCK_EVERY_POLLS {
            return;
        }
        self.polls_since_clock = 0;
        let now = Instant::now();
        if now.duration_since(self.last_check) < LIVENESS_PERIOD {
            return;
        }
        self.last_check = now;
        self.stats.liveness_checks += 1;
        for i in 0..self.active.len() {
            let idx = self.active[i] as usize;
            if !self.peers[idx].dead && !self.peers[idx].alive() {
                self.lose_peer(idx);
            }
            self.peers[idx].suspect = false;
        }
        self.reclaim_lanes(now);
    }

    /// Frees the lanes whose sender closed (or, looked for less often,
    /// died), once we took all it published.
    fn reclaim_lanes(&mut self, now: Instant) {
        let check_pids = now.duration_since(self.last_lane_check) >= LANE_PID_PERIOD;
        if check_pids {
            self.last_lane_check = now;
        }
        let mut i = 0;
        while i < self.rx_lanes.len() {
            let l = &self.rx_lanes[i];
            let gone = l.lane.state() != LaneState::Open || (check_pids && !pid_alive(l.pid));
            if gone && l.lane.peek(l.head).is_none() {
                // Its segment goes with our mapping; the next sender gets
                // a new one.
                self.rx_lanes.remove(i);
                self.rendezvous.grants.held.fetch_sub(1, Release);
                self.stats.lanes_reclaimed += 1;
            } else {
                i += 1;
            }
        }
        self.next_lane = 0;
    }

    /// Takes up the lanes the rendezvous thread granted since we last
    /// looked, with who holds each, as it verified.
    #[cold]
    fn scan_lanes(&mut self) {
        self.seen_grants = self.rendezvous.grants.generation.load(Acquire);
        let claims = std::mem::take(
            &mut *self.rendezvous.grants.claims.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for c in claims {
            let rx = RxLane { lane: c.lane, head: 0, qpn: c.qpn, connid: c.connid, pid: c.pid };
            self.rx_lanes.push(rx);
        }
    }

    fn source(&self, qpn: u16, connid: u32) -> Source {
        let idx = self.by_qpn[qpn as usize];
        match self.peers.get(idx as usize) {
            Some(p) if p.in_book && p.addr.connid == connid => Source::Known(Ah(idx)),
            _ => Source::Unknown { qpn },
        }
    }

    /// Takes ready slots off our lanes into `out`, lane after lane from
    /// the one after last time's first; returns how many completions it
    /// wrote.
    fn receive(&mut self, out: &mut [Cqe]) -> usize {
        if self.rendezvous.grants.generation.load(Relaxed) != self.seen_grants {
            self.scan_lanes();
        }
        let lanes = self.rx_lanes.len();
        // One lane, the pingpong's case: no round to keep (the loop below
        // does the same, starting from lane 0 every time).
        if crate::FAST_PATHS && lanes <= 1 {
            return if lanes == 0 { 0 } else { self.receive_lane(0, out).0 };
        }
        let first = if self.next_lane < lanes { self.next_lane } else { 0 };
        let mut i = first;
        let mut n = 0;
        for _ in 0..lanes {
            let (got, rnr) = self.receive_lane(i, &mut out[n..]);
            n += got;
            if rnr || n == out.len() {
                break;
            }
            i = if i + 1 == lanes { 0 } else { i + 1 };
        }
        self.next_lane = first + 1;
        n
    }

    /// Where packet buffer `id` starts in the pool.
    #[inline(always)]
    fn frame_at(&self, id: BufId) -> usize {
        id.index() * self.stride
    }

    /// Where `len` bytes of packet `buf` from its byte `from` land in
    /// region `mr` at `offset`: its mapping and offset there, and the
    /// bytes.
    #[inline(always)]
    fn landing(
        &self,
        buf: BufId,
        from: usize,
        mr: MrId,
        offset: usize,
        len: usize,
    ) -> (&Mapping, usize, &[u8]) {
        let r = self.regions.expect(mr);
        assert!(offset.checked_add(len).is_some_and(|e| e <= r.len), "outside the region");
        let pkt = &self.pool[self.frame_at(buf)..][..self.cfg.mtu];
        (&r.map, REGION_DATA + offset, &pkt[from..from + len])
    }

    /// Takes ready slots off lane `rx_lanes[i]`; returns how many
    /// completions it wrote and whether it stopped for want of a receive
    /// buffer.
    #[inline(always)]
    fn receive_lane(&mut self, i: usize, out: &mut [Cqe]) -> (usize, bool) {
        let RxLane { ref lane, head: start, qpn, connid, .. } = self.rx_lanes[i];
        let mut head = start;
        let mut n = 0;
        let mut rnr = false;
        // Malformed slots write no completion: bound the work per call.
        let mut budget = lane.slots();
        while n < out.len() && budget > 0 {
            budget -= 1;
            let Some(rec) = lane.peek(head) else { break };
            let len = rec.len as usize;
            let valid = match rec.kind {
                Kind::Packet => len <= self.cfg.mtu,
                Kind::WriteImm => true,
                Kind::Unknown(_) => false,
            };
            if !valid {
                self.stats.malformed += 1;
                head = head.wrapping_add(1);
                continue;
            }
            // The newest buffer first: the endpoint reposts each as it
            // is done with it, so it is still in cache.
            let Some(rx) = self.posted_rx.pop_back() else {
                self.stats.rnr_waits += 1;
                rnr = true;
                break;
            };
            let src = self.source(qpn, connid);
            out[n] = if rec.kind == Kind::Packet {
                let at = self.frame_at(rx);
                lane.read(head, &mut self.pool[at..at + len]);
                self.stats.delivered += 1;
                Cqe {
                    op: CqOp::Recv,
                    status: CqStatus::Ok,
                    wr_id: rx.wr_id(),
                    len: rec.len,
                    src,
                    imm: 0,
                }
            } else {
                let op = CqOp::RecvWriteImm;
                Cqe { op, status: CqStatus::Ok, wr_id: rx.wr_id(), len: rec.len, src, imm: rec.imm }
            };
            n += 1;
            head = head.wrapping_add(1);
        }
        if head != start {
            lane.set_head(head);
            self.rx_lanes[i].head = head;
        }
        (n, rnr)
    }

    /// The answer to our ask for a lane at `addr`: the ask under way, or
    /// a new one, waited for up to `hello_wait`.
    fn hello(&mut self, addr: &RawAddr) -> Result<rendezvous::Answer, DeviceError> {
        let i = match self.hellos.iter().position(|(a, _)| a == addr) {
            Some(i) => i,
            None => {
                let me = self.addr;
                let ask = rendezvous::Pending::hello(addr.qpn, addr.connid, me.qpn, me.connid);
                self.hellos.push((*addr, ask));
                self.hellos.len() - 1
            }
        };
        let result = match self.hellos[i].1.wait(self.cfg.hello_wait) {
            Ok(Waited::NotYet) => return Err(DeviceError::Again),
            Ok(Waited::Answer(answer)) => Ok(answer),
            Ok(Waited::TimedOut) => {
                self.stats.ask_timeouts += 1;
                Err(DeviceError::NoAnswer)
            }
            Err(rendezvous::AskError::Stranger { uid }) => {
                self.stats.strangers += 1;
                Err(DeviceError::OtherUser { uid })
            }
            Err(rendezvous::AskError::Io(_)) => Err(DeviceError::BadAddress),
        };
        self.hellos.swap_remove(i);
        result
    }

    /// The peer's region `key`, mapped on first use. Asking for it never
    /// holds the caller longer than [`ASK_WAIT`] (a stopped or busy
    /// peer): while no answer has come, the operation waits, and the ask
    /// is looked at again, without waiting, each time it is posted again,
    /// until [`rendezvous::ASK_TIMEOUT`] fails it.
    fn remote_region(&mut self, idx: usize, key: u64) -> Result<usize, NoRegion> {
        let p = &mut self.peers[idx];
        if let Some(i) = p.regions.find(key) {
            return Ok(i);
        }
        let answer = region_answer(&mut p.asks, p.addr, key, &mut self.stats)?;
        let fd = answer.fd.filter(|_| answer.status == rendezvous::OK);
        let fd = fd.ok_or(NoRegion::Failed(CqStatus::RemoteAccess))?;
        let map = Mapping::from_fd(fd.as_fd(), REGION_DATA, true)
            .map_err(|_| NoRegion::Failed(CqStatus::RemoteAccess))?;
        let ok = map.u64_at(hdr::MAGIC).load(Acquire) == hdr::MAGIC_VALUE
            && map.u32_at(hdr::KIND).load(Relaxed) == hdr::KIND_REGION
            && map.u64_at(hdr::KEY).load(Relaxed) == key;
        if !ok {
            return Err(NoRegion::Failed(CqStatus::RemoteAccess));
        }
        Ok(p.regions.insert(key, map))
    }

    /// Checks an RDMA operation against the target's registration; returns
    /// the index of the target's mapping in the peer's regions and the
    /// byte offset in it.
    fn resolve_remote(
        &mut self,
        idx: usize,
        wr: &RdmaWr,
        need: Access,
    ) -> Result<(usize, usize), NoRegion> {
        let refused = NoRegion::Failed(CqStatus::RemoteAccess);
        let r = self.remote_region(idx, wr.remote_key)?;
        let regions = &mut self.peers[idx].regions;
        let map = regions.at(r);
        if map.u32_at(hdr::STATE).load(Acquire) != hdr::STATE_READY {
            // Deregistered: forget the mapping too.
            regions.remove(wr.remote_key);
            return Err(refused);
        }
        let len = map.u64_at(hdr::LEN).load(Relaxed);
        // The owner's header could lie about the length: the mapping
        // bounds the access too.
        if !usize::try_from(len).is_ok_and(|len| len <= map.len() - REGION_DATA) {
            return Err(refused);
        }
        let mr = Mr {
            id: MrId(0),
            key: wr.remote_key,
            addr: map.u64_at(hdr::BASE).load(Relaxed),
            len,
            access: Access::from_bits_truncate(map.u32_at(hdr::ACCESS).load(Relaxed)),
        };
        let offset = mr.resolve(wr.remote_addr, wr.len, need).ok_or(refused)?;
        Ok((r, REGION_DATA + offset as usize))
    }
}

impl Device for ShmDevice {
    fn caps(&self) -> Caps {
        self.caps
    }

    fn addr(&self) -> RawAddr {
        self.addr
    }

    fn insert_addr(&mut self, addr: &RawAddr) -> Result<Ah, DeviceError> {
        if addr.gid != self.addr.gid {
            return Err(DeviceError::BadAddress);
        }
        let known = self.peers.iter().position(|p| p.addr == *addr && !p.dead);
        let idx = match known {
            Some(idx) => idx,
            None => {
                // The receiver grants a lane, a segment of its own that
                // comes with the grant; the kernel says which process it is.
                let answer = self.hello(addr)?;
                match answer.status {
                    rendezvous::OK => {}
                    // Every lane taken: the receiver has as many senders as
                    // it can take; one may leave.
                    rendezvous::FULL => return Err(DeviceError::Again),
                    rendezvous::NO_MEMORY => {
                        let errno = libc::ENOMEM;
                        return Err(DeviceError::Os { what: "the peer making our lane", errno });
                    }
                    _ => return Err(DeviceError::BadAddress),
                }
                let fd = answer.fd.ok_or(DeviceError::BadAddress)?;
                let map = Mapping::from_fd(fd.as_fd(), hdr::LEN_MIN, true)
                    .map_err(|_| DeviceError::BadAddress)?;
                let lane = Lane::attach_peer(map).ok_or(DeviceError::BadAddress)?;
                let h = lane.map();
                let pid = answer.peer.pid;
                let matches = h.u32_at(hdr::STATE).load(Relaxed) == hdr::STATE_READY
                    && h.u32_at(hdr::CONNID).load(Relaxed) == addr.connid
                    && h.u32_at(hdr::QPN).load(Relaxed) == addr.qpn as u32;
                if !matches {
                    return Err(DeviceError::BadAddress);
                }
                self.peers.push(Peer {
                    addr: *addr,
                    lane,
                    tail: 0,
                    seen_head: 0,
                    pid,
                    in_book: false,
                    dead: false,
                    suspect: false,
                    active: false,
                    pending: VecDeque::with_capacity(self.cfg.tx_depth),
                    regions: RemoteRegions::default(),
                    asks: Vec::new(),
                });
                self.peers.len() - 1
            }
        };
        self.peers[idx].in_book = true;
        self.by_qpn[addr.qpn as usize] = idx as u32;
        Ok(Ah(idx as u32))
    }

    fn remove_addr(&mut self, ah: Ah) {
        let Some(p) = self.peers.get_mut(ah.0 as usize) else {
            return;
        };
        p.in_book = false;
        let qpn = p.addr.qpn;
        if self.by_qpn[qpn as usize] == ah.0 {
            // Another entry with this QPN (an earlier incarnation) may
            // still be in the book.
            let other = self.peers.iter().rposition(|p| p.in_book && p.addr.qpn == qpn);
            self.by_qpn[qpn as usize] = other.map_or(NO_PEER, |i| i as u32);
        }
    }

    #[inline(always)]
    unsafe fn buf(&self, id: BufId) -> &[u8] {
        assert!(id.0 < self.caps.bufs, "buffer {id} out of range");
        let at = self.frame_at(id);
        &self.pool[at..at + self.cfg.mtu]
    }

    #[inline(always)]
    unsafe fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        assert!(id.0 < self.caps.bufs, "buffer {id} out of range");
        let at = self.frame_at(id);
        &mut self.pool[at..at + self.cfg.mtu]
    }

    fn register(&mut self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let (mr, region) = self.domain.create(len, access, 1)?;
        self.regions.insert(mr.id, region);
        Ok(mr)
    }

    fn attach(&mut self, mr: &Mr) -> Result<(), DeviceError> {
        let domain = &self.domain;
        self.regions.attach(mr.id, || domain.attach(mr))
    }

    fn deregister(&mut self, mr: MrId) -> Result<(), DeviceError> {
        self.regions.remove(mr)?;
        self.domain.detach(mr);
        Ok(())
    }

    // Always inlined, as the sim device's (see there).
    #[inline(always)]
    fn read_region(&self, mr: MrId, offset: usize, out: &mut [u8]) {
        let r = self.regions.expect(mr);
        assert!(offset.checked_add(out.len()).is_some_and(|e| e <= r.len), "outside the region");
        r.map.read_bytes(REGION_DATA + offset, out);
    }

    fn write_region(&mut self, mr: MrId, offset: usize, src: &[u8]) {
        let r = self.regions.expect(mr);
        assert!(offset.checked_add(src.len()).is_some_and(|e| e <= r.len), "outside the region");
        r.map.write_bytes(REGION_DATA + offset, src);
    }

    fn update_region<F: FnMut(usize, &mut [u8])>(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        fetch: Option<(BufId, usize)>,
        combine: F,
    ) {
        let r = self.regions.expect(mr);
        assert!(offset.checked_add(len).is_some_and(|e| e <= r.len), "outside the region");
        let (mtu, stride) = (self.cfg.mtu, self.stride);
        let pool = &mut self.pool;
        let fetch = |at: usize, old: &[u8]| {
            if let Some((buf, to)) = fetch {
                let pkt = &mut pool[buf.index() * stride..][..mtu];
                pkt[to + at..to + at + old.len()].copy_from_slice(old);
            }
        };
        r.map.update(REGION_DATA + offset, len, fetch, combine);
    }

    fn read_payload(&mut self, buf: BufId, from: usize, out: &mut [u8]) {
        let pkt = &self.pool[self.frame_at(buf)..][..self.cfg.mtu];
        out.copy_from_slice(&pkt[from..from + out.len()]);
    }

    fn copy_region(&mut self, src: MrId, src_off: usize, dst: MrId, dst_off: usize, len: usize) {
        let (s, d) = (self.regions.expect(src), self.regions.expect(dst));
        assert!(src_off.checked_add(len).is_some_and(|e| e <= s.len), "outside the region");
        assert!(dst_off.checked_add(len).is_some_and(|e| e <= d.len), "outside the region");
        Mapping::copy(&s.map, REGION_DATA + src_off, &d.map, REGION_DATA + dst_off, len);
    }

    #[inline(always)]
    fn copy_to_region(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        let (map, at, payload) = self.landing(buf, from, mr, offset, len);
        map.write_bytes(at, payload);
    }

    #[inline(always)]
    fn copy_to_slot(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        let (map, at, payload) = self.landing(buf, from, mr, offset, len);
        map.write_packet(at, payload);
    }

    #[inline(always)]
    fn copy_from_region(&mut self, mr: MrId, offset: usize, buf: BufId, to: usize, len: usize) {
        let r = self.regions.expect(mr);
        assert!(offset.checked_add(len).is_some_and(|e| e <= r.len), "outside the region");
        let at = self.frame_at(buf);
        let pkt = &mut self.pool[at..][..self.cfg.mtu];
        r.map.read_bytes(REGION_DATA + offset, &mut pkt[to..to + len]);
    }

    fn prepare_rdma(&mut self, mr: MrId) -> Result<(), DeviceError> {
        // Regions live in shared segments from registration on: nothing to do.
        self.regions.get(mr).map(drop).ok_or(DeviceError::UnknownHandle)
    }

    fn post_recv(&mut self, bufs: &[BufId]) -> usize {
        let n = bufs.len().min(self.cfg.rx_depth - self.posted_rx.len());
        for &b in &bufs[..n] {
            assert!(b.0 < self.caps.bufs, "buffer {b} out of range");
            self.posted_rx.push_back(b);
        }
        n
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> usize {
        let mut taken = 0;
        for wr in wrs {
            if self.tx_used >= self.cfg.tx_depth {
                break;
            }
            let len = wr.len as usize;
            assert!(wr.buf.0 < self.caps.bufs && wr.wire_len() <= self.cfg.mtu, "bad send {wr:?}");
            let idx = match self.book_peer(wr.ah) {
                Ok(idx) if wr.wire_len() <= self.peers[idx].lane.payload() => idx,
                Ok(_) => {
                    self.complete(CqOp::Send, CqStatus::LocalError, wr.wr_id);
                    self.tx_used += 1;
                    taken += 1;
                    continue;
                }
                Err(status) => {
                    self.complete(CqOp::Send, status, wr.wr_id);
                    self.tx_used += 1;
                    taken += 1;
                    continue;
                }
            };
            if !self.lane_has_room(idx) {
                break;
            }
            let at = self.frame_at(wr.buf);
            let p = &mut self.peers[idx];
            let rec = Record { kind: Kind::Packet, len: wr.wire_len() as u32, imm: 0 };
            let data = match wr.data {
                None => None,
                Some(d) => {
                    let r = self.regions.get(d.mr);
                    let r =
                        r.unwrap_or_else(|| panic!("send gathers from unregistered {:?}", d.mr));
                    let (off, n) = (d.offset as usize, d.len as usize);
                    assert!(
                        off.checked_add(n).is_some_and(|e| e <= r.len),
                        "gather outside its region"
                    );
                    Some((&*r.map, REGION_DATA + off, n))
                }
            };
            let pos = p.tail;
            p.lane.publish(pos, &rec, &self.pool[at..at + len], data);
            p.tail = pos.wrapping_add(1);
            p.pending.push_back(Pending { pos, op: CqOp::Send, wr_id: wr.wr_id });
            self.activate(idx);
            self.stats.sent += 1;
            self.tx_used += 1;
            taken += 1;
        }
        taken
    }

    fn post_rdma(&mut self, wrs: &[RdmaWr]) -> usize {
        let mut taken = 0;
        for wr in wrs {
            if self.tx_used >= self.cfg.tx_depth {
                break;
            }
            let (need, op) = match wr.op {
                RdmaOp::Read => (Access::REMOTE_READ, CqOp::Read),
                RdmaOp::Write { .. } => (Access::REMOTE_WRITE, CqOp::Write),
            };
            let local = self.regions.get(wr.local);
            let local_ok = local.is_some_and(|r| {
                wr.local_offset.checked_add(wr.len).is_some_and(|end| end <= r.len as u64)
            }) && wr.len <= self.caps.max_rdma_size;
            let target = if local_ok { self.book_peer(wr.ah) } else { Err(CqStatus::LocalError) };
            let checked = match target.map(|idx| (idx, self.resolve_remote(idx, wr, need))) {
                Ok((idx, Ok(found))) => Ok((idx, found)),
                // The region's owner has not answered yet.
                Ok((_, Err(NoRegion::Waiting))) => break,
                Ok((_, Err(NoRegion::Failed(status)))) => {
                    if status == CqStatus::RemoteAccess {
                        self.stats.remote_access_errors += 1;
                    }
                    Err(status)
                }
                Err(status) => Err(status),
            };
            let (idx, (r, remote_off)) = match checked {
                Ok(found) => found,
                Err(status) => {
                    self.complete(op, status, wr.wr_id);
                    self.tx_used += 1;
                    taken += 1;
                    continue;
                }
            };
            // Room for the notice is checked before any byte moves, so a
            // full lane refuses the whole operation.
            if let RdmaOp::Write { imm: Some(_) } = wr.op
                && !self.lane_has_room(idx)
            {
                break;
            }
            let local = &self.regions.get(wr.local).expect("checked above").map;
            let remote = self.peers[idx].regions.at(r);
            let local_off = REGION_DATA + wr.local_offset as usize;
            let len = wr.len as usize;
            match wr.op {
                RdmaOp::Read => Mapping::copy(remote, remote_off, local, local_off, len),
                RdmaOp::Write { .. } => Mapping::copy(local, local_off, remote, remote_off, len),
            }
            match wr.op {
                RdmaOp::Write { imm: Some(imm) } => {
                    // The bytes written, as EFA reports them.
                    let len = wr.len.min(u32::MAX as u64) as u32;
                    let rec = Record { kind: Kind::WriteImm, len, imm };
                    let p = &mut self.peers[idx];
                    let pos = p.tail;
                    p.lane.publish(pos, &rec, &[], None);
                    p.tail = pos.wrapping_add(1);
                    p.pending.push_back(Pending { pos, op, wr_id: wr.wr_id });
                    self.activate(idx);
                }
                _ => self.complete(op, CqStatus::Ok, wr.wr_id),
            }
            self.tx_used += 1;
            taken += 1;
        }
        taken
    }

    fn now_ns(&self) -> u64 {
        super::host_now_ns()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("sent", s.sent),
            ("delivered", s.delivered),
            ("rnr_waits", s.rnr_waits),
            ("ring_full", s.ring_full),
            ("remote_access_errors", s.remote_access_errors),
            ("malformed", s.malformed),
            ("lanes_reclaimed", s.lanes_reclaimed),
            ("liveness_checks", s.liveness_checks),
            ("peers_lost", s.peers_lost),
            ("refused", self.rendezvous.grants.refused.load(Relaxed)),
            ("strangers", s.strangers),
            ("ask_timeouts", s.ask_timeouts),
        ]
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        if !self.active.is_empty() {
            self.reap();
        }
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            out[n] = c;
            self.tx_used -= 1;
            n += 1;
        }
        n += self.receive(&mut out[n..]);
        self.maybe_check_liveness();
        while n < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            out[n] = c;
            self.tx_used -= 1;
            n += 1;
        }
        n
    }
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        // No lane is granted from here on; the senders of those granted
        // see us closed and fail what they sent us.
        self.rendezvous.stop();
        self.scan_lanes();
        for l in &self.rx_lanes {
            l.lane.close_receiver();
        }
        // Receivers take what we published, then free our lanes.
        for p in &self.peers {
            p.lane.close();
        }
        let domain = &self.domain;
        self.regions.clear(|id| domain.detach(id));
    }
}

#[cfg(test)]
mod tests;
