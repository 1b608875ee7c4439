//! The transmit side: packet buffers, control packets waiting for a
//! buffer, operations with packets due, and posting in bursts.
//!
//! Control packets the endpoint generates itself (HANDSHAKE, CTS, EOR,
//! RECEIPT, READ_NACK, RTR, the handshake trigger) are queued and built
//! when a buffer is free: never lost. Every built packet holds a TX buffer
//! until the device completes it; built packets the device did not take
//! yet wait in `pending`.

use std::collections::VecDeque;

use super::cq::{Completion, Op, Status};
use super::dispatch::req_type;
use super::ops::{MAX_IOV, Proto, Sgl, TxKind, TxPhase, TxProto};
use super::types::{BufId, Ctrl, Owner, RxId, TxId};
use super::{DropReason, Endpoint, PeerId};
use crate::device::{CqStatus, Cqe, DataSeg, Device, HeldBufs, MrId, SendWr};
use crate::wire::{IovList, PacketType, ReqFlags, ReqLayout, ReqRepr, RmaIov};

/// Sends posted to the device per call.
const POST_BURST: usize = 32;

/// Payloads at least this long are sent from the application's region
/// without a copy (a second gather element); shorter ones are copied,
/// unless the device copies the whole packet when it is posted (see
/// [`Endpoint::gathers`]).
const ZERO_COPY_MIN: usize = 1024;

#[derive(Debug)]
pub(crate) struct TxQueue {
    free: Vec<BufId>,
    owner: Vec<Owner>,
    /// By TX buffer: the region its packet gathers data from, if any, so
    /// that a region a send still reads is not deregistered. Meaningful
    /// while the buffer is out of `free`.
    gather: Vec<Option<MrId>>,
    /// Built packets the device has not taken yet: `pending[posted..]`.
    pending: Vec<SendWr>,
    posted: usize,
    ctrl: VecDeque<Ctrl>,
    /// Send-side operations with packets (or RDMA) due, in the order they
    /// became due.
    ready: VecDeque<TxId>,
    /// Send-side device RDMA operations with segments due.
    pub(crate) rdma: VecDeque<TxId>,
    /// Receive-side operations with RDMA reads due.
    pub(crate) reads: VecDeque<RxId>,
}

impl TxQueue {
    /// TX buffers are ids `0..bufs`.
    pub(crate) fn new(bufs: u32, ops: usize) -> TxQueue {
        TxQueue {
            free: (0..bufs).rev().map(BufId).collect(),
            owner: vec![Owner::Ctrl; bufs as usize],
            gather: vec![None; bufs as usize],
            pending: Vec::with_capacity(bufs as usize),
            posted: 0,
            ctrl: VecDeque::with_capacity(ops),
            ready: VecDeque::with_capacity(ops),
            rdma: VecDeque::with_capacity(ops),
            reads: VecDeque::with_capacity(ops),
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

    /// Whether device RDMA (send- or receive-side) may be due.
    #[inline]
    pub(crate) fn has_rdma_due(&self) -> bool {
        !self.rdma.is_empty() || !self.reads.is_empty()
    }

    /// Whether anything is due: packets to post, control packets or
    /// operations to build, RDMA to post. The idle progress loop's check.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        !(self.pending.is_empty()
            && self.ctrl.is_empty()
            && self.ready.is_empty()
            && !self.has_rdma_due())
    }
}

impl<D: Device> Endpoint<D> {
    /// Queues a control packet.
    pub(super) fn queue_ctrl(&mut self, c: Ctrl) {
        self.txq.ctrl.push_back(c);
    }

