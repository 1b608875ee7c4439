//! Two-sided messages (spec 3.2): send/recv, tagged or not, with the
//! eager, medium and long-CTS protocols, unexpected messages, truncation.

use super::cq::{Completion, Op, Status};
use super::ops::{Proto, RxOp, RxState, TxOp};
use super::rx::ReqInfo;
use super::tx::{Ctrl, EagerSend, Owner};
use super::{DropReason, Endpoint, Error, NO_BUF, PeerId, Span, TagMatch};
use crate::device::{BufId, Device};
use crate::wire::{CtsDataRepr, CtsRepr, PacketType};

/// What an arriving message is, by its REQ type.
fn msg_proto(ptype: PacketType) -> Option<(Proto, bool)> {
    use PacketType::*;
    Some(match ptype {
        EagerMsgRtm => (Proto::Eager, false),
        EagerTagRtm => (Proto::Eager, true),
        MediumMsgRtm => (Proto::Medium, false),
        MediumTagRtm => (Proto::Medium, true),
        LongCtsMsgRtm => (Proto::LongCts, false),
        LongCtsTagRtm => (Proto::LongCts, true),
        _ => return None,
    })
}

impl<D: Device> Endpoint<D> {
    /// Sends `src` to `peer`; completes with `ctx` once the data left.
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
        self.post_recv_op(dst, None, from, ctx)
    }

    /// Posts a receive for the next tagged message whose tag matches.
    pub fn trecv(
        &mut self,
        dst: Span,
        tag: TagMatch,
        from: Option<PeerId>,
        ctx: u64,
    ) -> Result<(), Error> {
        self.post_recv_op(dst, Some(tag), from, ctx)
    }

    fn check_peer(&self, peer: PeerId) -> Result<(), Error> {
        if (peer.0 as usize) < self.peers.len() { Ok(()) } else { Err(Error::UnknownPeer) }
    }

    /// The protocol for a message of `len` bytes to `peer` now.
    fn choose_proto(&self, peer: u32, len: u64, tagged: bool, cq_data: bool) -> Proto {
        let ptype = if tagged { PacketType::EagerTagRtm } else { PacketType::EagerMsgRtm };
        let room = (self.caps.mtu - self.req_header_len(ptype, peer, cq_data)) as u64;
        let eager_max = self.cfg.eager_max.map_or(room, |m| m.min(room));
        if len <= eager_max {
            Proto::Eager
        } else if len <= self.cfg.medium_max {
            Proto::Medium
        } else {
            Proto::LongCts
        }
    }

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
        let proto = self.choose_proto(peer.0, src.len, tag.is_some(), cq_data.is_some());
        // Fast path: an eager message whose packet can be built now is the
        // whole operation; its TX buffer remembers what to report.
        let now = self.txq.has_free_buf() && !self.txq_busy();
        if proto == Proto::Eager && now {
            let msg_id = self.next_msg_id(peer.0);
            let done = EagerSend {
                ctx,
                tag: tag.unwrap_or(0),
                len: src.len as u32,
                peer: peer.0,
                tagged: tag.is_some(),
            };
            let buf = self.take_tx_buf(Owner::Eager(done)).expect("checked a free buffer");
            let hdr = self.emit_eager(buf, peer.0, msg_id, tag, cq_data);
            let n = src.len as usize;
            if n > 0 {
                let (pkt, region) = self.dev.buf_and_region(buf, src.mr);
                let from = src.offset as usize;
                pkt[hdr..hdr + n].copy_from_slice(&region[from..from + n]);
            }
            self.push_packet(peer.0, buf, hdr + n);
            self.maybe_post();
            return Ok(());
        }
        if self.tx_ops.is_full() {
            return Err(Error::Again);
        }
        let msg_id = self.next_msg_id(peer.0);
        let op = TxOp {
            peer: peer.0,
            proto,
            tagged: tag.is_some(),
            tag: tag.unwrap_or(0),
            cq_data,
            ctx,
            src,
            msg_id,
            total: src.len,
            sent: 0,
            granted: 0,
            recv_id: 0,
            req_built: false,
            in_flight: 0,
            queued: false,
            error: None,
        };
        let id = self.tx_ops.insert(op).expect("checked room");
        if now {
            self.build_op_packet(id);
        }
        self.mark_ready(id);
        self.maybe_post();
        Ok(())
    }

    /// Takes the next msg_id to `peer`; a REQ goes out to it.
    #[inline]
    fn next_msg_id(&mut self, peer: u32) -> u32 {
        let p = self.peers.get_mut(peer).expect("checked peer");
        let msg_id = p.next_msg_id;
        p.next_msg_id = msg_id.wrapping_add(1);
        p.req_sent = true;
        msg_id
    }

    /// Whether control packets or other operations wait for buffers.
    fn txq_busy(&self) -> bool {
        self.txq.waiting() > 0
    }

    fn inject_msg(&mut self, peer: PeerId, data: &[u8], tag: Option<u64>) -> Result<(), Error> {
        self.check_peer(peer)?;
        if data.len() as u64 > self.max_eager_size(peer, tag.is_some()) {
            return Err(Error::TooLarge);
        }
        let Some(buf) = self.take_tx_buf(Owner::Ctrl) else { return Err(Error::Again) };
        let msg_id = self.next_msg_id(peer.0);
        let hdr = self.emit_eager(buf, peer.0, msg_id, tag, None);
        self.dev.buf_mut(buf)[hdr..hdr + data.len()].copy_from_slice(data);
        self.push_packet(peer.0, buf, hdr + data.len());
        self.maybe_post();
        Ok(())
    }

    fn post_recv_op(
        &mut self,
        dst: Span,
        tag: Option<TagMatch>,
        from: Option<PeerId>,
        ctx: u64,
    ) -> Result<(), Error> {
        self.check_span(&dst)?;
        if let Some(p) = from {
            self.check_peer(p)?;
        }
        let tagged = tag.is_some();
        let TagMatch { tag: want_tag, ignore } = tag.unwrap_or(TagMatch { tag: 0, ignore: 0 });
        let want_peer = from.map(|p| p.0);
        if let Some(id) =
            self.matcher.take_unexpected(&mut self.rx_ops, tagged, want_tag, ignore, want_peer)
        {
            let op = self.rx_ops.get_mut(id).expect("live op");
            op.state = RxState::Matched;
            op.ctx = ctx;
            op.dst = Some(dst);
            self.deliver_held(id);
            return Ok(());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let op = RxOp {
            state: RxState::Posted,
            tagged,
            ctx,
            dst: Some(dst),
            want_tag,
            ignore,
            want_peer,
            seq,
            peer: 0,
            msg_id: 0,
            proto: Proto::Eager,
            tag: 0,
            cq_data: None,
            total: 0,
            received: 0,
            send_id: 0,
            granted: 0,
            held: NO_BUF,
            prev: 0,
            next: 0,
        };
        let id = self.rx_ops.insert(op).ok_or(Error::Again)?;
        self.matcher.post(&mut self.rx_ops, id);
        self.retry_stalled();
        Ok(())
    }

    /// An RTM whose turn has come: match it or keep it as unexpected.
    /// Returns false, leaving the packet to the caller, when there is no
    /// room to keep an unexpected message.
    pub(super) fn handle_new_msg(&mut self, buf: BufId, peer: u32, info: &ReqInfo) -> bool {
        let Some((proto, tagged)) = msg_proto(info.ptype) else {
            // RTAs and the RDMA-read based protocols arrive with the
            // one-sided features.
            self.counters.drop(DropReason::Unsupported);
            self.release_rx(buf);
            return true;
        };
        let total = match proto {
            Proto::Eager => info.payload_len as u64,
            Proto::Medium | Proto::LongCts => info.msg_length,
        };
        let seg_offset = if proto == Proto::Medium { info.seg_offset } else { 0 };
        if seg_offset.checked_add(info.payload_len as u64).is_none_or(|end| end > total) {
            self.counters.drop(DropReason::SegmentOutOfRange);
            self.release_rx(buf);
            return true;
        }
        let matched = self.matcher.take_posted(&mut self.rx_ops, tagged, info.tag, peer);
        let id = match matched {
            Some(id) => id,
            None => {
                let op = RxOp {
                    state: RxState::Unexpected,
                    tagged,
                    ctx: 0,
                    dst: None,
                    want_tag: 0,
                    ignore: 0,
                    want_peer: None,
                    seq: 0,
                    peer,
                    msg_id: info.msg_id,
                    proto,
                    tag: info.tag,
                    cq_data: info.cq_data,
                    total,
                    received: 0,
                    send_id: info.send_id,
                    granted: 0,
                    held: NO_BUF,
                    prev: 0,
                    next: 0,
                };
                let Some(id) = self.rx_ops.insert(op) else {
                    // No room even for an unexpected message: the packet
                    // waits (holding its buffer) until receives are posted.
                    self.counters.rx_ops_exhausted += 1;
                    return false;
                };
                self.counters.unexpected += 1;
                self.matcher.push_unexpected(&mut self.rx_ops, id);
                self.hold(id, buf);
                if proto != Proto::Eager && (info.payload_len as u64) < total {
                    self.in_progress.insert(peer, info.msg_id, id);
                }
                return true;
            }
        };
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.state = RxState::Matched;
        op.peer = peer;
        op.msg_id = info.msg_id;
        op.proto = proto;
        op.tag = info.tag;
        op.cq_data = info.cq_data;
        op.total = total;
        op.received = 0;
        op.send_id = info.send_id;
        op.granted = 0;
        if proto != Proto::Eager && (info.payload_len as u64) < total {
            self.in_progress.insert(peer, info.msg_id, id);
        }
        self.land(id, buf, info.payload_off, info.payload_len, seg_offset);
        self.release_rx(buf);
        self.advance_rx(id);
        true
    }

    /// A later packet of a message in progress (a medium segment).
    pub(super) fn handle_segment(&mut self, buf: BufId, id: u32, info: &ReqInfo) {
        let Some(op) = self.rx_ops.get(id) else {
            self.counters.drop(DropReason::StaleId);
            self.release_rx(buf);
            return;
        };
        let consistent = op.proto == Proto::Medium
            && msg_proto(info.ptype) == Some((Proto::Medium, op.tagged))
            && info.msg_length == op.total;
        let in_range =
            info.seg_offset.checked_add(info.payload_len as u64).is_some_and(|e| e <= op.total);
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
        self.land(id, buf, info.payload_off, info.payload_len, info.seg_offset);
        self.release_rx(buf);
        self.advance_rx(id);
    }

    /// Adds a packet to an unexpected message's chain.
    fn hold(&mut self, id: u32, buf: BufId) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        self.rx_meta[buf as usize].next = op.held;
        op.held = buf;
    }

    /// A receive was posted for an unexpected message: lands what it held.
    fn deliver_held(&mut self, id: u32) {
        let mut buf =
            std::mem::replace(&mut self.rx_ops.get_mut(id).expect("live op").held, NO_BUF);
        let mut any = false;
        while buf != NO_BUF {
            let next = self.rx_meta[buf as usize].next;
            let len = self.rx_meta[buf as usize].len as usize;
            if let Ok(r) = ReqInfo::parse(&self.dev.buf(buf)[..len]) {
                let seg = if msg_proto(r.ptype).is_some_and(|(p, _)| p == Proto::Medium) {
                    r.seg_offset
                } else {
                    0
                };
                self.land(id, buf, r.payload_off, r.payload_len, seg);
                any = true;
            }
            self.release_rx(buf);
            buf = next;
        }
        debug_assert!(any, "an unexpected message holds its REQ");
        self.advance_rx(id);
    }

    /// Copies a packet's data into the receive's buffer at `seg_offset`;
    /// bytes beyond the buffer are counted but dropped (truncation).
    fn land(&mut self, id: u32, buf: BufId, off: u32, len: u32, seg_offset: u64) {
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.received += len as u64;
        let dst = op.dst.expect("matched receive has a buffer");
        if seg_offset >= dst.len || len == 0 {
            return;
        }
        let n = (len as u64).min(dst.len - seg_offset) as usize;
        let at = (dst.offset + seg_offset) as usize;
        let (pkt, region) = self.dev.buf_and_region(buf, dst.mr);
        region[at..at + n].copy_from_slice(&pkt[off as usize..off as usize + n]);
    }

    /// After data landed: complete the receive, or grant more (long-CTS).
    fn advance_rx(&mut self, id: u32) {
        let op = self.rx_ops.get(id).expect("live op");
        if op.received >= op.total {
            self.finish_rx(id);
            return;
        }
        if op.proto == Proto::LongCts {
            self.maybe_grant(id);
        }
    }

    /// Grants the next window of a long-CTS receive once half the current
    /// one arrived, so the sender never idles waiting for a CTS.
    fn maybe_grant(&mut self, id: u32) {
        let window = self.cts_window_bytes(self.rx_ops.get(id).expect("live op").peer);
        let op = self.rx_ops.get_mut(id).expect("live op");
        if op.granted == 0 {
            // What the RTM carried was granted implicitly.
            op.granted = op.received;
        }
        if op.granted >= op.total || op.received + window / 2 < op.granted {
            return;
        }
        // Spec 3.2: recv_length > 0 always.
        let grant = window.min(op.total - op.granted);
        op.granted += grant;
        let cts = Ctrl::Cts { peer: op.peer, send_id: op.send_id, recv_id: id, recv_length: grant };
        self.queue_ctrl(cts);
    }

    /// Bytes one CTS grants to `peer`: the window in packets times what a
    /// CTSDATA packet carries.
    fn cts_window_bytes(&self, peer: u32) -> u64 {
        let p = self.peers.get(peer).expect("live peer");
        let hdr = CtsDataRepr { connid: p.wants_connid().then_some(0), ..CtsDataRepr::default() }
            .buffer_len();
        self.cfg.cts_window as u64 * (self.caps.mtu - hdr) as u64
    }

    /// Reports a finished receive and frees it.
    fn finish_rx(&mut self, id: u32) {
        let Some(op) = self.rx_ops.get(id) else { return };
        if op.proto != Proto::Eager {
            self.in_progress.remove(op.peer, op.msg_id);
        }
        let dst_len = op.dst.map_or(0, |d| d.len);
        let mut c = Completion::new(Op::Recv, op.ctx);
        c.len = op.total.min(dst_len);
        c.status =
            if op.total > dst_len { Status::Truncated { olen: op.total } } else { Status::Ok };
        c.tag = op.tag;
        c.tagged = op.tagged;
        c.cq_data = op.cq_data;
        c.peer = Some(PeerId(op.peer));
        self.cq.push(c);
        self.rx_ops.free(id);
        self.retry_stalled();
    }

    /// A CTS at the sender: more of a long-CTS message may go.
    pub(super) fn handle_cts(&mut self, peer: u32, cts: &CtsRepr) {
        let Some(op) = self.tx_ops.get_mut(cts.send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        if op.peer != peer || op.proto != Proto::LongCts || !op.req_built {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        // Spec 3.2: a CTS grants > 0 bytes; one granting past the end can
        // only be a duplicate.
        if cts.recv_length == 0 || op.granted >= op.total {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        op.recv_id = cts.recv_id;
        op.granted = op.granted.saturating_add(cts.recv_length).min(op.total);
        self.mark_ready(cts.send_id);
    }

    /// CTSDATA at the receiver.
    pub(super) fn handle_ctsdata(
        &mut self,
        buf: BufId,
        peer: u32,
        d: &CtsDataRepr,
        payload_off: u32,
    ) {
        let Some(op) = self.rx_ops.get(d.recv_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        if op.peer != peer || op.state != RxState::Matched || op.proto != Proto::LongCts {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        if d.seg_offset.checked_add(d.seg_length).is_none_or(|end| end > op.total) {
            self.counters.drop(DropReason::SegmentOutOfRange);
            return;
        }
        self.land(d.recv_id, buf, payload_off, d.seg_length as u32, d.seg_offset);
        self.advance_rx(d.recv_id);
    }

    /// Posts built packets once a burst's worth is waiting.
    fn maybe_post(&mut self) {
        if self.txq.pending_len() >= 32 {
            self.flush_tx();
        }
    }
}
