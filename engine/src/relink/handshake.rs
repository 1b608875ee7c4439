//! The Relink handshake (relink 1): the version exchange, the connector's
//! request and the listener's reply.
//!
//! The peers take turns (half-duplex): connector's version, listener's
//! version, connector's request, listener's reply. Each transmission is a
//! multiple of 8 bytes, so packets that follow start 8-byte aligned.

use bitflags::bitflags;

use super::wire::{EmitError, PACKET_ALIGN, Parsed, WireError, align_up};

/// The protocol version this implementation speaks.
pub const VERSION: u8 = 0;

/// Link ids are below 2^63 (relink 1).
pub const LINK_ID_END: u64 = 1 << 63;

mod field {
    use core::ops::Range;

    /// Version transmission: the version byte, then 7 bytes of padding.
    pub const VERSION: usize = 0;
    pub const VERSION_LEN: usize = 8;

    /// Request: the name length, then the name; the fields after the name
    /// move with its length (see `RequestLayout`).
    pub const NAME_LEN: usize = 0;
    pub const NAME: usize = 1;
    /// Bytes from the end of the name to the padding: the two channel id
    /// sizes and the flags.
    pub const AFTER_NAME: usize = 3;
    /// Epoch and link id, each 8 bytes, 8-byte aligned.
    pub const IDS_LEN: usize = 16;

    /// Reply: epoch and link id.
    pub const REPLY_EPOCH: Range<usize> = 0..8;
    pub const REPLY_LINK_ID: Range<usize> = 8..16;
    pub const REPLY_LEN: usize = REPLY_LINK_ID.end;
}

const _: () = assert!(field::VERSION_LEN == PACKET_ALIGN);
const _: () = assert!(field::REPLY_LEN == 16);

bitflags! {
    /// Handshake flags (relink 1). Unknown bits are ignored when received.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct HandshakeFlags: u8 {
        /// The connector's channels use transactions.
        const CONNECTOR_TRANSACTIONS = 1 << 0;
        /// The listener's channels use transactions.
        const LISTENER_TRANSACTIONS = 1 << 1;
        /// The connector wants its old link or none.
        const REQUIRE_OLD_LINK_ID = 1 << 2;
    }
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Zero ("none") or within [1, 2^63) (relink 1).
fn check_link_id(link_id: u64) -> Result<u64, WireError> {
    if link_id < LINK_ID_END { Ok(link_id) } else { Err(WireError::LinkIdOutOfRange(link_id)) }
}

/// Either peer's version transmission (relink 1): one byte and 7 of padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRepr {
    pub version: u8,
}

impl VersionRepr {
    pub const LEN: usize = field::VERSION_LEN;

    /// Every version byte is valid; the caller decides what it supports.
    pub fn parse(buf: &[u8]) -> Parsed<Self> {
        if buf.len() < Self::LEN {
            return Parsed::Incomplete { need: Self::LEN };
        }
        Parsed::Complete { value: VersionRepr { version: buf[field::VERSION] }, len: Self::LEN }
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let Some(buf) = buf.get_mut(..Self::LEN) else {
            return Err(EmitError::BufferTooShort { need: Self::LEN, have: buf.len() });
        };
        buf.fill(0);
        buf[field::VERSION] = self.version;
        Ok(Self::LEN)
    }
}

/// The connector's request after the versions (relink 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRepr<'a> {
    /// Endpoint name: UTF-8, at most 255 bytes.
    pub name: &'a str,
    pub connector_id_len: u8,
    pub listener_id_len: u8,
    pub flags: HandshakeFlags,
    /// Old epoch, or zero.
    pub epoch: u64,
    /// Old link id, or zero.
    pub link_id: u64,
}

/// Offsets of the request fields for a name of a given length.
struct RequestLayout {
    connector_id_len: usize,
    listener_id_len: usize,
    flags: usize,
    epoch: usize,
    link_id: usize,
    len: usize,
}

