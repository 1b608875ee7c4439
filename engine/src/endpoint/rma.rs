//! One-sided operations (spec 3.3, 4.1, 4.6): emulated write and read,
//! direct RDMA read and write, the RDMA-read pipelines of long-read and
//! runting-read transfers, and the packets that end or divert them (EOR,
//! RECEIPT, READ_NACK).
//!
//! A responder checks every remote iov against its registrations before a
//! byte moves (key known, range inside without overflow, right granted);
//! a violation is counted and the request dropped. No packet tells the
//! requester; its read, atomic or delivery-complete operation fails when
//! the response does not come within `Config::response_timeout`.

use super::cq::{Completion, Op};
use super::msg::{copy_in, iov_total};
use super::ops::{Iovs, Proto, RxKind, RxOp, RxState, Sgl, TxKind};
use super::tx::device_status;
use super::types::{BufId, Ctrl, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, Error, PeerId, Span};
use crate::device::{Access, CqStatus, Cqe, Device, RdmaOp, RdmaWr, Source};
use crate::mem::AccessError;
use crate::wire::{PacketType, ReadRspRepr, RmaIov, extra};

/// Largest RDMA segment: its length lives in 31 bits of the work request
/// id.
const MAX_SEGMENT: u64 = 1 << 30;

/// Work request id of an RDMA segment: which slab, which operation, how
/// many bytes.
fn rdma_wr_id(rx: bool, id: u32, len: u64) -> u64 {
    debug_assert!(len <= MAX_SEGMENT);
    ((rx as u64) << 63) | ((id as u64) << 31) | len
}

fn split_wr_id(wr_id: u64) -> (bool, u32, u64) {
    (wr_id >> 63 == 1, (wr_id >> 31) as u32, wr_id & ((1 << 31) - 1))
}

/// The next RDMA segment of a transfer at message offset `at` (below
/// `end`): the remote piece from `remote` (a contiguous message across up
/// to four iovs) and the local piece from `local`.
fn next_segment(
    remote: &[RmaIov],
    local: &Sgl,
    at: u64,
    end: u64,
    max: u64,
) -> Option<(Span, u64, u64)> {
    let mut skip = at;
    let (raddr, rkey, rroom) = remote.iter().find_map(|v| {
        if skip < v.len {
            Some((v.addr.wrapping_add(skip), v.key, v.len - skip))
        } else {
            skip -= v.len;
            None
        }
    })?;
    let mut piece = None;
    local.pieces(at, end - at, |p| {
        if piece.is_none() {
            piece = Some(p);
        }
    });
    let mut p = piece?;
    p.len = p.len.min(rroom).min(max).min(MAX_SEGMENT);
    Some((p, raddr, rkey))
}

impl<D: Device> Endpoint<D> {
    /// Writes `src` to the peer's memory `remote` (its `addr`, `len` and
    /// `key`, from an `Mr` the peer registered with remote write).
    pub fn write(
        &mut self,
        peer: PeerId,
        src: Span,
        remote: RmaIov,
        ctx: u64,
    ) -> Result<(), Error> {
        self.write_op(peer, src, remote, None, ctx)
    }

    /// Writes with CQ data: the target reports a `RemoteWrite` completion
    /// carrying it (32 bits on the direct RDMA path, as EFA's immediate).
    pub fn writedata(
        &mut self,
        peer: PeerId,
        src: Span,
        remote: RmaIov,
        data: u64,
        ctx: u64,
    ) -> Result<(), Error> {
        self.write_op(peer, src, remote, Some(data), ctx)
    }

