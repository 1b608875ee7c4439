//! The crate's only memory-level code: slot storage that needs `unsafe`. Each `unsafe` block
//! states why it holds; everything outside this module is safe Rust.
#![allow(unsafe_code)]

pub mod spsc;
