//! The receive ring in an endpoint's segment: a bounded lock-free
//! multi-producer single-consumer queue of MTU-sized slots (Vyukov's
//! bounded queue: a sequence number per slot, producers advance the tail,
//! the owner alone consumes).
//!
//! Each slot's control word holds the slot's sequence number (low 32 bits)
//! and the pid of the producer writing it (high 32 bits). For position
//! `pos` (wrapping u32) a slot goes through:
//!
//! | seq | writer | meaning |
//! |---|---|---|
//! | `pos` | 0 | free for the producer of `pos` |
//! | `pos` | pid | claimed: `pid` is writing it |
//! | `pos + 1` | 0 | published: the consumer may take it |
//! | `pos + slots` | 0 | consumed: free for the producer of the next lap |
//!
//! A producer claims a slot by a compare-and-swap on the control word (not
//! on the tail), so the claim names its writer atomically, then moves the
//! tail on; any producer that finds a claimed slot under the tail moves the
//! tail on for it, so a producer that dies after claiming blocks no other
//! producer. The consumer, stuck on a slot whose writer died, can tell so
//! from the pid and skip the slot. The consumer publishes its head after
//! each burst: a sender learns that its packet at `pos` was consumed when
//! the head has passed `pos`, one shared line read per burst rather than a
//! slot's line per packet.

use std::ffi::CString;
use std::io;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use super::map::{Mapping, hdr};

/// The producers' tail, on a cache line pair of its own.
const TAIL: usize = 128;
/// The consumer's head (published per burst, for senders), likewise.
const HEAD: usize = 256;
/// The first slot.
const SLOTS: usize = 512;

mod slot {
    /// Payload starts right after the header, in the header's cache line:
    /// a packet of up to 96 bytes arrives in two lines, not three.
    pub const DATA: usize = 32;
}

/// A slot's header, at the start of its slot: the control word, then the
/// record. Only atomics, so any bytes a peer writes are valid values.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SlotHeader {
    ctl: AtomicU64,
    kind: AtomicU32,
    src_qpn: AtomicU32,
    src_connid: AtomicU32,
    len: AtomicU32,
    imm: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<SlotHeader>() <= slot::DATA);

/// Attempts of one `claim` before it reports the ring full.
const CLAIM_TRIES: u32 = 4096;

const _: () = assert!(hdr::LEN_MIN <= TAIL && TAIL + 128 <= HEAD && HEAD + 128 <= SLOTS);

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
    pub src_qpn: u16,
    pub src_connid: u32,
    pub len: u32,
    pub imm: u32,
}

/// What the consumer finds at its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// Nothing published.
    Empty,
    /// Process `writer` claimed the slot and has not published it yet.
    Writing {
        writer: u32,
    },
    Ready(Record),
}

/// A claimed slot, to be published by [`Ring::publish`].
#[derive(Debug)]
#[must_use = "a claimed slot blocks the ring until it is published"]
pub(crate) struct Claim(u32);

fn ctl(seq: u32, writer: u32) -> u64 {
    (writer as u64) << 32 | seq as u64
}

fn split(ctl: u64) -> (u32, u32) {
    (ctl as u32, (ctl >> 32) as u32)
}

/// A ring in a mapped endpoint segment: the owner's (to consume) or a
/// peer's (to produce into).
#[derive(Debug)]
pub(crate) struct Ring {
    map: Mapping,
    mask: u32,
    stride: usize,
    payload: usize,
}

impl Ring {
    /// Bytes of a segment with `slots` slots of `payload` bytes.
    pub(crate) fn segment_len(slots: u32, payload: usize) -> Option<usize> {
        let stride = Ring::stride(payload)?;
        stride.checked_mul(slots as usize)?.checked_add(SLOTS)
    }

    fn stride(payload: usize) -> Option<usize> {
        Some(payload.checked_add(slot::DATA + 63)? & !63)
    }

    /// Creates segment `name` holding an empty ring; the caller writes the
    /// rest of the header and then [`Ring::open_for_business`].
    pub(crate) fn create(name: &CString, slots: u32, payload: usize) -> io::Result<Ring> {
        assert!(slots >= 2 && slots.is_power_of_two(), "ring slots: a power of two, at least 2");
        let len = Ring::segment_len(slots, payload).ok_or(io::ErrorKind::InvalidInput)?;
        let stride = Ring::stride(payload).ok_or(io::ErrorKind::InvalidInput)?;
        let map = Mapping::create(name, len)?;
        map.u32_at(hdr::PID).store(std::process::id(), Release);
        map.u32_at(hdr::RING_SLOTS).store(slots, Relaxed);
        map.u32_at(hdr::SLOT_PAYLOAD).store(payload as u32, Relaxed);
        map.u32_at(hdr::SLOT_STRIDE).store(stride as u32, Relaxed);
        let ring = Ring { map, mask: slots - 1, stride, payload };
        for pos in 0..slots {
            ring.ctl(pos).store(ctl(pos, 0), Relaxed);
        }
        Ok(ring)
    }

