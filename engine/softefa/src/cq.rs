//! Completion queues: `ibv_cq_ex` (start/next/end poll and the
//! `ibv_wc_read_*` accessors), the EFA view with the sender's GID, and
//! `ibv_poll_cq` for callers of the old API.
//!
//! A CQ holds no completions of its own until polled: a poll drives the
//! QPs attached to it (their udp devices make progress only then) and
//! takes their completions for this CQ in a burst.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::mem::offset_of;
use std::ptr::null_mut;

use rdma_sys::*;

use crate::ctx::set_errno;
use crate::efadv::*;
use crate::limits::{MAX_CQE, NO_AH};
use crate::lock::SpinLock;
use crate::qp::Qp;

/// One work completion, as the accessors read it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wc {
    pub(crate) wr_id: u64,
    pub(crate) status: u32,
    pub(crate) vendor_err: u32,
    pub(crate) opcode: u32,
    pub(crate) byte_len: u32,
    /// As the sender gave it (network order, passed through).
    pub(crate) imm: u32,
    pub(crate) wc_flags: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) slid: u16,
    pub(crate) sgid: [u8; 16],
}

/// A QP attached to a CQ, and which of its queues complete here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attached {
    pub(crate) qp: *const Qp,
    pub(crate) send: bool,
    pub(crate) recv: bool,
}

#[derive(Debug, Default)]
pub(crate) struct CqState {
    pub(crate) qps: Vec<Attached>,
    /// Completions taken from the QPs, not yet polled.
    buf: VecDeque<Wc>,
    /// The completion `start_poll`/`next_poll` made current.
    cur: Wc,
    /// The QP to drive first at the next refill (round robin).
    next: usize,
    /// The last refill may have left completions in the QPs (a QP had more
    /// than a burst, or some were not looked at): the session's next poll
    /// looks again; else it ends without taking a QP's lock.
    more: bool,
}

// SAFETY: the QP pointers are of live QPs (a QP detaches itself before it
// is freed), which are Sync.
unsafe impl Send for CqState {}

/// Completions taken from a QP at a time.
const BURST: usize = 32;

#[repr(C)]
pub(crate) struct Cq {
    /// First: an `ibv_cq_ex` (and an `ibv_cq`) is a pointer to the Cq.
    cqx: ibv_cq_ex,
    dv: efadv_cq,
    pub(crate) state: SpinLock<CqState>,
}

impl Cq {
    /// # Safety
    /// `cq` came from one of our create calls and is not destroyed.
    pub(crate) unsafe fn of<'a>(cq: *mut ibv_cq_ex) -> &'a Cq {
        // SAFETY: the ibv_cq_ex is the first field of a Cq (repr(C)).
        unsafe { &*cq.cast::<Cq>() }
    }

    /// Takes completions from the attached QPs until some came or every
    /// QP was looked at once; `drive`: polling their devices first (a
    /// syscall each), else taking only what they completed already.
    fn refill(&self, s: &mut CqState, drive: bool) {
        let me = (self as *const Cq).cast_mut().cast::<ibv_cq>();
        let n = s.qps.len();
        s.more = false;
        for i in 0..n {
            let k = (s.next + i) % n;
            let a = s.qps[k];
            // SAFETY: attached QPs are live until they detach, which takes
            // this CQ's lock, held here.
            let left = unsafe { (*a.qp).drain(a.send, a.recv, drive, me, &mut s.buf, BURST) };
            if !s.buf.is_empty() {
                s.next = k + 1;
                s.more = left || i + 1 < n;
                return;
            }
        }
    }

    /// The next completion; `drive`: polling the devices when none is
    /// waiting. One poll session (start_poll, then next_poll until ENOENT)
    /// drives them once, at its start, as a NIC's CQ is read without a
    /// doorbell: another device poll per burst would be a syscall that
    /// found nothing on the latency path.
    fn next_wc(&self, s: &mut CqState, drive: bool) -> Option<Wc> {
        if s.buf.is_empty() && (drive || s.more) {
            self.refill(s, drive);
        }
        s.buf.pop_front()
    }
}

