//! `udp-floor`: the floor a transport over UDP sockets is measured against.
//!
//! Two threads, on cores 0 and 1, each with a non-blocking UDP socket
//! connected to the other's, busy-poll and move messages as bare
//! datagrams: no header, no acknowledgement (streaming's one credit per
//! window aside), no retransmission. A message larger than `--mtu` is cut
//! into datagrams of that size and has arrived when all its bytes have.
//! What a UDP-based transport measures beyond these figures is the cost of
//! its protocol. See perf/README.md.
#![deny(unsafe_code)]

use std::fmt;
use std::io::{self, Write as _};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use hdrhistogram::Histogram;
use serde::Serialize;
use thiserror::Error;

const EXIT_STATUS: &str = "\
Exit status:
  0  done
  1  a run failed: it stalled for --timeout (a datagram lost), a socket
     error, cores 0 and 1 not available, the --json file not written
  2  bad arguments";

/// The largest message `-S` takes: each side holds a buffer of it.
const MAX_SIZE: u64 = 1 << 30;

/// `--timeout`'s largest value: a year.
const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// Half round trips above this (1 hour, in ns) are recorded as this.
const HIST_MAX_NS: u64 = 3_600_000_000_000;

/// The cores the two sides run on: the measuring side, then its peer.
const CORES: [usize; 2] = [0, 1];

#[derive(Debug, Parser)]
#[command(
    name = "udp-floor",
    version,
    about = "The floor of a UDP transport: busy-polled pingpong and streaming of bare datagrams",
    after_help = EXIT_STATUS
)]
struct Cli {
    #[command(subcommand)]
    app: AppArgs,
}

#[derive(Debug, Subcommand)]
enum AppArgs {
    /// One message each way per round trip; each half round trip timed.
    #[command(after_help = EXIT_STATUS)]
    Pingpong(Common),
    /// Messages one way in windows, one credit back per window.
    #[command(after_help = EXIT_STATUS)]
    Streaming(StreamingArgs),
}

#[derive(Debug, Args)]
struct Common {
    /// Message sizes: bytes with an optional binary k, m or g suffix, or a
    /// comma-separated list (64,4k,1m). From 1 B to 1 GiB. Default: 64 B to
    /// 1 MiB, powers of two.
    #[arg(short = 'S', long = "size", value_name = "SIZE|a,b,c", value_parser = parse_sizes)]
    sizes: Option<Sizes>,
    /// Measured messages per size. Default, as efapoll's apps: pingpong
    /// 10000, from 64 KiB 1000, from 1 MiB 100; streaming about 1 GiB per
    /// size, 200 to 1000000 messages.
    #[arg(short = 'I', long = "iterations", value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Unmeasured messages before each size.
    #[arg(short = 'w', long = "warmup", default_value_t = 10)]
    warmup: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The local address both sockets bind, each on a port the OS picks.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    ip: IpAddr,
    /// Largest datagram payload, bytes; larger messages are cut into
    /// datagrams of this size. The default is the udp device's.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u32).range(64..=65_000))]
    mtu: u32,
    /// Send and receive buffer each socket asks for, bytes (k, m, g
    /// suffixes); the header line says what the kernel granted.
    #[arg(long, value_name = "BYTES", default_value = "4m", value_parser = parse_buffer)]
    socket_buffer: usize,
    /// Fail when nothing arrives for this long. At most a year (31536000).
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
    timeout: u64,
}

#[derive(Debug, Args)]
struct StreamingArgs {
    #[command(flatten)]
    common: Common,
    /// Messages per credit. The sender keeps at most two windows without
    /// their credit, so that one goes out while the other's credit is on
    /// its way. Nothing is retransmitted: a size whose two windows would
    /// not fit in the receive buffer the kernel granted gets a smaller
    /// window (each result says which).
    #[arg(short = 'W', long = "window", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    window: u64,
}

/// `-S`'s value.
#[derive(Debug, Clone)]
struct Sizes(Vec<u64>);

const SIZE_HELP: &str = "expected bytes with an optional binary k, m or g suffix (64, 4k, 1m), \
                         or a comma-separated list of them (64,4k,1m)";

fn parse_sizes(text: &str) -> Result<Sizes, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("no size given; {SIZE_HELP}"));
    }
    let size = |item: &str| match parse_bytes(item)? {
        0 => Err(format!(
            "`{}`: sizes start at 1 byte (a message has arrived when its bytes have)",
            item.trim()
        )),
        s => Ok(s),
    };
    text.split(',').map(size).collect::<Result<_, _>>().map(Sizes)
}

fn parse_buffer(text: &str) -> Result<usize, String> {
    match parse_bytes(text)? {
        0 => Err("a socket buffer of 0 bytes holds no datagram".into()),
        n => Ok(n as usize),
    }
}

