//! The `udp-floor` binary end to end over loopback: pingpong and
//! streaming with a few iterations, the JSON's shape and the agreement of
//! its numbers, and a bad argument. Nothing timed.
//!
//! Each run busy-polls two threads: on a two-core machine the runs take
//! [`busy`] first (nextest runs each test in a process of its own; its
//! `apps-busy-poll` group keeps them apart there).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

static BUSY: Mutex<()> = Mutex::new(());

fn busy() -> MutexGuard<'static, ()> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs udp-floor, at most a minute, so that a hung run fails the test.
fn floor(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_udp-floor"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("udp-floor {args:?} hung; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn json_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("udp-floor-{}-{test}.json", std::process::id()))
}

/// Runs `args` with `--json` and returns the document, after checking the
/// exit status, the header line and one table row per size.
fn run_json(test: &str, args: &[&str], sizes: usize) -> Value {
    let path = json_path(test);
    let path_arg = path.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--json", &path_arg]);
    let out = {
        let _busy = busy();
        floor(&all)
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "udp-floor {all:?}: exit {:?}\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with(&format!("# udp-floor {}: ", args[0])), "{stdout}");
    let rows = stdout
        .lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|c| c.parse::<u64>().is_ok()))
        .count();
    assert_eq!(rows, sizes, "{stdout}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).unwrap();
    json
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("`{key}` is a number in {v}"))
}

/// The fields every report has, checked; returns the results.
fn results<'a>(json: &'a Value, app: &str, bytes: &[u64]) -> &'a Vec<Value> {
    assert_eq!(json["app"], app);
    assert_eq!(json["mtu"], 8192);
    let buffers = json["socket_buffers"].as_array().expect("socket_buffers is an array");
    assert_eq!(buffers.len(), 2, "{json}");
    assert!(buffers.iter().all(|b| b.as_u64().is_some_and(|b| b > 0)), "{json}");
    let results = json["results"].as_array().expect("results is an array");
    let got: Vec<u64> = results.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(got, bytes);
    results
}

#[test]
fn pingpong_reports_ordered_latencies_per_size() {
    let json = run_json("pingpong", &["pingpong", "-S", "64,64k", "-I", "300", "-w", "20"], 2);
    let keys = ["bytes", "iterations", "t_min_us", "t_p50_us", "t_avg_us", "t_p99_us", "t_max_us"];
    for r in results(&json, "pingpong", &[64, 65536]) {
        let mut have: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        have.sort_unstable();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(have, want);
        assert_eq!(r["iterations"], 300);
        let t = |k| num(r, k);
        assert!(keys[2..].iter().all(|k| t(k) > 0.0), "{r}");
        assert!(t("t_min_us") <= t("t_p50_us"), "{r}");
        assert!(t("t_p50_us") <= t("t_p99_us"), "{r}");
        assert!(t("t_p99_us") <= t("t_max_us"), "{r}");
        assert!(t("t_min_us") <= t("t_avg_us") && t("t_avg_us") <= t("t_max_us"), "{r}");
    }
}

#[test]
fn streaming_rates_agree_with_each_other() {
    let args = ["streaming", "-S", "64,65536", "-I", "1000", "-W", "16"];
    let json = run_json("streaming", &args, 2);
    let keys = ["bytes", "iterations", "window", "mb_s", "mmsg_s", "mpkt_s"];
    for r in results(&json, "streaming", &[64, 65536]) {
        let mut have: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        have.sort_unstable();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(have, want);
        assert_eq!(r["iterations"], 1000);
        let window = r["window"].as_u64().unwrap();
        assert!((1..=16).contains(&window), "{r}");
        let (bytes, mb_s, mmsg_s, mpkt_s) =
            (num(r, "bytes"), num(r, "mb_s"), num(r, "mmsg_s"), num(r, "mpkt_s"));
        assert!(mb_s > 0.0 && mmsg_s > 0.0 && mpkt_s > 0.0, "{r}");
        // Each figure is rounded to 4 significant digits.
        let close = |a: f64, b: f64| (a - b).abs() <= 2e-3 * a.max(b);
        assert!(close(mb_s, mmsg_s * bytes), "{r}");
        let datagrams = (bytes / 8192.0).ceil();
        assert!(close(mpkt_s, mmsg_s * datagrams), "{r}");
    }
}

#[test]
fn a_bad_size_exits_2_and_names_the_argument() {
    for app in ["pingpong", "streaming"] {
        for bad in ["12x", "0", "64,"] {
            let out = floor(&[app, "-S", bad]);
            assert_eq!(out.status.code(), Some(2), "{app} -S {bad}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("--size") && err.contains(bad), "{app} -S {bad}: {err}");
        }
    }
}
