//! Relink packets (relink 2): the common header, general packets, channel
//! operations and acknowledgements, sequence packets and messages.
//!
//! [`PacketRepr`] is the value form of one packet. `parse` reads one packet
//! from the front of a byte stream, `buffer_len` says how many bytes `emit`
//! writes, and `emit` writes the packet with every padding byte zeroed.
//! Channel ids are carried in as many bytes as the handshake negotiated
//! ([`IdSizes`], up to 255); payloads, channel ids and multicast id vectors
//! are borrowed, never copied.

use core::borrow::Borrow;
use core::cmp::Ordering;
use core::fmt;
use core::hash::{Hash, Hasher};
use std::sync::Arc;

use thiserror::Error;

/// Every packet is padded at its end to a multiple of this (relink 2.1).
pub const PACKET_ALIGN: usize = 8;

/// The widest channel id: relink 1 negotiates its size in one byte.
pub const MAX_CHANNEL_ID_LEN: u8 = u8::MAX;

/// Significant bytes of a channel id kept inline; wider ones are shared.
const INLINE_ID_LEN: usize = 8;

mod field {
    use core::ops::Range;

    /// Header byte 0: channel bit, multicast bit, format and format-specific
    /// data (relink 2.1).
    pub const HEADER_FLAGS: usize = 0;
    /// Header byte 1: short message length (relink 2.1).
    pub const SHORT_LEN: usize = 1;
    pub const HEADER_LEN: usize = 2;
    /// A unicast channel id follows the header directly (relink 2.3).
    pub const UNICAST_ID: usize = HEADER_LEN;
    /// Multicast: 2 bytes of padding, then the channel id count (relink 2.3).
    pub const MULTICAST_COUNT: Range<usize> = 4..8;
    pub const MULTICAST_IDS: usize = MULTICAST_COUNT.end;
    /// A general packet is the header padded to 8 bytes (relink 2.2).
    pub const GENERAL_LEN: usize = 8;
    /// Sequence numbers are 4 bytes, 4-byte aligned (relink 2.3.2).
    pub const SEQ_LEN: usize = 4;
    /// The long message length is 4 bytes (relink 2.3.3.1).
    pub const LONG_LEN: usize = 4;
    /// Payload sizes: 2 bytes small, 8 bytes large (relink 2.3.3.2).
    pub const SMALL_SIZE_LEN: usize = 2;
    pub const LARGE_SIZE_LEN: usize = 8;
}

const _: () = assert!(field::HEADER_LEN == 2);
const _: () = assert!(field::MULTICAST_IDS == 8);
const _: () = assert!(field::GENERAL_LEN == PACKET_ALIGN);

// relink 2.1: header byte 0, bit 0 is the least significant.
const CHANNEL_BIT: u8 = 1 << 0;
const MULTICAST_BIT: u8 = 1 << 1;
const FORMAT_SHIFT: u32 = 2;
const FORMAT_MASK: u8 = 0b111;
const DATA_SHIFT: u32 = 5;
// relink 2.3.3: message flags in the format-specific data.
const LONG_FLAG: u8 = 1 << 0;
const LARGE_FLAG: u8 = 1 << 1;

/// Rounds `n` up to a multiple of `align` (a power of two), saturating.
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
    match n.checked_add(align - 1) {
        Some(v) => v & !(align - 1),
        None => usize::MAX & !(align - 1),
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two); `None` on overflow.
const fn align_up_u64(n: u64, align: u64) -> Option<u64> {
    match n.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}

/// Little-endian unsigned integer of `bytes.len()` (at most 8) bytes.
pub(crate) fn read_uint(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

/// Writes the low `out.len()` (at most 8) bytes of `value`, little-endian.
pub(crate) fn write_uint(out: &mut [u8], value: u64) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = (value >> (8 * i)) as u8;
    }
}

/// `bytes` without its trailing zero bytes: what of a little-endian id
/// matters.
fn significant(bytes: &[u8]) -> &[u8] {
    let len = bytes.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
    &bytes[..len]
}

/// Bytes `value` needs, little-endian.
const fn u64_len(value: u64) -> usize {
    (u64::BITS - value.leading_zeros()).div_ceil(8) as usize
}

/// Why bytes are not a channel id.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChannelIdError {
    /// relink 1: an id size is one byte of the handshake.
    #[error("channel id of {len} bytes is longer than 255")]
    TooLong { len: usize },
}

/// A channel id (relink 2.3): as many bytes as the handshake negotiated for
/// its direction, up to 255. It reads as a little-endian unsigned integer,
/// so 7 names the same channel in a 1-byte id and in a 255-byte one: ids of
/// up to 8 bytes convert from and to `u64`, wider ones come from
/// [`from_le_bytes`](Self::from_le_bytes).
#[derive(Clone)]
pub struct ChannelId(IdRepr);

#[derive(Clone)]
enum IdRepr {
    /// Up to 8 significant bytes; `len` of them are used.
    Inline { len: u8, bytes: [u8; INLINE_ID_LEN] },
    /// More than 8 significant bytes, shared so that events and errors
    /// that name the channel copy none.
    Wide(Arc<[u8]>),
}

impl ChannelId {
    /// The id whose little-endian bytes are `bytes`; trailing zeros do not
    /// matter. More than 255 bytes are no id.
    pub fn from_le_bytes(bytes: &[u8]) -> Result<Self, ChannelIdError> {
        if bytes.len() > usize::from(MAX_CHANNEL_ID_LEN) {
            return Err(ChannelIdError::TooLong { len: bytes.len() });
        }
        Ok(Self::from_significant(significant(bytes)))
    }

    /// From at most 255 bytes without trailing zeros.
    fn from_significant(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE_ID_LEN {
            let mut inline = [0; INLINE_ID_LEN];
            inline[..bytes.len()].copy_from_slice(bytes);
            ChannelId(IdRepr::Inline { len: bytes.len() as u8, bytes: inline })
        } else {
            ChannelId(IdRepr::Wide(bytes.into()))
        }
    }

    /// Its little-endian bytes without trailing zeros: the fewest that
    /// carry it.
    pub fn as_le_bytes(&self) -> &[u8] {
        match &self.0 {
            IdRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            IdRepr::Wide(bytes) => bytes,
        }
    }

    /// The id as a number, if it fits 8 bytes.
    pub fn to_u64(&self) -> Option<u64> {
        match self.0 {
            IdRepr::Inline { bytes, .. } => Some(u64::from_le_bytes(bytes)),
            IdRepr::Wide(_) => None,
        }
    }

    /// Whether it can be carried in `len` bytes.
    pub fn fits(&self, len: u8) -> bool {
        self.as_le_bytes().len() <= usize::from(len)
    }

    /// The borrowed form packets take.
    pub fn as_id_ref(&self) -> ChannelIdRef<'_> {
        match &self.0 {
            IdRepr::Inline { bytes, .. } => ChannelIdRef(RefRepr::Num(u64::from_le_bytes(*bytes))),
            IdRepr::Wide(bytes) => ChannelIdRef(RefRepr::Wide(bytes)),
        }
    }
}

impl From<u64> for ChannelId {
    fn from(id: u64) -> Self {
        let len = u64_len(id) as u8;
        ChannelId(IdRepr::Inline { len, bytes: id.to_le_bytes() })
    }
}

impl From<&ChannelId> for ChannelId {
    fn from(id: &ChannelId) -> Self {
        id.clone()
    }
}

impl From<ChannelIdRef<'_>> for ChannelId {
    fn from(id: ChannelIdRef<'_>) -> Self {
        match id.0 {
            RefRepr::Num(n) => ChannelId::from(n),
            RefRepr::Wide(bytes) => ChannelId::from_significant(bytes),
        }
    }
}

// Equality, order and hash are those of the significant bytes, so that a
// map keyed by ids can be searched with a packet's bytes.
impl PartialEq for ChannelId {
    fn eq(&self, other: &Self) -> bool {
        self.as_le_bytes() == other.as_le_bytes()
    }
}

impl Eq for ChannelId {}

impl PartialEq<u64> for ChannelId {
    fn eq(&self, other: &u64) -> bool {
        self.to_u64() == Some(*other)
    }
}

impl PartialOrd for ChannelId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ChannelId {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_le_bytes().cmp(other.as_le_bytes())
    }
}

impl Hash for ChannelId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_le_bytes().hash(state);
    }
}

impl Borrow<[u8]> for ChannelId {
    fn borrow(&self) -> &[u8] {
        self.as_le_bytes()
    }
}

/// Decimal up to 8 bytes, hexadecimal beyond.
impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_u64() {
            Some(n) => fmt::Display::fmt(&n, f),
            None => fmt::LowerHex::fmt(self, f),
        }
    }
}

impl fmt::Debug for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The integer in hexadecimal, most significant byte first.
impl fmt::LowerHex for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.to_u64() {
            return fmt::LowerHex::fmt(&n, f);
        }
        if f.alternate() {
            f.write_str("0x")?;
        }
        self.as_le_bytes().iter().rev().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// A channel id as a packet carries it, borrowed: the caller's
/// [`ChannelId`] or number, or the bytes of a received packet.
#[derive(Clone, Copy)]
pub struct ChannelIdRef<'a>(RefRepr<'a>);

