//! Segmentation of a message into Data Transfer messages (spec 3.1.5.4)
//! and its reassembly on the receiving side: pure arithmetic over header
//! values, no memory and no I/O, so that every rule is tested alone.

use super::ProtocolError;
use super::header::{HEADER_LEN, Repr};

/// One segment of a message: its header's data fields and the range of
/// the message it carries (`offset .. offset + repr.data_length`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Message offset of the segment's data.
    pub offset: u64,
    /// The header, credits and flags left for the sender to fill in.
    pub repr: Repr,
}

impl Segment {
    /// Whether it is the message's first segment.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }

    /// Whether it is the message's last segment.
    pub fn is_last(&self) -> bool {
        self.repr.remaining_data_length == 0
    }
}

/// Cuts a message of `len` bytes into segments, in the order they must be
/// sent. Spec 3.1.5.4:
///
/// * an empty buffer is one empty message: RemainingDataLength,
///   DataOffset and DataLength 0, no padding and no buffer;
/// * otherwise each segment's DataOffset is `data_offset` (8-byte
///   aligned; 24 by default, as the spec's SHOULD), its DataLength the
///   smaller of what is left and MaxSendSize - DataOffset, so that
///   DataOffset + DataLength never exceeds MaxSendSize;
/// * RemainingDataLength is the bytes not yet sent after this segment,
///   0 on the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmenter {
    len: u64,
    /// Bytes put in segments taken so far.
    sent: u64,
    data_offset: u32,
    max_data: u32,
    /// The empty message was taken.
    done_empty: bool,
}

impl Segmenter {
    /// The segments of no message, all taken.
    pub(crate) const EMPTY: Segmenter =
        Segmenter { len: 0, sent: 0, data_offset: 0, max_data: 0, done_empty: true };

    /// Segments for a message of `len` bytes at `data_offset`, with at most
    /// `max_send_size` bytes per segment. The caller checked the
    /// parameters ([`super::Params::check`]): `data_offset` is 8-byte
    /// aligned, at least 24 and below `max_send_size`; `len` is at most
    /// MaxFragmentedSendSize, a u32.
    pub fn new(len: u64, data_offset: u32, max_send_size: u32) -> Segmenter {
        debug_assert!(data_offset.is_multiple_of(8) && data_offset as usize >= HEADER_LEN);
        debug_assert!(data_offset < max_send_size && len <= u32::MAX as u64);
        Segmenter {
            len,
            sent: 0,
            data_offset,
            max_data: max_send_size - data_offset,
            done_empty: false,
        }
    }

    /// The message's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the message is empty (one empty message).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many segments the message takes.
    pub fn count(&self) -> u64 {
        if self.len == 0 { 1 } else { self.len.div_ceil(self.max_data as u64) }
    }

    /// Whether the message has data and goes in one segment ([`Self::count`]
    /// 1, without the division).
    #[inline]
    pub fn is_one_with_data(&self) -> bool {
        self.len.wrapping_sub(1) < self.max_data as u64
    }

    /// Whether every segment was taken.
    pub fn is_done(&self) -> bool {
        if self.len == 0 { self.done_empty } else { self.sent == self.len }
    }

    /// The next segment, without taking it (a send that cannot be posted
    /// now is retried with the same segment).
    #[inline]
    pub fn peek(&self) -> Option<Segment> {
        if self.is_done() {
            return None;
        }
        if self.len == 0 {
            return Some(Segment { offset: 0, repr: Repr::default() });
        }
        let left = self.len - self.sent;
        let n = left.min(self.max_data as u64);
        let repr = Repr {
            remaining_data_length: (left - n) as u32,
            data_offset: self.data_offset,
            data_length: n as u32,
            ..Repr::default()
        };
        Some(Segment { offset: self.sent, repr })
    }

