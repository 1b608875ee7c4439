//! Shared-memory segments: the one type here that maps them, the header
//! every segment starts with, and the liveness check of their owners.
//!
//! A segment is an anonymous memory file (`memfd_create`) with no name in
//! any file system: a peer gets its descriptor only from its owner, over
//! the rendezvous socket (see `rendezvous`). Its size is sealed
//! (`F_SEAL_SHRINK | F_SEAL_GROW`, then `F_SEAL_SEAL`) before anyone sees
//! it, so no process, the owner included, can shrink it under a mapping
//! (the SIGBUS a truncated file raises); a segment handed to us is mapped
//! only if it carries those seals. Its pages are reserved at creation
//! (`posix_fallocate`), so a full memory fails the creation instead of
//! raising SIGBUS in whoever touches a page later.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// The header at offset 0 of every segment. All fields are read and
/// written as atomics: the memory is shared with other processes.
pub(crate) mod hdr {
    /// `b"EFAPSHM\0"`, written last at creation (Release), so a reader that
    /// sees it sees the whole header.
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    /// [`STATE_READY`], [`STATE_CLOSED`]; 0 while being created.
    pub const STATE: usize = 12;
    /// The owner's pid: what a process that maps the segment (a debugger,
    /// a test) can tell its maker by. No one trusts it: the kernel says
    /// who granted a lane (`SO_PEERCRED`).
    pub const PID: usize = 16;
    /// [`KIND_LANE`] or [`KIND_REGION`].
    pub const KIND: usize = 20;
    /// Creation time in nanoseconds since the Unix epoch.
    pub const INCARNATION: usize = 24;

    // Lane segments: the receiver's address, and its ring's geometry.
    pub const CONNID: usize = 32;
    pub const QPN: usize = 36;
    pub const RING_SLOTS: usize = 40;
    pub const SLOT_PAYLOAD: usize = 44;
    pub const SLOT_STRIDE: usize = 48;

    // Region segments.
    pub const KEY: usize = 32;
    pub const LEN: usize = 40;
    /// The owner's virtual address of the region's byte 0: `Mr::addr`.
    pub const BASE: usize = 48;
    pub const ACCESS: usize = 56;

    /// Bytes of the header proper; a lane's producer state and head follow
    /// on lines of their own.
    pub const LEN_MIN: usize = 64;

    pub const MAGIC_VALUE: u64 = u64::from_le_bytes(*b"EFAPSHM\0");
    /// 5: a segment per lane.
    pub const VERSION_VALUE: u32 = 5;
    pub const STATE_READY: u32 = 1;
    pub const STATE_CLOSED: u32 = 2;
    pub const KIND_LANE: u32 = 3;
    pub const KIND_REGION: u32 = 2;
}

/// A shared mapping of a whole segment. The memory is shared with other
/// processes, which may write it at any time: it is read and written only
/// through atomics (header, ring control words) or by copying plain bytes.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

/// The seals every segment carries: its size is fixed for good.
const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