#[derive(Clone, Copy)]
enum RefRepr<'a> {
    /// Up to 8 significant bytes.
    Num(u64),
    /// More than 8 significant bytes, without trailing zeros.
    Wide(&'a [u8]),
}

impl<'a> ChannelIdRef<'a> {
    /// The id in a packet's id field (any width).
    fn from_wire(field: &'a [u8]) -> Self {
        let bytes = significant(field);
        if bytes.len() <= INLINE_ID_LEN {
            ChannelIdRef(RefRepr::Num(read_uint(bytes)))
        } else {
            ChannelIdRef(RefRepr::Wide(bytes))
        }
    }

    /// Its little-endian bytes without trailing zeros; `scratch` holds
    /// those of a number.
    pub fn le_bytes<'s>(&self, scratch: &'s mut [u8; 8]) -> &'s [u8]
    where
        'a: 's,
    {
        match self.0 {
            RefRepr::Num(n) => {
                *scratch = n.to_le_bytes();
                &scratch[..u64_len(n)]
            }
            RefRepr::Wide(bytes) => bytes,
        }
    }

    /// The id as a number, if it fits 8 bytes.
    pub fn to_u64(&self) -> Option<u64> {
        match self.0 {
            RefRepr::Num(n) => Some(n),
            RefRepr::Wide(_) => None,
        }
    }

    /// Whether it can be carried in `len` bytes.
    pub fn fits(&self, len: u8) -> bool {
        let need = match self.0 {
            RefRepr::Num(n) => u64_len(n),
            RefRepr::Wide(bytes) => bytes.len(),
        };
        need <= usize::from(len)
    }

    /// Writes the id into a whole id field, zero-extended. It must fit.
    fn write(&self, field: &mut [u8]) {
        let mut scratch = [0; INLINE_ID_LEN];
        let bytes = self.le_bytes(&mut scratch);
        let (used, rest) = field.split_at_mut(bytes.len());
        used.copy_from_slice(bytes);
        rest.fill(0);
    }
}

impl From<u64> for ChannelIdRef<'_> {
    fn from(id: u64) -> Self {
        ChannelIdRef(RefRepr::Num(id))
    }
}

impl<'a> From<&'a ChannelId> for ChannelIdRef<'a> {
    fn from(id: &'a ChannelId) -> Self {
        id.as_id_ref()
    }
}

impl PartialEq for ChannelIdRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self.0, other.0) {
            (RefRepr::Num(a), RefRepr::Num(b)) => a == b,
            (RefRepr::Wide(a), RefRepr::Wide(b)) => a == b,
            // Each form holds the ids the other cannot.
            _ => false,
        }
    }
}

impl Eq for ChannelIdRef<'_> {}

impl PartialEq<u64> for ChannelIdRef<'_> {
    fn eq(&self, other: &u64) -> bool {
        self.to_u64() == Some(*other)
    }
}

impl fmt::Debug for ChannelIdRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&ChannelId::from(*self), f)
    }
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $error:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
        }

        impl From<$name> for u8 {
            fn from(value: $name) -> u8 {
                value as u8
            }
        }

        // relink: an unused enumeration value terminates the connection, so
        // it never becomes a value; it is the typed error.
        impl TryFrom<u8> for $name {
            type Error = WireError;
            fn try_from(value: u8) -> Result<Self, WireError> {
                match value {
                    $( $value => Ok(Self::$variant), )+
                    other => Err(WireError::$error(other)),
                }
            }
        }
    };
}

wire_enum! {
    /// General packet types (relink 2.2).
    GeneralType, UnknownGeneralType {
        /// No operation: 8 zero bytes, usable as padding between packets.
        Nop = 0,
        Ping = 1,
        Pong = 2,
        Resume = 3,
        Shutdown = 4,
    }
}

wire_enum! {
    /// Channel packet formats (relink 2.1). The least significant bit is the
    /// direction: even formats use the sender's channel id space, odd ones
    /// the receiver's.
    ChannelFormat, UnknownChannelFormat {
        Operation = 0,
        Acknowledgement = 1,
        SequenceOperation = 2,
        SequenceAcknowledgement = 3,
        Message = 4,
    }
}

wire_enum! {
    /// Channel operation packet types (relink 2.3.1).
    ChannelOp, UnknownChannelOp {
        Commit = 0,
        Rollback = 1,
        Close = 2,
    }
}

wire_enum! {
    /// Channel acknowledgement packet types (relink 2.3.1).
    ChannelAck, UnknownChannelAck {
        Received = 0,
        Consumed = 1,
        Committed = 2,
        Uncommitted = 3,
        Closed = 4,
    }
}

wire_enum! {
    /// Sequence operation packet types (relink 2.3.2).
    SequenceOp, UnknownSequenceOp {
        Commit = 0,
        Rollback = 1,
    }
}

wire_enum! {
    /// Sequence acknowledgement packet types (relink 2.3.2).
    SequenceAck, UnknownSequenceAck {
        Received = 0,
        Consumed = 1,
        Committed = 2,
        Uncommitted = 3,
    }
}

impl ChannelFormat {
    /// Whether packets of this format name the sender's channels (relink 2.1).
    pub const fn uses_sender_ids(self) -> bool {
        (self as u8) & 1 == 0
    }
}

/// What is wrong with received bytes. Every variant terminates the link.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("unknown general packet type {0}")]
    UnknownGeneralType(u8),
    #[error("unknown channel packet format {0}")]
    UnknownChannelFormat(u8),
    #[error("unknown channel operation {0}")]
    UnknownChannelOp(u8),
    #[error("unknown channel acknowledgement {0}")]
    UnknownChannelAck(u8),
    #[error("unknown sequence operation {0}")]
    UnknownSequenceOp(u8),
    #[error("unknown sequence acknowledgement {0}")]
    UnknownSequenceAck(u8),
    #[error("packet of at least {len} bytes exceeds the limit of {max}")]
    PacketTooLong { len: u64, max: usize },
    #[error("{count} channel ids exceed the limit of {max}")]
    TooManyChannelIds { count: u32, max: u32 },
    #[error("{count} message parts exceed the limit of {max}")]
    TooManyParts { count: u32, max: u32 },
    #[error("endpoint name is not valid UTF-8")]
    NameNotUtf8,
    #[error("link id {0:#x} is outside [1, 2^63)")]
    LinkIdOutOfRange(u64),
    #[error("truncated: need at least {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
}

/// Why a value cannot be written. These are caller mistakes, not wire faults.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EmitError {
    #[error("buffer too short: need {need} bytes, have {have}")]
    BufferTooShort { need: usize, have: usize },
    #[error("channel id {id:#x} does not fit in {len} bytes")]
    ChannelIdTooWide { id: ChannelId, len: u8 },
    #[error("{0} channel ids do not fit a 32-bit count")]
    TooManyChannelIds(usize),
    #[error("{0} message parts do not fit a 32-bit length")]
    TooManyParts(usize),
    #[error("{0} message parts need the long flag")]
    NeedsLong(usize),
    #[error("a {0}-byte part needs the large flag")]
    NeedsLarge(usize),
    #[error("endpoint name of {0} bytes is longer than 255")]
    NameTooLong(usize),
    #[error("link id {0:#x} is outside [1, 2^63)")]
    LinkIdOutOfRange(u64),
}

/// Outcome of parsing from the front of a stream: a whole value, or how many
/// bytes are needed at least before trying again. Streams deliver partial
/// packets, so running short is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The value and the number of bytes it took, padding included.
    Complete { value: T, len: usize },
    /// More bytes are needed: at least `need` in all.
    Incomplete { need: usize },
}

impl<T> Parsed<T> {
    /// For a buffer that holds everything there is (`have` bytes): the value,
    /// or [`WireError::Truncated`].
    pub fn complete(self, have: usize) -> Result<(T, usize), WireError> {
        match self {
            Parsed::Complete { value, len } => Ok((value, len)),
            Parsed::Incomplete { need } => Err(WireError::Truncated { need, have }),
        }
    }
}

/// Negotiated channel id sizes, seen from one packet's sender (relink 2.3):
/// operations, sequence operations and messages name the sender's channels,
/// acknowledgements the receiver's. Each is 0..=255 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdSizes {
    sender: u8,
    receiver: u8,
}

impl IdSizes {
    pub const fn new(sender: u8, receiver: u8) -> Self {
        IdSizes { sender, receiver }
    }

    /// Id size of the channels owned by the packet's sender.
    pub const fn sender(self) -> u8 {
        self.sender
    }

    /// Id size of the channels owned by the packet's receiver.
    pub const fn receiver(self) -> u8 {
        self.receiver
    }

    /// The same sizes seen from the other peer.
    pub const fn reversed(self) -> Self {
        IdSizes { sender: self.receiver, receiver: self.sender }
    }

    const fn for_format(self, format: ChannelFormat) -> u8 {
        if format.uses_sender_ids() { self.sender } else { self.receiver }
    }
}

/// Bounds on what `parse` accepts. Relink allows 2^32-1 channel ids, parts
/// and 2^64-1-byte parts; implementations may impose stricter limits
/// (relink 2.3, 2.3.3.1, 2.3.3.2), and a stream parser must, or a hostile
/// length would make it wait for bytes forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireLimits {
    /// Longest packet, padding included.
    pub max_packet_len: usize,
    /// Most channel ids in one multicast packet.
    pub max_channel_ids: u32,
    /// Most parts in one message.
    pub max_parts: u32,
}

