//! The udp device's datagram format: a fixed transport header (sessions,
//! sequence numbers and piggybacked acknowledgements, after the RAMCloud
//! RPC transport), then, for one-sided operations, the RDMAP header of the
//! message (RFC 5040: Write, Read Request, Read Response, Terminate), then
//! the payload. Little-endian throughout, as RAMCloud's header is.
//!
//! ```text
//!  0      1      2      3      4              8              12
//! +------+------+------+------+--------------+--------------+
//! | ver  | type | flags| rsvd | src_connid   | dst_connid   |
//! +------+------+------+------+--------------+--------------+
//! 12             16             20             24
//! +--------------+--------------+--------------+-----------------------------+
//! | seq          | base         | ack          | staging vector (64 bits)    |
//! +--------------+--------------+--------------+-----------------------------+
//! 32             36      38      40
//! +--------------+-------+-------+
//! | credits      |src_qpn| check |
//! +--------------+-------+-------+
//! ```
//!
//! A Send flagged `IMM` carries immediate data: 8 more bytes of header
//! ([`SendImmHdr`]: the 32-bit value, then 4 reserved zero bytes, whole
//! 64-bit words as the check reads them) before its payload, covered by
//! the check. A Send without it has no RDMAP header, byte for byte what
//! the device sent before immediate data on Sends existed, so peers of
//! either kind meet. The flag, like the type, says how long the headers
//! are, so both are read before the check.
//!
//! * `seq`: the packet's number in the sender's session to this peer, for
//!   the sequenced types (Send, Write, Read Request, Read Response).
//! * `base`: the sender's oldest unacknowledged number: the receiver need
//!   not wait for anything below it (what was refused by a Terminate is
//!   never resent), SCTP's forward point.
//! * `ack`, `staging`: what the sender received from the peer, RAMCloud's
//!   `firstMissingFrag` and `stagingVector` (bit i: `ack + 1 + i`
//!   arrived), on every packet (flag `ACK`), so that traffic in both
//!   directions needs no acknowledgement of its own.
//! * `credits`: receive buffers the sender has posted and free.
//! * `src_qpn`: the port of the sender's device (its QPN), where answers
//!   go: a datagram may leave by another socket of the device, one
//!   connected to the peer (the kernel sends on a connected socket without
//!   a route lookup per datagram), whose port is not the device's.
//! * `check`: the Internet checksum (RFC 1071: the ones' complement of the
//!   ones' complement sum of 16-bit words, here little-endian) of the
//!   transport header, the RDMAP header after it, and the datagram's
//!   length in bytes. SRD's CRC drops a damaged packet, which is then
//!   resent; this does the same for what the device itself acts on, so
//!   that a flipped bit cannot end a session (a connid that looks like a
//!   restarted peer's), forge a control packet (Ack, Rnr, Terminate, Bad
//!   Session) or aim a Write or Read elsewhere, and a datagram cut short
//!   fails its length. It detects every single-bit error, every error
//!   within one 16-bit word (but 0x0000 for 0xffff) and every change of
//!   length (a datagram is shorter than 65,535 bytes); of other damage,
//!   one pattern in 65,536 passes. The payload is not covered: that would
//!   read every byte once more, a cost that grows with the packet; a
//!   Send's payload is an EFA packet that its endpoint checks again; and
//!   on a network, UDP's checksum (the same sum, which the kernel
//!   verifies) covers the whole datagram already. The check is against
//!   damage, not forgery: anyone can compute it.

/// Bytes of the transport header.
pub(crate) const HDR_LEN: usize = 40;
/// The version this device speaks: 2 has the header check (1 had two
/// reserved bytes there).
pub(crate) const VERSION: u8 = 2;
/// Where the check is.
const CHECK: std::ops::Range<usize> = 38..40;

