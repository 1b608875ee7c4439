//! The RDM endpoint: the protocol state machine that turns sends,
//! receives, writes, reads and atomics into EFA RDM v4 packets and RDMA
//! operations, and back.
//!
//! An [`Endpoint`] owns one [`Device`] and runs on the thread that made it
//! (it is `!Send` whenever its device is, and holds no lock). The protocol
//! logic does no I/O of its own; [`Endpoint::progress`] is the loop that
//! moves data between it and the device, in this order:
//!
//! 1. poll the device for a burst of completions and handle each: a sent
//!    packet frees its buffer and advances its operation; a received
//!    packet is parsed, its sender resolved (and answered with a
//!    HANDSHAKE the first time), put in msg_id order, matched, copied; a
//!    finished RDMA operation advances the transfer it belongs to;
//! 2. build what is due — queued control packets first (HANDSHAKE, CTS,
//!    EOR, RECEIPT...), then operations with packets or RDMA to post —
//!    while packet buffers and TX slots last, and post them in bursts;
//! 3. post free receive buffers; every so often, fail operations whose
//!    peer did not answer within [`Config::response_timeout`].
//!
//! Application commands (`send`, `recv`, `write`, `read`, `atomic`...)
//! enqueue work and may build packets at once; they return
//! [`Error::Again`] when a pool is full (back-pressure, not failure).
//! Completions wait in a queue that [`Endpoint::poll_cq`] drains, one at a
//! time, or [`Endpoint::poll_cq_with`], in a burst.
//!
//! Everything from the wire is checked before use: a packet the codec
//! rejects, a send_id/recv_id that names no live operation (slab index
//! plus generation), a msg_id outside the reorder window, a segment
//! outside its message or one that arrived before (a copy), a connid that
//! is not its sender's, a remote iov outside its registration (key,
//! bounds, rights): each is counted by reason (see [`Counters`]) and
//! dropped, and target memory is untouched.
//!
//! # Which protocol carries what
//!
//! | operation | size | protocol |
//! |---|---|---|
//! | send, tsend | fits one packet | eager RTM (DC_EAGER with delivery complete) |
//! | | from `long_read_min` (1 MiB; [`Config::on_host`]: any), peer and device read | long-read, or runting read (first `runt_size` bytes eager, default off; or the head of [`Endpoint::sendv_head`]), EOR |
//! | | up to `medium_max` (64 KiB) | medium RTM segments |
//! | | otherwise | long-CTS with CTS flow control |
//! | write | device and peer RDMA write | direct RDMA write, segmented |
//! | | fits one packet | EAGER_RTW |
//! | | from `long_read_write_min` (64 KiB), peer and device read | LONGREAD_RTW, EOR |
//! | | otherwise | LONGCTS_RTW |
//! | read | device and peer RDMA read | direct RDMA read, segmented |
//! | | fits one READRSP | SHORT_RTR + READRSP |
//! | | otherwise | LONGCTS_RTR + READRSP, CTSDATA, CTS (read flag) |
//! | atomic, fetch, compare | up to one packet | WRITE/FETCH/COMPARE_RTA (+ ATOMRSP) |
//!
//! A receiver that cannot prepare its memory for a long-read or runting
//! read (a message or a write) answers READ_NACK to a peer that takes it,
//! and the sender goes on by long-CTS, its re-sent REQ flagged and without
//! data (spec 4.7).
//!
//! Before a peer's HANDSHAKE arrives, sends use the baseline protocols
//! (eager, medium, long-CTS), as the spec's handshake workflow says (2.1,
//! step 1); the provider instead holds a message it would send by
//! long-read until the HANDSHAKE is in (libfabric 1.17's
//! `rxr_msg_post_rtm`: `-FI_EAGAIN` after triggering it), and either
//! meets the other. Writes, reads and delivery-complete operations ask
//! for the HANDSHAKE and return `Again` until it is in, since their
//! protocol depends on what the peer supports
//! ([`Config::handshake_on_insert`] avoids the wait).
//!
//! # Map
//!
//! One module per protocol, each with both sides of it: what its sender
//! does, what its receiver does, the packets it emits and the handlers of
//! those it receives. A send-side operation is a `TxOp` (of a `TxKind`) in
//! the `tx_ops` slab, a receive-side one an `RxOp` (of an `RxKind`) in
//! `rx_ops`; the protocol's own state is their `TxProto` or `RxProto`
//! variant (ops.rs), and where each stands is a phase: a `TxOp`'s
//! `TxPhase` (`Start`: its first packet due; `Transfer { awaits }`: the
//! rest going out, and the peer's answer it needs, if any), a message's
//! `RxState` (`Unexpected`, its packets held, until a receive matches it;
//! then `Matched`), and the reads' `ReadPhase` of a long-read or runting
//! read receive (`Waiting`, `Reading { next, in_flight }`, `Refused`).
//!
//! | protocol | file | packets | phases |
//! |---|---|---|---|
//! | handshake | handshake.rs | HANDSHAKE; a zero-byte write asks for it | per peer: `handshake_sent`, `req_sent`, `handshake_received` (peer.rs) |
//! | eager | eager.rs | EAGER_MSGRTM, EAGER_TAGRTM, DC_EAGER_MSGRTM, DC_EAGER_TAGRTM | usually no entry on either side (a TX buffer's `Owner::Eager`; header prediction); else `TxProto::Eager`, `Start`, `Transfer` until the packet completes (`awaits: Some(Receipt)` with delivery complete); `RxProto::Eager` |
//! | medium | medium.rs | MEDIUM_MSGRTM, MEDIUM_TAGRTM, DC_MEDIUM_MSGRTM, DC_MEDIUM_TAGRTM | `TxProto::Medium`: `Transfer` until every segment is built and completed; `RxProto::Medium` until every byte landed |
//! | long-CTS | longcts.rs | LONGCTS_MSGRTM, LONGCTS_TAGRTM, DC_LONGCTS_MSGRTM, DC_LONGCTS_TAGRTM, CTS, CTSDATA | `TxProto::LongCts { granted }`: in `Transfer`, sends up to the grant; `RxProto::LongCts { granted }`: grants a window when half the last arrived |
//! | long-read | longread.rs | LONGREAD_MSGRTM, LONGREAD_TAGRTM, EOR; RDMA reads | `TxProto::LongRead`: `Transfer { awaits: Some(Eor) }`; `RxProto::LongRead(Reads)`: `Waiting` until matched, then `Reading` |
//! | runting read | runtread.rs (runt segments: medium.rs; reads and EOR: longread.rs) | RUNTREAD_MSGRTM, RUNTREAD_TAGRTM | `TxProto::RuntRead { runt, budget }`: the runt in segments, then `awaits: Some(Eor)`; `RxProto::RuntRead(Reads)`: `Waiting` until the runt landed, then `Reading` |
//! | emulated write | write.rs | EAGER_RTW, DC_EAGER_RTW, LONGCTS_RTW, DC_LONGCTS_RTW, LONGREAD_RTW (then on as long-CTS or long-read) | `TxKind::Write` by `TxProto` Eager, LongCts or LongRead; the target's `RxKind::Write` by `RxProto` LongCts or LongRead |
//! | emulated read | read.rs | SHORT_RTR, LONGCTS_RTR, READRSP (then long-CTS's flow control, flagged as a read's) | requester: `RxKind::Read`, `RxProto::LongCts { granted }`, its responder `RemoteId::UNKNOWN` until READRSP; responder: `TxKind::ReadRsp`, `TxProto::LongCts` |
//! | atomics | atomic.rs | WRITE_RTA, DC_WRITE_RTA, FETCH_RTA, COMPARE_RTA, ATOMRSP | `TxKind::Atomic`: `Transfer` once its RTA is built, `awaits: Some(AtomRsp)` (fetch, compare) or `Some(Receipt)` (delivery complete) |
//! | direct RMA | rdma.rs | none: device RDMA read and write (with immediate for CQ data) | `TxKind::Rdma`: `Transfer` from the start, segments posted (`sent`) and completed (`in_flight`) |
//! | delivery complete | dc.rs | RECEIPT (the DC_ REQ types are their protocols') | `awaits: Some(Receipt)` until RECEIPT (a read protocol: `Some(Eor)`) |
//! | READ_NACK | nack.rs | READ_NACK; the long-CTS REQ re-sent flagged | sender: back to `Start` as `TxProto::LongCts { after_nack: true }`; receiver: `ReadPhase::Refused`, then `RxProto::LongCts` |
//!
//! Besides its phase, a send-side operation counts what the device has
//! not completed (`in_flight`: packets or RDMA segments), in either phase,
//! and its first error (`error`), reported once nothing is in flight; it
//! is done (`TxOp::is_done`) in `Transfer { awaits: None }` with every
//! byte sent and nothing in flight.
//!
//! Around the protocols: dispatch.rs maps each packet type to its handler
//! (and holds the table of REQ types, read both ways); msg.rs is what the
//! message protocols share (sends, receives, matching, landing,
//! completion); rx.rs resolves senders and keeps msg_id order; tx.rs owns
//! TX buffers, control packets and posting; matching.rs, peer.rs, slab.rs,
//! timer.rs, cq.rs, counters.rs and types.rs (ids, and what "none" is for
//! each) are the endpoint's data structures.

