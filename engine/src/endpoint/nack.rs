//! READ_NACK (spec 4.7): a receiver that cannot prepare its buffer for a
//! long-read or runting read says so, if the sender takes it; the sender
//! re-sends the message or write as long-CTS, its REQ flagged and with no
//! data, and a message's re-sent REQ continues the receiver's entry by
//! msg_id.

use super::dispatch::msg_proto;
use super::ops::{Proto, ReadPhase, RxKind, RxProto, RxState, TxKind, TxPhase, TxProto};
use super::types::{BufId, Ctrl, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, PeerId};
use crate::device::Device;
use crate::wire::{PacketType, extra};

impl<D: Device> Endpoint<D> {
    /// The receiver's side: long-read (or runting-read) entry `id` cannot
    /// read into its buffer (the device could not prepare it). Answers
    /// READ_NACK if the peer takes it, else lets the sender time out.
    pub(super) fn refuse_reads(&mut self, id: RxId) {
        let op = self.rx_ops.get(id).expect("live op");
        let (kind, peer, send_id) = (op.kind, op.peer, op.send_id);
        // Never a packet type the peer did not say it takes.
        let nack_ok = self.peers.get(peer).is_some_and(|p| p.supports(extra::READ_NACK));
        if nack_ok {
            // Spec 4.7: the sender re-sends the rest by long-CTS.
            self.queue_ctrl(Ctrl::ReadNack { peer, send_id, recv_id: id });
        }
        let op = self.rx_ops.get_mut(id).expect("live op");
        if let Some(reads) = op.proto.reads_mut() {
            reads.phase = ReadPhase::Refused;
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
            TxKind::Msg => op.proto.is_read(),
            TxKind::Write => op.proto == TxProto::LongRead,
            _ => false,
        };
        if op.peer != peer || !reads || op.phase == TxPhase::Start {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        let (runt, budget) = match op.proto {
            TxProto::RuntRead { runt, budget } => (runt, budget),
            _ => (0, 0),
        };
        self.give_runt_back(peer, budget);
        let op = self.tx_ops.get_mut(send_id).expect("live op");
        // CTS grants count from the bytes the runts delivered.
        // Its REQ is due again; what it then awaits follows from the new
        // protocol (RECEIPT with delivery complete, else nothing).
        op.proto = TxProto::LongCts { granted: runt, after_nack: true };
        op.phase = TxPhase::Start;
        op.sent = runt;
        self.mark_ready(send_id);
    }

    /// The long-CTS REQ a sender re-sends after our READ_NACK: the rest of
    /// the message comes by CTS flow control.
    pub(super) fn handle_nack_retry(&mut self, buf: BufId, id: RxId, info: &ReqInfo) {
        self.release_rx(buf);
        let Some(op) = self.rx_ops.get_mut(id) else { return };
        let retry_ok = matches!(op.proto, RxProto::LongRead(_) | RxProto::RuntRead(_))
            && msg_proto(info).is_some_and(|(p, t, _)| p == Proto::LongCts && t == op.tagged)
            && info.payload_len == 0
            && info.msg_length == op.total;
        if !retry_ok {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        // The runt (if any) was the protocol's own: grants count from it.
        op.proto = RxProto::LongCts { granted: op.received };
        op.send_id = RemoteId(info.send_id);
        if op.state == RxState::Matched {
            self.advance_rx(id);
        }
    }

    /// A READ_NACK into `buf`: `recv_id` cannot read `send_id`'s data.
    pub(super) fn emit_read_nack(
        &mut self,
        buf: BufId,
        peer: PeerId,
        send_id: RemoteId,
        recv_id: RxId,
    ) -> (PeerId, PacketType, usize) {
        self.counters.read_nacks += 1;
        self.emit_read_answer(buf, PacketType::ReadNack, peer, send_id, recv_id)
    }
}
