//! Receive matching: posted receives, unexpected messages, and messages in
//! progress by (peer, msg_id).
//!
//! Posted receives live in intrusive lists threaded through the receive
//! slab (no allocation per receive): untagged in one FIFO; tagged with an
//! exact tag in a FIFO per tag, found by hash, so matching costs the same
//! with 1 or 10,000 posted tags; tagged with ignore bits in one FIFO. An
//! arriving message takes the earliest-posted receive that matches, by
//! posting sequence. Unexpected messages wait in arrival order.

use super::ops::RxOp;
use super::peer::NONE;
use super::slab::Slab;
use crate::intmap::IntMap;

/// An intrusive FIFO of receive ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    head: u32,
    tail: u32,
}

impl Default for List {
    fn default() -> Self {
        List { head: NONE, tail: NONE }
    }
}

impl List {
    fn is_empty(&self) -> bool {
        self.head == NONE
    }

    #[inline]
    fn push_back(&mut self, ops: &mut Slab<RxOp>, id: u32) {
        let op = ops.get_mut(id).expect("live op");
        op.prev = self.tail;
        op.next = NONE;
        if self.tail == NONE {
            self.head = id;
        } else {
            ops.get_mut(self.tail).expect("live tail").next = id;
        }
        self.tail = id;
    }

    fn remove(&mut self, ops: &mut Slab<RxOp>, id: u32) {
        let (prev, next) = {
            let op = ops.get(id).expect("live op");
            (op.prev, op.next)
        };
        if prev == NONE {
            self.head = next;
        } else {
            ops.get_mut(prev).expect("live prev").next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            ops.get_mut(next).expect("live next").prev = prev;
        }
    }

    /// Takes the head if `f` holds for it.
    #[inline]
    fn pop_front_if(&mut self, ops: &mut Slab<RxOp>, f: impl FnOnce(&RxOp) -> bool) -> Option<u32> {
        let id = self.head;
        let op = ops.get(id)?;
        if !f(op) {
            return None;
        }
        let next = op.next;
        self.head = next;
        if next == NONE {
            self.tail = NONE;
        } else {
            ops.get_mut(next).expect("live next").prev = NONE;
        }
        Some(id)
    }

    /// The first id for which `f` holds.
    fn find(&self, ops: &Slab<RxOp>, mut f: impl FnMut(&RxOp) -> bool) -> Option<u32> {
        let mut id = self.head;
        while id != NONE {
            let op = ops.get(id).expect("live op");
            if f(op) {
                return Some(id);
            }
            id = op.next;
        }
        None
    }
}

/// Whether a receive posted for `want_peer` takes a message from `peer`.
#[inline]
fn peer_ok(want_peer: Option<u32>, peer: u32) -> bool {
    want_peer.is_none_or(|p| p == peer)
}

/// Whether a tagged receive takes a message with `tag`.
#[inline]
fn tag_ok(op: &RxOp, tag: u64) -> bool {
    (op.want_tag ^ tag) & !op.ignore == 0
}

/// Posted receives and unexpected messages.
#[derive(Debug)]
pub(crate) struct Matcher {
    posted_msg: List,
    posted_exact: IntMap<List>,
    posted_wild: List,
    unexp_msg: List,
    unexp_tag: List,
}

impl Matcher {
    pub(crate) fn with_capacity(n: usize) -> Matcher {
        let mut posted_exact = IntMap::default();
        posted_exact.reserve(n);
        Matcher {
            posted_msg: List::default(),
            posted_exact,
            posted_wild: List::default(),
            unexp_msg: List::default(),
            unexp_tag: List::default(),
        }
    }

    /// Queues a posted receive.
    #[inline(always)]
    pub(crate) fn post(&mut self, ops: &mut Slab<RxOp>, id: u32) {
        let op = ops.get(id).expect("live op");
        match (op.tagged, op.ignore) {
            (false, _) => self.posted_msg.push_back(ops, id),
            (true, 0) => {
                let tag = op.want_tag;
                self.posted_exact.entry(tag).or_default().push_back(ops, id)
            }
            (true, _) => self.posted_wild.push_back(ops, id),
        }
    }

