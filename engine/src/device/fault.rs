//! Fault injection at the datagram layer, seeded and replayable, for every
//! device that has a wire: the sim's fabric and the udp device's sockets
//! take their faults from here, so both are tested against one model, by
//! one set of endpoint scenarios (`engine/tests/endpoint_wire.rs`).
//!
//! Three pieces:
//!
//! * [`Faults`], what to inject: drop, duplicate, reorder, delay, corrupt,
//!   truncate, and queue-full (a post refused: back-pressure);
//! * [`Injector`], the seeded decisions: the [`Fate`] of each datagram, the
//!   pick among datagrams ready to deliver, whether a post is refused; it
//!   counts what it did ([`FaultStats`]). The same seed and the same calls
//!   give the same faults, so a failing run replays;
//! * [`FaultQueue`], datagrams held on the wire until due, and
//!   [`Faulty`], a [`Wire`] wrapped with both: what a device whose
//!   transport is a byte datagram wire (udp) puts between itself and it.
//!
//! A device applies a fate to its own representation of a packet: the sim
//! keeps a packet in its sender's buffer until delivery and makes a copy
//! only for a fault that needs one ([`Fate::needs_copy`]); [`Faulty`] works
//! on bytes ([`Fate::apply`]). Where a fault lands relative to the
//! device's reliability is the device's to say: below the udp device's
//! acknowledgements a drop is retransmitted; the sim, which models SRD's
//! reliable delivery without its protocol, delivers a dropped packet
//! again after its retransmission delay, and hands corrupted or truncated
//! bytes to the endpoint as a hostile peer's.
//!
//! Nothing here allocates unless a fault that copies a datagram happens.

use std::collections::VecDeque;

/// What to inject. Probabilities are in millionths (ppm) of datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Seeds every decision.
    pub seed: u64,
    /// Datagrams lost on the wire.
    pub drop_ppm: u32,
    /// Datagrams delivered twice.
    pub duplicate_ppm: u32,
    /// Delivery picks at random among the first this many datagrams due
    /// (1: in order; at most [`Faults::MAX_REORDER`]).
    pub reorder_window: u32,
    /// Datagrams held back for up to `delay_max_ns`.
    pub delay_ppm: u32,
    /// The longest delay, in nanoseconds of the device's clock.
    pub delay_max_ns: u64,
    /// Datagrams with one bit flipped.
    pub corrupt_ppm: u32,
    /// Datagrams cut short (to fewer bytes than were sent).
    pub truncate_ppm: u32,
    /// Posts refused as if the queue were full: back-pressure.
    pub queue_full_ppm: u32,
}

impl Faults {
    /// No faults: datagrams go as they are posted.
    pub const NONE: Faults = Faults {
        seed: 1,
        drop_ppm: 0,
        duplicate_ppm: 0,
        reorder_window: 1,
        delay_ppm: 0,
        delay_max_ns: 0,
        corrupt_ppm: 0,
        truncate_ppm: 0,
        queue_full_ppm: 0,
    };

    /// The widest reorder window.
    pub const MAX_REORDER: u32 = 1024;

    /// Reordering alone: delivery picks among the first `window` datagrams.
    pub fn reorder(seed: u64, window: u32) -> Faults {
        Faults { seed, reorder_window: window, ..Faults::NONE }
    }

    /// Whether nothing is injected.
    pub fn is_none(&self) -> bool {
        self.reorder_window <= 1
            && (self.drop_ppm | self.duplicate_ppm | self.delay_ppm)
                | (self.corrupt_ppm | self.truncate_ppm | self.queue_full_ppm)
                == 0
    }

    /// Whether delivery keeps the order of posting.
    pub fn in_order(&self) -> bool {
        self.reorder_window <= 1 && self.delay_ppm == 0
    }
}

