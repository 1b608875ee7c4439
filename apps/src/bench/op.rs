//! The operation a benchmark moves data with (`-o`), the endpoint calls
//! behind it, and the byte patterns `-c` verifies.
//!
//! Two-sided operations (send, tagged, smbd) move messages the peer
//! receives; smbd frames each as SMB Direct data transfer (MS-SMBD) over
//! an [`efapoll::ulp::smbd::Connection`], whose events come back here as
//! the completions a send would have.
//! One-sided ones (write, read, atomic) reach the peer's registered buffer,
//! whose descriptor came with the peer's card; the peer's application
//! hears of none of them (but of a write with CQ data), so a one-sided run
//! ends each size with a *fence*: an 8-byte control message to the target,
//! which checks and readies its buffer, and the target's 8-byte ack.

use std::collections::VecDeque;

use clap::ValueEnum;
use efapoll::device::{Access, Device, DeviceError, Mr, MrId};
use efapoll::endpoint::{
    AtomicOp, Completion, Config, Datatype, Endpoint, Error, Op, PeerId, Span, Status, TagMatch,
};
use efapoll::ulp::smbd::{
    self, Connection, Drained, Event, Flow, ProtocolError, RecvStatus, SendStatus,
};
use efapoll::wire::RmaIov;

use super::oob::MemDesc;
use super::{Params, RunError};

/// What `-o` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpKind {
    /// Untagged send/recv.
    Send,
    /// Tagged send/recv.
    Tagged,
    /// RDMA write into the peer's buffer (pingpong: with CQ data, which
    /// tells the peer it landed).
    Write,
    /// RDMA read from the peer's buffer (pingpong times whole reads).
    Read,
    /// Fetch-add on a u64 in the peer's buffer (-S 8 only).
    Atomic,
    /// Untagged messages framed as SMB Direct data transfer (MS-SMBD
    /// 3.1.5.4): segments of at most the largest size + 24 bytes (1 MiB +
    /// 24 at most), a window of credits, reassembly into the receive buffer
    /// (-c checks the reassembled message). Sizes from 1 B.
    Smbd,
}

/// The tag of every tagged message: one flow per endpoint, so one tag.
const TAG: u64 = 0xefa9_0000_0000_0001;

/// The operand of every fetch-add: bits in both halves, so an add that
/// loses either half of the word shows in the counter.
pub const ATOMIC_ADD: u64 = (1 << 32) + 1;

/// Bytes of a fence or ack message.
pub const CTL_LEN: u64 = 8;

/// EFA carries 32 bits of CQ data with an RDMA write (the immediate).
const CQ_DATA_MASK: u64 = u32::MAX as u64;

/// The layout of each endpoint's control region: the atomic operand, the
/// control message sent, the one received.
const OPERAND_AT: u64 = 0;
const CTL_TX_AT: u64 = 8;
const CTL_RX_AT: u64 = 16;
const CTL_REGION: u64 = 24;

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Send => "send",
            OpKind::Tagged => "tagged",
            OpKind::Write => "write",
            OpKind::Read => "read",
            OpKind::Atomic => "atomic",
            OpKind::Smbd => "smbd",
        }
    }

    /// Whether the peer's application takes no part in the operation.
    pub fn is_one_sided(self) -> bool {
        matches!(self, OpKind::Write | OpKind::Read | OpKind::Atomic)
    }

    /// Whether the operation fills the local buffer (read, the fetched
    /// value of an atomic) rather than sending from it.
    pub fn lands_here(self) -> bool {
        matches!(self, OpKind::Read | OpKind::Atomic)
    }

    /// Whether pingpong's responder answers each message (send, write);
    /// a read or an atomic is a round trip by itself.
    pub fn echoes(self) -> bool {
        !self.lands_here()
    }

    /// Timed legs per pingpong iteration: latency is the round trip over
    /// this. There and back for send and write (half round trips); a read
    /// or an atomic is reported whole, as perftest's ib_read_lat and
    /// ib_atomic_lat do.
    pub fn legs(self) -> u64 {
        if self.echoes() { 2 } else { 1 }
    }

    /// What pingpong's times are.
    pub fn latency_label(self) -> &'static str {
        if self.echoes() { "half round trip" } else { "whole round trip" }
    }

    /// The completion of one of this side's data operations.
    pub fn local_op(self) -> Op {
        match self {
            OpKind::Send | OpKind::Tagged | OpKind::Smbd => Op::Send,
            OpKind::Write => Op::Write,
            OpKind::Read => Op::Read,
            OpKind::Atomic => Op::Atomic,
        }
    }

    /// The endpoint configuration for the operation over a device whose
    /// defaults are `base`.
    pub fn config(self, base: Config) -> Config {
        // Writes, reads and atomics wait for the peer's HANDSHAKE: ask for
        // it as soon as the peer is known.
        Config { handshake_on_insert: self.is_one_sided(), ..base }
    }

    #[inline(always)]
    fn post_send<D: Device>(
        self,
        ep: &mut Endpoint<D>,
        peer: PeerId,
        src: Span,
        ctx: u64,
    ) -> Result<(), Error> {
        match self {
            OpKind::Tagged => ep.tsend(peer, src, TAG, ctx),
            // A one-sided run's messages are its untagged fences and acks.
            _ => ep.send(peer, src, ctx),
        }
    }

    #[inline(always)]
    fn post_recv<D: Device>(self, ep: &mut Endpoint<D>, dst: Span, ctx: u64) -> Result<(), Error> {
        match self {
            OpKind::Tagged => ep.trecv(dst, TagMatch { tag: TAG, ignore: 0 }, None, ctx),
            _ => ep.recv(dst, None, ctx),
        }
    }
}

/// The largest segment an smbd run sends, header included: a message of
/// up to 1 MiB goes in one.
const SMBD_SEGMENT_MAX: u64 = (1 << 20) + smbd::DEFAULT_DATA_OFFSET as u64;

/// The credits an smbd run negotiates, memory permitting: 255, MS-SMBD's
/// ReceiveCreditMax and the Linux client's, whatever the window. A
/// receiver grants credits back once it has handled and reposted about
/// half of them, and sees a sender's request for more only behind the
/// messages sent before it: a sender holding no more credits than it
/// keeps messages in flight (the window, as this once was) runs out on
/// every grant while a plain sender streams on.
const SMBD_CREDITS: u64 = 255;

/// The most memory an smbd run's receives take, per side.
const SMBD_RECEIVE_BYTES: u64 = 64 << 20;

/// What both sides of an smbd run negotiate, from the run's parameters
/// alone (both sides have the same): segments that hold the largest
/// message (1 MiB at most), messages up to the largest size, and
/// [`SMBD_CREDITS`] credits, fewer where the receives would take over
/// 64 MiB.
pub fn smbd_params(p: &Params) -> smbd::Params {
    let largest = p.max_size().max(CTL_LEN);
    let segment = (largest + smbd::DEFAULT_DATA_OFFSET as u64).min(SMBD_SEGMENT_MAX);
    let by_memory = (SMBD_RECEIVE_BYTES / segment).max(4);
    let credits = SMBD_CREDITS.min(by_memory) as u16;
    let max_message = u32::try_from(largest).unwrap_or(u32::MAX);
    smbd::Params::symmetric(segment as u32, max_message, credits)
}

