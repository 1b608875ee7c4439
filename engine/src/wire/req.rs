//! REQ packets (spec 3.1): the first packet of every subprotocol.
//!
//! A REQ packet is, in this order (interop notes, "REQ packet order"):
//! the type's fixed header, `rma_iov[]` (RTW/RTR/RTA), the optional headers
//! in flag-bit order (raw address, CQ data, connid), `read_iov[]`
//! (LONGREAD/RUNTREAD), then application data.
//!
//! The 26 REQ types share one codec driven by a per-type [`ReqLayout`]: the
//! offset of each field the type has. Offsets are those of the provider's
//! structs (interop notes' table), which differ from the spec text for
//! MEDIUM (offset 8 is the whole message length) and RUNTREAD (repeated
//! `runt_length` is the total runt).

use bitflags::bitflags;

use super::base::{self, BaseHeader, PacketType};
use super::list::{IovList, RmaIov, WireItem};
use super::{RawAddr, WireError, get_u32, get_u64, put_u32, put_u64};

bitflags! {
    /// REQ flags (spec table 3.1, interop notes).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ReqFlags: u16 {
        /// The optional raw address header is present.
        const RAW_ADDR_HDR = 0x0001;
        /// The optional CQ data header is present.
        const CQ_DATA_HDR = 0x0002;
        /// Set on every RTM.
        const MSG = 0x0004;
        /// Set on tagged RTMs.
        const TAGGED = 0x0008;
        /// Defined for RTW/RTR but never set by the provider: not required.
        const RMA = 0x0010;
        /// Set on every RTA.
        const ATOMIC = 0x0020;
        /// A LONGCTS RTM/RTW re-sent after a READ_NACK; it carries no data.
        /// libfabric: EFA_RDM_REQ_READ_NACK.
        const READ_NACK = 0x2000;
        /// The optional connid header is present (universal flag).
        const CONNID_HDR = base::CONNID_HDR;
    }
}

const _: () = assert!(super::names_each_flag_once(ReqFlags::SPEC_NAMES, ReqFlags::all().bits()));

impl ReqFlags {
    /// Each flag's bit and its name in spec table 3.1, for tools that name
    /// the bits of a flags word ([`PacketType::flag_names`](super::PacketType::flag_names)).
    pub const SPEC_NAMES: &'static [(u16, &'static str)] = &[
        (ReqFlags::RAW_ADDR_HDR.bits(), "REQ_OPT_RAW_ADDR_HDR"),
        (ReqFlags::CQ_DATA_HDR.bits(), "REQ_OPT_CQ_DATA_HDR"),
        (ReqFlags::MSG.bits(), "REQ_MSG"),
        (ReqFlags::TAGGED.bits(), "REQ_TAGGED"),
        (ReqFlags::RMA.bits(), "REQ_RMA"),
        (ReqFlags::ATOMIC.bits(), "REQ_ATOMIC"),
        // The spec is silent on bit 13; libfabric: EFA_RDM_REQ_READ_NACK,
        // named as the spec names the others (without EFA_RDM_).
        (ReqFlags::READ_NACK.bits(), "REQ_READ_NACK"),
        (ReqFlags::CONNID_HDR.bits(), "CONNID_HDR"),
    ];

    /// The flags that announce optional headers; `emit` derives them from
    /// the [`ReqRepr`]'s options.
    pub const OPT_HDRS: ReqFlags =
        ReqFlags::RAW_ADDR_HDR.union(ReqFlags::CQ_DATA_HDR).union(ReqFlags::CONNID_HDR);

    /// What the provider sets for a packet of this type: MSG on every RTM,
    /// TAGGED on tagged RTMs, ATOMIC on every RTA.
    pub fn for_type(ptype: PacketType) -> ReqFlags {
        let Some(layout) = ReqLayout::of(ptype) else {
            return ReqFlags::empty();
        };
        match layout.class {
            ReqClass::Rtm if layout.tag != 0 => ReqFlags::MSG | ReqFlags::TAGGED,
            ReqClass::Rtm => ReqFlags::MSG,
            ReqClass::Rta => ReqFlags::ATOMIC,
            ReqClass::Rtw | ReqClass::Rtr => ReqFlags::empty(),
        }
    }
}

/// The four REQ categories (spec 3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReqClass {
    /// Request to message (two-sided).
    Rtm,
    /// Request to write.
    Rtw,
    /// Request to read.
    Rtr,
    /// Request to atomic.
    Rta,
}

/// Where each field of a REQ type's fixed header lies. An offset of 0 means
/// the type has no such field (offset 0 is the base header's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqLayout {
    /// The REQ category.
    pub class: ReqClass,
    /// Bytes of the fixed header.
    pub header_len: u8,
    msg_id: u8,
    tag: u8,
    msg_length: u8,
    seg_offset: u8,
    send_id: u8,
    recv_id: u8,
    credit_request: u8,
    recv_length: u8,
    rma_iov_count: u8,
    read_iov_count: u8,
    atomic_datatype: u8,
    atomic_op: u8,
    runt_length: u8,
}

