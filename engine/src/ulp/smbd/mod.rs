//! SMB Direct data transfer (MS-SMBD) over the endpoint's messages.
//!
//! A [`Connection`] carries an upper layer's messages to one peer of an
//! [`Endpoint`](crate::endpoint::Endpoint) as SMB Direct Data Transfer
//! messages (2.2.3), after a negotiation this module leaves to the caller:
//! the [`Params`] are its outcome, each side's own view of it.
//!
//! # Sending (spec 3.1.5.4)
//!
//! [`Connection::send`] takes a span of registered memory and an optional
//! remote memory token. A message longer than MaxFragmentedSendSize is a
//! local error ([`SendError::TooLong`]) and nothing is sent. An empty one
//! is the empty message: the header alone, its data fields zero. Any
//! other is cut by a [`Segmenter`]: DataOffset 24 (8-byte aligned;
//! [`Config::data_offset`] sets another), DataLength the smaller of what
//! is left and MaxSendSize - DataOffset, RemainingDataLength the bytes not
//! yet sent after the segment, padding zero. Segments go in strict order,
//! each one endpoint send of the header and the caller's bytes: the
//! header emitted straight into the packet when the segment fits one
//! packet at once
//! ([`Endpoint::send_inline_head_with`](crate::endpoint::Endpoint::send_inline_head_with)),
//! else gathered from a header slot of the connection's and the caller's
//! span, which the connection never copies
//! ([`Endpoint::sendv_head`](crate::endpoint::Endpoint::sendv_head): a
//! segment the peer reads carries its header in the request, so the peer
//! reads the data alone, one RDMA read a segment). The token goes with
//! the first segment only, as the CQ data of its endpoint send: the spec
//! has the RDMA provider carry it with exactly one segment (Send with
//! Invalidate) and names no field for it; the endpoint's CQ data is the
//! provider's word that travels with one send. The first, as ksmbd does
//! since 2025 (commit 1b53426334c3, "invalidate a remote key as soon as
//! possible").
//! [`Connection::try_send`] sends as `send` does a message that can start
//! now, and refuses one that would wait for a credit or behind messages
//! queued before it ([`SendError::Again`], nothing queued): back-pressure
//! as a plain endpoint send has it, for a poll loop that holds a message
//! back rather than have the connection queue it.
//! [`Connection::inject`] sends a short message as the fast path below
//! would, at once or not at all, and reports nothing: no
//! [`Event::Sent`], as an endpoint inject (`fi_inject`) makes no
//! completion, for a sender that needs no word that each message went.
//!
//! Fast path ([`Config::fast_path`]): a message of one segment with no
//! token, up to [`Config::inject_max`] long, holds no header slot and
//! goes by inject
//! ([`Endpoint::inject_head_with`](crate::endpoint::Endpoint::inject_head_with)):
//! its bytes copied into the packet, it is sent as the call returns
//! ([`Event::Sent`] then, or in its turn behind messages still in
//! flight), as an SMB Direct sender that copies small messages into its
//! own send buffers tells its caller at once. Its send completes with no
//! completion unless it fails; the failure, found by the sequence number
//! in the send's context, ends the connection as any failed send does.
//! A longer message of one segment, with nothing waiting to be posted
//! before it and a credit, goes at once from a header slot, its data
//! gathered from the application's memory, without the queue's walk; it
//! is reported sent as its send completes.
//! On the receiving side, a whole message arriving in its turn, with no
//! token, nothing waiting before it and a buffer posted, is checked in
//! one pass over its header and copied and reported at once (only
//! reported, when its receive was posted into that buffer and it landed
//! there: direct placement, below). Every other
//! case, and any check that fails, takes the general path, which decides
//! it the same way; a property test holds the two to the same packets and
//! events.
//!
//! # Receiving
//!
//! The connection posts [`Params::receive_credit_max`] receives of
//! MaxReceiveSize bytes, one credit each, and handles their completions
//! in the order the endpoint matched them (the order the peer sent, the
//! endpoint being ordered), whatever order they completed in. Each
//! segment is checked ([`Repr::parse_header`], [`Reassembler`]) and its
//! data copied into the buffer the application posted with
//! [`Connection::recv`]; the message is delivered ([`Event::Received`])
//! with its last segment. A segment that carries a token invalidates it
//! (deregisters the region with that key) on arrival, before the message
//! is delivered.
//!
//! Lending ([`Config::lend_max`]): a message of one segment that short
//! takes no buffer. It is reported where it landed ([`Event::Lent`]: a
//! span of the receive region, read there) and its receive is posted
//! again when the application gives it back ([`Connection::give_back`]);
//! until then it holds the credit, as a message waiting for a buffer
//! does. A short message costs the connection no copy then, and the
//! application no buffer to post.
//!
//! Direct placement: when the application has posted buffers further
//! ahead than the receives, a receive is posted again scattered
//! ([`Endpoint::recvv`](crate::endpoint::Endpoint::recvv)) over the
//! header's bytes in its slot and the buffer of the message it can carry
//! at the latest (if that buffer, and the most a segment can carry, hold
//! at least [`Config::direct_min`] bytes); a message of one segment at
//! the peer's DataOffset then lands where it goes and is not copied
//! ([`Stats::in_place`]); a receive posted before that buffer was (every
//! receive of a fresh connection) is withdrawn and posted again into it
//! when the buffer comes. Any other segment is copied from where it
//! landed, in order, before that buffer is written or handed out. A
//! segment is checked and copied as soon as it is in its turn, which is
//! usually when its receive completes.
//!
//! # Credits
//!
//! A segment is sent only with a send credit, and the last credit only
//! with a segment that grants credits, so that the peer can always answer
//! (the rule that keeps both sides from waiting on each other; [`Credits`]).
//! Every message grants the receives posted since the last one said; a
//! sender running low sets SMB_DIRECT_RESPONSE_REQUESTED, and its peer,
//! with nothing of its own to send, answers with an empty message that
//! grants what it reposted (and answers so unasked once the sender holds
//! fewer than half its receives, or only its last credit while two
//! receives or more wait to be granted). A segment that arrives when the
//! peer held no credit ends the connection.
//!
//! # What ends a connection
//!
//! Every check on received bytes is a typed [`ProtocolError`], never a
//! panic: a segment shorter than its header, DataOffset not 8-byte aligned
//! or inside the header, data beyond the segment or beyond MaxReceiveSize,
//! RemainingDataLength that does not follow from the message so far, a
//! message longer than MaxFragmentedReceiveSize, a segment beyond the
//! credits granted, a token that cannot be invalidated or comes twice in
//! a message, an endpoint operation that failed. The connection is then
//! terminated: [`Connection::error`] says why, [`Event::Terminated`] is
//! reported once, it sends, grants and reposts nothing more, and every
//! message and receive buffer comes back to the application with a
//! `Terminated` status once the endpoint no longer uses it. Over EFA RDM
//! there is no connection to tear down: the peer sees its credits run out.
//!
//! # Driving it
//!
//! Each side's poll loop progresses its endpoint, hands the connection the
//! endpoint's completions, lets it post what is due, and takes its
//! events. Both sides in one thread over the sim device, a message of
//! four segments:
//!
//! ```
//! use efapoll::device::Access;
//! use efapoll::device::sim::{SimConfig, SimFabric};
//! use efapoll::endpoint::{Config as EpConfig, Endpoint, Span};
//! use efapoll::ulp::smbd::{Config, Connection, Event, Params, RecvStatus, SendStatus};
//!
//! let fabric = SimFabric::new(SimConfig::default());
//! let mut ep = [
//!     Endpoint::new(fabric.device(), EpConfig::default())?,
//!     Endpoint::new(fabric.device(), EpConfig::default())?,
//! ];
//! let to = [ep[0].insert_peer(&ep[1].addr())?, ep[1].insert_peer(&ep[0].addr())?];
//! // What the negotiation agreed: the Linux client's 1364-byte segments,
//! // messages up to 1 MiB, 16 receives and credits each way.
//! let params = Params::symmetric(1364, 1 << 20, 16);
//! let mut conn = [
//!     Connection::new(&mut ep[0], to[0], params, Config::default())?,
//!     Connection::new(&mut ep[1], to[1], params, Config::default())?,
//! ];
//!
//! let msg: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
//! let src = ep[0].register(5000, Access::empty())?;
//! let dst = ep[1].register(8192, Access::empty())?;
//! ep[0].write_mem(src.id, 0, &msg)?;
//! conn[1].recv(&mut ep[1], Span::new(&dst, 0, 8192), 2)?;
//! conn[0].send(&mut ep[0], Span::new(&src, 0, 5000), None, 1)?;
//!
//! let mut events = vec![];
//! while events.len() < 2 {
//!     for i in 0..2 {
//!         ep[i].progress();
//!         while let Some(c) = ep[i].poll_cq() {
//!             // False for a completion of another user of the endpoint.
//!             assert!(conn[i].handle_completion(&mut ep[i], &c));
//!         }
//!         conn[i].progress(&mut ep[i]);
//!         // Sent, Received; Lent: read it, then `give_back` its loan.
//!         while let Some(ev) = conn[i].poll_event() {
//!             events.push((i, ev));
//!         }
//!     }
//! }
//! events.sort_by_key(|&(i, _)| i);
//! assert_eq!(events[0], (0, Event::Sent { ctx: 1, status: SendStatus::Ok }));
//! let received = Event::Received { ctx: 2, len: 5000, status: RecvStatus::Ok, invalidated: None };
//! assert_eq!(events[1], (1, received));
//! let mut got = vec![0u8; 5000];
//! ep[1].read_mem(dst.id, 0, &mut got)?;
//! assert_eq!(got, msg);
//! assert_eq!(conn[0].stats().segments_sent, 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! or, with [`Connection::drain`], the same loop inside the connection, each
//! event handed out as it comes and a lent message read there, given back
//! as the closure returns (its receive posted again as the drain returns):
//!
//! ```text
//! loop {
//!     ep.progress();
//!     conn.drain(&mut ep, |ep, d| match d {
//!         Drained::Event(Event::Lent { data, .. }) => { /* read data */ Flow::Next }
//!         Drained::Event(e) => { /* Sent, Received... */ Flow::Next }
//!         Drained::Other(c) => { /* another user's completion */ Flow::Next }
//!     });
//!     conn.progress(&mut ep);
//! }
//! ```
//!
//! The connection owns every untagged message between its endpoint and
//! its peer: the application posts no untagged receive that could take
//! one (a wildcard receive would), and sends that peer nothing untagged
//! of its own; one connection to a peer per endpoint. A connection whose
//! receives are never posted into the application's buffers (segments
//! shorter than [`Config::direct_min`]) holds its slots in an endpoint
//! receive ring ([`Endpoint::recv_ring`](crate::endpoint::Endpoint::recv_ring)),
//! each armed again as it is free, rather than a receive posted per
//! segment. The ring fills its slots in turn, and a short segment that
//! lands whole there is marked in its slot rather than reported in the
//! endpoint's completion queue: [`Connection::drain`] takes it, or else
//! [`Connection::progress`] (so that the first loop above finds it among
//! the events), and [`Connection::has_work`] says one waits. Its endpoint
//! operations carry contexts whose high 32 bits
//! are [`Config::ctx_tag`], by which it knows its completions.
//!
//! Segmenting a send and parsing a received segment allocate nothing: the
//! queues are sized at [`Connection::new`] (events wait in a queue that
//! grows only if the application never polls them).

