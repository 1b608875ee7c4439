//! `efapoll`: the engine's command-line front end: the benchmark apps
//! (pingpong, streaming), the device list (info) and the packet dissector
//! (decode).
#![deny(unsafe_code)]

mod bench;
mod decode;
mod fipp;
mod info;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use efapoll::device::udp::Window;
use efapoll_lcores::{CoreList, IdleStrategy, LcoreMap, available_cores, check_cores_exist};

use bench::op::OpKind;
use bench::run::{DeviceKind, Mode, RunArgs};
use bench::{App, Params, sizes};

const EXIT_STATUS: &str = "\
Exit status:
  0  success
  1  a run failed: peer gone, verification error, timeout, parameter mismatch
     with the peer; decode: a packet or line that does not decode (bad hex,
     not UTF-8, a line over the length limit, not a valid packet)
  2  bad arguments
  130  interrupted by SIGINT, SIGTERM or SIGHUP (the rows completed are printed)";

#[derive(Debug, Parser)]
#[command(
    name = "efapoll",
    version,
    about = "Poll-mode EFA RDM v4 messaging engine: benchmark apps and tools",
    after_help = EXIT_STATUS
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Latency: one message each way at a time; half round trips.
    ///
    /// -o write: each side writes into the other's buffer with CQ data, whose
    /// completion tells the other (half round trips, as send). -o read and -o
    /// atomic (fetch-add): whole round trips, timed by the initiator alone.
    ///
    /// Without HOST or --server both sides run here, on two lcores over shm
    /// (or on one lcore with -p sim).
    #[command(
        after_help = EXIT_STATUS,
        mut_arg("iterations", |a| a.help(PINGPONG_ITERATIONS).long_help(None::<&str>)),
        mut_arg("op", |a| a.value_parser(op_values(App::Pingpong)))
    )]
    Pingpong(BenchArgs),
    /// Bandwidth: a window of messages in flight one way.
    ///
    /// -o write|read|atomic: a window of operations on the peer's buffer;
    /// the initiator's completions are what is timed.
    ///
    /// Without HOST or --server both sides run here, on two lcores over shm
    /// (or on one lcore with -p sim).
    #[command(
        after_help = EXIT_STATUS,
        mut_arg("iterations", |a| a.help(STREAMING_ITERATIONS).long_help(None::<&str>)),
        mut_arg("op", |a| a.value_parser(op_values(App::Streaming))),
        mut_arg("peer", |a| a.hide(true))
    )]
    Streaming(StreamingArgs),
    /// The devices available here and their capabilities.
    ///
    /// Every device, or the one named; as text, or as one JSON object
    /// (`{"devices": [...], "host": {...}}`, the text's fields with numbers
    /// as numbers and yes/no as booleans).
    #[command(after_help = EXIT_STATUS)]
    Info(InfoArgs),
    /// Dissect EFA RDM v4 packets (or, with --smbd, SMB Direct Data
    /// Transfer messages) given as hex, one per argument or per line of
    /// standard input; prints one JSON object per packet.
    ///
    /// Standard input is decoded line by line (empty lines skipped). A line
    /// that fails prints `{"error": ..., "line": N}` (N counts from 1) and
    /// decoding goes on with the next: a packet that does not parse, bad
    /// hex, a line that is not UTF-8, or a line longer than 65536 bytes
    /// (the limit: a 9 KiB packet with a separator after each byte fits).
    ///
    /// Exit status: 0 when every packet decoded, 1 when any failed (each
    /// has its error object), 2 for bad arguments.
    #[command(after_help = EXIT_STATUS)]
    Decode {
        /// The bytes are SMB Direct Data Transfer messages (MS-SMBD 2.2.3),
        /// each a segment as one send carries it: header, padding, data.
        #[arg(long)]
        smbd: bool,
        /// Packets as hex; read from standard input when none is given.
        packets: Vec<String>,
    },
}

// decode's help states the line limit as a number.
const _: () = assert!(decode::MAX_LINE == 65536);