/// The text form, `seed=7,drop_ppm=100000,reorder_window=8` (fields by
/// name, any subset; the rest as in [`Faults::NONE`]): how a fault set
/// crosses a process boundary, e.g. softefa's `SOFTEFA_FAULTS`.
impl std::fmt::Display for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Faults {
            seed,
            drop_ppm,
            duplicate_ppm,
            reorder_window,
            delay_ppm,
            delay_max_ns,
            corrupt_ppm,
            truncate_ppm,
            queue_full_ppm,
        } = self;
        write!(
            f,
            "seed={seed},drop_ppm={drop_ppm},duplicate_ppm={duplicate_ppm},\
             reorder_window={reorder_window},delay_ppm={delay_ppm},delay_max_ns={delay_max_ns},\
             corrupt_ppm={corrupt_ppm},truncate_ppm={truncate_ppm},queue_full_ppm={queue_full_ppm}"
        )
    }
}

/// A field of a fault set's text form that is unknown or not a number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad fault setting {0:?} (want name=number, e.g. drop_ppm=1000)")]
pub struct BadFaults(pub String);

impl std::str::FromStr for Faults {
    type Err = BadFaults;

    fn from_str(s: &str) -> Result<Faults, BadFaults> {
        let mut f = Faults::NONE;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || BadFaults(item.to_string());
            let (name, value) = item.split_once('=').ok_or_else(bad)?;
            let n: u64 = value.trim().parse().map_err(|_| bad())?;
            let ppm = || u32::try_from(n).ok().filter(|&p| p <= 1_000_000).ok_or_else(bad);
            match name.trim() {
                "seed" => f.seed = n,
                "drop_ppm" => f.drop_ppm = ppm()?,
                "duplicate_ppm" => f.duplicate_ppm = ppm()?,
                "reorder_window" => {
                    f.reorder_window = u32::try_from(n)
                        .ok()
                        .filter(|w| (1..=Faults::MAX_REORDER).contains(w))
                        .ok_or_else(bad)?
                }
                "delay_ppm" => f.delay_ppm = ppm()?,
                "delay_max_ns" => f.delay_max_ns = n,
                "corrupt_ppm" => f.corrupt_ppm = ppm()?,
                "truncate_ppm" => f.truncate_ppm = ppm()?,
                "queue_full_ppm" => f.queue_full_ppm = ppm()?,
                _ => return Err(bad()),
            }
        }
        Ok(f)
    }
}

impl Default for Faults {
    fn default() -> Faults {
        Faults::NONE
    }
}

/// What an [`Injector`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    pub dropped: u64,
    pub duplicated: u64,
    /// Deliveries that took a datagram other than the oldest due.
    pub reordered: u64,
    pub delayed: u64,
    pub corrupted: u64,
    pub truncated: u64,
    /// Posts refused (queue-full).
    pub refused: u64,
}

/// What happens to one datagram on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fate {
    /// Lost: nothing else applies.
    pub drop: bool,
    /// Delivered twice (the copy undamaged and undelayed).
    pub duplicate: bool,
    /// Held back this long.
    pub delay_ns: u64,
    /// Byte `.0` XORed with `.1` (one bit, never zero).
    pub corrupt: Option<(usize, u8)>,
    /// Cut to this many bytes, fewer than were sent.
    pub truncate: Option<usize>,
}

impl Fate {
    /// Delivered as sent.
    pub const CLEAN: Fate =
        Fate { drop: false, duplicate: false, delay_ns: 0, corrupt: None, truncate: None };

    /// Whether the bytes that arrive differ from those sent.
    pub fn damages(&self) -> bool {
        self.corrupt.is_some() || self.truncate.is_some()
    }

    /// Whether the wire must hold a copy of the datagram's bytes: it is
    /// damaged or delivered twice.
    pub fn needs_copy(&self) -> bool {
        self.duplicate || self.damages()
    }

    /// Damages `bytes` as the fate says; returns the length that arrives.
    pub fn apply(&self, bytes: &mut [u8]) -> usize {
        if let Some((at, xor)) = self.corrupt
            && let Some(b) = bytes.get_mut(at)
        {
            *b ^= xor;
        }
        self.truncate.map_or(bytes.len(), |n| n.min(bytes.len()))
    }
}

/// The seeded decisions of a [`Faults`] plan.
#[derive(Debug, Clone)]
pub struct Injector {
    faults: Faults,
    /// `faults.is_none()`, kept: devices ask it on every post.
    quiet: bool,
    /// Whether a datagram's [`Fate`] can be other than clean.
    fates: bool,
    rng: u64,
    stats: FaultStats,
}

