//! The out-of-band channel between a server and a client: Relink over TCP.
//!
//! The server answers to the app's endpoint name (`efapoll-pingpong`,
//! `efapoll-streaming`), so a client of the other app is refused at the
//! handshake. Each flow has a channel, its index: on it each side sends one
//! *card* with three parts: the endpoint's raw address (32 bytes), the
//! memory descriptor of its data buffer (addr, key, len: 3 x u64 LE; what
//! the one-sided operations reach) and the run's parameters (JSON). Both
//! sides compare the parameters before any traffic. After the run each
//! side sends `end` on channel 0, with `ok` or `error` and a message, and
//! the link shuts down; a peer that fails or vanishes mid-run stops this
//! side's lcores. While a client measures, it sends each size's row on
//! channel 0 (`row`, the row's JSON) and the server prints it: both ends
//! show the table, as fabtests do. In duration mode (`-D`) the client
//! tells each size's count as its time is up (`count`: flow, size index,
//! count, each a u64 LE) and the server answers once its side has it
//! (`counted`: flow, size index), see [`super::counts`].

use std::io::{self, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use efapoll::device::Mr;
use efapoll::relink::{self, Conn, Options, TcpError};
use efapoll::wire::RawAddr;
use efapoll_lcores::StopFlag;

use super::counts::Counts;
use super::report::{self, Row};
use super::run::RunArgs;
use super::{App, Params, RunError};

/// A registered region as a peer reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemDesc {
    pub addr: u64,
    pub key: u64,
    pub len: u64,
}

impl MemDesc {
    pub fn of(mr: &Mr) -> MemDesc {
        MemDesc { addr: mr.addr, key: mr.key, len: mr.len }
    }
}

/// What one side tells the other about one flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    pub addr: RawAddr,
    pub mem: MemDesc,
    pub params: Params,
}

impl Card {
    pub fn to_parts(&self) -> Vec<Vec<u8>> {
        let mut mem = Vec::with_capacity(24);
        for v in [self.mem.addr, self.mem.key, self.mem.len] {
            mem.extend_from_slice(&v.to_le_bytes());
        }
        let params = serde_json::to_vec(&self.params).expect("params serialize");
        vec![self.addr.to_bytes().to_vec(), mem, params]
    }

    pub fn from_parts(parts: &[Vec<u8>]) -> Result<Card, String> {
        let [addr, mem, params] = parts else {
            return Err(format!("a card has 3 parts, this one {}", parts.len()));
        };
        let addr = RawAddr::from_bytes(addr).map_err(|e| format!("raw address: {e}"))?;
        if mem.len() != 24 {
            return Err(format!("a memory descriptor is 24 bytes, this one {}", mem.len()));
        }
        let word = |i: usize| u64::from_le_bytes(mem[i * 8..i * 8 + 8].try_into().expect("8"));
        let mem = MemDesc { addr: word(0), key: word(1), len: word(2) };
        let params = serde_json::from_slice(params).map_err(|e| format!("parameters: {e}"))?;
        Ok(Card { addr, mem, params })
    }
}

fn options(timeout: Duration) -> Options {
    Options { timeout, ..Options::default() }
}

/// Connects to a server, retrying while nothing listens yet, up to
/// `timeout`.
pub fn connect(host: &str, port: u16, name: &str, timeout: Duration) -> Result<Conn, RunError> {
    let deadline = relink::deadline_after(timeout);
    let target = format!("{host}:{port}");
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| RunError::Setup(format!("cannot resolve {host}: {e}")))?
        .collect();
    loop {
        match connect_or_signal(&addrs, name, timeout)? {
            Ok(conn) => return Ok(conn),
            Err(TcpError::Io(e))
                if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < deadline =>
            {
                if super::run::interrupted() {
                    return Err(RunError::Interrupted);
                }
                thread::sleep(Duration::from_millis(50));
            }
            Err(TcpError::Handshake(e)) => {
                return Err(RunError::Setup(format!(
                    "the server at {target} refused the {name} handshake ({e}): does it run \
                     the same app?"
                )));
            }
            // A listener that does not serve the name closes the stream.
            Err(TcpError::Disconnected) => {
                return Err(RunError::Setup(format!(
                    "the server at {target} closed the link during the handshake: it does not \
                     serve {name} (is it another app's server?)"
                )));
            }
            Err(e) => return Err(RunError::Setup(format!("cannot connect to {target}: {e}"))),
        }
    }
}

/// `relink::connect` in a thread of its own, so that a signal ends the
/// wait at once even against a server that accepts and never answers (its
/// handshake waits up to `timeout`); the abandoned attempt ends with the
/// process.
fn connect_or_signal(
    addrs: &[std::net::SocketAddr],
    name: &str,
    timeout: Duration,
) -> Result<Result<Conn, TcpError>, RunError> {
    let (tx, rx) = mpsc::channel();
    let (addrs, name) = (addrs.to_vec(), name.to_owned());
    thread::spawn(move || {
        let _ = tx.send(relink::connect(&addrs[..], &name, &options(timeout)));
    });
    wait_or_signal(&rx, "the connecting thread died")
}

