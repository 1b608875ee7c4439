//! The Relink link (relink 1, 3) as a sans-IO state machine.
//!
//! A [`Link`] is the state two peers share across connections: per-channel
//! sequence numbers, unacknowledged messages, transactions, shutdown. It
//! does no I/O. The driver owns the byte stream and, in a loop:
//!
//! 1. writes whatever [`Link::poll_transmit`] appends to its buffer;
//! 2. feeds received bytes to [`Link::handle_input`];
//! 3. drains [`Link::poll_event`];
//!
//! and calls application commands ([`Link::send`], [`Link::consume`],
//! [`Link::ping`], [`Link::shutdown`], ...) whenever it likes. The link
//! keeps no time: a driver that batches acknowledgements
//! ([`Limits::ack_window`]) calls [`Link::release_acks`] when its delay
//! runs out. When the stream breaks it calls [`Link::stream_lost`]; a
//! connector then dials again and calls [`Link::reconnect`] (or
//! [`Link::reconnect_fresh`] for a new link), a listener hands the new
//! stream's [`Accepted`] to [`Link::resume`].
//!
//! The listener side of a handshake runs before its link is known: an
//! [`Acceptor`] per incoming stream asks the [`Listener`] (endpoint names,
//! parameters, the link ids it has issued) and yields an [`Accepted`], which
//! either starts a new link ([`Link::accept`]) or resumes an old one.
//!
//! Sequence numbers are per channel and direction, start at 0 and wrap
//! (relink 3.1), and start at 0 again when a closed channel reopens. An
//! acknowledgement or operation without a sequence number targets the
//! message after the one its type targeted last; after a reconnection
//! either side may have missed some, so the first of each type on a new
//! stream always carries its number.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use super::handshake::{HandshakeFlags, LINK_ID_END, ReplyRepr, RequestRepr, VERSION, VersionRepr};
use super::wire::{
    ChannelAck, ChannelId, ChannelIdRef, ChannelIds, ChannelOp, EmitError, GeneralType, IdSizes,
    MessageRepr, PacketRepr, Parsed, Parts, SequenceAck, SequenceOp, Target, WireError, WireLimits,
};

/// Most commits a channel may have awaiting their outcome, and how many
/// outcomes a receiver remembers to repeat after a reconnection (relink 3.2:
/// an outcome may be lost with the stream). Both sides use the same value,
/// so every outcome a sender still waits for is among those repeated.
pub const MAX_PENDING_COMMITS: usize = 64;

/// Which end of the stream this peer is (relink 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Connector,
    Listener,
}

/// What the handshake must agree on (relink 1): channel id sizes and
/// whether each direction uses transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    /// Bytes of the connector's channel ids (relink 1: 0..=255).
    pub connector_id_len: u8,
    /// Bytes of the listener's channel ids (relink 1: 0..=255).
    pub listener_id_len: u8,
    pub connector_transactions: bool,
    pub listener_transactions: bool,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            connector_id_len: 4,
            listener_id_len: 4,
            connector_transactions: false,
            listener_transactions: false,
        }
    }
}

impl Params {
    fn flags(&self) -> HandshakeFlags {
        let mut flags = HandshakeFlags::empty();
        flags.set(HandshakeFlags::CONNECTOR_TRANSACTIONS, self.connector_transactions);
        flags.set(HandshakeFlags::LISTENER_TRANSACTIONS, self.listener_transactions);
        flags
    }

    fn from_request(request: &RequestRepr<'_>) -> Self {
        Params {
            connector_id_len: request.connector_id_len,
            listener_id_len: request.listener_id_len,
            connector_transactions: request.flags.contains(HandshakeFlags::CONNECTOR_TRANSACTIONS),
            listener_transactions: request.flags.contains(HandshakeFlags::LISTENER_TRANSACTIONS),
        }
    }

    /// Id size of `role`'s channels.
    pub const fn id_len(&self, role: Role) -> u8 {
        match role {
            Role::Connector => self.connector_id_len,
            Role::Listener => self.listener_id_len,
        }
    }

    /// Whether `role`'s channels use transactions.
    pub const fn transactions(&self, role: Role) -> bool {
        match role {
            Role::Connector => self.connector_transactions,
            Role::Listener => self.listener_transactions,
        }
    }

    /// Id sizes of the packets `role` sends.
    fn sender_ids(&self, role: Role) -> IdSizes {
        IdSizes::new(self.id_len(role), self.id_len(role.peer()))
    }
}

impl Role {
    pub const fn peer(self) -> Role {
        match self {
            Role::Connector => Role::Listener,
            Role::Listener => Role::Connector,
        }
    }
}

/// Messages a channel may have unconsumed by default: the reference
/// implementation's send window, so that neither side stalls or ends a link
/// where the other would not.
pub const DEFAULT_WINDOW: u32 = 65_536;

/// Local bounds on what we send and on what a peer may make us hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub wire: WireLimits,
    /// Most messages on one of our channels that the peer has not
    /// acknowledged consumed (relink 3.1: an implementation may impose a
    /// limit). Past it [`Link::send`] refuses with
    /// [`CommandError::Blocked`] until the peer consumes; nothing is lost.
    pub send_window: u32,
    /// Most messages the peer may send on one of its channels beyond the
    /// last consumption we acknowledged to it. A peer that sends more
    /// ignores any window it could know of, and the link ends
    /// ([`LinkError::WindowExceeded`]); what our application holds unread
    /// but has not acknowledged yet never counts against the peer.
    pub recv_window: u32,
    /// Messages received, or consumed, on one of the peer's channels
    /// before we acknowledge them; fewer are held back until
    /// [`Link::release_acks`]. A driver releases them after a delay
    /// ([`Options::ack_delay`](super::tcp::Options::ack_delay)), so one
    /// acknowledgement may cover many messages. 0 and 1 acknowledge every
    /// message at once. Held acknowledgements go anyway when a stream
    /// opens (relink 3.5: before the resume packet), before a closure is
    /// confirmed and once we shut down.
    pub ack_window: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wire: WireLimits::default(),
            send_window: DEFAULT_WINDOW,
            recv_window: DEFAULT_WINDOW,
            ack_window: 1,
        }
    }
}

/// What a connector needs to start a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorConfig {
    /// The listener's endpoint name (relink 1): UTF-8, at most 255 bytes.
    pub endpoint_name: String,
    pub params: Params,
    pub limits: Limits,
}

impl ConnectorConfig {
    pub fn new(endpoint_name: impl Into<String>) -> Self {
        ConnectorConfig {
            endpoint_name: endpoint_name.into(),
            params: Params::default(),
            limits: Limits::default(),
        }
    }
}

/// What the link tells the application, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A handshake completed. `resumed` says whether the old link went on;
    /// if not, everything from an earlier link was discarded.
    Connected { link_id: u64, epoch: u64, resumed: bool },
    /// The peer caught up after a resumed handshake; messaging goes on.
    PeerResumed,
    /// A message on one of the peer's channels. Acknowledge it with
    /// [`Link::consume`] once done with it.
    Message { channel: ChannelId, seq: u32, parts: Vec<Vec<u8>> },
    /// The peer asks to process its messages through `seq`; answer with
    /// [`Link::resolve_commit`].
    Commit { channel: ChannelId, seq: u32 },
    /// The peer asks to ignore its uncommitted messages through `seq`.
    Rollback { channel: ChannelId, seq: u32 },
    /// The peer processed our messages through `seq`.
    Committed { channel: ChannelId, seq: u32 },
    /// The peer failed to process our messages through `seq`.
    Uncommitted { channel: ChannelId, seq: u32 },
    /// The peer closed its channel. We confirm the closure once every
    /// message of it is consumed (and every commit resolved); a message on
    /// it afterwards reopens it, numbered from 0.
    PeerClosed { channel: ChannelId },
    /// The peer acknowledged that we closed our channel.
    Closed { channel: ChannelId },
    /// The answer to one of our pings.
    Pong,
    /// The peer will open no more channels.
    PeerShutdown,
    /// Both peers sent shutdown: the link is over (relink 3.6).
    Done,
}

/// Why a handshake failed. Each ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeError {
    #[error("malformed handshake: {0}")]
    Wire(#[from] WireError),
    #[error("peer answered with Relink version {0}; we speak version 0")]
    VersionUnsupported(u8),
    #[error("unknown endpoint name {0:?}")]
    UnknownEndpoint(String),
    #[error("endpoint name of {0} bytes is longer than 255")]
    NameTooLong(usize),
    #[error("handshake parameters differ: ours {ours:?}, theirs {theirs:?}")]
    ParamsMismatch { ours: Params, theirs: Params },
    #[error("link {0} is lost: the listener does not know it")]
    LinkLost(u64),
    #[error("the listener replied with link id zero unasked")]
    ZeroLinkId,
}

