//! The base header every packet starts with (spec 1.3), packet type ids and
//! the universal flag.

use super::{WireError, get_u16, put_u16};

/// The protocol version this codec speaks and accepts (spec 1.3).
pub const PROTOCOL_VERSION: u8 = 4;

/// Bytes of the base header: type u8, version u8, flags u16.
pub const BASE_HEADER_LEN: usize = 4;

/// Universal flag (spec table 1.4): the packet carries the sender's connid.
pub const CONNID_HDR: u16 = 0x8000;

pub(crate) mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const VERSION: usize = 1;
    pub const FLAGS: Range<usize> = 2..4;
}

/// Why a type id is not accepted on receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeStatus {
    /// RTS (1) and CONNACK (2): protocol v3 packets, retired.
    Retired,
    /// 6: the provider's RMA context, never on the wire.
    Internal,
    /// Defined in the provider's headers but never sent nor accepted
    /// (131 READ_RTR, 132 DC range marker, 142-144 RUNTCTS, 147 RUNTREAD_RTW).
    NeverSent,
    /// No packet type has this id.
    Unassigned,
}

impl core::fmt::Display for TypeStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TypeStatus::Retired => "retired",
            TypeStatus::Internal => "internal to the provider, never sent",
            TypeStatus::NeverSent => "defined but never sent",
            TypeStatus::Unassigned => "unassigned",
        })
    }
}

macro_rules! packet_types {
    ($($variant:ident = $id:literal, $name:literal, $const_name:ident;)*) => {
        /// A packet type id (spec table 1.2 plus the interop notes' RUNTREAD ids).
        ///
        /// Ids this codec does not accept are kept as `Unknown(id)`, so a
        /// received byte is always representable and the rejection is a
        /// typed error at parse time.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum PacketType {
            $($variant,)*
            Unknown(u8),
        }

        impl PacketType {
            #[inline]
            const fn from_id(id: u8) -> Self {
                match id {
                    $($id => PacketType::$variant,)*
                    other => PacketType::Unknown(other),
                }
            }
        }

        impl From<u8> for PacketType {
            #[inline]
            fn from(id: u8) -> Self {
                PacketType::from_id(id)
            }
        }

        impl From<PacketType> for u8 {
            #[inline]
            fn from(t: PacketType) -> u8 {
                t.id()
            }
        }

        /// Raw type ids, named as the [`PacketType`] variants, for matching
        /// on a received byte.
        pub mod type_id {
            $(#[doc = $name] pub const $const_name: u8 = $id;)*
        }

        impl PacketType {
            /// Every packet type the provider sends, in id order.
            pub const ALL: &'static [PacketType] = &[$(PacketType::$variant,)*];

            /// The raw id. Always inlined: a REQ's emit dispatches on it,
            /// and folds to its type's stores only where it sees the id.
            #[inline(always)]
            pub const fn id(self) -> u8 {
                match self {
                    $(PacketType::$variant => $id,)*
                    PacketType::Unknown(id) => id,
                }
            }

            /// The spec's nickname (`EAGER_TAGRTM`), or `UNKNOWN` for an id
            /// this codec does not accept.
            pub const fn name(self) -> &'static str {
                match self {
                    $(PacketType::$variant => $name,)*
                    PacketType::Unknown(_) => "UNKNOWN",
                }
            }
        }
    };
}

