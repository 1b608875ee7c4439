//! Two-sided messages, what every message protocol shares (spec 3.2):
//! send/recv, tagged or not; the choice of protocol; a new message
//! matched against posted receives or kept as unexpected; its data landed
//! in order or recorded out of order; its completion, truncated if it did
//! not fit. Each protocol's own steps are in its module (`eager`,
//! `medium`, `longcts`, `longread`, `runtread`, `dc`, `nack`).

use super::cq::{Completion, Op, Status};
use super::dispatch::msg_proto;
use super::ops::{
    MAX_IOV, Posted, Proto, ReadPhase, RxKind, RxProto, RxState, Sgl, TxKind, TxProto,
};
use super::slab::ArmError;
use super::types::{BufId, Ctrl, FAST_PATHS, Held, Link, PostedId, RemoteId, ReqInfo, RxId};
use super::{DropReason, Endpoint, Error, PeerId, PersistentRecv, Span, TagMatch};
use crate::device::{Device, MrId};
use crate::wire::PacketType;

/// Copies `len` bytes of packet `buf` from offset `from` into `dst` at
/// message offset `seg_offset`, clipped to `dst`'s end.
#[inline(always)]
pub(super) fn copy_in<D: Device>(
    dev: &mut D,
    buf: BufId,
    from: usize,
    dst: &Sgl,
    seg_offset: u64,
    len: u64,
) {
    if FAST_PATHS && let Some(s) = dst.single() {
        // One span, the common case: no walk over the list.
        copy_in_span(dev, buf, from, &s, seg_offset, len);
        return;
    }
    let mut from = from;
    dst.pieces(seg_offset, len, |p| {
        let n = p.len as usize;
        dev.copy_to_region(buf, from, p.mr, p.offset as usize, n);
        from += n;
    });
}

/// [`copy_in`] into one span.
#[inline(always)]
pub(super) fn copy_in_span<D: Device>(
    dev: &mut D,
    buf: BufId,
    from: usize,
    dst: &Span,
    seg_offset: u64,
    len: u64,
) {
    let n = len.min(dst.len.saturating_sub(seg_offset)) as usize;
    if n > 0 {
        dev.copy_to_region(buf, from, dst.mr, (dst.offset + seg_offset) as usize, n);
    }
}

/// A persistent receive that cannot be started or freed: queued already,
/// or freed.
#[cold]
fn arm_error(e: ArmError) -> Error {
    match e {
        ArmError::Armed => Error::Busy,
        ArmError::Stale => Error::Invalid,
    }
}

/// The region of a posted receive's span that says its spans are in the
/// endpoint's table of scattered receives (`recvv`).
pub(super) const SCATTERED: MrId = MrId(u32::MAX - 1);

impl<D: Device> Endpoint<D> {
    /// The spans of scattered receive `id` (posted with `dst`), taken out of
    /// the table.
    #[inline(never)]
    fn take_scattered(&mut self, id: PostedId, dst: &Span) -> Sgl {
        if dst.mr != SCATTERED {
            return Sgl::EMPTY;
        }
        let slot = &mut self.scattered[super::slab::index(id)];
        std::mem::replace(slot, Sgl::EMPTY)
    }

    /// Sends `src` to `peer`; completes with `ctx` once the data left (or,
    /// with delivery complete, reached the receive buffer).
    pub fn send(&mut self, peer: PeerId, src: Span, ctx: u64) -> Result<(), Error> {
        self.send_msg(peer, src, None, None, ctx)
    }

    /// Sends `src` to `peer` with `tag`.
    pub fn tsend(&mut self, peer: PeerId, src: Span, tag: u64, ctx: u64) -> Result<(), Error> {
        self.send_msg(peer, src, Some(tag), None, ctx)
    }

    /// Sends `src` with CQ data the receiver's completion carries.
    pub fn senddata(&mut self, peer: PeerId, src: Span, data: u64, ctx: u64) -> Result<(), Error> {
        self.send_msg(peer, src, None, Some(data), ctx)
    }

    /// Tagged send with CQ data.
    pub fn tsenddata(
        &mut self,
        peer: PeerId,
        src: Span,
        tag: u64,
        data: u64,
        ctx: u64,
    ) -> Result<(), Error> {
        self.send_msg(peer, src, Some(tag), Some(data), ctx)
    }

