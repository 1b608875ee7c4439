//! A fixed-capacity slab whose ids carry a generation, so that an id from
//! the wire that names a freed or reused entry is detected, not misused.

use std::marker::PhantomData;

use super::types::SlabId;

/// Bits of an id that index the slab; the other 12 are the generation.
/// 2^20 entries let an application post a million receives; a stale id
/// aliases a live one only after its slot was reused exactly 4096 times.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u32 = (1 << (32 - INDEX_BITS)) - 1;
/// An entry's stamp with this bit set is live.
const LIVE: u32 = 1 << 31;
/// In a slab that keeps entries ([`Slab::insert_kept`]), the top bit of
/// the generation marks a kept entry, in its id and in its stamp: its id
/// is checked as any other, with one compare, and taking it tells it by
/// the id in hand. Such a slab's other entries cycle through the lower 11
/// bits.
const KEPT: u32 = 1 << (31 - INDEX_BITS);
const KEPT_ID: u32 = KEPT << INDEX_BITS;

/// Why a kept entry cannot be armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArmError {
    /// Not a live kept entry of this generation.
    Stale,
    /// Armed already.
    Armed,
}

/// The slab index an id names, whatever its generation.
#[inline(always)]
pub(crate) fn index(id: impl SlabId) -> usize {
    (id.raw() & INDEX_MASK) as usize
}

/// Largest capacity a slab can have.
pub(crate) const MAX_CAPACITY: usize = 1 << INDEX_BITS;

/// Its stamp first, then the value (`repr(C)`), from the start of a cache
/// line: checking an id from the wire and reading the value's first fields
/// touch the same line.
#[derive(Debug)]
#[repr(C, align(64))]
struct Entry<T> {
    /// The generation, and [`LIVE`] while in use: one word, written and
    /// read whole, so an id is checked with one compare and a check right
    /// after an insert or a free reads what the store wrote (a narrower
    /// store under a wider load stalls the load until the store retires).
    stamp: u32,
    /// A freed entry keeps its last value until the next insert
    /// overwrites it in place (no move through the stack).
    value: T,
}

/// Where a value of type `T` starts in its entry, and the entry's
/// alignment: what a layout test needs to tell which cache line of an
/// entry a field is in.
#[cfg(test)]
pub(crate) const fn value_placement<T>() -> (usize, usize) {
    (std::mem::offset_of!(Entry<T>, value), std::mem::align_of::<Entry<T>>())
}

/// Entries addressed by ids of type `I` over `u32`: index in the low 20
/// bits, generation in the high 12. All memory is allocated at
/// construction.
#[derive(Debug)]
pub(crate) struct Slab<T, I = u32, const KEEPS: bool = false> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    _id: PhantomData<fn(I) -> I>,
}

impl<T: Clone, I: SlabId, const KEEPS: bool> Slab<T, I, KEEPS> {
    /// A slab of `capacity` entries (at most [`MAX_CAPACITY`]), each
    /// holding `blank` until first used.
    pub(crate) fn with_capacity(capacity: usize, blank: T) -> Slab<T, I, KEEPS> {
        assert!(capacity > 0 && capacity <= MAX_CAPACITY, "slab capacity {capacity}");
        let entries = (0..capacity).map(|_| Entry { stamp: 0, value: blank.clone() }).collect();
        // Pop from the end: low indices first, which keeps ids small.
        let free = (0..capacity as u32).rev().collect();
        Slab { entries, free, _id: PhantomData }
    }
}

impl<T, I: SlabId, const KEEPS: bool> Slab<T, I, KEEPS> {
    /// The generation an entry freed goes on with.
    #[inline(always)]
    fn next_generation(stamp: u32) -> u32 {
        (stamp + 1) & if KEEPS { GENERATION_MASK & !KEPT } else { GENERATION_MASK }
    }

    /// Takes a free entry and lets `init` set its value in place (the
    /// entry holds a stale value: `init` must set every field it cares
    /// about, typically by assigning a whole new value first); `None` when
    /// full. Always inlined, as is `insert`: a call would move the value
    /// through the stack.
    #[inline(always)]
    pub(crate) fn insert_with(&mut self, init: impl FnOnce(&mut T)) -> Option<I> {
        let index = self.free.pop()?;
        let e = &mut self.entries[index as usize];
        let generation = e.stamp;
        e.stamp = generation | LIVE;
        init(&mut e.value);
        Some(I::from_raw((generation << INDEX_BITS) | index))
    }

    /// Stores `value`; `None` when full.
    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> Option<I> {
        self.insert_with(|v| *v = value)
    }