mod conn;
mod credits;
mod header;
mod segment;

pub use conn::{Connection, Drained, Event, Flow, Loan, RecvStatus, SendStatus, Stats};
pub use credits::Credits;
pub use header::{DEFAULT_DATA_OFFSET, Flags, HEADER_LEN, Packet, Repr, check_layout, golden};
pub use segment::{Placement, Reassembler, Segment, Segmenter};

use crate::endpoint::{Error as EpError, Status};

/// The outcome of the negotiation (MS-SMBD 3.1.1.1's Connection
/// variables), as one side holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Connection.MaxSendSize: the largest segment sent, header and
    /// padding included (at most the peer's MaxReceiveSize).
    pub max_send_size: u32,
    /// Connection.MaxReceiveSize: the largest segment accepted, the size
    /// of each posted receive.
    pub max_receive_size: u32,
    /// Connection.MaxFragmentedSendSize: the longest message sent (the
    /// peer's MaxFragmentedSize).
    pub max_fragmented_send_size: u32,
    /// The longest message reassembled (this side's MaxFragmentedSize).
    pub max_fragmented_receive_size: u32,
    /// Connection.ReceiveCreditMax: receives posted, one credit each.
    pub receive_credit_max: u16,
    /// Connection.SendCreditTarget: what CreditsRequested asks for.
    pub send_credit_target: u16,
    /// Connection.SendCredits when data transfer starts: what the peer's
    /// negotiation message granted.
    pub send_credits: u16,
    /// The credits this side's negotiation message granted the peer (at
    /// most `receive_credit_max`).
    pub receive_credits_granted: u16,
}

