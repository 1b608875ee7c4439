//! The SMB Direct Data Transfer message (MS-SMBD 2.2.3): a 20-byte header,
//! padding up to DataOffset, then DataLength bytes of the upper layer's
//! message. All integers are little-endian.
//!
//! ```text
//!  0 CreditsRequested u16    2 CreditsGranted u16
//!  4 Flags u16               6 Reserved u16
//!  8 RemainingDataLength u32
//! 12 DataOffset u32         16 DataLength u32
//! 20 Padding (DataOffset - 20 bytes), Buffer (DataLength bytes)
//! ```

use bitflags::bitflags;

use super::SegmentError;
use crate::endpoint::WriteHead;

bitflags! {
    /// The Flags field (MS-SMBD 2.2.3). Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Flags: u16 {
        /// SMB_DIRECT_RESPONSE_REQUESTED: the peer is asked to answer
        /// promptly (with the credits it can grant).
        const RESPONSE_REQUESTED = 0x0001;
    }
}

mod field {
    pub const CREDITS_REQUESTED: usize = 0;
    pub const CREDITS_GRANTED: usize = 2;
    pub const FLAGS: usize = 4;
    pub const RESERVED: usize = 6;
    pub const REMAINING_DATA_LENGTH: usize = 8;
    pub const DATA_OFFSET: usize = 12;
    pub const DATA_LENGTH: usize = 16;
    pub const HEADER_LEN: usize = DATA_LENGTH + 4;
}

/// Bytes of the fixed header, before any padding.
pub const HEADER_LEN: usize = field::HEADER_LEN;

const _: () = assert!(HEADER_LEN == 20);

// `Repr::emit` writes the fields as words at these offsets.
const _: () = assert!(
    field::CREDITS_REQUESTED == 0
        && field::CREDITS_GRANTED == 2
        && field::FLAGS == 4
        && field::RESERVED == 6
        && field::REMAINING_DATA_LENGTH == 8
        && field::DATA_OFFSET == 12
        && field::DATA_LENGTH == 16
);

/// The DataOffset a sender uses by default (spec 3.1.5.4: "SHOULD be 24"),
/// the first 8-byte aligned offset past the header.
pub const DEFAULT_DATA_OFFSET: u32 = 24;

const _: () =
    assert!(DEFAULT_DATA_OFFSET as usize >= HEADER_LEN && DEFAULT_DATA_OFFSET.is_multiple_of(8));

#[inline(always)]
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// A view of a Data Transfer message's bytes: the header, and when the
/// buffer holds the whole segment, its data.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view with no check; accessors panic on a buffer shorter than the
    /// header.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// A view of a whole segment whose length and layout are checked (see
    /// [`Packet::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Packet<T>, SegmentError> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer, a whole segment, holds the header and that
    /// the data it describes lies inside it ([`check_layout`]).
    pub fn check_len(&self) -> Result<(), SegmentError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(SegmentError::Truncated { need: HEADER_LEN as u64, have: b.len() });
        }
        check_layout(self.remaining_data_length(), self.data_offset(), self.data_length(), b.len())
    }

    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// CreditsRequested: how many credits the sender wants granted.
    pub fn credits_requested(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CREDITS_REQUESTED)
    }

    /// CreditsGranted: receives the sender posted for us since it last said.
    pub fn credits_granted(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CREDITS_GRANTED)
    }

    /// Flags, unknown bits kept.
    pub fn flags(&self) -> Flags {
        Flags::from_bits_retain(get_u16(self.buffer.as_ref(), field::FLAGS))
    }

    /// Reserved (sent as 0, ignored on receipt).
    pub fn reserved(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::RESERVED)
    }

    /// RemainingDataLength: bytes of the message still to come after this
    /// segment.
    pub fn remaining_data_length(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::REMAINING_DATA_LENGTH)
    }

    /// DataOffset: where the data starts, from the start of the segment.
    pub fn data_offset(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DATA_OFFSET)
    }

    /// DataLength: bytes of data in this segment.
    pub fn data_length(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DATA_LENGTH)
    }

    /// The data; panics unless the view was checked as a whole segment.
    pub fn data(&self) -> &[u8] {
        let (at, n) = (self.data_offset() as usize, self.data_length() as usize);
        if n == 0 { &[] } else { &self.buffer.as_ref()[at..at + n] }
    }
}

