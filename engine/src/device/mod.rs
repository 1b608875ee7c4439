//! What the endpoint needs from a NIC, and the NICs that provide it.
//!
//! The model is EFA's (spec 1.1, 2.2): unordered, reliable datagrams of at
//! most `mtu` bytes between queue pairs; RDMA read and write where the
//! device supports them; completions polled in bursts; an address book
//! that turns a peer's raw address into an address handle, and that
//! reports a received packet's sender as "unknown" (with its QPN only)
//! until the receiver has inserted the sender's address.
//!
//! # Two halves, as a NIC has
//!
//! * A [`Domain`] is shared by every lcore of a process: registrations,
//!   their keys, and through them what peers can reach (EFA's protection
//!   domain). It is set-up work and may lock.
//! * A [`Device`] is one lcore's queue pair and completion queue: packet
//!   buffers, posting, polling. It is the hot path: no lock, and `!Send`
//!   where it holds per-core state. An endpoint owns one.
//!
//! A region registered on a domain serves every queue that attaches it
//! (`Endpoint::attach`): N lcores, one registration, one key. A device can
//! also register a region of its own ([`Device::register`]), which ends
//! with it. The sim's domain is [`sim::SimDomain`], shm's
//! [`shm::ShmDomain`] and udp's [`udp::UdpDomain`] (`Send` and `Sync`:
//! lcore threads make their devices from clones of them). [`Caps::external_memory`] says which devices take
//! memory the caller owns: sim and udp, not shm, whose regions are segments
//! that peer processes map, so the domain allocates them.
//!
//! # Memory
//!
//! A device owns two kinds of memory, so that it can give its hardware (or
//! its model of it) stable addresses:
//!
//! * **packet buffers**: `Caps::bufs` buffers of `mtu` bytes, named by a
//!   [`BufId`]. The endpoint writes a packet into a buffer and posts it;
//!   it posts empty buffers for receiving and reads them on completion.
//!   A posted buffer belongs to the device until its completion; a
//!   buffer is lent as a slice ([`Device::buf`], `unsafe`) only while it
//!   is not posted.
//! * **registered regions** ([`Mr`]): memory that local operations read
//!   and write and that peers may reach by RDMA, with the access rights
//!   given at registration. A region's `addr` and `key` are what a peer
//!   puts in an `efa_rma_iov`. The domain may have allocated it, or the
//!   caller may own it ([`Domain::register_external`], `unsafe`: the
//!   caller promises it stays put until deregistered).
//!
//! A region is never lent out as a Rust reference: a peer (shm) or the NIC
//! (EFA) may write it at any time, which a `&[u8]` or `&mut [u8]` would
//! forbid. It is read and written only through copies
//! ([`Device::read_region`], [`Device::write_region`], the packet copies,
//! and [`Device::update_region`]'s read, combine and write back), over
//! raw pointers in `mem`. A region that a posted operation
//! still uses cannot be deregistered ([`DeviceError::Busy`]; the endpoint
//! checks its own operations first), so no DMA reaches freed memory; an
//! endpoint drains before it closes (`Endpoint::drain`, `close`).
//!
//! Every device checks remote access against the target's registration
//! (key known, range inside the region without overflow, right granted;
//! RDMAP 7.2) before a byte moves, and completes a violating operation
//! with [`CqStatus::RemoteAccess`], leaving the target untouched.
//!
//! # Posting, polling, time, faults
//!
//! Posting is in bursts: `post_send`, `post_recv` and `post_rdma` accept a
//! prefix of what they are given and return its length; accepting fewer is
//! back-pressure (the queue is full), not an error. Polling writes up to
//! `out.len()` completions into a caller-owned array.
//!
//! Time comes from the device ([`Device::now_ns`]): the host's monotonic
//! clock, or on the sim a virtual one that moves only when a test says,
//! so timeouts are tested without waiting. Faults (drop, duplicate,
//! reorder, delay, corrupt, truncate, queue-full) are injected at the
//! datagram layer by [`fault`], seeded and replayable, shared by every
//! device that has a wire.

#[cfg(feature = "efa")]
pub mod efa;
pub mod fault;
mod mem;
mod regions;
pub mod shm;
pub mod sim;
pub mod udp;

use bitflags::bitflags;

use crate::wire::RawAddr;

/// A packet buffer owned by the device: ids `0..Caps::bufs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct BufId(pub u32);

