//! Queue pairs: an SRD (or UD) QP is one udp device. A send of one SGE of
//! registered memory names it to the device, which sends from it; others
//! (inline data, two SGEs) are copied into the device's packet buffers;
//! RDMA names a registered region. Completions come back through the CQs,
//! which drain each QP's device (`Qp::drain`).
//!
//! The send path keeps EFA's rules (rdma-core providers/efa/verbs.c,
//! `efa_post_send_validate`): the QP must be in RTS, every WR signaled
//! (or the QP `sq_sig_all`), flags only SIGNALED and INLINE, and the SQ
//! not full; an `ibv_wr_*` session that breaks one fails as a whole at
//! `ibv_wr_complete`, nothing of it posted.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use efapoll::device::udp::UdpDevice;
use efapoll::device::{
    Ah as UdpAh, BufId, CqOp, CqStatus, Cqe, DataSeg, Device, RdmaOp, RdmaWr, SendWr, Source,
};
use efapoll::wire::RawAddr;
use rdma_sys::*;

use crate::ctx::{Ah, Ctx, MrInfo, Pd, set_errno, udp_config};
use crate::efadv::*;
use crate::limits::*;
use crate::lock::SpinLock;
use crate::status::{self, to_ibv};
use crate::{config, cq::Attached, cq::Cq, cq::Wc};

/// What a send-queue WR does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Read { rkey: u32, raddr: u64 },
    Write { rkey: u32, raddr: u64, imm: Option<u32> },
}

/// A WR between `ibv_wr_start` and `ibv_wr_complete` (or one of a
/// `post_send` chain).
#[derive(Debug, Clone, Copy)]
struct Pending {
    op: Op,
    wr_id: u64,
    /// Sends: the packet buffer the payload is gathered into (RDMA:
    /// `BufId::NONE`).
    buf: BufId,
    len: u32,
    /// Sends of one span of registered memory: the span (and its address),
    /// which the device sends from where it is, as a NIC reads it at send
    /// time (the caller leaves it alone until the completion); not copied
    /// into `buf`.
    data: Option<(DataSeg, u64)>,
    /// RDMA: the local span.
    local: Option<(MrInfo, u64)>,
    dest: Option<(*mut ibv_ah, u32, u32)>,
    /// Sends: immediate data (`ibv_wr_send_imm`, `IBV_WR_SEND_WITH_IMM`),
    /// passed through as given.
    imm: Option<u32>,
    /// A vendor error to complete with instead of posting.
    err: u32,
}

/// A send queue slot: what a udp completion (by its wr_id) completes.
#[derive(Debug, Clone, Copy, Default)]
struct SendSlot {
    wr_id: u64,
    buf: Option<BufId>,
    opcode: u32,
}

const NO_SGE: ibv_sge = ibv_sge { addr: 0, length: 0, lkey: 0 };

/// A udp address handle's peer, and the AH number its GID had here at
/// generation `ahs_gen` of the context's AH table.
#[derive(Debug, Clone, Copy)]
struct BookEntry {
    gid: [u8; 16],
    qpn: u16,
    ahn: u16,
    ahs_gen: u64,
}

/// A posted receive, by the packet buffer that stands for it.
#[derive(Clone, Copy)]
struct RecvSlot {
    wr_id: u64,
    sge: [ibv_sge; MAX_RQ_SGE as usize],
    nsge: u32,
}

/// The PD's registrations a QP reaches, by key, and the last one looked
/// up: a program sends from and receives into few regions, so an SGE's
/// key costs a comparison, not a hash.
#[derive(Debug, Default)]
struct Mrs {
    by_key: HashMap<u32, MrInfo>,
    last: Option<(u32, MrInfo)>,
}

impl Mrs {
    fn get(&mut self, key: u32) -> Option<MrInfo> {
        if let Some((k, m)) = self.last
            && k == key
        {
            return Some(m);
        }
        let m = *self.by_key.get(&key)?;
        self.last = Some((key, m));
        Some(m)
    }

    fn insert(&mut self, key: u32, m: MrInfo) {
        self.by_key.insert(key, m);
        self.last = None;
    }

    fn remove(&mut self, key: u32) {
        self.by_key.remove(&key);
        self.last = None;
    }
}

pub(crate) struct QpInner {
    dev: UdpDevice,
    state: ibv_qp_state::Type,
    qkey: u32,
    sq_psn: u32,
    rnr_retry: u8,
    /// Send WRs posted whose completion a CQ has not taken.
    sq_used: u32,
    rq_used: u32,
    free_bufs: Vec<BufId>,
    sends: Vec<SendSlot>,
    free_sends: Vec<u32>,
    recvs: Vec<RecvSlot>,
    mrs: Mrs,
    /// The udp address handle of the last destination, and each handle's
    /// peer, to name a known sender.
    last_dest: Option<(RawAddr, UdpAh)>,
    book: Vec<BookEntry>,
    /// The WRs of the open `ibv_wr_*` session, and its error.
    batch: Vec<Pending>,
    wr_err: c_int,
    done_send: VecDeque<Wc>,
    done_recv: VecDeque<Wc>,
    cqes: Vec<Cqe>,
    send_wrs: Vec<SendWr>,
    /// Each of `send_wrs`' immediate data.
    send_imms: Vec<Option<u32>>,
    rdma_wrs: Vec<RdmaWr>,
}

#[repr(C)]
pub(crate) struct Qp {
    /// First: an `ibv_qp` and an `ibv_qp_ex` are pointers to the Qp.
    qpx: ibv_qp_ex,
    pd: *const Pd,
    ctx: *const Ctx,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    sq_sig_all: bool,
    extended: bool,
    qp_type: ibv_qp_type::Type,
    max_inline: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    sq_depth: u32,
    rq_depth: u32,
    qpn: u32,
    /// Polls of its CQ that drove it: written under `inner`'s lock, read
    /// by the progress thread, which drives the QP when this stands still.
    polls: AtomicU64,
    inner: SpinLock<QpInner>,
}