impl Injector {
    /// An injector for `faults`.
    pub fn new(faults: Faults) -> Injector {
        let mut inj =
            Injector { faults, quiet: true, fates: false, rng: 0, stats: FaultStats::default() };
        inj.set_faults(faults);
        inj
    }

    /// Its plan.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// A new plan, reseeded from its seed: what follows replays as if the
    /// injector were new. Panics on a reorder window of 0 or past
    /// [`Faults::MAX_REORDER`].
    pub fn set_faults(&mut self, faults: Faults) {
        assert!(
            (1..=Faults::MAX_REORDER).contains(&faults.reorder_window),
            "reorder_window is 1..={}",
            Faults::MAX_REORDER
        );
        self.faults = faults;
        self.quiet = faults.is_none();
        self.fates = !Faults { reorder_window: 1, queue_full_ppm: 0, ..faults }.is_none();
        // A zero state would stall xorshift.
        self.rng = faults.seed ^ 0x9e37_79b9_7f4a_7c15;
    }

    /// What it did so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Whether nothing is injected.
    #[inline(always)]
    pub fn is_none(&self) -> bool {
        self.quiet
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `ppm` millionths (drawing nothing at 0, so
    /// that a fault switched off leaves the others' sequence alone).
    fn roll(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < ppm as u64
    }

    /// Whether [`Injector::fate`] can give anything but [`Fate::CLEAN`]
    /// (faults other than reordering and refused posts are on).
    #[inline(always)]
    pub fn has_fates(&self) -> bool {
        self.fates
    }

    /// Whether a post is refused as if the queue were full.
    #[inline]
    pub fn refuse(&mut self) -> bool {
        if !self.roll(self.faults.queue_full_ppm) {
            return false;
        }
        self.stats.refused += 1;
        true
    }

    /// The fate of a datagram of `len` bytes.
    pub fn fate(&mut self, len: usize) -> Fate {
        let f = self.faults;
        if self.roll(f.drop_ppm) {
            self.stats.dropped += 1;
            return Fate { drop: true, ..Fate::CLEAN };
        }
        let mut fate = Fate::CLEAN;
        if self.roll(f.duplicate_ppm) {
            self.stats.duplicated += 1;
            fate.duplicate = true;
        }
        if self.roll(f.delay_ppm) && f.delay_max_ns > 0 {
            self.stats.delayed += 1;
            fate.delay_ns = 1 + self.next() % f.delay_max_ns;
        }
        if len > 0 && self.roll(f.corrupt_ppm) {
            self.stats.corrupted += 1;
            let r = self.next();
            fate.corrupt = Some(((r >> 3) as usize % len, 1 << (r & 7)));
        }
        if len > 0 && self.roll(f.truncate_ppm) {
            self.stats.truncated += 1;
            fate.truncate = Some(self.next() as usize % len);
        }
        fate
    }

    /// Which of `due` datagrams ready in order to be delivered goes next
    /// (0: the oldest).
    #[inline]
    pub fn pick(&mut self, due: usize) -> usize {
        let window = due.min(self.faults.reorder_window as usize);
        if window <= 1 {
            return 0;
        }
        let i = (self.next() % window as u64) as usize;
        self.stats.reordered += (i != 0) as u64;
        i
    }
}

/// What [`FaultQueue::pop`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Popped<P> {
    /// The datagram to deliver.
    Got(P),
    /// Datagrams are due, but none that the caller can take now (a
    /// receiver with no buffer posted).
    Refused,
    /// None is due.
    Empty,
}

/// Datagrams on the wire, each with the time it is due, in posting order.
#[derive(Debug, Clone)]
pub struct FaultQueue<P> {
    q: VecDeque<(u64, P)>,
    /// No datagram is due later than this (while the queue is not empty).
    latest: u64,
}

impl<P> FaultQueue<P> {
    /// An empty queue with room for `cap` datagrams before it grows.
    pub fn with_capacity(cap: usize) -> FaultQueue<P> {
        FaultQueue { q: VecDeque::with_capacity(cap), latest: 0 }
    }

