//! The device, its context, and the objects of a protection domain:
//! device list and queries, PD, MR, AH, and the efadv queries.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::offset_of;
use std::net::IpAddr;
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use efapoll::device::udp::{UdpConfig, UdpDomain};
use efapoll::device::{Access, Domain, Mr as UdpMr};
use rdma_sys::*;

use crate::efadv::*;
use crate::limits::*;
use crate::qp::{Qp, Revoke};
use crate::{config, cq, current, qp};

/// The one device: an `ibv_device` that lives as long as the process.
struct DevicePtr(*mut ibv_device);
// SAFETY: the device is written once, before it is shared, and only read
// after.
unsafe impl Send for DevicePtr {}
// SAFETY: as above.
unsafe impl Sync for DevicePtr {}

pub(crate) const DEVICE_NAME: &str = "rdmap0s0";

fn device() -> *mut ibv_device {
    static DEVICE: OnceLock<DevicePtr> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            // SAFETY: ibv_device is plain C data: all-zero is a valid value.
            let mut d: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
            d.node_type = ibv_node_type::IBV_NODE_UNSPECIFIED;
            d.transport_type = ibv_transport_type::IBV_TRANSPORT_UNSPECIFIED;
            let path = sysfs().join("class/infiniband").join(DEVICE_NAME);
            let path = path.to_string_lossy();
            copy_cstr(&mut d.name, DEVICE_NAME);
            copy_cstr(&mut d.dev_name, "uverbs0");
            copy_cstr(&mut d.dev_path, "/sys/class/infiniband_verbs/uverbs0");
            copy_cstr(&mut d.ibdev_path, &path);
            DevicePtr(Box::into_raw(d))
        })
        .0
}

/// A sysfs of our own for the device, with what libfabric's EFA provider
/// reads there (efa_device.c: the ABI version, the device's PCI address
/// and driver, through `ibdev_path` and `SYSFS_PATH`):
///
/// ```text
/// class/infiniband_verbs/abi_version        "6"
/// class/infiniband/rdmap0s0/device       -> devices/pci0000:00/0000:00:06.0
/// devices/pci0000:00/0000:00:06.0/driver -> bus/pci/drivers/efa
/// ```
///
/// Under `SOFTEFA_SYSFS`, or the temporary directory. `SYSFS_PATH` is set
/// to it where unset and the host's sysfs has no verbs class (no RDMA
/// device): readers of the real sysfs find nothing there anyway.
fn sysfs() -> std::path::PathBuf {
    use std::os::unix::fs::symlink;
    let root = match std::env::var_os("SOFTEFA_SYSFS") {
        Some(r) => std::path::PathBuf::from(r),
        // SAFETY: getuid takes nothing and cannot fail.
        None => std::env::temp_dir().join(format!("softefa-sysfs-{}", unsafe { libc::getuid() })),
    };
    let pci = "devices/pci0000:00/0000:00:06.0";
    let made = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(root.join("class/infiniband_verbs"))?;
        std::fs::write(root.join("class/infiniband_verbs/abi_version"), "6\n")?;
        std::fs::create_dir_all(root.join("class/infiniband").join(DEVICE_NAME))?;
        std::fs::create_dir_all(root.join(pci))?;
        std::fs::create_dir_all(root.join("bus/pci/drivers/efa"))?;
        let link = |target: &str, at: std::path::PathBuf| match symlink(target, &at) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        };
        link(
            &format!("../../../{pci}"),
            root.join("class/infiniband").join(DEVICE_NAME).join("device"),
        )?;
        link("../../../bus/pci/drivers/efa", root.join(pci).join("driver"))
    })();
    let real = std::path::Path::new("/sys/class/infiniband_verbs/abi_version").exists();
    if made.is_ok() && !real && std::env::var_os("SYSFS_PATH").is_none() {
        // SAFETY: done once, while the device list is first made: verbs
        // programs do that before they start threads that read the
        // environment.
        unsafe { std::env::set_var("SYSFS_PATH", &root) };
    }
    root
}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// The device's GID: the address its QPs bind, IPv6 (IPv4 mapped), as the
/// udp device names itself.
pub(crate) fn gid() -> [u8; 16] {
    match config().addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The node GUID: the GID's low 64 bits, so two hosts differ.
fn guid() -> u64 {
    let g = gid();
    u64::from_be_bytes(g[8..].try_into().expect("8 bytes"))
}

/// Address handles by GID, shared by the context's PDs: EFA numbers an AH
/// per GID, and a receive names its sender by that number.
#[derive(Debug, Default)]
pub(crate) struct AhTable {
    by_gid: HashMap<[u8; 16], (u16, u32)>,
    used: Vec<bool>,
}

/// An open device: rdma-core's `verbs_context` (whose `ibv_context` the
/// caller sees, and through whose ops verbs.h's inline functions call
/// us), then ours.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) vctx: verbs_context,
    pub(crate) ahs: RwLock<AhTable>,
    /// Bumped at each change of `ahs`, under its write lock: a QP keeps
    /// the AH numbers of its senders and looks again only when this moved,
    /// so a receive takes no lock.
    pub(crate) ahs_gen: AtomicU64,
    fd: c_int,
}

