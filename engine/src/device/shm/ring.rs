//! The receive lanes of an endpoint: one per sending peer, each a bounded
//! single-producer single-consumer ring of MTU-sized slots in a segment of
//! its own, which only its sender and its receiver map.
//!
//! The receiver's rendezvous thread makes a lane when it grants it (see
//! `rendezvous`) and hands its descriptor to the sender it granted it to,
//! and to no one else: a sender can write its own lane and nothing of any
//! other sender's, nor anything the receiver keeps (who holds which lane,
//! where it reads next), which is private memory. The producer is the
//! lane's only writer of slots: publishing a packet is plain stores, the
//! control word last with Release, and needs no read of a line the
//! receiver writes except, once per lap of the ring, the receiver's head.
//! A lane's segment starts with a header (the receiver's address and state
//! and the geometry, written by the receiver), then the producer's line
//! (its state) and the head the receiver publishes after each burst, each
//! on a cache line of its own; the producer's tail is its own business.
//!
//! Slot `pos & (slots - 1)` of a lane holds the packet at position `pos`
//! (wrapping u32) when its control word is `pos + 1`; anything else (0 in
//! a new lane, or a previous lap's `pos - slots + 1`) means not yet
//! published. The receiver never writes a slot: the producer knows a slot
//! is free again when the head has passed the packet of the previous lap,
//! and a sender learns that its packet at `pos` was consumed the same way.
//!
//! A producer that closes marks its lane closed; one that dies leaves it
//! open. Either way the receiver takes what was published, then drops the
//! lane: a dead producer stalls its own lane only, never another's, and
//! the next sender gets a new one.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::map::{Mapping, hdr};

/// A lane segment after its header.
mod lane {
    /// The producer's line: its [`super::LaneState`] as a u32.
    pub const STATE: usize = 64;
    /// The receiver's line: every position before it is consumed.
    pub const HEAD: usize = 128;
    /// The first slot, past the pair of lines the head starts (the
    /// adjacent-line prefetchers fetch 128-byte pairs).
    pub const SLOTS: usize = 256;
}

mod slot {
    /// Payload starts right after the header, in the header's cache line:
    /// a packet of up to 112 bytes arrives in two lines.
    pub const DATA: usize = 16;
}

/// How many slots ahead of the one it fills a producer claims lines, and
/// at most how many lines (4 KiB): far enough that the consumer is done
/// with them, near enough to stay in cache.
const PREFETCH_AHEAD: u32 = 8;
const PREFETCH_LINES: usize = 64;

/// A slot's header, at the start of its slot: the control word, then the
/// record. Only atomics, so any bytes a peer writes are valid values.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SlotHeader {
    ctl: AtomicU32,
    kind: AtomicU32,
    len: AtomicU32,
    imm: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<SlotHeader>() <= slot::DATA);

/// What a slot carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A packet of `len` bytes.
    Packet,
    /// The notice of an RDMA write with immediate data (no bytes).
    WriteImm,
    /// Anything else: a peer's garbage.
    Unknown(u32),
}

impl Kind {
    fn to_u32(self) -> u32 {
        match self {
            Kind::Packet => 1,
            Kind::WriteImm => 2,
            Kind::Unknown(v) => v,
        }
    }

    fn from_u32(v: u32) -> Kind {
        match v {
            1 => Kind::Packet,
            2 => Kind::WriteImm,
            v => Kind::Unknown(v),
        }
    }
}

/// A slot's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub kind: Kind,
    pub len: u32,
    pub imm: u32,
}

/// Where a lane is in its life, as its producer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneState {
    /// Its producer sends through it (from the grant on).
    Open,
    /// Its producer closed: nothing more will be published. Also anything
    /// else a producer writes there.
    Closed,
}

const OPEN: u32 = 1;
const CLOSED: u32 = 2;

/// One lane: the receiver's side (to consume) or its sender's (to produce
/// into). The geometry is read once, where the lane is made or attached: a
/// peer that changes the header later cannot move our accesses outside
/// the mapping.
#[derive(Debug)]
pub(crate) struct Lane {
    map: Mapping,
    mask: u32,
    stride: usize,
    payload: usize,
}

/// Bytes from one slot to the next: a multiple of 128, so that every slot
/// starts a pair of cache lines, the unit the cores' adjacent-line
/// prefetchers fetch: a packet of up to 112 bytes then crosses between
/// the cores as one miss, not two in a row (with slots 64-byte aligned,
/// every other one straddled two pairs).
fn stride(payload: usize) -> Option<usize> {
    Some(payload.checked_add(slot::DATA + 127)? & !127)
}

const _: () = assert!(hdr::LEN_MIN <= lane::STATE && lane::STATE + 64 <= lane::HEAD);
const _: () = assert!(lane::HEAD + 128 <= lane::SLOTS && lane::SLOTS.is_multiple_of(128));

impl Lane {
    /// Bytes of a lane of `slots` slots of `payload` bytes.
    pub(crate) fn segment_len(slots: u32, payload: usize) -> Option<usize> {
        stride(payload)?.checked_mul(slots as usize)?.checked_add(lane::SLOTS)
    }

