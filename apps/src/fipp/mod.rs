//! `efapoll pingpong --peer fi_pingpong`: a pingpong with libfabric's
//! fi_pingpong (1.17, util/pingpong.c) on the other end, `-e rdm`.
//!
//! fi_pingpong's control link is its own ([`proto`]): a TCP connection on
//! port 47592 where the sides trade endpoint names (length, address
//! format, the 32-byte EFA address), then before each size a sync ("q",
//! "a") and after it the client's count of received messages ("cnt ok").
//! Its data are plain messages (tagged with 1234 with `-m tagged`, here
//! `-o tagged`), one each way per iteration, the client first; with `-c`
//! each carries pp_fill_buf's pattern. The run ends with a "fin" message
//! each way. One endpoint, on the calling thread; nothing of efapoll's own
//! control link (Relink) or flows.

pub mod proto;

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use efapoll::device::{Access, Device, Mr};
use efapoll::endpoint::{Completion, Endpoint, Op, PeerId, Span, Status, TagMatch};
use efapoll::wire::RawAddr;

use crate::bench::RunError;
use proto::{Ctrl, Pattern, Role, SizeSpec};

/// fi_pingpong's tag (pingpong.c `TAG`), with `-m tagged`.
const TAG: u64 = 1234;

/// Completion contexts.
const CTX_TX: u64 = 1;
const CTX_RX: u64 = 2;

/// How long a finished side keeps serving its device for the peer's last
/// acknowledgements, at most, once the peer has not closed the link.
const LINGER: Duration = Duration::from_secs(2);

/// What a run is asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// The server's host (the client's role), or None: serve.
    pub host: Option<String>,
    pub port: u16,
    /// The address a server listens on.
    pub bind: IpAddr,
    pub sizes: SizeSpec,
    pub iterations: u64,
    pub verify: bool,
    pub tagged: bool,
    /// Nothing moving for this long fails the run.
    pub timeout: Duration,
}

/// The endpoint's configuration: the provider's thresholds, and the
/// run's timeout for a transfer that waits on the peer (a large one on a
/// loaded host, under softefa, took over the default 5 s).
pub fn config(o: &Options) -> efapoll::endpoint::Config {
    efapoll::endpoint::Config { response_timeout: o.timeout, ..Default::default() }
}

/// The control link, connected: the client's to the server, the
/// server's once one client came. The TCP address the link uses here,
/// for a udp device to bind.
pub fn connect(o: &Options) -> Result<(Ctrl<TcpStream>, IpAddr), RunError> {
    let setup = |what: &str, e: std::io::Error| RunError::Setup(format!("{what}: {e}"));
    let (stream, role) = match &o.host {
        Some(host) => {
            let addrs: Vec<SocketAddr> =
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), o.port))
                    .map_err(|e| setup(&format!("resolving {host}"), e))?
                    .collect();
            let deadline = Instant::now() + o.timeout;
            // The server may not listen yet: retry until the timeout.
            let stream = loop {
                match addrs.iter().find_map(|a| TcpStream::connect(a).ok()) {
                    Some(s) => break s,
                    None if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    None => {
                        return Err(RunError::Setup(format!(
                            "no fi_pingpong server answers at {host}:{}",
                            o.port
                        )));
                    }
                }
            };
            (stream, Role::Client)
        }
        None => {
            let listener = TcpListener::bind((o.bind, o.port))
                .map_err(|e| setup(&format!("listening on {}:{}", o.bind, o.port), e))?;
            eprintln!("efapoll pingpong: waiting for fi_pingpong on port {}", o.port);
            let (stream, _) = listener.accept().map_err(|e| setup("accepting", e))?;
            (stream, Role::Server)
        }
    };
    stream.set_nodelay(true).map_err(|e| setup("TCP_NODELAY", e))?;
    stream.set_read_timeout(Some(o.timeout)).map_err(|e| setup("SO_RCVTIMEO", e))?;
    let ip = stream
        .local_addr()
        .map(|a| a.ip().to_canonical())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    Ok((Ctrl { stream, role }, ip))
}