impl Ctx {
    /// The context of an `ibv_context` we made.
    ///
    /// # Safety
    /// `c` came from [`ibv_open_device`] and is not closed.
    pub(crate) unsafe fn of<'a>(c: *mut ibv_context) -> &'a Ctx {
        // SAFETY: the ibv_context is the last field of the verbs_context,
        // the first of a Ctx (repr(C)), which lives until closed.
        unsafe { &*c.byte_sub(offset_of!(verbs_context, context)).cast::<Ctx>() }
    }

    /// The AH number of `gid`, or [`NO_AH`] when it has none here.
    pub(crate) fn ahn_of(&self, gid: &[u8; 16]) -> u16 {
        let t = self.ahs.read().unwrap_or_else(|e| e.into_inner());
        t.by_gid.get(gid).map_or(NO_AH, |&(n, _)| n)
    }
}

// ---- device list ----

/// # Safety
/// `num` is null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    // Freed by ibv_free_device_list with free(), as rdma-core's is.
    // SAFETY: calloc of two pointers; checked below.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: two slots were allocated; the second stays null.
    unsafe { *list = device() };
    if !num.is_null() {
        // SAFETY: the caller's pointer, checked non-null.
        unsafe { *num = 1 };
    }
    list
}

/// # Safety
/// `list` came from [`ibv_get_device_list`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: allocated with calloc by ibv_get_device_list.
    unsafe { libc::free(list.cast()) }
}

/// # Safety
/// `dev` is the device of [`ibv_get_device_list`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    // SAFETY: the device lives as long as the process.
    unsafe { (*dev).name.as_ptr() }
}

/// # Safety
/// Any device pointer; only ours exists.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_guid(_dev: *mut ibv_device) -> u64 {
    guid().to_be()
}

/// # Safety
/// Any device pointer; only ours exists.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_index(_dev: *mut ibv_device) -> c_int {
    0
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

// ---- context ----

/// # Safety
/// `dev` is the device of [`ibv_get_device_list`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    // A descriptor for cmd_fd and async_fd: callers may poll or fcntl them;
    // nothing is ever ready on it.
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    let ctx = Box::new(Ctx {
        // SAFETY: verbs_context is C data (pointers, integers, optional
        // function pointers, an opaque mutex): all-zero is valid, and a
        // zeroed pthread mutex is an initialised one on glibc.
        vctx: unsafe { std::mem::zeroed() },
        ahs: RwLock::default(),
        ahs_gen: AtomicU64::new(0),
        fd,
    });
    let ctx = Box::into_raw(ctx);
    // SAFETY: just made, not shared yet.
    let v = unsafe { &mut (*ctx).vctx };
    v.sz = size_of::<verbs_context>();
    v.query_port = Some(query_port_ex);
    v.create_cq_ex = Some(cq::create_cq_ex);
    v.create_qp_ex = Some(qp::create_qp_ex);
    let c = &mut v.context;
    c.device = dev;
    c.cmd_fd = fd;
    c.async_fd = fd;
    c.num_comp_vectors = 1;
    // verbs_get_ctx's mark of an extended context (__VERBS_ABI_IS_EXTENDED).
    c.abi_compat = usize::MAX as *mut c_void;
    c.ops.poll_cq = Some(cq::poll_cq);
    c.ops.req_notify_cq = Some(cq::req_notify_cq);
    c.ops.post_send = Some(qp::post_send);
    c.ops.post_recv = Some(qp::post_recv);
    c
}

/// # Safety
/// `c` came from [`ibv_open_device`]; its objects were destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    // SAFETY: the caller's contract; the Ctx was boxed by ibv_open_device.
    let ctx = unsafe { Box::from_raw((Ctx::of(c) as *const Ctx).cast_mut()) };
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(ctx.fd) };
    0
}

