//! Tests of the efa device on softefa: the test binary runs itself again,
//! one test (`--exact`), with `libsoftefa.so` preloaded in front of
//! rdma-core, since a verbs provider must be in place before the process
//! starts. The child tells softefa what device to be through its control
//! file, and reads what the wire's faults did from its stats file (see
//! softefa's crate doc).

use std::path::PathBuf;
use std::process::Command;

use efapoll::device::fault::{FaultStats, Faults};

/// Set in the child: the test runs here, under softefa.
const MARK: &str = "EFAPOLL_UNDER_SOFTEFA";

/// The built `libsoftefa.so`: `SOFTEFA_LIB`, or beside the test
/// (`target/<profile>/deps`, where a test build of the workspace puts it),
/// or in the profile's directory (`cargo build -p softefa`). A test of the
/// engine cannot depend on the cdylib, so it is built beforehand
/// (scripts/test.sh builds the workspace); a missing library fails the
/// test rather than skipping it.
pub fn library() -> PathBuf {
    if let Some(lib) = std::env::var_os("SOFTEFA_LIB") {
        return lib.into();
    }
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let dirs = [deps, deps.parent().expect("target/<profile>")];
    let lib = dirs.iter().map(|d| d.join("libsoftefa.so")).find(|l| l.exists());
    lib.unwrap_or_else(|| {
        panic!(
            "no libsoftefa.so in {dirs:?}: build it first (`cargo build -p softefa`, or the \
             workspace's tests, as scripts/test.sh does), or name it with SOFTEFA_LIB"
        )
    })
}

/// Runs `body` under softefa: here, when this is the child; otherwise in
/// a child running test `path` (`module_path!()` and the test's name, e.g.
/// `engine::endpoint_wire::efa::every_protocol_crosses_a_clean_wire`),
/// which must pass.
pub fn run(path: &str, body: impl FnOnce()) {
    if std::env::var_os(MARK).is_some() {
        return body();
    }
    // The harness names a test by its path below the crate.
    let name = path.split_once("::").map_or(path, |(_, below)| below);
    let dir = std::env::temp_dir().join(format!(
        "efapoll-softefa-{}-{}",
        std::process::id(),
        name.replace("::", "-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("timeout")
        .arg("600")
        .arg(&exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_PRELOAD", library())
        .env(MARK, "1")
        .env("SOFTEFA_CONTROL", dir.join("control"))
        .env("SOFTEFA_STATS", dir.join("stats"))
        .output()
        .expect("running the test again");
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} under softefa: {}\n{text}", out.status);
    assert!(text.contains("1 passed"), "{name} did not run under softefa:\n{text}");
}

fn var(k: &str) -> PathBuf {
    std::env::var_os(k)
        .unwrap_or_else(|| panic!("{k}: not run through common::softefa::run"))
        .into()
}

/// Makes the next devices and QPs softefa opens do RDMA read and write or
/// not, over a wire with `faults`; forgets the stats of QPs before.
pub fn configure(rdma: bool, faults: Faults) {
    let rdma = u8::from(rdma);
    let control =
        format!("SOFTEFA_RDMA_READ={rdma}\nSOFTEFA_RDMA_WRITE={rdma}\nSOFTEFA_FAULTS={faults}\n");
    std::fs::write(var("SOFTEFA_CONTROL"), control).unwrap();
    let _ = std::fs::remove_file(var("SOFTEFA_STATS"));
}

/// What the faults did on the wires of the QPs destroyed since
/// [`configure`], and how many datagrams their udp devices dropped as
/// copies, damaged or stale.
pub fn stats() -> (FaultStats, u64) {
    let text = std::fs::read_to_string(var("SOFTEFA_STATS")).unwrap_or_default();
    let (mut f, mut drops) = (FaultStats::default(), 0);
    for item in text.split_whitespace() {
        let (k, v) = item.split_once('=').expect("name=value");
        let v: u64 = v.parse().expect("a count");
        match k {
            "dropped" => f.dropped += v,
            "duplicated" => f.duplicated += v,
            "reordered" => f.reordered += v,
            "delayed" => f.delayed += v,
            "corrupted" => f.corrupted += v,
            "truncated" => f.truncated += v,
            "refused" => f.refused += v,
            _ => drops += v,
        }
    }
    (f, drops)
}
