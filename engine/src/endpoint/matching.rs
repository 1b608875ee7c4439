//! Receive matching: posted receives, unexpected messages, and messages in
//! progress by (peer, msg_id).
//!
//! A posted receive is a [`Posted`] record of one cache line in a slab of
//! its own: everything matching reads, and everything an eager message
//! needs to land and report, so that with thousands of receives posted a
//! message costs one cold line for its receive, not the several of a full
//! receive entry. A message that needs more (medium, long, delivery
//! complete) moves its receive into a receive entry ([`RxOp`]) when it
//! matches.
//!
//! Untagged posted receives wait in one FIFO of their ids, a ring as long
//! as the slab: posting one writes its id, and the message that takes the
//! head reads that id and the receive (an intrusive list would also write
//! its neighbours' links). Tagged ones live in intrusive lists threaded
//! through their slab, which give up an entry from the middle at no cost:
//! with an exact tag in a FIFO per tag, found by hash, so matching costs
//! the same with 1 or 10,000 posted tags; with ignore bits in one FIFO.
//! Nothing is allocated per receive. An arriving message takes the
//! earliest-posted receive that matches, by posting sequence. Unexpected
//! messages wait in arrival order, in lists through the receive entries.

use super::TagMatch;
use super::ops::{Posted, RxOp};
use super::slab::{self, Slab};
use super::types::{FAST_PATHS, Link, PeerId, PostedId, RxId, SlabId};
use crate::intmap::FlatMap;
use crate::ring::Ring;

/// Entries that lists thread through.
pub(crate) trait Linked {
    /// The id of an entry in its slab.
    type Id: SlabId;
    fn link(&self) -> &Link;
    fn link_mut(&mut self) -> &mut Link;
}

/// Entries with a `link` field.
macro_rules! linked {
    ($($t:ty: $id:ty),*) => {$(
        impl Linked for $t {
            type Id = $id;
            #[inline(always)]
            fn link(&self) -> &Link {
                &self.link
            }
            #[inline(always)]
            fn link_mut(&mut self) -> &mut Link {
                &mut self.link
            }
        }
    )*};
}

linked!(Posted: PostedId, RxOp: RxId);

/// An intrusive FIFO of slab ids (raw: one list type serves both slabs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    head: u32,
    tail: u32,
}

impl Default for List {
    fn default() -> Self {
        List { head: Link::END, tail: Link::END }
    }
}

impl List {
    fn is_empty(&self) -> bool {
        self.head == Link::END
    }

    #[inline(always)]
    fn push_back<T: Linked, const K: bool>(&mut self, ops: &mut Slab<T, T::Id, K>, id: T::Id) {
        *ops.get_mut(id).expect("live entry").link_mut() =
            Link { prev: self.tail, next: Link::END };
        if self.tail == Link::END {
            self.head = id.raw();
        } else {
            ops.get_mut(T::Id::from_raw(self.tail)).expect("live tail").link_mut().next = id.raw();
        }
        self.tail = id.raw();
    }

    fn remove<T: Linked, const K: bool>(&mut self, ops: &mut Slab<T, T::Id, K>, id: T::Id) {
        let Link { prev, next } = *ops.get(id).expect("live entry").link();
        if prev == Link::END {
            self.head = next;
        } else {
            ops.get_mut(T::Id::from_raw(prev)).expect("live prev").link_mut().next = next;
        }
        if next == Link::END {
            self.tail = prev;
        } else {
            ops.get_mut(T::Id::from_raw(next)).expect("live next").link_mut().prev = prev;
        }
    }

    /// The first id for which `f` holds.
    fn find<T: Linked, const K: bool>(
        &self,
        ops: &Slab<T, T::Id, K>,
        mut f: impl FnMut(T::Id, &T) -> bool,
    ) -> Option<T::Id> {
        let mut raw = self.head;
        while raw != Link::END {
            let id = T::Id::from_raw(raw);
            let op = ops.get(id).expect("live entry");
            if f(id, op) {
                return Some(id);
            }
            raw = op.link().next;
        }
        None
    }
}