    /// Takes the segment `peek` returned.
    #[inline]
    pub fn advance(&mut self) {
        // What `peek` gives, without building the segment again; nothing
        // once done.
        self.sent += (self.len - self.sent).min(self.max_data as u64);
        self.done_empty |= self.len == 0;
    }
}

impl Iterator for Segmenter {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        let s = self.peek()?;
        self.advance();
        Some(s)
    }
}

/// Where a received segment's data goes, once [`Reassembler::accept`]
/// took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The empty message: no data, nothing to deliver (credits only).
    Empty,
    /// `len` bytes at message offset `offset`. `total` is the message's
    /// length (known from its first segment: DataLength plus
    /// RemainingDataLength); `last` says the message is complete with it.
    Data { offset: u64, len: u32, total: u64, first: bool, last: bool },
}

/// Follows the messages of a connection as their segments arrive, in the
/// order they were sent, and checks each against the message so far:
///
/// * a first segment's DataLength + RemainingDataLength, the message's
///   length, is at most MaxFragmentedReceiveSize (what this side
///   advertised as its MaxFragmentedSize);
/// * every later segment's RemainingDataLength is the previous one's less
///   this segment's DataLength: the bytes "not yet sent" (3.1.5.4), which
///   only shrink, by exactly what arrived.
///
/// An empty message may come between the segments of a message (it
/// carries credits, not data) and does not change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reassembler {
    max_fragmented: u32,
    /// The message in progress: its length and the bytes arrived so far.
    current: Option<(u64, u64)>,
}

impl Reassembler {
    /// Reassembles messages of up to `max_fragmented_receive_size` bytes.
    pub fn new(max_fragmented_receive_size: u32) -> Reassembler {
        Reassembler { max_fragmented: max_fragmented_receive_size, current: None }
    }

    /// Whether a message is partly received.
    pub fn in_progress(&self) -> bool {
        self.current.is_some()
    }

