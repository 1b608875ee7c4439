//! softefa: EFA in software. A libibverbs + libefa provider, loaded with
//! `LD_PRELOAD` in front of rdma-core, that carries SRD over the engine's
//! udp device ([`efapoll::device::udp`]), so that verbs programs written
//! for EFA (the engine's `efa` device, libfabric's EFA provider) run on any
//! Linux host and meet `-p udp` peers on the wire.
//!
//! # The model
//!
//! * One device, `rdmap0s0`, reported as EFA reports itself (vendor
//!   0x1d0f, part 0xefa1, node and transport type unspecified, one port,
//!   LID 0, link layer unspecified, GID index 0).
//! * A QP is a [`UdpDevice`](efapoll::device::udp::UdpDevice): its GID is
//!   the socket's IPv6 address (IPv4 mapped), its QPN the UDP port, its
//!   qkey the udp connid (set at RESET->INIT). A PD is a
//!   [`UdpDomain`](efapoll::device::udp::UdpDomain) with 32-bit keys; an MR
//!   is a registration of the caller's memory on it (lkey = rkey = key).
//! * A send of one SGE of registered memory goes from it (the device
//!   gathers it after its header); inline data and two SGEs are copied
//!   into the device's packet buffers. Receives are consumed in the order
//!   they were posted (the udp device takes its buffers so), and copy a
//!   packet into the posted SGEs; RDMA read and write are the device's.
//! * A CQ polls the QPs attached to it: the udp device makes progress
//!   (acknowledgements, retransmissions, serving peers' reads) when
//!   polled. As a NIC does that whatever its program does, a thread
//!   (module `progress`) drives the QPs whose CQ has not been polled for a
//!   millisecond, and keeps their completions for the next poll.
//!
//! # Quirks kept, as EFA has them (rdma-core providers/efa/verbs.c)
//!
//! * SQ full: the `ibv_wr_*` builder fails the session with `ENOMEM`, and
//!   `ibv_wr_complete` rolls back every WR since `ibv_wr_start`.
//! * Unsignaled WRs are refused (`EINVAL`) unless the QP is `sq_sig_all`.
//! * RDMA read completions carry `IBV_WC_SEND`; RDMA write ones
//!   `IBV_WC_RDMA_WRITE`; a write with immediate data completes at the
//!   target as `IBV_WC_RECV_RDMA_WITH_IMM` (rdma-core 45 and later); a
//!   send with immediate data (`ibv_wr_send_imm`, `IBV_WR_SEND_WITH_IMM`:
//!   libfabric's efa-direct endpoint sends `FI_REMOTE_CQ_DATA` so) as
//!   `IBV_WC_RECV` flagged `IBV_WC_WITH_IMM`. The udp wire carries the
//!   value in the Send's header.
//! * A receive from a GID with no address handle here has `slid` 0xffff,
//!   its `src_qp`, and its GID through `efadv_wc_read_sgid`; one with an
//!   AH has `slid` = the AH number, and `efadv_wc_read_sgid` says ENOENT.
//! * Immediate data is passed through unconverted.
//! * `ibv_dereg_mr` deregisters at once, whatever a peer is reading from
//!   the region: the read is let finish for 10 ms at most (the QPs are
//!   driven meanwhile), then revoked, and fails at the reader (a remote
//!   access error) unless all of it had arrived. EBUSY only while a WR
//!   this process posted still reads or writes the region.
//! * Errors carry EFA's vendor codes (`efa_io_comp_status`) and the
//!   `ibv_wc_status` rdma-core maps them to.
//!
//! # Environment
//!
//! `SOFTEFA_ADDR` (the IP address QPs bind, default 127.0.0.1),
//! `SOFTEFA_MTU` (max_msg_sz, default 8192), `SOFTEFA_RDMA_READ=0` and
//! `SOFTEFA_RDMA_WRITE=0` (report and refuse the operation),
//! `SOFTEFA_UDP_WINDOW` (the udp device's window: packets in flight to a
//! peer, 1 to 64, or `adaptive`, the default; a fixed one to compare with
//! `efapoll -p udp`, whose apps fix it),
//! `SOFTEFA_FAULTS` (faults the udp wire injects below SRD, which repairs
//! them: [`Faults`]' text form, e.g. `seed=7,drop_ppm=10000,reorder_window=8`),
//! `SOFTEFA_PROGRESS=0` (no progress thread: a QP progresses only while
//! its CQ is polled, as before a NIC; for tests that show what it does).
//!
//! For tests that change the device between QPs in one process:
//! `SOFTEFA_CONTROL=<file>`, a file of `NAME=value` lines naming any of
//! `SOFTEFA_RDMA_READ`, `SOFTEFA_RDMA_WRITE` and `SOFTEFA_FAULTS`, read
//! over the environment each time a device is queried or a QP made; and
//! `SOFTEFA_STATS=<file>`, to which each QP, when destroyed, appends a line
//! of what its wire's faults did and what the udp device dropped
//! (`dropped=3 duplicated=1 ... duplicates=1 stale=0`): a process sees its
//! faults without reaching into the library.
//!
//! # Not implemented
//!
//! Completion channels (`ibv_create_comp_channel`, CQ events) are absent:
//! the efa device and libfabric's EFA provider both poll.