/// What a datagram is. The RDMA messages take their RDMAP opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Type {
    /// RDMAP RDMA Write: a fragment of one, [`WriteHdr`] then data.
    Write = 0,
    /// RDMAP RDMA Read Request: [`ReadReqHdr`].
    ReadReq = 1,
    /// RDMAP RDMA Read Response: [`ReadRespHdr`] then data.
    ReadResp = 2,
    /// RDMAP Send: a packet for a posted receive buffer.
    Send = 3,
    /// RDMAP Terminate: a sequenced packet refused ([`TermHdr`]).
    Terminate = 7,
    /// An acknowledgement alone (RAMCloud's PT_ACK).
    Ack = 8,
    /// Receiver not ready: no buffer for a sequenced packet; resend later
    /// ([`RnrHdr`]).
    Rnr = 9,
    /// The packet named a session (our connid) that is not ours: we
    /// restarted (RAMCloud's PT_BAD_SESSION).
    BadSession = 10,
}

impl Type {
    fn from_u8(v: u8) -> Option<Type> {
        Some(match v {
            0 => Type::Write,
            1 => Type::ReadReq,
            2 => Type::ReadResp,
            3 => Type::Send,
            7 => Type::Terminate,
            8 => Type::Ack,
            9 => Type::Rnr,
            10 => Type::BadSession,
            _ => return None,
        })
    }

    /// Whether the type is numbered, acknowledged and resent until it is.
    pub(crate) fn sequenced(self) -> bool {
        matches!(self, Type::Write | Type::ReadReq | Type::ReadResp | Type::Send)
    }

    /// Bytes of its RDMAP header, after the transport header, with header
    /// flags `fl`: a Send's depends on whether it carries immediate data.
    #[inline]
    pub(crate) fn ext_len(self, fl: u8) -> usize {
        let fixed = match self {
            Type::Write => WriteHdr::LEN,
            Type::ReadReq => ReadReqHdr::LEN,
            Type::ReadResp => ReadRespHdr::LEN,
            Type::Terminate => TermHdr::LEN,
            Type::Rnr => RnrHdr::LEN,
            Type::Send | Type::Ack | Type::BadSession => 0,
        };
        // Without a branch: a table lookup and an add, on every datagram.
        let imm = (self == Type::Send) & (fl & flags::IMM != 0);
        fixed + usize::from(imm) * SendImmHdr::LEN
    }
}

/// Header flags.
pub(crate) mod flags {
    /// `ack` and `staging` are meaningful.
    pub const ACK: u8 = 1 << 0;
    /// The sender wants an acknowledgement now (RAMCloud's requestAck).
    pub const REQUEST_ACK: u8 = 1 << 1;
    /// Drop on arrival: scripted loss for tests (RAMCloud's pleaseDrop).
    pub const PLEASE_DROP: u8 = 1 << 2;
    /// A Write that carries immediate data (its last fragment), or a Send
    /// that does ([`super::SendImmHdr`] after the transport header).
    pub const IMM: u8 = 1 << 3;
    /// A Read Response that carries no data but says the region read was
    /// deregistered at its source: the read fails, the rest never comes.
    pub const REVOKED: u8 = 1 << 4;
    pub const KNOWN: u8 = ACK | REQUEST_ACK | PLEASE_DROP | IMM | REVOKED;
}

/// Why a datagram was dropped unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HdrError {
    #[error("shorter than its headers")]
    Truncated,
    #[error("unknown version")]
    Version,
    #[error("unknown type")]
    Type,
    #[error("unknown flags or nonzero reserved bits")]
    Reserved,
    #[error("a field out of range")]
    Field,
    /// Damaged on the way, or cut short.
    #[error("headers fail their checksum")]
    Checksum,
}

/// The transport header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hdr {
    pub ty: Type,
    pub flags: u8,
    pub src_connid: u32,
    pub dst_connid: u32,
    pub seq: u32,
    pub base: u32,
    pub ack: u32,
    pub staging: u64,
    pub credits: u32,
    /// The sending device's port; never 0.
    pub src_qpn: u16,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