/// The data half: one endpoint, its peer, its two buffers.
pub struct Pp<D: Device> {
    ep: Endpoint<D>,
    peer: PeerId,
    tx: Mr,
    rx: Mr,
    /// Every receive takes the whole buffer, as fi_pingpong's.
    rx_len: u64,
    tagged: bool,
    verify: bool,
    fill: Pattern,
    check: Pattern,
    /// Copies in and out of registered memory (reached only by copies).
    staged: Vec<u8>,
    timeout: Duration,
    /// Sends posted and not completed: a send's buffer is reused only
    /// once it completes, and nothing waits for one otherwise (a peer
    /// blocked on the control link may acknowledge late: fi_pingpong under
    /// softefa is acknowledged for by its progress thread, a millisecond
    /// or more after its last poll).
    tx_pending: u32,
    /// The receive that completed, not yet taken.
    received: Option<u64>,
}

fn engine(what: &str, e: impl std::fmt::Display) -> RunError {
    RunError::Engine(format!("{what}: {e}"))
}

impl<D: Device> Pp<D> {
    fn post_recv(&mut self) -> Result<(), RunError> {
        let dst = Span::new(&self.rx, 0, self.rx_len);
        let r = if self.tagged {
            self.ep.trecv(dst, TagMatch { tag: TAG, ignore: 0 }, None, CTX_RX)
        } else {
            self.ep.recv(dst, None, CTX_RX)
        };
        r.map_err(|e| engine("posting a receive", e))
    }

    /// Sends `size` bytes of the TX buffer, retrying what the endpoint
    /// pushes back.
    fn send(&mut self, size: u64) -> Result<(), RunError> {
        let src = Span::new(&self.tx, 0, size);
        let deadline = Instant::now() + self.timeout;
        loop {
            let r = if self.tagged {
                self.ep.tsend(self.peer, src, TAG, CTX_TX)
            } else {
                self.ep.send(self.peer, src, CTX_TX)
            };
            match r {
                Ok(()) => {
                    self.tx_pending += 1;
                    self.ep.flush();
                    return Ok(());
                }
                Err(efapoll::endpoint::Error::Again) if Instant::now() < deadline => {
                    self.progress()?;
                }
                Err(e) => return Err(engine("sending", e)),
            }
        }
    }

    /// One pass of the progress loop; notes what completed.
    fn progress(&mut self) -> Result<bool, RunError> {
        let mut did = self.ep.progress();
        while let Some(c) = self.ep.poll_cq() {
            did = true;
            self.complete(&c)?;
        }
        Ok(did)
    }

    fn complete(&mut self, c: &Completion) -> Result<(), RunError> {
        if c.status != Status::Ok {
            return Err(match c.status {
                Status::Truncated { olen } => RunError::Verify(format!(
                    "a {olen}-byte message arrived in a {}-byte receive",
                    self.rx_len
                )),
                Status::PeerUnreachable => RunError::PeerGone(format!("a {:?} failed", c.op)),
                s => RunError::Engine(format!("{:?} completed with {s:?}", c.op)),
            });
        }
        match (c.op, c.ctx) {
            (Op::Send, CTX_TX) if self.tx_pending > 0 => self.tx_pending -= 1,
            (Op::Recv, CTX_RX) if self.received.is_none() => self.received = Some(c.len),
            (Op::Recv, CTX_RX) => {
                return Err(RunError::Verify("two messages arrived where one was due".into()));
            }
            (op, ctx) => {
                return Err(RunError::Engine(format!("an unexpected {op:?} completion ({ctx})")));
            }
        }
        Ok(())
    }

    /// Progresses until every send has completed and, with `recv`, a
    /// receive has: returns the received length.
    fn wait(&mut self, recv: bool) -> Result<Option<u64>, RunError> {
        let mut last = Instant::now();
        loop {
            if self.tx_pending == 0 && (!recv || self.received.is_some()) {
                // A message that came while only sends were waited for
                // stays for the receive that waits for it.
                return Ok(if recv { self.received.take() } else { None });
            }
            if self.progress()? {
                last = Instant::now();
            } else if last.elapsed() > self.timeout {
                return Err(RunError::Timeout(format!(
                    "nothing moved for {} s (waiting for {})",
                    self.timeout.as_secs(),
                    if self.tx_pending > 0 { "a send to complete" } else { "a message" }
                )));
            }
        }
    }

