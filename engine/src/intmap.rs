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
