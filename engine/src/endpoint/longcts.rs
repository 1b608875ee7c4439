//! Long-CTS (spec 3.2; LONGCTS_MSGRTM, LONGCTS_TAGRTM, DC_LONGCTS_*, and
//! LONGCTS_RTW and the data of emulated reads, spec 3.3): a REQ with the
//! data that fits, then CTSDATA packets as the receiver grants windows by
//! CTS. Also what follows a READ_NACK (`nack`).

use super::ops::{Proto, RxKind, RxProto, RxState, TxKind, TxPhase, TxProto};
use super::types::{BufId, Ctrl, RemoteId, RxId, TxId};
use super::{DropReason, Endpoint, PeerId};
use crate::device::{Device, HeldBufs};
use crate::wire::{CtsDataRepr, CtsFlags, CtsRepr, PacketType, PktFlags};

impl<D: Device> Endpoint<D> {
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
            TxKind::Msg | TxKind::Write => op.proto.name() == Proto::LongCts && !read,
            _ => false,
        };
        if op.peer != peer || !fits || op.phase == TxPhase::Start {
            self.counters.drop(DropReason::StaleId);
            return;
        }
        // Spec 3.2: a CTS grants > 0 bytes; one granting past the end can
        // only be a duplicate.
        let TxProto::LongCts { granted, .. } = &mut op.proto else {
            unreachable!("a CTS fits long-CTS operations only")
        };
        if cts.recv_length == 0 || *granted >= op.total {
            self.counters.drop(DropReason::Invalid);
            return;
        }
        *granted = granted.saturating_add(cts.recv_length).min(op.total);
        op.recv_id = RemoteId(cts.recv_id);
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
            None => matches!(op.proto, RxProto::LongCts { .. }),
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

    /// Grants the next window of a long-CTS receive once half the current
    /// one arrived, so the sender never idles waiting for a CTS.
    pub(super) fn maybe_grant(&mut self, id: RxId) {
        let window = self.cts_window_bytes(self.rx_ops.get(id).expect("live op").peer);
        let op = self.rx_ops.get_mut(id).expect("live op");
        let RxProto::LongCts { granted } = &mut op.proto else { return };
        // A read's CTS names the responder's operation, which its READRSP
        // tells; CTSDATA that overtook it must wait for it.
        let unknown_responder = op.kind == RxKind::Read && op.send_id == RemoteId::UNKNOWN;
        if *granted >= op.total || op.received + window / 2 < *granted || unknown_responder {
            return;
        }
        // Spec 3.2: recv_length > 0 always.
        let grant = window.min(op.total - *granted);
        *granted += grant;
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

    /// A CTS into `buf`: `recv_length` more bytes of the sender's
    /// `send_id` (a read's responder with `read`) may come to `recv_id`.
    pub(super) fn emit_cts(
        &mut self,
        buf: BufId,
        peer: PeerId,
        send_id: RemoteId,
        recv_id: RxId,
        recv_length: u64,
        read: bool,
    ) -> (PeerId, PacketType, usize) {
        let flags = if read { CtsFlags::EMULATED_READ } else { CtsFlags::empty() };
        let repr = CtsRepr {
            flags,
            connid: self.ctrl_connid(peer),
            send_id: send_id.0,
            recv_id: recv_id.0,
            recv_length,
        };
        (peer, PacketType::Cts, repr.emit(self.dev.held_mut(buf)))
    }

    /// The next CTSDATA of send-side operation `id` into `buf`, as much of
    /// the granted data as fits; returns its type, header length and data
    /// length.
    pub(super) fn emit_ctsdata(&mut self, buf: BufId, id: TxId) -> (PacketType, usize, u64) {
        let op = self.tx_ops.get(id).expect("live op");
        let TxProto::LongCts { granted, .. } = op.proto else { unreachable!("long-CTS data") };
        let mut d = CtsDataRepr {
            flags: PktFlags::empty(),
            recv_id: op.recv_id.0,
            seg_length: 0,
            seg_offset: op.sent,
            connid: self.ctrl_connid(op.peer),
        };
        let room = (self.caps.mtu - d.buffer_len()) as u64;
        d.seg_length = (granted - op.sent).min(room);
        (PacketType::CtsData, d.emit(self.dev.held_mut(buf)), d.seg_length)
    }
}
