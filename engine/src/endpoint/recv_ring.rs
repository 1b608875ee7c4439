//! Receive rings: a peer's untagged messages landed in fixed slots, each
//! armed by the caller when it is free, as a NIC's receive queue takes
//! its buffers. Arming queues a slot's number rather than a receive with
//! its entry to match and take for each message, which is what a framing
//! layer (`ulp::smbd`) that reposts every receive into the same slots
//! needs.

use super::types::PeerId;
use super::{Endpoint, Error, Span};
use crate::device::{Device, MrId};
use crate::ring::Ring;

/// A receive ring ([`Endpoint::recv_ring`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvRing {
    index: u32,
    /// Which use of the index: a handle kept past `recv_ring_free` names
    /// no later ring.
    generation: u32,
}

/// In `Rings::by_peer`: the peer has no ring.
pub(super) const NO_RING: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct RingState {
    peer: PeerId,
    /// Slot `i` is `len` bytes of `mr` at `offset + i * len`.
    mr: MrId,
    offset: u64,
    len: u64,
    /// Slot `i` completes with `ctx + i`.
    ctx: u64,
    /// The armed slots, in the order they take messages.
    armed: Ring<u16>,
    /// Per slot: whether it is in `armed`.
    is_armed: Box<[bool]>,
    /// Whether a message of the peer may wait unexpected: set when one
    /// found no slot armed (or may have come before the ring), cleared
    /// when a search finds none. Never false while one waits, so that an
    /// arm searches the unexpected messages only then, not whenever
    /// another peer's wait.
    waiting: bool,
}

impl RingState {
    /// The next armed slot, taken: its completion context and span.
    #[inline(always)]
    fn take_next(&mut self) -> Option<(u64, Span)> {
        let Some(slot) = self.armed.pop_front() else {
            // The message waits unexpected.
            self.waiting = true;
            return None;
        };
        self.is_armed[slot as usize] = false;
        let at = self.offset + slot as u64 * self.len;
        Some((self.ctx + slot as u64, Span { mr: self.mr, offset: at, len: self.len }))
    }
}

/// The rings of an endpoint.
#[derive(Debug, Default)]
pub(super) struct Rings {
    /// By handle index, with the generation of the index's use.
    list: Vec<(u32, Option<RingState>)>,
    /// By peer index, the peer's ring (`NO_RING` if none): empty until a
    /// peer has one, so that a message then checks a length only.
    by_peer: Vec<u32>,
}

impl<D: Device> Endpoint<D> {
    /// A receive ring for the untagged messages of `from`, over `slots`
    /// slots laid end to end from `first` (each `first.len` bytes): each
    /// message, whatever its protocol, lands in the slot armed first
    /// ([`Endpoint::recv_ring_arm`]) and completes with `ctx + slot`. No
    /// slot is armed at first. A message that finds none armed waits as an
    /// unexpected one does: an untagged receive posted then (for `from` or
    /// any peer) takes it as it would any, else the next arm hands it a
    /// slot, the oldest first. A receive posted before the message came
    /// takes nothing of `from`'s while the ring is there.
    /// [`Error::Busy`] when `from` has a ring already, [`Error::Invalid`]
    /// for no slots, [`Error::BadSpan`] when the slots leave the region.
    pub fn recv_ring(
        &mut self,
        first: Span,
        slots: u16,
        from: PeerId,
        ctx: u64,
    ) -> Result<RecvRing, Error> {
        self.check_peer(from)?;
        if slots == 0 || first.len == 0 {
            return Err(Error::Invalid);
        }
        let all = first.len.checked_mul(slots as u64).ok_or(Error::BadSpan)?;
        self.check_span(&Span { len: all, ..first })?;
        let p = from.0 as usize;
        if self.rings.by_peer.get(p).is_some_and(|&r| r != NO_RING) {
            return Err(Error::Busy);
        }
        let state = RingState {
            peer: from,
            mr: first.mr,
            offset: first.offset,
            len: first.len,
            ctx,
            armed: Ring::with_capacity(slots as usize, 0),
            is_armed: vec![false; slots as usize].into(),
            waiting: self.matcher.unexpected_untagged_waiting(),
        };
        let list = &mut self.rings.list;
        let index = match list.iter().position(|(_, s)| s.is_none()) {
            Some(i) => i,
            None => {
                list.push((0, None));
                list.len() - 1
            }
        };
        let (generation, slot) = &mut list[index];
        *slot = Some(state);
        if self.rings.by_peer.len() <= p {
            self.rings.by_peer.resize(p + 1, NO_RING);
        }
        self.rings.by_peer[p] = index as u32;
        Ok(RecvRing { index: index as u32, generation: *generation })
    }

