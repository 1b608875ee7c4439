//! With the `efa` feature: checks the hand-written efadv bindings
//! (src/device/efa/efadv_abi.rs) against the installed `efadv.h`, by
//! compiling C `_Static_assert`s of their sizes, offsets, constants and
//! function signatures with the system C compiler. Without it: nothing, so
//! the default build needs no rdma-core.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

const ABI: &str = "src/device/efa/efadv_abi.rs";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={ABI}");
    println!("cargo:rerun-if-env-changed=CC");
    if std::env::var_os("CARGO_FEATURE_EFA").is_some() {
        check_efadv();
    }
}

/// The C of each check, and the names of constants to check only where the
/// header declares them.
#[derive(Default)]
struct Checks {
    c: String,
    newer: Vec<(String, String)>,
}

macro_rules! efadv_structs {
    ($(
        $(#[$doc:meta])*
        $name:ident ($size:expr) {
            $($(#[$fdoc:meta])* pub $field:ident : $ty:ty = $offset:expr,)*
        }
    )*) => {
        fn structs(out: &mut Checks) {
            $(
                let s = stringify!($name);
                let _ = writeln!(out.c, "_Static_assert(sizeof(struct {s}) == {}, \"sizeof {s}\");", $size);
                $(
                    let f = stringify!($field);
                    let _ = writeln!(out.c,
                        "_Static_assert(offsetof(struct {s}, {f}) == {}, \"offset of {s}.{f}\");",
                        $offset);
                )*
            )*
        }
    };
}

macro_rules! efadv_consts {
    (
        header { $($(#[$doc:meta])* $name:ident : $ty:ty = $value:expr,)* }
        newer { $($(#[$ndoc:meta])* $nname:ident : $nty:ty = $nvalue:expr,)* }
    ) => {
        fn consts(out: &mut Checks) {
            $(
                let n = stringify!($name);
                let _ = writeln!(out.c, "_Static_assert({n} == {}ULL, \"value of {n}\");", ($value) as u64);
            )*
            $(out.newer.push((stringify!($nname).to_string(), format!("{}ULL", ($nvalue) as u64)));)*
        }
    };
}

macro_rules! efadv_fns {
    ($($(#[$doc:meta])* fn $name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty;)*) => {
        fn fns(out: &mut Checks) {
            $(
                let args: Vec<String> = vec![$(c_type(stringify!($ty))),*];
                let n = stringify!($name);
                let _ = writeln!(out.c,
                    "_Static_assert(__builtin_types_compatible_p(__typeof__(&{n}), {} (*)({})), \"signature of {n}\");",
                    c_type(stringify!($ret)), args.join(", "));
            )*
        }
    };
}

include!("src/device/efa/efadv_abi.rs");

/// The C spelling of a Rust FFI type as the ABI file writes them.
fn c_type(rust: &str) -> String {
    let mut t: &str = &rust.replace(' ', "");
    let mut stars = 0;
    while let Some(rest) = t.strip_prefix("*mut").or_else(|| t.strip_prefix("*const")) {
        t = rest;
        stars += 1;
    }
    let base = match t {
        "u64" => "uint64_t".to_string(),
        "u32" => "uint32_t".to_string(),
        "u16" => "uint16_t".to_string(),
        "u8" => "uint8_t".to_string(),
        "c_int" => "int".to_string(),
        "ibv_gid" => "union ibv_gid".to_string(),
        name if name.starts_with("ibv_") || name.starts_with("efadv_") => format!("struct {name}"),
        other => panic!("efadv_abi.rs: no C spelling for the Rust type {other}"),
    };
    format!("{base}{}", " *".repeat(stars))
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

fn cflags() -> Vec<String> {
    // Where pkg-config knows rdma-core's headers (an install outside
    // /usr/include); none otherwise.
    Command::new("pkg-config")
        .args(["--cflags", "libibverbs"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

fn run(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("feature `efa`: cannot run the C compiler `{}` to {what}: {e}", cc())
    });
    if !out.status.success() {
        panic!(
            "feature `efa`: {what} failed (is rdma-core's libibverbs-dev installed?):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.stdout
}

fn check_efadv() {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let head = "#include <stddef.h>\n#include <stdint.h>\n#include <infiniband/efadv.h>\n";
    let header_c = out_dir.join("efadv_header.c");
    std::fs::write(&header_c, head).expect("write efadv_header.c");
    let pre = run(
        Command::new(cc()).args(cflags()).arg("-E").arg(&header_c),
        "preprocess infiniband/efadv.h",
    );
    let pre = String::from_utf8_lossy(&pre);

    let mut checks = Checks::default();
    structs(&mut checks);
    consts(&mut checks);
    fns(&mut checks);
    let mut c = format!("{head}\n{}", checks.c);
    for (name, value) in &checks.newer {
        let declared =
            pre.split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).any(|w| w == name);
        if declared {
            let _ = writeln!(c, "_Static_assert({name} == {value}, \"value of {name}\");");
        }
    }
    let check_c = out_dir.join("efadv_check.c");
    std::fs::write(&check_c, c).expect("write efadv_check.c");
    run(
        Command::new(cc()).args(cflags()).args(["-fsyntax-only", "-Werror"]).arg(&check_c),
        "checking the efadv bindings against infiniband/efadv.h",
    );
}