// SAFETY: the raw pointers are to the QP's PD, context and CQs, which
// outlive it and are Sync; the mutable state is behind the lock.
unsafe impl Sync for Qp {}
// SAFETY: as above.
unsafe impl Send for QpInner {}

impl Pending {
    /// Forgets the payload gathered so far: an `ibv_wr_set_*` call sets it
    /// whole.
    fn clear_payload(&mut self) {
        self.len = 0;
        self.data = None;
    }
}

impl Qp {
    /// # Safety
    /// `qp` came from one of our create calls and is not destroyed.
    unsafe fn of<'a>(qp: *mut ibv_qp) -> &'a Qp {
        // SAFETY: the ibv_qp is the first field of a Qp (repr(C)).
        unsafe { &*qp.cast::<Qp>() }
    }

    /// Makes a registration of the PD usable here.
    pub(crate) fn attach(&self, mr: &MrInfo) {
        let mut q = self.inner.lock();
        if q.dev.attach(&mr.udp).is_ok() {
            q.mrs.insert(mr.udp.key as u32, *mr);
        }
    }

    /// Drives the device (when `drive`) and moves up to `max` completions
    /// of the queues `send` and `recv` into `out` (a CQ's poll); whether
    /// some of them remain.
    pub(crate) fn drain(
        &self,
        send: bool,
        recv: bool,
        drive: bool,
        _cq: *mut ibv_cq,
        out: &mut VecDeque<Wc>,
        max: usize,
    ) -> bool {
        let mut q = self.inner.lock();
        let q = &mut *q;
        if drive {
            // Only the lock's holder writes it: no atomic read-modify-write.
            let n = self.polls.load(Ordering::Relaxed);
            self.polls.store(n.wrapping_add(1), Ordering::Relaxed);
            self.progress(q);
        }
        // (Most polls find nothing: no drain then.)
        if send && !q.done_send.is_empty() {
            let n = q.done_send.len().min(max);
            out.extend(q.done_send.drain(..n));
            q.sq_used -= n as u32;
        }
        if recv && !q.done_recv.is_empty() {
            let n = q.done_recv.len().min(max);
            out.extend(q.done_recv.drain(..n));
            q.rq_used -= n as u32;
        }
        (send && !q.done_send.is_empty()) || (recv && !q.done_recv.is_empty())
    }

    /// How many CQ polls drove the QP so far.
    pub(crate) fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    /// Drives the QP as its CQ's poll would, keeping what completed for
    /// that poll, unless someone holds it (then it is in use: left alone,
    /// None). Else whether its device has nothing more to do until a
    /// datagram comes, and the descriptor that comes on.
    pub(crate) fn try_progress(&self) -> Option<(bool, std::os::fd::RawFd)> {
        let mut q = self.inner.try_lock()?;
        self.progress(&mut q);
        Some((q.dev.is_quiet(), q.dev.rx_fd()))
    }

    /// Polls the udp device and turns its completions into work
    /// completions.
    fn progress(&self, q: &mut QpInner) {
        let mut cqes = std::mem::take(&mut q.cqes);
        let n = q.dev.poll(&mut cqes);
        for c in &cqes[..n] {
            match c.op {
                CqOp::Recv | CqOp::RecvImm | CqOp::RecvWriteImm => {
                    let w = self.received(q, c);
                    q.done_recv.push_back(w);
                }
                CqOp::Send | CqOp::Read | CqOp::Write => {
                    let slot = q.sends[c.wr_id as usize];
                    q.free_sends.push(c.wr_id as u32);
                    if let Some(b) = slot.buf {
                        q.free_bufs.push(b);
                    }
                    let vendor = match c.status {
                        CqStatus::Ok => status::OK,
                        CqStatus::RemoteAccess => status::REMOTE_ERROR_BAD_ADDRESS,
                        CqStatus::PeerUnreachable => status::LOCAL_ERROR_UNRESP_REMOTE,
                        CqStatus::LocalError | CqStatus::DeviceError => {
                            status::LOCAL_ERROR_QP_INTERNAL_ERROR
                        }
                    };
                    let w = self.wc(slot.wr_id, slot.opcode, vendor);
                    q.done_send.push_back(w);
                }
            }
        }
        q.cqes = cqes;
    }

    fn wc(&self, wr_id: u64, opcode: u32, vendor: u32) -> Wc {
        Wc {
            wr_id,
            status: to_ibv(vendor),
            vendor_err: vendor,
            opcode,
            qp_num: self.qpn,
            ..Wc::default()
        }
    }