const NONE: ReqLayout = ReqLayout {
    class: ReqClass::Rtm,
    header_len: 0,
    msg_id: 0,
    tag: 0,
    msg_length: 0,
    seg_offset: 0,
    send_id: 0,
    recv_id: 0,
    credit_request: 0,
    recv_length: 0,
    rma_iov_count: 0,
    read_iov_count: 0,
    atomic_datatype: 0,
    atomic_op: 0,
    runt_length: 0,
};

const fn tagged(l: ReqLayout) -> ReqLayout {
    // The tag is always the last 8 bytes of the fixed header (interop notes).
    ReqLayout { tag: l.header_len, header_len: l.header_len + 8, ..l }
}

const EAGER_RTM: ReqLayout = ReqLayout { header_len: 8, msg_id: 4, ..NONE };
const MEDIUM_RTM: ReqLayout =
    ReqLayout { header_len: 24, msg_id: 4, msg_length: 8, seg_offset: 16, ..NONE };
const LONGCTS_RTM: ReqLayout =
    ReqLayout { header_len: 24, msg_id: 4, msg_length: 8, send_id: 16, credit_request: 20, ..NONE };
const LONGREAD_RTM: ReqLayout =
    ReqLayout { header_len: 24, msg_id: 4, msg_length: 8, send_id: 16, read_iov_count: 20, ..NONE };
const DC_EAGER_RTM: ReqLayout = ReqLayout { header_len: 16, msg_id: 4, send_id: 8, ..NONE };
const DC_MEDIUM_RTM: ReqLayout =
    ReqLayout { header_len: 32, msg_id: 4, send_id: 8, msg_length: 16, seg_offset: 24, ..NONE };
const RUNTREAD_RTM: ReqLayout = ReqLayout {
    header_len: 40,
    msg_id: 4,
    msg_length: 8,
    send_id: 16,
    read_iov_count: 20,
    seg_offset: 24,
    runt_length: 32,
    ..NONE
};
const EAGER_RTW: ReqLayout =
    ReqLayout { class: ReqClass::Rtw, header_len: 8, rma_iov_count: 4, ..NONE };
const DC_EAGER_RTW: ReqLayout =
    ReqLayout { class: ReqClass::Rtw, header_len: 16, rma_iov_count: 4, send_id: 8, ..NONE };
const LONGCTS_RTW: ReqLayout = ReqLayout {
    class: ReqClass::Rtw,
    header_len: 24,
    rma_iov_count: 4,
    msg_length: 8,
    send_id: 16,
    credit_request: 20,
    ..NONE
};
const LONGREAD_RTW: ReqLayout = ReqLayout {
    class: ReqClass::Rtw,
    header_len: 24,
    rma_iov_count: 4,
    msg_length: 8,
    send_id: 16,
    read_iov_count: 20,
    ..NONE
};
// SHORT_RTR puts the read length at offset 20 too, not padding (interop notes).
const RTR: ReqLayout = ReqLayout {
    class: ReqClass::Rtr,
    header_len: 24,
    rma_iov_count: 4,
    msg_length: 8,
    recv_id: 16,
    recv_length: 20,
    ..NONE
};
const WRITE_RTA: ReqLayout = ReqLayout {
    class: ReqClass::Rta,
    header_len: 24,
    msg_id: 4,
    rma_iov_count: 8,
    atomic_datatype: 12,
    atomic_op: 16,
    ..NONE
};
const FETCH_RTA: ReqLayout = ReqLayout { recv_id: 20, ..WRITE_RTA };
const DC_WRITE_RTA: ReqLayout = ReqLayout { send_id: 20, ..WRITE_RTA };

const _: () = {
    assert!(tagged(EAGER_RTM).header_len == 16);
    assert!(tagged(MEDIUM_RTM).header_len == 32);
    assert!(tagged(LONGCTS_RTM).header_len == 32);
    assert!(tagged(LONGREAD_RTM).header_len == 32);
    assert!(tagged(DC_EAGER_RTM).header_len == 24);
    assert!(tagged(DC_MEDIUM_RTM).header_len == 40);
    assert!(tagged(RUNTREAD_RTM).header_len == 48);
};

