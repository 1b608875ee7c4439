//! Delivery complete (spec 4.2): the DC_ REQ types, and the RECEIPT the
//! receiver sends once the data is in the target buffer; the sender's
//! operation completes only then. A read protocol ends with EOR instead.

use super::ops::{Answer, TxPhase};
use super::types::{BufId, RemoteId, TxId};
use super::{DropReason, Endpoint, Error, PeerId};
use crate::device::{Device, HeldBufs};
use crate::wire::{PacketType, PktFlags, ReceiptRepr, extra};

impl<D: Device> Endpoint<D> {
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

    /// RECEIPT: a delivery-complete operation's data reached its target.
    pub(super) fn handle_receipt(&mut self, peer: PeerId, send_id: TxId) {
        let Some(op) = self.tx_ops.get_mut(send_id) else {
            self.counters.drop(DropReason::StaleId);
            return;
        };
        // A read protocol ends with EOR, whatever was asked.
        let awaited = op.phase == TxPhase::Transfer { awaits: Some(Answer::Receipt) };
        if op.peer != peer || !awaited {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        op.phase = TxPhase::Transfer { awaits: None };
        if op.is_done() {
            self.finish_tx_op(send_id);
        }
    }

    /// A RECEIPT into `buf`: the data of `send_id` is in its target.
    pub(super) fn emit_receipt(
        &mut self,
        buf: BufId,
        peer: PeerId,
        send_id: RemoteId,
        msg_id: u32,
    ) -> (PeerId, PacketType, usize) {
        let repr = ReceiptRepr {
            flags: PktFlags::empty(),
            send_id: send_id.0,
            msg_id,
            connid: self.ctrl_connid(peer),
        };
        (peer, PacketType::Receipt, repr.emit(self.dev.held_mut(buf)))
    }
}
