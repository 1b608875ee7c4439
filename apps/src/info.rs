//! `efapoll info`: the devices here and what they can do, like `fi_info`.
//! Each built device is probed by creating one.
//!
//! An entry is a list of fields, each with its text and its JSON value, so
//! that the text and `--json` say the same things: in JSON, numbers are
//! numbers, yes/no are booleans, and a unit the text writes after a value
//! goes into the key (`peer_timeout: 5 s` is `"peer_timeout_s": 5`).

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::{self, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use efapoll::device::shm::{ShmConfig, ShmDevice};
use efapoll::device::sim::{SimConfig, SimFabric};
use efapoll::device::udp::{UdpConfig, UdpDevice, Window};
use efapoll::device::{Caps, Device};
use efapoll::wire::RawAddr;
use serde_json::{Map, Value, json};

use crate::Provider;

/// What to show.
#[derive(Debug, Clone)]
pub struct Options {
    /// The devices to list, in this order.
    pub devices: Vec<Provider>,
    pub json: bool,
    /// Each device's own limits too, besides its caps.
    pub verbose: bool,
}

/// One line of an entry: `text_key: text` in the text, `json_key: value`
/// in JSON.
#[derive(Debug)]
struct Field {
    text_key: &'static str,
    text: String,
    json_key: &'static str,
    value: Value,
}

impl Field {
    /// A field whose text is its JSON value's.
    fn plain(key: &'static str, value: impl Into<Value> + ToString) -> Field {
        Field { text_key: key, text: value.to_string(), json_key: key, value: value.into() }
    }

    fn yes_no(key: &'static str, b: bool) -> Field {
        let text = if b { "yes" } else { "no" }.to_owned();
        Field { text_key: key, text, json_key: key, value: json!(b) }
    }

    /// A field written differently in the text and in JSON.
    fn both(text_key: &'static str, text: String, json_key: &'static str, value: Value) -> Field {
        Field { text_key, text, json_key, value }
    }
}

/// Why a device has no caps to show.
#[derive(Debug)]
enum Missing {
    /// Built, but creating one failed here.
    Unavailable(String),
    /// Not in this build (a device behind a cargo feature).
    #[cfg_attr(feature = "efa", allow(dead_code))]
    NotBuilt,
}

/// One device's entry.
#[derive(Debug)]
struct Entry {
    name: &'static str,
    about: String,
    fields: Result<Vec<Field>, Missing>,
}

impl Entry {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(out, "device: {}", self.name);
        let _ = writeln!(out, "    about: {}", self.about);
        match &self.fields {
            Ok(fields) => {
                let _ = writeln!(out, "    status: available");
                for f in fields {
                    let _ = writeln!(out, "    {}: {}", f.text_key, f.text);
                }
            }
            Err(Missing::Unavailable(e)) => {
                let _ = writeln!(out, "    status: unavailable: {e}");
            }
            Err(Missing::NotBuilt) => {
                let _ = writeln!(out, "    status: not built (this efapoll has no `efa` feature)");
            }
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("device".into(), json!(self.name));
        m.insert("about".into(), json!(self.about));
        match &self.fields {
            Ok(fields) => {
                m.insert("status".into(), json!("available"));
                for f in fields {
                    m.insert(f.json_key.into(), f.value.clone());
                }
            }
            Err(Missing::Unavailable(e)) => {
                m.insert("status".into(), json!("unavailable"));
                m.insert("reason".into(), json!(e));
            }
            Err(Missing::NotBuilt) => {
                m.insert("status".into(), json!("not built"));
                m.insert("reason".into(), json!("this efapoll has no `efa` feature"));
            }
        }
        Value::Object(m)
    }
}

/// The fields every available device has: its address and [`Caps`], all
/// of them.
fn caps_fields(caps: Caps, addr: RawAddr) -> Vec<Field> {
    vec![
        Field::plain("address", addr.to_string()),
        Field::plain("mtu", caps.mtu),
        Field::plain("packet_buffers", caps.bufs),
        Field::plain("tx_depth", caps.tx_depth),
        Field::plain("rx_depth", caps.rx_depth),
        Field::plain("inline_size", caps.inline_size),
        Field::plain("max_rdma_size", caps.max_rdma_size),
        Field::yes_no("rdma_read", caps.rdma_read),
        Field::yes_no("rdma_write", caps.rdma_write),
        Field::both(
            "device_version",
            format!("{:#x}", caps.device_version),
            "device_version",
            json!(caps.device_version),
        ),
        Field::yes_no("external_memory", caps.external_memory),
    ]
}

/// `-v`: the address's parts, for readers that would rather not parse it.
fn address_parts(addr: RawAddr) -> [Field; 3] {
    let gid: Vec<String> =
        addr.gid.chunks_exact(2).map(|p| format!("{:02x}{:02x}", p[0], p[1])).collect();
    [
        Field::plain("address_gid", gid.join(":")),
        Field::plain("address_qpn", addr.qpn),
        Field::both(
            "address_connid",
            format!("{:#010x}", addr.connid),
            "address_connid",
            json!(addr.connid),
        ),
    ]
}

fn sim(verbose: bool) -> Entry {
    let fabric = SimFabric::new(SimConfig::default());
    let dev = fabric.device();
    let mut fields = caps_fields(dev.caps(), dev.addr());
    if verbose {
        let cfg = fabric.config();
        fields.extend(address_parts(dev.addr()));
        fields.push(Field::plain("seed", cfg.seed));
        // Virtual time: the sim's clock moves when a test says.
        fields.push(Field::plain("retransmit_ns", cfg.retransmit_ns));
    }
    Entry {
        name: "sim",
        about: "in-process model of EFA, one thread (tests; the engine's own cost)".into(),
        fields: Ok(fields),
    }
}

fn shm(verbose: bool) -> Entry {
    let cfg = ShmConfig::default();
    let about = format!(
        "processes and threads of one user on this host, over shared memory (sealed memory \
         files handed over a per-device socket); an endpoint takes packets from up to {} \
         senders at once, each through a ring of {} slots of its own",
        cfg.lanes, cfg.ring_slots
    );
    let fields = ShmDevice::new(cfg).map_err(|e| Missing::Unavailable(e.to_string())).map(|d| {
        let mut fields = caps_fields(d.caps(), d.addr());
        if verbose {
            let cfg = d.config();
            fields.extend(address_parts(d.addr()));
            fields.push(Field::plain("lanes", cfg.lanes));
            fields.push(Field::plain("ring_slots", cfg.ring_slots));
            let segment = u64::from(cfg.lanes) * u64::from(cfg.ring_slots) * cfg.mtu as u64;
            fields.push(Field::plain("segment_bytes", segment));
        }
        fields
    });
    Entry { name: "shm", about, fields }
}

fn udp(verbose: bool) -> Entry {
    // On loopback: what a device here gets; across hosts the apps bind
    // the address their control connection uses.
    let cfg = UdpConfig::default();
    let fields = UdpDevice::new(cfg).map_err(|e| Missing::Unavailable(e.to_string())).map(|d| {
        let mut fields = caps_fields(d.caps(), d.addr());
        let (snd, rcv) = d.socket_buffers();
        fields.push(Field::both(
            "socket_buffers",
            format!("send {snd}, receive {rcv} (asked {})", cfg.socket_buffer),
            "socket_buffers",
            json!({ "send": snd, "receive": rcv, "asked": cfg.socket_buffer }),
        ));
        // As the apps' --udp-window and their reports write it.
        let (text, value) = match cfg.window {
            Window::Adaptive => {
                ("adaptive (RTT-driven, at most 64 packets)".into(), json!("adaptive"))
            }
            Window::Fixed(n) => (format!("fixed, {n} packets"), json!(n)),
        };
        fields.push(Field::both("window", text, "window", value));
        let (min_us, max_us) = (cfg.min_rto.as_micros() as u64, cfg.max_rto.as_micros() as u64);
        fields.push(Field::both(
            "retransmission_timeout",
            format!("{min_us} us to {max_us} us, from the measured round trip"),
            "retransmission_timeout_us",
            json!({ "min": min_us, "max": max_us }),
        ));
        let peer_s = cfg.peer_timeout.as_secs();
        fields.push(Field::both(
            "peer_timeout",
            format!("{peer_s} s"),
            "peer_timeout_s",
            json!(peer_s),
        ));
        if verbose {
            fields.extend(address_parts(d.addr()));
            fields.push(Field::plain("local_socket", d.local_addr().to_string()));
            fields.push(Field::plain("read_jobs", cfg.read_jobs));
            fields.push(Field::plain("ack_delay_us", cfg.ack_delay.as_micros() as u64));
            fields.push(Field::plain("max_sessions", cfg.max_sessions));
            fields.push(Field::plain("connected_peers", cfg.connected_peers));
        }
        fields
    });
    Entry {
        name: "udp",
        about: "software SRD and RDMA over UDP, across hosts: reliable unordered datagrams, \
                selective retransmission, RDMA read and write checked at the target"
            .into(),
        fields,
    }
}

const EFA_ABOUT: &str = "AWS Elastic Fabric Adapter: SRD queue pairs through libibverbs and \
                         EFA direct verbs";

#[cfg(not(feature = "efa"))]
fn efa(_verbose: bool) -> Entry {
    Entry { name: "efa", about: EFA_ABOUT.into(), fields: Err(Missing::NotBuilt) }
}

/// The EFA devices here and, opened, the first one's caps; or why there
/// is none (no RDMA support in the kernel, no device, only other devices).
#[cfg(feature = "efa")]
fn efa(verbose: bool) -> Entry {
    use efapoll::device::efa::{self, EfaConfig, EfaDevice, EfaInfo};
    fn line(i: &EfaInfo) -> String {
        let caps: Vec<&str> = [
            (i.rdma_read(), "rdma_read"),
            (i.rdma_write(), "rdma_write"),
            (i.rnr_retry(), "rnr_retry"),
            (i.cq_with_sgid(), "cq_with_sgid"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        format!(
            "{} (part {:#x}, fw {}, port {}, max_msg_sz {}, sq {} rq {} wr, inline {} B, max_rdma {} B, caps [{}])",
            i.name,
            i.vendor_part_id,
            i.fw_ver,
            if i.port_active { "active" } else { "down" },
            i.max_msg_sz,
            i.max_sq_wr,
            i.max_rq_wr,
            i.inline_buf_size,
            i.max_rdma_size,
            caps.join(" ")
        )
    }
    let fields = efa::devices().map_err(|e| Missing::Unavailable(e.to_string())).and_then(|list| {
        let dev = EfaDevice::new(EfaConfig::default()).map_err(|e| {
            Missing::Unavailable(format!("{} found; opening it: {e}", list[0].name))
        })?;
        let mut fields = caps_fields(dev.caps(), dev.addr());
        let text: Vec<String> = list.iter().map(line).collect();
        let json: Vec<Value> = list
            .iter()
            .map(|i| {
                json!({
                    "name": i.name, "vendor_part_id": i.vendor_part_id, "fw_ver": i.fw_ver,
                    "port_active": i.port_active, "max_msg_sz": i.max_msg_sz,
                    "max_sq_wr": i.max_sq_wr, "max_rq_wr": i.max_rq_wr,
                    "max_sq_sge": i.max_sq_sge, "max_rq_sge": i.max_rq_sge,
                    "inline_buf_size": i.inline_buf_size, "max_rdma_size": i.max_rdma_size,
                    "rdma_read": i.rdma_read(), "rdma_write": i.rdma_write(),
                    "rnr_retry": i.rnr_retry(), "cq_with_sgid": i.cq_with_sgid(),
                })
            })
            .collect();
        fields.push(Field::both("efa_devices", text.join("; "), "efa_devices", json!(json)));
        if verbose {
            fields.extend(address_parts(dev.addr()));
        }
        Ok(fields)
    });
    Entry { name: "efa", about: EFA_ABOUT.into(), fields }
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

/// The report, as text or as one JSON object.
fn report(opts: &Options) -> String {
    // Only the devices asked for are created.
    let entries: Vec<Entry> = opts
        .devices
        .iter()
        .map(|device| match device {
            Provider::Sim => sim(opts.verbose),
            Provider::Shm => shm(opts.verbose),
            Provider::Udp => udp(opts.verbose),
            Provider::Efa => efa(opts.verbose),
        })
        .collect();
    let memcpy = memcpy_mb_s();
    if opts.json {
        let v = json!({
            "devices": entries.iter().map(Entry::to_json).collect::<Vec<_>>(),
            "host": { "memcpy_1mib_mb_s": memcpy.round() as u64 },
        });
        let mut text = serde_json::to_string_pretty(&v).expect("a report serializes");
        text.push('\n');
        return text;
    }
    let mut out = String::new();
    for e in &entries {
        e.write_text(&mut out);
    }
    let _ = writeln!(out, "host:");
    let _ = writeln!(out, "    memcpy_1MiB_MB/s: {memcpy:.0} (one core, in cache)");
    out
}

pub fn run(opts: &Options) -> ExitCode {
    let out = report(opts);
    match crate::reader_gone_is_ok(io::stdout().lock().write_all(out.as_bytes())) {
        Err(e) => {
            eprintln!("efapoll info: {e}");
            ExitCode::FAILURE
        }
        Ok(()) => ExitCode::SUCCESS,
    }
}