/// The local settings of an smbd run's connection: room for the buffers
/// streaming's receiver keeps posted ([`Params::depth_for`]), and messages
/// shorter than those the connection places in their buffers lent where
/// they land (no copy either way).
fn smbd_config(p: &Params) -> smbd::Config {
    let depth = p.sizes.iter().map(|&s| p.depth_for(s)).max().unwrap_or(1);
    let recv_queue = depth.clamp(1, u16::MAX as u64) as u16;
    let default = smbd::Config::default();
    smbd::Config {
        recv_queue: recv_queue.max(default.recv_queue),
        lend_max: default.direct_min - 1,
        ..default
    }
}

/// An endpoint, its one peer, and the operation to use.
#[derive(Debug)]
pub struct Io<D: Device> {
    pub ep: Endpoint<D>,
    pub peer: PeerId,
    pub op: OpKind,
    /// The peer's data buffer, which one-sided operations reach.
    remote: MemDesc,
    /// The atomic operand and the control messages.
    ctl: Mr,
    /// Bytes of registered memory copied out to be checked, or in to be
    /// filled, with `-c` (registered memory is reached only by copies).
    staged: Vec<u8>,
    /// `-o smbd`: what the sides negotiate, and the connection once the
    /// peer is known.
    smbd: Option<(smbd::Params, Option<Connection>)>,
    smbd_config: smbd::Config,
    /// Why the SMB Direct connection failed, once `poll_cq` met it, or
    /// why an operation was refused.
    failure: Option<RunError>,
    /// The completion `poll_smbd` found, on its way to `poll_cq`'s caller.
    smbd_ready: Option<Completion>,
    /// `-o smbd`: messages [`Io::post_streamed`] sent by inject, done as
    /// they went with no completion, since [`Io::take_injected`].
    injected: u64,
    /// `-o smbd`: messages lent and the receives they complete (boxed:
    /// the other operations' fields stay as close together as without).
    lending: Box<Lending>,
}

/// `-o smbd`'s lent messages and, with `-c`, the receives posted for
/// them. Without `-c` a message the connection lends needs no receive of
/// the application's: SMB Direct's receives are the connection's own,
/// which its credits count. Such a receive is taken at once, keeps
/// nothing, and the lent message completes one (its ctx 0), read where
/// it landed: a receiver of a stream is then what an SMB Direct consumer
/// is, and pays for no queue of receives that only stand in for the
/// connection's.
#[derive(Debug)]
struct Lending {
    /// With `-c`: receives posted for messages the connection lends (as
    /// it will: they are short and in one segment), oldest first.
    to: VecDeque<(Span, u64)>,
    /// With `-c`: messages lent before their receive was posted, oldest
    /// first.
    lent: VecDeque<(smbd::Loan, Span)>,
    /// With `-c`: a lent message is copied into its receive's buffer, to
    /// be checked there.
    copy: bool,
    /// The longest message the connection lends: its `lend_max`, or what
    /// one segment carries if less.
    max: u64,
}

impl<D: Device> Io<D> {
    /// An endpoint whose peer is not known yet, for a run of `params`.
    pub fn new(mut ep: Endpoint<D>, op: OpKind, params: &Params) -> Result<Io<D>, RunError> {
        let ctl = register(&mut ep, CTL_REGION)?;
        ep.write_mem(ctl.id, OPERAND_AT, &ATOMIC_ADD.to_le_bytes())
            .map_err(|e| RunError::Setup(format!("cannot write the atomic operand: {e}")))?;
        let remote = MemDesc { addr: 0, key: 0, len: 0 };
        let smbd = (op == OpKind::Smbd).then(|| (smbd_params(params), None));
        let peer = PeerId(u32::MAX);
        let staged = Vec::new();
        let smbd_config = smbd_config(params);
        let failure = None;
        let credits = smbd.as_ref().map_or(0, |(p, _)| p.receive_credit_max as usize);
        let lending = Box::new(Lending {
            to: VecDeque::with_capacity(smbd_config.recv_queue as usize),
            lent: VecDeque::with_capacity(credits),
            copy: params.verify,
            max: smbd.as_ref().map_or(0, |(p, _)| {
                let segment = p.max_receive_size as u64 - smbd::DEFAULT_DATA_OFFSET as u64;
                smbd_config.lend_max.min(segment)
            }),
        });
        Ok(Io {
            ep,
            peer,
            op,
            remote,
            ctl,
            staged,
            smbd,
            smbd_config,
            failure,
            smbd_ready: None,
            injected: 0,
            lending,
        })
    }

    /// Progresses the endpoint, and the SMB Direct connection over it.
    #[inline]
    pub fn progress(&mut self) -> bool {
        // The connection's first: what the endpoint lands now is then left
        // to the step's drain, which lends it, not taken by the
        // connection's progress.
        let did = match &mut self.smbd {
            Some((_, Some(conn))) => conn.progress(&mut self.ep),
            _ => false,
        };
        did | self.ep.progress()
    }

    /// Posts what was built now (see `Endpoint::flush`).
    #[inline]
    pub fn flush(&mut self) {
        self.ep.flush();
    }

    /// The next completion: the endpoint's, or with `-o smbd` the
    /// connection's events as the completions a send would have made.
    /// None also once the connection has failed: a step's poll loop is
    /// followed by [`Io::failure`], which says why.
    // Always inlined, as are `post` and `recv`, and no `Result`: a call,
    // or a `Result` around the completion, moves it through the stack
    // more than once. smbd's path goes out of line and hands its
    // completion back through `self`: returned by the call, it would
    // share the result with the endpoint's, whose fields would then go
    // through the stack too.
    #[inline(always)]
    pub fn poll_cq(&mut self) -> Option<Completion> {
        let Some((_, conn)) = &self.smbd else { return self.ep.poll_cq() };
        // Nothing waits, as most polls of a busy loop find: told in line.
        let waiting = conn.as_ref().is_some_and(|c| c.has_work(&self.ep));
        if !waiting && self.ep.cq_len() == 0 && self.lending.lent.is_empty() {
            return None;
        }
        self.poll_smbd();
        self.smbd_ready.take()
    }