    /// Puts a datagram on the wire, due at `due_ns`.
    #[inline]
    pub fn push(&mut self, due_ns: u64, p: P) {
        self.latest = self.latest.max(due_ns);
        self.q.push_back((due_ns, p));
    }

    /// Puts a datagram back at the head (it was taken but could not go).
    pub fn push_front(&mut self, due_ns: u64, p: P) {
        self.latest = self.latest.max(due_ns);
        self.q.push_front((due_ns, p));
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.q.len()
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The datagrams, in posting order.
    pub fn iter(&self) -> impl Iterator<Item = &P> {
        self.q.iter().map(|(_, p)| p)
    }

    /// Takes every datagram, in posting order.
    pub fn drain(&mut self) -> impl Iterator<Item = P> + '_ {
        self.latest = 0;
        self.q.drain(..).map(|(_, p)| p)
    }

    /// The earliest time a datagram falls due, if any is held.
    pub fn next_due(&self) -> Option<u64> {
        self.q.iter().map(|&(due, _)| due).min()
    }

    /// Takes the oldest datagram if it is due: the whole of `pop` on a wire
    /// without faults.
    #[inline(always)]
    pub fn pop_front(&mut self, now_ns: u64) -> Option<P> {
        match self.q.front() {
            Some(&(due, _)) if due <= now_ns => self.q.pop_front().map(|(_, p)| p),
            _ => None,
        }
    }

    /// Takes a datagram due by `now_ns`: the one `inj` picks among the first
    /// [`Faults::reorder_window`] due, if `accept` takes it, else the first
    /// of them that `accept` takes.
    #[inline]
    pub fn pop(
        &mut self,
        now_ns: u64,
        inj: &mut Injector,
        mut accept: impl FnMut(&P) -> bool,
    ) -> Popped<P> {
        let window = inj.faults.reorder_window as usize;
        let at = if self.latest <= now_ns {
            // All due (nothing was held back): positions are indices.
            let ready = self.q.len().min(window);
            if ready == 0 {
                return Popped::Empty;
            }
            let k = inj.pick(ready);
            if accept(&self.q[k].1) { Some(k) } else { (0..ready).find(|&i| accept(&self.q[i].1)) }
        } else {
            let due = || self.q.iter().enumerate().filter(|(_, (d, _))| *d <= now_ns);
            let ready = due().take(window).count();
            if ready == 0 {
                return Popped::Empty;
            }
            let k = inj.pick(ready);
            let picked = due().nth(k).map(|(i, _)| i).expect("k < ready");
            if accept(&self.q[picked].1) {
                Some(picked)
            } else {
                due().take(window).find(|(_, (_, p))| accept(p)).map(|(i, _)| i)
            }
        };
        let taken = match at {
            Some(0) => self.q.pop_front(),
            Some(i) => self.q.remove(i),
            None => None,
        };
        let Some((_, p)) = taken else {
            return Popped::Refused;
        };
        if self.q.is_empty() {
            self.latest = 0;
        }
        Popped::Got(p)
    }
}

/// A datagram wire as a device's transport sees it: unreliable datagrams
/// to and from addresses, one call each (a device batches its own calls);
/// time is passed in.
pub trait Wire {
    /// Where a datagram goes, and whom it came from.
    type Addr: Copy + Eq + std::fmt::Debug;

    /// Sends `bytes` to `to`; false when the wire's queue is full
    /// (back-pressure: try again later, nothing was sent).
    fn send(&mut self, now_ns: u64, to: Self::Addr, bytes: &[u8]) -> bool;

    /// Receives the next datagram into `buf`: its sender and length (a
    /// longer datagram is cut to `buf`).
    fn recv(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(Self::Addr, usize)>;
}

/// A [`Wire`] with faults between the device and it: what the device
/// sends meets its [`Fate`] here, and datagrams held back (delayed, or
/// reordered among the ones posted since the last call) go on to the
/// inner wire when due, at a later `send` or `recv`.
#[derive(Debug)]
pub struct Faulty<W: Wire> {
    inner: W,
    inj: Injector,
    held: FaultQueue<(W::Addr, Vec<u8>)>,
}

impl<W: Wire> Faulty<W> {
    /// `inner` with `faults`.
    pub fn new(inner: W, faults: Faults) -> Faulty<W> {
        Faulty { inner, inj: Injector::new(faults), held: FaultQueue::with_capacity(64) }
    }

