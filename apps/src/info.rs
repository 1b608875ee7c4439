//! `efapoll info`: the devices here and what they can do, like `fi_info`.
//! Each built device is probed by creating one.

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::{self, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use efapoll::device::Device;
use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::device::udp::{UdpConfig, UdpDevice, Window};

/// `writeln!` into a `String`, which cannot fail.
macro_rules! put {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// What probing a device found: its caps, its address, and lines of its
/// own (`key: value`).
type Probe = Result<(efapoll::device::Caps, String, Vec<String>), String>;

/// Appends one device's entry to `out`.
fn describe(out: &mut String, name: &str, about: &str, probe: Probe) {
    put!(out, "device: {name}");
    put!(out, "    about: {about}");
    match probe {
        Ok((caps, addr, own)) => {
            let yes_no = |b: bool| if b { "yes" } else { "no" };
            put!(out, "    status: available");
            put!(out, "    address: {addr}");
            put!(out, "    mtu: {}", caps.mtu);
            put!(out, "    packet_buffers: {}", caps.bufs);
            put!(out, "    tx_depth: {}", caps.tx_depth);
            put!(out, "    rx_depth: {}", caps.rx_depth);
            put!(out, "    inline_size: {}", caps.inline_size);
            put!(out, "    max_rdma_size: {}", caps.max_rdma_size);
            put!(out, "    rdma_read: {}", yes_no(caps.rdma_read));
            put!(out, "    rdma_write: {}", yes_no(caps.rdma_write));
            put!(out, "    device_version: {:#x}", caps.device_version);
            put!(out, "    external_memory: {}", yes_no(caps.external_memory));
            for line in own {
                put!(out, "    {line}");
            }
        }
        Err(status) => put!(out, "    status: {status}"),
    }
}

/// Single-core `memcpy` of 1 MiB between buffers in cache, in MB/s
/// (10^6 bytes/s, as the apps report): the reference the streaming
/// bandwidth of large messages is read against, which also stay in cache.
/// The best of five 20 ms batches, so that a scheduler hiccup does not
/// count.
fn memcpy_mb_s() -> f64 {
    const LEN: usize = 1 << 20;
    let src = vec![0x5au8; LEN];
    let mut dst = vec![0u8; LEN];
    dst.copy_from_slice(&src);
    let mut best = 0f64;
    for _ in 0..5 {
        let (t, mut copies) = (Instant::now(), 0u64);
        while t.elapsed() < Duration::from_millis(20) {
            black_box(&mut dst).copy_from_slice(black_box(&src));
            copies += 1;
        }
        best = best.max((copies * LEN as u64) as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    best
}

pub fn run() -> ExitCode {
    let mut out = String::new();
    let sim = SimFabric::new(SimConfig::default()).device();
    describe(
        &mut out,
        "sim",
        "in-process model of EFA, one thread (tests; the engine's own cost)",
        Ok((sim.caps(), sim.addr().to_string(), Vec::new())),
    );
    let shm_cfg = ShmConfig::default();
    let shm = ShmDevice::new(shm_cfg)
        .map(|d| (d.caps(), d.addr().to_string(), Vec::new()))
        .map_err(|e| format!("unavailable: {e}"));
    let about = format!(
        "processes and threads of one user on this host, over shared memory (sealed memory \
         files handed over a per-device socket); an endpoint takes packets from up to {} \
         senders at once, each through a ring of {} slots of its own",
        shm_cfg.lanes, shm_cfg.ring_slots
    );
    describe(&mut out, "shm", &about, shm);
    // On loopback: what a device here gets; across hosts the apps bind
    // the address their control connection uses.
    let udp_cfg = UdpConfig::default();
    let udp = UdpDevice::new(udp_cfg).map_err(|e| format!("unavailable: {e}")).map(|d| {
        let (snd, rcv) = d.socket_buffers();
        let window = match udp_cfg.window {
            Window::Adaptive => "adaptive (RTT-driven, at most 64 packets)".to_string(),
            Window::Fixed(n) => format!("fixed, {n} packets"),
        };
        let own = vec![
            format!("socket_buffers: send {snd}, receive {rcv} (asked {})", udp_cfg.socket_buffer),
            format!("window: {window}"),
            format!(
                "retransmission_timeout: {} us to {} us, from the measured round trip",
                udp_cfg.min_rto.as_micros(),
                udp_cfg.max_rto.as_micros()
            ),
            format!("peer_timeout: {} s", udp_cfg.peer_timeout.as_secs()),
        ];
        (d.caps(), d.addr().to_string(), own)
    });
    describe(
        &mut out,
        "udp",
        "software SRD and RDMA over UDP, across hosts: reliable unordered datagrams, \
         selective retransmission, RDMA read and write checked at the target",
        udp,
    );
    describe(&mut out, "efa", "AWS Elastic Fabric Adapter", Err("not built yet".into()));
    put!(out, "host:");
    put!(out, "    memcpy_1MiB_MB/s: {:.0} (one core, in cache)", memcpy_mb_s());
    match crate::reader_gone_is_ok(io::stdout().lock().write_all(out.as_bytes())) {
        Err(e) => {
            eprintln!("efapoll info: {e}");
            ExitCode::FAILURE
        }
        Ok(()) => ExitCode::SUCCESS,
    }
}
