//! A blocking Relink driver over `std::net::TcpStream`, for setup-time
//! exchanges (addresses, memory keys) between the apps. Not on any hot
//! path: it allocates freely and blocks with timeouts.
//!
//! ```no_run
//! use efapoll::relink::{self, Options};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), relink::TcpError> {
//! let mut conn = relink::connect("10.0.0.2:7000", "pingpong", &Options::default())?;
//! conn.send(0, &[b"my address", b"my key"])?;
//! let (channel, parts) = conn.recv(Duration::from_secs(5))?;
//! conn.shutdown()?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::link::{
    Accepted, Acceptor, CommandError, ConnectorConfig, Event, HandshakeError, Limits, Link,
    LinkError, Listener, Params,
};
use super::wire::ChannelId;

/// Driver settings. Both peers must use the same `params`.
///
/// Acknowledgements are batched with `limits.ack_window` (the link counts
/// the messages) and `ack_delay` (the driver keeps the time):
///
/// ```
/// use efapoll::relink::{AutoReconnect, Keepalive, Limits, Options, Reconnect};
/// use std::time::Duration;
///
/// let options = Options {
///     // One consumed acknowledgement per 16 messages, or after 5 ms.
///     limits: Limits { ack_window: 16, ..Limits::default() },
///     ack_delay: Duration::from_millis(5),
///     // Ping after 1 s of silence; no pong within 2 s fails the stream.
///     keepalive: Some(Keepalive {
///         idle: Duration::from_secs(1),
///         pong_timeout: Duration::from_secs(2),
///     }),
///     // A connector dials again by itself, up to 5 times in a row.
///     auto_reconnect: Some(AutoReconnect {
///         attempts: 5,
///         initial_backoff: Duration::from_millis(50),
///         max_backoff: Duration::from_secs(2),
///         mode: Reconnect::Resume,
///     }),
///     ..Options::default()
/// };
/// assert_eq!(options.timeout, Options::default().timeout);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub params: Params,
    pub limits: Limits,
    /// Limit for connecting, the handshake, a blocked send and shutdown.
    pub timeout: Duration,
    /// How long acknowledgements held below `limits.ack_window` wait before
    /// they go anyway. The Conn keeps this time only while one of its calls
    /// drives it; [`Conn::release_acks`] sends them at once.
    pub ack_delay: Duration,
    /// Health check by idle ping (relink 3.4); `None` pings only on request.
    pub keepalive: Option<Keepalive>,
    /// A connector that loses its stream dials again by itself during the
    /// call that meets the loss; `None` leaves that to
    /// [`Conn::reconnect`].
    pub auto_reconnect: Option<AutoReconnect>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            params: Params::default(),
            limits: Limits::default(),
            timeout: Duration::from_secs(10),
            // The reference implementation's batching delay.
            ack_delay: Duration::from_millis(100),
            keepalive: None,
            auto_reconnect: None,
        }
    }
}

/// Idle ping with a pong timeout: see [`Options::keepalive`].
///
/// After `idle` without a byte from the peer the Conn pings it; without a
/// pong `pong_timeout` after that ping the stream is given up as dead and
/// the call fails with [`TcpError::PongTimeout`] (or, with
/// [`Options::auto_reconnect`], dials again). Both are checked only while a
/// call drives the Conn: a Conn nobody calls neither pings nor answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub idle: Duration,
    pub pong_timeout: Duration,
}

/// Automatic reconnection: see [`Options::auto_reconnect`].
///
/// The first attempt follows the loss at once; after the n-th failure in a
/// row the next waits `initial_backoff * 2^(n-1)`, at most `max_backoff`.
/// After `attempts` failures in a row (at least one attempt is made) the
/// call fails with [`TcpError::ReconnectFailed`], and the Conn stops
/// trying until a [`Conn::reconnect`] succeeds. An attempt and a backoff
/// end with the call's own time limit: the call returns
/// [`TcpError::Timeout`], and the next call that drives the Conn goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoReconnect {
    pub attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub mode: Reconnect,
}

impl AutoReconnect {
    /// The wait after `failures` failed attempts in a row.
    fn backoff(&self, failures: u32) -> Duration {
        let doubled = 1u32 << failures.saturating_sub(1).min(31);
        self.initial_backoff.saturating_mul(doubled).min(self.max_backoff)
    }
}

/// Which link a connector asks for when it dials again (relink 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reconnect {
    /// Offer the old link; if the listener no longer knows it (it
    /// restarted, or forgot it), go on with a new one, the old link's
    /// undelivered messages discarded.
    #[default]
    Resume,
    /// Offer the old link and take nothing else: a listener that does not
    /// know it replies with link id zero, and the attempt fails with
    /// [`HandshakeError::LinkLost`] (handshake flag 2, "require old link
    /// id"). Automatic reconnection stops there.
    ResumeOnly,
    /// Start a new link at once, discarding everything of the old one.
    Fresh,
}

#[derive(Debug, Error)]
pub enum TcpError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("handshake failed: {0}")]
    Handshake(#[from] HandshakeError),
    #[error("link failed: {0}")]
    Link(LinkError),
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("timed out")]
    Timeout,
    /// The peer closed the stream, or an earlier call met its failure:
    /// [`Conn::reconnect`] or [`Conn::resume`] goes on.
    #[error("the stream is lost (closed by the peer, or failed earlier)")]
    Disconnected,
    #[error("the link is shut down")]
    ShutDown,
    #[error("only a connector reconnects")]
    NotConnector,
    /// A keepalive ping got no pong in time ([`Keepalive`]); the stream is
    /// given up, the link kept for a reconnection.
    #[error("no pong within {waited:?} of a keepalive ping")]
    PongTimeout { waited: Duration },
    /// Automatic reconnection failed `attempts` times in a row.
    #[error("gave up reconnecting after {attempts} attempts: {last}")]
    ReconnectFailed {
        attempts: u32,
        #[source]
        last: Box<TcpError>,
    },
    /// A reconnection started a new link while the call waited for the old
    /// one: what the old link had not delivered is discarded (relink 1).
    #[error("the link was replaced by a new one; its undelivered messages are discarded")]
    LinkReplaced,
}