    /// Stores `value` in an entry that [`Slab::take_or_keep`] takes only
    /// when armed ([`Slab::arm`]), and then leaves idle (not live, so not
    /// found by [`Slab::get`]) rather than free: freed only by
    /// [`Slab::free_kept`]. `None` when full.
    pub(crate) fn insert_kept(&mut self, value: T) -> Option<I> {
        assert!(KEEPS, "a slab that keeps entries");
        let index = self.free.pop()?;
        let e = &mut self.entries[index as usize];
        e.stamp |= KEPT;
        e.value = value;
        Some(I::from_raw((e.stamp << INDEX_BITS) | index))
    }

    /// The index and generation of kept entry `id`, live (armed) or idle.
    #[inline(always)]
    fn kept(&self, id: I) -> Result<(usize, u32), ArmError> {
        let raw = id.raw();
        let generation = raw >> INDEX_BITS;
        match self.entries.get(index(raw)) {
            Some(e) if KEEPS && raw & KEPT_ID != 0 && e.stamp & !LIVE == generation => {
                Ok((index(raw), generation))
            }
            _ => Err(ArmError::Stale),
        }
    }

    /// Arms kept entry `id`: live again, for [`Slab::take_or_keep`] to
    /// take.
    #[inline(always)]
    pub(crate) fn arm(&mut self, id: I) -> Result<(), ArmError> {
        let (at, generation) = self.kept(id)?;
        let e = &mut self.entries[at];
        if e.stamp & LIVE != 0 {
            return Err(ArmError::Armed);
        }
        e.stamp = generation | LIVE;
        Ok(())
    }

    /// Whether kept entry `id` is armed; its value.
    pub(crate) fn armed(&self, id: I) -> Result<(bool, &T), ArmError> {
        let e = &self.entries[self.kept(id)?.0];
        Ok((e.stamp & LIVE != 0, &e.value))
    }

    /// Frees kept entry `id`, armed or idle.
    pub(crate) fn free_kept(&mut self, id: I) -> Result<(), ArmError> {
        let (at, generation) = self.kept(id)?;
        self.entries[at].stamp = Self::next_generation(generation);
        self.free.push(at as u32);
        Ok(())
    }

    /// The entry `id` names, if it is live and of this generation.
    #[inline]
    pub(crate) fn get(&self, id: I) -> Option<&T> {
        let id = id.raw();
        let e = self.entries.get(index(id))?;
        (e.stamp == (id >> INDEX_BITS) | LIVE).then_some(&e.value)
    }

    /// The entry `id` names, if it is live and of this generation.
    #[inline]
    pub(crate) fn get_mut(&mut self, id: I) -> Option<&mut T> {
        let id = id.raw();
        let e = self.entries.get_mut(index(id))?;
        (e.stamp == (id >> INDEX_BITS) | LIVE).then_some(&mut e.value)
    }

    /// Frees entry `id`, if it is live and of this generation.
    #[inline]
    pub(crate) fn free(&mut self, id: I) {
        self.retire(id);
    }

    /// Frees entry `id` and returns its value, if it is live and of this
    /// generation: one check where `get` then `free` would make two. An
    /// armed kept entry is disarmed instead, and stays, idle: the entries
    /// freed pay a test of the id in hand for the ones kept.
    #[inline(always)]
    pub(crate) fn take_or_keep(&mut self, id: I) -> Option<T>
    where
        T: Copy,
    {
        if KEEPS && id.raw() & KEPT_ID != 0 {
            return self.disarm(id);
        }
        self.retire(id).copied()
    }

    /// Disarms armed kept entry `id`; its value.
    #[inline(always)]
    fn disarm(&mut self, id: I) -> Option<T>
    where
        T: Copy,
    {
        let raw = id.raw();
        let e = self.entries.get_mut(index(raw))?;
        if e.stamp != (raw >> INDEX_BITS) | LIVE {
            return None;
        }
        e.stamp &= !LIVE;
        Some(e.value)
    }

    /// Frees entry `id` if it is live and of this generation; its value
    /// stays in place until the next insert.
    #[inline(always)]
    fn retire(&mut self, id: I) -> Option<&T> {
        let id = id.raw();
        let index = id & INDEX_MASK;
        let e = self.entries.get_mut(index as usize)?;
        if e.stamp != (id >> INDEX_BITS) | LIVE {
            return None;
        }
        e.stamp = Self::next_generation(e.stamp);
        self.free.push(index);
        Some(&e.value)
    }