    /// Publishes the header: magic last, so a reader that sees it sees
    /// everything before it.
    pub(crate) fn open_for_business(&self) {
        self.map.u32_at(hdr::VERSION).store(hdr::VERSION_VALUE, Relaxed);
        self.map.u32_at(hdr::KIND).store(hdr::KIND_ENDPOINT, Relaxed);
        self.map.u32_at(hdr::STATE).store(hdr::STATE_READY, Relaxed);
        self.map.u64_at(hdr::MAGIC).store(hdr::MAGIC_VALUE, Release);
    }

    /// A peer's ring in `map`, if the header describes a ring that fits.
    /// The geometry is read once here: a peer changing its header later
    /// cannot move our accesses outside the mapping.
    pub(crate) fn attach(map: Mapping) -> Option<Ring> {
        if map.u64_at(hdr::MAGIC).load(Acquire) != hdr::MAGIC_VALUE
            || map.u32_at(hdr::VERSION).load(Relaxed) != hdr::VERSION_VALUE
            || map.u32_at(hdr::KIND).load(Relaxed) != hdr::KIND_ENDPOINT
            || map.len() < SLOTS
        {
            return None;
        }
        let slots = map.u32_at(hdr::RING_SLOTS).load(Relaxed);
        let payload = map.u32_at(hdr::SLOT_PAYLOAD).load(Relaxed) as usize;
        let stride = map.u32_at(hdr::SLOT_STRIDE).load(Relaxed) as usize;
        let fits = Ring::segment_len(slots, payload).is_some_and(|len| len <= map.len());
        (slots >= 2 && slots.is_power_of_two() && fits && Ring::stride(payload) == Some(stride))
            .then_some(Ring { map, mask: slots - 1, stride, payload })
    }

    /// The segment, for its header.
    pub(crate) fn map(&self) -> &Mapping {
        &self.map
    }

    /// Largest payload a slot carries.
    pub(crate) fn payload(&self) -> usize {
        self.payload
    }

    fn slot_off(&self, pos: u32) -> usize {
        SLOTS + (pos & self.mask) as usize * self.stride
    }

    /// The header of the slot at `pos`: one bounds check for all its fields.
    fn slot(&self, pos: u32) -> &SlotHeader {
        self.map.slot_header_at(self.slot_off(pos))
    }

    fn ctl(&self, pos: u32) -> &AtomicU64 {
        &self.slot(pos).ctl
    }

    // Producer side.

    /// Claims the next free slot for `writer` (our pid); `None` when the
    /// ring is full, or when it stays contended (or a peer corrupted it)
    /// for longer than a ring's worth of tries: back-pressure, not a spin.
    pub(crate) fn claim(&self, writer: u32) -> Option<Claim> {
        let tail = self.map.u32_at(TAIL);
        let mut pos = tail.load(Relaxed);
        for _ in 0..CLAIM_TRIES {
            let ctl_word = self.ctl(pos);
            let word = ctl_word.load(Acquire);
            let (seq, owner) = split(word);
            let lag = seq.wrapping_sub(pos) as i32;
            if lag == 0 && owner == 0 {
                // Acquire: the consumer's reads of the slot's last packet
                // happened before we overwrite it.
                if ctl_word.compare_exchange_weak(word, ctl(pos, writer), Acquire, Relaxed).is_ok()
                {
                    let _ = tail.compare_exchange(pos, pos.wrapping_add(1), Relaxed, Relaxed);
                    return Some(Claim(pos));
                }
            } else if lag == 0 {
                // Claimed by a producer that has not moved the tail yet
                // (or died first): move it for them.
                let _ = tail.compare_exchange(pos, pos.wrapping_add(1), Relaxed, Relaxed);
                pos = tail.load(Relaxed);
            } else if lag < 0 {
                // The slot still holds the previous lap's packet.
                return None;
            } else {
                pos = tail.load(Relaxed);
            }
        }
        None
    }

    /// Fills a claimed slot and hands it to the consumer; returns its
    /// position, which [`Ring::consumed`] takes.
    pub(crate) fn publish(&self, claim: Claim, rec: &Record, parts: [&[u8]; 2]) -> u32 {
        let pos = claim.0;
        let [head, tail] = parts;
        assert!(head.len() + tail.len() <= self.payload, "packet larger than the peer's slots");
        let h = self.slot(pos);
        h.kind.store(rec.kind.to_u32(), Relaxed);
        h.src_qpn.store(rec.src_qpn as u32, Relaxed);
        h.src_connid.store(rec.src_connid, Relaxed);
        h.len.store(rec.len, Relaxed);
        h.imm.store(rec.imm, Relaxed);
        let at = self.slot_off(pos) + slot::DATA;
        self.map.write_bytes(at, head);
        if !tail.is_empty() {
            self.map.write_bytes(at + head.len(), tail);
        }
        h.ctl.store(ctl(pos.wrapping_add(1), 0), Release);
        pos
    }