    /// A receive (with immediate data or not, or a write with immediate)
    /// into a posted buffer: its payload copied into the posted SGEs, its
    /// sender named.
    fn received(&self, q: &mut QpInner, c: &Cqe) -> Wc {
        let buf = BufId::from_wr_id(c.wr_id);
        let slot = q.recvs[buf.index()];
        let mut vendor = status::OK;
        let with_imm = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        let (opcode, flags) = match c.op {
            CqOp::RecvWriteImm => (ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, with_imm),
            // As EFA reports a SEND_WITH_IMM: a receive, flagged.
            CqOp::RecvImm => (ibv_wc_opcode::IBV_WC_RECV, with_imm),
            _ => (ibv_wc_opcode::IBV_WC_RECV, 0),
        };
        if c.op != CqOp::RecvWriteImm {
            let room: u64 =
                slot.sge[..slot.nsge as usize].iter().map(|s| u64::from(s.length)).sum();
            if u64::from(c.len) > room {
                vendor = status::LOCAL_ERROR_BAD_LENGTH;
            } else {
                let mut from = 0usize;
                for s in &slot.sge[..slot.nsge as usize] {
                    let n = (c.len as usize - from).min(s.length as usize);
                    let ok = q
                        .mrs
                        .get(s.lkey)
                        .is_some_and(|m| m.offset_of(s.addr, s.length as u64).is_some());
                    if !ok {
                        vendor = status::LOCAL_ERROR_INVALID_LKEY;
                        break;
                    }
                    // SAFETY: the span lies in a registration of the caller,
                    // who posted it for receiving: it is ours until this
                    // completion.
                    let dst = unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, n) };
                    q.dev.read_payload(buf, from, dst);
                    from += n;
                }
            }
        }
        // SAFETY: the QP's context outlives it.
        let ctx = unsafe { &*self.ctx };
        let known = match c.src {
            Source::Known(ah) => q.book.get_mut(ah.0 as usize),
            _ => None,
        };
        let (gid, qpn, slid) = match (known, c.src) {
            (Some(e), _) => {
                // The AH number as of the table's generation, looked up
                // again only when the table changed.
                let now = ctx.ahs_gen.load(Ordering::Acquire);
                if e.ahs_gen != now {
                    e.ahn = ctx.ahn_of(&e.gid);
                    e.ahs_gen = now;
                }
                (e.gid, e.qpn, e.ahn)
            }
            (None, Source::Unknown { qpn }) => {
                let gid = q.dev.sender(buf).map_or([0; 16], |a| a.gid);
                (gid, qpn, ctx.ahn_of(&gid))
            }
            (None, _) => ([0; 16], 0, ctx.ahn_of(&[0; 16])),
        };
        q.free_bufs.push(buf);
        Wc {
            wr_id: slot.wr_id,
            status: to_ibv(vendor),
            vendor_err: vendor,
            opcode,
            byte_len: c.len,
            imm: c.imm,
            wc_flags: flags,
            qp_num: self.qpn,
            src_qp: u32::from(qpn),
            slid,
            sgid: gid,
        }
    }

    /// EFA's checks of a new send WR (`efa_post_send_validate`).
    fn validate(&self, q: &QpInner, flags: u32) -> c_int {
        if q.state != ibv_qp_state::IBV_QPS_RTS && q.state != ibv_qp_state::IBV_QPS_SQD {
            return libc::EINVAL;
        }
        let signaled = ibv_send_flags::IBV_SEND_SIGNALED.0;
        if flags & signaled == 0 && !self.sq_sig_all {
            return libc::EINVAL;
        }
        if flags & !(signaled | ibv_send_flags::IBV_SEND_INLINE.0) != 0 {
            return libc::EINVAL;
        }
        if q.sq_used + q.batch.len() as u32 >= self.sq_depth {
            return libc::ENOMEM;
        }
        0
    }

    /// Opens a WR in the session: checked, and for sends given a packet
    /// buffer to gather into.
    fn begin(&self, q: &mut QpInner, op: Op, wr_id: u64, flags: u32) {
        if q.wr_err != 0 {
            return;
        }
        let err = self.validate(q, flags);
        if err != 0 {
            q.wr_err = err;
            return;
        }
        let supported = match op {
            Op::Send => true,
            Op::Read { .. } => config().rdma_read,
            Op::Write { .. } => config().rdma_write,
        };
        let buf = if op == Op::Send {
            q.free_bufs.pop().expect("a buffer per SQ slot")
        } else {
            BufId::NONE
        };
        q.batch.push(Pending {
            op,
            wr_id,
            buf,
            len: 0,
            data: None,
            local: None,
            dest: None,
            imm: None,
            err: if supported { status::OK } else { status::LOCAL_ERROR_UNSUPPORTED_OP },
        });
    }

    /// Gathers `len` bytes at `addr` (under `lkey`, or inline) into the
    /// open send, or sets the open RDMA's local span.
    fn gather(&self, q: &mut QpInner, lkey: Option<u32>, addr: u64, len: u32) {
        let mtu = config().mtu as u64;
        let Some(p) = q.batch.last().copied() else { return };
        let mr = lkey.map(|k| q.mrs.get(k));
        let mut p = p;
        match p.op {
            Op::Send => {
                if u64::from(p.len) + u64::from(len) > mtu {
                    p.err = status::LOCAL_ERROR_BAD_LENGTH;
                } else if let Some(m) = mr
                    && m.is_none_or(|m| m.offset_of(addr, u64::from(len)).is_none())
                {
                    p.err = status::LOCAL_ERROR_INVALID_LKEY;
                } else if p.err == status::OK && len > 0 {
                    match (mr.flatten(), p.len) {
                        // The first span, registered and large: sent from
                        // where it is. A small one costs less copied (the
                        // socket layer copies a small datagram whole anyway)
                        // than held as busy.
                        (Some(m), 0) if len >= ZERO_COPY_MIN => {
                            let offset = addr - m.addr;
                            p.data = Some((DataSeg { mr: m.udp.id, offset, len }, addr));
                        }
                        _ => {
                            // A second span (or inline data): the first one
                            // is copied after all, then this one.
                            if let Some((d, at)) = p.data.take() {
                                copy_in(&mut q.dev, p.buf, 0, at, d.len);
                            }
                            copy_in(&mut q.dev, p.buf, p.len, addr, len);
                        }
                    }
                }
                p.len += len;
            }
            Op::Read { .. } | Op::Write { .. } => {
                p.len = len;
                match mr.flatten().and_then(|m| Some((m, m.offset_of(addr, u64::from(len))?))) {
                    Some((m, off)) => p.local = Some((m, off)),
                    None => p.err = status::LOCAL_ERROR_INVALID_LKEY,
                }
            }
        }
        *q.batch.last_mut().expect("checked") = p;
    }

    /// Posts the WRs of the batch: the valid ones to the device, the others
    /// completed in error, as the NIC would.
    fn submit(&self, q: &mut QpInner) {
        let mut batch = std::mem::take(&mut q.batch);
        for p in batch.drain(..) {
            q.sq_used += 1;
            let opcode = match p.op {
                Op::Write { .. } => ibv_wc_opcode::IBV_WC_RDMA_WRITE,
                // EFA reports an RDMA read's completion with the send opcode.
                Op::Send | Op::Read { .. } => ibv_wc_opcode::IBV_WC_SEND,
            };
            let ah = match p.dest {
                Some((ah, qpn, qkey)) => self.udp_ah(q, ah, qpn, qkey),
                None => None,
            };
            let mut err = p.err;
            if err == status::OK && ah.is_none() {
                err = status::LOCAL_ERROR_INVALID_AH;
            }
            let buf = (p.op == Op::Send).then_some(p.buf);
            if err != status::OK {
                if let Some(b) = buf {
                    q.free_bufs.push(b);
                }
                q.done_send.push_back(self.wc(p.wr_id, opcode, err));
                continue;
            }
            let ah = ah.expect("checked");
            let slot = SendSlot { wr_id: p.wr_id, buf, opcode };
            let i = q.free_sends.pop().expect("a slot per SQ entry");
            q.sends[i as usize] = slot;
            match p.op {
                Op::Send => {
                    q.send_wrs.push(SendWr {
                        ah,
                        buf: p.buf,
                        len: if p.data.is_some() { 0 } else { p.len },
                        data: p.data.map(|(d, _)| d),
                        wr_id: u64::from(i),
                    });
                    q.send_imms.push(p.imm);
                }
                Op::Read { rkey, raddr } | Op::Write { rkey, raddr, .. } => {
                    let (m, off) = p.local.expect("checked at gather");
                    let op = match p.op {
                        Op::Write { imm, .. } => RdmaOp::Write { imm },
                        _ => RdmaOp::Read,
                    };
                    q.rdma_wrs.push(RdmaWr {
                        op,
                        ah,
                        local: m.udp.id,
                        local_offset: off,
                        len: u64::from(p.len),
                        remote_addr: raddr,
                        remote_key: u64::from(rkey),
                        wr_id: u64::from(i),
                    });
                }
            }
        }
        q.batch = batch;
        if !q.send_wrs.is_empty() {
            let n = q.dev.post_send_imm(&q.send_wrs, &q.send_imms);
            debug_assert_eq!(n, q.send_wrs.len(), "the SQ depth bounds the device's");
            q.send_wrs.clear();
            q.send_imms.clear();
        }
        if !q.rdma_wrs.is_empty() {
            let n = q.dev.post_rdma(&q.rdma_wrs);
            debug_assert_eq!(n, q.rdma_wrs.len(), "the SQ depth bounds the device's");
            q.rdma_wrs.clear();
        }
    }

    /// The udp address handle of (AH's GID, QPN, qkey).
    fn udp_ah(&self, q: &mut QpInner, ah: *mut ibv_ah, qpn: u32, qkey: u32) -> Option<UdpAh> {
        if ah.is_null() || qpn > u32::from(u16::MAX) {
            return None;
        }
        // SAFETY: an AH of the caller, live while WRs name it.
        let gid = unsafe { Ah::of(ah) }.gid;
        let addr = RawAddr { gid, qpn: qpn as u16, connid: qkey };
        if let Some((a, h)) = q.last_dest
            && a == addr
        {
            return Some(h);
        }
        let h = q.dev.insert_addr(&addr).ok()?;
        let i = h.0 as usize;
        let none = BookEntry { gid: [0; 16], qpn: 0, ahn: NO_AH, ahs_gen: u64::MAX };
        if q.book.len() <= i {
            q.book.resize(i + 1, none);
        }
        q.book[i] = BookEntry { gid, qpn: addr.qpn, ..none };
        q.last_dest = Some((addr, h));
        Some(h)
    }

    fn rollback(&self, q: &mut QpInner) {
        let mut batch = std::mem::take(&mut q.batch);
        for p in batch.drain(..) {
            if p.op == Op::Send {
                q.free_bufs.push(p.buf);
            }
        }
        q.batch = batch;
    }
}

