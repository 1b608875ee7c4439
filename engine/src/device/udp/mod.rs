//! The udp device: a software model of EFA's SRD transport over UDP, so
//! the engine runs across hosts without EFA.
//!
//! It implements the device boundary as a NIC does: datagrams of at most
//! `mtu` bytes between queue pairs, reliable, at most once and unordered;
//! a send completes when the receiver acknowledged it; one failed
//! operation fails alone; a receiver with no buffer posted is
//! back-pressure, not loss. One-sided operations are RDMAP messages (RFC
//! 5040): Write, Read Request, Read Response, Terminate.
//!
//! # Addresses
//!
//! A queue pair is a UDP socket: the raw address's GID is the socket's
//! IPv6 address (an IPv4 one mapped, `::ffff:a.b.c.d`), its QPN the port,
//! its connid random, drawn when the device opens. A datagram's sender is
//! its source IP and the QPN its header names: what we send to a peer
//! leaves by a socket connected to it (the first `connected_peers` peers;
//! the kernel then skips a route lookup per datagram), whose port is not
//! our QPN. A packet from an address not in the address book is reported
//! from an unknown sender (its QPN only), as EFA does.
//!
//! # Reliability (after the RAMCloud RPC transport)
//!
//! A session per peer (address and connid): sequence numbers per
//! direction; every packet carries the first number missing from the
//! peer and a staging vector of what arrived beyond it (the header is laid out in `hdr.rs`);
//! what is not acknowledged within a timeout derived from the measured
//! round trip (RFC 6298, microseconds) is resent alone, and duplicates
//! are dropped by the receiver's window. What arrives in one poll is
//! acknowledged at the next unless a packet of ours carried the
//! acknowledgement meanwhile (an answer sent at once rides on it; a
//! stream is acknowledged once a burst), after `ack_delay` at the latest,
//! and at once every 16 packets. A peer silent for
//! `peer_timeout` while work waits on it fails that work with
//! `PeerUnreachable`; a packet that names our previous connid is
//! answered "bad session", so a peer that restarted is told at once, and
//! a peer whose port speaks with a new connid is taken for restarted (the
//! old session's work fails). At most `window` packets are in flight per
//! peer (adaptive: grows while acknowledgements come, halves on a
//! timeout; or fixed, for benchmarks), and Sends no more than the
//! receiver's posted buffers (`credits`, on every packet); a Send that
//! still finds no buffer is refused "receiver not ready" and resent after
//! a backoff, without counting as a loss.
//!
//! Every datagram's headers (transport and RDMAP) and its length carry a
//! checksum, as SRD's CRC covers a packet: one damaged on the way or cut
//! short is dropped (counted `bad_checksum`) as if lost, and resent, so
//! that a flipped bit cannot pass for a restarted peer, a control packet
//! or another target. The payload is left to UDP's own checksum (why:
//! `hdr.rs`).
//!
//! # One-sided operations
//!
//! Every fragment of a Write carries the whole message's target, and
//! every fragment and every Read Request is checked against the target's
//! registration (key, range without overflow, right) before a byte moves:
//! a violation is answered with a Terminate (RFC 5040's Remote Protection
//! Error codes), completes the requester's operation with
//! `RemoteAccess`, and leaves the target untouched. A region is reached
//! through the queues that attached it. A Write with immediate data
//! consumes a posted receive buffer at the target, as on EFA; its
//! immediate travels in its last fragment, sent once every other one was
//! acknowledged, so the notice follows the data. A region served to a
//! peer's read is held until the reader acknowledged the last byte; one
//! revoked meanwhile ([`UdpDevice::revoke`], a verbs provider's
//! deregistration) is read no more, and what of the read remains goes as
//! a Read Response without data flagged REVOKED, which fails the read.
//!
//! A Send may carry immediate data too ([`UdpDevice::post_send_imm`], for a
//! verbs provider's SEND_WITH_IMM; the engine's endpoint sends none): its
//! receive completes as [`CqOp::RecvImm`], with the value.
//!
//! # Threat model
//!
//! As RoCE and EFA do, the device trusts its network: datagrams are not
//! authenticated, so a host that can forge a peer's source address and
//! guess its connid can inject packets as that peer, and one that also
//! guesses a region's key (64 random bits) can reach that region within
//! the rights it was registered with. Malformed datagrams
//! are counted and dropped; nothing a datagram says makes the device
//! panic, allocate without bound, or touch memory outside a region that
//! was registered for the access.
//!
//! # Faults
//!
//! `UdpConfig::faults` puts the shared fault layer ([`super::fault`])
//! between the device and its socket: drops, duplicates, reordering,
//! delays, seeded and replayable. [`UdpDevice::please_drop`] marks the
//! next packets to be dropped by their receiver (RAMCloud's pleaseDrop).

pub(crate) mod hdr;
mod sock;
mod window;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdr::{
    Hdr, HdrError, ReadReqHdr, ReadRespHdr, RnrHdr, SendImmHdr, TermHdr, Type, WriteHdr, flags,
    term,
};
use sock::{BURST, MAIN, Out, Sock};
use window::{Rtt, RxWindow, SPAN, Seen, acked};

use super::fault::{FaultStats, Faults, Faulty, Wire};
use super::mem::{Bytes, Frames, frame_stride};
use super::regions::{Attached, Registrations};
use super::{
    Access, Ah, BufId, Caps, CqOp, CqStatus, Cqe, DataSeg, Device, DeviceError, Domain, Mr, MrId,
    RdmaOp, RdmaWr, SendWr, Source, host_now_ns, random_u64,
};
use crate::wire::RawAddr;

/// How many packets a peer may have in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Grows by one a window of acknowledgements, halves on a timeout,
    /// shrinks while the round trip exceeds twice its minimum; at most
    /// 64 packets.
    Adaptive,
    /// Always this many (1 to 64), for benchmarks that want no control
    /// loop between them and the wire.
    Fixed(u32),
}

/// The device's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdpConfig {
    /// The address to bind; the port 0 picks a free one. Its IP address is
    /// the GID peers reach us at: loopback, or this host's address on the
    /// network the peers share (not the unspecified address).
    pub bind: SocketAddr,
    /// Largest packet, in bytes; a datagram carries it and a 40-byte
    /// header (48 with immediate data; an IP network fragments what
    /// exceeds its MTU).
    pub mtu: usize,
    /// Packet buffers.
    pub bufs: u32,
    /// Outstanding sends and RDMA operations.
    pub tx_depth: usize,
    /// Posted receive buffers.
    pub rx_depth: usize,
    /// Read Requests of peers this device serves at once; more are told
    /// "receiver not ready".
    pub read_jobs: usize,
    pub window: Window,
    /// Bounds of the retransmission timeout.
    pub min_rto: Duration,
    pub max_rto: Duration,
    /// A peer silent this long while work waits on it is unreachable.
    pub peer_timeout: Duration,
    /// An acknowledgement owed waits this long for a packet to ride on.
    pub ack_delay: Duration,
    /// Socket buffer size asked for, each way.
    pub socket_buffer: usize,
    /// Peers this device keeps sessions with.
    pub max_sessions: usize,
    /// Peers this device sends to through a socket connected to each
    /// (a descriptor each; faster sends); the rest through its own.
    pub connected_peers: usize,
    pub max_rdma_size: u64,
    /// The device offers RDMA read and write (an EFA device without them
    /// makes the endpoint emulate one-sided operations with messages).
    pub rdma_read: bool,
    pub rdma_write: bool,
    /// Faults between the device and its socket (none by default).
    pub faults: Faults,
    /// Region keys drawn to fit 32 bits (still random and unique in the
    /// domain), for a verbs provider whose lkeys and rkeys are 32-bit, as
    /// EFA's are; 64 bits otherwise.
    pub short_keys: bool,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            mtu: 8192,
            bufs: 2048,
            tx_depth: 512,
            rx_depth: 512,
            read_jobs: 256,
            window: Window::Adaptive,
            min_rto: Duration::from_micros(200),
            max_rto: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(5),
            ack_delay: Duration::from_micros(10),
            socket_buffer: 4 << 20,
            max_sessions: 4096,
            connected_peers: 64,
            max_rdma_size: 1 << 30,
            rdma_read: true,
            rdma_write: true,
            faults: Faults::default(),
            short_keys: false,
        }
    }
}

/// What happened at one device, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpStats {
    /// Datagrams handed to the socket (first sends and resends).
    pub tx_datagrams: u64,
    /// Datagrams received and parsed.
    pub rx_datagrams: u64,
    /// Sequenced packets sent again after their timeout.
    pub retransmits: u64,
    /// Packets received twice (or after their sender gave up on them).
    pub duplicates: u64,
    /// Packets past the receiver's window (a sender overran it).
    pub beyond_window: u64,
    /// Datagrams dropped as malformed.
    pub malformed: u64,
    /// Datagrams whose headers failed their checksum (damaged on the way,
    /// or cut short): dropped as lost, and resent by their sender.
    pub bad_checksum: u64,
    /// Datagrams dropped on their sender's request (pleaseDrop).
    pub please_dropped: u64,
    /// "Receiver not ready" sent (no buffer or no read job free) and
    /// received.
    pub rnr_sent: u64,
    pub rnr_received: u64,
    /// Remote accesses refused here (Terminate sent) and refused by peers.
    pub terminates_sent: u64,
    pub terminates_received: u64,
    /// Packets for a previous connid of ours, answered "bad session".
    pub stale: u64,
    /// Acknowledgements sent alone.
    pub acks_sent: u64,
    /// Peers found unreachable or restarted.
    pub peers_lost: u64,
    /// Datagrams from new peers dropped: the session table was full.
    pub sessions_full: u64,
    /// Bursts the socket took only in part (its buffer was full).
    pub tx_again: u64,
    /// Peers' reads whose region was deregistered here while they were
    /// served ([`UdpDevice::revoke`]).
    pub reads_revoked: u64,
}