fn os_err(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

impl Mapping {
    /// A new segment of `len` bytes, zeroed, its size sealed; returns its
    /// mapping and the descriptor a peer is handed.
    pub(crate) fn create(len: usize) -> io::Result<(Mapping, OwnedFd)> {
        // A memory file has no file system's size limit: reserving more
        // than the host can give would summon the OOM killer instead of
        // failing. Refuse what cannot fit now (ENOMEM).
        if mem_available().is_some_and(|avail| len as u64 > avail) {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        // SAFETY: the name is a NUL-terminated literal.
        let fd = os_err(unsafe { libc::memfd_create(c"efapoll".as_ptr(), flags) })?;
        // SAFETY: `fd` was just made and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(len as u64)?;
        // SAFETY: a plain syscall on a descriptor we hold.
        let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if err != 0 {
            return Err(io::Error::from_raw_os_error(err));
        }
        let seals = SIZE_SEALS | libc::F_SEAL_SEAL;
        // SAFETY: a plain syscall on a descriptor we hold.
        os_err(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        let map = Mapping::map(&file, len, true)?;
        Ok((map, file.into()))
    }

    /// Maps a segment whose descriptor a peer handed over, whole: only a
    /// memory file whose size is sealed (its owner could shrink any other
    /// under us) and that holds at least `min_len` bytes.
    pub(crate) fn from_fd(
        fd: BorrowedFd<'_>,
        min_len: usize,
        writable: bool,
    ) -> io::Result<Mapping> {
        // SAFETY: a plain syscall on a descriptor we hold.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SIZE_SEALS != SIZE_SEALS {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "segment size not sealed"));
        }
        let file = File::from(fd.try_clone_to_owned()?);
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(0);
        if len < min_len.max(hdr::LEN_MIN) {
            return Err(io::ErrorKind::InvalidData.into());
        }
        Mapping::map(&file, len, writable)
    }

    /// The descriptor closes when `file` drops; the mapping outlives it.
    fn map(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a new mapping at an address the kernel picks, so it
        // overlaps no Rust object; `len` is the file's size, so no page of
        // it lies past the end of the file.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(io::ErrorKind::InvalidData)?;
        Ok(Mapping { ptr, len, writable })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// This process's address of byte `offset`.
    pub(crate) fn addr_at(&self, offset: usize) -> u64 {
        self.ptr.as_ptr() as u64 + offset as u64
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "outside the segment");
    }

    pub(crate) fn u32_at(&self, offset: usize) -> &AtomicU32 {
        self.check(offset, 4);
        assert!(offset.is_multiple_of(4), "misaligned");
        // SAFETY: inside the mapping (checked) and aligned (the mapping is
        // page-aligned, the offset checked); the mapping lives as long as
        // `&self`; any bits are a valid u32, and shared words are only
        // accessed atomically.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    pub(crate) fn u64_at(&self, offset: usize) -> &AtomicU64 {
        self.check(offset, 8);
        assert!(offset.is_multiple_of(8), "misaligned");
        // SAFETY: as in `u32_at`.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The ring slot header at `offset`, checked once for all its fields.
    pub(crate) fn slot_header_at(&self, offset: usize) -> &super::ring::SlotHeader {
        use super::ring::SlotHeader;
        self.check(offset, std::mem::size_of::<SlotHeader>());
        assert!(offset.is_multiple_of(std::mem::align_of::<SlotHeader>()), "misaligned");
        // SAFETY: inside the mapping (checked) and aligned (page-aligned
        // mapping, offset checked); the mapping lives as long as `&self`;
        // `SlotHeader` is `repr(C)` atomics only, so any bits are valid and
        // shared words are only accessed atomically.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<SlotHeader>() }
    }

    /// Copies `src` into the segment at `offset`.
    pub(crate) fn write_bytes(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        assert!(self.writable, "read-only mapping");
        // SAFETY: the target range is inside a writable mapping (checked);
        // `src` is a Rust slice, so it is not the target range of this
        // mapping, which hands out no slices of ring slots or of regions
        // while a device call copies into them.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        }
    }

    /// [`Self::write_bytes`] of a packet's payload, short lengths copied
    /// in line ([`crate::device::mem::copy_packet`]).
    #[inline(always)]
    pub(crate) fn write_packet(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        assert!(self.writable, "read-only mapping");
        // SAFETY: as in `write_bytes`.
        unsafe {
            crate::device::mem::copy_packet(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        }
    }

    /// Reads `len` bytes at `offset`, hands them to `fetch`, lets `combine`
    /// change them and writes them back ([`crate::device::mem::update`]).
    pub(crate) fn update(
        &self,
        offset: usize,
        len: usize,
        fetch: impl FnMut(usize, &[u8]),
        combine: impl FnMut(usize, &mut [u8]),
    ) {
        self.check(offset, len);
        assert!(self.writable, "read-only mapping");
        // SAFETY: inside a writable mapping (checked), which lives as long
        // as `&self` and hands out no slices of regions. A peer may write
        // the range meanwhile, as it may during any copy: garbage, never
        // unsound memory.
        let at = unsafe { self.ptr.as_ptr().add(offset) };
        // SAFETY: as above.
        unsafe { crate::device::mem::update(at, len, fetch, combine) }
    }

    /// Asks the CPU to take the `lines` cache lines from byte `offset` on
    /// for writing (PREFETCHW): a hint, no access.
    #[inline(always)]
    pub(crate) fn prefetch_write(&self, offset: usize, lines: usize) {
        self.check(offset, lines * 64);
        #[cfg(target_arch = "x86_64")]
        for l in 0..lines {
            // SAFETY: the address is inside the mapping (checked above);
            // PREFETCHW changes no memory and cannot fault (a NOP where
            // unsupported).
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) self.ptr.as_ptr().add(offset + l * 64),
                    options(readonly, nostack, preserves_flags)
                );
            }
        }
    }

    /// Copies the segment's bytes at `offset` into `dst`.
    #[inline(always)]
    pub(crate) fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        // SAFETY: the source range is inside the mapping (checked); `dst`
        // is exclusive, so it is not the source. A peer may write the
        // source meanwhile: the bytes are then garbage, which every reader
        // validates, never unsound memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }

    /// Copies `len` bytes between two segments (RDMA by copy).
    pub(crate) fn copy(src: &Mapping, src_off: usize, dst: &Mapping, dst_off: usize, len: usize) {
        src.check(src_off, len);
        dst.check(dst_off, len);
        assert!(dst.writable, "read-only mapping");
        // SAFETY: both ranges are inside their mappings (checked), the
        // target writable. Devices copy only inside `&mut self` calls, when
        // they hand out no slice of their regions. `copy` is a memmove, so
        // a region copied onto itself through one mapping stays intact.
        unsafe { std::ptr::copy(src.ptr.as_ptr().add(src_off), dst.ptr.as_ptr().add(dst_off), len) }
    }
}

// SAFETY: a `Mapping` owns its mapping (unmapped once, on drop) and lends
// no reference into it: the memory is reached only through atomics and
// byte copies, which other processes race with anyway, so other threads
// of this one may as well (a domain's regions serve every lcore).
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: every access through `&Mapping` is an atomic or a
// raw copy.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are a mapping made in `map`, unmapped once,
        // here; every reference into it borrows `self`, so none is alive.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Bytes of memory the host can still give (`MemAvailable`), if it says.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Whether process `pid` may still run: "no such process" says it does not
/// (another user's process answers EPERM, and is alive), and neither does
/// a zombie, whose parent has not reaped it yet.
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 delivers nothing; it only checks the pid.
    let ret = unsafe { libc::kill(pid, 0) };
    if ret != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !is_zombie(pid)
}

/// Reads the state letter of `/proc/<pid>/stat` (after the parenthesised
/// command name, which may itself hold parentheses).
fn is_zombie(pid: libc::pid_t) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 512];
    let mut path = [0u8; 32];
    let path = {
        let mut w = &mut path[..];
        let _ = write!(w, "/proc/{pid}/stat");
        let left = w.len();
        std::str::from_utf8(&path[..32 - left]).unwrap_or("")
    };
    let Ok(mut f) = File::open(path) else {
        return false;
    };
    let n = f.read(&mut buf).unwrap_or(0);
    let stat = &buf[..n];
    let state = stat.iter().rposition(|&b| b == b')').and_then(|at| stat.get(at + 2));
    state == Some(&b'Z')
}