    /// Puts a send-side operation on the list of those with packets due.
    pub(super) fn mark_ready(&mut self, id: TxId) {
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
        if !self.txq.has_work() {
            // Only built packets were due (the eager fast path's).
            return posted;
        }
        loop {
            let built = if !self.txq.has_free_buf() {
                false
            } else if let Some(c) = self.txq.ctrl.pop_front() {
                self.build_ctrl(c);
                true
            } else {
                self.build_next_op_packet()
            };
            // RDMA needs no packet buffer, only a TX slot.
            let read = !built && self.txq.has_rdma_due() && self.post_next_rdma();
            if !built && !read {
                break;
            }
            posted |= read;
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
    pub(super) fn post_pending(&mut self) -> bool {
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
    #[inline(always)]
    pub(super) fn take_tx_buf(&mut self, owner: Owner) -> Option<BufId> {
        let b = self.txq.free.pop()?;
        self.txq.owner[b.index()] = owner;
        Some(b)
    }

    /// TX buffers taken (built, posted, or waiting for their completion).
    pub(super) fn tx_bufs_in_use(&self) -> usize {
        self.txq.owner.len() - self.txq.free.len()
    }

    /// Whether a packet not yet completed gathers its data from `mr`.
    pub(super) fn tx_gathers_from(&self, mr: MrId) -> bool {
        let mut free = vec![false; self.txq.owner.len()];
        for &b in &self.txq.free {
            free[b.index()] = true;
        }
        self.txq.gather.iter().zip(&free).any(|(&g, &is_free)| g == Some(mr) && !is_free)
    }

    /// Returns a TX buffer taken and not used.
    pub(super) fn release_tx_buf(&mut self, buf: BufId) {
        self.txq.owner[buf.index()] = Owner::Ctrl;
        self.txq.free.push(buf);
    }

    /// Queues the packet in buffer `buf` (its first `len` bytes, then
    /// `data` if any) for posting to `peer`.
    #[inline(always)]
    pub(super) fn push_packet(
        &mut self,
        peer: PeerId,
        ptype: PacketType,
        buf: BufId,
        len: usize,
        data: Option<DataSeg>,
    ) {
        let ah = self.peers.get(peer).expect("live peer").ah;
        self.counters.tx_by_type[ptype.id() as usize] += 1;
        self.txq.gather[buf.index()] = data.map(|d| d.mr);
        self.txq.pending.push(SendWr { ah, buf, len: len as u32, data, wr_id: buf.wr_id() });
    }

    /// Posts built packets once a burst's worth is waiting.
    #[inline]
    pub(super) fn maybe_post(&mut self) {
        if self.txq.pending_len() >= POST_BURST {
            self.flush_tx();
        }
    }

    /// A send completed at the device: frees its buffer, advances its
    /// operation.
    pub(super) fn handle_send_done(&mut self, cqe: &Cqe) {
        let buf = BufId::from_wr_id(cqe.wr_id);
        let owner = self.txq.owner[buf.index()];
        self.txq.free.push(buf);
        if cqe.status != CqStatus::Ok {
            self.counters.drop(DropReason::DeviceError);
        }
        match owner {
            Owner::Ctrl => {}
            Owner::Inject(_) if cqe.status == CqStatus::Ok => {}
            Owner::Eager(e) | Owner::Inject(e) => {
                self.cq.push(Completion {
                    ctx: e.ctx,
                    op: Op::Send,
                    status: device_status(cqe.status),
                    len: e.len as u64,
                    tag: e.tag,
                    tagged: e.tagged,
                    cq_data: None,
                    peer: Some(e.peer),
                });
            }
            Owner::Op(id) => {
                let Some(op) = self.tx_ops.get_mut(id) else { return };
                op.in_flight -= 1;
                if cqe.status != CqStatus::Ok && op.error.is_none() {
                    op.error = Some(device_status(cqe.status));
                }
                if op.is_done() {
                    self.finish_tx_op(id);
                }
            }
        }
    }

    /// Reports a finished send-side operation and frees it.
    pub(super) fn finish_tx_op(&mut self, id: TxId) {
        let Some(op) = self.tx_ops.get(id) else { return };
        if let Some(what) = op.kind.reported_as() {
            let mut c = Completion::new(what, op.ctx);
            c.len = op.total;
            c.tag = op.tag;
            c.tagged = op.tagged;
            c.peer = Some(op.peer);
            c.status = op.error.unwrap_or(Status::Ok);
            self.cq.push(c);
        }
        self.free_tx_op(id);
    }

    /// Frees a send-side operation that has been reported (or is not),
    /// giving back what it held of its peer's runt budget.
    pub(super) fn free_tx_op(&mut self, id: TxId) {
        let Some(op) = self.tx_ops.get(id) else { return };
        if let TxProto::RuntRead { budget, .. } = op.proto {
            let peer = op.peer;
            self.give_runt_back(peer, budget);
        }
        self.tx_ops.free(id);
    }

    /// The optional headers a REQ to `peer` carries now: our raw address
    /// until its HANDSHAKE arrives (spec 2.2), then our connid if it asked
    /// for it (spec 4.4).
    #[inline(always)]
    pub(super) fn req_opt_headers(&self, peer: PeerId) -> (bool, Option<u32>) {
        let p = self.peers.get(peer).expect("live peer");
        if !p.handshake_received {
            (true, None)
        } else {
            (false, p.wants_connid().then_some(self.addr.connid))
        }
    }

    /// The connid field of a non-REQ packet to `peer`.
    #[inline]
    pub(super) fn ctrl_connid(&self, peer: PeerId) -> Option<u32> {
        self.peers.get(peer).expect("live peer").wants_connid().then_some(self.addr.connid)
    }

    /// Bytes of header a REQ of `ptype` to `peer` takes now (without iov
    /// arrays).
    #[inline]
    pub(super) fn req_header_len(&self, ptype: PacketType, peer: PeerId, cq_data: bool) -> usize {
        let fixed = ReqLayout::of(ptype).expect("REQ type").header_len();
        let opt = self.peers.get(peer).expect("live peer").req_opt_len as usize;
        fixed + opt + if cq_data { 8 } else { 0 }
    }

    /// Builds a queued control packet; each protocol emits its own.
    fn build_ctrl(&mut self, c: Ctrl) {
        let buf = self.take_tx_buf(Owner::Ctrl).expect("caller checked a free buffer");
        let (peer, ptype, len) = match c {
            Ctrl::Handshake { peer } => self.emit_handshake(buf, peer),
            Ctrl::HandshakeTrigger { peer } => self.emit_handshake_trigger(buf, peer),
            Ctrl::Cts { peer, send_id, recv_id, recv_length, read } => {
                self.emit_cts(buf, peer, send_id, recv_id, recv_length, read)
            }
            Ctrl::Receipt { peer, send_id, msg_id } => {
                self.emit_receipt(buf, peer, send_id, msg_id)
            }
            Ctrl::Eor { peer, send_id, recv_id } => {
                self.emit_read_answer(buf, PacketType::Eor, peer, send_id, recv_id)
            }
            Ctrl::ReadNack { peer, send_id, recv_id } => {
                self.emit_read_nack(buf, peer, send_id, recv_id)
            }
            Ctrl::Rtr { rx } => match self.emit_rtr(buf, rx) {
                Some(p) => p,
                None => {
                    // Timed out before its request went: nothing to send.
                    self.release_tx_buf(buf);
                    return;
                }
            },
        };
        self.push_packet(peer, ptype, buf, len, None);
    }

    /// Builds the next packet of the first operation with one due; returns
    /// whether it built one.
    fn build_next_op_packet(&mut self) -> bool {
        while let Some(&id) = self.txq.ready.front() {
            let Some(op) = self.tx_ops.get(id) else {
                self.txq.ready.pop_front();
                continue;
            };
            if !op.has_packet_due() || matches!(op.kind, TxKind::Rdma { .. }) {
                let rdma = matches!(op.kind, TxKind::Rdma { .. }) && op.has_packet_due();
                self.txq.ready.pop_front();
                if rdma {
                    self.txq.rdma.push_back(id);
                } else if let Some(op) = self.tx_ops.get_mut(id) {
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

    /// Builds one packet of send-side operation `id`: its REQ (with as
    /// much data as fits), then medium/runt segments, CTSDATA or READRSP.
    pub(super) fn build_op_packet(&mut self, id: TxId) {
        if let Some(a) = self.tx_ops.get(id).expect("live op").atomic {
            self.build_rta(id, a.class);
            return;
        }
        let buf = self.take_tx_buf(Owner::Op(id)).expect("caller checked a free buffer");
        let op = self.tx_ops.get(id).expect("live op");
        let first = op.phase == TxPhase::Start;
        let (ptype, hdr, data_len) = match (op.kind, op.proto.name(), first) {
            (TxKind::ReadRsp, _, true) => self.emit_readrsp(buf, id),
            (TxKind::Msg | TxKind::Write | TxKind::ReadRsp, Proto::LongCts, false)
            | (TxKind::ReadRsp, _, false) => self.emit_ctsdata(buf, id),
            (kind, proto, _) => {
                let ptype = req_type(kind, proto, op.tagged, op.dc);
                self.emit_req(buf, id, ptype)
            }
        };
        let (src, sent, peer) = {
            let op = self.tx_ops.get(id).expect("live op");
            (op.src, op.sent, op.peer)
        };
        let (data, copied) =
            if data_len > 0 { self.attach_data(buf, hdr, &src, sent, data_len) } else { (None, 0) };
        let op = self.tx_ops.get_mut(id).expect("live op");
        if first {
            op.start_transfer();
            // What the RTM carries is granted by the protocol itself;
            // CTS grants count from there.
            if let TxProto::LongCts { granted, after_nack: false } = &mut op.proto
                && op.kind != TxKind::ReadRsp
            {
                *granted = data_len;
            }
        }
        op.sent += data_len;
        op.in_flight += 1;
        self.push_packet(peer, ptype, buf, hdr + copied, data);
        self.peers.get_mut(peer).expect("live peer").req_sent = true;
    }

    /// Writes the REQ of type `ptype` for send-side operation `id` into
    /// `buf`; returns the type, the header length (with iov arrays and,
    /// for atomics, the operands) and how much data follows it.
    fn emit_req(&mut self, buf: BufId, id: TxId, ptype: PacketType) -> (PacketType, usize, u64) {
        let op = self.tx_ops.get(id).expect("live op");
        let mut r = ReqRepr::new(ptype);
        r.msg_id = op.msg_id;
        r.tag = op.tag;
        r.msg_length = op.total;
        r.seg_offset = op.sent;
        r.send_id = id.0;
        r.recv_id = id.0;
        r.credit_request = self.cfg.cts_window;
        r.cq_data = op.cq_data;
        if op.proto.after_nack() {
            r.flags |= ReqFlags::READ_NACK;
        }
        let remote = op.remote;
        r.rma_iov = IovList::Host(remote.as_slice());
        let mut read_iov = [RmaIov::default(); MAX_IOV];
        let mut read_n = 0;
        if op.proto.is_read() {
            op.src.pieces(0, op.total, |p| {
                let mr = self.mem.get(p.mr).expect("registered source");
                read_iov[read_n] = RmaIov { addr: mr.addr_at(p.offset), len: p.len, key: mr.key };
                read_n += 1;
            });
            r.runt_length = match op.proto {
                TxProto::RuntRead { runt, .. } => runt,
                _ => 0,
            };
        }
        r.read_iov = IovList::Host(&read_iov[..read_n]);
        let (raw, connid) = self.req_opt_headers(op.peer);
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        let room = (self.caps.mtu - r.buffer_len()) as u64;
        let data_len = match op.proto {
            TxProto::LongCts { after_nack: true, .. } | TxProto::LongRead => 0,
            TxProto::RuntRead { runt, .. } => (runt - op.sent).min(room),
            _ => (op.total - op.sent).min(room),
        };
        (ptype, r.emit(self.dev.held_mut(buf)), data_len)
    }

    /// Whether `len` payload bytes behind a `hdr`-byte header go as a
    /// gather element from the application's region rather than copied
    /// into the packet buffer: long ones, where the second element costs a
    /// NIC less than the copy costs us, and any packet the device copies
    /// whole when it is posted (its inline size), where the copy into the
    /// buffer would be one copy too many.
    #[inline(always)]
    pub(super) fn gathers(&self, hdr: usize, len: usize) -> bool {
        len >= ZERO_COPY_MIN || hdr + len <= self.caps.inline_size
    }

    /// Puts message bytes `[offset, offset + len)` of `src` behind the
    /// header in `buf`: the last range as a gather element when it goes so
    /// ([`Endpoint::gathers`]) behind the header and the ranges before it,
    /// those copied if together they are short (a protocol's header sent
    /// gathered ahead of its payload); else every range copied. Returns
    /// the gather element, if any, and the bytes copied.
    fn attach_data(
        &mut self,
        buf: BufId,
        hdr: usize,
        src: &Sgl,
        offset: u64,
        len: u64,
    ) -> (Option<DataSeg>, usize) {
        // Nothing gathers where the whole range would not.
        if self.gathers(hdr, len as usize) {
            let mut last = None;
            src.pieces(offset, len, |p| last = Some(p));
            if let Some(p) = last {
                let lead = (len - p.len) as usize;
                if lead < ZERO_COPY_MIN && self.gathers(hdr + lead, p.len as usize) {
                    self.copy_pieces(buf, hdr, src, offset, lead as u64);
                    let data = DataSeg { mr: p.mr, offset: p.offset, len: p.len as u32 };
                    return (Some(data), lead);
                }
            }
        }
        self.copy_pieces(buf, hdr, src, offset, len);
        (None, len as usize)
    }

    /// Copies message bytes `[offset, offset + len)` of `src` into `buf`
    /// from byte `at`.
    fn copy_pieces(&mut self, buf: BufId, mut at: usize, src: &Sgl, offset: u64, len: u64) {
        src.pieces(offset, len, |p| {
            let n = p.len as usize;
            self.dev.copy_from_region(p.mr, p.offset as usize, buf, at, n);
            at += n;
        });
    }
}

/// A device status as an operation's.
pub(crate) fn device_status(s: CqStatus) -> Status {
    match s {
        CqStatus::Ok => Status::Ok,
        CqStatus::PeerUnreachable => Status::PeerUnreachable,
        CqStatus::RemoteAccess => Status::RemoteAccess,
        CqStatus::LocalError | CqStatus::DeviceError => Status::DeviceError,
    }
}
