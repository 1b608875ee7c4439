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
