//! CTS and CTSDATA: the long-CTS flow control (spec 3.2, tables 3.6, 3.7).

use bitflags::bitflags;

use super::base::{self, PacketType};
use super::{WireError, check_fixed, get_u32, get_u64, put_u32, put_u64};

bitflags! {
    /// CTS flags.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct CtsFlags: u16 {
        /// This CTS answers a LONGCTS_RTR (emulated read). libfabric:
        /// EFA_RDM_CTS_READ_REQ.
        const EMULATED_READ = 0x0080;
        /// Offset 4 carries the sender's connid.
        const CONNID_HDR = base::CONNID_HDR;
    }
}

impl CtsFlags {
    /// Each flag's bit and its name in the spec (3.2; table 1.4).
    pub const SPEC_NAMES: &'static [(u16, &'static str)] = &[
        (CtsFlags::EMULATED_READ.bits(), "CTS_EMULATED_READ"),
        (CtsFlags::CONNID_HDR.bits(), "CONNID_HDR"),
    ];
}

const _: () = assert!(super::names_each_flag_once(CtsFlags::SPEC_NAMES, CtsFlags::all().bits()));

mod cts_field {
    pub const CONNID: usize = 4;
    pub const SEND_ID: usize = 8;
    pub const RECV_ID: usize = 12;
    pub const RECV_LENGTH: usize = 16;
    pub const HEADER_LEN: usize = RECV_LENGTH + 8;
}

const _: () = assert!(cts_field::HEADER_LEN == 24);

/// A checked view of a CTS packet.
#[derive(Debug, Clone, Copy)]
pub struct CtsPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CtsPacket<T> {
    /// Checks base header, type and length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_fixed(buffer.as_ref(), PacketType::Cts, cts_field::HEADER_LEN)?;
        Ok(CtsPacket { buffer })
    }

    /// The flags, unknown bits kept.
    pub fn flags(&self) -> CtsFlags {
        CtsFlags::from_bits_retain(super::get_u16(self.buffer.as_ref(), 2))
    }

    /// The sender's connid, when CONNID_HDR is set.
    pub fn connid(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.flags().contains(CtsFlags::CONNID_HDR).then(|| get_u32(b, cts_field::CONNID))
    }

    /// The sender's send operation (from the LONGCTS REQ).
    pub fn send_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), cts_field::SEND_ID)
    }

    /// The receiver's receive operation, echoed in CTSDATA.
    pub fn recv_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), cts_field::RECV_ID)
    }

    /// Bytes the receiver is ready to take (u64 here, u32 in RTR).
    pub fn recv_length(&self) -> u64 {
        get_u64(self.buffer.as_ref(), cts_field::RECV_LENGTH)
    }
}

/// A CTS packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtsRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: CtsFlags,
    pub connid: Option<u32>,
    pub send_id: u32,
    pub recv_id: u32,
    /// Spec 3.2: must be > 0 for the transfer to move; the endpoint checks.
    pub recv_length: u64,
}

impl CtsRepr {
    /// Bytes of a CTS packet.
    pub const BUFFER_LEN: usize = cts_field::HEADER_LEN;

