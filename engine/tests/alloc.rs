//! What allocates on the hot paths: nothing, once warm. One binary with a
//! counting global allocator, which counts per thread, so the tests run
//! side by side.

use efapoll::mem::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

mod common;

mod endpoint_alloc;
mod smbd_alloc;
mod wire_alloc;