fn make_cq(
    c: *mut ibv_context,
    attr: &ibv_cq_init_attr_ex,
    efa: Option<&efadv_cq_init_attr>,
) -> *mut ibv_cq_ex {
    // IBV_WC_STANDARD_FLAGS: byte_len, imm, qp_num, src_qp, slid, sl,
    // dlid_path_bits (bits 0 to 6), which bindgen leaves out.
    let standard = 0x7f_u64;
    if attr.comp_mask != 0 || attr.wc_flags & !standard != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if !attr.channel.is_null() {
        // No completion events: EFA without CQ_NOTIFICATIONS refuses too.
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if attr.cqe as i64 > i64::from(MAX_CQE) {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let cq = Box::new(Cq {
        // SAFETY: C data: all-zero is valid (null pointers, None, a zeroed
        // pthread mutex and condition variable, which glibc takes as
        // initialised).
        cqx: unsafe { std::mem::zeroed() },
        dv: efadv_cq::default(),
        state: SpinLock::new(CqState::default()),
    });
    let cq = Box::into_raw(cq);
    // SAFETY: just made, not shared yet.
    let q = unsafe { &mut *cq };
    let x = &mut q.cqx;
    x.context = c;
    x.cq_context = attr.cq_context;
    x.cqe = attr.cqe.max(1).next_power_of_two() as c_int;
    x.start_poll = Some(start_poll);
    x.next_poll = Some(next_poll);
    x.end_poll = Some(end_poll);
    x.read_opcode = Some(read_opcode);
    x.read_vendor_err = Some(read_vendor_err);
    x.read_wc_flags = Some(read_wc_flags);
    let f = |flag: ibv_create_cq_wc_flags| attr.wc_flags & flag.0 as u64 != 0;
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN) {
        x.read_byte_len = Some(read_byte_len);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM) {
        x.read_imm_data = Some(read_imm_data);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM) {
        x.read_qp_num = Some(read_qp_num);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP) {
        x.read_src_qp = Some(read_src_qp);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID) {
        x.read_slid = Some(read_slid);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL) {
        x.read_sl = Some(read_sl);
    }
    if f(ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS) {
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
    if efa.is_some_and(|e| e.wc_flags & EFADV_WC_EX_WITH_SGID != 0) {
        q.dv.wc_read_sgid = Some(wc_read_sgid);
    }
    cq.cast()
}

/// `verbs_context.create_cq_ex`, behind verbs.h's inline `ibv_create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: the caller's attributes.
    make_cq(c, unsafe { &*attr }, None)
}

/// # Safety
/// `c` is an open context; `attr` and `efa` readable (`efa` of `inlen`
/// bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_create_cq(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
    efa: *mut efadv_cq_init_attr,
    inlen: u32,
) -> *mut ibv_cq_ex {
    if (inlen as usize) < size_of::<efadv_cq_init_attr>() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    let e = unsafe { &*efa };
    if e.comp_mask != 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    if e.wc_flags & !EFADV_WC_EX_WITH_SGID != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    make_cq(c, unsafe { &*attr }, Some(e))
}

/// # Safety
/// `cq` is ours.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_cq_from_ibv_cq_ex(cq: *mut ibv_cq_ex) -> *mut efadv_cq {
    // SAFETY: the caller's contract.
    let q = unsafe { Cq::of(cq) };
    (&raw const q.dv).cast_mut()
}

/// # Safety
/// `c` is an open context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: C data; all-zero is valid.
    let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.cqe = cqe.max(0) as u32;
    attr.cq_context = cq_context;
    attr.channel = channel;
    attr.comp_vector = comp_vector as u32;
    make_cq(c, &attr, None).cast()
}

/// # Safety
/// `cq` is ours; no QP uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: the caller's contract.
    let q = unsafe { Cq::of(cq.cast()) };
    if !q.state.lock().qps.is_empty() {
        return libc::EBUSY;
    }
    // SAFETY: boxed by make_cq; the caller gives it up.
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
    0
}

