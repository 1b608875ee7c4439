//! The connection: segments and credits on the send side, reassembly on the
//! receive side, over an endpoint and one of its peers.

use super::credits::Credits;
use super::header::{Flags, HEADER_LEN, Repr};
use super::segment::{Placement, Reassembler, Segmenter};
use super::{
    Config, DEFAULT_DATA_OFFSET, MAX_DATA_OFFSET, Params, ProtocolError, RecvError, SendError,
    SetupError,
};
use crate::device::{Access, Device, Mr};
use crate::endpoint::{Completion, Endpoint, Error as EpError, PeerId, RecvRing, Span, Status};
use crate::ring::Ring;

/// Context kinds, bits 24..32 of a context: a header slot's send, a
/// receive slot's receive. The slot is in the low 24 bits.
const KIND_SEND: u64 = 1;
const KIND_RECV: u64 = 2;
/// A whole message's one inject, its header emitted into the packet: the
/// low 24 bits are the message's sequence number, no header slot held.
/// Such a send completes with a completion only if it fails.
const KIND_WHOLE: u64 = 3;
const KIND_SHIFT: u32 = 24;
const SLOT_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// The longest segment the fast path reads whole out of its slot (see
/// `Connection::on_whole_arrival`).
const SMALL_SEGMENT: usize = 128;

/// A header slot's owner when the slot is free, and when the message is
/// the connection's own (an empty message granting credits).
const FREE: u64 = u64::MAX;
const NO_OWNER: u64 = u64::MAX - 1;

/// How a message's sending ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Every segment left.
    Ok,
    /// The endpoint failed a segment's send: its result, which the spec
    /// says the caller gets (3.1.5.4).
    Failed(Status),
    /// The connection was terminated before every segment was sent.
    Terminated,
}

/// How a receive buffer was filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvStatus {
    /// A whole message.
    Ok,
    /// The buffer was shorter than the message: the first `len` bytes of
    /// `olen` are in it.
    Truncated { olen: u64 },
    /// The connection was terminated; the buffer holds no whole message.
    Terminated,
}

/// What the connection reports, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A message given to [`Connection::send`] was sent, or failed; its
    /// buffer is the application's again.
    Sent { ctx: u64, status: SendStatus },
    /// A receive buffer given to [`Connection::recv`] holds a message of
    /// `len` bytes. `invalidated`: the token one of its segments carried,
    /// whose region was deregistered before this event.
    Received { ctx: u64, len: u64, status: RecvStatus, invalidated: Option<u64> },
    /// A message of one segment of at most [`Config::lend_max`] bytes is
    /// `data`, where it landed in the receive region: read it there, and
    /// give it back with [`Connection::give_back`], which posts its
    /// receive again (until then it holds a credit, as a message waiting
    /// for a buffer does). When the receive slots are an endpoint receive
    /// ring, which fills them in turn, a loan still out when its slot's
    /// turn comes round again also holds the messages behind it, waiting
    /// in the endpoint: give loans back within a round of the slots
    /// ([`Params::receive_credit_max`](super::Params::receive_credit_max) messages).
    /// `invalidated` as for `Received`.
    Lent { loan: Loan, data: Span, invalidated: Option<u64> },
    /// An empty message carried a token, whose region was deregistered.
    Invalidated { token: u64 },
    /// The connection ended, for this reason; reported once.
    Terminated(super::ProtocolError),
}

/// What [`Connection::drain`] hands its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained<'a> {
    /// An event of the connection's.
    Event(Event),
    /// An endpoint completion that is not the connection's.
    Other(&'a Completion),
}

/// What [`Connection::drain`]'s caller says of what it was handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Go on; a lent message was read, and is given back.
    Next,
    /// Go on; a lent message is kept, until [`Connection::give_back`].
    Keep,
    /// Stop here; a lent message was read, and is given back.
    Stop,
}

/// A message lent in its receive slot ([`Event::Lent`]), until given
/// back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loan(u16);

/// What a connection counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub messages_sent: u64,
    pub messages_received: u64,
    /// Data Transfer messages sent and received, empty ones included.
    pub segments_sent: u64,
    pub segments_received: u64,
    /// Empty messages sent to grant credits, and empty messages received.
    pub empty_sent: u64,
    pub empty_received: u64,
    /// Message bytes, headers not counted.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Times a segment waited for a send credit, or for a header slot.
    pub credit_stalls: u64,
    pub slot_stalls: u64,
    /// Segments sent with SMB_DIRECT_RESPONSE_REQUESTED.
    pub responses_requested: u64,
    /// Tokens the peer had invalidated here.
    pub tokens_invalidated: u64,
    /// Data segments that landed where their message goes, by a receive
    /// posted into the application's buffer: no copy.
    pub in_place: u64,
    /// Messages lent where they landed ([`Event::Lent`]): no copy.
    pub lent: u64,
    /// Messages sent by [`Connection::inject`], which nothing reports
    /// (counted in `messages_sent` too).
    pub injected: u64,
    /// Receives withdrawn to be posted again into buffers posted after
    /// them.
    pub replaced: u64,
}

impl Stats {
    /// `messages` lent, of `bytes` in all.
    #[inline]
    fn count_lent(&mut self, messages: u64, bytes: u64) {
        self.lent += messages;
        self.messages_received += messages;
        self.bytes_received += bytes;
    }

    /// What a drain lent whole, a segment each.
    #[inline]
    fn add_lent(&mut self, t: LentTally) {
        self.segments_received += t.messages;
        self.count_lent(t.messages, t.bytes);
    }
}

/// The messages [`Connection::drain`] lent whole as it went, counted in
/// registers and added to [`Stats`] as it returns, not four counters
/// updated in memory a message (a cycle or so a message when the cores
/// are far apart; perf/README, 2026-12-05).
#[derive(Debug, Clone, Copy, Default)]
struct LentTally {
    messages: u64,
    bytes: u64,
}

impl LentTally {
    #[inline(always)]
    fn add(&mut self, bytes: u64) {
        self.messages += 1;
        self.bytes += bytes;
    }
}

/// What a message sent whole at once reports, as it goes
/// (`Connection::send_whole_now`).
#[derive(Debug, Clone, Copy)]
enum Report {
    /// Its [`Event::Sent`] with this context, now: nothing is in flight
    /// before it.
    Now(u64),
    /// Its `Sent` with this context, after the messages in flight before
    /// it.
    Behind(u64),
    /// Nothing ([`Connection::inject`]).
    Nothing,
}

/// A message queued or being sent.
#[derive(Debug, Clone, Copy)]
struct TxMsg {
    src: Span,
    token: Option<u64>,
    ctx: u64,
    seg: Segmenter,
    /// Segments posted and not completed.
    in_flight: u32,
    status: SendStatus,
    /// One segment with data and no token, on the fast path: injected
    /// with its header emitted into the packet when it can be (then done
    /// with nothing in flight).
    whole: bool,
}

bitflags::bitflags! {
    /// What keeps a segment in its turn off the fast paths, kept in one
    /// word as each changes (all off those paths: [`Connection::settle`])
    /// so that the paths read one byte for four conditions.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    struct Unsettled: u8 {
        /// The connection was terminated.
        const TERMINATED = 1 << 0;
        /// Segments wait for their message's buffer.
        const PENDING = 1 << 1;
        /// A message is partly received.
        const PARTIAL = 1 << 2;
        /// Completions are stored for slots whose turn has not come: a
        /// segment may be taken whole, not lent as `drain` lends (handed
        /// out at once, it would leave those behind it untaken).
        const HELD = 1 << 3;
    }
}

/// What stands in a queue's free places.
const NO_SPAN: Span = Span { mr: crate::device::MrId(u32::MAX), offset: 0, len: 0 };

impl TxMsg {
    const FILL: TxMsg = TxMsg {
        src: NO_SPAN,
        token: None,
        ctx: 0,
        seg: Segmenter::EMPTY,
        in_flight: 0,
        status: SendStatus::Ok,
        whole: false,
    };
}

/// A receive buffer the application posted.
#[derive(Debug, Clone, Copy)]
struct AppBuf {
    dst: Span,
    ctx: u64,
    /// A posted receive scatters into it (see [`Landing`]); never twice.
    placed: bool,
    /// Given back to the application by a terminated connection.
    released: bool,
}

impl AppBuf {
    const FILL: AppBuf = AppBuf { dst: NO_SPAN, ctx: 0, placed: false, released: false };
}

/// Where a receive posted into an application buffer puts a segment's
/// bytes: `head` bytes in the slot, the next `len` in the buffer of
/// message `seq`, the rest in the slot again at their own offsets.
///
/// A receive is posted so only for the message it can carry at the latest:
/// behind `q` receives not yet handled, a segment belongs at most to the
/// message after the `q` that each of those could start, `seen + q`.
/// Its true message is that one or an earlier one, so that buffer is
/// handed to the application only once this receive was handled (its
/// message's last segment comes at or after it), and what landed in a
/// buffer that is not its message's is copied out, in order, before that
/// buffer is written. Only a message's first segment can land in its own
/// buffer, at offset 0 when DataOffset is `head`: then nothing is copied.
#[derive(Debug, Clone, Copy)]
struct Landing {
    seq: u64,
    dst: Span,
    head: u64,
    len: u64,
}

/// A receive slot's completion, waiting for the slots matched before it.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    status: Status,
    len: u64,
    token: Option<u64>,
}

/// A checked data segment waiting to be copied where its message goes
/// (from where its slot's [`Landing`], if any, put it).
#[derive(Debug, Clone, Copy)]
struct Pending {
    slot: u16,
    data_offset: u32,
    offset: u64,
    len: u32,
    total: u64,
    first: bool,
    last: bool,
    token: Option<u64>,
}

impl Pending {
    const FILL: Pending = Pending {
        slot: 0,
        data_offset: 0,
        offset: 0,
        len: 0,
        total: 0,
        first: false,
        last: false,
        token: None,
    };
}

/// The message being copied into an application buffer.
#[derive(Debug, Clone, Copy)]
struct RxMsg {
    buf: AppBuf,
    total: u64,
    token: Option<u64>,
}

/// Where [`Connection::drain`]'s run of slots given back begins: every
/// segment the ring took in its turn from slot `first` on (while
/// `armed` slots were armed) was lent and given back, so that the slots
/// are armed again as one run, counted by the ring's turns alone.
#[derive(Debug, Clone, Copy)]
struct GivenRun {
    first: u16,
    armed: u16,
}

