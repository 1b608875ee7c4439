//! Two-sided messages (spec 3.2, 4.1, 4.2, 4.5, 4.7): send/recv, tagged or
//! not, with the eager, medium, long-CTS, long-read and runting-read
//! protocols, delivery complete, unexpected messages, truncation.

use super::cq::{Completion, Op, Status};
use super::ops::{MAX_IOV, Posted, Proto, RxKind, RxState, Sgl, TxKind};
use super::types::{
    BufId, Ctrl, EagerSend, FAST_PATHS, Held, Link, Owner, PostedId, RemoteId, ReqInfo, RxId, TxId,
};
use super::{DropReason, Endpoint, Error, PeerId, Span, TagMatch};
use crate::device::{Access, DataSeg, Device, HeldBufs, MrId, Source};
use crate::wire::{CtsDataRepr, CtsFlags, CtsRepr, EagerRtm, PacketType, extra};

/// What an arriving message is, by its REQ type: protocol, tagged,
/// delivery complete.
fn msg_proto(ptype: PacketType) -> Option<(Proto, bool, bool)> {
    use PacketType::*;
    Some(match ptype {
        EagerMsgRtm => (Proto::Eager, false, false),
        EagerTagRtm => (Proto::Eager, true, false),
        MediumMsgRtm => (Proto::Medium, false, false),
        MediumTagRtm => (Proto::Medium, true, false),
        LongCtsMsgRtm => (Proto::LongCts, false, false),
        LongCtsTagRtm => (Proto::LongCts, true, false),
        DcEagerMsgRtm => (Proto::Eager, false, true),
        DcEagerTagRtm => (Proto::Eager, true, true),
        DcMediumMsgRtm => (Proto::Medium, false, true),
        DcMediumTagRtm => (Proto::Medium, true, true),
        DcLongCtsMsgRtm => (Proto::LongCts, false, true),
        DcLongCtsTagRtm => (Proto::LongCts, true, true),
        LongReadMsgRtm => (Proto::LongRead, false, false),
        LongReadTagRtm => (Proto::LongRead, true, false),
        RuntReadMsgRtm => (Proto::RuntRead, false, false),
        RuntReadTagRtm => (Proto::RuntRead, true, false),
        _ => return None,
    })
}

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
fn copy_in_span<D: Device>(
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
        self.send_msgv(peer, srcs, None, ctx)
    }

    /// [`Endpoint::sendv`] with CQ data the receiver's completion carries.
    pub fn sendvdata(
        &mut self,
        peer: PeerId,
        srcs: &[Span],
        data: u64,
        ctx: u64,
    ) -> Result<(), Error> {
        self.send_msgv(peer, srcs, Some(data), ctx)
    }

    /// Sends `head`, copied now, followed by `src` as one message (with
    /// CQ data when given), if that goes in one packet at once: true, and
    /// it completes with `ctx` as a send does. False, with nothing sent,
    /// when it would not (too long, no packet buffer free now, delivery
    /// complete): then send the head from registered memory with
    /// [`Endpoint::sendv`]. For a protocol framed on top of messages whose
    /// header is built per message: no copy of it into registered memory
    /// first.
    pub fn send_inline_head(
        &mut self,
        peer: PeerId,
        head: &[u8],
        src: Span,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<bool, Error> {
        let write = |b: &mut [u8]| b.copy_from_slice(head);
        self.send_inline_head_with(peer, head.len(), write, src, cq_data, ctx)
    }

    /// [`Endpoint::send_inline_head`] with a head of `head_len` bytes that
    /// `write_head` writes straight into the packet (it is called only when
    /// the message goes): a header emitted where it travels, not built
    /// aside and copied.
    #[inline]
    pub fn send_inline_head_with(
        &mut self,
        peer: PeerId,
        head_len: usize,
        write_head: impl FnOnce(&mut [u8]),
        src: Span,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<bool, Error> {
        self.check_peer(peer)?;
        self.check_span(&src)?;
        let total = head_len as u64 + src.len;
        // The eager size: a read is never chosen below it.
        let proto = self.choose_proto(peer, total, false, cq_data.is_some(), || false);
        let now = self.txq.has_free_buf() && self.txq.waiting() == 0;
        if proto != Proto::Eager || !now || self.cfg.delivery_complete {
            return Ok(false);
        }
        let msg_id = self.next_msg_id(peer);
        let done = EagerSend { ctx, tag: 0, len: total as u32, peer, tagged: false };
        let buf = self.take_tx_buf(Owner::Eager(done)).expect("checked a free buffer");
        let hdr = self.emit_eager(buf, peer, msg_id, None, cq_data);
        let at = hdr + head_len;
        write_head(&mut self.dev.held_mut(buf)[hdr..at]);
        let n = src.len as usize;
        if n > 0 && self.gathers(at, n) {
            let data = DataSeg { mr: src.mr, offset: src.offset, len: n as u32 };
            self.push_packet(peer, PacketType::EagerMsgRtm, buf, at, Some(data));
        } else {
            if n > 0 {
                self.dev.copy_from_region(src.mr, src.offset as usize, buf, at, n);
            }
            self.push_packet(peer, PacketType::EagerMsgRtm, buf, at + n, None);
        }
        self.maybe_post();
        Ok(true)
    }

    /// Sends `data`, copied now, in one packet, with no completion.
    pub fn inject(&mut self, peer: PeerId, data: &[u8]) -> Result<(), Error> {
        self.inject_msg(peer, data, None)
    }

    /// Tagged inject.
    pub fn tinject(&mut self, peer: PeerId, data: &[u8], tag: u64) -> Result<(), Error> {
        self.inject_msg(peer, data, Some(tag))
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
        if let [one] = dst {
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

    /// Withdraws the earliest untagged receive posted with `ctx` that no
    /// message has matched yet (as `fi_cancel`, without a completion);
    /// returns whether there was one. Its buffer is the caller's again, to
    /// deregister or repost. A linear search: set-up and teardown work.
    pub fn cancel_recv(&mut self, ctx: u64) -> bool {
        match self.matcher.withdraw_untagged(&mut self.posted, |_, p| p.ctx == ctx) {
            Some(id) => {
                if let Some(Posted { dst, .. }) = self.posted.take(id) {
                    self.take_scattered(id, &dst);
                }
                true
            }
            None => false,
        }
    }

    pub(super) fn check_peer(&self, peer: PeerId) -> Result<(), Error> {
        if (peer.0 as usize) < self.peers.len() { Ok(()) } else { Err(Error::UnknownPeer) }
    }

    /// Whether RDMA read works between us and `peer` for a source in `src`
    /// (the receiver reads it, so it must grant remote read).
    pub(super) fn can_long_read(&self, peer: PeerId, src: &Span) -> bool {
        self.caps.rdma_read
            && self.peers.get(peer).is_some_and(|p| p.supports(extra::RDMA_READ))
            && self.mem.get(src.mr).is_some_and(|m| m.access.contains(Access::REMOTE_READ))
    }

    /// Whether RDMA read works between us and `peer` for a source in every
    /// span of `src`.
    fn can_long_read_all(&self, peer: PeerId, src: &Sgl) -> bool {
        src.segs().iter().all(|s| self.can_long_read(peer, s))
    }

    /// The protocol for a message of `len` bytes to `peer` now;
    /// `readable` says whether the peer can read its source by RDMA (asked
    /// only of a message long enough for it).
    #[inline(always)]
    fn choose_proto(
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
            let p = self.peers.get(peer).expect("live peer");
            let runt = self.cfg.runt_size.saturating_sub(p.runt_in_flight);
            if p.supports(extra::RUNTING_READ) && runt > 0 {
                Proto::RuntRead
            } else {
                Proto::LongRead
            }
        } else if len <= self.cfg.medium_max {
            Proto::Medium
        } else {
            Proto::LongCts
        }
    }

    /// Delivery complete needs the peer's support, known from its
    /// HANDSHAKE: ask for it (and retry) or refuse.
    pub(super) fn check_dc(&mut self, peer: PeerId) -> Result<(), Error> {
        let p = self.peers.get(peer).expect("checked peer");
        if !p.handshake_received {
            self.request_handshake(peer);
            return Err(Error::Again);
        }
        if p.supports(extra::DELIVERY_COMPLETE) { Ok(()) } else { Err(Error::NotSupported) }
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
            return self.send_msg_op(peer, src, None, proto, tag, cq_data, ctx);
        }
        // The packet is the whole operation; its TX buffer remembers what
        // to report.
        let msg_id = self.next_msg_id(peer);
        let done = EagerSend {
            ctx,
            tag: tag.unwrap_or(0),
            len: src.len as u32,
            peer,
            tagged: tag.is_some(),
        };
        let buf = self.take_tx_buf(Owner::Eager(done)).expect("checked a free buffer");
        let hdr = self.emit_eager(buf, peer, msg_id, tag, cq_data);
        let n = src.len as usize;
        let ptype = if tag.is_some() { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        if n > 0 && self.gathers(hdr, n) {
            let data = DataSeg { mr: src.mr, offset: src.offset, len: n as u32 };
            self.push_packet(peer, ptype, buf, hdr, Some(data));
        } else {
            if n > 0 {
                self.dev.copy_from_region(src.mr, src.offset as usize, buf, hdr, n);
            }
            self.push_packet(peer, ptype, buf, hdr + n, None);
        }
        self.maybe_post();
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
        ctx: u64,
    ) -> Result<(), Error> {
        if let [one] = srcs {
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
        let proto = self.choose_proto(peer, total, false, cq_data.is_some(), || {
            self.can_long_read_all(peer, &sgl)
        });
        let now = FAST_PATHS && self.txq.has_free_buf() && self.txq.waiting() == 0;
        if proto != Proto::Eager || !now || dc {
            return self.send_msg_op(peer, srcs[0], Some(&sgl), proto, None, cq_data, ctx);
        }
        let msg_id = self.next_msg_id(peer);
        let done = EagerSend { ctx, tag: 0, len: total as u32, peer, tagged: false };
        let buf = self.take_tx_buf(Owner::Eager(done)).expect("checked a free buffer");
        let hdr = self.emit_eager(buf, peer, msg_id, None, cq_data);
        let mut at = hdr;
        for s in sgl.segs() {
            let n = s.len as usize;
            if n > 0 {
                self.dev.copy_from_region(s.mr, s.offset as usize, buf, at, n);
            }
            at += n;
        }
        self.push_packet(peer, PacketType::EagerMsgRtm, buf, at, None);
        self.maybe_post();
        Ok(())
    }

    /// A message that needs an operation entry: a protocol other than
    /// eager, delivery complete, or no TX buffer now. Its source is `src`,
    /// or the spans of `srcv` when given.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn send_msg_op(
        &mut self,
        peer: PeerId,
        src: Span,
        srcv: Option<&Sgl>,
        proto: Proto,
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
        let (granted, awaiting_peer) = match proto {
            Proto::RuntRead => {
                let p = self.peers.get_mut(peer).expect("checked peer");
                let len = srcv.map_or(src.len, Sgl::len);
                let runt = self.cfg.runt_size.saturating_sub(p.runt_in_flight).min(len);
                p.runt_in_flight += runt;
                (runt, true)
            }
            Proto::LongRead => (0, true),
            _ => (0, dc),
        };
        let watch = awaiting_peer || proto == Proto::LongCts;
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
                op.granted = granted;
                op.awaiting_peer = awaiting_peer;
            })
            .expect("checked room");
        if watch {
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

    fn inject_msg(&mut self, peer: PeerId, data: &[u8], tag: Option<u64>) -> Result<(), Error> {
        self.check_peer(peer)?;
        if data.len() as u64 > self.max_eager_size(peer, tag.is_some()) {
            return Err(Error::TooLarge);
        }
        let Some(buf) = self.take_tx_buf(Owner::Ctrl) else { return Err(Error::Again) };
        let msg_id = self.next_msg_id(peer);
        let hdr = self.emit_eager(buf, peer, msg_id, tag, None);
        self.dev.held_mut(buf)[hdr..hdr + data.len()].copy_from_slice(data);
        let ptype = if tag.is_some() { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        self.push_packet(peer, ptype, buf, hdr + data.len(), None);
        self.maybe_post();
        Ok(())
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
            let op = self.rx_ops.get_mut(id).expect("live op");
            if FAST_PATHS && op.proto == Proto::Eager && !op.dc {
                // The whole message waits in one held packet, whose payload
                // offset was noted when it was held: land it and report it.
                let (held, total, tagged, tag, cq_data, peer) =
                    (op.held, op.total, op.tagged, op.tag, op.cq_data, op.peer);
                let buf = held.first().expect("its packet");
                let from = self.rx_meta[buf as usize].payload_off as usize;
                match sgl {
                    Some(sgl) => copy_in(&mut self.dev, buf, from, sgl, 0, total),
                    None => copy_in_span(&mut self.dev, buf, from, &dst, 0, total),
                }
                self.report_rx(Op::Recv, ctx, total, dst.len, tagged, tag, cq_data, peer);
                self.release_rx(buf);
                self.rx_ops.free(id);
                self.retry_stalled();
                return Ok(());
            }
            op.state = RxState::Matched;
            op.ctx = ctx;
            op.dst = sgl.copied().unwrap_or_else(|| Sgl::one(dst));
            self.deliver_held(id);
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

    /// Header prediction, as TCP's fast path: the packet a receiver sees
    /// most, an eager message from a known peer, is landed and reported in
    /// one pass when it is in its turn and a posted receive takes it, and
    /// held for its turn when it is ahead. Anything else answers false
    /// before any state changes, and the packet takes the full path
    /// (`handle_recv`'s parse, `accept_from`, `handle_req`,
    /// `handle_new_msg`), whose outcome for this packet would be the same:
    /// the suites check so with it off ([`super::types::FAST_PATHS`]).
    #[inline(always)]
    pub(super) fn recv_predicted(&mut self, buf: BufId, len: usize, src: Source) -> bool {
        let Source::Known(ah) = src else { return false };
        let Some(e) = EagerRtm::predict(&self.dev.held(buf)[..len]) else { return false };
        let Some(peer) = self.peers.by_ah(ah) else { return false };
        let p = self.peers.get(peer).expect("live peer");
        // A connid that is not the peer's, and our HANDSHAKE still owed,
        // are the full path's business.
        if !p.handshake_sent || e.connid.is_some_and(|c| c != p.addr.connid) {
            return false;
        }
        let in_turn = !self.cfg.ordered
            || (e.msg_id == p.expected_msg_id && p.reorder.as_ref().is_none_or(|r| r.held == 0));
        if in_turn {
            if !self.land_eager(buf, len, peer, &e) {
                return false;
            }
            if self.cfg.ordered {
                let p = self.peers.get_mut(peer).expect("live peer");
                p.expected_msg_id = p.expected_msg_id.wrapping_add(1);
            }
        } else if !self.hold_predicted(buf, len, peer, &e) {
            return false;
        }
        let ptype = if e.tagged { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        self.counters.rx_by_type[ptype.id() as usize] += 1;
        true
    }

    /// [`Endpoint::recv_predicted`]'s eager message that is ahead of its
    /// turn, held until then as `handle_req` would; false, with nothing
    /// changed, when it is not ahead within the reorder window.
    #[inline(never)]
    fn hold_predicted(&mut self, buf: BufId, len: usize, peer: PeerId, e: &EagerRtm) -> bool {
        let expected = self.peers.get(peer).expect("live peer").expected_msg_id;
        let ahead = e.msg_id.wrapping_sub(expected);
        if ahead == 0 || ahead >= self.cfg.reorder_window {
            return false;
        }
        let meta = &mut self.rx_meta[buf as usize];
        meta.len = len as u32;
        meta.peer = peer;
        meta.payload_off = e.payload_off as u32;
        self.hold_in_order(peer, e.msg_id, buf);
        self.counters.reordered += 1;
        true
    }

    /// Lands eager message `e` (in `len` bytes of `buf`, from `peer`) in
    /// the posted receive that takes it, reports it and frees the buffer;
    /// false, with nothing changed, when no posted receive takes it.
    #[inline(always)]
    pub(super) fn land_eager(
        &mut self,
        buf: BufId,
        len: usize,
        peer: PeerId,
        e: &EagerRtm,
    ) -> bool {
        let Some(pid) = self.matcher.take_posted(&mut self.posted, e.tagged, e.tag, peer) else {
            return false;
        };
        let Posted { ctx, dst, .. } = self.posted.take(pid).expect("live receive");
        let total = (len - e.payload_off) as u64;
        if dst.mr == SCATTERED {
            // Landed from where the spans wait, not taken out first.
            let spans = &mut self.scattered[super::slab::index(pid)];
            copy_in(&mut self.dev, buf, e.payload_off, spans, 0, total);
            spans.clear();
        } else {
            copy_in_span(&mut self.dev, buf, e.payload_off, &dst, 0, total);
        }
        self.report_rx(Op::Recv, ctx, total, dst.len, e.tagged, e.tag, e.cq_data, peer);
        self.release_rx(buf);
        true
    }

    /// An RTM whose turn has come: match it or keep it as unexpected.
    /// Returns false, leaving the packet to the caller, when there is no
    /// room to keep an unexpected message.
    pub(super) fn handle_new_msg(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        let Some((proto, tagged, dc)) = msg_proto(info.ptype) else {
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
        let Some(pid) = self.matcher.take_posted(&mut self.posted, tagged, info.tag, peer) else {
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
        let Posted { ctx, dst, .. } = self.posted.take(pid).expect("live receive");
        let sgl = (dst.mr == SCATTERED).then(|| self.take_scattered(pid, &dst));
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
        op.proto = proto;
        op.tagged = tagged;
        op.dc = dc;
        op.tag = info.tag;
        op.cq_data = info.cq_data;
        op.total = total;
        op.received = 0;
        op.send_id = RemoteId(info.send_id);
        op.granted = 0;
        if let Some(v) = read_iov {
            op.read_iov = v;
        }
        op.runt = match proto {
            Proto::RuntRead => info.runt_length,
            _ => 0,
        };
    }

    /// A later packet of a message in progress (a medium or runting-read
    /// segment).
    pub(super) fn handle_segment(&mut self, buf: BufId, id: RxId, info: &ReqInfo) {
        let Some(op) = self.rx_ops.get(id) else {
            self.counters.drop(DropReason::StaleId);
            self.release_rx(buf);
            return;
        };
        let consistent = msg_proto(info.ptype)
            .is_some_and(|(p, t, _)| p == op.proto && t == op.tagged)
            && info.msg_length == op.total;
        let limit = if op.proto == Proto::RuntRead { op.runt } else { op.total };
        let in_range =
            info.seg_offset.checked_add(info.payload_len as u64).is_some_and(|e| e <= limit);
        if !consistent || !in_range {
            self.counters.drop(if consistent {
                DropReason::SegmentOutOfRange
            } else {
                DropReason::Invalid
            });
            self.release_rx(buf);
            return;
        }
        if op.state == RxState::Unexpected {
            self.hold(id, buf);
            return;
        }
        let landed = self.land(id, buf, info.payload_off, info.payload_len, info.seg_offset);
        self.release_rx(buf);
        if landed {
            self.advance_rx(id);
        }
    }

    /// The long-CTS REQ a sender re-sends after our READ_NACK: the rest of
    /// the message comes by CTS flow control.
    pub(super) fn handle_nack_retry(&mut self, buf: BufId, id: RxId, info: &ReqInfo) {
        self.release_rx(buf);
        let Some(op) = self.rx_ops.get_mut(id) else { return };
        let retry_ok = matches!(op.proto, Proto::LongRead | Proto::RuntRead)
            && msg_proto(info.ptype).is_some_and(|(p, t, _)| p == Proto::LongCts && t == op.tagged)
            && info.payload_len == 0
            && info.msg_length == op.total;
        if !retry_ok {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        op.proto = Proto::LongCts;
        op.send_id = RemoteId(info.send_id);
        op.granted = 0;
        if op.state == RxState::Matched {
            self.advance_rx(id);
        }
    }

    /// Adds a packet to an unexpected message's chain.
    fn hold(&mut self, id: RxId, buf: BufId) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        self.rx_meta[buf as usize].next = op.held;
        op.held = Held::at(buf);
    }

    /// A receive was posted for an unexpected message: lands what it held.
    fn deliver_held(&mut self, id: RxId) {
        let mut next =
            std::mem::replace(&mut self.rx_ops.get_mut(id).expect("live op").held, Held::EMPTY);
        while let Some(buf) = next.first() {
            next = self.rx_meta[buf as usize].next;
            if let Some(r) = self.held_info(buf) {
                let seg = match msg_proto(r.ptype) {
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
    fn report_rx(
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
            Proto::LongRead | Proto::RuntRead
                if op.received >= op.runt && op.read_next == 0 && op.reads_in_flight == 0 =>
            {
                self.start_reads(id)
            }
            Proto::LongRead | Proto::RuntRead => {}
            _ if op.received >= op.total => self.finish_rx(id),
            Proto::LongCts => self.maybe_grant(id),
            _ => {}
        }
    }

    /// Grants the next window of a long-CTS receive once half the current
    /// one arrived, so the sender never idles waiting for a CTS.
    pub(super) fn maybe_grant(&mut self, id: RxId) {
        let window = self.cts_window_bytes(self.rx_ops.get(id).expect("live op").peer);
        let op = self.rx_ops.get_mut(id).expect("live op");
        if op.kind != RxKind::Read && op.granted == 0 {
            // What the REQ carried was granted by the protocol itself.
            op.granted = op.received;
        }
        // A read's CTS names the responder's operation, which its READRSP
        // tells; CTSDATA that overtook it must wait for it.
        let unknown_responder = op.kind == RxKind::Read && op.send_id == RemoteId::UNKNOWN;
        if op.granted >= op.total || op.received + window / 2 < op.granted || unknown_responder {
            return;
        }
        // Spec 3.2: recv_length > 0 always.
        let grant = window.min(op.total - op.granted);
        op.granted += grant;
        let read = op.kind == RxKind::Read;
        let cts =
            Ctrl::Cts { peer: op.peer, send_id: op.send_id, recv_id: id, recv_length: grant, read };
        self.queue_ctrl(cts);
        self.watch_rx(id);
    }

    /// Bytes one CTS grants to `peer`: the window in packets times what a
    /// CTSDATA packet carries.
    pub(super) fn cts_window_bytes(&self, peer: PeerId) -> u64 {
        let p = self.peers.get(peer).expect("live peer");
        let hdr = CtsDataRepr { connid: p.wants_connid().then_some(0), ..CtsDataRepr::default() }
            .buffer_len();
        self.cfg.cts_window as u64 * (self.caps.mtu - hdr) as u64
    }

    /// Reports a finished receive-side operation, answers its sender
    /// (RECEIPT, EOR) and frees it.
    pub(super) fn finish_rx(&mut self, id: RxId) {
        let Some(op) = self.rx_ops.get(id) else { return };
        let dst_len = op.dst.len();
        let (kind, proto, peer) = (op.kind, op.proto, op.peer);
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
            if op.kind == RxKind::Msg && op.proto != Proto::Eager {
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

    /// A CTS at the sender (or, flagged, at an emulated read's responder):
    /// more of a long-CTS transfer may go.
    pub(super) fn handle_cts(&mut self, peer: PeerId, cts: &CtsRepr) {
        let deadline = self.fresh_deadline();
        let send_id = TxId(cts.send_id);
        let Some(op) = self.tx_ops.get_mut(send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        let read = cts.flags.contains(CtsFlags::EMULATED_READ);
        let fits = match op.kind {
            TxKind::ReadRsp => read,
            TxKind::Msg | TxKind::Write => op.proto == Proto::LongCts && !read,
            _ => false,
        };
        if op.peer != peer || !fits || !op.req_built {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        // Spec 3.2: a CTS grants > 0 bytes; one granting past the end can
        // only be a duplicate.
        if cts.recv_length == 0 || op.granted >= op.total {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        op.recv_id = RemoteId(cts.recv_id);
        op.granted = op.granted.saturating_add(cts.recv_length).min(op.total);
        op.deadline = deadline;
        self.mark_ready(send_id);
    }

    /// CTSDATA (or READRSP, which also names the responder's operation)
    /// for receive-side operation `recv_id`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn handle_data(
        &mut self,
        buf: BufId,
        peer: PeerId,
        recv_id: RxId,
        seg_offset: u64,
        seg_length: u64,
        payload_off: u32,
        readrsp_send_id: Option<RemoteId>,
    ) {
        let Some(op) = self.rx_ops.get_mut(recv_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        // CTSDATA may overtake the READRSP of a read: both name our entry.
        let fits = match readrsp_send_id {
            Some(_) => op.kind == RxKind::Read,
            None => op.proto == Proto::LongCts,
        };
        if op.peer != peer || op.state != RxState::Matched || !fits {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        if seg_offset.checked_add(seg_length).is_none_or(|end| end > op.total) {
            self.counters.drop(DropReason::SegmentOutOfRange);
            return;
        }
        if let Some(send_id) = readrsp_send_id {
            // The responder's operation, which our CTS packets name.
            op.send_id = send_id;
        }
        if self.land(recv_id, buf, payload_off, seg_length as u32, seg_offset) {
            self.advance_rx(recv_id);
        }
    }
}

/// Bytes of a message that a list of at most `MAX_IOV` iovs covers.
pub(super) fn iov_total(iovs: &[crate::wire::RmaIov]) -> Option<u64> {
    debug_assert!(iovs.len() <= MAX_IOV);
    iovs.iter().try_fold(0u64, |acc, v| acc.checked_add(v.len))
}