    /// Whether the consumer has taken the slot published at `pos`, as of
    /// its last published head.
    pub(crate) fn consumed(&self, pos: u32) -> bool {
        let head = self.map.u32_at(HEAD).load(Acquire);
        head.wrapping_sub(pos.wrapping_add(1)) as i32 >= 0
    }

    // Consumer side: only the ring's owner.

    /// What is at position `pos` (the consumer's head).
    pub(crate) fn head(&self, pos: u32) -> Head {
        let h = self.slot(pos);
        let (seq, writer) = split(h.ctl.load(Acquire));
        if seq == pos.wrapping_add(1) {
            Head::Ready(Record {
                kind: Kind::from_u32(h.kind.load(Relaxed)),
                src_qpn: h.src_qpn.load(Relaxed) as u16,
                src_connid: h.src_connid.load(Relaxed),
                len: h.len.load(Relaxed),
                imm: h.imm.load(Relaxed),
            })
        } else if seq == pos && writer != 0 {
            Head::Writing { writer }
        } else {
            Head::Empty
        }
    }

    /// Copies the first `dst.len()` payload bytes of the slot at `pos`.
    pub(crate) fn read(&self, pos: u32, dst: &mut [u8]) {
        assert!(dst.len() <= self.payload, "longer than a slot");
        self.map.read_bytes(self.slot_off(pos) + slot::DATA, dst);
    }

    /// Frees the slot at `pos` for the next lap: its sender sees the
    /// packet consumed.
    pub(crate) fn release(&self, pos: u32) {
        self.ctl(pos).store(ctl(pos.wrapping_add(self.mask + 1), 0), Release);
    }

    /// Frees the slot at `pos` that dead process `writer` claimed and never
    /// published; false if it changed meanwhile.
    pub(crate) fn skip_abandoned(&self, pos: u32, writer: u32) -> bool {
        let next = ctl(pos.wrapping_add(self.mask + 1), 0);
        self.ctl(pos).compare_exchange(ctl(pos, writer), next, Release, Relaxed).is_ok()
    }

    /// Publishes the consumer's head: every slot before `pos` is consumed
    /// (what senders learn their completions from).
    pub(crate) fn set_head(&self, pos: u32) {
        self.map.u32_at(HEAD).store(pos, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_ring(slots: u32) -> Ring {
        let seg = super::super::map::name(format_args!(
            "test-ring-{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
        ));
        let ring = Ring::create(&seg, slots, 64).unwrap();
        super::super::map::unlink(&seg);
        ring.open_for_business();
        ring
    }

    fn rec(len: u32) -> Record {
        Record { kind: Kind::Packet, src_qpn: 7, src_connid: 9, len, imm: 0 }
    }

    #[test]
    fn slots_go_round_and_senders_see_consumption() {
        let ring = test_ring(4);
        let me = std::process::id();
        for lap in 0..3u32 {
            let mut pos = Vec::new();
            for i in 0..4u8 {
                let c = ring.claim(me).expect("free slot");
                pos.push(ring.publish(c, &rec(1), [&[i], &[]]));
            }
            assert!(ring.claim(me).is_none(), "full");
            for (i, &p) in pos.iter().enumerate() {
                assert_eq!(p, lap * 4 + i as u32);
                assert!(!ring.consumed(p));
                assert_eq!(ring.head(p), Head::Ready(rec(1)));
                let mut b = [0u8; 1];
                ring.read(p, &mut b);
                assert_eq!(b[0], i as u8);
                ring.release(p);
                assert!(!ring.consumed(p), "not until the head is published");
                ring.set_head(p + 1);
                assert!(ring.consumed(p));
            }
            assert_eq!(ring.head(pos[3] + 1), Head::Empty);
        }
    }

    #[test]
    fn a_dead_writers_slot_is_skipped_and_the_tail_moves_past_it() {
        let ring = test_ring(4);
        // A pid that existed and is gone: a child we reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stuck = ring.claim(dead).unwrap();
        assert_eq!(ring.head(0), Head::Writing { writer: dead });
        let c = ring.claim(std::process::id()).unwrap();
        assert_eq!(ring.publish(c, &rec(0), [&[], &[]]), 1, "the next producer is not blocked");
        assert!(!ring.skip_abandoned(0, dead + 1), "only the writer named in the slot");
        assert!(ring.skip_abandoned(0, dead));
        assert!(matches!(ring.head(1), Head::Ready(_)));
        drop(stuck);
    }
}
