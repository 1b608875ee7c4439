//! The receive side: parse, resolve the sender, answer with a HANDSHAKE,
//! put messages in msg_id order, dispatch.

use super::ops::Iovs;
use super::peer::ReorderBuf;
use super::types::{BufId, Ctrl, FAST_PATHS, Held, IovAt, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, Error, PeerId};
use crate::device::{CqStatus, Cqe, Device, HeldBufs, Source};
use crate::wire::{
    AtomRspRepr, CtsDataRepr, CtsRepr, EagerRtm, EorRepr, Packet, PacketType, RawAddr,
    ReadNackRepr, ReadRspRepr, ReceiptRepr, ReqClass, ReqFlags, RmaIov, WireItem,
};

/// A received packet's headers, owned. A stack temporary of one packet's
/// handling: its size costs a copy, a box would cost an allocation.
#[derive(Debug, Clone, Copy)]
enum Parsed {
    Cts(CtsRepr),
    CtsData { repr: CtsDataRepr, payload_off: u32 },
    ReadRsp { repr: ReadRspRepr, payload_off: u32 },
    AtomRsp { repr: AtomRspRepr, payload_off: u32 },
    Eor(EorRepr),
    Receipt(ReceiptRepr),
    ReadNack(ReadNackRepr),
    Handshake { features: u64, connid: Option<u32> },
}

impl Parsed {
    fn connid(&self) -> Option<u32> {
        match self {
            Parsed::Cts(c) => c.connid,
            Parsed::CtsData { repr, .. } => repr.connid,
            Parsed::ReadRsp { repr, .. } => repr.connid,
            Parsed::AtomRsp { repr, .. } => repr.connid,
            Parsed::Eor(r) => r.connid,
            Parsed::Receipt(r) => r.connid,
            Parsed::ReadNack(r) => r.connid,
            Parsed::Handshake { connid, .. } => *connid,
        }
    }
}