    /// Takes the earliest-posted receive that matches a message.
    #[inline(always)]
    pub(crate) fn take_posted(
        &mut self,
        ops: &mut Slab<RxOp>,
        tagged: bool,
        tag: u64,
        peer: u32,
    ) -> Option<u32> {
        if !tagged {
            // The head, a receive from any peer, is the usual answer.
            if let Some(id) = self.posted_msg.pop_front_if(ops, |op| op.want_peer.is_none()) {
                return Some(id);
            }
            let id = self.posted_msg.find(ops, |op| peer_ok(op.want_peer, peer))?;
            self.posted_msg.remove(ops, id);
            return Some(id);
        }
        let exact =
            self.posted_exact.get(&tag).and_then(|l| l.find(ops, |op| peer_ok(op.want_peer, peer)));
        let wild = if self.posted_wild.is_empty() {
            None
        } else {
            self.posted_wild.find(ops, |op| tag_ok(op, tag) && peer_ok(op.want_peer, peer))
        };
        let seq = |id: u32| ops.get(id).expect("live op").seq;
        match (exact, wild) {
            (Some(e), Some(w)) if seq(w) < seq(e) => {
                self.posted_wild.remove(ops, w);
                Some(w)
            }
            (Some(e), _) => {
                let list = self.posted_exact.get_mut(&tag).expect("bucket");
                list.remove(ops, e);
                if list.is_empty() {
                    self.posted_exact.remove(&tag);
                }
                Some(e)
            }
            (None, Some(w)) => {
                self.posted_wild.remove(ops, w);
                Some(w)
            }
            (None, None) => None,
        }
    }

    /// Queues an unexpected message.
    pub(crate) fn push_unexpected(&mut self, ops: &mut Slab<RxOp>, id: u32) {
        if ops.get(id).expect("live op").tagged {
            self.unexp_tag.push_back(ops, id);
        } else {
            self.unexp_msg.push_back(ops, id);
        }
    }

    /// Takes the first unexpected message a receive being posted matches.
    pub(crate) fn take_unexpected(
        &mut self,
        ops: &mut Slab<RxOp>,
        tagged: bool,
        want_tag: u64,
        ignore: u64,
        want_peer: Option<u32>,
    ) -> Option<u32> {
        let list = if tagged { &mut self.unexp_tag } else { &mut self.unexp_msg };
        let id = list.find(ops, |m| {
            peer_ok(want_peer, m.peer) && (!tagged || (want_tag ^ m.tag) & !ignore == 0)
        })?;
        list.remove(ops, id);
        Some(id)
    }
}

/// Messages whose later packets are still to come (medium segments,
/// long-CTS data), by (peer, msg_id).
#[derive(Debug)]
pub(crate) struct MsgIndex {
    map: IntMap<u32>,
}

impl MsgIndex {
    pub(crate) fn with_capacity(n: usize) -> MsgIndex {
        let mut map = IntMap::default();
        map.reserve(n);
        MsgIndex { map }
    }

    #[inline]
    fn key(peer: u32, msg_id: u32) -> u64 {
        ((peer as u64) << 32) | msg_id as u64
    }

    #[inline]
    pub(crate) fn get(&self, peer: u32, msg_id: u32) -> Option<u32> {
        self.map.get(&Self::key(peer, msg_id)).copied()
    }

    #[inline]
    pub(crate) fn insert(&mut self, peer: u32, msg_id: u32, rx_id: u32) {
        self.map.insert(Self::key(peer, msg_id), rx_id);
    }

    #[inline]
    pub(crate) fn remove(&mut self, peer: u32, msg_id: u32) {
        self.map.remove(&Self::key(peer, msg_id));
    }
}
