//! Receive rings: a peer's untagged messages landed in fixed slots, each
//! armed by the caller when it is free, as a NIC's receive queue takes
//! its buffers. Slots take messages in turn, by index, as a receive
//! queue's entries do: no receive to match and take per message, and no
//! queue of armed slots to keep. A short message that lands whole is
//! marked in its slot rather than reported in the completion queue, so
//! that a framing layer (`ulp::smbd`) that reads every message where it
//! landed takes it in turn with a load.

use super::types::{BufId, PeerId};
use super::{Endpoint, Error, Span};
use crate::device::{Device, MrId};

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

/// In `RingState::landed`: no message marked in the slot.
const NOT_LANDED: u32 = u32::MAX;

#[derive(Debug)]
pub(super) struct RingState {
    peer: PeerId,
    /// Slot `i` is `len` bytes of `mr` at `offset + i * len`.
    mr: MrId,
    offset: u64,
    len: u64,
    /// Slot `i` completes with `ctx + i`.
    ctx: u64,
    /// The slot whose turn it is to take a message.
    next: u16,
    /// Per slot: armed, and not yet given a message.
    is_armed: Box<[bool]>,
    armed: u16,
    /// Per slot: the length of the message marked landed there
    /// ([`Endpoint::recv_ring_landed`]), or `NOT_LANDED`.
    landed: Box<[u32]>,
    /// Whether a message of the peer may wait unexpected: set when one
    /// found its slot not armed (or may have come before the ring),
    /// cleared when a search finds none. Never false while one waits, so
    /// that an arm searches the unexpected messages only then, not
    /// whenever another peer's wait.
    waiting: bool,
}

impl RingState {
    /// The slot whose turn it is, taken if armed: its number.
    #[inline(always)]
    fn take_next(&mut self) -> Option<u16> {
        let slot = self.next;
        match self.is_armed.get_mut(slot as usize) {
            Some(armed) if *armed => *armed = false,
            _ => {
                // The message waits unexpected.
                self.waiting = true;
                return None;
            }
        }
        self.armed -= 1;
        self.next = if slot as usize + 1 == self.is_armed.len() { 0 } else { slot + 1 };
        Some(slot)
    }

    /// Arms slot `slot`: [`Error::Busy`] if it is armed already,
    /// [`Error::Invalid`] if there is no such slot.
    #[inline(always)]
    fn arm(&mut self, slot: u16) -> Result<(), Error> {
        match self.is_armed.get_mut(slot as usize) {
            Some(armed) if !*armed => *armed = true,
            Some(_) => return Err(Error::Busy),
            None => return Err(Error::Invalid),
        }
        self.armed += 1;
        Ok(())
    }

    /// Undoes [`Self::arm`] of slot `slot`.
    fn disarm(&mut self, slot: u16) {
        self.is_armed[slot as usize] = false;
        self.armed -= 1;
    }

    #[inline(always)]
    fn span(&self, slot: u16) -> Span {
        Span { mr: self.mr, offset: self.offset + slot as u64 * self.len, len: self.len }
    }
}

