//! Packet type to handler, in one place: the `routes!` table below gives
//! each packet type the endpoint takes its class (how the receive path
//! takes it in: in msg_id order, at once, its buffer released after), the
//! protocol module it belongs to (the module map's file, which a test
//! holds the map to) and its handler. Read the other way, the same table
//! gives the REQ type a send-side operation begins with ([`req_type`]).
//!
//! An eager RTM from a known peer usually never gets here: header
//! prediction (`eager`) lands it first.

use super::ops::Proto::{self, Eager, LongCts, LongRead, Medium, RuntRead};
use super::ops::TxKind;
use super::types::{BufId, FAST_PATHS, RemoteId, ReqInfo, RxId, TxId};
use super::{DropReason, Endpoint, PeerId};
use crate::device::{CqStatus, Cqe, Device, HeldBufs};
use crate::wire::{
    AtomRspRepr, CtsDataRepr, CtsRepr, EorRepr, Packet, PacketType, ReadNackRepr, ReadRspRepr,
    ReceiptRepr, ReqFlags,
};

/// How the receive path takes a packet in, before its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Not a type the endpoint takes: counted as unsupported and dropped.
    None,
    /// A message's REQ (RTM): in msg_id order; later segments (medium,
    /// runting read) and a READ_NACK's re-sent REQ join the message begun.
    Message { proto: Proto, tagged: bool, dc: bool },
    /// An atomic's REQ (RTA): in msg_id order.
    Atomic,
    /// A write's REQ (RTW): at once.
    Write { proto: Proto, dc: bool },
    /// A read's REQ (RTR): at once.
    Read,
    /// Any other packet: at once, its buffer released after its handler.
    Ctrl,
}

impl Class {
    /// Whether it waits for its msg_id's turn.
    #[inline]
    pub(super) fn is_ordered(self) -> bool {
        matches!(self, Class::Message { .. } | Class::Atomic)
    }

    /// Whether later packets carry its msg_id too (medium and runting-read
    /// segments), so that a message already begun must be looked up.
    #[inline]
    pub(super) fn continues_a_message(self) -> bool {
        matches!(self, Class::Message { proto: Medium | RuntRead, .. })
    }
}

/// A REQ's handler. False when the packet cannot be taken in yet (no room
/// for its entry or its answer): it waits, in its msg_id's turn or with
/// the stalled packets. Otherwise its buffer is the handler's to hold or
/// release.
type ReqFn<D> = fn(&mut Endpoint<D>, BufId, PeerId, &ReqInfo) -> bool;

/// Any other packet's handler; its buffer is released after it.
type CtrlFn<D> = fn(&mut Endpoint<D>, BufId, PeerId, &Parsed);

/// A packet type's handler, by the headers it takes.
enum Handler<D: Device> {
    None,
    Req(ReqFn<D>),
    Ctrl(CtrlFn<D>),
}

impl<D: Device> Clone for Handler<D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for Handler<D> {}

/// The receive path, one row per packet type taken: `type, module,
/// class, kind handler`, the kind `req` (a [`ReqFn`]), `once` (a REQ's
/// handler that is done with the packet when it returns, which is then
/// released) or `ctrl` (a [`CtrlFn`]). It makes [`ROUTED`] (types,
/// classes and modules: what the rest reads) and `Endpoint::HANDLERS`
/// (the handlers by type id: what the receive path calls).
macro_rules! routes {
    ($($ptype:ident, $module:ident, $class:expr, $kind:ident $handler:expr;)*) => {
        /// Every packet type the endpoint takes: its class, and the module
        /// of the protocol it belongs to.
        pub(super) const ROUTED: &[(PacketType, Class, &str)] =
            &[$((PacketType::$ptype, $class, stringify!($module)),)*];

        impl<D: Device> Endpoint<D> {
            /// The handlers, by type id: an indexed load and a call, for
            /// every type.
            const HANDLERS: [Handler<D>; 256] = {
                let mut t = [Handler::None; 256];
                $(t[PacketType::$ptype.id() as usize] = routes!(@handler $kind $handler);)*
                t
            };
        }
    };
    (@handler req $h:expr) => { Handler::Req($h) };
    (@handler once $h:expr) => {
        Handler::Req(|ep, buf, peer, info| {
            $h(ep, buf, peer, info);
            ep.release_rx(buf);
            true
        })
    };
    (@handler ctrl $h:expr) => { Handler::Ctrl($h) };
}