impl Hdr {
    /// Parses the transport header at the front of datagram `b`, and
    /// checks that `b` holds the type's RDMAP header too and that both
    /// (and `b`'s length) pass their check.
    pub(crate) fn parse(b: &[u8]) -> Result<Hdr, HdrError> {
        if b.len() < HDR_LEN {
            return Err(HdrError::Truncated);
        }
        if b[0] != VERSION {
            return Err(HdrError::Version);
        }
        let ty = Type::from_u8(b[1]).ok_or(HdrError::Type)?;
        let hdrs = HDR_LEN + ty.ext_len(b[2]);
        if b.len() < hdrs {
            return Err(HdrError::Truncated);
        }
        if sum(&b[..hdrs], b.len()) != 0xffff {
            return Err(HdrError::Checksum);
        }
        let flags = b[2];
        if flags & !flags::KNOWN != 0 || b[3] != 0 {
            return Err(HdrError::Reserved);
        }
        let src_qpn = u16_at(b, 36);
        if src_qpn == 0 {
            return Err(HdrError::Field);
        }
        Ok(Hdr {
            ty,
            flags,
            src_connid: u32_at(b, 4),
            dst_connid: u32_at(b, 8),
            seq: u32_at(b, 12),
            base: u32_at(b, 16),
            ack: u32_at(b, 20),
            staging: u64_at(b, 24),
            credits: u32_at(b, 32),
            src_qpn,
        })
    }

    /// Writes the header into the first [`HDR_LEN`] bytes of `b`, but for
    /// its check: [`seal`] it once the RDMAP header is written too.
    pub(crate) fn emit(&self, b: &mut [u8]) {
        b[0] = VERSION;
        b[1] = self.ty as u8;
        b[2] = self.flags;
        b[3] = 0;
        put_u32(b, 4, self.src_connid);
        put_u32(b, 8, self.dst_connid);
        put_u32(b, 12, self.seq);
        put_u32(b, 16, self.base);
        put_u32(b, 20, self.ack);
        put_u64(b, 24, self.staging);
        put_u32(b, 32, self.credits);
        b[36..38].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[CHECK].fill(0);
    }
}

/// The ones' complement sum of `hdrs` (the transport header, then whole
/// 64-bit words) and `len`, folded to 16 bits. Read as 64-bit little-endian
/// words, four 16-bit ones at a time: the sum is the same modulo 2^16 - 1,
/// since 2^16 is 1 there; the words' carries gather above bit 64 and are
/// added back at the end.
#[inline]
fn sum(hdrs: &[u8], len: usize) -> u16 {
    let word = |w: &[u8]| u128::from(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    let (head, ext) = hdrs.split_at(HDR_LEN);
    let mut acc = len as u128;
    // The transport header's five words, unrolled; then the RDMAP header.
    for w in head.chunks_exact(8) {
        acc += word(w);
    }
    for w in ext.chunks_exact(8) {
        acc += word(w);
    }
    let (s, carry) = (acc as u64).overflowing_add((acc >> 64) as u64);
    let acc = s + u64::from(carry);
    let (s, carry) = (acc as u32).overflowing_add((acc >> 32) as u32);
    let acc = s + u32::from(carry);
    let (s, carry) = (acc as u16).overflowing_add((acc >> 16) as u16);
    s + u16::from(carry)
}

/// Writes the check of a datagram of `len` bytes whose headers, transport
/// and RDMAP, are `hdrs`. A receiver's sum over them, the check included,
/// is then 0xffff.
#[inline]
pub(crate) fn seal(hdrs: &mut [u8], len: usize) {
    hdrs[CHECK].fill(0);
    let check = !sum(hdrs, len);
    hdrs[CHECK].copy_from_slice(&check.to_le_bytes());
}

// Every header is whole 64-bit words, as the sum reads them.
const _: () = {
    let lens = [
        HDR_LEN,
        WriteHdr::LEN,
        ReadReqHdr::LEN,
        ReadRespHdr::LEN,
        TermHdr::LEN,
        RnrHdr::LEN,
        SendImmHdr::LEN,
    ];
    let mut i = 0;
    while i < lens.len() {
        assert!(lens[i].is_multiple_of(8));
        i += 1;
    }
};

/// RDMA Write fragment: the whole message's target (every fragment is
/// checked against all of it, so a write lands whole or not at all), and
/// where in it this fragment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteHdr {
    /// The target region's key (RDMAP's STag).
    pub stag: u64,
    /// The target address of the message's byte 0 (its tagged offset).
    pub msg_to: u64,
    pub msg_len: u64,
    /// This fragment's offset in the message.
    pub frag_off: u64,
    /// Immediate data ([`flags::IMM`]).
    pub imm: u32,
}

impl WriteHdr {
    pub(crate) const LEN: usize = 40;

