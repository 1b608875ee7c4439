//! Packet type to handler, in one place: the table of REQ types (what
//! operation and protocol each carries, tagged or not, delivery complete
//! or not), read one way to learn what an arriving REQ is and the other to
//! pick the REQ a send-side operation begins with; and the receive path
//! every packet takes to its protocol's handler:
//!
//! | packet | handler | module |
//! |---|---|---|
//! | any RTM (eager, medium, long-CTS, long-read, runting read; DC_ too) | in msg_id order, `handle_new_msg`; a later segment, `handle_segment`; the long-CTS REQ re-sent after a READ_NACK, `handle_nack_retry` | `msg`, `medium`, `nack` |
//! | WRITE_RTA, DC_WRITE_RTA, FETCH_RTA, COMPARE_RTA | in msg_id order, `handle_rta` | `atomic` |
//! | EAGER_RTW, DC_EAGER_RTW | `handle_eager_rtw` | `write` |
//! | LONGCTS_RTW, DC_LONGCTS_RTW, LONGREAD_RTW | `handle_long_rtw` | `write` |
//! | SHORT_RTR, LONGCTS_RTR | `handle_rtr` | `read` |
//! | CTS | `handle_cts` | `longcts` |
//! | CTSDATA, READRSP | `handle_data` | `longcts` |
//! | ATOMRSP | `handle_atomrsp` | `atomic` |
//! | EOR | `handle_eor` | `longread` |
//! | RECEIPT | `handle_receipt` | `dc` |
//! | READ_NACK | `handle_read_nack` | `nack` |
//! | HANDSHAKE | `handle_handshake` | `handshake` |
//!
//! An eager RTM from a known peer usually never gets here: header
//! prediction (`eager`) lands it first.

use super::ops::{Proto, TxKind};
use super::types::{BufId, FAST_PATHS, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, PeerId};
use crate::device::{CqStatus, Cqe, Device, HeldBufs};
use crate::wire::{
    AtomRspRepr, CtsDataRepr, CtsRepr, EorRepr, Packet, PacketType, ReadNackRepr, ReadRspRepr,
    ReceiptRepr, ReqClass, ReqFlags,
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

/// The REQ types messages and writes begin with, each once: what it
/// carries (protocol, tagged, delivery complete). `msg_proto` reads the
/// table from type to protocol, for what arrives; `req_type` from
/// protocol to type, for what a send-side operation sends first.
macro_rules! req_types {
    (
        messages { $($m:ident => $mp:ident, $mt:literal, $md:literal;)* }
        writes { $($w:ident => $wp:ident, $wd:literal;)* }
    ) => {
        /// What an arriving message is, by its REQ type: protocol, tagged,
        /// delivery complete.
        pub(super) fn msg_proto(ptype: PacketType) -> Option<(Proto, bool, bool)> {
            Some(match ptype {
                $(PacketType::$m => (Proto::$mp, $mt, $md),)*
                _ => return None,
            })
        }

        /// The REQ type of a send-side operation's first packet (an
        /// atomic's RTA is `atomic::build_rta`'s, an emulated read's
        /// response `read`'s).
        pub(super) fn req_type(kind: TxKind, proto: Proto, tagged: bool, dc: bool) -> PacketType {
            // The read protocols end with EOR, delivery complete or not
            // (spec 4.2); writes are not tagged.
            let dc = dc && !matches!(proto, Proto::LongRead | Proto::RuntRead);
            match (kind, proto, tagged, dc) {
                $((TxKind::Msg, Proto::$mp, $mt, $md) => PacketType::$m,)*
                $((TxKind::Write, Proto::$wp, _, $wd) => PacketType::$w,)*
                _ => unreachable!("{kind:?} by {proto:?} begins with no REQ of the table"),
            }
        }
    };
}

req_types! {
    messages {
        EagerMsgRtm => Eager, false, false;
        EagerTagRtm => Eager, true, false;
        DcEagerMsgRtm => Eager, false, true;
        DcEagerTagRtm => Eager, true, true;
        MediumMsgRtm => Medium, false, false;
        MediumTagRtm => Medium, true, false;
        DcMediumMsgRtm => Medium, false, true;
        DcMediumTagRtm => Medium, true, true;
        LongCtsMsgRtm => LongCts, false, false;
        LongCtsTagRtm => LongCts, true, false;
        DcLongCtsMsgRtm => LongCts, false, true;
        DcLongCtsTagRtm => LongCts, true, true;
        LongReadMsgRtm => LongRead, false, false;
        LongReadTagRtm => LongRead, true, false;
        RuntReadMsgRtm => RuntRead, false, false;
        RuntReadTagRtm => RuntRead, true, false;
    }
    writes {
        EagerRtw => Eager, false;
        DcEagerRtw => Eager, true;
        LongCtsRtw => LongCts, false;
        DcLongCtsRtw => LongCts, true;
        LongReadRtw => LongRead, false;
    }
}

impl<D: Device> Endpoint<D> {
    /// A receive buffer completed.
    pub(super) fn handle_recv(&mut self, cqe: &Cqe) {
        let buf = BufId::from_wr_id(cqe.wr_id);
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
                self.rx_meta[buf.index()].payload_off = info.payload_off;
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
            Parsed::Handshake { features, .. } => self.handle_handshake(peer, features),
        }
        self.release_rx(buf);
    }

    #[cold]
    fn drop_malformed(&mut self, buf: BufId, e: crate::wire::WireError) {
        self.counters.drop(DropReason::Malformed);
        self.counters.malformed[e.kind()] += 1;
        self.release_rx(buf);
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
    pub(super) fn deliver_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        match info.class {
            ReqClass::Rta => self.handle_rta(buf, peer, info),
            _ => self.handle_new_msg(buf, peer, info),
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