impl BufId {
    /// No buffer: the end of a chain of them, an empty slot. Never a
    /// device's (`Caps::bufs` is below it).
    pub const NONE: BufId = BufId(u32::MAX);

    /// Its place in a table by buffer.
    #[inline(always)]
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The buffer a receive completion names (its `wr_id`), or a send's
    /// whose `wr_id` was its buffer's ([`BufId::wr_id`]).
    #[inline(always)]
    pub fn from_wr_id(wr_id: u64) -> BufId {
        BufId(wr_id as u32)
    }

    /// A work request id naming this buffer.
    #[inline(always)]
    pub fn wr_id(self) -> u64 {
        u64::from(self.0)
    }
}

impl std::fmt::Display for BufId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An address handle: the device's name for a peer address it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ah(pub u32);

/// What a device can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Largest packet, in bytes (the EFA device's MTU: 8 KiB and up).
    pub mtu: usize,
    /// Packet buffers the device owns (ids `0..bufs`).
    pub bufs: u32,
    /// Sends and RDMA operations that may be outstanding at once.
    pub tx_depth: usize,
    /// Receive buffers that may be posted at once.
    pub rx_depth: usize,
    /// Bytes a send may carry inline (an optimisation hint).
    pub inline_size: usize,
    /// Largest single RDMA read or write, in bytes.
    pub max_rdma_size: u64,
    /// The device performs RDMA read.
    pub rdma_read: bool,
    /// The device performs RDMA write (with optional immediate data).
    pub rdma_write: bool,
    /// The EFA device version reported in HANDSHAKE packets.
    pub device_version: u32,
    /// Memory the caller owns can be registered on the device's domain
    /// (`register_external`, like `fi_mr_reg`): on the sim's
    /// ([`sim::SimDomain`]) and udp's ([`udp::UdpDomain`]). Not on shm,
    /// where a peer process must map a region, so the device allocates it
    /// in shared memory.
    pub external_memory: bool,
}

bitflags! {
    /// Rights a registration grants.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// Local operations may read and write it (always granted).
        const LOCAL = 1 << 0;
        /// Peers may read it.
        const REMOTE_READ = 1 << 1;
        /// Peers may write it.
        const REMOTE_WRITE = 1 << 2;
        /// Peers may apply atomics to it.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// A local handle of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MrId(pub u32);

/// A registered region: its local handle and what a peer needs to reach
/// it (`addr` is the address of byte 0 in the region's address space).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mr {
    pub id: MrId,
    pub key: u64,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
}

impl Mr {
    /// The remote address of the region's byte `offset`.
    pub fn addr_at(&self, offset: u64) -> u64 {
        self.addr.wrapping_add(offset)
    }

    /// Where `[addr, addr + len)` lies in this region, if it lies wholly
    /// inside (no overflow) and the region grants `need`.
    pub fn resolve(&self, addr: u64, len: u64, need: Access) -> Option<u64> {
        let offset = addr.checked_sub(self.addr)?;
        let end = offset.checked_add(len)?;
        (end <= self.len && self.access.contains(need)).then_some(offset)
    }
}

/// A send work request: the first `len` bytes of packet buffer `buf`,
/// then, if given, `data` from a registered region (a second gather
/// element, as EFA sends from a user buffer without copying it), to `ah`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    pub ah: Ah,
    pub buf: BufId,
    pub len: u32,
    pub data: Option<DataSeg>,
    /// Returned in the completion.
    pub wr_id: u64,
}

impl SendWr {
    /// Bytes on the wire.
    #[inline]
    pub fn wire_len(&self) -> usize {
        self.len as usize + self.data.map_or(0, |d| d.len as usize)
    }
}

/// Bytes of a registered region a send gathers after its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSeg {
    pub mr: MrId,
    pub offset: u64,
    pub len: u32,
}

/// Which way an RDMA operation moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaOp {
    /// Remote memory into local memory.
    Read,
    /// Local memory into remote memory; with immediate data, the target
    /// gets a [`CqOp::RecvWriteImm`] completion carrying it (consuming one
    /// posted receive buffer, as EFA does).
    Write { imm: Option<u32> },
}

/// An RDMA work request between local region bytes
/// `[local_offset, local_offset + len)` and the peer's `[remote_addr,
/// remote_addr + len)` under `remote_key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaWr {
    pub op: RdmaOp,
    pub ah: Ah,
    pub local: MrId,
    pub local_offset: u64,
    pub len: u64,
    pub remote_addr: u64,
    pub remote_key: u64,
    /// Returned in the completion.
    pub wr_id: u64,
}