impl From<LinkError> for TcpError {
    fn from(error: LinkError) -> Self {
        match error {
            LinkError::Handshake(error) => TcpError::Handshake(error),
            error => TcpError::Link(error),
        }
    }
}

/// A message from one of the peer's channels.
pub type Received = (ChannelId, Vec<Vec<u8>>);

/// A message from one of the peer's channels, not yet consumed: see
/// [`Conn::recv_unconsumed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub channel: ChannelId,
    /// Its number on `channel`, for [`Conn::consume`].
    pub seq: u32,
    pub parts: Vec<Vec<u8>>,
}

/// The Conn's timers, indexed into [`Timers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Held acknowledgements go.
    AckDelay,
    /// The peer has been silent for [`Keepalive::idle`]: ping it.
    Ping,
    /// The keepalive ping's pong is overdue.
    Pong,
    /// The next automatic reconnection attempt.
    Reconnect,
}

const TIMER_COUNT: usize = 4;

#[derive(Debug, Default)]
struct Timers([Option<Instant>; TIMER_COUNT]);

impl Timers {
    fn get(&self, timer: Timer) -> Option<Instant> {
        self.0[timer as usize]
    }

    fn set(&mut self, timer: Timer, at: Instant) {
        self.0[timer as usize] = Some(at);
    }

    fn clear(&mut self, timer: Timer) {
        self.0[timer as usize] = None;
    }

    /// Whether `timer` was due at `now`; clears it if so.
    fn expire(&mut self, timer: Timer, now: Instant) -> bool {
        let due = self.get(timer).is_some_and(|at| at <= now);
        if due {
            self.clear(timer);
        }
        due
    }

    fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }
}

/// One end of a Relink link over TCP.
///
/// A stream that fails (a read or write error, its end, a protocol error,
/// a keepalive ping without a pong) is given up at once: the call that
/// meets the failure reports it, and every later call that needs the
/// stream returns [`TcpError::Disconnected`] without touching it, until
/// [`reconnect`](Self::reconnect) or [`resume`](Self::resume) — or, for a
/// connector with [`Options::auto_reconnect`], until the Conn dials again
/// by itself. Messages received before stay readable, and
/// [`send`](Self::send) queues for the resumption.
///
/// What the peer sends comes out in order: [`next_event`](Self::next_event)
/// takes the next of everything, [`recv`](Self::recv) and
/// [`recv_unconsumed`](Self::recv_unconsumed) the next message, and
/// [`poll_event`](Self::poll_event) the next event that is not a message.
///
/// Timers (the ack delay, keepalive pings, reconnection backoff) run only
/// while a call drives the Conn: the blocking calls, and the writes of the
/// others.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    link: Link,
    /// Where a connector dials again.
    peer: Option<SocketAddr>,
    options: Options,
    /// What the link delivered and the caller has not taken, in order.
    queue: VecDeque<Event>,
    pongs: u64,
    /// Whether the last handshake resumed the link.
    resumed: bool,
    reconnects: u64,
    tx: Vec<u8>,
    /// The stream is given up: bytes left in it from a dead connection
    /// must not reach the link as if they came after the failure.
    lost: bool,
    timers: Timers,
    /// Automatic reconnection attempts that failed in a row, and whether
    /// it gave up.
    reconnect_failures: u32,
    reconnect_gave_up: bool,
    /// A handshake is under way: a loss ends it rather than starting
    /// another.
    handshaking: bool,
}

const READ_CHUNK: usize = 64 << 10;

/// How far off a deadline past the clock's range lies: far enough to be
/// "never" for a setup-time wait.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + timeout`, saturating: a huge timeout (`Duration::MAX`) is a
/// deadline a century away rather than an overflow.
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).or_else(|| now.checked_add(FAR_FUTURE)).unwrap_or(now)
}

fn dial(addr: impl ToSocketAddrs, timeout: Duration) -> Result<TcpStream, TcpError> {
    let mut last = None;
    for addr in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = Some(error),
        }
    }
    Err(last.map_or(TcpError::Disconnected, TcpError::Io))
}

fn prepare(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    // Control packets are small and latency matters more than batching.
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
}

/// Connects to a listener's endpoint and completes the handshake.
pub fn connect(
    addr: impl ToSocketAddrs,
    endpoint_name: &str,
    options: &Options,
) -> Result<Conn, TcpError> {
    let stream = dial(addr, options.timeout)?;
    let peer = stream.peer_addr()?;
    prepare(&stream, options.timeout)?;
    let link = Link::connect(ConnectorConfig {
        endpoint_name: endpoint_name.to_owned(),
        params: options.params,
        limits: options.limits,
    })?;
    let mut conn = Conn::new(stream, link, Some(peer), options);
    conn.await_open(deadline_after(options.timeout))?;
    Ok(conn)
}

/// A connected pair over loopback TCP: the connector and the listener of
/// `endpoint_name`, both with `options` (for tests and examples).
///
/// ```
/// use efapoll::relink::{self, Options};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), relink::TcpError> {
/// let (mut connector, mut listener) = relink::loopback_pair("demo", &Options::default())?;
/// connector.send(0, &[b"hello"])?;
/// let (channel, parts) = listener.recv(Duration::from_secs(5))?;
/// assert_eq!((channel.to_u64(), parts), (Some(0), vec![b"hello".to_vec()]));
/// # Ok(()) }
/// ```
pub fn loopback_pair(endpoint_name: &str, options: &Options) -> Result<(Conn, Conn), TcpError> {
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = tcp.local_addr()?;
    let (name, connector_options) = (endpoint_name.to_owned(), options.clone());
    // The handshake takes turns: each side needs its own thread.
    let connector = thread::spawn(move || connect(addr, &name, &connector_options));
    let listener = accept(&tcp, &[endpoint_name], options);
    let connector = connector.join().map_err(|_| TcpError::Disconnected)?;
    Ok((connector?, listener?))
}