/// What [`revoke`] did with a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revoke {
    /// It left every QP.
    Done,
    /// Work uses it still: call again.
    Wait,
    /// A WR the program posted uses it still: it stays everywhere.
    Busy,
}

/// `ibv_dereg_mr`'s work on the QPs of a PD, all locked at once (no WR
/// starts on the region meanwhile) and each driven first (the
/// acknowledgements that came end the reads they were holding it for):
/// the region leaves every QP, or none. While peers' reads of it are
/// served, [`Revoke::Wait`]; when `now`, they are revoked instead, as an
/// EFA device deregisters at once (each fails at its reader unless all of
/// it arrived). While a WR the program posted uses it, `Wait`, or
/// [`Revoke::Busy`] when `now`.
pub(crate) fn revoke(qps: &[*const Qp], mr: &MrInfo, now: bool) -> Revoke {
    let mut held: Vec<_> = qps
        .iter()
        .map(|&q| {
            // SAFETY: QPs in the PD's list are live.
            let q = unsafe { &*q };
            (q, q.inner.lock())
        })
        .collect();
    let (mut posted, mut served) = (0, 0);
    for (q, g) in &mut held {
        q.progress(g);
        if let Some(u) = g.dev.region_users(mr.udp.id) {
            posted += u.posted;
            served += u.served;
        }
    }
    match (posted, served) {
        (1.., _) if now => return Revoke::Busy,
        (1.., _) => return Revoke::Wait,
        (0, 1..) if !now => return Revoke::Wait,
        _ => {}
    }
    for (_, g) in &mut held {
        // Unknown here (its attach failed): nothing to undo.
        let _ = g.dev.revoke(mr.udp.id);
        g.mrs.remove(mr.udp.key as u32);
    }
    Revoke::Done
}