impl Default for WireLimits {
    fn default() -> Self {
        WireLimits { max_packet_len: 16 << 20, max_channel_ids: 4096, max_parts: 4096 }
    }
}

/// A multicast channel id vector: either the caller's ids (to emit) or the
/// ids as they sit in a received packet.
#[derive(Clone, Copy)]
pub struct ChannelIds<'a>(IdsInner<'a>);

#[derive(Clone, Copy)]
enum IdsInner<'a> {
    Nums(&'a [u64]),
    Ids(&'a [ChannelId]),
    Wire { bytes: &'a [u8], id_len: u8, count: u32 },
}

impl<'a> ChannelIds<'a> {
    pub const fn from_slice(ids: &'a [u64]) -> Self {
        ChannelIds(IdsInner::Nums(ids))
    }

    pub const fn from_ids(ids: &'a [ChannelId]) -> Self {
        ChannelIds(IdsInner::Ids(ids))
    }

    pub fn len(&self) -> usize {
        match self.0 {
            IdsInner::Nums(ids) => ids.len(),
            IdsInner::Ids(ids) => ids.len(),
            IdsInner::Wire { count, .. } => count as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> ChannelIdIter<'a> {
        ChannelIdIter { ids: *self, index: 0 }
    }

    fn get(&self, index: usize) -> Option<ChannelIdRef<'a>> {
        match self.0 {
            IdsInner::Nums(ids) => ids.get(index).map(|&id| id.into()),
            IdsInner::Ids(ids) => ids.get(index).map(ChannelId::as_id_ref),
            IdsInner::Wire { count, .. } if index >= count as usize => None,
            // relink 2.3: with size zero no id data is sent; every id is 0.
            IdsInner::Wire { id_len: 0, .. } => Some(0.into()),
            IdsInner::Wire { bytes, id_len, .. } => {
                let len = usize::from(id_len);
                let at = index.checked_mul(len)?;
                bytes.get(at..at.checked_add(len)?).map(ChannelIdRef::from_wire)
            }
        }
    }
}

impl PartialEq for ChannelIds<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for ChannelIds<'_> {}

impl fmt::Debug for ChannelIds<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over [`ChannelIds`].
#[derive(Debug, Clone)]
pub struct ChannelIdIter<'a> {
    ids: ChannelIds<'a>,
    index: usize,
}

impl<'a> Iterator for ChannelIdIter<'a> {
    type Item = ChannelIdRef<'a>;

    fn next(&mut self) -> Option<ChannelIdRef<'a>> {
        let id = self.ids.get(self.index)?;
        self.index += 1;
        Some(id)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.ids.len().saturating_sub(self.index);
        (left, Some(left))
    }
}

/// The channel(s) a channel packet is for (relink 2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Unicast(ChannelIdRef<'a>),
    /// Repeated ids mean repeated delivery (relink 2.3).
    Multicast(ChannelIds<'a>),
}

impl<'a> Target<'a> {
    /// Every targeted channel id, repeats included.
    pub fn iter(&self) -> TargetIter<'a> {
        match *self {
            Target::Unicast(id) => TargetIter::Unicast(Some(id)),
            Target::Multicast(ids) => TargetIter::Multicast(ids.iter()),
        }
    }

    /// Bytes after the header: the id, or padding, count and id vector.
    fn wire_len(&self, id_len: u8) -> usize {
        match self {
            Target::Unicast(_) => usize::from(id_len),
            Target::Multicast(ids) => (field::MULTICAST_IDS - field::HEADER_LEN)
                .saturating_add(ids.len().saturating_mul(usize::from(id_len))),
        }
    }

    fn check(&self, id_len: u8) -> Result<(), EmitError> {
        let check_id = |id: ChannelIdRef<'_>| {
            if id.fits(id_len) {
                Ok(())
            } else {
                Err(EmitError::ChannelIdTooWide { id: id.into(), len: id_len })
            }
        };
        match self {
            Target::Unicast(id) => check_id(*id),
            Target::Multicast(ids) => {
                if u32::try_from(ids.len()).is_err() {
                    return Err(EmitError::TooManyChannelIds(ids.len()));
                }
                ids.iter().try_for_each(check_id)
            }
        }
    }

    /// Writes the target after the header; returns the offset after it.
    /// The buffer is zeroed and long enough.
    fn emit(&self, buf: &mut [u8], id_len: u8) -> usize {
        let len = usize::from(id_len);
        match self {
            Target::Unicast(id) => {
                let end = field::UNICAST_ID + len;
                id.write(&mut buf[field::UNICAST_ID..end]);
                end
            }
            Target::Multicast(ids) => {
                buf[field::MULTICAST_COUNT].copy_from_slice(&(ids.len() as u32).to_le_bytes());
                let mut at = field::MULTICAST_IDS;
                for id in ids.iter() {
                    id.write(&mut buf[at..at + len]);
                    at += len;
                }
                at
            }
        }
    }
}

/// Iterator over the channel ids of a [`Target`].
#[derive(Debug, Clone)]
pub enum TargetIter<'a> {
    Unicast(Option<ChannelIdRef<'a>>),
    Multicast(ChannelIdIter<'a>),
}

impl<'a> Iterator for TargetIter<'a> {
    type Item = ChannelIdRef<'a>;

    fn next(&mut self) -> Option<ChannelIdRef<'a>> {
        match self {
            TargetIter::Unicast(id) => id.take(),
            TargetIter::Multicast(ids) => ids.next(),
        }
    }
}

/// The payload parts of a message: either the caller's slices (to emit) or
/// the size and data vectors of a received packet.
#[derive(Clone, Copy)]
pub struct Parts<'a>(PartsInner<'a>);

#[derive(Clone, Copy)]
enum PartsInner<'a> {
    Slice(&'a [&'a [u8]]),
    Wire { sizes: &'a [u8], large: bool, count: u32, data: &'a [u8] },
}

impl<'a> Parts<'a> {
    pub const fn from_slice(parts: &'a [&'a [u8]]) -> Self {
        Parts(PartsInner::Slice(parts))
    }

    /// Number of parts (the message length of relink 2.3.3.1).
    pub fn len(&self) -> usize {
        match self.0 {
            PartsInner::Slice(parts) => parts.len(),
            PartsInner::Wire { count, .. } => count as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> PartIter<'a> {
        PartIter { parts: *self, index: 0, data_at: 0 }
    }

    /// Copies every part out.
    pub fn to_vecs(&self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }

    fn sizes(&self) -> impl Iterator<Item = usize> + 'a {
        self.iter().map(<[u8]>::len)
    }
}

impl PartialEq for Parts<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Parts<'_> {}

impl fmt::Debug for Parts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over the parts of a message.
#[derive(Debug, Clone)]
pub struct PartIter<'a> {
    parts: Parts<'a>,
    index: usize,
    data_at: usize,
}

impl<'a> Iterator for PartIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self.parts.0 {
            PartsInner::Slice(parts) => {
                let part = parts.get(self.index)?;
                self.index += 1;
                Some(part)
            }
            PartsInner::Wire { sizes, large, count, data } => {
                if self.index >= count as usize {
                    return None;
                }
                let width = if large { field::LARGE_SIZE_LEN } else { field::SMALL_SIZE_LEN };
                let at = self.index * width;
                let size = usize::try_from(read_uint(sizes.get(at..at + width)?)).ok()?;
                let end = self.data_at.checked_add(size)?;
                let part = data.get(self.data_at..end)?;
                // relink 2.3.3.3: each part is padded to 8 bytes.
                self.data_at = align_up(end, PACKET_ALIGN);
                self.index += 1;
                Some(part)
            }
        }
    }
}

/// A message packet (relink 2.3.3). `long` and `large` are the wire flags:
/// [`MessageRepr::new`] picks the smallest encoding, but a received packet
/// keeps whatever its sender chose so that parse and emit round-trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRepr<'a> {
    pub target: Target<'a>,
    /// The part count is a 32-bit field instead of header byte 1.
    pub long: bool,
    /// Part sizes are 64-bit instead of 16-bit.
    pub large: bool,
    pub parts: Parts<'a>,
}

