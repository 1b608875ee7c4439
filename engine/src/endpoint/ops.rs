//! Operation entries: what the endpoint tracks per send, receive, write,
//! read and atomic, and the scatter lists their data lives in.

use super::cq::{Op, Status};
pub(crate) use super::types::MAX_IOV;
use super::types::{Held, Link, PeerId, RemoteId, RtaClass};
use crate::device::MrId;
use crate::mem::Span;
use crate::wire::RmaIov;

/// Where an operation's bytes are: up to four ranges of local regions, in
/// order, forming one contiguous message. Spans past `n` mean nothing (and
/// are not compared).
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Sgl {
    n: u8,
    segs: [Span; MAX_IOV],
}

const NO_SPAN: Span = Span { mr: MrId(u32::MAX), offset: 0, len: 0 };

impl PartialEq for Sgl {
    fn eq(&self, other: &Sgl) -> bool {
        self.segs() == other.segs()
    }
}

impl Eq for Sgl {}

impl std::fmt::Debug for Sgl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.segs()).finish()
    }
}

impl Sgl {
    /// Nothing.
    pub(crate) const EMPTY: Sgl = Sgl { n: 0, segs: [NO_SPAN; MAX_IOV] };

    /// One span.
    pub(crate) fn one(span: Span) -> Sgl {
        let mut s = Sgl::EMPTY;
        s.push(span);
        s
    }

    /// Makes this list `span` alone, in place: two stores, not a list's
    /// worth.
    #[inline]
    pub(crate) fn set_one(&mut self, span: Span) {
        self.segs[0] = span;
        self.n = 1;
    }

    /// Makes the list empty: one store.
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.n = 0;
    }

    /// Appends a span; panics past [`MAX_IOV`] (callers check counts).
    pub(crate) fn push(&mut self, span: Span) {
        self.segs[self.n as usize] = span;
        self.n += 1;
    }

    #[inline]
    pub(crate) fn segs(&self) -> &[Span] {
        &self.segs[..self.n as usize]
    }

    /// Total bytes.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.segs().iter().map(|s| s.len).sum()
    }

    /// The single span, when there is exactly one.
    #[inline]
    pub(crate) fn single(&self) -> Option<Span> {
        (self.n == 1).then_some(self.segs[0])
    }

    /// Calls `f(span)` for each piece of the message range
    /// `[offset, offset + len)`, in order, clipped to the list's end.
    #[inline]
    pub(crate) fn pieces(&self, mut offset: u64, mut len: u64, mut f: impl FnMut(Span)) {
        for seg in self.segs() {
            if len == 0 {
                return;
            }
            if offset >= seg.len {
                offset -= seg.len;
                continue;
            }
            let n = (seg.len - offset).min(len);
            f(Span { mr: seg.mr, offset: seg.offset + offset, len: n });
            len -= n;
            offset = 0;
        }
    }
}

/// The message protocols (spec 3.2, 4.1, 4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    /// One packet.
    Eager,
    /// Segments all sent at once.
    Medium,
    /// A REQ, then data as the receiver grants it by CTS.
    LongCts,
    /// A REQ naming the sender's buffer; the receiver reads it by RDMA
    /// and answers EOR.
    LongRead,
    /// The first bytes in REQs, the rest read by RDMA.
    RuntRead,
}

/// A send-side operation's protocol, with the state that is that
/// protocol's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxProto {
    /// One packet (and direct RMA and atomics, which keep no protocol
    /// state of their own).
    Eager,
    /// Segments all sent at once.
    Medium,
    /// A REQ, then data as the receiver grants it by CTS (an emulated
    /// read's responder: READRSP, then CTSDATA).
    LongCts {
        /// The receiver allows bytes up to this offset.
        granted: u64,
        /// A long-read or runting read re-sent this way after the
        /// receiver's READ_NACK: its REQ is flagged and carries no data.
        after_nack: bool,
    },
    /// A REQ naming the sender's buffer; the receiver reads it and
    /// answers EOR.
    LongRead,
    /// The first `runt` bytes in REQs, the rest read by the receiver;
    /// `budget` of them taken from the peer's runt budget (a head's runt,
    /// [`Endpoint::sendv_head`](super::Endpoint::sendv_head), takes none).
    RuntRead { runt: u64, budget: u64 },
}

