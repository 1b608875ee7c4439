//! The receive rings in an endpoint's segment: one lane per sending peer,
//! each a bounded single-producer single-consumer ring of MTU-sized slots.
//!
//! A sender claims a free lane of the receiver's segment once, when it
//! inserts the receiver's address (a compare-and-swap on the lane's owner
//! word, the only locked operation of the protocol), and from then on is
//! the lane's only producer: publishing a packet is plain stores, the
//! control word last with Release, and needs no read of a line the
//! receiver writes except, once per lap of the ring, the receiver's head.
//! A lane's control block holds its owner (pid, QPN, connid, state) on one
//! cache line and the head the receiver publishes after each burst on
//! another; the producer's tail is its own business.
//!
//! Slot `pos & (slots - 1)` of a lane holds the packet at position `pos`
//! (wrapping u32) when its control word is `pos + 1`; anything else (0 in
//! a new lane, or a previous lap's `pos - slots + 1`) means not yet
//! published. The receiver never writes a slot: the producer knows a slot
//! is free again when the head has passed the packet of the previous lap,
//! and a sender learns that its packet at `pos` was consumed the same way.
//!
//! A producer that closes marks its lane closed; one that dies leaves it
//! owned. Either way the receiver takes what was published, then resets
//! the lane (slots unpublished, head 0) and frees it for the next sender:
//! a dead producer stalls its own lane only, never another's.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::map::{Mapping, hdr};

/// Lane control blocks start here, `LANE_CTL` bytes each.
const LANE_TABLE: usize = 128;
const LANE_CTL: usize = 128;

/// A lane control block: the owner's line, then the head's.
mod lane {
    /// The owner word: 0 while free, else the producer's pid.
    pub const OWNER: usize = 0;
    pub const QPN: usize = 8;
    pub const CONNID: usize = 12;
    /// [`super::LaneState`] as a u32.
    pub const STATE: usize = 16;
    /// Every position before it is consumed (written by the receiver).
    pub const HEAD: usize = 64;
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
const _: () = assert!(hdr::LEN_MIN <= LANE_TABLE && lane::HEAD + 4 <= LANE_CTL);

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

/// Where a lane is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneState {
    /// No producer (or one still writing its owner line).
    Free,
    /// A producer sends through it.
    Open,
    /// Its producer closed: nothing more will be published.
    Closed,
}

impl LaneState {
    fn to_u32(self) -> u32 {
        match self {
            LaneState::Free => 0,
            LaneState::Open => 1,
            LaneState::Closed => 2,
        }
    }
}

/// A lane's producer, as its owner line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub pid: u32,
    pub qpn: u16,
    pub connid: u32,
    pub state: LaneState,
}

/// The rings of a mapped endpoint segment: the owner's (to consume) or a
/// peer's (to produce into one lane of).
#[derive(Debug)]
pub(crate) struct Ring {
    map: Mapping,
    lanes: u32,
    mask: u32,
    stride: usize,
    payload: usize,
    /// Where the first lane's slots start, and each lane's bytes.
    slots_at: usize,
    lane_len: usize,
}

/// Bytes of the lane table, rounded to a page so slots start on one.
fn slots_at(lanes: u32) -> Option<usize> {
    let table = (lanes as usize).checked_mul(LANE_CTL)?.checked_add(LANE_TABLE)?;
    Some(table.checked_add(4095)? & !4095)
}

/// Bytes from one slot to the next: a multiple of 128, so that every slot
/// starts a pair of cache lines, the unit the cores' adjacent-line
/// prefetchers fetch: a packet of up to 112 bytes then crosses between
/// the cores as one miss, not two in a row (with slots 64-byte aligned,
/// every other one straddled two pairs).
fn stride(payload: usize) -> Option<usize> {
    Some(payload.checked_add(slot::DATA + 127)? & !127)
}

impl Ring {
    /// Bytes of a segment with `lanes` lanes of `slots` slots of `payload`
    /// bytes.
    pub(crate) fn segment_len(lanes: u32, slots: u32, payload: usize) -> Option<usize> {
        let lane = stride(payload)?.checked_mul(slots as usize)?;
        lane.checked_mul(lanes as usize)?.checked_add(slots_at(lanes)?)
    }