    /// Hands `f` each completion waiting, as [`Io::poll_cq`] would, until
    /// there is none or `f` fails; whether there was any. Then
    /// [`Io::failure`], as after `poll_cq`. The endpoint's completions are
    /// read where they lie, and `f`, which has no way back to the
    /// endpoint, lets the loop keep the queue's place in registers (a
    /// `poll_cq` loop whose body may reach the endpoint reads it again for
    /// every completion).
    #[inline(always)]
    pub fn drain_cq<E>(
        &mut self,
        mut f: impl FnMut(&Completion) -> Result<(), E>,
    ) -> Result<bool, E> {
        if self.smbd.is_some() {
            return self.drain_smbd(f);
        }
        let mut failed = None;
        let taken = self.ep.poll_cq_with(|c| match f(c) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        });
        match failed {
            None => Ok(taken > 0),
            Some(e) => Err(e),
        }
    }

    /// [`Io::drain_cq`] of `-o smbd`: the connection's events handed to
    /// `f` as they come (`Connection::drain`), as the completions a send
    /// would have made; a lent message read there and given back.
    #[inline(always)]
    fn drain_smbd<E>(
        &mut self,
        mut f: impl FnMut(&Completion) -> Result<(), E>,
    ) -> Result<bool, E> {
        let mut any = false;
        loop {
            let Io { ep, peer, smbd, lending, failure, .. } = self;
            let (Some((_, Some(conn))), None, true) = (smbd, &failure, lending.lent.is_empty())
            else {
                // Not connected, failed, or messages lent before their
                // receives were posted: one at a time.
                while let Some(c) = self.poll_cq() {
                    any = true;
                    f(&c)?;
                }
                return Ok(any);
            };
            let (peer, lending) = (*peer, &mut **lending);
            let (mut failed, mut slow) = (None, None);
            conn.drain(ep, |ep, d| {
                any = true;
                // Taken out of the arms, `f` is inlined once in the loop.
                let mut got = None;
                let flow = hand_drained(ep, peer, lending, failure, &mut slow, d, |c| {
                    got = Some(*c);
                    Flow::Next
                });
                let Some(c) = got else { return flow };
                match f(&c) {
                    Ok(()) => Flow::Next,
                    Err(e) => {
                        failed = Some(e);
                        Flow::Stop
                    }
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            let Some(e) = slow else { return Ok(any) };
            match smbd_completion(e, conn.error(), peer) {
                Ok(Some(c)) => f(&c)?,
                Ok(None) => {}
                Err(e) => {
                    self.failure = Some(e);
                    return Ok(any);
                }
            }
        }
    }

    /// Leaves the next completion of `-o smbd` in `smbd_ready`.
    #[inline(never)]
    fn poll_smbd(&mut self) {
        if !matches!(self.smbd, Some((_, Some(_)))) {
            self.smbd_ready = self.ep.poll_cq();
            return;
        }
        if self.failure.is_some() {
            return;
        }
        debug_assert!(self.smbd_ready.is_none(), "taken by each poll");
        // A drain that stops at its first completion, left in `smbd_ready`
        // where it is made (not copied out of a closure's local): a message
        // lent is read where it landed and its receive posted again at once
        // (`Connection::drain`), where the loop below, event by event,
        // gives it back to be posted again by the next progress.
        while self.lending.lent.is_empty() {
            let Io { ep, peer, smbd: Some((_, Some(conn))), lending, failure, smbd_ready, .. } =
                self
            else {
                unreachable!("connected")
            };
            let (peer, lending) = (*peer, &mut **lending);
            let mut slow = None;
            conn.drain(ep, |ep, d| {
                hand_drained(ep, peer, lending, failure, &mut slow, d, |c| {
                    *smbd_ready = Some(*c);
                    Flow::Stop
                })
            });
            let Some(e) = slow else { return };
            match smbd_completion(e, conn.error(), peer) {
                // Nothing to report: drained on.
                Ok(None) => {}
                Ok(c) => {
                    *smbd_ready = c;
                    return;
                }
                Err(e) => {
                    *failure = Some(e);
                    return;
                }
            }
        }
        let Some((_, Some(conn))) = &mut self.smbd else { unreachable!("connected") };
        let (ep, peer, lending) = (&mut self.ep, self.peer, &mut *self.lending);
        let done = loop {
            // A message lent before its receive was posted completes the
            // oldest receive posted since.
            if !lending.lent.is_empty()
                && let Some(to) = lending.to.pop_front()
                && let Some((loan, data)) = lending.lent.pop_front()
            {
                break lent_completion(ep, conn, to, lending.copy, loan, data, peer).map(Some);
            }
            let Some(e) = conn.poll_event() else {
                match ep.poll_cq() {
                    None => break Ok(None),
                    Some(c) if !conn.handle_completion(ep, &c) => break Ok(Some(c)),
                    Some(_) => continue,
                }
            };
            // A message sent and one lent, as a stream has them, before
            // the others.
            match e {
                Event::Sent { ctx, status: SendStatus::Ok } => break Ok(Some(sent(ctx, peer))),
                Event::Lent { loan, data, .. } if !lending.copy => {
                    break give_back(conn, loan).map(|()| Some(lent_unkept(data, peer)));
                }
                Event::Lent { loan, data, .. } => {
                    if lending.lent.is_empty()
                        && let Some(to) = lending.to.pop_front()
                    {
                        break lent_completion(ep, conn, to, lending.copy, loan, data, peer)
                            .map(Some);
                    }
                    lending.lent.push_back((loan, data));
                }
                e => match smbd_completion(e, conn.error(), peer) {
                    Ok(None) => {}
                    c => break c,
                },
            }
        };
        match done {
            Ok(c) => self.smbd_ready = c,
            Err(e) => {
                self.smbd_ready = None;
                self.failure = Some(e);
            }
        }
    }

    /// Fails the step if `poll_cq` stopped at the SMB Direct connection's
    /// failure, or the endpoint refused an operation.
    #[inline(always)]
    pub fn failure(&mut self) -> Result<(), RunError> {
        // Looked at before it is taken: no store when there is none.
        match self.failure.is_some() {
            false => Ok(()),
            true => Err(self.failure.take().expect("a failure")),
        }
    }

    /// A copy of `len` bytes of `mr` from `at`, to check.
    pub fn copy_out(&mut self, mr: MrId, at: u64, len: u64) -> &[u8] {
        self.staged.resize(self.staged.len().max(len as usize), 0);
        let out = &mut self.staged[..len as usize];
        self.ep.read_mem(mr, at, out).expect("a span of a buffer this run registered");
        out
    }

    /// Writes `len` bytes of `mr` from `at` as `fill` makes them.
    pub fn fill_in(&mut self, mr: MrId, at: u64, len: u64, fill: impl FnOnce(&mut [u8])) {
        self.staged.resize(self.staged.len().max(len as usize), 0);
        let buf = &mut self.staged[..len as usize];
        fill(buf);
        self.ep.write_mem(mr, at, buf).expect("a span of a buffer this run registered");
    }

    /// Registers a data buffer the peer may reach with any operation.
    pub fn register(&mut self, len: u64) -> Result<Mr, RunError> {
        register(&mut self.ep, len)
    }

    /// Inserts the peer's address and notes its data buffer; while the
    /// device answers `Again`, tries again as long as `keep_waiting` says.
    pub fn connect(
        &mut self,
        addr: &efapoll::wire::RawAddr,
        mem: MemDesc,
        keep_waiting: &mut dyn FnMut() -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        self.peer = loop {
            match self.ep.insert_peer(addr) {
                Ok(peer) => break peer,
                Err(Error::Device(DeviceError::Again)) => keep_waiting()?,
                Err(e) => {
                    let e = format!("cannot insert the peer's address {addr}: {e}");
                    return Err(RunError::Setup(e));
                }
            }
        };
        self.remote = mem;
        if let Some((params, conn)) = &mut self.smbd {
            let c = Connection::new(&mut self.ep, self.peer, *params, self.smbd_config)
                .map_err(|e| RunError::Setup(format!("SMB Direct connection: {e}")))?;
            *conn = Some(c);
        }
        Ok(())
    }

    /// Posts data operation `seq` on `local`: a send from it, a write from
    /// it to the peer's buffer at `remote_at`, a read into it from there,
    /// or a fetch-add of [`ATOMIC_ADD`] to the peer's u64 there whose old
    /// value lands in it. `notify`: a write carries `seq` as CQ data, so
    /// the peer hears of it. False when the endpoint pushed back (retry
    /// after progress), or refused: then [`Io::failure`] says why.
    // A bool, the refusal parked in `failure`: a `Result` with a run's
    // error in it would come back through the stack on every post.
    #[inline(always)]
    pub fn post(&mut self, local: Span, remote_at: u64, seq: u64, notify: bool) -> bool {
        if matches!(self.op, OpKind::Send | OpKind::Tagged) {
            let result = self.op.post_send(&mut self.ep, self.peer, local, seq);
            return self.posted(result, self.op.name());
        }
        if self.op == OpKind::Smbd {
            return self.send_smbd(local, seq);
        }
        self.post_any(local, remote_at, seq, notify)
    }

    /// [`Io::post`] of a stream's operation: `-o smbd` sends a message by
    /// inject when it can ([`Connection::inject`]), done as it goes with
    /// no completion, and counted for [`Io::take_injected`]; as
    /// [`Connection::try_send`] otherwise (a completion then, as ever).
    #[inline(always)]
    pub fn post_streamed(&mut self, local: Span, remote_at: u64, seq: u64) -> bool {
        if self.op != OpKind::Smbd {
            return self.post(local, remote_at, seq, false);
        }
        let Some((_, Some(conn))) = &mut self.smbd else { return self.send_smbd(local, seq) };
        match conn.inject(&mut self.ep, local) {
            Ok(true) => {
                self.injected += 1;
                true
            }
            Ok(false) => self.send_smbd(local, seq),
            Err(e) => self.not_sent_smbd(e),
        }
    }

    /// The messages [`Io::post_streamed`] sent by inject since the last
    /// call: done, with no completion to come.
    #[inline(always)]
    pub fn take_injected(&mut self) -> u64 {
        std::mem::take(&mut self.injected)
    }

    /// [`Io::post`] out of line, for any operation (only sends are worth
    /// inlining).
    #[inline(never)]
    fn post_any(&mut self, local: Span, remote_at: u64, seq: u64, notify: bool) -> bool {
        let (ep, peer) = (&mut self.ep, self.peer);
        let remote = RmaIov {
            addr: self.remote.addr.wrapping_add(remote_at),
            len: local.len,
            key: self.remote.key,
        };
        let result = match self.op {
            OpKind::Smbd => return self.send_smbd(local, seq),
            OpKind::Send | OpKind::Tagged => self.op.post_send(ep, peer, local, seq),
            OpKind::Write if notify => ep.writedata(peer, local, remote, seq & CQ_DATA_MASK, seq),
            OpKind::Write => ep.write(peer, local, remote, seq),
            OpKind::Read => ep.read(peer, local, remote, seq),
            OpKind::Atomic => {
                let operand = Span::new(&self.ctl, OPERAND_AT, 8);
                let (add, dt) = (AtomicOp::Sum, Datatype::Uint64);
                ep.fetch_atomic(peer, add, dt, operand, local, remote, seq)
            }
        };
        self.posted(result, self.op.name())
    }

    /// Posts a receive for a message of the transfer; false when the
    /// endpoint pushed back, or refused ([`Io::failure`] says why).
    #[inline(always)]
    pub fn recv(&mut self, dst: Span, ctx: u64) -> bool {
        if self.smbd.is_some() {
            return self.recv_smbd(dst, ctx);
        }
        let result = self.op.post_recv(&mut self.ep, dst, ctx);
        self.posted(result, "receive")
    }

    /// Whether a receive of `len` bytes is kept until its message comes:
    /// not one that `-o smbd` without `-c` takes at once (see `Lending`),
    /// which a poll loop need not post.
    #[inline(always)]
    pub fn keeps_receive(&self, len: u64) -> bool {
        self.lending.copy || !self.lends(len)
    }

    /// Whether the connection lends a message of `len` bytes (and so
    /// completes a receive for it with no buffer of its own).
    #[inline(always)]
    fn lends(&self, len: u64) -> bool {
        len > 0 && len <= self.lending.max && matches!(self.smbd, Some((_, Some(_))))
    }

    /// [`Io::recv`] of `-o smbd`: a receive for a message the connection
    /// lends waits for it here, in line; any other goes out of line.
    #[inline(always)]
    fn recv_smbd(&mut self, dst: Span, ctx: u64) -> bool {
        if self.lends(dst.len) {
            let lending = &mut *self.lending;
            // The connection lends such a message: no buffer of its own,
            // and without `-c` nothing to keep (see `Lending`).
            if !lending.copy {
                return true;
            }
            if lending.to.len() >= self.smbd_config.recv_queue as usize {
                return false;
            }
            lending.to.push_back((dst, ctx));
            return true;
        }
        self.recv_smbd_buffer(dst, ctx)
    }

    #[inline(never)]
    fn recv_smbd_buffer(&mut self, dst: Span, ctx: u64) -> bool {
        let Some((_, Some(conn))) = &mut self.smbd else {
            let result = self.op.post_recv(&mut self.ep, dst, ctx);
            return self.posted(result, "receive");
        };
        match conn.recv(&mut self.ep, dst, ctx) {
            Ok(()) => true,
            Err(smbd::RecvError::Again) => false,
            Err(e) => self.refuse(RunError::Engine(format!("posting an SMB Direct receive: {e}"))),
        }
    }

    /// Sends a control message (fence, ack); false when the endpoint
    /// pushed back.
    pub fn send_ctl(&mut self) -> Result<bool, RunError> {
        let src = Span::new(&self.ctl, CTL_TX_AT, CTL_LEN);
        let sent = if self.op == OpKind::Smbd {
            self.send_smbd(src, 0)
        } else {
            let result = self.op.post_send(&mut self.ep, self.peer, src, 0);
            self.posted(result, "send")
        };
        self.failure()?;
        Ok(sent)
    }

    /// Sends `src` as an SMB Direct message; false when the connection
    /// has no credit to send it now or its queue is full, or it refused
    /// ([`Io::failure`] says why).
    #[inline(always)]
    fn send_smbd(&mut self, src: Span, ctx: u64) -> bool {
        let Some((_, Some(conn))) = &mut self.smbd else {
            return self.refuse(RunError::Setup("the SMB Direct connection is not set up".into()));
        };
        // Without a credit the message would wait in the connection's
        // queue: held back here instead, as back-pressure, and sent at
        // once from a later post (the connection's queue costs more).
        match conn.try_send(&mut self.ep, src, None, ctx) {
            Ok(()) => true,
            Err(e) => self.not_sent_smbd(e),
        }
    }

    /// [`Io::send_smbd`]'s message not sent: held back, or refused.
    #[inline(never)]
    fn not_sent_smbd(&mut self, e: smbd::SendError) -> bool {
        match e {
            smbd::SendError::Again => false,
            e => self.refuse(RunError::Engine(format!("sending an SMB Direct message: {e}"))),
        }
    }

    /// Posts a receive for a control message.
    pub fn recv_ctl(&mut self) -> Result<bool, RunError> {
        let posted = self.recv(Span::new(&self.ctl, CTL_RX_AT, CTL_LEN), 0);
        self.failure()?;
        Ok(posted)
    }

    /// Whether the endpoint took an operation: false when it pushed back,
    /// or refused (why is parked for [`Io::failure`]).
    #[inline(always)]
    fn posted(&mut self, result: Result<(), Error>, what: &'static str) -> bool {
        // Taken is the one outcome a busy loop sees: the others out of line.
        match result {
            Ok(()) => true,
            Err(e) => self.not_posted(e, what),
        }
    }

    #[inline(never)]
    fn not_posted(&mut self, e: Error, what: &'static str) -> bool {
        match e {
            Error::Again => false,
            e => self.refuse(refused(e, what)),
        }
    }

    /// Parks why an operation was refused for [`Io::failure`] (the first
    /// reason, if there are several); false, as nothing was posted.
    #[cold]
    #[inline(never)]
    fn refuse(&mut self, e: RunError) -> bool {
        self.failure.get_or_insert(e);
        false
    }

    /// Counters worth reporting: the endpoint's, and its device's (named
    /// `device.*`: packets it dropped, waits), those that are not zero.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let mut all = self.ep.counters().nonzero();
        let device = self.ep.device().counters().into_iter().filter(|&(_, n)| n > 0);
        all.extend(device.map(|(name, n)| (format!("device.{name}"), n)));
        if let Some((_, Some(conn))) = &self.smbd {
            let s = conn.stats();
            let smbd = [
                ("segments_sent", s.segments_sent),
                ("segments_received", s.segments_received),
                ("empty_sent", s.empty_sent),
                ("empty_received", s.empty_received),
                ("credit_stalls", s.credit_stalls),
                ("slot_stalls", s.slot_stalls),
                ("responses_requested", s.responses_requested),
                ("in_place", s.in_place),
                ("lent", s.lent),
                ("injected", s.injected),
            ];
            let nonzero = smbd.into_iter().filter(|&(_, n)| n > 0);
            all.extend(nonzero.map(|(name, n)| (format!("smbd.{name}"), n)));
        }
        all
    }
}

/// Hands `emit` what [`Connection::drain`] handed `-o smbd`'s drain, as
/// the completion a send would have made, and returns what `emit` says;
/// else the flow to go on with: a lent message kept for a receive not yet
/// posted, a failure to read one (left in `failure`), or an event the
/// caller takes out of the drain (left in `slow`). `emit` is called in
/// each arm, with that arm's completion: made where it is used, its fixed
/// fields are constants there, not merged with the others'.
#[inline(always)]
fn hand_drained<D: Device>(
    ep: &mut Endpoint<D>,
    peer: PeerId,
    lending: &mut Lending,
    failure: &mut Option<RunError>,
    slow: &mut Option<Event>,
    d: Drained<'_>,
    mut emit: impl FnMut(&Completion) -> Flow,
) -> Flow {
    match d {
        Drained::Other(c) => emit(c),
        Drained::Event(Event::Sent { ctx, status: SendStatus::Ok }) => emit(&sent(ctx, peer)),
        // A message delivered into its buffer, as a stream of placed ones
        // has them: handed on in the drain rather than stopping it.
        Drained::Event(Event::Received { ctx, len, status: RecvStatus::Ok, .. }) => {
            emit(&received(ctx, len, peer))
        }
        Drained::Event(Event::Lent { data, .. }) if !lending.copy => emit(&lent_unkept(data, peer)),
        Drained::Event(Event::Lent { loan, data, .. }) => {
            let Some(to) = lending.to.pop_front() else {
                lending.lent.push_back((loan, data));
                return Flow::Keep;
            };
            match read_lent(ep, to, lending.copy, data, peer) {
                Ok(c) => emit(&c),
                Err(e) => {
                    failure.get_or_insert(e);
                    Flow::Stop
                }
            }
        }
        Drained::Event(e) => {
            *slow = Some(e);
            Flow::Stop
        }
    }
}

/// An SMB Direct connection's event as the completion a plain send or
/// receive would have made; none for what has no such completion. A
/// termination fails the run, but for a failed send or receive, whose
/// status the completions carry (a passive side's last send may fail once
/// the peer is gone).
fn smbd_completion(
    e: Event,
    error: Option<ProtocolError>,
    peer: PeerId,
) -> Result<Option<Completion>, RunError> {
    let ended = match error {
        Some(ProtocolError::SendFailed(s) | ProtocolError::RecvFailed(s)) => s,
        _ => Status::DeviceError,
    };
    let c = |op, ctx, len, status| untagged(op, ctx, len, status, peer);
    Ok(Some(match e {
        Event::Sent { ctx, status } => {
            let status = match status {
                SendStatus::Ok => Status::Ok,
                SendStatus::Failed(s) => s,
                SendStatus::Terminated => ended,
            };
            c(Op::Send, ctx, 0, status)
        }
        Event::Received { ctx, len, status, .. } => {
            let status = match status {
                RecvStatus::Ok => Status::Ok,
                RecvStatus::Truncated { olen } => Status::Truncated { olen },
                RecvStatus::Terminated => ended,
            };
            c(Op::Recv, ctx, len, status)
        }
        Event::Terminated(ProtocolError::SendFailed(_) | ProtocolError::RecvFailed(_)) => {
            return Ok(None);
        }
        Event::Terminated(e) => {
            return Err(RunError::Engine(format!("the SMB Direct connection ended: {e}")));
        }
        Event::Invalidated { .. } => return Ok(None),
        // `lent_completion`'s, which `poll_smbd` hands it.
        Event::Lent { .. } => return Err(RunError::Engine("a lent message misrouted".into())),
    }))
}

/// A message the SMB Direct connection lent, as the completion of the
/// receive posted for it (`to`, [`read_lent`]), and given back.
fn lent_completion<D: Device>(
    ep: &mut Endpoint<D>,
    conn: &mut Connection,
    to: (Span, u64),
    copy: bool,
    loan: smbd::Loan,
    data: Span,
    peer: PeerId,
) -> Result<Completion, RunError> {
    let c = read_lent(ep, to, copy, data, peer)?;
    give_back(conn, loan)?;
    Ok(c)
}

fn give_back(conn: &mut Connection, loan: smbd::Loan) -> Result<(), RunError> {
    conn.give_back(loan)
        .map_err(|e| RunError::Engine(format!("giving back a lent SMB Direct message: {e}")))
}

/// A message the SMB Direct connection lent, as the completion of the
/// receive posted for it (`to`): copied into that receive's buffer when
/// `copy` (to be checked there).
#[inline(always)]
fn read_lent<D: Device>(
    ep: &mut Endpoint<D>,
    (dst, ctx): (Span, u64),
    copy: bool,
    data: Span,
    peer: PeerId,
) -> Result<Completion, RunError> {
    let len = data.len.min(dst.len);
    if copy && len > 0 {
        ep.copy_mem(Span { len, ..data }, dst.mr, dst.offset)
            .map_err(|e| RunError::Engine(format!("copying a lent SMB Direct message: {e}")))?;
    }
    let status = if data.len > dst.len { Status::Truncated { olen: data.len } } else { Status::Ok };
    Ok(untagged(Op::Recv, ctx, len, status, peer))
}

/// A send of context `ctx` to `peer` done, as its completion.
#[inline(always)]
fn sent(ctx: u64, peer: PeerId) -> Completion {
    untagged(Op::Send, ctx, 0, Status::Ok, peer)
}

/// A message delivered into the buffer of the receive of context `ctx`.
#[inline(always)]
fn received(ctx: u64, len: u64, peer: PeerId) -> Completion {
    untagged(Op::Recv, ctx, len, Status::Ok, peer)
}

/// A message lent and read where it landed, as the completion of a
/// receive of context 0: without `-c` none is kept for it
/// ([`Io::keeps_receive`]).
#[inline(always)]
fn lent_unkept(data: Span, peer: PeerId) -> Completion {
    untagged(Op::Recv, 0, data.len, Status::Ok, peer)
}

/// The completion of an untagged operation with `peer`.
fn untagged(op: Op, ctx: u64, len: u64, status: Status, peer: PeerId) -> Completion {
    Completion { ctx, op, status, len, tag: 0, tagged: false, cq_data: None, peer: Some(peer) }
}

fn register<D: Device>(ep: &mut Endpoint<D>, len: u64) -> Result<Mr, RunError> {
    let access = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    ep.register(len.max(8), access)
        .map_err(|e| RunError::Setup(format!("registering {len} bytes: {e}")))
}

#[cold]
#[inline(never)]
fn refused(e: Error, what: &str) -> RunError {
    RunError::Engine(format!("posting a {what}: {e}"))
}

/// A set of completion kinds, tested as a bit mask. A poll loop's
/// `match` on the kind, with the loop's end among its arms, can compile
/// to a jump table: an indirect jump whose target changes with each
/// completion when the kinds take turns (a message, then a send's
/// completion), which a predictor may miss; a bit test is a plain
/// conditional branch.
#[derive(Debug, Clone, Copy)]
pub struct Ops(u8);

impl Ops {
    pub const fn of(ops: &[Op]) -> Ops {
        let mut bits = 0;
        let mut i = 0;
        while i < ops.len() {
            bits |= 1 << ops[i] as u8;
            i += 1;
        }
        Ops(bits)
    }

    #[inline(always)]
    pub fn has(self, op: Op) -> bool {
        (self.0 >> op as u8) & 1 != 0
    }
}

/// Fails a completion that is not a success.
#[inline]
pub fn check_status(c: &Completion) -> Result<(), RunError> {
    // The failure takes the fields it tells of: were the completion's
    // address to reach a call, even one never made, the poll loop would
    // keep the whole completion on the stack, and a copy of it would keep
    // every field live until the check.
    if c.status == Status::Ok { Ok(()) } else { Err(failed(c.op, c.status, c.len)) }
}

/// Why a completion of `op` failed with `status` (`len`: the bytes of a
/// truncated receive), for the run's error.
#[cold]
#[inline(never)]
fn failed(op: Op, status: Status, len: u64) -> RunError {
    match status {
        Status::PeerUnreachable => {
            RunError::PeerGone(format!("the peer is unreachable (a {op:?} failed)"))
        }
        Status::Truncated { olen } => RunError::Verify(format!(
            "a {olen}-byte message arrived in a {len}-byte receive: the sides disagree on sizes"
        )),
        Status::RemoteAccess => RunError::Engine(format!(
            "the peer refused a {op:?} on its buffer (key, bounds or rights)"
        )),
        s => RunError::Engine(format!("{op:?} completed with {s:?}")),
    }
}

/// Fails a passive side's completion that is not a success, but for the
/// failure of its last send (echo, ack) once it has received everything:
/// the active side ends as soon as it has that message and may close
/// before the device here has seen it consumed (shm then fails what is
/// outstanding to it). Whether it arrived is the active side's to say.
#[inline]
pub fn check_passive_status(c: &Completion, all_received: bool) -> Result<(), RunError> {
    let last_send = matches!(c.op, Op::Send | Op::Write);
    if c.status == Status::Ok || all_received && last_send && c.status == Status::PeerUnreachable {
        return Ok(());
    }
    check_status(c)
}

/// Fails a receive that did not deliver `want` bytes.
#[inline]
pub fn check_len(c: &Completion, want: u64) -> Result<(), RunError> {
    if c.len == want { Ok(()) } else { Err(short(c.len, want)) }
}

#[cold]
#[inline(never)]
fn short(len: u64, want: u64) -> RunError {
    RunError::Verify(format!("received {len} bytes, expected {want}"))
}

/// The seed of message `seq` of a `size`-byte run: each message's bytes
/// differ, so one landing in the wrong buffer, or not at all, is caught.
pub fn seed(size: u64, seq: u64) -> u64 {
    size.rotate_left(40) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xefa0_5eed
}

#[inline]
fn word(seed: u64, k: usize) -> u64 {
    (seed ^ (k as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).wrapping_add(k as u64)
}

/// Fills `buf` with the pattern of `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut words = buf.chunks_exact_mut(8);
    for (k, chunk) in (&mut words).enumerate() {
        chunk.copy_from_slice(&word(seed, k).to_le_bytes());
    }
    let k = buf.len() / 8;
    let tail = &mut buf[k * 8..];
    tail.copy_from_slice(&word(seed, k).to_le_bytes()[..tail.len()]);
}

/// Words `check` compares before it looks for a difference: a block's
/// differences are OR-ed together without a branch per word, so `-c` costs
/// a fraction of a copy, not a comparison call per word.
const CHECK_BLOCK: usize = 64;

/// The offset of the first byte of `buf` that is not the pattern of
/// `seed`, if any.
pub fn check(buf: &[u8], seed: u64) -> Option<usize> {
    let diff = |k: usize, chunk: &[u8]| {
        let w = word(seed, k).to_le_bytes();
        chunk.iter().zip(w).position(|(a, b)| *a != b).map(|i| k * 8 + i)
    };
    for (b, block) in buf.chunks(CHECK_BLOCK * 8).enumerate() {
        let first = b * CHECK_BLOCK;
        let words = block.chunks_exact(8);
        let tail = words.remainder();
        let differs = words.enumerate().fold(0u64, |acc, (i, chunk)| {
            let got = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            acc | (got ^ word(seed, first + i))
        });
        if differs != 0 {
            return block.chunks(8).enumerate().find_map(|(i, chunk)| diff(first + i, chunk));
        }
        if !tail.is_empty() {
            return diff(first + block.len() / 8, tail);
        }
    }
    None
}

/// Verifies message `seq` of a `size`-byte run in `buf`.
pub fn verify(buf: &[u8], size: u64, seq: u64) -> Result<(), RunError> {
    match check(buf, seed(size, seq)) {
        None => Ok(()),
        Some(at) => Err(RunError::Verify(format!(
            "message {seq} of {size} bytes differs from what was sent at byte {at}"
        ))),
    }
}

/// Fails a write notice whose CQ data is not message `seq`'s.
pub fn check_cq_data(c: &Completion, seq: u64) -> Result<(), RunError> {
    match c.cq_data {
        Some(d) if d == seq & CQ_DATA_MASK => Ok(()),
        d => Err(RunError::Verify(format!(
            "write {seq} arrived with CQ data {d:?}, expected {}",
            seq & CQ_DATA_MASK
        ))),
    }
}

/// Readies the initiator's `buf` for operation `seq` of a `size`-byte
/// run, with `-c`: a pattern to send or write; zeros where a read lands
/// (so a read that lands nothing is caught); nothing for an atomic.
pub fn prepare_local(op: OpKind, buf: &mut [u8], size: u64, seq: u64) {
    match op {
        OpKind::Send | OpKind::Tagged | OpKind::Write | OpKind::Smbd => fill(buf, seed(size, seq)),
        OpKind::Read => buf.fill(0),
        OpKind::Atomic => {}
    }
}

/// Verifies what a read brought into `buf` from the target's slot `slot`
/// (see [`super::target::Target`]).
pub fn verify_read(buf: &[u8], size: u64, seq: u64, slot: u64) -> Result<(), RunError> {
    match check(buf, seed(size, slot)) {
        None => Ok(()),
        Some(at) => Err(RunError::Verify(format!(
            "read {seq} of {size} bytes differs from the target's pattern at byte {at}"
        ))),
    }
}

/// The u64 at the start of `buf`: a fetched value, or the target's counter.
pub fn fetched(buf: &[u8]) -> u64 {
    u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"))
}

/// Verifies the old value fetch-add `seq` of `total` brought back: with
/// one add at a time it is exactly `seq` adds; with several in flight, some
/// whole number of adds below `total`.
pub fn verify_fetched(
    value: u64,
    seq: u64,
    total: u64,
    one_at_a_time: bool,
) -> Result<(), RunError> {
    let ok = if one_at_a_time {
        value == seq.wrapping_mul(ATOMIC_ADD)
    } else {
        // A counter that wrapped says nothing either way.
        total.checked_mul(ATOMIC_ADD).is_none()
            || (value.is_multiple_of(ATOMIC_ADD) && value / ATOMIC_ADD < total)
    };
    if ok {
        Ok(())
    } else {
        Err(RunError::Verify(format!(
            "fetch-add {seq} of {total} brought back {value:#x}, which is not a count of adds \
             of {ATOMIC_ADD:#x} it could have seen"
        )))
    }
}

#[cfg(test)]
mod tests {
    use efapoll::device::sim::{SimConfig, SimDevice, SimFabric};

    use super::*;

    fn params(device: &str, op: &str) -> Params {
        Params {
            app: "streaming".into(),
            device: device.into(),
            op: op.into(),
            sizes: vec![64],
            iterations: vec![10],
            warmup: 0,
            window: 4,
            verify: false,
            flows: 1,
            duration_ms: None,
            prime: true,
        }
    }

    #[test]
    fn a_failed_smbd_connection_ends_the_poll_and_says_why() {
        let params = params("sim", "smbd");
        let fabric = SimFabric::new(SimConfig::default());
        let ep = Endpoint::new(fabric.device(), Config::default()).unwrap();
        let mut io = Io::new(ep, OpKind::Smbd, &params).unwrap();
        // A plain endpoint as the peer, which sends what is no SMB Direct
        // segment.
        let mut raw = Endpoint::new(fabric.device(), Config::default()).unwrap();
        let mem = MemDesc { addr: 0, key: 0, len: 0 };
        io.connect(&raw.addr(), mem, &mut || Ok(())).unwrap();
        let to_io = raw.insert_peer(&io.ep.addr()).unwrap();
        let junk = register(&mut raw, 8).unwrap();
        raw.send(to_io, Span::new(&junk, 0, 8), 0).unwrap();
        let mut polls = 0;
        let err = loop {
            raw.progress();
            io.progress();
            while io.poll_cq().is_some() {}
            if let Err(e) = io.failure() {
                break e;
            }
            polls += 1;
            assert!(polls < 1000, "the connection never failed");
        };
        assert!(err.to_string().contains("the SMB Direct connection ended"), "{err}");
        assert!(io.poll_cq().is_none(), "nothing after the failure");
    }

    /// Two `-o smbd` ends over sim, connected to each other.
    fn smbd_pair(verify: bool) -> (Io<SimDevice>, Io<SimDevice>) {
        let params = Params { verify, ..params("sim", "smbd") };
        let fabric = SimFabric::new(SimConfig::default());
        let ep = |f: &SimFabric| Endpoint::new(f.device(), Config::default()).unwrap();
        let mut a = Io::new(ep(&fabric), OpKind::Smbd, &params).unwrap();
        let mut b = Io::new(ep(&fabric), OpKind::Smbd, &params).unwrap();
        let mem = MemDesc { addr: 0, key: 0, len: 0 };
        let (a_addr, b_addr) = (a.ep.addr(), b.ep.addr());
        a.connect(&b_addr, mem, &mut || Ok(())).unwrap();
        b.connect(&a_addr, mem, &mut || Ok(())).unwrap();
        (a, b)
    }

    /// The connection's credits of an `-o smbd` end.
    fn smbd_credits(io: &Io<SimDevice>) -> smbd::Credits {
        let Some((_, Some(conn))) = &io.smbd else { panic!("not connected") };
        conn.credits()
    }

    /// Whether the connection of an `-o smbd` end has work waiting.
    fn smbd_has_work(io: &Io<SimDevice>) -> bool {
        let Some((_, Some(conn))) = &io.smbd else { panic!("not connected") };
        conn.has_work(&io.ep)
    }

    /// `poll_cq` of `-o smbd` takes a lent message as a drain does: its
    /// receive is posted again as the message is taken, before any
    /// progress, so that its credit can go back with the next message.
    #[test]
    fn smbd_poll_posts_a_lent_messages_receive_again_as_it_is_taken() {
        for verify in [false, true] {
            let (mut tx, mut rx) = smbd_pair(verify);
            let src = register(&mut tx.ep, 64).unwrap();
            let dst = register(&mut rx.ep, 64).unwrap();
            assert!(rx.recv(Span::new(&dst, 0, 64), 3));
            assert!(rx.poll_cq().is_none(), "nothing sent yet");
            assert!(tx.post(Span::new(&src, 0, 64), 0, 1, false));
            tx.failure().unwrap();
            let mut rounds = 0;
            while !smbd_has_work(&rx) {
                tx.progress();
                rx.ep.progress();
                rounds += 1;
                assert!(rounds < 1000, "the message never arrived");
            }
            assert_eq!(rx.ep.cq_len(), 0, "marked in the receive ring, not reported");
            let posted = smbd_credits(&rx).posted();
            let c = rx.poll_cq().expect("the message");
            let ctx = if verify { 3 } else { 0 };
            assert_eq!((c.op, c.status, c.len, c.ctx), (Op::Recv, Status::Ok, 64, ctx));
            // Its arrival took a receive; it was posted again as the drain
            // returned.
            assert_eq!(smbd_credits(&rx).posted(), posted, "-c {verify}");
            assert!(rx.poll_cq().is_none());
            rx.failure().unwrap();
        }
    }

    /// Without `-c` a message the connection lends completes a receive
    /// the application never posted: none is kept (`keeps_receive`), one
    /// posted is taken at once, and every message comes as a receive of
    /// its length, through `drain_cq` and `poll_cq` alike. With `-c`, and
    /// for messages too long to lend, receives are kept as before.
    #[test]
    fn smbd_without_check_completes_lent_messages_with_no_receive_kept() {
        let (mut tx, mut rx) = smbd_pair(false);
        assert!(!rx.keeps_receive(64) && !rx.keeps_receive(1));
        assert!(rx.keeps_receive(0) && rx.keeps_receive(rx.lending.max + 1));
        let (checked, _) = smbd_pair(true);
        assert!(checked.keeps_receive(64));
        let send = Io::new(
            Endpoint::new(SimFabric::new(SimConfig::default()).device(), Config::default())
                .unwrap(),
            OpKind::Send,
            &params("sim", "send"),
        )
        .unwrap();
        assert!(send.keeps_receive(64));

        let src = register(&mut tx.ep, 64).unwrap();
        let dst = register(&mut rx.ep, 64).unwrap();
        // One receive posted, taken at once and kept nowhere.
        assert!(rx.recv(Span::new(&dst, 0, 64), 7));
        assert!(rx.lending.to.is_empty());
        let total = 300u64;
        let (mut sent, mut sends_done, mut lens) = (0, 0, Vec::new());
        let mut polls = 0;
        while lens.len() < total as usize {
            while sent < total && tx.post(Span::new(&src, 0, 64), 0, sent, false) {
                sent += 1;
            }
            tx.failure().unwrap();
            tx.progress();
            while let Some(c) = tx.poll_cq() {
                assert_eq!((c.op, c.status), (Op::Send, Status::Ok));
                sends_done += 1;
            }
            rx.progress();
            // Half the polls through each way of taking completions.
            if polls % 2 == 0 {
                rx.drain_cq(|c| {
                    lens.push((c.op, c.status, c.len, c.ctx));
                    Ok::<(), RunError>(())
                })
                .unwrap();
            } else {
                while let Some(c) = rx.poll_cq() {
                    lens.push((c.op, c.status, c.len, c.ctx));
                }
            }
            rx.failure().unwrap();
            polls += 1;
            assert!(polls < 100_000, "{} of {total} received", lens.len());
        }
        assert!(lens.iter().all(|&l| l == (Op::Recv, Status::Ok, 64, 0)), "{lens:?}");
        assert_eq!(lens.len() as u64, total);
        assert!(rx.lending.to.is_empty() && rx.lending.lent.is_empty());
        let conn = rx.smbd.as_ref().and_then(|(_, c)| c.as_ref()).unwrap();
        assert_eq!(conn.stats().lent, total);
        // Each message was copied into its packet as it went: reported sent.
        while let Some(c) = tx.poll_cq() {
            assert_eq!((c.op, c.status), (Op::Send, Status::Ok));
            sends_done += 1;
        }
        assert_eq!(sends_done, total);
    }

    /// A shm peer that takes the connection and never answers (a stopped
    /// process) holds `connect` no longer than `keep_waiting` allows: the
    /// device says "not yet" every `hello_wait`, and a signal or the
    /// run's timeout ends the wait there.
    #[test]
    fn connecting_to_a_peer_that_never_answers_asks_whether_to_go_on() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        use std::time::{Duration, Instant};

        use efapoll::device::shm::{ShmConfig, ShmDevice};

        let hello_wait = Duration::from_millis(20);
        let dev = ShmDevice::new(ShmConfig { hello_wait, ..ShmConfig::default() }).unwrap();
        let ep = Endpoint::new(dev, Config::on_host()).unwrap();
        let mut io = Io::new(ep, OpKind::Send, &params("shm", "send")).unwrap();
        // The shm device's rendezvous socket of a peer that is stopped.
        let peer = efapoll::wire::RawAddr { qpn: 0xfffe, connid: 0x1234_5678, ..io.ep.addr() };
        let name = format!("efapoll-shm/{:04x}-{:08x}", peer.qpn, peer.connid);
        let _stopped = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name).unwrap());
        let mem = MemDesc { addr: 0, key: 0, len: 0 };
        let (started, mut asked) = (Instant::now(), 0);
        let err = io.connect(&peer, mem, &mut || {
            asked += 1;
            if asked < 5 { Ok(()) } else { Err(RunError::Interrupted) }
        });
        let took = started.elapsed();
        assert_eq!(err, Err(RunError::Interrupted));
        assert_eq!(asked, 5);
        assert!(took >= 5 * hello_wait && took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn pattern_round_trips_and_pinpoints_a_bad_byte() {
        for len in [0usize, 1, 7, 8, 9, 100, 511, 512, 513, 4096, 4100] {
            let mut buf = vec![0u8; len];
            fill(&mut buf, seed(len as u64, 3));
            assert_eq!(check(&buf, seed(len as u64, 3)), None, "{len}");
            // Word k of the pattern is at byte 8k, a short last word cut.
            for (k, chunk) in buf.chunks(8).enumerate() {
                assert_eq!(chunk, &word(seed(len as u64, 3), k).to_le_bytes()[..chunk.len()]);
            }
            for at in [0, len / 2, len.saturating_sub(1)].into_iter().filter(|_| len > 0) {
                let mut bad = buf.clone();
                bad[at] ^= 1;
                assert_eq!(check(&bad, seed(len as u64, 3)), Some(at), "{len} at {at}");
                // The first difference is the one reported.
                bad[len - 1] ^= 0x80;
                assert_eq!(check(&bad, seed(len as u64, 3)), Some(at), "{len} at {at}");
            }
        }
    }

    #[test]
    fn messages_differ_by_sequence_and_size() {
        let mut a = vec![0u8; 64];
        fill(&mut a, seed(64, 0));
        assert!(check(&a, seed(64, 1)).is_some());
        assert!(check(&a, seed(128, 0)).is_some());
    }

    #[test]
    fn round_trips_count_whole_for_reads_and_atomics() {
        for op in [OpKind::Send, OpKind::Tagged, OpKind::Write] {
            assert_eq!((op.legs(), op.echoes(), op.lands_here()), (2, true, false), "{op:?}");
        }
        for op in [OpKind::Read, OpKind::Atomic] {
            assert_eq!((op.legs(), op.echoes(), op.lands_here()), (1, false, true), "{op:?}");
        }
        assert!(OpKind::Write.config(Config::default()).handshake_on_insert);
        assert!(!OpKind::Send.config(Config::default()).handshake_on_insert);
    }

    #[test]
    fn fetched_values_are_whole_counts_of_adds() {
        assert!(verify_fetched(3 * ATOMIC_ADD, 3, 10, true).is_ok());
        assert!(verify_fetched(2 * ATOMIC_ADD, 3, 10, true).is_err());
        assert!(verify_fetched(7 * ATOMIC_ADD, 3, 10, false).is_ok());
        assert!(verify_fetched(10 * ATOMIC_ADD, 3, 10, false).is_err());
        assert!(verify_fetched(ATOMIC_ADD + 1, 3, 10, false).is_err());
        let low_half_only = 5u64;
        assert!(verify_fetched(low_half_only, 5, 10, true).is_err());
    }

    #[test]
    fn cq_data_carries_the_low_32_bits_of_the_sequence() {
        let mut c = Completion {
            ctx: 0,
            op: Op::RemoteWrite,
            status: Status::Ok,
            len: 0,
            tag: 0,
            tagged: false,
            cq_data: Some(7),
            peer: None,
        };
        assert!(check_cq_data(&c, 7).is_ok());
        assert!(check_cq_data(&c, (1 << 32) + 7).is_ok());
        assert!(check_cq_data(&c, 8).is_err());
        c.cq_data = None;
        assert!(check_cq_data(&c, 7).is_err());
    }
}