impl<'a> MessageRepr<'a> {
    /// A message in its smallest encoding.
    pub fn new(target: Target<'a>, parts: &'a [&'a [u8]]) -> Self {
        MessageRepr {
            target,
            long: parts.len() > usize::from(u8::MAX),
            large: parts.iter().any(|p| p.len() > usize::from(u16::MAX)),
            parts: Parts::from_slice(parts),
        }
    }

    fn layout(&self, id_len: u8) -> MessageLayout {
        MessageLayout::new(
            self.target.wire_len(id_len),
            self.long,
            self.large,
            self.parts.len(),
            self.parts.sizes(),
        )
    }
}

/// Offsets of a message's fields (relink 2.3.3), saturating on overflow so
/// that an absurd value makes `emit` fail rather than wrap.
struct MessageLayout {
    long_at: usize,
    sizes_at: usize,
    data_at: usize,
    len: usize,
}

impl MessageLayout {
    fn new(
        target_len: usize,
        long: bool,
        large: bool,
        count: usize,
        sizes: impl Iterator<Item = usize>,
    ) -> Self {
        // relink 2.3.3: message fields are 2-byte aligned.
        let long_at = align_up(field::HEADER_LEN.saturating_add(target_len), 2);
        let after_len = if long { long_at.saturating_add(field::LONG_LEN) } else { long_at };
        let (sizes_at, data_at) = if large {
            // relink 2.3.3.2: the large size vector is 8-byte aligned.
            let at = align_up(after_len, PACKET_ALIGN);
            (at, at.saturating_add(count.saturating_mul(field::LARGE_SIZE_LEN)))
        } else {
            // relink 2.3.3.3: the data vector after a small one is 8-byte aligned.
            let end = after_len.saturating_add(count.saturating_mul(field::SMALL_SIZE_LEN));
            (after_len, align_up(end, PACKET_ALIGN))
        };
        let len = sizes.fold(data_at, |at, size| at.saturating_add(align_up(size, PACKET_ALIGN)));
        MessageLayout { long_at, sizes_at, data_at, len }
    }
}

/// One Relink packet (relink 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketRepr<'a> {
    /// Nop, ping, pong, resume or shutdown (relink 2.2).
    General(GeneralType),
    /// Commit, rollback or close of the sender's channel(s) (relink 2.3.1).
    Operation {
        target: Target<'a>,
        op: ChannelOp,
    },
    /// Acknowledgement about the receiver's channel(s) (relink 2.3.1).
    Acknowledgement {
        target: Target<'a>,
        ack: ChannelAck,
    },
    /// Commit or rollback through `seq` (relink 2.3.2).
    SequenceOperation {
        target: Target<'a>,
        op: SequenceOp,
        seq: u32,
    },
    /// Acknowledgement through `seq` (relink 2.3.2).
    SequenceAcknowledgement {
        target: Target<'a>,
        ack: SequenceAck,
        seq: u32,
    },
    Message(MessageRepr<'a>),
}

/// Checks a packet end against the limit and the bytes present.
struct Bounds {
    have: usize,
    max: usize,
}

impl Bounds {
    /// `Ok(None)` when `end` bytes are present; `Ok(Some(need))` when more
    /// are needed; an error when `end` exceeds the limit.
    fn check(&self, end: u64) -> Result<Option<usize>, WireError> {
        if end > self.max as u64 {
            return Err(WireError::PacketTooLong { len: end, max: self.max });
        }
        if end <= self.have as u64 {
            return Ok(None);
        }
        // Every packet ends 8-byte aligned, so at least this much is needed.
        Ok(Some(align_up(end as usize, PACKET_ALIGN)))
    }
}

macro_rules! require {
    ($bounds:expr, $end:expr) => {
        if let Some(need) = $bounds.check($end)? {
            return Ok(Parsed::Incomplete { need });
        }
    };
}

impl<'a> PacketRepr<'a> {
    /// Parses the packet at the front of `buf`.
    ///
    /// `ids` are the channel id sizes seen from the packet's sender. An
    /// unknown enumeration value is reported as soon as its byte is present,
    /// a length over `limits` as soon as it is known; otherwise a partial
    /// packet yields [`Parsed::Incomplete`]. Padding and unused bits are not
    /// looked at (relink: ignored when received).
    pub fn parse(
        buf: &'a [u8],
        ids: IdSizes,
        limits: &WireLimits,
    ) -> Result<Parsed<Self>, WireError> {
        let Some(&flags) = buf.get(field::HEADER_FLAGS) else {
            return Ok(Parsed::Incomplete { need: PACKET_ALIGN });
        };
        let bounds = Bounds { have: buf.len(), max: limits.max_packet_len };
        let data = flags >> DATA_SHIFT;

        if flags & CHANNEL_BIT == 0 {
            // relink 2.2: only the packet type bits are used.
            let kind = GeneralType::try_from(data)?;
            require!(bounds, field::GENERAL_LEN as u64);
            return Ok(Parsed::Complete {
                value: PacketRepr::General(kind),
                len: field::GENERAL_LEN,
            });
        }

        let format = ChannelFormat::try_from((flags >> FORMAT_SHIFT) & FORMAT_MASK)?;
        // Decode the packet type before any length, so that an unknown value
        // is reported from the first byte.
        let kind = match format {
            ChannelFormat::Operation => Kind::Op(ChannelOp::try_from(data)?),
            ChannelFormat::Acknowledgement => Kind::Ack(ChannelAck::try_from(data)?),
            ChannelFormat::SequenceOperation => Kind::SeqOp(SequenceOp::try_from(data)?),
            ChannelFormat::SequenceAcknowledgement => Kind::SeqAck(SequenceAck::try_from(data)?),
            // relink 2.3.3: bit 2 of the message flags is unused.
            ChannelFormat::Message => {
                Kind::Message { long: data & LONG_FLAG != 0, large: data & LARGE_FLAG != 0 }
            }
        };
        let id_len = ids.for_format(format);

        let (target, target_end) = if flags & MULTICAST_BIT != 0 {
            require!(bounds, field::MULTICAST_IDS as u64);
            let count = read_u32(buf, field::MULTICAST_COUNT.start);
            if count > limits.max_channel_ids {
                return Err(WireError::TooManyChannelIds { count, max: limits.max_channel_ids });
            }
            let end = field::MULTICAST_IDS as u64 + u64::from(id_len) * u64::from(count);
            require!(bounds, end);
            let end = end as usize;
            let ids = ChannelIds(IdsInner::Wire {
                bytes: &buf[field::MULTICAST_IDS..end],
                id_len,
                count,
            });
            (Target::Multicast(ids), end)
        } else {
            let end = field::UNICAST_ID + usize::from(id_len);
            require!(bounds, end as u64);
            (Target::Unicast(ChannelIdRef::from_wire(&buf[field::UNICAST_ID..end])), end)
        };

        let (value, len) = match kind {
            Kind::Op(op) => {
                let len = align_up(target_end, PACKET_ALIGN);
                require!(bounds, len as u64);
                (PacketRepr::Operation { target, op }, len)
            }
            Kind::Ack(ack) => {
                let len = align_up(target_end, PACKET_ALIGN);
                require!(bounds, len as u64);
                (PacketRepr::Acknowledgement { target, ack }, len)
            }
            Kind::SeqOp(op) => match parse_seq(buf, &bounds, target_end)? {
                Parsed::Complete { value: seq, len } => {
                    (PacketRepr::SequenceOperation { target, op, seq }, len)
                }
                Parsed::Incomplete { need } => return Ok(Parsed::Incomplete { need }),
            },
            Kind::SeqAck(ack) => match parse_seq(buf, &bounds, target_end)? {
                Parsed::Complete { value: seq, len } => {
                    (PacketRepr::SequenceAcknowledgement { target, ack, seq }, len)
                }
                Parsed::Incomplete { need } => return Ok(Parsed::Incomplete { need }),
            },
            Kind::Message { long, large } => {
                match parse_message(buf, &bounds, limits, target, target_end, long, large)? {
                    Parsed::Complete { value, len } => (PacketRepr::Message(value), len),
                    Parsed::Incomplete { need } => return Ok(Parsed::Incomplete { need }),
                }
            }
        };
        Ok(Parsed::Complete { value, len })
    }

    /// Bytes `emit` writes, padding included.
    pub fn buffer_len(&self, ids: IdSizes) -> usize {
        match self {
            PacketRepr::General(_) => field::GENERAL_LEN,
            PacketRepr::Operation { target, .. } => {
                op_len(target.wire_len(ids.for_format(ChannelFormat::Operation)))
            }
            PacketRepr::Acknowledgement { target, .. } => {
                op_len(target.wire_len(ids.for_format(ChannelFormat::Acknowledgement)))
            }
            PacketRepr::SequenceOperation { target, .. } => {
                seq_layout(target.wire_len(ids.for_format(ChannelFormat::SequenceOperation))).1
            }
            PacketRepr::SequenceAcknowledgement { target, .. } => {
                seq_layout(target.wire_len(ids.for_format(ChannelFormat::SequenceAcknowledgement)))
                    .1
            }
            PacketRepr::Message(message) => {
                message.layout(ids.for_format(ChannelFormat::Message)).len
            }
        }
    }

    /// The channel format, or `None` for a general packet.
    pub fn format(&self) -> Option<ChannelFormat> {
        Some(match self {
            PacketRepr::General(_) => return None,
            PacketRepr::Operation { .. } => ChannelFormat::Operation,
            PacketRepr::Acknowledgement { .. } => ChannelFormat::Acknowledgement,
            PacketRepr::SequenceOperation { .. } => ChannelFormat::SequenceOperation,
            PacketRepr::SequenceAcknowledgement { .. } => ChannelFormat::SequenceAcknowledgement,
            PacketRepr::Message(_) => ChannelFormat::Message,
        })
    }

    /// The target of a channel packet.
    pub fn target(&self) -> Option<&Target<'a>> {
        match self {
            PacketRepr::General(_) => None,
            PacketRepr::Operation { target, .. }
            | PacketRepr::Acknowledgement { target, .. }
            | PacketRepr::SequenceOperation { target, .. }
            | PacketRepr::SequenceAcknowledgement { target, .. } => Some(target),
            PacketRepr::Message(message) => Some(&message.target),
        }
    }

