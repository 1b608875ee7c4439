//! A global allocator that counts allocations per thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // `const` initialisation: reading it never allocates (which would recurse).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations and reallocations made by
/// each thread. Install it with
/// `#[global_allocator] static A: CountingAlloc = CountingAlloc;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAlloc;

/// Allocations (and reallocations) this thread has made since it started,
/// when [`CountingAlloc`] is the global allocator; 0 otherwise.
pub fn allocations_on_this_thread() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn count() {
    // A thread being torn down has no counter left; its allocations are
    // not interesting.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are the caller's; counting touches
// only a thread-local Cell.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received; the caller upholds the contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from `System` with `layout`; forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