/// # Safety
/// `c` is an open context, `attr` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    _c: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: the caller's struct; all-zero is a valid value of it.
    let a = unsafe { &mut *attr };
    // SAFETY: as above.
    *a = unsafe { std::mem::zeroed() };
    copy_cstr(&mut a.fw_ver, "0.0.0.0");
    a.node_guid = guid().to_be();
    a.sys_image_guid = guid().to_be();
    a.max_mr_size = 1 << 40;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = VENDOR_ID;
    a.vendor_part_id = VENDOR_PART_ID;
    a.max_qp = MAX_QP;
    a.max_qp_wr = MAX_SQ_WR as c_int;
    a.max_sge = MAX_SQ_SGE as c_int;
    a.max_sge_rd = MAX_RDMA_SGE as c_int;
    a.max_cq = MAX_CQ;
    a.max_cqe = MAX_CQE;
    a.max_mr = MAX_MR;
    a.max_pd = MAX_PD;
    a.max_ah = MAX_AH;
    a.max_pkeys = 1;
    a.phys_port_cnt = 1;
    a.atomic_cap = ibv_atomic_cap::IBV_ATOMIC_NONE;
    0
}

fn fill_port(a: &mut ibv_port_attr) {
    // SAFETY: C data; all-zero is valid.
    *a = unsafe { std::mem::zeroed() };
    a.state = ibv_port_state::IBV_PORT_ACTIVE;
    a.max_mtu = ibv_mtu::IBV_MTU_4096;
    a.active_mtu = ibv_mtu::IBV_MTU_4096;
    a.gid_tbl_len = 1;
    a.max_msg_sz = config().mtu as u32;
    a.pkey_tbl_len = 1;
    a.lid = 0;
    a.active_width = 1;
    a.active_speed = 1;
    // LinkUp.
    a.phys_state = 5;
    // IBV_LINK_LAYER_UNSPECIFIED.
    a.link_layer = 0;
}

unsafe extern "C" fn query_port_ex(
    _c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: C data; all-zero is valid.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    fill_port(&mut a);
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct holds `len` bytes; we write at most that.
    unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

/// The exported query_port takes the compat layout, which has the same
/// size as `ibv_port_attr`.
///
/// # Safety
/// `attr` is a writable `ibv_port_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { query_port_ex(c, port, attr, size_of::<ibv_port_attr>()) }
}

/// # Safety
/// `gid` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    _c: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut ibv_gid,
) -> c_int {
    if port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: the caller's gid.
    unsafe { (*out).raw = gid() };
    0
}

/// # Safety
/// `pkey` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    _c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: the caller's pkey.
    unsafe { *pkey = 0xffff };
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    // Registered memory is the caller's own: a child's copy-on-write does
    // not move what a QP reaches.
    IBV_FORK_UNNEEDED
}

/// # Safety
/// `c` is an open context, `attr` holds `inlen` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_query_device(
    _c: *mut ibv_context,
    attr: *mut efadv_device_attr,
    inlen: u32,
) -> c_int {
    let avail = |end: usize| inlen as usize >= end;
    if !avail(offset_of!(efadv_device_attr, inline_buf_size) + 2) {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct holds `inlen` bytes.
    unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, inlen as usize) };
    let mut a = efadv_device_attr {
        max_sq_wr: MAX_SQ_WR,
        max_rq_wr: MAX_RQ_WR,
        max_sq_sge: MAX_SQ_SGE as u16,
        max_rq_sge: MAX_RQ_SGE as u16,
        inline_buf_size: INLINE_BUF_SIZE as u16,
        ..Default::default()
    };
    if avail(offset_of!(efadv_device_attr, device_caps) + 4) {
        a.device_caps |= EFADV_DEVICE_ATTR_CAPS_RNR_RETRY | EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID;
    }
    if avail(size_of::<efadv_device_attr>()) {
        a.max_rdma_size = MAX_RDMA_SIZE;
        let cfg = current();
        if cfg.rdma_read {
            a.device_caps |= EFADV_DEVICE_ATTR_CAPS_RDMA_READ;
        }
        if cfg.rdma_write {
            a.device_caps |= EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE;
        }
    }
    let n = (inlen as usize).min(size_of::<efadv_device_attr>());
    // SAFETY: at most `inlen` bytes of the caller's struct.
    unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

// ---- protection domain ----

/// A registration as QPs use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrInfo {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) udp: UdpMr,
}

impl MrInfo {
    /// The offset of `[addr, addr + len)` in the region, if inside.
    pub(crate) fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.addr)?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }
}