impl TxProto {
    /// A protocol's state before anything is sent (a runting read's runt
    /// is set when its budget is taken).
    #[inline]
    pub(crate) fn start(proto: Proto) -> TxProto {
        match proto {
            Proto::Eager => TxProto::Eager,
            Proto::Medium => TxProto::Medium,
            Proto::LongCts => TxProto::LongCts { granted: 0, after_nack: false },
            Proto::LongRead => TxProto::LongRead,
            Proto::RuntRead => TxProto::RuntRead { runt: 0, budget: 0 },
        }
    }

    /// Which protocol.
    #[inline]
    pub(crate) fn name(self) -> Proto {
        match self {
            TxProto::Eager => Proto::Eager,
            TxProto::Medium => Proto::Medium,
            TxProto::LongCts { .. } => Proto::LongCts,
            TxProto::LongRead => Proto::LongRead,
            TxProto::RuntRead { .. } => Proto::RuntRead,
        }
    }

    /// Whether the receiver reads the data (long-read, runting read), so
    /// that EOR ends the operation.
    #[inline]
    pub(crate) fn is_read(self) -> bool {
        matches!(self, TxProto::LongRead | TxProto::RuntRead { .. })
    }

    /// Whether it is long-CTS after a READ_NACK.
    #[inline]
    pub(crate) fn after_nack(self) -> bool {
        matches!(self, TxProto::LongCts { after_nack: true, .. })
    }
}

/// What a send-side operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// send / tsend.
    Msg,
    /// An emulated write to `remote`.
    Write,
    /// The responder's side of an emulated read: data to the requester.
    ReadRsp,
    /// A device RDMA read or write, in segments.
    Rdma { read: bool },
    /// An emulated atomic; fetch and compare wait for an ATOMRSP.
    Atomic,
}

impl TxKind {
    /// What its completion reports: none for a responder's answer to a
    /// peer's read, which is the peer's operation, not ours.
    #[inline]
    pub(crate) fn reported_as(self) -> Option<Op> {
        match self {
            TxKind::Msg => Some(Op::Send),
            TxKind::Write | TxKind::Rdma { read: false } => Some(Op::Write),
            TxKind::Rdma { read: true } => Some(Op::Read),
            TxKind::Atomic => Some(Op::Atomic),
            TxKind::ReadRsp => None,
        }
    }
}

/// Where a send-side operation stands. Every protocol goes through the
/// same two (the module map says which answer each awaits):
///
/// - `Start`: its first packet (REQ, RTA or READRSP) is due;
/// - `Transfer`: its first packet is built and the rest goes out as its
///   protocol allows (medium and runt segments at once, CTSDATA as CTS
///   packets grant, RDMA segments in a window). `awaits` names the peer's
///   answer it needs to be done; once that came (or if none is needed),
///   it is done when every byte is sent and the device completed all it
///   was given.
///
/// A READ_NACK takes a long-read or runting read back to `Start`, as
/// long-CTS. What the device has not completed yet (`TxOp::in_flight`)
/// is counted apart, in either phase: a READ_NACK can come while the
/// first REQ is still posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxPhase {
    Start,
    Transfer { awaits: Option<Answer> },
}

/// The peer's last word, which ends a send-side operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Delivery complete: the data is in the target buffer (spec 4.2).
    Receipt,
    /// Long-read, runting read: the peer read the rest (spec 4.1).
    Eor,
    /// A fetch or compare atomic: the old values (spec 3.3).
    AtomRsp,
}