    /// Arms slot `slot` of ring `r`, behind the slots armed before it: a
    /// slot is the caller's from its message's completion until it is
    /// armed again. A message of the ring's peer that waited for a slot
    /// takes it now. [`Error::Busy`] for a slot armed already,
    /// [`Error::Invalid`] for a freed ring or a slot it does not have.
    #[inline(always)]
    pub fn recv_ring_arm(&mut self, r: RecvRing, slot: u16) -> Result<(), Error> {
        let ring = self.ring_mut(r)?;
        match ring.is_armed.get_mut(slot as usize) {
            Some(armed) if !*armed => *armed = true,
            Some(_) => return Err(Error::Busy),
            None => return Err(Error::Invalid),
        }
        ring.armed.push_back(slot);
        if ring.waiting {
            self.ring_take_unexpected(r.index as usize);
        }
        // A message that waited for a receive entry may be an eager one a
        // slot now takes without one.
        self.retry_stalled();
        Ok(())
    }

    /// Hands the armed slots of ring `index` the unexpected messages of
    /// its peer, oldest first.
    #[inline(never)]
    fn ring_take_unexpected(&mut self, index: usize) {
        while let Some(ring) = &self.rings.list[index].1
            && !ring.armed.is_empty()
        {
            let peer = ring.peer;
            let waiting = self.matcher.take_unexpected(&mut self.rx_ops, None, Some(peer));
            let Some(id) = waiting else {
                self.rings.list[index].1.as_mut().expect("a live ring").waiting = false;
                return;
            };
            let (ctx, dst) = self.ring_slot(index).expect("an armed slot");
            self.take_unexpected_into(id, dst, None, ctx);
        }
    }

    /// Frees ring `r`: its peer's messages match posted receives again.
    /// Returns how many slots were armed, the last ones the caller armed:
    /// they take nothing now. A message that took a slot before completes
    /// there. [`Error::Invalid`] once freed.
    pub fn recv_ring_free(&mut self, r: RecvRing) -> Result<u16, Error> {
        self.ring_mut(r)?;
        let entry = &mut self.rings.list[r.index as usize];
        let ring = entry.1.take().expect("a live ring");
        entry.0 = entry.0.wrapping_add(1);
        self.rings.by_peer[ring.peer.0 as usize] = NO_RING;
        Ok(ring.armed.len() as u16)
    }

    #[inline(always)]
    fn ring_mut(&mut self, r: RecvRing) -> Result<&mut RingState, Error> {
        match self.rings.list.get_mut(r.index as usize) {
            Some((g, Some(ring))) if *g == r.generation => Ok(ring),
            _ => Err(Error::Invalid),
        }
    }

    /// The ring that takes an untagged message from `peer`, if any.
    #[inline(always)]
    pub(super) fn ring_for(&self, tagged: bool, peer: PeerId) -> Option<usize> {
        match self.rings.by_peer.get(peer.0 as usize) {
            Some(&i) if i != NO_RING && !tagged => Some(i as usize),
            _ => None,
        }
    }

    /// Ring `index`'s next armed slot, taken for a message: its
    /// completion context and span; None when none is armed.
    #[inline(always)]
    pub(super) fn ring_slot(&mut self, index: usize) -> Option<(u64, Span)> {
        self.rings.list[index].1.as_mut().expect("bound ring").take_next()
    }

    /// Whether a ring's slots lie in region `mr`.
    pub(super) fn ring_uses(&self, mr: MrId) -> bool {
        self.rings.list.iter().any(|(_, s)| s.as_ref().is_some_and(|s| s.mr == mr))
    }
}