    /// Writes the packet to the front of `buf` and returns its length
    /// ([`buffer_len`](Self::buffer_len)). Padding is written as zero and
    /// nothing past the packet is touched.
    pub fn emit(&self, buf: &mut [u8], ids: IdSizes) -> Result<usize, EmitError> {
        let format = self.format();
        let id_len = format.map_or(0, |f| ids.for_format(f));
        if let Some(target) = self.target() {
            target.check(id_len)?;
        }
        if let PacketRepr::Message(message) = self {
            let count = message.parts.len();
            if u32::try_from(count).is_err() {
                return Err(EmitError::TooManyParts(count));
            }
            if !message.long && count > usize::from(u8::MAX) {
                return Err(EmitError::NeedsLong(count));
            }
            if !message.large
                && let Some(size) = message.parts.sizes().find(|&s| s > usize::from(u16::MAX))
            {
                return Err(EmitError::NeedsLarge(size));
            }
        }
        let len = self.buffer_len(ids);
        if buf.len() < len {
            return Err(EmitError::BufferTooShort { need: len, have: buf.len() });
        }
        let buf = &mut buf[..len];
        // relink: padding and unused bits are sent as zero.
        buf.fill(0);

        let Some(format) = format else {
            if let PacketRepr::General(kind) = self {
                buf[field::HEADER_FLAGS] = u8::from(*kind) << DATA_SHIFT;
            }
            return Ok(len);
        };
        let data = match self {
            PacketRepr::General(_) => 0,
            PacketRepr::Operation { op, .. } => u8::from(*op),
            PacketRepr::Acknowledgement { ack, .. } => u8::from(*ack),
            PacketRepr::SequenceOperation { op, .. } => u8::from(*op),
            PacketRepr::SequenceAcknowledgement { ack, .. } => u8::from(*ack),
            PacketRepr::Message(m) => {
                (if m.long { LONG_FLAG } else { 0 }) | (if m.large { LARGE_FLAG } else { 0 })
            }
        };
        let Some(target) = self.target() else {
            return Ok(len);
        };
        let multicast = matches!(target, Target::Multicast(_));
        buf[field::HEADER_FLAGS] = CHANNEL_BIT
            | if multicast { MULTICAST_BIT } else { 0 }
            | (u8::from(format) << FORMAT_SHIFT)
            | (data << DATA_SHIFT);
        let target_end = target.emit(buf, id_len);

        match self {
            PacketRepr::SequenceOperation { seq, .. }
            | PacketRepr::SequenceAcknowledgement { seq, .. } => {
                let (at, _) = seq_layout(target_end - field::HEADER_LEN);
                buf[at..at + field::SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
            }
            PacketRepr::Message(message) => emit_message(buf, message, id_len),
            _ => {}
        }
        Ok(len)
    }
}

/// The packet type read from header byte 0, before the rest is parsed.
enum Kind {
    Op(ChannelOp),
    Ack(ChannelAck),
    SeqOp(SequenceOp),
    SeqAck(SequenceAck),
    Message { long: bool, large: bool },
}

/// Length of an operation or acknowledgement packet.
fn op_len(target_len: usize) -> usize {
    align_up(field::HEADER_LEN.saturating_add(target_len), PACKET_ALIGN)
}

/// Offset of the sequence number and the packet length (relink 2.3.2).
fn seq_layout(target_len: usize) -> (usize, usize) {
    // relink 2.3.2: the sequence number is 4-byte aligned.
    let at = align_up(field::HEADER_LEN.saturating_add(target_len), 4);
    (at, align_up(at.saturating_add(field::SEQ_LEN), PACKET_ALIGN))
}

/// The 4-byte aligned sequence number (relink 2.3.2) and the packet length.
fn parse_seq(buf: &[u8], bounds: &Bounds, target_end: usize) -> Result<Parsed<u32>, WireError> {
    let (at, len) = seq_layout(target_end - field::HEADER_LEN);
    if let Some(need) = bounds.check(len as u64)? {
        return Ok(Parsed::Incomplete { need });
    }
    Ok(Parsed::Complete { value: read_u32(buf, at), len })
}

fn parse_message<'a>(
    buf: &'a [u8],
    bounds: &Bounds,
    limits: &WireLimits,
    target: Target<'a>,
    target_end: usize,
    long: bool,
    large: bool,
) -> Result<Parsed<MessageRepr<'a>>, WireError> {
    // relink 2.3.3: message fields are 2-byte aligned.
    let mut at = align_up(target_end, 2) as u64;
    let count = if long {
        // relink 2.3.3.1: a 32-bit message length.
        require!(bounds, at + field::LONG_LEN as u64);
        let count = read_u32(buf, at as usize);
        at += field::LONG_LEN as u64;
        count
    } else {
        // relink 2.3.3.1: the short length in header byte 1.
        u32::from(buf[field::SHORT_LEN])
    };
    if count > limits.max_parts {
        return Err(WireError::TooManyParts { count, max: limits.max_parts });
    }
    let (sizes_at, sizes_end, data_at) = if large {
        // relink 2.3.3.2: the large size vector is 8-byte aligned.
        let sizes_at = at.next_multiple_of(PACKET_ALIGN as u64);
        let end = sizes_at + u64::from(count) * field::LARGE_SIZE_LEN as u64;
        (sizes_at, end, end)
    } else {
        let end = at + u64::from(count) * field::SMALL_SIZE_LEN as u64;
        // relink 2.3.3.3: padding aligns the data vector to 8 bytes.
        (at, end, end.next_multiple_of(PACKET_ALIGN as u64))
    };
    require!(bounds, sizes_end);
    let sizes = &buf[sizes_at as usize..sizes_end as usize];
    let width = if large { field::LARGE_SIZE_LEN } else { field::SMALL_SIZE_LEN };
    let too_long = WireError::PacketTooLong { len: u64::MAX, max: bounds.max };
    let mut end = data_at;
    for size in sizes.chunks_exact(width) {
        // relink 2.3.3.3: each part is padded to 8 bytes.
        let padded = align_up_u64(read_uint(size), PACKET_ALIGN as u64).ok_or(too_long.clone())?;
        end = end.checked_add(padded).ok_or(too_long.clone())?;
        if end > bounds.max as u64 {
            return Err(WireError::PacketTooLong { len: end, max: bounds.max });
        }
    }
    require!(bounds, end);
    let parts =
        Parts(PartsInner::Wire { sizes, large, count, data: &buf[data_at as usize..end as usize] });
    Ok(Parsed::Complete { value: MessageRepr { target, long, large, parts }, len: end as usize })
}