mod atomic;
mod counters;
mod cq;
mod dc;
mod dispatch;
mod eager;
mod handshake;
mod longcts;
mod longread;
mod matching;
mod medium;
mod msg;
mod nack;
mod ops;
mod peer;
mod rdma;
mod read;
mod recv_ring;
mod runtread;
mod rx;
mod slab;
mod timer;
mod tx;
mod types;
mod write;

use std::collections::VecDeque;
use std::time::Duration;

pub use crate::mem::Span;
pub use atomic::{AtomicOp, Datatype, apply as atomic_apply};
pub use counters::{Counters, DropReason};
pub use cq::{Completion, Op, Status};
pub use eager::WriteHead;
pub use recv_ring::RecvRing;
pub use types::{PeerId, PersistentRecv};

use crate::device::{Access, Caps, Cqe, Device, DeviceError, Mr, MrId};
use crate::mem::Registry;
use crate::wire::RawAddr;
use matching::Matcher;
use ops::{Posted, RxOp, TxOp};
use peer::Peers;
use slab::Slab;
use tx::TxQueue;
use types::{BufId, Held, PostedId, RxId, TxId};

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A pool or queue is full, or the peer's HANDSHAKE is still awaited:
    /// progress the endpoint and retry.
    #[error("resources exhausted or handshake pending, retry after progress")]
    Again,
    /// The peer is not in the address vector.
    #[error("unknown peer")]
    UnknownPeer,
    /// The span names no registered region, or lies outside it.
    #[error("span outside its registered region")]
    BadSpan,
    /// Larger than the operation allows (inject: one packet; atomics: one
    /// packet of operands).
    #[error("too large for this operation")]
    TooLarge,
    /// The operation's arguments do not fit together (an atomic operation
    /// and datatype the protocol does not define, lengths that differ).
    #[error("invalid arguments")]
    Invalid,
    /// The peer does not support what the operation needs (delivery
    /// complete with a peer that lacks it).
    #[error("the peer does not support this operation")]
    NotSupported,
    /// The region is in use: a posted receive, an operation in progress or
    /// a packet not yet sent reads or writes it. Deregister it once their
    /// completions are out.
    #[error("the region is in use by a posted or unfinished operation")]
    Busy,
    /// The device refused.
    #[error("device: {0}")]
    Device(DeviceError),
}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Error {
        match e {
            DeviceError::Busy => Error::Busy,
            e => Error::Device(e),
        }
    }
}

