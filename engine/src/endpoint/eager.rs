//! Eager messages (spec 3.2; EAGER_MSGRTM, EAGER_TAGRTM, and the DC_
//! types with delivery complete): a message in one packet. The common
//! case has paths of its own at both ends: sent without an operation
//! entry, its TX buffer remembering what to report; received by header
//! prediction and landed in its posted receive in one pass, or held for
//! its turn. What eager messages share with the other protocols
//! (matching, unexpected messages, delivery complete) is in `msg`.

use super::cq::Op;
use super::msg::{SCATTERED, copy_in, copy_in_span};
use super::ops::{Posted, Proto, Sgl};
use super::types::{BufId, EagerSend, FAST_PATHS, Held, Owner, RxId};
use super::{Endpoint, Error, PeerId, Span};
use crate::device::{DataSeg, Device, HeldBufs, Source};
use crate::wire::{EagerRtm, PacketType, ReqRepr};

/// Writes a message's head into its packet, ahead of the data
/// ([`Endpoint::send_inline_head_with`], [`Endpoint::inject_head_with`]):
/// any `FnOnce(&mut [u8])` (its argument's type written out: `|b: &mut
/// [u8]| ...`), or a framing layer's header type, which implements it
/// itself so that its write is inlined into the send: a closure called
/// once per message in a long send path is left out of line (a call, and
/// the header's length worked out twice).
pub trait WriteHead {
    /// Writes the head into `into`, exactly the length the send was told.
    fn write_head(self, into: &mut [u8]);
}

impl<F: FnOnce(&mut [u8])> WriteHead for F {
    #[inline(always)]
    fn write_head(self, into: &mut [u8]) {
        self(into)
    }
}

