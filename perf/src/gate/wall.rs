//! Wall-clock measurement in this process, for quiet machines (metal
//! instances, pinned cores): each workload is set up once and sampled
//! `runs` times; a metric is the median sample, bounded by the extremes.
//!
//! Latency workloads time every operation (one clock read each side, some
//! 20 ns, is part of what is measured) and keep each sample's p50 and p99
//! in ns; rate workloads time a sample of `iters` operations and keep
//! operations or bytes per second.

use hdrhistogram::Histogram;

use super::bmf::{Metric, Report};
use crate::workloads::{Kind, Runner, Unit, Workload};

/// Percentiles of one latency sample, ns.
fn latency_sample(runner: &mut dyn Runner, iters: u64) -> (f64, f64) {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    for _ in 0..iters {
        hist.saturating_record(runner.run_timed(1).as_nanos() as u64);
    }
    (hist.value_at_quantile(0.5) as f64, hist.value_at_quantile(0.99) as f64)
}

/// Operations, or bytes, per second of one sample.
fn rate_sample(runner: &mut dyn Runner, iters: u64, unit: Unit) -> f64 {
    let took = runner.run_timed(iters);
    let per_op = match unit {
        Unit::Ops => 1.0,
        Unit::Bytes(n) => n as f64,
    };
    iters as f64 * per_op / took.as_secs_f64()
}

/// Measures `workloads`, `runs` samples each; `progress` hears of each
/// workload before it starts.
pub fn measure(workloads: &[&Workload], runs: usize, mut progress: impl FnMut(&str)) -> Report {
    let mut report = Report::default();
    for w in workloads {
        progress(&w.name);
        let mut runner = w.setup();
        match w.kind {
            Kind::Latency => {
                let (p50, p99): (Vec<f64>, Vec<f64>) =
                    (0..runs).map(|_| latency_sample(runner.as_mut(), w.iters)).unzip();
                report.insert(&w.name, "latency", Metric::from_samples(&p50));
                report.insert(&w.name, "latency-p99", Metric::from_samples(&p99));
            }
            Kind::Rate => {
                let rates: Vec<f64> =
                    (0..runs).map(|_| rate_sample(runner.as_mut(), w.iters, w.unit)).collect();
                let measure = match w.unit {
                    Unit::Ops => "throughput",
                    Unit::Bytes(_) => "bandwidth",
                };
                report.insert(&w.name, measure, Metric::from_samples(&rates));
            }
        }
    }
    report
}