/// Evaluates `$body` with `$l` bound to the constant layout of `$ptype`, or
/// `$none` for a type that is not a REQ. Each arm is a separate copy of
/// `$body` in which the layout is a constant, so field offsets compile to
/// immediates and bounds checks fold: the hot parse and emit paths use it.
macro_rules! with_req_layout {
    ($type_id:expr, $l:ident => $body:expr, _ => $none:expr) => {{
        use super::base::type_id as t;
        match $type_id {
            t::EAGER_MSGRTM => with_req_layout!(@arm EAGER_RTM, $l, $body),
            t::EAGER_TAGRTM => with_req_layout!(@arm tagged(EAGER_RTM), $l, $body),
            t::MEDIUM_MSGRTM => with_req_layout!(@arm MEDIUM_RTM, $l, $body),
            t::MEDIUM_TAGRTM => with_req_layout!(@arm tagged(MEDIUM_RTM), $l, $body),
            t::LONGCTS_MSGRTM | t::DC_LONGCTS_MSGRTM => {
                with_req_layout!(@arm LONGCTS_RTM, $l, $body)
            }
            t::LONGCTS_TAGRTM | t::DC_LONGCTS_TAGRTM => {
                with_req_layout!(@arm tagged(LONGCTS_RTM), $l, $body)
            }
            t::EAGER_RTW => with_req_layout!(@arm EAGER_RTW, $l, $body),
            t::LONGCTS_RTW | t::DC_LONGCTS_RTW => with_req_layout!(@arm LONGCTS_RTW, $l, $body),
            t::SHORT_RTR | t::LONGCTS_RTR => with_req_layout!(@arm RTR, $l, $body),
            t::WRITE_RTA => with_req_layout!(@arm WRITE_RTA, $l, $body),
            t::FETCH_RTA | t::COMPARE_RTA => with_req_layout!(@arm FETCH_RTA, $l, $body),
            t::LONGREAD_MSGRTM => with_req_layout!(@arm LONGREAD_RTM, $l, $body),
            t::LONGREAD_TAGRTM => with_req_layout!(@arm tagged(LONGREAD_RTM), $l, $body),
            t::LONGREAD_RTW => with_req_layout!(@arm LONGREAD_RTW, $l, $body),
            t::DC_EAGER_MSGRTM => with_req_layout!(@arm DC_EAGER_RTM, $l, $body),
            t::DC_EAGER_TAGRTM => with_req_layout!(@arm tagged(DC_EAGER_RTM), $l, $body),
            t::DC_MEDIUM_MSGRTM => with_req_layout!(@arm DC_MEDIUM_RTM, $l, $body),
            t::DC_MEDIUM_TAGRTM => with_req_layout!(@arm tagged(DC_MEDIUM_RTM), $l, $body),
            t::DC_EAGER_RTW => with_req_layout!(@arm DC_EAGER_RTW, $l, $body),
            t::DC_WRITE_RTA => with_req_layout!(@arm DC_WRITE_RTA, $l, $body),
            t::RUNTREAD_MSGRTM => with_req_layout!(@arm RUNTREAD_RTM, $l, $body),
            t::RUNTREAD_TAGRTM => with_req_layout!(@arm tagged(RUNTREAD_RTM), $l, $body),
            _ => $none,
        }
    }};
    (@arm $layout:expr, $l:ident, $body:expr) => {{
        const LAYOUT: ReqLayout = $layout;
        let $l: &'static ReqLayout = &LAYOUT;
        $body
    }};
}

impl ReqLayout {
    /// The layout of a REQ type; `None` for a non-REQ or unknown type.
    #[inline]
    pub const fn of(ptype: PacketType) -> Option<&'static ReqLayout> {
        if let PacketType::Unknown(_) = ptype {
            return None;
        }
        with_req_layout!(ptype.id(), l => Some(l), _ => None)
    }

    /// Bytes of the fixed header.
    #[inline]
    pub const fn header_len(&self) -> usize {
        self.header_len as usize
    }
}

/// A named field of a REQ fixed header, spelled as in the spec's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReqField {
    MsgId,
    Tag,
    MsgLength,
    SegOffset,
    SendId,
    RecvId,
    CreditRequest,
    RecvLength,
    RmaIovCount,
    ReadIovCount,
    AtomicDatatype,
    AtomicOp,
    RuntLength,
}

impl ReqField {
    /// Every field, in the order a dissector prints them.
    pub const ALL: [ReqField; 13] = [
        ReqField::MsgId,
        ReqField::MsgLength,
        ReqField::SegOffset,
        ReqField::SendId,
        ReqField::RecvId,
        ReqField::CreditRequest,
        ReqField::RecvLength,
        ReqField::RmaIovCount,
        ReqField::ReadIovCount,
        ReqField::AtomicDatatype,
        ReqField::AtomicOp,
        ReqField::RuntLength,
        ReqField::Tag,
    ];

    /// The spec's name of the field.
    pub const fn name(self) -> &'static str {
        match self {
            ReqField::MsgId => "msg_id",
            ReqField::Tag => "tag",
            ReqField::MsgLength => "msg_length",
            ReqField::SegOffset => "seg_offset",
            ReqField::SendId => "send_id",
            ReqField::RecvId => "recv_id",
            ReqField::CreditRequest => "credit_request",
            ReqField::RecvLength => "recv_length",
            ReqField::RmaIovCount => "rma_iov_count",
            ReqField::ReadIovCount => "read_iov_count",
            ReqField::AtomicDatatype => "atomic_datatype",
            ReqField::AtomicOp => "atomic_op",
            ReqField::RuntLength => "runt_length",
        }
    }

    /// Whether the field is a u64 on the wire (the others are u32).
    pub const fn is_u64(self) -> bool {
        matches!(
            self,
            ReqField::Tag | ReqField::MsgLength | ReqField::SegOffset | ReqField::RuntLength
        )
    }
}

impl ReqLayout {
    /// The offset of `field` in the fixed header, if the type has it.
    #[inline]
    pub const fn offset(&self, field: ReqField) -> Option<usize> {
        let at = match field {
            ReqField::MsgId => self.msg_id,
            ReqField::Tag => self.tag,
            ReqField::MsgLength => self.msg_length,
            ReqField::SegOffset => self.seg_offset,
            ReqField::SendId => self.send_id,
            ReqField::RecvId => self.recv_id,
            ReqField::CreditRequest => self.credit_request,
            ReqField::RecvLength => self.recv_length,
            ReqField::RmaIovCount => self.rma_iov_count,
            ReqField::ReadIovCount => self.read_iov_count,
            ReqField::AtomicDatatype => self.atomic_datatype,
            ReqField::AtomicOp => self.atomic_op,
            ReqField::RuntLength => self.runt_length,
        };
        if at == 0 { None } else { Some(at as usize) }
    }