const fn msg(proto: Proto, tagged: bool, dc: bool) -> Class {
    Class::Message { proto, tagged, dc }
}

const fn write(proto: Proto, dc: bool) -> Class {
    Class::Write { proto, dc }
}

routes! {
    // Messages, tagged or not, delivery complete or not (spec 3.2, 4.1,
    // 4.2, 4.5); every protocol's first packet is matched in msg.rs.
    EagerMsgRtm, eager, msg(Eager, false, false), req Self::handle_new_msg;
    EagerTagRtm, eager, msg(Eager, true, false), req Self::handle_new_msg;
    DcEagerMsgRtm, eager, msg(Eager, false, true), req Self::handle_new_msg;
    DcEagerTagRtm, eager, msg(Eager, true, true), req Self::handle_new_msg;
    MediumMsgRtm, medium, msg(Medium, false, false), req Self::handle_new_msg;
    MediumTagRtm, medium, msg(Medium, true, false), req Self::handle_new_msg;
    DcMediumMsgRtm, medium, msg(Medium, false, true), req Self::handle_new_msg;
    DcMediumTagRtm, medium, msg(Medium, true, true), req Self::handle_new_msg;
    LongCtsMsgRtm, longcts, msg(LongCts, false, false), req Self::handle_new_msg;
    LongCtsTagRtm, longcts, msg(LongCts, true, false), req Self::handle_new_msg;
    DcLongCtsMsgRtm, longcts, msg(LongCts, false, true), req Self::handle_new_msg;
    DcLongCtsTagRtm, longcts, msg(LongCts, true, true), req Self::handle_new_msg;
    LongReadMsgRtm, longread, msg(LongRead, false, false), req Self::handle_new_msg;
    LongReadTagRtm, longread, msg(LongRead, true, false), req Self::handle_new_msg;
    RuntReadMsgRtm, runtread, msg(RuntRead, false, false), req Self::handle_new_msg;
    RuntReadTagRtm, runtread, msg(RuntRead, true, false), req Self::handle_new_msg;
    // Long-CTS data, and its flow control (also an emulated read's).
    Cts, longcts, Class::Ctrl, ctrl |ep, _, peer, p| {
        if let Parsed::Cts(cts) = p {
            ep.handle_cts(peer, cts)
        }
    };
    CtsData, longcts, Class::Ctrl, ctrl |ep, buf, peer, p| {
        if let &Parsed::CtsData { repr: r, payload_off } = p {
            let id = RxId(r.recv_id);
            ep.handle_data(buf, peer, id, r.seg_offset, r.seg_length, payload_off, None)
        }
    };
    // The receiver of a read protocol read it all.
    Eor, longread, Class::Ctrl, ctrl |ep, _, peer, p| {
        if let Parsed::Eor(r) = p {
            ep.handle_eor(peer, TxId(r.send_id))
        }
    };
    // Emulated writes (spec 3.3, 4.1): eager, or a receive entry at the
    // target for the rest.
    EagerRtw, write, write(Eager, false), once Self::handle_eager_rtw;
    DcEagerRtw, write, write(Eager, true), once Self::handle_eager_rtw;
    LongCtsRtw, write, write(LongCts, false), req Self::handle_long_rtw;
    DcLongCtsRtw, write, write(LongCts, true), req Self::handle_long_rtw;
    LongReadRtw, write, write(LongRead, false), req Self::handle_long_rtw;
    // Emulated reads (spec 3.3): the responder's answer is long-CTS's.
    ShortRtr, read, Class::Read, once Self::handle_rtr;
    LongCtsRtr, read, Class::Read, once Self::handle_rtr;
    ReadRsp, read, Class::Ctrl, ctrl |ep, buf, peer, p| {
        if let &Parsed::ReadRsp { repr: r, payload_off } = p {
            let (id, send_id) = (RxId(r.recv_id), Some(RemoteId(r.send_id)));
            ep.handle_data(buf, peer, id, 0, r.recv_length, payload_off, send_id)
        }
    };
    // Emulated atomics (spec 3.3).
    WriteRta, atomic, Class::Atomic, req Self::handle_rta;
    DcWriteRta, atomic, Class::Atomic, req Self::handle_rta;
    FetchRta, atomic, Class::Atomic, req Self::handle_rta;
    CompareRta, atomic, Class::Atomic, req Self::handle_rta;
    AtomRsp, atomic, Class::Ctrl, ctrl |ep, buf, peer, p| {
        if let Parsed::AtomRsp { repr, payload_off } = p {
            ep.handle_atomrsp(buf, peer, repr, *payload_off)
        }
    };
    // Delivery complete (spec 4.2).
    Receipt, dc, Class::Ctrl, ctrl |ep, _, peer, p| {
        if let Parsed::Receipt(r) = p {
            ep.handle_receipt(peer, TxId(r.send_id))
        }
    };
    // The receiver cannot read: long-CTS instead (spec 4.7).
    ReadNack, nack, Class::Ctrl, ctrl |ep, _, peer, p| {
        if let Parsed::ReadNack(r) = p {
            ep.handle_read_nack(peer, TxId(r.send_id))
        }
    };
    // What the peer supports (spec 2.1).
    Handshake, handshake, Class::Ctrl, ctrl |ep, _, peer, p| {
        if let &Parsed::Handshake { features, .. } = p {
            ep.handle_handshake(peer, features)
        }
    };
}

