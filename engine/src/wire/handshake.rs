//! HANDSHAKE (spec 2.1, table 2.2): capabilities an endpoint sends back
//! on the first packet from a peer.
//!
//! Layout: base header, `nextra_p3` u32, `extra_info[nextra_p3 - 3]` u64,
//! then, each present only if its flag is set and always in this order,
//! 8-byte optional fields: connid (u32 + pad, CONNID_HDR), host_id (u64),
//! device_version (u32 + reserved), user receive QP (qpn u32, qkey u32).

use bitflags::bitflags;

use super::base::{self, PacketType};
use super::list::{WireItem, WireList};
use super::{WireError, check_fixed, get_u16, get_u32, get_u64, put_u32};

bitflags! {
    /// HANDSHAKE flags (spec table 2.3); each announces an optional field.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct HandshakeFlags: u16 {
        /// `host_id` is present.
        const HOST_ID_HDR = 0x0001;
        /// `device_version` is present.
        const DEVICE_VERSION_HDR = 0x0002;
        /// The user receive QP's `qpn` and `qkey` are present (spec 4.8).
        const USER_RECV_QP_HDR = 0x0004;
        /// `connid` is present.
        const CONNID_HDR = base::CONNID_HDR;
    }
}

impl HandshakeFlags {
    /// The flags that announce optional fields; `emit` derives them.
    pub const OPT_FIELDS: HandshakeFlags = HandshakeFlags::all();

    /// Each flag's bit and its name in spec table 2.3.
    pub const SPEC_NAMES: &'static [(u16, &'static str)] = &[
        (HandshakeFlags::HOST_ID_HDR.bits(), "HANDSHAKE_HOST_ID_HDR"),
        (HandshakeFlags::DEVICE_VERSION_HDR.bits(), "HANDSHAKE_DEVICE_VERSION_HDR"),
        (HandshakeFlags::USER_RECV_QP_HDR.bits(), "HANDSHAKE_USER_RECV_QP_HDR"),
        (HandshakeFlags::CONNID_HDR.bits(), "CONNID_HDR"),
    ];
}

const _: () =
    assert!(super::names_each_flag_once(HandshakeFlags::SPEC_NAMES, HandshakeFlags::all().bits()));

/// Extra feature and request bits of `extra_info[0]` (spec table 2.1; the
/// spec's text says "5" of them, the table and providers use 0-7, and newer
/// providers add 8 and 9). Unknown bits are ignored on receive.
pub mod extra {
    /// Feature 0: RDMA-read based transfer (long-read, direct read, spec 4.1).
    pub const RDMA_READ: u64 = 1 << 0;
    /// Feature 1: delivery complete (spec 4.2).
    pub const DELIVERY_COMPLETE: u64 = 1 << 1;
    /// Request 2: keep the header length constant (spec 4.3, deprecated).
    pub const CONSTANT_HEADER_LENGTH: u64 = 1 << 2;
    /// Request 3: put the sender's connid in packet headers (spec 4.4).
    pub const CONNID_HEADER: u64 = 1 << 3;
    /// Feature 4: runting-read messages (spec 4.5).
    pub const RUNTING_READ: u64 = 1 << 4;
    /// Feature 5: RDMA-write based transfer (direct write, spec 4.6).
    pub const RDMA_WRITE: u64 = 1 << 5;
    /// Feature 6: READ_NACK packets (spec 4.7).
    pub const READ_NACK: u64 = 1 << 6;
    /// Feature and request 7: user receive QP (spec 4.8).
    pub const USER_RECV_QP: u64 = 1 << 7;
    /// Feature 8 (newer providers): unsolicited write receive.
    pub const UNSOLICITED_WRITE_RECV: u64 = 1 << 8;
    /// Feature 9 (newer providers): peer error reporting.
    pub const PEER_ERROR: u64 = 1 << 9;
    /// Ids of the bits above, for tools that print them.
    pub const NAMES: [(u64, &str); 10] = [
        (RDMA_READ, "rdma_read"),
        (DELIVERY_COMPLETE, "delivery_complete"),
        (CONSTANT_HEADER_LENGTH, "constant_header_length"),
        (CONNID_HEADER, "connid_header"),
        (RUNTING_READ, "runting_read"),
        (RDMA_WRITE, "rdma_write"),
        (READ_NACK, "read_nack"),
        (USER_RECV_QP, "user_recv_qp"),
        (UNSOLICITED_WRITE_RECV, "unsolicited_write_recv"),
        (PEER_ERROR, "peer_error"),
    ];
}