/// A number of bytes with an optional binary suffix, at most [`MAX_SIZE`].
fn parse_bytes(item: &str) -> Result<u64, String> {
    let item = item.trim();
    let (digits, shift) = match item.as_bytes().last() {
        Some(b'k' | b'K') => (&item[..item.len() - 1], 10),
        Some(b'm' | b'M') => (&item[..item.len() - 1], 20),
        Some(b'g' | b'G') => (&item[..item.len() - 1], 30),
        _ => (item, 0),
    };
    let bad = || format!("`{item}` is not a size; {SIZE_HELP}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift)
        .filter(|&s| s <= MAX_SIZE)
        .ok_or_else(|| format!("`{item}` is larger than 1g, the largest size"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum App {
    Pingpong,
    Streaming,
}

impl App {
    fn name(self) -> &'static str {
        match self {
            App::Pingpong => "pingpong",
            App::Streaming => "streaming",
        }
    }
}

/// Messages per size without `-I`: efapoll's apps' rule, so that the two
/// tables line up. Pingpong as fabtests; streaming about 1 GiB per size.
fn default_iterations(app: App, size: u64) -> u64 {
    match app {
        App::Streaming => ((1 << 30) / size).clamp(200, 1_000_000),
        App::Pingpong if size >= 1 << 20 => 100,
        App::Pingpong if size >= 1 << 16 => 1000,
        App::Pingpong => 10_000,
    }
}

/// How messages of one size are cut: datagrams of `mtu` bytes, the last
/// one shorter. Datagrams of a run are numbered from 0 across messages.
#[derive(Debug, Clone, Copy)]
struct Cut {
    size: usize,
    mtu: usize,
    per_msg: u64,
}

impl Cut {
    fn new(size: u64, mtu: usize) -> Cut {
        Cut { size: size as usize, mtu, per_msg: size.div_ceil(mtu as u64) }
    }

    /// Where datagram `d` lies in its message: offset and length.
    fn span(&self, d: u64) -> (usize, usize) {
        let off = (d % self.per_msg) as usize * self.mtu;
        (off, self.mtu.min(self.size - off))
    }
}

/// Roughly what the kernel charges a receive buffer for a datagram of
/// `len` bytes: its data in a power-of-two allocation, and the socket
/// buffer's own struct (an 8 KiB datagram takes about 17 KiB).
fn rcvbuf_charge(len: usize) -> u64 {
    ((len + 512).next_power_of_two() + 1024) as u64
}

/// Streaming's window for one size: `-W`, or fewer messages when two
/// windows would not fit in the receive buffer (what overflows it is
/// dropped, and nothing is sent again); at least one.
fn window_for(size: u64, mtu: usize, asked: u64, rcvbuf: usize) -> u64 {
    let cut = Cut::new(size, mtu);
    let (_, last) = cut.span(cut.per_msg - 1);
    let per_msg = (cut.per_msg - 1) * rcvbuf_charge(mtu) + rcvbuf_charge(last);
    (rcvbuf as u64 / (2 * per_msg)).clamp(1, asked)
}

/// What one run does, as both sides see it.
#[derive(Debug, Clone)]
struct Plan {
    app: App,
    sizes: Vec<u64>,
    iterations: Vec<u64>,
    /// Streaming: messages per credit, per size (pingpong: 1).
    windows: Vec<u64>,
    warmup: u64,
    mtu: usize,
    timeout: Duration,
}

/// Which side failed.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// The measuring side: pingpong's client, streaming's sender.
    Measuring,
    /// The answering side: pingpong's responder, streaming's receiver.
    Peer,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Measuring => "the measuring side (core 0)",
            Side::Peer => "the answering side (core 1)",
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Warmup,
    Measured,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Warmup => "warmup",
            Phase::Measured => "measured",
        })
    }
}

/// What a stalled side was waiting for.
#[derive(Debug, Clone, Copy)]
enum Waiting {
    /// The rest of message `index` (from 0) of `of`.
    Message { index: u64, of: u64, got: u64, size: u64 },
    /// The credit of window `index` (from 0) of `of`.
    Credit { index: u64, of: u64 },
    /// Room in its socket's send buffer.
    SendRoom,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Waiting::Message { index, of, got, size } => {
                write!(f, "message {} of {of} ({got} of its {size} bytes arrived)", index + 1)
            }
            Waiting::Credit { index, of } => {
                write!(f, "the credit of window {} of {of}", index + 1)
            }
            Waiting::SendRoom => f.write_str("room in the socket's send buffer"),
        }
    }
}