    /// Whether the type has `field`.
    #[inline]
    pub const fn has(&self, field: ReqField) -> bool {
        self.offset(field).is_some()
    }

    /// The fields this type has, in [`ReqField::ALL`] order.
    pub fn fields(&self) -> impl Iterator<Item = ReqField> + '_ {
        ReqField::ALL.into_iter().filter(|f| self.has(*f))
    }
}

/// Where the variable parts of a checked REQ packet start; computed once by
/// [`ReqPacket::new_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offsets {
    /// Start of the optional headers (after `rma_iov[]`).
    opt: usize,
    /// Start of the CQ data header (after the raw address header).
    cq_data: usize,
    /// Start of `read_iov[]` (after the optional headers).
    read_iov: usize,
    /// Start of application data.
    payload: usize,
}

const RAW_ADDR_SIZE_LEN: usize = 4;
const CQ_DATA_LEN: usize = 8;
/// In REQ packets the connid header is a bare u32, unlike CTSDATA and
/// HANDSHAKE where it takes 8 bytes (interop notes).
const CONNID_LEN: usize = 4;

/// The type id of a buffer whose base header is present and says version
/// 4; `None` sends the caller to [`not_req`] for the precise error.
#[inline(always)]
fn fast_base(buf: &[u8]) -> Option<u8> {
    match buf {
        [type_id, base::PROTOCOL_VERSION, _, _, ..] => Some(*type_id),
        _ => None,
    }
}

/// Why `buf` is not a REQ packet the fast path accepts: the base header's
/// error (type checked before version), or a non-REQ type.
#[cold]
#[inline(never)]
fn not_req(buf: &[u8]) -> WireError {
    match BaseHeader::new_checked(buf) {
        Err(e) => e,
        Ok(base) => WireError::NotReq { ptype: base.packet_type() },
    }
}

/// Fails unless `need` bytes are present.
#[inline(always)]
fn need(what: &'static str, need: u64, have: usize) -> Result<(), WireError> {
    if need > have as u64 { Err(truncated(what, need, have)) } else { Ok(()) }
}

#[cold]
#[inline(never)]
fn truncated(what: &'static str, need: u64, have: usize) -> WireError {
    WireError::Truncated { what, need, have }
}

/// The parts of a checked REQ packet, borrowed from its buffer.
#[derive(Clone, Copy)]
struct Parts<'a> {
    buf: &'a [u8],
    layout: &'static ReqLayout,
    flags: ReqFlags,
    at: Offsets,
}

impl<'a> Parts<'a> {
    /// Checks every count and size against the bytes present, in u64
    /// arithmetic so that a u32 count times 24 cannot wrap. Inlined into
    /// `new_checked`, for the reason given there.
    #[inline(always)]
    fn check(buf: &'a [u8]) -> Result<Parts<'a>, WireError> {
        match fast_base(buf) {
            Some(type_id) => {
                with_req_layout!(type_id, l => Parts::check_as(buf, l), _ => Err(not_req(buf)))
            }
            None => Err(not_req(buf)),
        }
    }

    /// [`Parts::check`] for a packet whose base header is checked and whose
    /// layout is `layout`; inlined per type by `with_req_layout!`.
    #[inline(always)]
    fn check_as(buf: &'a [u8], layout: &'static ReqLayout) -> Result<Parts<'a>, WireError> {
        let flags = ReqFlags::from_bits_retain(BaseHeader::new_unchecked(buf).flags());
        let have = buf.len();
        need("fixed header", layout.header_len as u64, have)?;

        let mut at = layout.header_len as u64;
        if let Some(o) = layout.offset(ReqField::RmaIovCount) {
            at += get_u32(buf, o) as u64 * RmaIov::LEN as u64;
            need("rma_iov[]", at, have)?;
        }
        let opt = at as usize;
        if flags.contains(ReqFlags::RAW_ADDR_HDR) {
            need("raw address header", at + RAW_ADDR_SIZE_LEN as u64, have)?;
            let size = get_u32(buf, opt);
            if (size as usize) < RawAddr::MIN_LEN {
                return Err(WireError::RawAddrSize { size: size as u64 });
            }
            at += RAW_ADDR_SIZE_LEN as u64 + size as u64;
            need("raw address", at, have)?;
        }
        let cq_data = at as usize;
        if flags.contains(ReqFlags::CQ_DATA_HDR) {
            at += CQ_DATA_LEN as u64;
            need("CQ data header", at, have)?;
        }
        if flags.contains(ReqFlags::CONNID_HDR) {
            at += CONNID_LEN as u64;
            need("connid header", at, have)?;
        }
        let read_iov = at as usize;
        if let Some(o) = layout.offset(ReqField::ReadIovCount) {
            at += get_u32(buf, o) as u64 * RmaIov::LEN as u64;
            need("read_iov[]", at, have)?;
        }
        let at = Offsets { opt, cq_data, read_iov, payload: at as usize };
        Ok(Parts { buf, layout, flags, at })
    }