/// Checks where a segment of `segment_len` bytes says its data is:
///
/// * DataLength 0 (the empty message, spec 3.1.5.4): RemainingDataLength
///   must be 0, as the empty message sets it, since no data cannot be
///   followed by more of the same message. Its DataOffset is not read.
/// * Otherwise DataOffset is 8-byte aligned ("MUST be 8-byte aligned in
///   the message", 3.1.5.4), at or past the 20-byte header, and
///   DataOffset + DataLength is within the segment.
///
/// The sums are in u64, so no field value wraps them.
pub fn check_layout(
    remaining_data_length: u32,
    data_offset: u32,
    data_length: u32,
    segment_len: usize,
) -> Result<(), SegmentError> {
    if data_length == 0 {
        if remaining_data_length != 0 {
            return Err(SegmentError::EmptyWithRemaining { remaining_data_length });
        }
        return Ok(());
    }
    if !data_offset.is_multiple_of(8) {
        return Err(SegmentError::Misaligned { data_offset });
    }
    if (data_offset as usize) < HEADER_LEN {
        return Err(SegmentError::OffsetInHeader { data_offset });
    }
    if data_offset as u64 + data_length as u64 > segment_len as u64 {
        return Err(SegmentError::BeyondSegment { data_offset, data_length, segment_len });
    }
    Ok(())
}

/// A Data Transfer message header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub credits_requested: u16,
    pub credits_granted: u16,
    pub flags: Flags,
    pub remaining_data_length: u32,
    /// 0 in the empty message; otherwise 8-byte aligned and at least 24.
    pub data_offset: u32,
    pub data_length: u32,
}

impl Repr {
    /// Checks and reads a whole segment; returns its header and its data.
    pub fn parse(segment: &[u8]) -> Result<(Repr, &[u8]), SegmentError> {
        let p = Packet::new_checked(segment)?;
        let r = Repr::read(&p);
        let (at, n) = (r.data_offset as usize, r.data_length as usize);
        let data = if n == 0 { &[][..] } else { &segment[at..at + n] };
        Ok((r, data))
    }

    /// Checks and reads a header of which only the first bytes were copied
    /// out of the `segment_len` bytes that arrived: what a receiver does,
    /// since received memory is reached only through copies and the data
    /// is copied once, to where the message goes.
    #[inline]
    pub fn parse_header(header: &[u8], segment_len: usize) -> Result<Repr, SegmentError> {
        let have = header.len().min(segment_len);
        if have < HEADER_LEN {
            return Err(SegmentError::Truncated { need: HEADER_LEN as u64, have });
        }
        let p = Packet::new_unchecked(header);
        let r = Repr::read(&p);
        check_layout(r.remaining_data_length, r.data_offset, r.data_length, segment_len)?;
        Ok(r)
    }

