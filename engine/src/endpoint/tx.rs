//! The transmit side: packet buffers, control packets waiting for a
//! buffer, operations with packets due, and posting in bursts.
//!
//! Control packets the endpoint generates itself (HANDSHAKE, CTS, the
//! handshake trigger) are queued and built when a buffer is free: never
//! lost. Every built packet holds a TX buffer until the device completes
//! it; built packets the device did not take yet wait in `pending`.

use std::collections::VecDeque;

use super::cq::Status;
use super::ops::Proto;
use super::{DropReason, Endpoint};
use crate::device::{BufId, CqStatus, Cqe, Device, SendWr};
use crate::wire::{
    CtsDataRepr, CtsFlags, CtsRepr, HandshakeFlags, HandshakeRepr, PacketType, PktFlags, ReqLayout,
    ReqRepr, WireList, extra,
};

/// Sends posted to the device per call.
const POST_BURST: usize = 32;

/// A control packet to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ctrl {
    /// Our capabilities, answering a peer's first packet (spec 2.1).
    Handshake { peer: u32 },
    /// A zero-byte EAGER_RTW: makes the peer answer with its HANDSHAKE
    /// (libfabric: efa_rdm_ep_trigger_handshake).
    HandshakeTrigger { peer: u32 },
    /// Clear to send `recv_length` more bytes (spec 3.2).
    Cts { peer: u32, send_id: u32, recv_id: u32, recv_length: u64 },
}

/// Who a TX buffer's packet belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A control packet or an inject: nothing waits for it.
    Ctrl,
    /// A send operation's packet.
    Op(u32),
    /// An eager message built when it was sent: the whole operation, so
    /// that its completion needs no operation entry.
    Eager(EagerSend),
}

/// What an eager send reports when its packet completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EagerSend {
    pub(crate) ctx: u64,
    pub(crate) tag: u64,
    pub(crate) len: u32,
    pub(crate) peer: u32,
    pub(crate) tagged: bool,
}

#[derive(Debug)]
pub(crate) struct TxQueue {
    free: Vec<BufId>,
    owner: Vec<Owner>,
    /// Built packets the device has not taken yet: `pending[posted..]`.
    pending: Vec<SendWr>,
    posted: usize,
    ctrl: VecDeque<Ctrl>,
    /// Send operations with packets due, in the order they became due.
    ready: VecDeque<u32>,
}

impl TxQueue {
    /// TX buffers are ids `0..bufs`.
    pub(crate) fn new(bufs: u32, ops: usize) -> TxQueue {
        TxQueue {
            free: (0..bufs).rev().collect(),
            owner: vec![Owner::Ctrl; bufs as usize],
            pending: Vec::with_capacity(bufs as usize),
            posted: 0,
            ctrl: VecDeque::with_capacity(ops),
            ready: VecDeque::with_capacity(ops),
        }
    }

    pub(crate) fn has_free_buf(&self) -> bool {
        !self.free.is_empty()
    }

    /// Control packets and operations waiting for buffers.
    pub(crate) fn waiting(&self) -> usize {
        self.ctrl.len() + self.ready.len()
    }

    /// Built packets the device has not taken.
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len() - self.posted
    }
}

impl<D: Device> Endpoint<D> {
    /// Queues a control packet.
    pub(super) fn queue_ctrl(&mut self, c: Ctrl) {
        self.txq.ctrl.push_back(c);
    }

    /// Puts a send operation on the list of those with packets due.
    pub(super) fn mark_ready(&mut self, id: u32) {
        if let Some(op) = self.tx_ops.get_mut(id)
            && !op.queued
            && op.has_packet_due()
        {
            op.queued = true;
            self.txq.ready.push_back(id);
        }
    }