/// What an endpoint still has in flight (see [`Endpoint::in_flight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// Send-side operations not finished: sends, writes, reads, atomics,
    /// and answers to the peers' reads.
    pub sends: usize,
    /// Messages and one-sided transfers being received (a message that
    /// arrived whole before its receive was posted does not count: it
    /// waits for the application, not for the network).
    pub receives: usize,
    /// Packets built and not yet completed by the device, control packets
    /// included.
    pub packets: usize,
}

impl InFlight {
    /// Nothing in flight.
    pub fn is_idle(&self) -> bool {
        *self == InFlight::default()
    }
}

/// Tunables. The defaults are the provider's where it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Deliver messages from each peer in send order (FI_ORDER_SAS).
    pub ordered: bool,
    /// msg_ids a receiver holds ahead of the next expected one, per peer.
    pub reorder_window: u32,
    /// Largest message sent with the medium protocol (provider: 64 KiB).
    pub medium_max: u64,
    /// Largest message sent eagerly; `None`: whatever fits in one packet.
    pub eager_max: Option<u64>,
    /// Packets a receiver grants per CTS in long-CTS transfers.
    pub cts_window: u32,
    /// Smallest message sent by RDMA read when both sides can (provider:
    /// 1 MiB); it takes precedence over `medium_max`.
    pub long_read_min: u64,
    /// Smallest emulated write done by the target's RDMA read (provider:
    /// 64 KiB).
    pub long_read_write_min: u64,
    /// Bytes a runting-read message sends eagerly, and the most such bytes
    /// in flight to one peer; 0 (the default) turns runting read off. The
    /// provider runts only device memory (307,200 for CUDA and Neuron
    /// buffers) and not system memory, which it has not tested runting
    /// with (efa_hmem.c), so it sends such messages LONGREAD; it accepts
    /// RUNTREAD from a peer all the same.
    pub runt_size: u64,
    /// RDMA operations one transfer keeps in flight.
    pub rdma_window: u32,
    /// Sends and writes complete only once the data is in the target
    /// buffer (FI_DELIVERY_COMPLETE), with the DC protocols.
    pub delivery_complete: bool,
    /// How long a read, fetch/compare atomic, long transfer or delivery
    /// complete operation waits for its peer before it completes in error
    /// (the provider waits forever).
    pub response_timeout: Duration,
    /// Send operations in flight (at most 2^20).
    pub tx_ops: usize,
    /// Receives posted and not yet matched (at most 2^20), and as many
    /// again of messages in progress or unexpected.
    pub rx_ops: usize,
    /// Ask each inserted peer for its HANDSHAKE at once (the provider waits
    /// for the first message), so the first large message or one-sided
    /// operation can use what the peer supports.
    pub handshake_on_insert: bool,
    /// Sent in HANDSHAKE packets when non-zero.
    pub host_id: u64,
    /// The msg_id of the first message to and from each peer (the
    /// provider's is 0); both sides must agree. For tests of wrap-around.
    pub first_msg_id: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ordered: true,
            reorder_window: 1024,
            medium_max: 64 * 1024,
            eager_max: None,
            cts_window: 32,
            long_read_min: 1 << 20,
            long_read_write_min: 64 * 1024,
            runt_size: 0,
            rdma_window: 16,
            delivery_complete: false,
            response_timeout: Duration::from_secs(5),
            tx_ops: 4096,
            rx_ops: 16384,
            handshake_on_insert: false,
            host_id: 0,
            first_msg_id: 0,
        }
    }
}