    /// A new lane, open, with nothing published, and the descriptor its
    /// producer is handed; the caller writes the rest of the header and
    /// then [`Lane::open_for_business`].
    pub(crate) fn create(slots: u32, payload: usize) -> io::Result<(Lane, OwnedFd)> {
        assert!(slots >= 2 && slots.is_power_of_two(), "ring slots: a power of two, at least 2");
        let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
        let len = Lane::segment_len(slots, payload).ok_or_else(invalid)?;
        let stride = stride(payload).ok_or_else(invalid)?;
        let (map, fd) = Mapping::create(len)?;
        map.u32_at(hdr::PID).store(std::process::id(), Release);
        map.u32_at(hdr::RING_SLOTS).store(slots, Relaxed);
        map.u32_at(hdr::SLOT_PAYLOAD).store(payload as u32, Relaxed);
        map.u32_at(hdr::SLOT_STRIDE).store(stride as u32, Relaxed);
        map.u32_at(lane::STATE).store(OPEN, Relaxed);
        // A new segment is zeroed: every slot unpublished, head 0.
        Ok((Lane { map, mask: slots - 1, stride, payload }, fd))
    }

    /// Publishes the header: magic last, so a reader that sees it sees
    /// everything before it.
    pub(crate) fn open_for_business(&self) {
        self.map.u32_at(hdr::VERSION).store(hdr::VERSION_VALUE, Relaxed);
        self.map.u32_at(hdr::KIND).store(hdr::KIND_LANE, Relaxed);
        self.map.u32_at(hdr::STATE).store(hdr::STATE_READY, Relaxed);
        self.map.u64_at(hdr::MAGIC).store(hdr::MAGIC_VALUE, Release);
    }

    /// The lane a receiver handed us, if its header is published (magic,
    /// version and kind) and describes a ring that fits.
    pub(crate) fn attach_peer(map: Mapping) -> Option<Lane> {
        let ready = map.u64_at(hdr::MAGIC).load(Acquire) == hdr::MAGIC_VALUE
            && map.u32_at(hdr::VERSION).load(Relaxed) == hdr::VERSION_VALUE
            && map.u32_at(hdr::KIND).load(Relaxed) == hdr::KIND_LANE;
        let slots = map.u32_at(hdr::RING_SLOTS).load(Relaxed);
        let payload = map.u32_at(hdr::SLOT_PAYLOAD).load(Relaxed) as usize;
        let stride = map.u32_at(hdr::SLOT_STRIDE).load(Relaxed) as usize;
        let fits = Lane::segment_len(slots, payload).is_some_and(|len| len <= map.len());
        if !ready || slots < 2 || !slots.is_power_of_two() || !fits {
            return None;
        }
        if self::stride(payload) != Some(stride) {
            return None;
        }
        Some(Lane { map, mask: slots - 1, stride, payload })
    }

    /// The segment, for its header.
    pub(crate) fn map(&self) -> &Mapping {
        &self.map
    }

    /// Largest payload a slot carries.
    pub(crate) fn payload(&self) -> usize {
        self.payload
    }

    /// Slots of the ring.
    pub(crate) fn slots(&self) -> u32 {
        self.mask + 1
    }

    #[inline]
    fn slot_off(&self, pos: u32) -> usize {
        lane::SLOTS + (pos & self.mask) as usize * self.stride
    }

    /// The header of slot `pos`: one bounds check for all its fields.
    #[inline]
    fn slot(&self, pos: u32) -> &SlotHeader {
        self.map.slot_header_at(self.slot_off(pos))
    }

    fn head_word(&self) -> &AtomicU32 {
        self.map.u32_at(lane::HEAD)
    }

    // Producer side.

    /// Marks the lane closed: nothing more will be published in it.
    pub(crate) fn close(&self) {
        self.map.u32_at(lane::STATE).store(CLOSED, Release);
    }

    /// Whether slot `pos` is free, given the consumer's head as last read
    /// (`seen`, refreshed here when the lane looks full: the head is read
    /// once a lap, not once a packet, as it only moves forward).
    #[inline]
    pub(crate) fn has_room(&self, pos: u32, seen: &mut u32) -> bool {
        if crate::FAST_PATHS && pos.wrapping_sub(*seen) <= self.mask {
            return true;
        }
        // Acquire: the consumer's reads of the slot's last packet happened
        // before we overwrite it.
        *seen = self.head_word().load(Acquire);
        pos.wrapping_sub(*seen) <= self.mask
    }