/// Classes by type id.
const CLASSES: [Class; 256] = {
    let mut t = [Class::None; 256];
    let mut i = 0;
    while i < ROUTED.len() {
        t[ROUTED[i].0.id() as usize] = ROUTED[i].1;
        i += 1;
    }
    t
};

/// A REQ's class.
#[inline(always)]
pub(super) fn req_class(info: &ReqInfo) -> Class {
    CLASSES[info.type_id as usize]
}

/// What an arriving message is, by its REQ type: protocol, tagged,
/// delivery complete.
#[inline]
pub(super) fn msg_proto(info: &ReqInfo) -> Option<(Proto, bool, bool)> {
    match req_class(info) {
        Class::Message { proto, tagged, dc } => Some((proto, tagged, dc)),
        _ => None,
    }
}

/// Where `req_type` looks a REQ up: a write or a message, by protocol,
/// tagged, delivery complete.
const fn req_index(write: bool, proto: Proto, tagged: bool, dc: bool) -> usize {
    (write as usize) * 20 + (proto as usize) * 4 + (tagged as usize) * 2 + dc as usize
}

/// The routes' REQ types read the other way (writes are not tagged: both
/// slots hold the type).
const REQ_TYPES: [Option<PacketType>; 40] = {
    let mut t = [None; 40];
    let mut i = 0;
    while i < ROUTED.len() {
        let (ptype, class, _) = ROUTED[i];
        match class {
            Class::Message { proto, tagged, dc } => {
                t[req_index(false, proto, tagged, dc)] = Some(ptype)
            }
            Class::Write { proto, dc } => {
                t[req_index(true, proto, false, dc)] = Some(ptype);
                t[req_index(true, proto, true, dc)] = Some(ptype);
            }
            _ => {}
        }
        i += 1;
    }
    t
};