impl Config {
    /// The defaults for peers on this host, over the shm device: a message
    /// that does not fit one packet is read (long-read, no runt), one copy
    /// straight out of the sender's mapped buffer, where packets would take
    /// two through the ring and cross between the cores twice (figures in
    /// perf/README.md). The provider's own
    /// path to a peer on its host, its shm provider, likewise moves what
    /// exceeds 4 KiB with one copy (process_vm_readv).
    pub fn on_host() -> Config {
        Config { long_read_min: 0, runt_size: 0, ..Config::default() }
    }
}

/// Tags of a tagged receive that must match: a bit set in `ignore` matches
/// anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagMatch {
    pub tag: u64,
    pub ignore: u64,
}

/// How the endpoint's buffers are laid out in the device's pool.
#[derive(Debug, Clone, Copy)]
struct BufLayout {
    /// TX buffers are `0..tx`, RX buffers `tx..total`.
    tx: u32,
    total: u32,
}

/// An RDM endpoint over device `D`.
///
/// `!Send` and `!Sync` by its own marker, whatever its device: it holds no
/// lock, so it stays on the thread (the lcore) that made it, and sharding
/// per core is the compiler's to enforce. Even over a device that could
/// move between threads, it cannot:
///
/// ```compile_fail,E0277
/// use efapoll::device::Device;
/// use efapoll::endpoint::Endpoint;
///
/// fn to_another_thread<D: Device + Send + 'static>(ep: Endpoint<D>) {
///     std::thread::spawn(move || drop(ep));
/// }
/// ```
///
/// (while the same function compiles for the device alone:)
///
/// ```
/// use efapoll::device::Device;
///
/// fn to_another_thread<D: Device + Send + 'static>(dev: D) {
///     std::thread::spawn(move || drop(dev));
/// }
/// ```
#[derive(Debug)]
pub struct Endpoint<D: Device> {
    dev: D,
    /// Makes the endpoint `!Send` and `!Sync` (see above).
    _one_core: std::marker::PhantomData<*const ()>,
    caps: Caps,
    cfg: Config,
    addr: RawAddr,
    /// This endpoint's raw address as REQ raw address headers carry it.
    addr_hdr: [u8; RawAddr::REQ_HDR_SIZE],
    peers: Peers,
    tx_ops: Slab<TxOp, TxId>,
    rx_ops: Slab<RxOp, RxId>,
    /// Receives waiting for a message.
    posted: Slab<Posted, PostedId, true>,
    /// The spans of posted receives that scatter (`recvv`), by the
    /// entry's slab index; empty where none is.
    scattered: Vec<ops::Sgl>,
    matcher: Matcher,
    /// Receive rings, and which peer has one.
    rings: recv_ring::Rings,
    txq: TxQueue,
    bufs: BufLayout,
    /// RX buffers neither posted nor holding a packet.
    rx_free: Vec<BufId>,
    rx_posted: usize,
    /// Free buffers are posted when fewer than this many are: a burst's
    /// worth short of the device's depth (a few is not worth a call).
    rx_refill_below: usize,
    /// Per buffer: length of the packet it holds, its sender, and the next
    /// buffer in the chain of held packets it belongs to.
    rx_meta: Vec<RxMeta>,
    mem: Registry,
    cq: cq::CompletionQueue,
    counters: Counters,
    /// The device's completions of one poll; out of `self` while they are
    /// handled, so handlers read them in place (see `progress`).
    cqes: Option<Box<[Cqe; POLL_BURST]>>,
    /// Posting order of receives.
    next_seq: u64,
    /// Messages whose later packets are still to come, by (peer, msg_id).
    in_progress: matching::MsgIndex,
    /// Segments that arrived ahead of their message's contiguous prefix,
    /// by (receive entry, message offset): their lengths.
    ooo_segs: OooSegs,
    /// Peers whose next message waits for a receive entry (ordered).
    stalled_peers: VecDeque<PeerId>,
    /// Packets waiting for a receive entry (unordered).
    stalled_bufs: VecDeque<BufId>,
    timer: timer::Timer,
    /// A packet's worth of memory for copies that need it (atomic
    /// operands).
    scratch: Box<[u8]>,
}

