//! READRSP and ATOMRSP: responses that carry data back to a read or
//! fetch/compare-atomic requester (spec tables 3.11, 3.15).
//!
//! Both are 24 bytes with connid-or-padding at offset 4. READRSP has
//! recv_id at 8 and send_id at 12 (the reverse of the spec's table,
//! interop notes); ATOMRSP has a reserved word at 8 and recv_id at 12.

use super::base::{self, PacketType};
use super::{PktFlags, WireError, check_fixed, get_u16, get_u32, get_u64, put_u32, put_u64};

pub(crate) const HEADER_LEN: usize = 24;

mod field {
    pub const CONNID: usize = 4;
    pub const READRSP_RECV_ID: usize = 8;
    pub const READRSP_SEND_ID: usize = 12;
    pub const ATOMRSP_RESERVED: usize = 8;
    pub const ATOMRSP_RECV_ID: usize = 12;
    pub const DATA_LENGTH: usize = 16;
}

const _: () = assert!(field::DATA_LENGTH + 8 == HEADER_LEN);

/// A checked view of a READRSP or ATOMRSP packet.
#[derive(Debug, Clone, Copy)]
pub struct RspPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RspPacket<T> {
    /// Checks base header, that the type is `ptype` (READRSP or ATOMRSP),
    /// length, and that the data length field equals the data present.
    pub fn new_checked(buffer: T, ptype: PacketType) -> Result<Self, WireError> {
        debug_assert!(matches!(ptype, PacketType::ReadRsp | PacketType::AtomRsp));
        check_fixed(buffer.as_ref(), ptype, HEADER_LEN)?;
        let p = RspPacket { buffer };
        let present = p.payload().len();
        let length = p.data_length();
        if length != present as u64 {
            let what = match ptype {
                PacketType::ReadRsp => "READRSP recv_length",
                _ => "ATOMRSP seg_length",
            };
            return Err(WireError::Length { what, field: length, present });
        }
        Ok(p)
    }

    fn is_readrsp(&self) -> bool {
        self.buffer.as_ref()[0] == PacketType::ReadRsp.id()
    }

    /// The flags, unknown bits kept.
    pub fn flags(&self) -> PktFlags {
        PktFlags::from_bits_retain(get_u16(self.buffer.as_ref(), 2))
    }

    /// The sender's connid, when CONNID_HDR is set.
    pub fn connid(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.flags().contains(PktFlags::CONNID_HDR).then(|| get_u32(b, field::CONNID))
    }

    /// The requester's receive operation.
    pub fn recv_id(&self) -> u32 {
        let at = if self.is_readrsp() { field::READRSP_RECV_ID } else { field::ATOMRSP_RECV_ID };
        get_u32(self.buffer.as_ref(), at)
    }

    /// READRSP: the responder's send operation; ATOMRSP has none.
    pub fn send_id(&self) -> Option<u32> {
        self.is_readrsp().then(|| get_u32(self.buffer.as_ref(), field::READRSP_SEND_ID))
    }

    /// Bytes of data in this packet (READRSP `recv_length`, ATOMRSP
    /// `seg_length`).
    pub fn data_length(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::DATA_LENGTH)
    }

    /// The data.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// A READRSP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadRspRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: PktFlags,
    pub connid: Option<u32>,
    pub recv_id: u32,
    pub send_id: u32,
    /// Bytes of data in this packet (the spec's name).
    pub recv_length: u64,
}

impl ReadRspRepr {
    /// Checks and reads a READRSP packet and its data.
    pub fn parse(buf: &[u8]) -> Result<(ReadRspRepr, &[u8]), WireError> {
        let p = RspPacket::new_checked(buf, PacketType::ReadRsp)?;
        let repr = ReadRspRepr {
            flags: p.flags(),
            connid: p.connid(),
            recv_id: p.recv_id(),
            send_id: p.send_id().unwrap_or_default(),
            recv_length: p.data_length(),
        };
        Ok((repr, &buf[HEADER_LEN..]))
    }

    /// Bytes of header `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; returns where the data goes.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        emit_rsp(buf, PacketType::ReadRsp, self.flags, self.connid, self.recv_length);
        put_u32(buf, field::READRSP_RECV_ID, self.recv_id);
        put_u32(buf, field::READRSP_SEND_ID, self.send_id);
        HEADER_LEN
    }
}

/// An ATOMRSP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomRspRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: PktFlags,
    pub connid: Option<u32>,
    pub recv_id: u32,
    /// Bytes of data in this packet.
    pub seg_length: u64,
}

impl AtomRspRepr {
    /// Checks and reads an ATOMRSP packet and its data.
    pub fn parse(buf: &[u8]) -> Result<(AtomRspRepr, &[u8]), WireError> {
        let p = RspPacket::new_checked(buf, PacketType::AtomRsp)?;
        let repr = AtomRspRepr {
            flags: p.flags(),
            connid: p.connid(),
            recv_id: p.recv_id(),
            seg_length: p.data_length(),
        };
        Ok((repr, &buf[HEADER_LEN..]))
    }

    /// Bytes of header `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header; returns where the data goes.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        emit_rsp(buf, PacketType::AtomRsp, self.flags, self.connid, self.seg_length);
        put_u32(buf, field::ATOMRSP_RESERVED, 0);
        put_u32(buf, field::ATOMRSP_RECV_ID, self.recv_id);
        HEADER_LEN
    }
}

fn emit_rsp(buf: &mut [u8], ptype: PacketType, flags: PktFlags, connid: Option<u32>, len: u64) {
    let mut flags = flags;
    flags.set(PktFlags::CONNID_HDR, connid.is_some());
    base::emit_base(buf, ptype.id(), flags.bits());
    put_u32(buf, field::CONNID, connid.unwrap_or(0));
    put_u64(buf, field::DATA_LENGTH, len);
}
