//! Bindings of rdma-core's EFA direct verbs (`infiniband/efadv.h`), which
//! `rdma-sys` does not cover: the structs, constants and functions the
//! `efa` device (and a verbs provider that implements them) use.
//!
//! They are declared once, in `efadv_abi.rs`: expanded here into `#[repr(C)]`
//! structs, constants and an `extern` block linked against `libefa`, each
//! struct's size and field offsets checked at compile time against the
//! numbers written there, and the same numbers, constants and function
//! signatures checked by the build script against the installed `efadv.h`
//! (C `_Static_assert`s compiled with the system `cc`): a mismatch fails
//! the build.

#![allow(non_camel_case_types)]

use core::ffi::c_int;

pub use rdma_sys::{
    ibv_ah, ibv_context, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_gid, ibv_pd, ibv_qp, ibv_qp_init_attr,
    ibv_qp_init_attr_ex,
};

macro_rules! efadv_structs {
    ($(
        $(#[$doc:meta])*
        $name:ident ($size:expr) {
            $($(#[$fdoc:meta])* pub $field:ident : $ty:ty = $offset:expr,)*
        }
    )*) => {$(
        $(#[$doc])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                // SAFETY: every field is an integer, an integer array or an
                // `Option` of a function pointer, for which all-zero bytes
                // are a valid value (0, or `None`), as C's `= {}` gives.
                unsafe { core::mem::zeroed() }
            }
        }

        const _: () = {
            assert!(core::mem::size_of::<$name>() == $size);
            $(assert!(core::mem::offset_of!($name, $field) == $offset);)*
        };
    )*};
}

macro_rules! efadv_consts {
    (
        header { $($(#[$doc:meta])* $name:ident : $ty:ty = $value:expr,)* }
        newer { $($(#[$ndoc:meta])* $nname:ident : $nty:ty = $nvalue:expr,)* }
    ) => {
        $($(#[$doc])* pub const $name: $ty = $value;)*
        $($(#[$ndoc])* pub const $nname: $nty = $nvalue;)*
    };
}

macro_rules! efadv_fns {
    ($($(#[$doc:meta])* fn $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty;)*) => {
        #[link(name = "efa")]
        unsafe extern "C" {
            $($(#[$doc])* pub fn $name($($arg: $ty),*) -> $ret;)*
        }
    };
}

include!("efadv_abi.rs");

/// The current completion's sender GID (efadv.h's inline function of the
/// same name): 0, or an errno (`ENOENT`: the sender is known by its
/// address handle, or the CQ was made without `EFADV_WC_EX_WITH_SGID`).
///
/// # Safety
/// `cq` is the EFA view of a CQ between `ibv_start_poll` (which succeeded)
/// and `ibv_end_poll`, and `sgid` points to a writable `ibv_gid`.
#[inline]
pub unsafe fn efadv_wc_read_sgid(cq: *mut efadv_cq, sgid: *mut ibv_gid) -> c_int {
    // SAFETY: the caller passes a live EFA CQ, whose provider set the
    // function (a null one is reported as unsupported, not called).
    match unsafe { (*cq).wc_read_sgid } {
        // SAFETY: as above; the provider's function reads its own CQ.
        Some(read) => unsafe { read(cq, sgid) },
        None => libc::EOPNOTSUPP,
    }
}

/// `inlen` of the efadv calls: the size of the struct the caller passes.
pub const fn inlen<T>() -> u32 {
    core::mem::size_of::<T>() as u32
}
