//! The address book of one queue, apart from the verbs so that it is
//! tested without a device: peers by handle, and a received packet's
//! sender from what its completion reports.
//!
//! EFA names a sender by the number of the receiver's address handle for
//! the sender's GID (`slid`, the AH number) and its QP number; a sender
//! whose GID has no address handle here comes with `slid == 0xffff`
//! (spec 2.2: "unknown"). As libfabric's EFA provider (`efa_av_reverse_
//! lookup_rdm`: AH number and QPN), a known sender is found by (AH number,
//! QPN), one probe of a flat table; an unknown one by its GID (read with
//! `efadv_wc_read_sgid` where the CQ has it) and QPN, off the hot path.

use std::collections::HashMap;

use crate::device::{Ah, DeviceError, Source};
use crate::intmap::FlatMap;
use crate::wire::RawAddr;

/// `slid` of a completion whose sender has no address handle here.
pub(super) const UNKNOWN_AHN: u32 = 0xffff;

/// A peer: its address, and the address handle for its GID (`A`: the
/// verbs handle; shared by every peer of that host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Peer<A> {
    pub addr: RawAddr,
    pub ah: A,
    pub ahn: u16,
}

#[derive(Debug)]
pub(super) struct Book<A> {
    peers: Vec<Option<Peer<A>>>,
    by_addr: HashMap<RawAddr, Ah>,
    /// (AH number, QPN) -> handle + 1.
    by_src: FlatMap<u32>,
    /// (GID, QPN) -> handle, for senders the device reports unknown.
    by_gid: HashMap<([u8; 16], u16), Ah>,
}

fn src_key(ahn: u16, qpn: u16) -> u64 {
    (u64::from(ahn) << 16) | u64::from(qpn)
}

impl<A: Copy> Book<A> {
    pub(super) fn new() -> Book<A> {
        Book {
            peers: Vec::new(),
            by_addr: HashMap::new(),
            by_src: FlatMap::with_capacity(64),
            by_gid: HashMap::new(),
        }
    }

    /// Adds `addr`, whose GID's address handle `resolve` gives (from the
    /// domain's cache, made on first use); the same address gives the
    /// same handle.
    pub(super) fn insert(
        &mut self,
        addr: &RawAddr,
        resolve: impl FnOnce(&[u8; 16]) -> Result<(A, u16), DeviceError>,
    ) -> Result<Ah, DeviceError> {
        if let Some(&ah) = self.by_addr.get(addr) {
            return Ok(ah);
        }
        let (handle, ahn) = resolve(&addr.gid)?;
        let id = match self.peers.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.peers.push(None);
                self.peers.len() - 1
            }
        };
        let ah = Ah(id as u32);
        self.peers[id] = Some(Peer { addr: *addr, ah: handle, ahn });
        self.by_addr.insert(*addr, ah);
        // A restarted peer (same GID and QPN, new connid) takes the key
        // over: its packets are the new one's.
        self.by_src.insert(src_key(ahn, addr.qpn), ah.0 + 1);
        self.by_gid.insert((addr.gid, addr.qpn), ah);
        Ok(ah)
    }

    pub(super) fn remove(&mut self, ah: Ah) {
        let Some(peer) = self.peers.get_mut(ah.0 as usize).and_then(Option::take) else { return };
        self.by_addr.remove(&peer.addr);
        let key = src_key(peer.ahn, peer.addr.qpn);
        if self.by_src.get(key) == Some(&(ah.0 + 1)) {
            self.by_src.remove(key);
        }
        if self.by_gid.get(&(peer.addr.gid, peer.addr.qpn)) == Some(&ah) {
            self.by_gid.remove(&(peer.addr.gid, peer.addr.qpn));
        }
    }

    #[inline]
    pub(super) fn get(&self, ah: Ah) -> Option<&Peer<A>> {
        self.peers.get(ah.0 as usize)?.as_ref()
    }

    /// The sender of a receive whose completion reports `slid` (the AH
    /// number, or [`UNKNOWN_AHN`]) and `src_qp`.
    #[inline]
    pub(super) fn source(&self, slid: u32, src_qp: u32) -> Source {
        let qpn = src_qp as u16;
        if slid == UNKNOWN_AHN {
            return Source::Unknown { qpn };
        }
        match self.by_src.get(src_key(slid as u16, qpn)) {
            Some(&h) => Source::Known(Ah(h - 1)),
            // A host we have a handle for, but a queue pair not inserted.
            None => Source::Unknown { qpn },
        }
    }

    /// The sender of a receive the device reported unknown, by the GID
    /// the CQ read.
    pub(super) fn source_by_gid(&self, gid: &[u8; 16], src_qp: u32) -> Source {
        let qpn = src_qp as u16;
        match self.by_gid.get(&(*gid, qpn)) {
            Some(&ah) => Source::Known(ah),
            None => Source::Unknown { qpn },
        }
    }
}