/// An atomic's request, kept until its packet is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AtomicReq {
    pub(crate) datatype: u32,
    pub(crate) op: u32,
    pub(crate) class: RtaClass,
    /// FETCH (or COMPARE): where the old values go.
    pub(crate) result: Option<Span>,
    /// COMPARE: the compare operands, sent after the operands.
    pub(crate) compare: Option<Span>,
}

/// A send-side operation.
#[derive(Debug, Clone)]
pub(crate) struct TxOp {
    pub(crate) kind: TxKind,
    pub(crate) peer: PeerId,
    pub(crate) proto: TxProto,
    /// Delivery complete: done only when the peer's RECEIPT (or EOR)
    /// arrives.
    pub(crate) dc: bool,
    pub(crate) tagged: bool,
    pub(crate) tag: u64,
    pub(crate) cq_data: Option<u64>,
    pub(crate) ctx: u64,
    /// The local data (source of sends and writes, target of reads).
    pub(crate) src: Sgl,
    /// Writes, reads, atomics: the peer's memory.
    pub(crate) remote: Iovs,
    pub(crate) atomic: Option<AtomicReq>,
    pub(crate) msg_id: u32,
    /// Message length.
    pub(crate) total: u64,
    /// Bytes put in built packets (or posted RDMA) so far; with the EOR
    /// of a read protocol, all of them (the peer read the rest).
    pub(crate) sent: u64,
    /// Long-CTS: the receiver's operation, from its CTS (ReadRsp: the
    /// requester's, from its RTR).
    pub(crate) recv_id: RemoteId,
    pub(crate) phase: TxPhase,
    /// Packets or RDMA operations posted and not yet completed.
    pub(crate) in_flight: u32,
    /// On the TX queue's list of operations with packets due.
    pub(crate) queued: bool,
    /// The first error, reported when nothing is in flight any more.
    pub(crate) error: Option<Status>,
    /// When the peer must have answered by (endpoint clock, ns).
    pub(crate) deadline: u64,
}

impl TxOp {
    /// What a free slab entry holds.
    pub(crate) fn blank() -> TxOp {
        TxOp::new(TxKind::Msg, PeerId(0), Proto::Eager, Sgl::EMPTY, 0)
    }

    /// A new operation with every progress field zero.
    pub(crate) fn new(kind: TxKind, peer: PeerId, proto: Proto, src: Sgl, ctx: u64) -> TxOp {
        TxOp {
            kind,
            peer,
            proto: TxProto::start(proto),
            dc: false,
            tagged: false,
            tag: 0,
            cq_data: None,
            ctx,
            src,
            remote: Iovs::default(),
            atomic: None,
            msg_id: 0,
            total: src.len(),
            sent: 0,
            recv_id: RemoteId(0),
            phase: TxPhase::Start,
            in_flight: 0,
            queued: false,
            error: None,
            deadline: 0,
        }
    }

    /// Makes this entry a new operation with every progress field zero
    /// and no data, field by field in place (no temporary of the whole
    /// entry); the caller sets `src` and `total`.
    #[inline]
    pub(crate) fn reset(&mut self, kind: TxKind, peer: PeerId, proto: Proto, ctx: u64) {
        self.kind = kind;
        self.peer = peer;
        self.proto = TxProto::start(proto);
        self.dc = false;
        self.tagged = false;
        self.tag = 0;
        self.cq_data = None;
        self.ctx = ctx;
        self.src.n = 0;
        self.remote.n = 0;
        self.atomic = None;
        self.msg_id = 0;
        self.total = 0;
        self.sent = 0;
        self.recv_id = RemoteId(0);
        self.phase = TxPhase::Start;
        self.in_flight = 0;
        self.queued = false;
        self.error = None;
        self.deadline = 0;
    }

    /// Its data: one span.
    #[inline]
    pub(crate) fn set_src(&mut self, span: Span) {
        self.src.set_one(span);
        self.total = span.len;
    }