    #[inline]
    fn rma_iov(&self) -> IovList<'a> {
        IovList::Wire(&self.buf[self.layout.header_len()..self.at.opt])
    }

    #[inline]
    fn raw_addr(&self) -> Option<&'a [u8]> {
        let start = self.at.opt + RAW_ADDR_SIZE_LEN;
        self.flags.contains(ReqFlags::RAW_ADDR_HDR).then(|| &self.buf[start..self.at.cq_data])
    }

    #[inline]
    fn cq_data(&self) -> Option<u64> {
        self.flags.contains(ReqFlags::CQ_DATA_HDR).then(|| get_u64(self.buf, self.at.cq_data))
    }

    #[inline]
    fn connid(&self) -> Option<u32> {
        self.flags
            .contains(ReqFlags::CONNID_HDR)
            .then(|| get_u32(self.buf, self.at.read_iov - CONNID_LEN))
    }

    #[inline]
    fn read_iov(&self) -> IovList<'a> {
        IovList::Wire(&self.buf[self.at.read_iov..self.at.payload])
    }

    #[inline]
    fn payload(&self) -> &'a [u8] {
        &self.buf[self.at.payload..]
    }
}

/// Every fixed-header field of a REQ, widened; zero where the type has
/// none. [`ReqPacket::fields`] reads them all at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReqFields {
    pub msg_id: u32,
    pub tag: u64,
    pub msg_length: u64,
    pub seg_offset: u64,
    pub send_id: u32,
    pub recv_id: u32,
    pub credit_request: u32,
    pub recv_length: u32,
    pub atomic_datatype: u32,
    pub atomic_op: u32,
    pub runt_length: u64,
}

impl ReqFields {
    /// Reads the fields `layout` has; inlined per type by
    /// `with_req_layout!`, where each offset is a constant.
    #[inline(always)]
    fn read(buf: &[u8], layout: &ReqLayout) -> ReqFields {
        let u32_at = |o: u8| if o == 0 { 0 } else { get_u32(buf, o as usize) };
        let u64_at = |o: u8| if o == 0 { 0 } else { get_u64(buf, o as usize) };
        ReqFields {
            msg_id: u32_at(layout.msg_id),
            tag: u64_at(layout.tag),
            msg_length: u64_at(layout.msg_length),
            seg_offset: u64_at(layout.seg_offset),
            send_id: u32_at(layout.send_id),
            recv_id: u32_at(layout.recv_id),
            credit_request: u32_at(layout.credit_request),
            recv_length: u32_at(layout.recv_length),
            atomic_datatype: u32_at(layout.atomic_datatype),
            atomic_op: u32_at(layout.atomic_op),
            runt_length: u64_at(layout.runt_length),
        }
    }
}

/// An eager RTM (EAGER_MSGRTM or EAGER_TAGRTM) read in one pass: the
/// receive path's header prediction, for the packet it sees most (and
/// [`EagerRtm::emit`], the send path's header in a few stores).
///
/// [`EagerRtm::predict`] answers only for the common form, without a raw
/// address header and without the READ_NACK flag; for anything else,
/// malformed packets included, it answers `None` and the caller takes the
/// full parse ([`ReqPacket::new_checked`]), which says what is wrong.
/// Where it answers, it reads what the full parse reads (a property test
/// holds it to that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EagerRtm {
    pub tagged: bool,
    pub msg_id: u32,
    /// 0 when untagged.
    pub tag: u64,
    pub cq_data: Option<u64>,
    pub connid: Option<u32>,
    /// Where the application data starts.
    pub payload_off: usize,
}

impl EagerRtm {
    /// The eager RTM in `buf`, if it is one in the common form.
    #[inline(always)]
    pub fn predict(buf: &[u8]) -> Option<EagerRtm> {
        use super::base::type_id as t;
        let [type_id, version, f0, f1] = *buf.first_chunk::<4>()?;
        let flags = ReqFlags::from_bits_retain(u16::from_le_bytes([f0, f1]));
        let unusual = ReqFlags::RAW_ADDR_HDR.union(ReqFlags::READ_NACK);
        if version != base::PROTOCOL_VERSION || flags.intersects(unusual) {
            return None;
        }
        let (tagged, fixed) = match type_id {
            t::EAGER_MSGRTM => (false, EAGER_RTM.header_len()),
            t::EAGER_TAGRTM => (true, tagged(EAGER_RTM).header_len()),
            _ => return None,
        };
        let has_cq_data = flags.contains(ReqFlags::CQ_DATA_HDR);
        let has_connid = flags.contains(ReqFlags::CONNID_HDR);
        let (connid_at, payload_off) = EagerRtm::opt_offsets(fixed, has_cq_data, has_connid);
        if buf.len() < payload_off {
            return None;
        }
        Some(EagerRtm {
            tagged,
            msg_id: get_u32(buf, EAGER_RTM.msg_id as usize),
            tag: if tagged { get_u64(buf, EAGER_RTM.header_len()) } else { 0 },
            cq_data: has_cq_data.then(|| get_u64(buf, fixed)),
            connid: has_connid.then(|| get_u32(buf, connid_at)),
            payload_off,
        })
    }