    /// Reads the peer's memory `remote` into `dst`.
    pub fn read(&mut self, peer: PeerId, dst: Span, remote: RmaIov, ctx: u64) -> Result<(), Error> {
        self.check_peer(peer)?;
        self.check_span(&dst)?;
        if remote.len != dst.len {
            return Err(Error::Invalid);
        }
        let p = self.peers.get(peer).expect("checked peer");
        if !p.handshake_received {
            // Which protocol depends on the peer (libfabric does the same:
            // efa_rdm_ep_trigger_handshake, then -FI_EAGAIN).
            self.request_handshake(peer);
            return Err(Error::Again);
        }
        if self.caps.rdma_read && p.supports(extra::RDMA_READ) {
            return self.start_rdma(peer, TxKind::Rdma { read: true }, dst, remote, None, ctx);
        }
        if dst.len == 0 {
            // Nothing to ask for (an RTR must request > 0 bytes).
            let mut c = Completion::new(Op::Read, ctx);
            c.peer = Some(peer);
            self.cq.push(c);
            return Ok(());
        }
        // Emulated read: our receive entry takes READRSP and CTSDATA.
        let mut op = RxOp::new(RxKind::Read, RxState::Matched);
        op.ctx = ctx;
        op.dst = Sgl::one(dst);
        op.peer = peer;
        op.proto = Proto::LongCts;
        op.total = dst.len;
        op.send_id = RemoteId::UNKNOWN;
        op.read_iov = Iovs::one(remote);
        let readrsp_room = (self.caps.mtu - ReadRspRepr::default().buffer_len()) as u64;
        let window = self.cts_window_bytes(peer).max(readrsp_room);
        op.granted = if dst.len <= readrsp_room { dst.len } else { window.min(dst.len) };
        let rx = self.rx_ops.insert(op).ok_or(Error::Again)?;
        self.peers.get_mut(peer).expect("checked peer").req_sent = true;
        self.queue_ctrl(Ctrl::Rtr { rx });
        self.watch_rx(rx);
        if self.txq.pending_len() == 0 {
            self.flush_tx();
        }
        Ok(())
    }

