//! The address vector: peers, their handshake state, msg_id counters and
//! reorder windows.

use std::collections::HashMap;

use super::types::{Held, PeerId};
use crate::device::Ah;
use crate::wire::RawAddr;

/// A REQ raw address header as current providers send it: size + 36.
pub(crate) const RAW_ADDR_HDR_LEN: u8 = 4 + RawAddr::REQ_HDR_SIZE as u8;

/// In `Peers::by_ah`: the address handle names no peer.
const NO_PEER: u32 = u32::MAX;

/// Packets that arrived ahead of their msg_id's turn, by msg_id modulo the
/// window: each slot is a chain of RX buffers.
#[derive(Debug)]
pub(crate) struct ReorderBuf {
    pub(crate) slots: Box<[Held]>,
    /// Packets held.
    pub(crate) held: u32,
}

impl ReorderBuf {
    pub(crate) fn new(window: u32) -> ReorderBuf {
        ReorderBuf { slots: vec![Held::EMPTY; window as usize].into_boxed_slice(), held: 0 }
    }
}

/// A peer.
///
/// One cache line holds what receiving a packet from it reads (the
/// handshake flags, the expected msg_id, whether a reorder buffer exists,
/// the connid to check) and what sending to it reads: with a thousand
/// peers taking turns, each packet costs one line of peer state, not two.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct Peer {
    /// Our HANDSHAKE is queued or sent.
    pub(crate) handshake_sent: bool,
    /// Theirs arrived: `features` is valid and REQs stop carrying our raw
    /// address (spec 2.2).
    pub(crate) handshake_received: bool,
    /// We asked for theirs (a zero-byte EAGER_RTW) or sent them a REQ.
    pub(crate) req_sent: bool,
    /// Bytes of optional headers our REQs to them carry now: the raw
    /// address header (40) until their HANDSHAKE, then the connid (4) if
    /// they asked for it.
    pub(crate) req_opt_len: u8,
    pub(crate) ah: Ah,
    /// The msg_id we deliver next from them.
    pub(crate) expected_msg_id: u32,
    /// The next msg_id we send them.
    pub(crate) next_msg_id: u32,
    /// Allocated the first time one of their messages arrives early.
    pub(crate) reorder: Option<ReorderBuf>,
    pub(crate) addr: RawAddr,
    /// `extra_info[0]` of their HANDSHAKE.
    pub(crate) features: u64,
    /// Runting-read bytes sent to them and not yet read (provider: the
    /// runt budget is per peer).
    pub(crate) runt_in_flight: u64,
}

const _: () = assert!(
    std::mem::offset_of!(Peer, addr) + std::mem::size_of::<RawAddr>() <= 64,
    "hot fields in one line"
);

impl Peer {
    /// Whether their HANDSHAKE advertised `feature` (an `extra` bit).
    #[inline]
    pub(crate) fn supports(&self, feature: u64) -> bool {
        self.handshake_received && self.features & feature != 0
    }

    /// Whether they asked for the sender's connid in our headers (extra
    /// request 3, spec 4.4).
    #[inline]
    pub(crate) fn wants_connid(&self) -> bool {
        self.handshake_received && self.features & crate::wire::extra::CONNID_HEADER != 0
    }

    /// Their HANDSHAKE arrived.
    pub(crate) fn handshake_arrived(&mut self, features: u64) {
        self.handshake_received = true;
        self.features = features;
        self.req_opt_len = if self.wants_connid() { 4 } else { 0 };
    }
}

/// The address vector.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    list: Vec<Peer>,
    /// Full raw address (with connid) to peer.
    by_addr: HashMap<RawAddr, PeerId>,
    /// Device address handle to the peer it currently names. A restarted
    /// process that reused a QPN shares the handle of its predecessor; the
    /// newest peer inserted for a handle owns it.
    by_ah: Vec<u32>,
}

impl Peers {
    #[inline]
    pub(crate) fn get(&self, id: PeerId) -> Option<&Peer> {
        self.list.get(id.0 as usize)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: PeerId) -> Option<&mut Peer> {
        self.list.get_mut(id.0 as usize)
    }

    #[inline]
    pub(crate) fn by_ah(&self, ah: Ah) -> Option<PeerId> {
        self.by_ah.get(ah.0 as usize).copied().filter(|&p| p != NO_PEER).map(PeerId)
    }

    pub(crate) fn by_addr(&self, addr: &RawAddr) -> Option<PeerId> {
        self.by_addr.get(addr).copied()
    }

    pub(crate) fn insert(&mut self, addr: RawAddr, ah: Ah, first_msg_id: u32) -> PeerId {
        let id = PeerId(self.list.len() as u32);
        self.list.push(Peer {
            addr,
            ah,
            handshake_sent: false,
            handshake_received: false,
            req_sent: false,
            features: 0,
            next_msg_id: first_msg_id,
            expected_msg_id: first_msg_id,
            reorder: None,
            req_opt_len: RAW_ADDR_HDR_LEN,
            runt_in_flight: 0,
        });
        self.by_addr.insert(addr, id);
        let i = ah.0 as usize;
        if self.by_ah.len() <= i {
            self.by_ah.resize(i + 1, NO_PEER);
        }
        self.by_ah[i] = id.0;
        id
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }
}