    pub(crate) fn parse(b: &[u8]) -> Result<WriteHdr, HdrError> {
        let e = b.get(HDR_LEN..HDR_LEN + Self::LEN).ok_or(HdrError::Truncated)?;
        if u32_at(e, 36) != 0 {
            return Err(HdrError::Reserved);
        }
        let h = WriteHdr {
            stag: u64_at(e, 0),
            msg_to: u64_at(e, 8),
            msg_len: u64_at(e, 16),
            frag_off: u64_at(e, 24),
            imm: u32_at(e, 32),
        };
        let data = (b.len() - HDR_LEN - Self::LEN) as u64;
        let fits = h.frag_off.checked_add(data).is_some_and(|end| end <= h.msg_len);
        if !fits {
            return Err(HdrError::Field);
        }
        Ok(h)
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        let e = &mut b[HDR_LEN..HDR_LEN + Self::LEN];
        put_u64(e, 0, self.stag);
        put_u64(e, 8, self.msg_to);
        put_u64(e, 16, self.msg_len);
        put_u64(e, 24, self.frag_off);
        put_u32(e, 32, self.imm);
        put_u32(e, 36, 0);
    }
}

/// A Send's immediate data ([`flags::IMM`]), passed to the receiver's
/// completion as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendImmHdr {
    pub imm: u32,
}

impl SendImmHdr {
    pub(crate) const LEN: usize = 8;

    pub(crate) fn parse(b: &[u8]) -> Result<SendImmHdr, HdrError> {
        Ok(SendImmHdr { imm: parse_word(b)? })
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        emit_word(b, self.imm);
    }
}

/// The value of an 8-byte RDMAP header that is one 32-bit value and 4
/// reserved zero bytes ([`SendImmHdr`], [`RnrHdr`]).
fn parse_word(b: &[u8]) -> Result<u32, HdrError> {
    let e = b.get(HDR_LEN..HDR_LEN + 8).ok_or(HdrError::Truncated)?;
    if u32_at(e, 4) != 0 {
        return Err(HdrError::Reserved);
    }
    Ok(u32_at(e, 0))
}

/// Writes [`parse_word`]'s header.
fn emit_word(b: &mut [u8], v: u32) {
    let e = &mut b[HDR_LEN..HDR_LEN + 8];
    put_u32(e, 0, v);
    put_u32(e, 4, 0);
}

/// RDMA Read Request (RFC 5040 4.4, with 64-bit STags): the data sink is
/// the requester's operation, the source the target's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadReqHdr {
    /// The requester's name for the read, copied into every response.
    pub sink_stag: u64,
    /// RDMARDSZ.
    pub size: u64,
    pub src_stag: u64,
    pub src_to: u64,
}

impl ReadReqHdr {
    pub(crate) const LEN: usize = 32;

    pub(crate) fn parse(b: &[u8]) -> Result<ReadReqHdr, HdrError> {
        let e = b.get(HDR_LEN..HDR_LEN + Self::LEN).ok_or(HdrError::Truncated)?;
        Ok(ReadReqHdr {
            sink_stag: u64_at(e, 0),
            size: u64_at(e, 8),
            src_stag: u64_at(e, 16),
            src_to: u64_at(e, 24),
        })
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        let e = &mut b[HDR_LEN..HDR_LEN + Self::LEN];
        put_u64(e, 0, self.sink_stag);
        put_u64(e, 8, self.size);
        put_u64(e, 16, self.src_stag);
        put_u64(e, 24, self.src_to);
    }
}

/// RDMA Read Response fragment: which read, and where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadRespHdr {
    pub sink_stag: u64,
    /// Offset of this fragment in the read (the sink's tagged offset).
    pub sink_to: u64,
}

impl ReadRespHdr {
    pub(crate) const LEN: usize = 16;

    pub(crate) fn parse(b: &[u8]) -> Result<ReadRespHdr, HdrError> {
        let e = b.get(HDR_LEN..HDR_LEN + Self::LEN).ok_or(HdrError::Truncated)?;
        Ok(ReadRespHdr { sink_stag: u64_at(e, 0), sink_to: u64_at(e, 8) })
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        let e = &mut b[HDR_LEN..HDR_LEN + Self::LEN];
        put_u64(e, 0, self.sink_stag);
        put_u64(e, 8, self.sink_to);
    }
}