/// The smallest span of registered memory a send names to the device
/// rather than copies into a packet buffer: the udp socket layer copies a
/// datagram of up to 1 KiB into one buffer whatever it is made of.
const ZERO_COPY_MIN: u32 = 1024;

/// Copies `len` bytes at `addr` into packet buffer `buf` at `at`.
fn copy_in(dev: &mut UdpDevice, buf: BufId, at: u32, addr: u64, len: u32) {
    // SAFETY: a registered span of the caller (checked by the caller), or
    // inline data it handed us, readable for `len` bytes.
    let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
    // SAFETY: the buffer is not posted: it was taken from the free list for
    // the WR being built.
    let dst = unsafe { dev.buf_mut(buf) };
    dst[at as usize..(at + len) as usize].copy_from_slice(src);
}

// ---- creation ----

fn create_qp(
    c: *mut ibv_context,
    attr: &mut ibv_qp_init_attr_ex,
    driver: Option<u32>,
) -> Result<*mut ibv_qp, c_int> {
    use ibv_qp_create_send_ops_flags as ops;
    use ibv_qp_init_attr_mask as mask;
    if let Some(t) = driver
        && t != EFADV_QP_DRIVER_TYPE_SRD
    {
        return Err(libc::EOPNOTSUPP);
    }
    let supported_mask = mask::IBV_QP_INIT_ATTR_PD.0 | mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
    if attr.comp_mask & !supported_mask != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if attr.comp_mask & mask::IBV_QP_INIT_ATTR_PD.0 == 0 || attr.pd.is_null() {
        return Err(libc::EINVAL);
    }
    let extended = attr.comp_mask & mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0 != 0;
    if extended {
        let mut allowed = (ops::IBV_QP_EX_WITH_SEND.0 | ops::IBV_QP_EX_WITH_SEND_WITH_IMM.0) as u64;
        let cfg = crate::current();
        if attr.qp_type == ibv_qp_type::IBV_QPT_DRIVER {
            if cfg.rdma_read {
                allowed |= ops::IBV_QP_EX_WITH_RDMA_READ.0 as u64;
            }
            if cfg.rdma_write {
                allowed |= (ops::IBV_QP_EX_WITH_RDMA_WRITE.0
                    | ops::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0) as u64;
            }
        }
        if attr.send_ops_flags & !allowed != 0 {
            return Err(libc::EOPNOTSUPP);
        }
    }
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        return Err(libc::EINVAL);
    }
    if !attr.srq.is_null() {
        return Err(libc::EINVAL);
    }
    let cap = &mut attr.cap;
    if cap.max_send_sge > MAX_SQ_SGE
        || cap.max_recv_sge > MAX_RQ_SGE
        || cap.max_send_wr > MAX_SQ_WR
        || cap.max_recv_wr > MAX_RQ_WR
        || cap.max_inline_data > INLINE_BUF_SIZE
    {
        return Err(libc::EINVAL);
    }
    // As EFA sizes its queues: powers of two.
    let sq_depth = cap.max_send_wr.max(1).next_power_of_two();
    let rq_depth = cap.max_recv_wr.max(1).next_power_of_two();
    cap.max_send_wr = sq_depth;
    cap.max_recv_wr = rq_depth;
    // SAFETY: the caller's PD.
    let pd = unsafe { Pd::of(attr.pd) };
    let bufs = sq_depth + rq_depth;
    let udp = efapoll::device::udp::UdpConfig {
        bufs,
        tx_depth: sq_depth as usize,
        rx_depth: rq_depth as usize,
        ..udp_config()
    };
    let dev = pd.domain.device_with(udp).map_err(|_| libc::ENOMEM)?;
    let qpn = u32::from(dev.addr().qpn);
    let ctx = unsafe_ctx(c);
    let inner = QpInner {
        dev,
        state: ibv_qp_state::IBV_QPS_RESET,
        qkey: 0,
        sq_psn: 0,
        rnr_retry: 0,
        sq_used: 0,
        rq_used: 0,
        free_bufs: (0..bufs).rev().map(BufId).collect(),
        sends: vec![SendSlot::default(); sq_depth as usize],
        free_sends: (0..sq_depth).rev().collect(),

        recvs: vec![
            RecvSlot { wr_id: 0, sge: [NO_SGE; MAX_RQ_SGE as usize], nsge: 0 };
            bufs as usize
        ],
        mrs: Mrs::default(),
        last_dest: None,
        book: Vec::new(),
        batch: Vec::with_capacity(sq_depth as usize),
        wr_err: 0,
        done_send: VecDeque::with_capacity(sq_depth as usize),
        done_recv: VecDeque::with_capacity(rq_depth as usize),
        cqes: vec![Cqe::default(); 32],
        send_wrs: Vec::with_capacity(sq_depth as usize),
        send_imms: Vec::with_capacity(sq_depth as usize),
        rdma_wrs: Vec::with_capacity(sq_depth as usize),
    };
    let qp = Box::new(Qp {
        // SAFETY: C data: all-zero is valid (null pointers, None, zeroed
        // pthread objects, which glibc takes as initialised).
        qpx: unsafe { std::mem::zeroed() },
        pd,
        ctx,
        send_cq: attr.send_cq.cast_const().cast(),
        recv_cq: attr.recv_cq.cast_const().cast(),
        sq_sig_all: attr.sq_sig_all != 0,
        extended,
        qp_type: attr.qp_type,
        max_inline: cap.max_inline_data,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge.max(1),
        sq_depth,
        rq_depth,
        qpn,
        polls: AtomicU64::new(0),
        inner: SpinLock::new(inner),
    });
    let qp = Box::into_raw(qp);
    // SAFETY: just made, not shared yet.
    let q = unsafe { &mut *qp };
    let b = &mut q.qpx.qp_base;
    b.context = c;
    b.qp_context = attr.qp_context;
    b.pd = attr.pd;
    b.send_cq = attr.send_cq;
    b.recv_cq = attr.recv_cq;
    b.qp_num = qpn;
    b.state = ibv_qp_state::IBV_QPS_RESET;
    b.qp_type = attr.qp_type;
    if extended {
        let x = &mut q.qpx;
        let has = |f: ibv_qp_create_send_ops_flags| attr.send_ops_flags & f.0 as u64 != 0;
        x.wr_start = Some(wr_start);
        x.wr_complete = Some(wr_complete);
        x.wr_abort = Some(wr_abort);
        if has(ops::IBV_QP_EX_WITH_SEND) {
            x.wr_send = Some(wr_send);
        }
        if has(ops::IBV_QP_EX_WITH_SEND_WITH_IMM) {
            x.wr_send_imm = Some(wr_send_imm);
        }
        if has(ops::IBV_QP_EX_WITH_RDMA_READ) {
            x.wr_rdma_read = Some(wr_rdma_read);
        }
        if has(ops::IBV_QP_EX_WITH_RDMA_WRITE) {
            x.wr_rdma_write = Some(wr_rdma_write);
        }
        if has(ops::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
            x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
        }
        x.wr_set_sge = Some(wr_set_sge);
        x.wr_set_sge_list = Some(wr_set_sge_list);
        x.wr_set_inline_data = Some(wr_set_inline_data);
        x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
        x.wr_set_ud_addr = Some(wr_set_ud_addr);
    }
    // The PD's registrations, and the CQs that will drive it.
    {
        let mut s = pd.lock();
        for m in s.mrs.values() {
            q.attach(m);
        }
        s.qps.push(qp);
    }
    let (send_cq, recv_cq) = (q.send_cq, q.recv_cq);
    let same = send_cq == recv_cq;
    // SAFETY: the caller's CQs, which outlive the QP (destroy_cq refuses
    // while a QP is attached).
    unsafe { &*send_cq }.state.lock().qps.push(Attached { qp, send: true, recv: same });
    if !same {
        // SAFETY: as above.
        unsafe { &*recv_cq }.state.lock().qps.push(Attached { qp, send: false, recv: true });
    }
    crate::progress::add(qp);
    Ok(qp.cast())
}

