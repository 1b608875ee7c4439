//! Emulated read (spec 3.3): the requester's SHORT_RTR or LONGCTS_RTR;
//! the responder's READRSP with the first bytes, then CTSDATA as the
//! requester's CTS packets (flagged as a read's) grant. The responder
//! checks the iovs as a write's target does.

use super::cq::{Completion, Op};
use super::msg::iov_total;
use super::ops::{Iovs, Proto, RxKind, RxOp, RxProto, RxState, Sgl, TxKind, TxProto};
use super::types::{BufId, Ctrl, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, Error, PeerId, Span};
use crate::device::{Access, Device, HeldBufs};
use crate::wire::{IovList, PacketType, PktFlags, ReadRspRepr, ReqRepr, RmaIov, extra};

impl<D: Device> Endpoint<D> {
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
        op.proto = RxProto::LongCts { granted: 0 };
        op.total = dst.len;
        op.send_id = RemoteId::UNKNOWN;
        op.read_iov = Iovs::one(remote);
        let readrsp_room = (self.caps.mtu - ReadRspRepr::default().buffer_len()) as u64;
        let window = self.cts_window_bytes(peer).max(readrsp_room);
        let granted = if dst.len <= readrsp_room { dst.len } else { window.min(dst.len) };
        op.proto = RxProto::LongCts { granted };
        let rx = self.rx_ops.insert(op).ok_or(Error::Again)?;
        self.peers.get_mut(peer).expect("checked peer").req_sent = true;
        self.queue_ctrl(Ctrl::Rtr { rx });
        self.watch_rx(rx);
        if self.txq.pending_len() == 0 {
            self.flush_tx();
        }
        Ok(())
    }

    /// SHORT_RTR / LONGCTS_RTR: send the requested bytes back, READRSP
    /// first, then CTSDATA as the requester grants. Inlined into its
    /// routing table entry, the one caller.
    #[inline(always)]
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
            op.recv_id = RemoteId(info.recv_id);
            let granted = (info.recv_length as u64).min(op.total);
            op.proto = TxProto::LongCts { granted, after_nack: false };
        }) else {
            // The requester times out; nothing here is lost.
            self.counters.drop(DropReason::Unsupported);
            return;
        };
        self.watch_tx(id);
        self.mark_ready(id);
    }

    /// The request of emulated read `rx` into `buf` (SHORT_RTR when the
    /// whole read fits one READRSP, else LONGCTS_RTR); `None` if `rx` is
    /// gone.
    pub(super) fn emit_rtr(&mut self, buf: BufId, rx: RxId) -> Option<(PeerId, PacketType, usize)> {
        let op = self.rx_ops.get(rx)?;
        let RxProto::LongCts { granted } = op.proto else { unreachable!("an emulated read") };
        let (peer, total) = (op.peer, op.total);
        let remote = op.read_iov;
        let readrsp_room = (self.caps.mtu - ReadRspRepr::default().buffer_len()) as u64;
        let ptype =
            if total <= readrsp_room { PacketType::ShortRtr } else { PacketType::LongCtsRtr };
        let mut r = ReqRepr::new(ptype);
        r.msg_length = total;
        r.recv_id = rx.0;
        // SHORT_RTR carries the read length here too (interop notes).
        r.recv_length = granted.min(u32::MAX as u64) as u32;
        r.rma_iov = IovList::Host(remote.as_slice());
        let (raw, connid) = self.req_opt_headers(peer);
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        Some((peer, ptype, r.emit(self.dev.held_mut(buf))))
    }

    /// The responder's first packet of read `id` into `buf`: READRSP, with
    /// as much of the granted data as fits; returns its type, header
    /// length and data length.
    pub(super) fn emit_readrsp(&mut self, buf: BufId, id: TxId) -> (PacketType, usize, u64) {
        let op = self.tx_ops.get(id).expect("live op");
        let TxProto::LongCts { granted, .. } = op.proto else { unreachable!("a read's response") };
        let mut r = ReadRspRepr {
            flags: PktFlags::empty(),
            connid: self.ctrl_connid(op.peer),
            recv_id: op.recv_id.0,
            send_id: id.0,
            recv_length: 0,
        };
        let room = (self.caps.mtu - r.buffer_len()) as u64;
        r.recv_length = (granted - op.sent).min(room);
        (PacketType::ReadRsp, r.emit(self.dev.held_mut(buf)), r.recv_length)
    }
}