const PINGPONG_ITERATIONS: &str = "Measured round trips per size. Default: fewer for larger \
     sizes, as fabtests: 10000, from 64 KiB 1000, from 1 MiB 100";
const STREAMING_ITERATIONS: &str = "Measured messages (or operations) per size. Default: about \
     1 GiB per size, 200 to 1000000 messages";

/// `-o`'s values, each described as `app` runs it.
fn op_values(app: App) -> clap::builder::ValueParser {
    let pingpong = app == App::Pingpong;
    let help = |op: OpKind| match op {
        OpKind::Send => "Untagged send/recv",
        OpKind::Tagged => "Tagged send/recv",
        OpKind::Write if pingpong => {
            "RDMA write into the peer's buffer with CQ data, whose completion tells the peer"
        }
        OpKind::Write => "RDMA writes into the peer's buffer",
        OpKind::Read if pingpong => "RDMA read from the peer's buffer, each timed whole",
        OpKind::Read => "RDMA reads from the peer's buffer",
        OpKind::Atomic if pingpong => "Fetch-add on a u64 in the peer's buffer, timed whole (-S 8)",
        OpKind::Atomic => "Fetch-adds on a u64 in the peer's buffer (-S 8)",
        OpKind::Smbd => "Messages framed as SMB Direct data transfer (MS-SMBD), reassembled",
    };
    let ops =
        [OpKind::Send, OpKind::Tagged, OpKind::Write, OpKind::Read, OpKind::Atomic, OpKind::Smbd];
    let names = ops.map(|op| clap::builder::PossibleValue::new(op.name()).help(help(op)));
    let parser = clap::builder::PossibleValuesParser::new(names)
        .map(|name| OpKind::from_str(&name, false).expect("a listed name"));
    clap::builder::ValueParser::new(parser)
}

#[derive(Debug, Args)]
struct InfoArgs {
    /// Only this device.
    #[arg(value_name = "DEVICE", value_enum)]
    device: Option<Provider>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Each device's own limits too (shm's lanes and rings, udp's socket,
    /// sessions and acknowledgement delay, the sim's seed), and the
    /// address's parts; the caps every device reports are always shown.
    #[arg(short = 'v', long)]
    verbose: bool,
}

/// `-p`: the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Provider {
    /// In-process model: both endpoints in one thread (the engine's cost).
    Sim,
    /// Shared memory between threads or processes of this host.
    Shm,
    /// Software SRD over UDP sockets: across hosts (loopback without HOST).
    Udp,
    /// AWS EFA: verbs SRD queue pairs (a build with the `efa` feature).
    Efa,
}

/// Exit status of a run a signal ended: 128 + SIGINT, as shells report an
/// interrupt (a second signal exits with it at once).
const INTERRUPTED_STATUS: u8 = 130;

/// `--timeout`'s largest value: a year.
const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// `-S`'s value, and whether it was `all` (whose sizes are fi_pingpong's
/// own with `--peer fi_pingpong`).
#[derive(Debug, Clone)]
struct Sizes(Vec<u64>, bool);

fn parse_sizes(text: &str) -> Result<Sizes, String> {
    let all = text.trim().eq_ignore_ascii_case("all");
    sizes::parse(text).map(|s| Sizes(s, all))
}

/// `--peer`: the program at the other end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PeerKind {
    /// `efapoll pingpong`: efapoll's control link (Relink), its sizes and
    /// options.
    Efapoll,
    /// libfabric's fi_pingpong -e rdm (1.17's util/pingpong.c, with -p efa
    /// here): its TCP control exchange (default port 47592), its sizes
    /// (no -S: 64 B to 1 MiB, six sizes; -S all: 0, 1, 2, 3, 4, 6, 8, 12,
    /// ... to 6 MiB; or one size, no lists), 10 iterations without -I, no
    /// warmup (-w is ignored), its data pattern with -c (give both sides
    /// -c or neither), -o send (fi_pingpong's -m msg) or -o tagged (-m
    /// tagged), its table; one endpoint on this thread (-l: its first core
    /// pins it). --timeout also bounds each transfer that waits on the
    /// peer (a long read, a long-CTS message), as libfabric's waits are
    /// unbounded.
    #[value(name = "fi_pingpong")]
    FiPingpong,
}

