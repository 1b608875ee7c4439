//! Memory: what the engine and its embedders need to reason about it.
//!
//! [`CountingAlloc`] proves a loop allocates nothing: install it as the
//! global allocator of a test or a debug build and read the per-thread
//! count around the code under test.

mod alloc_count;

pub use alloc_count::{CountingAlloc, allocations_on_this_thread};
