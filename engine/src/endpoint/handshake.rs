//! The handshake subprotocol (spec 2): peers by raw address (spec 2.2),
//! our HANDSHAKE answering a peer's first packet (spec 2.1), the
//! zero-byte EAGER_RTW that asks a peer for its own, and what its
//! HANDSHAKE advertises.

use super::types::{BufId, Ctrl};
use super::{Endpoint, Error, PeerId};
use crate::device::{Device, HeldBufs};
use crate::wire::{HandshakeFlags, HandshakeRepr, PacketType, RawAddr, ReqRepr, WireList, extra};

impl<D: Device> Endpoint<D> {
    /// The peer for `addr`, inserting it in the device's address book and
    /// the address vector if new.
    pub(super) fn peer_for_addr(&mut self, addr: &RawAddr) -> Result<PeerId, Error> {
        if let Some(id) = self.peers.by_addr(addr) {
            return Ok(id);
        }
        let ah = self.dev.insert_addr(addr)?;
        Ok(self.peers.insert(*addr, ah, self.cfg.first_msg_id))
    }

    /// Sends the zero-byte write that makes a peer answer with its
    /// HANDSHAKE, unless one is known or a REQ already went out.
    pub(super) fn request_handshake(&mut self, peer: PeerId) {
        let p = self.peers.get_mut(peer).expect("live peer");
        if p.handshake_received || p.req_sent {
            return;
        }
        p.req_sent = true;
        self.queue_ctrl(Ctrl::HandshakeTrigger { peer });
    }

    /// The extra features and requests this endpoint advertises: only what
    /// it implements end to end.
    pub(super) fn features(&self) -> u64 {
        let mut f = extra::CONNID_HEADER | extra::DELIVERY_COMPLETE | extra::READ_NACK;
        if self.caps.rdma_read {
            f |= extra::RDMA_READ | extra::RUNTING_READ;
        }
        if self.caps.rdma_write {
            f |= extra::RDMA_WRITE;
        }
        f
    }

    /// Our HANDSHAKE into `buf`: the features we implement end to end.
    pub(super) fn emit_handshake(
        &mut self,
        buf: BufId,
        peer: PeerId,
    ) -> (PeerId, PacketType, usize) {
        let words = [self.features()];
        // Providers always send device_version; some receivers
        // read it without checking its flag (interop notes).
        let repr = HandshakeRepr {
            flags: HandshakeFlags::empty(),
            extra_info: WireList::Host(&words),
            connid: Some(self.addr.connid),
            host_id: (self.cfg.host_id != 0).then_some(self.cfg.host_id),
            device_version: Some(self.caps.device_version),
            user_recv_qp: None,
        };
        self.counters.handshakes_sent += 1;
        (peer, PacketType::Handshake, repr.emit(self.dev.held_mut(buf)))
    }

    /// The zero-byte EAGER_RTW into `buf` that makes `peer` answer with
    /// its HANDSHAKE.
    pub(super) fn emit_handshake_trigger(
        &mut self,
        buf: BufId,
        peer: PeerId,
    ) -> (PeerId, PacketType, usize) {
        let mut r = ReqRepr::new(PacketType::EagerRtw);
        let (raw, connid) = self.req_opt_headers(peer);
        if raw {
            r.raw_addr = Some(&self.addr_hdr);
        }
        r.connid = connid;
        (peer, PacketType::EagerRtw, r.emit(self.dev.held_mut(buf)))
    }

    /// The peer's HANDSHAKE: what it supports is known from now on.
    pub(super) fn handle_handshake(&mut self, peer: PeerId, features: u64) {
        self.peers.get_mut(peer).expect("resolved peer").handshake_arrived(features);
        self.counters.handshakes_received += 1;
    }
}
