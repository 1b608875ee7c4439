//! Direct RMA (spec 4.1 direct read, 4.6 direct write): a read or write
//! the device does by RDMA when both sides can, posted in segments, a
//! window of them in flight; a write's CQ data goes as the last segment's
//! immediate, which the target reports. The RDMA reads of long-read
//! receives (`longread`) go out through the same queue.

use super::cq::{Completion, Op};
use super::ops::{Proto, Sgl, TxKind};
use super::tx::device_status;
use super::types::{BufId, RxId, TxId};
use super::{DropReason, Endpoint, Error, PeerId, Span};
use crate::device::{CqStatus, Cqe, Device, RdmaOp, RdmaWr, Source};
use crate::wire::RmaIov;

/// Largest RDMA segment: its length lives in 31 bits of the work request
/// id.
const MAX_SEGMENT: u64 = 1 << 30;

/// Work request id of an RDMA segment: which slab, which operation, how
/// many bytes.
pub(super) fn rdma_wr_id(rx: bool, id: u32, len: u64) -> u64 {
    debug_assert!(len <= MAX_SEGMENT);
    ((rx as u64) << 63) | ((id as u64) << 31) | len
}

fn split_wr_id(wr_id: u64) -> (bool, u32, u64) {
    (wr_id >> 63 == 1, (wr_id >> 31) as u32, wr_id & ((1 << 31) - 1))
}

/// The next RDMA segment of a transfer at message offset `at` (below
/// `end`): the remote piece from `remote` (a contiguous message across up
/// to four iovs) and the local piece from `local`.
pub(super) fn next_segment(
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
    /// A direct RDMA read or write, posted in segments by `post_next_rdma`.
    pub(super) fn start_rdma(
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
                op.start_transfer();
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
    pub(super) fn post_rdma_wr(&mut self, wr: RdmaWr) -> bool {
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
    pub(super) fn rdma_wr(
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
        self.post_next_read()
    }

    /// An RDMA segment finished.
    pub(super) fn handle_rdma_done(&mut self, cqe: &Cqe) {
        let (rx, raw, len) = split_wr_id(cqe.wr_id);
        let deadline = self.fresh_deadline();
        if rx {
            self.handle_read_done(RxId(raw), len, cqe.status, deadline);
            return;
        }
        let id = TxId(raw);
        let Some(op) = self.tx_ops.get_mut(id) else { return };
        op.in_flight -= 1;
        op.deadline = deadline;
        if cqe.status != CqStatus::Ok {
            op.error.get_or_insert(device_status(cqe.status));
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
        let buf = BufId::from_wr_id(cqe.wr_id);
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
}