/// What a completion completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CqOp {
    #[default]
    Send,
    /// A packet arrived in buffer `wr_id`.
    Recv,
    Read,
    Write,
    /// A peer's RDMA write with immediate data landed; `wr_id` is the
    /// receive buffer it consumed (which holds no data).
    RecvWriteImm,
    /// A packet sent with immediate data (EFA's SEND_WITH_IMM, which the
    /// udp device carries for a verbs provider) arrived in buffer
    /// `wr_id`; `imm` holds the value.
    RecvImm,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CqStatus {
    #[default]
    Ok,
    /// The target refused the access: unknown key, out of bounds, or a
    /// right not granted. Target memory is untouched.
    RemoteAccess,
    /// The peer is gone (its endpoint closed or its process died).
    PeerUnreachable,
    /// A local argument was invalid (a region, a range, a buffer).
    LocalError,
    /// The device failed the operation (an injected fault, a flush).
    DeviceError,
}

/// The sender of a received packet, as EFA reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// Not a receive.
    #[default]
    None,
    /// A sender whose address is in the address book.
    Known(Ah),
    /// A sender whose address is not: only its QPN is known (spec 2.2).
    Unknown { qpn: u16 },
}

/// A completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub op: CqOp,
    pub status: CqStatus,
    /// The work request's `wr_id`; for receives, the buffer.
    pub wr_id: u64,
    /// Receives: bytes that arrived; [`CqOp::RecvWriteImm`]: bytes the
    /// write carried (EFA's byte_len).
    pub len: u32,
    /// Receives: who sent it.
    pub src: Source,
    /// [`CqOp::RecvWriteImm`], [`CqOp::RecvImm`]: the immediate data.
    pub imm: u32,
}

/// Why a device refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A table or pool is full; retry later.
    #[error("device resources exhausted")]
    Again,
    /// Memory registration failed (the device's limit, or an injected
    /// fault).
    #[error("memory registration failed")]
    Registration,
    /// The handle is not known to the device.
    #[error("unknown handle")]
    UnknownHandle,
    /// The address cannot be reached from this device.
    #[error("address not reachable from this device")]
    BadAddress,
    /// The process at the address is another user's (`uid`): refused, as
    /// shm refuses every other user, root included.
    #[error("the process at that address is another user's (uid {uid}): refused")]
    OtherUser { uid: u32 },
    /// The peer did not answer in time: its process is stopped, or stuck.
    #[error("the peer did not answer (its process is stopped or stuck)")]
    NoAnswer,
    /// The region is still used by work posted to the device.
    #[error("region in use by posted work")]
    Busy,
    /// The device cannot do this (e.g. register memory it did not
    /// allocate).
    #[error("not supported by this device")]
    NotSupported,
    /// The system refused what the device asked of it: `what` it was
    /// doing, and the error number (`ENOMEM` when shm cannot reserve a
    /// segment's memory: its memory files live in no file system to fill).
    #[error("{what}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os { what: &'static str, errno: i32 },
}

impl DeviceError {
    /// The error of a failed system call made while doing `what`.
    pub(crate) fn os(what: &'static str, e: &std::io::Error) -> DeviceError {
        match e.raw_os_error() {
            Some(errno) => DeviceError::Os { what, errno },
            None => DeviceError::Registration,
        }
    }
}

/// The shared half of a NIC: a protection domain, as EFA's PD. It holds
/// registrations and their keys, which every queue made from it may use
/// and through which peers reach the memory; it hands out the per-core
/// queues ([`Domain::device`]). Set-up work: a domain may lock, allocate
/// and make system calls; nothing on the hot path goes through it.
pub trait Domain {
    /// Its per-core half: a queue pair and completion queue.
    type Device: Device;

    /// A new queue pair and completion queue in the domain, for one lcore.
    fn device(&self) -> Result<Self::Device, DeviceError>;

    /// Registers `len` bytes of new, zeroed memory in the domain. A queue
    /// uses it once attached ([`Device::attach`], `Endpoint::attach`);
    /// peers reach it by its key through any queue of the domain.
    fn register(&self, len: u64, access: Access) -> Result<Mr, DeviceError>;