    /// The peer's memory: one iov.
    #[inline]
    pub(crate) fn set_remote(&mut self, iov: RmaIov) {
        self.remote.set_one(iov);
    }

    pub(crate) fn remote(&self) -> &[RmaIov] {
        self.remote.as_slice()
    }

    /// The answer it needs from its peer to be done, by its protocol.
    #[inline]
    pub(crate) fn answer(&self) -> Option<Answer> {
        if self.proto.is_read() {
            Some(Answer::Eor)
        } else if self.dc {
            Some(Answer::Receipt)
        } else if self.atomic.is_some_and(|a| a.class != RtaClass::Write) {
            Some(Answer::AtomRsp)
        } else {
            None
        }
    }

    /// Its first packet is built (or, direct RMA, needs none).
    #[inline]
    pub(crate) fn start_transfer(&mut self) {
        self.phase = TxPhase::Transfer { awaits: self.answer() };
    }

    /// Whether its peer must answer in time: it awaits an answer, or
    /// (long-CTS) a CTS.
    #[inline]
    pub(crate) fn watches_peer(&self) -> bool {
        self.answer().is_some() || matches!(self.proto, TxProto::LongCts { .. })
    }

    /// Whether it has a packet (or RDMA operation) to build now.
    #[inline]
    pub(crate) fn has_packet_due(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        if self.phase == TxPhase::Start {
            return true;
        }
        match (self.kind, self.proto) {
            (TxKind::Rdma { .. }, _) => self.sent < self.total,
            (_, TxProto::Medium) => self.sent < self.total,
            (_, TxProto::RuntRead { runt, .. }) => self.sent < runt,
            (_, TxProto::LongCts { granted, .. }) => self.sent < granted,
            _ => false,
        }
    }

    /// Whether everything is sent, completed and acknowledged (or failed
    /// and drained).
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        if self.in_flight > 0 {
            return false;
        }
        if self.error.is_some() {
            return true;
        }
        // Direct RMA too: with nothing in flight and no error, every byte
        // posted completed.
        self.phase == TxPhase::Transfer { awaits: None } && self.sent == self.total
    }
}

/// A receive-side operation's protocol, with the state that is that
/// protocol's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxProto {
    /// One packet.
    Eager,
    /// Segments that land as they come.
    Medium,
    /// Data as we grant it by CTS (CTSDATA; an emulated read's READRSP
    /// first).
    LongCts {
        /// Bytes granted so far (an offset): from the start, what the
        /// REQ carried (an emulated read: what its request asks first; after
        /// a READ_NACK, what the runt brought).
        granted: u64,
    },
    /// We read the sender's buffer (`read_iov`) by RDMA.
    LongRead(Reads),
    /// The runt comes in REQ segments, the rest by RDMA read.
    RuntRead(Reads),
}

/// The RDMA reads of a long-read or runting-read receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reads {
    /// Bytes that come in REQ segments (runting read); reads start there.
    pub(crate) runt: u64,
    pub(crate) phase: ReadPhase,
}

/// Where the reads of a long-read or runting-read receive stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadPhase {
    /// Not begun: no receive matched the message yet, or (runting read)
    /// the runt is still arriving.
    Waiting,
    /// Reads are posted up to message offset `next`; `in_flight` of them
    /// have not completed.
    Reading { next: u64, in_flight: u32 },
    /// The buffer could not be prepared for reads: the sender was told by
    /// READ_NACK (the rest comes by long-CTS) or is left to time out.
    Refused,
}

impl RxProto {
    /// A protocol's state as its first packet arrives: `first` is what
    /// the sender sends before any CTS or read, which the protocol itself
    /// grants (long-CTS: the REQ's data; runting read: the runt).
    #[inline]
    pub(crate) fn start(proto: Proto, first: u64) -> RxProto {
        let waiting = |runt| Reads { runt, phase: ReadPhase::Waiting };
        match proto {
            Proto::Eager => RxProto::Eager,
            Proto::Medium => RxProto::Medium,
            Proto::LongCts => RxProto::LongCts { granted: first },
            Proto::LongRead => RxProto::LongRead(waiting(0)),
            Proto::RuntRead => RxProto::RuntRead(waiting(first)),
        }
    }