/// `ibv_context_ops.poll_cq`: the old API's poll.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's CQ.
    let q = unsafe { Cq::of(cq.cast()) };
    let mut s = q.state.lock();
    let mut i = 0;
    while i < n.max(0) as usize {
        let Some(w) = q.next_wc(&mut s, i == 0) else { break };
        // SAFETY: the caller's array holds `n` entries.
        let out = unsafe { &mut *wc.add(i) };
        out.wr_id = w.wr_id;
        out.status = w.status;
        out.opcode = w.opcode;
        out.vendor_err = w.vendor_err;
        out.byte_len = w.byte_len;
        out.imm_data_invalidated_rkey_union.imm_data = w.imm;
        out.qp_num = w.qp_num;
        out.src_qp = w.src_qp;
        out.wc_flags = w.wc_flags;
        out.pkey_index = 0;
        out.slid = w.slid;
        out.sl = 0;
        out.dlid_path_bits = 0;
        i += 1;
    }
    i as c_int
}

/// `ibv_context_ops.req_notify_cq`: no completion events (CQs with a
/// channel are refused at creation).
pub(crate) unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller's attributes.
    if unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's CQ.
    let q = unsafe { Cq::of(cq) };
    // Held until end_poll, as EFA holds its CQ lock (or released here when
    // there is nothing to poll).
    q.state.raw_lock();
    // SAFETY: locked just above.
    let s = unsafe { q.state.data() };
    match q.next_wc(s, true) {
        Some(w) => {
            set_current(cq, s, w);
            0
        }
        None => {
            // SAFETY: taken above; `s` is not used after.
            unsafe { q.state.raw_unlock() };
            libc::ENOENT
        }
    }
}

fn set_current(cq: *mut ibv_cq_ex, s: &mut CqState, w: Wc) {
    s.cur = w;
    // SAFETY: the caller's CQ, whose lock we hold; status and wr_id are
    // the fields the inline accessors read directly.
    unsafe {
        (*cq).status = w.status;
        (*cq).wr_id = w.wr_id;
    }
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller's CQ, locked since start_poll.
    let q = unsafe { Cq::of(cq) };
    // SAFETY: start_poll succeeded, so we hold the lock.
    let s = unsafe { q.state.data() };
    match q.next_wc(s, false) {
        Some(w) => {
            set_current(cq, s, w);
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller's CQ, locked since start_poll.
    unsafe { Cq::of(cq).state.raw_unlock() }
}

/// The current completion.
///
/// # Safety
/// Between a successful `start_poll` and `end_poll` of `cq`.
unsafe fn cur(cq: *mut ibv_cq_ex) -> Wc {
    // SAFETY: the caller holds the CQ's lock.
    unsafe { Cq::of(cq).state.data().cur }
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode::Type {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.opcode
}

unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.vendor_err
}

unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.byte_len
}

unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.imm
}

unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.qp_num
}

unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.src_qp
}

unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> std::ffi::c_uint {
    // SAFETY: called between start and end poll.
    unsafe { cur(cq) }.wc_flags
}

unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    // SAFETY: called between start and end poll.
    u32::from(unsafe { cur(cq) }.slid)
}

unsafe extern "C" fn read_sl(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

unsafe extern "C" fn read_dlid_path_bits(_cq: *mut ibv_cq_ex) -> u8 {
    0
}

unsafe extern "C" fn wc_read_sgid(dv: *mut efadv_cq, sgid: *mut ibv_gid) -> c_int {
    // SAFETY: the efadv_cq is a field of a Cq (efadv_cq_from_ibv_cq_ex).
    let cq = unsafe { dv.byte_sub(offset_of!(Cq, dv)) }.cast::<ibv_cq_ex>();
    // SAFETY: called between start and end poll.
    let w = unsafe { cur(cq) };
    if w.slid != NO_AH {
        // The sender's GID is reported only for an unknown sender.
        return -libc::ENOENT;
    }
    // SAFETY: the caller's gid.
    unsafe { (*sgid).raw = w.sgid };
    0
}

/// The exported form of efadv.h's inline function.
///
/// # Safety
/// `dv` is the EFA view of a CQ between start and end poll.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_wc_read_sgid(dv: *mut efadv_cq, sgid: *mut ibv_gid) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { (*dv).wc_read_sgid } {
        // SAFETY: ours, set by efadv_create_cq.
        Some(f) => unsafe { f(dv, sgid) },
        None => libc::EOPNOTSUPP,
    }
}