/// Completions polled per device call (DPDK's burst).
const POLL_BURST: usize = 32;

/// Out-of-order segments recorded, by (receive entry id, message offset).
type OooSegs = std::collections::HashMap<
    (RxId, u64),
    u64,
    std::hash::BuildHasherDefault<crate::intmap::IntHasher>,
>;

/// Out-of-order segments the endpoint holds room for: a few CTS windows'
/// worth (more only allocate).
const OOO_SEGS: usize = 256;

#[derive(Debug, Clone, Copy)]
struct RxMeta {
    len: u32,
    peer: PeerId,
    /// The rest of the chain of held packets this one heads.
    next: Held,
    /// REQs: where the payload starts, so that a held eager message is
    /// landed without parsing its packet again.
    payload_off: u32,
}

impl<D: Device> Endpoint<D> {
    /// An endpoint over `dev`. Partitions the device's packet buffers:
    /// one TX buffer per TX slot, the rest for receiving and holding.
    pub fn new(dev: D, cfg: Config) -> Result<Endpoint<D>, Error> {
        let caps = dev.caps();
        assert!(caps.mtu >= 256, "mtu {} is too small for EFA RDM headers", caps.mtu);
        assert!(cfg.cts_window > 0 && cfg.reorder_window > 0, "windows are at least 1");
        assert!(cfg.rdma_window > 0, "rdma_window is at least 1");
        let tx = (caps.tx_depth as u32).min(caps.bufs / 2);
        let bufs = BufLayout { tx, total: caps.bufs };
        let addr = dev.addr();
        let tx_ops = cfg.tx_ops.min(slab::MAX_CAPACITY);
        let rx_ops = cfg.rx_ops.min(slab::MAX_CAPACITY);
        let rx_free: Vec<BufId> = (tx..caps.bufs).rev().map(BufId).collect();
        let mut ep = Endpoint {
            caps,
            cfg,
            addr,
            addr_hdr: addr.to_req_hdr_bytes(),
            peers: Peers::default(),
            tx_ops: Slab::with_capacity(tx_ops, TxOp::blank()),
            rx_ops: Slab::with_capacity(
                rx_ops,
                RxOp::new(ops::RxKind::Msg, ops::RxState::Unexpected),
            ),
            posted: Slab::with_capacity(rx_ops, Posted::BLANK),
            scattered: Vec::new(),
            matcher: Matcher::with_capacity(rx_ops),
            rings: recv_ring::Rings::default(),
            txq: TxQueue::new(tx, tx_ops + rx_ops),
            bufs,
            rx_free,
            rx_posted: 0,
            rx_refill_below: if caps.rx_depth > POLL_BURST {
                (caps.rx_depth - POLL_BURST + 1).max(POLL_BURST)
            } else {
                caps.rx_depth
            },
            rx_meta: vec![
                RxMeta { len: 0, peer: PeerId(0), next: Held::EMPTY, payload_off: 0 };
                caps.bufs as usize
            ],
            mem: Registry::default(),
            cq: cq::CompletionQueue::with_capacity(tx_ops + 2 * rx_ops),
            counters: Counters::default(),
            cqes: Some(Box::new([Cqe::default(); POLL_BURST])),
            next_seq: 0,
            in_progress: matching::MsgIndex::with_capacity(rx_ops),
            ooo_segs: OooSegs::with_capacity_and_hasher(OOO_SEGS, Default::default()),
            stalled_peers: VecDeque::with_capacity(64),
            stalled_bufs: VecDeque::with_capacity(64),
            timer: timer::Timer::new(cfg.response_timeout, tx_ops + rx_ops),
            scratch: vec![0u8; caps.mtu].into_boxed_slice(),
            dev,
            _one_core: std::marker::PhantomData,
        };
        ep.post_rx_buffers();
        Ok(ep)
    }

