//! Completions the endpoint reports to the application.

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

/// Completions waiting for the application: a ring with room reserved for
/// every operation the endpoint can hold, touched as it fills. It grows (a
/// cold path) only if the application keeps posting without ever polling,
/// since operations free their entries before their completions are read.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    /// Slots written so far: the ring's first `ring.len()` of `cap`. Slots
    /// are written in index order from 0 (the queue starts there and
    /// rewinds there when drained), so the next slot is at most one past.
    ring: Vec<Completion>,
    /// A power of two.
    cap: usize,
    head: usize,
    len: usize,
}

impl CompletionQueue {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let cap = capacity.max(1).next_power_of_two();
        CompletionQueue { ring: Vec::with_capacity(cap), cap, head: 0, len: 0 }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, c: Completion) {
        if self.len == self.cap {
            self.grow();
        }
        let at = (self.head + self.len) & (self.cap - 1);
        if at < self.ring.len() {
            self.ring[at] = c;
        } else {
            self.ring.push(c);
        }
        self.len += 1;
    }

    #[inline(always)]
    pub(crate) fn pop(&mut self) -> Option<Completion> {
        if self.len == 0 {
            return None;
        }
        // Field by field: a completion is written a field at a time, often
        // just before it is read, and one wide load over several of those
        // stores cannot take their values from the store buffer; it waits
        // until they reach the cache, behind every older store, such as a
        // ring store that waits for the peer's core to give up its line
        // (what a whole-struct copy cost: perf/README.md). The first field
        // loaded apart keeps the compiler from merging the fields back into
        // one copy.
        let r = &self.ring[self.head];
        let c = Completion {
            ctx: crate::mem::load_apart(&r.ctx),
            op: r.op,
            status: r.status,
            len: r.len,
            tag: r.tag,
            tagged: r.tagged,
            cq_data: r.cq_data,
            peer: r.peer,
        };
        self.skip();
        Some(c)
    }

    /// The oldest completion, where it lies.
    #[inline(always)]
    pub(crate) fn front(&self) -> Option<&Completion> {
        (self.len > 0).then(|| &self.ring[self.head])
    }

    /// Drops the oldest completion, if any.
    #[inline(always)]
    pub(crate) fn skip(&mut self) {
        if self.len > 0 {
            self.len -= 1;
            // Rewind to the first slots once drained: a queue that rotates
            // through all its capacity writes a cold line per completion.
            self.head = if self.len == 0 { 0 } else { (self.head + 1) & (self.cap - 1) };
        }
    }

    /// Hands `f` each completion, oldest first, where it lies (read in
    /// place, a field at a time as `pop` reads it); stops when none is left
    /// or `f` returns false (the completion it returned false for is
    /// taken). How many it took. The queue's place is written back once,
    /// after the loop.
    #[inline(always)]
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&Completion) -> bool) -> usize {
        let (mut head, mut len, mask) = (self.head, self.len, self.cap - 1);
        let ring = &self.ring[..];
        let mut n = 0;
        while len > 0 {
            let more = f(&ring[head]);
            head = (head + 1) & mask;
            len -= 1;
            n += 1;
            if !more {
                break;
            }
        }
        self.len = len;
        // Rewound once drained, as by `pop`.
        self.head = if len == 0 { 0 } else { head };
        n
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Doubles the ring, keeping the queue's order.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let mut ring = Vec::with_capacity(self.cap * 2);
        ring.extend((0..self.len).map(|i| self.ring[(self.head + i) & (self.cap - 1)]));
        self.ring = ring;
        self.cap *= 2;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_come_out_in_order_across_wraps_and_growth() {
        let mut q = CompletionQueue::with_capacity(3);
        assert_eq!(q.cap, 4);
        let (mut next_in, mut next_out) = (0u64, 0u64);
        // Wrap around a few times at depth 3, then grow past 4 while wrapped.
        for depth in [3usize, 3, 3, 9, 17, 2] {
            while q.len() < depth {
                q.push(Completion::new(Op::Recv, next_in));
                next_in += 1;
            }
            while q.len() > depth / 2 {
                assert_eq!(q.pop().map(|c| c.ctx), Some(next_out));
                next_out += 1;
            }
        }
        while let Some(c) = q.pop() {
            assert_eq!(c.ctx, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert_eq!(q.cap, 32, "grew to hold 17");
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn a_drain_takes_completions_in_order_and_stops_where_told() {
        let mut q = CompletionQueue::with_capacity(4);
        // Wrapped: 2, 3, 4, 5 queued, the last two in the ring's first slots.
        for ctx in 0..3 {
            q.push(Completion::new(Op::Recv, ctx));
        }
        assert_eq!(q.pop().map(|c| c.ctx), Some(0));
        assert_eq!(q.pop().map(|c| c.ctx), Some(1));
        for ctx in 3..6 {
            q.push(Completion::new(Op::Recv, ctx));
        }
        // Told to stop at the second: it is taken, the rest stay queued.
        let mut seen = Vec::new();
        let taken = q.drain(|c| {
            seen.push(c.ctx);
            seen.len() < 2
        });
        assert_eq!((taken, seen.as_slice()), (2, &[2, 3][..]));
        assert_eq!(q.len(), 2);
        // To the end: the rest in order, and the queue rewinds.
        seen.clear();
        let taken = q.drain(|c| {
            seen.push(c.ctx);
            true
        });
        assert_eq!((taken, seen.as_slice()), (2, &[4, 5][..]));
        assert_eq!((q.len(), q.head), (0, 0));
        assert_eq!(q.drain(|_| true), 0);
        q.push(Completion::new(Op::Send, 6));
        assert_eq!(q.pop().map(|c| c.ctx), Some(6));
    }
}