/// What uses a region at one queue ([`UdpDevice::region_users`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionUsers {
    /// Operations the queue posted that read or write it (a send's data,
    /// a write's source, a read's destination).
    pub posted: u32,
    /// Peers' reads served from it, held until the reader acknowledged
    /// their last byte.
    pub served: u32,
}

impl UdpStats {
    /// The device's counters ([`Device::counters`]) of datagrams it
    /// dropped on arrival as copies, damaged, malformed or stale: what a
    /// wire's faults make it drop.
    pub const DROPS: [&'static str; 5] =
        ["duplicates", "malformed", "bad_checksum", "stale", "beyond_window"];
}

/// Why a device could not be created.
#[derive(Debug, thiserror::Error)]
pub enum UdpError {
    #[error("invalid udp config: {0}")]
    Config(&'static str),
    #[error("udp socket {0}: {1}")]
    Socket(SocketAddr, std::io::Error),
}

impl From<UdpError> for DeviceError {
    fn from(e: UdpError) -> DeviceError {
        match e {
            UdpError::Config(_) => DeviceError::NotSupported,
            UdpError::Socket(_, e) => DeviceError::os("binding a udp socket", &e),
        }
    }
}

/// A region a queue uses: its memory, and what a peer reaches it by.
#[derive(Debug, Clone)]
struct Region {
    bytes: Arc<Bytes>,
    mr: Mr,
}

/// A protection domain on udp: registrations shared by the queues of a
/// process's lcores. `Send` and `Sync`; set-up work takes its lock, the
/// hot path never does.
#[derive(Debug, Clone)]
pub struct UdpDomain {
    cfg: UdpConfig,
    regs: Arc<Mutex<Registrations<Region>>>,
}

impl UdpDomain {
    /// A domain whose devices take `cfg` (each binds `cfg.bind`; give port
    /// 0 to make several).
    pub fn new(cfg: UdpConfig) -> UdpDomain {
        UdpDomain { cfg, regs: Arc::default() }
    }