/// The domain's address handles, one per GID, shared by every peer on
/// that host and every queue of the domain (as libfabric's `efa_ah`
/// map). They live as long as the domain: a send in flight may still use
/// one whose last peer was removed.
#[derive(Debug)]
pub(super) struct AhCache<A> {
    by_gid: HashMap<[u8; 16], (A, u16)>,
}

impl<A: Copy> AhCache<A> {
    pub(super) fn new() -> AhCache<A> {
        AhCache { by_gid: HashMap::new() }
    }

    /// The handle for `gid`, made by `create` (which also gives its AH
    /// number) the first time.
    pub(super) fn get_or_create(
        &mut self,
        gid: &[u8; 16],
        create: impl FnOnce() -> Result<(A, u16), DeviceError>,
    ) -> Result<(A, u16), DeviceError> {
        if let Some(&h) = self.by_gid.get(gid) {
            return Ok(h);
        }
        let h = create()?;
        self.by_gid.insert(*gid, h);
        Ok(h)
    }

    /// Every handle, to destroy them.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = A> + '_ {
        self.by_gid.drain().map(|(_, (a, _))| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: u8, qpn: u16, connid: u32) -> RawAddr {
        let mut gid = [0u8; 16];
        gid[15] = host;
        RawAddr { gid, qpn, connid }
    }

    #[test]
    fn peers_on_one_host_share_its_address_handle() {
        let mut cache = AhCache::new();
        let mut made = 0;
        let mut book = Book::new();
        let mut resolve = |gid: &[u8; 16]| {
            cache.get_or_create(gid, || {
                made += 1;
                Ok((100 + gid[15] as usize, gid[15] as u16 * 10))
            })
        };
        let a = book.insert(&addr(1, 5, 9), &mut resolve).unwrap();
        let b = book.insert(&addr(1, 6, 9), &mut resolve).unwrap();
        let c = book.insert(&addr(2, 5, 9), &mut resolve).unwrap();
        assert_eq!(book.insert(&addr(1, 5, 9), &mut resolve).unwrap(), a, "same address");
        assert_eq!(made, 2, "one handle per GID");
        assert_eq!(book.get(a).unwrap().ah, book.get(b).unwrap().ah);
        assert_ne!(book.get(a).unwrap().ah, book.get(c).unwrap().ah);
    }

    #[test]
    fn a_sender_is_known_by_ah_number_and_qpn_and_unknown_at_0xffff() {
        let mut book = Book::new();
        let a = book.insert(&addr(1, 5, 9), |_| Ok((0usize, 7))).unwrap();
        assert_eq!(book.source(7, 5), Source::Known(a));
        assert_eq!(book.source(7, 6), Source::Unknown { qpn: 6 }, "host known, QP not");
        assert_eq!(book.source(UNKNOWN_AHN, 5), Source::Unknown { qpn: 5 });
        assert_eq!(book.source_by_gid(&addr(1, 0, 0).gid, 5), Source::Known(a));
        assert_eq!(book.source_by_gid(&addr(3, 0, 0).gid, 5), Source::Unknown { qpn: 5 });
        book.remove(a);
        assert_eq!(book.source(7, 5), Source::Unknown { qpn: 5 }, "removed: unknown again");
        assert!(book.get(a).is_none());
    }

    #[test]
    fn a_restarted_peer_takes_over_its_qpn_and_removing_the_old_one_keeps_it() {
        let mut book = Book::new();
        let old = book.insert(&addr(1, 5, 9), |_| Ok((0usize, 7))).unwrap();
        let new = book.insert(&addr(1, 5, 10), |_| Ok((0usize, 7))).unwrap();
        assert_ne!(old, new);
        assert_eq!(book.source(7, 5), Source::Known(new));
        book.remove(old);
        assert_eq!(book.source(7, 5), Source::Known(new));
        // The freed handle is reused.
        let again = book.insert(&addr(2, 1, 1), |_| Ok((1usize, 8))).unwrap();
        assert_eq!(again, old);
    }

    #[test]
    fn a_failed_handle_leaves_the_book_unchanged() {
        let mut book: Book<usize> = Book::new();
        let err = book.insert(&addr(1, 5, 9), |_| Err(DeviceError::BadAddress));
        assert_eq!(err, Err(DeviceError::BadAddress));
        assert_eq!(book.source(0, 5), Source::Unknown { qpn: 5 });
    }
}