/// Whether a receive posted for `want_peer` (`None`: any) takes a message
/// from `peer`.
#[inline]
fn peer_ok(want_peer: Option<PeerId>, peer: PeerId) -> bool {
    want_peer.is_none_or(|w| w == peer)
}

/// Whether a tagged receive takes a message with `tag`.
#[inline]
fn tag_ok(want: TagMatch, tag: u64) -> bool {
    (want.tag ^ tag) & !want.ignore == 0
}

/// Posted receives and unexpected messages.
#[derive(Debug)]
pub(crate) struct Matcher {
    /// Untagged receives, oldest first; never longer than the slab, so
    /// never grown.
    posted_msg: Ring<PostedId>,
    posted_exact: FlatMap<List>,
    posted_wild: List,
    /// What the receives on `posted_wild` match, by slab index: the rare
    /// wildcard receive keeps its tag apart, so that every posted receive
    /// fits one line.
    wild: Vec<TagMatch>,
    unexp_msg: List,
    unexp_tag: List,
}

impl Matcher {
    /// A matcher for a slab of `n` posted receives.
    pub(crate) fn with_capacity(n: usize) -> Matcher {
        Matcher {
            posted_msg: Ring::with_capacity(n, PostedId(0)),
            posted_exact: FlatMap::with_capacity(n),
            posted_wild: List::default(),
            wild: vec![TagMatch { tag: 0, ignore: 0 }; n],
            unexp_msg: List::default(),
            unexp_tag: List::default(),
        }
    }

    /// Queues posted receive `id`, untagged or matching `tag`.
    #[inline(always)]
    pub(crate) fn post(
        &mut self,
        posted: &mut Slab<Posted, PostedId, true>,
        id: PostedId,
        tag: Option<TagMatch>,
    ) {
        match tag {
            None => self.posted_msg.push_back(id),
            Some(t) if t.ignore == 0 => {
                self.posted_exact.get_or_default(t.tag).push_back(posted, id)
            }
            Some(t) => {
                self.wild[slab::index(id)] = t;
                self.posted_wild.push_back(posted, id)
            }
        }
    }

    /// Takes the earliest-posted receive that matches a message.
    #[inline(always)]
    pub(crate) fn take_posted(
        &mut self,
        posted: &mut Slab<Posted, PostedId, true>,
        tagged: bool,
        tag: u64,
        peer: PeerId,
    ) -> Option<PostedId> {
        if !tagged {
            // The head, a receive from any peer or from this one, is the
            // usual answer.
            if FAST_PATHS
                && let Some(&id) = self.posted_msg.front()
                && posted.get(id).is_some_and(|p| peer_ok(p.want_peer, peer))
            {
                self.posted_msg.skip_front();
                return Some(id);
            }
            return Self::withdraw_msg(&mut self.posted_msg, posted, false, |_, p| {
                peer_ok(p.want_peer, peer)
            });
        }
        let exact = self
            .posted_exact
            .get(tag)
            .and_then(|l| l.find(posted, |_, p| peer_ok(p.want_peer, peer)));
        let wild = if self.posted_wild.is_empty() {
            None
        } else {
            let wild = &self.wild;
            self.posted_wild.find(posted, |id, p| {
                tag_ok(wild[slab::index(id)], tag) && peer_ok(p.want_peer, peer)
            })
        };
        let seq = |id: PostedId| posted.get(id).expect("live entry").seq;
        match (exact, wild) {
            (Some(e), Some(w)) if seq(w) < seq(e) => {
                self.posted_wild.remove(posted, w);
                Some(w)
            }
            (Some(e), _) => {
                let list = self.posted_exact.get_mut(tag).expect("bucket");
                list.remove(posted, e);
                if list.is_empty() {
                    self.posted_exact.remove(tag);
                }
                Some(e)
            }
            (None, Some(w)) => {
                self.posted_wild.remove(posted, w);
                Some(w)
            }
            (None, None) => None,
        }
    }