    /// Registers `len` bytes the caller owns, at `ptr`, as `fi_mr_reg`
    /// does: an arena, hugepages, a pinned pool. A device that cannot
    /// ([`Caps::external_memory`] false) answers
    /// [`DeviceError::NotSupported`].
    ///
    /// # Safety
    /// Until [`Domain::deregister`] of this registration succeeds, the
    /// memory stays valid for reads and writes and is neither freed nor
    /// moved. The queues, their peers (as `access` allows) and, on a NIC,
    /// DMA may write it at any time: the caller reaches it only through
    /// raw pointers or copies (`Endpoint::read_mem`, `write_mem`), never
    /// through a Rust reference held while an operation on it is posted or
    /// a peer may write it.
    unsafe fn register_external(
        &self,
        ptr: std::ptr::NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<Mr, DeviceError> {
        let _ = (ptr, len, access);
        Err(DeviceError::NotSupported)
    }

    /// Ends a registration made on the domain; [`DeviceError::Busy`] while
    /// a queue still uses it (deregister it there first, which detaches
    /// it) or work in flight reads or writes it.
    fn deregister(&self, mr: &Mr) -> Result<(), DeviceError>;
}

/// The per-core half of a NIC, as the endpoint sees it: packet buffers,
/// posting and polling, the hot path. It reads and writes registered
/// memory only by copy, and holds no lock.
pub trait Device {
    /// What the device can do.
    fn caps(&self) -> Caps;

    /// This queue pair's raw address.
    fn addr(&self) -> RawAddr;

    /// Adds a peer to the address book; the same address gives the same
    /// handle.
    fn insert_addr(&mut self, addr: &RawAddr) -> Result<Ah, DeviceError>;

    /// Removes a peer from the address book: its packets are reported from
    /// an unknown sender again.
    fn remove_addr(&mut self, ah: Ah);

    /// Packet buffer `id` (all `mtu` bytes). Of a received packet, read
    /// its headers here and its payload through [`Device::copy_to_region`]
    /// or [`Device::read_payload`]: a device may place a payload only when
    /// it is copied out (the sim does, as a NIC's DMA costs the host's CPU
    /// nothing).
    ///
    /// # Safety
    /// Buffer `id` is not posted: a receive buffer is the caller's from its
    /// completion until it is posted again, a send's from its completion
    /// on. A posted buffer is written by the device's NIC at any time, and
    /// by the sim during another device's calls (a peer's `post_send`
    /// lands in it), which a slice would forbid. While the slice lives the
    /// buffer cannot be posted (the slice borrows the device).
    ///
    /// Safe code cannot reach a buffer, even through
    /// `Endpoint::device()`:
    ///
    /// ```compile_fail,E0133
    /// use efapoll::device::Device;
    /// use efapoll::device::sim::{SimConfig, SimFabric};
    ///
    /// let dev = SimFabric::new(SimConfig::default()).device();
    /// let bytes = dev.buf(0);
    /// ```
    unsafe fn buf(&self, id: BufId) -> &[u8];

    /// Packet buffer `id`, to write a packet into. Once a send from it
    /// completes, its bytes are unspecified: write every packet whole.
    ///
    /// # Safety
    /// As [`Device::buf`]: buffer `id` is not posted.
    unsafe fn buf_mut(&mut self, id: BufId) -> &mut [u8];

    /// Allocates and registers a region of `len` bytes, zeroed.
    fn register(&mut self, len: u64, access: Access) -> Result<Mr, DeviceError>;

    /// Uses a region registered on this device's protection domain (by the
    /// domain, or through another of its devices): registrations, keys and
    /// address handles belong to the domain, shared by every lcore's queue,
    /// while buffers, posting and polling are the queue's own. A device
    /// without a shared domain answers [`DeviceError::NotSupported`].
    fn attach(&mut self, mr: &Mr) -> Result<(), DeviceError> {
        let _ = mr;
        Err(DeviceError::NotSupported)
    }

    /// Stops using a region: deregisters it, or, for one its domain holds
    /// or other devices use, detaches it from this device only;
    /// [`DeviceError::Busy`] while work posted to the device still reads or
    /// writes it (the endpoint checks its own operations first).
    fn deregister(&mut self, mr: MrId) -> Result<(), DeviceError>;

    /// Copies `out.len()` bytes of region `mr` from `offset` into `out`.
    /// A region is never lent out as a reference: a peer (shm) or the NIC
    /// (EFA) may write it at any time, which a `&[u8]` would forbid. Panics
    /// if the range is outside the region (the endpoint checks spans).
    fn read_region(&self, mr: MrId, offset: usize, out: &mut [u8]);

