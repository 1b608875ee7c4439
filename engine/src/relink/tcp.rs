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

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::link::{
    Accepted, Acceptor, CommandError, ConnectorConfig, Event, HandshakeError, Limits, Link,
    LinkError, Listener, Params,
};
use super::wire::ChannelId;

/// Driver settings. Both peers must use the same `params`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub params: Params,
    pub limits: Limits,
    /// Limit for connecting, the handshake, a blocked send and shutdown.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            params: Params::default(),
            limits: Limits::default(),
            timeout: Duration::from_secs(10),
        }
    }
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

/// One end of a Relink link over TCP.
///
/// A stream that fails (a read or write error, its end, a protocol error)
/// is given up at once: the call that meets the failure reports it, and
/// every later call that needs the stream returns
/// [`TcpError::Disconnected`] without touching it, until
/// [`reconnect`](Self::reconnect) or [`resume`](Self::resume). Messages
/// received before stay readable, and [`send`](Self::send) queues for the
/// resumption.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    link: Link,
    /// Where a connector dials again.
    peer: Option<SocketAddr>,
    timeout: Duration,
    inbox: VecDeque<(ChannelId, u32, Vec<Vec<u8>>)>,
    events: VecDeque<Event>,
    pongs: u64,
    /// Whether the last handshake resumed the link.
    resumed: bool,
    tx: Vec<u8>,
    /// The stream is given up: bytes left in it from a dead connection
    /// must not reach the link as if they came after the failure.
    lost: bool,
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
    let mut conn = Conn::new(stream, link, Some(peer), options.timeout);
    conn.await_open()?;
    Ok(conn)
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
#[derive(Debug)]
pub struct Server {
    tcp: TcpListener,
    instance: Listener,
    options: Options,
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
    pub fn new(tcp: TcpListener, known_names: &[&str], options: Options) -> Self {
        Server {
            tcp,
            instance: Listener::new(known_names.iter().copied(), options.params),
            options,
        }
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
        Ok(Incoming::New(Box::new(Conn::accepted(stream, accepted, &self.options)?)))
    }

    /// Forgets a finished link, so its id is never resumed.
    pub fn forget(&mut self, link_id: u64) {
        self.instance.forget(link_id);
    }
}

impl Conn {
    fn new(stream: TcpStream, link: Link, peer: Option<SocketAddr>, timeout: Duration) -> Self {
        Conn {
            stream,
            link,
            peer,
            timeout,
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            pongs: 0,
            resumed: false,
            tx: Vec::new(),
            lost: false,
        }
    }

    fn accepted(
        stream: TcpStream,
        accepted: Accepted,
        options: &Options,
    ) -> Result<Self, TcpError> {
        let link = Link::accept(accepted, options.limits)?;
        let mut conn = Conn::new(stream, link, None, options.timeout);
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
        let deadline = deadline_after(self.timeout);
        loop {
            match self.link.send(&channel, parts) {
                Ok(seq) => {
                    // The link keeps the message until the peer acknowledges
                    // it; a failed write only loses the stream.
                    let _ = self.flush();
                    return Ok(seq);
                }
                Err(CommandError::Blocked { .. }) => {
                    self.drive_until(deadline, |conn| conn.link.send_window(&channel) > 0)?;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// The next message from the peer's channels, waiting up to `timeout`.
    /// Its consumption is acknowledged.
    pub fn recv(&mut self, timeout: Duration) -> Result<Received, TcpError> {
        let deadline = deadline_after(timeout);
        if self.inbox.is_empty() {
            if self.link.is_done() {
                return Err(TcpError::ShutDown);
            }
            self.drive_until(deadline, |conn| !conn.inbox.is_empty())?;
        }
        let Some((channel, seq, parts)) = self.inbox.pop_front() else {
            return Err(TcpError::Timeout);
        };
        // Cannot fail: the message came from the link and is consumed once.
        let _ = self.link.consume(&channel, seq);
        if !self.link.is_done() {
            // A failed write loses the stream, which the next call reports;
            // the message is the caller's either way.
            let _ = self.flush();
        }
        Ok((channel, parts))
    }

    /// Pings the peer and waits for the pong; returns the round-trip time.
    pub fn ping(&mut self, timeout: Duration) -> Result<Duration, TcpError> {
        if self.lost {
            return Err(TcpError::Disconnected);
        }
        let start = Instant::now();
        let seen = self.pongs;
        self.link.ping()?;
        self.drive_until(deadline_after(timeout), |conn| conn.pongs > seen)?;
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

    /// The limit of blocked sends and of shutdown from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Events other than messages and pongs (commits, closures, ...).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Sends shutdown and waits for the peer's (relink 3.6), then closes the
    /// stream gracefully. Messages that arrived meanwhile stay readable
    /// with [`recv`](Self::recv).
    pub fn shutdown(&mut self) -> Result<(), TcpError> {
        let deadline = deadline_after(self.timeout);
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
    /// unacknowledged was discarded with the old link).
    pub fn reconnect(&mut self) -> Result<bool, TcpError> {
        let peer = self.peer.ok_or(TcpError::NotConnector)?;
        self.lose_stream();
        let stream = dial(peer, self.timeout)?;
        prepare(&stream, self.timeout)?;
        self.link.reconnect(false)?;
        self.stream = stream;
        self.lost = false;
        self.await_open()?;
        Ok(self.resumed)
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
        self.flush()
    }

    /// Gives the stream up: nothing more is written to it or read from it.
    fn lose_stream(&mut self) {
        self.lost = true;
        self.link.stream_lost();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn await_open(&mut self) -> Result<(), TcpError> {
        let deadline = deadline_after(self.timeout);
        self.resumed = false;
        self.drive_until(deadline, |conn| conn.link.is_open())
    }

    fn flush(&mut self) -> Result<(), TcpError> {
        if self.lost {
            return Ok(());
        }
        self.tx.clear();
        self.link.poll_transmit(&mut self.tx);
        if self.tx.is_empty() {
            return Ok(());
        }
        if let Err(error) = self.stream.write_all(&self.tx) {
            self.lose_stream();
            return Err(error.into());
        }
        Ok(())
    }

    fn collect_events(&mut self) {
        while let Some(event) = self.link.poll_event() {
            match event {
                Event::Message { channel, seq, parts } => {
                    self.inbox.push_back((channel, seq, parts))
                }
                Event::Pong => self.pongs += 1,
                Event::Connected { resumed, .. } => {
                    self.resumed = resumed;
                    self.events.push_back(event);
                }
                event => self.events.push_back(event),
            }
        }
    }

    /// Moves bytes both ways until `ready` holds or `deadline` passes.
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
            flushed?;
            if self.lost {
                return Err(TcpError::Disconnected);
            }
            let n = match read_until(&self.stream, &mut buf, deadline) {
                Ok(n) => n,
                Err(TcpError::Timeout) => return Err(TcpError::Timeout),
                Err(error) => {
                    self.lose_stream();
                    return Err(error);
                }
            };
            if let Err(error) = self.link.handle_input(&buf[..n]) {
                self.lose_stream();
                return Err(error.into());
            }
        }
    }
}