pub mod cq;
pub mod ctx;
mod lock;
mod progress;
pub mod qp;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

pub use efapoll::device::efa::efadv;
use efapoll::device::fault::Faults;
use efapoll::device::udp::Window;

/// What the environment asks of the device.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub addr: IpAddr,
    pub mtu: usize,
    pub rdma_read: bool,
    pub rdma_write: bool,
    /// What the udp wire under each QP injects.
    pub faults: Faults,
    pub udp_window: Window,
    /// A thread drives the QPs whose CQ is not polled (module `progress`).
    pub progress: bool,
}

impl Config {
    fn from_env() -> Config {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// The configuration the variables `var` gives say.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Config {
        let flag = |k: &str| var(k).is_none_or(|v| v != "0");
        Config {
            addr: var("SOFTEFA_ADDR")
                .and_then(|a| a.parse().ok())
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            mtu: var("SOFTEFA_MTU").and_then(|m| m.parse().ok()).unwrap_or(8192),
            rdma_read: flag("SOFTEFA_RDMA_READ"),
            rdma_write: flag("SOFTEFA_RDMA_WRITE"),
            faults: var("SOFTEFA_FAULTS").map_or(Faults::NONE, |f| {
                f.parse().unwrap_or_else(|e| panic!("softefa: SOFTEFA_FAULTS: {e}"))
            }),
            udp_window: match var("SOFTEFA_UDP_WINDOW").and_then(|w| w.parse::<u32>().ok()) {
                Some(n @ 1..=64) => Window::Fixed(n),
                _ => Window::Adaptive,
            },
            progress: flag("SOFTEFA_PROGRESS"),
        }
    }
}

/// The configuration, read from the environment once.
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_env)
}

/// The configuration now: [`config`], with what the `SOFTEFA_CONTROL`
/// file says over it. Read on the control path only (device queries, QP
/// creation); the data path keeps [`config`].
pub fn current() -> Config {
    let Some(path) = std::env::var_os("SOFTEFA_CONTROL") else {
        return *config();
    };
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    Config::from_vars(|k| {
        let line = text.lines().find_map(|l| l.trim().strip_prefix(k)?.strip_prefix('='));
        line.map(|v| v.trim().to_string()).or_else(|| std::env::var(k).ok())
    })
}

/// Appends a destroyed QP's fault and drop counts to `SOFTEFA_STATS`.
pub(crate) fn record_stats(dev: &efapoll::device::udp::UdpDevice) {
    use std::io::Write;
    let Some(path) = std::env::var_os("SOFTEFA_STATS") else { return };
    let f = dev.fault_stats();
    let mut line = format!(
        "dropped={} duplicated={} reordered={} delayed={} corrupted={} truncated={} refused={}",
        f.dropped, f.duplicated, f.reordered, f.delayed, f.corrupted, f.truncated, f.refused
    );
    for (k, v) in efapoll::device::Device::counters(dev) {
        if efapoll::device::udp::UdpStats::DROPS.contains(&k) {
            line.push_str(&format!(" {k}={v}"));
        }
    }
    line.push('\n');
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    // One write per line, so QPs of several threads do not interleave.
    if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
        eprintln!("softefa: SOFTEFA_STATS {}: {e}", path.to_string_lossy());
    }
}

/// EFA's limits, as the device reports them.
pub mod limits {
    pub const VENDOR_ID: u32 = 0x1d0f;
    pub const VENDOR_PART_ID: u32 = 0xefa1;
    pub const MAX_SQ_WR: u32 = 4096;
    pub const MAX_RQ_WR: u32 = 8192;
    pub const MAX_SQ_SGE: u32 = 2;
    pub const MAX_RQ_SGE: u32 = 1;
    /// RDMA reads and writes take one local SGE
    /// (`EFA_IO_TX_DESC_NUM_RDMA_BUFS`).
    pub const MAX_RDMA_SGE: u32 = 1;
    pub const INLINE_BUF_SIZE: u32 = 32;
    pub const MAX_RDMA_SIZE: u32 = 1 << 30;
    pub const MAX_QP: i32 = 256;
    pub const MAX_CQ: i32 = 256;
    pub const MAX_CQE: i32 = 32768;
    pub const MAX_MR: i32 = 65536;
    pub const MAX_PD: i32 = 256;
    pub const MAX_AH: i32 = 1024;
    /// An address handle number that names no AH: a receive's `slid` when
    /// the sender's GID has none here.
    pub const NO_AH: u16 = 0xffff;
}