fn unsafe_ctx(c: *mut ibv_context) -> *const Ctx {
    // SAFETY: the caller's open context.
    unsafe { Ctx::of(c) as *const Ctx }
}

fn created(r: Result<*mut ibv_qp, c_int>) -> *mut ibv_qp {
    r.unwrap_or_else(|e| {
        set_errno(e);
        null_mut()
    })
}

/// `verbs_context.create_qp_ex`, behind verbs.h's inline `ibv_create_qp_ex`:
/// UD only, as on EFA (SRD goes through efadv).
pub(crate) unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let attr = unsafe { &mut *attr };
    if attr.qp_type != ibv_qp_type::IBV_QPT_UD {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    created(create_qp(c, attr, None))
}

/// # Safety
/// `c` is an open context; `attr` and `efa` (of `inlen` bytes) readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
    efa: *mut efadv_qp_init_attr,
    inlen: u32,
) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let (attr, e) = unsafe { (&mut *attr, &*efa) };
    if attr.qp_type != ibv_qp_type::IBV_QPT_DRIVER
        || (inlen as usize) < size_of::<efadv_qp_init_attr>()
        || e.comp_mask != 0
        || e.reserved != [0; 4]
    {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    created(create_qp(c, attr, Some(e.driver_qp_type)))
}

/// An init attribute of the old API, extended.
fn extend(pd: *mut ibv_pd, attr: &ibv_qp_init_attr) -> ibv_qp_init_attr_ex {
    // SAFETY: C data: all-zero is valid.
    let mut x: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    x.qp_context = attr.qp_context;
    x.send_cq = attr.send_cq;
    x.recv_cq = attr.recv_cq;
    x.srq = attr.srq;
    x.cap = attr.cap;
    x.qp_type = attr.qp_type;
    x.sq_sig_all = attr.sq_sig_all;
    x.comp_mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
    x.pd = pd;
    x
}

/// # Safety
/// `pd` is ours; `attr` readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_create_driver_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    driver_qp_type: u32,
) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.qp_type != ibv_qp_type::IBV_QPT_DRIVER {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let mut x = extend(pd, a);
    // SAFETY: the PD's context is open.
    let c = unsafe { Pd::of(pd) }.ibv.context;
    let r = create_qp(c, &mut x, Some(driver_qp_type));
    a.cap = x.cap;
    created(r)
}

/// The old API's QP: UD only, as on EFA.
///
/// # Safety
/// `pd` is ours; `attr` readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.qp_type != ibv_qp_type::IBV_QPT_UD {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    let mut x = extend(pd, a);
    // SAFETY: the PD's context is open.
    let c = unsafe { Pd::of(pd) }.ibv.context;
    let r = create_qp(c, &mut x, None);
    a.cap = x.cap;
    created(r)
}

/// # Safety
/// `qp` is ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: the caller's contract.
    match unsafe { Qp::of(qp) }.extended {
        true => qp.cast(),
        false => null_mut(),
    }
}

/// # Safety
/// `qp` is ours; nothing else uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the caller's contract.
    let q = unsafe { Qp::of(qp) };
    let me = (q as *const Qp).cast_mut();
    crate::progress::remove(me);
    for cq in [q.send_cq, q.recv_cq] {
        // SAFETY: the QP's CQs outlive it.
        unsafe { &*cq }.state.lock().qps.retain(|a| a.qp != me.cast_const());
    }
    // SAFETY: the QP's PD outlives it.
    unsafe { &*q.pd }.lock().qps.retain(|&p| p != me.cast_const());
    // SAFETY: boxed by create_qp, no longer reachable from its PD or CQs.
    let q = unsafe { Box::from_raw(me) };
    crate::record_stats(&q.inner.lock().dev);
    drop(q);
    0
}