    /// Header prediction, as TCP's: the header of a `segment_len`-byte
    /// segment when it is a stream's usual one, a whole message in one
    /// segment (RemainingDataLength 0, DataLength not 0) at the default
    /// DataOffset with its data running to the segment's end, recognized
    /// by three compares (RemainingDataLength and DataOffset as one word,
    /// DataLength against the segment's length and against 0) rather than
    /// [`Repr::parse_header`]'s field by field checks. What it returns `parse_header` returns for
    /// the same bytes; None for any other header, which is not thereby
    /// malformed: parse it.
    #[inline(always)]
    pub fn predict_whole(header: &[u8; HEADER_LEN], segment_len: u64) -> Option<Repr> {
        let word =
            |at: usize| u64::from_le_bytes(*header[at..].first_chunk().expect("in the header"));
        let (w0, w1) = (word(field::CREDITS_REQUESTED), word(field::REMAINING_DATA_LENGTH));
        let data_length = get_u32(header, field::DATA_LENGTH);
        // RemainingDataLength 0 and DataOffset the default, in one word.
        let usual = (DEFAULT_DATA_OFFSET as u64) << 32;
        let to_end = segment_len.wrapping_sub(DEFAULT_DATA_OFFSET as u64);
        if w1 != usual || data_length as u64 != to_end || data_length == 0 {
            return None;
        }
        Some(Repr {
            credits_requested: w0 as u16,
            credits_granted: (w0 >> 16) as u16,
            flags: Flags::from_bits_retain((w0 >> 32) as u16),
            remaining_data_length: 0,
            data_offset: DEFAULT_DATA_OFFSET,
            data_length,
        })
    }

    fn read<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr {
            credits_requested: p.credits_requested(),
            credits_granted: p.credits_granted(),
            flags: p.flags(),
            remaining_data_length: p.remaining_data_length(),
            data_offset: p.data_offset(),
            data_length: p.data_length(),
        }
    }

    /// Whether this is the empty message (no data, spec 3.1.5.4).
    pub const fn is_empty(&self) -> bool {
        self.data_length == 0
    }

    /// Bytes `emit` writes: the header and its padding up to DataOffset;
    /// 20 for the empty message ("Padding and Buffer are not present").
    pub const fn buffer_len(&self) -> usize {
        if self.data_length == 0 || (self.data_offset as usize) < HEADER_LEN {
            HEADER_LEN
        } else {
            self.data_offset as usize
        }
    }

    /// Bytes of the whole segment: `buffer_len` plus the data.
    pub const fn segment_len(&self) -> usize {
        if self.data_length == 0 {
            HEADER_LEN
        } else {
            self.buffer_len() + self.data_length as usize
        }
    }

    /// Writes the header, Reserved as 0, and the padding up to DataOffset
    /// as zeros (spec 3.1.5.4); returns where the data goes. Panics if
    /// `buf` is shorter than `buffer_len()`.
    // Always inlined: a send's header, written where it travels
    // (`WriteHead`), folds into the send path.
    #[inline(always)]
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        // The fields as three little-endian words (Reserved and the usual
        // four bytes of padding zero), stored whole.
        let w0 = self.credits_requested as u64
            | (self.credits_granted as u64) << 16
            | (self.flags.bits() as u64) << 32;
        let w1 = self.remaining_data_length as u64 | (self.data_offset as u64) << 32;
        let w2 = self.data_length as u64;
        let b = &mut buf[..len];
        b[..8].copy_from_slice(&w0.to_le_bytes());
        b[8..16].copy_from_slice(&w1.to_le_bytes());
        if len >= DEFAULT_DATA_OFFSET as usize {
            b[16..24].copy_from_slice(&w2.to_le_bytes());
            if len > DEFAULT_DATA_OFFSET as usize {
                b[24..].fill(0);
            }
        } else {
            put_u32(b, field::DATA_LENGTH, self.data_length);
        }
        len
    }
}

/// A header written where it travels, inlined into the send.
impl WriteHead for &Repr {
    #[inline(always)]
    fn write_head(self, into: &mut [u8]) {
        self.emit(into);
    }
}

/// Golden segments, written byte by byte from the layout of MS-SMBD 2.2.3
/// with the offset and field of every row. Shared by the unit tests, the
/// dissector's tests and the benches.
pub mod golden {
    /// CreditsRequested in every golden segment.
    pub const CREDITS_REQUESTED: u16 = 0x00fe;
    /// CreditsGranted in every golden segment.
    pub const CREDITS_GRANTED: u16 = 0x0011;
    /// RemainingDataLength of [`FIRST`].
    pub const REMAINING: u32 = 0x0001_2345;
    /// The data of the segments that carry some.
    pub const DATA: &[u8] = b"efapoll!";