fn parse_lcores(text: &str) -> Result<LcoreMap, String> {
    let map: LcoreMap = text.parse().map_err(|e| {
        format!(
            "{e}; expected a core list like `0-1` or `0,2-3` (DPDK's -l), or lcores on CPUs \
             like `0-1@0,2-3@1` (DPDK's --lcores)"
        )
    })?;
    check_cores_exist(&map.cpus()).map_err(|e| e.to_string())?;
    Ok(map)
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Run as the client of the server on HOST.
    #[arg(value_name = "HOST", conflicts_with = "server")]
    host: Option<String>,
    /// Wait for one client, run, exit.
    #[arg(long)]
    server: bool,
    /// The device.
    #[arg(short = 'p', long = "provider", value_enum, default_value_t = Provider::Shm)]
    provider: Provider,
    /// The operation.
    #[arg(short = 'o', long = "op", value_enum, default_value_t = OpKind::Send)]
    op: OpKind,
    /// Message sizes: bytes with an optional k/m/g suffix, a list (64,4k,1m),
    /// or `all` (1 B to 8 MiB, powers of two). Default: 64 B to 1 MiB;
    /// -o atomic: 8, the only size it takes (one u64). 0 times messages with
    /// no payload (headers only, as fi_pingpong -S 0) and, with pingpong -o
    /// write, writes that carry only their CQ data; -o read and streaming -o
    /// write take sizes from 1 B, since a zero-byte one never reaches the peer.
    #[arg(short = 'S', long = "size", value_name = "SIZE|all|a,b,c", value_parser = parse_sizes)]
    sizes: Option<Sizes>,
    /// Every size, 1 B to 8 MiB in powers of two: -S all (perftest's -a).
    #[arg(short = 'a', long = "all-sizes", conflicts_with = "sizes")]
    all_sizes: bool,
    /// The endpoint type, as fabtests' -e: efapoll's are reliable
    /// datagram endpoints (FI_EP_RDM), as EFA's, so `rdm` only.
    #[arg(short = 'e', long = "ep-type", value_name = "rdm", value_parser = ["rdm", "msg", "dgram"])]
    ep_type: Option<String>,
    /// Measured iterations per size (each subcommand says its default).
    #[arg(short = 'I', long = "iterations", short_alias = 'n', alias = "iters",
          value_parser = clap::value_parser!(u64).range(1..))]
    iterations: Option<u64>,
    /// Duration mode, as perftest's -D: measure each size for SECS seconds
    /// (a decimal number, e.g. 0.5) instead of a count of iterations; the
    /// rows say how many fit.
    #[arg(short = 'D', long = "duration", value_name = "SECS", conflicts_with = "iterations",
          value_parser = parse_duration)]
    duration: Option<Duration>,
    /// perftest's -t (TX queue depth) and fabtests' -t (completion type)
    /// have no meaning here: streaming's -W is the window in flight, and
    /// -D SECS a timed run.
    #[arg(short = 't', value_name = "N", hide = true)]
    perftest_t: Option<String>,
    /// Bandwidth in Gbit/s (10^9 bits/s) instead of MB/s in the table, as
    /// perftest's --report_gbits (the JSON and CSV have both).
    #[arg(long = "report_gbits", alias = "report-gbits")]
    report_gbits: bool,
    /// Unmeasured iterations before each size.
    #[arg(short = 'w', long = "warmup", default_value_t = 10)]
    warmup: u64,
    /// Lcores, DPDK syntax (0-3,5): one flow per pair (the first of a pair
    /// measures, as the client; the second answers, as the server); with
    /// -p sim one flow per lcore. Default: the first two cores (sim: the
    /// first). `LCORES@CPU` items (DPDK's --lcores) run lcores on a CPU of
    /// another number, several on one: `0-1@0,2-3@1` runs two flows on two
    /// CPUs, for functional runs (with --idle yield), not for timing.
    #[arg(short = 'l', long = "lcores", value_name = "LIST", value_parser = parse_lcores)]
    lcores: Option<LcoreMap>,
    /// Verify every byte received (a pattern per message); one-sided ops:
    /// what each write left in the target, each read brought back, and the
    /// counter the atomics added to.
    #[arg(short = 'c', long = "check", short_alias = 'v', alias = "verify")]
    check: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the results as CSV to FILE: a header line (app, device, op
    /// and the JSON results' keys), then a line per size.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write the results to FILE in the format its extension names:
    /// .json (as --json) or .csv (as --csv).
    #[arg(long, value_name = "FILE.json|FILE.csv", value_parser = parse_output)]
    output: Option<Output>,
    /// Draw the results against message size into FILE.svg: pingpong's
    /// latency; streaming's bandwidth above its message rate.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// What a poll loop does when it finds no work.
    #[arg(
        long,
        default_value = "spin",
        value_parser = PossibleValuesParser::new(IdleStrategy::NAMES)
            .map(|s| s.parse::<IdleStrategy>().expect("a listed name"))
    )]
    idle: IdleStrategy,
    /// TCP port of the control link (server and client). A server given 0
    /// listens on a port the OS chooses and prints it. Default: 9228;
    /// with --peer fi_pingpong, 47592 (fi_pingpong's).
    #[arg(short = 'B', long = "port")]
    port: Option<u16>,
    /// The program on the other end (pingpong only).
    #[arg(long, value_enum, default_value_t = PeerKind::Efapoll)]
    peer: PeerKind,
    /// The address a server listens on. Default: all of this host's
    /// (0.0.0.0). A connection that is not a client of this app is
    /// rejected with a line on stderr and the server waits on, up to 16
    /// of them; each has 3 s for its handshake.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    bind: std::net::IpAddr,
    /// Fail when nothing moves for this long (and the connect deadline),
    /// or when the peer answers no ping on the control link for this long:
    /// how the target of one-sided operations, which sees none of them,
    /// tells a stopped initiator.
    /// At most a year (31536000).
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_SECS))]
    timeout: u64,
    /// -p udp: the device's window of packets in flight to a peer. A number
    /// (1 to 64) keeps it fixed, as a benchmark wants no control loop
    /// between it and the wire; `adaptive` lets the measured round trip
    /// drive it (SRD's aim: the fewest packets in flight that keep up),
    /// as the device does by default.
    #[arg(long = "udp-window", value_name = "PACKETS|adaptive", default_value = "64",
          value_parser = parse_udp_window)]
    udp_window: Window,
}