    /// Whether no entry is free.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Entries in use.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// The values of the entries in use, in slab order (a walk over the
    /// whole slab: for set-up and teardown, not the hot path).
    pub(crate) fn live(&self) -> impl Iterator<Item = &T> {
        let kept = if KEEPS { KEPT } else { 0 };
        self.entries.iter().filter(move |e| e.stamp & (LIVE | kept) != 0).map(|e| &e.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_forged_ids_are_refused() {
        let mut s: Slab<&str> = Slab::with_capacity(2, "");
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert!(s.insert("c").is_none(), "full");
        assert_eq!(s.get(a), Some(&"a"));
        s.free(a);
        assert_eq!(s.get(a), None, "freed");
        let c = s.insert("c").unwrap();
        assert_eq!(c & INDEX_MASK, a & INDEX_MASK, "slot reused");
        assert_ne!(c, a, "with a new generation");
        assert_eq!(s.get(a), None, "the old id is stale");
        s.free(a);
        assert_eq!(s.get(c), Some(&"c"), "freeing a stale id frees nothing");
        assert_eq!(s.take_or_keep(a), None, "taking a stale id takes nothing");
        assert_eq!(s.take_or_keep(c), Some("c"));
        assert_eq!(s.get(c), None, "taken is freed");
        assert_eq!(s.take_or_keep(c), None, "once");
        let d = s.insert("d").unwrap();
        assert_ne!(d, c, "a taken slot comes back with a new generation");
        assert_eq!(s.get(b | 0x0ff0_0000), None, "forged generation");
        assert_eq!(s.get(0xfffff), None, "index out of range");
        assert!(s.is_full());
    }

    #[test]
    fn a_kept_entry_is_taken_when_armed_and_stays_until_freed() {
        let mut s: Slab<u8, u32, true> = Slab::with_capacity(2, 0);
        let kept = s.insert_kept(1).unwrap();
        let other = s.insert(2).unwrap();
        assert_eq!(s.get(kept), None, "idle: not found");
        assert_eq!(s.armed(kept), Ok((false, &1)));
        assert_eq!(s.take_or_keep(kept), None, "not armed: nothing to take");
        assert_eq!(s.arm(kept), Ok(()));
        assert_eq!(s.armed(kept), Ok((true, &1)));
        assert_eq!(s.arm(kept), Err(ArmError::Armed));
        assert_eq!(s.get(kept), Some(&1), "found armed");
        assert_eq!(s.take_or_keep(kept), Some(1));
        assert_eq!((s.get(kept), s.armed(kept)), (None, Ok((false, &1))), "idle again");
        assert_eq!(s.live().count(), 2, "an idle kept entry is in use");
        assert_eq!(s.arm(other), Err(ArmError::Stale), "an entry not kept is not armed");
        assert_eq!(s.free_kept(other), Err(ArmError::Stale));
        assert_eq!(s.take_or_keep(other), Some(2));
        assert_eq!(s.get(other), None, "freed");
        s.arm(kept).unwrap();
        assert_eq!(s.free_kept(kept), Ok(()));
        assert_eq!(s.get(kept), None, "a kept entry, armed or not, is freed by `free_kept`");
        assert_eq!(s.armed(kept), Err(ArmError::Stale));
        assert_eq!(s.arm(kept), Err(ArmError::Stale));
        assert_eq!(s.take_or_keep(kept), None, "a stale id takes nothing");
        assert_eq!(s.free_kept(kept), Err(ArmError::Stale), "freed once");
        let (a, b) = (s.insert(3).unwrap(), s.insert(4).unwrap());
        assert!(s.is_full());
        for id in [a, b] {
            assert_ne!(id, kept, "a reused entry's id differs from the kept one's");
            assert!(s.take_or_keep(id).is_some());
            assert_eq!(s.get(id), None, "its reuse is not kept");
        }
        let idle = s.insert_kept(5).unwrap();
        assert_eq!(s.free_kept(idle), Ok(()), "freed idle");
        assert_eq!(s.live().count(), 0);
    }

    #[test]
    fn generations_of_a_keeping_slab_never_make_a_kept_id() {
        let mut s: Slab<u8, u32, true> = Slab::with_capacity(1, 0);
        let kept = s.insert_kept(0).unwrap();
        s.free_kept(kept).unwrap();
        for _ in 0..5000 {
            let id = s.insert(1).unwrap();
            assert_eq!(id & KEPT_ID, 0, "{id:#x}");
            assert_ne!(id, kept);
            s.free(id);
        }
    }

    #[test]
    fn generations_wrap_within_their_bits() {
        let mut s: Slab<i32> = Slab::with_capacity(1, 0);
        let first = s.insert(0).unwrap();
        s.free(first);
        for _ in 0..4095 {
            let id = s.insert(1).unwrap();
            assert_eq!(id & INDEX_MASK, 0);
            s.free(id);
        }
        // The 4096th reuse of the slot brings the first generation back.
        let id = s.insert(2).unwrap();
        assert_eq!(id, first);
        assert_eq!(s.get(id), Some(&2));
    }
}