/// RFC 5040's Terminate Control values this device sends: layer RDMA
/// (0), error type Remote Protection Error (1), and the error code.
pub(crate) mod term {
    pub const INVALID_STAG: u8 = 0x00;
    pub const BASE_OR_BOUNDS: u8 = 0x01;
    pub const ACCESS_RIGHTS: u8 = 0x02;
    /// Layer 0 (RDMA), error type 1 (Remote Protection Error).
    pub const LAYER_ETYPE: u8 = 0x01;
}

/// Terminate: the sequenced packet `seq` was refused for `code`. It was
/// not taken, and its sender resends it no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TermHdr {
    pub seq: u32,
    /// Terminate Control's layer and error type (4 bits each).
    pub layer_etype: u8,
    pub code: u8,
}

impl TermHdr {
    pub(crate) const LEN: usize = 8;

    pub(crate) fn parse(b: &[u8]) -> Result<TermHdr, HdrError> {
        let e = b.get(HDR_LEN..HDR_LEN + Self::LEN).ok_or(HdrError::Truncated)?;
        if e[6] != 0 || e[7] != 0 {
            return Err(HdrError::Reserved);
        }
        Ok(TermHdr { seq: u32_at(e, 0), layer_etype: e[4], code: e[5] })
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        let e = &mut b[HDR_LEN..HDR_LEN + Self::LEN];
        put_u32(e, 0, self.seq);
        e[4] = self.layer_etype;
        e[5] = self.code;
        e[6] = 0;
        e[7] = 0;
    }
}

/// Receiver not ready for sequenced packet `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RnrHdr {
    pub seq: u32,
}

impl RnrHdr {
    pub(crate) const LEN: usize = 8;

    pub(crate) fn parse(b: &[u8]) -> Result<RnrHdr, HdrError> {
        Ok(RnrHdr { seq: parse_word(b)? })
    }