/// `-D`'s value: seconds, whole or decimal, from a millisecond to a year.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("expected seconds, a number like 2 or 0.5, not `{text}`"))?;
    if !(0.001..=MAX_TIMEOUT_SECS as f64).contains(&secs) {
        return Err(format!("expected from 0.001 to {MAX_TIMEOUT_SECS} seconds"));
    }
    Ok(Duration::from_millis((secs * 1e3).round() as u64))
}

/// `--output`'s file, by its format.
#[derive(Debug, Clone)]
enum Output {
    Json(PathBuf),
    Csv(PathBuf),
}

fn parse_output(text: &str) -> Result<Output, String> {
    let path = PathBuf::from(text);
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("json") => Ok(Output::Json(path)),
        Some("csv") => Ok(Output::Csv(path)),
        _ => Err("expected a file name ending in .json or .csv (the format)".into()),
    }
}

fn parse_udp_window(text: &str) -> Result<Window, String> {
    if text == "adaptive" {
        return Ok(Window::Adaptive);
    }
    match text.parse::<u32>() {
        Ok(n @ 1..=64) => Ok(Window::Fixed(n)),
        _ => Err("expected a number of packets from 1 to 64, or `adaptive`".into()),
    }
}

#[derive(Debug, Args)]
struct StreamingArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Messages (or one-sided operations) in flight.
    #[arg(short = 'W', long = "window", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    window: u32,
}

