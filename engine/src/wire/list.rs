//! Arrays of fixed-size wire items: `rma_iov[]`, `read_iov[]` (spec 3.3) and
//! the HANDSHAKE `extra_info[]` words (spec 2.1).

use super::{get_u64, put_u64};

/// A fixed-size item of a wire array.
pub trait WireItem: Copy + PartialEq + core::fmt::Debug + 'static {
    /// Bytes per item on the wire.
    const LEN: usize;
    /// Reads an item from exactly `LEN` bytes.
    fn read(b: &[u8]) -> Self;
    /// Writes the item into exactly `LEN` bytes.
    fn write(&self, b: &mut [u8]);
}

/// `struct efa_rma_iov`: a remote buffer (spec 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RmaIov {
    /// Remote virtual address (or offset, as the responder's registration
    /// defines it).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The responder's memory registration key.
    pub key: u64,
}

impl WireItem for RmaIov {
    const LEN: usize = 24;
    #[inline]
    fn read(b: &[u8]) -> Self {
        RmaIov { addr: get_u64(b, 0), len: get_u64(b, 8), key: get_u64(b, 16) }
    }
    #[inline]
    fn write(&self, b: &mut [u8]) {
        put_u64(b, 0, self.addr);
        put_u64(b, 8, self.len);
        put_u64(b, 16, self.key);
    }
}

impl WireItem for u64 {
    const LEN: usize = 8;
    #[inline]
    fn read(b: &[u8]) -> Self {
        get_u64(b, 0)
    }
    #[inline]
    fn write(&self, b: &mut [u8]) {
        put_u64(b, 0, *self)
    }
}

/// An array of wire items, either still in received bytes (zero-copy parse)
/// or in host form (what a sender hands to `emit`).
#[derive(Debug, Clone, Copy)]
pub enum WireList<'a, T: WireItem> {
    /// Received bytes; the length is a multiple of `T::LEN` (parse checks it).
    Wire(&'a [u8]),
    /// Host values.
    Host(&'a [T]),
}

/// `rma_iov[]` or `read_iov[]`.
pub type IovList<'a> = WireList<'a, RmaIov>;

impl<'a, T: WireItem> WireList<'a, T> {
    /// An empty list.
    pub const EMPTY: WireList<'static, T> = WireList::Host(&[]);

    /// Number of items.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            WireList::Wire(b) => b.len() / T::LEN,
            WireList::Host(v) => v.len(),
        }
    }

    /// True when the list holds no item.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the list takes on the wire.
    #[inline]
    pub fn wire_len(&self) -> usize {
        self.len() * T::LEN
    }

    /// The item at `index`, if any.
    #[inline]
    pub fn get(&self, index: usize) -> Option<T> {
        match self {
            WireList::Wire(b) => {
                let start = index.checked_mul(T::LEN)?;
                b.get(start..start + T::LEN).map(T::read)
            }
            WireList::Host(v) => v.get(index).copied(),
        }
    }

    /// Iterates over the items.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + 'a {
        let this = *self;
        (0..this.len()).map(move |i| match this {
            WireList::Wire(b) => T::read(&b[i * T::LEN..(i + 1) * T::LEN]),
            WireList::Host(v) => v[i],
        })
    }

    /// Writes the items into `buf`, which must hold `wire_len()` bytes.
    #[inline]
    pub(crate) fn emit(&self, buf: &mut [u8]) {
        match self {
            WireList::Wire(b) => buf[..b.len()].copy_from_slice(b),
            WireList::Host(v) => {
                for (item, out) in v.iter().zip(buf.chunks_exact_mut(T::LEN)) {
                    item.write(out);
                }
            }
        }
    }
}

impl<T: WireItem> PartialEq for WireList<'_, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl<T: WireItem + Eq> Eq for WireList<'_, T> {}

impl<T: WireItem> Default for WireList<'_, T> {
    fn default() -> Self {
        WireList::Host(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_host_forms_agree() {
        let host = [
            RmaIov { addr: 0x1122334455667788, len: 4096, key: 7 },
            RmaIov { addr: 1, len: u64::MAX, key: u64::MAX - 1 },
        ];
        let list = IovList::Host(&host);
        let mut bytes = [0xa5u8; 49];
        list.emit(&mut bytes);
        assert_eq!(&bytes[..8], &0x1122334455667788u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &4096u64.to_le_bytes());
        assert_eq!(bytes[48], 0xa5, "nothing written past the list");
        let wire = IovList::Wire(&bytes[..48]);
        assert_eq!(wire, list);
        assert_eq!(wire.get(1), Some(host[1]));
        assert_eq!(wire.get(2), None);
        assert_eq!(wire.get(usize::MAX), None);
        assert_eq!(wire.iter().collect::<Vec<_>>(), host);
        assert_ne!(IovList::Wire(&bytes[..24]), list);
    }
}