/// The `extra_info[]` words.
pub type ExtraInfo<'a> = WireList<'a, u64>;

mod field {
    pub const NEXTRA_P3: usize = 4;
    pub const EXTRA_INFO: usize = 8;
    /// Each optional field takes 8 bytes.
    pub const OPT_LEN: usize = 8;
}

/// `nextra_p3` counts extra_info words plus 3 (spec 2.1: once `maxproto`).
const NEXTRA_BIAS: u32 = 3;

/// Where each optional field lies in a checked HANDSHAKE.
#[derive(Debug, Clone, Copy, Default)]
struct OptAt {
    extra_end: usize,
    connid: Option<usize>,
    host_id: Option<usize>,
    device_version: Option<usize>,
    user_recv_qp: Option<usize>,
}

/// A checked view of a HANDSHAKE packet.
#[derive(Debug, Clone, Copy)]
pub struct HandshakePacket<T: AsRef<[u8]>> {
    buffer: T,
    at: OptAt,
}

impl<T: AsRef<[u8]>> HandshakePacket<T> {
    /// Checks base header, `nextra_p3` >= 3, and that `extra_info[]` and
    /// every flagged optional field lie within the packet. Unknown flags
    /// and trailing bytes (fields of newer providers) are ignored.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let buf = buffer.as_ref();
        let flags = HandshakeFlags::from_bits_retain(check_fixed(
            buf,
            PacketType::Handshake,
            field::EXTRA_INFO,
        )?);
        let nextra_p3 = get_u32(buf, field::NEXTRA_P3);
        if nextra_p3 < NEXTRA_BIAS {
            return Err(WireError::NextraP3 { nextra_p3 });
        }
        let have = buf.len();
        let mut end = field::EXTRA_INFO as u64 + (nextra_p3 - NEXTRA_BIAS) as u64 * 8;
        if end > have as u64 {
            return Err(WireError::Truncated { what: "HANDSHAKE extra_info[]", need: end, have });
        }
        let mut at = OptAt { extra_end: end as usize, ..OptAt::default() };
        // Spec 2.1.1: present fields keep the table's order, absent ones
        // take no space.
        let order = [
            (HandshakeFlags::CONNID_HDR, &mut at.connid, "HANDSHAKE connid"),
            (HandshakeFlags::HOST_ID_HDR, &mut at.host_id, "HANDSHAKE host_id"),
            (
                HandshakeFlags::DEVICE_VERSION_HDR,
                &mut at.device_version,
                "HANDSHAKE device_version",
            ),
            (HandshakeFlags::USER_RECV_QP_HDR, &mut at.user_recv_qp, "HANDSHAKE qpn/qkey"),
        ];
        for (flag, slot, what) in order {
            if flags.contains(flag) {
                *slot = Some(end as usize);
                end += field::OPT_LEN as u64;
                if end > have as u64 {
                    return Err(WireError::Truncated { what, need: end, have });
                }
            }
        }
        Ok(HandshakePacket { buffer, at })
    }

    /// The flags, unknown bits kept.
    pub fn flags(&self) -> HandshakeFlags {
        HandshakeFlags::from_bits_retain(get_u16(self.buffer.as_ref(), 2))
    }

    /// Number of extra_info words plus 3.
    pub fn nextra_p3(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::NEXTRA_P3)
    }

    /// The `extra_info[]` words.
    pub fn extra_info(&self) -> ExtraInfo<'_> {
        WireList::Wire(&self.buffer.as_ref()[field::EXTRA_INFO..self.at.extra_end])
    }

    /// The sender's connid.
    pub fn connid(&self) -> Option<u32> {
        self.at.connid.map(|o| get_u32(self.buffer.as_ref(), o))
    }

    /// The sender's host id.
    pub fn host_id(&self) -> Option<u64> {
        self.at.host_id.map(|o| get_u64(self.buffer.as_ref(), o))
    }

    /// The sender's EFA device version.
    pub fn device_version(&self) -> Option<u32> {
        self.at.device_version.map(|o| get_u32(self.buffer.as_ref(), o))
    }

    /// The sender's user receive QP (qpn, qkey).
    pub fn user_recv_qp(&self) -> Option<UserRecvQp> {
        let b = self.buffer.as_ref();
        self.at.user_recv_qp.map(|o| UserRecvQp { qpn: get_u32(b, o), qkey: get_u32(b, o + 4) })
    }
}

