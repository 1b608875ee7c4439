//! The control path's verbs: finding EFA devices, opening one, and what
//! it reports. Set-up work only.

use std::ffi::CStr;
use std::ptr;

use rdma_sys::{
    ___ibv_query_port, ibv_close_device, ibv_context, ibv_device, ibv_device_attr,
    ibv_free_device_list, ibv_get_device_list, ibv_get_device_name, ibv_gid, ibv_open_device,
    ibv_port_attr, ibv_port_state, ibv_query_device, ibv_query_gid,
};

use super::EfaError;
use super::efadv::{
    EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID, EFADV_DEVICE_ATTR_CAPS_RDMA_READ,
    EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE, EFADV_DEVICE_ATTR_CAPS_RNR_RETRY, efadv_device_attr,
    efadv_query_device, inlen,
};

/// The port every EFA device has (and the only one).
pub(super) const PORT: u8 = 1;

/// The calling thread's `errno`.
pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// What an EFA device reports: `efapoll info`'s lines, and the limits the
/// device's queues take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfaInfo {
    /// The verbs device name (`rdmap0s6`, ...).
    pub name: String,
    pub vendor_id: u32,
    /// 0xefa0, 0xefa1, ...: the EFA generation; the engine's HANDSHAKE
    /// device version.
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub fw_ver: String,
    /// Port 1's GID index 0: the raw address's GID.
    pub gid: [u8; 16],
    /// Port 1 is active.
    pub port_active: bool,
    /// Largest message: the MTU of a send.
    pub max_msg_sz: u32,
    pub max_qp: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_mr: i32,
    pub max_mr_size: u64,
    pub max_ah: i32,
    /// The efadv attributes: queue and SGE limits, inline size, caps.
    pub max_sq_wr: u32,
    pub max_rq_wr: u32,
    pub max_sq_sge: u16,
    pub max_rq_sge: u16,
    pub inline_buf_size: u16,
    pub max_rdma_size: u32,
    /// `EFADV_DEVICE_ATTR_CAPS_*`.
    pub device_caps: u32,
}

impl EfaInfo {
    pub fn rdma_read(&self) -> bool {
        self.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_READ != 0
    }

    pub fn rdma_write(&self) -> bool {
        self.device_caps & EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE != 0
    }

    pub fn rnr_retry(&self) -> bool {
        self.device_caps & EFADV_DEVICE_ATTR_CAPS_RNR_RETRY != 0
    }

    /// Completions can carry the sender's GID.
    pub fn cq_with_sgid(&self) -> bool {
        self.device_caps & EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID != 0
    }
}

/// An open verbs device, closed when dropped.
#[derive(Debug)]
pub(super) struct Context(pub(super) *mut ibv_context);

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device and closed once, here, after
        // everything made on it (the domain's drop order).
        unsafe { ibv_close_device(self.0) };
    }
}

/// Every EFA device: `(context, info)` for the one named `want` (or the
/// first), and every one's info. Fails, saying why, when there is none.
pub(super) fn scan(want: Option<&str>) -> Result<(Option<Context>, Vec<EfaInfo>), EfaError> {
    let mut n = 0;
    // SAFETY: writes the count to `n`; the list is freed below.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = errno();
        return Err(match e {
            libc::ENOSYS => EfaError::NoDevice(
                "no RDMA support in the kernel (ibv_get_device_list: ENOSYS; is ib_uverbs loaded?)"
                    .into(),
            ),
            _ => EfaError::Verbs { what: "ibv_get_device_list", errno: e },
        });
    }
    let mut chosen = None;
    let mut infos = Vec::new();
    let mut others = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        let name = device_name(dev);
        // SAFETY: a device of the list, which is alive until freed below.
        let ctx = unsafe { ibv_open_device(dev) };
        if ctx.is_null() {
            others.push(format!("{name} (cannot open: {})", std::io::Error::last_os_error()));
            continue;
        }
        let ctx = Context(ctx);
        match query(&ctx, &name) {
            Some(info) => {
                if chosen.is_none() && want.is_none_or(|w| w == name) {
                    chosen = Some(ctx);
                }
                infos.push(info);
            }
            None => others.push(name),
        }
    }
    // SAFETY: the list from ibv_get_device_list, freed once; the contexts
    // opened from it stay valid.
    unsafe { ibv_free_device_list(list) };
    if infos.is_empty() {
        return Err(EfaError::NoDevice(why_none(&others)));
    }
    if let (Some(w), None) = (want, &chosen) {
        let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
        return Err(EfaError::NoDevice(format!(
            "no EFA device named {w}; EFA devices here: {}",
            names.join(", ")
        )));
    }
    Ok((chosen, infos))
}