    /// Builds due packets while buffers last and posts them; returns
    /// whether anything was posted.
    pub(super) fn flush_tx(&mut self) -> bool {
        let mut posted = self.post_pending();
        if self.txq.pending_len() > 0 {
            // The device is full: building more would only pin buffers.
            return posted;
        }
        while self.txq.has_free_buf() {
            let built = match self.txq.ctrl.front().copied() {
                Some(c) => {
                    self.txq.ctrl.pop_front();
                    self.build_ctrl(c);
                    true
                }
                None => self.build_next_op_packet(),
            };
            if !built {
                break;
            }
            if self.txq.pending_len() >= POST_BURST {
                posted |= self.post_pending();
                if self.txq.pending_len() > 0 {
                    return posted;
                }
            }
        }
        posted | self.post_pending()
    }

    /// Posts pending packets in bursts; returns whether any was taken.
    fn post_pending(&mut self) -> bool {
        let q = &mut self.txq;
        let mut any = false;
        while q.posted < q.pending.len() {
            let burst = &q.pending[q.posted..q.pending.len().min(q.posted + POST_BURST)];
            let taken = self.dev.post_send(burst);
            any |= taken > 0;
            q.posted += taken;
            if taken < burst.len() {
                self.counters.tx_queued += 1;
                break;
            }
        }
        if q.posted == q.pending.len() {
            q.pending.clear();
            q.posted = 0;
        }
        any
    }

    /// Takes a free TX buffer for `owner`.
    #[inline]
    pub(super) fn take_tx_buf(&mut self, owner: Owner) -> Option<BufId> {
        let b = self.txq.free.pop()?;
        self.txq.owner[b as usize] = owner;
        Some(b)
    }

    /// Queues the packet in buffer `buf` for posting to `peer`.
    #[inline]
    pub(super) fn push_packet(&mut self, peer: u32, buf: BufId, len: usize) {
        let ah = self.peers.get(peer).expect("live peer").ah;
        let t = self.dev.buf(buf)[0];
        self.counters.tx_by_type[t as usize] += 1;
        self.txq.pending.push(SendWr { ah, buf, len: len as u32, data: None, wr_id: buf as u64 });
    }

    /// A send completed at the device: frees its buffer, advances its
    /// operation.
    pub(super) fn handle_send_done(&mut self, cqe: Cqe) {
        let buf = cqe.wr_id as BufId;
        let owner = self.txq.owner[buf as usize];
        self.txq.free.push(buf);
        if cqe.status != CqStatus::Ok {
            self.counters.drop(DropReason::DeviceError);
        }
        if let Owner::Eager(e) = owner {
            let mut c = super::Completion::new(super::Op::Send, e.ctx);
            c.len = e.len as u64;
            c.tag = e.tag;
            c.tagged = e.tagged;
            c.peer = Some(super::PeerId(e.peer));
            c.status = match cqe.status {
                CqStatus::Ok => Status::Ok,
                CqStatus::PeerUnreachable => Status::PeerUnreachable,
                _ => Status::DeviceError,
            };
            self.cq.push(c);
        } else if let Owner::Op(id) = owner {
            let Some(op) = self.tx_ops.get_mut(id) else { return };
            op.in_flight -= 1;
            if cqe.status != CqStatus::Ok && op.error.is_none() {
                op.error = Some(match cqe.status {
                    CqStatus::PeerUnreachable => Status::PeerUnreachable,
                    CqStatus::RemoteAccess => Status::RemoteAccess,
                    _ => Status::DeviceError,
                });
            }
            if op.is_done() {
                self.finish_tx_op(id);
            }
        }
    }

    /// Reports a finished send and frees it.
    pub(super) fn finish_tx_op(&mut self, id: u32) {
        let Some(op) = self.tx_ops.get(id) else { return };
        let mut c = super::Completion::new(super::Op::Send, op.ctx);
        c.len = op.total;
        c.tag = op.tag;
        c.tagged = op.tagged;
        c.peer = Some(super::PeerId(op.peer));
        c.status = op.error.unwrap_or(Status::Ok);
        self.cq.push(c);
        self.tx_ops.free(id);
    }

    /// The optional headers a REQ to `peer` carries now: our raw address
    /// until its HANDSHAKE arrives (spec 2.2), then our connid if it asked
    /// for it (spec 4.4).
    #[inline]
    pub(super) fn req_opt_headers(&self, peer: u32) -> (bool, Option<u32>) {
        let p = self.peers.get(peer).expect("live peer");
        if !p.handshake_received {
            (true, None)
        } else {
            (false, p.wants_connid().then_some(self.addr.connid))
        }
    }