impl Params {
    /// What two peers with the same settings agree on: segments of up to
    /// `max_size` bytes each way, messages of up to `max_fragmented`, and
    /// `credits` receives each, all granted.
    pub const fn symmetric(max_size: u32, max_fragmented: u32, credits: u16) -> Params {
        Params {
            max_send_size: max_size,
            max_receive_size: max_size,
            max_fragmented_send_size: max_fragmented,
            max_fragmented_receive_size: max_fragmented,
            receive_credit_max: credits,
            send_credit_target: credits,
            send_credits: credits,
            receive_credits_granted: credits,
        }
    }

    /// Checks the parameters against each other and against `data_offset`;
    /// says what is wrong.
    pub fn check(&self, data_offset: u32) -> Result<(), SetupError> {
        let bad = |what| Err(SetupError::Params(what));
        if !data_offset.is_multiple_of(8) || !(24..=MAX_DATA_OFFSET).contains(&data_offset) {
            return bad("DataOffset must be 8-byte aligned, from 24 to 256");
        }
        if self.max_send_size <= data_offset {
            return bad("MaxSendSize leaves no room for data after DataOffset");
        }
        if (self.max_receive_size as usize) < HEADER_LEN {
            return bad("MaxReceiveSize is shorter than the 20-byte header");
        }
        if self.receive_credit_max < 2 || self.send_credits < 2 {
            return bad("each side needs at least 2 credits: the last is kept for granting");
        }
        if self.receive_credits_granted < 2
            || self.receive_credits_granted > self.receive_credit_max
        {
            return bad("the credits granted must be from 2 to ReceiveCreditMax");
        }
        Ok(())
    }
}