#[derive(Default)]
pub(crate) struct PdState {
    pub(crate) mrs: HashMap<u32, MrInfo>,
    pub(crate) qps: Vec<*const Qp>,
}

// SAFETY: the QP pointers are of live QPs (a QP removes itself before it
// is freed), which are Sync.
unsafe impl Send for PdState {}

/// A protection domain: a udp domain whose keys fit 32 bits.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) ibv: ibv_pd,
    pub(crate) domain: UdpDomain,
    pub(crate) state: Mutex<PdState>,
}

impl Pd {
    /// # Safety
    /// `pd` came from [`ibv_alloc_pd`] and is not freed.
    pub(crate) unsafe fn of<'a>(pd: *mut ibv_pd) -> &'a Pd {
        // SAFETY: the ibv_pd is the first field of a Pd (repr(C)).
        unsafe { &*pd.cast::<Pd>() }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, PdState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The udp parameters a PD's QPs start from.
pub(crate) fn udp_config() -> UdpConfig {
    let cfg = current();
    UdpConfig {
        bind: std::net::SocketAddr::new(cfg.addr, 0),
        mtu: cfg.mtu,
        rdma_read: cfg.rdma_read,
        rdma_write: cfg.rdma_write,
        max_rdma_size: u64::from(MAX_RDMA_SIZE),
        short_keys: true,
        faults: cfg.faults,
        window: cfg.udp_window,
        // The udp device's acknowledgement delay: an ack owed rides on the
        // program's answer if one follows, and a program that stops
        // polling has its acks sent by the progress thread.
        ..UdpConfig::default()
    }
}

/// # Safety
/// `c` is an open context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    static HANDLES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let pd = Box::new(Pd {
        ibv: ibv_pd {
            context: c,
            handle: HANDLES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        },
        domain: UdpDomain::new(udp_config()),
        state: Mutex::default(),
    });
    Box::into_raw(pd).cast()
}

/// # Safety
/// `pd` came from [`ibv_alloc_pd`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    {
        // SAFETY: the caller's contract.
        let p = unsafe { Pd::of(pd) };
        let s = p.lock();
        if !s.mrs.is_empty() || !s.qps.is_empty() {
            return libc::EBUSY;
        }
    }
    // SAFETY: boxed by ibv_alloc_pd; nothing refers to it any more.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}

/// A memory region.
#[repr(C)]
pub(crate) struct Mr {
    ibv: ibv_mr,
    info: MrInfo,
}

/// # Safety
/// `pd` is ours; `[addr, addr + len)` stays mapped until deregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // Peers name a region by its address here: an iova elsewhere would need
    // the udp device to translate.
    if iova != addr as u64 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    // SAFETY: the caller's contract.
    let p = unsafe { Pd::of(pd) };
    let mut rights = Access::LOCAL;
    if access & ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 != 0 {
        rights |= Access::REMOTE_READ;
    }
    if access & ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 != 0 {
        rights |= Access::REMOTE_WRITE;
    }
    let Some(ptr) = NonNull::new(addr.cast::<u8>()) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    // SAFETY: the caller keeps the memory mapped until ibv_dereg_mr, which
    // deregisters it from the domain.
    let udp = match unsafe { p.domain.register_external(ptr, len as u64, rights) } {
        Ok(m) => m,
        Err(_) => {
            set_errno(libc::ENOMEM);
            return null_mut();
        }
    };
    let info = MrInfo { addr: addr as u64, len: len as u64, udp };
    let key = udp.key as u32;
    let mut s = p.lock();
    for &qp in &s.qps {
        // SAFETY: QPs in the PD's list are live.
        unsafe { (*qp).attach(&info) };
    }
    s.mrs.insert(key, info);
    let mr = Box::new(Mr {
        ibv: ibv_mr {
            context: p.ibv.context,
            pd,
            addr,
            length: len,
            handle: udp.id.0,
            lkey: key,
            rkey: key,
        },
        info,
    });
    Box::into_raw(mr).cast()
}

/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, len, addr as u64, access as c_uint) }
}

/// # Safety
/// As [`ibv_reg_mr_iova2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the caller's contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, len, iova, access as c_uint) }
}

/// How long `ibv_dereg_mr` lets the reads peers make of the region finish
/// (their readers acknowledge the last bytes, as a NIC's DMA ends) before
/// it revokes them: the QPs are driven meanwhile, here and by the peers'
/// progress threads, which answer within a few milliseconds.
const DEREG_WAIT: Duration = Duration::from_millis(10);

