//! The endpoint's registered regions, and the checks a responder makes on
//! every remote iov before a byte moves (RDMAP 7.2: key known, range
//! inside the registration with no overflow, right granted).

use crate::device::{Access, Mr, MrId};
use crate::intmap::IntMap;
use crate::wire::RmaIov;

/// Why a remote access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region has this key.
    #[error("unknown memory key")]
    UnknownKey,
    /// The range starts before the region, ends after it, or wraps.
    #[error("range outside the registration")]
    OutOfBounds,
    /// The region does not grant the right.
    #[error("access right not granted")]
    NotPermitted,
}

/// A byte range of a local region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    pub mr: MrId,
    pub offset: u64,
    pub len: u64,
}

impl Span {
    /// `len` bytes of `mr` from `offset`.
    pub fn new(mr: &Mr, offset: u64, len: u64) -> Span {
        Span { mr: mr.id, offset, len }
    }

    /// All of `mr`.
    pub fn whole(mr: &Mr) -> Span {
        Span { mr: mr.id, offset: 0, len: mr.len }
    }
}

/// Regions by local id and by key.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    by_id: Vec<Option<Mr>>,
    by_key: IntMap<u32>,
}

impl Registry {
    pub(crate) fn insert(&mut self, mr: Mr) {
        let i = mr.id.0 as usize;
        if self.by_id.len() <= i {
            self.by_id.resize(i + 1, None);
        }
        self.by_id[i] = Some(mr);
        self.by_key.insert(mr.key, mr.id.0);
    }

    pub(crate) fn remove(&mut self, id: MrId) -> Option<Mr> {
        let mr = self.by_id.get_mut(id.0 as usize)?.take()?;
        self.by_key.remove(&mr.key);
        Some(mr)
    }

    #[inline]
    pub(crate) fn get(&self, id: MrId) -> Option<&Mr> {
        self.by_id.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The region with remote key `key`.
    pub(crate) fn by_key(&self, key: u64) -> Option<&Mr> {
        self.get(MrId(*self.by_key.get(&key)?))
    }

    /// Whether `span` lies in a registered region.
    #[inline]
    pub(crate) fn contains(&self, span: &Span) -> bool {
        self.get(span.mr)
            .is_some_and(|mr| span.offset.checked_add(span.len).is_some_and(|e| e <= mr.len))
    }

    /// The local span a peer's iov names, if the access is allowed.
    pub(crate) fn resolve(&self, iov: &RmaIov, need: Access) -> Result<Span, AccessError> {
        let id = *self.by_key.get(&iov.key).ok_or(AccessError::UnknownKey)?;
        let mr = self.get(MrId(id)).ok_or(AccessError::UnknownKey)?;
        let offset = iov.addr.checked_sub(mr.addr).ok_or(AccessError::OutOfBounds)?;
        let end = offset.checked_add(iov.len).ok_or(AccessError::OutOfBounds)?;
        if end > mr.len {
            return Err(AccessError::OutOfBounds);
        }
        if !mr.access.intersects(need) {
            return Err(AccessError::NotPermitted);
        }
        Ok(Span { mr: mr.id, offset, len: iov.len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_violation_is_refused() {
        let mut reg = Registry::default();
        let mr =
            Mr { id: MrId(3), key: 0xabc, addr: 0x1000, len: 0x100, access: Access::REMOTE_READ };
        reg.insert(mr);
        let iov = |addr, len, key| RmaIov { addr, len, key };
        assert_eq!(
            reg.resolve(&iov(0x1010, 0x10, 0xabc), Access::REMOTE_READ),
            Ok(Span { mr: MrId(3), offset: 0x10, len: 0x10 })
        );
        assert_eq!(
            reg.resolve(&iov(0x1000, 0x100, 0xabc), Access::REMOTE_READ).map(|s| s.len),
            Ok(0x100)
        );
        assert_eq!(
            reg.resolve(&iov(0x1000, 8, 0xabd), Access::REMOTE_READ),
            Err(AccessError::UnknownKey)
        );
        assert_eq!(
            reg.resolve(&iov(0xfff, 8, 0xabc), Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            reg.resolve(&iov(0x10f9, 8, 0xabc), Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            reg.resolve(&iov(0x1008, u64::MAX, 0xabc), Access::REMOTE_READ),
            Err(AccessError::OutOfBounds)
        );
        assert_eq!(
            reg.resolve(&iov(0x1000, 8, 0xabc), Access::REMOTE_WRITE),
            Err(AccessError::NotPermitted)
        );
        // Any of the rights asked for will do (atomics accept write or atomic).
        assert!(
            reg.resolve(&iov(0x1000, 8, 0xabc), Access::REMOTE_WRITE | Access::REMOTE_READ).is_ok()
        );
        reg.remove(MrId(3));
        assert_eq!(
            reg.resolve(&iov(0x1000, 8, 0xabc), Access::REMOTE_READ),
            Err(AccessError::UnknownKey)
        );
    }
}