    /// A device of the domain with parameters of its own (its queue
    /// depths, as a verbs QP sizes its queues), sharing the domain's
    /// registrations and key setting.
    pub fn device_with(&self, cfg: UdpConfig) -> Result<UdpDevice, UdpError> {
        let cfg = UdpConfig { short_keys: self.cfg.short_keys, ..cfg };
        UdpDevice::in_domain(UdpDomain { cfg, regs: self.regs.clone() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registrations<Region>> {
        // Every change is one slot store: a panic elsewhere leaves it whole.
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, bytes: Bytes, access: Access, queues: u32) -> Result<Region, DeviceError> {
        let mut regs = self.lock();
        let key = loop {
            // Hard to guess: a peer names a region by its key.
            let key = match self.cfg.short_keys {
                true => random_u64() & 0xffff_ffff,
                false => random_u64(),
            };
            if !regs.has_key(key) {
                break key;
            }
        };
        let (addr, len) = (bytes.addr(), bytes.len() as u64);
        let bytes = Arc::new(bytes);
        let region = regs.insert(queues, |id| {
            let mr = Mr { id, key, addr, len, access };
            (mr, Region { bytes, mr })
        });
        Ok(region.clone())
    }

    fn attach(&self, mr: &Mr) -> Result<Region, DeviceError> {
        self.lock().attach(mr).cloned()
    }

    fn detach(&self, id: MrId) {
        self.lock().detach(id);
    }
}

impl Domain for UdpDomain {
    type Device = UdpDevice;

    fn device(&self) -> Result<UdpDevice, DeviceError> {
        Ok(UdpDevice::in_domain(self.clone())?)
    }

    fn register(&self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        self.add(Bytes::zeroed(len), access | Access::LOCAL, 0).map(|r| r.mr)
    }

    unsafe fn register_external(
        &self,
        ptr: std::ptr::NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        // SAFETY: the caller's contract is `Bytes::external`'s: valid and
        // unmoved until deregistered.
        let bytes = unsafe { Bytes::external(ptr, len) };
        self.add(bytes, access | Access::LOCAL, 0).map(|r| r.mr)
    }

    fn deregister(&self, mr: &Mr) -> Result<(), DeviceError> {
        self.lock().deregister(mr).map(drop)
    }
}

/// An operation: one the endpoint posted, or a peer's read served here.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Send {
        buf: BufId,
        len: u32,
        data: Option<DataSeg>,
        /// Immediate data, if `with_imm` (not an Option: that would make
        /// every operation 8 bytes larger).
        imm: u32,
        with_imm: bool,
    },
    Write {
        local: MrId,
        local_off: u64,
        remote_addr: u64,
        key: u64,
        imm: Option<u32>,
    },
    Read {
        local: MrId,
        local_off: u64,
        remote_addr: u64,
        key: u64,
    },
    /// A peer's read: the bytes of `src` from `src_off` to send back.
    Serve {
        src: MrId,
        src_off: u64,
        sink: u64,
    },
    /// A peer's read whose region was deregistered here while it was
    /// served ([`UdpDevice::revoke`]): what remained to send, or is resent,
    /// goes as a Read Response without data flagged REVOKED, which fails
    /// the read at the peer.
    Revoked {
        sink: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Op {
    kind: Kind,
    wr_id: u64,
    sess: u32,
    /// Bytes the operation moves.
    len: u64,
    /// Bytes put in packets so far.
    emitted: u64,
    /// Packets sent and not yet acknowledged or refused.
    unresolved: u32,
    /// Reads: bytes that came back; whether the request was taken.
    got: u64,
    req_taken: bool,
    /// Set by a Terminate.
    status: CqStatus,
    /// Told apart from an earlier operation in the same slot.
    generation: u32,
    live: bool,
}

impl Op {
    const BLANK: Op = Op {
        kind: Kind::Send { buf: BufId::NONE, len: 0, data: None, imm: 0, with_imm: false },
        wr_id: 0,
        sess: 0,
        len: 0,
        emitted: 0,
        unresolved: 0,
        got: 0,
        req_taken: false,
        status: CqStatus::Ok,
        generation: 0,
        live: false,
    };
}

/// A sequenced packet in flight: what it carries, when it left.
#[derive(Debug, Clone, Copy)]
struct Slot {
    live: bool,
    ty: Type,
    op: u32,
    off: u64,
    len: u32,
    sent_ns: u64,
    tries: u32,
    /// Refused "not ready": resend at `rnr_due_ns`.
    rnr_due_ns: u64,
    flags: u8,
}

impl Slot {
    const EMPTY: Slot = Slot {
        live: false,
        ty: Type::Send,
        op: 0,
        off: 0,
        len: 0,
        sent_ns: 0,
        tries: 0,
        rnr_due_ns: 0,
        flags: 0,
    };
}

/// Everything about one peer: RAMCloud's session.
#[derive(Debug)]
struct Session {
    peer: SocketAddr,
    connid: u32,
    ah: Option<Ah>,
    dead: bool,
    // Sending.
    next_seq: u32,
    base: u32,
    slots: Box<[Slot; SPAN as usize]>,
    in_flight: u32,
    sends_in_flight: u32,
    cwnd: u32,
    cwnd_acked: u32,
    min_rtt_ns: u64,
    rtt: Rtt,
    /// Operations with packets still to make, oldest first.
    queue: VecDeque<u32>,
    last_heard_ns: u64,
    peer_credits: u32,
    // Receiving.
    rx: RxWindow,
    /// The socket our datagrams to it leave by ([`Out::via`]).
    via: u16,
    ack_owed: u32,
    ack_since_ns: u64,
    /// The poll in which the owed acknowledgement became owed.
    ack_since_poll: u64,
    ack_now: bool,
    active: bool,
}

/// Sequenced packets a receiver takes before it acknowledges without
/// waiting for a packet to ride on.
const ACK_EVERY: u32 = 16;
/// A Send refused "not ready" is resent after this, doubled per refusal.
const RNR_BACKOFF_NS: u64 = 20_000;
/// Largest header a datagram carries: transport and RDMAP.
const HDR_MAX: usize = hdr::HDR_LEN + WriteHdr::LEN;

/// How the device reaches its socket: straight, or through the fault
/// layer (one datagram at a time, gathered into a copy).
#[derive(Debug)]
enum Io {
    Direct(Sock),
    Faulty(Box<Faulty<Sock>>),
}

/// One lcore's udp queue pair: a socket, its sessions, packet buffers.
#[derive(Debug)]
pub struct UdpDevice {
    cfg: UdpConfig,
    domain: UdpDomain,
    io: Io,
    me: RawAddr,
    /// Our socket's family: peers of the other one are unreachable.
    v6: bool,
    _pool: Bytes,
    frames: Frames,
    /// Where received datagrams land before they are read.
    _rx_pool: Bytes,
    rx_frames: Frames,
    rx_got: [(SocketAddr, usize); BURST],
    /// Datagrams gathered for the next burst, and their headers.
    tx: Vec<Out>,
    tx_hdrs: Box<[[u8; HDR_MAX]; BURST]>,
    scratch: Vec<u8>,
    regions: Attached<Region>,
    by_key: HashMap<u64, MrId>,
    book: Vec<Option<(RawAddr, u32)>>,
    by_addr: HashMap<RawAddr, Ah>,
    sessions: Vec<Session>,
    by_peer: HashMap<(SocketAddr, u32), u32>,
    /// The newest session of each peer address: a new connid there means
    /// the peer restarted.
    by_sockaddr: HashMap<SocketAddr, u32>,
    last_sess: u32,
    active: Vec<u32>,
    ops: Vec<Op>,
    free_ops: Vec<u32>,
    /// Operations the endpoint posted and has not polled the completion of.
    tx_used: usize,
    serving: usize,
    /// Posted receive buffers, taken in the order posted, as EFA takes
    /// a QP's receives.
    posted: VecDeque<BufId>,
    cq: VecDeque<Cqe>,
    please_drop: u32,
    /// Calls of `poll`, the device's clock of turns.
    polls: u64,
    /// Peers with a connected socket.
    connected: usize,
    /// The session whose packet filled each receive buffer, recorded only
    /// when it was reported from an unknown sender ([`UdpDevice::sender`]).
    unknown_from: Vec<u32>,
    stats: UdpStats,
}

/// The GID of a socket address: IPv6, an IPv4 address mapped.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

const NO_SESSION: u32 = u32::MAX;

impl UdpDevice {
    /// A device in a domain of its own.
    pub fn new(cfg: UdpConfig) -> Result<UdpDevice, UdpError> {
        UdpDevice::in_domain(UdpDomain::new(cfg))
    }

    fn in_domain(domain: UdpDomain) -> Result<UdpDevice, UdpError> {
        let cfg = domain.cfg;
        if cfg.mtu < 64 || cfg.mtu > 65_000 {
            return Err(UdpError::Config("mtu: 64 to 65,000 bytes"));
        }
        if cfg.bufs == 0 || cfg.tx_depth == 0 || cfg.rx_depth == 0 || cfg.read_jobs == 0 {
            return Err(UdpError::Config("bufs, tx_depth, rx_depth and read_jobs: at least 1"));
        }
        if let Window::Fixed(n) = cfg.window
            && !(1..=SPAN).contains(&n)
        {
            return Err(UdpError::Config("window: 1 to 64 packets"));
        }
        if cfg.bind.ip().is_unspecified() {
            return Err(UdpError::Config("bind: an address peers can reach, not 0.0.0.0 or ::"));
        }
        let sock =
            Sock::bind(cfg.bind, cfg.socket_buffer).map_err(|e| UdpError::Socket(cfg.bind, e))?;
        let local = sock.local();
        let me = RawAddr {
            gid: gid_of(local.ip()),
            qpn: local.port(),
            connid: random_u64() as u32 & 0x7fff_ffff,
        };
        let stride = frame_stride(cfg.mtu);
        let pool = Bytes::zeroed(cfg.bufs as usize * stride);
        let frames = Frames::new(&pool, cfg.bufs, cfg.mtu, stride);
        // The largest datagram: a Send of `mtu` bytes with immediate data.
        let rx_cap = hdr::HDR_LEN + SendImmHdr::LEN + cfg.mtu;
        let rx_stride = frame_stride(rx_cap);
        let rx_pool = Bytes::zeroed(BURST * rx_stride);
        let rx_frames = Frames::new(&rx_pool, BURST as u32, rx_cap, rx_stride);
        let mut rx_ptrs = [std::ptr::null_mut(); BURST];
        for (i, p) in rx_ptrs.iter_mut().enumerate() {
            *p = rx_frames.ptr(BufId(i as u32));
        }
        let mut sock = sock;
        // SAFETY: the receive frames live in `rx_pool`, which the device
        // keeps as long as its socket, and only the socket writes them
        // while the device reads none (it reads them between calls).
        unsafe { sock.set_frames(&rx_ptrs, rx_cap) };
        let io = if cfg.faults.is_none() {
            Io::Direct(sock)
        } else {
            Io::Faulty(Box::new(Faulty::new(sock, cfg.faults)))
        };
        let nops = cfg.tx_depth + cfg.read_jobs;
        Ok(UdpDevice {
            v6: local.is_ipv6(),
            io,
            me,
            _pool: pool,
            frames,
            _rx_pool: rx_pool,
            rx_frames,
            rx_got: [(local, 0); BURST],
            tx: Vec::with_capacity(BURST),
            tx_hdrs: Box::new([[0; HDR_MAX]; BURST]),
            scratch: vec![0; HDR_MAX + cfg.mtu],
            regions: Attached::default(),
            by_key: HashMap::new(),
            book: Vec::new(),
            by_addr: HashMap::new(),
            sessions: Vec::new(),
            by_peer: HashMap::new(),
            by_sockaddr: HashMap::new(),
            last_sess: NO_SESSION,
            active: Vec::with_capacity(64),
            ops: vec![Op::BLANK; nops],
            free_ops: (0..nops as u32).rev().collect(),
            tx_used: 0,
            serving: 0,
            posted: VecDeque::with_capacity(cfg.rx_depth),
            cq: VecDeque::with_capacity(cfg.tx_depth + cfg.rx_depth),
            please_drop: 0,
            polls: 0,
            connected: 0,
            unknown_from: vec![NO_SESSION; cfg.bufs as usize],
            stats: UdpStats::default(),
            cfg,
            domain,
        })
    }

    /// What happened here.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// What the fault layer did (all zero without faults).
    pub fn fault_stats(&self) -> FaultStats {
        match &self.io {
            Io::Direct(_) => FaultStats::default(),
            Io::Faulty(f) => f.injector().stats(),
        }
    }

    /// The socket's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.sock().local()
    }

    /// The socket buffers the kernel granted: (send, receive) bytes.
    pub fn socket_buffers(&self) -> (usize, usize) {
        self.sock().buffers()
    }

    /// The descriptor datagrams arrive on: readable when a poll would
    /// receive, for a host that waits for traffic rather than polls.
    pub fn rx_fd(&self) -> std::os::fd::RawFd {
        self.sock().fd()
    }

    /// Nothing to do until a datagram comes: no packet in flight or
    /// waiting for room, no acknowledgement owed, no completion to take,
    /// and no fault layer (which may hold datagrams to release later).
    pub fn is_quiet(&self) -> bool {
        self.active.is_empty() && self.cq.is_empty() && matches!(self.io, Io::Direct(_))
    }

    /// Marks the next `n` sequenced packets this device sends for the
    /// first time to be dropped by their receiver (RAMCloud's pleaseDrop):
    /// scripted loss, which their resends then repair.
    pub fn please_drop(&mut self, n: u32) {
        self.please_drop = n;
    }

    /// The smoothed round trip to the peer `ah`, in nanoseconds (0 before
    /// a sample).
    pub fn srtt_ns(&self, ah: Ah) -> Option<u64> {
        let (_, s) = (*self.book.get(ah.0 as usize)?)?;
        Some(self.sessions[s as usize].rtt.srtt_ns())
    }

    /// Sets the connid peers must address this queue pair by, as an EFA
    /// QP takes its qkey at RESET->INIT: before any traffic, since peers
    /// that knew the old one are answered "bad session".
    pub fn set_connid(&mut self, connid: u32) {
        self.me.connid = connid;
    }

    /// The address of the peer whose packet filled receive buffer `buf`,
    /// for a completion that reported it from an unknown sender (EFA's
    /// sender GID, `efadv_wc_read_sgid`); valid until `buf` is posted again.
    pub fn sender(&self, buf: BufId) -> Option<RawAddr> {
        let s = *self.unknown_from.get(buf.index())?;
        let sess = self.sessions.get(s as usize)?;
        let gid = gid_of(sess.peer.ip());
        Some(RawAddr { gid, qpn: sess.peer.port(), connid: sess.connid })
    }

    /// Posts sends as [`Device::post_send`] does, each with the immediate
    /// data `imm` has for it (EFA's SEND_WITH_IMM): the receiver's
    /// completion is a [`CqOp::RecvImm`] carrying it. `imm` is as long as
    /// `wrs`.
    pub fn post_send_imm(&mut self, wrs: &[SendWr], imm: &[Option<u32>]) -> usize {
        assert_eq!(wrs.len(), imm.len(), "an immediate (or none) per send");
        self.post_sends(wrs, |k| imm[k])
    }

    /// Posts sends, the `k`th with immediate data `imm(k)`.
    #[inline(always)]
    fn post_sends(&mut self, wrs: &[SendWr], imm: impl Fn(usize) -> Option<u32>) -> usize {
        let mut n = 0;
        for (k, wr) in wrs.iter().enumerate() {
            if self.tx_used >= self.cfg.tx_depth {
                break;
            }
            self.tx_used += 1;
            n += 1;
            let session = self.book.get(wr.ah.0 as usize).copied().flatten().map(|(_, s)| s);
            let data_ok = wr.data.is_none_or(|d| self.region_ok(d.mr, d.offset, u64::from(d.len)));
            let fits = wr.wire_len() <= self.cfg.mtu && wr.buf.0 < self.cfg.bufs;
            let (Some(s), true, true) = (session, data_ok, fits) else {
                self.local_error(CqOp::Send, wr.wr_id);
                continue;
            };
            let (with_imm, imm) = match imm(k) {
                Some(v) => (true, v),
                None => (false, 0),
            };
            let kind = Kind::Send { buf: wr.buf, len: wr.len, data: wr.data, imm, with_imm };
            let i = self.alloc_op(kind, wr.wr_id, s, wr.wire_len() as u64).expect("tx_depth");
            if let Some(d) = wr.data {
                self.regions.mark_busy(d.mr);
            }
            self.start(i);
        }
        self.pump(host_now_ns());
        self.flush();
        n
    }

    /// What uses region `mr` here; None if it is not attached here.
    pub fn region_users(&self, mr: MrId) -> Option<RegionUsers> {
        self.regions.get(mr)?;
        let mut u = RegionUsers::default();
        for op in self.ops.iter().filter(|o| o.live) {
            match op.kind {
                Kind::Serve { src, .. } if src == mr => u.served += 1,
                Kind::Send { data: Some(d), .. } if d.mr == mr => u.posted += 1,
                Kind::Write { local, .. } | Kind::Read { local, .. } if local == mr => {
                    u.posted += 1
                }
                _ => {}
            }
        }
        Some(u)
    }

    /// Deregisters `mr` here at once, as an EFA device deregisters a
    /// region whatever a peer is reading from it: each read served from
    /// it stops reading it, and what of the read is unsent or is resent
    /// goes as a notice (a Read Response flagged REVOKED) that fails the
    /// read at the peer; a read whose bytes all arrived completes as it
    /// would have. Busy while an operation this queue posted uses the
    /// region: that is the caller's to wait for.
    pub fn revoke(&mut self, mr: MrId) -> Result<(), DeviceError> {
        let users = self.region_users(mr).ok_or(DeviceError::UnknownHandle)?;
        if users.posted > 0 {
            return Err(DeviceError::Busy);
        }
        for op in self.ops.iter_mut().filter(|o| o.live) {
            if let Kind::Serve { src, sink, .. } = op.kind
                && src == mr
            {
                op.kind = Kind::Revoked { sink };
            }
        }
        // What of them is in flight is resent as a notice.
        for sess in &mut self.sessions {
            for slot in sess.slots.iter_mut().filter(|t| t.live && t.ty == Type::ReadResp) {
                if let Kind::Revoked { .. } = self.ops[slot.op as usize].kind {
                    slot.flags |= flags::REVOKED;
                }
            }
        }
        self.stats.reads_revoked += u64::from(users.served);
        self.regions.unmark_busy(mr, users.served);
        Device::deregister(self, mr)
    }

    fn sock(&self) -> &Sock {
        match &self.io {
            Io::Direct(s) => s,
            Io::Faulty(f) => f.inner(),
        }
    }

    fn sockaddr_of(&self, a: &RawAddr) -> Option<SocketAddr> {
        let ip = Ipv6Addr::from(a.gid);
        let ip = match (self.v6, ip.to_ipv4_mapped()) {
            (false, Some(v4)) => IpAddr::V4(v4),
            (true, None) => IpAddr::V6(ip),
            _ => return None,
        };
        (!ip.is_unspecified() && a.qpn != 0).then_some(SocketAddr::new(ip, a.qpn))
    }

    /// The session with `peer` at `connid`, made if new (None when the
    /// table is full). A new connid at a known address means the peer
    /// restarted: the old session's work fails.
    fn session(&mut self, peer: SocketAddr, connid: u32, now: u64) -> Option<u32> {
        if self.last_sess != NO_SESSION {
            let s = &self.sessions[self.last_sess as usize];
            if s.connid == connid && s.peer == peer {
                return Some(self.last_sess);
            }
        }
        if let Some(&s) = self.by_peer.get(&(peer, connid)) {
            self.last_sess = s;
            return Some(s);
        }
        if self.sessions.len() >= self.cfg.max_sessions {
            return None;
        }
        // A restarted peer is at the same address: its connected socket
        // serves the new session.
        let mut via = MAIN;
        if let Some(&old) = self.by_sockaddr.get(&peer) {
            self.lose_session(old, CqStatus::PeerUnreachable);
            via = self.sessions[old as usize].via;
        }
        if via == MAIN
            && let Io::Direct(sock) = &mut self.io
            && self.connected < self.cfg.connected_peers
        {
            via = sock.connect(peer).unwrap_or(MAIN);
            self.connected += usize::from(via != MAIN);
        }
        let cwnd = match self.cfg.window {
            Window::Fixed(n) => n,
            Window::Adaptive => 16,
        };
        let s = self.sessions.len() as u32;
        self.sessions.push(Session {
            peer,
            connid,
            ah: None,
            dead: false,
            next_seq: 0,
            base: 0,
            slots: Box::new([Slot::EMPTY; SPAN as usize]),
            in_flight: 0,
            sends_in_flight: 0,
            cwnd,
            cwnd_acked: 0,
            min_rtt_ns: u64::MAX,
            rtt: Rtt::new(
                (self.cfg.min_rto.as_nanos() as u64).max(1_000_000),
                self.cfg.min_rto.as_nanos() as u64,
                self.cfg.max_rto.as_nanos() as u64,
            ),
            queue: VecDeque::with_capacity(16),
            last_heard_ns: now,
            peer_credits: self.cfg.rx_depth as u32,
            rx: RxWindow::default(),
            via,
            ack_owed: 0,
            ack_since_ns: 0,
            ack_since_poll: 0,
            ack_now: false,
            active: false,
        });
        self.by_peer.insert((peer, connid), s);
        self.by_sockaddr.insert(peer, s);
        self.last_sess = s;
        Some(s)
    }

    fn activate(&mut self, s: u32) {
        let sess = &mut self.sessions[s as usize];
        if !sess.active {
            sess.active = true;
            self.active.push(s);
        }
    }

    /// Fails every operation waiting on session `s` with `status` and
    /// forgets its packets in flight.
    fn lose_session(&mut self, s: u32, status: CqStatus) {
        let sess = &mut self.sessions[s as usize];
        if sess.dead {
            return;
        }
        sess.dead = true;
        sess.queue.clear();
        for slot in sess.slots.iter_mut() {
            slot.live = false;
        }
        sess.in_flight = 0;
        sess.sends_in_flight = 0;
        // The receiver may skip everything sent so far.
        sess.base = sess.next_seq;
        self.stats.peers_lost += 1;
        for i in 0..self.ops.len() {
            if self.ops[i].live && self.ops[i].sess == s {
                self.ops[i].status = status;
                self.finish(i as u32);
            }
        }
    }

    /// Ends operation `i`: its completion (none for a read served), its
    /// regions no longer busy, its slot free.
    fn finish(&mut self, i: u32) {
        let op = self.ops[i as usize];
        let (cq_op, regions): (Option<CqOp>, [Option<MrId>; 1]) = match op.kind {
            Kind::Send { data, .. } => (Some(CqOp::Send), [data.map(|d| d.mr)]),
            Kind::Write { local, .. } => (Some(CqOp::Write), [Some(local)]),
            Kind::Read { local, .. } => (Some(CqOp::Read), [Some(local)]),
            Kind::Serve { src, .. } => (None, [Some(src)]),
            Kind::Revoked { .. } => (None, [None]),
        };
        for mr in regions.into_iter().flatten() {
            self.regions.unmark_busy(mr, 1);
        }
        match cq_op {
            Some(cq_op) => {
                self.cq.push_back(Cqe {
                    op: cq_op,
                    status: op.status,
                    wr_id: op.wr_id,
                    ..Cqe::default()
                });
            }
            None => self.serving -= 1,
        }
        let o = &mut self.ops[i as usize];
        o.live = false;
        o.generation = o.generation.wrapping_add(1);
        self.free_ops.push(i);
    }

    fn alloc_op(&mut self, kind: Kind, wr_id: u64, sess: u32, len: u64) -> Option<u32> {
        let i = self.free_ops.pop()?;
        let o = &mut self.ops[i as usize];
        *o = Op {
            kind,
            wr_id,
            sess,
            len,
            emitted: 0,
            unresolved: 0,
            got: 0,
            req_taken: false,
            status: CqStatus::Ok,
            generation: o.generation,
            live: true,
        };
        Some(i)
    }

    /// Queues operation `i` on its session, or fails it at once if the
    /// peer is gone.
    fn start(&mut self, i: u32) {
        let s = self.ops[i as usize].sess;
        if self.sessions[s as usize].dead {
            self.ops[i as usize].status = CqStatus::PeerUnreachable;
            self.finish(i);
            return;
        }
        self.sessions[s as usize].queue.push_back(i);
        self.activate(s);
    }

    fn local_error(&mut self, op: CqOp, wr_id: u64) {
        self.cq.push_back(Cqe { op, status: CqStatus::LocalError, wr_id, ..Cqe::default() });
    }

    fn region_ok(&self, mr: MrId, off: u64, len: u64) -> bool {
        let r = self.regions.get(mr);
        r.is_some_and(|r| off.checked_add(len).is_some_and(|end| end <= r.mr.len))
    }

    fn bytes(&self, mr: MrId) -> &Bytes {
        &self.regions.expect(mr).bytes
    }

    // ---- sending ----

    /// Makes packets of the queued operations while the windows allow.
    fn pump(&mut self, now: u64) {
        let mut k = 0;
        while k < self.active.len() {
            let s = self.active[k];
            k += 1;
            loop {
                let sess = &self.sessions[s as usize];
                let Some(&i) = sess.queue.front() else { break };
                let room = sess.in_flight < sess.cwnd
                    && sess.next_seq.wrapping_sub(sess.base) < SPAN
                    && !sess.dead;
                if !room {
                    break;
                }
                let op = self.ops[i as usize];
                let frag_cap = |ext: usize| (self.cfg.mtu - ext) as u64;
                let (ty, len, mut fl) = match op.kind {
                    Kind::Send { with_imm, .. } => {
                        if sess.sends_in_flight >= sess.peer_credits.max(1) {
                            break;
                        }
                        (Type::Send, op.len, if with_imm { flags::IMM } else { 0 })
                    }
                    Kind::Write { imm, .. } => {
                        let len = (op.len - op.emitted).min(frag_cap(WriteHdr::LEN));
                        let last = op.emitted + len >= op.len;
                        if last && imm.is_some() {
                            // The notice follows the data: the last
                            // fragment goes once the others are taken.
                            if op.unresolved > 0 {
                                break;
                            }
                            (Type::Write, len, flags::IMM)
                        } else {
                            (Type::Write, len, 0)
                        }
                    }
                    Kind::Read { .. } => (Type::ReadReq, 0, 0),
                    Kind::Serve { .. } => {
                        (Type::ReadResp, (op.len - op.emitted).min(frag_cap(ReadRespHdr::LEN)), 0)
                    }
                    // One notice stands for the rest.
                    Kind::Revoked { .. } => (Type::ReadResp, 0, flags::REVOKED),
                };
                if self.please_drop > 0 {
                    self.please_drop -= 1;
                    fl |= flags::PLEASE_DROP;
                }
                let sess = &mut self.sessions[s as usize];
                let seq = sess.next_seq;
                sess.next_seq = seq.wrapping_add(1);
                if sess.in_flight == 0 {
                    sess.last_heard_ns = now;
                }
                sess.in_flight += 1;
                if ty == Type::Send {
                    sess.sends_in_flight += 1;
                }
                sess.slots[(seq % SPAN) as usize] = Slot {
                    live: true,
                    ty,
                    op: i,
                    off: op.emitted,
                    len: len as u32,
                    sent_ns: now,
                    tries: 0,
                    rnr_due_ns: 0,
                    flags: fl,
                };
                let o = &mut self.ops[i as usize];
                o.emitted += if ty == Type::ReadReq { o.len } else { len };
                if let Kind::Revoked { .. } = o.kind {
                    o.emitted = o.len;
                }
                o.unresolved += 1;
                let done = ty == Type::ReadReq || ty == Type::Send || o.emitted >= o.len;
                if done {
                    self.sessions[s as usize].queue.pop_front();
                }
                self.emit(s, seq);
            }
        }
    }

    /// Gathers sequenced packet `seq` of session `s` for the next burst.
    fn emit(&mut self, s: u32, seq: u32) {
        if self.tx.len() == BURST {
            self.flush();
        }
        let slot = self.sessions[s as usize].slots[(seq % SPAN) as usize];
        let op = self.ops[slot.op as usize];
        let mut h = self.header(s, slot.ty, slot.flags);
        h.seq = seq;
        let mut hb = [0u8; HDR_MAX];
        h.emit(&mut hb);
        let mut parts = [(std::ptr::null(), 0usize); 3];
        let ext = match op.kind {
            Kind::Send { buf, len, data, imm, with_imm } => {
                parts[1] = (self.frames.ptr(buf).cast_const(), len as usize);
                if let Some(d) = data {
                    let p = self.bytes(d.mr).ptr();
                    // SAFETY: the data span was checked inside the region
                    // when posted, and the region is busy until the send
                    // completes.
                    parts[2] = (unsafe { p.add(d.offset as usize) }.cast_const(), d.len as usize);
                }
                if with_imm {
                    SendImmHdr { imm }.emit(&mut hb);
                    SendImmHdr::LEN
                } else {
                    0
                }
            }
            Kind::Write { local, local_off, remote_addr, key, imm } => {
                WriteHdr {
                    stag: key,
                    msg_to: remote_addr,
                    msg_len: op.len,
                    frag_off: slot.off,
                    imm: if slot.flags & flags::IMM != 0 { imm.unwrap_or(0) } else { 0 },
                }
                .emit(&mut hb);
                let p = self.bytes(local).ptr();
                // SAFETY: the span was checked inside the region when
                // posted; the region is busy until the write completes.
                let at = unsafe { p.add((local_off + slot.off) as usize) };
                parts[1] = (at.cast_const(), slot.len as usize);
                WriteHdr::LEN
            }
            Kind::Read { remote_addr, key, .. } => {
                let sink = u64::from(slot.op) | u64::from(op.generation) << 32;
                ReadReqHdr { sink_stag: sink, size: op.len, src_stag: key, src_to: remote_addr }
                    .emit(&mut hb);
                ReadReqHdr::LEN
            }
            Kind::Serve { src, src_off, sink } => {
                ReadRespHdr { sink_stag: sink, sink_to: slot.off }.emit(&mut hb);
                let p = self.bytes(src).ptr();
                // SAFETY: the span was checked inside the region when the
                // request came; the region is busy until served.
                let at = unsafe { p.add((src_off + slot.off) as usize) };
                parts[1] = (at.cast_const(), slot.len as usize);
                ReadRespHdr::LEN
            }
            Kind::Revoked { sink } => {
                ReadRespHdr { sink_stag: sink, sink_to: slot.off }.emit(&mut hb);
                ReadRespHdr::LEN
            }
        };
        debug_assert_eq!(ext, slot.ty.ext_len(slot.flags));
        let hdrs = hdr::HDR_LEN + ext;
        hdr::seal(&mut hb[..hdrs], hdrs + parts[1].1 + parts[2].1);
        let n = self.tx.len();
        self.tx_hdrs[n] = hb;
        parts[0] = (self.tx_hdrs[n].as_ptr(), hdrs);
        let sess = &self.sessions[s as usize];
        self.tx.push(Out { to: sess.peer, via: sess.via, parts });
    }

    /// A header to session `s`, carrying our acknowledgement of it.
    fn header(&mut self, s: u32, ty: Type, fl: u8) -> Hdr {
        let credits = self.posted.len() as u32;
        let sess = &mut self.sessions[s as usize];
        let (ack, staging) = sess.rx.ack();
        sess.ack_owed = 0;
        sess.ack_now = false;
        Hdr {
            ty,
            flags: fl | flags::ACK,
            src_connid: self.me.connid,
            dst_connid: sess.connid,
            seq: 0,
            base: sess.base,
            ack,
            staging,
            credits,
            src_qpn: self.me.qpn,
        }
    }

    /// Gathers an unsequenced packet: an acknowledgement, a refusal; it
    /// leaves by socket `via`.
    fn control(&mut self, to: SocketAddr, via: u16, h: Hdr, ext: impl FnOnce(&mut [u8])) {
        if self.tx.len() == BURST {
            self.flush();
        }
        let n = self.tx.len();
        let b = &mut self.tx_hdrs[n];
        h.emit(b);
        ext(b);
        let len = hdr::HDR_LEN + h.ty.ext_len(h.flags);
        hdr::seal(&mut b[..len], len);
        self.tx.push(Out {
            to,
            via,
            parts: [(b.as_ptr(), len), (std::ptr::null(), 0), (std::ptr::null(), 0)],
        });
    }

    /// Hands the gathered datagrams to the socket. What it cannot take now
    /// is lost as on a full wire: the timeouts resend it.
    fn flush(&mut self) {
        if self.tx.is_empty() {
            return;
        }
        let now = host_now_ns();
        match &mut self.io {
            Io::Direct(sock) => {
                // SAFETY: every part points into our headers, packet
                // buffers or a busy region, for its length.
                let n = unsafe { sock.send(&self.tx) };
                if n < self.tx.len() {
                    self.stats.tx_again += 1;
                }
            }
            Io::Faulty(f) => {
                for o in &self.tx {
                    let mut len = 0;
                    for &(p, l) in &o.parts {
                        if l > 0 {
                            // SAFETY: as above; the scratch holds a whole
                            // datagram (header and mtu).
                            let src = unsafe { std::slice::from_raw_parts(p, l) };
                            self.scratch[len..len + l].copy_from_slice(src);
                            len += l;
                        }
                    }
                    f.send(now, o.to, &self.scratch[..len]);
                }
            }
        }
        self.stats.tx_datagrams += self.tx.len() as u64;
        self.tx.clear();
    }

    // ---- receiving ----

    /// Takes up to a burst of datagrams off the socket and handles them.
    fn receive(&mut self, now: u64) -> usize {
        let n = match &mut self.io {
            Io::Direct(sock) => sock.recv(&mut self.rx_got),
            Io::Faulty(f) => {
                let mut n = 0;
                while n < BURST {
                    // SAFETY: frame `n` is ours and not lent out.
                    let frame = unsafe { self.rx_frames.slice_mut(BufId(n as u32)) };
                    match f.recv(now, frame) {
                        Some((from, len)) => {
                            self.rx_got[n] = (from, len);
                            n += 1;
                        }
                        None => break,
                    }
                }
                n
            }
        };
        for i in 0..n {
            let (from, len) = self.rx_got[i];
            self.datagram(BufId(i as u32), from, len, now);
        }
        n
    }

    fn datagram(&mut self, frame: BufId, from: SocketAddr, len: usize, now: u64) {
        // SAFETY: receive frame `frame` is ours and holds the datagram.
        let b = unsafe { &self.rx_frames.slice(frame)[..len] };
        let h = match Hdr::parse(b) {
            Ok(h) => h,
            Err(HdrError::Checksum) => {
                // Lost, as SRD's CRC loses it: its sender resends it.
                self.stats.bad_checksum += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        // Answers go to the device's port, which the datagram may not have
        // left from (a socket connected to us).
        let mut from = from;
        from.set_port(h.src_qpn);
        let ext_seq = match h.ty {
            Type::Terminate => TermHdr::parse(b).map(|t| t.seq),
            Type::Rnr => RnrHdr::parse(b).map(|r| r.seq),
            _ => Ok(0),
        };
        self.stats.rx_datagrams += 1;
        if h.flags & flags::PLEASE_DROP != 0 {
            self.stats.please_dropped += 1;
            return;
        }
        if h.dst_connid != self.me.connid {
            // For our previous incarnation: tell the sender, whose work
            // with it fails at once instead of timing out.
            self.stats.stale += 1;
            if h.ty != Type::BadSession {
                let mut r = self.bare(Type::BadSession, h.src_connid);
                r.seq = h.dst_connid;
                self.control(from, MAIN, r, |_| {});
            }
            return;
        }
        if h.ty == Type::BadSession {
            // `seq` names the connid we addressed: that peer is gone.
            if let Some(&s) = self.by_peer.get(&(from, h.seq)) {
                self.lose_session(s, CqStatus::PeerUnreachable);
            }
            return;
        }
        let Some(s) = self.session(from, h.src_connid, now) else {
            self.stats.sessions_full += 1;
            return;
        };
        {
            let sess = &mut self.sessions[s as usize];
            if sess.dead {
                // Heard again: a new start, sequence numbers go on.
                sess.dead = false;
            }
            sess.last_heard_ns = now;
            sess.peer_credits = h.credits;
        }
        if h.flags & flags::ACK != 0 {
            self.acked(s, h.ack, h.staging, now);
        }
        match h.ty {
            t if t.sequenced() => self.sequenced(s, frame, len, &h, from, now),
            Type::Terminate => match ext_seq {
                Ok(seq) => {
                    self.stats.terminates_received += 1;
                    self.refused(s, seq);
                }
                Err(_) => self.stats.malformed += 1,
            },
            Type::Rnr => match ext_seq {
                Ok(seq) => {
                    self.stats.rnr_received += 1;
                    let sess = &mut self.sessions[s as usize];
                    let in_window = sess.next_seq.wrapping_sub(seq).wrapping_sub(1) < SPAN;
                    let slot = &mut sess.slots[(seq % SPAN) as usize];
                    if slot.live && in_window {
                        let backoff = RNR_BACKOFF_NS << slot.tries.min(9);
                        slot.rnr_due_ns = now + backoff;
                        slot.tries += 1;
                    }
                }
                Err(_) => self.stats.malformed += 1,
            },
            _ => {}
        }
    }

    /// A header with no session behind it.
    fn bare(&self, ty: Type, dst_connid: u32) -> Hdr {
        Hdr {
            ty,
            flags: 0,
            src_connid: self.me.connid,
            dst_connid,
            seq: 0,
            base: 0,
            ack: 0,
            staging: 0,
            credits: self.posted.len() as u32,
            src_qpn: self.me.qpn,
        }
    }

    /// The peer's acknowledgement of our packets to it.
    fn acked(&mut self, s: u32, ack: u32, staging: u64, now: u64) {
        let sess = &self.sessions[s as usize];
        if sess.in_flight == 0 {
            return;
        }
        let (base, next) = (sess.base, sess.next_seq);
        let mut seq = base;
        while seq != next {
            let slot = self.sessions[s as usize].slots[(seq % SPAN) as usize];
            if slot.live && acked(ack, staging, seq) {
                if slot.tries == 0 {
                    let r = now.saturating_sub(slot.sent_ns);
                    let sess = &mut self.sessions[s as usize];
                    sess.rtt.sample(r);
                    sess.min_rtt_ns = sess.min_rtt_ns.min(r);
                    if self.cfg.window == Window::Adaptive {
                        sess.cwnd_acked += 1;
                        if sess.cwnd_acked >= sess.cwnd {
                            sess.cwnd_acked = 0;
                            if r > 2 * sess.min_rtt_ns && sess.cwnd > 4 {
                                sess.cwnd -= 1;
                            } else if sess.cwnd < SPAN {
                                sess.cwnd += 1;
                            }
                        }
                    }
                }
                self.resolve(s, seq, CqStatus::Ok);
            }
            seq = seq.wrapping_add(1);
        }
    }

    /// The peer refused our packet `seq` (Terminate): it resends it no
    /// more, and its operation fails.
    fn refused(&mut self, s: u32, seq: u32) {
        let sess = &self.sessions[s as usize];
        let in_window = sess.next_seq.wrapping_sub(seq).wrapping_sub(1) < SPAN;
        if in_window && sess.slots[(seq % SPAN) as usize].live {
            self.resolve(s, seq, CqStatus::RemoteAccess);
        }
    }

    /// Packet `seq` is settled: taken (`Ok`) or refused.
    fn resolve(&mut self, s: u32, seq: u32, status: CqStatus) {
        let sess = &mut self.sessions[s as usize];
        let slot = &mut sess.slots[(seq % SPAN) as usize];
        slot.live = false;
        let (i, ty) = (slot.op, slot.ty);
        sess.in_flight -= 1;
        if ty == Type::Send {
            sess.sends_in_flight -= 1;
        }
        while sess.base != sess.next_seq && !sess.slots[(sess.base % SPAN) as usize].live {
            sess.base = sess.base.wrapping_add(1);
        }
        let op = &mut self.ops[i as usize];
        op.unresolved -= 1;
        if status != CqStatus::Ok {
            op.status = status;
        }
        let done = match op.kind {
            Kind::Send { .. } => true,
            Kind::Write { .. } | Kind::Serve { .. } | Kind::Revoked { .. } => {
                op.emitted >= op.len && op.unresolved == 0
            }
            Kind::Read { .. } => {
                op.req_taken = status == CqStatus::Ok;
                status != CqStatus::Ok || op.got >= op.len
            }
        };
        if done {
            // A write refused while fragments wait in the queue: drop them.
            self.sessions[s as usize].queue.retain(|&q| q != i);
            self.finish(i);
        }
    }

    /// A sequenced packet from session `s`.
    fn sequenced(&mut self, s: u32, frame: BufId, len: usize, h: &Hdr, from: SocketAddr, now: u64) {
        let sess = &mut self.sessions[s as usize];
        sess.rx.skip_to(h.base);
        match sess.rx.check(h.seq) {
            Seen::Duplicate => {
                self.stats.duplicates += 1;
                self.owe_ack(s, now, true);
                return;
            }
            Seen::Beyond => {
                self.stats.beyond_window += 1;
                return;
            }
            Seen::New => {}
        }
        match self.take(s, frame, len, h) {
            Taken::Yes => {
                self.sessions[s as usize].rx.take(h.seq);
                self.owe_ack(s, now, h.flags & flags::REQUEST_ACK != 0);
            }
            Taken::NotReady => {
                self.stats.rnr_sent += 1;
                let r = self.header(s, Type::Rnr, 0);
                let via = self.sessions[s as usize].via;
                self.control(from, via, r, |b| RnrHdr { seq: h.seq }.emit(b));
            }
            Taken::Refused(code) => {
                self.stats.terminates_sent += 1;
                let r = self.header(s, Type::Terminate, 0);
                let t = TermHdr { seq: h.seq, layer_etype: term::LAYER_ETYPE, code };
                let via = self.sessions[s as usize].via;
                self.control(from, via, r, |b| t.emit(b));
            }
            Taken::Malformed => {
                // Taken and dropped: its sender must not resend it forever.
                self.stats.malformed += 1;
                self.sessions[s as usize].rx.take(h.seq);
                self.owe_ack(s, now, false);
            }
        }
    }

    fn owe_ack(&mut self, s: u32, now: u64, now_please: bool) {
        let sess = &mut self.sessions[s as usize];
        if sess.ack_owed == 0 {
            sess.ack_since_ns = now;
            sess.ack_since_poll = self.polls;
        }
        sess.ack_owed += 1;
        sess.ack_now |= now_please;
        self.activate(s);
    }

    /// The source of a packet from session `s`, whose address is not in
    /// the book, landed in `buf`: noted for [`UdpDevice::sender`].
    #[cold]
    fn unknown_sender(&mut self, buf: BufId, s: u32) -> Source {
        self.unknown_from[buf.index()] = s;
        Source::Unknown { qpn: self.sessions[s as usize].peer.port() }
    }

    /// Completes a receive into posted buffer `buf`, from session `s`.
    #[inline]
    fn deliver(&mut self, op: CqOp, buf: BufId, len: u32, s: u32, imm: u32) {
        let src = match self.sessions[s as usize].ah {
            Some(ah) => Source::Known(ah),
            None => self.unknown_sender(buf, s),
        };
        self.cq.push_back(Cqe { op, status: CqStatus::Ok, wr_id: buf.wr_id(), len, src, imm });
    }

    /// Checks a remote access to `[addr, addr + len)` under `key`.
    fn remote(&self, key: u64, addr: u64, len: u64, need: Access) -> Result<(MrId, u64), u8> {
        let &id = self.by_key.get(&key).ok_or(term::INVALID_STAG)?;
        let mr = &self.regions.get(id).ok_or(term::INVALID_STAG)?.mr;
        let off = addr.checked_sub(mr.addr).ok_or(term::BASE_OR_BOUNDS)?;
        let in_bounds = off.checked_add(len).is_some_and(|end| end <= mr.len);
        if !in_bounds || len > self.cfg.max_rdma_size {
            return Err(term::BASE_OR_BOUNDS);
        }
        if !mr.access.contains(need) {
            return Err(term::ACCESS_RIGHTS);
        }
        Ok((id, off))
    }

    /// A Send with immediate data: out of the way of the engine's Sends,
    /// which carry none.
    #[cold]
    #[inline(never)]
    fn take_send_imm(&mut self, s: u32, frame: BufId, len: usize) -> Taken {
        // SAFETY: receive frame `frame` is ours and holds the datagram.
        let b = unsafe { &self.rx_frames.slice(frame)[..len] };
        let Ok(e) = SendImmHdr::parse(b) else { return Taken::Malformed };
        let at = hdr::HDR_LEN + SendImmHdr::LEN;
        self.land_send(s, frame, at..len, CqOp::RecvImm, e.imm)
    }

    /// Lands a Send's payload, `data` of receive frame `frame`, in the
    /// oldest posted buffer and completes it as `op` with `imm`.
    #[inline(always)]
    fn land_send(
        &mut self,
        s: u32,
        frame: BufId,
        data: std::ops::Range<usize>,
        op: CqOp,
        imm: u32,
    ) -> Taken {
        // SAFETY: receive frame `frame` is ours and holds the datagram.
        let payload = unsafe { &self.rx_frames.slice(frame)[data] };
        if payload.len() > self.cfg.mtu {
            return Taken::Malformed;
        }
        let Some(buf) = self.posted.pop_front() else { return Taken::NotReady };
        // SAFETY: a posted buffer is the device's until completed.
        let dst = unsafe { self.frames.slice_mut(buf) };
        dst[..payload.len()].copy_from_slice(payload);
        self.deliver(op, buf, payload.len() as u32, s, imm);
        Taken::Yes
    }

    fn take(&mut self, s: u32, frame: BufId, len: usize, h: &Hdr) -> Taken {
        // SAFETY: receive frame `frame` is ours and holds the datagram.
        let b = unsafe { &self.rx_frames.slice(frame)[..len] };
        match h.ty {
            Type::Send if h.flags & flags::IMM != 0 => self.take_send_imm(s, frame, len),
            Type::Send => self.land_send(s, frame, hdr::HDR_LEN..len, CqOp::Recv, 0),
            Type::Write => {
                let Ok(w) = WriteHdr::parse(b) else { return Taken::Malformed };
                let (id, off) = match self.remote(w.stag, w.msg_to, w.msg_len, Access::REMOTE_WRITE)
                {
                    Ok(r) => r,
                    Err(code) => return Taken::Refused(code),
                };
                let imm = h.flags & flags::IMM != 0;
                if imm && self.posted.is_empty() {
                    return Taken::NotReady;
                }
                let data = &b[hdr::HDR_LEN + WriteHdr::LEN..];
                self.bytes(id).write((off + w.frag_off) as usize, data);
                if imm {
                    let buf = self.posted.pop_front().expect("checked above");
                    self.deliver(CqOp::RecvWriteImm, buf, w.msg_len as u32, s, w.imm);
                }
                Taken::Yes
            }
            Type::ReadReq => {
                let Ok(r) = ReadReqHdr::parse(b) else { return Taken::Malformed };
                let (id, off) = match self.remote(r.src_stag, r.src_to, r.size, Access::REMOTE_READ)
                {
                    Ok(x) => x,
                    Err(code) => return Taken::Refused(code),
                };
                if r.size == 0 {
                    // Nothing to send back: taking the request answers it.
                    return Taken::Yes;
                }
                if self.serving >= self.cfg.read_jobs {
                    return Taken::NotReady;
                }
                let kind = Kind::Serve { src: id, src_off: off, sink: r.sink_stag };
                let Some(i) = self.alloc_op(kind, 0, s, r.size) else { return Taken::NotReady };
                self.serving += 1;
                self.regions.mark_busy(id);
                self.start(i);
                Taken::Yes
            }
            Type::ReadResp => {
                let Ok(r) = ReadRespHdr::parse(b) else { return Taken::Malformed };
                let data = &b[hdr::HDR_LEN + ReadRespHdr::LEN..];
                let i = (r.sink_stag & 0xffff_ffff) as usize;
                let generation = (r.sink_stag >> 32) as u32;
                let Some(op) = self.ops.get(i).copied() else { return Taken::Malformed };
                let current = op.live && op.generation == generation && op.sess == s;
                if h.flags & flags::REVOKED != 0 {
                    // The region went at the peer before all of it came (a
                    // duplicate never gets here): the read fails. For a
                    // read that ended meanwhile, nothing to do.
                    if current && let Kind::Read { .. } = op.kind {
                        let o = &mut self.ops[i];
                        o.status = CqStatus::RemoteAccess;
                        o.got = o.len;
                        if o.req_taken && o.unresolved == 0 {
                            self.finish(i as u32);
                        }
                    }
                    return Taken::Yes;
                }
                let Kind::Read { local, local_off, .. } = op.kind else {
                    return Taken::Malformed;
                };
                let fits = r.sink_to.checked_add(data.len() as u64).is_some_and(|e| e <= op.len);
                if !current || !fits {
                    // Late, for a read that ended (the peer was lost), or
                    // garbage: taken, so it is not resent, and dropped.
                    return Taken::Malformed;
                }
                self.bytes(local).write((local_off + r.sink_to) as usize, data);
                let o = &mut self.ops[i];
                o.got += data.len() as u64;
                if o.got >= o.len && o.req_taken && o.unresolved == 0 {
                    self.finish(i as u32);
                }
                Taken::Yes
            }
            _ => Taken::Malformed,
        }
    }

    // ---- time ----

    /// Resends what timed out; fails the work of peers silent too long;
    /// sends the acknowledgements that waited long enough.
    fn timers(&mut self, now: u64) {
        let peer_timeout = self.cfg.peer_timeout.as_nanos() as u64;
        let ack_delay = self.cfg.ack_delay.as_nanos() as u64;
        let mut k = 0;
        while k < self.active.len() {
            let s = self.active[k];
            let sess = &self.sessions[s as usize];
            if sess.in_flight > 0 && now.saturating_sub(sess.last_heard_ns) > peer_timeout {
                self.lose_session(s, CqStatus::PeerUnreachable);
            }
            let sess = &self.sessions[s as usize];
            if sess.in_flight > 0 {
                let mut seq = sess.base;
                let mut timed_out = false;
                while seq != self.sessions[s as usize].next_seq {
                    let sess = &mut self.sessions[s as usize];
                    let slot = &mut sess.slots[(seq % SPAN) as usize];
                    let due = if slot.rnr_due_ns > 0 {
                        slot.rnr_due_ns
                    } else {
                        slot.sent_ns + sess.rtt.rto_ns(slot.tries)
                    };
                    if slot.live && now >= due {
                        if slot.rnr_due_ns == 0 {
                            slot.tries += 1;
                            timed_out = true;
                            self.stats.retransmits += 1;
                        }
                        slot.rnr_due_ns = 0;
                        slot.sent_ns = now;
                        slot.flags &= !flags::PLEASE_DROP;
                        self.emit(s, seq);
                    }
                    seq = seq.wrapping_add(1);
                }
                let sess = &mut self.sessions[s as usize];
                if timed_out && self.cfg.window == Window::Adaptive {
                    sess.cwnd = (sess.cwnd / 2).max(2);
                    sess.cwnd_acked = 0;
                }
            }
            let sess = &self.sessions[s as usize];
            // What came in one poll is acknowledged at the next, unless a
            // packet carried the acknowledgement meanwhile: the answer a
            // host makes at once (a pingpong's) rides on it, a stream is
            // acknowledged once per burst taken, not after `ack_delay`
            // (which bounds the wait when polls are far apart).
            if sess.ack_owed > 0
                && (sess.ack_now
                    || sess.ack_owed >= ACK_EVERY
                    || self.polls > sess.ack_since_poll
                    || now.saturating_sub(sess.ack_since_ns) >= ack_delay)
            {
                let h = self.header(s, Type::Ack, 0);
                let sess = &self.sessions[s as usize];
                self.control(sess.peer, sess.via, h, |_| {});
                self.stats.acks_sent += 1;
            }
            let sess = &mut self.sessions[s as usize];
            if sess.in_flight == 0 && sess.queue.is_empty() && sess.ack_owed == 0 {
                sess.active = false;
                self.active.swap_remove(k);
            } else {
                k += 1;
            }
        }
    }
}

/// What a receiver made of a new sequenced packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    Yes,
    /// No buffer (or read job) for it: resend later.
    NotReady,
    /// A remote access the registration does not allow: RFC 5040's code.
    Refused(u8),
    /// Its headers contradict themselves.
    Malformed,
}

impl Device for UdpDevice {
    fn caps(&self) -> Caps {
        Caps {
            mtu: self.cfg.mtu,
            bufs: self.cfg.bufs,
            tx_depth: self.cfg.tx_depth,
            rx_depth: self.cfg.rx_depth,
            inline_size: 0,
            max_rdma_size: self.cfg.max_rdma_size,
            rdma_read: self.cfg.rdma_read,
            rdma_write: self.cfg.rdma_write,
            device_version: 0x55,
            external_memory: true,
        }
    }

    fn addr(&self) -> RawAddr {
        self.me
    }

    fn insert_addr(&mut self, addr: &RawAddr) -> Result<Ah, DeviceError> {
        if let Some(&ah) = self.by_addr.get(addr) {
            return Ok(ah);
        }
        let sa = self.sockaddr_of(addr).ok_or(DeviceError::BadAddress)?;
        let s = self.session(sa, addr.connid, host_now_ns()).ok_or(DeviceError::Again)?;
        let id = match self.book.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.book.push(None);
                self.book.len() - 1
            }
        };
        let ah = Ah(id as u32);
        self.book[id] = Some((*addr, s));
        self.by_addr.insert(*addr, ah);
        self.sessions[s as usize].ah = Some(ah);
        Ok(ah)
    }

    fn remove_addr(&mut self, ah: Ah) {
        if let Some(slot) = self.book.get_mut(ah.0 as usize)
            && let Some((addr, s)) = slot.take()
        {
            self.by_addr.remove(&addr);
            self.sessions[s as usize].ah = None;
        }
    }

    unsafe fn buf(&self, id: BufId) -> &[u8] {
        // SAFETY: the buffer is not posted (the caller's contract), and the
        // device writes only posted buffers, inside its own calls.
        unsafe { self.frames.slice(id) }
    }

    unsafe fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        // SAFETY: as `buf`; `&mut self` makes the loan exclusive.
        unsafe { self.frames.slice_mut(id) }
    }