    /// Sends the concatenation of `srcs` (one to four spans, as
    /// `fi_sendv`) to `peer` as one message: a header and a payload kept in
    /// different regions go out without first being copied together.
    /// [`Error::Invalid`] for no span or more than four.
    pub fn sendv(&mut self, peer: PeerId, srcs: &[Span], ctx: u64) -> Result<(), Error> {
        self.send_msgv(peer, srcs, None, 0, ctx)
    }

    /// [`Endpoint::sendv`] with CQ data the receiver's completion carries.
    pub fn sendvdata(
        &mut self,
        peer: PeerId,
        srcs: &[Span],
        data: u64,
        ctx: u64,
    ) -> Result<(), Error> {
        self.send_msgv(peer, srcs, Some(data), 0, ctx)
    }

    /// Sends `head` then `body` as one message, as [`Endpoint::sendv`]
    /// (with CQ data when given): a protocol's header ahead of its
    /// payload. A message the peer would read (long-read) goes by runting
    /// read (spec 4.5) with `head` as its runt, when the peer takes those:
    /// the header travels in the REQ and the peer reads `body` alone, one
    /// RDMA read where it would take a second for a few bytes scattered
    /// apart from the body. Such a runt is outside the runt budget
    /// ([`Config::runt_size`](super::Config::runt_size)), which bounds
    /// payload-sized runts.
    ///
    /// The provider sends system memory LONGREAD, never runting it, and
    /// takes RUNTREAD from a peer all the same (`Config::runt_size`).
    pub fn sendv_head(
        &mut self,
        peer: PeerId,
        head: Span,
        body: Span,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<(), Error> {
        // A runt must leave something to read.
        let runt = if body.len > 0 { head.len } else { 0 };
        self.send_msgv(peer, &[head, body], cq_data, runt, ctx)
    }

    /// Posts a receive for the next untagged message (from `from`, or any
    /// peer); completes with `ctx`.
    pub fn recv(&mut self, dst: Span, from: Option<PeerId>, ctx: u64) -> Result<(), Error> {
        self.post_recv_op(dst, None, None, from, ctx)
    }

    /// Posts a receive for the next untagged message (from `from`, or any
    /// peer) that scatters it over `dst`, one to four spans in order (as
    /// `fi_recvv`): a header and a payload kept apart without a copy.
    /// [`Error::Invalid`] for no span or more than four.
    pub fn recvv(&mut self, dst: &[Span], from: Option<PeerId>, ctx: u64) -> Result<(), Error> {
        if FAST_PATHS && let [one] = dst {
            return self.recv(*one, from, ctx);
        }
        if dst.is_empty() || dst.len() > MAX_IOV {
            return Err(Error::Invalid);
        }
        let mut sgl = Sgl::EMPTY;
        let mut total = 0u64;
        for s in dst {
            self.check_span(s)?;
            total = total.checked_add(s.len).ok_or(Error::TooLarge)?;
            sgl.push(*s);
        }
        let marker = Span { mr: SCATTERED, offset: 0, len: total };
        self.post_recv_op(marker, Some(&sgl), None, from, ctx)
    }

    /// Posts a receive for the next tagged message whose tag matches.
    pub fn trecv(
        &mut self,
        dst: Span,
        tag: TagMatch,
        from: Option<PeerId>,
        ctx: u64,
    ) -> Result<(), Error> {
        self.post_recv_op(dst, None, Some(tag), from, ctx)
    }

    /// A persistent receive (as MPI's `MPI_Recv_init`): an untagged
    /// receive into `dst` for the next message from `from` (or any peer),
    /// completing with `ctx`, set up once and then started again and
    /// again ([`Endpoint::recv_start`]) at the cost of queueing its id,
    /// with no check or entry per message. It is idle until started, and
    /// again once a message completes it or it is withdrawn
    /// ([`Endpoint::cancel_recv`]); its region stays in use until
    /// [`Endpoint::recv_free`]. [`Error::Again`] when as many receives
    /// are posted or set up as the endpoint holds.
    pub fn recv_init(
        &mut self,
        dst: Span,
        from: Option<PeerId>,
        ctx: u64,
    ) -> Result<PersistentRecv, Error> {
        self.check_span(&dst)?;
        if let Some(p) = from {
            self.check_peer(p)?;
        }
        let posted = Posted { link: Link::NONE, want_peer: from, ctx, seq: 0, dst };
        self.posted.insert_kept(posted).map(PersistentRecv).ok_or(Error::Again)
    }

    /// Starts persistent receive `r`: queued behind the untagged receives
    /// posted before it, as [`Endpoint::recv`] would post it, or handed at
    /// once a message that waits for it. [`Error::Busy`] while it is
    /// queued; [`Error::Invalid`] once freed.
    #[inline(always)]
    pub fn recv_start(&mut self, r: PersistentRecv) -> Result<(), Error> {
        if self.matcher.unexpected_untagged_waiting() && self.start_on_unexpected(r)? {
            return Ok(());
        }
        self.posted.arm(r.0).map_err(arm_error)?;
        // Untagged: its place in the queue is its order, no `seq` needed.
        self.matcher.post(&mut self.posted, r.0, None);
        self.retry_stalled();
        Ok(())
    }

    /// Hands idle persistent receive `r` the first unexpected untagged
    /// message it takes, if any; whether there was one.
    #[inline(never)]
    fn start_on_unexpected(&mut self, r: PersistentRecv) -> Result<bool, Error> {
        let (armed, &Posted { dst, want_peer, ctx, .. }) =
            self.posted.armed(r.0).map_err(arm_error)?;
        if armed {
            return Err(Error::Busy);
        }
        let Some(id) = self.matcher.take_unexpected(&mut self.rx_ops, None, want_peer) else {
            return Ok(false);
        };
        self.take_unexpected_into(id, dst, None, ctx);
        Ok(true)
    }

    /// Frees persistent receive `r`, withdrawn first if it is queued; its
    /// region is no longer in use by it. [`Error::Invalid`] once freed.
    pub fn recv_free(&mut self, r: PersistentRecv) -> Result<(), Error> {
        if self.posted.armed(r.0).map_err(arm_error)?.0 {
            let withdrawn = self.matcher.withdraw_untagged(&mut self.posted, |id, _| id == r.0);
            debug_assert_eq!(withdrawn, Some(r.0), "a queued receive waits in the matcher");
        }
        self.posted.free_kept(r.0).map_err(arm_error)
    }

    /// Withdraws the earliest untagged receive posted with `ctx` that no
    /// message has matched yet (as `fi_cancel`, without a completion);
    /// returns whether there was one. Its buffer is the caller's again, to
    /// deregister or repost; a persistent receive withdrawn stays, idle.
    /// A linear search: set-up and teardown work.
    pub fn cancel_recv(&mut self, ctx: u64) -> bool {
        let id = self.matcher.withdraw_untagged(&mut self.posted, |_, p| p.ctx == ctx);
        self.free_withdrawn(id)
    }

    /// [`Endpoint::cancel_recv`] of the latest untagged receive posted
    /// with `ctx`, searched from the newest: the receives posted last are
    /// withdrawn with no search.
    pub fn cancel_last_recv(&mut self, ctx: u64) -> bool {
        let id = self.matcher.withdraw_untagged_last(&mut self.posted, |_, p| p.ctx == ctx);
        self.free_withdrawn(id)
    }

    /// Frees a withdrawn receive; whether there was one.
    fn free_withdrawn(&mut self, id: Option<PostedId>) -> bool {
        let Some(id) = id else { return false };
        let Posted { dst, .. } = self.take_matched(id);
        self.take_scattered(id, &dst);
        true
    }

    pub(super) fn check_peer(&self, peer: PeerId) -> Result<(), Error> {
        if (peer.0 as usize) < self.peers.len() { Ok(()) } else { Err(Error::UnknownPeer) }
    }

    /// The protocol for a message of `len` bytes to `peer` now;
    /// `readable` says whether the peer can read its source by RDMA (asked
    /// only of a message long enough for it).
    #[inline(always)]
    pub(super) fn choose_proto(
        &self,
        peer: PeerId,
        len: u64,
        tagged: bool,
        cq_data: bool,
        readable: impl FnOnce() -> bool,
    ) -> Proto {
        let ptype = if tagged { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        let room = (self.caps.mtu - self.req_header_len(ptype, peer, cq_data)) as u64;
        let eager_max = self.cfg.eager_max.map_or(room, |m| m.min(room));
        if len <= eager_max {
            Proto::Eager
        } else if len >= self.cfg.long_read_min && readable() {
            if self.runt_allowed(peer) { Proto::RuntRead } else { Proto::LongRead }
        } else if len <= self.cfg.medium_max {
            Proto::Medium
        } else {
            Proto::LongCts
        }
    }

    /// A message send. The eager packet built at once, the common case, is
    /// inlined into each public send; everything else is not.
    #[inline(always)]
    fn send_msg(
        &mut self,
        peer: PeerId,
        src: Span,
        tag: Option<u64>,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<(), Error> {
        self.check_peer(peer)?;
        self.check_span(&src)?;
        let dc = self.cfg.delivery_complete;
        if dc {
            self.check_dc(peer)?;
        }
        let proto = self.choose_proto(peer, src.len, tag.is_some(), cq_data.is_some(), || {
            self.can_long_read(peer, &src)
        });
        let now = FAST_PATHS && self.txq.has_free_buf() && self.txq.waiting() == 0;
        if proto != Proto::Eager || !now || dc {
            return self.send_msg_op(peer, src, None, proto, 0, tag, cq_data, ctx);
        }
        self.send_eager_now(peer, src, tag, cq_data, ctx);
        Ok(())
    }

    /// An untagged message gathered from several spans: eager at once
    /// when it fits a packet, each span copied into it; otherwise an
    /// operation entry whose protocols walk the spans as they walk a
    /// receive's.
    fn send_msgv(
        &mut self,
        peer: PeerId,
        srcs: &[Span],
        cq_data: Option<u64>,
        head_runt: u64,
        ctx: u64,
    ) -> Result<(), Error> {
        if FAST_PATHS && let [one] = srcs {
            return self.send_msg(peer, *one, None, cq_data, ctx);
        }
        if srcs.is_empty() || srcs.len() > MAX_IOV {
            return Err(Error::Invalid);
        }
        self.check_peer(peer)?;
        let mut sgl = Sgl::EMPTY;
        let mut total = 0u64;
        for s in srcs {
            self.check_span(s)?;
            total = total.checked_add(s.len).ok_or(Error::TooLarge)?;
            sgl.push(*s);
        }
        let dc = self.cfg.delivery_complete;
        if dc {
            self.check_dc(peer)?;
        }
        let mut proto = self.choose_proto(peer, total, false, cq_data.is_some(), || {
            self.can_long_read_all(peer, &sgl)
        });
        let head_runt = match proto {
            Proto::LongRead | Proto::RuntRead if head_runt > 0 && self.takes_runts(peer) => {
                proto = Proto::RuntRead;
                head_runt
            }
            _ => 0,
        };
        let now = FAST_PATHS && self.txq.has_free_buf() && self.txq.waiting() == 0;
        if proto != Proto::Eager || !now || dc {
            let src = srcs[0];
            return self.send_msg_op(peer, src, Some(&sgl), proto, head_runt, None, cq_data, ctx);
        }
        self.send_eager_now_v(peer, &sgl, total, cq_data, ctx);
        Ok(())
    }

    /// A message that needs an operation entry: a protocol other than
    /// eager, delivery complete, or no TX buffer now. Its source is `src`,
    /// or the spans of `srcv` when given; a runting read's runt is
    /// `head_runt` when not 0 ([`Endpoint::sendv_head`]), else taken from
    /// the peer's budget.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn send_msg_op(
        &mut self,
        peer: PeerId,
        src: Span,
        srcv: Option<&Sgl>,
        proto: Proto,
        head_runt: u64,
        tag: Option<u64>,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<(), Error> {
        if self.tx_ops.is_full() {
            return Err(Error::Again);
        }
        let dc = self.cfg.delivery_complete;
        let now = self.txq.has_free_buf() && self.txq.waiting() == 0;
        let msg_id = self.next_msg_id(peer);
        let state = match proto {
            Proto::RuntRead if head_runt > 0 => TxProto::RuntRead { runt: head_runt, budget: 0 },
            Proto::RuntRead => {
                let runt = self.take_runt(peer, srcv.map_or(src.len, Sgl::len));
                TxProto::RuntRead { runt, budget: runt }
            }
            _ => TxProto::start(proto),
        };
        let id = self
            .tx_ops
            .insert_with(|op| {
                op.reset(TxKind::Msg, peer, proto, ctx);
                match srcv {
                    Some(v) => {
                        op.src = *v;
                        op.total = v.len();
                    }
                    None => op.set_src(src),
                }
                op.tagged = tag.is_some();
                op.tag = tag.unwrap_or(0);
                op.cq_data = cq_data;
                op.msg_id = msg_id;
                op.dc = dc;
                op.proto = state;
            })
            .expect("checked room");
        if self.tx_ops.get(id).expect("live op").watches_peer() {
            self.watch_tx(id);
        }
        if now {
            self.build_op_packet(id);
        }
        self.mark_ready(id);
        self.maybe_post();
        Ok(())
    }

    /// Takes the next msg_id to `peer`; a REQ goes out to it.
    #[inline]
    pub(super) fn next_msg_id(&mut self, peer: PeerId) -> u32 {
        let p = self.peers.get_mut(peer).expect("checked peer");
        let msg_id = p.next_msg_id;
        p.next_msg_id = msg_id.wrapping_add(1);
        p.req_sent = true;
        msg_id
    }

    /// Posts a receive into `dst`, or, given `sgl`, into its spans (`dst`
    /// then only marks it, [`SCATTERED`], with the total length).
    #[inline(always)]
    fn post_recv_op(
        &mut self,
        dst: Span,
        sgl: Option<&Sgl>,
        tag: Option<TagMatch>,
        from: Option<PeerId>,
        ctx: u64,
    ) -> Result<(), Error> {
        if sgl.is_none() {
            self.check_span(&dst)?;
        }
        if let Some(p) = from {
            self.check_peer(p)?;
        }
        let want_peer = from;
        if let Some(id) = self.matcher.take_unexpected(&mut self.rx_ops, tag, want_peer) {
            self.take_unexpected_into(id, dst, sgl, ctx);
            return Ok(());
        }
        let seq = self.next_seq;
        let id = self
            .posted
            .insert(Posted { link: Link::NONE, want_peer, ctx, seq, dst })
            .ok_or(Error::Again)?;
        if let Some(sgl) = sgl {
            // Kept beside the entry, which is one cache line with room for
            // one span (see `Posted`); growing the table is a cold path,
            // as slab indices are reused.
            let i = super::slab::index(id);
            if self.scattered.len() <= i {
                self.scattered.resize(i + 1, Sgl::EMPTY);
            }
            self.scattered[i] = *sgl;
        }
        self.next_seq += 1;
        self.matcher.post(&mut self.posted, id, tag);
        // A message that waited for room may be an eager one this receive
        // takes without an entry.
        self.retry_stalled();
        Ok(())
    }

    /// Hands unexpected message `id` to a receive being posted (to `dst`,
    /// or the spans of `sgl`).
    #[inline(always)]
    pub(super) fn take_unexpected_into(
        &mut self,
        id: RxId,
        dst: Span,
        sgl: Option<&Sgl>,
        ctx: u64,
    ) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        if FAST_PATHS && op.proto == RxProto::Eager && !op.dc {
            self.land_unexpected_eager(id, dst, sgl, ctx);
            return;
        }
        op.state = RxState::Matched;
        op.ctx = ctx;
        op.dst = sgl.copied().unwrap_or_else(|| Sgl::one(dst));
        self.deliver_held(id);
    }

    /// Takes posted receive `pid`, which a message matched or which was
    /// withdrawn, out of the slab; a persistent one stays there, idle.
    #[inline(always)]
    pub(super) fn take_matched(&mut self, pid: PostedId) -> Posted {
        self.posted.take_or_keep(pid).expect("live receive")
    }

    /// An RTM whose turn has come: match it or keep it as unexpected.
    /// Returns false, leaving the packet to the caller, when there is no
    /// room to keep an unexpected message.
    pub(super) fn handle_new_msg(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        let Some((proto, tagged, dc)) = msg_proto(info) else {
            self.counters.drop(DropReason::Unsupported);
            self.release_rx(buf);
            return true;
        };
        let total = match proto {
            Proto::Eager => info.payload_len as u64,
            _ => info.msg_length,
        };
        let seg_offset =
            if matches!(proto, Proto::Medium | Proto::RuntRead) { info.seg_offset } else { 0 };
        let in_range =
            seg_offset.checked_add(info.payload_len as u64).is_some_and(|end| end <= total);
        let runt_ok =
            proto != Proto::RuntRead || (info.runt_length <= total && info.read_iov.n > 0);
        let read_ok = proto != Proto::LongRead || (info.read_iov.n > 0 && info.payload_len == 0);
        if !in_range || !runt_ok || !read_ok {
            self.counters.drop(if in_range {
                DropReason::Invalid
            } else {
                DropReason::SegmentOutOfRange
            });
            self.release_rx(buf);
            return true;
        }
        // Everything but an eager message that nothing answers is recorded
        // in an entry, matched or not: without room, the packet waits
        // (holding its buffer) until entries are freed or receives posted.
        let needs_entry = proto != Proto::Eager || dc || !FAST_PATHS;
        if needs_entry && self.rx_ops.is_full() {
            self.counters.rx_ops_exhausted += 1;
            return false;
        }
        let ring = self.ring_for(tagged, peer);
        if let Some(ring) = ring
            && proto == Proto::Eager
            && !dc
            && info.cq_data.is_none()
        {
            // Whole, as `land_eager` takes it: marked in its slot.
            let from = info.payload_off as usize;
            if self.ring_land_eager(ring, buf, from, total) == Some(true) {
                self.release_rx(buf);
                return true;
            }
        }
        let taken = match ring {
            Some(ring) => self.ring_slot(ring).map(|(ctx, dst)| (ctx, dst, None)),
            None => self.matcher.take_posted(&mut self.posted, tagged, info.tag, peer).map(|pid| {
                let Posted { ctx, dst, .. } = self.take_matched(pid);
                let sgl = (dst.mr == SCATTERED).then(|| self.take_scattered(pid, &dst));
                (ctx, dst, sgl)
            }),
        };
        let Some((ctx, dst, sgl)) = taken else {
            let Some(id) = self.rx_ops.insert_with(|op| op.reset(RxKind::Msg, RxState::Unexpected))
            else {
                self.counters.rx_ops_exhausted += 1;
                return false;
            };
            self.counters.unexpected += 1;
            self.set_message(id, buf, peer, proto, tagged, dc, total, info);
            self.matcher.push_unexpected(&mut self.rx_ops, id);
            self.hold(id, buf);
            if self.needs_later_packets(proto, info) {
                self.in_progress.insert(peer, info.msg_id, id);
            }
            return true;
        };
        if !needs_entry {
            // The whole message is here and nothing answers it: land it
            // and report it without recording it in an entry.
            let from = info.payload_off as usize;
            match &sgl {
                Some(sgl) => copy_in(&mut self.dev, buf, from, sgl, 0, total),
                None => copy_in_span(&mut self.dev, buf, from, &dst, 0, total),
            }
            self.report_rx(Op::Recv, ctx, total, dst.len, tagged, info.tag, info.cq_data, peer);
            self.release_rx(buf);
            return true;
        }
        let id = self
            .rx_ops
            .insert_with(|op| {
                op.reset(RxKind::Msg, RxState::Matched);
                op.ctx = ctx;
                match sgl {
                    Some(sgl) => op.dst = sgl,
                    None => op.dst.set_one(dst),
                }
            })
            .expect("room checked");
        self.set_message(id, buf, peer, proto, tagged, dc, total, info);
        if self.needs_later_packets(proto, info) {
            self.in_progress.insert(peer, info.msg_id, id);
        }
        self.land(id, buf, info.payload_off, info.payload_len, seg_offset);
        self.release_rx(buf);
        self.advance_rx(id);
        true
    }

    /// Whether packets with this msg_id are still to come (or, for the
    /// read protocols, a READ_NACK retry may come).
    fn needs_later_packets(&self, proto: Proto, info: &ReqInfo) -> bool {
        match proto {
            Proto::Eager => false,
            Proto::Medium | Proto::RuntRead | Proto::LongCts => {
                (info.payload_len as u64) < info.msg_length || proto == Proto::RuntRead
            }
            Proto::LongRead => true,
        }
    }

    /// Records what a message is in receive entry `id`.
    #[allow(clippy::too_many_arguments)]
    fn set_message(
        &mut self,
        id: RxId,
        buf: BufId,
        peer: PeerId,
        proto: Proto,
        tagged: bool,
        dc: bool,
        total: u64,
        info: &ReqInfo,
    ) {
        // Only the read protocols use the sender's iovs.
        let read_iov = match proto {
            Proto::LongRead | Proto::RuntRead => Some(self.req_iovs(buf, info.read_iov)),
            _ => None,
        };
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.reset_message();
        op.peer = peer;
        op.msg_id = info.msg_id;
        let first = match proto {
            Proto::LongCts => info.payload_len as u64,
            Proto::RuntRead => info.runt_length,
            _ => 0,
        };
        op.proto = RxProto::start(proto, first);
        op.tagged = tagged;
        op.dc = dc;
        op.tag = info.tag;
        op.cq_data = info.cq_data;
        op.total = total;
        op.received = 0;
        op.send_id = RemoteId(info.send_id);
        if let Some(v) = read_iov {
            op.read_iov = v;
        }
    }

    /// Adds a packet to an unexpected message's chain.
    pub(super) fn hold(&mut self, id: RxId, buf: BufId) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        self.rx_meta[buf.index()].next = op.held;
        op.held = Held::at(buf);
    }

    /// A receive was posted for an unexpected message: lands what it held.
    fn deliver_held(&mut self, id: RxId) {
        let mut next =
            std::mem::replace(&mut self.rx_ops.get_mut(id).expect("live op").held, Held::EMPTY);
        while let Some(buf) = next.first() {
            next = self.rx_meta[buf.index()].next;
            if let Some(r) = self.held_info(buf) {
                let seg = match msg_proto(&r) {
                    Some((Proto::Medium | Proto::RuntRead, _, _)) => r.seg_offset,
                    _ => 0,
                };
                self.land(id, buf, r.payload_off, r.payload_len, seg);
            }
            self.release_rx(buf);
        }
        self.advance_rx(id);
    }

    /// Copies a packet's data into the operation's buffer at message
    /// offset `seg_offset` (in the message: callers check); bytes beyond
    /// the buffer are counted but dropped (truncation). A segment that
    /// arrived before is counted and dropped instead: counted twice, it
    /// would complete its message with a hole. Returns whether it landed.
    pub(super) fn land(
        &mut self,
        id: RxId,
        buf: BufId,
        off: u32,
        len: u32,
        seg_offset: u64,
    ) -> bool {
        let op = self.rx_ops.get_mut(id).expect("live op");
        if seg_offset == op.prefix {
            // In order, the common case.
            op.prefix += len as u64;
            if op.ooo > 0 {
                self.absorb_ooo(id);
            }
        } else if !self.record_ooo(id, seg_offset, len as u64) {
            self.counters.drop(DropReason::Duplicate);
            return false;
        }
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.received += len as u64;
        copy_in(&mut self.dev, buf, off as usize, &op.dst, seg_offset, len as u64);
        true
    }

    /// Records a segment of entry `id` that arrived ahead of its
    /// message's prefix; false if it arrived before (it starts inside the
    /// prefix or where a recorded one starts). Overlaps that a copy cannot
    /// make (a segment starting inside another out of order) are the
    /// sender's own corruption and are not looked for.
    #[cold]
    #[inline(never)]
    fn record_ooo(&mut self, id: RxId, seg_offset: u64, len: u64) -> bool {
        let op = self.rx_ops.get_mut(id).expect("live op");
        if seg_offset < op.prefix {
            return false;
        }
        match self.ooo_segs.entry((id, seg_offset)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(len);
                op.ooo += 1;
                true
            }
        }
    }