    /// Fills slot `pos` (free: see [`Lane::has_room`]) and hands it to the
    /// consumer.
    pub(crate) fn publish(
        &self,
        pos: u32,
        rec: &Record,
        head: &[u8],
        tail: Option<(&Mapping, usize, usize)>,
    ) {
        let tail_len = tail.map_or(0, |(_, _, n)| n);
        assert!(head.len() + tail_len <= self.payload, "packet larger than the peer's slots");
        let at = self.slot_off(pos);
        let h = self.map.slot_header_at(at);
        h.kind.store(rec.kind.to_u32(), Relaxed);
        h.len.store(rec.len, Relaxed);
        h.imm.store(rec.imm, Relaxed);
        self.map.write_bytes(at + slot::DATA, head);
        if let Some((src, off, n)) = tail {
            // Gathered from a region a peer may write: copied, not lent.
            Mapping::copy(src, off, &self.map, at + slot::DATA + head.len(), n);
        }
        h.ctl.store(pos.wrapping_add(1), Release);
        // Take the lines of the slot PREFETCH_AHEAD on, as many as this
        // packet used: the consumer read them a lap ago and holds them, and
        // a store to a line another core holds waits for it, with every
        // store behind it. Asked for now, they are ours when that packet is
        // written. A slot not yet consumed only costs the consumer a second
        // read.
        let ahead = self.slot_off(pos.wrapping_add(PREFETCH_AHEAD));
        let lines = (slot::DATA + head.len() + tail_len).div_ceil(64).min(PREFETCH_LINES);
        self.map.prefetch_write(ahead, lines);
    }

    /// Whether the consumer has taken the packet we published at `pos`, as
    /// of its last published head.
    pub(crate) fn consumed(&self, pos: u32) -> bool {
        let head = self.head_word().load(Acquire);
        head.wrapping_sub(pos.wrapping_add(1)) as i32 >= 0
    }

    // Consumer side: only the receiver.

    /// Whether the producer still sends through the lane.
    pub(crate) fn state(&self) -> LaneState {
        match self.map.u32_at(lane::STATE).load(Acquire) {
            OPEN => LaneState::Open,
            // Closed, or a producer's garbage: nothing more to wait for.
            _ => LaneState::Closed,
        }
    }

    /// The packet at position `pos` (the consumer's head), if published.
    #[inline]
    pub(crate) fn peek(&self, pos: u32) -> Option<Record> {
        let h = self.slot(pos);
        (h.ctl.load(Acquire) == pos.wrapping_add(1)).then(|| Record {
            kind: Kind::from_u32(h.kind.load(Relaxed)),
            len: h.len.load(Relaxed),
            imm: h.imm.load(Relaxed),
        })
    }

    /// Copies the first `dst.len()` payload bytes of slot `pos`.
    pub(crate) fn read(&self, pos: u32, dst: &mut [u8]) {
        assert!(dst.len() <= self.payload, "longer than a slot");
        self.map.read_bytes(self.slot_off(pos) + slot::DATA, dst);
    }

    /// Publishes the consumer's head: every packet before `pos` is
    /// consumed (what its producer learns completions and room from).
    pub(crate) fn set_head(&self, pos: u32) {
        self.head_word().store(pos, Release);
    }

    /// Tells the producer the receiver is gone: it fails what it sent.
    pub(crate) fn close_receiver(&self) {
        self.map.u32_at(hdr::STATE).store(hdr::STATE_CLOSED, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_lane(slots: u32) -> Lane {
        let (lane, _fd) = Lane::create(slots, 64).unwrap();
        lane.open_for_business();
        lane
    }

    fn rec(len: u32) -> Record {
        Record { kind: Kind::Packet, len, imm: 0 }
    }

    #[test]
    fn slots_go_round_and_the_producer_sees_room_and_consumption_from_the_head() {
        let lane = test_lane(4);
        assert_eq!(lane.state(), LaneState::Open, "open from the grant on");
        let mut seen = 0;
        for lap in 0..3u32 {
            for i in 0..4u32 {
                let pos = lap * 4 + i;
                assert!(lane.has_room(pos, &mut seen), "lap {lap} slot {i}");
                lane.publish(pos, &rec(1), &[i as u8], None);
            }
            assert!(!lane.has_room(lap * 4 + 4, &mut seen), "full");
            for i in 0..4u32 {
                let pos = lap * 4 + i;
                assert!(!lane.consumed(pos));
                assert_eq!(lane.peek(pos), Some(rec(1)));
                let mut b = [0u8; 1];
                lane.read(pos, &mut b);
                assert_eq!(b[0], i as u8);
                lane.set_head(pos + 1);
                assert!(lane.consumed(pos));
            }
            assert_eq!(lane.peek(lap * 4 + 4), None, "the last lap's packet is stale");
        }
    }

    #[test]
    fn each_side_sees_the_other_close() {
        let (lane, fd) = Lane::create(4, 64).unwrap();
        lane.open_for_business();
        let theirs =
            Lane::attach_peer(Mapping::from_fd(std::os::fd::AsFd::as_fd(&fd), 0, true).unwrap())
                .expect("a published lane attaches");
        theirs.publish(0, &rec(1), b"x", None);
        theirs.close();
        assert_eq!(lane.state(), LaneState::Closed);
        assert_eq!(lane.peek(0), Some(rec(1)), "what was published stays to take");
        lane.close_receiver();
        assert_eq!(theirs.map().u32_at(hdr::STATE).load(Acquire), hdr::STATE_CLOSED);
        // A producer's garbage in its state word is no open lane.
        theirs.map().u32_at(lane::STATE).store(77, Relaxed);
        assert_eq!(lane.state(), LaneState::Closed);
    }
}