packet_types! {
    Cts = 3, "CTS", CTS;
    CtsData = 4, "CTSDATA", CTSDATA;
    ReadRsp = 5, "READRSP", READRSP;
    Eor = 7, "EOR", EOR;
    AtomRsp = 8, "ATOMRSP", ATOMRSP;
    Handshake = 9, "HANDSHAKE", HANDSHAKE;
    Receipt = 10, "RECEIPT", RECEIPT;
    ReadNack = 11, "READ_NACK", READ_NACK;
    EagerMsgRtm = 64, "EAGER_MSGRTM", EAGER_MSGRTM;
    EagerTagRtm = 65, "EAGER_TAGRTM", EAGER_TAGRTM;
    MediumMsgRtm = 66, "MEDIUM_MSGRTM", MEDIUM_MSGRTM;
    MediumTagRtm = 67, "MEDIUM_TAGRTM", MEDIUM_TAGRTM;
    LongCtsMsgRtm = 68, "LONGCTS_MSGRTM", LONGCTS_MSGRTM;
    LongCtsTagRtm = 69, "LONGCTS_TAGRTM", LONGCTS_TAGRTM;
    EagerRtw = 70, "EAGER_RTW", EAGER_RTW;
    LongCtsRtw = 71, "LONGCTS_RTW", LONGCTS_RTW;
    ShortRtr = 72, "SHORT_RTR", SHORT_RTR;
    LongCtsRtr = 73, "LONGCTS_RTR", LONGCTS_RTR;
    WriteRta = 74, "WRITE_RTA", WRITE_RTA;
    FetchRta = 75, "FETCH_RTA", FETCH_RTA;
    CompareRta = 76, "COMPARE_RTA", COMPARE_RTA;
    LongReadMsgRtm = 128, "LONGREAD_MSGRTM", LONGREAD_MSGRTM;
    LongReadTagRtm = 129, "LONGREAD_TAGRTM", LONGREAD_TAGRTM;
    LongReadRtw = 130, "LONGREAD_RTW", LONGREAD_RTW;
    DcEagerMsgRtm = 133, "DC_EAGER_MSGRTM", DC_EAGER_MSGRTM;
    DcEagerTagRtm = 134, "DC_EAGER_TAGRTM", DC_EAGER_TAGRTM;
    DcMediumMsgRtm = 135, "DC_MEDIUM_MSGRTM", DC_MEDIUM_MSGRTM;
    DcMediumTagRtm = 136, "DC_MEDIUM_TAGRTM", DC_MEDIUM_TAGRTM;
    DcLongCtsMsgRtm = 137, "DC_LONGCTS_MSGRTM", DC_LONGCTS_MSGRTM;
    // The spec's table misspells this one DC_LONTCTS_TAGRTM (interop notes).
    DcLongCtsTagRtm = 138, "DC_LONGCTS_TAGRTM", DC_LONGCTS_TAGRTM;
    DcEagerRtw = 139, "DC_EAGER_RTW", DC_EAGER_RTW;
    DcLongCtsRtw = 140, "DC_LONGCTS_RTW", DC_LONGCTS_RTW;
    DcWriteRta = 141, "DC_WRITE_RTA", DC_WRITE_RTA;
    RuntReadMsgRtm = 145, "RUNTREAD_MSGRTM", RUNTREAD_MSGRTM;
    RuntReadTagRtm = 146, "RUNTREAD_TAGRTM", RUNTREAD_TAGRTM;
}

/// By type id: whether it is a REQ type this codec knows (see
/// [`PacketType::is_req`]). A table, for the receive path's first branch.
const IS_REQ: [bool; 256] = {
    let mut t = [false; 256];
    let mut id = 64;
    while id < 256 {
        t[id] = !matches!(PacketType::from_id(id as u8), PacketType::Unknown(_));
        id += 1;
    }
    t
};

impl PacketType {
    /// REQ packets are the first packet of a subprotocol (spec 1.3); their
    /// ids start at 64.
    #[inline]
    pub fn is_req(self) -> bool {
        !matches!(self, PacketType::Unknown(_)) && self.id() >= 64
    }

    /// [`PacketType::is_req`] of a raw type id, by table lookup.
    #[inline]
    pub fn is_req_id(id: u8) -> bool {
        IS_REQ[id as usize]
    }

    /// Why an unknown id is rejected; `None` for a type this codec accepts.
    pub fn status(self) -> Option<TypeStatus> {
        match self {
            PacketType::Unknown(id) => Some(match id {
                1 | 2 => TypeStatus::Retired,
                6 => TypeStatus::Internal,
                131 | 132 | 142..=144 | 147 => TypeStatus::NeverSent,
                _ => TypeStatus::Unassigned,
            }),
            _ => None,
        }
    }

    /// Looks a nickname up (`"EAGER_TAGRTM"`), for tools and tests.
    pub fn from_name(name: &str) -> Option<PacketType> {
        PacketType::ALL.iter().copied().find(|t| t.name() == name)
    }
}

