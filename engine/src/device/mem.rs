//! Heap memory with a stable address that a device and its peers share.
//!
//! A device must hand its packet buffers and regions to "hardware" that
//! writes them while the endpoint runs: here, the in-process fabric of the
//! sim device. `Bytes` owns a zeroed heap allocation that is reached only
//! through copies (never a Rust reference, which another writer would
//! make unsound); a frame of the packet buffers is lent as a slice only
//! while it is not posted, since the fabric writes only posted frames.

use std::ptr::NonNull;

use super::{BufId, UPDATE_CHUNK};

/// A zeroed heap allocation of fixed length, shared by reference counting
/// between a device and its fabric.
#[derive(Debug)]
pub(crate) struct Bytes {
    ptr: NonNull<u8>,
    len: usize,
    /// Allocated here (freed on drop), or the caller's (left alone).
    owned: bool,
}

// SAFETY: `Bytes` is reached only through raw-pointer copies, as a NIC's
// memory is: lcores of one domain (the udp device's) may copy into the
// same region from their threads, racing as DMA races with the CPU; what
// a region holds while two writers overlap is the caller's to avoid.
unsafe impl Send for Bytes {}
// SAFETY: as for `Send`: no reference into the memory is ever handed out.
unsafe impl Sync for Bytes {}

impl Bytes {
    /// Allocates `len` zeroed bytes.
    pub(crate) fn zeroed(len: usize) -> Bytes {
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let len = boxed.len();
        // Box::into_raw never returns null.
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("non-null box");
        Bytes { ptr, len, owned: true }
    }

    /// `len` bytes at `ptr` that the caller owns: never freed here.
    ///
    /// # Safety
    /// The range is valid for reads and writes for as long as the `Bytes`
    /// lives, and is reached otherwise only through raw-pointer copies
    /// (the contract of [`super::Domain::register_external`]).
    pub(crate) unsafe fn external(ptr: NonNull<u8>, len: usize) -> Bytes {
        Bytes { ptr, len, owned: false }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of byte 0, as a peer names it.
    /// The first byte, for a system call to gather from or scatter into.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Copies `out.len()` bytes at `offset` into `out`. Panics if the
    /// range is outside.
    #[inline(always)]
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|end| end <= self.len), "range outside");
        // SAFETY: inside the allocation (checked above), which lives as long
        // as `self`; `out` is a Rust borrow, so it is not this memory, which
        // is never lent out as a reference.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }

    /// Copies `src` into the allocation at `offset`. Panics if the range is
    /// outside.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset.checked_add(src.len()).is_some_and(|end| end <= self.len), "range outside");
        // SAFETY: inside the allocation (checked above); no reference to
        // this memory exists (it is reached only through copies), and `src`
        // is a Rust borrow, so not this memory.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        }
    }

    /// [`update`] of `len` bytes at `offset`. Panics if the range is
    /// outside.
    #[inline(always)]
    pub(crate) fn update(
        &self,
        offset: usize,
        len: usize,
        fetch: impl FnMut(usize, &[u8]),
        combine: impl FnMut(usize, &mut [u8]),
    ) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "range outside");
        // SAFETY: inside the allocation (checked above), which lives as long
        // as `self` and is never lent out as a reference.
        unsafe { update(self.ptr.as_ptr().add(offset), len, fetch, combine) }
    }

    /// Copies `len` bytes from `src` at `src_offset` into `dst` at
    /// `dst_offset`: the fabric moving data between two devices' memory.
    /// Panics if either range is outside its allocation.
    pub(crate) fn copy(src: &Bytes, src_offset: usize, dst: &Bytes, dst_offset: usize, len: usize) {
        assert!(src_offset.checked_add(len).is_some_and(|end| end <= src.len), "source range");
        assert!(dst_offset.checked_add(len).is_some_and(|end| end <= dst.len), "target range");
        // SAFETY: both ranges are inside their allocations (checked above).
        // The fabric runs this only inside a device call on one thread, on
        // memory posted to the device for this operation: no slice of the
        // target range is alive. `copy` allows the ranges to overlap (a
        // device reading its own region).
        unsafe {
            std::ptr::copy(src.ptr.as_ptr().add(src_offset), dst.ptr.as_ptr().add(dst_offset), len)
        }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: `ptr` and `len` came from `Box::<[u8]>::into_raw` in
        // `zeroed` and are dropped once, here.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)));
        }
    }
}

/// Reads `len` bytes at `at`, hands them to `fetch`, lets `combine`
/// change them and writes them back, through a copy on the stack of
/// [`UPDATE_CHUNK`] bytes at a time (each function gets the chunk's offset
/// from `at`): a region's read, combine and write in one pass, the region
/// never lent as a reference.
///
/// # Safety
/// `[at, at + len)` is valid for reads and writes until this returns and
/// is reached only through raw pointers (no reference to it is alive).
#[inline(always)]
pub(crate) unsafe fn update(
    at: *mut u8,
    len: usize,
    mut fetch: impl FnMut(usize, &[u8]),
    mut combine: impl FnMut(usize, &mut [u8]),
) {
    let mut chunk = [0u8; UPDATE_CHUNK];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(UPDATE_CHUNK);
        // SAFETY: inside the range (the caller's contract); `chunk` is a
        // local, not that memory.
        unsafe { copy_short(at.add(done), chunk.as_mut_ptr(), n) };
        fetch(done, &chunk[..n]);
        // The functions may reach the range through a device call of their
        // own, but only by copies: the write back below wins.
        combine(done, &mut chunk[..n]);
        // SAFETY: as the read above.
        unsafe { copy_short(chunk.as_ptr(), at.add(done), n) };
        done += n;
    }
}