    /// Where the connid header and the application data of an eager RTM
    /// in the common form start, its fixed header `fixed` bytes long:
    /// the CQ data, if any, first (flag-bit order).
    #[inline(always)]
    fn opt_offsets(fixed: usize, has_cq_data: bool, has_connid: bool) -> (usize, usize) {
        let connid_at = fixed + if has_cq_data { CQ_DATA_LEN } else { 0 };
        (connid_at, connid_at + if has_connid { CONNID_LEN } else { 0 })
    }

    /// Writes the header of an eager RTM in the common form (no raw
    /// address header, no READ_NACK) into `buf`, `tag` making it an
    /// EAGER_TAGRTM; returns where application data goes. The send path's
    /// counterpart of [`EagerRtm::predict`]: the bytes [`ReqRepr::emit`]
    /// writes for the same fields (a property test holds it to that), in a
    /// few stores whatever the caller knows of the type, where the general
    /// emit folds to them only when its type is a constant there. Panics
    /// if `buf` is shorter than the header.
    #[inline(always)]
    pub fn emit(
        buf: &mut [u8],
        msg_id: u32,
        tag: Option<u64>,
        cq_data: Option<u64>,
        connid: Option<u32>,
    ) -> usize {
        use super::base::type_id as t;
        let (type_id, fixed) = match tag {
            Some(_) => (t::EAGER_TAGRTM, tagged(EAGER_RTM).header_len()),
            None => (t::EAGER_MSGRTM, EAGER_RTM.header_len()),
        };
        let mut flags = ReqFlags::MSG;
        flags.set(ReqFlags::TAGGED, tag.is_some());
        flags.set(ReqFlags::CQ_DATA_HDR, cq_data.is_some());
        flags.set(ReqFlags::CONNID_HDR, connid.is_some());
        let (connid_at, payload_off) =
            EagerRtm::opt_offsets(fixed, cq_data.is_some(), connid.is_some());
        // One bounds check for every store below.
        let hdr = &mut buf[..payload_off];
        base::emit_base(hdr, type_id, flags.bits());
        put_u32(hdr, EAGER_RTM.msg_id as usize, msg_id);
        if let Some(tag) = tag {
            put_u64(hdr, EAGER_RTM.header_len(), tag);
        }
        if let Some(cq_data) = cq_data {
            put_u64(hdr, fixed, cq_data);
        }
        if let Some(connid) = connid {
            put_u32(hdr, connid_at, connid);
        }
        payload_off
    }
}

/// A checked, zero-copy view of a REQ packet.
#[derive(Debug, Clone, Copy)]
pub struct ReqPacket<T: AsRef<[u8]>> {
    buffer: T,
    layout: &'static ReqLayout,
    at: Offsets,
}

impl<T: AsRef<[u8]>> ReqPacket<T> {
    /// Checks a received REQ packet: base header, fixed header, and every
    /// count and size against the bytes present. Always inlined: returned
    /// through memory, the view's fields would be read back in other
    /// widths than they were written, which stalls store forwarding.
    #[inline(always)]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let Parts { layout, at, .. } = Parts::check(buffer.as_ref())?;
        Ok(ReqPacket { buffer, layout, at })
    }

    #[inline]
    fn parts(&self) -> Parts<'_> {
        let buf = self.buffer.as_ref();
        let flags = ReqFlags::from_bits_retain(BaseHeader::new_unchecked(buf).flags());
        Parts { buf, layout: self.layout, flags, at: self.at }
    }

    /// The packet type.
    #[inline]
    pub fn packet_type(&self) -> PacketType {
        BaseHeader::new_unchecked(self.buffer.as_ref()).packet_type()
    }

    /// The type's layout.
    #[inline(always)]
    pub fn layout(&self) -> &'static ReqLayout {
        self.layout
    }

    /// The flags, unknown bits kept.
    #[inline]
    pub fn flags(&self) -> ReqFlags {
        self.parts().flags
    }

    /// A fixed-header field, widened to u64; `None` if the type lacks it.
    #[inline]
    pub fn field(&self, field: ReqField) -> Option<u64> {
        let buf = self.buffer.as_ref();
        let o = self.layout.offset(field)?;
        Some(if field.is_u64() { get_u64(buf, o) } else { get_u32(buf, o) as u64 })
    }

    /// Every fixed-header field at once, at the type's constant offsets:
    /// what a receiver reads, in one step. Always inlined: returned through
    /// memory, its fields would be read back wider than written, which
    /// stalls store forwarding.
    #[inline(always)]
    pub fn fields(&self) -> ReqFields {
        let buf = self.buffer.as_ref();
        // The type was checked with the buffer: `None` cannot happen.
        with_req_layout!(buf[0], l => ReqFields::read(buf, l), _ => ReqFields::default())
    }

    /// `rma_iov[]` (empty for types without it).
    #[inline]
    pub fn rma_iov(&self) -> IovList<'_> {
        self.parts().rma_iov()
    }

    /// The raw address header's `addr` bytes (`size` of them), if present.
    #[inline]
    pub fn raw_addr(&self) -> Option<&[u8]> {
        self.parts().raw_addr()
    }

    /// Where the raw address header's `addr` bytes start, if present.
    #[inline]
    pub fn raw_addr_offset(&self) -> Option<usize> {
        let p = self.parts();
        p.flags.contains(ReqFlags::RAW_ADDR_HDR).then_some(p.at.opt + RAW_ADDR_SIZE_LEN)
    }

    /// The CQ data header, if present.
    #[inline]
    pub fn cq_data(&self) -> Option<u64> {
        self.parts().cq_data()
    }

    /// The sender's connid header, if present.
    #[inline]
    pub fn connid(&self) -> Option<u32> {
        self.parts().connid()
    }

    /// `read_iov[]` (empty for types without it).
    #[inline]
    pub fn read_iov(&self) -> IovList<'_> {
        self.parts().read_iov()
    }

    /// Bytes of header: fixed header, `rma_iov[]` and optional headers.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        self.at.read_iov
    }

    /// Where application data starts (after `read_iov[]`).
    #[inline]
    pub fn payload_offset(&self) -> usize {
        self.at.payload
    }

    /// Application data.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.parts().payload()
    }
}