    fn register(&mut self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        let region = self.domain.add(Bytes::zeroed(len), access | Access::LOCAL, 1)?;
        let mr = region.mr;
        self.install(region);
        Ok(mr)
    }

    fn attach(&mut self, mr: &Mr) -> Result<(), DeviceError> {
        if !self.regions.contains(mr.id) {
            self.install(self.domain.attach(mr)?);
        }
        Ok(())
    }

    fn deregister(&mut self, mr: MrId) -> Result<(), DeviceError> {
        let region = self.regions.remove(mr)?;
        self.by_key.remove(&region.mr.key);
        self.domain.detach(mr);
        Ok(())
    }

    fn read_region(&self, mr: MrId, offset: usize, out: &mut [u8]) {
        self.bytes(mr).read(offset, out);
    }

    fn write_region(&mut self, mr: MrId, offset: usize, src: &[u8]) {
        self.bytes(mr).write(offset, src);
    }

    fn copy_region(&mut self, src: MrId, src_off: usize, dst: MrId, dst_off: usize, len: usize) {
        Bytes::copy(self.bytes(src), src_off, self.bytes(dst), dst_off, len);
    }

    fn update_region<F: FnMut(usize, &mut [u8])>(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        fetch: Option<(BufId, usize)>,
        combine: F,
    ) {
        self.bytes(mr).update(offset, len, self.frames.fetcher(fetch), combine);
    }