/// `copy_nonoverlapping`, inline for the common atomic elements (2, 4 or
/// 8 bytes), which a call to `memcpy` would cost several times over.
///
/// # Safety
/// As `copy_nonoverlapping`.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract; unaligned reads and writes of `n`
    // bytes at most.
    unsafe {
        match n {
            8 if crate::FAST_PATHS => {
                dst.cast::<u64>().write_unaligned(src.cast::<u64>().read_unaligned())
            }
            4 if crate::FAST_PATHS => {
                dst.cast::<u32>().write_unaligned(src.cast::<u32>().read_unaligned())
            }
            2 if crate::FAST_PATHS => {
                dst.cast::<u16>().write_unaligned(src.cast::<u16>().read_unaligned())
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

/// `copy_nonoverlapping` of a short packet's payload: 65 to 128 bytes as
/// two overlapping 64-byte blocks, in line (each read before either is
/// written); any other length by `copy_nonoverlapping`. `memcpy`'s path
/// for that size class, a call and its dispatch on the length, cost the
/// framed 64-byte stream's receiver, whose segments land as 88 bytes,
/// some 3% of its rate (perf/README, 2026-12-06).
///
/// # Safety
/// As `copy_nonoverlapping`.
#[inline(always)]
pub(crate) unsafe fn copy_packet(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract; for 65 <= n <= 128 both blocks,
    // [0, 64) and [n - 64, n), lie within the `n` bytes, read and written
    // unaligned.
    unsafe {
        if crate::FAST_PATHS && (65..=128).contains(&n) {
            let head = src.cast::<[u8; 64]>().read_unaligned();
            let tail = src.add(n - 64).cast::<[u8; 64]>().read_unaligned();
            dst.cast::<[u8; 64]>().write_unaligned(head);
            dst.add(n - 64).cast::<[u8; 64]>().write_unaligned(tail);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n)
        }
    }
}

/// Bytes from one packet buffer to the next in a pool of `mtu`-byte
/// buffers: a cache line past the MTU. With an MTU-sized stride (a
/// multiple of the page size) every buffer's first lines, where a packet's
/// headers are, would map to the same L1 sets, and a burst of packets
/// would evict its own headers: with 32 in flight on a 12-way cache, every
/// packet misses.
pub(crate) const fn frame_stride(mtu: usize) -> usize {
    mtu + 64
}

/// A device's packet buffers: frame `id` of `mtu` bytes at `stride * id`
/// in the device's pool (a [`Bytes`] the fabric keeps alive as long as
/// itself, so that a packet in flight from a device that died can still
/// land).
#[derive(Debug)]
pub(crate) struct Frames {
    base: NonNull<u8>,
    n: u32,
    stride: usize,
    mtu: usize,
}

impl Frames {
    /// `n` frames of `pool`, frame `i` at `stride * i`.
    pub(crate) fn new(pool: &Bytes, n: u32, mtu: usize, stride: usize) -> Frames {
        assert!(mtu <= stride && stride * n as usize <= pool.len, "frames outside the pool");
        Frames { base: pool.ptr, n, stride, mtu }
    }

    /// Where frame `id` starts. Panics if `id` is out of range.
    /// Frame `id`'s first byte, for a system call to gather from or
    /// scatter into.
    #[inline(always)]
    pub(crate) fn ptr(&self, id: BufId) -> *mut u8 {
        self.at(id).as_ptr()
    }

    #[inline(always)]
    fn at(&self, id: BufId) -> NonNull<u8> {
        assert!(id.0 < self.n, "buffer {id} out of range");
        // SAFETY: `stride * id + mtu <= pool.len` (checked in `new`, with
        // `id < n` above), so the pointer is inside the allocation.
        unsafe { self.base.add(self.stride * id.index()) }
    }

    /// Buffer `id`, whole. Panics if `id` is out of range.
    ///
    /// # Safety
    /// Nothing writes the frame while the slice lives: it is not posted
    /// (the contract of [`super::Device::buf`]), and no `slice_mut` of it
    /// is alive.
    #[inline(always)]
    pub(crate) unsafe fn slice(&self, id: BufId) -> &[u8] {
        // SAFETY: a frame is `mtu` bytes inside a live pool; no writer,
        // by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.at(id).as_ptr(), self.mtu) }
    }

    /// Buffer `id`, writable. Panics if `id` is out of range.
    ///
    /// # Safety
    /// As [`Frames::slice`], and no other slice of the frame is alive
    /// while this one lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, id: BufId) -> &mut [u8] {
        // SAFETY: as `slice`, exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.at(id).as_ptr(), self.mtu) }
    }

    /// Copies `len` bytes from `src` at `src_offset` into buffer `id` at
    /// `offset`: the fabric writing a posted buffer. Panics if either
    /// range is outside.
    #[inline(always)]
    pub(crate) fn copy_in(
        &self,
        id: BufId,
        offset: usize,
        src: &Bytes,
        src_offset: usize,
        len: usize,
    ) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.mtu), "frame range");
        assert!(src_offset.checked_add(len).is_some_and(|end| end <= src.len), "source range");
        // SAFETY: both ranges are inside live allocations (checked above);
        // the frame is either posted (the fabric writing it: no slice of it
        // is alive) or being built by its device inside a `&mut self` call
        // (no slice either); a frame is never inside a region.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.ptr.as_ptr().add(src_offset),
                self.at(id).as_ptr().add(offset),
                len,
            )
        }
    }

    /// Copies `len` bytes of buffer `id` from `offset` into `dst` at
    /// `dst_offset`: a received payload into a region. Panics if either
    /// range is outside.
    #[inline(always)]
    pub(crate) fn copy_out(
        &self,
        id: BufId,
        offset: usize,
        dst: &Bytes,
        dst_offset: usize,
        len: usize,
    ) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.mtu), "frame range");
        assert!(dst_offset.checked_add(len).is_some_and(|end| end <= dst.len), "target range");
        // SAFETY: both ranges are inside live allocations (checked above);
        // a frame is never inside a region, and the frame is the device's
        // (not posted), so the fabric is not writing it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.at(id).as_ptr().add(offset),
                dst.ptr.as_ptr().add(dst_offset),
                len,
            )
        }
    }

    /// Copies `src` into buffer `id` at `offset`: a packet's bytes built
    /// elsewhere (a few, as a fetching atomic's old values). Panics if the
    /// range is outside the frame.
    #[inline(always)]
    pub(crate) fn write(&self, id: BufId, offset: usize, src: &[u8]) {
        assert!(offset.checked_add(src.len()).is_some_and(|end| end <= self.mtu), "frame range");
        // SAFETY: inside a live frame (checked above); `src` is a Rust
        // borrow, so not a frame. The caller is the device, inside one of
        // its `&mut self` calls: no slice of the frame is alive.
        unsafe { copy_short(src.as_ptr(), self.at(id).as_ptr().add(offset), src.len()) }
    }

    /// What [`Bytes::update`] hands the bytes it read to, for
    /// [`super::Device::update_region`]'s `fetch` (buffer `buf` from byte
    /// `to`): each chunk copied into the buffer at its offset, or nowhere.
    #[inline(always)]
    pub(crate) fn fetcher(&self, fetch: Option<(BufId, usize)>) -> impl FnMut(usize, &[u8]) + '_ {
        move |at, old| {
            if let Some((buf, to)) = fetch {
                self.write(buf, to + at, old);
            }
        }
    }

    /// Copies `out.len()` bytes of buffer `id` from `offset` into `out`: a
    /// received payload read. Panics if the range is outside the frame.
    #[inline(always)]
    pub(crate) fn read(&self, id: BufId, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|end| end <= self.mtu), "frame range");
        // SAFETY: inside a live frame (checked above); `out` is a Rust
        // borrow, so not a frame. Only the device's own calls (and, for a
        // posted frame, its fabric inside some device's call) write a
        // frame, and this is one of them.
        unsafe { copy_short(self.at(id).as_ptr().add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies the first `len` bytes of `src`'s buffer `sid` into `dst`'s
    /// buffer `did`. Panics if `len` exceeds a frame.
    #[inline(always)]
    pub(crate) fn copy(src: &Frames, sid: BufId, dst: &Frames, did: BufId, len: usize) {
        assert!(len <= src.mtu && len <= dst.mtu, "frame range");
        let (from, to) = (src.at(sid), dst.at(did));
        if from == to {
            return;
        }
        // SAFETY: two distinct frames (checked above; frames never
        // overlap), each inside a live pool; the target is posted to the
        // fabric, so no slice of it is alive.
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_ptr(), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_packet;

    /// Every length lands exactly: its bytes, from any offset, and
    /// nothing on either side of them.
    #[test]
    fn copy_packet_lands_each_length_exactly() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 1) as u8).collect();
        for n in 0..=160 {
            for (from, to) in [(0, 0), (3, 5), (17, 1)] {
                let mut dst = [0xEEu8; 200];
                // SAFETY: both ranges in bounds, of two distinct buffers.
                unsafe { copy_packet(src[from..].as_ptr(), dst[to..].as_mut_ptr(), n) };
                assert_eq!(&dst[to..to + n], &src[from..from + n], "{n} bytes from {from} to {to}");
                assert!(dst[..to].iter().all(|&b| b == 0xEE), "{n}: before");
                assert!(dst[to + n..].iter().all(|&b| b == 0xEE), "{n}: after");
            }
        }
    }
}