/// A bad combination of arguments: exit 2 with clap's usage line.
fn usage_error(app: App, message: String) -> ! {
    let mut cli = Cli::command();
    // Built, the subcommand knows its full name: its usage, not the
    // top-level one, goes with the message.
    cli.build();
    let sub = cli.find_subcommand_mut(app.name()).expect("every app is a subcommand");
    sub.error(ErrorKind::ArgumentConflict, message).exit()
}

/// Checks what clap cannot and builds the run.
fn resolve(app: App, b: BenchArgs, window: u32) -> RunArgs {
    let device = match b.provider {
        Provider::Sim => DeviceKind::Sim,
        Provider::Shm => DeviceKind::Shm,
        Provider::Udp => DeviceKind::Udp,
        Provider::Efa if cfg!(feature = "efa") => DeviceKind::Efa,
        Provider::Efa => usage_error(
            app,
            "-p efa: this efapoll was built without the efa device; build it with \
             `cargo build --release -p efapoll-apps --features efa` (needs rdma-core's \
             libibverbs-dev and libclang)"
                .into(),
        ),
    };
    let mode = match (b.host, b.server) {
        (Some(host), _) => Mode::Client(host),
        (None, true) => Mode::Server,
        (None, false) => Mode::SelfContained,
    };
    if device == DeviceKind::Sim && mode != Mode::SelfContained {
        usage_error(
            app,
            "-p sim runs both sides in this process: it takes no HOST and no --server".into(),
        );
    }
    let available = available_cores().unwrap_or_else(|e| usage_error(app, format!("-l: {e}")));
    let first = |n: usize| {
        if available.len() < n {
            usage_error(app, format!("-l: {n} cores are needed; the cores here are {available}"));
        }
        LcoreMap::identity(CoreList::from_cores(available.iter().take(n)).expect("existing cores"))
    };
    let lcores = match (b.lcores, device) {
        (Some(list), _) => list,
        (None, DeviceKind::Sim) => first(1),
        (None, DeviceKind::Shm | DeviceKind::Udp | DeviceKind::Efa) => first(2),
    };
    if device != DeviceKind::Sim && !lcores.lcores().len().is_multiple_of(2) {
        usage_error(
            app,
            format!(
                "-l {lcores}: shm, udp and efa run one flow per lcore pair, so it takes an even number of \
             lcores (like 0-1 or 0-3); the cores here are {available}"
            ),
        );
    }
    if let Some(t) = &b.perftest_t {
        usage_error(
            app,
            format!(
                "-t {t}: efapoll has no -t; perftest's -t (TX queue depth) is streaming's -W \
                 (operations in flight), and a timed run is -D SECS"
            ),
        );
    }
    if let Some(ep) = b.ep_type.as_deref().filter(|&ep| ep != "rdm") {
        usage_error(
            app,
            format!(
                "-e {ep}: efapoll's endpoints are reliable datagram endpoints (FI_EP_RDM), as \
                 EFA's: -e rdm, or leave -e out"
            ),
        );
    }
    let streaming = app == App::Streaming;
    let sizes = b.sizes.map(|s| s.0).or(b.all_sizes.then(sizes::all));
    let sizes = sizes.unwrap_or_else(|| match (app, b.op) {
        (_, OpKind::Atomic) => vec![ATOMIC_SIZE],
        (App::Pingpong, _) => sizes::default_pingpong(),
        (App::Streaming, _) => sizes::default_streaming(),
    });
    check_sizes(app, b.op, &sizes).unwrap_or_else(|e| usage_error(app, e));
    // Duration mode: counts are what fits in the time, decided as it runs.
    let iterations = match b.duration {
        Some(_) => vec![0; sizes.len()],
        None => sizes.iter().map(|&s| sizes::iterations(s, b.iterations, streaming)).collect(),
    };
    let n = lcores.lcores().len();
    let flows = if device == DeviceKind::Sim { n } else { n / 2 };
    let params = Params {
        app: app.name().into(),
        device: b.provider.to_possible_value().expect("not skipped").get_name().to_owned(),
        op: b.op.name().into(),
        sizes,
        iterations,
        warmup: b.warmup,
        window,
        verify: b.check,
        flows,
        duration_ms: b.duration.map(|d| d.as_millis() as u64),
        prime: mode != Mode::SelfContained || lcores.cpus().len() == lcores.lcores().len(),
    };
    let (mut json, mut csv) = (b.json, b.csv);
    match b.output {
        Some(Output::Json(path)) => json = Some(path),
        Some(Output::Csv(path)) => csv = Some(path),
        None => {}
    }
    RunArgs {
        app,
        mode,
        device,
        op: b.op,
        params,
        lcores,
        idle: b.idle,
        port: b.port.unwrap_or(DEFAULT_PORT),
        bind: b.bind,
        udp_ip: std::net::Ipv4Addr::LOCALHOST.into(),
        udp_window: b.udp_window,
        timeout: Duration::from_secs(b.timeout),
        json,
        csv,
        plot: b.plot,
        gbits: b.report_gbits,
        started: std::time::SystemTime::now(),
        probe: None,
        gate: bench::run::SetupGate::new(1),
    }
}