/// Connections that are not a client of ours a server turns away before
/// it gives up.
pub const MAX_REJECTED: u32 = 16;

/// The most a connection has to complete its handshake (one round trip).
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(3);

/// Waits for one client of `app` on `listener`. A connection that is not
/// one (garbage, another app's name, a handshake cut short or slower than
/// [`HANDSHAKE_LIMIT`]) is rejected with a line on stderr, and the wait
/// goes on, for up to [`MAX_REJECTED`] of them. `interrupt` ends the wait.
pub fn accept(
    listener: &TcpListener,
    app: App,
    timeout: Duration,
    interrupt: &StopFlag,
) -> Result<Conn, RunError> {
    let name = app.endpoint_name();
    let setup = |e: io::Error| RunError::Setup(format!("accepting a client: {e}"));
    listener.set_nonblocking(true).map_err(setup)?;
    let handshake = Options { timeout: timeout.min(HANDSHAKE_LIMIT), ..Options::default() };
    let mut rejected = 0;
    loop {
        if interrupt.is_stopped() {
            return Err(RunError::Interrupted);
        }
        let (stream, from) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(setup(e)),
        };
        match handshake_or_signal(stream, name, &handshake)? {
            Ok(mut conn) => {
                conn.set_timeout(timeout);
                return Ok(conn);
            }
            Err(e) => {
                rejected += 1;
                let why = match e {
                    TcpError::Timeout => {
                        format!("no handshake within {} s", handshake.timeout.as_secs_f64())
                    }
                    e => e.to_string(),
                };
                eprintln!(
                    "efapoll {}: rejected a connection from {from} ({rejected} of at most \
                     {MAX_REJECTED}): {why}; this server runs {name}",
                    app.name()
                );
                if rejected == MAX_REJECTED {
                    return Err(RunError::Setup(format!(
                        "gave up after {MAX_REJECTED} connections that were not {name} clients"
                    )));
                }
            }
        }
    }
}

/// `relink::accept_stream` in a thread of its own, so that a signal ends
/// a server's wait at once even while a silent connection holds its
/// handshake (up to [`HANDSHAKE_LIMIT`]); the abandoned handshake ends
/// with the process.
fn handshake_or_signal(
    stream: std::net::TcpStream,
    name: &'static str,
    options: &Options,
) -> Result<Result<Conn, TcpError>, RunError> {
    let (tx, rx) = mpsc::channel();
    let options = options.clone();
    thread::spawn(move || {
        let _ = tx.send(relink::accept_stream(stream, &[name], &options));
    });
    wait_or_signal(&rx, "the handshake's thread died")
}

/// The value `rx` brings, waited for in slices so that a signal ends the
/// wait at once.
fn wait_or_signal<T>(rx: &mpsc::Receiver<T>, died: &str) -> Result<T, RunError> {
    loop {
        match rx.recv_timeout(super::run::WAIT_SLICE) {
            Ok(r) => return Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if super::run::interrupted() {
                    return Err(RunError::Interrupted);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(RunError::Setup(died.into())),
        }
    }
}

/// `conn.recv(timeout)` in slices, ended early by a signal.
fn recv_or_interrupt(
    conn: &mut Conn,
    timeout: Duration,
) -> Result<relink::tcp::Received, TcpError> {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match conn.recv(left.min(super::run::WAIT_SLICE)) {
            Err(TcpError::Timeout) if !left.is_zero() && !super::run::interrupted() => {}
            r => return r,
        }
    }
}

/// Sends our cards (one per flow, on channel = flow) and returns the
/// peer's, after checking that its parameters are ours.
pub fn exchange(conn: &mut Conn, mine: &[Card], timeout: Duration) -> Result<Vec<Card>, RunError> {
    let lost = |e: TcpError| RunError::PeerGone(format!("control link: {e}"));
    for (flow, card) in mine.iter().enumerate() {
        let parts = card.to_parts();
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        conn.send(flow as u64, &parts).map_err(lost)?;
    }
    let mut theirs: Vec<Option<Card>> = vec![None; mine.len()];
    let mut got = 0;
    while got < mine.len() {
        let (channel, parts) = recv_or_interrupt(conn, timeout).map_err(lost)?;
        let card = Card::from_parts(&parts)
            .map_err(|e| RunError::Setup(format!("the peer's card is malformed: {e}")))?;
        let diff = mine[0].params.diff(&card.params);
        if !diff.is_empty() {
            return Err(RunError::Mismatch(diff.join("; ")));
        }
        let flow = channel.to_u64().and_then(|c| usize::try_from(c).ok());
        let slot = flow.and_then(|flow| theirs.get_mut(flow)).ok_or_else(|| {
            RunError::Setup(format!("the peer sent a card for flow {channel}, beyond the flows"))
        })?;
        if slot.replace(card).is_none() {
            got += 1;
        }
    }
    Ok(theirs.into_iter().map(|c| c.expect("every flow's card")).collect())
}