/// Parses a packet other than a REQ.
fn parse(bytes: &[u8]) -> Result<Parsed, crate::wire::WireError> {
    let off = |payload: &[u8]| (bytes.len() - payload.len()) as u32;
    Ok(match Packet::parse(bytes)? {
        Packet::Cts(c) => Parsed::Cts(c),
        Packet::CtsData(repr, p) => Parsed::CtsData { repr, payload_off: off(p) },
        Packet::ReadRsp(repr, p) => Parsed::ReadRsp { repr, payload_off: off(p) },
        Packet::AtomRsp(repr, p) => Parsed::AtomRsp { repr, payload_off: off(p) },
        Packet::Eor(r) => Parsed::Eor(r),
        Packet::Receipt(r) => Parsed::Receipt(r),
        Packet::ReadNack(r) => Parsed::ReadNack(r),
        Packet::Handshake(h) => Parsed::Handshake { features: h.features(), connid: h.connid },
        // REQs took the branch above.
        Packet::Req(..) => {
            return Err(crate::wire::WireError::NotReq { ptype: PacketType::from(bytes[0]) });
        }
    })
}

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

    /// A receive buffer completed.
    pub(super) fn handle_recv(&mut self, cqe: &Cqe) {
        let buf = cqe.wr_id as BufId;
        self.rx_posted -= 1;
        if cqe.status != CqStatus::Ok {
            self.counters.drop(DropReason::DeviceError);
            self.release_rx(buf);
            return;
        }
        let len = (cqe.len as usize).min(self.caps.mtu);
        if FAST_PATHS && self.recv_predicted(buf, len, cqe.src) {
            return;
        }
        let bytes = &self.dev.held(buf)[..len];
        // REQs, the common case, skip the enum of the other types.
        if bytes.first().is_some_and(|&t| PacketType::is_req_id(t)) {
            let info = match ReqInfo::parse(bytes) {
                Ok(info) => info,
                Err(e) => return self.drop_malformed(buf, e),
            };
            let Some(peer) = self.accept_from(buf, len, cqe.src, info.connid, info.raw_addr_at)
            else {
                return;
            };
            if info.too_many_iovs {
                self.counters.drop(DropReason::Unsupported);
                self.release_rx(buf);
            } else {
                self.rx_meta[buf as usize].payload_off = info.payload_off;
                self.handle_req(buf, peer, &info);
            }
            return;
        }
        let parsed = match parse(bytes) {
            Ok(p) => p,
            Err(e) => return self.drop_malformed(buf, e),
        };
        let Some(peer) = self.accept_from(buf, len, cqe.src, parsed.connid(), None) else {
            return;
        };
        match parsed {
            Parsed::Cts(cts) => self.handle_cts(peer, &cts),
            Parsed::CtsData { repr, payload_off } => self.handle_data(
                buf,
                peer,
                RxId(repr.recv_id),
                repr.seg_offset,
                repr.seg_length,
                payload_off,
                None,
            ),
            Parsed::ReadRsp { repr, payload_off } => self.handle_data(
                buf,
                peer,
                RxId(repr.recv_id),
                0,
                repr.recv_length,
                payload_off,
                Some(RemoteId(repr.send_id)),
            ),
            Parsed::AtomRsp { repr, payload_off } => {
                self.handle_atomrsp(buf, peer, &repr, payload_off)
            }
            Parsed::Eor(eor) => self.handle_eor(peer, TxId(eor.send_id)),
            Parsed::Receipt(r) => self.handle_receipt(peer, TxId(r.send_id)),
            Parsed::ReadNack(n) => self.handle_read_nack(peer, TxId(n.send_id)),
            Parsed::Handshake { features, .. } => {
                self.peers.get_mut(peer).expect("resolved peer").handshake_arrived(features);
                self.counters.handshakes_received += 1;
            }
        }
        self.release_rx(buf);
    }

    #[cold]
    fn drop_malformed(&mut self, buf: BufId, e: crate::wire::WireError) {
        self.counters.drop(DropReason::Malformed);
        self.counters.malformed[e.kind()] += 1;
        self.release_rx(buf);
    }

    /// Counts a parsed packet and resolves its sender; `None` when it is
    /// dropped (buffer released). The first packet from a peer is answered
    /// with our HANDSHAKE (spec 2.1; libfabric answers any packet type).
    #[inline(always)]
    fn accept_from(
        &mut self,
        buf: BufId,
        len: usize,
        src: Source,
        connid: Option<u32>,
        raw_at: Option<u32>,
    ) -> Option<PeerId> {
        let ptype = self.dev.held(buf)[0];
        self.counters.rx_by_type[ptype as usize] += 1;
        let peer = match self.resolve_sender(buf, src, connid, raw_at) {
            Ok(p) => p,
            Err(reason) => {
                self.counters.drop(reason);
                self.release_rx(buf);
                return None;
            }
        };
        let p = self.peers.get_mut(peer).expect("resolved peer");
        if !p.handshake_sent {
            p.handshake_sent = true;
            self.queue_ctrl(Ctrl::Handshake { peer });
        }
        let meta = &mut self.rx_meta[buf as usize];
        meta.len = len as u32;
        meta.peer = peer;
        Some(peer)
    }

    /// Who sent a packet: the address book's peer for a known sender, the
    /// REQ's raw address for an unknown one (spec 2.2). A connid that is
    /// not the peer's is a restarted process that reused the QPN: with a
    /// raw address it is a new peer, without one the packet is dropped.
    fn resolve_sender(
        &mut self,
        buf: BufId,
        src: Source,
        connid: Option<u32>,
        raw_at: Option<u32>,
    ) -> Result<PeerId, DropReason> {
        let known = match src {
            Source::Known(ah) => self.peers.by_ah(ah),
            Source::Unknown { .. } | Source::None => None,
        };
        if let Some(peer) = known {
            let p = self.peers.get(peer).expect("live peer");
            match connid {
                Some(c) if c != p.addr.connid => {}
                _ => return Ok(peer),
            }
            if raw_at.is_none() {
                return Err(DropReason::ConnidMismatch);
            }
        }
        // The codec checked the address is there and at least 24 bytes.
        let addr = raw_at
            .and_then(|at| RawAddr::from_bytes(&self.dev.held(buf)[at as usize..]).ok())
            .ok_or(DropReason::UnknownSender)?;
        if let Source::Unknown { qpn } = src
            && qpn != addr.qpn
        {
            // The header names a queue pair other than the sender's.
            return Err(DropReason::Invalid);
        }
        self.peer_for_addr(&addr).map_err(|_| DropReason::UnknownSender)
    }

    /// A REQ: in msg_id order if its type carries one, else at once.
    pub(super) fn handle_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        if !info.has_msg_id() {
            self.handle_unordered_req(buf, peer, info);
            return;
        }
        // The long-CTS REQ re-sent after a READ_NACK continues a message
        // whose msg_id took its turn already (libfabric:
        // efa_rdm_pke_proc_rtm_rta skips reordering for it).
        if info.flags.contains(ReqFlags::READ_NACK) {
            match self.in_progress.get(peer, info.msg_id) {
                Some(rx) => self.handle_nack_retry(buf, rx, info),
                None => {
                    self.counters.drop(DropReason::StaleId);
                    self.release_rx(buf);
                }
            }
            return;
        }
        // Later packets of a message already begun (medium segments).
        if info.continues_a_message()
            && let Some(rx) = self.in_progress.get(peer, info.msg_id)
        {
            self.handle_segment(buf, rx, info);
            return;
        }
        if !self.cfg.ordered {
            if !self.deliver_req(buf, peer, info) {
                self.stalled_bufs.push_back(buf);
            }
            return;
        }
        let window = self.cfg.reorder_window;
        let p = self.peers.get(peer).expect("live peer");
        let ahead = info.msg_id.wrapping_sub(p.expected_msg_id);
        if ahead == 0
            && p.reorder
                .as_ref()
                .is_none_or(|r| r.slots[(info.msg_id % window) as usize].is_empty())
        {
            if self.deliver_req(buf, peer, info) {
                let p = self.peers.get_mut(peer).expect("live peer");
                p.expected_msg_id = p.expected_msg_id.wrapping_add(1);
                self.drain_reorder(peer);
            } else {
                self.hold_in_order(peer, info.msg_id, buf);
                self.stall(peer);
            }
        } else if ahead < window {
            // Ahead of its turn (or its turn is stalled): held until then.
            self.hold_in_order(peer, info.msg_id, buf);
            self.counters.reordered += 1;
        } else {
            // Already delivered (a duplicate) or too far ahead.
            self.counters.drop(DropReason::MsgIdOutOfWindow);
            self.release_rx(buf);
        }
    }

    /// Takes in a REQ with a msg_id (a message or an atomic) that may go
    /// now: its turn has come, or the endpoint does not order messages.
    /// Returns false, leaving the packet to the caller, when it cannot be
    /// taken in yet.
    #[inline(always)]
    fn deliver_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        match info.class {
            ReqClass::Rta => self.handle_rta(buf, peer, info),
            _ => self.handle_new_msg(buf, peer, info),
        }
    }

    /// Keeps `buf` in `peer`'s reorder buffer under `msg_id`, after the
    /// packets of that msg_id already there (arrival order).
    pub(super) fn hold_in_order(&mut self, peer: PeerId, msg_id: u32, buf: BufId) {
        let window = self.cfg.reorder_window;
        let p = self.peers.get_mut(peer).expect("live peer");
        let rb = p.reorder.get_or_insert_with(|| ReorderBuf::new(window));
        let slot = &mut rb.slots[(msg_id % window) as usize];
        self.rx_meta[buf as usize].next = Held::EMPTY;
        match slot.first() {
            None => *slot = Held::at(buf),
            Some(mut last) => {
                while let Some(next) = self.rx_meta[last as usize].next.first() {
                    last = next;
                }
                self.rx_meta[last as usize].next = Held::at(buf);
            }
        }
        rb.held += 1;
    }

    /// Delivers held packets whose turn has come; stops (and stalls the
    /// peer) when a message cannot be taken in yet.
    #[inline]
    fn drain_reorder(&mut self, peer: PeerId) {
        if self.peers.get(peer).is_some_and(|p| p.reorder.as_ref().is_some_and(|r| r.held > 0)) {
            self.drain_reorder_held(peer);
        }
    }

    fn drain_reorder_held(&mut self, peer: PeerId) {
        let window = self.cfg.reorder_window;
        loop {
            let p = self.peers.get_mut(peer).expect("live peer");
            let expected = p.expected_msg_id;
            let Some(rb) = p.reorder.as_mut() else { return };
            let slot = (expected % window) as usize;
            let head = rb.slots[slot];
            let Some(head) = head.first().filter(|_| rb.held > 0) else { return };
            if FAST_PATHS && self.drain_predicted(peer, slot, head) {
                continue;
            }
            // The first packet of the message decides whether it can go.
            let Some(info) = self.held_info(head) else {
                // Cannot happen for a packet accepted once; drop the chain.
                let chain = self.take_slot(peer, slot);
                self.release_chain(chain);
                continue;
            };
            let chain = self.take_slot(peer, slot).first().expect("a packet");
            let rest = self.rx_meta[chain as usize].next;
            self.rx_meta[chain as usize].next = Held::EMPTY;
            let taken = match self.in_progress.get(peer, info.msg_id) {
                Some(rx) if info.continues_a_message() => {
                    self.handle_segment(chain, rx, &info);
                    true
                }
                _ => self.deliver_req(chain, peer, &info),
            };
            if !taken {
                // Put the chain back whole and wait for resources.
                self.rx_meta[chain as usize].next = rest;
                let held = 1 + self.chain_len(rest);
                let p = self.peers.get_mut(peer).expect("live peer");
                let rb = p.reorder.as_mut().expect("reorder buffer");
                rb.slots[slot] = Held::at(chain);
                rb.held += held;
                self.stall(peer);
                return;
            }
            let p = self.peers.get_mut(peer).expect("live peer");
            p.expected_msg_id = p.expected_msg_id.wrapping_add(1);
            let mut next = rest;
            while let Some(buf) = next.first() {
                next = self.rx_meta[buf as usize].next;
                self.rx_meta[buf as usize].next = Held::EMPTY;
                match self.held_info(buf) {
                    Some(info) => match self.in_progress.get(peer, info.msg_id) {
                        Some(rx) if info.continues_a_message() => {
                            self.handle_segment(buf, rx, &info)
                        }
                        _ => {
                            // The message completed: a duplicate.
                            self.counters.drop(DropReason::MsgIdOutOfWindow);
                            self.release_rx(buf);
                        }
                    },
                    None => self.release_rx(buf),
                }
            }
        }
    }

    /// The held packet whose turn came, landed without its full parse
    /// when it is an eager message alone in its slot that a posted receive
    /// takes (see `recv_predicted`); false, with nothing changed,
    /// otherwise.
    #[inline]
    fn drain_predicted(&mut self, peer: PeerId, slot: usize, head: BufId) -> bool {
        let meta = self.rx_meta[head as usize];
        if !meta.next.is_empty() {
            return false;
        }
        let len = meta.len as usize;
        let Some(e) = EagerRtm::predict(&self.dev.held(head)[..len]) else { return false };
        if !self.land_eager(head, len, peer, &e) {
            return false;
        }
        let p = self.peers.get_mut(peer).expect("live peer");
        p.expected_msg_id = p.expected_msg_id.wrapping_add(1);
        let rb = p.reorder.as_mut().expect("reorder buffer");
        rb.slots[slot] = Held::EMPTY;
        rb.held -= 1;
        true
    }

    /// Empties a reorder slot, returning its chain.
    fn take_slot(&mut self, peer: PeerId, slot: usize) -> Held {
        let head = {
            let p = self.peers.get_mut(peer).expect("live peer");
            let rb = p.reorder.as_mut().expect("reorder buffer");
            std::mem::replace(&mut rb.slots[slot], Held::EMPTY)
        };
        let n = self.chain_len(head);
        let rb = self.peers.get_mut(peer).and_then(|p| p.reorder.as_mut()).expect("reorder buffer");
        rb.held -= n;
        head
    }

    fn chain_len(&self, mut chain: Held) -> u32 {
        let mut n = 0;
        while let Some(buf) = chain.first() {
            n += 1;
            chain = self.rx_meta[buf as usize].next;
        }
        n
    }

    /// Frees every buffer of a chain of held packets.
    pub(super) fn release_chain(&mut self, mut chain: Held) {
        while let Some(buf) = chain.first() {
            chain = self.rx_meta[buf as usize].next;
            self.release_rx(buf);
        }
    }

    /// The headers of a held packet (it was valid when it arrived).
    /// The iovs `at` names in REQ packet `buf`, which its parse checked.
    pub(super) fn req_iovs(&self, buf: BufId, at: IovAt) -> Iovs {
        let from = at.at as usize;
        let bytes = &self.dev.held(buf)[from..from + at.n as usize * RmaIov::LEN];
        Iovs::from_list(crate::wire::IovList::Wire(bytes))
    }

    pub(super) fn held_info(&self, buf: BufId) -> Option<ReqInfo> {
        let len = self.rx_meta[buf as usize].len as usize;
        ReqInfo::parse(&self.dev.held(buf)[..len]).ok()
    }

    /// Marks a peer whose next message waits for resources.
    fn stall(&mut self, peer: PeerId) {
        if !self.stalled_peers.contains(&peer) {
            self.stalled_peers.push_back(peer);
        }
    }

    /// Retries messages that waited for resources.
    #[inline]
    pub(super) fn retry_stalled(&mut self) {
        if self.stalled_peers.is_empty() && self.stalled_bufs.is_empty() {
            return;
        }
        self.retry_stalled_slow();
    }

    #[cold]
    fn retry_stalled_slow(&mut self) {
        for _ in 0..self.stalled_peers.len() {
            let Some(peer) = self.stalled_peers.pop_front() else { return };
            self.drain_reorder(peer);
        }
        for _ in 0..self.stalled_bufs.len() {
            let Some(buf) = self.stalled_bufs.pop_front() else { return };
            let peer = self.rx_meta[buf as usize].peer;
            match self.held_info(buf) {
                Some(info) => {
                    if !self.deliver_req(buf, peer, &info) {
                        self.stalled_bufs.push_back(buf);
                        return;
                    }
                }
                None => self.release_rx(buf),
            }
        }
    }

    /// REQs without a msg_id: the emulated write and read protocols.
    fn handle_unordered_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        match info.ptype {
            PacketType::ShortRtr | PacketType::LongCtsRtr => self.handle_rtr(buf, peer, info),
            PacketType::EagerRtw | PacketType::DcEagerRtw => self.handle_eager_rtw(buf, peer, info),
            // Flagged READ_NACK, a long-CTS write is the retry of a
            // long-read one we could not read, new to us and without data
            // (interop notes); a long-read write cannot be a retry.
            PacketType::LongCtsRtw | PacketType::DcLongCtsRtw
                if !info.flags.contains(ReqFlags::READ_NACK) || info.payload_len == 0 =>
            {
                self.handle_long_rtw(buf, peer, info);
                return;
            }
            PacketType::LongReadRtw if !info.flags.contains(ReqFlags::READ_NACK) => {
                self.handle_long_rtw(buf, peer, info);
                return;
            }
            _ => self.counters.drop(DropReason::Unsupported),
        }
        self.release_rx(buf);
    }
}
