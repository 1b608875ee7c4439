//! `sim`: a deterministic, in-process model of EFA for tests and for
//! measuring the engine without a device in the way.
//!
//! A [`SimFabric`] connects any number of [`SimDevice`]s in one thread,
//! each in a protection domain ([`SimDomain`]) of its own or in one it
//! shares with other devices (lcores of one process). Everything that
//! happens is a function of the seeds and of the order of calls: a packet
//! is delivered when its receiver polls, in order unless the wire's faults
//! ([`SimConfig::faults`]) reorder or hold it back. Time is virtual: it
//! moves only by [`SimFabric::advance`] and [`SimFabric::skip_to_next_due`].
//! What EFA does, the model does:
//!
//! * a send completes when its packet lands in a posted receive buffer of
//!   the peer; with none posted the packet waits (the NIC's RNR retry) and
//!   the wait is counted, so a slow receiver back-pressures the sender's
//!   TX queue;
//! * the receiver learns the sender's address handle only if it inserted
//!   the sender's address; otherwise the sender is `Unknown { qpn }`;
//! * RDMA read and write run when the target polls, after the target's
//!   registration is checked (key, bounds, rights); a violation completes
//!   the operation with `RemoteAccess` and moves no byte;
//! * a peer that vanished fails what is sent to it with `PeerUnreachable`.
//!
//! A NIC places payloads by DMA, at no cost to the host's CPU; the sim
//! charges the CPU for the copies the endpoint makes and, of the NIC's
//! work, only for a packet's headers and short payload, copied from the
//! sender's TX buffer into the receiver's posted one. A packet lands in
//! the receiver's own buffer, as on EFA, so a receiver's buffers stay in
//! its own memory however many peers send to it (moving the frame instead
//! cost nothing per packet but scattered a receiver's buffers over every
//! sender's pool, which cost more per message with many senders than the
//! copy: perf/README.md). A payload of
//! [`UNPLACED_MIN`] bytes or more that a send gathers from a region lands
//! *unplaced*: its headers are in the receive buffer, its bytes still in the
//! sender's region, and the send completes once they are placed: copied
//! straight to where the endpoint copies them (`copy_to_region`), or into
//! the buffer when it is read otherwise, reposted (dropped), or still held
//! when the receiver polls again after its completion.
//!
//! Faults for tests: the wire's, from [`super::fault`] (reorder, delay,
//! drop, duplicate, corrupt, truncate, queue-full; see
//! [`SimConfig::faults`]); and the model's own: failed registrations,
//! failed sends, a vanished peer, a restarted peer reusing its QPN with a
//! new connid, and arbitrary (hostile) bytes injected as if a peer had
//! sent them.
//!
//! Nothing allocates per packet unless a fault that copies a packet
//! (duplicate, damage) or injection is on.
//!
//! Threat model: the fabric lives in one thread of one process, so there
//! is no other user or process to guard against; what a hostile peer can
//! do is send any bytes, which [`SimFabric::inject`] and the corrupting
//! faults model, and which the endpoint must count and drop.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use super::fault::{Fate, FaultQueue, FaultStats, Faults, Injector, Popped};
use super::mem::{Bytes, Frames, frame_stride};
use super::regions::{Attached, Registrations};
use super::{
    Access, Ah, BufId, Caps, CqOp, CqStatus, Cqe, Device, DeviceError, Domain, Mr, MrId, RdmaOp,
    RdmaWr, SendWr, Source,
};
use crate::wire::RawAddr;

/// The model's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// Seeds connids and keys.
    pub seed: u64,
    /// Faults on the fabric's wire ([`super::fault`]), seeded by their own
    /// seed: reordering among the packets due at a receiver, delays, drops
    /// (delivered again after `retransmit_ns`, as SRD's NIC retransmits),
    /// duplicates, corrupted and truncated packets (handed to the endpoint
    /// as a hostile peer's), refused posts.
    pub faults: Faults,
    /// How long a dropped packet takes to arrive after all, in virtual
    /// nanoseconds.
    pub retransmit_ns: u64,
    /// Largest packet.
    pub mtu: usize,
    /// Packet buffers per device.
    pub bufs: u32,
    /// Outstanding sends and RDMA operations per device.
    pub tx_depth: usize,
    /// Posted receive buffers per device.
    pub rx_depth: usize,
    /// Devices perform RDMA read.
    pub rdma_read: bool,
    /// Devices perform RDMA write.
    pub rdma_write: bool,
    /// Largest RDMA operation.
    pub max_rdma_size: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            faults: Faults::NONE,
            retransmit_ns: 50_000,
            mtu: 8192,
            bufs: 2048,
            tx_depth: 512,
            rx_depth: 512,
            rdma_read: true,
            rdma_write: true,
            max_rdma_size: 1 << 30,
        }
    }
}

/// What happened at one device, for tests and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimStats {
    /// Packets delivered into this device's receive buffers.
    pub delivered: u64,
    /// Times a packet for this device waited because no receive buffer
    /// was posted (the NIC would have retried).
    pub rnr_waits: u64,
    /// Packets delivered a second time by the duplication fault.
    pub duplicated: u64,
    /// Packets delivered corrupted or truncated by the faults.
    pub damaged: u64,
    /// Injected packets delivered.
    pub injected: u64,
    /// RDMA operations refused by this device's registration checks.
    pub remote_access_errors: u64,
}

/// The address every sim device shares the GID of.
const SIM_GID: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x51, 0x4d, 0, 0, 0, 0, 0, 1];

/// An in-process fabric: create devices from it, inject faults into it.
#[derive(Debug, Clone)]
pub struct SimFabric {
    inner: Rc<RefCell<Fabric>>,
}

#[derive(Debug)]
struct Fabric {
    cfg: SimConfig,
    rng: u64,
    /// The wire's faults.
    inj: Injector,
    /// The faults of the packet being landed (for `observe`).
    fate: Fate,
    nodes: Vec<Node>,
    /// Replaced nodes (restarted devices): (node, incarnation, buffers,
    /// pool). Their frames may have moved to other devices' tables, so the
    /// pools live as long as the fabric; their packets still in flight
    /// land from their buffers.
    retired: Vec<(usize, u32, Rc<Frames>, Rc<Bytes>)>,
    /// Delivered packets, when capturing: (from qpn, to qpn, bytes).
    capture: Option<Vec<(u16, u16, Vec<u8>)>>,
    /// Virtual time, in nanoseconds: moved only by [`SimFabric::advance`]
    /// (shared with the devices, which read it without the fabric).
    clock: Rc<Cell<u64>>,
    /// Protection domains, by id: their registrations.
    domains: Vec<Registrations<Rc<Bytes>>>,
}

#[derive(Debug)]
enum Flight {
    /// A posted send: bytes stay in the sender's buffer (and region) until
    /// delivery.
    Packet {
        src: usize,
        incarnation: u32,
        buf: BufId,
        len: u32,
        data: Option<(Rc<Bytes>, u64, u32)>,
        wr_id: u64,
    },
    /// Bytes held by the fabric: a duplicate or an injected packet.
    Raw { src: usize, bytes: Vec<u8> },
    /// An RDMA operation to run at its target.
    Rdma { src: usize, incarnation: u32, wr: RdmaWr, local: Rc<Bytes> },
}

/// A device on the fabric. `repr(C)`, in the order a send and a delivery
/// read them: the first two cache lines hold everything those touch.
#[derive(Debug)]
#[repr(C, align(64))]
struct Node {
    incarnation: u32,
    alive: bool,
    fail_sends: u32,
    tx_outstanding: usize,
    /// A stack: the newest posted buffer fills first, as on shm (the
    /// endpoint reposts each as soon as it is done with it, so it is still
    /// in cache).
    posted_rx: Vec<BufId>,
    cq: VecDeque<Cqe>,
    /// What is on the wire to it, each flight with the time it is due.
    inbox: FaultQueue<Flight>,
    /// The memory of the frames this device started with.
    pool: Rc<Bytes>,
    /// By buffer id, its frame now (shared with the device).
    frames: Rc<Frames>,
    /// Address book: by handle, the node it reaches.
    book: Vec<usize>,
    /// The reverse: by node, its handle here (`u32::MAX`: not inserted).
    ah_of_node: Vec<u32>,
    stats: SimStats,
    /// Its protection domain.
    domain: usize,
    fail_registrations: u32,
    /// By receive buffer: its payload, if unplaced.
    unplaced: Vec<Option<Unplaced>>,
    /// (buffer, epoch) of each unplaced payload handed out, oldest first
    /// (entries of payloads placed since are skipped).
    unplaced_order: VecDeque<(BufId, u32)>,
    /// How many are unplaced; shared with the device, which checks it
    /// before touching the fabric.
    unplaced_count: Rc<Cell<u32>>,
    polls: u32,
}

const NO_AH: u32 = u32::MAX;

/// Who sent a packet being delivered: a node as an incarnation, and
/// whether it is still that incarnation, alive.
#[derive(Debug, Clone, Copy)]
struct Sender {
    node: usize,
    incarnation: u32,
    current: bool,
}

/// Gathered payloads from this size on land unplaced (see the module
/// docs); below it a copy costs less than the bookkeeping.
pub const UNPLACED_MIN: u32 = 1024;

/// A delivered payload still in its sender's region.
#[derive(Debug)]
struct Unplaced {
    region: Rc<Bytes>,
    offset: u64,
    len: u32,
    /// Where in the receive buffer the payload belongs.
    at: u32,
    /// The send to complete once it is placed.
    src: usize,
    incarnation: u32,
    wr_id: u64,
    /// The receiver's poll count when its completion was handed out.
    epoch: u32,
}

impl SimFabric {
    /// A fabric with `cfg`.
    pub fn new(cfg: SimConfig) -> SimFabric {
        assert!(cfg.retransmit_ns > 0, "retransmit_ns is at least 1");
        assert!(cfg.mtu >= 64 && cfg.bufs > 0, "mtu and bufs");
        // A zero seed would stall xorshift.
        let rng = cfg.seed ^ 0x9e37_79b9_7f4a_7c15;
        SimFabric {
            inner: Rc::new(RefCell::new(Fabric {
                cfg,
                rng,
                inj: Injector::new(cfg.faults),
                fate: Fate::CLEAN,
                nodes: Vec::new(),
                retired: Vec::new(),
                capture: None,
                clock: Rc::new(Cell::new(0)),
                domains: Vec::new(),
            })),
        }
    }