    /// Waits for the next message.
    fn wait_recv(&mut self) -> Result<u64, RunError> {
        let mut last = Instant::now();
        loop {
            if let Some(len) = self.received.take() {
                return Ok(len);
            }
            if self.progress()? {
                last = Instant::now();
            } else if last.elapsed() > self.timeout {
                let s = self.timeout.as_secs();
                return Err(RunError::Timeout(format!("no message for {s} s")));
            }
        }
    }

    /// pp_tx: fills the buffer (with -c) once the last send from it is
    /// done, and sends.
    fn tx(&mut self, size: u64) -> Result<(), RunError> {
        if self.tx_pending > 0 {
            self.wait(false)?;
        }
        if self.verify {
            self.staged.resize(size as usize, 0);
            self.fill.fill(&mut self.staged);
            self.ep.write_mem(self.tx.id, 0, &self.staged).map_err(|e| engine("filling", e))?;
        }
        self.send(size)
    }

    /// pp_rx: waits for the message, checks it (with -c), reposts.
    fn rx(&mut self, size: u64) -> Result<(), RunError> {
        let len = self.wait_recv()?;
        if len != size {
            return Err(RunError::Verify(format!("received {len} bytes, expected {size}")));
        }
        if self.verify {
            self.staged.resize(size as usize, 0);
            self.ep.read_mem(self.rx.id, 0, &mut self.staged).map_err(|e| engine("reading", e))?;
            if let Some(at) = self.check.check(&self.staged) {
                return Err(RunError::Verify(format!(
                    "size {size}: byte {at} is not fi_pingpong's pattern"
                )));
            }
        }
        self.post_recv()
    }

    /// Runs `f` on the control link while the endpoint keeps moving: the
    /// peer's device may wait for our acknowledgements (EFA's come from
    /// the NIC, whatever the process does).
    fn on_link<T>(
        &mut self,
        ctrl: &Ctrl<TcpStream>,
        f: impl FnOnce(&mut Ctrl<Polled<'_, D>>) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        ctrl.stream.set_nonblocking(true)?;
        let timeout = self.timeout;
        let stream = Polled { stream: &ctrl.stream, pp: self, timeout };
        let r = f(&mut Ctrl { stream, role: ctrl.role });
        ctrl.stream.set_nonblocking(false)?;
        r
    }

    /// pp_finalize: "fin" each way, then serves the device until the peer
    /// closes the link (its own "fin" went through) or [`LINGER`] passes.
    fn finish(&mut self, ctrl: &mut Ctrl<TcpStream>) -> Result<(), RunError> {
        self.wait(false)?;
        self.ep.write_mem(self.tx.id, 0, proto::FIN).map_err(|e| engine("filling", e))?;
        self.send(proto::FIN.len() as u64)?;
        // Only its length is fi_pingpong's: it writes "fin" into its
        // buffer's message prefix, which the provider skips, so the bytes
        // sent are whatever followed (and nobody checks them).
        let len = self.wait(true)?.unwrap_or_default();
        if len != proto::FIN.len() as u64 {
            return Err(RunError::Verify(format!("the last message has {len} bytes, not 4 (fin)")));
        }
        let _ = ctrl.stream.shutdown(std::net::Shutdown::Write);
        let _ = ctrl.stream.set_nonblocking(true);
        let until = Instant::now() + LINGER;
        let mut byte = [0; 1];
        while Instant::now() < until {
            match ctrl.stream.read(&mut byte) {
                Ok(0) => break,
                Err(e) if e.kind() != ErrorKind::WouldBlock => break,
                _ => {}
            }
            self.progress()?;
        }
        Ok(())
    }
}

/// The control link, non-blocking, with the endpoint progressed while it
/// has nothing to read.
pub struct Polled<'a, D: Device> {
    stream: &'a TcpStream,
    pp: &'a mut Pp<D>,
    timeout: Duration,
}