    /// Which protocol.
    #[inline]
    pub(crate) fn name(self) -> Proto {
        match self {
            RxProto::Eager => Proto::Eager,
            RxProto::Medium => Proto::Medium,
            RxProto::LongCts { .. } => Proto::LongCts,
            RxProto::LongRead(_) => Proto::LongRead,
            RxProto::RuntRead(_) => Proto::RuntRead,
        }
    }

    /// The reads of a long-read or runting read.
    #[inline]
    pub(crate) fn reads_mut(&mut self) -> Option<&mut Reads> {
        match self {
            RxProto::LongRead(r) | RxProto::RuntRead(r) => Some(r),
            _ => None,
        }
    }
}

/// What a receive-side operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxKind {
    /// recv / trecv.
    Msg,
    /// The target of an emulated long write (CTS data or RDMA read).
    Write,
    /// The requester of an emulated read: READRSP and CTSDATA land here.
    Read,
}

/// Where a receive operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxState {
    /// A message arrived before any matching receive was posted; its
    /// packets are held.
    Unexpected,
    /// Data lands in its buffer.
    Matched,
}

/// Up to `MAX_IOV` iovs, by value; iovs past `n` mean nothing.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct Iovs {
    /// First, beside the fields before it: clearing the list touches one
    /// cache line, not the one the array ends in.
    n: u8,
    v: [RmaIov; MAX_IOV],
}

impl PartialEq for Iovs {
    fn eq(&self, other: &Iovs) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Iovs {}

impl std::fmt::Debug for Iovs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Iovs {
    /// Makes these iovs `iov` alone, in place.
    #[inline]
    pub(crate) fn set_one(&mut self, iov: RmaIov) {
        self.v[0] = iov;
        self.n = 1;
    }

    pub(crate) fn one(iov: RmaIov) -> Iovs {
        let mut v = Iovs { n: 1, ..Iovs::default() };
        v.v[0] = iov;
        v
    }

    /// The first `MAX_IOV` of `list`.
    pub(crate) fn from_list(list: crate::wire::IovList<'_>) -> Iovs {
        let mut v = Iovs::default();
        for (slot, iov) in v.v.iter_mut().zip(list.iter()) {
            *slot = iov;
            v.n += 1;
        }
        v
    }