impl Default for Params {
    /// The sizes of MS-SMBD's examples and of the Linux SMB client:
    /// 1364-byte segments, 1 MiB messages, 255 credits.
    fn default() -> Params {
        Params::symmetric(1364, 1 << 20, 255)
    }
}

/// The largest DataOffset a connection sends with (its header slots hold
/// that much).
pub const MAX_DATA_OFFSET: u32 = 256;

/// Local settings, not negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// DataOffset of the segments sent: 8-byte aligned, 24 to 256 (spec
    /// 3.1.5.4: "SHOULD be 24", "MAY be set to any other valid values").
    pub data_offset: u32,
    /// Segments in flight at once: header slots.
    pub send_slots: u16,
    /// Messages queued or being sent.
    pub send_queue: u16,
    /// Receive buffers the application may have posted at once.
    pub recv_queue: u16,
    /// The high 32 bits of the contexts of the connection's endpoint
    /// operations, by which it knows its completions.
    pub ctx_tag: u32,
    /// The shortest application buffer a receive is posted into (direct
    /// placement), and the least a segment must be able to carry for a
    /// connection to look for one; shorter messages are copied out of the
    /// receive's slot, which costs less than scattering a receive.
    pub direct_min: u64,
    /// A message of one segment with no token is sent holding no header
    /// slot (up to `inject_max`; a longer one at once from a header slot),
    /// and a whole message arriving in its turn is checked and delivered
    /// in one pass (see the module's documentation). The same
    /// packets and events as with it off, which only header slots running
    /// short can tell apart (it does not wait for one); off, every message
    /// takes the general path (the tests compare the two).
    pub fast_path: bool,
    /// On the fast path, the longest message sent by inject (copied into
    /// its packet, reported sent at once); a longer message of one
    /// segment goes from a header slot, its data gathered from the
    /// application's memory, and is reported sent as its send completes.
    /// From about 2 KiB the copy costs more than the completion: over shm,
    /// 4 KiB messages stream 1.26 times as fast gathered, 1 KiB ones 0.81
    /// times (perf/README.md).
    pub inject_max: u64,
    /// Messages of one segment of at most this many bytes are lent where
    /// they landed ([`Event::Lent`]) rather than copied into a buffer the
    /// application posted: a receive with no copy of the connection's,
    /// for an application that reads short messages where they are. 0,
    /// the default, lends none.
    pub lend_max: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            data_offset: DEFAULT_DATA_OFFSET,
            send_slots: 256,
            send_queue: 256,
            recv_queue: 256,
            ctx_tag: u32::from_be_bytes(*b"SMBD"),
            direct_min: 4096,
            fast_path: true,
            inject_max: 2048,
            lend_max: 0,
        }
    }
}