    /// The connid field of a non-REQ packet to `peer`.
    #[inline]
    fn ctrl_connid(&self, peer: u32) -> Option<u32> {
        self.peers.get(peer).expect("live peer").wants_connid().then_some(self.addr.connid)
    }

    /// Bytes of header a REQ of `ptype` to `peer` takes now.
    #[inline]
    pub(super) fn req_header_len(&self, ptype: PacketType, peer: u32, cq_data: bool) -> usize {
        let fixed = ReqLayout::of(ptype).expect("REQ type").header_len();
        let opt = self.peers.get(peer).expect("live peer").req_opt_len as usize;
        fixed + opt + if cq_data { 8 } else { 0 }
    }

    fn build_ctrl(&mut self, c: Ctrl) {
        let buf = self.take_tx_buf(Owner::Ctrl).expect("caller checked a free buffer");
        let (peer, len) = match c {
            Ctrl::Handshake { peer } => {
                let mut flags = HandshakeFlags::empty();
                // Providers always send device_version; some receivers read
                // it without checking its flag (interop notes).
                let features = self.features();
                let words = [features];
                let repr = HandshakeRepr {
                    flags: flags.difference(HandshakeFlags::OPT_FIELDS),
                    extra_info: WireList::Host(&words),
                    connid: Some(self.addr.connid),
                    host_id: (self.cfg.host_id != 0).then_some(self.cfg.host_id),
                    device_version: Some(self.caps.device_version),
                    user_recv_qp: None,
                };
                flags = repr.wire_flags();
                debug_assert!(flags.contains(HandshakeFlags::CONNID_HDR));
                let len = repr.emit(self.dev.buf_mut(buf));
                self.counters.handshakes_sent += 1;
                (peer, len)
            }
            Ctrl::HandshakeTrigger { peer } => {
                let mut r = ReqRepr::new(PacketType::EagerRtw);
                let (raw, connid) = self.req_opt_headers(peer);
                let addr_hdr = self.addr_hdr;
                if raw {
                    r.raw_addr = Some(&addr_hdr);
                }
                r.connid = connid;
                (peer, r.emit(self.dev.buf_mut(buf)))
            }
            Ctrl::Cts { peer, send_id, recv_id, recv_length } => {
                let repr = CtsRepr {
                    flags: CtsFlags::empty(),
                    connid: self.ctrl_connid(peer),
                    send_id,
                    recv_id,
                    recv_length,
                };
                (peer, repr.emit(self.dev.buf_mut(buf)))
            }
        };
        self.push_packet(peer, buf, len);
    }

    /// Writes the REQ of type `ptype` for send operation `id` into `buf`;
    /// returns the header length and how much data follows it.
    #[inline(always)]
    fn emit_req(&mut self, buf: BufId, id: u32, ptype: PacketType) -> (usize, u64) {
        let op = self.tx_ops.get(id).expect("live op");
        let mut r = ReqRepr::new(ptype);
        r.msg_id = op.msg_id;
        r.tag = op.tag;
        r.msg_length = op.total;
        r.seg_offset = op.sent;
        r.send_id = id;
        r.credit_request = self.cfg.cts_window;
        r.cq_data = op.cq_data;
        let (total, sent) = (op.total, op.sent);
        let (raw, connid) = self.req_opt_headers(op.peer);
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        let room = (self.caps.mtu - r.buffer_len()) as u64;
        (r.emit(self.dev.buf_mut(buf)), (total - sent).min(room))
    }

    /// Writes an eager RTM header for `peer` into `buf`; returns its
    /// length.
    #[inline(always)]
    pub(super) fn emit_eager(
        &mut self,
        buf: BufId,
        peer: u32,
        msg_id: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
    ) -> usize {
        // One call per type, each with its type a constant, so that the
        // header's emit folds to its stores.
        match tag {
            Some(t) => self.emit_eager_as(PacketType::EagerTagRtm, buf, peer, msg_id, t, cq_data),
            None => self.emit_eager_as(PacketType::EagerMsgRtm, buf, peer, msg_id, 0, cq_data),
        }
    }