    /// A copy of the whole of region `mr`, for checks at set-up time and in
    /// tests (it allocates).
    fn region_vec(&self, mr: &Mr) -> Vec<u8> {
        let mut out = vec![0; mr.len as usize];
        self.read_region(mr.id, 0, &mut out);
        out
    }

    /// Copies `src` into region `mr` at `offset`. Panics as
    /// [`Device::read_region`].
    fn write_region(&mut self, mr: MrId, offset: usize, src: &[u8]);

    /// Copies `len` bytes of region `src` from `src_offset` into region
    /// `dst` at `dst_offset` (the ranges may overlap). Panics as
    /// [`Device::read_region`]. The default bounces through the stack, a
    /// page at a time; the devices here copy directly.
    fn copy_region(
        &mut self,
        src: MrId,
        src_offset: usize,
        dst: MrId,
        dst_offset: usize,
        len: usize,
    ) {
        copy_by_bounce(self, src, src_offset, dst, dst_offset, len);
    }

    /// Reads `len` bytes of region `mr` at `offset`, lets `combine` change
    /// them, and writes them back, in one call: an emulated atomic's read,
    /// combine and write. With `fetch` (a packet buffer and a byte in it),
    /// the bytes as they were are also copied there first: what a fetching
    /// atomic answers. `combine` works on a copy, never on the region (see
    /// [`Device::read_region`]), [`UPDATE_CHUNK`] bytes at a time, each
    /// chunk given with its offset from `offset`. Panics as
    /// [`Device::read_region`], or if the fetched bytes overrun the buffer.
    fn update_region<F: FnMut(usize, &mut [u8])>(
        &mut self,
        mr: MrId,
        offset: usize,
        len: usize,
        fetch: Option<(BufId, usize)>,
        combine: F,
    ) where
        Self: Sized;

    /// Copies `len` bytes of received packet `buf`, from its byte `from`,
    /// into region `mr` at `offset`.
    fn copy_to_region(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize);

    /// [`Device::copy_to_region`] of a payload landing in a slot of a
    /// receive ring (an SMB Direct connection's: a stream's short
    /// segments, one a packet), which a device may copy in line where
    /// `memcpy` would cost it. Not every landing: on shm, plain sends'
    /// receiver copying 65-128 bytes in line ran no faster in the VM's
    /// fast mode and 16-19% slower in its slow one (perf/README,
    /// 2026-12-06).
    #[inline(always)]
    fn copy_to_slot(&mut self, buf: BufId, from: usize, mr: MrId, offset: usize, len: usize) {
        self.copy_to_region(buf, from, mr, offset, len)
    }

    /// Copies `len` bytes of region `mr` from `offset` into packet buffer
    /// `buf` at `to`: a packet's payload, built.
    fn copy_from_region(&mut self, mr: MrId, offset: usize, buf: BufId, to: usize, len: usize);

    /// Copies `out.len()` bytes of received packet `buf`, from its byte
    /// `from`, into `out`. Panics if the range is outside the buffer.
    fn read_payload(&mut self, buf: BufId, from: usize, out: &mut [u8]);

    /// Makes a region usable as the local side of an RDMA read the
    /// endpoint is about to post, as EFA registers a receive buffer on
    /// demand; fails when the device cannot (its registrations are
    /// exhausted), which long-read receivers answer with READ_NACK.
    fn prepare_rdma(&mut self, mr: MrId) -> Result<(), DeviceError>;

    /// Posts empty buffers for receiving; returns how many were taken. A
    /// device fills them in any order (a completion names its buffer).
    fn post_recv(&mut self, bufs: &[BufId]) -> usize;

    /// Posts sends; returns how many were taken (fewer: the TX queue is
    /// full).
    fn post_send(&mut self, wrs: &[SendWr]) -> usize;

    /// Posts RDMA operations; returns how many were taken. A device
    /// without the capability takes none.
    fn post_rdma(&mut self, wrs: &[RdmaWr]) -> usize;

    /// Writes up to `out.len()` completions; returns how many.
    fn poll(&mut self, out: &mut [Cqe]) -> usize;