/// Why a segment's bytes are not a Data Transfer message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// Fewer bytes than the 20-byte header.
    #[error("segment cut short: need {need} bytes, have {have}")]
    Truncated { need: u64, have: usize },
    /// DataOffset not 8-byte aligned (spec 3.1.5.4).
    #[error("DataOffset {data_offset} is not 8-byte aligned")]
    Misaligned { data_offset: u32 },
    /// Data that would start inside the 20-byte header.
    #[error("DataOffset {data_offset} is inside the header")]
    OffsetInHeader { data_offset: u32 },
    /// DataOffset + DataLength past the end of the segment.
    #[error(
        "data at {data_offset} of {data_length} bytes is beyond the {segment_len}-byte segment"
    )]
    BeyondSegment { data_offset: u32, data_length: u32, segment_len: usize },
    /// No data, yet RemainingDataLength says more is to come.
    #[error("no data, yet RemainingDataLength is {remaining_data_length}")]
    EmptyWithRemaining { remaining_data_length: u32 },
}

/// Why a connection was terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A segment that is not a valid Data Transfer message.
    #[error("malformed segment: {0}")]
    Malformed(SegmentError),
    /// A segment longer than MaxReceiveSize (the receive it landed in).
    #[error("segment of {len} bytes exceeds MaxReceiveSize {max}")]
    SegmentTooLong { len: u64, max: u32 },
    /// A message longer than MaxFragmentedReceiveSize.
    #[error("message of {len} bytes exceeds MaxFragmentedSize {max}")]
    MessageTooLong { len: u64, max: u32 },
    /// RemainingDataLength that does not follow from the message so far:
    /// `left` bytes were due, and a segment of `data_length` said
    /// `remaining` remain.
    #[error(
        "{left} bytes of the message were due; a segment of {data_length} said {remaining} remain"
    )]
    RemainingMismatch { left: u64, data_length: u32, remaining: u32 },
    /// A segment arrived while the peer held no credit.
    #[error("segment received beyond the credits granted")]
    CreditsExceeded,
    /// A token that names no region of the endpoint, or one of the
    /// connection's own.
    #[error("token {token:#x} names no region that can be invalidated")]
    UnknownToken { token: u64 },
    /// A token whose region the endpoint would not deregister (in use by
    /// a posted or unfinished operation).
    #[error("token {token:#x} could not be invalidated: {error}")]
    Invalidate { token: u64, error: EpError },
    /// A second token in one message (the spec: exactly one segment).
    #[error("a second token ({token:#x}) in one message")]
    TokenTwice { token: u64 },
    /// A send the endpoint completed in error ("the RDMA layer will have
    /// initiated termination", spec 3.1.5.4).
    #[error("send failed: {0:?}")]
    SendFailed(Status),
    /// A receive the endpoint completed in error.
    #[error("receive failed: {0:?}")]
    RecvFailed(Status),
    /// The endpoint refused an operation (a region the application
    /// deregistered under a message, for one).
    #[error("endpoint: {0}")]
    Endpoint(EpError),
    /// This side closed the connection ([`Connection::close`]).
    #[error("closed")]
    Closed,
}

/// Why a connection could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// Parameters that do not fit together.
    #[error("parameters: {0}")]
    Params(&'static str),
    /// The endpoint does not deliver in order (`Config::ordered`), which
    /// strict sequential order needs.
    #[error("the endpoint must deliver in order")]
    Unordered,
    /// The endpoint refused a registration or a receive.
    #[error("endpoint: {0}")]
    Endpoint(#[from] EpError),
}

/// Why [`Connection::send`] refused a message; nothing of it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Longer than MaxFragmentedSendSize: the local error of spec 3.1.5.4.
    #[error("message of {len} bytes exceeds MaxFragmentedSendSize {max}")]
    TooLong { len: u64, max: u32 },
    /// The send queue is full, or ([`Connection::try_send`]) the message
    /// would wait for a credit or behind others: progress and retry.
    #[error("cannot queue or start the message now, retry after progress")]
    Again,
    /// The span is not registered memory.
    #[error("span outside its registered region")]
    BadSpan,
    /// The connection was terminated.
    #[error("connection terminated: {0}")]
    Terminated(ProtocolError),
}

/// Why [`Connection::recv`] refused a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvError {
    /// As many buffers are posted as [`Config::recv_queue`] allows.
    #[error("receive queue full")]
    Again,
    /// The span is not registered memory.
    #[error("span outside its registered region")]
    BadSpan,
    /// The connection was terminated.
    #[error("connection terminated: {0}")]
    Terminated(ProtocolError),
    /// [`Connection::give_back`] of a loan that is not out.
    #[error("no such message lent")]
    NotLent,
}
