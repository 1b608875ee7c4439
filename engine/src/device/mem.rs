//! Heap memory with a stable address that a device and its peers share.
//!
//! A device must hand its packet buffers and regions to "hardware" that
//! writes them while the endpoint runs: here, the in-process fabric of the
//! sim device. `Bytes` owns a zeroed heap allocation; the device gives out
//! slices of it through its own `&self`/`&mut self`, and the fabric copies
//! into it only memory posted to the device.

use std::ptr::NonNull;

/// A zeroed heap allocation of fixed length, shared by reference counting
/// between a device and its fabric.
#[derive(Debug)]
pub(crate) struct Bytes {
    ptr: NonNull<u8>,
    len: usize,
}

impl Bytes {
    /// Allocates `len` zeroed bytes.
    pub(crate) fn zeroed(len: usize) -> Bytes {
        let boxed: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let len = boxed.len();
        // Box::into_raw never returns null.
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("non-null box");
        Bytes { ptr, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of byte 0, as a peer names it.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// `len` bytes at `offset`. Panics if the range is outside.
    ///
    /// # Safety
    /// No writable slice of the range (from `slice_mut`) or write (from
    /// `copy`) may overlap the returned slice while it lives. Devices keep
    /// this by reading only through `&self` and writing only through
    /// `&mut self` of the one device that owns the memory, and by letting
    /// the fabric write only memory posted to it.
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "range outside");
        // SAFETY: inside the allocation (checked above), which lives as long
        // as `self`; no overlapping writer, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// `len` bytes at `offset`, writable. Panics if the range is outside.
    ///
    /// # Safety
    /// No other slice of the range may be alive while the returned one
    /// lives (see [`Bytes::slice`]).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len), "range outside");
        // SAFETY: inside the allocation (checked above); exclusive by the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
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
        // SAFETY: `ptr` and `len` came from `Box::<[u8]>::into_raw` in
        // `zeroed` and are dropped once, here.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)));
        }
    }
}
