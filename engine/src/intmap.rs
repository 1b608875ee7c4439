//! Hash maps keyed by integers the endpoint chooses or checks (tags, ids,
//! keys): a multiplicative hash, not SipHash, on the hot path.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The FxHash multiply-rotate over 64-bit words.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A map from `u64` keys.
pub(crate) type IntMap<V> = HashMap<u64, V, BuildHasherDefault<IntHasher>>;

/// A map from `u64` keys to small values, for lookups on the hot path:
/// open addressing with linear probing over one array of (key, value)
/// slots, so that a lookup in a large, cold map costs about one cache miss
/// (a `HashMap` reads its control bytes and its bucket, two). Sized at
/// construction to stay at most three quarters full, dense enough that
/// ten thousand keys and what they point to stay within a core's L2;
/// inserting beyond that grows it (allocating, off the hot path). Removal shifts the probe run back, so
/// no tombstones build up.
#[derive(Debug, Clone)]
pub(crate) struct FlatMap<V> {
    slots: Box<[Slot<V>]>,
    /// `slots.len() - 1`; the length is a power of two.
    mask: usize,
    /// log2 of `slots.len()`: the hash's top bits index the slots.
    bits: u32,
    len: usize,
    /// The value of key `EMPTY`, which cannot live in a slot.
    empty_key: Option<V>,
}

#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    key: u64,
    value: V,
}

/// The key that marks a free slot.
const EMPTY: u64 = u64::MAX;

impl<V: Copy + Default> FlatMap<V> {
    /// A map that holds `n` keys without growing.
    pub(crate) fn with_capacity(n: usize) -> FlatMap<V> {
        let slots = (n + n.div_ceil(3)).next_power_of_two().max(16);
        FlatMap {
            slots: vec![Slot { key: EMPTY, value: V::default() }; slots].into_boxed_slice(),
            mask: slots - 1,
            bits: slots.trailing_zeros(),
            len: 0,
            empty_key: None,
        }
    }

    /// Where `key`'s probe run starts: the top bits of a Fibonacci hash,
    /// which spread sequential keys (tags, msg_ids) evenly.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - self.bits)) as usize
    }

    /// The slot holding `key`, or the free slot that ends its probe run.
    #[inline(always)]
    fn probe(&self, key: u64) -> (usize, bool) {
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key;
            if k == key {
                return (i, true);
            }
            if k == EMPTY {
                return (i, false);
            }
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<&V> {
        if key == EMPTY {
            return self.empty_key.as_ref();
        }
        match self.probe(key) {
            (i, true) => Some(&self.slots[i].value),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == EMPTY {
            return self.empty_key.as_mut();
        }
        match self.probe(key) {
            (i, true) => Some(&mut self.slots[i].value),
            _ => None,
        }
    }

    /// `key`'s value, inserted as `V::default()` if absent.
    #[inline]
    pub(crate) fn get_or_default(&mut self, key: u64) -> &mut V {
        if key == EMPTY {
            return self.empty_key.get_or_insert_with(V::default);
        }
        let (mut i, found) = self.probe(key);
        if !found {
            if 4 * (self.len + 1) > 3 * self.slots.len() {
                self.grow();
                i = self.probe(key).0;
            }
            self.slots[i] = Slot { key, value: V::default() };
            self.len += 1;
        }
        &mut self.slots[i].value
    }

    #[inline]
    pub(crate) fn insert(&mut self, key: u64, value: V) {
        *self.get_or_default(key) = value;
    }

    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.empty_key.take();
        }
        let (mut hole, found) = self.probe(key);
        if !found {
            return None;
        }
        let value = self.slots[hole].value;
        self.len -= 1;
        // Move back every later entry of the run that may sit in the hole
        // (its home is not cyclically within (hole, j]).
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let k = self.slots[j].key;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].key = EMPTY;
        Some(value)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len + self.empty_key.is_some() as usize
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = FlatMap::with_capacity(self.slots.len());
        for s in self.slots.iter().filter(|s| s.key != EMPTY) {
            bigger.insert(s.key, s.value);
        }
        bigger.empty_key = self.empty_key;
        *self = bigger;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u64, u32),
        Remove(u64),
    }

    /// Keys from a small set (so that removes hit), with the sentinel and
    /// keys that collide at home in a small table.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..40, Just(EMPTY), (0u64..8).prop_map(|k| k << 60)]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (key(), any::<u32>()).prop_map(|(k, v)| Step::Insert(k, v)),
            key().prop_map(Step::Remove),
        ]
    }

    proptest! {
        #[test]
        fn behaves_as_a_hash_map(steps in proptest::collection::vec(step(), 0..400)) {
            // Room for 4 keys: a 16-slot table that grows under the load.
            let mut m = FlatMap::<u32>::with_capacity(4);
            let mut model = std::collections::HashMap::new();
            for s in steps {
                match s {
                    Step::Insert(k, v) => {
                        m.insert(k, v);
                        model.insert(k, v);
                    }
                    Step::Remove(k) => prop_assert_eq!(m.remove(k), model.remove(&k)),
                }
                prop_assert_eq!(m.len(), model.len());
            }
            for k in (0..40).chain([EMPTY]).chain((0..8).map(|k| k << 60)) {
                prop_assert_eq!(m.get(k), model.get(&k));
            }
        }
    }

    #[test]
    fn a_removal_keeps_the_rest_of_a_wrapped_probe_run_reachable() {
        let mut m = FlatMap::<u32>::with_capacity(8);
        // Keys whose runs start in the table's last slots and wrap.
        let last: Vec<u64> = (0..100_000u64).filter(|&k| m.home(k) >= m.mask - 1).take(5).collect();
        for (v, &k) in last.iter().enumerate() {
            m.insert(k, v as u32);
        }
        m.remove(last[0]);
        for (v, &k) in last.iter().enumerate().skip(1) {
            assert_eq!(m.get(k), Some(&(v as u32)), "key {k}");
        }
        assert_eq!(m.get(last[0]), None);
        assert_eq!(m.slots.iter().filter(|s| s.key != EMPTY).count(), 4);
    }

    #[test]
    fn a_map_within_its_capacity_never_grows() {
        let mut m = FlatMap::<u32>::with_capacity(1000);
        let slots = m.slots.len();
        for k in 0..1000 {
            m.insert(k * 7919, k as u32);
        }
        assert_eq!(m.slots.len(), slots);
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(999 * 7919), Some(&999));
    }
}
