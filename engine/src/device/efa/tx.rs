//! The send queue's bookkeeping, apart from the verbs so that it is tested
//! without a device: a slot per work request in flight (its kind, for EFA
//! reports an RDMA read's completion with the send opcode; the request
//! itself, for an RNR repost), completion statuses from EFA's vendor
//! codes, and the RNR backoff.

use std::collections::VecDeque;

use crate::device::{CqOp, CqStatus, MrId, RdmaOp, RdmaWr, SendWr};

/// A work request as posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Work {
    Send(SendWr),
    Rdma(RdmaWr),
}

impl Work {
    /// What its completion completes, whatever opcode the device reports.
    pub(super) fn op(&self) -> CqOp {
        match self {
            Work::Send(_) => CqOp::Send,
            Work::Rdma(RdmaWr { op: RdmaOp::Read, .. }) => CqOp::Read,
            Work::Rdma(RdmaWr { op: RdmaOp::Write { .. }, .. }) => CqOp::Write,
        }
    }

    pub(super) fn wr_id(&self) -> u64 {
        match self {
            Work::Send(wr) => wr.wr_id,
            Work::Rdma(wr) => wr.wr_id,
        }
    }

    /// The registered region it reads or writes, busy while it is posted.
    pub(super) fn region(&self) -> Option<MrId> {
        match self {
            Work::Send(wr) => wr.data.map(|d| d.mr),
            Work::Rdma(wr) => Some(wr.local),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    work: Work,
    /// RNRs in a row: the next backoff doubles with each.
    rnr: u32,
}

/// A slot per send-queue entry: a posted request's `wr_id` on the wire is
/// its slot's index, so a completion finds its request without a search.
/// Its capacity is the send queue's depth, so a batch never exceeds the
/// queue's free entries.
#[derive(Debug)]
pub(super) struct Slots {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
}

impl Slots {
    pub(super) fn new(depth: usize) -> Slots {
        Slots { slots: vec![None; depth], free: (0..depth as u32).rev().collect() }
    }

    /// Entries free for new work.
    pub(super) fn free(&self) -> usize {
        self.free.len()
    }

    /// A slot for `work`, or `None` when the queue is full.
    pub(super) fn take(&mut self, work: Work) -> Option<u32> {
        let i = self.free.pop()?;
        self.slots[i as usize] = Some(Slot { work, rnr: 0 });
        Some(i)
    }

    /// The work in slot `i`, if it is taken.
    pub(super) fn get(&self, i: u64) -> Option<Work> {
        let slot = self.slots.get(usize::try_from(i).ok()?)?;
        slot.map(|s| s.work)
    }

    /// Frees slot `i` (its work completed, or its batch was not posted);
    /// returns its work.
    pub(super) fn release(&mut self, i: u32) -> Option<Work> {
        let slot = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(slot.work)
    }

    /// Counts an RNR of slot `i`; returns how many in a row.
    pub(super) fn rnr(&mut self, i: u32) -> u32 {
        match self.slots.get_mut(i as usize).and_then(Option::as_mut) {
            Some(s) => {
                s.rnr += 1;
                s.rnr
            }
            None => 0,
        }
    }
}

/// EFA's completion status codes (the vendor error of a completion):
/// rdma-core providers/efa/efa_io_defs.h, `enum efa_io_comp_status`.
pub mod efa_io {
    pub const OK: u32 = 0;
    pub const FLUSHED: u32 = 1;
    pub const LOCAL_ERROR_QP_INTERNAL_ERROR: u32 = 2;
    pub const LOCAL_ERROR_UNSUPPORTED_OP: u32 = 3;
    pub const LOCAL_ERROR_INVALID_AH: u32 = 4;
    pub const LOCAL_ERROR_INVALID_LKEY: u32 = 5;
    pub const LOCAL_ERROR_BAD_LENGTH: u32 = 6;
    /// The destination is down or does not run EFA; also a remote address
    /// or key the target refuses (verbs: `IBV_WC_REM_ACCESS_ERR`).
    pub const REMOTE_ERROR_BAD_ADDRESS: u32 = 7;
    pub const REMOTE_ERROR_ABORT: u32 = 8;
    pub const REMOTE_ERROR_BAD_DEST_QPN: u32 = 9;
    /// No receive posted at the destination.
    pub const REMOTE_ERROR_RNR: u32 = 10;
    pub const REMOTE_ERROR_BAD_LENGTH: u32 = 11;
    pub const REMOTE_ERROR_BAD_STATUS: u32 = 12;
    pub const LOCAL_ERROR_UNRESP_REMOTE: u32 = 13;
    /// The target has no address handle for us (RDMA needs one).
    pub const REMOTE_ERROR_UNKNOWN_PEER: u32 = 14;
    pub const LOCAL_ERROR_UNREACH_REMOTE: u32 = 15;
    pub const REMOTE_ERROR_FEATURE_MISMATCH: u32 = 18;
}

/// How a completion ended, for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Done(CqStatus),
    /// The receiver had no buffer: post it again after a backoff.
    Rnr,
}

/// The verbs statuses the mapping falls back on (`enum ibv_wc_status`).
pub(super) mod wc {
    use rdma_sys::ibv_wc_status as s;
    pub const SUCCESS: u32 = s::IBV_WC_SUCCESS;
    pub const LOC_LEN_ERR: u32 = s::IBV_WC_LOC_LEN_ERR;
    pub const LOC_QP_OP_ERR: u32 = s::IBV_WC_LOC_QP_OP_ERR;
    pub const LOC_PROT_ERR: u32 = s::IBV_WC_LOC_PROT_ERR;
    pub const WR_FLUSH_ERR: u32 = s::IBV_WC_WR_FLUSH_ERR;
    pub const REM_INV_REQ_ERR: u32 = s::IBV_WC_REM_INV_REQ_ERR;
    pub const REM_ACCESS_ERR: u32 = s::IBV_WC_REM_ACCESS_ERR;
    pub const REM_OP_ERR: u32 = s::IBV_WC_REM_OP_ERR;
    pub const RNR_RETRY_EXC_ERR: u32 = s::IBV_WC_RNR_RETRY_EXC_ERR;
    pub const REM_ABORT_ERR: u32 = s::IBV_WC_REM_ABORT_ERR;
    pub const RESP_TIMEOUT_ERR: u32 = s::IBV_WC_RESP_TIMEOUT_ERR;
}

/// A completion's outcome from its verbs status and EFA vendor code (the
/// vendor code decides; the verbs status is for a code this table does
/// not know).
pub(super) fn outcome(status: u32, vendor_err: u32) -> Outcome {
    use efa_io::*;
    if status == wc::SUCCESS {
        return Outcome::Done(CqStatus::Ok);
    }
    let mapped = match vendor_err {
        REMOTE_ERROR_RNR => return Outcome::Rnr,
        FLUSHED | LOCAL_ERROR_QP_INTERNAL_ERROR | REMOTE_ERROR_BAD_STATUS
        | REMOTE_ERROR_FEATURE_MISMATCH => Some(CqStatus::DeviceError),
        LOCAL_ERROR_UNSUPPORTED_OP
        | LOCAL_ERROR_INVALID_AH
        | LOCAL_ERROR_INVALID_LKEY
        | LOCAL_ERROR_BAD_LENGTH
        // The peer's buffer is shorter than what we sent: our packet's
        // fault, as a local length error is.
        | REMOTE_ERROR_BAD_LENGTH => Some(CqStatus::LocalError),
        REMOTE_ERROR_BAD_ADDRESS | REMOTE_ERROR_UNKNOWN_PEER => Some(CqStatus::RemoteAccess),
        REMOTE_ERROR_ABORT
        | REMOTE_ERROR_BAD_DEST_QPN
        | LOCAL_ERROR_UNRESP_REMOTE
        | LOCAL_ERROR_UNREACH_REMOTE => Some(CqStatus::PeerUnreachable),
        _ => None,
    };
    if let Some(s) = mapped {
        return Outcome::Done(s);
    }
    Outcome::Done(match status {
        wc::RNR_RETRY_EXC_ERR => return Outcome::Rnr,
        wc::REM_ACCESS_ERR => CqStatus::RemoteAccess,
        wc::LOC_LEN_ERR | wc::LOC_QP_OP_ERR | wc::LOC_PROT_ERR | wc::REM_INV_REQ_ERR => {
            CqStatus::LocalError
        }
        wc::REM_OP_ERR | wc::REM_ABORT_ERR | wc::RESP_TIMEOUT_ERR => CqStatus::PeerUnreachable,
        wc::WR_FLUSH_ERR => CqStatus::DeviceError,
        _ => CqStatus::DeviceError,
    })
}

/// Work the receiver had no buffer for, waiting to be posted again: each
/// RNR in a row doubles the wait, from `min_ns` up to `max_ns` (as the
/// provider backs off a peer that answered RNR). Its capacity is the send
/// queue's depth, so it never grows on the hot path.
#[derive(Debug)]
pub(super) struct RnrQueue {
    waiting: VecDeque<(u64, u32)>,
    min_ns: u64,
    max_ns: u64,
}

impl RnrQueue {
    pub(super) fn new(depth: usize, min_ns: u64, max_ns: u64) -> RnrQueue {
        RnrQueue { waiting: VecDeque::with_capacity(depth), min_ns, max_ns: max_ns.max(min_ns) }
    }