    /// Moves virtual time forward by `d`: the devices' clock
    /// ([`Device::now_ns`]), on which endpoints time out operations.
    /// Nothing else moves it, so a test decides when a timeout is due.
    pub fn advance(&self, d: std::time::Duration) {
        let clock = &self.inner.borrow().clock;
        clock.set(clock.get().saturating_add(d.as_nanos().min(u64::MAX as u128) as u64));
    }

    /// Virtual time, in nanoseconds since the fabric was made.
    pub fn now_ns(&self) -> u64 {
        self.inner.borrow().clock.get()
    }

    /// The fabric's parameters.
    pub fn config(&self) -> SimConfig {
        self.inner.borrow().cfg
    }

    /// A new device on the fabric, in a protection domain of its own; its
    /// QPN is its index.
    pub fn device(&self) -> SimDevice {
        let domain = self.domain();
        domain.device().expect("sim QPNs are 16-bit")
    }

    /// A new protection domain: registrations that every device made from
    /// it shares, as EFA's PD is shared by the QPs of a process's lcores.
    pub fn domain(&self) -> SimDomain {
        let mut f = self.inner.borrow_mut();
        f.domains.push(Registrations::default());
        SimDomain { fabric: self.inner.clone(), id: f.domains.len() - 1 }
    }

    /// A peer that restarted: a new device at `addr`'s QPN with a new
    /// connid. The old device is gone (its peers' packets reach the new
    /// one, as on EFA, where GID and QPN are all the NIC knows).
    pub fn restart(&self, addr: &RawAddr) -> SimDevice {
        self.kill(addr);
        let domain = self.domain().id;
        self.attach(addr.qpn as usize, domain)
    }

    fn attach(&self, qpn: usize, domain: usize) -> SimDevice {
        let mut f = self.inner.borrow_mut();
        let cfg = f.cfg;
        let connid = (f.next_random() >> 32) as u32;
        let stride = frame_stride(cfg.mtu);
        let pool = Rc::new(Bytes::zeroed(cfg.bufs as usize * stride));
        let frames = Rc::new(Frames::new(&pool, cfg.bufs, cfg.mtu, stride));
        let addr = RawAddr { gid: SIM_GID, qpn: qpn as u16, connid };
        let incarnation = f.nodes.get(qpn).map_or(0, |n| n.incarnation + 1);
        let node = Node {
            incarnation,
            alive: true,
            domain,
            pool,
            frames: frames.clone(),
            book: Vec::new(),
            ah_of_node: Vec::new(),
            posted_rx: Vec::with_capacity(cfg.rx_depth),
            inbox: FaultQueue::with_capacity(cfg.tx_depth * 2),
            cq: VecDeque::with_capacity(cfg.tx_depth + cfg.rx_depth),
            tx_outstanding: 0,
            fail_registrations: 0,
            fail_sends: 0,
            stats: SimStats::default(),
            unplaced: Vec::new(),
            unplaced_order: VecDeque::with_capacity(cfg.rx_depth * 2),
            unplaced_count: Rc::new(Cell::new(0)),
            polls: 0,
        };
        let unplaced = node.unplaced_count.clone();
        if qpn == f.nodes.len() {
            f.nodes.push(node);
        } else {
            let old = std::mem::replace(&mut f.nodes[qpn], node);
            f.retired.push((qpn, old.incarnation, old.frames, old.pool));
        }
        let caps = Caps {
            mtu: cfg.mtu,
            bufs: cfg.bufs,
            tx_depth: cfg.tx_depth,
            rx_depth: cfg.rx_depth,
            inline_size: 32,
            max_rdma_size: cfg.max_rdma_size,
            rdma_read: cfg.rdma_read,
            rdma_write: cfg.rdma_write,
            device_version: 0x51,
            external_memory: true,
        };
        SimDevice {
            fabric: self.inner.clone(),
            node: qpn,
            domain,
            incarnation,
            caps,
            addr,
            frames,
            regions: Attached::default(),
            unplaced,
            clock: f.clock.clone(),
        }
    }

    /// The device at `addr` vanishes: what is in flight to it, and what is
    /// sent to it from now on, fails with `PeerUnreachable`.
    pub fn kill(&self, addr: &RawAddr) {
        self.inner.borrow_mut().kill(addr.qpn as usize);
    }

    /// The next `n` registrations (and RDMA preparations) at `addr`'s
    /// device fail.
    pub fn fail_registrations(&self, addr: &RawAddr, n: u32) {
        self.inner.borrow_mut().nodes[addr.qpn as usize].fail_registrations = n;
    }

    /// The next `n` sends posted at `addr`'s device complete in error
    /// without being delivered.
    pub fn fail_sends(&self, addr: &RawAddr, n: u32) {
        self.inner.borrow_mut().nodes[addr.qpn as usize].fail_sends = n;
    }

    /// Sets the wire's faults, replayed from their seed.
    pub fn set_faults(&self, faults: Faults) {
        let mut f = self.inner.borrow_mut();
        f.cfg.faults = faults;
        f.inj.set_faults(faults);
    }

    /// What the wire's faults did so far (since they were last set).
    pub fn fault_stats(&self) -> FaultStats {
        self.inner.borrow().inj.stats()
    }

    /// Moves virtual time to when the next packet held on the wire
    /// (delayed, or dropped and due again) is due, if nothing is due now;
    /// returns whether it moved. A test's loop calls it when a round did
    /// nothing, as a discrete-event simulation jumps to its next event.
    pub fn skip_to_next_due(&self) -> bool {
        let f = self.inner.borrow();
        let now = f.clock.get();
        let next = f.nodes.iter().filter_map(|n| n.inbox.next_due()).min();
        match next {
            Some(due) if due > now => {
                f.clock.set(due);
                true
            }
            _ => false,
        }
    }

    /// Puts `bytes` in flight to `to` as if the device at QPN `from_qpn`
    /// had sent them (with no send completion anywhere): a hostile or
    /// malformed packet.
    pub fn inject(&self, to: &RawAddr, from_qpn: u16, bytes: &[u8]) {
        let mut f = self.inner.borrow_mut();
        let mtu = f.cfg.mtu;
        let bytes = bytes[..bytes.len().min(mtu)].to_vec();
        f.nodes[to.qpn as usize].inbox.push(0, Flight::Raw { src: from_qpn as usize, bytes });
    }

    /// Starts (or stops) keeping a copy of every packet delivered, for
    /// tests that look at the wire.
    pub fn set_capture(&self, on: bool) {
        self.inner.borrow_mut().capture = on.then(Vec::new);
    }

    /// The packets delivered since capture started: (from QPN, to QPN,
    /// bytes), in delivery order. Clears the capture.
    pub fn take_capture(&self) -> Vec<(u16, u16, Vec<u8>)> {
        self.inner.borrow_mut().capture.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What happened at `addr`'s device so far.
    pub fn stats(&self, addr: &RawAddr) -> SimStats {
        self.inner.borrow().nodes[addr.qpn as usize].stats
    }

    /// Packets and operations in flight to `addr`'s device, plus its
    /// completions not yet polled.
    pub fn pending(&self, addr: &RawAddr) -> usize {
        let f = self.inner.borrow();
        f.nodes[addr.qpn as usize].pending()
    }

    /// Everything in flight on the fabric, plus completions not yet polled.
    pub fn pending_total(&self) -> usize {
        let f = self.inner.borrow();
        f.nodes.iter().map(Node::pending).sum()
    }
}

impl Fabric {
    /// Registers `bytes` in `domain`, used by `queues` devices.
    fn register(&mut self, domain: usize, bytes: Rc<Bytes>, access: Access, queues: u32) -> Mr {
        let key_salt = self.next_random();
        let (addr, len) = (bytes.addr(), bytes.len() as u64);
        let mut mr = Mr { id: MrId(0), key: 0, addr, len, access: access | Access::LOCAL };
        self.domains[domain].insert(queues, |id| {
            // Keys are hard to guess: a forged key is refused, not lucky.
            mr.key = (key_salt & !0xffff_ffff) | u64::from(id.0);
            mr.id = id;
            (mr, bytes)
        });
        mr
    }

    /// Whether a send or an RDMA operation in flight, or a payload not yet
    /// placed, still reads or writes `region`.
    fn uses(&self, region: &Rc<Bytes>) -> bool {
        let flight_uses = |f: &Flight| match f {
            Flight::Packet { data: Some((r, ..)), .. } => Rc::ptr_eq(r, region),
            Flight::Rdma { local, .. } => Rc::ptr_eq(local, region),
            _ => false,
        };
        self.nodes.iter().any(|n| {
            n.inbox.iter().any(flight_uses)
                || n.unplaced.iter().flatten().any(|u| Rc::ptr_eq(&u.region, region))
        })
    }

    /// xorshift64*.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Completes `flight` at its sender with `status`.
    fn fail_flight(&mut self, flight: Flight, status: CqStatus) {
        let (src, incarnation, op, wr_id) = match flight {
            Flight::Packet { src, incarnation, wr_id, .. } => (src, incarnation, CqOp::Send, wr_id),
            Flight::Rdma { src, incarnation, wr, .. } => {
                let op = if wr.op == RdmaOp::Read { CqOp::Read } else { CqOp::Write };
                (src, incarnation, op, wr.wr_id)
            }
            Flight::Raw { .. } => return,
        };
        self.complete_at(src, incarnation, Cqe { op, status, wr_id, ..Cqe::default() });
    }

    /// Queues a completion for a sender's operation, if that sender is
    /// still the incarnation that posted it.
    fn complete_at(&mut self, node: usize, incarnation: u32, cqe: Cqe) {
        let n = &mut self.nodes[node];
        if n.alive && n.incarnation == incarnation {
            n.tx_outstanding -= 1;
            n.cq.push_back(cqe);
        }
    }

    /// Places `at`'s unplaced payload in buffer `id`, if it has one:
    /// copies it into the buffer (or, with `copy` false, drops it: the
    /// buffer was reposted unread) and completes its send.
    fn place(&mut self, at: usize, id: BufId, copy: bool) {
        let Some(u) = self.nodes[at].take_unplaced(id, |_| true) else { return };
        if copy {
            let node = &self.nodes[at];
            node.frames.copy_in(id, u.at as usize, &u.region, u.offset as usize, u.len as usize);
        }
        self.complete_placed(&u);
    }

