//! Instruction counts under valgrind's callgrind: deterministic where wall
//! clock is noise (shared CI machines), so a 2% threshold means something.
//!
//! Each workload runs in a process of its own, `efapoll-perf exec NAME N`,
//! twice: with N and 2N operations. Process start, setup and warm-up are
//! the same in both, so the difference of the two totals divided by N is
//! the cost of one operation. The workloads are single-threaded and seeded,
//! so the count repeats to within a few instructions per operation.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::GateError;
use super::bmf::{Metric, Report};
use crate::workloads::Workload;

/// The installed valgrind's version, or why it cannot be used.
pub fn valgrind_version() -> Result<String, GateError> {
    let out = Command::new("valgrind").arg("--version").output().map_err(|e| {
        GateError::Tool(format!(
            "valgrind not found ({e}): instruction mode needs it; install it with \
             `apt-get install valgrind` (or use --mode wall)"
        ))
    })?;
    if !out.status.success() {
        return Err(GateError::Tool(format!("`valgrind --version` failed: {}", out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The total instruction count in a callgrind output file.
pub fn parse_totals(text: &str) -> Option<u64> {
    // callgrind writes "summary: N" in the header and "totals: N" at the
    // end; the first event is Ir (instructions) unless told otherwise.
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Instructions of `exe exec name iters`, start to exit.
fn count(exe: &Path, dir: &Path, name: &str, iters: u64) -> Result<u64, GateError> {
    let file: PathBuf = dir.join(format!("{}.{iters}.out", name.replace('/', "_")));
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(exe)
        .args(["exec", name, &iters.to_string()])
        .output()
        .map_err(|e| GateError::Tool(format!("valgrind: {e}")))?;
    if !out.status.success() {
        return Err(GateError::Tool(format!(
            "valgrind {} exec {name} {iters}: {}\n{}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let text = std::fs::read_to_string(&file)
        .map_err(|e| GateError::Tool(format!("{}: {e}", file.display())))?;
    // The profile is large and of no further use.
    let _ = std::fs::remove_file(&file);
    parse_totals(&text)
        .ok_or_else(|| GateError::Tool(format!("{}: no instruction total", file.display())))
}

/// Instructions per operation of each workload: `runs` pairs of
/// processes each, `jobs` valgrind processes at a time.
pub fn measure(
    exe: &Path,
    workloads: &[&Workload],
    runs: usize,
    jobs: usize,
    dir: &Path,
) -> Result<Report, GateError> {
    std::fs::create_dir_all(dir).map_err(|e| GateError::Tool(format!("{}: {e}", dir.display())))?;
    // Every (workload, run, N or 2N) is an independent process.
    let tasks: Vec<(&str, u64)> = workloads
        .iter()
        .flat_map(|w| {
            let n = w.counted_iters();
            (0..runs).flat_map(move |_| [(w.name.as_str(), n), (w.name.as_str(), 2 * n)])
        })
        .collect();
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<u64, GateError>>>> =
        Mutex::new((0..tasks.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(name, iters)) = tasks.get(i) else { break };
                    let r = count(exe, dir, name, iters);
                    done.lock().unwrap()[i] = Some(r);
                }
            });
        }
    });
    let counts: Vec<u64> = done
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every task ran"))
        .collect::<Result<_, _>>()?;
    let mut report = Report::default();
    for (w, workload) in workloads.iter().enumerate() {
        let per_op: Vec<f64> = (0..runs)
            .map(|r| {
                let i = 2 * (w * runs + r);
                let (one, two) = (counts[i], counts[i + 1]);
                two.saturating_sub(one) as f64 / tasks[i].1 as f64
            })
            .collect();
        let mut metric = Metric::from_samples(&per_op);
        if runs == 1 {
            // One sample has no spread to report.
            metric.lower_value = None;
            metric.upper_value = None;
        }
        report.insert(&workload.name, "instructions", round1(metric));
    }
    Ok(report)
}

/// A tenth of an instruction is below anything the gate can resolve.
fn round1(m: Metric) -> Metric {
    let r = |v: f64| (v * 10.0).round() / 10.0;
    Metric {
        value: r(m.value),
        lower_value: m.lower_value.map(r),
        upper_value: m.upper_value.map(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_totals_line() {
        let text = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1234\n\
                    fn=(1) main\n3 1234\n\ntotals: 5678\n";
        assert_eq!(parse_totals(text), Some(5678));
        assert_eq!(parse_totals("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(parse_totals("events: Ir\n"), None);
        assert_eq!(parse_totals("totals: many\n"), None);
    }
}