    fn write_op(
        &mut self,
        peer: PeerId,
        src: Span,
        remote: RmaIov,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<(), Error> {
        self.check_peer(peer)?;
        self.check_span(&src)?;
        if remote.len != src.len {
            return Err(Error::Invalid);
        }
        if !self.peers.get(peer).expect("checked peer").handshake_received {
            self.request_handshake(peer);
            return Err(Error::Again);
        }
        let dc = self.cfg.delivery_complete;
        if dc {
            self.check_dc(peer)?;
        }
        let p = self.peers.get(peer).expect("checked peer");
        if self.caps.rdma_write && p.supports(extra::RDMA_WRITE) {
            return self.start_rdma(peer, TxKind::Rdma { read: false }, src, remote, cq_data, ctx);
        }
        let room =
            self.caps.mtu - self.req_header_len(PacketType::EagerRtw, peer, cq_data.is_some());
        let proto = if src.len + 24 <= room as u64 {
            Proto::Eager
        } else if src.len >= self.cfg.long_read_write_min && self.can_long_read(peer, &src) {
            Proto::LongRead
        } else {
            Proto::LongCts
        };
        // A long-read write ends with EOR; `dc` picks the protocol it
        // falls back to after a READ_NACK.
        let awaiting_peer = dc || proto == Proto::LongRead;
        let watch = awaiting_peer || proto == Proto::LongCts;
        let id = self
            .tx_ops
            .insert_with(|op| {
                op.reset(TxKind::Write, peer, proto, ctx);
                op.set_src(src);
                op.cq_data = cq_data;
                op.set_remote(remote);
                op.dc = dc;
                op.awaiting_peer = awaiting_peer;
            })
            .ok_or(Error::Again)?;
        if watch {
            self.watch_tx(id);
        }
        self.mark_ready(id);
        if self.txq.pending_len() == 0 {
            self.flush_tx();
        }
        Ok(())
    }

    /// A direct RDMA read or write, posted in segments by `post_next_rdma`.
    fn start_rdma(
        &mut self,
        peer: PeerId,
        kind: TxKind,
        local: Span,
        remote: RmaIov,
        cq_data: Option<u64>,
        ctx: u64,
    ) -> Result<(), Error> {
        let id = self
            .tx_ops
            .insert_with(|op| {
                op.reset(kind, peer, Proto::Eager, ctx);
                op.set_src(local);
                op.set_remote(remote);
                op.cq_data = cq_data;
                // Nothing to build: the "REQ" is the first segment.
                op.req_built = true;
            })
            .ok_or(Error::Again)?;
        if local.len == 0 {
            match (kind, cq_data) {
                (TxKind::Rdma { read: false }, Some(data)) => {
                    // No bytes, but the CQ data must still reach the
                    // target: a zero-length write with immediate.
                    let write = RdmaOp::Write { imm: Some(data as u32) };
                    let wr_id = rdma_wr_id(false, id.0, 0);
                    let wr = self.rdma_wr(write, peer, local, remote.addr, remote.key, wr_id);
                    if !self.post_rdma_wr(wr) {
                        self.tx_ops.free(id);
                        return Err(Error::Again);
                    }
                    self.tx_ops.get_mut(id).expect("live op").in_flight = 1;
                }
                _ => self.finish_tx_op(id),
            }
            return Ok(());
        }
        self.tx_ops.get_mut(id).expect("live op").queued = true;
        self.txq.rdma.push_back(id);
        self.post_next_rdma();
        Ok(())
    }

    /// Posts one RDMA operation and counts it; false when the device is
    /// full.
    fn post_rdma_wr(&mut self, wr: RdmaWr) -> bool {
        if self.dev.post_rdma(&[wr]) == 0 {
            return false;
        }
        match wr.op {
            RdmaOp::Read => self.counters.rdma_reads += 1,
            RdmaOp::Write { .. } => self.counters.rdma_writes += 1,
        }
        self.counters.rdma_bytes += wr.len;
        true
    }

    /// The work request moving `local` to or from peer `peer`'s
    /// `[remote_addr, remote_addr + local.len)`.
    fn rdma_wr(
        &self,
        op: RdmaOp,
        peer: PeerId,
        local: Span,
        remote_addr: u64,
        remote_key: u64,
        wr_id: u64,
    ) -> RdmaWr {
        RdmaWr {
            op,
            ah: self.peers.get(peer).expect("live peer").ah,
            local: local.mr,
            local_offset: local.offset,
            len: local.len,
            remote_addr,
            remote_key,
            wr_id,
        }
    }

    /// Posts the next RDMA segment of the first transfer with one due:
    /// direct reads and writes first, then long-read receives. Returns
    /// whether it posted one.
    pub(super) fn post_next_rdma(&mut self) -> bool {
        while let Some(&id) = self.txq.rdma.front() {
            let Some(op) = self.tx_ops.get(id) else {
                self.txq.rdma.pop_front();
                continue;
            };
            let window = self.cfg.rdma_window;
            if op.sent >= op.total || op.error.is_some() || op.in_flight >= window {
                self.txq.rdma.pop_front();
                if let Some(op) = self.tx_ops.get_mut(id) {
                    op.queued = false;
                }
                continue;
            }
            let read = matches!(op.kind, TxKind::Rdma { read: true });
            let Some((local, raddr, rkey)) =
                next_segment(op.remote(), &op.src, op.sent, op.total, self.caps.max_rdma_size)
            else {
                self.txq.rdma.pop_front();
                continue;
            };
            let last = op.sent + local.len == op.total;
            let imm = if last { op.cq_data.map(|d| d as u32) } else { None };
            let rdma_op = if read { RdmaOp::Read } else { RdmaOp::Write { imm } };
            let wr_id = rdma_wr_id(false, id.0, local.len);
            let wr = self.rdma_wr(rdma_op, op.peer, local, raddr, rkey, wr_id);
            if !self.post_rdma_wr(wr) {
                return false;
            }
            let op = self.tx_ops.get_mut(id).expect("live op");
            op.sent += local.len;
            op.in_flight += 1;
            return true;
        }
        while let Some(&id) = self.txq.reads.front() {
            let Some(op) = self.rx_ops.get(id) else {
                self.txq.reads.pop_front();
                continue;
            };
            let end = op.total.min(op.dst.len());
            if op.read_next >= end || op.reads_in_flight >= self.cfg.rdma_window {
                self.txq.reads.pop_front();
                continue;
            }
            let Some((local, raddr, rkey)) =
                next_segment(op.read_iov(), &op.dst, op.read_next, end, self.caps.max_rdma_size)
            else {
                self.txq.reads.pop_front();
                continue;
            };
            let wr_id = rdma_wr_id(true, id.0, local.len);
            let wr = self.rdma_wr(RdmaOp::Read, op.peer, local, raddr, rkey, wr_id);
            if !self.post_rdma_wr(wr) {
                return false;
            }
            let op = self.rx_ops.get_mut(id).expect("live op");
            op.read_next += local.len;
            op.reads_in_flight += 1;
            return true;
        }
        false
    }

    /// An RDMA segment finished.
    pub(super) fn handle_rdma_done(&mut self, cqe: &Cqe) {
        let (rx, raw, len) = split_wr_id(cqe.wr_id);
        let deadline = self.fresh_deadline();
        if rx {
            let id = RxId(raw);
            let Some(op) = self.rx_ops.get_mut(id) else { return };
            op.reads_in_flight -= 1;
            op.deadline = deadline;
            if cqe.status != CqStatus::Ok {
                // The sender's buffer is gone or refused: the transfer
                // fails; the sender hears nothing and times out.
                self.counters.drop(DropReason::DeviceError);
                let mut c = Completion::new(Op::Recv, op.ctx);
                c.status = device_status(cqe.status);
                c.peer = Some(op.peer);
                if op.kind == RxKind::Msg {
                    self.cq.push(c);
                }
                self.free_rx_op(id);
                return;
            }
            op.received += len;
            let end = op.total.min(op.dst.len());
            if op.read_next >= end && op.reads_in_flight == 0 {
                // Truncated reads stop at the buffer's end.
                op.received = op.total;
                self.finish_rx(id);
            } else if op.read_next < end && !self.txq.reads.contains(&id) {
                self.txq.reads.push_back(id);
            }
            return;
        }
        let id = TxId(raw);
        let Some(op) = self.tx_ops.get_mut(id) else { return };
        op.in_flight -= 1;
        op.deadline = deadline;
        if cqe.status != CqStatus::Ok {
            op.error.get_or_insert(device_status(cqe.status));
        } else {
            op.done_bytes += len;
        }
        if op.is_done() {
            self.finish_tx_op(id);
        } else if op.sent < op.total && op.error.is_none() && !op.queued {
            op.queued = true;
            self.txq.rdma.push_back(id);
        }
    }

    /// A peer's RDMA write with immediate data landed (direct write with CQ
    /// data): report it as the target's completion.
    pub(super) fn handle_remote_write_imm(&mut self, cqe: &Cqe) {
        let buf = cqe.wr_id as BufId;
        self.rx_posted -= 1;
        self.release_rx(buf);
        if cqe.status != CqStatus::Ok {
            self.counters.drop(DropReason::DeviceError);
            return;
        }
        self.counters.remote_writes += 1;
        let mut c = Completion::new(Op::RemoteWrite, 0);
        // What the device reports: the bytes of the RDMA write that carried
        // the data, its last piece when the write was split.
        c.len = cqe.len as u64;
        c.cq_data = Some(cqe.imm as u64);
        c.peer = match cqe.src {
            Source::Known(ah) => self.peers.by_ah(ah),
            _ => None,
        };
        self.cq.push(c);
    }

    /// Local spans for a REQ's rma_iov list, each checked against our
    /// registrations for `need`; counts and returns the violation.
    fn resolve_iovs(&mut self, iovs: &[RmaIov], need: Access) -> Result<Sgl, AccessError> {
        let mut sgl = Sgl::EMPTY;
        for iov in iovs {
            match self.mem.resolve(iov, need) {
                Ok(span) => sgl.push(span),
                Err(e) => {
                    self.counters.drop(DropReason::RemoteAccess);
                    self.counters.remote_access_refused += 1;
                    return Err(e);
                }
            }
        }
        Ok(sgl)
    }

    /// EAGER_RTW / DC_EAGER_RTW: the data is in the packet.
    pub(super) fn handle_eager_rtw(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        // A zero-byte write with no iov is the handshake trigger: the
        // HANDSHAKE is queued already.
        if info.rma_iov.n == 0 && info.payload_len == 0 {
            return;
        }
        let iovs = self.req_iovs(buf, info.rma_iov);
        let Ok(dst) = self.resolve_iovs(iovs.as_slice(), Access::REMOTE_WRITE) else { return };
        if dst.len() != info.payload_len as u64 {
            self.counters.drop(DropReason::SegmentOutOfRange);
            return;
        }
        copy_in(&mut self.dev, buf, info.payload_off as usize, &dst, 0, dst.len());
        if let Some(data) = info.cq_data {
            let mut c = Completion::new(Op::RemoteWrite, 0);
            c.len = dst.len();
            c.cq_data = Some(data);
            c.peer = Some(peer);
            self.cq.push(c);
        }
        if info.ptype == PacketType::DcEagerRtw {
            let send_id = RemoteId(info.send_id);
            self.queue_ctrl(Ctrl::Receipt { peer, send_id, msg_id: 0 });
        }
    }

    /// LONGCTS_RTW, DC_LONGCTS_RTW, LONGREAD_RTW: a receive-side entry
    /// takes the rest.
    pub(super) fn handle_long_rtw(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        let iovs = self.req_iovs(buf, info.rma_iov);
        let Ok(dst) = self.resolve_iovs(iovs.as_slice(), Access::REMOTE_WRITE) else {
            self.release_rx(buf);
            return;
        };
        let long_read = info.ptype == PacketType::LongReadRtw;
        let bad = iov_total(iovs.as_slice()) != Some(info.msg_length)
            || info.payload_len as u64 > info.msg_length
            || (long_read && (info.read_iov.n == 0 || info.payload_len != 0));
        if bad {
            self.counters.drop(DropReason::Invalid);
            self.release_rx(buf);
            return;
        }
        let mut op = RxOp::new(RxKind::Write, RxState::Matched);
        op.dst = dst;
        op.peer = peer;
        op.proto = if long_read { Proto::LongRead } else { Proto::LongCts };
        op.dc = info.ptype == PacketType::DcLongCtsRtw;
        op.cq_data = info.cq_data;
        op.total = info.msg_length;
        op.send_id = RemoteId(info.send_id);
        op.read_iov = self.req_iovs(buf, info.read_iov);
        let Some(id) = self.rx_ops.insert(op) else {
            // Waits, holding its buffer, for a free entry.
            self.counters.rx_ops_exhausted += 1;
            self.stalled_bufs.push_back(buf);
            return;
        };
        self.land(id, buf, info.payload_off, info.payload_len, 0);
        self.release_rx(buf);
        self.advance_rx(id);
    }

    /// SHORT_RTR / LONGCTS_RTR: send the requested bytes back, READRSP
    /// first, then CTSDATA as the requester grants.
    pub(super) fn handle_rtr(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        let iovs = self.req_iovs(buf, info.rma_iov);
        // An iov the registrations refuse (an unknown or deregistered key,
        // out of bounds, no remote read) is counted and answered with
        // nothing, so the requester's read times out; the spec is silent.
        // libfabric 1.17: rxr_pkt_handle_rtr_recv, where a failed
        // rxr_rma_verified_copy_iov writes FI_EINVAL (FI_EFA_ERR_RMA_ADDR)
        // to the responder's EQ, releases the RTR and sends nothing back.
        let Ok(src) = self.resolve_iovs(iovs.as_slice(), Access::REMOTE_READ) else { return };
        if iov_total(iovs.as_slice()) != Some(info.msg_length) || info.recv_length == 0 {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        let Some(id) = self.tx_ops.insert_with(|op| {
            op.reset(TxKind::ReadRsp, peer, Proto::LongCts, 0);
            op.src = src;
            op.total = src.len();
            op.report = false;
            op.recv_id = RemoteId(info.recv_id);
            op.granted = (info.recv_length as u64).min(op.total);
        }) else {
            // The requester times out; nothing here is lost.
            self.counters.drop(DropReason::Unsupported);
            return;
        };
        self.watch_tx(id);
        self.mark_ready(id);
    }

    /// Long-read (or runting-read) data is to be read: prepare the buffer
    /// and queue the reads, or answer READ_NACK when it cannot be prepared.
    pub(super) fn start_reads(&mut self, id: RxId) {
        let op = self.rx_ops.get(id).expect("live op");
        let dst = op.dst;
        let mut prepared = true;
        for seg in dst.segs() {
            if self.dev.prepare_rdma(seg.mr).is_err() {
                prepared = false;
                break;
            }
        }
        let op = self.rx_ops.get_mut(id).expect("live op");
        if !prepared {
            let (kind, peer, send_id) = (op.kind, op.peer, op.send_id);
            // Never a packet type the peer did not say it takes.
            let nack_ok = self.peers.get(peer).is_some_and(|p| p.supports(extra::READ_NACK));
            if nack_ok {
                // Spec 4.7: the sender re-sends the rest by long-CTS.
                self.queue_ctrl(Ctrl::ReadNack { peer, send_id, recv_id: id });
            }
            match kind {
                // A write comes again as a LONGCTS_RTW of its own, a new
                // entry here (libfabric: handle_longcts_rtw_recv); a
                // message's re-sent REQ continues this one by msg_id.
                RxKind::Write if nack_ok => self.free_rx_op(id),
                RxKind::Msg if nack_ok => self.watch_rx(id),
                // The requester times out.
                _ => {
                    self.counters.drop(DropReason::DeviceError);
                    self.watch_rx(id);
                }
            }
            return;
        }
        let op = self.rx_ops.get_mut(id).expect("live op");
        op.read_next = op.runt;
        let end = op.total.min(op.dst.len());
        if op.read_next >= end {
            op.received = op.total;
            self.finish_rx(id);
            return;
        }
        self.txq.reads.push_back(id);
        self.watch_rx(id);
    }

    /// EOR: the receiver read everything; the sender's buffer is free.
    pub(super) fn handle_eor(&mut self, peer: PeerId, send_id: TxId) {
        let Some(op) = self.tx_ops.get_mut(send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        let reads = matches!(op.proto, Proto::LongRead | Proto::RuntRead) && !op.after_nack;
        if op.peer != peer || !reads || !op.req_built {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        op.awaiting_peer = false;
        op.sent = op.total;
        if op.is_done() {
            self.finish_tx_op(send_id);
        }
    }

    /// RECEIPT: a delivery-complete operation's data reached its target.
    pub(super) fn handle_receipt(&mut self, peer: PeerId, send_id: TxId) {
        let Some(op) = self.tx_ops.get_mut(send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        // A read protocol ends with EOR, whatever was asked.
        let reads = matches!(op.proto, Proto::LongRead | Proto::RuntRead) && !op.after_nack;
        if op.peer != peer || !op.dc || !op.awaiting_peer || reads {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        op.awaiting_peer = false;
        if op.is_done() {
            self.finish_tx_op(send_id);
        }
    }

    /// READ_NACK: the receiver cannot read our buffer; re-send the message
    /// or write as long-CTS, flagged, with no data in the REQ (spec 4.7;
    /// for a write, LONGCTS_RTW as libfabric's handle_read_nack_recv).
    pub(super) fn handle_read_nack(&mut self, peer: PeerId, send_id: TxId) {
        let Some(op) = self.tx_ops.get_mut(send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        let reads = match op.kind {
            TxKind::Msg => matches!(op.proto, Proto::LongRead | Proto::RuntRead),
            TxKind::Write => op.proto == Proto::LongRead,
            _ => false,
        } && !op.after_nack;
        if op.peer != peer || !reads || !op.req_built {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        let runt = if op.proto == Proto::RuntRead { op.granted } else { 0 };
        if op.proto == Proto::RuntRead
            && let Some(p) = self.peers.get_mut(peer)
        {
            p.runt_in_flight = p.runt_in_flight.saturating_sub(runt);
        }
        let op = self.tx_ops.get_mut(send_id).expect("live op");
        op.proto = Proto::LongCts;
        op.after_nack = true;
        op.req_built = false;
        op.sent = runt;
        // CTS grants count from the bytes the runts delivered.
        op.granted = runt;
        op.awaiting_peer = op.dc;
        self.mark_ready(send_id);
    }
}