/// The value form of a REQ packet's headers (everything before the
/// application data).
///
/// Fields the type lacks are ignored by `emit` and read as zero by `parse`.
/// `rma_iov_count` and `read_iov_count` come from the lists; the optional
/// header flags come from the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr<'a> {
    pub ptype: PacketType,
    /// All flags; RAW_ADDR_HDR, CQ_DATA_HDR and CONNID_HDR follow `raw_addr`,
    /// `cq_data` and `connid` on emit.
    pub flags: ReqFlags,
    pub msg_id: u32,
    pub tag: u64,
    pub msg_length: u64,
    pub seg_offset: u64,
    pub send_id: u32,
    pub recv_id: u32,
    pub credit_request: u32,
    /// LONGCTS_RTR / SHORT_RTR: bytes the requester is ready to receive.
    pub recv_length: u32,
    pub atomic_datatype: u32,
    pub atomic_op: u32,
    pub runt_length: u64,
    pub rma_iov: IovList<'a>,
    /// The raw address header's `addr` bytes (see [`RawAddr`]).
    pub raw_addr: Option<&'a [u8]>,
    pub cq_data: Option<u64>,
    pub connid: Option<u32>,
    pub read_iov: IovList<'a>,
}

impl<'a> ReqRepr<'a> {
    /// A REQ of `ptype` with the flags the provider sets for it and every
    /// field zero. Panics if `ptype` is not a REQ type (a programming error,
    /// never a property of received bytes).
    #[inline]
    pub fn new(ptype: PacketType) -> ReqRepr<'a> {
        assert!(ptype.is_req(), "{ptype} is not a REQ type");
        ReqRepr {
            ptype,
            flags: ReqFlags::for_type(ptype),
            msg_id: 0,
            tag: 0,
            msg_length: 0,
            seg_offset: 0,
            send_id: 0,
            recv_id: 0,
            credit_request: 0,
            recv_length: 0,
            atomic_datatype: 0,
            atomic_op: 0,
            runt_length: 0,
            rma_iov: IovList::Host(&[]),
            raw_addr: None,
            cq_data: None,
            connid: None,
            read_iov: IovList::Host(&[]),
        }
    }

    /// Checks and reads a received REQ packet: its headers and its
    /// application data.
    #[inline]
    pub fn parse(buf: &'a [u8]) -> Result<(ReqRepr<'a>, &'a [u8]), WireError> {
        match fast_base(buf) {
            Some(type_id) => with_req_layout!(
                type_id,
                l => ReqRepr::parse_as(buf, PacketType::from(type_id), l),
                _ => Err(not_req(buf))
            ),
            None => Err(not_req(buf)),
        }
    }

    #[inline(always)]
    fn parse_as(
        buf: &'a [u8],
        ptype: PacketType,
        layout: &'static ReqLayout,
    ) -> Result<(ReqRepr<'a>, &'a [u8]), WireError> {
        let p = Parts::check_as(buf, layout)?;
        let f = ReqFields::read(buf, layout);
        let repr = ReqRepr {
            ptype,
            flags: p.flags,
            msg_id: f.msg_id,
            tag: f.tag,
            msg_length: f.msg_length,
            seg_offset: f.seg_offset,
            send_id: f.send_id,
            recv_id: f.recv_id,
            credit_request: f.credit_request,
            recv_length: f.recv_length,
            atomic_datatype: f.atomic_datatype,
            atomic_op: f.atomic_op,
            runt_length: f.runt_length,
            rma_iov: p.rma_iov(),
            raw_addr: p.raw_addr(),
            cq_data: p.cq_data(),
            connid: p.connid(),
            read_iov: p.read_iov(),
        };
        Ok((repr, p.payload()))
    }

    /// The type's layout. Panics if `ptype` is not a REQ type.
    #[inline(always)]
    pub fn layout(&self) -> &'static ReqLayout {
        ReqLayout::of(self.ptype).expect("ReqRepr holds a REQ type")
    }

    /// A fixed-header field by name, widened to u64 (counts from the lists).
    pub fn field(&self, field: ReqField) -> u64 {
        match field {
            ReqField::MsgId => self.msg_id as u64,
            ReqField::Tag => self.tag,
            ReqField::MsgLength => self.msg_length,
            ReqField::SegOffset => self.seg_offset,
            ReqField::SendId => self.send_id as u64,
            ReqField::RecvId => self.recv_id as u64,
            ReqField::CreditRequest => self.credit_request as u64,
            ReqField::RecvLength => self.recv_length as u64,
            ReqField::RmaIovCount => self.rma_iov.len() as u64,
            ReqField::ReadIovCount => self.read_iov.len() as u64,
            ReqField::AtomicDatatype => self.atomic_datatype as u64,
            ReqField::AtomicOp => self.atomic_op as u64,
            ReqField::RuntLength => self.runt_length,
        }
    }

    /// The flags as emitted: optional-header bits follow the options.
    #[inline(always)]
    pub fn wire_flags(&self) -> ReqFlags {
        let mut flags = self.flags.difference(ReqFlags::OPT_HDRS);
        flags.set(ReqFlags::RAW_ADDR_HDR, self.raw_addr.is_some());
        flags.set(ReqFlags::CQ_DATA_HDR, self.cq_data.is_some());
        flags.set(ReqFlags::CONNID_HDR, self.connid.is_some());
        flags
    }

    /// Bytes of header, without `read_iov[]`: fixed header, `rma_iov[]`
    /// and optional headers.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        let layout = self.layout();
        let mut len = layout.header_len();
        if layout.has(ReqField::RmaIovCount) {
            len += self.rma_iov.wire_len();
        }
        if let Some(addr) = self.raw_addr {
            len += RAW_ADDR_SIZE_LEN + addr.len();
        }
        if self.cq_data.is_some() {
            len += CQ_DATA_LEN;
        }
        if self.connid.is_some() {
            len += CONNID_LEN;
        }
        len
    }

    /// Bytes `emit` writes: the headers and `read_iov[]`; application data
    /// follows at this offset.
    #[inline(always)]
    pub fn buffer_len(&self) -> usize {
        let read_iov =
            if self.layout().has(ReqField::ReadIovCount) { self.read_iov.wire_len() } else { 0 };
        self.header_len() + read_iov
    }

    /// Writes the headers into `buf` (at least [`Self::buffer_len`] bytes),
    /// padding as zero, and returns where application data goes.
    ///
    /// Always inlined: where the caller's type is a constant, the dispatch
    /// folds away and only that type's stores remain.
    #[inline(always)]
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let type_id = self.ptype.id();
        with_req_layout!(
            type_id,
            l => self.emit_as(buf, type_id, l),
            _ => panic!("{} is not a REQ type", self.ptype)
        )
    }

    #[inline(always)]
    fn emit_as(&self, buf: &mut [u8], type_id: u8, layout: &'static ReqLayout) -> usize {
        let hdr = layout.header_len();
        let fixed = &mut buf[..hdr];
        fixed.fill(0);
        base::emit_base(fixed, type_id, self.wire_flags().bits());
        // One statement per field (not a loop over ReqField::ALL) so that,
        // with a constant layout, each folds to a store or to nothing.
        let mut put32 = |f: ReqField, v: u32| {
            if let Some(o) = layout.offset(f) {
                put_u32(fixed, o, v)
            }
        };
        put32(ReqField::MsgId, self.msg_id);
        put32(ReqField::SendId, self.send_id);
        put32(ReqField::RecvId, self.recv_id);
        put32(ReqField::CreditRequest, self.credit_request);
        put32(ReqField::RecvLength, self.recv_length);
        put32(ReqField::RmaIovCount, self.rma_iov.len() as u32);
        put32(ReqField::ReadIovCount, self.read_iov.len() as u32);
        put32(ReqField::AtomicDatatype, self.atomic_datatype);
        put32(ReqField::AtomicOp, self.atomic_op);
        let mut put64 = |f: ReqField, v: u64| {
            if let Some(o) = layout.offset(f) {
                put_u64(fixed, o, v)
            }
        };
        put64(ReqField::Tag, self.tag);
        put64(ReqField::MsgLength, self.msg_length);
        put64(ReqField::SegOffset, self.seg_offset);
        put64(ReqField::RuntLength, self.runt_length);
        let mut at = hdr;
        if layout.has(ReqField::RmaIovCount) {
            let len = self.rma_iov.wire_len();
            self.rma_iov.emit(&mut buf[at..at + len]);
            at += len;
        }
        if let Some(addr) = self.raw_addr {
            put_u32(buf, at, addr.len() as u32);
            at += RAW_ADDR_SIZE_LEN;
            // The size every current provider uses is copied word by word,
            // not by a memcpy call.
            if addr.len() == RawAddr::REQ_HDR_SIZE {
                let dst = &mut buf[at..at + RawAddr::REQ_HDR_SIZE];
                for word in (0..32).step_by(8) {
                    put_u64(dst, word, get_u64(addr, word));
                }
                put_u32(dst, 32, get_u32(addr, 32));
            } else {
                buf[at..at + addr.len()].copy_from_slice(addr);
            }
            at += addr.len();
        }
        if let Some(cq_data) = self.cq_data {
            put_u64(buf, at, cq_data);
            at += CQ_DATA_LEN;
        }
        if let Some(connid) = self.connid {
            put_u32(buf, at, connid);
            at += CONNID_LEN;
        }
        if layout.has(ReqField::ReadIovCount) {
            let len = self.read_iov.wire_len();
            self.read_iov.emit(&mut buf[at..at + len]);
            at += len;
        }
        at
    }
}