/// EFA's completion status codes (`efa_io_comp_status`), the vendor error
/// of a work completion: the efa device's table, and what verbs make of it.
pub mod status {
    pub use efapoll::device::efa::efa_io::*;

    use rdma_sys::ibv_wc_status::*;

    /// The `ibv_wc_status` rdma-core reports for a vendor code
    /// (providers/efa/verbs.c, `to_ibv_status`).
    pub fn to_ibv(code: u32) -> u32 {
        match code {
            OK => IBV_WC_SUCCESS,
            FLUSHED => IBV_WC_WR_FLUSH_ERR,
            LOCAL_ERROR_QP_INTERNAL_ERROR | LOCAL_ERROR_UNSUPPORTED_OP | LOCAL_ERROR_INVALID_AH => {
                IBV_WC_LOC_QP_OP_ERR
            }
            LOCAL_ERROR_INVALID_LKEY => IBV_WC_LOC_PROT_ERR,
            LOCAL_ERROR_BAD_LENGTH => IBV_WC_LOC_LEN_ERR,
            REMOTE_ERROR_ABORT => IBV_WC_REM_ABORT_ERR,
            REMOTE_ERROR_RNR => IBV_WC_RNR_RETRY_EXC_ERR,
            REMOTE_ERROR_BAD_DEST_QPN => IBV_WC_REM_INV_RD_REQ_ERR,
            REMOTE_ERROR_BAD_STATUS => IBV_WC_BAD_RESP_ERR,
            REMOTE_ERROR_BAD_LENGTH => IBV_WC_REM_INV_REQ_ERR,
            LOCAL_ERROR_UNRESP_REMOTE | LOCAL_ERROR_UNREACH_REMOTE => IBV_WC_RESP_TIMEOUT_ERR,
            REMOTE_ERROR_BAD_ADDRESS => IBV_WC_REM_ACCESS_ERR,
            REMOTE_ERROR_UNKNOWN_PEER => IBV_WC_REM_OP_ERR,
            _ => IBV_WC_GENERAL_ERR,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_sets_address_mtu_and_rdma_caps() {
        let none = Config::from_vars(|_| None);
        assert_eq!(none.addr, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!((none.mtu, none.rdma_read, none.rdma_write), (8192, true, true));
        assert_eq!(none.udp_window, Window::Adaptive);
        let vars = [
            ("SOFTEFA_ADDR", "::1"),
            ("SOFTEFA_MTU", "9000"),
            ("SOFTEFA_RDMA_READ", "0"),
            ("SOFTEFA_RDMA_WRITE", "1"),
            ("SOFTEFA_UDP_WINDOW", "64"),
        ];
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let c = Config::from_vars(get);
        assert_eq!(c.addr, "::1".parse::<IpAddr>().unwrap());
        assert_eq!((c.mtu, c.rdma_read, c.rdma_write), (9000, false, true));
        assert_eq!(none.faults, Faults::NONE);
        let faulty =
            Config::from_vars(|k| (k == "SOFTEFA_FAULTS").then(|| "seed=4,drop_ppm=7".into()));
        assert_eq!(faulty.faults, Faults { seed: 4, drop_ppm: 7, ..Faults::NONE });
        assert_eq!(c.udp_window, Window::Fixed(64));
    }

    #[test]
    fn vendor_errors_map_to_rdma_cores_statuses() {
        use rdma_sys::ibv_wc_status::*;
        let cases = [
            (status::OK, IBV_WC_SUCCESS),
            (status::LOCAL_ERROR_INVALID_LKEY, IBV_WC_LOC_PROT_ERR),
            (status::LOCAL_ERROR_BAD_LENGTH, IBV_WC_LOC_LEN_ERR),
            (status::LOCAL_ERROR_INVALID_AH, IBV_WC_LOC_QP_OP_ERR),
            (status::LOCAL_ERROR_UNSUPPORTED_OP, IBV_WC_LOC_QP_OP_ERR),
            (status::REMOTE_ERROR_BAD_ADDRESS, IBV_WC_REM_ACCESS_ERR),
            (status::REMOTE_ERROR_RNR, IBV_WC_RNR_RETRY_EXC_ERR),
            (status::LOCAL_ERROR_UNRESP_REMOTE, IBV_WC_RESP_TIMEOUT_ERR),
            (status::REMOTE_ERROR_UNKNOWN_PEER, IBV_WC_REM_OP_ERR),
            (99, IBV_WC_GENERAL_ERR),
        ];
        for (code, want) in cases {
            assert_eq!(status::to_ibv(code), want, "vendor error {code}");
        }
    }
}