    /// Completes the send of a payload now placed.
    fn complete_placed(&mut self, u: &Unplaced) {
        let cqe = Cqe { op: CqOp::Send, wr_id: u.wr_id, ..Cqe::default() };
        self.complete_at(u.src, u.incarnation, cqe);
    }

    /// Completes the sends of unplaced payloads in `bufs`, which `at`'s
    /// endpoint reposts unread (it dropped their packets); out of line, so
    /// that posting stays as lean as without them.
    #[cold]
    #[inline(never)]
    fn drop_unplaced(&mut self, at: usize, bufs: &[BufId]) {
        let room = self.cfg.rx_depth - self.nodes[at].posted_rx.len();
        for &b in &bufs[..bufs.len().min(room)] {
            self.place(at, b, false);
        }
    }

    /// Places what `at`'s endpoint left unplaced through a whole round of
    /// handling: payloads whose completions an earlier poll returned.
    /// Called as a poll starts.
    /// Node `n` vanishes: what is in flight to it, and what is sent to it
    /// from now on, fails with `PeerUnreachable`.
    fn kill(&mut self, n: usize) {
        if n >= self.nodes.len() || !self.nodes[n].alive {
            return;
        }
        self.nodes[n].alive = false;
        // Payloads it received but never read were delivered all the same.
        for id in 0..self.nodes[n].unplaced.len() {
            self.place(n, BufId(id as u32), false);
        }
        let flights: Vec<Flight> = self.nodes[n].inbox.drain().collect();
        for flight in flights {
            self.fail_flight(flight, CqStatus::PeerUnreachable);
        }
        // Its own operations in flight elsewhere complete nowhere.
    }

    fn place_held(&mut self, at: usize) {
        // Polls count only while something is unplaced: an epoch is a
        // difference of two counts taken then.
        let polls = self.nodes[at].polls.wrapping_add(1);
        self.nodes[at].polls = polls;
        while let Some(&(id, epoch)) = self.nodes[at].unplaced_order.front()
            && polls != epoch
        {
            self.nodes[at].unplaced_order.pop_front();
            let current =
                self.nodes[at].unplaced[id.index()].as_ref().is_some_and(|u| u.epoch == epoch);
            if current {
                self.place(at, id, true);
            }
        }
    }

    /// Polls node `at`: its queued completions, then deliveries.
    #[inline(always)]
    fn poll_at(&mut self, at: usize, out: &mut [Cqe]) -> usize {
        let mut n = self.nodes[at].take_cqes(out);
        while n < out.len() && !self.nodes[at].inbox.is_empty() {
            match self.deliver_one(at, &mut out[n]) {
                Some(wrote) => n += wrote,
                None => break,
            }
            // Completions of this device's own operations (a peer that is
            // this device) come back through its queue.
            n += self.nodes[at].take_cqes(&mut out[n..]);
        }
        n
    }

    /// [`Fabric::poll_at`] while `at` holds unplaced payloads.
    #[cold]
    fn poll_placing(&mut self, at: usize, out: &mut [Cqe]) -> usize {
        self.place_held(at);
        let n = self.poll_at(at, out);
        self.nodes[at].handed_out(&out[..n]);
        n
    }

    fn source(&self, at: usize, src: usize) -> Source {
        match self.nodes[at].ah_of_node.get(src) {
            Some(&ah) if ah != NO_AH => Source::Known(Ah(ah)),
            _ => Source::Unknown { qpn: src as u16 },
        }
    }

    /// Delivers one flight to `at`, writing at most one completion for
    /// `at` into `out`; returns how many it wrote, or `None` when nothing
    /// could be delivered (empty, or only packets and no posted buffer).
    #[inline]
    fn deliver_one(&mut self, at: usize, out: &mut Cqe) -> Option<usize> {
        let has_buf = !self.nodes[at].posted_rx.is_empty();
        let now = self.clock.get();
        let flight = if has_buf && self.inj.is_none() {
            self.nodes[at].inbox.pop_front(now)?
        } else {
            // Only operations that need no receive buffer can land without
            // one.
            let needs_buf = |f: &Flight| match f {
                Flight::Rdma { wr, .. } => matches!(wr.op, RdmaOp::Write { imm: Some(_) }),
                _ => true,
            };
            let inbox = &mut self.nodes[at].inbox;
            match inbox.pop(now, &mut self.inj, |f| has_buf || !needs_buf(f)) {
                Popped::Got(flight) => flight,
                Popped::Refused => {
                    self.nodes[at].stats.rnr_waits += 1;
                    return None;
                }
                Popped::Empty => return None,
            }
        };
        if self.inj.has_fates() && self.befall(&flight) {
            self.nodes[at].inbox.push(now + self.fate.delay_ns, flight);
            self.fate = Fate::CLEAN;
            return Some(0);
        }
        Some(match flight {
            Flight::Packet { src, incarnation, buf, len, data, wr_id } => {
                let data = data.as_ref().map(|(r, offset, n)| (r, *offset, *n));
                let from = &self.nodes[src];
                let current = from.alive && from.incarnation == incarnation;
                let src = Sender { node: src, incarnation, current };
                *out = self.land_packet(at, src, buf, len, data, wr_id);
                1
            }
            Flight::Raw { src, bytes } => {
                let rx = self.nodes[at].posted_rx.pop().expect("checked above");
                let len = bytes.len();
                let node = &mut self.nodes[at];
                // SAFETY: buffer `rx` was posted to the device, so the
                // fabric may write it: no slice of it is alive.
                let frame = unsafe { node.frames.slice_mut(rx) };
                frame[..len].copy_from_slice(&bytes);
                node.stats.injected += 1;
                *out = self.recv_cqe(at, src, rx, len as u32);
                1
            }
            Flight::Rdma { src, incarnation, wr, local } => {
                self.run_rdma(at, src, incarnation, wr, &local, out)
            }
        })
    }

    /// The common send, in one pass: no gathered data, from `src` (the
    /// current incarnation), to a live peer with a buffer posted and
    /// nothing in flight ahead, on an in-order fabric that neither fails
    /// sends nor watches packets. Delivers it and completes both sides, as
    /// [`SimDevice::post_one`] would; false, with nothing changed, when the
    /// model has more to say. It is `land_packet` for this case, written
    /// out (a call costs a sim round trip a few percent: perf/README.md):
    /// a change to how a packet lands goes in both, and the suites, run
    /// again with the `general-paths` feature that turns this off, check
    /// that they agree. The send completes as it is posted, so
    /// `tx_outstanding` is left as it was.
    #[inline(always)]
    fn land_now(&mut self, src: usize, wr: &SendWr) -> bool {
        let me = &self.nodes[src];
        let target = me.book.get(wr.ah.0 as usize).copied().unwrap_or(usize::MAX);
        let quiet = me.fail_sends == 0 && self.inj.is_none() && self.capture.is_none();
        let ready = |n: &Node| n.alive && n.inbox.is_empty() && !n.posted_rx.is_empty();
        if !quiet || !self.nodes.get(target).is_some_and(ready) {
            return false;
        }
        let to = &mut self.nodes[target];
        let rx = to.posted_rx.pop().expect("checked");
        to.stats.delivered += 1;
        let len = wr.len as usize;
        Frames::copy(&self.nodes[src].frames, wr.buf, &self.nodes[target].frames, rx, len);
        let cqe = self.recv_cqe(target, src, rx, wr.len);
        self.nodes[src].cq.push_back(Cqe { op: CqOp::Send, wr_id: wr.wr_id, ..Cqe::default() });
        self.nodes[target].cq.push_back(cqe);
        true
    }

    /// Lands a packet in `at`'s next posted buffer (the caller checked
    /// there is one): the first `hdr` bytes of `src`'s buffer `buf`, then
    /// `data` (a region, an offset, a length), unplaced if large. Completes
    /// the send at its sender (once placed); returns the receive
    /// completion.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn land_packet(
        &mut self,
        at: usize,
        sender: Sender,
        buf: BufId,
        hdr: u32,
        data: Option<(&Rc<Bytes>, u64, u32)>,
        wr_id: u64,
    ) -> Cqe {
        let Sender { node: src, incarnation, current } = sender;
        let observed = self.capture.is_some() || self.inj.has_fates();
        let to = &mut self.nodes[at];
        let rx = to.posted_rx.pop().expect("checked by the caller");
        to.stats.delivered += 1;
        let mut len = hdr;
        let mut placed = true;
        {
            let to = &self.nodes[at];
            let from = if current {
                &self.nodes[src].frames
            } else {
                // Its buffer is no longer one its device uses (the packet
                // had left it, on the wire).
                self.gone_frames(src, incarnation)
            };
            Frames::copy(from, buf, &to.frames, rx, hdr as usize);
            if let Some((region, offset, n)) = data {
                if n >= UNPLACED_MIN && !observed {
                    placed = false;
                } else {
                    to.frames.copy_in(rx, hdr as usize, region, offset as usize, n as usize);
                }
                len += n;
            }
        }
        if !placed && let Some((region, offset, n)) = data {
            let to = &mut self.nodes[at];
            if to.unplaced.is_empty() {
                // Allocated on first use: a fabric that never defers keeps
                // its memory layout.
                to.unplaced.resize_with(self.cfg.bufs as usize, || None);
            }
            to.unplaced[rx.index()] = Some(Unplaced {
                region: region.clone(),
                offset,
                len: n,
                at: hdr,
                src,
                incarnation,
                wr_id,
                epoch: 0,
            });
            to.unplaced_count.set(to.unplaced_count.get() + 1);
        }
        if observed {
            len = self.observe(at, src, rx, len);
        }
        let cqe = self.recv_cqe(at, src, rx, len);
        if placed {
            self.complete_at(src, incarnation, Cqe { op: CqOp::Send, wr_id, ..Cqe::default() });
        }
        cqe
    }

    /// The buffers of `src` as incarnation `incarnation`, which died or
    /// was replaced since.
    #[cold]
    #[inline(never)]
    fn gone_frames(&self, src: usize, incarnation: u32) -> &Frames {
        if self.nodes[src].incarnation == incarnation {
            return &self.nodes[src].frames;
        }
        let old = self.retired.iter().find(|r| r.0 == src && r.1 == incarnation);
        &old.expect("every replaced node is retired").2
    }