/// The user receive QP a HANDSHAKE may announce (spec 4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserRecvQp {
    pub qpn: u32,
    pub qkey: u32,
}

/// A HANDSHAKE packet.
///
/// Interop (notes): providers send `nextra_p3` = 4 and always set
/// CONNID_HDR and DEVICE_VERSION_HDR (some receivers read device_version
/// without checking its flag); current receivers copy at most 4 words, so
/// send no more than 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HandshakeRepr<'a> {
    /// Flags; the optional-field bits follow the options on emit.
    pub flags: HandshakeFlags,
    pub extra_info: ExtraInfo<'a>,
    pub connid: Option<u32>,
    pub host_id: Option<u64>,
    pub device_version: Option<u32>,
    pub user_recv_qp: Option<UserRecvQp>,
}

impl<'a> HandshakeRepr<'a> {
    /// Checks and reads a HANDSHAKE packet.
    pub fn parse(buf: &'a [u8]) -> Result<HandshakeRepr<'a>, WireError> {
        let p = HandshakePacket::new_checked(buf)?;
        Ok(HandshakeRepr {
            flags: p.flags(),
            extra_info: WireList::Wire(&buf[field::EXTRA_INFO..p.at.extra_end]),
            connid: p.connid(),
            host_id: p.host_id(),
            device_version: p.device_version(),
            user_recv_qp: p.user_recv_qp(),
        })
    }

    /// `extra_info[0]`, the feature/request bits of ids 0-63 (0 if absent).
    pub fn features(&self) -> u64 {
        self.extra_info.get(0).unwrap_or(0)
    }

    /// `nextra_p3` as emitted.
    pub fn nextra_p3(&self) -> u32 {
        self.extra_info.len() as u32 + NEXTRA_BIAS
    }

    /// The flags as emitted: optional-field bits follow the options.
    pub fn wire_flags(&self) -> HandshakeFlags {
        let mut flags = self.flags.difference(HandshakeFlags::OPT_FIELDS);
        flags.set(HandshakeFlags::CONNID_HDR, self.connid.is_some());
        flags.set(HandshakeFlags::HOST_ID_HDR, self.host_id.is_some());
        flags.set(HandshakeFlags::DEVICE_VERSION_HDR, self.device_version.is_some());
        flags.set(HandshakeFlags::USER_RECV_QP_HDR, self.user_recv_qp.is_some());
        flags
    }

    /// Bytes of the packet.
    pub fn buffer_len(&self) -> usize {
        let opts = [
            self.connid.is_some(),
            self.host_id.is_some(),
            self.device_version.is_some(),
            self.user_recv_qp.is_some(),
        ];
        field::EXTRA_INFO
            + self.extra_info.wire_len()
            + field::OPT_LEN * opts.iter().filter(|p| **p).count()
    }

    /// Writes the packet, padding as zero; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        base::emit_base(buf, PacketType::Handshake.id(), self.wire_flags().bits());
        put_u32(buf, field::NEXTRA_P3, self.nextra_p3());
        let mut at = field::EXTRA_INFO;
        let len = self.extra_info.wire_len();
        self.extra_info.emit(&mut buf[at..at + len]);
        at += len;
        let mut put_opt = |word: Option<[u32; 2]>| {
            if let Some([lo, hi]) = word {
                put_u32(buf, at, lo);
                put_u32(buf, at + 4, hi);
                at += field::OPT_LEN;
            }
        };
        put_opt(self.connid.map(|c| [c, 0]));
        put_opt(self.host_id.map(|h| [h as u32, (h >> 32) as u32]));
        put_opt(self.device_version.map(|v| [v, 0]));
        put_opt(self.user_recv_qp.map(|q| [q.qpn, q.qkey]));
        at
    }
}

const _: () = assert!(<u64 as WireItem>::LEN == field::OPT_LEN);