/// An SMB Direct connection to one peer of an endpoint (see the module's
/// documentation). Every method that may post takes the endpoint.
#[derive(Debug)]
pub struct Connection {
    peer: PeerId,
    params: Params,
    cfg: Config,
    /// `ctx_tag` in the high 32 bits.
    tag: u64,
    /// Header slots of `data_offset` bytes, one per segment in flight.
    hdr: Mr,
    hdr_free: Vec<u16>,
    /// Per header slot: the sequence number of the message whose segment
    /// it carries, or `NO_OWNER`.
    hdr_owner: Vec<u64>,
    /// Receive slots of MaxReceiveSize bytes.
    rx: Mr,
    /// Slots to post (again).
    rx_free: Vec<u16>,
    /// Receives at the back of `rx_order` posted into their slots alone
    /// (at most; fewer once the order is shorter).
    unplaced_back: usize,
    /// Slots at the top of `rx_free` whose receives were withdrawn to be
    /// posted into a buffer (`place_posted`): granted already, so posted
    /// again without a credit.
    withdrawn: u16,
    /// Posted slots in posting order: the order the endpoint fills them
    /// (when receives are placed; else empty).
    rx_order: Ring<u16>,
    /// When receives are never placed: the endpoint's ring over the
    /// slots, each armed again as it is free, which fills them in turn by
    /// index from `rx_next`, `rx_armed` of them armed and not yet handled
    /// (in place of `rx_order`).
    rx_ring: Option<RecvRing>,
    rx_next: u16,
    rx_armed: u16,
    /// Per slot: its completion, until its turn.
    arrivals: Vec<Option<Arrival>>,
    /// Completions stored in `arrivals` (at least as many as are there):
    /// with none, no slot's turn can have come with the one handled.
    arrivals_held: usize,
    /// Messages queued or in flight, oldest first; the front's sequence
    /// number is `tx_front_seq`, and `next_post` indexes the first with
    /// segments still to post.
    tx: Ring<TxMsg>,
    tx_front_seq: u64,
    next_post: usize,
    /// The longest message sent whole by inject ([`TxMsg::whole`]): what
    /// one segment carries, within MaxFragmentedSendSize, within one
    /// packet to the peer as last read (`eager_room`) and within
    /// [`Config::inject_max`]; 0 without the fast path.
    whole_max: u64,
    /// The endpoint's largest message in one packet to the peer, as last
    /// read ([`Endpoint::max_eager_size`]; it only grows): a segment
    /// longer goes from its header slot without trying the packet first.
    eager_room: u64,
    /// The longest segment whose message may be lent: `lend_max` bytes
    /// behind the longest DataOffset, within MaxReceiveSize and within a
    /// DataLength of MaxFragmentedReceiveSize at the default DataOffset
    /// (so that a segment this short needs no other check of its length:
    /// a longer one is taken by the general path, which lends it as
    /// well); 0 when nothing is lent or without the fast path. Set up
    /// once, read for every segment.
    lend_segment_max: u64,
    apps: Ring<AppBuf>,
    /// Messages whose buffer came before the front's: the front's
    /// sequence number.
    apps_front_seq: u64,
    /// Messages whose first segment was handled.
    msgs_seen: u64,
    /// Per receive slot: the application buffer it was posted into.
    landings: Vec<Option<Landing>>,
    /// Whether receives are ever posted into buffers: a segment places at
    /// most MaxReceiveSize bytes, and below `direct_min` placing never
    /// pays. Set up once, read for every receive posted.
    places: bool,
    /// Per receive slot: lent to the application ([`Event::Lent`]).
    lent: Vec<bool>,
    lent_out: usize,
    /// The peer's DataOffset, as its last data segment said.
    peer_data_offset: u32,
    pending: Ring<Pending>,
    rx_msg: Option<RxMsg>,
    /// The message arriving carried a token already.
    token_in_msg: bool,
    reasm: Reassembler,
    credits: Credits,
    events: Ring<Event>,
    /// The contexts of messages sent at once ([`Self::sent_now`]), each
    /// an `Event::Sent` with `SendStatus::Ok` that comes after every event
    /// in `events`: a word queued and taken a message, not an event.
    sent: Ring<u64>,
    /// A short segment read whole out of its slot (the fast path).
    scratch: [u8; SMALL_SEGMENT],
    error: Option<ProtocolError>,
    /// `error`, `pending`, `reasm` and `arrivals_held`, as the fast paths
    /// read them.
    unsettled: Unsettled,
    closed: bool,
    stats: Stats,
}

impl Connection {
    /// A connection to `peer` of `ep`, with the negotiated `params`:
    /// registers its header slots and receive slots, and posts every
    /// receive (`params.receive_credits_granted` of them granted by the
    /// negotiation).
    pub fn new<D: Device>(
        ep: &mut Endpoint<D>,
        peer: PeerId,
        params: Params,
        cfg: Config,
    ) -> Result<Connection, SetupError> {
        params.check(cfg.data_offset)?;
        if cfg.send_slots == 0 || cfg.send_queue == 0 || cfg.recv_queue == 0 {
            return Err(SetupError::Params("queues and slots are at least 1"));
        }
        if !ep.config().ordered {
            return Err(SetupError::Unordered);
        }
        ep.peer_addr(peer).ok_or(EpError::UnknownPeer)?;
        let slots = params.receive_credit_max as usize;
        // Headers are read by the peer when the endpoint sends by RDMA read.
        let hdr =
            ep.register(cfg.send_slots as u64 * cfg.data_offset as u64, Access::REMOTE_READ)?;
        let rx = match ep.register(slots as u64 * params.max_receive_size as u64, Access::empty()) {
            Ok(mr) => mr,
            Err(e) => {
                let _ = ep.deregister(hdr.id);
                return Err(e.into());
            }
        };
        // Every page of the receives touched now, at set-up: a segment that
        // lands in one first would fault it in on the receive path (a
        // 1 MiB one, 256 faults).
        let zeros = vec![0u8; 64 << 10];
        let mut at = 0;
        while at < rx.len {
            let n = (rx.len - at).min(zeros.len() as u64);
            ep.write_mem(rx.id, at, &zeros[..n as usize])?;
            at += n;
        }
        let mut c = Connection {
            peer,
            params,
            cfg,
            tag: (cfg.ctx_tag as u64) << 32,
            hdr,
            hdr_free: (0..cfg.send_slots).rev().collect(),
            hdr_owner: vec![FREE; cfg.send_slots as usize],
            rx,
            rx_free: (0..slots as u16).rev().collect(),
            withdrawn: 0,
            unplaced_back: 0,
            rx_order: Ring::with_capacity(slots, 0),
            rx_ring: None,
            rx_next: 0,
            rx_armed: 0,
            arrivals: vec![None; slots],
            arrivals_held: 0,
            tx: Ring::with_capacity(cfg.send_queue as usize, TxMsg::FILL),
            tx_front_seq: 0,
            next_post: 0,
            whole_max: 0,
            eager_room: 0,
            lend_segment_max: if cfg.fast_path && cfg.lend_max > 0 {
                let predicted =
                    params.max_fragmented_receive_size as u64 + DEFAULT_DATA_OFFSET as u64;
                cfg.lend_max
                    .saturating_add(MAX_DATA_OFFSET as u64)
                    .min(params.max_receive_size as u64)
                    .min(predicted)
            } else {
                0
            },
            apps: Ring::with_capacity(cfg.recv_queue as usize, AppBuf::FILL),
            apps_front_seq: 0,
            msgs_seen: 0,
            landings: vec![None; slots],
            places: params.max_receive_size.min(params.max_fragmented_receive_size) as u64
                >= cfg.direct_min,
            lent: vec![false; slots],
            lent_out: 0,
            peer_data_offset: super::DEFAULT_DATA_OFFSET,
            pending: Ring::with_capacity(slots, Pending::FILL),
            rx_msg: None,
            token_in_msg: false,
            reasm: Reassembler::new(params.max_fragmented_receive_size),
            credits: Credits::new(params.send_credits, 0, 0),
            events: Ring::with_capacity(
                cfg.send_queue as usize + cfg.recv_queue as usize + 4,
                Event::Terminated(ProtocolError::Closed),
            ),
            // Each message sent at once takes a credit: room for as many
            // as the credits before the application takes their events
            // (it grows past that).
            sent: Ring::with_capacity(
                params.send_credit_target.max(params.send_credits) as usize,
                0,
            ),
            scratch: [0; SMALL_SEGMENT],
            error: None,
            unsettled: Unsettled::empty(),
            closed: false,
            stats: Stats::default(),
        };
        c.read_eager_room(ep);
        if !c.places
            && let Err(e) = c.set_up_slots(ep)
        {
            let _ = c.close(ep);
            return Err(SetupError::Endpoint(e));
        }
        c.repost(ep);
        if c.rx_free.is_empty() {
            c.credits =
                Credits::new(params.send_credits, slots as u16, params.receive_credits_granted);
            return Ok(c);
        }
        // The endpoint took fewer receives than the credits promise.
        let error = match c.error {
            Some(ProtocolError::Endpoint(e)) => e,
            _ => EpError::Again,
        };
        let _ = c.close(ep);
        Err(SetupError::Endpoint(error))
    }

    /// Reads the endpoint's room for a message in one packet to the peer
    /// again, and the longest message sent whole with it.
    fn read_eager_room<D: Device>(&mut self, ep: &Endpoint<D>) {
        self.eager_room = ep.max_eager_size(self.peer, false);
        self.whole_max = if self.cfg.fast_path {
            let one = (self.params.max_send_size - self.cfg.data_offset) as u64;
            let packet = self.eager_room.saturating_sub(self.cfg.data_offset as u64);
            one.min(self.params.max_fragmented_send_size as u64)
                .min(packet)
                .min(self.cfg.inject_max)
        } else {
            0
        };
    }

    /// Sets up the endpoint's receive ring over the slots, for a
    /// connection whose receives are never placed: each slot armed again
    /// as it is free, with no receive posted per segment.
    fn set_up_slots<D: Device>(&mut self, ep: &mut Endpoint<D>) -> Result<(), EpError> {
        let first = Span { mr: self.rx.id, offset: 0, len: self.params.max_receive_size as u64 };
        let slots = self.arrivals.len() as u16;
        self.rx_ring = Some(ep.recv_ring(first, slots, self.peer, self.ctx(KIND_RECV, 0))?);
        Ok(())
    }

    /// The peer.
    pub fn peer(&self) -> PeerId {
        self.peer
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The local settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The credits now.
    pub fn credits(&self) -> Credits {
        self.credits
    }

    /// What the connection counted.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Why the connection was terminated, once it was.
    pub fn error(&self) -> Option<ProtocolError> {
        self.error
    }

    /// The region of its header slots, which the peer may read (to keep
    /// its key out of tokens and the like).
    pub fn header_region(&self) -> &Mr {
        &self.hdr
    }

    /// The region of its receive slots.
    pub fn receive_region(&self) -> &Mr {
        &self.rx
    }

    /// Whether `c` is one of this connection's endpoint completions.
    #[inline]
    pub fn owns(&self, c: &Completion) -> bool {
        c.ctx & !0xffff_ffff == self.tag
            && matches!((c.ctx >> KIND_SHIFT) & 0xff, KIND_SEND | KIND_RECV | KIND_WHOLE)
    }

    #[inline(always)]
    fn ctx(&self, kind: u64, slot: u16) -> u64 {
        self.tag | kind << KIND_SHIFT | slot as u64
    }

    #[inline(always)]
    fn rx_slot_offset(&self, slot: u16) -> u64 {
        slot as u64 * self.params.max_receive_size as u64
    }

    /// Queues `src` for sending, with `token` for the peer to invalidate;
    /// [`Event::Sent`] with `ctx` says when its memory is the
    /// application's again. Segments go at once as far as credits allow,
    /// the rest from [`Connection::progress`]. A message of one segment
    /// on the fast path is copied into its packet: its `Sent` is queued
    /// as it goes (see the module's documentation).
    pub fn send<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        token: Option<u64>,
        ctx: u64,
    ) -> Result<(), SendError> {
        match self.send_at_once(ep, src, token, ctx) {
            Some(done) => done,
            None => self.send_queued(ep, src, token, ctx),
        }
    }

