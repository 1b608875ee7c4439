//! Long-read (spec 4.1; LONGREAD_MSGRTM, LONGREAD_TAGRTM, LONGREAD_RTW):
//! the REQ names the sender's buffer; the receiver reads it by RDMA, a
//! window of reads in flight, and answers EOR, which ends the sender's
//! operation. A runting read's RDMA half (spec 4.5) is the same.

use super::cq::{Completion, Op};
use super::ops::{ReadPhase, Reads, RxKind, RxProto, Sgl, TxPhase};
use super::rdma::{next_segment, rdma_wr_id};
use super::tx::device_status;
use super::types::{BufId, RemoteId, RxId, TxId};
use super::{DropReason, Endpoint, PeerId, Span};
use crate::device::{Access, CqStatus, Device, HeldBufs, RdmaOp};
use crate::wire::{EorRepr, PacketType, PktFlags, ReadNackRepr, extra};

impl<D: Device> Endpoint<D> {
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
        if !prepared {
            self.refuse_reads(id);
            return;
        }
        let op = self.rx_ops.get_mut(id).expect("live op");
        let end = op.total.min(op.dst.len());
        let reads = op.proto.reads_mut().expect("a read protocol");
        let next = reads.runt;
        reads.phase = ReadPhase::Reading { next, in_flight: 0 };
        if next >= end {
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
        let reads = op.proto.is_read();
        if op.peer != peer || !reads || op.phase == TxPhase::Start {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        // The peer read what the REQ named: all of it is sent.
        op.phase = TxPhase::Transfer { awaits: None };
        op.sent = op.total;
        if op.is_done() {
            self.finish_tx_op(send_id);
        }
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
    pub(super) fn can_long_read_all(&self, peer: PeerId, src: &Sgl) -> bool {
        src.segs().iter().all(|s| self.can_long_read(peer, s))
    }

    /// Posts the next RDMA read of the first long-read receive with one
    /// due (after the direct operations, see `post_next_rdma`); returns
    /// whether it posted one.
    pub(super) fn post_next_read(&mut self) -> bool {
        while let Some(&id) = self.txq.reads.front() {
            let Some(op) = self.rx_ops.get(id) else {
                self.txq.reads.pop_front();
                continue;
            };
            let end = op.total.min(op.dst.len());
            let (next, in_flight) = match op.proto {
                RxProto::LongRead(r) | RxProto::RuntRead(r) => match r.phase {
                    ReadPhase::Reading { next, in_flight } => (next, in_flight),
                    _ => (end, 0),
                },
                _ => (end, 0),
            };
            if next >= end || in_flight >= self.cfg.rdma_window {
                self.txq.reads.pop_front();
                continue;
            }
            let Some((local, raddr, rkey)) =
                next_segment(op.read_iov(), &op.dst, next, end, self.caps.max_rdma_size)
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
            let reads = op.proto.reads_mut().expect("a read protocol");
            reads.phase = ReadPhase::Reading { next: next + local.len, in_flight: in_flight + 1 };
            return true;
        }
        false
    }

    /// An RDMA read of receive-side entry `id` finished, `len` bytes.
    pub(super) fn handle_read_done(&mut self, id: RxId, len: u64, status: CqStatus, deadline: u64) {
        let Some(op) = self.rx_ops.get_mut(id) else { return };
        let Some(Reads { phase: ReadPhase::Reading { next, in_flight }, .. }) =
            op.proto.reads_mut()
        else {
            return;
        };
        *in_flight -= 1;
        let (next, in_flight) = (*next, *in_flight);
        op.deadline = deadline;
        if status != CqStatus::Ok {
            // The sender's buffer is gone or refused: the transfer
            // fails; the sender hears nothing and times out.
            self.counters.drop(DropReason::DeviceError);
            let mut c = Completion::new(Op::Recv, op.ctx);
            c.status = device_status(status);
            c.peer = Some(op.peer);
            if op.kind == RxKind::Msg {
                self.cq.push(c);
            }
            self.free_rx_op(id);
            return;
        }
        op.received += len;
        let end = op.total.min(op.dst.len());
        if next >= end && in_flight == 0 {
            // Truncated reads stop at the buffer's end.
            op.received = op.total;
            self.finish_rx(id);
        } else if next < end && !self.txq.reads.contains(&id) {
            self.txq.reads.push_back(id);
        }
    }

    /// An EOR or a READ_NACK (`ptype`) into `buf`: receive-side `recv_id`
    /// says it read all of `send_id`'s data, or cannot read it. The two
    /// have one layout (spec 4.1 and 4.7): both ids, and our connid if
    /// the peer wants it.
    pub(super) fn emit_read_answer(
        &mut self,
        buf: BufId,
        ptype: PacketType,
        peer: PeerId,
        send_id: RemoteId,
        recv_id: RxId,
    ) -> (PeerId, PacketType, usize) {
        let (flags, connid) = (PktFlags::empty(), self.ctrl_connid(peer));
        let (send_id, recv_id) = (send_id.0, recv_id.0);
        let b = self.dev.held_mut(buf);
        let len = match ptype {
            PacketType::Eor => EorRepr { flags, send_id, recv_id, connid }.emit(b),
            _ => ReadNackRepr { flags, send_id, recv_id, connid }.emit(b),
        };
        (peer, ptype, len)
    }
}