impl RequestLayout {
    const fn new(name_len: usize) -> Self {
        let after_name = field::NAME + name_len;
        // relink 1: the epoch is 8-byte aligned.
        let epoch = align_up(after_name + field::AFTER_NAME, PACKET_ALIGN);
        RequestLayout {
            connector_id_len: after_name,
            listener_id_len: after_name + 1,
            flags: after_name + 2,
            epoch,
            link_id: epoch + 8,
            len: epoch + field::IDS_LEN,
        }
    }
}

// relink 1 example: a 6-byte name puts the epoch at 16 and ends at 32.
const _: () = assert!(RequestLayout::new(6).epoch == 16);
const _: () = assert!(RequestLayout::new(6).len == 32);

impl<'a> RequestRepr<'a> {
    pub fn parse(buf: &'a [u8]) -> Result<Parsed<Self>, WireError> {
        let Some(&name_len) = buf.get(field::NAME_LEN) else {
            return Ok(Parsed::Incomplete { need: RequestLayout::new(0).len });
        };
        let name_len = usize::from(name_len);
        let layout = RequestLayout::new(name_len);
        if buf.len() < layout.len {
            return Ok(Parsed::Incomplete { need: layout.len });
        }
        let name = core::str::from_utf8(&buf[field::NAME..field::NAME + name_len])
            .map_err(|_| WireError::NameNotUtf8)?;
        Ok(Parsed::Complete {
            value: RequestRepr {
                name,
                // relink 1: any size of one byte, 0..=255.
                connector_id_len: buf[layout.connector_id_len],
                listener_id_len: buf[layout.listener_id_len],
                flags: HandshakeFlags::from_bits_truncate(buf[layout.flags]),
                epoch: read_u64(buf, layout.epoch),
                link_id: check_link_id(read_u64(buf, layout.link_id))?,
            },
            len: layout.len,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        RequestLayout::new(self.name.len()).len
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        let name = self.name.as_bytes();
        let name_len = u8::try_from(name.len()).map_err(|_| EmitError::NameTooLong(name.len()))?;
        if self.link_id >= LINK_ID_END {
            return Err(EmitError::LinkIdOutOfRange(self.link_id));
        }
        let layout = RequestLayout::new(name.len());
        let have = buf.len();
        let Some(buf) = buf.get_mut(..layout.len) else {
            return Err(EmitError::BufferTooShort { need: layout.len, have });
        };
        buf.fill(0);
        buf[field::NAME_LEN] = name_len;
        buf[field::NAME..field::NAME + name.len()].copy_from_slice(name);
        buf[layout.connector_id_len] = self.connector_id_len;
        buf[layout.listener_id_len] = self.listener_id_len;
        buf[layout.flags] = self.flags.bits();
        buf[layout.epoch..layout.epoch + 8].copy_from_slice(&self.epoch.to_le_bytes());
        buf[layout.link_id..layout.link_id + 8].copy_from_slice(&self.link_id.to_le_bytes());
        Ok(layout.len)
    }
}

/// The listener's reply (relink 1): old or new epoch and link id, or a zero
/// link id when the connector required an old link the listener lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyRepr {
    pub epoch: u64,
    pub link_id: u64,
}

impl ReplyRepr {
    pub const LEN: usize = field::REPLY_LEN;