/// The control link's port without -B.
const DEFAULT_PORT: u16 = 9228;

/// The one size atomics take: a u64.
const ATOMIC_SIZE: u64 = 8;

/// Refuses sizes the operation cannot run.
fn check_sizes(app: App, op: OpKind, sizes: &[u64]) -> Result<(), String> {
    let list = || sizes.iter().map(|s| sizes::human(*s)).collect::<Vec<_>>().join(",");
    if op == OpKind::Atomic && sizes.iter().any(|&s| s != ATOMIC_SIZE) {
        return Err(format!(
            "-S {}: -o atomic is a fetch-add on one u64, so it takes -S {ATOMIC_SIZE} only \
             (the default with -o atomic)",
            list()
        ));
    }
    if op == OpKind::Smbd && sizes.contains(&0) {
        return Err(format!(
            "-S {}: an empty buffer is SMB Direct's empty message, which delivers nothing to \
             the peer's application (MS-SMBD 3.1.5.4), so -o smbd takes sizes from 1 byte",
            list()
        ));
    }
    // A zero-byte read, or a write without CQ data (streaming's), completes
    // here without reaching the peer: there would be nothing to time.
    let zero_stays_here = match op {
        OpKind::Read => true,
        OpKind::Write => app == App::Streaming,
        OpKind::Send | OpKind::Tagged | OpKind::Atomic | OpKind::Smbd => false,
    };
    if zero_stays_here && sizes.contains(&0) {
        return Err(format!(
            "-S {}: a zero-byte {} -o {} completes without reaching the peer, so it takes \
             sizes from 1 byte (0 is for send, tagged and pingpong -o write, whose CQ data \
             still goes)",
            list(),
            app.name(),
            op.name()
        ));
    }
    Ok(())
}

fn bench(args: RunArgs) -> ExitCode {
    match bench::run::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ bench::RunError::Interrupted) => {
            eprintln!("efapoll {}: {e}", args.app.name());
            ExitCode::from(INTERRUPTED_STATUS)
        }
        Err(e) => {
            eprintln!("efapoll {}: {e}", args.app.name());
            ExitCode::FAILURE
        }
    }
}

/// `r`, with a reader that stopped early (`| head`) taken as success:
/// not an error of ours.
pub(crate) fn reader_gone_is_ok(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode { smbd, packets } => {
            let format = if smbd { decode::Format::Smbd } else { decode::Format::Efa };
            decode::run(&packets, format)
        }
        Command::Info(i) => info::run(&info::Options {
            devices: i.device.map_or_else(|| Provider::value_variants().to_vec(), |d| vec![d]),
            json: i.json,
            verbose: i.verbose,
        }),
        Command::Pingpong(b) if b.peer == PeerKind::FiPingpong => fi_pingpong(b),
        Command::Pingpong(b) => bench(resolve(App::Pingpong, b, 1)),
        Command::Streaming(s) if s.common.peer != PeerKind::Efapoll => usage_error(
            App::Streaming,
            "--peer fi_pingpong: fi_pingpong is a pingpong; streaming's peer is efapoll".into(),
        ),
        Command::Streaming(s) => bench(resolve(App::Streaming, s.common, s.window)),
    }
}