fn why_none(others: &[String]) -> String {
    if !others.is_empty() {
        return format!("no EFA device; RDMA devices here: {}", others.join(", "));
    }
    if !std::path::Path::new("/sys/class/infiniband_verbs").exists() {
        return "no EFA device: no RDMA device and no verbs support in the kernel \
                (/sys/class/infiniband_verbs is missing: is ib_uverbs loaded, the efa driver \
                installed?)"
            .into();
    }
    "no EFA device: no RDMA device found (is rdma-core's ibverbs-providers installed?)".into()
}

fn device_name(dev: *mut ibv_device) -> String {
    // SAFETY: a live device of the list; the name is a C string it owns.
    let name = unsafe { ibv_get_device_name(dev) };
    if name.is_null() {
        return "?".into();
    }
    // SAFETY: non-null, NUL-terminated, alive while the list is.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// The device's info if it is an EFA device (`efadv_query_device`
/// succeeds, as libfabric tells EFA devices from others).
fn query(ctx: &Context, name: &str) -> Option<EfaInfo> {
    let mut efa = efadv_device_attr::default();
    // SAFETY: a live context; `efa` is the struct whose size we pass.
    if unsafe { efadv_query_device(ctx.0, &mut efa, inlen::<efadv_device_attr>()) } != 0 {
        return None;
    }
    // SAFETY: plain C structs, all-zero valid; filled by the calls below.
    let mut dev: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut port: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: a live context; each call fills the struct it is given.
    let ok = unsafe {
        ibv_query_device(ctx.0, &mut dev) == 0
            && ___ibv_query_port(ctx.0, PORT, &mut port) == 0
            && ibv_query_gid(ctx.0, PORT, 0, &mut gid) == 0
    };
    if !ok {
        return None;
    }
    // SAFETY: `raw` is the union's byte view, valid for any bits.
    let gid = unsafe { gid.raw };
    // SAFETY: a NUL-terminated C string the query wrote (zeroed before).
    let fw = unsafe { CStr::from_ptr(dev.fw_ver.as_ptr()) }.to_string_lossy().into_owned();
    Some(EfaInfo {
        name: name.to_owned(),
        vendor_id: dev.vendor_id,
        vendor_part_id: dev.vendor_part_id,
        hw_ver: dev.hw_ver,
        fw_ver: fw,
        gid,
        port_active: port.state == ibv_port_state::IBV_PORT_ACTIVE,
        max_msg_sz: port.max_msg_sz,
        max_qp: dev.max_qp,
        max_cq: dev.max_cq,
        max_cqe: dev.max_cqe,
        max_mr: dev.max_mr,
        max_mr_size: dev.max_mr_size,
        max_ah: dev.max_ah,
        max_sq_wr: efa.max_sq_wr,
        max_rq_wr: efa.max_rq_wr,
        max_sq_sge: efa.max_sq_sge,
        max_rq_sge: efa.max_rq_sge,
        inline_buf_size: efa.inline_buf_size,
        max_rdma_size: efa.max_rdma_size,
        device_caps: efa.device_caps,
    })
}

/// A null pointer of a verbs type, for fields left unset.
pub(super) fn null<T>() -> *mut T {
    ptr::null_mut()
}