/// Writes the message fields after the target; `buf` is zeroed and exactly
/// the packet's length.
fn emit_message(buf: &mut [u8], message: &MessageRepr<'_>, id_len: u8) {
    let layout = message.layout(id_len);
    let count = message.parts.len();
    if message.long {
        buf[layout.long_at..layout.long_at + field::LONG_LEN]
            .copy_from_slice(&(count as u32).to_le_bytes());
    } else {
        buf[field::SHORT_LEN] = count as u8;
    }
    let width = if message.large { field::LARGE_SIZE_LEN } else { field::SMALL_SIZE_LEN };
    let mut size_at = layout.sizes_at;
    let mut data_at = layout.data_at;
    for part in message.parts.iter() {
        write_uint(&mut buf[size_at..size_at + width], part.len() as u64);
        size_at += width;
        buf[data_at..data_at + part.len()].copy_from_slice(part);
        data_at += align_up(part.len(), PACKET_ALIGN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SENTINEL: u8 = 0xa5;

    fn limits() -> WireLimits {
        WireLimits::default()
    }

    fn ids(sender: u8, receiver: u8) -> IdSizes {
        IdSizes::new(sender, receiver)
    }

    /// Parses `bytes` as one whole packet, and emits `repr` into a buffer
    /// pre-filled with a sentinel: the output must be `bytes` exactly, with
    /// nothing past it touched.
    fn check_golden(bytes: &[u8], repr: &PacketRepr<'_>, ids: IdSizes) {
        let parsed = PacketRepr::parse(bytes, ids, &limits()).unwrap();
        assert_eq!(parsed, Parsed::Complete { value: *repr, len: bytes.len() });
        assert_eq!(repr.buffer_len(ids), bytes.len());
        let mut buf = vec![SENTINEL; bytes.len() + 24];
        assert_eq!(repr.emit(&mut buf, ids), Ok(bytes.len()));
        assert_eq!(&buf[..bytes.len()], bytes);
        assert!(buf[bytes.len()..].iter().all(|&b| b == SENTINEL));
        // Every prefix is incomplete, never an error.
        for cut in 0..bytes.len() {
            match PacketRepr::parse(&bytes[..cut], ids, &limits()) {
                Ok(Parsed::Incomplete { need }) => assert!(need > cut && need <= bytes.len()),
                other => panic!("prefix of {cut} bytes: {other:?}"),
            }
        }
    }

    // relink 2.3.3.3 example: a short, small unicast message with a 1-byte
    // channel id and parts of 3, 0 and 5 bytes.
    const SHORT_SMALL: [u8; 32] = [
        0x11, 3, 0x2a, 0, // channel | message format; 3 parts; id; pad
        3, 0, 0, 0, // sizes #0, #1
        5, 0, 0, 0, 0, 0, 0, 0, // size #2; pad to 8
        b'a', b'b', b'c', 0, 0, 0, 0, 0, // data #0, padded
        b'h', b'e', b'l', b'l', b'o', 0, 0, 0, // data #2, padded
    ];

    #[test]
    fn golden_short_small_message() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"hello"];
        let repr = PacketRepr::Message(MessageRepr::new(Target::Unicast(0x2a.into()), &parts));
        check_golden(&SHORT_SMALL, &repr, ids(1, 7));
    }

    // relink 2.3.3.3 example: a long, large multicast message to 2 channels
    // with 4-byte ids and 2 parts.
    const LONG_LARGE: [u8; 64] = [
        0x73, 0, 0, 0, // channel | multicast | message | long | large; pad
        2, 0, 0, 0, // channel id count
        4, 3, 2, 1, // id #0
        0xd, 0xc, 0xb, 0xa, // id #1
        2, 0, 0, 0, // long message length
        0, 0, 0, 0, // pad to 8
        2, 0, 0, 0, 0, 0, 0, 0, // large size #0
        9, 0, 0, 0, 0, 0, 0, 0, // large size #1
        b'x', b'y', 0, 0, 0, 0, 0, 0, // data #0
        b'1', b'2', b'3', b'4', b'5', b'6', b'7', b'8', // data #1
        b'9', 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn golden_long_large_multicast_message() {
        let channels = [0x0102_0304, 0x0a0b_0c0d];
        let parts: [&[u8]; 2] = [b"xy", b"123456789"];
        let repr = PacketRepr::Message(MessageRepr {
            target: Target::Multicast(ChannelIds::from_slice(&channels)),
            long: true,
            large: true,
            parts: Parts::from_slice(&parts),
        });
        check_golden(&LONG_LARGE, &repr, ids(4, 1));
    }

    // relink 2.3.2 example: a unicast sequence packet with an 8-byte id;
    // the sequence number is 4-byte aligned at 12.
    const SEQ_ACK_8: [u8; 16] = [
        0x2d, 0, // channel | sequence ack | consumed
        8, 7, 6, 5, 4, 3, 2, 1, // channel id
        0, 0, // pad to 4
        0xef, 0xbe, 0xad, 0xde, // sequence number
    ];

    #[test]
    fn golden_sequence_ack_with_8_byte_id() {
        let repr = PacketRepr::SequenceAcknowledgement {
            target: Target::Unicast(0x0102_0304_0506_0708.into()),
            ack: SequenceAck::Consumed,
            seq: 0xdead_beef,
        };
        // Acknowledgements name the receiver's channels.
        check_golden(&SEQ_ACK_8, &repr, ids(2, 8));
    }

    #[test]
    fn golden_sequence_op_multicast() {
        // header 2 + pad 2 + count 4 + two 3-byte ids = 14, seq at 16.
        let bytes = [0x2b, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0];
        let channels = [1, 2];
        let repr = PacketRepr::SequenceOperation {
            target: Target::Multicast(ChannelIds::from_slice(&channels)),
            op: SequenceOp::Rollback,
            seq: 7,
        };
        check_golden(&bytes, &repr, ids(3, 0));
    }

    #[test]
    fn golden_channel_op_and_ack() {
        // relink 2.3.1 example layout: unicast with a 2-byte channel id.
        let close = [0x41, 0, 0x34, 0x12, 0, 0, 0, 0];
        let repr =
            PacketRepr::Operation { target: Target::Unicast(0x1234.into()), op: ChannelOp::Close };
        check_golden(&close, &repr, ids(2, 5));

        // Multicast with id size zero: a count and no id data (relink 2.3).
        let received = [0x07, 0, 0, 0, 3, 0, 0, 0];
        let zeros = [0, 0, 0];
        let repr = PacketRepr::Acknowledgement {
            target: Target::Multicast(ChannelIds::from_slice(&zeros)),
            ack: ChannelAck::Received,
        };
        check_golden(&received, &repr, ids(8, 0));
    }

    #[test]
    fn golden_general_packets() {
        // relink 2.2: nop is 8 zero bytes.
        check_golden(&[0; 8], &PacketRepr::General(GeneralType::Nop), ids(0, 0));
        for kind in GeneralType::ALL {
            let mut bytes = [0; 8];
            bytes[0] = u8::from(*kind) << 5;
            check_golden(&bytes, &PacketRepr::General(*kind), ids(8, 8));
        }
    }

    #[test]
    fn padding_and_unused_bits_are_ignored() {
        let mut bytes = SHORT_SMALL;
        bytes[0] |= 0x80; // unused message flag bit
        for at in [3, 10, 11, 12, 13, 14, 15, 19, 20, 21, 22, 23, 29, 30, 31] {
            bytes[at] = 0xff;
        }
        let (value, len) =
            PacketRepr::parse(&bytes, ids(1, 1), &limits()).unwrap().complete(bytes.len()).unwrap();
        assert_eq!(len, 32);
        let parts: [&[u8]; 3] = [b"abc", b"", b"hello"];
        assert_eq!(
            value,
            PacketRepr::Message(MessageRepr::new(Target::Unicast(0x2a.into()), &parts))
        );

        // General packets: bits 1-4 and bytes 1-7 unused.
        let ping = [0x20 | 0x1e, 9, 9, 9, 9, 9, 9, 9];
        let parsed = PacketRepr::parse(&ping, ids(0, 0), &limits()).unwrap();
        assert_eq!(
            parsed,
            Parsed::Complete { value: PacketRepr::General(GeneralType::Ping), len: 8 }
        );

        // Byte 1 of a non-message channel packet, and multicast padding.
        let mut bytes =
            [0x07, 0xff, 0xff, 0xff, 1, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        bytes[0] = 0x07;
        let parsed = PacketRepr::parse(&bytes, ids(0, 1), &limits()).unwrap();
        let five = [5];
        assert_eq!(
            parsed,
            Parsed::Complete {
                value: PacketRepr::Acknowledgement {
                    target: Target::Multicast(ChannelIds::from_slice(&five)),
                    ack: ChannelAck::Received
                },
                len: 16
            }
        );
    }

    #[test]
    fn unknown_enumeration_values_are_errors() {
        let parse = |b0: u8| PacketRepr::parse(&[b0], ids(1, 1), &limits()).map(|_| ());
        for kind in 5..8 {
            assert_eq!(parse(kind << 5), Err(WireError::UnknownGeneralType(kind)));
        }
        for format in 5..8 {
            assert_eq!(parse(1 | (format << 2)), Err(WireError::UnknownChannelFormat(format)));
        }
        for kind in 3..8 {
            assert_eq!(parse(1 | (kind << 5)), Err(WireError::UnknownChannelOp(kind)));
        }
        for kind in 5..8 {
            assert_eq!(parse(1 | (1 << 2) | (kind << 5)), Err(WireError::UnknownChannelAck(kind)));
        }
        for kind in 2..8 {
            assert_eq!(parse(1 | (2 << 2) | (kind << 5)), Err(WireError::UnknownSequenceOp(kind)));
        }
        for kind in 4..8 {
            assert_eq!(parse(1 | (3 << 2) | (kind << 5)), Err(WireError::UnknownSequenceAck(kind)));
        }
    }

    #[test]
    fn truncated_input_is_incomplete_then_truncated() {
        let cut = &LONG_LARGE[..41];
        let parsed = PacketRepr::parse(cut, ids(4, 4), &limits()).unwrap();
        assert_eq!(parsed, Parsed::Incomplete { need: 64 });
        assert_eq!(parsed.complete(cut.len()), Err(WireError::Truncated { need: 64, have: 41 }));
        assert_eq!(
            PacketRepr::parse(&[], ids(4, 4), &limits()),
            Ok(Parsed::Incomplete { need: 8 })
        );
    }

    #[test]
    fn overlong_counts_and_lengths_are_errors() {
        let small = WireLimits { max_packet_len: 1024, max_channel_ids: 16, max_parts: 8 };
        // Multicast count over the limit, known from the first 8 bytes.
        let mut bytes = [0x03, 0, 0, 0, 17, 0, 0, 0];
        assert_eq!(
            PacketRepr::parse(&bytes, ids(4, 4), &small),
            Err(WireError::TooManyChannelIds { count: 17, max: 16 })
        );
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            PacketRepr::parse(
                &bytes,
                ids(4, 4),
                &WireLimits { max_channel_ids: u32::MAX, ..small }
            ),
            Err(WireError::PacketTooLong { len: 8 + 4 * u64::from(u32::MAX), max: 1024 })
        );
        // Long message length over the limit (at offset 2: no id bytes).
        let long = [0x31, 0, 9, 0, 0, 0, 0, 0];
        assert_eq!(
            PacketRepr::parse(&long, ids(0, 0), &small),
            Err(WireError::TooManyParts { count: 9, max: 8 })
        );
        // Short message length over the limit.
        assert_eq!(
            PacketRepr::parse(&[0x11, 9], ids(0, 0), &small),
            Err(WireError::TooManyParts { count: 9, max: 8 })
        );
        // A large size that overflows when padded, and one over the limit.
        let mut large = [0x51, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            PacketRepr::parse(&large, ids(0, 0), &small),
            Err(WireError::PacketTooLong { .. })
        ));
        large[8..16].copy_from_slice(&2000u64.to_le_bytes());
        assert_eq!(
            PacketRepr::parse(&large, ids(0, 0), &small),
            Err(WireError::PacketTooLong { len: 2016, max: 1024 })
        );
        // Many small sizes that add up past the limit.
        let mut sizes = vec![0x11, 8];
        sizes.extend([0xff, 0xff].repeat(8));
        assert!(matches!(
            PacketRepr::parse(&sizes, ids(0, 0), &small),
            Err(WireError::PacketTooLong { .. })
        ));
    }

    #[test]
    fn emit_refuses_what_does_not_fit() {
        let mut buf = [0; 64];
        let repr = PacketRepr::Operation {
            target: Target::Unicast(0x1_0000.into()),
            op: ChannelOp::Close,
        };
        assert_eq!(
            repr.emit(&mut buf, ids(2, 2)),
            Err(EmitError::ChannelIdTooWide { id: 0x1_0000.into(), len: 2 })
        );
        assert_eq!(repr.emit(&mut buf, ids(3, 2)), Ok(8));
        assert_eq!(
            repr.emit(&mut buf[..7], ids(3, 2)),
            Err(EmitError::BufferTooShort { need: 8, have: 7 })
        );

        let big = vec![0u8; 70_000];
        let parts: [&[u8]; 1] = [&big];
        let mut message = MessageRepr::new(Target::Unicast(0.into()), &parts);
        assert!(message.large);
        message.large = false;
        let mut out = vec![0; 80_000];
        assert_eq!(
            PacketRepr::Message(message).emit(&mut out, ids(0, 0)),
            Err(EmitError::NeedsLarge(70_000))
        );

        let many: Vec<&[u8]> = vec![b"x"; 300];
        let mut message = MessageRepr::new(Target::Unicast(0.into()), &many);
        assert!(message.long && !message.large);
        let len = PacketRepr::Message(message).buffer_len(ids(0, 0));
        let mut out = vec![SENTINEL; len];
        assert_eq!(PacketRepr::Message(message).emit(&mut out, ids(0, 0)), Ok(len));
        let (parsed, _) =
            PacketRepr::parse(&out, ids(0, 0), &limits()).unwrap().complete(len).unwrap();
        assert_eq!(parsed, PacketRepr::Message(message));
        message.long = false;
        assert_eq!(
            PacketRepr::Message(message).emit(&mut out, ids(0, 0)),
            Err(EmitError::NeedsLong(300))
        );
    }

    #[test]
    fn large_part_round_trips() {
        let big: Vec<u8> = (0..70_001u32).map(|i| i as u8).collect();
        let parts: [&[u8]; 2] = [b"head", &big];
        let repr = PacketRepr::Message(MessageRepr::new(Target::Unicast(3.into()), &parts));
        let len = repr.buffer_len(ids(1, 1));
        let mut out = vec![SENTINEL; len + 8];
        assert_eq!(repr.emit(&mut out, ids(1, 1)), Ok(len));
        assert!(out[len..].iter().all(|&b| b == SENTINEL));
        let (parsed, n) =
            PacketRepr::parse(&out[..len], ids(1, 1), &limits()).unwrap().complete(len).unwrap();
        assert_eq!((parsed, n), (repr, len));
    }

    // ---- channel ids wider than 8 bytes (relink 1: sizes of 0..=255) ----

    /// An id of `len` bytes, none of them zero: 1, 2, ... wrapping past 255.
    fn wide_id(len: usize) -> ChannelId {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 255) as u8 + 1).collect();
        ChannelId::from_le_bytes(&bytes).unwrap()
    }

    #[test]
    fn golden_sequence_ack_with_9_byte_id() {
        // header 2 + id 9 = 11, the sequence number 4-byte aligned at 12.
        let bytes = [
            0x0d, 0, // channel | sequence ack | received
            1, 2, 3, 4, 5, 6, 7, 8, 9, // channel id
            0, // pad to 4
            7, 0, 0, 0, // sequence number
        ];
        let id = wide_id(9);
        let repr = PacketRepr::SequenceAcknowledgement {
            target: Target::Unicast(id.as_id_ref()),
            ack: SequenceAck::Received,
            seq: 7,
        };
        check_golden(&bytes, &repr, ids(1, 9));
    }

    #[test]
    fn golden_close_with_255_byte_id_and_multicast_with_64_byte_ids() {
        // header 2 + id 255 = 257, padded to 264.
        let mut close = vec![0x41, 0];
        close.extend(wide_id(255).as_le_bytes());
        close.resize(264, 0);
        let id = wide_id(255);
        let repr =
            PacketRepr::Operation { target: Target::Unicast((&id).into()), op: ChannelOp::Close };
        check_golden(&close, &repr, ids(255, 0));

        // header 2 + pad 2 + count 4 + 2 ids of 64 bytes = 136: a consumed
        // acknowledgement to a 64-byte id and to channel 5, zero-extended.
        let mut consumed = vec![0x27, 0, 0, 0, 2, 0, 0, 0];
        consumed.extend(wide_id(64).as_le_bytes());
        consumed.push(5);
        consumed.resize(136, 0);
        let channels = [wide_id(64), ChannelId::from(5)];
        let repr = PacketRepr::Acknowledgement {
            target: Target::Multicast(ChannelIds::from_ids(&channels)),
            ack: ChannelAck::Consumed,
        };
        check_golden(&consumed, &repr, ids(0, 64));
        let (parsed, _) =
            PacketRepr::parse(&consumed, ids(0, 64), &limits()).unwrap().complete(136).unwrap();
        let got: Vec<ChannelId> = parsed.target().unwrap().iter().map(ChannelId::from).collect();
        assert_eq!(got, channels);
        assert_eq!(got[1], 5);
    }

    #[test]
    fn channel_ids_are_little_endian_integers_of_at_most_255_bytes() {
        assert_eq!(ChannelId::from_le_bytes(&[1; 256]), Err(ChannelIdError::TooLong { len: 256 }));
        let widest = ChannelId::from_le_bytes(&[0xff; 255]).unwrap();
        assert_eq!(widest.as_le_bytes().len(), 255);
        assert!(widest.fits(255) && !widest.fits(254));
        assert_eq!(widest.to_u64(), None);
        // Trailing zeros do not matter: 7 in any width is channel 7.
        let seven = ChannelId::from_le_bytes(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!((seven.clone(), seven.to_u64()), (ChannelId::from(7), Some(7)));
        assert_eq!(seven.as_le_bytes(), [7]);
        assert_eq!(ChannelId::from(0).as_le_bytes(), []);
        assert_eq!(ChannelId::from(u64::MAX).as_le_bytes(), [0xff; 8]);
        // Nine bytes no longer fit a number.
        let nine = ChannelId::from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
        assert_eq!((nine.to_u64(), format!("{nine:#x}")), (None, "0x010000000000000000".into()));
        assert_eq!(format!("{seven} {seven:#x}"), "7 0x7");
        // An id that does not fit its field is refused, not cut.
        let repr =
            PacketRepr::Operation { target: Target::Unicast((&nine).into()), op: ChannelOp::Close };
        assert_eq!(
            repr.emit(&mut [0; 32], ids(8, 0)),
            Err(EmitError::ChannelIdTooWide { id: nine.clone(), len: 8 })
        );
        assert_eq!(repr.emit(&mut [0; 32], ids(9, 0)), Ok(16));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn wide_channel_ids_round_trip(
            id_len in 9u8..=255,
            raw in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..=255), 1..4),
            seq in any::<u32>(),
        ) {
            let channels: Vec<ChannelId> = raw
                .iter()
                .map(|bytes| ChannelId::from_le_bytes(&bytes[..bytes.len().min(usize::from(id_len))]))
                .collect::<Result<_, _>>()
                .unwrap();
            let ids = ids(id_len, id_len);
            for target in
                [Target::Unicast((&channels[0]).into()), Target::Multicast(ChannelIds::from_ids(&channels))]
            {
                let repr = PacketRepr::SequenceOperation { target, op: SequenceOp::Commit, seq };
                let len = repr.buffer_len(ids);
                let mut buf = vec![SENTINEL; len + 8];
                prop_assert_eq!(repr.emit(&mut buf, ids), Ok(len));
                prop_assert!(buf[len..].iter().all(|&b| b == SENTINEL));
                let parsed = PacketRepr::parse(&buf, ids, &limits()).unwrap();
                prop_assert_eq!(parsed, Parsed::Complete { value: repr, len });
                let (value, _) = parsed.complete(len).unwrap();
                let got: Vec<ChannelId> = value.target().unwrap().iter().map(ChannelId::from).collect();
                prop_assert_eq!(&got[..], &channels[..got.len()]);
            }
        }
    }

    // ---- property round trips ----

    #[derive(Debug, Clone)]
    enum OwnedTarget {
        Unicast(u64),
        Multicast(Vec<u64>),
    }

    #[derive(Debug, Clone)]
    enum Owned {
        General(GeneralType),
        Op(OwnedTarget, ChannelOp),
        Ack(OwnedTarget, ChannelAck),
        SeqOp(OwnedTarget, SequenceOp, u32),
        SeqAck(OwnedTarget, SequenceAck, u32),
        Message { target: OwnedTarget, long: bool, large: bool, parts: Vec<Vec<u8>> },
    }

    fn mask(id: u64, len: u8) -> u64 {
        if len >= 8 { id } else { id & ((1u64 << (8 * len)) - 1) }
    }

    fn target_strategy() -> impl Strategy<Value = OwnedTarget> {
        prop_oneof![
            any::<u64>().prop_map(OwnedTarget::Unicast),
            prop::collection::vec(any::<u64>(), 0..6).prop_map(OwnedTarget::Multicast),
        ]
    }

    fn packet_strategy() -> impl Strategy<Value = Owned> {
        prop_oneof![
            prop::sample::select(GeneralType::ALL).prop_map(Owned::General),
            (target_strategy(), prop::sample::select(ChannelOp::ALL))
                .prop_map(|(t, op)| Owned::Op(t, op)),
            (target_strategy(), prop::sample::select(ChannelAck::ALL))
                .prop_map(|(t, ack)| Owned::Ack(t, ack)),
            (target_strategy(), prop::sample::select(SequenceOp::ALL), any::<u32>())
                .prop_map(|(t, op, seq)| Owned::SeqOp(t, op, seq)),
            (target_strategy(), prop::sample::select(SequenceAck::ALL), any::<u32>())
                .prop_map(|(t, ack, seq)| Owned::SeqAck(t, ack, seq)),
            (
                target_strategy(),
                any::<bool>(),
                any::<bool>(),
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 0..6)
            )
                .prop_map(|(target, long, large, parts)| Owned::Message {
                    target,
                    long,
                    large,
                    parts
                }),
        ]
    }

    /// Builds the borrowed form, with ids cut to the width the format uses.
    fn with_repr<R>(owned: &Owned, ids: IdSizes, f: impl FnOnce(PacketRepr<'_>) -> R) -> R {
        let (target, format) = match owned {
            Owned::General(kind) => return f(PacketRepr::General(*kind)),
            Owned::Op(t, _) => (t, ChannelFormat::Operation),
            Owned::Ack(t, _) => (t, ChannelFormat::Acknowledgement),
            Owned::SeqOp(t, ..) => (t, ChannelFormat::SequenceOperation),
            Owned::SeqAck(t, ..) => (t, ChannelFormat::SequenceAcknowledgement),
            Owned::Message { target, .. } => (target, ChannelFormat::Message),
        };
        let len = ids.for_format(format);
        let masked: Vec<u64> = match target {
            OwnedTarget::Unicast(id) => vec![mask(*id, len)],
            OwnedTarget::Multicast(list) => list.iter().map(|&id| mask(id, len)).collect(),
        };
        let target = match target {
            OwnedTarget::Unicast(_) => Target::Unicast(masked[0].into()),
            OwnedTarget::Multicast(_) => Target::Multicast(ChannelIds::from_slice(&masked)),
        };
        let slices: Vec<&[u8]> = match owned {
            Owned::Message { parts, .. } => parts.iter().map(Vec::as_slice).collect(),
            _ => Vec::new(),
        };
        f(match owned {
            Owned::General(_) => unreachable!(),
            Owned::Op(_, op) => PacketRepr::Operation { target, op: *op },
            Owned::Ack(_, ack) => PacketRepr::Acknowledgement { target, ack: *ack },
            Owned::SeqOp(_, op, seq) => {
                PacketRepr::SequenceOperation { target, op: *op, seq: *seq }
            }
            Owned::SeqAck(_, ack, seq) => {
                PacketRepr::SequenceAcknowledgement { target, ack: *ack, seq: *seq }
            }
            Owned::Message { long, large, .. } => PacketRepr::Message(MessageRepr {
                target,
                long: *long,
                large: *large,
                parts: Parts::from_slice(&slices),
            }),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn packets_round_trip(
            sender in prop_oneof![0u8..=8, any::<u8>()],
            receiver in prop_oneof![0u8..=8, any::<u8>()],
            owned in packet_strategy(),
        ) {
            let ids = ids(sender, receiver);
            with_repr(&owned, ids, |repr| {
                let len = repr.buffer_len(ids);
                prop_assert_eq!(len % PACKET_ALIGN, 0);
                let mut buf = vec![SENTINEL; len + 16];
                prop_assert_eq!(repr.emit(&mut buf, ids), Ok(len));
                prop_assert!(buf[len..].iter().all(|&b| b == SENTINEL));
                let parsed = PacketRepr::parse(&buf, ids, &limits()).unwrap();
                prop_assert_eq!(parsed, Parsed::Complete { value: repr, len });
                // A packet followed by another parses alone.
                let mut two = buf[..len].to_vec();
                two.extend_from_slice(&buf[..len]);
                prop_assert_eq!(
                    PacketRepr::parse(&two, ids, &limits()).unwrap(),
                    Parsed::Complete { value: repr, len }
                );
                Ok(())
            })?;
        }
    }

    // ---- bounded mutation test ----

    /// Small deterministic generator (xorshift64*), so failures replay.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    pub(crate) fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
        let mut bytes = base.to_vec();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 if !bytes.is_empty() => {
                    let at = rng.below(bytes.len());
                    bytes[at] ^= 1 << rng.below(8);
                }
                1 if !bytes.is_empty() => {
                    let at = rng.below(bytes.len());
                    bytes[at] = rng.next() as u8;
                }
                2 if !bytes.is_empty() => {
                    let len = rng.below(bytes.len());
                    bytes.truncate(len);
                }
                3 => {
                    let n = rng.below(24);
                    bytes.extend((0..n).map(|_| rng.next() as u8));
                }
                _ if bytes.len() >= 8 => {
                    // A random 32-bit field, where counts and lengths live.
                    let at = rng.below(bytes.len() - 3);
                    let value = [0, 1, 0xff, 0xffff, u32::MAX, rng.next() as u32][rng.below(6)];
                    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
                }
                _ => {}
            }
        }
        bytes
    }

    /// Mostly the sizes of numeric ids, sometimes wider ones.
    fn random_id_len(rng: &mut Rng) -> u8 {
        if rng.below(4) == 0 { [9, 16, 64, 255][rng.below(4)] } else { rng.below(9) as u8 }
    }

    #[test]
    fn mutated_packets_never_panic() {
        let mut corpus: Vec<Vec<u8>> = vec![
            SHORT_SMALL.to_vec(),
            LONG_LARGE.to_vec(),
            SEQ_ACK_8.to_vec(),
            vec![0x41, 0, 0x34, 0x12, 0, 0, 0, 0],
            vec![0x07, 0, 0, 0, 3, 0, 0, 0],
            vec![0x20, 0, 0, 0, 0, 0, 0, 0],
        ];
        let mut rng = Rng(0x5eed_1234_abcd_ef01);
        // Emitted packets of every format as further seeds.
        for format in 0..6 {
            // Ids 1, 2 and 3 need a byte.
            let ids = ids(random_id_len(&mut rng).max(1), random_id_len(&mut rng).max(1));
            let channels = [1, 2, 3];
            let parts: [&[u8]; 2] = [b"seed", b"data!"];
            let target = if rng.below(2) == 0 {
                Target::Unicast(1.into())
            } else {
                Target::Multicast(ChannelIds::from_slice(&channels))
            };
            let repr = match format {
                0 => PacketRepr::Operation { target, op: ChannelOp::Commit },
                1 => PacketRepr::Acknowledgement { target, ack: ChannelAck::Closed },
                2 => PacketRepr::SequenceOperation { target, op: SequenceOp::Commit, seq: 9 },
                3 => PacketRepr::SequenceAcknowledgement {
                    target,
                    ack: SequenceAck::Received,
                    seq: 1,
                },
                4 => PacketRepr::Message(MessageRepr {
                    target,
                    long: true,
                    large: false,
                    parts: Parts::from_slice(&parts),
                }),
                _ => PacketRepr::Message(MessageRepr {
                    target,
                    long: false,
                    large: true,
                    parts: Parts::from_slice(&parts),
                }),
            };
            let mut buf = vec![0; repr.buffer_len(ids)];
            repr.emit(&mut buf, ids).unwrap();
            corpus.push(buf);
        }

        let limits = WireLimits { max_packet_len: 1 << 16, max_channel_ids: 64, max_parts: 64 };
        let (mut complete, mut incomplete, mut errors) = (0, 0, 0);
        for _ in 0..150_000 {
            let base = &corpus[rng.below(corpus.len())];
            let bytes = mutate(&mut rng, base);
            let ids = ids(random_id_len(&mut rng), random_id_len(&mut rng));
            match PacketRepr::parse(&bytes, ids, &limits) {
                Ok(Parsed::Complete { value, len }) => {
                    complete += 1;
                    assert!(len <= bytes.len() && len % PACKET_ALIGN == 0);
                    // What parses re-emits to the same length and value.
                    assert_eq!(value.buffer_len(ids), len);
                    let mut out = vec![0; len];
                    assert_eq!(value.emit(&mut out, ids), Ok(len));
                    let again = PacketRepr::parse(&out, ids, &limits).unwrap();
                    assert_eq!(again, Parsed::Complete { value, len });
                    let _ = value.target().map(|t| t.iter().count());
                }
                Ok(Parsed::Incomplete { need }) => {
                    incomplete += 1;
                    assert!(need > bytes.len());
                }
                Err(_) => errors += 1,
            }
        }
        // The mutations reach every outcome.
        assert!(complete > 10_000 && incomplete > 10_000 && errors > 10_000);
    }
}