impl<D: Device> Polled<'_, D> {
    fn retry<T>(
        &mut self,
        mut op: impl FnMut(&TcpStream) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let start = Instant::now();
        loop {
            match op(self.stream) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.pp.progress().map_err(|e| std::io::Error::other(e.to_string()))?;
                    if start.elapsed() > self.timeout {
                        return Err(ErrorKind::TimedOut.into());
                    }
                }
                r => return r,
            }
        }
    }
}

impl<D: Device> Read for Polled<'_, D> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.retry(|mut s| s.read(buf))
    }
}

impl<D: Device> Write for Polled<'_, D> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.retry(|mut s| s.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs the whole exchange over `ep`, the link connected: prints
/// fi_pingpong's table (the server prints the client's count as #ack).
pub fn run<D: Device>(
    mut ep: Endpoint<D>,
    mut ctrl: Ctrl<TcpStream>,
    o: &Options,
) -> Result<(), RunError> {
    let link = |e: std::io::Error| RunError::PeerGone(format!("the control link: {e}"));
    let buf_len = o.sizes.tx_size().max(proto::MAX_CTRL_MSG);
    let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let tx =
        ep.register(buf_len, access).map_err(|e| RunError::Setup(format!("registering: {e}")))?;
    let rx =
        ep.register(buf_len, access).map_err(|e| RunError::Setup(format!("registering: {e}")))?;
    let name = ep.addr().to_bytes();
    let (format, peer_name) = ctrl.exchange_names(proto::FI_ADDR_EFA, &name).map_err(link)?;
    if format != proto::FI_ADDR_EFA {
        return Err(RunError::Mismatch(format!(
            "the peer's address format is {format}, not FI_ADDR_EFA ({}): is it -p efa?",
            proto::FI_ADDR_EFA
        )));
    }
    let addr = RawAddr::from_bytes(&peer_name)
        .map_err(|e| RunError::Setup(format!("the peer's name {peer_name:02x?}: {e}")))?;
    let peer =
        ep.insert_peer(&addr).map_err(|e| RunError::Setup(format!("inserting the peer: {e}")))?;
    let mut pp = Pp {
        ep,
        peer,
        tx,
        rx,
        rx_len: buf_len,
        tagged: o.tagged,
        verify: o.verify,
        fill: Pattern::default(),
        check: Pattern::default(),
        staged: Vec::new(),
        timeout: o.timeout,
        tx_pending: 0,
        received: None,
    };
    pp.post_recv()?;
    let result = pp.exchange(&mut ctrl, o);
    // What the engine and device saw, on stderr: which protocols the run
    // took, and on a failure the first clue to a difference.
    {
        let mut counters = pp.ep.counters().nonzero();
        let device = pp.ep.device().counters().into_iter().filter(|&(_, n)| n > 0);
        counters.extend(device.map(|(name, n)| (format!("device.{name}"), n)));
        let line: Vec<String> = counters.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!("efapoll pingpong: counters: {}", line.join(" "));
    }
    result
}

impl<D: Device> Pp<D> {
    /// The sizes, then "fin".
    fn exchange(&mut self, ctrl: &mut Ctrl<TcpStream>, o: &Options) -> Result<(), RunError> {
        let link = |e: std::io::Error| RunError::PeerGone(format!("the control link: {e}"));
        let pp = self;
        println!("{}", proto::perf_header());
        let client = ctrl.role == Role::Client;
        for size in o.sizes.sizes() {
            pp.on_link(ctrl, |c| c.sync()).map_err(link)?;
            let start = Instant::now();
            for _ in 0..o.iterations {
                if client {
                    pp.tx(size)?;
                    pp.rx(size)?;
                } else {
                    pp.rx(size)?;
                    pp.tx(size)?;
                }
            }
            let elapsed_us = start.elapsed().as_micros() as u64;
            let acked = pp.on_link(ctrl, |c| c.count(o.iterations)).map_err(link)?;
            if o.iterations > 0 {
                println!("{}", proto::perf_row(size, o.iterations, acked, elapsed_us.max(1)));
            }
        }
        pp.finish(ctrl)
    }
}