    /// Creates a segment holding empty lanes, and returns its descriptor
    /// too; the caller writes the rest of the header and then
    /// [`Ring::open_for_business`].
    pub(crate) fn create(lanes: u32, slots: u32, payload: usize) -> io::Result<(Ring, OwnedFd)> {
        assert!(lanes >= 1, "at least one lane");
        assert!(slots >= 2 && slots.is_power_of_two(), "ring slots: a power of two, at least 2");
        let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
        let len = Ring::segment_len(lanes, slots, payload).ok_or_else(invalid)?;
        let (map, fd) = Mapping::create(len)?;
        map.u32_at(hdr::PID).store(std::process::id(), Release);
        map.u32_at(hdr::LANES).store(lanes, Relaxed);
        map.u32_at(hdr::RING_SLOTS).store(slots, Relaxed);
        map.u32_at(hdr::SLOT_PAYLOAD).store(payload as u32, Relaxed);
        map.u32_at(hdr::SLOT_STRIDE).store(stride(payload).ok_or_else(invalid)? as u32, Relaxed);
        // A new segment is zeroed: every lane free, every slot unpublished.
        Ok((Ring::attach(map).ok_or_else(invalid)?, fd))
    }

    /// Publishes the header: magic last, so a reader that sees it sees
    /// everything before it.
    pub(crate) fn open_for_business(&self) {
        self.map.u32_at(hdr::VERSION).store(hdr::VERSION_VALUE, Relaxed);
        self.map.u32_at(hdr::KIND).store(hdr::KIND_ENDPOINT, Relaxed);
        self.map.u32_at(hdr::STATE).store(hdr::STATE_READY, Relaxed);
        self.map.u64_at(hdr::MAGIC).store(hdr::MAGIC_VALUE, Release);
    }

    /// The rings in `map`, if its header describes rings that fit. The
    /// geometry is read once here: a peer changing its header later cannot
    /// move our accesses outside the mapping. (A segment being created has
    /// no magic yet; `create` checks its own geometry the same way.)
    pub(crate) fn attach(map: Mapping) -> Option<Ring> {
        let lanes = map.u32_at(hdr::LANES).load(Relaxed);
        let slots = map.u32_at(hdr::RING_SLOTS).load(Relaxed);
        let payload = map.u32_at(hdr::SLOT_PAYLOAD).load(Relaxed) as usize;
        let stride = map.u32_at(hdr::SLOT_STRIDE).load(Relaxed) as usize;
        let fits = Ring::segment_len(lanes, slots, payload).is_some_and(|len| len <= map.len());
        if lanes == 0 || slots < 2 || !slots.is_power_of_two() || !fits {
            return None;
        }
        if self::stride(payload) != Some(stride) {
            return None;
        }
        let slots_at = slots_at(lanes)?;
        let lane_len = stride * slots as usize;
        Some(Ring { map, lanes, mask: slots - 1, stride, payload, slots_at, lane_len })
    }

    /// A peer's published segment: magic, version and kind checked.
    pub(crate) fn attach_peer(map: Mapping) -> Option<Ring> {
        let ready = map.u64_at(hdr::MAGIC).load(Acquire) == hdr::MAGIC_VALUE
            && map.u32_at(hdr::VERSION).load(Relaxed) == hdr::VERSION_VALUE
            && map.u32_at(hdr::KIND).load(Relaxed) == hdr::KIND_ENDPOINT;
        if ready { Ring::attach(map) } else { None }
    }

    /// The segment, for its header.
    pub(crate) fn map(&self) -> &Mapping {
        &self.map
    }

    /// Largest payload a slot carries.
    pub(crate) fn payload(&self) -> usize {
        self.payload
    }

    /// Lanes of the segment.
    pub(crate) fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Slots of each lane.
    pub(crate) fn slots(&self) -> u32 {
        self.mask + 1
    }

    fn lane_ctl(&self, lane: u32) -> usize {
        assert!(lane < self.lanes, "lane {lane} out of range");
        LANE_TABLE + lane as usize * LANE_CTL
    }

    #[inline]
    fn slot_off(&self, lane: u32, pos: u32) -> usize {
        self.slots_at + lane as usize * self.lane_len + (pos & self.mask) as usize * self.stride
    }

    /// The header of slot `pos` of `lane`: one bounds check for all its
    /// fields.
    #[inline]
    fn slot(&self, lane: u32, pos: u32) -> &SlotHeader {
        self.map.slot_header_at(self.slot_off(lane, pos))
    }

    fn head_word(&self, lane: u32) -> &AtomicU32 {
        self.map.u32_at(self.lane_ctl(lane) + lane::HEAD)
    }

