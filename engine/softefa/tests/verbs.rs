//! Runs verbs programs written in C against rdma-core's headers and
//! libraries, with softefa preloaded in front of them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built `libsoftefa.so`: cargo builds the package's cdylib with its
/// tests, beside their executables' directory (`target/<profile>/`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("deps/");
    for dir in [deps.parent().expect("the profile's directory"), deps] {
        let lib = dir.join("libsoftefa.so");
        if lib.exists() {
            return lib;
        }
    }
    panic!("libsoftefa.so not found beside {}", deps.display());
}

/// Compiles `tests/<name>.c` with the system C compiler, linked with
/// libibverbs and libefa as an EFA program is.
fn compile(name: &str, tag: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(format!("{name}.c"));
    let out = std::env::temp_dir().join(format!("softefa-{name}-{tag}-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-libverbs", "-lefa"])
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e}"));
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// Runs `exe` under softefa with `env`; returns its standard output.
fn run(exe: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new("timeout")
        .arg("120")
        .arg(exe)
        .env("LD_PRELOAD", library())
        .envs(env.iter().copied())
        .output()
        .expect("running the program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {}\n{stdout}{stderr}", exe.display(), out.status);
    stdout
}

#[test]
fn a_verbs_program_sends_reads_writes_and_meets_efa_quirks() {
    let exe = compile("verbs", "default");
    let out = run(&exe, &[]);
    let _ = std::fs::remove_file(&exe);
    for check in [
        "ok device list",
        "ok queries",
        "ok send, unknown sender with sgid",
        "ok known sender by AH number",
        "ok post_send with two SGEs, poll_cq",
        "ok rdma write with immediate",
        "ok rdma read completes with IBV_WC_SEND",
        "ok bad rkey: vendor error 7",
        "ok bad lkey: vendor error 5",
        "ok SQ full: ENOMEM, the batch rolled back",
        "ok unsignaled WR refused",
        "ok a full SQ's worth",
        "ok receive SGE limit",
        "ok teardown",
        "all passed",
    ] {
        assert!(out.lines().any(|l| l == check), "missing {check:?} in:\n{out}");
    }
}

#[test]
fn the_mtu_is_max_msg_sz_and_configurable() {
    let exe = compile("verbs", "mtu");
    let out = run(&exe, &[("SOFTEFA_MTU", "9000")]);
    let _ = std::fs::remove_file(&exe);
    assert!(out.contains("all passed"), "{out}");
}