    pub(crate) fn as_slice(&self) -> &[RmaIov] {
        &self.v[..self.n as usize]
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// A receive the application posted, waiting for a message: what matching
/// reads and what an eager message needs to land and report, in one slab
/// entry of one cache line (see the layout test).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Posted {
    /// Links in the matcher's lists.
    pub(crate) link: Link,
    /// The peer it takes a message from; `None`: any.
    pub(crate) want_peer: Option<PeerId>,
    pub(crate) ctx: u64,
    /// Posting order, to pick the earliest of several matching receives.
    pub(crate) seq: u64,
    pub(crate) dst: Span,
}

impl Posted {
    pub(crate) const BLANK: Posted = Posted {
        link: Link::NONE,
        want_peer: None,
        ctx: 0,
        seq: 0,
        dst: Span { mr: MrId(0), offset: 0, len: 0 },
    };
}

/// An unexpected message, a message being received, a write target or a
/// read requester.
///
/// In declaration order (`repr(C)`) by when the fields are used: the
/// slab entry's first line holds what matching an unexpected message reads.
/// What a message records (`msg_id` onwards) is written by
/// [`RxOp::reset_message`] when one arrives.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct RxOp {
    pub(crate) kind: RxKind,
    pub(crate) state: RxState,
    pub(crate) tagged: bool,
    pub(crate) dc: bool,
    /// Links in the matcher's lists.
    pub(crate) link: Link,
    pub(crate) peer: PeerId,
    pub(crate) tag: u64,
    pub(crate) ctx: u64,
    /// Unexpected: the held packets.
    pub(crate) held: Held,
    /// Its deadline is on the timer.
    pub(crate) watched: bool,
    pub(crate) dst: Sgl,
    // The message.
    pub(crate) msg_id: u32,
    /// The sender's operation (long-CTS, long-read, DC receipts; an
    /// emulated read's responder).
    pub(crate) send_id: RemoteId,
    pub(crate) proto: RxProto,
    pub(crate) cq_data: Option<u64>,
    pub(crate) total: u64,
    /// Distinct bytes of the message that arrived (packets and reads).
    pub(crate) received: u64,
    /// Every byte before this message offset arrived in a packet; what
    /// arrived beyond it is recorded by offset in the endpoint's
    /// out-of-order segments, `ooo` of them.
    pub(crate) prefix: u64,
    pub(crate) ooo: u32,
    /// When the peer must have answered by (endpoint clock, ns).
    pub(crate) deadline: u64,
    /// Long-read / runting read: the sender's buffer.
    pub(crate) read_iov: Iovs,
}

impl RxOp {
    /// Makes this entry a new one of `kind` with no message yet, field by
    /// field in place (no temporary of the whole entry): the fields up to
    /// `dst`'s count. The message's fields are stale until
    /// [`RxOp::reset_message`].
    #[inline]
    pub(crate) fn reset(&mut self, kind: RxKind, state: RxState) {
        self.kind = kind;
        self.state = state;
        self.tagged = false;
        self.dc = false;
        self.link = Link::NONE;
        self.peer = PeerId(0);
        self.ctx = 0;
        self.held = Held::EMPTY;
        self.watched = false;
        self.dst.n = 0;
    }

    /// Zeroes what a message records, for a message about to be recorded.
    #[inline]
    pub(crate) fn reset_message(&mut self) {
        self.msg_id = 0;
        self.send_id = RemoteId(0);
        self.proto = RxProto::Eager;
        self.tag = 0;
        self.cq_data = None;
        self.total = 0;
        self.received = 0;
        self.prefix = 0;
        self.ooo = 0;
        self.deadline = 0;
        self.read_iov.n = 0;
    }

    /// A new entry with every message field zero.
    pub(crate) fn new(kind: RxKind, state: RxState) -> RxOp {
        RxOp {
            kind,
            state,
            tagged: false,
            ctx: 0,
            dst: Sgl::EMPTY,
            peer: PeerId(0),
            msg_id: 0,
            proto: RxProto::Eager,
            dc: false,
            tag: 0,
            cq_data: None,
            total: 0,
            received: 0,
            prefix: 0,
            ooo: 0,
            send_id: RemoteId(0),
            read_iov: Iovs::default(),
            held: Held::EMPTY,
            link: Link::NONE,
            deadline: 0,
            watched: false,
        }
    }