    /// Decides the wire's faults for `flight`, about to land:
    /// true when it is held back instead (dropped and due again after the
    /// retransmission delay, or delayed), with the delay in `self.fate`;
    /// otherwise the faults that befall it as it lands (sent packets only:
    /// an RDMA operation is not damaged or copied) wait in `self.fate`.
    #[cold]
    #[inline(never)]
    fn befall(&mut self, flight: &Flight) -> bool {
        let len = match flight {
            Flight::Packet { len, data, .. } => {
                *len as usize + data.as_ref().map_or(0, |d| d.2 as usize)
            }
            Flight::Raw { bytes, .. } => bytes.len(),
            Flight::Rdma { .. } => 0,
        };
        let mut fate = self.inj.fate(len);
        if fate.drop {
            fate.delay_ns = self.cfg.retransmit_ns;
        }
        if !matches!(flight, Flight::Packet { .. }) {
            fate.duplicate = false;
            fate.corrupt = None;
            fate.truncate = None;
        }
        self.fate = fate;
        fate.delay_ns > 0
    }

    /// What tests ask of a packet just delivered into `at`'s buffer `rx`:
    /// the faults that befall it (a duplicate in flight, its bytes
    /// damaged), a copy for the capture. Returns the length that arrived.
    #[cold]
    fn observe(&mut self, at: usize, src: usize, rx: BufId, len: u32) -> u32 {
        let fate = std::mem::take(&mut self.fate);
        if fate.duplicate {
            let bytes = self.nodes[at].pool_bytes(rx, len);
            self.nodes[at].stats.duplicated += 1;
            self.nodes[at].inbox.push(0, Flight::Raw { src, bytes });
        }
        let mut len = len;
        if fate.damages() {
            let node = &mut self.nodes[at];
            // SAFETY: buffer `rx` was just delivered into and is not yet
            // handed to the endpoint: no slice of it is alive.
            let frame = unsafe { node.frames.slice_mut(rx) };
            len = fate.apply(&mut frame[..len as usize]) as u32;
            node.stats.damaged += 1;
        }
        if let Some(capture) = &mut self.capture {
            capture.push((src as u16, at as u16, self.nodes[at].pool_bytes(rx, len)));
        }
        len
    }

    fn recv_cqe(&self, at: usize, src: usize, rx: BufId, len: u32) -> Cqe {
        Cqe {
            op: CqOp::Recv,
            status: CqStatus::Ok,
            wr_id: rx.wr_id(),
            len,
            src: self.source(at, src),
            imm: 0,
        }
    }

    /// Runs an RDMA operation at its target `at`, after checking the
    /// target's registration.
    fn run_rdma(
        &mut self,
        at: usize,
        src: usize,
        incarnation: u32,
        wr: RdmaWr,
        local: &Rc<Bytes>,
        out: &mut Cqe,
    ) -> usize {
        let (need, op) = match wr.op {
            RdmaOp::Read => (Access::REMOTE_READ, CqOp::Read),
            RdmaOp::Write { .. } => (Access::REMOTE_WRITE, CqOp::Write),
        };
        let target = self.domains[self.nodes[at].domain].find_key(wr.remote_key);
        let resolved = target.and_then(|r| {
            r.mr.resolve(wr.remote_addr, wr.len, need).map(|o| (r.region.clone(), o))
        });
        let Some((remote, offset)) = resolved else {
            self.nodes[at].stats.remote_access_errors += 1;
            let cqe = Cqe { op, status: CqStatus::RemoteAccess, wr_id: wr.wr_id, ..Cqe::default() };
            self.complete_at(src, incarnation, cqe);
            return 0;
        };
        let (local_off, remote_off, len) =
            (wr.local_offset as usize, offset as usize, wr.len as usize);
        let mut wrote = 0;
        match wr.op {
            RdmaOp::Read => Bytes::copy(&remote, remote_off, local, local_off, len),
            RdmaOp::Write { imm } => {
                Bytes::copy(local, local_off, &remote, remote_off, len);
                if let Some(imm) = imm {
                    let rx = self.nodes[at].posted_rx.pop().expect("checked by deliver_one");
                    *out = Cqe {
                        op: CqOp::RecvWriteImm,
                        status: CqStatus::Ok,
                        wr_id: rx.wr_id(),
                        len: wr.len.min(u32::MAX as u64) as u32,
                        src: self.source(at, src),
                        imm,
                    };
                    wrote = 1;
                }
            }
        }
        self.complete_at(src, incarnation, Cqe { op, wr_id: wr.wr_id, ..Cqe::default() });
        wrote
    }
}

impl Node {
    /// Packets and operations in flight to this node, its completions not
    /// yet polled, and the sends waiting for its unplaced payloads.
    fn pending(&self) -> usize {
        self.inbox.len() + self.cq.len() + self.unplaced_count.get() as usize
    }

    /// Takes the unplaced payload of buffer `id`, if it has one that
    /// `want` accepts; with none left, forgets their order.
    #[inline(always)]
    fn take_unplaced(
        &mut self,
        id: BufId,
        want: impl FnOnce(&Unplaced) -> bool,
    ) -> Option<Unplaced> {
        let slot = self.unplaced.get_mut(id.index())?;
        if !slot.as_ref().is_some_and(want) {
            return None;
        }
        let u = slot.take();
        let left = self.unplaced_count.get() - 1;
        self.unplaced_count.set(left);
        if left == 0 {
            self.unplaced_order.clear();
        }
        u
    }

    /// Starts the clock of the unplaced payloads whose receive completions
    /// the endpoint now has: it has until its next poll to copy them out.
    #[cold]
    fn handed_out(&mut self, cqes: &[Cqe]) {
        for c in cqes.iter().filter(|c| c.op == CqOp::Recv) {
            let buf = BufId::from_wr_id(c.wr_id);
            if let Some(u) = self.unplaced.get_mut(buf.index()).and_then(Option::as_mut) {
                u.epoch = self.polls;
                self.unplaced_order.push_back((buf, self.polls));
            }
        }
    }

    /// Moves queued completions into `out`; returns how many.
    #[inline(always)]
    fn take_cqes(&mut self, out: &mut [Cqe]) -> usize {
        let mut n = 0;
        while n < out.len()
            && let Some(c) = self.cq.pop_front()
        {
            out[n] = c;
            n += 1;
        }
        n
    }

    fn pool_bytes(&self, buf: BufId, len: u32) -> Vec<u8> {
        // SAFETY: the buffer was just delivered into and is not yet handed
        // to the endpoint; reading it aliases no writer.
        let frame = unsafe { self.frames.slice(buf) };
        frame[..len as usize].to_vec()
    }
}

/// A protection domain on a [`SimFabric`]: the registrations its devices
/// share. Set-up work (it borrows the fabric); the hot path is the
/// devices'. A region registered here is used by a device once attached to
/// it ([`Device::attach`], `Endpoint::attach`), and peers reach it by its
/// key through any device of the domain.
#[derive(Debug, Clone)]
pub struct SimDomain {
    fabric: Rc<RefCell<Fabric>>,
    id: usize,
}

impl Domain for SimDomain {
    type Device = SimDevice;

    fn device(&self) -> Result<SimDevice, DeviceError> {
        let qpn = self.fabric.borrow().nodes.len();
        if qpn >= u16::MAX as usize {
            // Sim QPNs are 16-bit, as EFA's.
            return Err(DeviceError::Again);
        }
        Ok(SimFabric { inner: self.fabric.clone() }.attach(qpn, self.id))
    }

    fn register(&self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        let bytes = Rc::new(Bytes::zeroed(len));
        Ok(self.fabric.borrow_mut().register(self.id, bytes, access, 0))
    }

    unsafe fn register_external(
        &self,
        ptr: std::ptr::NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<Mr, DeviceError> {
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        // SAFETY: the caller's contract is `Bytes::external`'s: valid until
        // deregistered, reached otherwise only by raw-pointer copies. The
        // `Bytes` outlives the registration only inside flights and
        // unplaced payloads, which deregistration waits for
        // (`Fabric::uses`), and in queues that attached it, which it
        // refuses while any does.
        let bytes = Rc::new(unsafe { Bytes::external(ptr, len) });
        Ok(self.fabric.borrow_mut().register(self.id, bytes, access, 0))
    }

    fn deregister(&self, mr: &Mr) -> Result<(), DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let bytes = f.domains[self.id].get(mr).map(|r| r.region.clone());
        if bytes.is_some_and(|b| f.uses(&b)) {
            return Err(DeviceError::Busy);
        }
        f.domains[self.id].deregister(mr).map(drop)
    }
}

/// One queue pair on a [`SimFabric`]. `!Send`: it shares the fabric with
/// its peers in one thread.
#[derive(Debug)]
pub struct SimDevice {
    fabric: Rc<RefCell<Fabric>>,
    node: usize,
    /// Its protection domain (the node's, until a restart replaces it).
    domain: usize,
    incarnation: u32,
    caps: Caps,
    addr: RawAddr,
    /// By buffer id, its frame now (shared with the fabric's node).
    frames: Rc<Frames>,
    /// By `MrId` in `domain`: the region's memory, mirrored from the
    /// fabric so that access needs no fabric borrow.
    regions: Attached<Rc<Bytes>>,
    /// How many payloads this device holds unplaced.
    unplaced: Rc<Cell<u32>>,
    /// The fabric's virtual time.
    clock: Rc<Cell<u64>>,
}

impl SimDevice {
    /// The fabric this device is on.
    pub fn fabric(&self) -> SimFabric {
        SimFabric { inner: self.fabric.clone() }
    }

    fn is_current(&self, f: &Fabric) -> bool {
        let n = &f.nodes[self.node];
        n.alive && n.incarnation == self.incarnation
    }

