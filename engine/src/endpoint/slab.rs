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
pub(crate) struct Slab<T, I = u32> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    _id: PhantomData<fn(I) -> I>,
}

impl<T: Clone, I: SlabId> Slab<T, I> {
    /// A slab of `capacity` entries (at most [`MAX_CAPACITY`]), each
    /// holding `blank` until first used.
    pub(crate) fn with_capacity(capacity: usize, blank: T) -> Slab<T, I> {
        assert!(capacity > 0 && capacity <= MAX_CAPACITY, "slab capacity {capacity}");
        let entries = (0..capacity).map(|_| Entry { stamp: 0, value: blank.clone() }).collect();
        // Pop from the end: low indices first, which keeps ids small.
        let free = (0..capacity as u32).rev().collect();
        Slab { entries, free, _id: PhantomData }
    }
}

impl<T, I: SlabId> Slab<T, I> {
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
    /// generation: one check where `get` then `free` would make two.
    #[inline(always)]
    pub(crate) fn take(&mut self, id: I) -> Option<T>
    where
        T: Copy,
    {
        self.retire(id).copied()
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
        e.stamp = (e.stamp + 1) & GENERATION_MASK;
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
        self.entries.iter().filter(|e| e.stamp & LIVE != 0).map(|e| &e.value)
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
        assert_eq!(s.take(a), None, "taking a stale id takes nothing");
        assert_eq!(s.take(c), Some("c"));
        assert_eq!(s.get(c), None, "taken is freed");
        assert_eq!(s.take(c), None, "once");
        let d = s.insert("d").unwrap();
        assert_ne!(d, c, "a taken slot comes back with a new generation");
        assert_eq!(s.get(b | 0x0ff0_0000), None, "forged generation");
        assert_eq!(s.get(0xfffff), None, "index out of range");
        assert!(s.is_full());
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
