//! Operation entries: what the endpoint tracks per send and per receive.

use super::Span;
use super::cq::Status;

/// The message protocols (spec 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proto {
    /// One packet.
    Eager,
    /// Segments all sent at once, each a MEDIUM_RTM.
    Medium,
    /// A LONGCTS_RTM, then CTSDATA as the receiver grants it by CTS.
    LongCts,
}

/// A send.
#[derive(Debug)]
pub(crate) struct TxOp {
    pub(crate) peer: u32,
    pub(crate) proto: Proto,
    pub(crate) tagged: bool,
    pub(crate) tag: u64,
    pub(crate) cq_data: Option<u64>,
    pub(crate) ctx: u64,
    /// The data, in a registered region.
    pub(crate) src: Span,
    pub(crate) msg_id: u32,
    /// Message length.
    pub(crate) total: u64,
    /// Bytes put in built packets so far.
    pub(crate) sent: u64,
    /// Long-CTS: the receiver allows bytes up to this offset.
    pub(crate) granted: u64,
    /// Long-CTS: the receiver's operation, from its CTS.
    pub(crate) recv_id: u32,
    /// The REQ (first packet) is built.
    pub(crate) req_built: bool,
    /// Packets built and not yet completed by the device.
    pub(crate) in_flight: u32,
    /// On the TX queue's list of operations with packets to build.
    pub(crate) queued: bool,
    /// The first error, reported when nothing is in flight any more.
    pub(crate) error: Option<Status>,
}

impl TxOp {
    /// Whether it has a packet to build now.
    #[inline]
    pub(crate) fn has_packet_due(&self) -> bool {
        if self.error.is_some() {
            return false;
        }
        if !self.req_built {
            return true;
        }
        match self.proto {
            Proto::Eager => false,
            Proto::Medium => self.sent < self.total,
            Proto::LongCts => self.sent < self.granted,
        }
    }

    /// Whether everything is sent and completed (or failed and drained).
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.in_flight == 0 && (self.error.is_some() || (self.req_built && self.sent == self.total))
    }
}

/// Where a receive operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxState {
    /// Posted by the application, waiting for a message.
    Posted,
    /// A message arrived before any matching receive was posted; its
    /// packets are held.
    Unexpected,
    /// Matched: the message lands in the application's buffer.
    Matched,
}

/// A receive, or an unexpected message.
#[derive(Debug)]
pub(crate) struct RxOp {
    pub(crate) state: RxState,
    pub(crate) tagged: bool,
    // What the application posted.
    pub(crate) ctx: u64,
    pub(crate) dst: Option<Span>,
    pub(crate) want_tag: u64,
    pub(crate) ignore: u64,
    pub(crate) want_peer: Option<u32>,
    /// Posting order, to pick the earliest of several matching receives.
    pub(crate) seq: u64,
    // The message.
    pub(crate) peer: u32,
    pub(crate) msg_id: u32,
    pub(crate) proto: Proto,
    pub(crate) tag: u64,
    pub(crate) cq_data: Option<u64>,
    pub(crate) total: u64,
    pub(crate) received: u64,
    /// Long-CTS: the sender's operation.
    pub(crate) send_id: u32,
    /// Long-CTS: bytes granted so far (an offset).
    pub(crate) granted: u64,
    /// Unexpected: the held packets (a chain of RX buffers).
    pub(crate) held: u32,
    /// Links in the matcher's lists.
    pub(crate) prev: u32,
    pub(crate) next: u32,
}