/// Why the link ended the current stream. The driver closes the stream and
/// calls [`Link::stream_lost`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LinkError {
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("malformed packet: {0}")]
    Wire(#[from] WireError),
    #[error("no stream: the link is between connections or failed")]
    NoStream,
    #[error("acknowledgement for message {seq} on channel {channel}, which was not sent")]
    AckBeyondSent { channel: ChannelId, seq: u32 },
    #[error("outcome for message {seq} on channel {channel}, which no commit awaits")]
    UnexpectedOutcome { channel: ChannelId, seq: u32 },
    #[error("transaction packet on channel {channel} without negotiated transactions")]
    TransactionsNotNegotiated { channel: ChannelId },
    #[error("operation on channel {channel} targets message {seq}, which was not received")]
    OpBeyondReceived { channel: ChannelId, seq: u32 },
    #[error("channel {channel} has more than {max} commits awaiting their outcome")]
    TooManyCommits { channel: ChannelId, max: usize },
    #[error("channel {channel} has more than {max} messages past the consumption we acknowledged")]
    WindowExceeded { channel: ChannelId, max: u32 },
    #[error("message on channel {channel} before we confirmed its closure")]
    MessageWhileClosing { channel: ChannelId },
    #[error("channel packet before our resume packet")]
    MessageBeforeResume,
    #[error("resume packet on a stream that does not resume")]
    UnexpectedResume,
    #[error("accepted link {got} is not this link ({want})")]
    WrongLink { want: u64, got: u64 },
    #[error("the accepted handshake resumes link {0}: give it to that link")]
    NotNew(u64),
    #[error("the link is shut down")]
    LinkDone,
}

/// Why an application command was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommandError {
    #[error("channel {channel} has the most unconsumed messages; wait for acknowledgements")]
    Blocked { channel: ChannelId },
    #[error("channel {channel} is named {count} times, more than its window of {window}")]
    BeyondWindow { channel: ChannelId, count: u32, window: u32 },
    #[error("channel id {channel:#x} does not fit in {len} bytes")]
    ChannelIdTooWide { channel: ChannelId, len: u8 },
    /// After [`Link::shutdown`] nothing more is sent: relink 3.6 forbids
    /// opening a channel, and the reference implementation drops the
    /// connection on any message that follows a shutdown.
    #[error("after shutdown nothing more is sent")]
    ShutDown,
    #[error("channel {channel} is being closed")]
    ChannelClosing { channel: ChannelId },
    #[error("channel {channel} is not open")]
    ChannelNotOpen { channel: ChannelId },
    #[error("our channels do not use transactions")]
    TransactionsNotNegotiated,
    #[error("channel {channel} has no message since its last commit or rollback")]
    NothingToCommit { channel: ChannelId },
    #[error("channel {channel} has the most commits awaiting their outcome")]
    TooManyPendingCommits { channel: ChannelId },
    #[error("message {seq} on channel {channel} is not received or already consumed")]
    NoSuchMessage { channel: ChannelId, seq: u32 },
    #[error("message {seq} was not sent on our channel {channel}")]
    NotSent { channel: ChannelId, seq: u32 },
    #[error("no commit of message {seq} on channel {channel} awaits an outcome")]
    NoPendingCommit { channel: ChannelId, seq: u32 },
    #[error("message packet of {len} bytes exceeds {max}")]
    MessageTooLong { len: usize, max: usize },
    #[error("{count} parts exceed {max}")]
    TooManyParts { count: usize, max: u32 },
    #[error("{count} channels exceed {max}")]
    TooManyChannels { count: usize, max: u32 },
    #[error("the link has no open stream")]
    NotOpen,
    #[error("only a connector reconnects")]
    NotConnector,
    #[error("the link is shut down")]
    LinkDone,
}

/// Position of `seq` relative to `cursor`, the last sequence number a
/// packet type targeted: 1 for the next message; 0 or beyond 2^31 for one
/// already targeted.
const fn distance(cursor: u32, seq: u32) -> u32 {
    seq.wrapping_sub(cursor)
}

const fn is_stale(cursor: u32, seq: u32) -> bool {
    let d = distance(cursor, seq);
    d == 0 || d > i32::MAX as u32
}

/// "Nothing targeted yet": the message before sequence number 0.
const BEFORE_FIRST: u32 = u32::MAX;

type MessageData = Arc<Vec<Vec<u8>>>;

/// Something we sent on one of our channels and must send again after a
/// reconnection until it is acknowledged.
#[derive(Debug, Clone)]
enum Logged {
    /// Until acknowledged received or consumed.
    Message { seq: u32, data: MessageData },
    /// Until committed or uncommitted.
    Commit(u32),
    /// Until closed.
    Close,
}

/// One of our channels.
#[derive(Debug)]
struct OutChannel {
    next_seq: u32,
    /// Last targets of the peer's received and consumed acknowledgements.
    received: u32,
    consumed: u32,
    /// Last targets of the peer's committed and uncommitted acknowledgements.
    committed: u32,
    uncommitted: u32,
    /// Last message covered by a commit or rollback.
    transaction_end: u32,
    log: VecDeque<Logged>,
    /// Last commit and rollback targets written on this stream, for the
    /// short form; `None` on a new stream.
    commit_sent: Option<u32>,
    rollback_sent: Option<u32>,
    closing: bool,
    closed: bool,
    /// Reopened, and the peer has acknowledged no message of this opening
    /// yet. Until it does it may repeat its confirmation of the previous
    /// closure (it does after every reconnection), which must not pass for
    /// a confirmation of this one; so our close waits for that
    /// acknowledgement.
    peer_may_repeat_closed: bool,
    /// Our close waits, unwritten on this stream, for that acknowledgement.
    close_held: bool,
}

impl OutChannel {
    fn new() -> Self {
        OutChannel {
            next_seq: 0,
            received: BEFORE_FIRST,
            consumed: BEFORE_FIRST,
            committed: BEFORE_FIRST,
            uncommitted: BEFORE_FIRST,
            transaction_end: BEFORE_FIRST,
            log: VecDeque::new(),
            commit_sent: None,
            rollback_sent: None,
            closing: false,
            closed: false,
            peer_may_repeat_closed: false,
            close_held: false,
        }
    }

    /// relink 3.3: sending reopens a closed channel, and relink 3.1
    /// numbers its messages from 0, as the reference implementation
    /// expects: it drops the connection on an acknowledgement of any other
    /// number.
    fn reopen(&mut self) {
        *self = OutChannel { peer_may_repeat_closed: true, ..OutChannel::new() };
    }

    /// Messages sent and not acknowledged consumed.
    fn unconsumed(&self) -> u32 {
        self.next_seq.wrapping_sub(self.consumed.wrapping_add(1))
    }

    fn pending_commits(&self) -> usize {
        self.log.iter().filter(|item| matches!(item, Logged::Commit(_))).count()
    }

    /// Drops messages the peer acknowledged, received or consumed.
    fn trim_log(&mut self) {
        let next = self.next_seq;
        // A message is covered by a cursor when it is no newer than it.
        let covered = |seq: u32, cursor: u32| next.wrapping_sub(seq) >= next.wrapping_sub(cursor);
        let (received, consumed) = (self.received, self.consumed);
        self.log.retain(|item| match item {
            Logged::Message { seq, .. } => !covered(*seq, received) && !covered(*seq, consumed),
            _ => true,
        });
    }
}

/// One of the peer's channels.
#[derive(Debug)]
struct InChannel {
    /// Last message received and consumed.
    received: u32,
    consumed: u32,
    any_received: bool,
    any_consumed: bool,
    /// Last consumption acknowledged on any stream: all the peer can know
    /// of, so its window counts from here.
    consumed_told: u32,
    /// Last acknowledgement targets written on this stream, for the short
    /// form; `None` on a new stream.
    received_sent: Option<u32>,
    consumed_sent: Option<u32>,
    committed_sent: Option<u32>,
    uncommitted_sent: Option<u32>,
    /// Last targets of the peer's commit and rollback operations.
    commit: u32,
    rollback: u32,
    /// Commits the application has yet to resolve.
    undecided: VecDeque<u32>,
    /// The latest outcomes (sequence number, committed), and how many of
    /// the newest are still to be written.
    outcomes: VecDeque<(u32, bool)>,
    outcomes_unsent: usize,
    closure: Closure,
    /// A closed acknowledgement is due on this stream.
    closed_unsent: bool,
}

