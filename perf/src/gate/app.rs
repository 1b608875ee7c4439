//! The app-level gate: `efapoll pingpong` and `efapoll streaming` with
//! `--json`, run alternately (one app at a time: each busy-polls two
//! lcores), their results turned into metrics.
//!
//! Benches are `app/<app>/<device>/<op>/<size>`; pingpong gives `latency`
//! (t_p50_us) and `latency-p99` (t_p99_us) in ns, streaming gives
//! `bandwidth` (bw_avg_mb_s) in bytes/s and `throughput` (mmsg_per_s) in
//! messages/s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Deserialize;

use super::GateError;
use super::bmf::{Metric, Report};

/// What `--json` writes (apps/src/bench/report.rs); fields the gate does
/// not use are ignored.
#[derive(Debug, Deserialize)]
struct AppJson {
    app: String,
    device: String,
    op: String,
    results: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct PingpongRow {
    bytes: u64,
    t_p50_us: f64,
    t_p99_us: f64,
}

#[derive(Debug, Deserialize)]
struct StreamingRow {
    bytes: u64,
    bw_avg_mb_s: f64,
    mmsg_per_s: f64,
}

/// `1024` → `1KiB`, `100` → `100B`: whole binary units, as the workloads
/// are named.
pub fn size_name(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// The `(bench, measure, value)` triples of one app's JSON output.
pub fn metrics(json: &str) -> Result<Vec<(String, &'static str, f64)>, String> {
    let doc: AppJson = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for row in doc.results {
        let row_err = |e: serde_json::Error| format!("{} result: {e}", doc.app);
        let bench =
            |bytes| format!("app/{}/{}/{}/{}", doc.app, doc.device, doc.op, size_name(bytes));
        match doc.app.as_str() {
            "pingpong" => {
                let r: PingpongRow = serde_json::from_value(row).map_err(row_err)?;
                out.push((bench(r.bytes), "latency", r.t_p50_us * 1e3));
                out.push((bench(r.bytes), "latency-p99", r.t_p99_us * 1e3));
            }
            "streaming" => {
                let r: StreamingRow = serde_json::from_value(row).map_err(row_err)?;
                out.push((bench(r.bytes), "bandwidth", r.bw_avg_mb_s * 1e6));
                out.push((bench(r.bytes), "throughput", r.mmsg_per_s * 1e6));
            }
            other => return Err(format!("unknown app `{other}`")),
        }
    }
    Ok(out)
}

/// How to run the apps.
#[derive(Debug, Clone)]
pub struct AppRun {
    /// The `efapoll` binary.
    pub efapoll: PathBuf,
    pub device: String,
    /// `-S` of both apps.
    pub sizes: String,
    /// Runs of each app, alternating.
    pub runs: usize,
    /// More arguments for both apps (`-l 2,3`, `-I 20000`).
    pub extra: Vec<String>,
    /// Where the apps' JSON files go.
    pub dir: PathBuf,
}

fn run_app(run: &AppRun, app: &str, json: &Path) -> Result<String, GateError> {
    let out = Command::new(&run.efapoll)
        .arg(app)
        .args(["-p", &run.device, "-S", &run.sizes, "--json"])
        .arg(json)
        .args(&run.extra)
        .output()
        .map_err(|e| {
            GateError::Tool(format!(
                "{}: {e} (build it: cargo build --release -p efapoll-apps)",
                run.efapoll.display()
            ))
        })?;
    if !out.status.success() {
        return Err(GateError::Tool(format!(
            "efapoll {app} failed: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::read_to_string(json).map_err(|e| GateError::Tool(format!("{}: {e}", json.display())))
}

/// Runs both apps `runs` times, alternating, and keeps each metric's
/// median; `progress` hears of each finished run.
pub fn measure(run: &AppRun, mut progress: impl FnMut(&str)) -> Result<Report, GateError> {
    std::fs::create_dir_all(&run.dir)
        .map_err(|e| GateError::Tool(format!("{}: {e}", run.dir.display())))?;
    let mut samples: BTreeMap<(String, &'static str), Vec<f64>> = BTreeMap::new();
    for r in 1..=run.runs {
        for app in ["pingpong", "streaming"] {
            let t = Instant::now();
            let json = run_app(run, app, &run.dir.join(format!("{app}.json")))?;
            let metrics = metrics(&json)
                .map_err(|e| GateError::Tool(format!("efapoll {app} --json: {e}")))?;
            for (bench, measure, value) in metrics {
                samples.entry((bench, measure)).or_default().push(value);
            }
            progress(&format!("run {r}/{}: {app} ({:.1} s)", run.runs, t.elapsed().as_secs_f64()));
        }
    }
    let mut report = Report::default();
    for ((bench, measure), values) in samples {
        report.insert(&bench, measure, Metric::from_samples(&values));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    // As apps/src/bench/report.rs writes them.
    const PINGPONG: &str = r#"{
      "app": "pingpong", "device": "shm", "op": "send", "lcores": "0-1",
      "results": [
        {"bytes": 64, "iterations": 10000, "t_min_us": 0.21, "t_p50_us": 0.25, "t_avg_us": 0.26,
         "t_p99_us": 0.4, "t_p999_us": 1.1, "t_max_us": 9.5, "mb_per_s": 246.1,
         "mmsg_per_s": 3.845, "batch": 1},
        {"bytes": 1048576, "iterations": 100, "t_min_us": 60.0, "t_p50_us": 70.5, "t_avg_us": 71.0,
         "t_p99_us": 90.0, "t_p999_us": 95.0, "t_max_us": 99.0, "mb_per_s": 14770.0,
         "mmsg_per_s": 0.01408, "batch": 1}
      ],
      "counters": {"tx.EAGER_MSGRTM": 20020}
    }"#;

    const STREAMING: &str = r#"{
      "app": "streaming", "device": "shm", "op": "send", "lcores": "0-1",
      "results": [
        {"bytes": 4096, "iterations": 262144, "window": 64, "bw_peak_mb_s": 9000.0,
         "bw_avg_mb_s": 8500.0, "mmsg_per_s": 2.5, "usec_per_xfer": 0.4819, "busy_pct": 99.9}
      ],
      "counters": {}
    }"#;

    #[test]
    fn pingpong_gives_p50_and_p99_latency_in_ns() {
        let m = metrics(PINGPONG).unwrap();
        assert_eq!(
            m,
            [
                ("app/pingpong/shm/send/64B".to_string(), "latency", 250.0),
                ("app/pingpong/shm/send/64B".to_string(), "latency-p99", 400.0),
                ("app/pingpong/shm/send/1MiB".to_string(), "latency", 70_500.0),
                ("app/pingpong/shm/send/1MiB".to_string(), "latency-p99", 90_000.0),
            ]
        );
    }

    #[test]
    fn streaming_gives_bandwidth_and_message_rate() {
        let m = metrics(STREAMING).unwrap();
        assert_eq!(
            m,
            [
                ("app/streaming/shm/send/4KiB".to_string(), "bandwidth", 8.5e9),
                ("app/streaming/shm/send/4KiB".to_string(), "throughput", 2.5e6),
            ]
        );
    }

    #[test]
    fn malformed_output_is_an_error() {
        assert!(metrics("{}").is_err());
        assert!(metrics(&PINGPONG.replace("\"t_p99_us\"", "\"p99\"")).is_err());
        assert!(metrics(&STREAMING.replace("\"streaming\"", "\"bounce\"")).is_err());
    }

    #[test]
    fn sizes_are_named_in_binary_units() {
        assert_eq!(size_name(64), "64B");
        assert_eq!(size_name(4096), "4KiB");
        assert_eq!(size_name(65536), "64KiB");
        assert_eq!(size_name(1 << 20), "1MiB");
        assert_eq!(size_name(1000), "1000B");
        assert_eq!(size_name(3 << 30), "3GiB");
    }
}
