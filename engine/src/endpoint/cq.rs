//! Completions the endpoint reports to the application.

use std::collections::VecDeque;

use super::PeerId;

/// What completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// A send or tagged send.
    Send,
    /// A receive or tagged receive.
    Recv,
    /// A write this endpoint asked for.
    Write,
    /// A read this endpoint asked for.
    Read,
    /// An atomic this endpoint asked for.
    Atomic,
    /// A peer's write with CQ data landed here (the only one-sided
    /// operation the target is told of, spec 3.3).
    RemoteWrite,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Ok,
    /// The receive buffer was shorter than the message: `len` bytes were
    /// delivered of `olen` (like FI_ETRUNC).
    Truncated {
        olen: u64,
    },
    /// The peer is gone.
    PeerUnreachable,
    /// The peer refused the access to its memory (key, bounds or right).
    RemoteAccess,
    /// The peer did not answer within the configured time.
    Timeout,
    /// The peer does not support what the operation needs.
    NotSupported,
    /// The device failed the operation.
    DeviceError,
}

impl Status {
    /// Whether the operation succeeded.
    pub fn is_ok(&self) -> bool {
        matches!(self, Status::Ok)
    }
}

/// A completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The context the application gave the operation.
    pub ctx: u64,
    pub op: Op,
    pub status: Status,
    /// Bytes sent, delivered, read or written.
    pub len: u64,
    /// Tagged operations: the message's tag.
    pub tag: u64,
    /// Whether the message was tagged.
    pub tagged: bool,
    /// The CQ data the sender attached (senddata, writedata).
    pub cq_data: Option<u64>,
    /// The peer (receives: the sender).
    pub peer: Option<PeerId>,
}

impl Completion {
    pub(crate) fn new(op: Op, ctx: u64) -> Completion {
        Completion {
            ctx,
            op,
            status: Status::Ok,
            len: 0,
            tag: 0,
            tagged: false,
            cq_data: None,
            peer: None,
        }
    }
}

/// Completions waiting for the application, preallocated: every operation
/// the endpoint can hold completes once, so it is sized to never grow.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    q: VecDeque<Completion>,
}

impl CompletionQueue {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        CompletionQueue { q: VecDeque::with_capacity(capacity) }
    }

    #[inline]
    pub(crate) fn push(&mut self, c: Completion) {
        self.q.push_back(c);
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Completion> {
        let c = self.q.pop_front();
        // Rewind to the first slots once drained: a queue that rotates
        // through all its capacity writes a cold line per completion.
        if self.q.is_empty() {
            self.q.clear();
        }
        c
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
}