/// Closes the link after telling the peer why (a setup failure).
pub fn abort(mut conn: Conn, error: &RunError) {
    let message = error.to_string();
    let _ = conn.send(0, &[b"end", b"error", message.as_bytes()]);
    let _ = conn.shutdown();
}

/// How long an interrupted side waits for the peer's `end` after its own.
const INTERRUPT_GRACE: Duration = Duration::from_millis(300);

/// What our side tells the peer during a run, in order.
#[derive(Debug)]
pub enum ToPeer {
    /// A size's row as measured here (by the active side), for the peer's
    /// table.
    Row(Row),
    /// Duration mode: flow `flow`'s size `k` has `n` measured iterations.
    Count { flow: usize, k: usize, n: u64 },
    /// How our side ended; the last message.
    End(Result<(), String>),
}

/// How the peer's run went, and the rows it measured.
pub type PeerOutcome = (Result<(), RunError>, Vec<Row>);

/// The control link during a run, on a thread of its own (blocked in
/// reads, never polling).
#[derive(Debug)]
pub struct Control {
    outbox: mpsc::Sender<ToPeer>,
    thread: JoinHandle<PeerOutcome>,
}

impl Control {
    /// Watches `conn`: the peer's failure, its loss before its `end`, or
    /// its silence for `timeout` (it answers pings while it lives, even
    /// when it has no traffic to show, as a one-sided target has not)
    /// raises `stop`. Sends what arrives on `from_main` (`outbox` is its
    /// sender); prints the rows the peer measured, under our header. Once
    /// our side ended, the peer has `timeout` to end too; a peer that ended
    /// gets a graceful shutdown, a silent one only the closed stream.
    /// `counts`: each flow's, which the peer's `count` and `counted`
    /// messages fill in and confirm.
    pub fn spawn(
        mut conn: Conn,
        stop: StopFlag,
        a: &RunArgs,
        counts: Vec<Arc<Counts>>,
        (outbox, from_main): (mpsc::Sender<ToPeer>, mpsc::Receiver<ToPeer>),
    ) -> Control {
        let (timeout, app, gbits) = (a.timeout, a.app, a.gbits);
        // A count waits here for the next look at `from_main`, with an
        // active side idle until it is confirmed: look often then.
        let look_every = match a.params.duration_ms {
            Some(_) => Duration::from_millis(1),
            None => Duration::from_millis(50),
        };
        let thread = thread::spawn(move || {
            let ping_every = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            let mut sent: Option<Instant> = None;
            let mut peer: Option<Result<(), RunError>> = None;
            let mut peer_ended = false;
            let mut rows = Vec::new();
            let (mut heard, mut pinged, mut pongs) = (Instant::now(), Instant::now(), conn.pongs());
            loop {
                while sent.is_none() {
                    let (parts, is_end) = match from_main.try_recv() {
                        Ok(ToPeer::Row(row)) => (row_parts(&row), false),
                        Ok(ToPeer::Count { flow, k, n }) => {
                            (vec![b"count".to_vec(), words(&[flow as u64, k as u64, n])], false)
                        }
                        Ok(ToPeer::End(result)) => (end_parts(result), true),
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => {
                            (end_parts(Err("aborted".into())), true)
                        }
                    };
                    let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                    let _ = conn.send(0, &parts);
                    if is_end {
                        sent = Some(Instant::now());
                    }
                }
                if sent.is_some() && peer.is_some() {
                    break;
                }
                let grace = if super::run::interrupted() { INTERRUPT_GRACE } else { timeout };
                if sent.is_some_and(|t| t.elapsed() > grace) {
                    // A peer that stopped answering (our side timed out).
                    let e = RunError::Timeout("the peer did not end its run".into());
                    peer = Some(Err(e));
                    break;
                }
                if conn.pongs() != pongs {
                    pongs = conn.pongs();
                    heard = Instant::now();
                }
                if peer.is_none() && heard.elapsed() > timeout {
                    // Stopped (SIGSTOP, a hung host): no pong, no byte.
                    let secs = timeout.as_secs_f64();
                    peer = Some(Err(RunError::Timeout(format!(
                        "nothing moved for {secs} s on the control link: the peer stopped \
                         answering"
                    ))));
                    stop.stop();
                }
                if pinged.elapsed() >= ping_every {
                    let _ = conn.send_ping();
                    pinged = Instant::now();
                }
                match conn.recv(look_every) {
                    Ok((_, parts)) if parts.first().is_some_and(|p| p == b"count") => {
                        heard = Instant::now();
                        let stored = match parts.get(1).and_then(|w| read_words::<3>(w)) {
                            Some([flow, k, n]) => counts
                                .get(flow as usize)
                                .filter(|c| c.store(k as usize, n))
                                .map(|_| [flow, k]),
                            None => None,
                        };
                        match stored {
                            Some(fk) => {
                                let _ = conn.send(0, &[b"counted", &words(&fk)]);
                            }
                            None if peer.is_some() => {}
                            None => {
                                let e = RunError::Setup("the peer sent a malformed count".into());
                                peer = Some(Err(e));
                                stop.stop();
                            }
                        }
                    }
                    Ok((_, parts)) if parts.first().is_some_and(|p| p == b"counted") => {
                        heard = Instant::now();
                        let confirmed = parts.get(1).and_then(|w| read_words::<2>(w)).is_some_and(
                            |[flow, k]| {
                                counts.get(flow as usize).is_some_and(|c| c.confirm(k as usize))
                            },
                        );
                        if !confirmed && peer.is_none() {
                            let e = RunError::Setup("the peer confirmed an unknown count".into());
                            peer = Some(Err(e));
                            stop.stop();
                        }
                    }
                    Ok((_, parts)) if parts.first().is_some_and(|p| p == b"row") => {
                        heard = Instant::now();
                        match parts.get(1).map(|json| Row::from_json(app, json)) {
                            Some(Ok(row)) => {
                                let line = report::format_row(&row, gbits);
                                let _ = writeln!(io::stdout().lock(), "{line}");
                                rows.push(row);
                            }
                            _ if peer.is_some() => {}
                            _ => {
                                let e = RunError::Setup("the peer sent a malformed row".into());
                                peer = Some(Err(e));
                                stop.stop();
                            }
                        }
                    }
                    Ok((_, parts)) if parts.first().is_some_and(|p| p == b"end") => {
                        heard = Instant::now();
                        peer_ended = true;
                        let ok = parts.get(1).is_some_and(|p| p == b"ok");
                        let message = parts.get(2).map(|m| String::from_utf8_lossy(m).into_owned());
                        if ok {
                            peer.get_or_insert(Ok(()));
                        } else if peer.as_ref().is_none_or(Result::is_ok) {
                            peer = Some(Err(RunError::Peer(message.unwrap_or_default())));
                            stop.stop();
                        }
                    }
                    Ok(_) => heard = Instant::now(),
                    Err(TcpError::Timeout) => {}
                    Err(e) => {
                        if peer.is_none() {
                            peer = Some(Err(RunError::PeerGone(format!("control link: {e}"))));
                            stop.stop();
                        }
                        if sent.is_none() {
                            // Nobody to tell any more; wait for our side's end.
                            while let Ok(ToPeer::Row(_) | ToPeer::Count { .. }) = from_main.recv() {
                            }
                        }
                        return (peer.expect("set above"), rows);
                    }
                }
            }
            if peer_ended {
                // A silent peer would hold a graceful shutdown for its
                // whole timeout: only one that ended gets it.
                let _ = conn.shutdown();
            }
            (peer.expect("loop ends with the peer's outcome"), rows)
        });
        Control { outbox, thread }
    }