/// The REQ type of a send-side operation's first packet (an atomic's RTA
/// is `atomic::build_rta`'s, an emulated read's response `read`'s).
pub(super) fn req_type(kind: TxKind, proto: Proto, tagged: bool, dc: bool) -> PacketType {
    // The read protocols end with EOR, delivery complete or not (spec 4.2).
    let dc = dc && !matches!(proto, LongRead | RuntRead);
    let write = match kind {
        TxKind::Msg => false,
        TxKind::Write => true,
        _ => unreachable!("{kind:?} begins with no REQ of the table"),
    };
    match REQ_TYPES[req_index(write, proto, tagged, dc)] {
        Some(ptype) => ptype,
        None => unreachable!("{kind:?} by {proto:?} begins with no REQ of the table"),
    }
}

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
        // It parsed: it has a type byte.
        let ptype = bytes[0];
        let Some(peer) = self.accept_from(buf, len, cqe.src, parsed.connid(), None) else {
            return;
        };
        match Self::HANDLERS[ptype as usize] {
            Handler::Ctrl(handle) => handle(self, buf, peer, &parsed),
            _ => self.counters.drop(DropReason::Unsupported),
        }
        self.release_rx(buf);
    }

    #[cold]
    fn drop_malformed(&mut self, buf: BufId, e: crate::wire::WireError) {
        self.counters.drop(DropReason::Malformed);
        self.counters.malformed[e.kind()] += 1;
        self.release_rx(buf);
    }

    /// A REQ: in msg_id order if its class has one, else at once.
    pub(super) fn handle_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) {
        let class = req_class(info);
        if !class.is_ordered() {
            if !self.deliver_req(buf, peer, info) {
                self.stalled_bufs.push_back(buf);
            }
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
        if class.continues_a_message()
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

    /// Takes in a REQ that may go now (its turn has come, or it has no
    /// turn to wait for) by its handler. Returns false, leaving the packet
    /// to the caller, when it cannot be taken in yet.
    #[inline(always)]
    pub(super) fn deliver_req(&mut self, buf: BufId, peer: PeerId, info: &ReqInfo) -> bool {
        match Self::HANDLERS[info.type_id as usize] {
            Handler::Req(handle) => handle(self, buf, peer, info),
            _ => {
                self.counters.drop(DropReason::Unsupported);
                self.release_rx(buf);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimDevice;
    use crate::wire::{ReqClass, ReqLayout};

    #[test]
    fn every_packet_type_has_one_route_and_a_req_the_class_its_codec_says() {
        for &ptype in PacketType::ALL {
            let routes = ROUTED.iter().filter(|r| r.0 == ptype).count();
            assert_eq!(routes, 1, "{ptype}: {routes} routes");
            let class = CLASSES[ptype.id() as usize];
            let wire = ReqLayout::of(ptype).map(|l| l.class);
            let agrees = matches!(
                (class, wire),
                (Class::Message { .. }, Some(ReqClass::Rtm))
                    | (Class::Atomic, Some(ReqClass::Rta))
                    | (Class::Write { .. }, Some(ReqClass::Rtw))
                    | (Class::Read, Some(ReqClass::Rtr))
                    | (Class::Ctrl, None)
            );
            assert!(agrees, "{ptype}: class {class:?}, codec {wire:?}");
            let handler = Endpoint::<SimDevice>::HANDLERS[ptype.id() as usize];
            let kind_agrees = match handler {
                Handler::Req(_) => class != Class::Ctrl,
                Handler::Ctrl(_) => class == Class::Ctrl,
                Handler::None => false,
            };
            assert!(kind_agrees, "{ptype}: its handler is not of its class");
        }
    }

    #[test]
    fn req_type_reads_the_message_and_write_rows_back() {
        for &(ptype, class, _) in ROUTED {
            match class {
                Class::Message { proto, tagged, dc } => {
                    assert_eq!(req_type(TxKind::Msg, proto, tagged, dc), ptype);
                }
                Class::Write { proto, dc } => {
                    assert_eq!(req_type(TxKind::Write, proto, false, dc), ptype);
                    assert_eq!(req_type(TxKind::Write, proto, true, dc), ptype);
                }
                _ => {}
            }
        }
        // The read protocols end with EOR, delivery complete or not.
        assert_eq!(req_type(TxKind::Msg, LongRead, true, true), PacketType::LongReadTagRtm);
        assert_eq!(req_type(TxKind::Write, LongRead, false, true), PacketType::LongReadRtw);
    }

    /// The module map (mod.rs) names each packet type in the row of the
    /// protocol module its route gives, and in no other row.
    #[test]
    fn the_module_map_agrees_with_the_routes() {
        let doc = include_str!("mod.rs");
        let map = doc.split("# Map").nth(1).expect("the module doc has a map");
        let rows: Vec<(&str, Vec<PacketType>)> = map
            .lines()
            .filter_map(|l| l.strip_prefix("//! | "))
            .filter_map(|row| {
                let cols: Vec<&str> = row.split(" | ").collect();
                let file = cols.get(1)?.split_whitespace().next()?.strip_suffix(".rs")?;
                let named = cols
                    .get(2)?
                    // Words whole: long-CTS is a protocol, not a packet.
                    .split(|c: char| !(c.is_ascii_alphanumeric() || "_-'".contains(c)))
                    .filter_map(PacketType::from_name)
                    .collect();
                Some((file, named))
            })
            .collect();
        assert!(rows.len() >= 10, "the map's rows: {rows:?}");
        for &(ptype, _, module) in ROUTED {
            let files: Vec<&str> =
                rows.iter().filter(|(_, named)| named.contains(&ptype)).map(|r| r.0).collect();
            assert_eq!(
                files,
                [module],
                "{ptype}: routed to {module}.rs, in the map's rows {files:?}"
            );
        }
    }
}