    /// The wire underneath.
    pub fn inner(&self) -> &W {
        &self.inner
    }

    /// The wire underneath, to configure.
    pub fn inner_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The injector: its plan and what it did.
    pub fn injector(&self) -> &Injector {
        &self.inj
    }

    /// A new plan, replayed from its seed.
    pub fn set_faults(&mut self, faults: Faults) {
        self.inj.set_faults(faults);
    }

    /// Datagrams held back, not yet on the inner wire.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Passes what is due to the inner wire, in the injector's order,
    /// until it is full.
    pub fn release(&mut self, now_ns: u64) {
        while let Popped::Got((to, bytes)) = self.held.pop(now_ns, &mut self.inj, |_| true) {
            if !self.inner.send(now_ns, to, &bytes) {
                self.held.push_front(now_ns, (to, bytes));
                return;
            }
        }
    }
}

impl<W: Wire> Wire for Faulty<W> {
    type Addr = W::Addr;

    fn send(&mut self, now_ns: u64, to: W::Addr, bytes: &[u8]) -> bool {
        if self.inj.refuse() {
            return false;
        }
        let fate = self.inj.fate(bytes.len());
        if fate.drop {
            return true;
        }
        let hold = fate.delay_ns > 0 || fate.needs_copy() || !self.inj.faults.in_order();
        if !hold && self.held.is_empty() {
            return self.inner.send(now_ns, to, bytes);
        }
        let mut copy = bytes.to_vec();
        if fate.duplicate {
            self.held.push(now_ns, (to, copy.clone()));
        }
        let len = fate.apply(&mut copy);
        copy.truncate(len);
        self.held.push(now_ns.saturating_add(fate.delay_ns), (to, copy));
        // Held until the device's next receive, or a window's worth, so
        // that there is something to reorder.
        if self.held.len() >= self.inj.faults.reorder_window as usize {
            self.release(now_ns);
        }
        true
    }