    /// Tells the peer how our side ended and returns how the peer's did,
    /// with the rows it sent.
    pub fn finish(self, ours: &Result<(), RunError>) -> PeerOutcome {
        let _ = self.outbox.send(ToPeer::End(ours.clone().map_err(|e| e.to_string())));
        self.thread
            .join()
            .unwrap_or_else(|_| (Err(RunError::Setup("control thread".into())), Vec::new()))
    }
}

/// The `row` message for a row: its JSON, as the report holds it.
fn row_parts(row: &Row) -> Vec<Vec<u8>> {
    let json = serde_json::to_vec(&row.to_value()).expect("rows serialize");
    vec![b"row".to_vec(), json]
}

/// `values` as u64 LE words, one part.
fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A part of exactly `N` u64 LE words.
fn read_words<const N: usize>(part: &[u8]) -> Option<[u64; N]> {
    if part.len() != N * 8 {
        return None;
    }
    Some(std::array::from_fn(|i| {
        u64::from_le_bytes(part[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }))
}

/// The `end` message for an outcome.
fn end_parts(result: Result<(), String>) -> Vec<Vec<u8>> {
    match result {
        Ok(()) => vec![b"end".to_vec(), b"ok".to_vec(), Vec::new()],
        Err(m) => vec![b"end".to_vec(), b"error".to_vec(), m.into_bytes()],
    }
}