    // Producer side.

    /// Claims a free lane for the producer `pid` with address (`qpn`,
    /// `connid`); `None` when every lane is taken.
    pub(crate) fn claim_lane(&self, pid: u32, qpn: u16, connid: u32) -> Option<u32> {
        (0..self.lanes).find(|&lane| {
            let ctl = self.lane_ctl(lane);
            let owner = self.map.u64_at(ctl + lane::OWNER);
            if owner.compare_exchange(0, pid as u64, Acquire, Relaxed).is_err() {
                return false;
            }
            self.map.u32_at(ctl + lane::QPN).store(qpn as u32, Relaxed);
            self.map.u32_at(ctl + lane::CONNID).store(connid, Relaxed);
            self.map.u32_at(ctl + lane::STATE).store(LaneState::Open.to_u32(), Release);
            true
        })
    }

    /// Takes a free lane for `pid` and stops there, as a sender that dies
    /// halfway through [`Ring::claim_lane`] would.
    #[cfg(test)]
    pub(crate) fn take_lane_unopened(&self, pid: u32) -> Option<u32> {
        (0..self.lanes).find(|&lane| {
            let owner = self.map.u64_at(self.lane_ctl(lane) + lane::OWNER);
            owner.compare_exchange(0, pid as u64, Acquire, Relaxed).is_ok()
        })
    }

    /// Marks our lane closed: nothing more will be published in it.
    pub(crate) fn close_lane(&self, lane: u32) {
        let state = self.map.u32_at(self.lane_ctl(lane) + lane::STATE);
        state.store(LaneState::Closed.to_u32(), Release);
    }

    /// Whether slot `pos` of our lane is free, given the consumer's head as
    /// last read (`seen`, refreshed here when the lane looks full).
    #[inline]
    pub(crate) fn has_room(&self, lane: u32, pos: u32, seen: &mut u32) -> bool {
        if pos.wrapping_sub(*seen) <= self.mask {
            return true;
        }
        // Acquire: the consumer's reads of the slot's last packet happened
        // before we overwrite it.
        *seen = self.head_word(lane).load(Acquire);
        pos.wrapping_sub(*seen) <= self.mask
    }

    /// Fills slot `pos` of our lane (free: see [`Ring::has_room`]) and hands
    /// it to the consumer.
    pub(crate) fn publish(
        &self,
        lane: u32,
        pos: u32,
        rec: &Record,
        head: &[u8],
        tail: Option<(&Mapping, usize, usize)>,
    ) {
        let tail_len = tail.map_or(0, |(_, _, n)| n);
        assert!(head.len() + tail_len <= self.payload, "packet larger than the peer's slots");
        let at = self.slot_off(lane, pos);
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
        // written (64 B streaming 1.21-1.25x, pingpong p50 0.78-0.91x). A
        // slot not yet consumed only costs the consumer a second read.
        let ahead = self.slot_off(lane, pos.wrapping_add(PREFETCH_AHEAD));
        let lines = (slot::DATA + head.len() + tail_len).div_ceil(64).min(PREFETCH_LINES);
        self.map.prefetch_write(ahead, lines);
    }

    /// Whether the consumer has taken the packet we published at `pos`, as
    /// of its last published head.
    pub(crate) fn consumed(&self, lane: u32, pos: u32) -> bool {
        let head = self.head_word(lane).load(Acquire);
        head.wrapping_sub(pos.wrapping_add(1)) as i32 >= 0
    }

    // Consumer side: only the segment's owner.

    /// Who produces into `lane`.
    pub(crate) fn owner(&self, lane: u32) -> Owner {
        let ctl = self.lane_ctl(lane);
        let state = match self.map.u32_at(ctl + lane::STATE).load(Acquire) {
            1 => LaneState::Open,
            2 => LaneState::Closed,
            // 0, or a peer's garbage: no producer to take packets from.
            _ => LaneState::Free,
        };
        Owner {
            pid: self.map.u64_at(ctl + lane::OWNER).load(Relaxed) as u32,
            qpn: self.map.u32_at(ctl + lane::QPN).load(Relaxed) as u16,
            connid: self.map.u32_at(ctl + lane::CONNID).load(Relaxed),
            state,
        }
    }

