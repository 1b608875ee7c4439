//! The receive side's common ground, before and around the protocols:
//! resolve a packet's sender (answering its first packet with our
//! HANDSHAKE), hold REQs that arrived ahead of their msg_id's turn and
//! deliver them when it comes, and retry what waited for resources.

use super::dispatch::req_class;
use super::ops::Iovs;
use super::peer::ReorderBuf;
use super::types::{BufId, Ctrl, FAST_PATHS, Held, IovAt, ReqInfo};
use super::{DropReason, Endpoint, PeerId};
use crate::device::{Device, HeldBufs, Source};
use crate::wire::{RawAddr, RmaIov, WireItem};

impl<D: Device> Endpoint<D> {
    /// Counts a parsed packet and resolves its sender; `None` when it is
    /// dropped (buffer released). The first packet from a peer is answered
    /// with our HANDSHAKE (spec 2.1; libfabric answers any packet type).
    #[inline(always)]
    pub(super) fn accept_from(
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
        let meta = &mut self.rx_meta[buf.index()];
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

    /// Keeps `buf` in `peer`'s reorder buffer under `msg_id`, after the
    /// packets of that msg_id already there (arrival order).
    pub(super) fn hold_in_order(&mut self, peer: PeerId, msg_id: u32, buf: BufId) {
        let window = self.cfg.reorder_window;
        let p = self.peers.get_mut(peer).expect("live peer");
        let rb = p.reorder.get_or_insert_with(|| ReorderBuf::new(window));
        let slot = &mut rb.slots[(msg_id % window) as usize];
        self.rx_meta[buf.index()].next = Held::EMPTY;
        match slot.first() {
            None => *slot = Held::at(buf),
            Some(mut last) => {
                while let Some(next) = self.rx_meta[last.index()].next.first() {
                    last = next;
                }
                self.rx_meta[last.index()].next = Held::at(buf);
            }
        }
        rb.held += 1;
    }

    /// Delivers held packets whose turn has come; stops (and stalls the
    /// peer) when a message cannot be taken in yet.
    #[inline]
    pub(super) fn drain_reorder(&mut self, peer: PeerId) {
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
            let rest = self.rx_meta[chain.index()].next;
            self.rx_meta[chain.index()].next = Held::EMPTY;
            let taken = match self.in_progress.get(peer, info.msg_id) {
                Some(rx) if req_class(&info).continues_a_message() => {
                    self.handle_segment(chain, rx, &info);
                    true
                }
                _ => self.deliver_req(chain, peer, &info),
            };
            if !taken {
                // Put the chain back whole and wait for resources.
                self.rx_meta[chain.index()].next = rest;
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
                next = self.rx_meta[buf.index()].next;
                self.rx_meta[buf.index()].next = Held::EMPTY;
                match self.held_info(buf) {
                    Some(info) => match self.in_progress.get(peer, info.msg_id) {
                        Some(rx) if req_class(&info).continues_a_message() => {
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
            chain = self.rx_meta[buf.index()].next;
        }
        n
    }

    /// Frees every buffer of a chain of held packets.
    pub(super) fn release_chain(&mut self, mut chain: Held) {
        while let Some(buf) = chain.first() {
            chain = self.rx_meta[buf.index()].next;
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
        let len = self.rx_meta[buf.index()].len as usize;
        ReqInfo::parse(&self.dev.held(buf)[..len]).ok()
    }

    /// Marks a peer whose next message waits for resources.
    pub(super) fn stall(&mut self, peer: PeerId) {
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
            let peer = self.rx_meta[buf.index()].peer;
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
}