    /// [`Connection::send`] of a message that starts now or not at all:
    /// [`SendError::Again`], with nothing queued, when it would wait for
    /// a credit or behind messages queued before it. For a poll loop that
    /// holds a message back rather than have the connection queue it. A
    /// message with a credit that does not go by inject (more than one
    /// segment, longer than [`Config::inject_max`], a token, or no free
    /// packet buffer in the endpoint) is taken as `send` takes it: posted
    /// through a header slot, where the endpoint may queue it, or left in
    /// the connection's queue when the endpoint or the header slots push
    /// back; a `try_send` behind it then answers `Again`.
    #[inline(always)]
    pub fn try_send<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        token: Option<u64>,
        ctx: u64,
    ) -> Result<(), SendError> {
        if let Some(done) = self.send_at_once(ep, src, token, ctx) {
            return done;
        }
        let waits =
            self.next_post < self.tx.len() || !self.credits.may_send(self.credits.to_grant());
        // A message too long, or a connection ended, is told as `send`
        // tells it, whatever the credits.
        let sendable = src.len <= self.params.max_fragmented_send_size as u64;
        if waits && sendable && self.error.is_none() {
            return Err(SendError::Again);
        }
        self.send_queued(ep, src, token, ctx)
    }

    /// Sends `src` whole at once, copied into its packet, and reports
    /// nothing: no [`Event::Sent`] follows, as an endpoint inject (or
    /// `fi_inject`) makes no completion. True: the message is on its way
    /// and `src` is the caller's again. False, with nothing sent, when it
    /// does not go so now (longer than one packet or
    /// [`Config::inject_max`], messages queued or in flight before it, no
    /// credit for it, the last one being kept for a message that grants,
    /// or the endpoint not taking it at once): [`Connection::send`] or
    /// [`Connection::try_send`] takes it then, and tells any error. For a
    /// sender of short messages that needs no word that each went, a
    /// stream's: a report a message saved. A failure of its send, which
    /// the endpoint reports later, terminates the connection as any failed
    /// send does.
    #[inline(always)]
    pub fn inject<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
    ) -> Result<bool, SendError> {
        if self.goes_whole(src.len, None) && self.tx.is_empty() && self.error.is_none() {
            match self.send_whole_now(ep, src, Report::Nothing) {
                Some(Ok(())) => return Ok(true),
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        self.not_injected()
    }

    /// [`Connection::inject`]'s message that did not go.
    #[cold]
    fn not_injected(&self) -> Result<bool, SendError> {
        self.error.map_or(Ok(false), |e| Err(SendError::Terminated(e)))
    }

    /// A stream's usual message, short, with nothing queued or in flight
    /// before it and a credit for it: sent whole at once and reported
    /// sent. None, with nothing done, for any other.
    #[inline(always)]
    fn send_at_once<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        token: Option<u64>,
        ctx: u64,
    ) -> Option<Result<(), SendError>> {
        if !(self.goes_whole(src.len, token) && self.tx.is_empty() && self.error.is_none()) {
            return None;
        }
        self.send_whole_now(ep, src, Report::Now(ctx))
    }

    /// Whether a message of `len` bytes with `token` goes whole by inject
    /// ([`TxMsg::whole`]).
    #[inline(always)]
    fn goes_whole(&self, len: u64, token: Option<u64>) -> bool {
        // 1..=whole_max in one compare.
        len.wrapping_sub(1) < self.whole_max && token.is_none()
    }

    /// Sends `src`, a message of one segment with no token
    /// ([`TxMsg::whole`]) and nothing waiting to be posted before it, at
    /// once if a credit allows, as `post_segment` would, without queueing
    /// it first, reported as `report` says. None, with nothing done, when
    /// it does not go so.
    #[inline(always)]
    fn send_whole_now<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        report: Report,
    ) -> Option<Result<(), SendError>> {
        // A stream's usual message, told in one test: nothing to grant,
        // no response to ask for; the header's constants fold into a copy
        // of the send of its own.
        if self.credits.may_send_quiet() {
            let r = self.whole_repr_with(src.len, 0, Flags::empty());
            return self.send_whole_with(ep, src, report, &r);
        }
        let grants = self.credits.to_grant();
        if !self.credits.may_send(grants) {
            return None;
        }
        let r = self.whole_repr(src.len, grants);
        self.send_whole_with(ep, src, report, &r)
    }

    /// [`Self::send_whole_now`] with header `r`, which a credit allows.
    #[inline(always)]
    fn send_whole_with<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        report: Report,
        r: &Repr,
    ) -> Option<Result<(), SendError>> {
        let i = if let Report::Behind(_) = report { self.tx.len() } else { 0 };
        match self.send_whole(ep, i, src, r) {
            // Copied into its packet: sent, as far as the application is
            // concerned.
            Ok(true) => {
                match report {
                    Report::Now(ctx) => self.sent_now(ctx),
                    Report::Behind(ctx) => self.queue_sent(src, ctx),
                    Report::Nothing => self.sent_unreported(),
                }
                Some(Ok(()))
            }
            Err(EpError::BadSpan) => Some(Err(SendError::BadSpan)),
            // Not now, or told as the general path tells it.
            Ok(false) | Err(_) => None,
        }
    }

    /// A whole message sent at once behind messages in flight: queued,
    /// to be reported sent after them.
    #[inline(never)]
    fn queue_sent(&mut self, src: Span, ctx: u64) {
        let mut seg = Segmenter::new(src.len, self.cfg.data_offset, self.params.max_send_size);
        seg.advance();
        let (token, status, whole) = (None, SendStatus::Ok, true);
        self.tx.push_back(TxMsg { src, token, ctx, seg, in_flight: 0, status, whole });
        self.next_post = self.tx.len();
    }

    /// [`Connection::send`] of a message [`Self::send_at_once`] did not
    /// send.
    #[inline(never)]
    fn send_queued<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        token: Option<u64>,
        ctx: u64,
    ) -> Result<(), SendError> {
        if let Some(e) = self.error {
            return Err(SendError::Terminated(e));
        }
        // Spec 3.1.5.4: longer than MaxFragmentedSendSize is a local error,
        // and nothing is sent.
        let max = self.params.max_fragmented_send_size;
        if src.len > max as u64 {
            return Err(SendError::TooLong { len: src.len, max });
        }
        if self.tx.len() >= self.cfg.send_queue as usize {
            return Err(SendError::Again);
        }
        // The room grows once the peer's HANDSHAKE is in: a message too
        // long for the packet at first may go whole by now.
        self.read_eager_room(ep);
        let seg = Segmenter::new(src.len, self.cfg.data_offset, self.params.max_send_size);
        let whole = self.goes_whole(src.len, token);
        let status = SendStatus::Ok;
        // Nothing waiting to be posted before it, but messages in flight
        // (with none, `send_at_once` tried).
        if whole
            && self.next_post == self.tx.len()
            && !self.tx.is_empty()
            && let Some(done) = self.send_whole_now(ep, src, Report::Behind(ctx))
        {
            return done;
        }
        if self.cfg.fast_path
            && !whole
            && self.next_post == self.tx.len()
            && let Some(done) = self.send_one_now(ep, src, token, ctx, seg)
        {
            return done;
        }
        if !registered(ep, &src) {
            return Err(SendError::BadSpan);
        }
        self.tx.push_back(TxMsg { src, token, ctx, seg, in_flight: 0, status, whole });
        // A sender streaming faster than it is granted usually waits here:
        // told as `post_segments` would, without the call.
        if !self.credits.may_send(self.credits.to_grant()) {
            self.stats.credit_stalls += 1;
            return Ok(());
        }
        self.post_segments(ep);
        Ok(())
    }

    /// Sends `src`, a message of one segment (`seg` its segmenter, none
    /// taken yet) with nothing waiting to be posted before it, at once
    /// through a header slot if a credit and a slot allow, as
    /// `post_segment` would, without the queue's walk: the message that
    /// does not go whole by inject (longer than [`Config::inject_max`] or
    /// than one packet, or with a token). Reported sent when its send
    /// completes. None, with nothing done, when it does not go so now (the
    /// queue takes it and decides it as ever).
    #[inline(always)]
    fn send_one_now<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        src: Span,
        token: Option<u64>,
        ctx: u64,
        mut seg: Segmenter,
    ) -> Option<Result<(), SendError>> {
        // An empty message is the queue's.
        let one = seg.is_one_with_data();
        let grants = self.credits.to_grant();
        if !one || !self.credits.may_send(grants) {
            return None;
        }
        let &slot = self.hdr_free.last()?;
        let r = self.whole_repr(src.len, grants);
        match self.post_message(ep, slot, &r, Some(src), token) {
            Ok(()) => {}
            Err(EpError::BadSpan) => return Some(Err(SendError::BadSpan)),
            // Not now, or told as the general path tells it.
            Err(_) => return None,
        }
        self.occupy_slot(slot, self.tx_front_seq + self.tx.len() as u64);
        seg.advance();
        let status = SendStatus::Ok;
        self.tx.push_back(TxMsg { src, token, ctx, seg, in_flight: 1, status, whole: false });
        self.next_post = self.tx.len();
        self.count_segment(&r);
        Some(Ok(()))
    }

    /// Posts `dst` for the next message; [`Event::Received`] with `ctx`
    /// reports it. A message waiting for a buffer holds its receives, and
    /// so the peer's credits: the flow control of SMB Direct.
    pub fn recv<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        dst: Span,
        ctx: u64,
    ) -> Result<(), RecvError> {
        if let Some(e) = self.error {
            return Err(RecvError::Terminated(e));
        }
        if !registered(ep, &dst) {
            return Err(RecvError::BadSpan);
        }
        if self.apps.len() >= self.cfg.recv_queue as usize {
            return Err(RecvError::Again);
        }
        self.apps.push_back(AppBuf { dst, ctx, placed: false, released: false });
        self.deliver(ep);
        if self.places {
            self.place_posted(ep);
        }
        Ok(())
    }

    /// Gives back a message lent by [`Event::Lent`]: its receive is posted
    /// again by the next [`Connection::progress`] (on a connection still
    /// up), and its bytes are no longer the application's to read.
    /// [`RecvError::NotLent`] for a loan given back already.
    pub fn give_back(&mut self, loan: Loan) -> Result<(), RecvError> {
        if !self.end_loan(loan)? {
            return Ok(());
        }
        // Posted by the next `progress`, with the others freed by then.
        self.rx_free.push(loan.0);
        Ok(())
    }

    /// Takes `loan` back; whether its receive is to be posted again (the
    /// connection is up).
    #[inline(always)]
    fn end_loan(&mut self, loan: Loan) -> Result<bool, RecvError> {
        match self.lent.get_mut(loan.0 as usize) {
            Some(lent) if *lent => *lent = false,
            _ => return Err(RecvError::NotLent),
        }
        self.lent_out -= 1;
        Ok(self.error.is_none())
    }

    /// Takes an endpoint completion; returns false if it is not this
    /// connection's (it is left to its owner).
    #[inline]
    pub fn handle_completion<D: Device>(&mut self, ep: &mut Endpoint<D>, c: &Completion) -> bool {
        self.handle(ep, c)
    }

    /// [`Connection::handle_completion`], inlined into `drain`'s loop.
    #[inline(always)]
    fn handle<D: Device>(&mut self, ep: &mut Endpoint<D>, c: &Completion) -> bool {
        // Zero above the kind when the tag is this connection's.
        let k = c.ctx ^ self.tag;
        let slot = (k & SLOT_MASK) as usize;
        match k >> KIND_SHIFT {
            KIND_SEND => {
                if slot < self.hdr_owner.len() {
                    self.on_send_done(slot as u16, c.status);
                }
            }
            KIND_RECV => {
                if slot < self.arrivals.len() {
                    self.on_recv_done(ep, slot as u16, c);
                }
            }
            KIND_WHOLE => self.on_whole_failed(slot as u64, c.status),
            _ => return false,
        }
        true
    }

    /// A receive slot's completion.
    #[inline]
    fn on_recv_done<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16, c: &Completion) {
        let a = Arrival { status: c.status, len: c.len, token: c.cq_data };
        if self.turn() == Some(slot) {
            // Its turn, as a receive usually completes: handled at once
            // rather than stored and taken back.
            self.next_turn();
            self.on_turn(ep, slot, a);
        } else {
            self.arrivals[slot as usize] = Some(a);
            self.arrivals_held += 1;
            self.settle();
        }
        let next = self.arrivals_held > 0
            && self.turn().is_some_and(|s| self.arrivals[s as usize].is_some());
        if next || self.error.is_some() {
            self.on_arrivals(ep);
        }
    }

    /// Takes the segments landed in the receive ring in their turn (which
    /// [`Connection::drain`] would have lent), reposts free receives,
    /// posts the segments credits allow, and an empty message when the
    /// peer asked for credits and nothing else carries them; returns
    /// whether it did anything.
    #[inline]
    pub fn progress<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        // Nothing to post, as most polls find: told in line, in a few
        // loads, rather than by a call through every queue.
        let idle = self.rx_free.is_empty()
            && self.next_post >= self.tx.len()
            && !self.credits.response_due()
            && !self.landed_in_turn(ep);
        if idle {
            return false;
        }
        self.post_due(ep)
    }

    /// [`Connection::progress`] with something to do.
    #[inline(never)]
    fn post_due<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        let took = self.landed_in_turn(ep);
        if took {
            self.on_arrivals(ep);
        }
        if self.error.is_some() {
            return took;
        }
        // Receives first, so that the segments below grant them.
        let mut did = took | self.repost(ep);
        did |= self.post_segments(ep);
        if self.credits.response_due() {
            did |= self.post_empty(ep);
        }
        did
    }

    /// The next event.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        match self.events.pop_front() {
            Some(e) => Some(e),
            None => self.sent.pop_front().map(sent_ok),
        }
    }

    /// Whether an event waits ([`Connection::poll_event`]).
    #[inline]
    pub fn has_event(&self) -> bool {
        !(self.events.is_empty() && self.sent.is_empty())
    }

    /// Whether an event waits or a segment landed in the receive ring in
    /// its turn: with no completion in the endpoint's queue either, a
    /// drain (or a poll after progress) would find nothing.
    #[inline]
    pub fn has_work<D: Device>(&self, ep: &Endpoint<D>) -> bool {
        self.has_event() || self.landed_in_turn(ep)
    }

    /// Whether the segment in turn landed in the receive ring, marked
    /// there rather than reported in the endpoint's queue.
    #[inline(always)]
    fn landed_in_turn<D: Device>(&self, ep: &Endpoint<D>) -> bool {
        self.rx_armed > 0 && self.rx_ring.is_some_and(|r| ep.recv_ring_has_landed(r, self.rx_next))
    }

    /// The receive slot whose segment is next, if one is posted.
    #[inline(always)]
    fn turn(&self) -> Option<u16> {
        if self.rx_armed > 0 { Some(self.rx_next) } else { self.rx_order.front().copied() }
    }

    /// The segment in turn was taken: the next slot's turn.
    #[inline(always)]
    fn next_turn(&mut self) {
        if self.rx_armed > 0 {
            self.next_ring_turn();
        } else {
            self.rx_order.skip_front();
        }
    }

    /// [`Self::next_turn`] in the receive ring.
    #[inline(always)]
    fn next_ring_turn(&mut self) {
        self.rx_armed -= 1;
        let next = self.rx_next + 1;
        self.rx_next = if next as usize == self.arrivals.len() { 0 } else { next };
    }

    /// Slot `slot`'s segment, marked in the receive ring in its turn (now
    /// passed), that is not a message to lend: taken as a completion in
    /// its turn is.
    #[inline(never)]
    fn on_landed<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16, a: Arrival) {
        self.on_turn(ep, slot, a);
        if self.arrivals_held > 0 || self.error.is_some() {
            self.on_arrivals(ep);
        }
    }

    /// Takes the endpoint's completions and hands `f` what they make, in
    /// order, as it comes: the connection's events, and the completions
    /// that are not the connection's ([`Drained::Other`]); what `f`
    /// returns says whether to go on, and whether a lent message was read
    /// ([`Flow`]). A message lent so is read where it landed, inside `f`,
    /// and given back as `f` returns, its receive posted again before
    /// `drain` returns (those of all it gave back in one call into the
    /// endpoint): no [`Connection::give_back`], no wait for
    /// [`Connection::progress`].
    /// Returns how many things `f` was handed.
    ///
    /// What a loop of [`Endpoint::poll_cq`],
    /// [`Connection::handle_completion`] and [`Connection::poll_event`]
    /// does, for an application that hands the connection every
    /// completion of its endpoint.
    pub fn drain<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        mut f: impl FnMut(&mut Endpoint<D>, Drained<'_>) -> Flow,
    ) -> usize {
        let mut n = 0;
        let mut run = self.run_from_turn();
        let mut tally = LentTally::default();
        'next: loop {
            // One call of `f` in the loop, which it can then take inline.
            let c;
            // A loan `lend_now` made is marked lent only if `f` keeps it.
            let mut fresh = false;
            let d = match self.events.pop_front() {
                Some(e) => Drained::Event(e),
                None => 'taken: {
                    if let Some(ctx) = self.sent.pop_front() {
                        break 'taken Drained::Event(sent_ok(ctx));
                    }
                    // A segment landed in the ring in its turn, as a stream
                    // of short messages has them: lent as it is taken, read
                    // with no completion, its header read as the mark is.
                    if self.rx_armed > 0
                        && let Some(ring) = self.rx_ring
                        && let Some(len) =
                            ep.recv_ring_landed(ring, self.rx_next, &mut self.scratch[..HEADER_LEN])
                    {
                        let slot = self.rx_next;
                        self.next_ring_turn();
                        let a = Arrival { status: Status::Ok, len, token: None };
                        if let Some(e) = self.lend_read(slot, &a, &mut tally) {
                            fresh = true;
                            break 'taken Drained::Event(e);
                        }
                        self.end_run(ep, run, 1);
                        self.on_landed(ep, slot, a);
                        run = self.run_from_turn();
                        continue 'next;
                    }
                    let Some(next) = ep.peek_cq() else {
                        self.arm_given_back(ep, run);
                        self.stats.add_lent(tally);
                        return n;
                    };
                    // A short message lent in its turn, as a stream has
                    // them: handed out as it is taken, not queued first,
                    // its completion read where it lies.
                    if let Some(e) = self.lend_now(ep, next, &mut tally) {
                        ep.skip_cq();
                        fresh = true;
                        Drained::Event(e)
                    } else {
                        let got = ep.poll_cq().expect("peeked");
                        // Its handling may take segments in their turns.
                        self.end_run(ep, run, 0);
                        let handled = self.handle(ep, &got);
                        run = self.run_from_turn();
                        if handled {
                            continue 'next;
                        }
                        c = got;
                        Drained::Other(&c)
                    }
                }
            };
            n += 1;
            let flow = f(ep, d);
            if let Drained::Event(Event::Lent { loan, .. }) = d {
                match (flow, fresh) {
                    (Flow::Keep, true) => {
                        self.mark_lent(loan.0);
                        // The run ends before it.
                        run = self.end_run(ep, run, 1);
                    }
                    (Flow::Keep, false) => {}
                    // `f` cannot reach the connection: still up, as
                    // `lend_now` found it.
                    // Given back with more to come: in the run, armed with
                    // it as `drain` returns (a placing connection's, with
                    // the other free slots); the last one now.
                    (Flow::Next, true) => {
                        if self.places {
                            self.rearm(loan.0);
                        }
                    }
                    (_, true) => {
                        self.end_run(ep, run, 1);
                        self.arm_now(ep, loan.0);
                        run = self.run_from_turn();
                    }
                    (_, false) => self.repost_lent(loan),
                }
            }
            if flow == Flow::Stop {
                self.arm_given_back(ep, run);
                self.stats.add_lent(tally);
                return n;
            }
        }
    }

    /// The slots of the messages [`Connection::drain`] was given back,
    /// armed again in the ring together as it returns: `run` as one, and
    /// any others as a list.
    #[inline(always)]
    fn arm_given_back<D: Device>(&mut self, ep: &mut Endpoint<D>, run: GivenRun) {
        self.end_run(ep, run, 0);
        if !self.places && !self.rx_free.is_empty() {
            self.repost_in_slots(ep);
        }
    }

    /// A run of slots given back that begins at the ring's turn: none yet.
    #[inline(always)]
    fn run_from_turn(&self) -> GivenRun {
        GivenRun { first: self.rx_next, armed: self.rx_armed }
    }

    /// Ends `run` here: its slots armed again ([`Self::arm_run`]), those
    /// the ring took in turn since it began but for the last `held` taken
    /// (not given back); returns the run that begins now.
    #[inline(always)]
    fn end_run<D: Device>(&mut self, ep: &mut Endpoint<D>, run: GivenRun, held: u16) -> GivenRun {
        debug_assert!(run.armed >= self.rx_armed, "only turns taken since the run began");
        // A placing connection takes none in the ring.
        let count = run.armed.saturating_sub(self.rx_armed).saturating_sub(held);
        if count > 0 {
            self.arm_run(ep, run.first, count);
        }
        self.run_from_turn()
    }

    /// [`Self::repost_in_slots`] of `count` slots from `first`, in the
    /// ring. Refused, they are free to post again later, as a refused
    /// repost leaves its slots.
    #[inline(never)]
    fn arm_run<D: Device>(&mut self, ep: &mut Endpoint<D>, first: u16, count: u16) {
        let ring = self.rx_ring.expect("a ring when never placing");
        if let Err(e) = ep.recv_ring_arm_run(ring, first, count) {
            let n = self.arrivals.len();
            for i in 0..count as usize {
                let slot = first as usize + i;
                self.rearm(if slot >= n { slot - n } else { slot } as u16);
            }
            self.refused(e);
            return;
        }
        // At most a slot each.
        self.rx_armed += count;
        // Only a placing connection withdraws receives.
        debug_assert_eq!(self.withdrawn, 0);
        self.credits.on_posts(count as u32);
    }

    /// A lent message was read ([`Connection::drain`]): given back, and
    /// its receive posted again as `drain` returns when it goes into its
    /// slot alone (else by the next [`Connection::progress`], as any given
    /// back).
    #[inline(always)]
    fn repost_lent(&mut self, loan: Loan) {
        let up = self.end_loan(loan);
        debug_assert!(up.is_ok(), "drain hands each loan out once");
        if up == Ok(true) {
            self.rearm(loan.0);
        }
    }

    /// Receive slot `slot`, read and not lent, free to post again: as
    /// `drain` returns when it goes into its slot alone
    /// ([`Self::arm_given_back`]), else by the next `progress`.
    #[inline(always)]
    fn rearm(&mut self, slot: u16) {
        self.rx_free.push(slot);
    }

    /// [`Self::rearm`], armed now when it goes into its slot alone: the
    /// message a drain stops at, as a ping-pong's each is.
    #[inline(always)]
    fn arm_now<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16) {
        if self.places {
            self.rx_free.push(slot);
        } else if let Err(e) = self.arm_one(ep, slot) {
            self.rx_free.push(slot);
            self.refused(e);
        }
    }

    /// Ends the connection (with [`ProtocolError::Closed`] if it was still
    /// up), withdraws its receives and deregisters its regions;
    /// [`EpError::Busy`] while segments are in flight or arriving, or
    /// messages are lent: progress the endpoint, hand the connection its
    /// completions, give the loans back, and call again.
    pub fn close<D: Device>(&mut self, ep: &mut Endpoint<D>) -> Result<(), EpError> {
        self.terminate(ProtocolError::Closed);
        if self.closed {
            return Ok(());
        }
        if let Some(ring) = self.rx_ring {
            // Segments marked in the ring go with it: taken first (and
            // dropped, the connection being terminated).
            self.on_arrivals(ep);
            // The armed slots take nothing now; those that took a segment
            // before, in turn from `rx_next`, complete in the queue.
            self.rx_armed -= ep.recv_ring_free(ring)?;
            self.rx_ring = None;
        }
        let tag = self.tag;
        self.rx_order.retain(|&slot| {
            let withdrawn = ep.cancel_recv(tag | KIND_RECV << KIND_SHIFT | slot as u64);
            !withdrawn
        });
        // Buffers that withdrawn receives were posted into are free now.
        self.release_buffers();
        if !self.rx_order.is_empty()
            || self.rx_armed > 0
            || self.lent_out > 0
            || self.hdr_free.len() < self.hdr_owner.len()
            || self.tx.iter().any(|m| m.in_flight > 0)
        {
            return Err(EpError::Busy);
        }
        ep.deregister(self.hdr.id)?;
        ep.deregister(self.rx.id)?;
        self.closed = true;
        Ok(())
    }

    // ---- sending ----

    /// Posts segments while credits, slots and the endpoint allow.
    fn post_segments<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        let mut did = false;
        while self.next_post < self.tx.len() {
            // A sender waiting for credits is the usual stall: told here,
            // before the segment is looked at.
            let grants = self.credits.to_grant();
            if !self.credits.may_send(grants) {
                self.stats.credit_stalls += 1;
                break;
            }
            if !self.post_segment(ep, grants) {
                break;
            }
            did = true;
        }
        did
    }

    /// Posts the next segment of the first message with some to go,
    /// granting `grants`, which a credit allows. A whole message without
    /// a token ([`TxMsg::whole`]) goes as one endpoint send with its
    /// header emitted into the packet and its sequence number in the
    /// send's context, holding no header slot; when it does not go so now,
    /// and for every other segment, a header slot carries it.
    #[inline]
    fn post_segment<D: Device>(&mut self, ep: &mut Endpoint<D>, grants: u16) -> bool {
        if self.error.is_some() {
            return false;
        }
        let i = self.next_post;
        let Some(m) = self.tx.get(i) else { return false };
        let (src, token, whole) = (m.src, m.token, m.whole);
        if whole {
            match self.send_whole(ep, i, src, &self.whole_repr(src.len, grants)) {
                // Copied into its packet: sent. The front, as a sender
                // waiting for credits has it, is reported now; any other
                // in its turn (`finish_sent`).
                Ok(true) if i == 0 => {
                    let ctx = self.tx[0].ctx;
                    self.tx.skip_front();
                    self.sent_now(ctx);
                    return true;
                }
                Ok(true) => {
                    self.tx[i].seg.advance();
                    self.next_post = i + 1;
                    return true;
                }
                // From a header slot, as any other segment.
                Ok(false) => {}
                Err(e) => return self.refused(e),
            }
        }
        let Some(seg) = self.tx[i].seg.peek() else {
            self.next_post += 1;
            return true;
        };
        let mut r = seg.repr;
        r.credits_requested = self.params.send_credit_target;
        r.credits_granted = grants;
        // The application's empty message too: it uses a credit as a
        // segment does, and the peer, owing nothing, would grant none.
        if self.credits.asks_response() {
            r.flags |= Flags::RESPONSE_REQUESTED;
        }
        let seq = self.tx_front_seq + i as u64;
        let body = Span { mr: src.mr, offset: src.offset + seg.offset, len: r.data_length as u64 };
        let Some(&slot) = self.hdr_free.last() else {
            self.stats.slot_stalls += 1;
            return false;
        };
        let data = !r.is_empty();
        // The token rides with exactly one segment, the first (see the
        // module's documentation).
        let token = if seg.is_first() { token } else { None };
        if !self.posted(ep, slot, &r, data.then_some(body), token) {
            return false;
        }
        self.occupy_slot(slot, seq);
        let m = &mut self.tx[i];
        m.seg.advance();
        m.in_flight += 1;
        self.next_post = i + m.seg.is_done() as usize;
        self.count_segment(&r);
        true
    }

    /// Sends message `i` of the queue, `src` in one segment with no token
    /// ([`TxMsg::whole`]), as one endpoint inject with its header emitted
    /// into the packet and its sequence number in the send's context,
    /// holding no header slot; with header `r`, whose grants a credit
    /// allows. `src` is copied, so the message is sent once this returns
    /// true (its send completes with a completion only if it fails).
    /// False, with nothing sent, when it does not go so now.
    #[inline(always)]
    fn send_whole<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        i: usize,
        src: Span,
        r: &Repr,
    ) -> Result<bool, EpError> {
        let seq = self.tx_front_seq + i as u64;
        let ctx = self.tag | KIND_WHOLE << KIND_SHIFT | (seq & SLOT_MASK);
        if !ep.inject_head_with(self.peer, r.buffer_len(), r, src, ctx)? {
            return Ok(false);
        }
        self.count_segment(r);
        Ok(true)
    }

    /// The header of a message of `len` bytes in one segment, granting
    /// `grants`.
    #[inline(always)]
    fn whole_repr(&self, len: u64, grants: u16) -> Repr {
        let asks = self.credits.asks_response();
        let flags = if asks { Flags::RESPONSE_REQUESTED } else { Flags::empty() };
        self.whole_repr_with(len, grants, flags)
    }

    /// [`Self::whole_repr`] with `flags`.
    #[inline(always)]
    fn whole_repr_with(&self, len: u64, grants: u16, flags: Flags) -> Repr {
        Repr {
            credits_requested: self.params.send_credit_target,
            credits_granted: grants,
            flags,
            data_offset: self.cfg.data_offset,
            data_length: len as u32,
            ..Repr::default()
        }
    }

    /// The message at the front of the queue (or, the queue empty, the
    /// one that would have been) went whole by inject: reported sent, its
    /// sequence number not to be taken again.
    #[inline(always)]
    fn sent_now(&mut self, ctx: u64) {
        self.stats.messages_sent += 1;
        self.sent.push_back(ctx);
        self.tx_front_seq += 1;
    }

    /// [`Self::sent_now`] of a message [`Connection::inject`] sent, which
    /// reports nothing.
    #[inline(always)]
    fn sent_unreported(&mut self) {
        self.stats.messages_sent += 1;
        self.stats.injected += 1;
        self.tx_front_seq += 1;
    }

    /// Queues event `e` behind those before it, the messages sent at
    /// once among them.
    #[inline(always)]
    fn push_event(&mut self, e: Event) {
        if !self.sent.is_empty() {
            self.flush_sent();
        }
        self.events.push_back(e);
    }

    /// The messages sent at once so far, queued as the events they are,
    /// ahead of an event that comes after them.
    #[cold]
    fn flush_sent(&mut self) {
        while let Some(ctx) = self.sent.pop_front() {
            self.events.push_back(sent_ok(ctx));
        }
    }

    /// Header slot `slot`, the last free one, carries a send now: in flight
    /// for message `owner` (its sequence number, or [`NO_OWNER`]).
    #[inline(always)]
    fn occupy_slot(&mut self, slot: u16, owner: u64) {
        debug_assert_eq!(self.hdr_free.last(), Some(&slot));
        self.hdr_free.pop();
        self.hdr_owner[slot as usize] = owner;
    }

    /// A segment with header `r` went, granting what it grants.
    #[inline(always)]
    fn count_segment(&mut self, r: &Repr) {
        self.credits.on_send(r.credits_granted);
        self.stats.segments_sent += 1;
        self.stats.bytes_sent += r.data_length as u64;
        self.stats.responses_requested += r.flags.contains(Flags::RESPONSE_REQUESTED) as u64;
    }

    /// An endpoint error on a post: back-pressure leaves it for later,
    /// any other terminates the connection; false either way.
    #[cold]
    fn refused(&mut self, e: EpError) -> bool {
        if e != EpError::Again {
            self.terminate(ProtocolError::Endpoint(e));
        }
        false
    }

    /// An empty message that grants the receives posted since the last
    /// message: the answer to a peer that asked for credits.
    fn post_empty<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        let Some(&slot) = self.hdr_free.last() else { return false };
        let grants = self.credits.to_grant();
        if grants == 0 || !self.credits.may_send(grants) {
            return false;
        }
        let r = Repr {
            credits_requested: self.params.send_credit_target,
            credits_granted: grants,
            ..Repr::default()
        };
        if !self.posted(ep, slot, &r, None, None) {
            return false;
        }
        self.occupy_slot(slot, NO_OWNER);
        self.credits.on_send(grants);
        self.stats.segments_sent += 1;
        self.stats.empty_sent += 1;
        true
    }

    /// [`Self::post_message`]: whether it went; back-pressure leaves it
    /// for later, any other endpoint error terminates the connection.
    fn posted<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        slot: u16,
        r: &Repr,
        body: Option<Span>,
        token: Option<u64>,
    ) -> bool {
        match self.post_message(ep, slot, r, body, token) {
            Ok(()) => true,
            Err(e) => self.refused(e),
        }
    }

    /// Sends header `r` followed by `body` when given, the token as the
    /// send's CQ data: in one packet with the header emitted into it when
    /// it fits now, else as one endpoint send gathered from header slot
    /// `slot` (written first) and the body.
    #[inline]
    fn post_message<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        slot: u16,
        r: &Repr,
        body: Option<Span>,
        token: Option<u64>,
    ) -> Result<(), EpError> {
        let at = slot as u64 * self.cfg.data_offset as u64;
        let ctx = self.ctx(KIND_SEND, slot);
        let n = r.buffer_len();
        let none = Span { mr: self.hdr.id, offset: at, len: 0 };
        let body_len = body.map_or(0, |b| b.len);
        if n as u64 + body_len <= self.eager_room
            && ep.send_inline_head_with(self.peer, n, r, body.unwrap_or(none), token, ctx)?
        {
            return Ok(());
        }
        self.send_gathered(ep, r, at, body, token, ctx)
    }

    /// [`Self::post_message`]'s send from the header slot at `at`.
    #[inline(never)]
    fn send_gathered<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        r: &Repr,
        at: u64,
        body: Option<Span>,
        token: Option<u64>,
        ctx: u64,
    ) -> Result<(), EpError> {
        let mut b = [0u8; MAX_DATA_OFFSET as usize];
        let n = r.emit(&mut b);
        let head = &b[..n];
        ep.write_mem(self.hdr.id, at, head)?;
        let h = Span { mr: self.hdr.id, offset: at, len: head.len() as u64 };
        match (body, token) {
            // A segment the peer reads carries its header in the REQ: the
            // peer reads the data alone, into the buffer it placed the
            // receive in.
            (Some(d), t) => ep.sendv_head(self.peer, h, d, t, ctx),
            (None, None) => ep.send(self.peer, h, ctx),
            (None, Some(t)) => ep.senddata(self.peer, h, t, ctx),
        }
    }

    /// A segment's send completed.
    fn on_send_done(&mut self, slot: u16, status: Status) {
        let seq = std::mem::replace(&mut self.hdr_owner[slot as usize], FREE);
        if seq == FREE {
            return; // not in flight: not a completion of ours to count
        }
        self.hdr_free.push(slot);
        let msg = if seq == NO_OWNER { None } else { seq.checked_sub(self.tx_front_seq) };
        if let Some(m) = msg.and_then(|i| self.tx.get_mut(i as usize)) {
            m.in_flight = m.in_flight.saturating_sub(1);
            if !status.is_ok() {
                m.status = SendStatus::Failed(status);
            }
        }
        if !status.is_ok() {
            // Spec 3.1.5.4: a failed send means the RDMA layer initiated
            // the connection's termination.
            self.terminate(ProtocolError::SendFailed(status));
        }
        self.finish_sent();
    }

    /// A whole message's send failed ([`TxMsg::whole`]: sent by inject,
    /// whose success is not reported); `low_seq` is the low bits of its
    /// sequence number.
    #[cold]
    fn on_whole_failed(&mut self, low_seq: u64, status: Status) {
        if status.is_ok() {
            return;
        }
        // Fewer messages are queued than the low bits count: one reported
        // already is not found.
        let i = low_seq.wrapping_sub(self.tx_front_seq) & SLOT_MASK;
        if let Some(m) = self.tx.get_mut(i as usize) {
            m.status = SendStatus::Failed(status);
        }
        // Spec 3.1.5.4: a failed send means the RDMA layer initiated the
        // connection's termination.
        self.terminate(ProtocolError::SendFailed(status));
        self.finish_sent();
    }

    /// Reports the messages at the front that are done, in order.
    fn finish_sent(&mut self) {
        let stopped = self.error.is_some();
        while let Some(m) = self.tx.front() {
            let done = m.seg.is_done();
            if !(done || stopped) || m.in_flight > 0 {
                return;
            }
            let status = match m.status {
                SendStatus::Ok if !done => SendStatus::Terminated,
                s => s,
            };
            self.stats.messages_sent += (status == SendStatus::Ok) as u64;
            self.push_event(Event::Sent { ctx: m.ctx, status });
            self.tx.skip_front();
            self.tx_front_seq += 1;
            self.next_post = self.next_post.saturating_sub(1);
        }
    }

    // ---- receiving ----

    /// Posts the free receive slots: into the application buffer of the
    /// message each can carry at the latest when that one is posted (see
    /// [`Landing`]), else into the slot alone.
    fn repost<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        let mut did = false;
        let mrs = self.params.max_receive_size as u64;
        if !self.places {
            return self.repost_in_slots(ep);
        }
        while let Some(&slot) = self.rx_free.last() {
            let at = self.rx_slot_offset(slot);
            let whole = Span { mr: self.rx.id, offset: at, len: mrs };
            let ctx = self.ctx(KIND_RECV, slot);
            let seq = self.msgs_seen + self.rx_order.len() as u64;
            let head = self.peer_data_offset as u64;
            // Buffers are taken only by messages seen: never below the front.
            let i = seq.saturating_sub(self.apps_front_seq) as usize;
            let landing = match self.apps.get(i) {
                Some(b) if self.placeable(b) => {
                    let len = b.dst.len.min(mrs - head);
                    Some(Landing { seq, dst: b.dst, head, len })
                }
                _ => None,
            };
            let posted = match landing {
                Some(l) => {
                    let piece = Span { len: l.len, ..l.dst };
                    let before = Span { len: head, ..whole };
                    let end = head + l.len;
                    let after = Span { mr: self.rx.id, offset: at + end, len: mrs - end };
                    if after.len > 0 {
                        ep.recvv(&[before, piece, after], Some(self.peer), ctx)
                    } else {
                        ep.recvv(&[before, piece], Some(self.peer), ctx)
                    }
                }
                None => ep.recv(whole, Some(self.peer), ctx),
            };
            match posted {
                Ok(()) => {}
                Err(EpError::Again) => break,
                Err(e) => {
                    self.terminate(ProtocolError::Endpoint(e));
                    break;
                }
            }
            // A free slot's landing was taken when it arrived.
            debug_assert!(self.landings[slot as usize].is_none());
            if landing.is_some() {
                self.apps[i].placed = true;
                self.landings[slot as usize] = landing;
                self.unplaced_back = 0;
            } else {
                self.unplaced_back = self.unplaced_back.min(self.rx_order.len()) + 1;
            }
            self.rx_free.pop();
            self.rx_order.push_back(slot);
            self.count_post();
            did = true;
        }
        did
    }

    /// Whether a receive may be posted into `b` (its message's buffer).
    #[inline(always)]
    fn placeable(&self, b: &AppBuf) -> bool {
        let head = self.peer_data_offset as u64;
        !b.placed
            && b.dst.len >= self.cfg.direct_min.max(1)
            && head < self.params.max_receive_size as u64
    }

    /// A receive posted (again) counts a credit to grant, unless it was
    /// withdrawn to be placed ([`Self::place_posted`]).
    #[inline(always)]
    fn count_post(&mut self) {
        if self.withdrawn > 0 {
            self.withdrawn -= 1;
        } else {
            self.credits.on_post();
        }
    }

    /// Posts again into their buffers the receives at the back of the
    /// order that were posted before their messages' buffers were (on a
    /// fresh connection, every receive): withdrawn from the newest and
    /// posted again in the same order, which places each whose buffer is
    /// there now. Else a stream's first ReceiveCreditMax messages would
    /// each be copied out of its slot (at 1 MiB, some 6% of `efapoll
    /// streaming -o smbd`'s first 3,000 messages' time). Only when at
    /// least half of those receives would be placed: an application that
    /// keeps fewer buffers posted than receives would otherwise have the
    /// whole back of the order posted again for every buffer.
    fn place_posted<D: Device>(&mut self, ep: &mut Endpoint<D>) {
        let n = self.rx_order.len();
        let tail = self.unplaced_back.min(n);
        let q = n - tail;
        // The receive at position p carries at the latest message
        // `msgs_seen + p`: those before `have` have their buffers.
        let have = (self.apps_front_seq + self.apps.len() as u64).saturating_sub(self.msgs_seen);
        let placed = (have.min(n as u64) as usize).saturating_sub(q);
        if placed == 0 || 2 * placed < tail || !self.apps.back().is_some_and(|b| self.placeable(b))
        {
            return;
        }
        while self.rx_order.len() > q {
            let Some(&slot) = self.rx_order.back() else { break };
            // A receive a message matched, or that completed, stays.
            if !ep.cancel_last_recv(self.ctx(KIND_RECV, slot)) {
                break;
            }
            self.rx_order.skip_back();
            self.rx_free.push(slot);
            self.withdrawn += 1;
            self.stats.replaced += 1;
        }
        self.unplaced_back = self.rx_order.len() - q;
        self.repost(ep);
    }

    /// Arms slot `slot` in the ring (a connection that never places).
    #[inline(always)]
    fn arm_one<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16) -> Result<(), EpError> {
        ep.recv_ring_arm(self.rx_ring.expect("a ring when never placing"), slot)?;
        self.rx_armed += 1;
        self.count_post();
        Ok(())
    }

    /// [`Self::repost`] when no receive is posted into a buffer: the
    /// free slots armed in the ring, together.
    #[inline(never)]
    fn repost_in_slots<D: Device>(&mut self, ep: &mut Endpoint<D>) -> bool {
        if self.rx_free.is_empty() {
            return false;
        }
        let ring = self.rx_ring.expect("a ring when never placing");
        if let Err(e) = ep.recv_ring_arm_each(ring, &self.rx_free) {
            return self.refused(e);
        }
        let n = self.rx_free.len();
        self.rx_free.clear();
        // At most a slot each.
        self.rx_armed += n as u16;
        // Only a placing connection withdraws receives.
        debug_assert_eq!(self.withdrawn, 0);
        self.credits.on_posts(n as u32);
        true
    }

    /// Handles slot `slot`'s segment in its turn when it is a whole
    /// message, valid, with no token, nothing waiting before it and a
    /// buffer posted for it: checked in one pass, copied into the buffer
    /// and reported, as [`Self::on_arrival`] would. False, with nothing
    /// changed, for any other segment, which `on_arrival` takes.
    #[inline]
    fn on_whole_arrival<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        slot: u16,
        a: &Arrival,
    ) -> bool {
        if let Some(l) = self.landings[slot as usize] {
            return self.on_placed_arrival(ep, slot, a, l);
        }
        if !self.whole_may_arrive(slot, a) {
            return false;
        }
        // A segment this short may be lent, and needs no buffer.
        let lend = self.may_lend(a.len);
        if !lend && self.apps.is_empty() {
            return false;
        }
        let at = self.rx_slot_offset(slot);
        // A short segment is read whole, its data then written into the
        // buffer: one read and one write of plain bytes cost less than a
        // copy between two regions, which checks and looks up both.
        // Into the connection's scratch bytes, which a fresh array would
        // zero for every segment; only the `read` bytes are looked at.
        let small = a.len as usize <= SMALL_SEGMENT && !lend;
        let read = if small { a.len as usize } else { HEADER_LEN };
        if ep.read_mem(self.rx.id, at, &mut self.scratch[..read]).is_err() {
            return false;
        }
        let Some(r) = self.whole_header(a.len, false) else { return false };
        let seg = &self.scratch;
        let len = r.data_length as u64;
        if self.lends(len) {
            self.accept_whole(&r);
            self.lend(slot, at + r.data_offset as u64, len, None);
            return true;
        }
        let Some(&buf) = self.apps.front() else { return false };
        let n = len.min(buf.dst.len);
        let copied = if n == 0 {
            Ok(())
        } else if small {
            // Within the segment: the codec checked DataOffset + DataLength.
            let from = r.data_offset as usize;
            ep.write_mem(buf.dst.mr, buf.dst.offset, &seg[from..from + n as usize])
        } else {
            let src = Span { mr: self.rx.id, offset: at + r.data_offset as u64, len: n };
            ep.copy_mem(src, buf.dst.mr, buf.dst.offset)
        };
        if copied.is_err() {
            return false;
        }
        self.deliver_whole(slot, &r, buf);
        true
    }

    /// [`Self::on_whole_arrival`] of a segment whose receive was posted
    /// into its message's buffer ([`Landing`] `l`): when it is that
    /// message, whole, at the DataOffset the receive was posted for, its
    /// data is where it goes, and it is only checked and reported. False,
    /// with nothing changed, for any other, which `on_arrival` takes (and
    /// copies out of the buffer what is not the buffer's).
    #[inline(always)]
    fn on_placed_arrival<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        slot: u16,
        a: &Arrival,
        l: Landing,
    ) -> bool {
        // Nothing before it: the buffer at the front is the next message's.
        if l.seq != self.apps_front_seq
            || !self.settled(Unsettled::HELD)
            || !self.segment_may_be_whole(a)
        {
            return false;
        }
        debug_assert_eq!(self.msgs_seen, self.apps_front_seq, "every message seen delivered");
        let at = self.rx_slot_offset(slot);
        if ep.read_mem(self.rx.id, at, &mut self.scratch[..HEADER_LEN]).is_err() {
            return false;
        }
        let Some(r) = self.whole_header(a.len, false) else { return false };
        let len = r.data_length as u64;
        // Its data from the buffer's start: where it goes (what a buffer
        // too short for it could not take went on into the slot, and the
        // message is reported truncated). A message to lend goes back to
        // its slot.
        if r.data_offset as u64 != l.head || self.lends(len) {
            return false;
        }
        let Some(&buf) = self.apps.front() else { return false };
        debug_assert_eq!(buf.dst, l.dst);
        self.landings[slot as usize] = None;
        self.stats.in_place += 1;
        self.deliver_whole(slot, &r, buf);
        true
    }

    /// A whole message of one segment (header `r`, in slot `slot`) is in
    /// `buf`, the front buffer: taken, its slot freed, and reported.
    #[inline(always)]
    fn deliver_whole(&mut self, slot: u16, r: &Repr, buf: AppBuf) {
        let len = r.data_length as u64;
        self.accept_whole(r);
        self.msgs_seen += 1;
        self.apps.skip_front();
        self.apps_front_seq += 1;
        self.rx_free.push(slot);
        self.stats.bytes_received += len;
        self.report_received(buf.ctx, len, buf.dst.len, None);
    }

    /// Whether slot `slot`'s segment, in its turn, may be taken whole
    /// ([`Self::on_whole_arrival`]): nothing waits before it or is half
    /// received, it carries no token, a credit was granted for it, and it
    /// holds a header and no more than a receive.
    #[inline(always)]
    fn whole_may_arrive(&self, slot: u16, a: &Arrival) -> bool {
        self.landings[slot as usize].is_none()
            && self.settled(Unsettled::HELD)
            && self.segment_may_be_whole(a)
            && a.len <= self.params.max_receive_size as u64
    }

    /// What a whole segment's completion says of it: received, with no
    /// token, granted a credit, long enough for a header.
    #[inline(always)]
    fn segment_may_be_whole(&self, a: &Arrival) -> bool {
        a.status == Status::Ok
            && a.token.is_none()
            && self.credits.granted() > 0
            && a.len >= HEADER_LEN as u64
    }

    /// Whether a segment of `len` bytes is short enough that its message
    /// may be lent (and so needs no buffer).
    #[inline(always)]
    fn may_lend(&self, len: u64) -> bool {
        len <= self.lend_segment_max
    }

    /// The header read into the scratch bytes, of a segment of `len`
    /// bytes, when it is valid and a whole message in one segment: the
    /// codec's checks and the reassembler's for a first segment that is
    /// also the last. A stream's usual header is recognized by its words
    /// ([`Repr::predict_whole`]), any other checked field by field.
    /// `lendable`: `len` is within `lend_segment_max`, which leaves a
    /// predicted header's DataLength within MaxFragmentedReceiveSize.
    #[inline(always)]
    fn whole_header(&self, len: u64, lendable: bool) -> Option<Repr> {
        let head = self.scratch.first_chunk().expect("a header fits the scratch bytes");
        let max = self.params.max_fragmented_receive_size;
        match Repr::predict_whole(head, len) {
            Some(r) if lendable => {
                debug_assert!(r.data_length <= max);
                Some(r)
            }
            // Predicted whole: the one check left is the message's size.
            Some(r) => (r.data_length <= max).then_some(r),
            None => {
                let r = Repr::parse_header(head, len as usize).ok()?;
                self.is_whole(&r).then_some(r)
            }
        }
    }

    /// Whether header `r`, valid, is a whole message in one segment: the
    /// reassembler's checks for a first segment that is also the last.
    #[inline(always)]
    fn is_whole(&self, r: &Repr) -> bool {
        r.remaining_data_length == 0
            && r.data_length > 0
            && r.data_length <= self.params.max_fragmented_receive_size
    }

    /// [`Self::handle`] of a completion [`Connection::drain`] can hand
    /// out at once: a message it lends, in its turn, with nothing held
    /// behind it; taken as [`Self::on_whole_arrival`] takes it, and its
    /// [`Event::Lent`] returned rather than queued, its slot not yet
    /// marked lent (`drain` marks it if kept). None, with nothing
    /// changed, for any other completion.
    #[inline(always)]
    fn lend_now<D: Device>(
        &mut self,
        ep: &Endpoint<D>,
        c: &Completion,
        tally: &mut LentTally,
    ) -> Option<Event> {
        let k = c.ctx ^ self.tag;
        let slot = (k & SLOT_MASK) as u16;
        if k >> KIND_SHIFT != KIND_RECV || self.turn() != Some(slot) {
            return None;
        }
        let a = Arrival { status: c.status, len: c.len, token: c.cq_data };
        let e = self.lend_whole(ep, slot, &a, tally)?;
        self.next_turn();
        Some(e)
    }

    /// Slot `slot`'s segment, in its turn, taken as [`Self::lend_now`]
    /// takes it when it is a message to lend, with nothing held behind
    /// it: its [`Event::Lent`], the turn left to the caller to pass. None,
    /// with nothing changed, for any other.
    #[inline(always)]
    fn lend_whole<D: Device>(
        &mut self,
        ep: &Endpoint<D>,
        slot: u16,
        a: &Arrival,
        tally: &mut LentTally,
    ) -> Option<Event> {
        if self.landings[slot as usize].is_some() || !self.may_lend_whole(a) {
            return None;
        }
        let at = self.rx_slot_offset(slot);
        ep.read_mem(self.rx.id, at, &mut self.scratch[..HEADER_LEN]).ok()?;
        self.lend_header(slot, a.len, tally)
    }

    /// [`Self::lend_whole`] of a segment marked in the receive ring, whose
    /// header was read into the scratch bytes as the mark was taken.
    #[inline(always)]
    fn lend_read(&mut self, slot: u16, a: &Arrival, tally: &mut LentTally) -> Option<Event> {
        debug_assert!(self.landings[slot as usize].is_none(), "a ring's slots are never placed");
        if !self.may_lend_whole(a) {
            return None;
        }
        self.lend_header(slot, a.len, tally)
    }

    /// [`Self::whole_may_arrive`], less the slot's landing, of a segment
    /// to lend, which also has nothing held behind it: one check of the
    /// state, and its length within `lend_segment_max` only (which is
    /// within MaxReceiveSize); nothing may be lent without the fast path.
    #[inline(always)]
    fn may_lend_whole(&self, a: &Arrival) -> bool {
        self.settled(Unsettled::empty()) && self.segment_may_be_whole(a) && self.may_lend(a.len)
    }

    /// Slot `slot`'s segment of `len` bytes, its header in the scratch
    /// bytes, lent when it is a whole message to lend; counted in `tally`.
    #[inline(always)]
    fn lend_header(&mut self, slot: u16, len: u64, tally: &mut LentTally) -> Option<Event> {
        let r = self.whole_header(len, true)?;
        let data = r.data_length as u64;
        if !self.lends(data) {
            return None;
        }
        self.take_whole(&r);
        tally.add(data);
        let at = self.rx_slot_offset(slot) + r.data_offset as u64;
        Some(self.loan(slot, at, data, None))
    }

    /// [`Self::on_whole_arrival`]'s segment `r` taken: counted, its
    /// credits and DataOffset noted (the checks said it may be).
    #[inline(always)]
    fn accept_whole(&mut self, r: &Repr) {
        self.stats.segments_received += 1;
        self.take_whole(r);
    }

    /// [`Self::accept_whole`] but for the count, which the caller keeps.
    #[inline(always)]
    fn take_whole(&mut self, r: &Repr) {
        let arrived = self.credits.on_arrival();
        debug_assert!(arrived.is_ok());
        self.credits.on_header(r.credits_granted, r.flags.contains(Flags::RESPONSE_REQUESTED));
        self.credits.on_data();
        self.peer_data_offset = r.data_offset;
    }

    /// Handles the completed slots in the order they were matched: each
    /// completion stored, or segment marked in the receive ring.
    fn on_arrivals<D: Device>(&mut self, ep: &mut Endpoint<D>) {
        while let Some(slot) = self.turn() {
            let a = match self.arrivals[slot as usize].take() {
                Some(a) => {
                    self.arrivals_held = self.arrivals_held.saturating_sub(1);
                    self.settle();
                    a
                }
                None => match self.rx_ring.and_then(|r| ep.recv_ring_landed(r, slot, &mut [])) {
                    Some(len) => Arrival { status: Status::Ok, len, token: None },
                    None => break,
                },
            };
            self.next_turn();
            self.on_turn(ep, slot, a);
        }
        if self.error.is_some() {
            self.release_buffers();
        }
    }

    /// Handles slot `slot`'s segment, taken in its turn: whole by the fast
    /// path when it can, else as any.
    #[inline(always)]
    fn on_turn<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16, a: Arrival) {
        if !(self.cfg.fast_path && self.on_whole_arrival(ep, slot, &a)) {
            self.on_arrival(ep, slot, a);
        }
    }

    /// Handles slot `slot`'s segment, taken in its turn.
    #[inline]
    fn on_arrival<D: Device>(&mut self, ep: &mut Endpoint<D>, slot: u16, a: Arrival) {
        if self.error.is_some() {
            // Not posted again: a terminated connection grants nothing.
            self.landings[slot as usize] = None;
            return;
        }
        self.stats.segments_received += 1;
        if let Err(e) = self.on_segment(ep, slot, a) {
            self.terminate(e);
        }
        self.settle();
    }

    /// Checks one segment against the credits, the codec and the message
    /// so far; invalidates its token; queues its data.
    #[inline]
    fn on_segment<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        slot: u16,
        a: Arrival,
    ) -> Result<(), ProtocolError> {
        self.credits.on_arrival()?;
        let max = self.params.max_receive_size;
        match a.status {
            Status::Ok => {}
            // The receive is MaxReceiveSize long: a longer segment did not
            // fit.
            Status::Truncated { olen } => {
                return Err(ProtocolError::SegmentTooLong { len: olen, max });
            }
            s => return Err(ProtocolError::RecvFailed(s)),
        }
        if a.len > max as u64 {
            return Err(ProtocolError::SegmentTooLong { len: a.len, max });
        }
        let mut h = [0u8; HEADER_LEN];
        let n = (a.len as usize).min(HEADER_LEN);
        // Read whole, a copy of known length; a shorter segment is refused
        // by the codec without its bytes.
        if n == HEADER_LEN {
            ep.read_mem(self.rx.id, self.rx_slot_offset(slot), &mut h)
                .map_err(ProtocolError::Endpoint)?;
        }
        let r = Repr::parse_header(&h[..n], a.len as usize).map_err(ProtocolError::Malformed)?;
        self.credits.on_header(r.credits_granted, r.flags.contains(Flags::RESPONSE_REQUESTED));
        let placement = self.reasm.accept(&r)?;
        match placement {
            Placement::Empty => {
                self.stats.empty_received += 1;
                if let Some(token) = a.token {
                    self.invalidate(ep, token)?;
                    self.push_event(Event::Invalidated { token });
                }
                // Its 20 bytes are all in the slot.
                self.landings[slot as usize] = None;
                self.rx_free.push(slot);
            }
            Placement::Data { offset, len, total, first, last } => {
                self.credits.on_data();
                let before = self.token_in_msg && !first;
                if let Some(token) = a.token {
                    // The spec puts a token in exactly one segment.
                    if before {
                        return Err(ProtocolError::TokenTwice { token });
                    }
                    // Before the message can be delivered, as soon as it
                    // is known.
                    self.invalidate(ep, token)?;
                }
                self.token_in_msg = (before || a.token.is_some()) && !last;
                // A lent message takes no buffer: not one of those counted.
                self.msgs_seen += (first && !(last && self.lends(len as u64))) as u64;
                // Where the next receives are posted assumes this offset.
                self.peer_data_offset = r.data_offset;
                let p = Pending {
                    slot,
                    data_offset: r.data_offset,
                    offset,
                    len,
                    total,
                    first,
                    last,
                    token: a.token,
                };
                // In order: at once when nothing waits before it.
                if !(self.pending.is_empty() && self.deliver_segment(ep, &p))
                    && self.error.is_none()
                {
                    self.pending.push_back(p);
                }
            }
        }
        Ok(())
    }

    /// Deregisters the region whose key the peer sent as a token.
    fn invalidate<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        token: u64,
    ) -> Result<(), ProtocolError> {
        // The connection's own regions are not the peer's to end.
        let own = token == self.hdr.key || token == self.rx.key;
        let mr =
            ep.mr_by_key(token).filter(|_| !own).ok_or(ProtocolError::UnknownToken { token })?;
        ep.deregister(mr.id).map_err(|error| ProtocolError::Invalidate { token, error })?;
        self.stats.tokens_invalidated += 1;
        Ok(())
    }

    /// Copies checked segments into the application's buffers, in order,
    /// and reports each message with its last segment.
    fn deliver<D: Device>(&mut self, ep: &mut Endpoint<D>) {
        while let Some(&p) = self.pending.front() {
            if self.error.is_some() || !self.deliver_segment(ep, &p) {
                break;
            }
            self.pending.pop_front();
        }
        self.settle();
    }

    /// Copies segment `p`, the next in order, into its message's buffer
    /// and reports the message with its last segment; false, with nothing
    /// changed, when its message has no buffer yet (or the copy failed,
    /// which terminates).
    #[inline]
    fn deliver_segment<D: Device>(&mut self, ep: &mut Endpoint<D>, p: &Pending) -> bool {
        if p.first && p.last && self.lends(p.len as u64) {
            let at = self.rx_slot_offset(p.slot) + p.data_offset as u64;
            // Bytes a receive put into a buffer that was not theirs come
            // back into the slot, where they are lent.
            let landed = self.landings[p.slot as usize].is_some();
            if landed && let Err(e) = self.copy_data(ep, p, p.len as u64, self.rx.id, at) {
                self.terminate(ProtocolError::Endpoint(e));
                return false;
            }
            self.lend(p.slot, at, p.len as u64, p.token);
            return true;
        }
        if p.first && p.last && self.landings[p.slot as usize].is_none() {
            // A message of one segment, in its slot: copied and reported
            // with no message kept in between. A copy that fails is left
            // to the general path below, which fails it again and ends.
            let Some(&buf) = self.apps.front() else { return false };
            let n = (p.len as u64).min(buf.dst.len);
            let at = self.rx_slot_offset(p.slot) + p.data_offset as u64;
            let src = Span { mr: self.rx.id, offset: at, len: n };
            if n == 0 || ep.copy_mem(src, buf.dst.mr, buf.dst.offset).is_ok() {
                self.apps.skip_front();
                self.apps_front_seq += 1;
                self.rx_free.push(p.slot);
                self.stats.bytes_received += p.len as u64;
                self.report_received(buf.ctx, p.total, buf.dst.len, p.token);
                return true;
            }
        }
        let m = if p.first {
            let Some(buf) = self.apps.pop_front() else { return false };
            self.apps_front_seq += 1;
            RxMsg { buf, total: p.total, token: p.token }
        } else {
            let Some(m) = self.rx_msg.as_mut() else { return false };
            m.token = m.token.or(p.token);
            *m
        };
        let dst = m.buf.dst;
        let n = (p.len as u64).min(dst.len.saturating_sub(p.offset));
        if let Err(e) = self.copy_data(ep, p, n, dst.mr, dst.offset + p.offset) {
            // The application deregistered its buffer meanwhile.
            self.rx_msg = Some(m);
            self.terminate(ProtocolError::Endpoint(e));
            return false;
        }
        self.rx_free.push(p.slot);
        self.stats.bytes_received += p.len as u64;
        if !p.last {
            self.rx_msg = Some(m);
            return true;
        }
        self.rx_msg = None;
        self.report_received(m.buf.ctx, m.total, dst.len, m.token);
        true
    }

    /// Whether a whole message of `len` bytes in one segment is lent.
    #[inline(always)]
    fn lends(&self, len: u64) -> bool {
        len <= self.cfg.lend_max
    }

    /// Lends the message of `len` bytes at `offset` of receive slot `slot`.
    #[inline]
    fn lend(&mut self, slot: u16, offset: u64, len: u64, invalidated: Option<u64>) {
        self.mark_lent(slot);
        self.stats.count_lent(1, len);
        let e = self.loan(slot, offset, len, invalidated);
        self.push_event(e);
    }

    /// Receive slot `slot`'s message is the application's until it gives
    /// the loan back.
    #[inline(always)]
    fn mark_lent(&mut self, slot: u16) {
        self.lent[slot as usize] = true;
        self.lent_out += 1;
    }

    /// The event of slot `slot`'s message lent, to be handed out (marking
    /// it lent, [`Self::mark_lent`], and counting it are the caller's).
    #[inline(always)]
    fn loan(&self, slot: u16, offset: u64, len: u64, invalidated: Option<u64>) -> Event {
        let data = Span { mr: self.rx.id, offset, len };
        Event::Lent { loan: Loan(slot), data, invalidated }
    }

    /// Reports a message of `total` bytes delivered into a buffer of
    /// `cap`.
    #[inline(always)]
    fn report_received(&mut self, ctx: u64, total: u64, cap: u64, invalidated: Option<u64>) {
        let status =
            if total > cap { RecvStatus::Truncated { olen: total } } else { RecvStatus::Ok };
        self.stats.messages_received += 1;
        self.push_event(Event::Received { ctx, len: total.min(cap), status, invalidated });
    }

    /// Copies the first `n` data bytes of segment `p` from where they
    /// landed to region `mr` at `at`; nothing for bytes already there.
    #[inline]
    fn copy_data<D: Device>(
        &mut self,
        ep: &mut Endpoint<D>,
        p: &Pending,
        n: u64,
        mr: crate::device::MrId,
        at: u64,
    ) -> Result<(), EpError> {
        let slot_at = self.rx_slot_offset(p.slot);
        let (from, to) = (p.data_offset as u64, p.data_offset as u64 + n);
        let in_slot = |a: u64, b: u64| Span { mr: self.rx.id, offset: slot_at + a, len: b - a };
        let Some(l) = self.landings[p.slot as usize].take() else {
            return if n > 0 { ep.copy_mem(in_slot(from, to), mr, at) } else { Ok(()) };
        };
        // Segment bytes [head, head + len) are in the buffer, the others in
        // the slot at their own offsets. The buffer's first: it may be
        // this message's own, shifted, and the slot's go where it was.
        let (h, e) = (l.head, l.head + l.len);
        let mut copied = false;
        let (a, b) = (from.max(h), to.min(e));
        if a < b {
            let src = Span { mr: l.dst.mr, offset: l.dst.offset + (a - h), len: b - a };
            let dst_at = at + (a - from);
            if src.mr != mr || src.offset != dst_at {
                ep.copy_mem(src, mr, dst_at)?;
                copied = true;
            }
        }
        if from < to.min(h) {
            ep.copy_mem(in_slot(from, to.min(h)), mr, at)?;
            copied = true;
        }
        let a = from.max(e);
        if a < to {
            ep.copy_mem(in_slot(a, to), mr, at + (a - from))?;
            copied = true;
        }
        self.stats.in_place += (n > 0 && !copied) as u64;
        Ok(())
    }

    /// A terminated connection gives back the application's buffers that
    /// no posted receive still writes, in the order they were posted.
    fn release_buffers(&mut self) {
        for i in 0..self.apps.len() {
            let seq = self.apps_front_seq + i as u64;
            let landings = &self.landings;
            let written =
                self.rx_order.iter().any(|&s| landings[s as usize].is_some_and(|l| l.seq == seq));
            let buf = &mut self.apps[i];
            if written || buf.released {
                continue;
            }
            buf.released = true;
            let ctx = buf.ctx;
            self.push_event(Event::Received {
                ctx,
                len: 0,
                status: RecvStatus::Terminated,
                invalidated: None,
            });
        }
        while self.apps.front().is_some_and(|b| b.released) {
            self.apps.pop_front();
            self.apps_front_seq += 1;
        }
    }

    // ---- termination ----

    /// Ends the connection for `e` (the first reason stays): nothing more
    /// is sent, granted or reposted; messages and buffers go back to the
    /// application once the endpoint no longer uses them.
    fn terminate(&mut self, e: ProtocolError) {
        if self.error.is_some() {
            return;
        }
        self.error = Some(e);
        self.push_event(Event::Terminated(e));
        self.next_post = self.tx.len();
        self.finish_sent();
        let terminated = |buf: AppBuf, invalidated| Event::Received {
            ctx: buf.ctx,
            len: 0,
            status: RecvStatus::Terminated,
            invalidated,
        };
        if let Some(m) = self.rx_msg.take() {
            self.push_event(terminated(m.buf, m.token));
        }
        self.pending.clear();
        self.settle();
        self.rx_free.clear();
        self.withdrawn = 0;
        self.release_buffers();
    }

    /// `unsettled` made again from what it stands for, after any of those
    /// changed.
    fn settle(&mut self) {
        self.unsettled = self.unsettled_now();
    }

    fn unsettled_now(&self) -> Unsettled {
        let mut u = Unsettled::empty();
        u.set(Unsettled::TERMINATED, self.error.is_some());
        u.set(Unsettled::PENDING, !self.pending.is_empty());
        u.set(Unsettled::PARTIAL, self.reasm.in_progress());
        u.set(Unsettled::HELD, self.arrivals_held > 0);
        u
    }

    /// Whether nothing keeps a segment off the fast paths but (some of)
    /// `but`.
    #[inline(always)]
    fn settled(&self, but: Unsettled) -> bool {
        debug_assert_eq!(self.unsettled, self.unsettled_now(), "settled after each change");
        self.unsettled.difference(but).is_empty()
    }
}

/// The event of a message sent at once, `ctx` as the queue of those
/// ([`Connection::sent`]) keeps it.
#[inline(always)]
fn sent_ok(ctx: u64) -> Event {
    Event::Sent { ctx, status: SendStatus::Ok }
}

/// Whether `span` lies in a region registered on `ep`.
fn registered<D: Device>(ep: &Endpoint<D>, span: &Span) -> bool {
    ep.mr(span.mr)
        .is_some_and(|mr| span.offset.checked_add(span.len).is_some_and(|end| end <= mr.len))
}