    /// Withdraws the earliest untagged posted receive for which `f`
    /// holds; returns its id (still in the slab, for the caller to free).
    pub(crate) fn withdraw_untagged(
        &mut self,
        posted: &mut Slab<Posted, PostedId, true>,
        f: impl FnMut(PostedId, &Posted) -> bool,
    ) -> Option<PostedId> {
        Self::withdraw_msg(&mut self.posted_msg, posted, false, f)
    }

    /// Withdraws the latest untagged posted receive for which `f` holds
    /// (searched from the newest).
    pub(crate) fn withdraw_untagged_last(
        &mut self,
        posted: &mut Slab<Posted, PostedId, true>,
        f: impl FnMut(PostedId, &Posted) -> bool,
    ) -> Option<PostedId> {
        Self::withdraw_msg(&mut self.posted_msg, posted, true, f)
    }

    /// Takes the first untagged receive for which `f` holds out of
    /// `fifo`, searched from the oldest, or from the newest when `newest`.
    fn withdraw_msg(
        fifo: &mut Ring<PostedId>,
        posted: &Slab<Posted, PostedId, true>,
        newest: bool,
        mut f: impl FnMut(PostedId, &Posted) -> bool,
    ) -> Option<PostedId> {
        let mut hit = |i: &usize| f(fifo[*i], posted.get(fifo[*i]).expect("live entry"));
        let n = fifo.len();
        let at = if newest { (0..n).rev().find(&mut hit) } else { (0..n).find(&mut hit) }?;
        fifo.remove(at)
    }

    /// Queues an unexpected message.
    pub(crate) fn push_unexpected(&mut self, ops: &mut Slab<RxOp, RxId>, id: RxId) {
        if ops.get(id).expect("live op").tagged {
            self.unexp_tag.push_back(ops, id);
        } else {
            self.unexp_msg.push_back(ops, id);
        }
    }

    /// Whether unexpected untagged messages wait.
    #[inline(always)]
    pub(crate) fn unexpected_untagged_waiting(&self) -> bool {
        !self.unexp_msg.is_empty()
    }

    /// Takes the first unexpected message a receive being posted matches.
    #[inline(always)]
    pub(crate) fn take_unexpected(
        &mut self,
        ops: &mut Slab<RxOp, RxId>,
        tag: Option<TagMatch>,
        want_peer: Option<PeerId>,
    ) -> Option<RxId> {
        let list = if tag.is_some() { &mut self.unexp_tag } else { &mut self.unexp_msg };
        // Usually none wait: say so without a call.
        if list.is_empty() {
            return None;
        }
        Self::take_first_match(list, ops, tag, want_peer)
    }

    #[inline(never)]
    fn take_first_match(
        list: &mut List,
        ops: &mut Slab<RxOp, RxId>,
        tag: Option<TagMatch>,
        want_peer: Option<PeerId>,
    ) -> Option<RxId> {
        let id = list
            .find(ops, |_, m| peer_ok(want_peer, m.peer) && tag.is_none_or(|t| tag_ok(t, m.tag)))?;
        list.remove(ops, id);
        Some(id)
    }
}

/// Messages whose later packets are still to come (medium segments,
/// long-CTS data), by (peer, msg_id).
#[derive(Debug)]
pub(crate) struct MsgIndex {
    map: FlatMap<u32>,
}

impl MsgIndex {
    pub(crate) fn with_capacity(n: usize) -> MsgIndex {
        MsgIndex { map: FlatMap::with_capacity(n) }
    }

    #[inline]
    fn key(peer: PeerId, msg_id: u32) -> u64 {
        ((peer.0 as u64) << 32) | msg_id as u64
    }

    #[inline]
    pub(crate) fn get(&self, peer: PeerId, msg_id: u32) -> Option<RxId> {
        self.map.get(Self::key(peer, msg_id)).copied().map(RxId)
    }

    #[inline]
    pub(crate) fn insert(&mut self, peer: PeerId, msg_id: u32, rx_id: RxId) {
        self.map.insert(Self::key(peer, msg_id), rx_id.0);
    }

    #[inline]
    pub(crate) fn remove(&mut self, peer: PeerId, msg_id: u32) {
        self.map.remove(Self::key(peer, msg_id));
    }
}