    fn read_payload(&mut self, buf: BufId, from: usize, out: &mut [u8]) {
        self.frames.read(buf, from, out);
    }

    fn copy_to_region(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        self.frames.copy_out(buf, from, &self.regions.expect(mr).bytes, offset, len);
    }

    fn copy_from_region(&mut self, mr: MrId, offset: usize, buf: BufId, to: usize, len: usize) {
        self.frames.copy_in(buf, to, &self.regions.expect(mr).bytes, offset, len);
    }

    fn prepare_rdma(&mut self, mr: MrId) -> Result<(), DeviceError> {
        self.regions.get(mr).map(drop).ok_or(DeviceError::UnknownHandle)
    }

    fn post_recv(&mut self, bufs: &[BufId]) -> usize {
        let room = self.cfg.rx_depth - self.posted.len();
        let n = bufs.len().min(room);
        self.posted.extend(&bufs[..n]);
        n
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> usize {
        self.post_sends(wrs, |_| None)
    }

    fn post_rdma(&mut self, wrs: &[RdmaWr]) -> usize {
        let mut n = 0;
        for wr in wrs {
            if self.tx_used >= self.cfg.tx_depth {
                break;
            }
            self.tx_used += 1;
            n += 1;
            let (cq_op, offered) = match wr.op {
                RdmaOp::Read => (CqOp::Read, self.cfg.rdma_read),
                RdmaOp::Write { .. } => (CqOp::Write, self.cfg.rdma_write),
            };
            if !offered {
                // A device without the capability takes none.
                self.tx_used -= 1;
                n -= 1;
                break;
            }
            let session = self.book.get(wr.ah.0 as usize).copied().flatten().map(|(_, s)| s);
            let ok = self.region_ok(wr.local, wr.local_offset, wr.len)
                && wr.len <= self.cfg.max_rdma_size;
            let (Some(s), true) = (session, ok) else {
                self.local_error(cq_op, wr.wr_id);
                continue;
            };
            let kind = match wr.op {
                RdmaOp::Read => Kind::Read {
                    local: wr.local,
                    local_off: wr.local_offset,
                    remote_addr: wr.remote_addr,
                    key: wr.remote_key,
                },
                RdmaOp::Write { imm } => Kind::Write {
                    local: wr.local,
                    local_off: wr.local_offset,
                    remote_addr: wr.remote_addr,
                    key: wr.remote_key,
                    imm,
                },
            };
            let i = self.alloc_op(kind, wr.wr_id, s, wr.len).expect("tx_depth");
            self.regions.mark_busy(wr.local);
            self.start(i);
        }
        self.pump(host_now_ns());
        self.flush();
        n
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        if self.cq.len() < out.len() {
            self.polls += 1;
            let now = host_now_ns();
            // A few bursts at most: a flood must not keep us from sending.
            for _ in 0..4 {
                if self.receive(now) < BURST {
                    break;
                }
            }
            if !self.active.is_empty() {
                self.timers(now);
                self.pump(now);
            }
            self.flush();
        }
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.cq.pop_front() else { break };
            if !matches!(c.op, CqOp::Recv | CqOp::RecvWriteImm | CqOp::RecvImm) {
                self.tx_used -= 1;
            }
            out[n] = c;
            n += 1;
        }
        n
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("tx_datagrams", s.tx_datagrams),
            ("rx_datagrams", s.rx_datagrams),
            ("retransmits", s.retransmits),
            ("duplicates", s.duplicates),
            ("beyond_window", s.beyond_window),
            ("malformed", s.malformed),
            ("bad_checksum", s.bad_checksum),
            ("please_dropped", s.please_dropped),
            ("rnr_sent", s.rnr_sent),
            ("rnr_received", s.rnr_received),
            ("terminates_sent", s.terminates_sent),
            ("terminates_received", s.terminates_received),
            ("stale", s.stale),
            ("acks_sent", s.acks_sent),
            ("peers_lost", s.peers_lost),
            ("sessions_full", s.sessions_full),
            ("tx_again", s.tx_again),
            ("reads_revoked", s.reads_revoked),
        ]
    }

    fn now_ns(&self) -> u64 {
        host_now_ns()
    }
}

impl UdpDevice {
    fn install(&mut self, region: Region) {
        self.by_key.insert(region.mr.key, region.mr.id);
        self.regions.insert(region.mr.id, region);
    }
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        // A NIC acknowledges what it took whether or not its host polls
        // again: the acknowledgements still owed go now, or a peer's last
        // send (a process that received it and exits at once) would wait
        // for a retransmission no one answers until it timed out.
        for s in 0..self.sessions.len() as u32 {
            let sess = &self.sessions[s as usize];
            if sess.ack_owed > 0 && !sess.dead {
                let h = self.header(s, Type::Ack, 0);
                let sess = &self.sessions[s as usize];
                self.control(sess.peer, sess.via, h, |_| {});
                self.stats.acks_sent += 1;
            }
        }
        self.flush();
        let domain = &self.domain;
        self.regions.clear(|id| domain.detach(id));
    }
}

#[cfg(test)]
mod tests;
