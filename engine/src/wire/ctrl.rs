//! EOR, RECEIPT and READ_NACK: 16-byte control packets that end or divert
//! an operation (spec tables 4.2 and the RECEIPT and READ_NACK tables).
//!
//! All three are `send_id` at 4, a second id at 8 (EOR and READ_NACK:
//! `recv_id`; RECEIPT: `msg_id`), connid-or-padding at 12.

use super::base::{self, PacketType};
use super::{PktFlags, WireError, check_fixed, get_u16, get_u32, put_u32};

pub(crate) const HEADER_LEN: usize = 16;

mod field {
    pub const SEND_ID: usize = 4;
    /// EOR, READ_NACK: recv_id; RECEIPT: msg_id.
    pub const SECOND_ID: usize = 8;
    pub const CONNID: usize = 12;
}

const _: () = assert!(field::CONNID + 4 == HEADER_LEN);

/// A checked view of an EOR, RECEIPT or READ_NACK packet.
#[derive(Debug, Clone, Copy)]
pub struct CtrlPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CtrlPacket<T> {
    /// Checks base header, that the type is `ptype`, and length.
    pub fn new_checked(buffer: T, ptype: PacketType) -> Result<Self, WireError> {
        debug_assert!(matches!(
            ptype,
            PacketType::Eor | PacketType::Receipt | PacketType::ReadNack
        ));
        check_fixed(buffer.as_ref(), ptype, HEADER_LEN)?;
        Ok(CtrlPacket { buffer })
    }

    /// The flags, unknown bits kept.
    pub fn flags(&self) -> PktFlags {
        PktFlags::from_bits_retain(get_u16(self.buffer.as_ref(), 2))
    }

    /// The sender's send operation.
    pub fn send_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SEND_ID)
    }

    /// EOR and READ_NACK: the receiver's receive operation.
    pub fn recv_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SECOND_ID)
    }

    /// RECEIPT: the message id (the same bytes as `recv_id` elsewhere).
    pub fn msg_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SECOND_ID)
    }

    /// The sender's connid, when CONNID_HDR is set.
    pub fn connid(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.flags().contains(PktFlags::CONNID_HDR).then(|| get_u32(b, field::CONNID))
    }
}

fn parse_ctrl(
    buf: &[u8],
    ptype: PacketType,
) -> Result<(PktFlags, u32, u32, Option<u32>), WireError> {
    let p = CtrlPacket::new_checked(buf, ptype)?;
    Ok((p.flags(), p.send_id(), p.recv_id(), p.connid()))
}

fn emit_ctrl(
    buf: &mut [u8],
    ptype: PacketType,
    flags: PktFlags,
    ids: [u32; 2],
    connid: Option<u32>,
) -> usize {
    let mut flags = flags;
    flags.set(PktFlags::CONNID_HDR, connid.is_some());
    base::emit_base(buf, ptype.id(), flags.bits());
    put_u32(buf, field::SEND_ID, ids[0]);
    put_u32(buf, field::SECOND_ID, ids[1]);
    put_u32(buf, field::CONNID, connid.unwrap_or(0));
    HEADER_LEN
}

/// EOR: the receiver finished reading a long-read message or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EorRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: PktFlags,
    pub send_id: u32,
    pub recv_id: u32,
    pub connid: Option<u32>,
}

/// READ_NACK: the receiver could not register memory for a long-read or
/// runting-read message; the sender falls back to long-CTS (spec 4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadNackRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: PktFlags,
    pub send_id: u32,
    pub recv_id: u32,
    pub connid: Option<u32>,
}

/// RECEIPT: the data of a delivery-complete operation reached its target
/// (spec 4.2). The provider's field is `tx_id`; the spec calls it send_id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReceiptRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: PktFlags,
    pub send_id: u32,
    pub msg_id: u32,
    pub connid: Option<u32>,
}

macro_rules! ctrl_codec {
    ($repr:ident, $ptype:expr, $second:ident) => {
        impl $repr {
            /// Bytes of the packet.
            pub const BUFFER_LEN: usize = HEADER_LEN;

            /// Checks and reads the packet.
            pub fn parse(buf: &[u8]) -> Result<$repr, WireError> {
                let (flags, send_id, $second, connid) = parse_ctrl(buf, $ptype)?;
                Ok($repr { flags, send_id, $second, connid })
            }

            /// Bytes `emit` writes.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }

            /// Writes the packet; returns its length.
            pub fn emit(&self, buf: &mut [u8]) -> usize {
                emit_ctrl(buf, $ptype, self.flags, [self.send_id, self.$second], self.connid)
            }
        }
    };
}

ctrl_codec!(EorRepr, PacketType::Eor, recv_id);
ctrl_codec!(ReadNackRepr, PacketType::ReadNack, recv_id);
ctrl_codec!(ReceiptRepr, PacketType::Receipt, msg_id);
