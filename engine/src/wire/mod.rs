//! Zero-copy codecs for every EFA RDM protocol v4 packet the provider sends.
//!
//! The byte layouts are those of libfabric's EFA provider, which the
//! interop notes (specs/efa-rdm-interop-notes.md) describe where they
//! differ from the spec text. All integers are little-endian.
//!
//! Each packet family has a checked view over received bytes
//! (`*Packet::new_checked`) and a value form (`*Repr`) with `parse`,
//! `buffer_len` and `emit`, so that senders never compute an offset by hand.
//! [`Packet::parse`] reads any packet.
//!
//! # The contract
//!
//! * Parsing never panics and never reads out of bounds, whatever the
//!   input. Every count, size and length is checked against the bytes
//!   present, in u64 arithmetic that cannot wrap, before anything is read.
//! * A packet is rejected with a typed [`WireError`] naming what is wrong
//!   when: it is shorter than its headers; its version is not 4; its type
//!   id is unassigned, retired or never sent; a HANDSHAKE's `nextra_p3` is
//!   below 3; a raw address header is under 24 bytes; the data length of a
//!   CTSDATA, READRSP or ATOMRSP disagrees with the data present.
//!   (The provider checks none of this; efapoll does.)
//! * Padding and reserved bytes are ignored on receive (the provider does
//!   not clear its buffers) and written as zero on send. Unknown flag bits
//!   are kept, so that a packet re-emits as received.
//!   [`PacketType::flag_names`] names a flags word's bits as the spec does,
//!   from each flags type's `SPEC_NAMES` (one table per type, checked at
//!   compile time to name every flag the type defines).
//! * Parsing and emitting allocate nothing. `emit` writes exactly
//!   `buffer_len()` bytes (application data is the caller's to copy) and
//!   panics only if the caller's buffer is shorter than that.

mod addr;
mod base;
mod ctrl;
mod cts;
pub mod golden;
mod handshake;
mod list;
mod req;
mod rsp;

pub use addr::RawAddr;
pub use base::{
    BASE_HEADER_LEN, BaseHeader, CONNID_HDR, PROTOCOL_VERSION, PacketType, TypeStatus, type_id,
};
pub use ctrl::{CtrlPacket, EorRepr, ReadNackRepr, ReceiptRepr};
pub use cts::{CtsDataPacket, CtsDataRepr, CtsFlags, CtsPacket, CtsRepr};
pub use handshake::{ExtraInfo, HandshakeFlags, HandshakePacket, HandshakeRepr, UserRecvQp, extra};
pub use list::{IovList, RmaIov, WireItem, WireList};
pub use req::{EagerRtm, ReqClass, ReqField, ReqFields, ReqFlags, ReqLayout, ReqPacket, ReqRepr};
pub use rsp::{AtomRspRepr, ReadRspRepr, RspPacket};

bitflags::bitflags! {
    /// Flags of packets that define none of their own: only the universal
    /// CONNID_HDR (spec table 1.4). Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PktFlags: u16 {
        /// The packet carries the sender's connid.
        const CONNID_HDR = CONNID_HDR;
    }
}

impl PktFlags {
    /// Each flag's bit and its name in spec table 1.4.
    pub const SPEC_NAMES: &'static [(u16, &'static str)] =
        &[(PktFlags::CONNID_HDR.bits(), "CONNID_HDR")];
}

const _: () = assert!(names_each_flag_once(PktFlags::SPEC_NAMES, PktFlags::all().bits()));

/// Whether `names` gives every flag of `all` exactly one name, each of one
/// bit: checked at compile time next to each flags type, so that a flag
/// added without its name fails the build.
const fn names_each_flag_once(names: &[(u16, &str)], all: u16) -> bool {
    let (mut seen, mut i) = (0u16, 0);
    while i < names.len() {
        let bit = names[i].0;
        if bit.count_ones() != 1 || seen & bit != 0 {
            return false;
        }
        seen |= bit;
        i += 1;
    }
    seen == all
}

/// A set bit of a packet's flags word, named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagName {
    /// The spec's name of the bit for this packet type (the provider's
    /// where the spec has none).
    Known(&'static str),
    /// A bit this packet type does not define (kept on parse, not an
    /// error): its value.
    Unknown(u16),
}

impl core::fmt::Display for FlagName {
    /// The name, or the bit's value as `0x0100`.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FlagName::Known(name) => f.write_str(name),
            FlagName::Unknown(bit) => write!(f, "{bit:#06x}"),
        }
    }
}

impl PacketType {
    /// The flags this type defines, `(bit, spec name)`: REQ packets share
    /// table 3.1's (spec 3.1), CTS and HANDSHAKE have their own, every
    /// other type only the universal CONNID_HDR (table 1.4).
    pub fn flag_spec_names(self) -> &'static [(u16, &'static str)] {
        match self {
            PacketType::Cts => CtsFlags::SPEC_NAMES,
            PacketType::Handshake => HandshakeFlags::SPEC_NAMES,
            t if t.is_req() => ReqFlags::SPEC_NAMES,
            _ => PktFlags::SPEC_NAMES,
        }
    }

    /// The bits set in `flags`, lowest first, each named as this type
    /// names it.
    pub fn flag_names(self, flags: u16) -> impl Iterator<Item = FlagName> {
        let names = self.flag_spec_names();
        (0..u16::BITS).map(|i| 1u16 << i).filter(move |bit| flags & bit != 0).map(move |bit| {
            match names.iter().find(|(b, _)| *b == bit) {
                Some(&(_, name)) => FlagName::Known(name),
                None => FlagName::Unknown(bit),
            }
        })
    }
}