#[derive(Debug, Error)]
enum FloorError {
    #[error("{side}: nothing moved for {secs} s at {bytes} B ({phase}), waiting for {waiting}")]
    Stalled { side: Side, bytes: u64, phase: Phase, waiting: Waiting, secs: u64 },
    #[error("{side}: {call}: {source}")]
    Io { side: Side, call: &'static str, source: io::Error },
    #[error("cannot pin a thread to core {0}")]
    Pin(usize),
    /// The other side failed first.
    #[error("stopped: the other side failed")]
    Stopped,
}

/// One side's socket and its busy-poll bookkeeping.
#[derive(Debug)]
struct Link<'a> {
    sock: UdpSocket,
    side: Side,
    /// Set by whichever side fails, so that the other stops polling.
    stop: &'a AtomicBool,
    timeout: Duration,
    /// The size being moved and the phase, for errors.
    bytes: u64,
    phase: Phase,
    idle_polls: u32,
    idle_since: Option<Instant>,
}

/// Empty polls between two looks at the clock and the stop flag: a poll
/// is a system call, so this is a millisecond or so.
const POLLS_PER_CHECK: u32 = 1024;

impl<'a> Link<'a> {
    fn new(sock: UdpSocket, side: Side, stop: &'a AtomicBool, timeout: Duration) -> Link<'a> {
        Link {
            sock,
            side,
            stop,
            timeout,
            bytes: 0,
            phase: Phase::Warmup,
            idle_polls: 0,
            idle_since: None,
        }
    }

    fn progress(&mut self) {
        self.idle_polls = 0;
        self.idle_since = None;
    }

    /// An empty poll: fails once nothing has moved for the timeout, or
    /// when the other side failed.
    fn idle(&mut self, waiting: Waiting) -> Result<(), FloorError> {
        self.idle_polls += 1;
        if self.idle_polls < POLLS_PER_CHECK {
            return Ok(());
        }
        self.idle_polls = 0;
        if self.stop.load(Ordering::Relaxed) {
            return Err(FloorError::Stopped);
        }
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now - since >= self.timeout {
            return Err(FloorError::Stalled {
                side: self.side,
                bytes: self.bytes,
                phase: self.phase,
                waiting,
                secs: self.timeout.as_secs(),
            });
        }
        Ok(())
    }

    fn io(&self, call: &'static str) -> impl FnOnce(io::Error) -> FloorError {
        let side = self.side;
        move |source| FloorError::Io { side, call, source }
    }

    /// Sends datagrams `first..end` of the run's messages from `buf` (one
    /// message), a burst at a time; returns how many went (none when the
    /// send buffer is full).
    fn send_some(&mut self, buf: &[u8], cut: Cut, first: u64, end: u64) -> Result<u64, FloorError> {
        let mut spans = [(0, 0); sys::BURST];
        let n = (end - first).min(sys::BURST as u64) as usize;
        for (i, span) in spans[..n].iter_mut().enumerate() {
            *span = cut.span(first + i as u64);
        }
        let sent = sys::send_burst(&self.sock, buf, &spans[..n]).map_err(self.io("send"))?;
        Ok(sent as u64)
    }

    /// Receives up to a burst of datagrams `first..end` into `buf` (one
    /// message), each where the sender cut it from; returns how many came
    /// and their bytes.
    fn recv_some(
        &mut self,
        buf: &mut [u8],
        cut: Cut,
        first: u64,
        end: u64,
    ) -> Result<(u64, u64), FloorError> {
        let mut spans = [(0, 0); sys::BURST];
        let mut lens = [0; sys::BURST];
        let n = (end - first).min(sys::BURST as u64) as usize;
        for (i, span) in spans[..n].iter_mut().enumerate() {
            *span = cut.span(first + i as u64);
        }
        let got =
            sys::recv_burst(&self.sock, buf, &spans[..n], &mut lens).map_err(self.io("receive"))?;
        Ok((got as u64, lens[..got].iter().sum::<usize>() as u64))
    }

    /// Sends one message of `buf` whole.
    fn send_message(&mut self, buf: &[u8], cut: Cut) -> Result<(), FloorError> {
        let mut d = 0;
        while d < cut.per_msg {
            match self.send_some(buf, cut, d, cut.per_msg)? {
                0 => self.idle(Waiting::SendRoom)?,
                k => {
                    d += k;
                    self.progress();
                }
            }
        }
        Ok(())
    }

    /// Waits for message `index` of `of` whole, into `buf`.
    fn recv_message(
        &mut self,
        buf: &mut [u8],
        cut: Cut,
        index: u64,
        of: u64,
    ) -> Result<(), FloorError> {
        let (mut d, mut got) = (0, 0);
        while got < cut.size as u64 {
            match self.recv_some(buf, cut, d, cut.per_msg)? {
                (0, _) => self.idle(Waiting::Message { index, of, got, size: cut.size as u64 })?,
                (k, b) => {
                    d += k;
                    got += b;
                    self.progress();
                }
            }
        }
        Ok(())
    }

    /// Credits that arrived since the last call.
    fn recv_credits(&mut self) -> Result<u64, FloorError> {
        let mut credit = [0u8; CREDIT_LEN];
        let mut n = 0;
        loop {
            match self.sock.recv(&mut credit) {
                Ok(_) => n += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("receive a credit")(e)),
            }
        }
    }

