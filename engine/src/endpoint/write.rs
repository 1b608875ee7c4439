//! Emulated write (spec 3.3): EAGER_RTW and DC_EAGER_RTW carry the data;
//! LONGCTS_RTW and DC_LONGCTS_RTW go on by long-CTS, LONGREAD_RTW by
//! long-read (spec 4.1). The target checks every iov against its
//! registrations (key known, range inside, right granted) before a byte
//! moves; a violation is counted and dropped, and the writer, told
//! nothing, times out if it waits for an answer.

use super::cq::{Completion, Op};
use super::msg::{copy_in, iov_total};
use super::ops::{Proto, RxKind, RxOp, RxProto, RxState, Sgl, TxKind};
use super::types::{BufId, Ctrl, RemoteId, ReqInfo};
use super::{DropReason, Endpoint, Error, PeerId, Span};
use crate::device::{Access, Device};
use crate::mem::AccessError;
use crate::wire::{PacketType, ReqFlags, RmaIov, extra};

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
        let id = self
            .tx_ops
            .insert_with(|op| {
                op.reset(TxKind::Write, peer, proto, ctx);
                op.set_src(src);
                op.cq_data = cq_data;
                op.set_remote(remote);
                // A long-read write ends with EOR; `dc` picks the protocol
                // it falls back to after a READ_NACK.
                op.dc = dc;
            })
            .ok_or(Error::Again)?;
        if self.tx_ops.get(id).expect("live op").watches_peer() {
            self.watch_tx(id);
        }
        self.mark_ready(id);
        if self.txq.pending_len() == 0 {
            self.flush_tx();
        }
        Ok(())
    }

    /// EAGER_RTW / DC_EAGER_RTW: the data is in the packet. Inlined into
    /// its routing table entry, the one caller.
    #[inline(always)]
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
    /// takes the rest. False, the packet left to the caller, when there is
    /// no room for the entry.
    pub(super) fn handle_long_rtw(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        let long_read = info.ptype == PacketType::LongReadRtw;
        // Flagged READ_NACK, a long-CTS write is the retry of a long-read
        // one we could not read, new to us and without data (interop
        // notes); a long-read write cannot be a retry.
        if info.flags.contains(ReqFlags::READ_NACK) && (long_read || info.payload_len != 0) {
            self.counters.drop(DropReason::Unsupported);
            self.release_rx(buf);
            return true;
        }
        let iovs = self.req_iovs(buf, info.rma_iov);
        let Ok(dst) = self.resolve_iovs(iovs.as_slice(), Access::REMOTE_WRITE) else {
            self.release_rx(buf);
            return true;
        };
        let bad = iov_total(iovs.as_slice()) != Some(info.msg_length)
            || info.payload_len as u64 > info.msg_length
            || (long_read && (info.read_iov.n == 0 || info.payload_len != 0));
        if bad {
            self.counters.drop(DropReason::Invalid);
            self.release_rx(buf);
            return true;
        }
        let mut op = RxOp::new(RxKind::Write, RxState::Matched);
        op.dst = dst;
        op.peer = peer;
        op.proto = if long_read {
            RxProto::start(Proto::LongRead, 0)
        } else {
            RxProto::start(Proto::LongCts, info.payload_len as u64)
        };
        op.dc = info.ptype == PacketType::DcLongCtsRtw;
        op.cq_data = info.cq_data;
        op.total = info.msg_length;
        op.send_id = RemoteId(info.send_id);
        op.read_iov = self.req_iovs(buf, info.read_iov);
        let Some(id) = self.rx_ops.insert(op) else {
            // Waits, holding its buffer, for a free entry.
            self.counters.rx_ops_exhausted += 1;
            return false;
        };
        self.land(id, buf, info.payload_off, info.payload_len, 0);
        self.release_rx(buf);
        self.advance_rx(id);
        true
    }

    /// Local spans for a REQ's rma_iov list, each checked against our
    /// registrations for `need`; counts and returns the violation.
    pub(super) fn resolve_iovs(
        &mut self,
        iovs: &[RmaIov],
        need: Access,
    ) -> Result<Sgl, AccessError> {
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
}