/// Why a packet was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a header, count or size requires.
    #[error("{what} cut short: need {need} bytes, have {have}")]
    Truncated { what: &'static str, need: u64, have: usize },
    /// The version byte is not 4.
    #[error("protocol version {found}, expected 4")]
    Version { found: u8 },
    /// A type id that is not sent on the wire.
    #[error("packet type {id} is {status}")]
    Type { id: u8, status: TypeStatus },
    /// A non-REQ type given to the REQ codec.
    #[error("{ptype} is not a REQ packet")]
    NotReq { ptype: PacketType },
    /// A packet of another type given to a type's codec.
    #[error("expected {expected}, found {found}")]
    WrongType { expected: PacketType, found: PacketType },
    /// HANDSHAKE `nextra_p3` below 3 (it counts extra_info words plus 3).
    #[error("HANDSHAKE nextra_p3 {nextra_p3} is below 3")]
    NextraP3 { nextra_p3: u32 },
    /// A raw address shorter than the 24 bytes up to its connid.
    #[error("raw address size {size} is below 24")]
    RawAddrSize { size: u64 },
    /// A data length field that disagrees with the data present.
    #[error("{what} {field} disagrees with the {present} data bytes present")]
    Length { what: &'static str, field: u64, present: usize },
}

impl WireError {
    /// Number of distinct reasons, for per-reason counters.
    pub const KINDS: usize = 8;

    /// A small index per reason, for per-reason counters.
    pub fn kind(&self) -> usize {
        match self {
            WireError::Truncated { .. } => 0,
            WireError::Version { .. } => 1,
            WireError::Type { .. } => 2,
            WireError::NotReq { .. } => 3,
            WireError::WrongType { .. } => 4,
            WireError::NextraP3 { .. } => 5,
            WireError::RawAddrSize { .. } => 6,
            WireError::Length { .. } => 7,
        }
    }

    /// A short name per reason, for counter dumps.
    pub fn kind_name(kind: usize) -> &'static str {
        [
            "truncated",
            "version",
            "type",
            "not_req",
            "wrong_type",
            "nextra_p3",
            "raw_addr_size",
            "length",
        ]
        .get(kind)
        .copied()
        .unwrap_or("unknown")
    }
}

/// Any packet, parsed: its headers' value form and, for packets that carry
/// it, the application data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    Cts(CtsRepr),
    CtsData(CtsDataRepr, &'a [u8]),
    ReadRsp(ReadRspRepr, &'a [u8]),
    Eor(EorRepr),
    AtomRsp(AtomRspRepr, &'a [u8]),
    Handshake(HandshakeRepr<'a>),
    Receipt(ReceiptRepr),
    ReadNack(ReadNackRepr),
    Req(ReqRepr<'a>, &'a [u8]),
}

impl<'a> Packet<'a> {
    /// Checks and reads any packet.
    #[inline]
    pub fn parse(buf: &'a [u8]) -> Result<Packet<'a>, WireError> {
        let ptype = BaseHeader::new_checked(buf)?.packet_type();
        Ok(match ptype {
            PacketType::Cts => Packet::Cts(CtsRepr::parse(buf)?),
            PacketType::CtsData => {
                let (r, data) = CtsDataRepr::parse(buf)?;
                Packet::CtsData(r, data)
            }
            PacketType::ReadRsp => {
                let (r, data) = ReadRspRepr::parse(buf)?;
                Packet::ReadRsp(r, data)
            }
            PacketType::Eor => Packet::Eor(EorRepr::parse(buf)?),
            PacketType::AtomRsp => {
                let (r, data) = AtomRspRepr::parse(buf)?;
                Packet::AtomRsp(r, data)
            }
            PacketType::Handshake => Packet::Handshake(HandshakeRepr::parse(buf)?),
            PacketType::Receipt => Packet::Receipt(ReceiptRepr::parse(buf)?),
            PacketType::ReadNack => Packet::ReadNack(ReadNackRepr::parse(buf)?),
            _ => {
                let (r, data) = ReqRepr::parse(buf)?;
                Packet::Req(r, data)
            }
        })
    }

    /// The packet type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Cts(_) => PacketType::Cts,
            Packet::CtsData(..) => PacketType::CtsData,
            Packet::ReadRsp(..) => PacketType::ReadRsp,
            Packet::Eor(_) => PacketType::Eor,
            Packet::AtomRsp(..) => PacketType::AtomRsp,
            Packet::Handshake(_) => PacketType::Handshake,
            Packet::Receipt(_) => PacketType::Receipt,
            Packet::ReadNack(_) => PacketType::ReadNack,
            Packet::Req(r, _) => r.ptype,
        }
    }

    /// Bytes of header: the fixed header plus `rma_iov[]` and optional
    /// headers (REQ), the connid (CTSDATA), or the whole packet (HANDSHAKE).
    pub fn header_len(&self) -> usize {
        match self {
            Packet::Cts(_) => CtsRepr::BUFFER_LEN,
            Packet::CtsData(r, _) => r.buffer_len(),
            Packet::ReadRsp(..) | Packet::AtomRsp(..) => rsp::HEADER_LEN,
            Packet::Eor(_) | Packet::Receipt(_) | Packet::ReadNack(_) => ctrl::HEADER_LEN,
            Packet::Handshake(r) => r.buffer_len(),
            Packet::Req(r, _) => r.header_len(),
        }
    }

    /// Where application data starts: after `read_iov[]` for LONGREAD and
    /// RUNTREAD, after the header otherwise.
    pub fn payload_offset(&self) -> usize {
        match self {
            Packet::Req(r, _) => r.buffer_len(),
            other => other.header_len(),
        }
    }

    /// Application data (empty for packets that carry none).
    pub fn payload(&self) -> &'a [u8] {
        match self {
            Packet::CtsData(_, d) | Packet::ReadRsp(_, d) | Packet::AtomRsp(_, d) => d,
            Packet::Req(_, d) => d,
            _ => &[],
        }
    }

    /// Bytes `emit` writes (headers only; application data follows).
    pub fn buffer_len(&self) -> usize {
        self.payload_offset()
    }

    /// Writes the headers and returns where application data goes.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        match self {
            Packet::Cts(r) => r.emit(buf),
            Packet::CtsData(r, _) => r.emit(buf),
            Packet::ReadRsp(r, _) => r.emit(buf),
            Packet::Eor(r) => r.emit(buf),
            Packet::AtomRsp(r, _) => r.emit(buf),
            Packet::Handshake(r) => r.emit(buf),
            Packet::Receipt(r) => r.emit(buf),
            Packet::ReadNack(r) => r.emit(buf),
            Packet::Req(r, _) => r.emit(buf),
        }
    }
}