    /// What the device counted, by name: packets it dropped (by reason),
    /// waits, losses. For reports (it allocates); a device without
    /// counters of its own has none.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// The device's clock, in nanoseconds from an origin of its own: the
    /// time the endpoint's timers run on. The sim's is virtual (it moves
    /// only when a test says so, [`sim::SimFabric::advance`]), so a
    /// timeout test takes no wall-clock time and cannot flake; the others
    /// read the host's monotonic clock.
    fn now_ns(&self) -> u64;
}

/// How many bytes of a region [`Device::update_region`] hands its function
/// at a time: a cache line, a multiple of every atomic element's size.
pub const UPDATE_CHUNK: usize = 64;

/// The packet buffers the engine holds, lent as slices: [`Device::buf`]
/// and [`Device::buf_mut`] for the endpoint, which keeps their contract by
/// construction, and for the devices' tests. Crate-private, so that the
/// only way to a buffer from outside is the `unsafe` one.
pub(crate) trait HeldBufs: Device {
    /// Buffer `id`, which the caller holds (it is not posted).
    #[inline(always)]
    fn held(&self, id: BufId) -> &[u8] {
        // SAFETY: callers pass only buffers they hold: the endpoint, a
        // receive it polled and has not posted again, or a send buffer
        // from its free list, not posted yet or whose send completed.
        unsafe { self.buf(id) }
    }

    /// Buffer `id`, which the caller holds, to write.
    #[inline(always)]
    fn held_mut(&mut self, id: BufId) -> &mut [u8] {
        // SAFETY: as in `held`.
        unsafe { self.buf_mut(id) }
    }
}

impl<D: Device + ?Sized> HeldBufs for D {}

/// [`Device::copy_region`] through `read_region` and `write_region`, a
/// stack page at a time: for a device that cannot copy directly.
pub(crate) fn copy_by_bounce<D: Device + ?Sized>(
    dev: &mut D,
    src: MrId,
    src_offset: usize,
    dst: MrId,
    dst_offset: usize,
    len: usize,
) {
    let mut bounce = [0u8; 4096];
    // Front to back, unless the target starts inside the source range of
    // the same region, where that would overwrite bytes not yet read.
    let backwards = src == dst && dst_offset > src_offset && dst_offset < src_offset + len;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(bounce.len());
        let at = if backwards { len - done - n } else { done };
        dev.read_region(src, src_offset + at, &mut bounce[..n]);
        dev.write_region(dst, dst_offset + at, &bounce[..n]);
        done += n;
    }
}

/// The host's monotonic clock in nanoseconds (since boot): the clock of
/// the devices that run in real time. Read directly, not through
/// `Instant`, whose subtraction and 128-bit conversion cost more than the
/// read itself (the udp device reads it at every poll).
pub fn host_now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `t` is; the
    // monotonic clock exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A random u64 from the standard library's OS-seeded hasher keys: keys
/// and connids that a peer should not guess.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(t.unwrap_or_default().as_nanos());
    h.write_u32(std::process::id());
    h.finish()
}

/// Checks of the `Device` contract that each device's tests run.
#[cfg(test)]
pub(crate) mod checks {
    use super::{Access, BufId, Device, HeldBufs};

    /// [`Device::update_region`] on a region of `dev`: the range, fetched
    /// into a packet buffer as it was, combined a chunk at a time and
    /// written back; nothing outside it moves.
    pub(crate) fn update_region_fetches_combines_and_writes_back<D: Device>(dev: &mut D) {
        let mr = dev.register(256, Access::LOCAL).unwrap();
        let before: Vec<u8> = (0..256).map(|i| (i * 7 + 1) as u8).collect();
        dev.write_region(mr.id, 0, &before);
        let mut chunks = Vec::new();
        dev.update_region(mr.id, 10, 150, Some((BufId(3), 20)), |at, bytes| {
            chunks.push((at, bytes.len()));
            bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
        });
        assert_eq!(chunks, [(0, 64), (64, 64), (128, 22)]);
        let after = dev.region_vec(&mr);
        let want: Vec<u8> = (0..256)
            .map(|i| if (10..160).contains(&i) { before[i].wrapping_add(1) } else { before[i] })
            .collect();
        assert_eq!(after, want);
        assert_eq!(&dev.held(BufId(3))[20..170], &before[10..160], "fetched as it was");
        // One element, without a fetch.
        dev.update_region(mr.id, 0, 8, None, |_, bytes| bytes.fill(9));
        assert_eq!(&dev.region_vec(&mr)[..9], &[9, 9, 9, 9, 9, 9, 9, 9, before[8]]);
    }
}