    /// Takes the next segment's header, checked by the codec; says where
    /// its data goes, or why the connection must end.
    #[inline]
    pub fn accept(&mut self, r: &Repr) -> Result<Placement, ProtocolError> {
        if r.is_empty() {
            return Ok(Placement::Empty);
        }
        let (len, remaining) = (r.data_length as u64, r.remaining_data_length as u64);
        let (total, offset, first) = match self.current {
            None => {
                let total = len + remaining;
                if total > self.max_fragmented as u64 {
                    return Err(ProtocolError::MessageTooLong {
                        len: total,
                        max: self.max_fragmented,
                    });
                }
                (total, 0, true)
            }
            Some((total, arrived)) => {
                let expected = total - arrived;
                if len > expected || remaining != expected - len {
                    return Err(ProtocolError::RemainingMismatch {
                        left: expected,
                        data_length: r.data_length,
                        remaining: r.remaining_data_length,
                    });
                }
                (total, arrived, false)
            }
        };
        let last = remaining == 0;
        self.current = if last { None } else { Some((total, offset + len)) };
        Ok(Placement::Data { offset, len: r.data_length, total, first, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(remaining: u32, len: u32) -> Repr {
        Repr {
            remaining_data_length: remaining,
            data_offset: 24,
            data_length: len,
            ..Repr::default()
        }
    }

    #[test]
    fn the_default_segment_is_24_bytes_in_and_fills_max_send_size() {
        let segs: Vec<Segment> = Segmenter::new(3000, 24, 1364).collect();
        assert_eq!(segs.len(), 3);
        let fields: Vec<(u64, u32, u32, u32)> = segs
            .iter()
            .map(|s| {
                (s.offset, s.repr.data_offset, s.repr.data_length, s.repr.remaining_data_length)
            })
            .collect();
        assert_eq!(fields, [(0, 24, 1340, 1660), (1340, 24, 1340, 320), (2680, 24, 320, 0)]);
        for s in &segs {
            assert!(s.repr.data_offset + s.repr.data_length <= 1364);
            assert_eq!(s.repr.segment_len(), 24 + s.repr.data_length as usize);
        }
    }

    #[test]
    fn an_empty_buffer_is_one_empty_message() {
        let mut s = Segmenter::new(0, 24, 1364);
        assert_eq!(s.count(), 1);
        let only = s.next().unwrap();
        assert_eq!(only.repr, Repr::default());
        assert_eq!(only.repr.segment_len(), 20);
        assert!(only.is_first() && only.is_last());
        assert_eq!(s.next(), None);
    }

    #[test]
    fn one_segment_with_data_is_a_count_of_one_but_the_empty_message() {
        for len in [0u64, 1, 1339, 1340, 1341, 2680, 1 << 20] {
            let s = Segmenter::new(len, 24, 1364);
            assert_eq!(s.is_one_with_data(), len > 0 && s.count() == 1, "{len} bytes");
        }
        assert!(Segmenter::new(1340, 24, 1364).is_one_with_data());
        assert!(!Segmenter::new(1341, 24, 1364).is_one_with_data());
    }

    #[test]
    fn a_segment_peeked_is_the_one_taken() {
        let mut s = Segmenter::new(100, 32, 64);
        let a = s.peek();
        assert_eq!(s.peek(), a, "peek takes nothing");
        s.advance();
        assert_ne!(s.peek(), a);
        assert_eq!(a.unwrap().repr.data_length, 32);
    }

    #[test]
    fn a_message_reassembles_from_its_segments() {
        let mut r = Reassembler::new(1 << 20);
        let mut got = Vec::new();
        for s in Segmenter::new(3000, 24, 1364) {
            got.push(r.accept(&s.repr).unwrap());
        }
        assert_eq!(
            got,
            [
                Placement::Data { offset: 0, len: 1340, total: 3000, first: true, last: false },
                Placement::Data { offset: 1340, len: 1340, total: 3000, first: false, last: false },
                Placement::Data { offset: 2680, len: 320, total: 3000, first: false, last: true },
            ]
        );
        assert!(!r.in_progress());
    }

    #[test]
    fn a_message_longer_than_max_fragmented_receive_size_is_refused() {
        let mut r = Reassembler::new(1000);
        assert_eq!(r.accept(&data(0, 1000)).map(|_| ()), Ok(()));
        assert_eq!(
            r.accept(&data(1, 1000)),
            Err(ProtocolError::MessageTooLong { len: 1001, max: 1000 })
        );
        // Fields near 2^32 are summed without wrapping.
        let mut r = Reassembler::new(u32::MAX);
        assert_eq!(
            r.accept(&data(u32::MAX, 8)),
            Err(ProtocolError::MessageTooLong { len: u32::MAX as u64 + 8, max: u32::MAX })
        );
    }

    #[test]
    fn remaining_data_length_must_shrink_by_what_arrived() {
        let start = || {
            let mut r = Reassembler::new(1 << 20);
            r.accept(&data(200, 100)).unwrap();
            r
        };
        // Exactly right: 200 left, 50 arrive, 150 left.
        assert!(start().accept(&data(150, 50)).is_ok());
        // More left than before, less, nothing while bytes are missing,
        // more data than was left, and a new message's first segment where
        // the old one's next was due.
        for (remaining, len) in [(151, 50), (149, 50), (0, 199), (0, 201), (200, 8)] {
            assert_eq!(
                start().accept(&data(remaining, len)),
                Err(ProtocolError::RemainingMismatch { left: 200, data_length: len, remaining }),
                "{remaining} left after {len}"
            );
        }
    }

    #[test]
    fn an_empty_message_between_segments_changes_nothing() {
        let mut r = Reassembler::new(1 << 20);
        r.accept(&data(100, 100)).unwrap();
        assert_eq!(r.accept(&Repr::default()), Ok(Placement::Empty));
        assert_eq!(
            r.accept(&data(0, 100)),
            Ok(Placement::Data { offset: 100, len: 100, total: 200, first: false, last: true })
        );
    }
}