    /// A first segment: response requested, more to come, DataOffset 24
    /// (4 bytes of padding), 8 bytes of data.
    pub const FIRST: &[u8] = &[
        0xfe, 0x00, // 0 CreditsRequested
        0x11, 0x00, // 2 CreditsGranted
        0x01, 0x00, // 4 Flags: SMB_DIRECT_RESPONSE_REQUESTED
        0x00, 0x00, // 6 Reserved
        0x45, 0x23, 0x01, 0x00, // 8 RemainingDataLength
        0x18, 0x00, 0x00, 0x00, // 12 DataOffset 24
        0x08, 0x00, 0x00, 0x00, // 16 DataLength 8
        0x00, 0x00, 0x00, 0x00, // 20 Padding (DataOffset - 20 bytes)
        b'e', b'f', b'a', b'p', b'o', b'l', b'l', b'!', // 24 Buffer
    ];

    /// A last segment (RemainingDataLength 0) at DataOffset 32: 12 bytes of
    /// padding.
    pub const LAST_AT_32: &[u8] = &[
        0xfe, 0x00, // 0 CreditsRequested
        0x11, 0x00, // 2 CreditsGranted
        0x00, 0x00, // 4 Flags
        0x00, 0x00, // 6 Reserved
        0x00, 0x00, 0x00, 0x00, // 8 RemainingDataLength 0: the last segment
        0x20, 0x00, 0x00, 0x00, // 12 DataOffset 32
        0x08, 0x00, 0x00, 0x00, // 16 DataLength 8
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 20 Padding
        b'e', b'f', b'a', b'p', b'o', b'l', b'l', b'!', // 32 Buffer
    ];

    /// The empty message: Reserved, RemainingDataLength, DataOffset and
    /// DataLength zero, no padding and no buffer (spec 3.1.5.4); the
    /// credits are a message's like any other.
    pub const EMPTY: &[u8] = &[
        0xfe, 0x00, // 0 CreditsRequested
        0x11, 0x00, // 2 CreditsGranted
        0x00, 0x00, // 4 Flags
        0x00, 0x00, // 6 Reserved
        0x00, 0x00, 0x00, 0x00, // 8 RemainingDataLength
        0x00, 0x00, 0x00, 0x00, // 12 DataOffset
        0x00, 0x00, 0x00, 0x00, // 16 DataLength
    ];

    /// Every golden segment, by name.
    pub const ALL: &[(&str, &[u8])] =
        &[("FIRST", FIRST), ("LAST_AT_32", LAST_AT_32), ("EMPTY", EMPTY)];
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENTINEL: u8 = 0x5a;

    fn first() -> Repr {
        Repr {
            credits_requested: golden::CREDITS_REQUESTED,
            credits_granted: golden::CREDITS_GRANTED,
            flags: Flags::RESPONSE_REQUESTED,
            remaining_data_length: golden::REMAINING,
            data_offset: 24,
            data_length: 8,
        }
    }

    #[test]
    fn golden_segments_parse_field_by_field() {
        let p = Packet::new_checked(golden::FIRST).unwrap();
        assert_eq!(p.credits_requested(), 0xfe);
        assert_eq!(p.credits_granted(), 0x11);
        assert_eq!(p.flags(), Flags::RESPONSE_REQUESTED);
        assert_eq!(p.reserved(), 0);
        assert_eq!(p.remaining_data_length(), 0x12345);
        assert_eq!(p.data_offset(), 24);
        assert_eq!(p.data_length(), 8);
        assert_eq!(p.data(), golden::DATA);
        assert_eq!(Repr::parse(golden::FIRST), Ok((first(), golden::DATA)));

        let last =
            Repr { flags: Flags::empty(), remaining_data_length: 0, data_offset: 32, ..first() };
        assert_eq!(Repr::parse(golden::LAST_AT_32), Ok((last, golden::DATA)));

        let empty = Repr {
            credits_requested: golden::CREDITS_REQUESTED,
            credits_granted: golden::CREDITS_GRANTED,
            ..Repr::default()
        };
        assert_eq!(Repr::parse(golden::EMPTY), Ok((empty, &[][..])));
        assert!(empty.is_empty());
    }