/// How far the peer's closing of one of its channels went (relink 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closure {
    Open,
    /// The peer closed the channel. We confirm once every message is
    /// consumed and every commit answered, right after acknowledging
    /// them: an acknowledgement of this opening written after the
    /// confirmation would land on the reopened channel.
    Closing,
    /// Confirmed. Of this opening only the confirmation is written again,
    /// after each reconnection, until the peer reopens the channel.
    Closed,
}

impl InChannel {
    fn new() -> Self {
        InChannel {
            received: BEFORE_FIRST,
            consumed: BEFORE_FIRST,
            any_received: false,
            any_consumed: false,
            consumed_told: BEFORE_FIRST,
            received_sent: None,
            consumed_sent: None,
            committed_sent: None,
            uncommitted_sent: None,
            commit: BEFORE_FIRST,
            rollback: BEFORE_FIRST,
            undecided: VecDeque::new(),
            outcomes: VecDeque::new(),
            outcomes_unsent: 0,
            closure: Closure::Open,
            closed_unsent: false,
        }
    }

    /// Whether a received and a consumed acknowledgement are owed, and
    /// whether each is due under `window` (see [`Limits::ack_window`]).
    fn acks_owed(&self, window: u32, release: bool) -> [(bool, bool); 2] {
        let owed = |any: bool, sent: Option<u32>, last: u32| {
            let owed = any && sent != Some(last);
            let due = release || distance(sent.unwrap_or(BEFORE_FIRST), last) >= window.max(1);
            (owed, owed && due)
        };
        [
            owed(self.any_received, self.received_sent, self.received),
            owed(self.any_consumed, self.consumed_sent, self.consumed),
        ]
    }

    /// The received, consumed and outcome acknowledgements due on one of the
    /// peer's channels; received and consumed ones below `window` wait
    /// unless `release`.
    fn transmit_acks(
        &mut self,
        out: &mut Vec<u8>,
        ids: IdSizes,
        channel: ChannelIdRef<'_>,
        window: u32,
        release: bool,
    ) {
        let [(_, received_due), (_, consumed_due)] = self.acks_owed(window, release);
        if received_due {
            push_ack(out, ids, channel, SequenceAck::Received, self.received_sent, self.received);
            self.received_sent = Some(self.received);
        }
        if consumed_due {
            push_ack(out, ids, channel, SequenceAck::Consumed, self.consumed_sent, self.consumed);
            self.consumed_sent = Some(self.consumed);
            self.consumed_told = self.consumed;
        }
        let first = self.outcomes.len() - self.outcomes_unsent;
        for &(seq, committed) in self.outcomes.iter().skip(first) {
            let (ack, sent) = if committed {
                (SequenceAck::Committed, &mut self.committed_sent)
            } else {
                (SequenceAck::Uncommitted, &mut self.uncommitted_sent)
            };
            push_ack(out, ids, channel, ack, *sent, seq);
            *sent = Some(seq);
        }
        self.outcomes_unsent = 0;
    }
}

/// Channel packets waiting for their first transmission, in command order.
#[derive(Debug)]
enum Unsent {
    Message { channels: Vec<ChannelId>, data: MessageData },
    Commit { channel: ChannelId, seq: u32 },
    Rollback { channel: ChannelId, seq: u32 },
    Close { channel: ChannelId },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between streams.
    Down,
    /// Connector: sent our version, awaiting the listener's.
    AwaitVersion,
    /// Connector: sent the request, awaiting the reply.
    AwaitReply,
    Open,
    /// A protocol error ended the stream.
    Failed,
    Done,
}

/// State that lives and dies with one stream.
#[derive(Debug, Default)]
struct StreamState {
    rx: Vec<u8>,
    handshake_tx: Vec<u8>,
    pings: u32,
    // relink 3.4: pongs owed on this stream; not carried to the next.
    pongs: u32,
    /// We owe the peer a resume packet, after our acknowledgements.
    resume_owed: bool,
    /// Whether we may send channel packets: at once on a new link, after
    /// the peer's resume on a resumed one (relink 1).
    peer_resumed: bool,
    /// Whether our resume packet is written; until then the peer must not
    /// send channel operations or messages.
    resume_written: bool,
    unsent: VecDeque<Unsent>,
    shutdown_written: bool,
    /// Acknowledgements held below the ack window go at the next transmit.
    acks_released: bool,
}

/// One Relink link, either role. See the module documentation.
#[derive(Debug)]
pub struct Link {
    role: Role,
    params: Params,
    limits: Limits,
    endpoint_name: String,
    epoch: u64,
    link_id: u64,
    require_old_link_id: bool,
    phase: Phase,
    stream: StreamState,
    out: BTreeMap<ChannelId, OutChannel>,
    inc: BTreeMap<ChannelId, InChannel>,
    events: VecDeque<Event>,
    shutdown_requested: bool,
    shutdown_sent: bool,
    peer_shutdown: bool,
}

impl Link {
    fn new(role: Role, endpoint_name: String, params: Params, limits: Limits) -> Self {
        Link {
            role,
            params,
            limits,
            endpoint_name,
            epoch: 0,
            link_id: 0,
            require_old_link_id: false,
            phase: Phase::Down,
            stream: StreamState::default(),
            out: BTreeMap::new(),
            inc: BTreeMap::new(),
            events: VecDeque::new(),
            shutdown_requested: false,
            shutdown_sent: false,
            peer_shutdown: false,
        }
    }

    /// A connector's link, its handshake started on a fresh stream. Messages
    /// may be sent at once; they go out when the link is connected.
    pub fn connect(config: ConnectorConfig) -> Result<Self, HandshakeError> {
        if config.endpoint_name.len() > usize::from(u8::MAX) {
            return Err(HandshakeError::NameTooLong(config.endpoint_name.len()));
        }
        let mut link =
            Link::new(Role::Connector, config.endpoint_name, config.params, config.limits);
        link.start_handshake(false);
        Ok(link)
    }

    /// A listener's new link from an accepted handshake. `accepted` must not
    /// resume a link: give those to [`Link::resume`].
    pub fn accept(accepted: Accepted, limits: Limits) -> Result<Self, LinkError> {
        if accepted.resumed {
            return Err(LinkError::NotNew(accepted.link_id));
        }
        let mut link = Link::new(Role::Listener, accepted.endpoint_name, accepted.params, limits);
        link.epoch = accepted.epoch;
        link.link_id = accepted.link_id;
        link.open(false);
        link.handle_input(&accepted.leftover)?;
        Ok(link)
    }

    /// Listener: continue this link on the new stream of `accepted`, whose
    /// handshake acknowledged our link id.
    pub fn resume(&mut self, accepted: Accepted) -> Result<(), LinkError> {
        if self.phase == Phase::Done {
            return Err(LinkError::LinkDone);
        }
        if self.role != Role::Listener
            || !accepted.resumed
            || accepted.link_id != self.link_id
            || accepted.epoch != self.epoch
        {
            return Err(LinkError::WrongLink { want: self.link_id, got: accepted.link_id });
        }
        self.reset_stream();
        self.open(true);
        self.handle_input(&accepted.leftover)
    }

    /// Connector: start a handshake on a new stream, offering our epoch and
    /// link id. With `require_old_link_id` the listener drops the stream
    /// instead of starting a new link (relink 1).
    pub fn reconnect(&mut self, require_old_link_id: bool) -> Result<(), CommandError> {
        if self.role != Role::Connector {
            return Err(CommandError::NotConnector);
        }
        if self.phase == Phase::Done {
            return Err(CommandError::LinkDone);
        }
        self.reset_stream();
        self.start_handshake(require_old_link_id);
        Ok(())
    }

    /// Connector: start a handshake on a new stream for a new link,
    /// offering no link id (relink 1). Everything of the old link is
    /// discarded now, as a new link id would discard it: unacknowledged
    /// messages, commits, closures, what the peer sent. Messages sent from
    /// now on go on the new link.
    pub fn reconnect_fresh(&mut self) -> Result<(), CommandError> {
        if self.role != Role::Connector {
            return Err(CommandError::NotConnector);
        }
        if self.phase == Phase::Done {
            return Err(CommandError::LinkDone);
        }
        self.discard_link();
        self.epoch = 0;
        self.link_id = 0;
        self.reset_stream();
        self.start_handshake(false);
        Ok(())
    }