/// Accepts one connection on `listener` as a fresh listener instance serving
/// `known_names`, and completes the handshake. A connector asking to resume
/// gets a new link; use [`Server`] to resume links.
pub fn accept(
    listener: &TcpListener,
    known_names: &[&str],
    options: &Options,
) -> Result<Conn, TcpError> {
    let (stream, _) = listener.accept()?;
    accept_stream(stream, known_names, options)
}

/// Runs the listener's handshake on a stream the caller accepted (to poll
/// the listener, or to bound each handshake by `options.timeout` on its
/// own) as a fresh listener instance serving `known_names`.
pub fn accept_stream(
    stream: TcpStream,
    known_names: &[&str],
    options: &Options,
) -> Result<Conn, TcpError> {
    let mut instance = Listener::new(known_names.iter().copied(), options.params);
    let accepted = handshake(&stream, &mut instance, options.timeout)?;
    Conn::accepted(stream, accepted, options)
}

/// Runs the listener's handshake on `stream`.
fn handshake(
    mut stream: &TcpStream,
    instance: &mut Listener,
    timeout: Duration,
) -> Result<Accepted, TcpError> {
    // A listener's stream may be non-blocking; the handshake reads with
    // timeouts.
    stream.set_nonblocking(false)?;
    prepare(stream, timeout)?;
    let deadline = deadline_after(timeout);
    let mut acceptor = Acceptor::new();
    let mut buf = vec![0; READ_CHUNK];
    let mut tx = Vec::new();
    loop {
        let n = read_until(stream, &mut buf, deadline)?;
        let result = acceptor.handle_input(&buf[..n], instance);
        tx.clear();
        acceptor.poll_transmit(&mut tx);
        stream.write_all(&tx)?;
        if let Some(accepted) = result? {
            return Ok(accepted);
        }
    }
}