    fn recv(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(W::Addr, usize)> {
        self.release(now_ns);
        self.inner.recv(now_ns, buf)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn faults_cross_as_text_and_bad_settings_are_named() {
        let f = Faults {
            seed: 9,
            drop_ppm: 100_000,
            reorder_window: 8,
            delay_max_ns: 200_000,
            queue_full_ppm: 1,
            ..Faults::NONE
        };
        assert_eq!(f.to_string().parse::<Faults>(), Ok(f));
        assert_eq!("".parse::<Faults>(), Ok(Faults::NONE));
        assert_eq!(
            " seed=3 , drop_ppm=5".parse(),
            Ok(Faults { seed: 3, drop_ppm: 5, ..Faults::NONE })
        );
        for bad in ["drop_ppm", "drop_ppm=x", "drop_ppm=1000001", "reorder_window=0", "lose=1"] {
            assert!(bad.parse::<Faults>().is_err(), "{bad}");
        }
    }

    use super::*;

    /// A loopback wire: what is sent comes back, in order, up to `cap`
    /// datagrams queued.
    #[derive(Debug, Default)]
    struct Loopback {
        q: VecDeque<(u16, Vec<u8>)>,
        cap: usize,
    }

    impl Wire for Loopback {
        type Addr = u16;

        fn send(&mut self, _now: u64, to: u16, bytes: &[u8]) -> bool {
            if self.q.len() >= self.cap {
                return false;
            }
            self.q.push_back((to, bytes.to_vec()));
            true
        }

        fn recv(&mut self, _now: u64, buf: &mut [u8]) -> Option<(u16, usize)> {
            let (from, bytes) = self.q.pop_front()?;
            let n = bytes.len().min(buf.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            Some((from, n))
        }
    }

    /// Sends datagrams `0..n` (each 8 bytes: its number) through `faults`,
    /// receiving as it goes and then for `tail_ns` of clock; returns what
    /// arrived and the injector's counts.
    fn run(faults: Faults, n: u64, tail_ns: u64) -> (Vec<Vec<u8>>, FaultStats) {
        let mut w = Faulty::new(Loopback { cap: 1 << 20, ..Loopback::default() }, faults);
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        let mut recv_all = |w: &mut Faulty<Loopback>, now| {
            while let Some((_, len)) = w.recv(now, &mut buf) {
                got.push(buf[..len].to_vec());
            }
        };
        let mut now = 0;
        for i in 0..n {
            while !w.send(now, 7, &i.to_le_bytes()) {
                recv_all(&mut w, now);
            }
            if i % 4 == 3 {
                recv_all(&mut w, now);
            }
            now += 1_000;
        }
        recv_all(&mut w, now + tail_ns);
        assert_eq!(w.held(), 0, "everything due was released");
        (got, w.injector().stats())
    }

    fn numbers(got: &[Vec<u8>]) -> Vec<u64> {
        got.iter().map(|b| u64::from_le_bytes(b[..8].try_into().unwrap())).collect()
    }

    #[test]
    fn no_faults_deliver_everything_in_order_without_holding() {
        let (got, stats) = run(Faults::NONE, 1000, 0);
        assert_eq!(numbers(&got), (0..1000).collect::<Vec<_>>());
        assert_eq!(stats, FaultStats::default());
    }

    #[test]
    fn the_same_seed_replays_the_same_faults_and_another_does_not() {
        let faults = |seed| Faults {
            seed,
            drop_ppm: 100_000,
            duplicate_ppm: 100_000,
            reorder_window: 8,
            delay_ppm: 100_000,
            delay_max_ns: 20_000,
            corrupt_ppm: 50_000,
            truncate_ppm: 50_000,
            queue_full_ppm: 50_000,
        };
        let a = run(faults(3), 2000, 1_000_000);
        assert_eq!(a, run(faults(3), 2000, 1_000_000));
        assert_ne!(a.0, run(faults(4), 2000, 1_000_000).0);
    }

    #[test]
    fn each_fault_happens_at_its_rate_and_does_what_it_says() {
        const N: u64 = 20_000;
        let ten_percent = |f: fn(&mut Faults)| {
            let mut faults = Faults { seed: 9, ..Faults::NONE };
            f(&mut faults);
            run(faults, N, 1_000_000)
        };
        let near = |count: u64| (1_700..=2_300).contains(&count);

        let (got, s) = ten_percent(|f| f.drop_ppm = 100_000);
        assert!(near(s.dropped), "{s:?}");
        assert_eq!(got.len() as u64, N - s.dropped);
        let mut seen = numbers(&got);
        assert!(seen.is_sorted(), "drops alone keep the order");
        seen.dedup();
        assert_eq!(seen.len(), got.len(), "no copies");

        let (got, s) = ten_percent(|f| f.duplicate_ppm = 100_000);
        assert!(near(s.duplicated), "{s:?}");
        assert_eq!(got.len() as u64, N + s.duplicated);
        let mut seen = numbers(&got);
        seen.sort();
        seen.dedup();
        assert_eq!(seen, (0..N).collect::<Vec<_>>(), "every one, some twice");

        let (got, s) = ten_percent(|f| f.corrupt_ppm = 100_000);
        assert!(near(s.corrupted), "{s:?}");
        let flipped = numbers(&got).iter().enumerate().filter(|&(i, &v)| v != i as u64).count();
        assert_eq!(flipped as u64, s.corrupted, "one bit of each corrupted datagram");
        let one_bit =
            numbers(&got).iter().enumerate().all(|(i, &v)| (v ^ i as u64).count_ones() <= 1);
        assert!(one_bit);

        let (got, s) = ten_percent(|f| f.truncate_ppm = 100_000);
        assert!(near(s.truncated), "{s:?}");
        assert_eq!(got.iter().filter(|b| b.len() < 8).count() as u64, s.truncated);
        assert_eq!(got.len() as u64, N, "truncated, not lost");

        let (got, s) = ten_percent(|f| f.queue_full_ppm = 100_000);
        assert!(near(s.refused), "{s:?}");
        assert_eq!(numbers(&got), (0..N).collect::<Vec<_>>(), "refused posts go later");
    }

    #[test]
    fn reordering_stays_within_its_window_and_delays_within_their_bound() {
        let (got, s) = run(Faults::reorder(5, 4), 10_000, 0);
        let seen = numbers(&got);
        assert!(s.reordered > 1000, "{s:?}");
        assert_ne!(seen, (0..10_000).collect::<Vec<_>>());
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10_000).collect::<Vec<_>>(), "nothing lost or copied");
        // Released every four sends, picking among at most four.
        for (pos, &v) in seen.iter().enumerate() {
            assert!((v as i64 - pos as i64).abs() < 4, "{v} delivered at {pos}");
        }

        // Delayed by up to 50 us while one is sent every 1 us: overtaken
        // by at most 50.
        let faults = Faults { delay_ppm: 200_000, delay_max_ns: 50_000, ..Faults::NONE };
        let (got, s) = run(faults, 10_000, 100_000);
        let seen = numbers(&got);
        assert!(s.delayed > 1000, "{s:?}");
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(sorted, (0..10_000).collect::<Vec<_>>());
        for (pos, &v) in seen.iter().enumerate() {
            assert!((v as i64 - pos as i64).abs() <= 54, "{v} delivered at {pos}");
        }
    }

    #[test]
    fn a_full_inner_wire_holds_datagrams_back_and_loses_none() {
        let faults = Faults { delay_ppm: 500_000, delay_max_ns: 3_000, ..Faults::reorder(2, 8) };
        let mut w = Faulty::new(Loopback { cap: 3, ..Loopback::default() }, faults);
        let mut got = Vec::new();
        let mut buf = [0u8; 8];
        for i in 0..100u64 {
            w.send(i * 1000, 1, &i.to_le_bytes());
            if i % 10 == 9 {
                while let Some((_, n)) = w.recv(i * 1000 + 5000, &mut buf) {
                    got.push(u64::from_le_bytes(buf[..n].try_into().unwrap()));
                }
            }
        }
        got.sort();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn a_queue_pops_only_what_is_due_and_what_the_caller_takes() {
        let mut inj = Injector::new(Faults::NONE);
        let mut q = FaultQueue::with_capacity(4);
        assert_eq!(q.pop(0, &mut inj, |_| true), Popped::Empty);
        q.push(10, 'a');
        q.push(0, 'b');
        q.push(0, 'c');
        assert_eq!(q.next_due(), Some(0));
        assert_eq!(q.pop_front(5), None, "the oldest is not due");
        assert_eq!(q.pop(5, &mut inj, |&p| p != 'b'), Popped::Refused, "in order: b first");
        let mut window = Injector::new(Faults::reorder(1, 4));
        assert_eq!(q.pop(5, &mut window, |&p| p != 'b'), Popped::Got('c'), "the first taken");
        assert_eq!(q.pop(5, &mut window, |&p| p != 'b'), Popped::Refused);
        assert_eq!(q.pop(5, &mut inj, |_| true), Popped::Got('b'));
        assert_eq!(q.pop(9, &mut inj, |_| true), Popped::Empty);
        assert_eq!(q.pop(10, &mut inj, |_| true), Popped::Got('a'));
    }

    #[test]
    fn fates_damage_within_the_datagram() {
        let mut inj = Injector::new(Faults {
            corrupt_ppm: 1_000_000,
            truncate_ppm: 1_000_000,
            ..Faults::NONE
        });
        for len in [1usize, 2, 7, 1500] {
            for _ in 0..200 {
                let fate = inj.fate(len);
                let (at, xor) = fate.corrupt.unwrap();
                assert!(at < len && xor.count_ones() == 1);
                let mut bytes = vec![0u8; len];
                let n = fate.apply(&mut bytes);
                assert!(n < len, "shorter than sent");
                assert_eq!(bytes.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
            }
        }
        assert_eq!(inj.fate(0), Fate::CLEAN, "an empty datagram has nothing to damage");
    }
}
