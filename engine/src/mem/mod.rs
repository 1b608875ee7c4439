//! Memory: registered regions and the checks on every remote access to
//! them ([`Span`], the registry), and tools to reason about allocation.
//!
//! [`CountingAlloc`] proves a loop allocates nothing: install it as the
//! global allocator of a test or a debug build and read the per-thread
//! count around the code under test.

mod alloc_count;
mod registry;

pub use alloc_count::{CountingAlloc, allocations_on_this_thread};
pub(crate) use registry::Registry;
pub use registry::{AccessError, Span};

/// A copy of `*v` that the compiler must load as one value, where it lies:
/// not merged with the loads of neighbouring fields into a wider one, and
/// (unlike `std::hint::black_box`) without a trip through the stack.
#[inline(always)]
pub(crate) fn load_apart<T: Copy>(v: &T) -> T {
    // SAFETY: `v` is a reference, so valid, aligned and initialised for a
    // read of `T`; a volatile read of it has no other effect.
    unsafe { std::ptr::read_volatile(v) }
}