    /// relink 1: state specific to an old link is discarded.
    fn discard_link(&mut self) {
        self.out.clear();
        self.inc.clear();
        self.shutdown_requested = false;
        self.shutdown_sent = false;
        self.peer_shutdown = false;
    }

    /// The stream broke or was closed: forget everything about it. Unsent
    /// and unacknowledged packets go out again after a resumed handshake;
    /// pings and pongs do not (relink 3.4).
    pub fn stream_lost(&mut self) {
        if self.phase == Phase::Done {
            return;
        }
        self.reset_stream();
        self.phase = Phase::Down;
    }

    fn reset_stream(&mut self) {
        self.stream = StreamState::default();
        for channel in self.out.values_mut() {
            channel.commit_sent = None;
            channel.rollback_sent = None;
            channel.close_held = false;
        }
        for channel in self.inc.values_mut() {
            channel.received_sent = None;
            channel.consumed_sent = None;
            channel.committed_sent = None;
            channel.uncommitted_sent = None;
            // relink 3.5: tell the peer everything again before resuming.
            channel.outcomes_unsent = channel.outcomes.len();
            channel.closed_unsent = channel.closure == Closure::Closed;
        }
    }

    fn start_handshake(&mut self, require_old_link_id: bool) {
        self.require_old_link_id = require_old_link_id;
        self.phase = Phase::AwaitVersion;
        push_repr(
            &mut self.stream.handshake_tx,
            |buf| VersionRepr { version: VERSION }.emit(buf),
            VersionRepr::LEN,
        );
    }

    fn open(&mut self, resumed: bool) {
        self.phase = Phase::Open;
        // relink 3.5: everything received is told again on a new stream.
        self.stream.acks_released = true;
        self.stream.resume_owed = resumed;
        self.stream.resume_written = !resumed;
        self.stream.peer_resumed = !resumed;
        if !resumed {
            self.rebuild_unsent();
        }
        self.events.push_back(Event::Connected {
            link_id: self.link_id,
            epoch: self.epoch,
            resumed,
        });
    }