/// Checks that `buf` holds a valid base header of type `expected` and at
/// least `len` bytes.
#[inline]
pub(crate) fn check_fixed(buf: &[u8], expected: PacketType, len: usize) -> Result<u16, WireError> {
    let base = BaseHeader::new_checked(buf)?;
    let found = base.packet_type();
    if found != expected {
        return Err(WireError::WrongType { expected, found });
    }
    if buf.len() < len {
        return Err(WireError::Truncated {
            what: expected.name(),
            need: len as u64,
            have: buf.len(),
        });
    }
    Ok(base.flags())
}

#[inline(always)]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

#[inline(always)]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[inline(always)]
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[inline(always)]
pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline(always)]
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline(always)]
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(ptype: PacketType, flags: u16) -> Vec<String> {
        ptype.flag_names(flags).map(|n| n.to_string()).collect()
    }

    #[test]
    fn flags_are_named_as_their_packet_type_names_them() {
        // golden::CTS: 0x8080.
        assert_eq!(names(PacketType::Cts, 0x8080), ["CTS_EMULATED_READ", "CONNID_HDR"]);
        // golden::EAGER_TAGRTM: 0x800c; golden::LONGCTS_MSGRTM (0x0007) re-sent
        // after a READ_NACK.
        assert_eq!(names(PacketType::EagerTagRtm, 0x800c), ["REQ_MSG", "REQ_TAGGED", "CONNID_HDR"]);
        assert_eq!(
            names(PacketType::LongCtsMsgRtm, 0x2007),
            ["REQ_OPT_RAW_ADDR_HDR", "REQ_OPT_CQ_DATA_HDR", "REQ_MSG", "REQ_READ_NACK"]
        );
        assert_eq!(names(PacketType::FetchRta, 0x0030), ["REQ_RMA", "REQ_ATOMIC"]);
        assert_eq!(
            names(PacketType::Handshake, 0x8007),
            [
                "HANDSHAKE_HOST_ID_HDR",
                "HANDSHAKE_DEVICE_VERSION_HDR",
                "HANDSHAKE_USER_RECV_QP_HDR",
                "CONNID_HDR"
            ]
        );
        assert_eq!(names(PacketType::Eor, 0x8000), ["CONNID_HDR"]);
        assert!(names(PacketType::ReadRsp, 0).is_empty());
    }

    #[test]
    fn a_bit_its_type_does_not_define_is_its_value() {
        // 0x80 is CTS_EMULATED_READ on a CTS only.
        assert_eq!(names(PacketType::EagerMsgRtm, 0x0084), ["REQ_MSG", "0x0080"]);
        assert_eq!(names(PacketType::Eor, 0x4001), ["0x0001", "0x4000"]);
        assert_eq!(PacketType::Receipt.flag_names(0x0100).next(), Some(FlagName::Unknown(0x100)));
        assert_eq!(names(PacketType::Cts, 0xffff).len(), 16);
    }
}