/// Copies all of a slot shorter than `head` into it. Out of line, so that
/// the usual read, of a header's known length, stays a few moves rather
/// than joining this one in a call to memcpy.
#[cold]
#[inline(never)]
fn read_short_slot<D: Device>(dev: &D, ring: &RingState, at: usize, head: &mut [u8]) {
    dev.read_region(ring.mr, at, &mut head[..ring.len as usize]);
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
    /// slots laid end to end from `first` (each `first.len` bytes). The
    /// slots take the messages in turn, 0, 1, .. `slots - 1`, then 0 again,
    /// whatever their protocol, each slot once armed
    /// ([`Endpoint::recv_ring_arm`]); no slot is armed at first. A message
    /// whose slot is not armed waits as an unexpected one does: an
    /// untagged receive posted then (for `from` or any peer) takes it as
    /// it would any, else arming the slot hands it the slot, the oldest
    /// first. A receive posted before the message came takes nothing of
    /// `from`'s while the ring is there.
    ///
    /// A message that lands whole by the eager protocol, with no CQ data
    /// and within its slot, is marked in the slot and not reported in the
    /// completion queue: [`Endpoint::recv_ring_landed`] takes its length.
    /// Any other completes in the queue with `ctx + slot`, as a receive
    /// does. Either way the slot is the caller's until armed again.
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
            next: 0,
            is_armed: vec![false; slots as usize].into(),
            armed: 0,
            landed: vec![NOT_LANDED; slots as usize].into(),
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

    /// Arms slot `slot` of ring `r`: it takes a message in its turn. A
    /// slot is the caller's from its message's completion until it is
    /// armed again; the message that waited for it takes it now.
    /// [`Error::Busy`] for a slot armed already, [`Error::Invalid`] for a
    /// freed ring or a slot it does not have.
    #[inline(always)]
    pub fn recv_ring_arm(&mut self, r: RecvRing, slot: u16) -> Result<(), Error> {
        let ring = self.ring_mut(r)?;
        ring.arm(slot)?;
        let wakes = ring.waiting && slot == ring.next;
        self.ring_armed(r.index as usize, wakes);
        Ok(())
    }

    /// Arms each of `slots` of ring `r`, as that many
    /// [`Endpoint::recv_ring_arm`]s would, with one look-up of the ring
    /// and one look for messages that waited: none armed on an error
    /// (a slot named twice is armed already the second time).
    pub fn recv_ring_arm_each(&mut self, r: RecvRing, slots: &[u16]) -> Result<(), Error> {
        let ring = self.ring_mut(r)?;
        let mut wakes = false;
        for (i, &slot) in slots.iter().enumerate() {
            if let Err(e) = ring.arm(slot) {
                for &armed in &slots[..i] {
                    ring.disarm(armed);
                }
                return Err(e);
            }
            wakes |= slot == ring.next;
        }
        let waiting = ring.waiting;
        self.ring_armed(r.index as usize, wakes && waiting);
        Ok(())
    }

    /// Arms the `count` slots of ring `r` from `first` on, wrapping past
    /// the last to slot 0, as [`Endpoint::recv_ring_arm_each`] of them
    /// would: a caller that gives slots back in the order they take
    /// messages arms them so without listing them. None armed on an
    /// error: [`Error::Busy`] when one is armed already,
    /// [`Error::Invalid`] for a freed ring, a first slot it does not have
    /// or more slots than it has.
    pub fn recv_ring_arm_run(&mut self, r: RecvRing, first: u16, count: u16) -> Result<(), Error> {
        let ring = self.ring_mut(r)?;
        let n = ring.is_armed.len();
        let (first, count) = (first as usize, count as usize);
        if first >= n || count > n {
            return Err(Error::Invalid);
        }
        // The run as its two pieces: to the last slot, then from slot 0.
        let (to_end, wrapped) =
            if first + count <= n { (count, 0) } else { (n - first, first + count - n) };
        let (low, high) = ring.is_armed.split_at_mut(first);
        let (high, low) = (&mut high[..to_end], &mut low[..wrapped]);
        // Folded whole rather than searched, so that the test goes a
        // vector at a time.
        let any_armed = |slots: &[bool]| slots.iter().fold(false, |any, &a| any | a);
        if any_armed(high) || any_armed(low) {
            return Err(Error::Busy);
        }
        high.fill(true);
        low.fill(true);
        ring.armed += count as u16;
        let next = ring.next as usize;
        let past_first = if next >= first { next - first } else { next + n - first };
        let wakes = ring.waiting && past_first < count;
        self.ring_armed(r.index as usize, wakes);
        Ok(())
    }

    /// Slots of ring `index` were armed: when `wakes` (the one in turn
    /// among them, and a message may wait), the messages that waited for
    /// them take them.
    #[inline(always)]
    fn ring_armed(&mut self, index: usize, wakes: bool) {
        if wakes {
            self.ring_take_unexpected(index);
        }
        // A message that waited for a receive entry may be an eager one a
        // slot now takes without one.
        self.retry_stalled();
    }

    /// The length of the message marked landed in slot `slot` of ring `r`
    /// (see [`Endpoint::recv_ring`]), taken: each mark is returned once.
    /// The slot's first `head.len()` bytes (as many as it has) are copied
    /// into `head` as it is taken, so that a framing layer reads its
    /// header with the same look-up of the ring: pass `&mut []` for none.
    /// None, `head` untouched, when the slot has none (or `r` is freed).
    #[inline(always)]
    pub fn recv_ring_landed(&mut self, r: RecvRing, slot: u16, head: &mut [u8]) -> Option<u64> {
        // The ring alone borrowed, so that the device can read the slot.
        let ring = match self.rings.list.get_mut(r.index as usize) {
            Some((g, Some(ring))) if *g == r.generation => ring,
            _ => return None,
        };
        let landed = ring.landed.get_mut(slot as usize)?;
        if *landed == NOT_LANDED {
            return None;
        }
        let len = std::mem::replace(landed, NOT_LANDED) as u64;
        if !head.is_empty() {
            // In its region: the ring's span was checked when it was made,
            // and a region with a ring on it stays registered.
            let at = (ring.offset + slot as u64 * ring.len) as usize;
            if head.len() as u64 <= ring.len {
                // A header's known length: copied with moves.
                self.dev.read_region(ring.mr, at, head);
            } else {
                read_short_slot(&self.dev, ring, at, head);
            }
        }
        Some(len)
    }

    /// Whether slot `slot` of ring `r` has a message marked landed, which
    /// [`Endpoint::recv_ring_landed`] would take.
    #[inline(always)]
    pub fn recv_ring_has_landed(&self, r: RecvRing, slot: u16) -> bool {
        match self.rings.list.get(r.index as usize) {
            Some((g, Some(ring))) if *g == r.generation => {
                ring.landed.get(slot as usize).is_some_and(|&l| l != NOT_LANDED)
            }
            _ => false,
        }
    }

    /// Lands eager payload `from..from + len` of `buf` in ring `index`'s
    /// slot in turn, marked there, when it fits: Some(true). Some(false),
    /// with nothing taken, when it does not fit; None when the slot is
    /// not armed (the message waits).
    #[inline(always)]
    pub(super) fn ring_land_eager(
        &mut self,
        index: usize,
        buf: BufId,
        from: usize,
        len: u64,
    ) -> Option<bool> {
        // One look-up of the ring for the slot, the copy and the mark.
        let ring = self.rings.list[index].1.as_mut().expect("bound ring");
        if len > ring.len {
            return Some(false);
        }
        let slot = ring.take_next()?;
        let span = ring.span(slot);
        if len > 0 {
            self.dev.copy_to_slot(buf, from, span.mr, span.offset as usize, len as usize);
        }
        // An eager payload, within one packet: far below `NOT_LANDED`.
        ring.landed[slot as usize] = len as u32;
        Some(true)
    }

    /// Hands the slots of ring `index`, armed in turn, the unexpected
    /// messages of its peer, oldest first.
    #[inline(never)]
    fn ring_take_unexpected(&mut self, index: usize) {
        while let Some(ring) = &self.rings.list[index].1
            && ring.is_armed[ring.next as usize]
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
    /// Returns how many slots were armed: they take nothing now. A message
    /// that took a slot before completes there, in the completion queue;
    /// the marks not yet taken ([`Endpoint::recv_ring_landed`]) are
    /// dropped. [`Error::Invalid`] once freed.
    pub fn recv_ring_free(&mut self, r: RecvRing) -> Result<u16, Error> {
        self.ring_mut(r)?;
        let entry = &mut self.rings.list[r.index as usize];
        let ring = entry.1.take().expect("a live ring");
        entry.0 = entry.0.wrapping_add(1);
        self.rings.by_peer[ring.peer.0 as usize] = NO_RING;
        Ok(ring.armed)
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
        let ring = self.rings.list[index].1.as_mut().expect("bound ring");
        let slot = ring.take_next()?;
        Some((ring.ctx + slot as u64, ring.span(slot)))
    }

    /// Whether a ring's slots lie in region `mr`.
    pub(super) fn ring_uses(&self, mr: MrId) -> bool {
        self.rings.list.iter().any(|(_, s)| s.as_ref().is_some_and(|s| s.mr == mr))
    }
}
