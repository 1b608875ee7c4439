//! The `efapoll-perf` binary end to end: exit statuses, `exec`, `compare`,
//! and one instruction-mode gate run on a tiny workload. Nothing timed.

use std::path::PathBuf;
use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_efapoll-perf")).args(args).output().expect("runs")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("efapoll-perf-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn exec_runs_a_workload_and_rejects_an_unknown_one() {
    assert_eq!(code(&perf(&["exec", "codec/parse/CTS", "100"])), 0);
    assert_eq!(code(&perf(&["exec", "sim/pingpong_64B", "10"])), 0);
    let out = perf(&["exec", "codec/parse/NOPE", "1"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no workload `codec/parse/NOPE`"));
}

#[test]
fn list_names_the_small_suite() {
    let out = perf(&["list", "--small"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().all(|l| l.ends_with("small")), "{text}");
    assert!(text.contains("sim/pingpong_64B"));
}

#[test]
fn compare_exits_3_on_a_regression_or_a_missing_metric() {
    let dir = scratch("compare");
    let write = |name: &str, json: &str| {
        let p = dir.join(name);
        std::fs::write(&p, json).unwrap();
        p.display().to_string()
    };
    let base = write(
        "base.json",
        r#"{"a": {"instructions": {"value": 100}}, "b": {"latency": {"value": 1000}}}"#,
    );
    let same = write(
        "same.json",
        r#"{"a": {"instructions": {"value": 101}}, "b": {"latency": {"value": 1040}}}"#,
    );
    let worse = write(
        "worse.json",
        r#"{"a": {"instructions": {"value": 103}}, "b": {"latency": {"value": 1000}}}"#,
    );
    let gone = write("gone.json", r#"{"a": {"instructions": {"value": 100}}}"#);
    let bad = write("bad.json", r#"{"a": 1}"#);
    assert_eq!(code(&perf(&["compare", &base, &same])), 0);
    let out = perf(&["compare", &base, &worse]);
    assert_eq!(code(&out), 3);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("REGRESSED") && table.contains("+3.00%"), "{table}");
    // A wider threshold lets the same change pass.
    assert_eq!(code(&perf(&["compare", &base, &worse, "--threshold", "instructions=5"])), 0);
    assert_eq!(code(&perf(&["compare", &base, &gone])), 3);
    assert_eq!(code(&perf(&["compare", &base, &bad])), 1);
    assert_eq!(code(&perf(&["compare", &base, &same, "--threshold", "speed=5"])), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wall_and_app_modes_need_five_runs() {
    let out = perf(&["gate", "--mode", "wall", "--machine", "m", "--runs", "3"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 5 runs"));
}

/// A CI runner's host name changes from run to run: wall and app
/// baselines are named by a label given, never by it.
#[test]
fn wall_and_app_modes_need_a_machine_label() {
    for mode in ["wall", "app"] {
        let out = perf(&["gate", "--mode", mode]);
        assert_eq!(code(&out), 2, "{mode}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs --machine LABEL") && err.contains("--baseline"), "{err}");
    }
    let out = perf(&["gate", "--mode", "wall", "--machine", "../etc"]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--machine"));
}

#[test]
fn the_instruction_gate_passes_then_fails_against_a_lower_baseline() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        // CI installs valgrind (.ci/run); a developer machine may not have it.
        assert!(std::env::var_os("CI").is_none(), "valgrind is missing on CI");
        eprintln!("valgrind not installed: instruction gate not tested");
        return;
    }
    let dir = scratch("gate");
    let baseline = dir.join("base.json").display().to_string();
    let out = dir.join("out.json").display().to_string();
    let gate = |extra: &[&str]| {
        // One valgrind at a time: tests run side by side.
        let mut args =
            vec!["gate", "--filter", "codec/parse/CTS", "--suite", "full", "--jobs", "1"];
        args.extend(["--baseline", &baseline, "--out", &out]);
        args.extend(extra);
        perf(&args)
    };
    // No baseline yet: an error that says how to write one.
    let first = gate(&[]);
    assert_eq!(code(&first), 1);
    assert!(String::from_utf8_lossy(&first.stderr).contains("--update-baseline"));
    let said = String::from_utf8_lossy(&first.stdout);
    assert!(!said.contains("PASS") && !said.contains("FAIL"), "one verdict, the error: {said}");
    assert_eq!(code(&gate(&["--update-baseline"])), 0);
    // Deterministic: the same count again.
    let again = gate(&[]);
    assert_eq!(code(&again), 0, "{}", String::from_utf8_lossy(&again.stdout));
    // A baseline 10% cheaper than the code: a regression.
    let text = std::fs::read_to_string(&baseline).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let count = v["codec/parse/CTS"]["instructions"]["value"].as_f64().unwrap();
    assert!(count > 10.0, "{count} instructions per parse");
    let lower = serde_json::json!({"codec/parse/CTS": {"instructions": {"value": count * 0.9}}});
    std::fs::write(&baseline, lower.to_string()).unwrap();
    let regressed = gate(&[]);
    assert_eq!(code(&regressed), 3);
    assert!(String::from_utf8_lossy(&regressed.stdout).contains("REGRESSED"));
    // The results file is Bencher Metric Format.
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(results["codec/parse/CTS"]["instructions"]["value"].as_f64(), Some(count));
    std::fs::remove_dir_all(&dir).unwrap();
}