    /// Moves entry `id`'s prefix over the recorded segments it reached.
    #[cold]
    #[inline(never)]
    fn absorb_ooo(&mut self, id: RxId) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        while op.ooo > 0
            && let Some(len) = self.ooo_segs.remove(&(id, op.prefix))
        {
            op.prefix += len;
            op.ooo -= 1;
        }
    }

    /// Reports a receive-side operation that brought `total` bytes into a
    /// buffer of `dst_len` (truncated if they did not fit).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn report_rx(
        &mut self,
        what: Op,
        ctx: u64,
        total: u64,
        dst_len: u64,
        tagged: bool,
        tag: u64,
        cq_data: Option<u64>,
        peer: PeerId,
    ) {
        self.cq.push(Completion {
            ctx,
            op: what,
            status: if total > dst_len { Status::Truncated { olen: total } } else { Status::Ok },
            len: total.min(dst_len),
            tag,
            tagged,
            cq_data,
            peer: Some(peer),
        });
    }

    /// After data landed: complete the operation, grant more (long-CTS),
    /// or start reading the rest (long-read, runting read).
    pub(super) fn advance_rx(&mut self, id: RxId) {
        let deadline = self.fresh_deadline();
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.deadline = deadline;
        match op.proto {
            RxProto::LongRead(r) | RxProto::RuntRead(r)
                if r.phase == ReadPhase::Waiting && op.received >= r.runt =>
            {
                self.start_reads(id)
            }
            RxProto::LongRead(_) | RxProto::RuntRead(_) => {}
            _ if op.received >= op.total => self.finish_rx(id),
            RxProto::LongCts { .. } => self.maybe_grant(id),
            _ => {}
        }
    }

    /// Reports a finished receive-side operation, answers its sender
    /// (RECEIPT, EOR) and frees it.
    pub(super) fn finish_rx(&mut self, id: RxId) {
        let Some(op) = self.rx_ops.get(id) else { return };
        let dst_len = op.dst.len();
        let (kind, proto, peer) = (op.kind, op.proto.name(), op.peer);
        let answer = match (kind, proto) {
            (_, Proto::LongRead | Proto::RuntRead) => {
                Some(Ctrl::Eor { peer, send_id: op.send_id, recv_id: id })
            }
            _ if op.dc => Some(Ctrl::Receipt { peer, send_id: op.send_id, msg_id: op.msg_id }),
            _ => None,
        };
        let report = match kind {
            RxKind::Msg => Some(Op::Recv),
            RxKind::Read => Some(Op::Read),
            // A write's target hears of it only with CQ data (spec 3.3).
            RxKind::Write => op.cq_data.map(|_| Op::RemoteWrite),
        };
        if let Some(what) = report {
            let (ctx, total, tagged, tag, cq_data) =
                (op.ctx, op.total, op.tagged, op.tag, op.cq_data);
            self.report_rx(what, ctx, total, dst_len, tagged, tag, cq_data, peer);
        }
        if let Some(a) = answer {
            self.queue_ctrl(a);
        }
        self.free_rx_op(id);
        self.retry_stalled();
    }

    /// Frees a receive-side entry and its index by msg_id.
    pub(super) fn free_rx_op(&mut self, id: RxId) {
        if let Some(op) = self.rx_ops.get(id) {
            if op.kind == RxKind::Msg && op.proto != RxProto::Eager {
                self.in_progress.remove(op.peer, op.msg_id);
            }
            if op.ooo > 0 {
                // Ended before its prefix reached them (an error, a
                // timeout): rare, so a sweep.
                self.ooo_segs.retain(|&(op_id, _), _| op_id != id);
            }
            let held = op.held;
            self.release_chain(held);
        }
        self.rx_ops.free(id);
    }
}

/// Bytes of a message that a list of at most `MAX_IOV` iovs covers.
pub(super) fn iov_total(iovs: &[crate::wire::RmaIov]) -> Option<u64> {
    debug_assert!(iovs.len() <= MAX_IOV);
    iovs.iter().try_fold(0u64, |acc, v| acc.checked_add(v.len))
}