/// One read before `deadline`; zero bytes read is a closed stream.
fn read_until(
    mut stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<usize, TcpError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TcpError::Timeout);
        }
        // A zero timeout means "block forever" to the socket.
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match stream.read(buf) {
            Ok(0) => return Err(TcpError::Disconnected),
            Ok(n) => return Ok(n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A listener that keeps its instance across connections, so connectors can
/// resume their links.
///
/// Each endpoint name may have options of its own ([`serve`](Self::serve)):
/// parameters its connectors must agree on, limits, timeouts, keepalive.
/// The handshake itself is bounded by the options given to
/// [`new`](Self::new), as the name is not known before it.
#[derive(Debug)]
pub struct Server {
    tcp: TcpListener,
    instance: Listener,
    options: Options,
    /// Names served with options other than `options`.
    named: BTreeMap<String, Options>,
}

/// What a [`Server`] accepted.
#[derive(Debug)]
pub enum Incoming {
    /// A new link.
    New(Box<Conn>),
    /// A connector resuming a link: hand it to that link's [`Conn::resume`].
    Resume(Resumption),
}

/// A new stream for an existing link.
#[derive(Debug)]
pub struct Resumption {
    stream: TcpStream,
    accepted: Accepted,
}

impl Resumption {
    pub fn link_id(&self) -> u64 {
        self.accepted.link_id
    }
}

impl Server {
    /// Serves `known_names`, each with `options`.
    pub fn new(tcp: TcpListener, known_names: &[&str], options: Options) -> Self {
        Server {
            tcp,
            instance: Listener::new(known_names.iter().copied(), options.params),
            options,
            named: BTreeMap::new(),
        }
    }

    /// Serves `name` with `options` of its own (relink 1: endpoint names
    /// host several services at one address), adding the name if new. Its
    /// connectors must use the same `options.params`; its links get these
    /// limits, timeout, ack delay and keepalive.
    ///
    /// ```
    /// use efapoll::relink::{self, Incoming, Options, Params, Server};
    /// use std::net::TcpListener;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let tcp = TcpListener::bind("127.0.0.1:0")?;
    /// let mut server = Server::new(tcp, &["plain"], Options::default());
    /// // "wide" speaks 8-byte channel ids with transactions from the connector.
    /// let wide = Params {
    ///     connector_id_len: 8,
    ///     listener_id_len: 8,
    ///     connector_transactions: true,
    ///     ..Params::default()
    /// };
    /// let wide_options = Options { params: wide, ..Options::default() };
    /// server.serve("wide", wide_options.clone());
    /// let addr = server.local_addr()?;
    /// let client = std::thread::spawn(move || relink::connect(addr, "wide", &wide_options));
    /// let Incoming::New(conn) = server.accept()? else { unreachable!("a first connection") };
    /// assert_eq!(conn.link().endpoint_name(), "wide");
    /// assert_eq!(*conn.link().params(), wide);
    /// # let _client = client.join().unwrap()?;
    /// # Ok(()) }
    /// ```
    pub fn serve(&mut self, name: &str, options: Options) {
        self.instance.serve(name, options.params);
        self.named.insert(name.to_owned(), options);
    }

    /// The options `name` is served with.
    pub fn options_for(&self, name: &str) -> &Options {
        self.named.get(name).unwrap_or(&self.options)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Blocks for the next connection and completes its handshake.
    pub fn accept(&mut self) -> Result<Incoming, TcpError> {
        let (stream, _) = self.tcp.accept()?;
        self.accept_stream(stream)
    }

    /// Completes the handshake on a stream the caller accepted (to poll the
    /// listener, as with [`accept_stream`]), keeping links resumable.
    pub fn accept_stream(&mut self, stream: TcpStream) -> Result<Incoming, TcpError> {
        let accepted = handshake(&stream, &mut self.instance, self.options.timeout)?;
        if accepted.resumed {
            return Ok(Incoming::Resume(Resumption { stream, accepted }));
        }
        let options = self.options_for(&accepted.endpoint_name);
        Ok(Incoming::New(Box::new(Conn::accepted(stream, accepted, options)?)))
    }

    /// Forgets a finished link, so its id is never resumed.
    pub fn forget(&mut self, link_id: u64) {
        self.instance.forget(link_id);
    }
}

impl Conn {
    fn new(stream: TcpStream, link: Link, peer: Option<SocketAddr>, options: &Options) -> Self {
        let mut conn = Conn {
            stream,
            link,
            peer,
            options: options.clone(),
            queue: VecDeque::new(),
            pongs: 0,
            resumed: false,
            reconnects: 0,
            tx: Vec::new(),
            lost: false,
            timers: Timers::default(),
            reconnect_failures: 0,
            reconnect_gave_up: false,
            handshaking: false,
        };
        conn.stream_started();
        conn
    }

    fn accepted(
        stream: TcpStream,
        accepted: Accepted,
        options: &Options,
    ) -> Result<Self, TcpError> {
        let link = Link::accept(accepted, options.limits)?;
        let mut conn = Conn::new(stream, link, None, options);
        conn.flush()?;
        Ok(conn)
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    pub fn link_id(&self) -> u64 {
        self.link.link_id()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Sends a message on our `channel`; returns its sequence number. Blocks
    /// while the channel's window is full, up to the timeout. While the
    /// stream is lost, or if writing it fails now, the message is queued for
    /// the resumption: the next call that needs the stream reports the loss.
    pub fn send(
        &mut self,
        channel: impl Into<ChannelId>,
        parts: &[&[u8]],
    ) -> Result<u32, TcpError> {
        let channel = channel.into();
        let seqs = self.send_to(std::slice::from_ref(&channel), parts)?;
        Ok(seqs[0])
    }

    /// Sends one message to several of our channels in one multicast packet
    /// (relink 2.3); each channel numbers it in its own sequence (relink
    /// 3.1) and the peer acknowledges it on each. A channel named twice gets
    /// it twice. Returns the sequence numbers in the order of `channels`.
    /// Blocks, like [`send`](Self::send), while any of the windows is full;
    /// the message goes to all of them or to none.
    ///
    /// ```
    /// use efapoll::relink::{self, Options};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let (mut a, mut b) = relink::loopback_pair("demo", &Options::default())?;
    /// a.send(2, &[b"first"])?;
    /// assert_eq!(a.send_multicast(&[1u64, 2], &[b"to both"])?, [0, 1]);
    /// let wait = Duration::from_secs(5);
    /// let mut got = Vec::new();
    /// for _ in 0..3 {
    ///     let message = b.recv_unconsumed(wait)?;
    ///     got.push((message.channel.to_u64().unwrap(), message.seq, message.parts));
    /// }
    /// let both = vec![b"to both".to_vec()];
    /// assert_eq!(got[1..], [(1, 0, both.clone()), (2, 1, both)]);
    /// # Ok(()) }
    /// ```
    pub fn send_multicast<C: Clone + Into<ChannelId>>(
        &mut self,
        channels: &[C],
        parts: &[&[u8]],
    ) -> Result<Vec<u32>, TcpError> {
        let channels: Vec<ChannelId> = channels.iter().cloned().map(Into::into).collect();
        self.send_to(&channels, parts)
    }

    fn send_to(&mut self, channels: &[ChannelId], parts: &[&[u8]]) -> Result<Vec<u32>, TcpError> {
        let deadline = deadline_after(self.options.timeout);
        loop {
            let result = match channels {
                [channel] => self.link.send(channel, parts).map(|seq| vec![seq]),
                _ => self.link.send_multicast(channels, parts),
            };
            match result {
                Ok(seqs) => {
                    // The link keeps the message until the peer acknowledges
                    // it; a failed write only loses the stream.
                    let _ = self.flush();
                    return Ok(seqs);
                }
                Err(CommandError::Blocked { .. }) => {
                    let mut wanted: BTreeMap<&ChannelId, u32> = BTreeMap::new();
                    for channel in channels {
                        *wanted.entry(channel).or_default() += 1;
                    }
                    self.drive_until(deadline, |conn| {
                        wanted.iter().all(|(channel, &n)| conn.link.send_window(*channel) >= n)
                    })?;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// The next message from the peer's channels, waiting up to `timeout`.
    /// Its consumption is acknowledged, and with it that of every earlier
    /// message of its channel (relink 3.1).
    pub fn recv(&mut self, timeout: Duration) -> Result<Received, TcpError> {
        let message = self.recv_unconsumed(timeout)?;
        // Cannot fail: the message came from the link and is consumed once.
        let _ = self.link.consume(&message.channel, message.seq);
        if !self.link.is_done() {
            // A failed write loses the stream, which the next call reports;
            // the message is the caller's either way.
            let _ = self.flush();
        }
        Ok((message.channel, message.parts))
    }

    /// The next message from the peer's channels, waiting up to `timeout`,
    /// without acknowledging its consumption: the peer counts it against
    /// its window, and a closure of its channel waits, until
    /// [`consume`](Self::consume).
    ///
    /// ```
    /// use efapoll::relink::{self, Options};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let (mut a, mut b) = relink::loopback_pair("demo", &Options::default())?;
    /// let wait = Duration::from_secs(5);
    /// let seq = a.send(3, &[b"job"])?;
    /// let job = b.recv_unconsumed(wait)?;
    /// assert!(!a.link().is_consumed(3, seq)?);
    /// // ... the job is done: only now may the peer count it consumed.
    /// b.consume(&job.channel, job.seq)?;
    /// a.wait_consumed(3, seq, wait)?;
    /// # Ok(()) }
    /// ```
    pub fn recv_unconsumed(&mut self, timeout: Duration) -> Result<Message, TcpError> {
        let is_message = |event: &Event| matches!(event, Event::Message { .. });
        if !self.queue.iter().any(is_message) {
            if self.link.is_done() {
                return Err(TcpError::ShutDown);
            }
            self.drive_until(deadline_after(timeout), |conn| conn.queue.iter().any(is_message))?;
        }
        match self.take(is_message) {
            Some(Event::Message { channel, seq, parts }) => Ok(Message { channel, seq, parts }),
            _ => Err(TcpError::Timeout),
        }
    }

    /// Acknowledges that we consumed the peer's messages on `channel`
    /// through `seq` (relink 3.1), from [`recv_unconsumed`](Self::recv_unconsumed)
    /// or [`next_event`](Self::next_event). The acknowledgement goes now,
    /// or with the next ones under an ack window ([`Options::ack_delay`]).
    pub fn consume(&mut self, channel: impl Into<ChannelId>, seq: u32) -> Result<(), TcpError> {
        self.link.consume(channel, seq)?;
        self.flush()
    }

    /// Waits up to `timeout` until the peer has consumed our message `seq`
    /// on `channel` (and so every earlier one of it); returns at once if it
    /// has. See [`Link::is_consumed`] for what the number names.
    ///
    /// Fails with [`TcpError::LinkReplaced`] if a reconnection started a new
    /// link meanwhile: the message was discarded with the old one.
    ///
    /// ```
    /// use efapoll::relink::{self, Options};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let (mut a, mut b) = relink::loopback_pair("demo", &Options::default())?;
    /// let seq = a.send(0, &[b"config"])?;
    /// b.recv(Duration::from_secs(5))?;
    /// a.wait_consumed(0, seq, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn wait_consumed(
        &mut self,
        channel: impl Into<ChannelId>,
        seq: u32,
        timeout: Duration,
    ) -> Result<(), TcpError> {
        let channel = channel.into();
        let link = self.link_key();
        if self.link.is_consumed(&channel, seq)? {
            return Ok(());
        }
        self.drive_until(deadline_after(timeout), |conn| {
            conn.link_key() != link || conn.link.is_consumed(&channel, seq).unwrap_or(true)
        })?;
        if self.link_key() != link {
            return Err(TcpError::LinkReplaced);
        }
        Ok(())
    }

    /// The next of everything the peer sent, in order, waiting up to
    /// `timeout`: messages (not consumed: see
    /// [`consume`](Self::consume)), commits and rollbacks, closures of its
    /// channels ([`Event::PeerClosed`]), confirmations of ours, shutdown;
    /// first of all, [`Event::Connected`] for the handshake.
    ///
    /// ```
    /// use efapoll::relink::{self, Event, Options};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let (mut a, mut b) = relink::loopback_pair("demo", &Options::default())?;
    /// a.send(4, &[b"last words"])?;
    /// a.close(4)?;
    /// let wait = Duration::from_secs(5);
    /// assert!(matches!(b.next_event(wait)?, Event::Connected { resumed: false, .. }));
    /// let Event::Message { channel, seq, .. } = b.next_event(wait)? else { unreachable!() };
    /// assert_eq!(b.next_event(wait)?, Event::PeerClosed { channel: channel.clone() });
    /// // The closure is confirmed once its messages are consumed.
    /// b.consume(&channel, seq)?;
    /// a.wait_closed(4, wait)?;
    /// # Ok(()) }
    /// ```
    pub fn next_event(&mut self, timeout: Duration) -> Result<Event, TcpError> {
        if self.queue.is_empty() {
            if self.link.is_done() {
                return Err(TcpError::ShutDown);
            }
            self.drive_until(deadline_after(timeout), |conn| !conn.queue.is_empty())?;
        }
        self.queue.pop_front().ok_or(TcpError::Timeout)
    }

    /// Closes our `channel` after the messages sent on it (relink 3.3). The
    /// peer sees [`Event::PeerClosed`] after them and confirms once it has
    /// consumed them: wait for that with [`wait_closed`](Self::wait_closed).
    /// Sending on the channel afterwards reopens it, numbered from 0.
    pub fn close(&mut self, channel: impl Into<ChannelId>) -> Result<(), TcpError> {
        self.link.close(channel)?;
        // Kept by the link until confirmed; a failed write only loses the
        // stream.
        let _ = self.flush();
        Ok(())
    }

    /// Waits up to `timeout` for the peer's confirmation of our close of
    /// `channel` ([`Event::Closed`], taken from the events if there); at
    /// once if it came. See [`next_event`](Self::next_event) for an
    /// example.
    pub fn wait_closed(
        &mut self,
        channel: impl Into<ChannelId>,
        timeout: Duration,
    ) -> Result<(), TcpError> {
        let channel = channel.into();
        let link = self.link_key();
        if !self.link.is_closing(&channel) && !self.link.is_closed(&channel) {
            return Err(CommandError::ChannelNotOpen { channel }.into());
        }
        self.drive_until(deadline_after(timeout), |conn| {
            conn.link_key() != link || !conn.link.is_closing(&channel)
        })?;
        if self.link_key() != link {
            return Err(TcpError::LinkReplaced);
        }
        self.take(|event| matches!(event, Event::Closed { channel: c } if *c == channel));
        Ok(())
    }

    /// Asks the peer to process our messages on `channel` sent since the
    /// last commit or rollback (relink 3.2); returns the last one's number.
    /// Our channels must use transactions (`params`). The peer sees the
    /// messages, then [`Event::Commit`]; [`wait_commit`](Self::wait_commit)
    /// waits for its answer.
    ///
    /// ```
    /// use efapoll::relink::{self, Event, Options, Params};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let params = Params { connector_transactions: true, ..Params::default() };
    /// let options = Options { params, ..Options::default() };
    /// let (mut a, mut b) = relink::loopback_pair("demo", &options)?;
    /// a.send(0, &[b"debit"])?;
    /// a.send(0, &[b"credit"])?;
    /// let seq = a.commit(0)?;
    ///
    /// let wait = Duration::from_secs(5);
    /// let mut batch = Vec::new();
    /// loop {
    ///     match b.next_event(wait)? {
    ///         Event::Connected { .. } => {}
    ///         Event::Message { parts, .. } => batch.push(parts),
    ///         Event::Commit { channel, seq } => {
    ///             // Apply the batch, then answer.
    ///             b.consume(&channel, seq)?;
    ///             b.resolve_commit(&channel, seq, batch.len() == 2)?;
    ///             break;
    ///         }
    ///         other => unreachable!("{other:?}"),
    ///     }
    /// }
    /// assert!(a.wait_commit(0, seq, wait)?);
    /// # Ok(()) }
    /// ```
    pub fn commit(&mut self, channel: impl Into<ChannelId>) -> Result<u32, TcpError> {
        let seq = self.link.commit(channel)?;
        // Kept by the link until answered; a failed write only loses the
        // stream.
        let _ = self.flush();
        Ok(seq)
    }

    /// Asks the peer to ignore our messages on `channel` sent since the
    /// last commit or rollback (relink 3.2); returns the last one's number.
    /// Not answered, and not sent again after a reconnection: the next
    /// commit covers only what follows. The peer sees
    /// [`Event::Rollback`] after the messages.
    ///
    /// ```
    /// use efapoll::relink::{self, Event, Options, Params};
    /// use std::time::Duration;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let params = Params { connector_transactions: true, ..Params::default() };
    /// let options = Options { params, ..Options::default() };
    /// let (mut a, mut b) = relink::loopback_pair("demo", &options)?;
    /// a.send(0, &[b"draft"])?;
    /// let seq = a.rollback(0)?;
    /// let wait = Duration::from_secs(5);
    /// assert!(matches!(b.next_event(wait)?, Event::Connected { .. }));
    /// assert!(matches!(b.next_event(wait)?, Event::Message { .. }));
    /// assert_eq!(b.next_event(wait)?, Event::Rollback { channel: 0.into(), seq });
    /// # Ok(()) }
    /// ```
    pub fn rollback(&mut self, channel: impl Into<ChannelId>) -> Result<u32, TcpError> {
        let seq = self.link.rollback(channel)?;
        let _ = self.flush();
        Ok(seq)
    }

    /// Waits up to `timeout` for the outcome of our commit through `seq` on
    /// `channel`: `true` if the peer committed ([`Event::Committed`]),
    /// `false` if it could not ([`Event::Uncommitted`]). The event is taken
    /// from the events. Fails with [`CommandError::NoPendingCommit`] if no
    /// such commit awaits its outcome, and with [`TcpError::LinkReplaced`]
    /// if a new link replaced the old one meanwhile. See
    /// [`commit`](Self::commit) for an example.
    pub fn wait_commit(
        &mut self,
        channel: impl Into<ChannelId>,
        seq: u32,
        timeout: Duration,
    ) -> Result<bool, TcpError> {
        let channel = channel.into();
        let link = self.link_key();
        let is_outcome = |event: &Event| match event {
            Event::Committed { channel: c, seq: s } | Event::Uncommitted { channel: c, seq: s } => {
                *c == channel && *s == seq
            }
            _ => false,
        };
        if !self.queue.iter().any(is_outcome) {
            if !self.link.awaits_outcome(&channel, seq) {
                return Err(CommandError::NoPendingCommit { channel, seq }.into());
            }
            self.drive_until(deadline_after(timeout), |conn| {
                conn.link_key() != link
                    || conn.queue.iter().any(is_outcome)
                    || !conn.link.awaits_outcome(&channel, seq)
            })?;
        }
        match self.take(is_outcome) {
            Some(event) => Ok(matches!(event, Event::Committed { .. })),
            None if self.link_key() != link => Err(TcpError::LinkReplaced),
            None => Err(CommandError::NoPendingCommit { channel, seq }.into()),
        }
    }

    /// Answers the oldest [`Event::Commit`] on the peer's `channel`
    /// (relink 3.2): `committed` if we processed its messages through
    /// `seq`. See [`commit`](Self::commit) for an example.
    pub fn resolve_commit(
        &mut self,
        channel: impl Into<ChannelId>,
        seq: u32,
        committed: bool,
    ) -> Result<(), TcpError> {
        self.link.resolve_commit(channel, seq, committed)?;
        self.flush()
    }

    /// Sends every acknowledgement held below the ack window now, instead
    /// of after [`Options::ack_delay`].
    pub fn release_acks(&mut self) -> Result<(), TcpError> {
        self.link.release_acks();
        self.flush()
    }

    /// Pings the peer and waits for the pong; returns the round-trip time.
    pub fn ping(&mut self, timeout: Duration) -> Result<Duration, TcpError> {
        let deadline = deadline_after(timeout);
        self.ensure_stream(deadline)?;
        let start = Instant::now();
        let seen = self.pongs;
        self.link.ping()?;
        self.drive_until(deadline, |conn| conn.pongs > seen)?;
        Ok(start.elapsed())
    }

    /// Sends a ping without waiting for its pong: [`pongs`](Self::pongs)
    /// counts it when a later call reads it.
    pub fn send_ping(&mut self) -> Result<(), TcpError> {
        if self.lost {
            return Err(TcpError::Disconnected);
        }
        self.link.ping()?;
        self.flush()
    }

    /// Pongs received so far.
    pub fn pongs(&self) -> u64 {
        self.pongs
    }

    /// Streams opened after the first one, by [`reconnect`](Self::reconnect),
    /// [`resume`](Self::resume) or automatically.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    /// The limit of blocked sends and of shutdown from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.options.timeout = timeout;
    }

    /// The next event that is not a message (commits, closures, ...);
    /// pongs are counted by [`pongs`](Self::pongs) instead.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.take(|event| !matches!(event, Event::Message { .. }))
    }

    /// Sends shutdown and waits for the peer's (relink 3.6), then closes the
    /// stream gracefully. Messages that arrived meanwhile stay readable
    /// with [`recv`](Self::recv).
    pub fn shutdown(&mut self) -> Result<(), TcpError> {
        let deadline = deadline_after(self.options.timeout);
        self.link.shutdown();
        self.drive_until(deadline, |conn| conn.link.is_done())?;
        // Half-close, then read to the peer's end, so neither side resets
        // the connection while the other still reads.
        let _ = self.stream.shutdown(Shutdown::Write);
        let mut buf = [0; 1024];
        while read_until(&self.stream, &mut buf, deadline).is_ok() {}
        Ok(())
    }

    /// Connector: dials the listener again after the stream broke and
    /// resumes the link; returns whether it was resumed (if not, everything
    /// unacknowledged was discarded with the old link). The same as
    /// [`reconnect_with`](Self::reconnect_with)`(Reconnect::Resume)`.
    pub fn reconnect(&mut self) -> Result<bool, TcpError> {
        self.reconnect_with(Reconnect::Resume)
    }

    /// Connector: dials the listener again, asking for the link `mode`
    /// says; returns whether the old link goes on. Within the Conn's
    /// timeout.
    ///
    /// ```
    /// use efapoll::relink::{self, Incoming, Options, Reconnect, Server};
    /// use std::net::TcpListener;
    ///
    /// # fn main() -> Result<(), relink::TcpError> {
    /// let tcp = TcpListener::bind("127.0.0.1:0")?;
    /// let addr = tcp.local_addr()?;
    /// let mut server = Server::new(tcp, &["demo"], Options::default());
    /// let listener = std::thread::spawn(move || -> Result<_, relink::TcpError> {
    ///     let Incoming::New(mut first) = server.accept()? else { unreachable!() };
    ///     // The connector comes back for its link, then for a new one.
    ///     let Incoming::Resume(resumption) = server.accept()? else { unreachable!() };
    ///     first.resume(resumption)?;
    ///     let Incoming::New(second) = server.accept()? else { unreachable!() };
    ///     Ok((first.link_id(), second.link_id()))
    /// });
    /// let mut conn = relink::connect(addr, "demo", &Options::default())?;
    /// let first = conn.link_id();
    /// conn.disconnect();
    /// assert!(conn.reconnect_with(Reconnect::ResumeOnly)?);
    /// assert_eq!(conn.link_id(), first);
    /// conn.disconnect();
    /// assert!(!conn.reconnect_with(Reconnect::Fresh)?);
    /// assert_ne!(conn.link_id(), first);
    /// assert_eq!(listener.join().unwrap()?, (first, conn.link_id()));
    /// # Ok(()) }
    /// ```
    pub fn reconnect_with(&mut self, mode: Reconnect) -> Result<bool, TcpError> {
        let resumed = self.reconnect_until(mode, deadline_after(self.options.timeout))?;
        self.reconnect_failures = 0;
        self.reconnect_gave_up = false;
        Ok(resumed)
    }

    /// Breaks the stream at once, keeping the link so that it can be
    /// resumed (an abort, or a test of resumption).
    pub fn disconnect(&mut self) {
        self.lose_stream();
    }

    /// Listener: continues this link on the stream of `resumption`.
    pub fn resume(&mut self, resumption: Resumption) -> Result<(), TcpError> {
        match self.link.resume(resumption.accepted) {
            Ok(()) => {}
            // Refused: the link and its stream are as they were.
            Err(error @ (LinkError::WrongLink { .. } | LinkError::LinkDone)) => {
                return Err(error.into());
            }
            // The link took the new stream, whose first bytes it refused.
            Err(error) => {
                self.stream = resumption.stream;
                self.lose_stream();
                return Err(error.into());
            }
        }
        self.stream = resumption.stream;
        self.lost = false;
        self.reconnects += 1;
        self.stream_started();
        self.flush()
    }

    /// Dials, handshakes as `mode` says, and waits for the link to open,
    /// all before `deadline` and within the Conn's timeout.
    fn reconnect_until(&mut self, mode: Reconnect, deadline: Instant) -> Result<bool, TcpError> {
        let peer = self.peer.ok_or(TcpError::NotConnector)?;
        self.lose_stream();
        let deadline = deadline.min(deadline_after(self.options.timeout));
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TcpError::Timeout);
        }
        let stream = dial(peer, left)?;
        prepare(&stream, self.options.timeout)?;
        match mode {
            Reconnect::Resume => self.link.reconnect(false)?,
            Reconnect::ResumeOnly => self.link.reconnect(true)?,
            Reconnect::Fresh => self.link.reconnect_fresh()?,
        }
        self.stream = stream;
        self.lost = false;
        self.stream_started();
        if let Err(error) = self.await_open(deadline) {
            // A handshake cut short is abandoned, not continued.
            self.lose_stream();
            return Err(error);
        }
        self.reconnects += 1;
        Ok(self.resumed)
    }

    /// With the stream lost, reconnects automatically if the options say
    /// so, waiting out the backoff first; otherwise fails.
    fn recover(&mut self, deadline: Instant) -> Result<(), TcpError> {
        let Some(auto) = self.auto_reconnect() else {
            return Err(TcpError::Disconnected);
        };
        if self.link.is_done() {
            return Err(TcpError::ShutDown);
        }
        if let Some(at) = self.timers.get(Timer::Reconnect) {
            let now = Instant::now();
            if at > deadline {
                thread::sleep(deadline.saturating_duration_since(now));
                return Err(TcpError::Timeout);
            }
            thread::sleep(at.saturating_duration_since(now));
            self.timers.clear(Timer::Reconnect);
        }
        let error = match self.reconnect_until(auto.mode, deadline) {
            Ok(_) => {
                self.reconnect_failures = 0;
                return Ok(());
            }
            Err(error) => error,
        };
        let permanent = matches!(
            error,
            TcpError::Handshake(HandshakeError::LinkLost(_))
                | TcpError::Command(CommandError::LinkDone)
        );
        if permanent {
            self.reconnect_gave_up = true;
            return Err(error);
        }
        // An attempt that the caller's limit cut short is not a failure:
        // the next call tries again at once.
        if Instant::now() >= deadline {
            return Err(TcpError::Timeout);
        }
        self.reconnect_failures += 1;
        if self.reconnect_failures >= auto.attempts.max(1) {
            self.reconnect_gave_up = true;
            return Err(TcpError::ReconnectFailed {
                attempts: self.reconnect_failures,
                last: Box::new(error),
            });
        }
        let backoff = auto.backoff(self.reconnect_failures);
        self.timers.set(Timer::Reconnect, Instant::now() + backoff);
        Ok(())
    }

    /// The automatic reconnection that applies now: a connector's, not
    /// given up, and not inside a handshake (whose loss ends it).
    fn auto_reconnect(&self) -> Option<AutoReconnect> {
        let applies = self.peer.is_some() && !self.handshaking && !self.reconnect_gave_up;
        self.options.auto_reconnect.filter(|_| applies)
    }

    /// A stream to work with: the current one, or a new one if the options
    /// reconnect automatically.
    fn ensure_stream(&mut self, deadline: Instant) -> Result<(), TcpError> {
        while self.lost {
            self.recover(deadline)?;
        }
        Ok(())
    }

    /// The link's identity: a new link (not a resumed one) changes it.
    fn link_key(&self) -> (u64, u64) {
        (self.link.epoch(), self.link.link_id())
    }

    /// Removes and returns the first event `wanted` picks.
    fn take(&mut self, wanted: impl Fn(&Event) -> bool) -> Option<Event> {
        let at = self.queue.iter().position(wanted)?;
        self.queue.remove(at)
    }

    /// Gives the stream up: nothing more is written to it or read from it.
    fn lose_stream(&mut self) {
        self.lost = true;
        self.link.stream_lost();
        let _ = self.stream.shutdown(Shutdown::Both);
        for timer in [Timer::AckDelay, Timer::Ping, Timer::Pong] {
            self.timers.clear(timer);
        }
    }

    /// A new stream: the peer counts as just heard from.
    fn stream_started(&mut self) {
        for timer in [Timer::AckDelay, Timer::Pong, Timer::Reconnect] {
            self.timers.clear(timer);
        }
        self.heard_from_peer(Instant::now());
    }

    /// Bytes arrived: the keepalive ping waits another idle period, unless
    /// one is out already, whose pong alone counts.
    fn heard_from_peer(&mut self, now: Instant) {
        if let Some(keepalive) = self.options.keepalive
            && self.timers.get(Timer::Pong).is_none()
        {
            self.timers.set(Timer::Ping, now + keepalive.idle);
        }
    }

    fn await_open(&mut self, deadline: Instant) -> Result<(), TcpError> {
        self.resumed = false;
        self.handshaking = true;
        let opened = self.drive_until(deadline, |conn| conn.link.is_open());
        self.handshaking = false;
        opened
    }

    fn flush(&mut self) -> Result<(), TcpError> {
        if self.lost {
            return Ok(());
        }
        self.tx.clear();
        self.link.poll_transmit(&mut self.tx);
        if !self.tx.is_empty()
            && let Err(error) = self.stream.write_all(&self.tx)
        {
            self.lose_stream();
            return Err(error.into());
        }
        // The delay runs from the first acknowledgement held.
        if !self.link.acks_held() {
            self.timers.clear(Timer::AckDelay);
        } else if self.timers.get(Timer::AckDelay).is_none() {
            self.timers.set(Timer::AckDelay, Instant::now() + self.options.ack_delay);
        }
        Ok(())
    }

    fn collect_events(&mut self) {
        while let Some(event) = self.link.poll_event() {
            match event {
                Event::Pong => {
                    self.pongs += 1;
                    // Any pong answers the keepalive: the peer is alive.
                    self.timers.clear(Timer::Pong);
                    self.heard_from_peer(Instant::now());
                }
                Event::Connected { resumed, .. } => {
                    self.resumed = resumed;
                    self.queue.push_back(event);
                }
                event => self.queue.push_back(event),
            }
        }
    }

    /// Runs the timers due at `now`; returns whether that left bytes to
    /// write. Fails if the keepalive's pong is overdue, the stream then
    /// given up.
    fn run_timers(&mut self, now: Instant) -> Result<bool, TcpError> {
        let mut transmit = false;
        if self.timers.expire(Timer::AckDelay, now) {
            self.link.release_acks();
            transmit = true;
        }
        if let Some(keepalive) = self.options.keepalive {
            if self.timers.expire(Timer::Pong, now) {
                self.lose_stream();
                return Err(TcpError::PongTimeout { waited: keepalive.pong_timeout });
            }
            if self.timers.expire(Timer::Ping, now) && self.link.is_open() {
                // relink 3.4: pings may be sent at will.
                self.link.ping()?;
                self.timers.set(Timer::Pong, now + keepalive.pong_timeout);
                transmit = true;
            }
        }
        Ok(transmit)
    }

    /// Moves bytes both ways, and runs the timers, until `ready` holds or
    /// `deadline` passes. A lost stream fails the call, unless the options
    /// reconnect automatically.
    fn drive_until(
        &mut self,
        deadline: Instant,
        mut ready: impl FnMut(&Self) -> bool,
    ) -> Result<(), TcpError> {
        let mut buf = vec![0; READ_CHUNK];
        loop {
            let flushed = self.flush();
            // What arrived before a failure still counts.
            self.collect_events();
            if ready(self) {
                return Ok(());
            }
            let failed = match flushed.and_then(|()| self.run_timers(Instant::now())) {
                Ok(true) => continue,
                Ok(false) => None,
                Err(error) => Some(error),
            };
            if self.lost {
                match self.recover(deadline) {
                    Ok(()) => continue,
                    Err(TcpError::Disconnected) => {
                        return Err(failed.unwrap_or(TcpError::Disconnected));
                    }
                    Err(error) => return Err(error),
                }
            }
            if let Some(error) = failed {
                return Err(error);
            }
            // Wake for the next timer, or at the deadline.
            let wake = self.timers.next().map_or(deadline, |at| at.min(deadline));
            let n = match read_until(&self.stream, &mut buf, wake) {
                Ok(n) => n,
                Err(TcpError::Timeout) if Instant::now() < deadline => continue,
                Err(TcpError::Timeout) => return Err(TcpError::Timeout),
                Err(error) => {
                    self.lose_stream();
                    if self.auto_reconnect().is_some() {
                        continue;
                    }
                    return Err(error);
                }
            };
            self.heard_from_peer(Instant::now());
            if let Err(error) = self.link.handle_input(&buf[..n]) {
                self.lose_stream();
                if self.auto_reconnect().is_some() {
                    continue;
                }
                return Err(error.into());
            }
        }
    }
}