    /// [`Device::copy_to_region`] of an unplaced payload, whole: its one
    /// copy, straight from the sender's memory; returns whether it was
    /// (else the caller copies out of the buffer, placed on the way).
    #[cold]
    #[inline(never)]
    fn copy_unplaced(
        &mut self,
        buf: BufId,
        from: usize,
        mr: MrId,
        offset: usize,
        len: usize,
    ) -> bool {
        let mut f = self.fabric.borrow_mut();
        let whole = |u: &Unplaced| u.at as usize == from && u.len as usize == len;
        let Some(u) = f.nodes[self.node].take_unplaced(buf, whole) else { return false };
        Bytes::copy(&u.region, u.offset as usize, self.region_bytes(mr), offset, len);
        f.complete_placed(&u);
        true
    }

    /// Posts one send the way the model decides: failed, delivered now,
    /// or in flight (see [`Fabric::land_now`] for the common case).
    #[inline(never)]
    fn post_one(&self, f: &mut Fabric, wr: &SendWr) {
        let data = match wr.data {
            None => None,
            Some(d) => {
                let region = self.regions.get(d.mr);
                match region {
                    Some(r)
                        if d.offset
                            .checked_add(d.len as u64)
                            .is_some_and(|e| e <= r.len() as u64) =>
                    {
                        Some((r, d.offset, d.len))
                    }
                    _ => panic!("send gathers outside its region: {wr:?}"),
                }
            }
        };
        let me = &mut f.nodes[self.node];
        me.tx_outstanding += 1;
        let target = me.book.get(wr.ah.0 as usize).copied().unwrap_or(usize::MAX);
        let status = if me.fail_sends > 0 {
            me.fail_sends -= 1;
            Some(CqStatus::DeviceError)
        } else if target == usize::MAX {
            Some(CqStatus::LocalError)
        } else if !f.nodes[target].alive {
            Some(CqStatus::PeerUnreachable)
        } else {
            None
        };
        match status {
            Some(status) => {
                let cqe = Cqe { op: CqOp::Send, status, wr_id: wr.wr_id, ..Cqe::default() };
                f.complete_at(self.node, self.incarnation, cqe);
            }
            // An in-order fabric with nothing queued ahead and a buffer
            // posted delivers at once, as a NIC would by the time the
            // receiver looks: the same bytes and completions, without
            // the packet's trip through the inbox.
            None if f.inj.is_none()
                && f.nodes[target].inbox.is_empty()
                && !f.nodes[target].posted_rx.is_empty() =>
            {
                let src = Sender { node: self.node, incarnation: self.incarnation, current: true };
                let cqe = f.land_packet(target, src, wr.buf, wr.len, data, wr.wr_id);
                f.nodes[target].cq.push_back(cqe);
            }
            None => f.nodes[target].inbox.push(
                0,
                Flight::Packet {
                    src: self.node,
                    incarnation: self.incarnation,
                    buf: wr.buf,
                    len: wr.len,
                    data: data.map(|(r, offset, n)| (r.clone(), offset, n)),
                    wr_id: wr.wr_id,
                },
            ),
        }
    }

    /// Places buffer `id`'s payload before the endpoint reads or writes
    /// the buffer.
    #[inline(always)]
    fn settle(&mut self, id: BufId) {
        if self.unplaced.get() != 0 {
            self.fabric.borrow_mut().place(self.node, id, true);
        }
    }

    /// Consumes one injected registration failure, if any is due.
    fn take_registration(&mut self) -> Result<(), DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let node = &mut f.nodes[self.node];
        if node.fail_registrations > 0 {
            node.fail_registrations -= 1;
            return Err(DeviceError::Registration);
        }
        Ok(())
    }

    /// Registers `bytes` in this device's domain, used by this device.
    fn register_bytes(&mut self, bytes: Rc<Bytes>, access: Access) -> Result<Mr, DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let domain = f.nodes[self.node].domain;
        let mr = f.register(domain, bytes.clone(), access, 1);
        self.regions.insert(mr.id, bytes);
        Ok(mr)
    }

    #[inline(always)]
    fn region_bytes(&self, mr: MrId) -> &Rc<Bytes> {
        self.regions.expect(mr)
    }
}

impl Device for SimDevice {
    fn caps(&self) -> Caps {
        self.caps
    }

    fn addr(&self) -> RawAddr {
        self.addr
    }

    fn insert_addr(&mut self, addr: &RawAddr) -> Result<Ah, DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let target = addr.qpn as usize;
        if addr.gid != SIM_GID || target >= f.nodes.len() {
            return Err(DeviceError::BadAddress);
        }
        let node = &mut f.nodes[self.node];
        if node.ah_of_node.len() <= target {
            node.ah_of_node.resize(target + 1, NO_AH);
        }
        if node.ah_of_node[target] != NO_AH {
            return Ok(Ah(node.ah_of_node[target]));
        }
        let ah = match node.book.iter().position(|&n| n == usize::MAX) {
            Some(free) => free,
            None => {
                node.book.push(usize::MAX);
                node.book.len() - 1
            }
        };
        node.book[ah] = target;
        node.ah_of_node[target] = ah as u32;
        Ok(Ah(ah as u32))
    }

    fn remove_addr(&mut self, ah: Ah) {
        let mut f = self.fabric.borrow_mut();
        let node = &mut f.nodes[self.node];
        if let Some(target) = node.book.get_mut(ah.0 as usize)
            && *target != usize::MAX
        {
            node.ah_of_node[*target] = NO_AH;
            *target = usize::MAX;
        }
    }

    #[inline(always)]
    unsafe fn buf(&self, id: BufId) -> &[u8] {
        // SAFETY: the caller's contract: the buffer is not posted, and the
        // fabric writes only posted buffers (placing an unplaced payload
        // takes `&mut self`); `&self` excludes this device's own writers.
        unsafe { self.frames.slice(id) }
    }

    #[inline(always)]
    unsafe fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        self.settle(id);
        // SAFETY: as `buf`; `&mut self` makes the loan exclusive.
        unsafe { self.frames.slice_mut(id) }
    }

    fn register(&mut self, len: u64, access: Access) -> Result<Mr, DeviceError> {
        self.take_registration()?;
        let len = usize::try_from(len).map_err(|_| DeviceError::Registration)?;
        self.register_bytes(Rc::new(Bytes::zeroed(len)), access)
    }

    fn attach(&mut self, mr: &Mr) -> Result<(), DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let domain = f.nodes[self.node].domain;
        let regs = &mut f.domains[domain];
        self.regions.attach(mr.id, || regs.attach(mr).cloned())
    }

    fn deregister(&mut self, mr: MrId) -> Result<(), DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let bytes = self.regions.get(mr).ok_or(DeviceError::UnknownHandle)?;
        if f.uses(bytes) {
            return Err(DeviceError::Busy);
        }
        let domain = f.nodes[self.node].domain;
        f.domains[domain].detach(mr);
        self.regions.remove(mr).map(drop)
    }

    // Always inlined: a caller reading a few bytes of known length (a
    // header) then copies them with moves rather than a call to memcpy,
    // whatever else its inlining budget holds.
    #[inline(always)]
    fn read_region(&self, mr: MrId, offset: usize, out: &mut [u8]) {
        self.region_bytes(mr).read(offset, out);
    }

    fn write_region(&mut self, mr: MrId, offset: usize, src: &[u8]) {
        self.region_bytes(mr).write(offset, src);
    }

    fn copy_region(&mut self, src: MrId, src_off: usize, dst: MrId, dst_off: usize, len: usize) {
        Bytes::copy(self.region_bytes(src), src_off, self.region_bytes(dst), dst_off, len);
    }

    #[inline(always)]
    fn update_region<F: FnMut(usize, &mut [u8])>(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        fetch: Option<(BufId, usize)>,
        combine: F,
    ) {
        if let Some((buf, _)) = fetch {
            self.settle(buf);
        }
        self.region_bytes(mr).update(offset, len, self.frames.fetcher(fetch), combine);
    }

    #[inline(always)]
    fn copy_to_region(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        if self.unplaced.get() != 0 && self.copy_unplaced(buf, from, mr, offset, len) {
            return;
        }
        self.settle(buf);
        self.frames.copy_out(buf, from, self.region_bytes(mr), offset, len);
    }

    #[inline(always)]
    fn copy_from_region(&mut self, mr: MrId, offset: usize, buf: BufId, to: usize, len: usize) {
        self.settle(buf);
        self.frames.copy_in(buf, to, self.region_bytes(mr), offset, len);
    }

    #[inline(always)]
    fn read_payload(&mut self, buf: BufId, from: usize, out: &mut [u8]) {
        self.settle(buf);
        self.frames.read(buf, from, out);
    }

    fn prepare_rdma(&mut self, mr: MrId) -> Result<(), DeviceError> {
        let mut f = self.fabric.borrow_mut();
        let node = &mut f.nodes[self.node];
        if node.fail_registrations > 0 {
            node.fail_registrations -= 1;
            return Err(DeviceError::Registration);
        }
        self.regions.get(mr).map(drop).ok_or(DeviceError::UnknownHandle)
    }

    fn post_recv(&mut self, bufs: &[BufId]) -> usize {
        let mut f = self.fabric.borrow_mut();
        if !self.is_current(&f) {
            return 0;
        }
        if self.unplaced.get() != 0 {
            f.drop_unplaced(self.node, bufs);
        }
        let rx_depth = f.cfg.rx_depth;
        let n = bufs.len().min(rx_depth - f.nodes[self.node].posted_rx.len());
        let node = &mut f.nodes[self.node];
        for &b in &bufs[..n] {
            assert!(b.0 < self.caps.bufs, "buffer {b} out of range");
            node.posted_rx.push(b);
        }
        n
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> usize {
        let mut f = self.fabric.borrow_mut();
        if !self.is_current(&f) {
            return 0;
        }
        let tx_depth = f.cfg.tx_depth;
        let n = wrs.len().min(tx_depth - f.nodes[self.node].tx_outstanding);
        for (i, wr) in wrs[..n].iter().enumerate() {
            if !f.inj.is_none() && f.inj.refuse() {
                return i;
            }
            assert!(wr.buf.0 < self.caps.bufs && wr.wire_len() <= self.caps.mtu, "bad send {wr:?}");
            // Off with the `general-paths` feature, so that the tests see
            // land_now do what post_one does.
            if !(crate::FAST_PATHS && wr.data.is_none() && f.land_now(self.node, wr)) {
                self.post_one(&mut f, wr);
            }
        }
        n
    }

    fn post_rdma(&mut self, wrs: &[RdmaWr]) -> usize {
        let mut f = self.fabric.borrow_mut();
        if !self.is_current(&f) {
            return 0;
        }
        let tx_depth = f.cfg.tx_depth;
        let mut taken = 0;
        for wr in wrs {
            let supported = match wr.op {
                RdmaOp::Read => self.caps.rdma_read,
                RdmaOp::Write { .. } => self.caps.rdma_write,
            };
            if !supported || f.nodes[self.node].tx_outstanding >= tx_depth {
                break;
            }
            if !f.inj.is_none() && f.inj.refuse() {
                break;
            }
            taken += 1;
            f.nodes[self.node].tx_outstanding += 1;
            let local = self.regions.get(wr.local);
            let local_ok = local.is_some_and(|b| {
                wr.local_offset.checked_add(wr.len).is_some_and(|end| end <= b.len() as u64)
            }) && wr.len <= self.caps.max_rdma_size;
            let me = &f.nodes[self.node];
            let target = me.book.get(wr.ah.0 as usize).copied().unwrap_or(usize::MAX);
            let status = if !local_ok || target == usize::MAX {
                Some(CqStatus::LocalError)
            } else if !f.nodes[target].alive {
                Some(CqStatus::PeerUnreachable)
            } else {
                None
            };
            match (status, local) {
                (None, Some(local)) => f.nodes[target].inbox.push(
                    0,
                    Flight::Rdma {
                        src: self.node,
                        incarnation: self.incarnation,
                        wr: *wr,
                        local: local.clone(),
                    },
                ),
                (status, _) => {
                    let op = if wr.op == RdmaOp::Read { CqOp::Read } else { CqOp::Write };
                    let status = status.unwrap_or(CqStatus::LocalError);
                    let cqe = Cqe { op, status, wr_id: wr.wr_id, ..Cqe::default() };
                    f.complete_at(self.node, self.incarnation, cqe);
                }
            }
        }
        taken
    }

    fn now_ns(&self) -> u64 {
        self.clock.get()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.fabric.borrow().nodes[self.node].stats;
        vec![
            ("delivered", s.delivered),
            ("rnr_waits", s.rnr_waits),
            ("duplicated", s.duplicated),
            ("damaged", s.damaged),
            ("injected", s.injected),
            ("remote_access_errors", s.remote_access_errors),
        ]
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        let mut f = self.fabric.borrow_mut();
        if !self.is_current(&f) {
            return 0;
        }
        if self.unplaced.get() != 0 {
            return f.poll_placing(self.node, out);
        }
        let n = f.poll_at(self.node, out);
        if self.unplaced.get() != 0 {
            // Landed during this poll.
            f.nodes[self.node].handed_out(&out[..n]);
        }
        n
    }
}

