//! efapoll: a poll-mode, run-to-completion engine for the EFA RDM communication
//! protocol v4, the wire protocol of libfabric's EFA provider.
//!
//! Each worker core owns one endpoint and busy-polls it; nothing on the hot
//! path is shared between cores, allocates, locks or makes a system call.
#![deny(unsafe_code)]
#[allow(unsafe_code)]
pub mod device;
pub mod endpoint;
mod intmap;
#[allow(unsafe_code)]
pub mod mem;
pub mod relink;
pub mod wire;