    #[inline(always)]
    fn emit_eager_as(
        &mut self,
        ptype: PacketType,
        buf: BufId,
        peer: u32,
        msg_id: u32,
        tag: u64,
        cq_data: Option<u64>,
    ) -> usize {
        let mut r = ReqRepr::new(ptype);
        r.msg_id = msg_id;
        r.tag = tag;
        r.cq_data = cq_data;
        let (raw, connid) = self.req_opt_headers(peer);
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        r.emit(self.dev.buf_mut(buf))
    }

    /// The extra features and requests this endpoint advertises: only what
    /// it implements end to end.
    pub(super) fn features(&self) -> u64 {
        extra::CONNID_HEADER
    }

    /// Builds the next packet of the first operation with one due; returns
    /// whether it built one.
    fn build_next_op_packet(&mut self) -> bool {
        while let Some(&id) = self.txq.ready.front() {
            let due = self.tx_ops.get(id).is_some_and(|op| op.has_packet_due());
            if !due {
                self.txq.ready.pop_front();
                if let Some(op) = self.tx_ops.get_mut(id) {
                    op.queued = false;
                }
                continue;
            }
            self.build_op_packet(id);
            let op = self.tx_ops.get_mut(id).expect("live op");
            if !op.has_packet_due() {
                op.queued = false;
                self.txq.ready.pop_front();
            }
            return true;
        }
        false
    }

    /// Builds one packet of send operation `id`: its REQ (with as much
    /// data as fits), then medium segments or CTSDATA.
    pub(super) fn build_op_packet(&mut self, id: u32) {
        let buf = self.take_tx_buf(Owner::Op(id)).expect("caller checked a free buffer");
        let op = self.tx_ops.get(id).expect("live op");
        let (peer, src, sent, first) = (op.peer, op.src, op.sent, !op.req_built);
        // One arm per REQ type, each with its type a constant, so that the
        // header's emit folds to its stores (see `ReqRepr::emit`).
        use PacketType as T;
        let (len, data_len) = match (op.proto, op.tagged, first) {
            (Proto::Eager, false, _) => self.emit_req(buf, id, T::EagerMsgRtm),
            (Proto::Eager, true, _) => self.emit_req(buf, id, T::EagerTagRtm),
            (Proto::Medium, false, _) => self.emit_req(buf, id, T::MediumMsgRtm),
            (Proto::Medium, true, _) => self.emit_req(buf, id, T::MediumTagRtm),
            (Proto::LongCts, false, true) => self.emit_req(buf, id, T::LongCtsMsgRtm),
            (Proto::LongCts, true, true) => self.emit_req(buf, id, T::LongCtsTagRtm),
            (Proto::LongCts, _, false) => {
                let mut d = CtsDataRepr {
                    flags: PktFlags::empty(),
                    recv_id: op.recv_id,
                    seg_length: 0,
                    seg_offset: sent,
                    connid: self.ctrl_connid(peer),
                };
                let room = (self.caps.mtu - d.buffer_len()) as u64;
                d.seg_length = (op.granted - sent).min(room);
                (d.emit(self.dev.buf_mut(buf)), d.seg_length)
            }
        };
        if data_len > 0 {
            let (pkt, region) = self.dev.buf_and_region(buf, src.mr);
            let from = (src.offset + sent) as usize;
            pkt[len..len + data_len as usize]
                .copy_from_slice(&region[from..from + data_len as usize]);
        }
        let op = self.tx_ops.get_mut(id).expect("live op");
        if !op.req_built && op.proto == Proto::LongCts {
            // What the RTM carries is granted by the protocol itself; CTS
            // grants count from there.
            op.granted = data_len;
        }
        op.req_built = true;
        op.sent += data_len;
        op.in_flight += 1;
        self.push_packet(peer, buf, len + data_len as usize);
        let peer = self.peers.get_mut(peer).expect("live peer");
        peer.req_sent = true;
    }
}