    pub fn parse(buf: &[u8]) -> Result<Parsed<Self>, WireError> {
        if buf.len() < Self::LEN {
            return Ok(Parsed::Incomplete { need: Self::LEN });
        }
        Ok(Parsed::Complete {
            value: ReplyRepr {
                epoch: read_u64(buf, field::REPLY_EPOCH.start),
                link_id: check_link_id(read_u64(buf, field::REPLY_LINK_ID.start))?,
            },
            len: Self::LEN,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        Self::LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, EmitError> {
        if self.link_id >= LINK_ID_END {
            return Err(EmitError::LinkIdOutOfRange(self.link_id));
        }
        let have = buf.len();
        let Some(buf) = buf.get_mut(..Self::LEN) else {
            return Err(EmitError::BufferTooShort { need: Self::LEN, have });
        };
        buf[field::REPLY_EPOCH].copy_from_slice(&self.epoch.to_le_bytes());
        buf[field::REPLY_LINK_ID].copy_from_slice(&self.link_id.to_le_bytes());
        Ok(Self::LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SENTINEL: u8 = 0xa5;

    // relink 1 example: the connector's request with a 6-byte name.
    const REQUEST_6: [u8; 32] = [
        6, b'a', b'b', b'c', // name length, name
        b'd', b'e', b'f', 1, // name (cont'd), connector's channel id size
        2, 0x05, 0, 0, // listener's channel id size, flags, pad
        0, 0, 0, 0, // pad to 8
        8, 7, 6, 5, 4, 3, 2, 1, // old epoch
        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, // old link id
    ];

    fn request_6() -> RequestRepr<'static> {
        RequestRepr {
            name: "abcdef",
            connector_id_len: 1,
            listener_id_len: 2,
            flags: HandshakeFlags::CONNECTOR_TRANSACTIONS | HandshakeFlags::REQUIRE_OLD_LINK_ID,
            epoch: 0x0102_0304_0506_0708,
            link_id: 0x1112_1314_1516_1718,
        }
    }

    #[test]
    fn golden_connector_request() {
        let repr = request_6();
        assert_eq!(RequestRepr::parse(&REQUEST_6), Ok(Parsed::Complete { value: repr, len: 32 }));
        assert_eq!(repr.buffer_len(), 32);
        let mut buf = [SENTINEL; 48];
        assert_eq!(repr.emit(&mut buf), Ok(32));
        assert_eq!(&buf[..32], &REQUEST_6);
        assert!(buf[32..].iter().all(|&b| b == SENTINEL));
        for cut in 0..32 {
            assert!(matches!(
                RequestRepr::parse(&REQUEST_6[..cut]),
                Ok(Parsed::Incomplete { need }) if need > cut
            ));
        }
    }

    #[test]
    fn golden_versions_and_reply() {
        let mut buf = [SENTINEL; 12];
        assert_eq!(VersionRepr { version: 0 }.emit(&mut buf), Ok(8));
        assert_eq!(buf, [0, 0, 0, 0, 0, 0, 0, 0, SENTINEL, SENTINEL, SENTINEL, SENTINEL]);
        // relink: padding is ignored when received.
        assert_eq!(
            VersionRepr::parse(&[3, 9, 9, 9, 9, 9, 9, 9]),
            Parsed::Complete { value: VersionRepr { version: 3 }, len: 8 }
        );
        assert_eq!(VersionRepr::parse(&[0; 7]), Parsed::Incomplete { need: 8 });

        let reply = ReplyRepr { epoch: 0x0102_0304_0506_0708, link_id: 42 };
        let bytes = [8, 7, 6, 5, 4, 3, 2, 1, 42, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(ReplyRepr::parse(&bytes), Ok(Parsed::Complete { value: reply, len: 16 }));
        let mut buf = [SENTINEL; 20];
        assert_eq!(reply.emit(&mut buf), Ok(16));
        assert_eq!(&buf[..16], &bytes);
        assert!(buf[16..].iter().all(|&b| b == SENTINEL));
    }

    #[test]
    fn unknown_flag_bits_and_padding_are_ignored() {
        let mut bytes = REQUEST_6;
        bytes[9] |= 0xf8;
        bytes[10..16].fill(0xee);
        assert_eq!(
            RequestRepr::parse(&bytes),
            Ok(Parsed::Complete { value: request_6(), len: 32 })
        );
    }

    #[test]
    fn channel_id_sizes_up_to_255_are_carried() {
        // relink 1: each size is one byte; every value is a size.
        for len in [9, 64, 255] {
            let mut bytes = REQUEST_6;
            bytes[7] = len;
            bytes[8] = len;
            let value = RequestRepr { connector_id_len: len, listener_id_len: len, ..request_6() };
            assert_eq!(RequestRepr::parse(&bytes), Ok(Parsed::Complete { value, len: 32 }));
            let mut buf = [SENTINEL; 32];
            assert_eq!(value.emit(&mut buf), Ok(32));
            assert_eq!(buf, bytes);
        }
    }

    #[test]
    fn malformed_handshakes_are_typed_errors() {
        let mut bad_name = REQUEST_6;
        bad_name[2] = 0xff;
        assert_eq!(RequestRepr::parse(&bad_name), Err(WireError::NameNotUtf8));

        let mut link = REQUEST_6;
        link[24..32].copy_from_slice(&LINK_ID_END.to_le_bytes());
        assert_eq!(RequestRepr::parse(&link), Err(WireError::LinkIdOutOfRange(LINK_ID_END)));

        let mut reply = [0; 16];
        reply[8..].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(ReplyRepr::parse(&reply), Err(WireError::LinkIdOutOfRange(u64::MAX)));
        // Zero is "none" on the wire; the link decides whether it is allowed.
        assert!(matches!(
            ReplyRepr::parse(&[0; 16]),
            Ok(Parsed::Complete { value: ReplyRepr { link_id: 0, .. }, .. })
        ));
    }

    #[test]
    fn emit_refuses_what_does_not_fit() {
        let long = "x".repeat(256);
        let mut repr = request_6();
        repr.name = &long;
        let mut buf = [0; 512];
        assert_eq!(repr.emit(&mut buf), Err(EmitError::NameTooLong(256)));
        let mut repr = request_6();
        repr.link_id = LINK_ID_END;
        assert_eq!(repr.emit(&mut buf), Err(EmitError::LinkIdOutOfRange(LINK_ID_END)));
        let repr = request_6();
        assert_eq!(
            repr.emit(&mut buf[..31]),
            Err(EmitError::BufferTooShort { need: 32, have: 31 })
        );
    }

    #[test]
    fn mutated_handshakes_never_panic() {
        let mut state = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..100_000 {
            let mut bytes = REQUEST_6.to_vec();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            bytes.truncate((next() % 40) as usize);
            if let Ok(Parsed::Complete { value, len }) = RequestRepr::parse(&bytes) {
                assert_eq!(value.buffer_len(), len);
                assert!(len <= bytes.len());
            }
            let _ = ReplyRepr::parse(&bytes);
            let _ = VersionRepr::parse(&bytes);
        }
    }

    proptest! {
        #[test]
        fn requests_round_trip(
            name in "\\PC{0,40}",
            connector_id_len in any::<u8>(),
            listener_id_len in any::<u8>(),
            flags in 0u8..8,
            epoch in any::<u64>(),
            link_id in 0..LINK_ID_END,
        ) {
            prop_assume!(name.len() <= 255);
            let repr = RequestRepr {
                name: &name,
                connector_id_len,
                listener_id_len,
                flags: HandshakeFlags::from_bits_truncate(flags),
                epoch,
                link_id,
            };
            let len = repr.buffer_len();
            prop_assert_eq!(len % PACKET_ALIGN, 0);
            let mut buf = vec![SENTINEL; len + 8];
            prop_assert_eq!(repr.emit(&mut buf), Ok(len));
            prop_assert!(buf[len..].iter().all(|&b| b == SENTINEL));
            prop_assert_eq!(RequestRepr::parse(&buf), Ok(Parsed::Complete { value: repr, len }));
        }

        #[test]
        fn replies_round_trip(epoch in any::<u64>(), link_id in 0..LINK_ID_END) {
            let repr = ReplyRepr { epoch, link_id };
            let mut buf = [0; 16];
            prop_assert_eq!(repr.emit(&mut buf), Ok(16));
            prop_assert_eq!(ReplyRepr::parse(&buf), Ok(Parsed::Complete { value: repr, len: 16 }));
        }
    }
}