/// `pingpong --peer fi_pingpong`: checks what fi_pingpong cannot run and
/// runs [`fipp`].
fn fi_pingpong(b: BenchArgs) -> ExitCode {
    let app = App::Pingpong;
    let sizes = match (&b.sizes, b.all_sizes) {
        (None, false) => fipp::proto::SizeSpec::Default,
        (Some(Sizes(_, true)), _) | (None, true) => fipp::proto::SizeSpec::All,
        (Some(Sizes(list, false)), _) if list.len() == 1 => fipp::proto::SizeSpec::One(list[0]),
        (Some(_), _) => usage_error(
            app,
            "--peer fi_pingpong: fi_pingpong's -S is one size or `all`, not a list".into(),
        ),
    };
    let tagged = match b.op {
        OpKind::Send => false,
        OpKind::Tagged => true,
        op => usage_error(
            app,
            format!(
                "--peer fi_pingpong -o {}: fi_pingpong sends messages, untagged (-o send, its \
                 -m msg) or tagged (-o tagged, its -m tagged)",
                op.name()
            ),
        ),
    };
    if b.duration.is_some() {
        usage_error(app, "--peer fi_pingpong: fi_pingpong has no -D; give -I".into());
    }
    if let Some(ep) = b.ep_type.as_deref().filter(|&ep| ep != "rdm") {
        usage_error(app, format!("-e {ep}: efapoll's endpoints are FI_EP_RDM: -e rdm"));
    }
    if matches!(b.provider, Provider::Sim | Provider::Shm) {
        usage_error(
            app,
            "--peer fi_pingpong: -p efa (libfabric's EFA provider at the other end), or -p udp \
             (another efapoll speaking fi_pingpong's control link)"
                .into(),
        );
    }
    if b.provider == Provider::Efa && !cfg!(feature = "efa") {
        usage_error(app, "-p efa: this efapoll was built without the efa device".into());
    }
    if let Some(core) = b.lcores.as_ref().and_then(|l| l.cpus().iter().next())
        && let Err(e) = efapoll_lcores::pin_current_thread(core)
    {
        usage_error(app, format!("-l: {e}"));
    }
    let o = fipp::Options {
        host: b.host,
        port: b.port.unwrap_or(fipp::proto::DEFAULT_PORT),
        bind: b.bind,
        sizes,
        iterations: b.iterations.unwrap_or(fipp::proto::DEFAULT_ITERATIONS),
        verify: b.check,
        tagged,
        timeout: Duration::from_secs(b.timeout),
    };
    let result = fipp::connect(&o).and_then(|(ctrl, ip)| match b.provider {
        #[cfg(feature = "efa")]
        Provider::Efa => {
            use efapoll::device::Domain;
            let dev = bench::run::efa_domain()?
                .device()
                .map_err(|e| bench::RunError::Setup(format!("efa device: {e}")))?;
            let ep = efapoll::endpoint::Endpoint::new(dev, fipp::config(&o))
                .map_err(|e| bench::RunError::Setup(format!("efa endpoint: {e}")))?;
            fipp::run(ep, ctrl, &o)
        }
        _ => {
            use efapoll::device::udp::{UdpConfig, UdpDevice};
            let cfg = UdpConfig {
                bind: std::net::SocketAddr::new(ip, 0),
                window: b.udp_window,
                ..UdpConfig::default()
            };
            let dev = UdpDevice::new(cfg)
                .map_err(|e| bench::RunError::Setup(format!("udp device: {e}")))?;
            let ep = efapoll::endpoint::Endpoint::new(dev, fipp::config(&o))
                .map_err(|e| bench::RunError::Setup(format!("udp endpoint: {e}")))?;
            fipp::run(ep, ctrl, &o)
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("efapoll pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