impl<D: Device> Endpoint<D> {
    /// An eager message sent at once (`send_msg`'s common case): the
    /// packet is the whole operation, its TX buffer remembering what to
    /// report. The caller checked a TX buffer is free and nothing waits.
    #[inline(always)]
    pub(super) fn send_eager_now(
        &mut self,
        peer: PeerId,
        src: Span,
        tag: Option<u64>,
        cq_data: Option<u64>,
        ctx: u64,
    ) {
        let done = EagerSend {
            ctx,
            tag: tag.unwrap_or(0),
            len: src.len as u32,
            peer,
            tagged: tag.is_some(),
        };
        let (buf, hdr) = self.begin_eager(peer, Owner::Eager(done), tag, cq_data);
        let ptype = if tag.is_some() { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        self.finish_eager(peer, ptype, buf, hdr, src);
    }

    /// Takes a TX buffer for an eager message to `peer`, owned by `owner`
    /// (the caller checked one is free) and writes its header; returns
    /// the buffer and the header's length.
    #[inline(always)]
    fn begin_eager(
        &mut self,
        peer: PeerId,
        owner: Owner,
        tag: Option<u64>,
        cq_data: Option<u64>,
    ) -> (BufId, usize) {
        let msg_id = self.next_msg_id(peer);
        let buf = self.take_tx_buf(owner).expect("checked a free buffer");
        (buf, self.emit_eager(buf, peer, msg_id, tag, cq_data))
    }

    /// [`Self::begin_eager`] of an untagged message, and the packet: what
    /// follows the header is written in the same look-up of the buffer.
    /// (Not what `begin_eager` calls: its callers' code moves by a few
    /// instructions if it is.)
    #[inline(always)]
    fn begin_untagged_in(
        &mut self,
        peer: PeerId,
        owner: Owner,
        cq_data: Option<u64>,
    ) -> (BufId, usize, &mut [u8]) {
        let msg_id = self.next_msg_id(peer);
        let buf = self.take_tx_buf(owner).expect("checked a free buffer");
        let (hdr, pkt) = self.emit_eager_as(buf, peer, msg_id, None, cq_data);
        (buf, hdr, pkt)
    }

    /// Puts `src` behind the first `at` bytes of eager packet `buf`, as a
    /// gather element or copied (see `gathers`), and queues the packet.
    #[inline(always)]
    fn finish_eager(&mut self, peer: PeerId, ptype: PacketType, buf: BufId, at: usize, src: Span) {
        self.finish_eager_as(peer, ptype, buf, at, src, false)
    }

    /// [`Self::finish_eager`], `src` copied into the packet when `copy`
    /// (its memory is then the sender's again at once).
    #[inline(always)]
    fn finish_eager_as(
        &mut self,
        peer: PeerId,
        ptype: PacketType,
        buf: BufId,
        at: usize,
        src: Span,
        copy: bool,
    ) {
        let n = src.len as usize;
        if n > 0 && !copy && self.gathers(at, n) {
            let data = DataSeg { mr: src.mr, offset: src.offset, len: n as u32 };
            self.push_packet(peer, ptype, buf, at, Some(data));
        } else {
            if n > 0 {
                self.dev.copy_from_region(src.mr, src.offset as usize, buf, at, n);
            }
            self.push_packet(peer, ptype, buf, at + n, None);
        }
        self.maybe_post();
    }

    /// [`Endpoint::send_eager_now`] of a message gathered from `sgl`
    /// (`total` bytes), each span copied into the packet.
    pub(super) fn send_eager_now_v(
        &mut self,
        peer: PeerId,
        sgl: &Sgl,
        total: u64,
        cq_data: Option<u64>,
        ctx: u64,
    ) {
        let done = EagerSend { ctx, tag: 0, len: total as u32, peer, tagged: false };
        let (buf, hdr) = self.begin_eager(peer, Owner::Eager(done), None, cq_data);
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
    }

    /// A receive posted for unexpected eager message `id` (no delivery
    /// complete): the whole message waits in one held packet, whose
    /// payload offset was noted when it was held; lands it in `dst` (or
    /// `sgl`'s spans) and reports it, with no step through the entry.
    #[inline(always)]
    pub(super) fn land_unexpected_eager(
        &mut self,
        id: RxId,
        dst: Span,
        sgl: Option<&Sgl>,
        ctx: u64,
    ) {
        let op = self.rx_ops.get(id).expect("live op");
        let (held, total, tagged, tag, cq_data, peer) =
            (op.held, op.total, op.tagged, op.tag, op.cq_data, op.peer);
        let buf = held.first().expect("its packet");
        let from = self.rx_meta[buf.index()].payload_off as usize;
        match sgl {
            Some(sgl) => copy_in(&mut self.dev, buf, from, sgl, 0, total),
            None => copy_in_span(&mut self.dev, buf, from, &dst, 0, total),
        }
        self.report_rx(Op::Recv, ctx, total, dst.len, tagged, tag, cq_data, peer);
        self.release_rx(buf);
        self.rx_ops.free(id);
        self.retry_stalled();
    }

    /// Sends `head`, copied now, followed by `src` as one message (with
    /// CQ data when given), if that goes in one packet at once: true, and
    /// it completes with `ctx` as a send does. False, with nothing sent,
    /// when it would not (too long, no packet buffer free now, delivery
    /// complete; in a test build with the `general-paths` feature,
    /// always): then send the head from registered memory with
    /// [`Endpoint::sendv`], the general path this one saves a copy on. For
    /// a protocol framed on top of messages whose header is built per
    /// message: no copy of it into registered memory first.
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
        write_head: impl WriteHead,
        src: Span,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<bool, Error> {
        self.send_head(peer, head_len, write_head, src, cq_data, ctx, false)
    }

    /// [`Endpoint::send_inline_head_with`] as an inject: `src` is copied
    /// into the packet, so its memory is the caller's again on return, and
    /// the send completes with no completion unless it fails (then one
    /// with `ctx` and the failure, as `fi_inject`'s errors are reported).
    /// For a protocol whose sender owes its caller nothing once the bytes
    /// are copied: a small message framed on top of messages, its header
    /// and its data in one packet.
    #[inline]
    pub fn inject_head_with(
        &mut self,
        peer: PeerId,
        head_len: usize,
        write_head: impl WriteHead,
        src: Span,
        ctx: u64,
    ) -> Result<bool, Error> {
        self.send_head(peer, head_len, write_head, src, None, ctx, true)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn send_head(
        &mut self,
        peer: PeerId,
        head_len: usize,
        write_head: impl WriteHead,
        src: Span,
        cq_data: Option<u64>,
        ctx: u64,
        quiet: bool,
    ) -> Result<bool, Error> {
        self.check_peer(peer)?;
        self.check_span(&src)?;
        let total = head_len as u64 + src.len;
        // The eager size: a read is never chosen below it.
        let proto = self.choose_proto(peer, total, false, cq_data.is_some(), || false);
        let now = FAST_PATHS && self.txq.has_free_buf() && self.txq.waiting() == 0;
        if proto != Proto::Eager || !now || self.cfg.delivery_complete {
            return Ok(false);
        }
        let done = EagerSend { ctx, tag: 0, len: total as u32, peer, tagged: false };
        let owner = if quiet { Owner::Inject(done) } else { Owner::Eager(done) };
        let (buf, hdr, pkt) = self.begin_untagged_in(peer, owner, cq_data);
        let at = hdr + head_len;
        write_head.write_head(&mut pkt[hdr..at]);
        self.finish_eager_as(peer, PacketType::EagerMsgRtm, buf, at, src, quiet);
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
        let meta = &mut self.rx_meta[buf.index()];
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
        let (ctx, dst, pid) = match self.ring_for(e.tagged, peer) {
            Some(ring) => {
                if e.cq_data.is_none() {
                    // Marked in its slot, with no completion queued.
                    let len = (len - e.payload_off) as u64;
                    match self.ring_land_eager(ring, buf, e.payload_off, len) {
                        Some(true) => {
                            self.release_rx(buf);
                            return true;
                        }
                        Some(false) => {}
                        None => return false,
                    }
                }
                let Some((ctx, dst)) = self.ring_slot(ring) else { return false };
                (ctx, dst, None)
            }
            None => {
                let taken = self.matcher.take_posted(&mut self.posted, e.tagged, e.tag, peer);
                let Some(pid) = taken else { return false };
                let Posted { ctx, dst, .. } = self.take_matched(pid);
                (ctx, dst, Some(pid))
            }
        };
        let total = (len - e.payload_off) as u64;
        if let Some(pid) = pid
            && dst.mr == SCATTERED
        {
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

    /// Writes an eager RTM header for `peer` into `buf`; returns its
    /// length.
    #[inline(always)]
    pub(super) fn emit_eager(
        &mut self,
        buf: BufId,
        peer: PeerId,
        msg_id: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
    ) -> usize {
        // One call per type, each with its tag's presence a constant, so
        // that the header's emit folds to its stores.
        match tag {
            Some(t) => self.emit_eager_as(buf, peer, msg_id, Some(t), cq_data).0,
            None => self.emit_eager_as(buf, peer, msg_id, None, cq_data).0,
        }
    }

    /// Writes an eager RTM header, tagged with `tag` if any; returns its
    /// length, and the packet for what follows it. Once the peer's
    /// HANDSHAKE is in (no raw address header) by [`EagerRtm::emit`]: the
    /// general emit folds to its stores only where the type is a constant,
    /// and an application's loop that posts sends of both types (the apps'
    /// `post`) left it building the whole REQ on the stack and dispatching
    /// on its type: some 45 instructions a message more (a 64 B stream's
    /// sender on sim).
    #[inline(always)]
    fn emit_eager_as(
        &mut self,
        buf: BufId,
        peer: PeerId,
        msg_id: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
    ) -> (usize, &mut [u8]) {
        let (raw, connid) = self.req_opt_headers(peer);
        if !raw {
            let pkt = self.dev.held_mut(buf);
            return (EagerRtm::emit(pkt, msg_id, tag, cq_data, connid), pkt);
        }
        let ptype = if tag.is_some() { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        let mut r = ReqRepr::new(ptype);
        r.msg_id = msg_id;
        r.tag = tag.unwrap_or(0);
        r.cq_data = cq_data;
        r.raw_addr = Some(&self.addr_hdr);
        r.connid = connid;
        let pkt = self.dev.held_mut(buf);
        (r.emit(pkt), pkt)
    }

    /// The held packet whose turn came, landed without its full parse
    /// when it is an eager message alone in its slot that a posted receive
    /// takes (see `recv_predicted`); false, with nothing changed,
    /// otherwise.
    #[inline]
    pub(super) fn drain_predicted(&mut self, peer: PeerId, slot: usize, head: BufId) -> bool {
        let meta = self.rx_meta[head.index()];
        if !meta.next.is_empty() {
            return false;
        }
        let len = meta.len as usize;
        let Some(e) = EagerRtm::predict(&self.dev.held(head)[..len]) else { return false };
        if !self.land_eager(head, len, peer, &e) {
            return false;
        }
        let p = self.peers.get_mut(peer).expect("live peer");
        p.expected_msg_id = p.expected_msg_id.wrapping_add(1);
        let rb = p.reorder.as_mut().expect("reorder buffer");
        rb.slots[slot] = Held::EMPTY;
        rb.held -= 1;
        true
    }
}