    /// Queue every logged packet for transmission, in channel order.
    fn rebuild_unsent(&mut self) {
        let unsent = &mut self.stream.unsent;
        unsent.clear();
        for (channel, state) in &self.out {
            for item in &state.log {
                let channel = channel.clone();
                unsent.push_back(match item {
                    Logged::Message { data, .. } => {
                        Unsent::Message { channels: vec![channel], data: Arc::clone(data) }
                    }
                    Logged::Commit(seq) => Unsent::Commit { channel, seq: *seq },
                    Logged::Close => Unsent::Close { channel },
                });
            }
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn endpoint_name(&self) -> &str {
        &self.endpoint_name
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The link id, zero before the first handshake.
    pub fn link_id(&self) -> u64 {
        self.link_id
    }

    /// The listener instance's epoch, zero before the first handshake.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether a stream is open (handshake done, not failed or done).
    pub fn is_open(&self) -> bool {
        self.phase == Phase::Open
    }

    /// Whether both peers sent shutdown (relink 3.6).
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Whether we may send channel packets now (not waiting for the peer's
    /// resume).
    pub fn is_messaging(&self) -> bool {
        self.phase == Phase::Open && self.stream.peer_resumed
    }

    /// How many more messages `channel` takes before the peer must
    /// acknowledge consumption.
    pub fn send_window(&self, channel: impl Into<ChannelId>) -> u32 {
        self.window_left(&channel.into())
    }

    fn window_left(&self, channel: &ChannelId) -> u32 {
        let used = self.out.get(channel).map_or(0, OutChannel::unconsumed);
        self.limits.send_window.saturating_sub(used)
    }

    /// Messages the peer has not yet acknowledged received, over all channels.
    pub fn unacknowledged(&self) -> usize {
        self.out
            .values()
            .flat_map(|c| &c.log)
            .filter(|item| matches!(item, Logged::Message { .. }))
            .count()
    }

    /// Whether an acknowledgement is owed that the next
    /// [`poll_transmit`](Self::poll_transmit) holds back, below
    /// [`Limits::ack_window`]: a driver calls
    /// [`release_acks`](Self::release_acks) once it has waited long enough.
    pub fn acks_held(&self) -> bool {
        // A window of one holds nothing back.
        if self.limits.ack_window <= 1 {
            return false;
        }
        if self.phase != Phase::Open || self.stream.acks_released || self.shutdown_requested {
            return false;
        }
        let window = self.limits.ack_window;
        self.inc.values().any(|state| {
            state.closure == Closure::Open
                && state.acks_owed(window, false).iter().any(|&(owed, due)| owed && !due)
        })
    }

    /// Lets the next [`poll_transmit`](Self::poll_transmit) write every
    /// acknowledgement held below the ack window.
    pub fn release_acks(&mut self) {
        self.stream.acks_released = true;
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Sends a message on one of our channels; returns its sequence number.
    /// While the link waits for a stream or the peer's resume, the message
    /// is queued.
    pub fn send(
        &mut self,
        channel: impl Into<ChannelId>,
        parts: &[&[u8]],
    ) -> Result<u32, CommandError> {
        let seqs = self.send_to(vec![channel.into()], parts)?;
        Ok(seqs[0])
    }

    /// Sends one message to several of our channels in one multicast
    /// packet (relink 2.3), each channel numbering it in its own sequence
    /// (relink 3.1); a repeated channel gets it repeatedly. Returns the
    /// sequence numbers in the order of `channels`. All or nothing: a full
    /// window on any of them refuses the whole message.
    pub fn send_multicast<C: Clone + Into<ChannelId>>(
        &mut self,
        channels: &[C],
        parts: &[&[u8]],
    ) -> Result<Vec<u32>, CommandError> {
        self.send_to(channels.iter().cloned().map(Into::into).collect(), parts)
    }

    fn send_to(
        &mut self,
        channels: Vec<ChannelId>,
        parts: &[&[u8]],
    ) -> Result<Vec<u32>, CommandError> {
        self.check_send(&channels, parts)?;
        let data: MessageData = Arc::new(parts.iter().map(|p| p.to_vec()).collect());
        let mut seqs = Vec::with_capacity(channels.len());
        for channel in &channels {
            let state = self.out.entry(channel.clone()).or_insert_with(OutChannel::new);
            if state.closed {
                state.reopen();
            }
            let seq = state.next_seq;
            state.next_seq = seq.wrapping_add(1);
            state.log.push_back(Logged::Message { seq, data: Arc::clone(&data) });
            seqs.push(seq);
        }
        if self.is_messaging() && !channels.is_empty() {
            self.stream.unsent.push_back(Unsent::Message { channels, data });
        }
        Ok(seqs)
    }

    /// Whether the peer acknowledged consuming our message `seq` on
    /// `channel` (relink 3.1: consumption is acknowledged in order, so
    /// every earlier message too). A closure the peer confirmed covers
    /// every message of the channel; once the channel reopens, sequence
    /// numbers name the messages of the new opening.
    pub fn is_consumed(
        &self,
        channel: impl Into<ChannelId>,
        seq: u32,
    ) -> Result<bool, CommandError> {
        let channel = channel.into();
        let Some(state) = self.out.get(&channel) else {
            return Err(CommandError::NotSent { channel, seq });
        };
        // How far back `seq` lies; beyond half the number space it is
        // ahead of the channel, not behind (serial number arithmetic).
        let back = state.next_seq.wrapping_sub(seq);
        if back == 0 || back > i32::MAX as u32 {
            return Err(CommandError::NotSent { channel, seq });
        }
        Ok(back > state.unconsumed())
    }

    fn check_send(&self, channels: &[ChannelId], parts: &[&[u8]]) -> Result<(), CommandError> {
        if self.phase == Phase::Done {
            return Err(CommandError::LinkDone);
        }
        if self.shutdown_requested {
            return Err(CommandError::ShutDown);
        }
        let wire = &self.limits.wire;
        if parts.len() > wire.max_parts as usize {
            return Err(CommandError::TooManyParts { count: parts.len(), max: wire.max_parts });
        }
        if channels.len() > wire.max_channel_ids as usize {
            return Err(CommandError::TooManyChannels {
                count: channels.len(),
                max: wire.max_channel_ids,
            });
        }
        let id_len = self.params.id_len(self.role);
        let mut counts: BTreeMap<&ChannelId, u32> = BTreeMap::new();
        for channel in channels {
            if !channel.fits(id_len) {
                return Err(CommandError::ChannelIdTooWide {
                    channel: channel.clone(),
                    len: id_len,
                });
            }
            *counts.entry(channel).or_default() += 1;
        }
        for (&channel, &count) in &counts {
            let state = self.out.get(channel);
            if state.is_some_and(|s| s.closing) {
                return Err(CommandError::ChannelClosing { channel: channel.clone() });
            }
            // More copies than a whole window would never fit: not a wait.
            if count > self.limits.send_window {
                return Err(CommandError::BeyondWindow {
                    channel: channel.clone(),
                    count,
                    window: self.limits.send_window,
                });
            }
            if self.window_left(channel) < count {
                return Err(CommandError::Blocked { channel: channel.clone() });
            }
        }
        // Check the largest packet this message may become: multicast now,
        // or unicast after a reconnection.
        let target = if channels.len() > 1 {
            Target::Multicast(ChannelIds::from_ids(channels))
        } else {
            // Every id takes the negotiated size, whatever its value.
            Target::Unicast(0.into())
        };
        let len = PacketRepr::Message(MessageRepr::new(target, parts))
            .buffer_len(self.params.sender_ids(self.role));
        if len > wire.max_packet_len {
            return Err(CommandError::MessageTooLong { len, max: wire.max_packet_len });
        }
        Ok(())
    }

    fn transaction_target(&self, channel: &ChannelId) -> Result<u32, CommandError> {
        if !self.params.transactions(self.role) {
            return Err(CommandError::TransactionsNotNegotiated);
        }
        if self.phase == Phase::Done {
            return Err(CommandError::LinkDone);
        }
        let channel = channel.clone();
        let Some(state) = self.out.get(&channel) else {
            return Err(CommandError::NothingToCommit { channel });
        };
        // Outcomes precede the peer's confirmation of a closure, so nothing
        // of a closing or closed opening is left to decide.
        if state.closing {
            return Err(CommandError::ChannelClosing { channel });
        }
        if state.closed {
            return Err(CommandError::ChannelNotOpen { channel });
        }
        let last = state.next_seq.wrapping_sub(1);
        if last == state.transaction_end {
            return Err(CommandError::NothingToCommit { channel });
        }
        Ok(last)
    }

    /// Asks the peer to process our messages on `channel` sent since the
    /// last commit or rollback (relink 3.2); returns the last one's sequence
    /// number. The outcome arrives as [`Event::Committed`] or
    /// [`Event::Uncommitted`].
    pub fn commit(&mut self, channel: impl Into<ChannelId>) -> Result<u32, CommandError> {
        let channel = channel.into();
        let seq = self.transaction_target(&channel)?;
        let messaging = self.is_messaging();
        let Some(state) = self.out.get_mut(&channel) else {
            return Err(CommandError::NothingToCommit { channel });
        };
        if state.pending_commits() >= MAX_PENDING_COMMITS {
            return Err(CommandError::TooManyPendingCommits { channel });
        }
        state.transaction_end = seq;
        state.log.push_back(Logged::Commit(seq));
        if messaging {
            self.stream.unsent.push_back(Unsent::Commit { channel, seq });
        }
        Ok(seq)
    }

    /// Asks the peer to ignore our messages on `channel` sent since the
    /// last commit or rollback. Not acknowledged and not sent again after a
    /// reconnection (relink 3.2).
    pub fn rollback(&mut self, channel: impl Into<ChannelId>) -> Result<u32, CommandError> {
        let channel = channel.into();
        let seq = self.transaction_target(&channel)?;
        let messaging = self.is_messaging();
        if let Some(state) = self.out.get_mut(&channel) {
            state.transaction_end = seq;
        }
        if messaging {
            self.stream.unsent.push_back(Unsent::Rollback { channel, seq });
        }
        Ok(seq)
    }

    /// Closes our `channel` after the messages sent on it (relink 3.3);
    /// [`Event::Closed`] follows the peer's acknowledgement, which it sends
    /// once it has consumed them. Sending on it again afterwards reopens
    /// it, numbered from 0.
    pub fn close(&mut self, channel: impl Into<ChannelId>) -> Result<(), CommandError> {
        let channel = channel.into();
        if self.phase == Phase::Done {
            return Err(CommandError::LinkDone);
        }
        let messaging = self.is_messaging();
        let state = match self.out.get_mut(&channel) {
            Some(state) if !state.closing && !state.closed => state,
            _ => return Err(CommandError::ChannelNotOpen { channel }),
        };
        state.closing = true;
        state.log.push_back(Logged::Close);
        if messaging {
            self.stream.unsent.push_back(Unsent::Close { channel });
        }
        Ok(())
    }

    /// Whether our close of `channel` awaits the peer's confirmation.
    pub fn is_closing(&self, channel: impl Into<ChannelId>) -> bool {
        self.out.get(&channel.into()).is_some_and(|s| s.closing)
    }

    /// Whether the peer confirmed our close of `channel`, which has not
    /// reopened since.
    pub fn is_closed(&self, channel: impl Into<ChannelId>) -> bool {
        self.out.get(&channel.into()).is_some_and(|s| s.closed)
    }

    /// Whether our commit through `seq` on `channel` awaits its outcome.
    pub fn awaits_outcome(&self, channel: impl Into<ChannelId>, seq: u32) -> bool {
        let Some(state) = self.out.get(&channel.into()) else {
            return false;
        };
        state.log.iter().any(|item| matches!(item, Logged::Commit(pending) if *pending == seq))
    }

    /// Acknowledges that the application consumed the peer's messages on
    /// `channel` through `seq` (relink 3.1).
    pub fn consume(&mut self, channel: impl Into<ChannelId>, seq: u32) -> Result<(), CommandError> {
        let channel = channel.into();
        let Some(state) = self.inc.get_mut(&channel) else {
            return Err(CommandError::NoSuchMessage { channel, seq });
        };
        let d = distance(state.consumed, seq);
        if d == 0 || d > distance(state.consumed, state.received) {
            return Err(CommandError::NoSuchMessage { channel, seq });
        }
        state.consumed = seq;
        state.any_consumed = true;
        Ok(())
    }

    /// Answers the oldest [`Event::Commit`] on `channel` (relink 3.2).
    pub fn resolve_commit(
        &mut self,
        channel: impl Into<ChannelId>,
        seq: u32,
        committed: bool,
    ) -> Result<(), CommandError> {
        let channel = channel.into();
        let Some(state) = self.inc.get_mut(&channel).filter(|s| s.undecided.front() == Some(&seq))
        else {
            return Err(CommandError::NoPendingCommit { channel, seq });
        };
        state.undecided.pop_front();
        if state.outcomes.len() == MAX_PENDING_COMMITS {
            state.outcomes.pop_front();
        }
        state.outcomes.push_back((seq, committed));
        state.outcomes_unsent = (state.outcomes_unsent + 1).min(state.outcomes.len());
        Ok(())
    }

    /// Sends a ping; the peer's pong arrives as [`Event::Pong`] (relink 3.4).
    pub fn ping(&mut self) -> Result<(), CommandError> {
        if self.phase != Phase::Open {
            return Err(CommandError::NotOpen);
        }
        self.stream.pings = self.stream.pings.saturating_add(1);
        Ok(())
    }

    /// Announces that we open no more channels (relink 3.6). Sent after
    /// everything queued; the link is done once the peer sends its own.
    pub fn shutdown(&mut self) {
        self.shutdown_requested = true;
    }

    /// Appends the bytes to send to `out`; returns how many. Everything
    /// appended must be written to the stream, in order.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.append(&mut self.stream.handshake_tx);
        if self.phase != Phase::Open {
            return out.len() - start;
        }
        let ids = self.params.sender_ids(self.role);
        for _ in 0..core::mem::take(&mut self.stream.pongs) {
            push_packet(out, &PacketRepr::General(GeneralType::Pong), ids);
        }
        for _ in 0..core::mem::take(&mut self.stream.pings) {
            push_packet(out, &PacketRepr::General(GeneralType::Ping), ids);
        }
        self.transmit_acks(out, ids);
        if core::mem::take(&mut self.stream.resume_owed) {
            // relink 3.5: resume after telling the peer all we received.
            push_packet(out, &PacketRepr::General(GeneralType::Resume), ids);
            self.stream.resume_written = true;
        }
        if self.stream.peer_resumed {
            while let Some(item) = self.stream.unsent.pop_front() {
                self.transmit_unsent(out, ids, item);
            }
            // After every close, even one that waits for an acknowledgement:
            // nothing may follow the shutdown packet.
            if self.shutdown_requested
                && !self.stream.shutdown_written
                && !self.out.values().any(|c| c.close_held)
            {
                push_packet(out, &PacketRepr::General(GeneralType::Shutdown), ids);
                self.stream.shutdown_written = true;
                self.shutdown_sent = true;
                self.check_done();
            }
        }
        out.len() - start
    }

    fn transmit_acks(&mut self, out: &mut Vec<u8>, ids: IdSizes) {
        let window = self.limits.ack_window;
        // Nothing held may be left behind the shutdown packet.
        let release = core::mem::take(&mut self.stream.acks_released) || self.shutdown_requested;
        for (channel, state) in &mut self.inc {
            if state.closure != Closure::Closed {
                // relink 3.3: a closure is confirmed right after the last
                // acknowledgements, never before them.
                let release = release || state.closure == Closure::Closing;
                state.transmit_acks(out, ids, channel.as_id_ref(), window, release);
            }
            if state.closure == Closure::Closing
                && state.consumed == state.received
                && state.undecided.is_empty()
            {
                // relink 3.3: confirm after the acknowledgements above.
                state.closure = Closure::Closed;
                state.closed_unsent = true;
            }
            if core::mem::take(&mut state.closed_unsent) {
                let packet = PacketRepr::Acknowledgement {
                    target: Target::Unicast(channel.as_id_ref()),
                    ack: ChannelAck::Closed,
                };
                push_packet(out, &packet, ids);
            }
        }
    }

    fn transmit_unsent(&mut self, out: &mut Vec<u8>, ids: IdSizes, item: Unsent) {
        match item {
            Unsent::Message { channels, data } => {
                let parts: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                let target = match channels.as_slice() {
                    [channel] => Target::Unicast(channel.as_id_ref()),
                    _ => Target::Multicast(ChannelIds::from_ids(&channels)),
                };
                push_packet(out, &PacketRepr::Message(MessageRepr::new(target, &parts)), ids);
            }
            Unsent::Commit { channel, seq } => {
                let Some(state) = self.out.get_mut(&channel) else {
                    return;
                };
                let id = channel.as_id_ref();
                push_op(out, ids, id, SequenceOp::Commit, state.commit_sent, seq);
                state.commit_sent = Some(seq);
            }
            Unsent::Rollback { channel, seq } => {
                let Some(state) = self.out.get_mut(&channel) else {
                    return;
                };
                let id = channel.as_id_ref();
                push_op(out, ids, id, SequenceOp::Rollback, state.rollback_sent, seq);
                state.rollback_sent = Some(seq);
            }
            Unsent::Close { channel } => {
                let Some(state) = self.out.get_mut(&channel).filter(|s| s.closing) else {
                    return;
                };
                if state.peer_may_repeat_closed {
                    state.close_held = true;
                    return;
                }
                let packet = PacketRepr::Operation {
                    target: Target::Unicast(channel.as_id_ref()),
                    op: ChannelOp::Close,
                };
                push_packet(out, &packet, ids);
            }
        }
    }

    /// Feeds bytes received from the stream. On error the stream must be
    /// closed; the link stays usable for [`Link::stream_lost`] and a later
    /// resumption.
    pub fn handle_input(&mut self, bytes: &[u8]) -> Result<(), LinkError> {
        match self.phase {
            Phase::Done => return Ok(()),
            Phase::Down | Phase::Failed => return Err(LinkError::NoStream),
            Phase::AwaitVersion | Phase::AwaitReply | Phase::Open => {}
        }
        let mut rx = core::mem::take(&mut self.stream.rx);
        rx.extend_from_slice(bytes);
        let mut at = 0;
        let result = loop {
            match self.step(&rx[at..]) {
                Ok(Some(len)) => at += len,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        rx.drain(..at);
        self.stream.rx = rx;
        if result.is_err() {
            self.phase = Phase::Failed;
            self.stream.rx.clear();
        }
        result
    }

    /// Handles one unit from the front of `buf`: its length, or `None` when
    /// more bytes are needed.
    fn step(&mut self, buf: &[u8]) -> Result<Option<usize>, LinkError> {
        match self.phase {
            Phase::AwaitVersion => match VersionRepr::parse(buf) {
                Parsed::Incomplete { .. } => Ok(None),
                Parsed::Complete { value, len } => {
                    // relink 1: the listener answers our version or a lower
                    // one; we speak only version 0.
                    if value.version != VERSION {
                        return Err(HandshakeError::VersionUnsupported(value.version).into());
                    }
                    self.send_request();
                    self.phase = Phase::AwaitReply;
                    Ok(Some(len))
                }
            },
            Phase::AwaitReply => match ReplyRepr::parse(buf).map_err(HandshakeError::from)? {
                Parsed::Incomplete { .. } => Ok(None),
                Parsed::Complete { value, len } => {
                    self.handle_reply(value)?;
                    Ok(Some(len))
                }
            },
            Phase::Open => {
                let ids = self.params.sender_ids(self.role.peer());
                match PacketRepr::parse(buf, ids, &self.limits.wire)? {
                    Parsed::Incomplete { .. } => Ok(None),
                    Parsed::Complete { value, len } => {
                        self.handle_packet(&value)?;
                        Ok(Some(len))
                    }
                }
            }
            // relink 3.6: after both shutdowns nothing more matters.
            Phase::Done if !buf.is_empty() => Ok(Some(buf.len())),
            Phase::Done | Phase::Down | Phase::Failed => Ok(None),
        }
    }

    fn send_request(&mut self) {
        let mut flags = self.params.flags();
        flags.set(HandshakeFlags::REQUIRE_OLD_LINK_ID, self.require_old_link_id);
        let request = RequestRepr {
            name: &self.endpoint_name,
            connector_id_len: self.params.connector_id_len,
            listener_id_len: self.params.listener_id_len,
            flags,
            epoch: self.epoch,
            link_id: self.link_id,
        };
        let len = request.buffer_len();
        push_repr(&mut self.stream.handshake_tx, |buf| request.emit(buf), len);
    }

    fn handle_reply(&mut self, reply: ReplyRepr) -> Result<(), HandshakeError> {
        if reply.link_id == 0 {
            // relink 1: zero means the required old link is unknown.
            return Err(if self.require_old_link_id {
                HandshakeError::LinkLost(self.link_id)
            } else {
                HandshakeError::ZeroLinkId
            });
        }
        let resumed =
            self.link_id != 0 && reply.epoch == self.epoch && reply.link_id == self.link_id;
        if self.require_old_link_id && !resumed {
            return Err(HandshakeError::LinkLost(self.link_id));
        }
        if !resumed && self.link_id != 0 {
            // relink 1: a new link id or epoch discards the old link's state.
            self.discard_link();
        }
        self.epoch = reply.epoch;
        self.link_id = reply.link_id;
        self.open(resumed);
        Ok(())
    }

    fn handle_packet(&mut self, packet: &PacketRepr<'_>) -> Result<(), LinkError> {
        match *packet {
            PacketRepr::General(kind) => self.handle_general(kind),
            PacketRepr::Operation { target, op } => {
                self.check_resume_written()?;
                let op = match op {
                    ChannelOp::Commit => Some(SequenceOp::Commit),
                    ChannelOp::Rollback => Some(SequenceOp::Rollback),
                    ChannelOp::Close => None,
                };
                for channel in target.iter() {
                    match op {
                        Some(op) => self.handle_transaction_op(channel, op, None)?,
                        None => self.handle_close(channel),
                    }
                }
                Ok(())
            }
            PacketRepr::SequenceOperation { target, op, seq } => {
                self.check_resume_written()?;
                target
                    .iter()
                    .try_for_each(|channel| self.handle_transaction_op(channel, op, Some(seq)))
            }
            PacketRepr::Acknowledgement { target, ack } => {
                let ack = match ack {
                    ChannelAck::Received => SequenceAck::Received,
                    ChannelAck::Consumed => SequenceAck::Consumed,
                    ChannelAck::Committed => SequenceAck::Committed,
                    ChannelAck::Uncommitted => SequenceAck::Uncommitted,
                    ChannelAck::Closed => {
                        target.iter().for_each(|channel| self.handle_closed(channel));
                        return Ok(());
                    }
                };
                target.iter().try_for_each(|channel| self.handle_ack(channel, ack, None))
            }
            PacketRepr::SequenceAcknowledgement { target, ack, seq } => {
                target.iter().try_for_each(|channel| self.handle_ack(channel, ack, Some(seq)))
            }
            PacketRepr::Message(message) => {
                self.check_resume_written()?;
                for channel in message.target.iter() {
                    self.handle_message(channel, &message.parts)?;
                }
                Ok(())
            }
        }
    }

    fn handle_general(&mut self, kind: GeneralType) -> Result<(), LinkError> {
        match kind {
            GeneralType::Nop => {}
            // relink 3.4: every ping gets a pong.
            GeneralType::Ping => self.stream.pongs = self.stream.pongs.saturating_add(1),
            GeneralType::Pong => self.events.push_back(Event::Pong),
            GeneralType::Resume => {
                if self.stream.peer_resumed {
                    return Err(LinkError::UnexpectedResume);
                }
                // relink 3.5: the peer told us all it received; send the rest.
                self.stream.peer_resumed = true;
                self.rebuild_unsent();
                self.events.push_back(Event::PeerResumed);
            }
            GeneralType::Shutdown => {
                if !self.peer_shutdown {
                    self.peer_shutdown = true;
                    self.events.push_back(Event::PeerShutdown);
                    self.check_done();
                }
            }
        }
        Ok(())
    }

    /// relink 1: no messaging on a resumed link before it is resumed.
    fn check_resume_written(&self) -> Result<(), LinkError> {
        if self.stream.resume_written { Ok(()) } else { Err(LinkError::MessageBeforeResume) }
    }

    fn check_done(&mut self) {
        if self.shutdown_sent && self.peer_shutdown && self.phase != Phase::Done {
            self.phase = Phase::Done;
            self.events.push_back(Event::Done);
        }
    }

    fn handle_message(
        &mut self,
        channel: ChannelIdRef<'_>,
        parts: &Parts<'_>,
    ) -> Result<(), LinkError> {
        let channel = known_id(&self.inc, channel);
        let state = self.inc.entry(channel.clone()).or_insert_with(InChannel::new);
        match state.closure {
            Closure::Open => {}
            // relink 3.3: the peer reopens only after our confirmation.
            Closure::Closing => return Err(LinkError::MessageWhileClosing { channel }),
            // relink 3.3: reopened; relink 3.1: numbered from 0 again.
            Closure::Closed => *state = InChannel::new(),
        }
        let seq = state.received.wrapping_add(1);
        let max = self.limits.recv_window;
        if distance(state.consumed_told, seq) > max {
            return Err(LinkError::WindowExceeded { channel, max });
        }
        state.received = seq;
        state.any_received = true;
        self.events.push_back(Event::Message { channel, seq, parts: parts.to_vecs() });
        Ok(())
    }

    fn handle_close(&mut self, channel: ChannelIdRef<'_>) {
        let channel = known_id(&self.inc, channel);
        let state = self.inc.entry(channel.clone()).or_insert_with(InChannel::new);
        match state.closure {
            Closure::Open => {
                state.closure = Closure::Closing;
                self.events.push_back(Event::PeerClosed { channel });
            }
            // Repeated after a reconnection: confirmed once consumed.
            Closure::Closing => {}
            // relink 3.3: confirmed before; confirm again.
            Closure::Closed => state.closed_unsent = true,
        }
    }

    fn handle_transaction_op(
        &mut self,
        channel: ChannelIdRef<'_>,
        op: SequenceOp,
        seq: Option<u32>,
    ) -> Result<(), LinkError> {
        let channel = known_id(&self.inc, channel);
        if !self.params.transactions(self.role.peer()) {
            return Err(LinkError::TransactionsNotNegotiated { channel });
        }
        let state = self.inc.entry(channel.clone()).or_insert_with(InChannel::new);
        let cursor = match op {
            SequenceOp::Commit => state.commit,
            SequenceOp::Rollback => state.rollback,
        };
        let target = seq.unwrap_or(cursor.wrapping_add(1));
        if is_stale(cursor, target) {
            // relink 3.2: a commit sent again after a reconnection.
            return Ok(());
        }
        if distance(cursor, target) > distance(cursor, state.received) {
            return Err(LinkError::OpBeyondReceived { channel, seq: target });
        }
        match op {
            SequenceOp::Commit => {
                if state.undecided.len() >= MAX_PENDING_COMMITS {
                    return Err(LinkError::TooManyCommits { channel, max: MAX_PENDING_COMMITS });
                }
                state.commit = target;
                state.undecided.push_back(target);
                self.events.push_back(Event::Commit { channel, seq: target });
            }
            SequenceOp::Rollback => {
                state.rollback = target;
                self.events.push_back(Event::Rollback { channel, seq: target });
            }
        }
        Ok(())
    }

    fn handle_ack(
        &mut self,
        channel: ChannelIdRef<'_>,
        ack: SequenceAck,
        seq: Option<u32>,
    ) -> Result<(), LinkError> {
        let channel = known_id(&self.out, channel);
        let transactional = matches!(ack, SequenceAck::Committed | SequenceAck::Uncommitted);
        if transactional && !self.params.transactions(self.role) {
            return Err(LinkError::TransactionsNotNegotiated { channel });
        }
        let Some(state) = self.out.get_mut(&channel) else {
            return Err(if transactional {
                LinkError::UnexpectedOutcome { channel, seq: seq.unwrap_or(0) }
            } else {
                LinkError::AckBeyondSent { channel, seq: seq.unwrap_or(0) }
            });
        };
        let cursor = match ack {
            SequenceAck::Received => &mut state.received,
            SequenceAck::Consumed => &mut state.consumed,
            SequenceAck::Committed => &mut state.committed,
            SequenceAck::Uncommitted => &mut state.uncommitted,
        };
        let target = seq.unwrap_or(cursor.wrapping_add(1));
        if !transactional {
            if is_stale(*cursor, target) {
                // Repeated after a reconnection (relink 3.5).
                return Ok(());
            }
            let sent = state.next_seq.wrapping_sub(cursor.wrapping_add(1));
            if distance(*cursor, target) > sent {
                return Err(LinkError::AckBeyondSent { channel, seq: target });
            }
            *cursor = target;
            state.trim_log();
            // The peer holds this opening now, so our close may go.
            state.peer_may_repeat_closed = false;
            if core::mem::take(&mut state.close_held) {
                self.stream.unsent.push_back(Unsent::Close { channel });
            }
            return Ok(());
        }
        let pending = state.log.iter().enumerate().find_map(|(i, item)| match item {
            Logged::Commit(seq) => Some((i, *seq)),
            _ => None,
        });
        match pending {
            Some((index, pending_seq)) if pending_seq == target => {
                *cursor = target;
                state.log.remove(index);
                self.events.push_back(if ack == SequenceAck::Committed {
                    Event::Committed { channel, seq: target }
                } else {
                    Event::Uncommitted { channel, seq: target }
                });
                Ok(())
            }
            // relink 3.2: an outcome repeated after a reconnection, older
            // than any commit still waiting.
            Some((_, pending_seq)) if !is_stale(target, pending_seq) => {
                *cursor = target;
                Ok(())
            }
            None => {
                *cursor = target;
                Ok(())
            }
            Some(_) => Err(LinkError::UnexpectedOutcome { channel, seq: target }),
        }
    }

    fn handle_closed(&mut self, channel: ChannelIdRef<'_>) {
        let channel = known_id(&self.out, channel);
        let Some(state) = self.out.get_mut(&channel) else {
            return;
        };
        // Otherwise a repeat about an earlier closure.
        if !state.closing || state.peer_may_repeat_closed {
            return;
        }
        // relink 3.3: the peer confirms once it has every message sent
        // before the close, so all of them are acknowledged, even those
        // whose acknowledgements a broken stream lost. It answers every
        // commit before confirming too: a commit still logged lost its
        // outcome with such a stream and is not sent again.
        let last = state.next_seq.wrapping_sub(1);
        state.received = last;
        state.consumed = last;
        state.log.clear();
        state.closing = false;
        state.closed = true;
        self.events.push_back(Event::Closed { channel });
    }
}

/// The id `map` keeps for the channel a packet names, else a new one: a
/// known channel's id is shared, not allocated again, for every packet.
fn known_id<V>(map: &BTreeMap<ChannelId, V>, id: ChannelIdRef<'_>) -> ChannelId {
    let mut scratch = [0; 8];
    match map.get_key_value(id.le_bytes(&mut scratch)) {
        Some((known, _)) => known.clone(),
        None => id.into(),
    }
}

/// Appends a value of `len` bytes written by `emit`.
fn push_repr(
    out: &mut Vec<u8>,
    emit: impl FnOnce(&mut [u8]) -> Result<usize, EmitError>,
    len: usize,
) {
    let at = out.len();
    out.resize(at + len, 0);
    if emit(&mut out[at..]).is_err() {
        // Every value is checked when its command is accepted.
        debug_assert!(false, "relink: emit of a checked value failed");
        out.truncate(at);
    }
}

fn push_packet(out: &mut Vec<u8>, packet: &PacketRepr<'_>, ids: IdSizes) {
    push_repr(out, |buf| packet.emit(buf, ids), packet.buffer_len(ids));
}

/// An acknowledgement through `seq`, short when it targets the message
/// after the last one this type targeted on this stream.
fn push_ack(
    out: &mut Vec<u8>,
    ids: IdSizes,
    channel: ChannelIdRef<'_>,
    ack: SequenceAck,
    last: Option<u32>,
    seq: u32,
) {
    let target = Target::Unicast(channel);
    let packet = if last.map(|l| l.wrapping_add(1)) == Some(seq) {
        let ack = match ack {
            SequenceAck::Received => ChannelAck::Received,
            SequenceAck::Consumed => ChannelAck::Consumed,
            SequenceAck::Committed => ChannelAck::Committed,
            SequenceAck::Uncommitted => ChannelAck::Uncommitted,
        };
        PacketRepr::Acknowledgement { target, ack }
    } else {
        PacketRepr::SequenceAcknowledgement { target, ack, seq }
    };
    push_packet(out, &packet, ids);
}

/// An operation through `seq`, short like [`push_ack`].
fn push_op(
    out: &mut Vec<u8>,
    ids: IdSizes,
    channel: ChannelIdRef<'_>,
    op: SequenceOp,
    last: Option<u32>,
    seq: u32,
) {
    let target = Target::Unicast(channel);
    let packet = if last.map(|l| l.wrapping_add(1)) == Some(seq) {
        let op = match op {
            SequenceOp::Commit => ChannelOp::Commit,
            SequenceOp::Rollback => ChannelOp::Rollback,
        };
        PacketRepr::Operation { target, op }
    } else {
        PacketRepr::SequenceOperation { target, op, seq }
    };
    push_packet(out, &packet, ids);
}

/// A listener instance (relink 1): its epoch, the endpoint names it serves
/// with their parameters, and the link ids it has issued.
#[derive(Debug, Clone)]
pub struct Listener {
    epoch: u64,
    /// Each name with the parameters its connectors must agree on.
    names: Vec<(String, Params)>,
    params: Params,
    links: BTreeSet<u64>,
    next_link_id: u64,
}

/// Last epoch handed out in this process, so that two listener instances
/// never share one even within a microsecond.
static LAST_EPOCH: AtomicU64 = AtomicU64::new(0);

fn new_epoch() -> u64 {
    // relink 1: microseconds since 1970-01-01 UTC.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut last = LAST_EPOCH.load(Ordering::Relaxed);
    loop {
        let epoch = now.max(last.saturating_add(1));
        match LAST_EPOCH.compare_exchange_weak(last, epoch, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return epoch,
            Err(seen) => last = seen,
        }
    }
}

impl Listener {
    /// A listener instance starting now, serving `names` with `params`.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>, params: Params) -> Self {
        Listener {
            epoch: new_epoch(),
            names: names.into_iter().map(|name| (name.into(), params)).collect(),
            params,
            links: BTreeSet::new(),
            next_link_id: 1,
        }
    }

    /// The same with a chosen epoch (tests, restarts).
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The parameters of the names given to [`new`](Self::new).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Serves `name` with its own `params` (relink 1: endpoint names host
    /// several services at one address), replacing what it had.
    pub fn serve(&mut self, name: impl Into<String>, params: Params) {
        let name = name.into();
        match self.names.iter_mut().find(|(known, _)| *known == name) {
            Some(entry) => entry.1 = params,
            None => self.names.push((name, params)),
        }
    }

    /// The parameters `name` is served with, if it is.
    pub fn params_for(&self, name: &str) -> Option<&Params> {
        self.names.iter().find(|(known, _)| known == name).map(|(_, params)| params)
    }

    /// Whether `link_id` was issued and not forgotten.
    pub fn knows(&self, link_id: u64) -> bool {
        self.links.contains(&link_id)
    }

    /// Forgets a link that is done; a connector offering it gets a new one.
    pub fn forget(&mut self, link_id: u64) {
        self.links.remove(&link_id);
    }

    /// A new, unique link id in [1, 2^63) (relink 1).
    fn allocate(&mut self) -> u64 {
        loop {
            let id = self.next_link_id;
            self.next_link_id = if id + 1 >= LINK_ID_END { 1 } else { id + 1 };
            if self.links.insert(id) {
                return id;
            }
        }
    }
}

/// A listener's completed handshake on one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub endpoint_name: String,
    pub params: Params,
    pub epoch: u64,
    pub link_id: u64,
    /// The connector's old link goes on: hand this to that [`Link::resume`].
    pub resumed: bool,
    /// Bytes that followed the handshake.
    leftover: Vec<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum AcceptPhase {
    #[default]
    AwaitVersion,
    AwaitRequest,
    Finished,
}

/// The listener side of one stream's handshake (relink 1).
#[derive(Debug, Default)]
pub struct Acceptor {
    phase: AcceptPhase,
    rx: Vec<u8>,
    tx: Vec<u8>,
}

impl Acceptor {
    pub fn new() -> Self {
        Acceptor::default()
    }

    /// Feeds received bytes. Returns the accepted handshake once complete.
    /// After every call, successful or not, write out
    /// [`poll_transmit`](Self::poll_transmit): a lost required link is
    /// answered before the stream closes.
    pub fn handle_input(
        &mut self,
        bytes: &[u8],
        listener: &mut Listener,
    ) -> Result<Option<Accepted>, HandshakeError> {
        if self.phase == AcceptPhase::Finished {
            return Ok(None);
        }
        self.rx.extend_from_slice(bytes);
        if self.phase == AcceptPhase::AwaitVersion {
            let Parsed::Complete { len, .. } = VersionRepr::parse(&self.rx) else {
                return Ok(None);
            };
            self.rx.drain(..len);
            // relink 1: answer with the same or a lower version. We speak
            // only version 0, the lowest, so that is the answer to any; a
            // connector that cannot speak it ends the connection.
            let version = VersionRepr { version: VERSION };
            push_repr(&mut self.tx, |buf| version.emit(buf), VersionRepr::LEN);
            self.phase = AcceptPhase::AwaitRequest;
        }
        let result = self.handle_request(listener);
        if !matches!(result, Ok(None)) {
            self.phase = AcceptPhase::Finished;
        }
        result
    }

    fn handle_request(
        &mut self,
        listener: &mut Listener,
    ) -> Result<Option<Accepted>, HandshakeError> {
        let (request, len) = match RequestRepr::parse(&self.rx)? {
            Parsed::Incomplete { .. } => return Ok(None),
            Parsed::Complete { value, len } => (value, len),
        };
        // relink 1: unknown names and disagreements end the connection.
        let Some(&ours) = listener.params_for(request.name) else {
            return Err(HandshakeError::UnknownEndpoint(request.name.to_owned()));
        };
        let theirs = Params::from_request(&request);
        if theirs != ours {
            return Err(HandshakeError::ParamsMismatch { ours, theirs });
        }
        let known = request.link_id != 0
            && request.epoch == listener.epoch
            && listener.knows(request.link_id);
        let epoch = listener.epoch;
        if !known && request.flags.contains(HandshakeFlags::REQUIRE_OLD_LINK_ID) {
            // relink 1: reply with the zero link id and disconnect.
            let reply = ReplyRepr { epoch, link_id: 0 };
            push_repr(&mut self.tx, |buf| reply.emit(buf), ReplyRepr::LEN);
            return Err(HandshakeError::LinkLost(request.link_id));
        }
        let link_id = if known { request.link_id } else { listener.allocate() };
        let accepted = Accepted {
            endpoint_name: request.name.to_owned(),
            params: theirs,
            epoch,
            link_id,
            resumed: known,
            leftover: self.rx[len..].to_vec(),
        };
        let reply = ReplyRepr { epoch, link_id };
        push_repr(&mut self.tx, |buf| reply.emit(buf), ReplyRepr::LEN);
        self.rx.clear();
        Ok(Some(accepted))
    }

    /// Appends the bytes to send to `out`; returns how many.
    pub fn poll_transmit(&mut self, out: &mut Vec<u8>) -> usize {
        let len = self.tx.len();
        out.append(&mut self.tx);
        len
    }
}