/// Deregisters at once, as EFA does: a read a peer makes of the region is
/// let finish for `DEREG_WAIT` (10 ms) at most, then revoked (it fails at the
/// reader, unless all of it had arrived); later ones are refused (remote
/// access error). EBUSY, the region kept, only while a WR this process
/// posted still reads or writes it after that wait.
///
/// # Safety
/// `mr` came from one of the `ibv_reg_mr` calls.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: the caller's contract: our Mr (repr(C), ibv_mr first).
    let m = unsafe { &*mr.cast::<Mr>() };
    // SAFETY: the MR's PD outlives it.
    let p = unsafe { Pd::of(m.ibv.pd) };
    let deadline = Instant::now() + DEREG_WAIT;
    loop {
        let mut s = p.lock();
        match qp::revoke(&s.qps, &m.info, Instant::now() >= deadline) {
            Revoke::Done => {
                s.mrs.remove(&m.ibv.lkey);
                break;
            }
            Revoke::Busy => return libc::EBUSY,
            Revoke::Wait => {}
        }
        drop(s);
        std::thread::sleep(Duration::from_micros(50));
    }
    let _ = p.domain.deregister(&m.info.udp);
    // SAFETY: boxed by ibv_reg_mr_iova2; no QP refers to it any more.
    drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
    0
}

// ---- address handles ----

#[repr(C)]
pub(crate) struct Ah {
    ibv: ibv_ah,
    pub(crate) gid: [u8; 16],
    pub(crate) ahn: u16,
}

impl Ah {
    /// # Safety
    /// `ah` came from [`ibv_create_ah`] and is not destroyed.
    pub(crate) unsafe fn of<'a>(ah: *mut ibv_ah) -> &'a Ah {
        // SAFETY: the ibv_ah is the first field of an Ah (repr(C)).
        unsafe { &*ah.cast::<Ah>() }
    }
}

/// # Safety
/// `pd` is ours, `attr` readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: the caller's contract.
    let (p, a) = unsafe { (Pd::of(pd), &*attr) };
    if a.is_global == 0 {
        // EFA addresses by GID only.
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: a GID is 16 bytes whichever way it is read.
    let gid = unsafe { a.grh.dgid.raw };
    // SAFETY: the PD's context is open.
    let ctx = unsafe { Ctx::of(p.ibv.context) };
    let mut t = ctx.ahs.write().unwrap_or_else(|e| e.into_inner());
    let ahn = match t.by_gid.get_mut(&gid) {
        Some((n, refs)) => {
            *refs += 1;
            *n
        }
        None => {
            let n = match t.used.iter().position(|u| !u) {
                Some(i) => i,
                None => {
                    t.used.push(false);
                    t.used.len() - 1
                }
            };
            if n >= MAX_AH as usize {
                set_errno(libc::ENOMEM);
                return null_mut();
            }
            t.used[n] = true;
            t.by_gid.insert(gid, (n as u16, 1));
            ctx.ahs_gen.fetch_add(1, Ordering::Release);
            n as u16
        }
    };
    let ah = Box::new(Ah {
        ibv: ibv_ah { context: p.ibv.context, pd, handle: u32::from(ahn) },
        gid,
        ahn,
    });
    Box::into_raw(ah).cast()
}

/// # Safety
/// `ah` came from [`ibv_create_ah`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: boxed by ibv_create_ah; the caller gives it up.
    let ah = unsafe { Box::from_raw(ah.cast::<Ah>()) };
    // SAFETY: the AH's context is open.
    let ctx = unsafe { Ctx::of(ah.ibv.context) };
    let mut t = ctx.ahs.write().unwrap_or_else(|e| e.into_inner());
    if let Some((n, refs)) = t.by_gid.get_mut(&ah.gid) {
        *refs -= 1;
        if *refs == 0 {
            let n = *n as usize;
            t.by_gid.remove(&ah.gid);
            t.used[n] = false;
            ctx.ahs_gen.fetch_add(1, Ordering::Release);
        }
    }
    0
}

/// # Safety
/// `ah` is ours, `attr` holds `inlen` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efadv_query_ah(
    ah: *mut ibv_ah,
    attr: *mut efadv_ah_attr,
    inlen: u32,
) -> c_int {
    if (inlen as usize) < offset_of!(efadv_ah_attr, ahn) + 2 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct holds `inlen` bytes.
    unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, inlen as usize) };
    // SAFETY: the caller's contract; `ahn` is inside `inlen`.
    unsafe { (*attr).ahn = Ah::of(ah).ahn };
    0
}