    fn send_credit(&mut self) -> Result<(), FloorError> {
        loop {
            match self.sock.send(&[0; CREDIT_LEN]) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.idle(Waiting::SendRoom)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("send a credit")(e)),
            }
        }
    }
}

/// A credit's datagram: its content is never read.
const CREDIT_LEN: usize = 8;

/// A result row, as the table and the JSON show it.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
enum Row {
    Pingpong(PingpongRow),
    Streaming(StreamingRow),
}

#[derive(Debug, Clone, Serialize)]
struct PingpongRow {
    bytes: u64,
    iterations: u64,
    t_min_us: f64,
    t_p50_us: f64,
    t_avg_us: f64,
    t_p99_us: f64,
    t_max_us: f64,
}

#[derive(Debug, Clone, Serialize)]
struct StreamingRow {
    bytes: u64,
    iterations: u64,
    window: u64,
    mb_s: f64,
    mmsg_s: f64,
    mpkt_s: f64,
}

/// Rounds to 4 significant digits, as efapoll's apps report.
fn sig4(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

fn table_header(app: App) -> String {
    match app {
        App::Pingpong => format!(
            "{:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "bytes", "iterations", "t_min", "t_p50", "t_avg", "t_p99", "t_max"
        ),
        App::Streaming => format!(
            "{:>9} {:>10} {:>6} {:>10} {:>8} {:>8}",
            "bytes", "iterations", "window", "MB/s", "Mmsg/s", "Mpkt/s"
        ),
    }
}

fn table_row(row: &Row) -> String {
    match row {
        Row::Pingpong(r) => format!(
            "{:>9} {:>10} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            r.bytes, r.iterations, r.t_min_us, r.t_p50_us, r.t_avg_us, r.t_p99_us, r.t_max_us
        ),
        Row::Streaming(r) => format!(
            "{:>9} {:>10} {:>6} {:>10.2} {:>8.4} {:>8.4}",
            r.bytes, r.iterations, r.window, r.mb_s, r.mmsg_s, r.mpkt_s
        ),
    }
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Report<'a> {
    app: &'static str,
    mtu: usize,
    /// Granted by the kernel: (send, receive), bytes.
    socket_buffers: [usize; 2],
    results: &'a [Row],
}

/// Pingpong's client: times each round trip of each size, halved.
fn pingpong_client(link: &mut Link<'_>, plan: &Plan, k: usize) -> Result<PingpongRow, FloorError> {
    let (size, iters) = (plan.sizes[k], plan.iterations[k]);
    let cut = Cut::new(size, plan.mtu);
    let tx = vec![0xa5; cut.size];
    let mut rx = vec![0; cut.size];
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds");
    let mut sum_ns = 0u128;
    link.bytes = size;
    let total = plan.warmup + iters;
    for i in 0..total {
        link.phase = if i < plan.warmup { Phase::Warmup } else { Phase::Measured };
        let start = Instant::now();
        link.send_message(&tx, cut)?;
        link.recv_message(&mut rx, cut, i, total)?;
        let half_ns = (start.elapsed().as_nanos() / 2) as u64;
        if i >= plan.warmup {
            hist.saturating_record(half_ns.max(1));
            sum_ns += half_ns as u128;
        }
    }
    let us = |ns: u64| sig4(ns as f64 / 1e3);
    Ok(PingpongRow {
        bytes: size,
        iterations: iters,
        t_min_us: us(hist.min()),
        t_p50_us: us(hist.value_at_quantile(0.5)),
        t_avg_us: sig4(sum_ns as f64 / 1e3 / iters as f64),
        t_p99_us: us(hist.value_at_quantile(0.99)),
        t_max_us: us(hist.max()),
    })
}

/// Pingpong's responder: each message back as soon as it is whole.
fn pingpong_responder(link: &mut Link<'_>, plan: &Plan, k: usize) -> Result<(), FloorError> {
    let cut = Cut::new(plan.sizes[k], plan.mtu);
    let tx = vec![0x5a; cut.size];
    let mut rx = vec![0; cut.size];
    link.bytes = plan.sizes[k];
    let total = plan.warmup + plan.iterations[k];
    for i in 0..total {
        link.phase = if i < plan.warmup { Phase::Warmup } else { Phase::Measured };
        link.recv_message(&mut rx, cut, i, total)?;
        link.send_message(&tx, cut)?;
    }
    Ok(())
}

/// Streaming's sender: `n` messages of `buf`, at most two windows without
/// their credit; returns the time from the first send to the last credit,
/// which covers delivery, not just sending.
fn stream_send(
    link: &mut Link<'_>,
    buf: &[u8],
    cut: Cut,
    n: u64,
    window: u64,
) -> Result<Duration, FloorError> {
    let windows = n.div_ceil(window);
    let (mut sent, mut credits) = (0, 0);
    let start = Instant::now();
    while credits < windows {
        let allowed = ((credits + 2) * window).min(n) * cut.per_msg;
        if sent < allowed {
            let k = link.send_some(buf, cut, sent, allowed)?;
            if k > 0 {
                sent += k;
                link.progress();
                continue;
            }
        }
        // Credits are read only when sending has to wait: the second
        // window in flight leaves time for the first one's to arrive.
        match link.recv_credits()? {
            0 if sent < allowed => link.idle(Waiting::SendRoom)?,
            0 => link.idle(Waiting::Credit { index: credits, of: windows })?,
            c => {
                credits += c;
                link.progress();
            }
        }
    }
    Ok(start.elapsed())
}

/// Streaming's receiver: `n` messages into `buf`, a credit back when each
/// window (the last one possibly short) is whole.
fn stream_recv(
    link: &mut Link<'_>,
    buf: &mut [u8],
    cut: Cut,
    n: u64,
    window: u64,
) -> Result<(), FloorError> {
    let windows = n.div_ceil(window);
    let (mut datagrams, mut bytes, mut credits) = (0, 0, 0);
    let size = cut.size as u64;
    while credits < windows {
        match link.recv_some(buf, cut, datagrams, n * cut.per_msg)? {
            (0, _) => {
                link.idle(Waiting::Message { index: bytes / size, of: n, got: bytes % size, size })?
            }
            (k, b) => {
                datagrams += k;
                bytes += b;
                link.progress();
                let whole = bytes / size;
                while credits < windows && whole >= ((credits + 1) * window).min(n) {
                    link.send_credit()?;
                    credits += 1;
                }
            }
        }
    }
    Ok(())
}

fn streaming_sender(
    link: &mut Link<'_>,
    plan: &Plan,
    k: usize,
) -> Result<StreamingRow, FloorError> {
    let (size, iters, window) = (plan.sizes[k], plan.iterations[k], plan.windows[k]);
    let cut = Cut::new(size, plan.mtu);
    let buf = vec![0xa5; cut.size];
    link.bytes = size;
    if plan.warmup > 0 {
        link.phase = Phase::Warmup;
        stream_send(link, &buf, cut, plan.warmup, window)?;
    }
    link.phase = Phase::Measured;
    let secs = stream_send(link, &buf, cut, iters, window)?.as_secs_f64().max(1e-9);
    let per_s = iters as f64 / secs;
    Ok(StreamingRow {
        bytes: size,
        iterations: iters,
        window,
        mb_s: sig4(per_s * size as f64 / 1e6),
        mmsg_s: sig4(per_s / 1e6),
        mpkt_s: sig4(per_s * cut.per_msg as f64 / 1e6),
    })
}

fn streaming_receiver(link: &mut Link<'_>, plan: &Plan, k: usize) -> Result<(), FloorError> {
    let cut = Cut::new(plan.sizes[k], plan.mtu);
    let mut buf = vec![0; cut.size];
    link.bytes = plan.sizes[k];
    if plan.warmup > 0 {
        link.phase = Phase::Warmup;
        stream_recv(link, &mut buf, cut, plan.warmup, plan.windows[k])?;
    }
    link.phase = Phase::Measured;
    stream_recv(link, &mut buf, cut, plan.iterations[k], plan.windows[k])
}

/// The measuring side, on core 0: prints each size's row as it comes.
fn run_measuring(link: &mut Link<'_>, plan: &Plan) -> Result<Vec<Row>, FloorError> {
    let mut rows = Vec::with_capacity(plan.sizes.len());
    for k in 0..plan.sizes.len() {
        let row = match plan.app {
            App::Pingpong => Row::Pingpong(pingpong_client(link, plan, k)?),
            App::Streaming => Row::Streaming(streaming_sender(link, plan, k)?),
        };
        println!("{}", table_row(&row));
        rows.push(row);
    }
    Ok(rows)
}

/// The peer, on core 1.
fn run_peer(link: &mut Link<'_>, plan: &Plan) -> Result<(), FloorError> {
    for k in 0..plan.sizes.len() {
        match plan.app {
            App::Pingpong => pingpong_responder(link, plan, k)?,
            App::Streaming => streaming_receiver(link, plan, k)?,
        }
    }
    Ok(())
}

fn pin(core: usize) -> Result<(), FloorError> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        Ok(())
    } else {
        Err(FloorError::Pin(core))
    }
}