    pub(crate) fn read_iov(&self) -> &[RmaIov] {
        self.read_iov.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::BufId;

    #[test]
    fn a_reset_send_side_entry_is_a_new_one() {
        let span = Span { mr: MrId(3), offset: 5, len: 7 };
        let mut op = TxOp::new(TxKind::Write, PeerId(9), Proto::LongRead, Sgl::one(span), 4);
        op.dc = true;
        op.tagged = true;
        op.tag = 1;
        op.cq_data = Some(2);
        op.set_remote(RmaIov { addr: 1, len: 2, key: 3 });
        op.atomic = Some(AtomicReq {
            datatype: 1,
            op: 2,
            class: RtaClass::Fetch,
            result: Some(span),
            compare: None,
        });
        op.msg_id = 5;
        op.sent = 6;
        op.proto = TxProto::LongCts { granted: 8, after_nack: true };
        op.recv_id = RemoteId(9);
        op.phase = TxPhase::Transfer { awaits: Some(Answer::Receipt) };
        op.in_flight = 10;
        op.queued = true;
        op.error = Some(Status::Timeout);
        op.deadline = 11;
        op.reset(TxKind::Msg, PeerId(1), Proto::Eager, 2);
        op.set_src(span);
        let new = TxOp::new(TxKind::Msg, PeerId(1), Proto::Eager, Sgl::one(span), 2);
        assert_eq!(format!("{op:?}"), format!("{new:?}"));
    }

    #[test]
    fn reset_leaves_nothing_of_the_previous_entry() {
        let span = Span { mr: MrId(3), offset: 5, len: 7 };
        let mut op = RxOp::new(RxKind::Read, RxState::Matched);
        op.tagged = true;
        op.ctx = 1;
        op.dst = Sgl::one(span);
        op.dst.push(span);
        op.peer = PeerId(6);
        op.msg_id = 7;
        op.proto = RxProto::RuntRead(Reads {
            runt: 14,
            phase: ReadPhase::Reading { next: 15, in_flight: 16 },
        });
        op.dc = true;
        op.tag = 8;
        op.cq_data = Some(9);
        op.total = 10;
        op.received = 11;
        op.send_id = RemoteId(12);
        op.read_iov = Iovs::one(RmaIov { addr: 1, len: 2, key: 3 });
        op.held = Held::at(BufId(17));
        op.link = Link { prev: 18, next: 19 };
        op.deadline = 20;
        op.watched = true;
        op.reset(RxKind::Msg, RxState::Unexpected);
        op.reset_message();
        let new = RxOp::new(RxKind::Msg, RxState::Unexpected);
        assert_eq!(format!("{op:?}"), format!("{new:?}"));
    }

    #[test]
    fn a_posted_receive_is_one_cache_line_of_its_slab() {
        let (value_at, align) = super::super::slab::value_placement::<Posted>();
        assert_eq!(align, 64, "entries start on a cache line");
        assert!(value_at + size_of::<Posted>() <= 64, "{value_at} + {}", size_of::<Posted>());
    }

    #[test]
    fn matching_an_unexpected_message_reads_the_first_line_of_its_entry() {
        use std::mem::offset_of;
        let (value_at, _) = super::super::slab::value_placement::<RxOp>();
        let line = |offset: usize| (value_at + offset) / 64;
        assert_eq!(line(offset_of!(RxOp, tagged)), 0);
        assert_eq!(line(offset_of!(RxOp, link) + size_of::<Link>() - 1), 0);
        assert_eq!(line(offset_of!(RxOp, peer) + 3), 0);
        assert_eq!(line(offset_of!(RxOp, tag) + 7), 0);
    }

    #[test]
    fn pieces_split_a_range_across_spans() {
        let mut s = Sgl::EMPTY;
        s.push(Span { mr: MrId(1), offset: 100, len: 10 });
        s.push(Span { mr: MrId(2), offset: 0, len: 5 });
        s.push(Span { mr: MrId(3), offset: 7, len: 20 });
        assert_eq!(s.len(), 35);
        let mut got = Vec::new();
        s.pieces(8, 10, |p| got.push((p.mr.0, p.offset, p.len)));
        assert_eq!(got, [(1, 108, 2), (2, 0, 5), (3, 7, 3)]);
        got.clear();
        s.pieces(30, 100, |p| got.push((p.mr.0, p.offset, p.len)));
        assert_eq!(got, [(3, 22, 5)], "clipped at the end");
        got.clear();
        s.pieces(40, 1, |p| got.push((p.mr.0, p.offset, p.len)));
        assert!(got.is_empty());
        assert_eq!(
            Sgl::one(Span { mr: MrId(9), offset: 1, len: 2 }).single().map(|s| s.len),
            Some(2)
        );
        assert_eq!(s.single(), None);
    }
}