impl core::fmt::Display for PacketType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PacketType::Unknown(id) => write!(f, "type {id}"),
            t => write!(f, "{} ({})", t.name(), t.id()),
        }
    }
}

/// A checked view of the base header of any packet.
#[derive(Debug, Clone, Copy)]
pub struct BaseHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BaseHeader<T> {
    /// Wraps a buffer without checking it; accessors may panic on a short
    /// buffer. Use [`BaseHeader::new_checked`] on untrusted input.
    pub const fn new_unchecked(buffer: T) -> Self {
        BaseHeader { buffer }
    }

    /// Wraps a buffer after checking it holds a base header, version 4 and a
    /// type id that is sent on the wire.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let hdr = BaseHeader::new_unchecked(buffer);
        hdr.check()?;
        Ok(hdr)
    }

    /// Checks length, type and version: type first, so that a retired
    /// protocol v3 packet is reported as such.
    pub fn check(&self) -> Result<(), WireError> {
        let buf = self.buffer.as_ref();
        if buf.len() < BASE_HEADER_LEN {
            return Err(WireError::Truncated {
                what: "base header",
                need: BASE_HEADER_LEN as u64,
                have: buf.len(),
            });
        }
        let ptype = self.packet_type();
        if let Some(status) = ptype.status() {
            return Err(WireError::Type { id: ptype.id(), status });
        }
        let version = self.version();
        if version != PROTOCOL_VERSION {
            return Err(WireError::Version { found: version });
        }
        Ok(())
    }

    /// The packet type.
    #[inline]
    pub fn packet_type(&self) -> PacketType {
        PacketType::from(self.buffer.as_ref()[field::TYPE])
    }

    /// The protocol version byte.
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The raw flags word.
    #[inline]
    pub fn flags(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FLAGS.start)
    }
}

/// Writes a base header: type, version 4, flags.
#[inline]
pub(crate) fn emit_base(buf: &mut [u8], type_id: u8, flags: u16) {
    buf[field::TYPE] = type_id;
    buf[field::VERSION] = PROTOCOL_VERSION;
    put_u16(buf, field::FLAGS.start, flags);
}

const _: () = assert!(field::FLAGS.end == BASE_HEADER_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_unique() {
        for id in 0..=255u8 {
            let t = PacketType::from(id);
            assert_eq!(u8::from(t), id);
            if t.status().is_none() {
                assert_eq!(PacketType::from_name(t.name()), Some(t));
            }
        }
        assert_eq!(PacketType::ALL.len(), 35);
    }

    #[test]
    fn rejected_ids_are_classified() {
        assert_eq!(PacketType::from(1).status(), Some(TypeStatus::Retired));
        assert_eq!(PacketType::from(2).status(), Some(TypeStatus::Retired));
        assert_eq!(PacketType::from(6).status(), Some(TypeStatus::Internal));
        for id in [131, 132, 142, 143, 144, 147] {
            assert_eq!(PacketType::from(id).status(), Some(TypeStatus::NeverSent), "{id}");
        }
        for id in [0, 12, 63, 77, 127, 148, 255] {
            assert_eq!(PacketType::from(id).status(), Some(TypeStatus::Unassigned), "{id}");
        }
        assert_eq!(PacketType::from(146), PacketType::RuntReadTagRtm);
        assert_eq!(PacketType::DcLongCtsTagRtm.name(), "DC_LONGCTS_TAGRTM");
    }

    #[test]
    fn base_header_checks_type_before_version() {
        let err = BaseHeader::new_checked([1u8, 3, 0, 0]).unwrap_err();
        assert_eq!(err, WireError::Type { id: 1, status: TypeStatus::Retired });
        let err = BaseHeader::new_checked([64u8, 5, 0, 0]).unwrap_err();
        assert_eq!(err, WireError::Version { found: 5 });
        let err = BaseHeader::new_checked([64u8, 4, 0]).unwrap_err();
        assert_eq!(err, WireError::Truncated { what: "base header", need: 4, have: 3 });
        let hdr = BaseHeader::new_checked([65u8, 4, 0x0c, 0x80]).unwrap();
        assert_eq!(hdr.packet_type(), PacketType::EagerTagRtm);
        assert_eq!(hdr.flags(), 0x800c);
    }
}