/// A socket bound to `ip`, non-blocking, its buffers asked to hold
/// `buffer` bytes; returns it and the buffers granted.
fn open_socket(ip: IpAddr, buffer: usize) -> io::Result<(UdpSocket, (usize, usize))> {
    let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    sock.set_nonblocking(true)?;
    let granted = sys::set_buffers(&sock, buffer)?;
    Ok((sock, granted))
}

/// The kernel's count of UDP datagrams dropped for a full receive buffer
/// (`RcvbufErrors`, IPv4 and IPv6), where /proc tells it.
fn udp_rcvbuf_errors() -> Option<u64> {
    let v4 = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut lines = v4.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let mut total = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "RcvbufErrors")?
        .1
        .parse::<u64>()
        .ok()?;
    if let Ok(v6) = std::fs::read_to_string("/proc/net/snmp6") {
        let mut fields = v6.lines().map(str::split_whitespace);
        if let Some(n) = fields.find_map(|mut f| {
            (f.next() == Some("Udp6RcvbufErrors")).then(|| f.next()?.parse::<u64>().ok()).flatten()
        }) {
            total += n;
        }
    }
    Some(total)
}

fn fail(message: impl fmt::Display) -> ExitCode {
    eprintln!("udp-floor: {message}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (app, common, window) = match cli.app {
        AppArgs::Pingpong(c) => (App::Pingpong, c, 1),
        AppArgs::Streaming(s) => (App::Streaming, s.common, s.window),
    };
    let sizes = common.sizes.map(|s| s.0).unwrap_or_else(|| {
        std::iter::successors(Some(64u64), |s| Some(s * 2)).take_while(|&s| s <= 1 << 20).collect()
    });
    let iterations =
        sizes.iter().map(|&s| common.iterations.unwrap_or_else(|| default_iterations(app, s)));
    let mtu = common.mtu as usize;

    let have = core_affinity::get_core_ids().unwrap_or_default();
    if let Some(missing) = CORES.iter().find(|&&c| !have.iter().any(|id| id.id == c)) {
        let ids: Vec<String> = have.iter().map(|id| id.id.to_string()).collect();
        return fail(format_args!(
            "core {missing} is not available to this process (cores here: {}); \
             the two sides run on cores 0 and 1",
            if ids.is_empty() { "unknown".into() } else { ids.join(",") }
        ));
    }
    let open = |what| {
        open_socket(common.ip, common.socket_buffer)
            .map_err(|e| format!("{what} socket on {}: {e}", common.ip))
    };
    let (measuring, peer) = match (open("the measuring side's"), open("the answering side's")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let connect = |a: &UdpSocket, b: &UdpSocket| a.connect(b.local_addr()?);
    if let Err(e) = connect(&measuring.0, &peer.0).and_then(|()| connect(&peer.0, &measuring.0)) {
        return fail(format_args!("connecting the sockets on {}: {e}", common.ip));
    }
    // The smaller of the two sockets' grants: what a message meets on
    // its way, whichever way it goes.
    let granted = [measuring.1.0.min(peer.1.0), measuring.1.1.min(peer.1.1)];
    let plan = Plan {
        app,
        windows: sizes
            .iter()
            .map(|&s| match app {
                App::Pingpong => 1,
                App::Streaming => window_for(s, mtu, window, peer.1.1),
            })
            .collect(),
        iterations: iterations.collect(),
        sizes,
        warmup: common.warmup,
        mtu,
        timeout: Duration::from_secs(common.timeout),
    };

    let unit = match app {
        App::Pingpong => "times in µs, half round trips".to_owned(),
        App::Streaming => format!(
            "MB/s = 10^6 bytes/s; a credit per window (-W {window}), two windows in flight at most"
        ),
    };
    println!(
        "# udp-floor {}: {}, cores {}-{}, mtu {mtu}, socket buffers {}/{} B (send/receive; \
         asked {}); {unit}",
        app.name(),
        common.ip,
        CORES[0],
        CORES[1],
        granted[0],
        granted[1],
        common.socket_buffer
    );
    println!("{}", table_header(app));
    let _ = io::stdout().flush();

    let drops_before = udp_rcvbuf_errors();
    let stop = AtomicBool::new(false);
    // Whichever side fails raises `stop`, so that the other stops polling.
    let failed = |is_err: bool| {
        if is_err {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let (measured, peer_result) = std::thread::scope(|s| {
        let peer_thread = s.spawn(|| {
            let r = pin(CORES[1]).and_then(|()| {
                run_peer(&mut Link::new(peer.0, Side::Peer, &stop, plan.timeout), &plan)
            });
            failed(r.is_err());
            r
        });
        let r = pin(CORES[0]).and_then(|()| {
            run_measuring(&mut Link::new(measuring.0, Side::Measuring, &stop, plan.timeout), &plan)
        });
        failed(r.is_err());
        (r, peer_thread.join().expect("the peer thread does not panic"))
    });
    let rows = match (measured, peer_result) {
        (Ok(rows), Ok(())) => rows,
        (m, p) => {
            // The side that failed says why; the other only stopped.
            let errors: Vec<FloorError> = [m.err(), p.err()]
                .into_iter()
                .flatten()
                .filter(|e| !matches!(e, FloorError::Stopped))
                .collect();
            let mut message = errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
            if errors.iter().any(|e| matches!(e, FloorError::Stalled { .. })) {
                let dropped = udp_rcvbuf_errors()
                    .zip(drops_before)
                    .map(|(after, before)| {
                        format!(
                            " (this host's UDP RcvbufErrors rose by {})",
                            after.saturating_sub(before)
                        )
                    })
                    .unwrap_or_default();
                let window = if app == App::Streaming { " or a smaller -W" } else { "" };
                message.push_str(&format!(
                    "\nnothing is sent again: a datagram the kernel dropped for a full receive \
                     buffer{dropped} stalls the run; try a larger --socket-buffer{window}"
                ));
            }
            return fail(message);
        }
    };

    if let Some(path) = &common.json {
        let report = Report { app: app.name(), mtu, socket_buffers: granted, results: &rows };
        let mut text = serde_json::to_string_pretty(&report).expect("the report serializes");
        text.push('\n');
        if let Err(e) = std::fs::write(path, text) {
            return fail(format_args!("--json {}: {e}", path.display()));
        }
    }
    ExitCode::SUCCESS
}

/// The system calls std does not offer: socket buffer sizes, and
/// datagrams moved in bursts, one system call for up to [`BURST`](sys::BURST) of them
/// (`sendmmsg`, `recvmmsg`). The only `unsafe` of this program.
#[allow(unsafe_code)]
mod sys {
    use std::io;
    use std::mem::{size_of, zeroed};
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::ptr;

    /// Datagrams a burst moves at most.
    pub const BURST: usize = 32;

    fn setsockopt(sock: &UdpSocket, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
        // SAFETY: a plain system call reading one live c_int of the size
        // given.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    fn getsockopt(sock: &UdpSocket, opt: libc::c_int) -> io::Result<usize> {
        let mut v: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a plain system call writing at most `len` bytes, one
        // c_int, into `v`.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v.max(0) as usize) }
    }

    /// Asks for `bytes` of send and of receive buffer, beyond the system's
    /// limit where we may (`SO_*BUFFORCE`, root), as the udp device does;
    /// returns what the kernel granted, (send, receive). Linux grants
    /// twice what is asked, for its own bookkeeping.
    pub fn set_buffers(sock: &UdpSocket, bytes: usize) -> io::Result<(usize, usize)> {
        let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        for (force, plain) in
            [(libc::SO_SNDBUFFORCE, libc::SO_SNDBUF), (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF)]
        {
            if setsockopt(sock, force, want).is_err() {
                setsockopt(sock, plain, want)?;
            }
        }
        Ok((getsockopt(sock, libc::SO_SNDBUF)?, getsockopt(sock, libc::SO_RCVBUF)?))
    }

    /// All-zero system call headers, filled in per call.
    fn headers() -> [libc::mmsghdr; BURST] {
        // SAFETY: mmsghdr is a C struct of integers and pointers, for
        // which all-zero bytes are a valid value.
        unsafe { zeroed() }
    }

    /// A would-block or interrupted call moved nothing; other errors are
    /// the caller's.
    fn none_or(e: io::Error) -> io::Result<usize> {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        }
    }

    /// Sends `spans` (offset, length) of `buf` as datagrams on the
    /// connected socket, in one call; returns how many the kernel took
    /// (none when its send buffer is full). Panics on a span outside `buf`.
    pub fn send_burst(sock: &UdpSocket, buf: &[u8], spans: &[(usize, usize)]) -> io::Result<usize> {
        let n = spans.len().min(BURST);
        if n == 0 {
            return Ok(0);
        }
        if n == 1 {
            // One datagram: send(2) spares sendmmsg's header copies.
            let (off, len) = spans[0];
            return sock.send(&buf[off..off + len]).map(|_| 1).or_else(none_or);
        }
        let mut iov = [libc::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; BURST];
        for (v, &(off, len)) in iov.iter_mut().zip(&spans[..n]) {
            let part = &buf[off..off + len];
            *v = libc::iovec { iov_base: part.as_ptr() as *mut libc::c_void, iov_len: len };
        }
        let mut hdrs = headers();
        for (i, h) in hdrs[..n].iter_mut().enumerate() {
            h.msg_hdr.msg_iov = iov.as_mut_ptr().wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: each of the `n` headers points at one iovec above, which
        // lies within `buf` (checked by slicing); both outlive the call,
        // and the kernel only reads the data. The socket is connected, so
        // no address is given.
        let r =
            unsafe { libc::sendmmsg(sock.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
        if r < 0 { none_or(io::Error::last_os_error()) } else { Ok(r as usize) }
    }

    /// Receives up to `spans.len()` datagrams in one call, without
    /// waiting, each into its span (offset, length) of `buf` (spans may
    /// overlap: the same message's place, again); writes each one's length
    /// into `lens` and returns how many came. Panics on a span outside
    /// `buf`.
    pub fn recv_burst(
        sock: &UdpSocket,
        buf: &mut [u8],
        spans: &[(usize, usize)],
        lens: &mut [usize; BURST],
    ) -> io::Result<usize> {
        let n = spans.len().min(BURST);
        if n == 0 {
            return Ok(0);
        }
        if n == 1 {
            // One datagram: recv(2) spares recvmmsg's header copies (the
            // socket does not block).
            let (off, len) = spans[0];
            return match sock.recv(&mut buf[off..off + len]) {
                Ok(got) => {
                    lens[0] = got;
                    Ok(1)
                }
                Err(e) => none_or(e),
            };
        }
        // Every span's pointer comes from this one, so that overlapping
        // spans never alias two references.
        let base = buf.as_mut_ptr();
        let mut iov = [libc::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; BURST];
        for (v, &(off, len)) in iov.iter_mut().zip(&spans[..n]) {
            assert!(off.checked_add(len).is_some_and(|end| end <= buf.len()), "span in buf");
            *v = libc::iovec { iov_base: base.wrapping_add(off).cast(), iov_len: len };
        }
        let mut hdrs = headers();
        for (i, h) in hdrs[..n].iter_mut().enumerate() {
            h.msg_hdr.msg_iov = iov.as_mut_ptr().wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: each of the `n` headers points at one iovec above, whose
        // span was checked within `buf`, borrowed mutably for the call;
        // the kernel writes at most each span's length there, and the
        // lengths into the headers. MSG_DONTWAIT: it returns at once.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
            )
        };
        if r < 0 {
            return none_or(io::Error::last_os_error());
        }
        let r = r as usize;
        for (len, h) in lens.iter_mut().zip(&hdrs[..r]) {
            *len = h.msg_len as usize;
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_lists() {
        assert_eq!(parse_sizes("64,4096,64k,1m").unwrap().0, [64, 4096, 65536, 1 << 20]);
        assert_eq!(parse_sizes(" 4K , 1g ").unwrap().0, [4096, 1 << 30]);
    }

    #[test]
    fn bad_sizes_name_the_item() {
        for bad in ["", "x", "12x", "1.5k", "-1", "64,", "1kk"] {
            assert!(parse_sizes(bad).unwrap_err().contains("suffix"), "{bad}");
        }
        assert!(parse_sizes("64,0").unwrap_err().contains("`0`: sizes start at 1 byte"));
        assert!(parse_sizes("2g").unwrap_err().contains("largest"));
        assert!(parse_buffer("0").is_err());
    }

    #[test]
    fn a_message_is_cut_at_the_mtu() {
        let cut = Cut::new(20_000, 8192);
        assert_eq!(cut.per_msg, 3);
        assert_eq!(
            [cut.span(0), cut.span(1), cut.span(2)],
            [(0, 8192), (8192, 8192), (16384, 3616)]
        );
        // The next message's datagrams start over.
        assert_eq!(cut.span(3), (0, 8192));
        assert_eq!(Cut::new(64, 8192).span(5), (0, 64));
    }

    #[test]
    fn two_windows_fit_the_receive_buffer() {
        let rcvbuf = 8 << 20;
        assert_eq!(window_for(64, 8192, 64, rcvbuf), 64);
        for size in [4096, 65536, 1 << 20, 4 << 20] {
            let w = window_for(size, 8192, 64, rcvbuf);
            let cut = Cut::new(size, 8192);
            let charge = cut.per_msg * rcvbuf_charge(8192.min(size as usize));
            assert!(w == 1 || 2 * w * charge <= rcvbuf as u64, "{size}: {w}");
        }
        assert_eq!(window_for(1 << 20, 8192, 64, rcvbuf), 1);
        assert_eq!(window_for(64, 8192, 8, 0), 1);
    }
}
