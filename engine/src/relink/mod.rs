//! Relink: the out-of-band control link of the apps (specs/relink-protocol.md).
//!
//! Relink v0 runs over any byte stream, here TCP. After a handshake that
//! agrees on an endpoint name, channel id sizes and transactions, and names
//! the link by epoch and link id, both peers exchange packets: messages on
//! channels (ids of 0 to 255 bytes, [`ChannelId`]) with received and
//! consumed acknowledgements, optional transactions, channel closure, ping
//! and pong, resumption after the stream breaks, and shutdown. The apps use
//! it to exchange addresses and memory keys, check health and shut down, one
//! channel per lcore.
//!
//! - [`wire`] and [`handshake`] are the codecs: a value form per packet with
//!   `parse`, `emit` and `buffer_len`, explicit little-endian fields, every
//!   padding byte written as zero and ignored when read.
//! - [`link`] is the protocol as a sans-IO state machine: bytes in, bytes
//!   and events out, for either role.
//! - [`tcp`] drives a link over a blocking `std::net::TcpStream` for
//!   setup-time use: connect or accept (a [`Server`] with options per
//!   endpoint name), send and multicast, receive with a timeout and consume
//!   now or later, close channels, commit and roll back, ping, reconnect
//!   (by hand or automatically with backoff), shut down. Its timers (ack
//!   delay, keepalive ping and pong timeout, reconnection backoff) run
//!   while its calls block.
//!
//! Nothing received is trusted. Every length and count is checked against
//! the bytes present and against [`WireLimits`] with arithmetic that cannot
//! overflow; an unknown enumeration value, a name that is not UTF-8, a link
//! id outside [1, 2^63) or a protocol violation (an acknowledgement of a
//! message never sent, a message before the resume packet, a window
//! overrun) is a typed error that ends the stream. A partial packet is not an
//! error: parsers return [`Parsed::Incomplete`] and the link waits for more
//! bytes. No input makes any of this panic.

pub mod handshake;
pub mod link;
pub mod tcp;
pub mod wire;

pub use handshake::{HandshakeFlags, ReplyRepr, RequestRepr, VERSION, VersionRepr};
pub use link::{
    Accepted, Acceptor, CommandError, ConnectorConfig, DEFAULT_WINDOW, Event, HandshakeError,
    Limits, Link, LinkError, Listener, MAX_PENDING_COMMITS, Params, Role,
};
pub use tcp::{
    AutoReconnect, Conn, Incoming, Keepalive, Message, Options, Reconnect, Resumption, Server,
    TcpError, accept, accept_stream, connect, deadline_after, loopback_pair,
};
pub use wire::{
    ChannelAck, ChannelFormat, ChannelId, ChannelIdError, ChannelIdRef, ChannelIds, ChannelOp,
    EmitError, GeneralType, IdSizes, MAX_CHANNEL_ID_LEN, MessageRepr, PacketRepr, Parsed, Parts,
    SequenceAck, SequenceOp, Target, WireError, WireLimits,
};