    #[test]
    fn emit_writes_the_golden_bytes_over_a_sentinel() {
        for (name, bytes) in golden::ALL {
            let (r, data) = Repr::parse(bytes).unwrap();
            let mut buf = [SENTINEL; 64];
            let at = r.emit(&mut buf);
            assert_eq!(at, r.buffer_len(), "{name}");
            assert_eq!(r.segment_len(), bytes.len(), "{name}");
            buf[at..at + data.len()].copy_from_slice(data);
            assert_eq!(&buf[..bytes.len()], *bytes, "{name}");
            assert!(
                buf[bytes.len()..].iter().all(|&b| b == SENTINEL),
                "{name}: wrote past its end"
            );
        }
    }

    #[test]
    fn the_empty_message_is_twenty_bytes_without_padding() {
        // Whatever DataOffset the value holds: an empty message has none.
        let r = Repr { data_offset: 24, ..Repr::default() };
        assert_eq!((r.buffer_len(), r.segment_len()), (20, 20));
        let mut buf = [SENTINEL; 24];
        assert_eq!(r.emit(&mut buf), 20);
        assert_eq!(&buf[20..], &[SENTINEL; 4]);
    }

    #[test]
    fn reserved_and_unknown_flags_are_read_and_reserved_is_sent_as_zero() {
        let mut seg = golden::FIRST.to_vec();
        seg[4] = 0x03; // an unknown flag bit
        seg[6] = 0x77; // Reserved
        let (r, _) = Repr::parse(&seg).unwrap();
        assert_eq!(r.flags.bits(), 0x0003);
        let mut out = [0u8; 24];
        r.emit(&mut out);
        assert_eq!(out[4], 0x03, "unknown bits are kept");
        assert_eq!(out[6], 0x00, "Reserved is sent as 0");
    }

    fn header_of(seg: &[u8]) -> &[u8; HEADER_LEN] {
        seg.first_chunk().unwrap()
    }

    #[test]
    fn a_whole_message_at_the_default_offset_is_predicted_as_parsed() {
        let r = Repr { remaining_data_length: 0, ..first() };
        let mut seg = [SENTINEL; 32];
        r.emit(&mut seg);
        seg[4] = 0x03; // an unknown flag bit, kept as parsing keeps it
        seg[6] = 0x77; // Reserved, read by neither
        let want = Repr::parse_header(&seg[..HEADER_LEN], 32).unwrap();
        assert_eq!(want.flags.bits(), 0x0003);
        assert_eq!(Repr::predict_whole(header_of(&seg), 32), Some(want));
    }

    #[test]
    fn other_headers_are_left_to_parsing_valid_or_not() {
        let usual = |f: &dyn Fn(&mut Repr)| {
            let mut r = Repr { remaining_data_length: 0, ..first() };
            f(&mut r);
            let mut seg = [0u8; 64];
            r.emit(&mut seg);
            seg
        };
        let whole = usual(&|_| {});
        assert!(Repr::predict_whole(header_of(&whole), 32).is_some());
        // Valid, not predicted: more to come; another DataOffset; bytes
        // past the data; the empty message.
        let more = usual(&|r| r.remaining_data_length = 1);
        let at_32 = golden::LAST_AT_32;
        let cases: [(&str, &[u8], u64); 4] = [
            ("more to come", &more, 32),
            ("DataOffset 32", at_32, at_32.len() as u64),
            ("bytes past the data", &whole, 33),
            ("empty", golden::EMPTY, HEADER_LEN as u64),
        ];
        for (name, seg, len) in cases {
            assert!(Repr::parse_header(&seg[..HEADER_LEN], len as usize).is_ok(), "{name}");
            assert_eq!(Repr::predict_whole(header_of(seg), len), None, "{name}");
        }
        // Not whole, or not valid: data beyond the segment; DataLength 0
        // at DataOffset 24 in a segment of its header and padding; and
        // segments shorter than the default offset, whose length less 24
        // wraps.
        let none = usual(&|r| r.data_length = 0);
        for (seg, len) in [(&whole, 31u64), (&none, 24), (&whole, 0), (&whole, 20)] {
            assert_eq!(Repr::predict_whole(header_of(seg), len), None, "{len}");
        }
    }