/// # Safety
/// `qp` is ours; `attr` readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    use ibv_qp_attr_mask as m;
    use ibv_qp_state::*;
    // SAFETY: the caller's contract.
    let (q, a) = unsafe { (Qp::of(qp), &*attr) };
    let mask = mask as u32;
    let has = |f: ibv_qp_attr_mask| mask & f.0 != 0;
    let mut s = q.inner.lock();
    let cur = s.state;
    let next = if has(m::IBV_QP_STATE) { a.qp_state } else { cur };
    let need = |flags: &[ibv_qp_attr_mask]| flags.iter().all(|&f| has(f));
    let ok = match (cur, next) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => true,
        (IBV_QPS_RESET, IBV_QPS_INIT) => {
            need(&[m::IBV_QP_PKEY_INDEX, m::IBV_QP_PORT, m::IBV_QP_QKEY])
        }
        (IBV_QPS_INIT, IBV_QPS_INIT) | (IBV_QPS_INIT, IBV_QPS_RTR) => true,
        (IBV_QPS_RTR, IBV_QPS_RTS) => need(&[m::IBV_QP_SQ_PSN]),
        (IBV_QPS_RTS, IBV_QPS_RTS) => true,
        _ => false,
    };
    if !ok || (has(m::IBV_QP_PORT) && a.port_num != 1) {
        return libc::EINVAL;
    }
    if has(m::IBV_QP_QKEY) {
        s.qkey = a.qkey;
        // The qkey is the connid peers address this QP by.
        s.dev.set_connid(a.qkey);
    }
    if has(m::IBV_QP_SQ_PSN) {
        s.sq_psn = a.sq_psn;
    }
    if has(m::IBV_QP_RNR_RETRY) {
        s.rnr_retry = a.rnr_retry;
    }
    s.state = next;
    drop(s);
    // SAFETY: the caller's QP; `state` is read by callers only.
    unsafe { (*qp).state = next };
    0
}

/// # Safety
/// `qp` is ours; `attr` and `init` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let q = unsafe { Qp::of(qp) };
    let s = q.inner.lock();
    let cap = ibv_qp_cap {
        max_send_wr: q.sq_depth,
        max_recv_wr: q.rq_depth,
        max_send_sge: q.max_send_sge,
        max_recv_sge: q.max_recv_sge,
        max_inline_data: q.max_inline,
    };
    // SAFETY: the caller's structs; C data, all-zero valid.
    let (a, i) = unsafe { (&mut *attr, &mut *init) };
    // SAFETY: as above.
    *a = unsafe { std::mem::zeroed() };
    a.qp_state = s.state;
    a.cur_qp_state = s.state;
    a.qkey = s.qkey;
    a.sq_psn = s.sq_psn;
    a.port_num = 1;
    a.rnr_retry = s.rnr_retry;
    a.cap = cap;
    // SAFETY: as above.
    *i = unsafe { std::mem::zeroed() };
    i.qp_context = q.qpx.qp_base.qp_context;
    i.send_cq = q.qpx.qp_base.send_cq;
    i.recv_cq = q.qpx.qp_base.recv_cq;
    i.cap = cap;
    i.qp_type = q.qp_type;
    i.sq_sig_all = c_int::from(q.sq_sig_all);
    0
}

// ---- the ibv_wr_* builder ----

/// The QP of a builder call and its state, locked since `wr_start`.
///
/// # Safety
/// Between `wr_start` and `wr_complete`/`wr_abort` of `qpx`.
unsafe fn session<'a>(qpx: *mut ibv_qp_ex) -> (&'a Qp, &'a mut QpInner) {
    // SAFETY: the caller's QP, locked by wr_start.
    let q = unsafe { Qp::of(qpx.cast()) };
    // SAFETY: wr_start took the lock; one reference per builder call.
    (q, unsafe { q.inner.data() })
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: the caller's QP.
    let q = unsafe { Qp::of(qpx.cast()) };
    q.inner.raw_lock();
    // SAFETY: locked just above.
    let s = unsafe { q.inner.data() };
    s.wr_err = 0;
    s.batch.clear();
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    let err = s.wr_err;
    if err != 0 {
        q.rollback(s);
    } else {
        q.submit(s);
    }
    // SAFETY: taken by wr_start; `s` is not used after.
    unsafe { q.inner.raw_unlock() };
    err
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    q.rollback(s);
    // SAFETY: taken by wr_start; `s` is not used after.
    unsafe { q.inner.raw_unlock() };
}

unsafe fn wr_begin(qpx: *mut ibv_qp_ex, op: Op) {
    // SAFETY: inside the session; the caller's wr_id and wr_flags.
    let (q, s) = unsafe { session(qpx) };
    // SAFETY: as above.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    q.begin(s, op, wr_id, flags);
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    // SAFETY: inside the session.
    unsafe { wr_begin(qpx, Op::Send) }
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: __be32) {
    // SAFETY: inside the session.
    unsafe { wr_begin(qpx, Op::Send) };
    // SAFETY: as above.
    let (_, s) = unsafe { session(qpx) };
    // (A WR refused at its start set wr_err: the last one is not it.)
    if s.wr_err == 0
        && let Some(p) = s.batch.last_mut()
    {
        p.imm = Some(imm);
    }
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    // SAFETY: inside the session.
    unsafe { wr_begin(qpx, Op::Read { rkey, raddr }) }
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    // SAFETY: inside the session.
    unsafe { wr_begin(qpx, Op::Write { rkey, raddr, imm: None }) }
}

unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, imm: __be32) {
    // SAFETY: inside the session.
    unsafe { wr_begin(qpx, Op::Write { rkey, raddr, imm: Some(imm) }) }
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: inside the session.
    let (_, s) = unsafe { session(qpx) };
    if s.wr_err == 0
        && let Some(p) = s.batch.last_mut()
    {
        p.dest = Some((ah, qpn, qkey));
    }
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, len: u32) {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    if s.wr_err == 0 {
        if let Some(p) = s.batch.last_mut() {
            p.clear_payload();
        }
        q.gather(s, Some(lkey), addr, len);
    }
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    let Some(p) = s.batch.last().copied() else { return };
    if s.wr_err != 0 {
        return;
    }
    let max = if p.op == Op::Send { q.max_send_sge } else { MAX_RDMA_SGE };
    if n > max as usize {
        s.wr_err = libc::EINVAL;
        return;
    }
    // SAFETY: the caller's list of `n` SGEs.
    let sges = unsafe { std::slice::from_raw_parts(list, n) };
    s.batch.last_mut().expect("checked").clear_payload();
    for g in sges {
        q.gather(s, Some(g.lkey), g.addr, g.length);
    }
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    if s.wr_err != 0 {
        return;
    }
    if len > q.max_inline as usize {
        s.wr_err = libc::EINVAL;
        return;
    }
    if let Some(p) = s.batch.last_mut() {
        p.clear_payload();
    }
    q.gather(s, None, addr as u64, len as u32);
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: inside the session.
    let (q, s) = unsafe { session(qpx) };
    if s.wr_err != 0 {
        return;
    }
    // SAFETY: the caller's list of `n` buffers.
    let bufs = unsafe { std::slice::from_raw_parts(list, n) };
    if bufs.iter().map(|b| b.length).sum::<usize>() > q.max_inline as usize {
        s.wr_err = libc::EINVAL;
        return;
    }
    if let Some(p) = s.batch.last_mut() {
        p.clear_payload();
    }
    for b in bufs {
        q.gather(s, None, b.addr as u64, b.length as u32);
    }
}

// ---- the old API: ibv_post_send, ibv_post_recv ----

/// `ibv_context_ops.post_send`: sends only, as on EFA; the WRs before a
/// bad one are posted, the bad one is named.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's QP.
    let q = unsafe { Qp::of(qp) };
    let mut s = q.inner.lock();
    let s = &mut *s;
    s.batch.clear();
    s.wr_err = 0;
    let mut err = 0;
    while !wr.is_null() {
        // SAFETY: the caller's chain of WRs.
        let w = unsafe { &*wr };
        let inline = w.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        // SAFETY: the caller's `num_sge` SGEs.
        let sges = unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge.max(0) as usize) };
        err = q.validate(s, w.send_flags);
        if err == 0
            && !matches!(w.opcode, ibv_wr_opcode::IBV_WR_SEND | ibv_wr_opcode::IBV_WR_SEND_WITH_IMM)
        {
            err = libc::EINVAL;
        }
        if err == 0
            && inline
            && sges.iter().map(|g| g.length as usize).sum::<usize>() > q.max_inline as usize
        {
            err = libc::EINVAL;
        }
        if err == 0 && !inline && sges.len() > q.max_send_sge as usize {
            err = libc::EINVAL;
        }
        if err != 0 {
            // SAFETY: the caller's out pointer.
            unsafe { *bad = wr };
            break;
        }
        q.begin(s, Op::Send, w.wr_id, w.send_flags);
        for g in sges {
            q.gather(s, (!inline).then_some(g.lkey), g.addr, g.length);
        }
        let p = s.batch.last_mut().expect("begun");
        if w.opcode == ibv_wr_opcode::IBV_WR_SEND_WITH_IMM {
            // SAFETY: a SEND_WITH_IMM's union holds its immediate data.
            p.imm = Some(unsafe { w.imm_data_invalidated_rkey_union.imm_data });
        }
        // SAFETY: a UD WR names its destination in `wr.ud`.
        let ud = unsafe { w.wr.ud };
        p.dest = Some((ud.ah, ud.remote_qpn, ud.remote_qkey));
        wr = w.next;
    }
    q.submit(s);
    err
}

/// `ibv_context_ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's QP.
    let q = unsafe { Qp::of(qp) };
    let mut s = q.inner.lock();
    let s = &mut *s;
    let mut posted = [BufId::NONE; 64];
    let mut n = 0;
    let mut err = 0;
    while !wr.is_null() {
        // SAFETY: the caller's chain of WRs.
        let w = unsafe { &*wr };
        let unready =
            s.state == ibv_qp_state::IBV_QPS_RESET || s.state == ibv_qp_state::IBV_QPS_ERR;
        err = if unready || w.num_sge < 0 || w.num_sge as u32 > q.max_recv_sge {
            libc::EINVAL
        } else if s.rq_used >= q.rq_depth {
            libc::ENOMEM
        } else {
            0
        };
        if err != 0 {
            // SAFETY: the caller's out pointer.
            unsafe { *bad = wr };
            break;
        }
        let buf = s.free_bufs.pop().expect("a buffer per RQ slot");
        // SAFETY: the caller's `num_sge` SGEs.
        let sges = unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) };
        let slot = &mut s.recvs[buf.index()];
        slot.wr_id = w.wr_id;
        slot.nsge = sges.len() as u32;
        slot.sge[..sges.len()].copy_from_slice(sges);
        s.rq_used += 1;
        posted[n] = buf;
        n += 1;
        if n == posted.len() {
            s.dev.post_recv(&posted);
            n = 0;
        }
        wr = w.next;
    }
    if n > 0 {
        s.dev.post_recv(&posted[..n]);
    }
    err
}