    /// The wait before the `nth` RNR in a row (from 1) is retried.
    pub(super) fn backoff_ns(&self, nth: u32) -> u64 {
        let doublings = nth.saturating_sub(1).min(32);
        self.min_ns.saturating_mul(1 << doublings).min(self.max_ns)
    }

    /// Slot `slot` waits for its `nth` RNR in a row, from `now`.
    pub(super) fn push(&mut self, slot: u32, nth: u32, now: u64) {
        self.waiting.push_back((now + self.backoff_ns(nth), slot));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The first slot whose wait is over at `now`, taken off the queue.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<u32> {
        let i = self.waiting.iter().position(|&(due, _)| due <= now)?;
        self.waiting.remove(i).map(|(_, slot)| slot)
    }

    /// Puts back a slot that could not be posted, due at once.
    pub(super) fn push_front(&mut self, slot: u32, now: u64) {
        self.waiting.push_front((now, slot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Ah, BufId, DataSeg};

    fn send(wr_id: u64) -> Work {
        Work::Send(SendWr { ah: Ah(0), buf: BufId(1), len: 64, data: None, wr_id })
    }

    fn rdma(op: RdmaOp, wr_id: u64) -> Work {
        Work::Rdma(RdmaWr {
            op,
            ah: Ah(0),
            local: MrId(3),
            local_offset: 0,
            len: 4096,
            remote_addr: 0x1000,
            remote_key: 7,
            wr_id,
        })
    }

    #[test]
    fn a_read_completes_as_a_read_whatever_opcode_efa_reports() {
        let mut slots = Slots::new(4);
        let r = slots.take(rdma(RdmaOp::Read, 10)).unwrap();
        let w = slots.take(rdma(RdmaOp::Write { imm: Some(5) }, 11)).unwrap();
        let s = slots.take(send(12)).unwrap();
        // The slot, not the completion's opcode, says what completed.
        assert_eq!(slots.get(u64::from(r)).map(|w| w.op()), Some(CqOp::Read));
        assert_eq!(slots.get(u64::from(w)).map(|w| w.op()), Some(CqOp::Write));
        assert_eq!(slots.get(u64::from(s)).map(|w| w.op()), Some(CqOp::Send));
        assert_eq!(slots.release(r).map(|w| w.wr_id()), Some(10));
        assert_eq!(slots.get(u64::from(r)), None, "a released slot is empty");
        assert_eq!(slots.get(99), None, "a wr_id no slot has");
    }

    #[test]
    fn slots_cap_a_batch_at_the_free_entries_and_a_rollback_frees_them() {
        let mut slots = Slots::new(3);
        let taken: Vec<u32> = (0..5).map_while(|i| slots.take(send(i))).collect();
        assert_eq!(taken.len(), 3, "no more than the queue's depth");
        assert_eq!(slots.free(), 0);
        // A batch the device refused is released whole, as not posted.
        for &i in &taken {
            slots.release(i);
        }
        assert_eq!(slots.free(), 3);
        assert_eq!(slots.release(taken[0]), None, "released once");
    }

    #[test]
    fn a_region_is_busy_for_the_work_that_uses_it() {
        let with_data = Work::Send(SendWr {
            ah: Ah(0),
            buf: BufId(0),
            len: 8,
            data: Some(DataSeg { mr: MrId(2), offset: 0, len: 100 }),
            wr_id: 1,
        });
        assert_eq!(with_data.region(), Some(MrId(2)));
        assert_eq!(send(1).region(), None);
        assert_eq!(rdma(RdmaOp::Read, 1).region(), Some(MrId(3)));
    }

    #[test]
    fn efa_vendor_codes_map_to_completion_statuses() {
        use efa_io::*;
        let err = 12; // any verbs error status
        let cases = [
            (REMOTE_ERROR_BAD_ADDRESS, CqStatus::RemoteAccess),
            (REMOTE_ERROR_UNKNOWN_PEER, CqStatus::RemoteAccess),
            (REMOTE_ERROR_BAD_DEST_QPN, CqStatus::PeerUnreachable),
            (REMOTE_ERROR_ABORT, CqStatus::PeerUnreachable),
            (LOCAL_ERROR_UNRESP_REMOTE, CqStatus::PeerUnreachable),
            (LOCAL_ERROR_UNREACH_REMOTE, CqStatus::PeerUnreachable),
            (LOCAL_ERROR_INVALID_LKEY, CqStatus::LocalError),
            (LOCAL_ERROR_INVALID_AH, CqStatus::LocalError),
            (LOCAL_ERROR_BAD_LENGTH, CqStatus::LocalError),
            (REMOTE_ERROR_BAD_LENGTH, CqStatus::LocalError),
            (FLUSHED, CqStatus::DeviceError),
            (LOCAL_ERROR_QP_INTERNAL_ERROR, CqStatus::DeviceError),
            (REMOTE_ERROR_FEATURE_MISMATCH, CqStatus::DeviceError),
        ];
        for (code, want) in cases {
            assert_eq!(outcome(err, code), Outcome::Done(want), "vendor code {code}");
        }
        assert_eq!(outcome(err, REMOTE_ERROR_RNR), Outcome::Rnr);
        assert_eq!(outcome(wc::SUCCESS, 0), Outcome::Done(CqStatus::Ok));
    }

    #[test]
    fn an_unknown_vendor_code_falls_back_on_the_verbs_status() {
        assert_eq!(outcome(wc::REM_ACCESS_ERR, 200), Outcome::Done(CqStatus::RemoteAccess));
        assert_eq!(outcome(wc::RNR_RETRY_EXC_ERR, 200), Outcome::Rnr);
        assert_eq!(outcome(wc::RESP_TIMEOUT_ERR, 200), Outcome::Done(CqStatus::PeerUnreachable));
        assert_eq!(outcome(wc::LOC_PROT_ERR, 200), Outcome::Done(CqStatus::LocalError));
        assert_eq!(outcome(99, 200), Outcome::Done(CqStatus::DeviceError));
    }

    #[test]
    fn rnr_backoff_doubles_to_its_cap_and_releases_work_when_due() {
        let mut q = RnrQueue::new(4, 1_000, 5_000);
        assert_eq!([1, 2, 3, 4, 40].map(|n| q.backoff_ns(n)), [1_000, 2_000, 4_000, 5_000, 5_000]);
        q.push(7, 1, 100); // due at 1_100
        q.push(8, 3, 100); // due at 4_100
        assert_eq!(q.pop_due(1_000), None, "not yet");
        assert_eq!(q.pop_due(2_000), Some(7));
        assert_eq!(q.pop_due(2_000), None);
        q.push_front(7, 2_000);
        assert_eq!(q.pop_due(2_000), Some(7), "put back: due at once");
        assert_eq!(q.pop_due(5_000), Some(8));
        assert!(q.is_empty());
    }
}