/// A dropped device is a destroyed queue pair: what peers send it fails,
/// and the domain's regions it attached may be deregistered.
impl Drop for SimDevice {
    fn drop(&mut self) {
        // Only a device in a call of the fabric's holds it: not one that is
        // being dropped.
        let Ok(mut f) = self.fabric.try_borrow_mut() else { return };
        if f.nodes[self.node].incarnation == self.incarnation {
            f.kill(self.node);
        }
        let regs = &mut f.domains[self.domain];
        self.regions.clear(|id| drop(regs.detach(id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DataSeg, HeldBufs};

    fn pair(cfg: SimConfig) -> (SimFabric, SimDevice, SimDevice) {
        let fabric = SimFabric::new(cfg);
        let a = fabric.device();
        let b = fabric.device();
        (fabric, a, b)
    }

    fn send(dev: &mut SimDevice, ah: Ah, buf: BufId, bytes: &[u8], wr_id: u64) {
        dev.held_mut(buf)[..bytes.len()].copy_from_slice(bytes);
        let wr = SendWr { ah, buf, len: bytes.len() as u32, data: None, wr_id };
        assert_eq!(dev.post_send(&[wr]), 1);
    }

    fn poll_all(dev: &mut SimDevice) -> Vec<Cqe> {
        let mut out = [Cqe::default(); 8];
        let mut all = Vec::new();
        loop {
            let n = dev.poll(&mut out);
            if n == 0 {
                return all;
            }
            all.extend_from_slice(&out[..n]);
        }
    }

    /// The bounce copy a device without a direct one gets agrees with the
    /// sim's direct copy (a memmove), across pages and overlapping.
    #[test]
    fn the_bounced_region_copy_is_a_memmove() {
        let (_f, mut a, _b) = pair(SimConfig::default());
        let len = 20_000usize;
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let xm = a.register(len as u64, Access::empty()).unwrap();
        let ym = a.register(len as u64, Access::empty()).unwrap();
        let (x, y) = (xm.id, ym.id);
        let mr_of = |id: MrId| if id == x { xm } else { ym };
        for (src, so, dst, d_o, n) in
            [(x, 0, y, 100, 9000), (x, 0, x, 3, 10_000), (x, 4097, x, 5, 12_000), (x, 7, x, 7, 50)]
        {
            a.write_region(x, 0, &pattern);
            a.write_region(y, 0, &pattern);
            crate::device::copy_by_bounce(&mut a, src, so, dst, d_o, n);
            let bounced = a.region_vec(&mr_of(dst));
            a.write_region(x, 0, &pattern);
            a.write_region(y, 0, &pattern);
            a.copy_region(src, so, dst, d_o, n);
            let direct = a.region_vec(&mr_of(dst));
            let mut want = pattern.clone();
            want.copy_within(so..so + n, d_o);
            assert_eq!(direct, want, "{so} -> {d_o}, {n} bytes");
            assert_eq!(bounced, want, "{so} -> {d_o}, {n} bytes");
        }
    }

    #[test]
    fn delivery_reports_unknown_sender_until_inserted() {
        let (_f, mut a, mut b) = pair(SimConfig::default());
        let ah_b = a.insert_addr(&b.addr()).unwrap();
        assert_eq!(a.insert_addr(&b.addr()).unwrap(), ah_b, "same address, same handle");
        assert_eq!(b.post_recv(&[BufId(10), BufId(11)]), 2);
        send(&mut a, ah_b, BufId(0), b"hello", 7);
        let got = poll_all(&mut b);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].op, CqOp::Recv);
        assert_eq!(got[0].wr_id, 11, "the newest posted buffer fills first");
        assert_eq!(got[0].len, 5);
        assert_eq!(got[0].src, Source::Unknown { qpn: a.addr().qpn });
        assert_eq!(&b.held(BufId(11))[..5], b"hello");
        let sent = poll_all(&mut a);
        assert_eq!(sent, [Cqe { op: CqOp::Send, wr_id: 7, ..Cqe::default() }]);

        let ah_a = b.insert_addr(&a.addr()).unwrap();
        send(&mut a, ah_b, BufId(1), b"again", 8);
        assert_eq!(poll_all(&mut b)[0].src, Source::Known(ah_a));
        b.remove_addr(ah_a);
        assert_eq!(b.post_recv(&[BufId(12)]), 1);
        send(&mut a, ah_b, BufId(2), b"third", 9);
        assert_eq!(poll_all(&mut b)[0].src, Source::Unknown { qpn: a.addr().qpn });
    }

    /// `a` sends `b` a 16-byte header and `len` bytes gathered from a
    /// region of `a` (bytes 3, 4, 5, ...); returns the receive completion
    /// and the payload.
    fn send_gathered(a: &mut SimDevice, b: &mut SimDevice, len: u32) -> (Cqe, Vec<u8>) {
        let ah = a.insert_addr(&b.addr()).unwrap();
        let mr = a.register(8192, Access::LOCAL).unwrap();
        let payload: Vec<u8> = (0..len).map(|i| (i + 3) as u8).collect();
        a.write_region(mr.id, 100, &payload);
        a.held_mut(BufId(0))[..16].copy_from_slice(&[0xab; 16]);
        let data = Some(DataSeg { mr: mr.id, offset: 100, len });
        assert_eq!(a.post_send(&[SendWr { ah, buf: BufId(0), len: 16, data, wr_id: 7 }]), 1);
        let mut got = [Cqe::default(); 4];
        assert_eq!(b.poll(&mut got), 1);
        assert_eq!(got[0].len, 16 + len);
        assert_eq!(
            &b.held(BufId::from_wr_id(got[0].wr_id))[..16],
            &[0xab; 16],
            "headers are in place"
        );
        (got[0], payload)
    }

    const SENT: Cqe =
        Cqe { op: CqOp::Send, status: CqStatus::Ok, wr_id: 7, len: 0, src: Source::None, imm: 0 };

    #[test]
    fn a_large_gathered_payload_moves_once_where_the_receiver_copies_it() {
        let (fabric, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        let (cqe, payload) = send_gathered(&mut a, &mut b, 4000);
        assert!(poll_all(&mut a).is_empty(), "the send completes once its payload is placed");
        assert_eq!(fabric.pending(&b.addr()), 1);
        let dst = b.register(8192, Access::LOCAL).unwrap();
        b.copy_to_region(BufId::from_wr_id(cqe.wr_id), 16, dst.id, 50, 4000);
        assert_eq!(&b.region_vec(&dst)[50..4050], &payload[..]);
        assert_ne!(
            &b.held(BufId(10))[16..4016],
            &payload[..],
            "straight to the region, not the buffer"
        );
        assert_eq!(poll_all(&mut a), [SENT]);
        assert_eq!(fabric.pending_total(), 0);
    }

    #[test]
    fn an_unplaced_payload_is_placed_when_read_held_or_dropped() {
        // Read any other way: placed into the buffer first.
        let (_f, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        let (_, payload) = send_gathered(&mut a, &mut b, 2000);
        let mut out = vec![0; 2000];
        b.read_payload(BufId(10), 16, &mut out);
        assert_eq!(out, payload);
        assert_eq!(&b.held(BufId(10))[16..2016], &payload[..]);
        assert_eq!(poll_all(&mut a), [SENT]);

        // Held through a round of handling: placed as the receiver polls
        // again, so the sender never waits on the receiver's application.
        let (_f, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        let (_, payload) = send_gathered(&mut a, &mut b, 2000);
        assert!(poll_all(&mut a).is_empty());
        b.poll(&mut [Cqe::default(); 4]);
        assert_eq!(&b.held(BufId(10))[16..2016], &payload[..]);
        assert_eq!(poll_all(&mut a), [SENT]);

        // The same when it landed during a poll (it waited for a buffer).
        let (_f, mut a, mut b) = pair(SimConfig::default());
        let ah = a.insert_addr(&b.addr()).unwrap();
        let mr = a.register(4096, Access::LOCAL).unwrap();
        a.write_region(mr.id, 0, &[9; 2000]);
        let data = Some(DataSeg { mr: mr.id, offset: 0, len: 2000 });
        assert_eq!(a.post_send(&[SendWr { ah, buf: BufId(0), len: 16, data, wr_id: 7 }]), 1);
        b.post_recv(&[BufId(10)]);
        assert_eq!(b.poll(&mut [Cqe::default(); 4]), 1, "delivered by this poll");
        assert!(poll_all(&mut a).is_empty());
        b.poll(&mut [Cqe::default(); 4]);
        assert_eq!(&b.held(BufId(10))[16..2016], &[9; 2000]);
        assert_eq!(poll_all(&mut a), [SENT]);

        // Reposted unread (the endpoint dropped the packet): delivered all
        // the same.
        let (_f, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        send_gathered(&mut a, &mut b, 2000);
        b.post_recv(&[BufId(10)]);
        assert_eq!(poll_all(&mut a), [SENT]);

        // The receiver vanishes: what it received was delivered.
        let (fabric, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        send_gathered(&mut a, &mut b, 2000);
        fabric.kill(&b.addr());
        assert_eq!(poll_all(&mut a), [SENT]);
    }

    #[test]
    fn a_region_a_send_still_reads_cannot_be_deregistered() {
        let fabric = SimFabric::new(SimConfig::default());
        let domain = fabric.domain();
        let (mut a, mut b) = (domain.device().unwrap(), fabric.device());
        let ah = a.insert_addr(&b.addr()).unwrap();
        // The device's own region and one the domain holds, attached.
        let own = a.register(8192, Access::LOCAL).unwrap();
        let held = domain.register(8192, Access::LOCAL).unwrap();
        a.attach(&held).unwrap();
        for (buf, mr) in [(BufId(1), own), (BufId(2), held)] {
            let data = Some(DataSeg { mr: mr.id, offset: 0, len: 64 });
            let wr = SendWr { ah, buf, len: 16, data, wr_id: buf.wr_id() };
            assert_eq!(a.post_send(&[wr]), 1);
        }
        // No receive posted at `b`: both wait on the wire, gathering from
        // the regions when they land. (The domain refuses while a queue
        // uses the region, and a queue cannot stop while a flight does.)
        assert_eq!(a.deregister(own.id), Err(DeviceError::Busy));
        assert_eq!(a.deregister(held.id), Err(DeviceError::Busy));
        assert_eq!(domain.deregister(&held), Err(DeviceError::Busy));
        b.post_recv(&[BufId(10), BufId(11)]);
        assert_eq!(poll_all(&mut b).len(), 2);
        assert_eq!(poll_all(&mut a).len(), 2);
        assert_eq!(a.deregister(own.id), Ok(()));
        assert_eq!(a.deregister(held.id), Ok(()));
        assert_eq!(domain.deregister(&held), Ok(()));

        // A large payload lands unplaced: its region is still read until
        // the receiver copies the payload out.
        let mr = a.register(8192, Access::LOCAL).unwrap();
        b.post_recv(&[BufId(12)]);
        let data = Some(DataSeg { mr: mr.id, offset: 0, len: UNPLACED_MIN });
        assert_eq!(a.post_send(&[SendWr { ah, buf: BufId(3), len: 16, data, wr_id: 3 }]), 1);
        let mut got = [Cqe::default(); 4];
        assert_eq!(b.poll(&mut got), 1);
        assert_eq!(a.deregister(mr.id), Err(DeviceError::Busy));
        let dst = b.register(8192, Access::LOCAL).unwrap();
        b.copy_to_region(BufId(12), 16, dst.id, 0, UNPLACED_MIN as usize);
        assert_eq!(poll_all(&mut a), [Cqe { wr_id: 3, ..SENT }]);
        assert_eq!(a.deregister(mr.id), Ok(()));
    }

    #[test]
    fn a_dropped_device_frees_the_regions_it_attached_and_its_peers_see_it_gone() {
        let fabric = SimFabric::new(SimConfig::default());
        let domain = fabric.domain();
        let (mut a, mut b) = (domain.device().unwrap(), fabric.device());
        let held = domain.register(8192, Access::LOCAL).unwrap();
        a.attach(&held).unwrap();
        let mut c = domain.device().unwrap();
        c.attach(&held).unwrap();
        b.post_recv(&[BufId(10)]);
        let ah = b.insert_addr(&a.addr()).unwrap();
        assert_eq!(domain.deregister(&held), Err(DeviceError::Busy));
        drop(a);
        assert_eq!(domain.deregister(&held), Err(DeviceError::Busy), "c still uses it");
        drop(c);
        assert_eq!(domain.deregister(&held), Ok(()));
        // What its peer sends it fails, as to a destroyed queue pair.
        assert_eq!(b.post_send(&[SendWr { ah, buf: BufId(1), len: 16, data: None, wr_id: 7 }]), 1);
        let got = poll_all(&mut b);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].wr_id, got[0].status), (7, CqStatus::PeerUnreachable));
        // A restarted device's old handle, dropped late, leaves the new one be.
        let d = fabric.device();
        let d2 = fabric.restart(&d.addr());
        drop(d);
        let ah = b.insert_addr(&d2.addr()).unwrap();
        assert_eq!(b.post_send(&[SendWr { ah, buf: BufId(2), len: 16, data: None, wr_id: 8 }]), 1);
        let mut d2 = d2;
        d2.post_recv(&[BufId(3)]);
        assert_eq!(poll_all(&mut d2).len(), 1);
        assert_eq!(poll_all(&mut b)[0].status, CqStatus::Ok);
    }

    #[test]
    fn a_small_gathered_payload_is_copied_at_delivery() {
        let (_f, mut a, mut b) = pair(SimConfig::default());
        b.post_recv(&[BufId(10)]);
        let (_, payload) = send_gathered(&mut a, &mut b, UNPLACED_MIN - 1);
        assert_eq!(&b.held(BufId(10))[16..16 + payload.len()], &payload[..]);
        assert_eq!(poll_all(&mut a), [SENT]);
    }

    #[test]
    fn no_posted_buffer_holds_the_packet_and_back_pressures_the_sender() {
        let cfg = SimConfig { tx_depth: 2, ..SimConfig::default() };
        let (fabric, mut a, mut b) = pair(cfg);
        let ah = a.insert_addr(&b.addr()).unwrap();
        send(&mut a, ah, BufId(0), b"x", 0);
        send(&mut a, ah, BufId(1), b"y", 1);
        let wr = SendWr { ah, buf: BufId(2), len: 1, data: None, wr_id: 2 };
        assert_eq!(a.post_send(&[wr]), 0, "TX queue full");
        assert!(poll_all(&mut b).is_empty());
        assert_eq!(fabric.stats(&b.addr()).rnr_waits, 1);
        assert!(poll_all(&mut a).is_empty(), "no send completes before delivery");
        b.post_recv(&[BufId(5), BufId(6)]);
        assert_eq!(poll_all(&mut b).len(), 2);
        assert_eq!(poll_all(&mut a).len(), 2);
        assert_eq!(a.post_send(&[wr]), 1);
    }

    #[test]
    fn in_order_delivery_is_immediate_but_never_overtakes_a_held_packet() {
        let (_f, mut a, mut b) = pair(SimConfig::default());
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.post_recv(&[BufId(10)]);
        send(&mut a, ah, BufId(0), b"now", 0);
        assert_eq!(poll_all(&mut a).len(), 1, "delivered before the receiver polls");
        // No buffer: held. A buffer posted later must not let the next
        // packet land before it.
        send(&mut a, ah, BufId(1), b"held", 1);
        b.post_recv(&[BufId(11), BufId(12)]);
        send(&mut a, ah, BufId(2), b"after", 2);
        let got = poll_all(&mut b);
        let bufs: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        assert_eq!(bufs, [10, 12, 11], "newest posted buffer first");
        assert_eq!(&b.held(BufId(10))[..3], b"now");
        assert_eq!(&b.held(BufId(12))[..4], b"held");
        assert_eq!(&b.held(BufId(11))[..5], b"after");
        assert_eq!(poll_all(&mut a).len(), 2);
    }

    #[test]
    fn delivery_copies_into_the_posted_buffer_and_a_restarted_senders_packet_still_lands() {
        let (fabric, mut a, mut b) = pair(SimConfig::default());
        let ah = a.insert_addr(&b.addr()).unwrap();
        let addrs = |a: &SimDevice, b: &SimDevice| {
            [a.held(BufId(3)).as_ptr(), b.held(BufId(20)).as_ptr(), b.held(BufId(21)).as_ptr()]
        };
        let home = addrs(&a, &b);
        b.post_recv(&[BufId(20), BufId(21)]);
        send(&mut a, ah, BufId(3), b"first", 0);
        assert_eq!(poll_all(&mut a).len(), 1);
        // The packet was copied: what the sender writes in its buffer for
        // its next send never reaches the packet already delivered.
        a.held_mut(BufId(3))[..5].copy_from_slice(b"XXXXX");
        send(&mut a, ah, BufId(3), b"second", 1);
        let got = poll_all(&mut b);
        assert_eq!(got.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [21, 20]);
        assert_eq!(&b.held(BufId(21))[..5], b"first");
        assert_eq!(&b.held(BufId(20))[..6], b"second");
        // Every buffer is where it was: a receiver's buffers stay in its
        // own memory, as a NIC writes a host's posted buffers.
        assert_eq!(addrs(&a, &b), home);

        // A packet still in flight (no buffer posted) when its sender
        // restarts lands as it was sent, and the new device's buffer of
        // the same id keeps what that device wrote in it.
        send(&mut a, ah, BufId(4), b"from the old a", 2);
        let mut a2 = fabric.restart(&a.addr());
        a2.held_mut(BufId(4))[..3].copy_from_slice(b"new");
        b.post_recv(&[BufId(22)]);
        assert_eq!(poll_all(&mut b).len(), 1);
        assert_eq!(&b.held(BufId(22))[..14], b"from the old a");
        assert_eq!(&a2.held(BufId(4))[..3], b"new");
    }

    #[test]
    fn reordering_is_deterministic_per_seed() {
        let order = |seed| {
            let cfg = SimConfig { faults: Faults::reorder(seed, 8), ..SimConfig::default() };
            let (_f, mut a, mut b) = pair(cfg);
            let ah = a.insert_addr(&b.addr()).unwrap();
            for i in 0..32u8 {
                send(&mut a, ah, BufId(i as u32), &[i], i as u64);
            }
            b.post_recv(&(100..132).map(BufId).collect::<Vec<_>>());
            poll_all(&mut b)
                .iter()
                .map(|c| b.held(BufId::from_wr_id(c.wr_id))[0])
                .collect::<Vec<_>>()
        };
        let first = order(3);
        assert_eq!(first, order(3));
        assert_ne!(first, order(4));
        assert_ne!(first, (0..32).collect::<Vec<_>>());
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>(), "nothing lost or duplicated");
    }

    #[test]
    fn rdma_checks_the_targets_registration() {
        let (fabric, mut a, mut b) = pair(SimConfig::default());
        let ah = a.insert_addr(&b.addr()).unwrap();
        let local = a.register(64, Access::LOCAL).unwrap();
        let remote = b.register(64, Access::REMOTE_READ).unwrap();
        b.write_region(remote.id, 0, &[9; 64]);
        a.write_region(local.id, 0, b"abcd");
        let rd = RdmaWr {
            op: RdmaOp::Read,
            ah,
            local: local.id,
            local_offset: 8,
            len: 16,
            remote_addr: remote.addr_at(4),
            remote_key: remote.key,
            wr_id: 1,
        };
        let bad = [
            RdmaWr { remote_key: remote.key ^ 1, wr_id: 2, ..rd },
            RdmaWr { remote_addr: remote.addr_at(60), wr_id: 3, ..rd },
            RdmaWr { remote_addr: remote.addr.wrapping_sub(1), wr_id: 4, ..rd },
            RdmaWr { op: RdmaOp::Write { imm: None }, wr_id: 5, ..rd },
            RdmaWr { len: u64::MAX, local_offset: 0, wr_id: 6, ..rd },
        ];
        assert_eq!(a.post_rdma(&[rd]), 1);
        assert_eq!(a.post_rdma(&bad), bad.len());
        poll_all(&mut b);
        let done = poll_all(&mut a);
        let status = |id| done.iter().find(|c| c.wr_id == id).unwrap().status;
        assert_eq!(status(1), CqStatus::Ok);
        for id in 2..=5 {
            assert_eq!(status(id), CqStatus::RemoteAccess, "wr {id}");
        }
        assert_eq!(status(6), CqStatus::LocalError);
        assert_eq!(&a.region_vec(&local)[..8], b"abcd\0\0\0\0");
        assert_eq!(&a.region_vec(&local)[8..24], &[9; 16]);
        assert!(b.region_vec(&remote).iter().all(|&x| x == 9), "target untouched");
        assert_eq!(fabric.stats(&b.addr()).remote_access_errors, 4);
    }

    #[test]
    fn write_with_immediate_consumes_a_receive_buffer() {
        let (_f, mut a, mut b) = pair(SimConfig::default());
        let ah = a.insert_addr(&b.addr()).unwrap();
        let local = a.register(8, Access::LOCAL).unwrap();
        let remote = b.register(8, Access::REMOTE_WRITE).unwrap();
        a.write_region(local.id, 0, b"12345678");
        let wr = RdmaWr {
            op: RdmaOp::Write { imm: Some(42) },
            ah,
            local: local.id,
            local_offset: 0,
            len: 8,
            remote_addr: remote.addr,
            remote_key: remote.key,
            wr_id: 1,
        };
        assert_eq!(a.post_rdma(&[wr]), 1);
        assert!(poll_all(&mut b).is_empty(), "waits for a receive buffer");
        b.post_recv(&[BufId(3)]);
        let got = poll_all(&mut b);
        let imm = (got[0].op, got[0].imm, got[0].wr_id, got[0].len);
        assert_eq!(imm, (CqOp::RecvWriteImm, 42, 3, 8));
        assert_eq!(b.region_vec(&remote), b"12345678");
        assert_eq!(poll_all(&mut a)[0].op, CqOp::Write);
    }

    #[test]
    fn faults() {
        let (fabric, mut a, mut b) = pair(SimConfig::default());
        fabric.fail_registrations(&a.addr(), 1);
        assert_eq!(a.register(8, Access::LOCAL), Err(DeviceError::Registration));
        assert!(a.register(8, Access::LOCAL).is_ok());

        let ah = a.insert_addr(&b.addr()).unwrap();
        fabric.fail_sends(&a.addr(), 1);
        send(&mut a, ah, BufId(0), b"lost", 1);
        assert_eq!(poll_all(&mut a)[0].status, CqStatus::DeviceError);

        // One buffer, which the injected packet takes: the next packet is
        // still in flight (held for a buffer) when its target dies.
        b.post_recv(&[BufId(1)]);
        fabric.inject(&b.addr(), 77, b"\x40\x04");
        let got = poll_all(&mut b);
        assert_eq!(got[0].src, Source::Unknown { qpn: 77 });
        assert_eq!(&b.held(BufId(1))[..2], b"\x40\x04");

        send(&mut a, ah, BufId(1), b"doomed", 2);
        fabric.kill(&b.addr());
        assert_eq!(poll_all(&mut a)[0].status, CqStatus::PeerUnreachable);
        send(&mut a, ah, BufId(2), b"late", 3);
        assert_eq!(poll_all(&mut a)[0].status, CqStatus::PeerUnreachable);
        assert!(poll_all(&mut b).is_empty(), "a dead device completes nothing");

        // A restarted peer answers at the same QPN with a new connid.
        let mut b2 = fabric.restart(&b.addr());
        assert_eq!(b2.addr().qpn, b.addr().qpn);
        assert_ne!(b2.addr().connid, b.addr().connid);
        b2.post_recv(&[BufId(0)]);
        send(&mut a, ah, BufId(3), b"hi", 4);
        assert_eq!(poll_all(&mut b2).len(), 1);
    }

    #[test]
    fn a_dropped_packet_arrives_after_the_retransmission_delay_and_damage_reaches_the_receiver() {
        let faults = Faults { drop_ppm: 1_000_000, ..Faults::NONE };
        let (fabric, mut a, mut b) = pair(SimConfig { faults, ..SimConfig::default() });
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.post_recv(&[BufId(4), BufId(5)]);
        send(&mut a, ah, BufId(0), b"lost once", 1);
        assert!(poll_all(&mut b).is_empty(), "dropped: held for its retransmission");
        fabric.set_faults(Faults::NONE);
        assert!(poll_all(&mut b).is_empty(), "not due before the delay");
        assert!(fabric.skip_to_next_due());
        assert_eq!(fabric.now_ns(), SimConfig::default().retransmit_ns);
        let got = poll_all(&mut b);
        assert_eq!(got.len(), 1, "delivered once");
        assert_eq!(&b.held(BufId::from_wr_id(got[0].wr_id))[..9], b"lost once");
        assert_eq!(poll_all(&mut a).len(), 1, "and its send completes");
        assert!(!fabric.skip_to_next_due(), "nothing held");

        // Corrupted and truncated bytes land as sent by a hostile peer.
        let faults = Faults { corrupt_ppm: 1_000_000, truncate_ppm: 1_000_000, ..Faults::NONE };
        fabric.set_faults(faults);
        b.post_recv(&[BufId(6)]);
        send(&mut a, ah, BufId(1), &[0u8; 100], 2);
        let got = poll_all(&mut b);
        assert!(got[0].len < 100, "truncated: {}", got[0].len);
        let flipped: u32 =
            b.held(BufId(6))[..got[0].len as usize].iter().map(|x| x.count_ones()).sum();
        assert!(flipped <= 1, "one bit at most (it may have been cut off)");
        assert_eq!(fabric.stats(&b.addr()).damaged, 1);
        let s = fabric.fault_stats();
        assert_eq!((s.corrupted, s.truncated), (1, 1));
    }

    #[test]
    fn a_refused_post_is_back_pressure() {
        let faults = Faults { queue_full_ppm: 500_000, ..Faults::NONE };
        let (fabric, mut a, mut b) = pair(SimConfig { faults, ..SimConfig::default() });
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.post_recv(&(100..200).map(BufId).collect::<Vec<_>>());
        let wrs: Vec<SendWr> = (0..100)
            .map(|i| SendWr { ah, buf: BufId(i), len: 1, data: None, wr_id: i as u64 })
            .collect();
        let mut posted = 0;
        let mut calls = 0;
        while posted < wrs.len() {
            posted += a.post_send(&wrs[posted..]);
            calls += 1;
        }
        assert!(calls > 10, "posts were refused: {calls} calls");
        assert_eq!(fabric.fault_stats().refused, calls - 1);
        assert_eq!(poll_all(&mut b).len(), 100, "every one went, once");
    }

    #[test]
    fn duplicates_are_delivered_twice() {
        let faults = Faults { duplicate_ppm: 1_000_000, ..Faults::NONE };
        let cfg = SimConfig { faults, ..SimConfig::default() };
        let (fabric, mut a, mut b) = pair(cfg);
        let ah = a.insert_addr(&b.addr()).unwrap();
        b.post_recv(&[BufId(0), BufId(1), BufId(2)]);
        send(&mut a, ah, BufId(0), b"twice", 1);
        let mut out = [Cqe::default(); 1];
        assert_eq!(b.poll(&mut out), 1);
        // Stop before the duplicate is itself duplicated.
        fabric.set_faults(Faults::NONE);
        let mut got = vec![out[0]];
        got.extend(poll_all(&mut b));
        assert_eq!(got.len(), 2);
        assert_eq!(&b.held(BufId::from_wr_id(got[1].wr_id))[..5], b"twice");
        assert_eq!(poll_all(&mut a).len(), 1, "one send completion");
    }

    #[test]
    fn update_region_fetches_combines_and_writes_back() {
        let (_f, mut a, _b) = pair(SimConfig::default());
        crate::device::checks::update_region_fetches_combines_and_writes_back(&mut a);
    }
}
