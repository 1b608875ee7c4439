//! The EFA raw address (spec 1.4): the identity of an endpoint.

use super::{WireError, get_u16, get_u32, put_u16, put_u32};

/// An endpoint's raw address: GID, queue pair number and connection id.
///
/// On the wire it is 32 bytes (spec table 1.5): `gid[16]`, qpn u16, pad u16,
/// connid u32, reserved u64. The reserved word is the provider's list pointer
/// and may hold anything: it is ignored on receive and written as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawAddr {
    /// Device id, in IPv6 format.
    pub gid: [u8; 16],
    /// Queue pair number.
    pub qpn: u16,
    /// Random id chosen when the endpoint opened; tells a restarted process
    /// that reused a QPN from the old one (spec 4.4).
    pub connid: u32,
}

pub(crate) mod field {
    use core::ops::Range;
    pub const GID: Range<usize> = 0..16;
    pub const QPN: usize = 16;
    pub const CONNID: usize = 20;
    /// The bytes that carry meaning; an address header shorter than this
    /// cannot identify its sender.
    pub const MEANINGFUL_LEN: usize = 24;
}

impl RawAddr {
    /// Bytes of the address as the provider lays it out.
    pub const LEN: usize = 32;
    /// Shortest address a peer may send: up to and including connid.
    pub const MIN_LEN: usize = field::MEANINGFUL_LEN;
    /// The `size` current providers put in a REQ raw address header: the
    /// 32-byte address padded so the header (4 + size) is 8-byte aligned.
    /// libfabric: EFA_RDM_REQ_OPT_RAW_ADDR_HDR_SIZE - 4.
    pub const REQ_HDR_SIZE: usize = 36;

    /// The 32-byte wire form.
    pub fn to_bytes(&self) -> [u8; RawAddr::LEN] {
        let mut b = [0u8; RawAddr::LEN];
        self.write(&mut b);
        b
    }

    /// The `size` bytes a REQ raw address header carries (36, as current
    /// providers send).
    pub fn to_req_hdr_bytes(&self) -> [u8; RawAddr::REQ_HDR_SIZE] {
        let mut b = [0u8; RawAddr::REQ_HDR_SIZE];
        self.write(&mut b);
        b
    }

    fn write(&self, b: &mut [u8]) {
        b[field::GID].copy_from_slice(&self.gid);
        put_u16(b, field::QPN, self.qpn);
        put_u32(b, field::CONNID, self.connid);
    }

    /// Reads an address from the first bytes of `b`, which may be longer
    /// than 32 (the format may grow, spec 3.1) but not shorter than 24.
    pub fn from_bytes(b: &[u8]) -> Result<RawAddr, WireError> {
        if b.len() < RawAddr::MIN_LEN {
            return Err(WireError::RawAddrSize { size: b.len() as u64 });
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[field::GID]);
        Ok(RawAddr { gid, qpn: get_u16(b, field::QPN), connid: get_u32(b, field::CONNID) })
    }
}

impl core::fmt::Display for RawAddr {
    /// `gid:qpn:connid`, the GID as eight hex groups like an IPv6 address.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, pair) in self.gid.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        write!(f, "/qpn {}/connid {:#010x}", self.qpn, self.connid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_bytes() {
        let addr = RawAddr {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80],
            qpn: 0x0102,
            connid: 0xdeadbeef,
        };
        let mut want = [0u8; 32];
        want[..16].copy_from_slice(&addr.gid);
        want[16..18].copy_from_slice(&[0x02, 0x01]);
        want[20..24].copy_from_slice(&[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(addr.to_bytes(), want);
        assert_eq!(&addr.to_req_hdr_bytes()[..32], &want);
        assert_eq!(&addr.to_req_hdr_bytes()[32..], &[0; 4]);

        // Pad and reserved bytes are ignored on receive.
        let mut dirty = want;
        dirty[18] = 0xff;
        dirty[24..32].fill(0xaa);
        assert_eq!(RawAddr::from_bytes(&dirty).unwrap(), addr);
        // 24 bytes are enough (the format may shrink to what carries meaning).
        assert_eq!(RawAddr::from_bytes(&want[..24]).unwrap(), addr);
        assert_eq!(RawAddr::from_bytes(&want[..23]), Err(WireError::RawAddrSize { size: 23 }));
    }
}