    /// The packet at position `pos` of `lane` (the consumer's head), if
    /// published.
    #[inline]
    pub(crate) fn peek(&self, lane: u32, pos: u32) -> Option<Record> {
        let h = self.slot(lane, pos);
        (h.ctl.load(Acquire) == pos.wrapping_add(1)).then(|| Record {
            kind: Kind::from_u32(h.kind.load(Relaxed)),
            len: h.len.load(Relaxed),
            imm: h.imm.load(Relaxed),
        })
    }

    /// Copies the first `dst.len()` payload bytes of slot `pos` of `lane`.
    pub(crate) fn read(&self, lane: u32, pos: u32, dst: &mut [u8]) {
        assert!(dst.len() <= self.payload, "longer than a slot");
        self.map.read_bytes(self.slot_off(lane, pos) + slot::DATA, dst);
    }

    /// Publishes the consumer's head of `lane`: every packet before `pos`
    /// is consumed (what its producer learns completions and room from).
    pub(crate) fn set_head(&self, lane: u32, pos: u32) {
        self.head_word(lane).store(pos, Release);
    }

    /// Empties a lane whose producer is gone, and frees it for the next:
    /// slots unpublished, head 0, owner line cleared, the owner word last.
    pub(crate) fn reset_lane(&self, lane: u32) {
        for pos in 0..=self.mask {
            self.slot(lane, pos).ctl.store(0, Relaxed);
        }
        let ctl = self.lane_ctl(lane);
        self.head_word(lane).store(0, Relaxed);
        self.map.u32_at(ctl + lane::STATE).store(LaneState::Free.to_u32(), Relaxed);
        self.map.u64_at(ctl + lane::OWNER).store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_ring(lanes: u32, slots: u32) -> Ring {
        let (ring, _fd) = Ring::create(lanes, slots, 64).unwrap();
        ring.open_for_business();
        ring
    }

    fn rec(len: u32) -> Record {
        Record { kind: Kind::Packet, len, imm: 0 }
    }

    #[test]
    fn slots_go_round_and_the_producer_sees_room_and_consumption_from_the_head() {
        let ring = test_ring(2, 4);
        let me = std::process::id();
        let lane = ring.claim_lane(me, 7, 9).unwrap();
        assert_eq!(ring.owner(lane), Owner { pid: me, qpn: 7, connid: 9, state: LaneState::Open });
        let mut seen = 0;
        for lap in 0..3u32 {
            for i in 0..4u32 {
                let pos = lap * 4 + i;
                assert!(ring.has_room(lane, pos, &mut seen), "lap {lap} slot {i}");
                ring.publish(lane, pos, &rec(1), &[i as u8], None);
            }
            assert!(!ring.has_room(lane, lap * 4 + 4, &mut seen), "full");
            for i in 0..4u32 {
                let pos = lap * 4 + i;
                assert!(!ring.consumed(lane, pos));
                assert_eq!(ring.peek(lane, pos), Some(rec(1)));
                let mut b = [0u8; 1];
                ring.read(lane, pos, &mut b);
                assert_eq!(b[0], i as u8);
                ring.set_head(lane, pos + 1);
                assert!(ring.consumed(lane, pos));
            }
            assert_eq!(ring.peek(lane, lap * 4 + 4), None, "the last lap's packet is stale");
        }
    }

    #[test]
    fn each_producer_has_a_lane_until_there_are_none() {
        let ring = test_ring(2, 4);
        let a = ring.claim_lane(100, 1, 1).unwrap();
        let b = ring.claim_lane(200, 2, 2).unwrap();
        assert_ne!(a, b);
        assert_eq!(ring.claim_lane(300, 3, 3), None, "every lane taken");
        ring.publish(a, 0, &rec(1), b"a", None);
        ring.publish(b, 0, &rec(1), b"b", None);
        let mut x = [0u8; 1];
        ring.read(b, 0, &mut x);
        assert_eq!(&x, b"b", "lanes do not share slots");
        ring.close_lane(a);
        assert_eq!(ring.owner(a).state, LaneState::Closed);
        ring.reset_lane(a);
        assert_eq!(ring.owner(a).state, LaneState::Free);
        assert_eq!(ring.peek(a, 0), None, "a reset lane has nothing published");
        let c = ring.claim_lane(300, 3, 3).unwrap();
        assert_eq!(c, a, "the freed lane goes to the next producer");
        let mut seen = 0;
        assert!(ring.has_room(c, 0, &mut seen));
        assert!(!ring.consumed(c, 0), "and its head starts again at 0");
    }
}
