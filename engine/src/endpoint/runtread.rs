//! Runting read (spec 4.5; RUNTREAD_MSGRTM, RUNTREAD_TAGRTM): the first
//! bytes of a long message go in REQ segments, as medium ones (`medium`),
//! the rest is read by the receiver as long-read (`longread`), which
//! answers EOR. What is its own is the runt budget: the runt bytes sent
//! to a peer and not yet read are bounded by `Config::runt_size` (as the
//! provider bounds them per peer); a message that finds it spent goes by
//! long-read. A message's head sent as its runt
//! ([`Endpoint::sendv_head`]) is outside the budget.

use super::{Endpoint, PeerId};
use crate::device::Device;
use crate::wire::extra;

impl<D: Device> Endpoint<D> {
    /// Whether a message to `peer` that may be read goes by runting read:
    /// the peer takes it and some runt budget is left.
    #[inline]
    pub(super) fn runt_allowed(&self, peer: PeerId) -> bool {
        let in_flight = self.peers.get(peer).expect("live peer").runt_in_flight;
        self.takes_runts(peer) && self.cfg.runt_size > in_flight
    }

    /// Whether `peer` said it takes runting reads (its HANDSHAKE).
    #[inline]
    pub(super) fn takes_runts(&self, peer: PeerId) -> bool {
        self.peers.get(peer).expect("live peer").supports(extra::RUNTING_READ)
    }

    /// Takes the runt of a `len`-byte message to `peer` out of its budget;
    /// returns the runt's length.
    pub(super) fn take_runt(&mut self, peer: PeerId, len: u64) -> u64 {
        let p = self.peers.get_mut(peer).expect("checked peer");
        let runt = self.cfg.runt_size.saturating_sub(p.runt_in_flight).min(len);
        p.runt_in_flight += runt;
        runt
    }

    /// Gives `runt` bytes back to `peer`'s budget: its message was read,
    /// failed, or goes on by long-CTS after a READ_NACK.
    pub(super) fn give_runt_back(&mut self, peer: PeerId, runt: u64) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.runt_in_flight = p.runt_in_flight.saturating_sub(runt);
        }
    }
}