    /// Checks and reads a CTS packet.
    pub fn parse(buf: &[u8]) -> Result<CtsRepr, WireError> {
        let p = CtsPacket::new_checked(buf)?;
        Ok(CtsRepr {
            flags: p.flags(),
            connid: p.connid(),
            send_id: p.send_id(),
            recv_id: p.recv_id(),
            recv_length: p.recv_length(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        Self::BUFFER_LEN
    }

    /// Writes the packet; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let mut flags = self.flags;
        flags.set(CtsFlags::CONNID_HDR, self.connid.is_some());
        base::emit_base(buf, PacketType::Cts.id(), flags.bits());
        put_u32(buf, cts_field::CONNID, self.connid.unwrap_or(0));
        put_u32(buf, cts_field::SEND_ID, self.send_id);
        put_u32(buf, cts_field::RECV_ID, self.recv_id);
        put_u64(buf, cts_field::RECV_LENGTH, self.recv_length);
        Self::BUFFER_LEN
    }
}

mod data_field {
    pub const RECV_ID: usize = 4;
    pub const SEG_LENGTH: usize = 8;
    pub const SEG_OFFSET: usize = 16;
    pub const HEADER_LEN: usize = SEG_OFFSET + 8;
    /// Optional: connid u32 then 4 bytes of padding.
    pub const CONNID: usize = HEADER_LEN;
    pub const CONNID_HEADER_LEN: usize = CONNID + 8;
}

const _: () = assert!(data_field::HEADER_LEN == 24 && data_field::CONNID_HEADER_LEN == 32);

/// A checked view of a CTSDATA packet: header, optional connid, data.
#[derive(Debug, Clone, Copy)]
pub struct CtsDataPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CtsDataPacket<T> {
    /// Checks base header, type, length, and that `seg_length` equals the
    /// data present.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let buf = buffer.as_ref();
        let flags = check_fixed(buf, PacketType::CtsData, data_field::HEADER_LEN)?;
        let p = CtsDataPacket { buffer };
        let header_len = p.header_len_for(flags);
        let buf = p.buffer.as_ref();
        if buf.len() < header_len {
            return Err(WireError::Truncated {
                what: "CTSDATA connid header",
                need: header_len as u64,
                have: buf.len(),
            });
        }
        let present = buf.len() - header_len;
        let seg_length = p.seg_length();
        if seg_length != present as u64 {
            return Err(WireError::Length {
                what: "CTSDATA seg_length",
                field: seg_length,
                present,
            });
        }
        Ok(p)
    }

    fn header_len_for(&self, flags: u16) -> usize {
        if flags & base::CONNID_HDR != 0 {
            data_field::CONNID_HEADER_LEN
        } else {
            data_field::HEADER_LEN
        }
    }

    /// The flags, unknown bits kept.
    pub fn flags(&self) -> super::PktFlags {
        super::PktFlags::from_bits_retain(super::get_u16(self.buffer.as_ref(), 2))
    }

    /// The receive operation (from the CTS).
    pub fn recv_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), data_field::RECV_ID)
    }

    /// Bytes of data in this packet.
    pub fn seg_length(&self) -> u64 {
        get_u64(self.buffer.as_ref(), data_field::SEG_LENGTH)
    }

    /// Where the data goes in the message.
    pub fn seg_offset(&self) -> u64 {
        get_u64(self.buffer.as_ref(), data_field::SEG_OFFSET)
    }

    /// The sender's connid, when CONNID_HDR is set.
    pub fn connid(&self) -> Option<u32> {
        self.flags()
            .contains(super::PktFlags::CONNID_HDR)
            .then(|| get_u32(self.buffer.as_ref(), data_field::CONNID))
    }

    /// Bytes of header: 24, or 32 with connid.
    pub fn header_len(&self) -> usize {
        self.header_len_for(self.flags().bits())
    }

    /// The data.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

/// A CTSDATA header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtsDataRepr {
    /// Flags; CONNID_HDR follows `connid` on emit.
    pub flags: super::PktFlags,
    pub recv_id: u32,
    pub seg_length: u64,
    pub seg_offset: u64,
    pub connid: Option<u32>,
}

impl CtsDataRepr {
    /// Checks and reads a CTSDATA packet and its data.
    pub fn parse(buf: &[u8]) -> Result<(CtsDataRepr, &[u8]), WireError> {
        let p = CtsDataPacket::new_checked(buf)?;
        let repr = CtsDataRepr {
            flags: p.flags(),
            recv_id: p.recv_id(),
            seg_length: p.seg_length(),
            seg_offset: p.seg_offset(),
            connid: p.connid(),
        };
        Ok((repr, &buf[p.header_len()..]))
    }

    /// Bytes of header `emit` writes: 24, or 32 with connid.
    pub const fn buffer_len(&self) -> usize {
        if self.connid.is_some() { data_field::CONNID_HEADER_LEN } else { data_field::HEADER_LEN }
    }

    /// Writes the header; returns where the data goes.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let mut flags = self.flags;
        flags.set(super::PktFlags::CONNID_HDR, self.connid.is_some());
        base::emit_base(buf, PacketType::CtsData.id(), flags.bits());
        put_u32(buf, data_field::RECV_ID, self.recv_id);
        put_u64(buf, data_field::SEG_LENGTH, self.seg_length);
        put_u64(buf, data_field::SEG_OFFSET, self.seg_offset);
        if let Some(connid) = self.connid {
            put_u32(buf, data_field::CONNID, connid);
            put_u32(buf, data_field::CONNID + 4, 0);
        }
        self.buffer_len()
    }
}