    pub(crate) fn emit(&self, b: &mut [u8]) {
        emit_word(b, self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of type `ty`, flagged IMM but for a Send, whose headers
    /// the flag lengthens ([`imm_send`] has it).
    fn hdr(ty: Type) -> Hdr {
        let imm = if ty == Type::Send { 0 } else { flags::IMM };
        Hdr {
            ty,
            flags: flags::ACK | imm,
            src_connid: 0x0403_0201,
            dst_connid: 0x0807_0605,
            seq: 0x0c0b_0a09,
            base: 0x100f_0e0d,
            ack: 0x1413_1211,
            staging: 0x1c1b_1a19_1817_1615,
            credits: 0x201f_1e1d,
            src_qpn: 0x2221,
        }
    }

    /// A Send that carries immediate data.
    fn imm_send() -> Hdr {
        Hdr { flags: flags::ACK | flags::IMM, ..hdr(Type::Send) }
    }

    /// A datagram of type `ty` with `data` payload bytes, sealed.
    fn datagram(ty: Type, data: usize) -> Vec<u8> {
        datagram_of(hdr(ty), data)
    }

    /// A datagram with header `h` and `data` payload bytes, sealed.
    fn datagram_of(h: Hdr, data: usize) -> Vec<u8> {
        let ty = h.ty;
        let hdrs = HDR_LEN + ty.ext_len(h.flags);
        let mut b: Vec<u8> = (0..hdrs + data).map(|i| (i * 7 + 3) as u8).collect();
        h.emit(&mut b);
        match ty {
            Type::Write => {
                let len = data as u64 + 5;
                WriteHdr { stag: 9, msg_to: 0x1000, msg_len: len, frag_off: 5, imm: 7 }.emit(&mut b)
            }
            Type::ReadReq => {
                ReadReqHdr { sink_stag: 1, size: 2, src_stag: 3, src_to: 4 }.emit(&mut b)
            }
            Type::ReadResp => ReadRespHdr { sink_stag: 1, sink_to: 2 }.emit(&mut b),
            Type::Terminate => TermHdr { seq: 3, layer_etype: 1, code: 2 }.emit(&mut b),
            Type::Rnr => RnrHdr { seq: 3 }.emit(&mut b),
            Type::Send if h.flags & flags::IMM != 0 => SendImmHdr { imm: 0x1234 }.emit(&mut b),
            Type::Send | Type::Ack | Type::BadSession => {}
        }
        let len = b.len();
        seal(&mut b[..hdrs], len);
        b
    }

    const TYPES: [Type; 8] = [
        Type::Write,
        Type::ReadReq,
        Type::ReadResp,
        Type::Send,
        Type::Terminate,
        Type::Ack,
        Type::Rnr,
        Type::BadSession,
    ];

    #[test]
    fn golden_header_and_write_fragment() {
        let mut b = [0u8; HDR_LEN + WriteHdr::LEN + 3];
        hdr(Type::Write).emit(&mut b);
        let w = WriteHdr { stag: 0xaa, msg_to: 0x1000, msg_len: 10, frag_off: 7, imm: 0xdead_beef };
        w.emit(&mut b);
        seal(&mut b[..HDR_LEN + WriteHdr::LEN], HDR_LEN + WriteHdr::LEN + 3);
        let golden: [u8; HDR_LEN + WriteHdr::LEN] = [
            2, 0, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22,
            0x27, 0x1e, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0,
            0, 7, 0, 0, 0, 0, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0,
        ];
        assert_eq!(b[..HDR_LEN + WriteHdr::LEN], golden);
        assert_eq!(Hdr::parse(&b), Ok(hdr(Type::Write)));
        assert_eq!(WriteHdr::parse(&b), Ok(w));
    }

    /// A Send with immediate data: the value, then 4 reserved zero bytes,
    /// between the transport header and the payload; covered by the check.
    #[test]
    fn golden_send_with_immediate_data() {
        let mut b = [0xa5u8; HDR_LEN + SendImmHdr::LEN + 5];
        imm_send().emit(&mut b);
        SendImmHdr { imm: 0xdead_beef }.emit(&mut b);
        let len = b.len();
        seal(&mut b[..HDR_LEN + SendImmHdr::LEN], len);
        assert_eq!(b[1..3], [3, 9], "RDMAP's Send opcode, flagged ACK and IMM");
        assert_eq!(b[HDR_LEN..HDR_LEN + 8], [0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0]);
        assert_eq!(b[HDR_LEN + 8..], [0xa5; 5], "the payload, untouched");
        assert_eq!(Hdr::parse(&b), Ok(imm_send()));
        assert_eq!(SendImmHdr::parse(&b), Ok(SendImmHdr { imm: 0xdead_beef }));
        // The value damaged in any bit fails the check.
        for bit in 0..32 {
            let mut c = b;
            c[HDR_LEN + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Hdr::parse(&c), Err(HdrError::Checksum), "imm bit {bit}");
        }
        // Reserved bytes set (and sealed so): refused.
        let mut c = b;
        c[HDR_LEN + 6] = 1;
        seal(&mut c[..HDR_LEN + SendImmHdr::LEN], len);
        assert!(Hdr::parse(&c).is_ok());
        assert_eq!(SendImmHdr::parse(&c), Err(HdrError::Reserved));
        // Too short for its headers.
        assert_eq!(Hdr::parse(&b[..HDR_LEN + 7]), Err(HdrError::Truncated));
        // A Send without the flag is what it always was: no RDMAP header.
        let plain = datagram(Type::Send, 5);
        assert_eq!(plain.len(), HDR_LEN + 5);
        assert_eq!(Type::Send.ext_len(flags::ACK), 0);
    }

    #[test]
    fn the_check_is_rfc_1071s_sum_of_16_bit_words_and_the_length() {
        // By hand, a 16-bit word at a time, as RFC 1071 computes it.
        let b = datagram(Type::Terminate, 0);
        let mut acc: u32 = b.len() as u32;
        for w in b.chunks_exact(2) {
            acc += u32::from(u16::from_le_bytes([w[0], w[1]]));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        assert_eq!(acc, 0xffff, "the sum over a sealed datagram, check included");
        assert_eq!(Hdr::parse(&b).map(|h| h.ty), Ok(Type::Terminate));
    }

    #[test]
    fn golden_read_request_terminate_and_rnr() {
        let mut b = [0u8; HDR_LEN + ReadReqHdr::LEN];
        hdr(Type::ReadReq).emit(&mut b);
        let r = ReadReqHdr { sink_stag: 5, size: 0x0102, src_stag: 7, src_to: 0x0300 };
        r.emit(&mut b);
        let ext = [5, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 3];
        assert_eq!(b[HDR_LEN..HDR_LEN + 26], ext);
        assert_eq!(b[1], 1, "RDMAP's Read Request opcode");
        assert_eq!(ReadReqHdr::parse(&b), Ok(r));

        let mut b = [0u8; HDR_LEN + TermHdr::LEN];
        hdr(Type::Terminate).emit(&mut b);
        let t = TermHdr { seq: 9, layer_etype: term::LAYER_ETYPE, code: term::BASE_OR_BOUNDS };
        t.emit(&mut b);
        assert_eq!(b[1], 7, "RDMAP's Terminate opcode");
        assert_eq!(b[HDR_LEN..], [9, 0, 0, 0, 1, 1, 0, 0]);
        assert_eq!(TermHdr::parse(&b), Ok(t));

        let mut b = [0u8; HDR_LEN + RnrHdr::LEN];
        hdr(Type::Rnr).emit(&mut b);
        RnrHdr { seq: 0x0102_0304 }.emit(&mut b);
        assert_eq!(b[HDR_LEN..], [4, 3, 2, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let mut b = [0u8; HDR_LEN + WriteHdr::LEN + 8];
        hdr(Type::Send).emit(&mut b);
        let len = b.len();
        seal(&mut b[..HDR_LEN], len);
        assert!(Hdr::parse(&b).is_ok());
        for len in 0..HDR_LEN {
            assert_eq!(Hdr::parse(&b[..len]), Err(HdrError::Truncated), "{len} bytes");
        }
        // Each field wrong, and sealed so: the field's error, not damage.
        let bad = |at: usize, v: u8, want: HdrError| {
            let mut c = b;
            c[at] = v;
            let len = c.len();
            seal(&mut c[..HDR_LEN], len);
            assert_eq!(Hdr::parse(&c), Err(want), "byte {at} = {v}");
        };
        bad(0, 1, HdrError::Version);
        bad(0, 9, HdrError::Version);
        for ty in [4, 5, 6, 11, 255] {
            bad(1, ty, HdrError::Type);
        }
        bad(2, 1 << 7, HdrError::Reserved);
        bad(3, 1, HdrError::Reserved);
        let mut c = b;
        c[36..38].fill(0);
        let len = c.len();
        seal(&mut c[..HDR_LEN], len);
        assert_eq!(Hdr::parse(&c), Err(HdrError::Field), "no port to answer");

        // A type whose RDMAP header does not fit.
        hdr(Type::Write).emit(&mut b);
        assert_eq!(Hdr::parse(&b[..HDR_LEN + WriteHdr::LEN - 1]), Err(HdrError::Truncated));
        // A fragment that runs past its message, or wraps.
        let w = WriteHdr { stag: 1, msg_to: 0, msg_len: 8, frag_off: 1, imm: 0 };
        w.emit(&mut b);
        assert_eq!(WriteHdr::parse(&b), Err(HdrError::Field), "8 data bytes at offset 1 of 8");
        WriteHdr { frag_off: u64::MAX, ..w }.emit(&mut b);
        assert_eq!(WriteHdr::parse(&b), Err(HdrError::Field));
        WriteHdr { frag_off: 0, ..w }.emit(&mut b);
        assert!(WriteHdr::parse(&b).is_ok());
        b[HDR_LEN + 36] = 1;
        assert_eq!(WriteHdr::parse(&b), Err(HdrError::Reserved));
    }

    /// What the fault layer does to a datagram, one bit flipped or the
    /// datagram cut short, never passes the headers of any type; damage to
    /// the payload does (it is the endpoint's, or UDP's, to catch).
    #[test]
    fn every_flipped_header_bit_and_every_cut_is_caught() {
        for h in TYPES.map(hdr).into_iter().chain([imm_send()]) {
            let ty = h.ty;
            let hdrs = HDR_LEN + ty.ext_len(h.flags);
            let data = if ty.sequenced() && ty != Type::ReadReq { 24 } else { 0 };
            let b = datagram_of(h, data);
            assert!(Hdr::parse(&b).is_ok(), "{ty:?}");
            for bit in 0..hdrs * 8 {
                let mut c = b.clone();
                c[bit / 8] ^= 1 << (bit % 8);
                let got = Hdr::parse(&c);
                let imm_bit = bit == 2 * 8 + flags::IMM.trailing_zeros() as usize;
                match bit / 8 {
                    // The version, or the type (which says how long the
                    // headers are), is read first.
                    0 => assert_eq!(got, Err(HdrError::Version)),
                    1 => assert!(got.is_err(), "{ty:?} type bit {bit}: {got:?}"),
                    // So is a Send's IMM flag, which says so too.
                    2 if imm_bit && ty == Type::Send => assert!(got.is_err(), "{got:?}"),
                    _ => assert_eq!(got, Err(HdrError::Checksum), "{ty:?} bit {bit}"),
                }
            }
            for len in hdrs..b.len() {
                assert_eq!(Hdr::parse(&b[..len]), Err(HdrError::Checksum), "{ty:?} cut to {len}");
            }
            for at in hdrs..b.len() {
                let mut c = b.clone();
                c[at] ^= 0x10;
                assert!(Hdr::parse(&c).is_ok(), "{ty:?}: payload byte {at} is not covered");
            }
        }
    }

    /// Any change to one 16-bit word of the headers is caught, but for
    /// 0x0000 and 0xffff, the two zeros of ones' complement.
    #[test]
    fn every_change_of_one_word_is_caught() {
        let b = datagram(Type::Ack, 0);
        for at in [4, 12, 24, 30] {
            let was = u16::from_le_bytes([b[at], b[at + 1]]);
            assert!(was != 0 && was != 0xffff);
            for v in (0..=u16::MAX).filter(|&v| v != was) {
                let mut c = b.clone();
                c[at..at + 2].copy_from_slice(&v.to_le_bytes());
                assert_eq!(Hdr::parse(&c), Err(HdrError::Checksum), "word {at} = {v:#x}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(0u8..=255, 0..120)) {
            if let Ok(h) = Hdr::parse(&bytes) {
                let _ = match h.ty {
                    Type::Write => WriteHdr::parse(&bytes).map(|_| ()),
                    Type::ReadReq => ReadReqHdr::parse(&bytes).map(|_| ()),
                    Type::ReadResp => ReadRespHdr::parse(&bytes).map(|_| ()),
                    Type::Terminate => TermHdr::parse(&bytes).map(|_| ()),
                    Type::Rnr => RnrHdr::parse(&bytes).map(|_| ()),
                    _ => Ok(()),
                };
            }
        }

        /// Any header, sealed, parses back as it was emitted; changed in
        /// one byte of its headers (other than its version and type), it
        /// fails its check.
        #[test]
        fn sealed_headers_round_trip_and_damage_fails(
            ty in proptest::sample::select(TYPES.to_vec()),
            fields in proptest::array::uniform8(proptest::num::u32::ANY),
            staging: u64,
            src_qpn in 1u16..,
            flags in 0..=flags::KNOWN,
            data in 0usize..100,
            at: proptest::sample::Index,
            xor in 1u8..,
        ) {
            let h = Hdr {
                ty,
                flags,
                src_connid: fields[0],
                dst_connid: fields[1],
                seq: fields[2],
                base: fields[3],
                ack: fields[4],
                staging,
                credits: fields[5],
                src_qpn,
            };
            let hdrs = HDR_LEN + ty.ext_len(flags);
            let mut b = vec![0xa5; hdrs + data];
            h.emit(&mut b);
            let len = b.len();
            seal(&mut b[..hdrs], len);
            proptest::prop_assert_eq!(Hdr::parse(&b), Ok(h));
            let at = 2 + at.index(hdrs - 2);
            b[at] ^= xor;
            if ty == Type::Send && at == 2 && xor & flags::IMM != 0 {
                // The headers' length changed: not necessarily their check
                // that fails first.
                proptest::prop_assert!(Hdr::parse(&b).is_err());
            } else {
                proptest::prop_assert_eq!(Hdr::parse(&b), Err(HdrError::Checksum));
            }
        }
    }
}
