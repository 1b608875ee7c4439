//! The engine's integration tests, one binary (engine/Cargo.toml says
//! why): each file beside this one is a module of it, but for `alloc.rs`'s
//! and `shm.rs`'s.

mod common;

mod endpoint_atomic;
mod endpoint_gather;
mod endpoint_hostile;
mod endpoint_mem;
mod endpoint_msg;
mod endpoint_rma;
mod endpoint_wire;
mod relink;
mod smbd;
mod smbd_props;
mod wire_golden;
mod wire_malformed;
mod wire_props;
