//! The `efa` device: AWS EFA through libibverbs and EFA direct verbs (SRD
//! queue pairs), behind the `efa` cargo feature, so that default builds
//! need no rdma-core.
//!
//! # As the provider does it
//!
//! The control path follows libfabric's EFA provider: an EFA device is one
//! whose `efadv_query_device` succeeds; the domain opens it, reads its
//! device, port 1 and GID index 0, and allocates the protection domain.
//! Each lcore's queue is a CQ from `efadv_create_cq` (with the sender-GID
//! flag when the device has `CQ_WITH_SGID`; `ibv_create_cq_ex` otherwise)
//! and an SRD QP from `efadv_create_qp_ex` (every WR signalled; send ops
//! SEND and SEND_WITH_IMM, plus RDMA_READ and RDMA_WRITE(_WITH_IMM) as the
//! device offers them), moved RESET -> INIT (qkey: a random connid with
//! its top bit clear, which marks privileged qkeys) -> RTR -> RTS (with
//! `rnr_retry` where the device honours it). The raw address is (GID, QP
//! number, qkey as the connid). Address handles are made per GID and
//! shared by every peer on that host and every queue of the domain.
//!
//! Thread domains: where the provider offers `ibv_alloc_td`, each queue
//! makes its QP and CQ in a parent domain of its own thread domain, so the
//! provider takes no lock on the hot path. EFA's provider in rdma-core 44
//! implements neither thread nor parent domains (the call fails with
//! EOPNOTSUPP); there each queue uses the plain PD, and the provider's
//! per-queue spinlocks are uncontended, as one lcore owns its QP and CQ.
//!
//! # Memory
//!
//! Packet buffers are one pool of `bufs` x MTU bytes per queue (MTU: the
//! port's `max_msg_sz`), registered once for local write. Regions are
//! registered with `ibv_reg_mr`, with the rights the provider maps
//! (libfabric efa_mr.c): local write always; remote read and write as
//! asked, where the device does RDMA read and write. (The provider grants
//! remote read to every region so that its long-read protocol can read
//! any send buffer; the endpoint here reads only regions registered with
//! `REMOTE_READ`, so a region gets no right it was not given.) Emulated
//! one-sided operations and atomics are checked by the endpoint.
//!
//! # Data path
//!
//! Sends and RDMA go in `ibv_wr_start` ... `ibv_wr_complete` batches of at
//! most the free send-queue entries. EFA takes or rolls back a batch
//! whole: a refused batch (`ENOMEM`: the queue is full) is reported as not
//! accepted; another refusal posts the batch's requests one by one, and
//! those refused alone complete with `LocalError`. Each request's kind is
//! kept in its slot (the `wr_id` the device sees), since EFA reports an
//! RDMA read's completion with the send opcode. Receives are posted as
//! linked `ibv_recv_wr` chains; completions are read with
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`, a burst at a time.
//! A sender is known by (AH number, QPN), unknown when `slid` is 0xffff
//! (see `book.rs`). Immediate data passes through unconverted both ways,
//! as libfabric does (a peer reads the same 32 bits it was given).
//! A send the receiver had no buffer for (`REMOTE_ERROR_RNR`, after the
//! QP's own `rnr_retry`) is posted again after a backoff, never reported;
//! other EFA status codes map to [`CqStatus`].

pub mod efadv;

mod book;
mod tx;
mod verbs;

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdma_sys::{
    ibv_access_flags, ibv_ah, ibv_ah_attr, ibv_alloc_parent_domain, ibv_alloc_td, ibv_cq_ex,
    ibv_cq_ex_to_cq, ibv_cq_init_attr_ex, ibv_cq_init_attr_mask, ibv_create_ah,
    ibv_create_cq_attr_flags, ibv_create_cq_ex, ibv_create_cq_wc_flags, ibv_dealloc_pd,
    ibv_dealloc_td, ibv_dereg_mr, ibv_destroy_ah, ibv_destroy_cq, ibv_destroy_qp, ibv_end_poll,
    ibv_modify_qp, ibv_mr, ibv_next_poll, ibv_parent_domain_init_attr, ibv_pd, ibv_poll_cq_attr,
    ibv_post_recv, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask, ibv_qp_create_send_ops_flags, ibv_qp_ex,
    ibv_qp_init_attr_ex, ibv_qp_init_attr_mask, ibv_qp_state, ibv_qp_to_qp_ex, ibv_qp_type,
    ibv_recv_wr, ibv_reg_mr, ibv_send_flags, ibv_sge, ibv_start_poll, ibv_td, ibv_td_init_attr,
    ibv_wc_opcode, ibv_wc_read_byte_len, ibv_wc_read_imm_data, ibv_wc_read_opcode,
    ibv_wc_read_slid, ibv_wc_read_src_qp, ibv_wc_read_vendor_err, ibv_wr_complete,
    ibv_wr_rdma_read, ibv_wr_rdma_write, ibv_wr_rdma_write_imm, ibv_wr_send,
    ibv_wr_set_inline_data, ibv_wr_set_sge, ibv_wr_set_sge_list, ibv_wr_set_ud_addr, ibv_wr_start,
};

use self::book::{AhCache, Book, Peer};
use self::efadv::{
    EFADV_QP_DRIVER_TYPE_SRD, EFADV_WC_EX_WITH_SGID, efadv_cq, efadv_cq_from_ibv_cq_ex,
    efadv_cq_init_attr, efadv_create_cq, efadv_create_qp_ex, efadv_qp_init_attr, efadv_query_ah,
    efadv_wc_read_sgid, inlen,
};
pub use self::tx::efa_io;
use self::tx::{Outcome, RnrQueue, Slots, Work};
pub use self::verbs::EfaInfo;
use self::verbs::{Context, PORT, errno, null};
use super::mem::{Bytes, Frames, frame_stride};
use super::regions::{Attached, Registrations};
use super::{
    Access, Ah, BufId, Caps, CqOp, CqStatus, Cqe, Device, DeviceError, Domain, Mr, MrId, RdmaOp,
    RdmaWr, SendWr, Source, host_now_ns, random_u64,
};
use crate::wire::RawAddr;

/// The device's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfaConfig {
    /// The verbs device to open (`rdmap0s6`, ...); the first EFA device
    /// when `None`.
    pub device: Option<String>,
    /// Packet buffers per queue.
    pub bufs: u32,
    /// Outstanding sends and RDMA operations (at most the device's
    /// `max_sq_wr`).
    pub tx_depth: usize,
    /// Posted receive buffers (at most the device's `max_rq_wr`).
    pub rx_depth: usize,
    /// The QP's own retries of a send the receiver had no buffer for,
    /// before the device backs off (libfabric's default: 3; 7 retries
    /// forever in the device).
    pub rnr_retry: u8,
    /// The first wait before an RNR-refused send goes again; it doubles
    /// with each RNR in a row, up to `rnr_backoff_max`.
    pub rnr_backoff_min: Duration,
    pub rnr_backoff_max: Duration,
    /// Small sends without a data segment go inline (copied into the
    /// work request), up to the device's inline size.
    pub inline: bool,
}

impl Default for EfaConfig {
    fn default() -> Self {
        EfaConfig {
            device: None,
            bufs: 2048,
            tx_depth: 512,
            rx_depth: 512,
            rnr_retry: 3,
            rnr_backoff_min: Duration::from_micros(20),
            rnr_backoff_max: Duration::from_millis(10),
            inline: true,
        }
    }
}

/// Why the device could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EfaError {
    /// No EFA device to open, and why (no RDMA support, no device, only
    /// other devices, no device of that name).
    #[error("{0}")]
    NoDevice(String),
    /// A verbs call failed: which, and its error number.
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Verbs { what: &'static str, errno: i32 },
    #[error("invalid efa config: {0}")]
    Config(&'static str),
}

impl From<EfaError> for DeviceError {
    fn from(e: EfaError) -> DeviceError {
        match e {
            EfaError::NoDevice(_) | EfaError::Config(_) => DeviceError::NotSupported,
            EfaError::Verbs { what, errno } => DeviceError::Os { what, errno },
        }
    }
}

fn verbs_err(what: &'static str) -> EfaError {
    EfaError::Verbs { what, errno: errno() }
}

/// The EFA devices of this host, or why there are none.
pub fn devices() -> Result<Vec<EfaInfo>, EfaError> {
    verbs::scan(None).map(|(_, infos)| infos)
}

/// The verbs rights of a region registered with `access` on `info`'s
/// device (see the module's Memory section).
fn mr_access(access: Access, info: &EfaInfo) -> i32 {
    let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if access.contains(Access::REMOTE_READ) && info.rdma_read() {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::REMOTE_WRITE) && info.rdma_write() {
        flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    flags as i32
}

/// An address handle of the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AhPtr(*mut ibv_ah);

/// A registration: its memory and its verbs MR, deregistered when the last
/// queue and the domain let go of it.
#[derive(Debug)]
struct RegionShared {
    mr: *mut ibv_mr,
    lkey: u32,
    /// Freed only once the MR is gone (see `drop`).
    bytes: std::mem::ManuallyDrop<Bytes>,
}

// SAFETY: the MR is only deregistered (in drop, once); the memory is
// reached through copies (`Bytes` is Send and Sync for that reason).
unsafe impl Send for RegionShared {}
// SAFETY: as for Send.
unsafe impl Sync for RegionShared {}

impl Drop for RegionShared {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr and deregistered once, here,
        // before `bytes` frees its memory; no queue uses it (the last
        // reference is going).
        if unsafe { ibv_dereg_mr(self.mr) } != 0 {
            // The provider kept the MR (EBUSY: work it still does reads or
            // writes the memory): the memory stays too, leaked rather than
            // freed under it.
            return;
        }
        // SAFETY: the MR is gone, nothing else reaches `bytes`, dropped once.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.bytes) };
    }
}

#[derive(Debug)]
struct DomainInner {
    cfg: EfaConfig,
    info: EfaInfo,
    pd: *mut ibv_pd,
    regs: Mutex<Registrations<Arc<RegionShared>>>,
    ahs: Mutex<AhCache<AhPtr>>,
    /// Closed last (field order): everything above is made on it.
    ctx: Context,
}

// SAFETY: the verbs objects (context, PD, MRs, AHs) are made and
// destroyed under the locks above or in drop; libibverbs' control calls
// are thread-safe. Queues (QPs, CQs) are not here: they are `!Send`.
unsafe impl Send for DomainInner {}
// SAFETY: as for Send.
unsafe impl Sync for DomainInner {}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // Regions no queue holds any more go first (their MRs are on the
        // PD), then the address handles, then the PD; the context closes
        // after, as a field.
        *lock(&self.regs) = Registrations::default();
        for ah in lock(&self.ahs).drain() {
            // SAFETY: made by ibv_create_ah on this PD, destroyed once;
            // every queue that used it is gone (it held the domain).
            unsafe { ibv_destroy_ah(ah.0) };
        }
        // SAFETY: allocated by ibv_alloc_pd, freed once, after all that
        // was made on it.
        unsafe { ibv_dealloc_pd(self.pd) };
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change is one store: a panic elsewhere leaves the table whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A protection domain on an EFA device: registrations and address
/// handles shared by the queues of a process's lcores. `Send` and `Sync`;
/// set-up work takes its locks, the hot path never does.
#[derive(Debug, Clone)]
pub struct EfaDomain {
    inner: Arc<DomainInner>,
}

impl EfaDomain {
    /// Opens the device `cfg.device` names (or the first EFA device) and
    /// allocates a protection domain.
    pub fn open(cfg: EfaConfig) -> Result<EfaDomain, EfaError> {
        if cfg.bufs == 0 || cfg.tx_depth == 0 || cfg.rx_depth == 0 {
            return Err(EfaError::Config("bufs, tx_depth and rx_depth must be positive"));
        }
        let (ctx, infos) = verbs::scan(cfg.device.as_deref())?;
        let ctx = ctx.expect("scan returns the chosen device or fails");
        let info = infos.into_iter().find(|i| cfg.device.as_ref().is_none_or(|d| *d == i.name));
        let info = info.expect("the chosen device's info");
        // SAFETY: a live context.
        let pd = unsafe { rdma_sys::ibv_alloc_pd(ctx.0) };
        if pd.is_null() {
            return Err(verbs_err("ibv_alloc_pd"));
        }
        let inner = DomainInner {
            cfg,
            info,
            pd,
            regs: Mutex::default(),
            ahs: Mutex::new(AhCache::new()),
            ctx,
        };
        Ok(EfaDomain { inner: Arc::new(inner) })
    }

    /// What the device reports.
    pub fn info(&self) -> &EfaInfo {
        &self.inner.info
    }

    /// Registers `bytes` (allocated here or the caller's) with `access`,
    /// used by `queues` queues.
    fn add(
        &self,
        bytes: Bytes,
        access: Access,
        queues: u32,
    ) -> Result<(Mr, Arc<RegionShared>), DeviceError> {
        let d = &self.inner;
        let flags = mr_access(access, &d.info);
        // SAFETY: the memory is valid and stays put until the MR is
        // deregistered (allocated here, or the register_external
        // contract); the PD is alive.
        let mr = unsafe { ibv_reg_mr(d.pd, bytes.ptr().cast(), bytes.len().max(1), flags) };
        if mr.is_null() {
            return Err(DeviceError::os("ibv_reg_mr", &std::io::Error::last_os_error()));
        }
        // SAFETY: a live MR the call just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let len = bytes.len() as u64;
        let addr = bytes.addr();
        let bytes = std::mem::ManuallyDrop::new(bytes);
        let shared = Arc::new(RegionShared { mr, lkey, bytes });
        let mut mr = Mr { id: MrId(0), key: u64::from(rkey), addr, len, access };
        let mut regs = lock(&d.regs);
        let shared = regs.insert(queues, |id| {
            mr.id = id;
            (mr, shared)
        });
        Ok((mr, shared.clone()))
    }

    fn attach(&self, mr: &Mr) -> Result<Arc<RegionShared>, DeviceError> {
        lock(&self.inner.regs).attach(mr).cloned()
    }

    fn detach(&self, id: MrId) {
        let ended = lock(&self.inner.regs).detach(id);
        // Its MR is deregistered outside the lock.
        drop(ended);
    }

    /// The address handle for `gid`, made on first use.
    fn ah(&self, gid: &[u8; 16]) -> Result<(AhPtr, u16), DeviceError> {
        let d = &self.inner;
        lock(&d.ahs).get_or_create(gid, || {
            // SAFETY: a plain C struct, all-zero valid.
            let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
            attr.is_global = 1;
            attr.port_num = PORT;
            attr.grh.dgid.raw = *gid;
            // SAFETY: a live PD; `attr` is filled above.
            let ah = unsafe { ibv_create_ah(d.pd, &mut attr) };
            if ah.is_null() {
                return Err(DeviceError::os("ibv_create_ah", &std::io::Error::last_os_error()));
            }
            let mut efa = efadv::efadv_ah_attr::default();
            // SAFETY: a live AH; `efa` is the struct whose size we pass.
            if unsafe { efadv_query_ah(ah, &mut efa, inlen::<efadv::efadv_ah_attr>()) } != 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: made above, used by nothing yet.
                unsafe { ibv_destroy_ah(ah) };
                return Err(DeviceError::os("efadv_query_ah", &e));
            }
            Ok((AhPtr(ah), efa.ahn))
        })
    }
}

impl Domain for EfaDomain {
    type Device = EfaDevice;

    fn device(&self) -> Result<EfaDevice, DeviceError> {
        Ok(EfaDevice::in_domain(self.clone())?)
    }

    fn register(&self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        self.add(Bytes::zeroed(len), access | Access::LOCAL, 0).map(|(mr, _)| mr)
    }

    unsafe fn register_external(
        &self,
        ptr: NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        // SAFETY: the caller's contract is `Bytes::external`'s: valid and
        // unmoved until deregistered.
        let bytes = unsafe { Bytes::external(ptr, len) };
        self.add(bytes, access | Access::LOCAL, 0).map(|(mr, _)| mr)
    }

    fn deregister(&self, mr: &Mr) -> Result<(), DeviceError> {
        let ended = lock(&self.inner.regs).deregister(mr);
        // Its MR is deregistered outside the lock.
        ended.map(drop)
    }
}

/// What one queue counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EfaStats {
    /// Sends the receiver had no buffer for (after the QP's own retries),
    /// and how many went again after their backoff.
    pub rnr: u64,
    pub rnr_reposts: u64,
    /// Batches the send queue refused whole (full), reported not taken.
    pub sq_full: u64,
    /// Batches refused otherwise, then posted one request at a time.
    pub batch_refused: u64,
    /// Requests that failed locally (a bad handle, region or length).
    pub local_errors: u64,
    /// Receives from senders without an address handle here.
    pub unknown_senders: u64,
    /// Of those, senders found by the GID the CQ read.
    pub known_by_gid: u64,
}

/// Marks a receive's `wr_id` (its buffer); sends carry their slot.
const RECV_TAG: u64 = 1 << 63;

/// One lcore's SRD queue pair and completion queue on an EFA device.
pub struct EfaDevice {
    qp: *mut ibv_qp,
    qpx: *mut ibv_qp_ex,
    cq: *mut ibv_cq_ex,
    /// The EFA view of the CQ when it reads senders' GIDs; else null.
    efa_cq: *mut efadv_cq,
    /// The thread and parent domains, when the provider has them; else
    /// null.
    td: *mut ibv_td,
    parent: *mut ibv_pd,
    pool_mr: *mut ibv_mr,
    pool_lkey: u32,
    frames: Frames,
    me: RawAddr,
    caps: Caps,
    book: Book<AhPtr>,
    regions: Attached<Arc<RegionShared>>,
    slots: Slots,
    rnr: RnrQueue,
    /// Completions of requests that failed before reaching the device.
    local: VecDeque<Cqe>,
    /// Slots of the batch being posted (capacity: the queue's depth).
    batch: Vec<u32>,
    rx_posted: usize,
    recv_wrs: Box<[ibv_recv_wr]>,
    recv_sges: Box<[ibv_sge]>,
    stats: EfaStats,
    /// The packet buffers' memory, freed once their MR is deregistered
    /// (in drop; leaked if the provider refuses); reached through `frames`.
    _pool: std::mem::ManuallyDrop<Bytes>,
    /// Last: the PD and context outlive the queue's objects.
    domain: EfaDomain,
}

impl std::fmt::Debug for EfaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfaDevice")
            .field("device", &self.domain.inner.info.name)
            .field("addr", &self.me)
            .field("caps", &self.caps)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl EfaDevice {
    /// A queue on a domain of its own (the device `cfg` names).
    pub fn new(cfg: EfaConfig) -> Result<EfaDevice, EfaError> {
        EfaDevice::in_domain(EfaDomain::open(cfg)?)
    }

    /// What this queue counted.
    pub fn stats(&self) -> EfaStats {
        self.stats
    }

    /// Its domain.
    pub fn domain(&self) -> &EfaDomain {
        &self.domain
    }

    fn in_domain(domain: EfaDomain) -> Result<EfaDevice, EfaError> {
        let d = domain.inner.clone();
        let info = &d.info;
        let cfg = &d.cfg;
        let tx_depth = cfg.tx_depth.min(info.max_sq_wr as usize).max(1);
        let rx_depth = cfg.rx_depth.min(info.max_rq_wr as usize).max(1);
        let mtu = info.max_msg_sz as usize;
        if mtu == 0 {
            return Err(EfaError::Config("the device reports a max_msg_sz of 0"));
        }
        // The pieces are freed by `Parts`' drop if a later step fails.
        let mut p = Parts::new(d.ctx.0, d.pd);
        p.thread_domain();
        p.cq((tx_depth + rx_depth) as u32, info.cq_with_sgid())?;
        let connid = (random_u64() as u32) & 0x7fff_ffff;
        p.qp(tx_depth as u32, rx_depth as u32, info, cfg.rnr_retry, connid)?;

        let stride = frame_stride(mtu);
        let pool_len = stride.checked_mul(cfg.bufs as usize).ok_or(EfaError::Config("bufs"))?;
        let pool = Bytes::zeroed(pool_len);
        let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the pool is valid and lives (a field) until the MR is
        // deregistered in drop; the PD is alive.
        p.pool_mr = unsafe { ibv_reg_mr(d.pd, pool.ptr().cast(), pool.len(), local_write) };
        if p.pool_mr.is_null() {
            return Err(verbs_err("ibv_reg_mr (packet buffers)"));
        }
        let frames = Frames::new(&pool, cfg.bufs, mtu, stride);
        // SAFETY: a live QP and MR made above.
        let (qpn, pool_lkey) = unsafe { ((*p.qp).qp_num, (*p.pool_mr).lkey) };
        let me = RawAddr { gid: info.gid, qpn: qpn as u16, connid };
        let caps = Caps {
            mtu,
            bufs: cfg.bufs,
            tx_depth,
            rx_depth,
            inline_size: if cfg.inline { info.inline_buf_size as usize } else { 0 },
            max_rdma_size: u64::from(info.max_rdma_size),
            rdma_read: info.rdma_read(),
            rdma_write: info.rdma_write(),
            device_version: info.vendor_part_id,
            external_memory: true,
        };
        // SAFETY: plain C structs, all-zero valid; filled when posting.
        let recv_wrs = (0..rx_depth).map(|_| unsafe { std::mem::zeroed() }).collect();
        // SAFETY: as above.
        let recv_sges = (0..rx_depth).map(|_| unsafe { std::mem::zeroed() }).collect();
        let rnr = RnrQueue::new(
            tx_depth,
            cfg.rnr_backoff_min.as_nanos() as u64,
            cfg.rnr_backoff_max.as_nanos() as u64,
        );
        let dev = EfaDevice {
            qp: p.qp,
            qpx: p.qpx,
            cq: p.cq,
            efa_cq: p.efa_cq,
            td: p.td,
            parent: p.parent,
            pool_mr: p.pool_mr,
            pool_lkey,
            frames,
            me,
            caps,
            book: Book::new(),
            regions: Attached::default(),
            slots: Slots::new(tx_depth),
            rnr,
            local: VecDeque::with_capacity(tx_depth),
            batch: Vec::with_capacity(tx_depth),
            rx_posted: 0,
            recv_wrs,
            recv_sges,
            stats: EfaStats::default(),
            _pool: std::mem::ManuallyDrop::new(pool),
            domain,
        };
        // The device owns the objects now (its drop destroys them).
        std::mem::forget(p);
        Ok(dev)
    }

    fn region(&self, mr: MrId) -> &RegionShared {
        self.regions.expect(mr)
    }

    /// Region `mr` covers `[offset, offset + len)`; its lkey.
    fn lkey_for(&self, mr: MrId, offset: u64, len: u64) -> Option<u32> {
        let r = self.regions.get(mr)?;
        let end = offset.checked_add(len)?;
        (end <= r.bytes.len() as u64).then_some(r.lkey)
    }

    /// The peer `work` goes to, if the request is one the device can take.
    fn check(&self, work: &Work) -> Option<Peer<AhPtr>> {
        match work {
            Work::Send(wr) => {
                let data_ok = wr
                    .data
                    .is_none_or(|d| self.lkey_for(d.mr, d.offset, u64::from(d.len)).is_some());
                let ok = data_ok && wr.buf.0 < self.caps.bufs && wr.wire_len() <= self.caps.mtu;
                ok.then(|| self.book.get(wr.ah).copied()).flatten()
            }
            Work::Rdma(wr) => {
                let ok = self.lkey_for(wr.local, wr.local_offset, wr.len).is_some()
                    && wr.len <= self.caps.max_rdma_size
                    && u32::try_from(wr.len).is_ok()
                    && u32::try_from(wr.remote_key).is_ok();
                ok.then(|| self.book.get(wr.ah).copied()).flatten()
            }
        }
    }

    /// Adds `work` in slot `slot` to the open batch.
    ///
    /// # Safety
    /// Between `ibv_wr_start` and `ibv_wr_complete` on this QP; `work`
    /// passed [`EfaDevice::check`], so its buffer and regions exist.
    unsafe fn build(&self, slot: u32, work: &Work, peer: &Peer<AhPtr>) {
        let qpx = self.qpx;
        // SAFETY: the caller's contract; the fields are the extended QP's
        // per-request ones, read by the next builder call.
        unsafe {
            (*qpx).wr_id = u64::from(slot);
            (*qpx).wr_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        let (qpn, qkey) = (u32::from(peer.addr.qpn), peer.addr.connid);
        match work {
            Work::Send(wr) => {
                let head = self.frames.ptr(wr.buf);
                // SAFETY: the caller's contract: an open batch; the
                // address handle lives as long as the domain.
                unsafe {
                    ibv_wr_send(qpx);
                    ibv_wr_set_ud_addr(qpx, peer.ah.0, qpn, qkey);
                }
                match wr.data {
                    None if wr.len as usize <= self.caps.inline_size => {
                        // SAFETY: the buffer holds `len` bytes (checked);
                        // the provider copies them now.
                        unsafe { ibv_wr_set_inline_data(qpx, head.cast(), wr.len as usize) }
                    }
                    None => {
                        // SAFETY: inside the registered pool (checked).
                        unsafe { ibv_wr_set_sge(qpx, self.pool_lkey, head as u64, wr.len) }
                    }
                    Some(d) => {
                        let r = self.region(d.mr);
                        let sges = [
                            ibv_sge { addr: head as u64, length: wr.len, lkey: self.pool_lkey },
                            ibv_sge {
                                addr: r.bytes.addr() + d.offset,
                                length: d.len,
                                lkey: r.lkey,
                            },
                        ];
                        // SAFETY: both inside registered memory (checked);
                        // the provider copies the list now.
                        unsafe { ibv_wr_set_sge_list(qpx, sges.len(), sges.as_ptr()) }
                    }
                }
            }
            Work::Rdma(wr) => {
                let key = wr.remote_key as u32;
                // SAFETY: the caller's contract: an open batch, an op the
                // QP was made with (post_rdma checks the caps). Immediate
                // data goes as given, unconverted (as libfabric does).
                unsafe {
                    match wr.op {
                        RdmaOp::Read => ibv_wr_rdma_read(qpx, key, wr.remote_addr),
                        RdmaOp::Write { imm: None } => ibv_wr_rdma_write(qpx, key, wr.remote_addr),
                        RdmaOp::Write { imm: Some(imm) } => {
                            ibv_wr_rdma_write_imm(qpx, key, wr.remote_addr, imm)
                        }
                    }
                    ibv_wr_set_ud_addr(qpx, peer.ah.0, qpn, qkey);
                }
                let r = self.region(wr.local);
                let at = r.bytes.addr() + wr.local_offset;
                // SAFETY: inside the registered region (checked).
                unsafe { ibv_wr_set_sge(qpx, r.lkey, at, wr.len as u32) }
            }
        }
    }

    /// Posts the first `count` of the requests `work` gives, in one batch;
    /// returns how many were taken.
    fn post(&mut self, count: usize, work: impl Fn(usize) -> Work) -> usize {
        let room = self.slots.free().saturating_sub(self.local.len());
        let n = count.min(room);
        if n == 0 {
            return 0;
        }
        let local_before = self.local.len();
        self.batch.clear();
        // SAFETY: a live extended QP; the batch is completed or aborted
        // below.
        unsafe { ibv_wr_start(self.qpx) };
        for i in 0..n {
            let w = work(i);
            match self.check(&w) {
                Some(peer) => {
                    let slot = self.slots.take(w).expect("room counted above");
                    // SAFETY: the batch is open; `w` passed the check.
                    unsafe { self.build(slot, &w, &peer) };
                    self.batch.push(slot);
                }
                None => self.fail_locally(&w),
            }
        }
        let rc = if self.batch.is_empty() {
            // SAFETY: the batch opened above, on a live QP.
            unsafe { rdma_sys::ibv_wr_abort(self.qpx) };
            0
        } else {
            // SAFETY: as above.
            unsafe { ibv_wr_complete(self.qpx) }
        };
        if rc == 0 {
            for k in 0..self.batch.len() {
                let slot = self.batch[k];
                self.mark_busy(slot, true);
            }
            return n;
        }
        // EFA took none of the batch.
        for k in 0..self.batch.len() {
            self.slots.release(self.batch[k]);
        }
        self.stats.local_errors -= (self.local.len() - local_before) as u64;
        self.local.truncate(local_before);
        if rc == libc::ENOMEM {
            self.stats.sq_full += 1;
            return 0;
        }
        // Something in the batch is bad: each request alone, so that only
        // the bad ones fail.
        self.stats.batch_refused += 1;
        for i in 0..n {
            let w = work(i);
            if !self.post_one(&w) {
                self.fail_locally(&w);
            }
        }
        n
    }

    /// Posts `work` alone; whether the device took it.
    fn post_one(&mut self, w: &Work) -> bool {
        let Some(peer) = self.check(w) else { return false };
        let Some(slot) = self.slots.take(*w) else { return false };
        // SAFETY: a live QP; the batch of one is completed here; `w`
        // passed the check.
        let rc = unsafe {
            ibv_wr_start(self.qpx);
            self.build(slot, w, &peer);
            ibv_wr_complete(self.qpx)
        };
        if rc != 0 {
            self.slots.release(slot);
            return false;
        }
        self.mark_busy(slot, true);
        true
    }

    fn fail_locally(&mut self, w: &Work) {
        self.stats.local_errors += 1;
        self.local.push_back(Cqe {
            op: w.op(),
            status: CqStatus::LocalError,
            wr_id: w.wr_id(),
            ..Cqe::default()
        });
    }

    /// Counts slot `slot`'s region as used (or no longer).
    fn mark_busy(&mut self, slot: u32, busy: bool) {
        let Some(mr) = self.slots.get(u64::from(slot)).and_then(|w| w.region()) else { return };
        if busy {
            self.regions.mark_busy(mr);
        } else {
            self.regions.unmark_busy(mr, 1);
        }
    }

    /// Posts again what RNR held back and whose wait is over.
    fn repost_due(&mut self) {
        let now = host_now_ns();
        while let Some(slot) = self.rnr.pop_due(now) {
            let Some(w) = self.slots.get(u64::from(slot)) else { continue };
            let Some(peer) = self.check(&w) else {
                // Its peer was removed meanwhile.
                self.mark_busy(slot, false);
                self.slots.release(slot);
                self.local.push_back(Cqe {
                    op: w.op(),
                    status: CqStatus::PeerUnreachable,
                    wr_id: w.wr_id(),
                    ..Cqe::default()
                });
                continue;
            };
            // SAFETY: a live QP; the batch of one is completed here; the
            // slot's work passed the check.
            let rc = unsafe {
                ibv_wr_start(self.qpx);
                self.build(slot, &w, &peer);
                ibv_wr_complete(self.qpx)
            };
            if rc != 0 {
                self.rnr.push_front(slot, now);
                break;
            }
            self.stats.rnr_reposts += 1;
        }
    }

    /// The completion the CQ is at, if it is one to report.
    ///
    /// # Safety
    /// Between a successful `ibv_start_poll` (or `ibv_next_poll`) and
    /// `ibv_end_poll` on this queue's CQ.
    unsafe fn completion(&mut self) -> Option<Cqe> {
        let cq = self.cq;
        // SAFETY: the caller's contract: the CQ is at a completion.
        let (wr_id, status) = unsafe { ((*cq).wr_id, (*cq).status) };
        if wr_id & RECV_TAG != 0 {
            self.rx_posted -= 1;
            let buf = wr_id & !RECV_TAG;
            if status != tx::wc::SUCCESS {
                // A flushed receive (the QP is going): report it failed.
                return Some(Cqe {
                    op: CqOp::Recv,
                    status: CqStatus::DeviceError,
                    wr_id: buf,
                    ..Cqe::default()
                });
            }
            // SAFETY: the caller's contract; the CQ was made with these
            // fields (IBV_WC_STANDARD_FLAGS).
            let (opcode, len) = unsafe { (ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq)) };
            if opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                // SAFETY: as above; the immediate as it came.
                let imm = unsafe { ibv_wc_read_imm_data(cq) };
                return Some(Cqe {
                    op: CqOp::RecvWriteImm,
                    wr_id: buf,
                    len,
                    imm,
                    ..Cqe::default()
                });
            }
            // SAFETY: as above.
            let (slid, src_qp) = unsafe { (ibv_wc_read_slid(cq), ibv_wc_read_src_qp(cq)) };
            let mut src = self.book.source(slid, src_qp);
            if let Source::Unknown { .. } = src {
                self.stats.unknown_senders += 1;
                if !self.efa_cq.is_null() {
                    // SAFETY: all-zero is a valid GID.
                    let mut gid: efadv::ibv_gid = unsafe { std::mem::zeroed() };
                    // SAFETY: the EFA view of this CQ, at a completion.
                    if unsafe { efadv_wc_read_sgid(self.efa_cq, &mut gid) } == 0 {
                        // SAFETY: the union's byte view, valid for any bits.
                        src = self.book.source_by_gid(unsafe { &gid.raw }, src_qp);
                        if let Source::Known(_) = src {
                            self.stats.known_by_gid += 1;
                        }
                    }
                }
            }
            return Some(Cqe { op: CqOp::Recv, wr_id: buf, len, src, ..Cqe::default() });
        }
        let slot = wr_id as u32;
        let vendor = if status == tx::wc::SUCCESS {
            0
        } else {
            // SAFETY: the caller's contract.
            unsafe { ibv_wc_read_vendor_err(cq) }
        };
        match tx::outcome(status, vendor) {
            Outcome::Rnr => {
                self.stats.rnr += 1;
                let nth = self.slots.rnr(slot);
                self.rnr.push(slot, nth, host_now_ns());
                None
            }
            Outcome::Done(status) => {
                self.mark_busy(slot, false);
                let w = self.slots.release(slot)?;
                Some(Cqe { op: w.op(), status, wr_id: w.wr_id(), ..Cqe::default() })
            }
        }
    }
}

/// A queue's verbs objects while it is being made: whatever exists is
/// destroyed, in order, if a step fails.
struct Parts {
    ctx: *mut rdma_sys::ibv_context,
    pd: *mut ibv_pd,
    td: *mut ibv_td,
    parent: *mut ibv_pd,
    cq: *mut ibv_cq_ex,
    efa_cq: *mut efadv_cq,
    qp: *mut ibv_qp,
    qpx: *mut ibv_qp_ex,
    pool_mr: *mut ibv_mr,
}

impl Parts {
    fn new(ctx: *mut rdma_sys::ibv_context, pd: *mut ibv_pd) -> Parts {
        Parts {
            ctx,
            pd,
            td: null(),
            parent: null(),
            cq: null(),
            efa_cq: null(),
            qp: null(),
            qpx: null(),
            pool_mr: null(),
        }
    }

    /// The PD the queue's objects go in: its parent domain if it has one.
    fn queue_pd(&self) -> *mut ibv_pd {
        if self.parent.is_null() { self.pd } else { self.parent }
    }

    /// A thread domain and a parent domain over the PD, where the
    /// provider has them (not EFA's in rdma-core 44: see the module
    /// docs); without, the plain PD.
    fn thread_domain(&mut self) {
        let mut attr = ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: a live context; a provider without thread domains
        // answers None or null (EOPNOTSUPP).
        let td = unsafe { ibv_alloc_td(self.ctx, &mut attr) }.unwrap_or(null());
        if td.is_null() {
            return;
        }
        // SAFETY: a plain C struct, all-zero valid.
        let mut pattr: ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        pattr.pd = self.pd;
        pattr.td = td;
        // SAFETY: a live context, PD and TD.
        let parent = unsafe { ibv_alloc_parent_domain(self.ctx, &mut pattr) }.unwrap_or(null());
        if parent.is_null() {
            // SAFETY: allocated above, used by nothing.
            unsafe { ibv_dealloc_td(td) };
            return;
        }
        self.td = td;
        self.parent = parent;
    }

    fn cq(&mut self, cqe: u32, with_sgid: bool) -> Result<(), EfaError> {
        // SAFETY: a plain C struct, all-zero valid.
        let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = cqe;
        // libfabric's IBV_WC_STANDARD_FLAGS: byte_len, imm, qp_num,
        // src_qp, slid, sl, dlid_path_bits.
        attr.wc_flags = u64::from(
            (ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SLID
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SL
                | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_DLID_PATH_BITS)
                .0,
        );
        if !self.parent.is_null() {
            attr.comp_mask = (ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_PD
                | ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_FLAGS)
                .0;
            attr.parent_domain = self.parent;
            attr.flags = ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_SINGLE_THREADED.0;
        }
        if with_sgid {
            let mut efa = efadv_cq_init_attr { comp_mask: 0, wc_flags: EFADV_WC_EX_WITH_SGID };
            // SAFETY: a live context; the structs are filled above.
            self.cq = unsafe {
                efadv_create_cq(self.ctx, &mut attr, &mut efa, inlen::<efadv_cq_init_attr>())
            };
            if self.cq.is_null() {
                return Err(verbs_err("efadv_create_cq"));
            }
            // SAFETY: a CQ efadv_create_cq made.
            self.efa_cq = unsafe { efadv_cq_from_ibv_cq_ex(self.cq) };
        } else {
            // SAFETY: a live context; `attr` is filled above.
            self.cq = unsafe { ibv_create_cq_ex(self.ctx, &mut attr) }.unwrap_or(null());
            if self.cq.is_null() {
                return Err(verbs_err("ibv_create_cq_ex"));
            }
        }
        Ok(())
    }

    fn qp(
        &mut self,
        tx_depth: u32,
        rx_depth: u32,
        info: &EfaInfo,
        rnr_retry: u8,
        qkey: u32,
    ) -> Result<(), EfaError> {
        // SAFETY: a live CQ made above.
        let cq = unsafe { ibv_cq_ex_to_cq(self.cq) };
        // SAFETY: a plain C struct, all-zero valid.
        let mut attr: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.qp_type = ibv_qp_type::IBV_QPT_DRIVER;
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.cap.max_send_wr = tx_depth;
        attr.cap.max_recv_wr = rx_depth;
        // A header from the packet pool, then a region's bytes.
        attr.cap.max_send_sge = u32::from(info.max_sq_sge).min(2);
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = u32::from(info.inline_buf_size);
        // Every request completes: its slot is freed by its completion.
        attr.sq_sig_all = 1;
        attr.pd = self.queue_pd();
        attr.comp_mask = (ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
            .0;
        let mut ops = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND
            | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM;
        if info.rdma_read() {
            ops |= ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ;
        }
        if info.rdma_write() {
            ops |= ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE
                | ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
        }
        attr.send_ops_flags = u64::from(ops.0);
        let mut efa = efadv_qp_init_attr {
            driver_qp_type: EFADV_QP_DRIVER_TYPE_SRD,
            ..efadv_qp_init_attr::default()
        };
        // SAFETY: a live context; the structs are filled above.
        self.qp = unsafe {
            efadv_create_qp_ex(self.ctx, &mut attr, &mut efa, inlen::<efadv_qp_init_attr>())
        };
        if self.qp.is_null() {
            return Err(verbs_err("efadv_create_qp_ex"));
        }
        // SAFETY: a QP made with send ops flags, so it has the extension.
        self.qpx = unsafe { ibv_qp_to_qp_ex(self.qp) };
        if self.qpx.is_null() {
            return Err(verbs_err("ibv_qp_to_qp_ex"));
        }
        use ibv_qp_attr_mask as m;
        // SAFETY: a plain C struct, all-zero valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = PORT;
        a.qkey = qkey;
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY;
        self.modify(&mut a, mask, "ibv_modify_qp to INIT")?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, m::IBV_QP_STATE, "ibv_modify_qp to RTR")?;
        // SAFETY: as above.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if info.rnr_retry() {
            a.rnr_retry = rnr_retry.min(7);
            mask |= m::IBV_QP_RNR_RETRY;
        }
        self.modify(&mut a, mask, "ibv_modify_qp to RTS")
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), EfaError> {
        // SAFETY: a live QP; `attr` holds the fields `mask` names.
        let rc = unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(EfaError::Verbs { what, errno: rc });
        }
        Ok(())
    }
}

impl Parts {
    /// Destroys what exists, users first: the QP (which stops its DMA),
    /// the pool's MR, the CQ, then the parent and thread domains; each
    /// once (its pointer is cleared). Whether the pool's memory may be
    /// freed: its MR is gone (or was never made).
    fn destroy(&mut self) -> bool {
        // SAFETY: each object was made by this queue's set-up, and is
        // destroyed here once, users first.
        unsafe {
            if !self.qp.is_null() {
                ibv_destroy_qp(self.qp);
                self.qp = null();
            }
            let mut pool_gone = true;
            if !self.pool_mr.is_null() {
                // Refused (a provider that still uses it): the caller keeps
                // the memory rather than free it under the provider.
                pool_gone = ibv_dereg_mr(self.pool_mr) == 0;
                self.pool_mr = null();
            }
            if !self.cq.is_null() {
                ibv_destroy_cq(ibv_cq_ex_to_cq(self.cq));
                self.cq = null();
            }
            if !self.parent.is_null() {
                ibv_dealloc_pd(self.parent);
                self.parent = null();
            }
            if !self.td.is_null() {
                ibv_dealloc_td(self.td);
                self.td = null();
            }
            pool_gone
        }
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        // A set-up that failed registered no pool, or failed doing so.
        self.destroy();
    }
}

impl Drop for EfaDevice {
    fn drop(&mut self) {
        // The verbs objects go first (Parts' order), then the regions'
        // references (the MRs of the last ones are deregistered), then the
        // pool's memory; the domain last.
        let pool_gone = Parts {
            ctx: null(),
            pd: null(),
            td: self.td,
            parent: self.parent,
            cq: self.cq,
            efa_cq: self.efa_cq,
            qp: self.qp,
            qpx: self.qpx,
            pool_mr: self.pool_mr,
        }
        .destroy();
        let domain = &self.domain;
        self.regions.clear(|id| domain.detach(id));
        if pool_gone {
            // SAFETY: its MR is gone and the frames are not used again;
            // dropped once, here.
            unsafe { std::mem::ManuallyDrop::drop(&mut self._pool) };
        }
    }
}

impl Device for EfaDevice {
    fn caps(&self) -> Caps {
        self.caps
    }

    fn addr(&self) -> RawAddr {
        self.me
    }

    fn insert_addr(&mut self, addr: &RawAddr) -> Result<Ah, DeviceError> {
        let domain = &self.domain;
        self.book.insert(addr, |gid| domain.ah(gid))
    }

    fn remove_addr(&mut self, ah: Ah) {
        self.book.remove(ah);
    }

    unsafe fn buf(&self, id: BufId) -> &[u8] {
        // SAFETY: the buffer is not posted (the caller's contract), so the
        // NIC does not write it.
        unsafe { self.frames.slice(id) }
    }

    unsafe fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        // SAFETY: as `buf`; `&mut self` makes the loan exclusive.
        unsafe { self.frames.slice_mut(id) }
    }

    fn register(&mut self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        let (mr, shared) = self.domain.add(Bytes::zeroed(len), access | Access::LOCAL, 1)?;
        self.regions.insert(mr.id, shared);
        Ok(mr)
    }

    fn attach(&mut self, mr: &Mr) -> Result<(), DeviceError> {
        let domain = &self.domain;
        self.regions.attach(mr.id, || domain.attach(mr))
    }

    fn deregister(&mut self, mr: MrId) -> Result<(), DeviceError> {
        self.regions.remove(mr)?;
        self.domain.detach(mr);
        Ok(())
    }

    fn read_region(&self, mr: MrId, offset: usize, out: &mut [u8]) {
        self.region(mr).bytes.read(offset, out);
    }

    fn write_region(&mut self, mr: MrId, offset: usize, src: &[u8]) {
        self.region(mr).bytes.write(offset, src);
    }

    fn copy_region(&mut self, src: MrId, src_off: usize, dst: MrId, dst_off: usize, len: usize) {
        let (s, d) = (&self.region(src).bytes, &self.region(dst).bytes);
        Bytes::copy(s, src_off, d, dst_off, len);
    }

    fn update_region<F: FnMut(usize, &mut [u8])>(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        fetch: Option<(BufId, usize)>,
        combine: F,
    ) {
        self.region(mr).bytes.update(offset, len, self.frames.fetcher(fetch), combine);
    }

    fn read_payload(&mut self, buf: BufId, from: usize, out: &mut [u8]) {
        self.frames.read(buf, from, out);
    }

    fn copy_to_region(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        self.frames.copy_out(buf, from, &self.region(mr).bytes, offset, len);
    }

    fn copy_from_region(&mut self, mr: MrId, offset: usize, buf: BufId, to: usize, len: usize) {
        self.frames.copy_in(buf, to, &self.region(mr).bytes, offset, len);
    }

    fn prepare_rdma(&mut self, mr: MrId) -> Result<(), DeviceError> {
        if self.regions.contains(mr) { Ok(()) } else { Err(DeviceError::UnknownHandle) }
    }

    fn post_recv(&mut self, bufs: &[BufId]) -> usize {
        let room = self.caps.rx_depth - self.rx_posted;
        let n = bufs.len().min(room);
        if n == 0 {
            return 0;
        }
        let wrs = self.recv_wrs.as_mut_ptr();
        let sges = self.recv_sges.as_mut_ptr();
        for (i, &buf) in bufs[..n].iter().enumerate() {
            let at = self.frames.ptr(buf) as u64;
            // SAFETY: `i < n <= rx_depth`, the arrays' length.
            unsafe {
                *sges.add(i) =
                    ibv_sge { addr: at, length: self.caps.mtu as u32, lkey: self.pool_lkey };
                *wrs.add(i) = ibv_recv_wr {
                    wr_id: RECV_TAG | buf.wr_id(),
                    next: if i + 1 < n { wrs.add(i + 1) } else { null() },
                    sg_list: sges.add(i),
                    num_sge: 1,
                };
            }
        }
        let mut bad: *mut ibv_recv_wr = null();
        // SAFETY: a live QP; the chain of `n` requests is built above over
        // registered buffers the caller holds (not posted).
        let rc = unsafe { ibv_post_recv(self.qp, wrs, &mut bad) };
        let taken = if rc == 0 {
            n
        } else if bad.is_null() {
            0
        } else {
            // SAFETY: `bad` points into the chain, at the first request
            // not posted.
            (unsafe { bad.offset_from(wrs) }).clamp(0, n as isize) as usize
        };
        self.rx_posted += taken;
        taken
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> usize {
        self.post(wrs.len(), |i| Work::Send(wrs[i]))
    }

    fn post_rdma(&mut self, wrs: &[RdmaWr]) -> usize {
        // A device without the capability takes none.
        let (read, write) = (self.caps.rdma_read, self.caps.rdma_write);
        let offered = |w: &RdmaWr| match w.op {
            RdmaOp::Read => read,
            RdmaOp::Write { .. } => write,
        };
        let count = wrs.iter().position(|w| !offered(w)).unwrap_or(wrs.len());
        self.post(count, |i| Work::Rdma(wrs[i]))
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.local.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        if !self.rnr.is_empty() {
            self.repost_due();
        }
        if n == out.len() {
            return n;
        }
        let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: a live CQ, polled by this queue alone.
        if unsafe { ibv_start_poll(self.cq, &mut attr) } != 0 {
            return n;
        }
        loop {
            // SAFETY: the poll started above and is not ended yet.
            if let Some(c) = unsafe { self.completion() } {
                out[n] = c;
                n += 1;
            }
            // SAFETY: as above.
            if n == out.len() || unsafe { ibv_next_poll(self.cq) } != 0 {
                break;
            }
        }
        // SAFETY: ends the poll started above.
        unsafe { ibv_end_poll(self.cq) };
        n
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        vec![
            ("rnr", s.rnr),
            ("rnr_reposts", s.rnr_reposts),
            ("rnr_waiting", self.rnr.len() as u64),
            ("sq_full", s.sq_full),
            ("batch_refused", s.batch_refused),
            ("local_errors", s.local_errors),
            ("unknown_senders", s.unknown_senders),
            ("known_by_gid", s.known_by_gid),
        ]
    }

    fn now_ns(&self) -> u64 {
        host_now_ns()
    }
}

#[cfg(test)]
mod tests;