    /// This endpoint's raw address, to give to peers.
    pub fn addr(&self) -> RawAddr {
        self.addr
    }

    /// The device's capabilities.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// What the endpoint has counted.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The device, for its own statistics.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Adds a peer to the address vector (like `fi_av_insert`); inserting
    /// the same address again gives the same id.
    pub fn insert_peer(&mut self, addr: &RawAddr) -> Result<PeerId, Error> {
        let id = self.peer_for_addr(addr)?;
        if self.cfg.handshake_on_insert {
            self.request_handshake(id);
        }
        Ok(id)
    }

    /// A peer's raw address.
    pub fn peer_addr(&self, peer: PeerId) -> Option<RawAddr> {
        self.peers.get(peer).map(|p| p.addr)
    }

    /// Whether the peer's HANDSHAKE has arrived (its features are known).
    pub fn peer_handshake_received(&self, peer: PeerId) -> bool {
        self.peers.get(peer).is_some_and(|p| p.handshake_received)
    }

    /// The extra features the peer advertised (0 before its HANDSHAKE).
    pub fn peer_features(&self, peer: PeerId) -> u64 {
        self.peers.get(peer).map_or(0, |p| p.features)
    }

    /// The largest message that goes to `peer` in one packet now (it grows
    /// once the peer's HANDSHAKE arrives and REQs stop carrying our raw
    /// address).
    pub fn max_eager_size(&self, peer: PeerId, tagged: bool) -> u64 {
        use crate::wire::PacketType;
        let ptype = if tagged { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        let room = (self.caps.mtu - self.req_header_len(ptype, peer, false)) as u64;
        self.cfg.eager_max.map_or(room, |m| m.min(room))
    }

    /// Registers `len` bytes of new, zeroed memory with `access` rights.
    pub fn register(&mut self, len: u64, access: Access) -> Result<Mr, Error> {
        let mr = self.dev.register(len, access)?;
        self.mem.insert(mr);
        Ok(mr)
    }

    /// Uses a region registered on the device's protection domain (by the
    /// domain itself, or by another endpoint on it): N lcores, one
    /// registration. [`Endpoint::deregister`] detaches it again.
    pub fn attach(&mut self, mr: &Mr) -> Result<(), Error> {
        self.dev.attach(mr)?;
        self.mem.insert(*mr);
        Ok(())
    }

    /// Deregisters a region (detaches it, if its domain holds it or other
    /// endpoints use it); [`Error::Busy`] while a posted receive, an
    /// unfinished operation or a packet not yet sent uses it (on a NIC,
    /// its DMA would reach freed memory). It looks through the live
    /// operations (deregistration is set-up work, and a count kept per
    /// region would cost every message).
    pub fn deregister(&mut self, mr: MrId) -> Result<(), Error> {
        if self.mem.get(mr).is_none() {
            return Err(Error::BadSpan);
        }
        if self.region_in_use(mr) {
            return Err(Error::Busy);
        }
        self.dev.deregister(mr)?;
        self.mem.remove(mr);
        Ok(())
    }

    /// Whether anything posted or in progress reads or writes region `mr`.
    fn region_in_use(&self, mr: MrId) -> bool {
        let uses = |sgl: &ops::Sgl| sgl.segs().iter().any(|s| s.mr == mr);
        let atomic_uses = |a: &Option<ops::AtomicReq>| {
            a.is_some_and(|a| [a.result, a.compare].iter().flatten().any(|s| s.mr == mr))
        };
        self.posted.live().any(|p| p.dst.mr == mr)
            || self.ring_uses(mr)
            || self.scattered.iter().any(uses)
            || self.rx_ops.live().any(|op| uses(&op.dst))
            || self.tx_ops.live().any(|op| uses(&op.src) || atomic_uses(&op.atomic))
            || self.tx_gathers_from(mr)
    }

    /// What is in flight: operations not finished and packets the device
    /// has not completed. Posted receives waiting for a message are not
    /// in flight.
    pub fn in_flight(&self) -> InFlight {
        let receives = self.rx_ops.live().filter(|op| op.state != ops::RxState::Unexpected);
        InFlight {
            sends: self.tx_ops.len(),
            receives: receives.count(),
            packets: self.tx_bufs_in_use(),
        }
    }

    /// Progresses once and says whether nothing is in flight any more
    /// ([`Endpoint::in_flight`]): the loop that ends an endpoint's work,
    /// polled like any other (its peers must progress too, for their
    /// answers to come). Then [`Endpoint::close`] it.
    pub fn drain(&mut self) -> bool {
        self.progress();
        self.in_flight().is_idle() && !self.txq.has_work()
    }

    /// Closes the endpoint once nothing is in flight and gives its device
    /// back (dropping the device frees its memory); an endpoint that is
    /// still busy comes back as the error, to [`Endpoint::drain`] further.
    /// Completions not polled and receives still posted are discarded.
    #[allow(clippy::result_large_err)]
    pub fn close(mut self) -> Result<D, Endpoint<D>> {
        if !self.drain() {
            return Err(self);
        }
        Ok(self.dev)
    }

    /// A registered region, by its local handle.
    pub fn mr(&self, mr: MrId) -> Option<Mr> {
        self.mem.get(mr).copied()
    }

    /// Copies `out.len()` bytes of region `mr` from `offset` into `out`.
    ///
    /// Registered memory is reached only through copies, never lent as a
    /// `&[u8]`: a peer (shm) or the NIC (EFA) may write it at any time, as
    /// its access rights allow. Read it after the completion that says it
    /// was written.
    pub fn read_mem(&self, mr: MrId, offset: u64, out: &mut [u8]) -> Result<(), Error> {
        self.check_span(&Span { mr, offset, len: out.len() as u64 })?;
        self.dev.read_region(mr, offset as usize, out);
        Ok(())
    }

    /// Copies `data` into region `mr` at `offset` (see
    /// [`Endpoint::read_mem`]).
    pub fn write_mem(&mut self, mr: MrId, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.check_span(&Span { mr, offset, len: data.len() as u64 })?;
        self.dev.write_region(mr, offset as usize, data);
        Ok(())
    }

    /// Copies the bytes of span `src` into region `dst` at `offset`, one
    /// registered region to another (or within one; the ranges may
    /// overlap) without passing through the caller's memory. Read both
    /// after the completions that say they were written.
    pub fn copy_mem(&mut self, src: Span, dst: MrId, offset: u64) -> Result<(), Error> {
        self.check_span(&src)?;
        self.check_span(&Span { mr: dst, offset, len: src.len })?;
        if src.len > 0 {
            let n = src.len as usize;
            self.dev.copy_region(src.mr, src.offset as usize, dst, offset as usize, n);
        }
        Ok(())
    }

    /// The region registered (or attached) here under remote key `key`:
    /// what a peer names when it hands a key back, as a token to
    /// invalidate.
    pub fn mr_by_key(&self, key: u64) -> Option<Mr> {
        self.mem.by_key(key).copied()
    }

    /// Checks that `span` lies in a registered region.
    #[inline]
    fn check_span(&self, span: &Span) -> Result<(), Error> {
        if self.mem.contains(span) { Ok(()) } else { Err(Error::BadSpan) }
    }

    /// The next completion, if any.
    #[inline]
    pub fn poll_cq(&mut self) -> Option<Completion> {
        self.cq.pop()
    }

    /// Hands `f` the completions waiting, oldest first, until none is left
    /// or `f` returns false (the completion it returned false for is
    /// taken); how many it took. A burst of [`Endpoint::poll_cq`]s without
    /// their copies: `f` reads the fields it wants where the completion
    /// lies, and as it cannot reach the endpoint, the loop keeps its place
    /// in the queue in registers, where a `poll_cq` loop whose body calls
    /// out reads it again for every completion.
    ///
    /// ```
    /// # use efapoll::device::sim::{SimConfig, SimFabric};
    /// # use efapoll::endpoint::{Config, Endpoint, Op};
    /// # let fabric = SimFabric::new(SimConfig::default());
    /// # let mut ep = Endpoint::new(fabric.device(), Config::default()).unwrap();
    /// let (mut sent, mut received) = (0, 0);
    /// ep.progress();
    /// ep.poll_cq_with(|c| {
    ///     match c.op {
    ///         Op::Send => sent += 1,
    ///         Op::Recv => received += c.len,
    ///         _ => {}
    ///     }
    ///     true
    /// });
    /// ```
    #[inline]
    pub fn poll_cq_with(&mut self, f: impl FnMut(&Completion) -> bool) -> usize {
        self.cq.drain(f)
    }

    /// The next completion, where it lies, left in the queue: a poll loop
    /// that takes some completions its own way reads the fields it wants
    /// and takes the completion with [`Endpoint::skip_cq`], no copy made.
    #[inline]
    pub fn peek_cq(&self) -> Option<&Completion> {
        self.cq.front()
    }

    /// Takes the next completion, unread (after [`Endpoint::peek_cq`]).
    #[inline]
    pub fn skip_cq(&mut self) {
        self.cq.skip()
    }

    /// Completions waiting.
    pub fn cq_len(&self) -> usize {
        self.cq.len()
    }

    /// Posts the packets built so far to the device now rather than at the
    /// next [`Endpoint::progress`], which posts them in bursts: for a send
    /// whose latency matters more than the batching (a device call per
    /// flush). Returns whether the device took any.
    pub fn flush(&mut self) -> bool {
        self.post_pending()
    }

    /// Runs the progress loop once (see the module's doc); returns whether
    /// it did any work.
    pub fn progress(&mut self) -> bool {
        // One burst per call, as a DPDK poll loop: draining the device
        // while a fast sender keeps it full would starve the application of
        // its turn to post receives, and every message would arrive
        // unexpected (an extra copy each).
        // Handled in place, not copied out: a copy would read each
        // completion wider than the device wrote it, which stalls store
        // forwarding.
        let mut cqes = self.cqes.take().expect("completions array");
        let n = self.dev.poll(&mut cqes[..]);
        let mut did = n > 0;
        for cqe in &cqes[..n] {
            self.handle_cqe(cqe);
        }
        self.cqes = Some(cqes);
        if self.txq.has_work() {
            did |= self.flush_tx();
        }
        if self.rx_posted < self.rx_refill_below {
            self.post_rx_buffers();
        }
        self.retry_stalled();
        if self.timer.is_armed() {
            self.expire_timeouts();
        }
        did
    }

    fn handle_cqe(&mut self, cqe: &Cqe) {
        use crate::device::CqOp;
        match cqe.op {
            CqOp::Send => self.handle_send_done(cqe),
            // Immediate data is no part of the RDM protocol: a packet that
            // came with some is a packet.
            CqOp::Recv | CqOp::RecvImm => self.handle_recv(cqe),
            CqOp::Read | CqOp::Write => self.handle_rdma_done(cqe),
            CqOp::RecvWriteImm => self.handle_remote_write_imm(cqe),
        }
    }

    /// Returns RX buffer `buf` to the free list.
    #[inline]
    fn release_rx(&mut self, buf: BufId) {
        debug_assert!(buf.0 >= self.bufs.tx && buf.0 < self.bufs.total);
        self.rx_meta[buf.index()].next = Held::EMPTY;
        self.rx_free.push(buf);
    }

    /// Posts free RX buffers up to the device's receive depth, in bursts
    /// (see `rx_refill_below`).
    fn post_rx_buffers(&mut self) {
        let want = self.caps.rx_depth.saturating_sub(self.rx_posted);
        let n = want.min(self.rx_free.len());
        if n < want && self.rx_posted == 0 {
            self.counters.rx_hold_exhausted += 1;
        }
        if n == 0 {
            return;
        }
        let start = self.rx_free.len() - n;
        let taken = self.dev.post_recv(&self.rx_free[start..]);
        // The device took a prefix of what it was given.
        self.rx_free.drain(start..start + taken);
        self.rx_posted += taken;
    }
}