    #[test]
    fn a_header_copied_alone_parses_against_the_segment_length() {
        let r = Repr::parse_header(&golden::FIRST[..HEADER_LEN], golden::FIRST.len());
        assert_eq!(r, Ok(first()));
        assert_eq!(
            Repr::parse_header(&golden::FIRST[..HEADER_LEN], golden::FIRST.len() - 1),
            Err(SegmentError::BeyondSegment { data_offset: 24, data_length: 8, segment_len: 31 })
        );
        assert_eq!(
            Repr::parse_header(&golden::FIRST[..HEADER_LEN], 19),
            Err(SegmentError::Truncated { need: 20, have: 19 })
        );
    }

    #[test]
    fn every_malformed_layout_is_a_typed_error() {
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut s = golden::FIRST.to_vec();
            f(&mut s);
            Repr::parse(&s).map(|(r, _)| r)
        };
        assert_eq!(
            Repr::parse(&golden::FIRST[..19]),
            Err(SegmentError::Truncated { need: 20, have: 19 })
        );
        assert_eq!(
            with(&|s| s[12] = 28),
            Err(SegmentError::Misaligned { data_offset: 28 }),
            "DataOffset not 8-byte aligned"
        );
        assert_eq!(
            with(&|s| s[12] = 16),
            Err(SegmentError::OffsetInHeader { data_offset: 16 }),
            "data inside the header"
        );
        assert_eq!(
            with(&|s| s[16] = 9),
            Err(SegmentError::BeyondSegment { data_offset: 24, data_length: 9, segment_len: 32 })
        );
        // Offsets and lengths near 2^32 do not wrap the check.
        assert_eq!(
            with(&|s| s[12..20].copy_from_slice(&[0xf8, 0xff, 0xff, 0xff, 0x10, 0, 0, 0])),
            Err(SegmentError::BeyondSegment {
                data_offset: 0xffff_fff8,
                data_length: 16,
                segment_len: 32
            })
        );
        assert_eq!(
            with(&|s| s[16..20].copy_from_slice(&[0xff; 4])),
            Err(SegmentError::BeyondSegment {
                data_offset: 24,
                data_length: u32::MAX,
                segment_len: 32
            })
        );
        assert_eq!(
            Repr::parse(&{
                let mut e = golden::EMPTY.to_vec();
                e[8] = 1;
                e
            })
            .map(|(r, _)| r),
            Err(SegmentError::EmptyWithRemaining { remaining_data_length: 1 }),
            "no data, yet more to come"
        );
    }

    /// A bounded fuzz in the normal suite: random bytes of every length up
    /// to 64 parse or fail, never panic, and what parses re-emits as read.
    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..200_000 {
            let len = (next() % 65) as usize;
            let mut s: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && len >= 20 {
                // Plausible layouts, to reach past the first checks.
                s[12..16].copy_from_slice(&((next() % 6 * 8) as u32).to_le_bytes());
                s[16..20].copy_from_slice(&((next() % 48) as u32).to_le_bytes());
            }
            if let Ok((r, data)) = Repr::parse(&s) {
                assert_eq!(data.len(), r.data_length as usize);
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out);
                assert_eq!(Repr::parse_header(&out[..20], r.segment_len()), Ok(r));
            }
        }
    }
}
