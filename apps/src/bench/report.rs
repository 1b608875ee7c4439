//! Measurements, the rows they make, the table on stdout and the JSON file.
//!
//! Units: times in µs, bandwidth in MB/s (10^6 bytes per second), message
//! rates in millions per second.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::App;

/// Half round trips above this (1 hour, in ns) are recorded as this.
pub const HIST_MAX_NS: u64 = 3_600_000_000_000;

/// A histogram of half round trips in ns, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

/// One flow's measurement of one size.
#[derive(Debug, Clone)]
pub enum Sample {
    Pingpong(PingpongSample),
    Streaming(StreamingSample),
}

#[derive(Debug, Clone)]
pub struct PingpongSample {
    pub bytes: u64,
    pub iterations: u64,
    /// Half round trips, ns (batch means when `batch` > 1).
    pub hist: Histogram<u64>,
    /// All measured round trips, end to end.
    pub total_ns: u64,
    /// Round trips per clock read.
    pub batch: u64,
    /// Messages per round trip: 2 (half round trips), or 1 for reads and
    /// atomics, which are reported whole.
    pub legs: u64,
}

#[derive(Debug, Clone)]
pub struct StreamingSample {
    pub bytes: u64,
    pub iterations: u64,
    pub window: u64,
    /// Messages the measured interval covers, and its length.
    pub messages: u64,
    pub elapsed_ns: u64,
    /// The best 10 ms interval, bytes per second (the average when the run
    /// is shorter).
    pub peak_bytes_per_s: f64,
    pub busy_pct: f64,
}

impl StreamingSample {
    fn bytes_per_s(&self) -> f64 {
        (self.messages * self.bytes) as f64 / secs(self.elapsed_ns)
    }

    fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / secs(self.elapsed_ns)
    }
}

fn secs(ns: u64) -> f64 {
    ns.max(1) as f64 / 1e9
}

/// A pingpong table row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingpongRow {
    pub bytes: u64,
    pub iterations: u64,
    pub t_min_us: f64,
    pub t_p50_us: f64,
    pub t_avg_us: f64,
    pub t_p99_us: f64,
    pub t_p999_us: f64,
    pub t_max_us: f64,
    pub mb_per_s: f64,
    pub mmsg_per_s: f64,
    /// Round trips timed per clock read (1: each one).
    pub batch: u64,
    /// The standard deviation of the half round trips: a spread larger
    /// than the median says the machine was busy or the cores moved.
    #[serde(default)]
    pub t_stddev_us: f64,
}

/// A streaming table row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamingRow {
    pub bytes: u64,
    pub iterations: u64,
    pub window: u64,
    pub bw_peak_mb_s: f64,
    pub bw_avg_mb_s: f64,
    pub mmsg_per_s: f64,
    pub usec_per_xfer: f64,
    pub busy_pct: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Pingpong(PingpongRow),
    Streaming(StreamingRow),
}

impl Row {
    /// The row as the JSON report's `results` hold it.
    pub fn to_value(&self) -> Value {
        match self {
            Row::Pingpong(r) => serde_json::to_value(r),
            Row::Streaming(r) => serde_json::to_value(r),
        }
        .expect("rows serialize")
    }

    /// A row of `app` from its JSON (as [`Row::to_value`] wrote it).
    pub fn from_json(app: App, json: &[u8]) -> Result<Row, serde_json::Error> {
        Ok(match app {
            App::Pingpong => Row::Pingpong(serde_json::from_slice(json)?),
            App::Streaming => Row::Streaming(serde_json::from_slice(json)?),
        })
    }
}

/// Rounds to 4 significant digits, for readable JSON that keeps small
/// rates (1 MiB messages are a few thousandths of a million per second).
fn r3(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// The row of one size from every flow's sample of it: latencies over all
/// flows' round trips, rates summed over flows.
pub fn aggregate(samples: &[Sample]) -> Row {
    match &samples[0] {
        Sample::Pingpong(first) => {
            let mut hist = first.hist.clone();
            let (mut iterations, mut total_ns, mut rate) = (0u64, 0u64, 0f64);
            for s in samples {
                let Sample::Pingpong(s) = s else { unreachable!("one app per run") };
                if !std::ptr::eq(s, first) {
                    hist.add(&s.hist).expect("histograms with the same bounds");
                }
                iterations += s.iterations;
                total_ns += s.total_ns;
                // Each flow's messages per second: one per timed leg.
                rate += (s.legs * s.iterations) as f64 / secs(s.total_ns);
            }
            let us = |ns: u64| r3(ns as f64 / 1e3);
            let avg_us = total_ns as f64 / 1e3 / (first.legs * iterations.max(1)) as f64;
            Row::Pingpong(PingpongRow {
                bytes: first.bytes,
                iterations,
                t_min_us: us(hist.min()),
                t_p50_us: us(hist.value_at_quantile(0.5)),
                t_avg_us: r3(avg_us),
                t_p99_us: us(hist.value_at_quantile(0.99)),
                t_p999_us: us(hist.value_at_quantile(0.999)),
                t_max_us: us(hist.max()),
                t_stddev_us: r3(hist.stdev() / 1e3),
                mb_per_s: r3(rate * first.bytes as f64 / 1e6),
                mmsg_per_s: r3(rate / 1e6),
                batch: samples
                    .iter()
                    .map(|s| match s {
                        Sample::Pingpong(s) => s.batch,
                        Sample::Streaming(_) => 1,
                    })
                    .max()
                    .unwrap_or(1),
            })
        }
        Sample::Streaming(first) => {
            let (mut iterations, mut bw, mut peak, mut msgs, mut busy) = (0, 0.0, 0.0, 0.0, 0.0);
            for s in samples {
                let Sample::Streaming(s) = s else { unreachable!("one app per run") };
                iterations += s.iterations;
                bw += s.bytes_per_s();
                peak += s.peak_bytes_per_s;
                msgs += s.msgs_per_s();
                busy += s.busy_pct;
            }
            Row::Streaming(StreamingRow {
                bytes: first.bytes,
                iterations,
                window: first.window,
                bw_peak_mb_s: r3(peak / 1e6),
                bw_avg_mb_s: r3(bw / 1e6),
                mmsg_per_s: r3(msgs / 1e6),
                usec_per_xfer: r3(1e6 / msgs.max(f64::MIN_POSITIVE)),
                busy_pct: r3(busy / samples.len() as f64),
            })
        }
    }
}

/// The warning for sizes whose round trips spread wider than their
/// median: on a quiet machine with pinned cores the deviation is a
/// fraction of it, so such a spread says the machine was busy or the cores
/// moved, and the averages and tails of those rows measure that.
pub fn spread_warning(rows: &[Row]) -> Option<String> {
    let wide: Vec<String> = rows
        .iter()
        .filter_map(|row| match row {
            Row::Pingpong(r) if r.t_stddev_us > r.t_p50_us => Some(format!(
                "{} B (stddev {:.2} µs, p50 {:.2} µs, max {:.2} µs)",
                r.bytes, r.t_stddev_us, r.t_p50_us, r.t_max_us
            )),
            _ => None,
        })
        .collect();
    (!wide.is_empty()).then(|| {
        format!(
            "warning: round trips spread wider than their median, so the machine was busy or \
             the cores moved during: {}; compare medians of several runs",
            wide.join(", ")
        )
    })
}

/// Gbit/s (10^9 bits per second) of `mb_s` MB/s, perftest's
/// `--report_gbits` unit.
pub fn gbit_s(mb_s: f64) -> f64 {
    r3(mb_s * 8.0 / 1e3)
}

/// The table's column header; `gbits`: bandwidth in Gbit/s rather than
/// MB/s (`--report_gbits`).
pub fn header(app: App, gbits: bool) -> String {
    let bw = |name: &str| if gbits { format!("{name}Gb/s") } else { format!("{name}MB/s") };
    match app {
        App::Pingpong => format!(
            "{:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>5}",
            "bytes",
            "iterations",
            "t_min",
            "t_p50",
            "t_avg",
            "t_p99",
            "t_p99.9",
            "t_max",
            bw(""),
            "Mmsg/s",
            "t_stddev",
            "batch"
        ),
        App::Streaming => format!(
            "{:>9} {:>10} {:>6} {:>10} {:>10} {:>8} {:>9} {:>6}",
            "bytes",
            "iterations",
            "window",
            bw("peak_"),
            bw("avg_"),
            "Mmsg/s",
            "us/xfer",
            "busy%"
        ),
    }
}

/// A table row, aligned under [`header`] with the same `gbits`.
pub fn format_row(row: &Row, gbits: bool) -> String {
    // MB/s with two decimals; Gbit/s, a thousandth of the figure, with four.
    let bw = |mb_s: f64| if gbits { format!("{:.4}", gbit_s(mb_s)) } else { format!("{mb_s:.2}") };
    match row {
        Row::Pingpong(r) => format!(
            "{:>9} {:>10} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10} {:>8.4} {:>9.2} {:>5}",
            r.bytes,
            r.iterations,
            r.t_min_us,
            r.t_p50_us,
            r.t_avg_us,
            r.t_p99_us,
            r.t_p999_us,
            r.t_max_us,
            bw(r.mb_per_s),
            r.mmsg_per_s,
            r.t_stddev_us,
            r.batch
        ),
        Row::Streaming(r) => format!(
            "{:>9} {:>10} {:>6} {:>10} {:>10} {:>8.4} {:>9.3} {:>6.1}",
            r.bytes,
            r.iterations,
            r.window,
            bw(r.bw_peak_mb_s),
            bw(r.bw_avg_mb_s),
            r.mmsg_per_s,
            r.usec_per_xfer,
            r.busy_pct
        ),
    }
}

/// Adds `counters` into `into`.
pub fn merge_counters(into: &mut BTreeMap<String, u64>, counters: Vec<(String, u64)>) {
    for (name, value) in counters {
        *into.entry(name).or_default() += value;
    }
}

/// Keys a pingpong result repeats under a second name, `(key, also)`: its
/// bandwidth under streaming's name, so that one name reads both apps, and
/// p99.9 under the table's column name. Canonical: `bw_avg_mb_s` (both
/// apps) and `t_p999_us` (units last, no dot to quote); `mb_per_s` and
/// `t_p99.9_us` stay for older readers and for readers of the table.
/// README.md's list of keys says the same.
pub const PINGPONG_ALSO: [(&str, &str); 2] =
    [("mb_per_s", "bw_avg_mb_s"), ("t_p999_us", "t_p99.9_us")];

/// Bandwidths a result also gives in Gbit/s, `(key in MB/s, key in
/// Gbit/s)`, each after the MB/s key it converts (or its alias).
pub const GBIT_KEYS: [(&str, &str); 2] =
    [("bw_avg_mb_s", "bw_avg_gbit_s"), ("bw_peak_mb_s", "bw_peak_gbit_s")];

/// `row` as the report's results hold it: each second name right after
/// the key it repeats, each Gbit/s figure after its MB/s one.
fn with_aliases(app: App, row: Value) -> Value {
    let Value::Object(fields) = row else { return row };
    let also: &[(&str, &str)] = match app {
        App::Pingpong => &PINGPONG_ALSO,
        App::Streaming => &[],
    };
    let mut out = Map::new();
    let add = |out: &mut Map<String, Value>, key: &str, value: Value| {
        if let Some((_, gbit)) = GBIT_KEYS.iter().find(|(mb, _)| *mb == key) {
            let gbits = gbit_s(value.as_f64().unwrap_or(0.0));
            out.insert(key.to_owned(), value);
            out.insert((*gbit).to_owned(), json!(gbits));
        } else {
            out.insert(key.to_owned(), value);
        }
    };
    for (key, value) in fields {
        let alias = also.iter().find(|(of, _)| *of == key).map(|(_, alias)| *alias);
        add(&mut out, &key, value.clone());
        if let Some(alias) = alias {
            add(&mut out, alias, value);
        }
    }
    Value::Object(out)
}

/// What `--json` writes.
#[derive(Debug)]
pub struct Report<'a> {
    pub app: App,
    pub device: &'a str,
    pub op: &'a str,
    pub lcores: String,
    /// Streaming: the window `-W` asked for (each result says the one it
    /// ran with, smaller where verifying capped it).
    pub window: Option<u64>,
    /// When, where, which build, the command line and the settings
    /// ([`super::meta`]).
    pub meta: Value,
    pub rows: &'a [Row],
    pub counters: &'a BTreeMap<String, u64>,
    /// The answering sides' (receivers', responders', targets') when they
    /// ran in this process; written only if any is non-zero.
    pub passive_counters: &'a BTreeMap<String, u64>,
}

impl Report<'_> {
    pub fn to_json(&self) -> Value {
        let results: Vec<Value> =
            self.rows.iter().map(|r| with_aliases(self.app, r.to_value())).collect();
        let map = |c: &BTreeMap<String, u64>| -> Map<String, Value> {
            c.iter().map(|(k, v)| (k.clone(), json!(v))).collect()
        };
        let mut report = json!({
            "app": self.app.name(),
            "device": self.device,
            "op": self.op,
            "lcores": self.lcores,
            "meta": self.meta,
            "results": results,
            "counters": map(self.counters),
        });
        if let Some(w) = self.window {
            report["window"] = json!(w);
        }
        if !self.passive_counters.is_empty() {
            report["passive_counters"] = Value::Object(map(self.passive_counters));
        }
        report
    }

    pub fn write(&self, path: &Path) -> io::Result<()> {
        let mut text = serde_json::to_string_pretty(&self.to_json()).map_err(io::Error::other)?;
        text.push('\n');
        std::fs::File::create(path)?.write_all(text.as_bytes())
    }

    /// The results as CSV: a header line of `app`, `device`, `op` and the
    /// results' keys (as the JSON names them), then a line per size.
    pub fn to_csv(&self) -> String {
        let results: Vec<Value> =
            self.rows.iter().map(|r| with_aliases(self.app, r.to_value())).collect();
        let keys: Vec<&str> = match results.first() {
            Some(Value::Object(first)) => first.keys().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        let mut out = String::from("app,device,op");
        for key in &keys {
            out.push(',');
            out.push_str(key);
        }
        out.push('\n');
        for result in &results {
            out.push_str(&format!("{},{},{}", self.app.name(), self.device, self.op));
            for key in &keys {
                out.push(',');
                out.push_str(&result[*key].to_string());
            }
            out.push('\n');
        }
        out
    }

    pub fn write_csv(&self, path: &Path) -> io::Result<()> {
        std::fs::File::create(path)?.write_all(self.to_csv().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pingpong(bytes: u64, half_rtts_ns: &[u64]) -> Sample {
        let mut hist = new_histogram();
        for &v in half_rtts_ns {
            hist.record(v).unwrap();
        }
        Sample::Pingpong(PingpongSample {
            bytes,
            iterations: half_rtts_ns.len() as u64,
            hist,
            total_ns: 2 * half_rtts_ns.iter().sum::<u64>(),
            batch: 1,
            legs: 2,
        })
    }

    #[test]
    fn a_pingpong_row_from_one_flow() {
        let Row::Pingpong(r) = aggregate(&[pingpong(64, &[1000, 2000, 3000, 2000])]) else {
            panic!()
        };
        assert_eq!((r.bytes, r.iterations), (64, 4));
        assert_eq!(r.t_min_us, 1.0);
        assert_eq!(r.t_p50_us, 2.0);
        assert_eq!(r.t_avg_us, 2.0);
        // The histogram keeps 3 significant digits: 3000 ns reads back as
        // the top of its bucket.
        assert_eq!(r.t_max_us, 3.001);
        assert_eq!(r.t_p99_us, 3.001);
        // 64 bytes per 2 µs half round trip: 32 MB/s, 0.5 Mmsg/s.
        assert_eq!(r.mb_per_s, 32.0);
        assert_eq!(r.mmsg_per_s, 0.5);
    }

    #[test]
    fn whole_round_trips_count_once() {
        let Sample::Pingpong(mut s) = pingpong(8, &[1000, 1000]) else { panic!() };
        // Two reads of 2 µs each, reported whole.
        s.legs = 1;
        let Row::Pingpong(r) = aggregate(&[Sample::Pingpong(s)]) else { panic!() };
        assert_eq!((r.t_avg_us, r.mmsg_per_s, r.mb_per_s), (2.0, 0.5, 4.0));
    }

    #[test]
    fn flows_merge_latencies_and_add_rates() {
        let one = pingpong(64, &[1000; 10]);
        let Row::Pingpong(r) = aggregate(&[one.clone(), one]) else { panic!() };
        assert_eq!(r.iterations, 20);
        assert_eq!(r.t_avg_us, 1.0);
        assert_eq!(r.mmsg_per_s, 2.0);
        assert_eq!(r.mb_per_s, 128.0);
    }

    #[test]
    fn a_streaming_row_and_its_sum_over_flows() {
        let s = Sample::Streaming(StreamingSample {
            bytes: 1000,
            iterations: 1000,
            window: 64,
            messages: 1000,
            elapsed_ns: 1_000_000,
            peak_bytes_per_s: 1.5e9,
            busy_pct: 80.0,
        });
        let Row::Streaming(r) = aggregate(std::slice::from_ref(&s)) else { panic!() };
        // 1000 x 1000 B in 1 ms: 1000 MB/s, 1 Mmsg/s, 1 µs per message.
        assert_eq!((r.bw_avg_mb_s, r.bw_peak_mb_s), (1000.0, 1500.0));
        assert_eq!((r.mmsg_per_s, r.usec_per_xfer, r.busy_pct), (1.0, 1.0, 80.0));
        let Row::Streaming(two) = aggregate(&[s.clone(), s]) else { panic!() };
        assert_eq!((two.bw_avg_mb_s, two.iterations, two.usec_per_xfer), (2000.0, 2000, 0.5));
        assert_eq!(two.busy_pct, 80.0);
    }

    #[test]
    fn a_spread_wider_than_the_median_is_warned_of() {
        // Steady round trips: no warning.
        let quiet = aggregate(&[pingpong(64, &[1000; 100])]);
        assert_eq!(spread_warning(std::slice::from_ref(&quiet)), None);
        // Mostly 1 µs, a few 2 ms stalls: the deviation dwarfs the median.
        let mut times = vec![1000u64; 990];
        times.extend([2_000_000; 10]);
        let noisy = aggregate(&[pingpong(4096, &times)]);
        let w = spread_warning(&[quiet, noisy]).expect("a warning");
        assert!(w.contains("4096 B (stddev") && !w.contains("64 B"), "{w}");
    }

    #[test]
    fn rows_line_up_under_the_header() {
        let row = aggregate(&[pingpong(1 << 20, &[123_456, 234_567])]);
        let line = format_row(&row, false);
        assert_eq!(line.len(), header(App::Pingpong, false).len());
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            [
                "1048576", "2", "123.50", "123.50", "179.00", "234.60", "234.60", "234.60",
                "5858.00", "0.0056", "55.54", "1"
            ]
        );
        // In Gbit/s, a thousandth of MB/s times 8, under its own header.
        let gbits = format_row(&row, true);
        assert_eq!(gbits.len(), header(App::Pingpong, true).len());
        assert_eq!(gbits.split_whitespace().nth(8), Some("46.8600"));
        assert!(header(App::Pingpong, true).contains(" Gb/s "));
        let s = Sample::Streaming(StreamingSample {
            bytes: 64,
            iterations: 10,
            window: 64,
            messages: 10,
            elapsed_ns: 10_000,
            peak_bytes_per_s: 64e6,
            busy_pct: 99.94,
        });
        let line = format_row(&aggregate(&[s]), false);
        assert_eq!(line.len(), header(App::Streaming, false).len());
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["64", "10", "64", "64.00", "64.00", "1.0000", "1.000", "99.9"]
        );
    }

    #[test]
    fn the_json_report_has_every_field() {
        let rows = [aggregate(&[pingpong(64, &[1000])])];
        let mut counters = BTreeMap::new();
        merge_counters(&mut counters, vec![("tx.EAGER_MSGRTM".into(), 2)]);
        merge_counters(&mut counters, vec![("tx.EAGER_MSGRTM".into(), 3)]);
        let report = Report {
            app: App::Pingpong,
            device: "sim",
            op: "send",
            lcores: "0".into(),
            window: None,
            meta: json!({"commit": "abc1234"}),
            rows: &rows,
            counters: &counters,
            passive_counters: &BTreeMap::new(),
        };
        let v = report.to_json();
        assert_eq!(v["meta"]["commit"], "abc1234");
        assert_eq!(v["app"], "pingpong");
        assert_eq!(v["counters"]["tx.EAGER_MSGRTM"], 5);
        assert!(v.get("passive_counters").is_none(), "only when the passive sides ran here");
        let passive = BTreeMap::from([("unexpected".to_owned(), 7)]);
        let v = Report { passive_counters: &passive, ..report }.to_json();
        assert_eq!(v["passive_counters"]["unexpected"], 7);
        let r = &v["results"][0];
        for key in [
            "bytes",
            "iterations",
            "t_min_us",
            "t_p50_us",
            "t_avg_us",
            "t_p99_us",
            "t_p999_us",
            "t_max_us",
            "t_stddev_us",
            "mb_per_s",
            "mmsg_per_s",
        ] {
            assert!(r[key].is_number(), "{key}");
        }
    }

    #[test]
    fn pingpong_results_repeat_two_keys_under_their_other_names() {
        let rows = [aggregate(&[pingpong(64, &[1000, 3000])])];
        let report = Report {
            app: App::Pingpong,
            device: "sim",
            op: "send",
            lcores: "0".into(),
            window: None,
            meta: json!({}),
            rows: &rows,
            counters: &BTreeMap::new(),
            passive_counters: &BTreeMap::new(),
        };
        let v = report.to_json();
        let r = v["results"][0].as_object().unwrap();
        let keys: Vec<&str> = r.keys().map(String::as_str).collect();
        for (key, also) in PINGPONG_ALSO {
            assert_eq!(r[key], r[also], "{key}");
            // Side by side, as a reader of the file looks for them.
            let at = keys.iter().position(|k| *k == key).unwrap();
            assert_eq!(keys[at + 1], also, "{keys:?}");
        }
        // The row on the control link keeps one name each: the peer's
        // parser takes it as it is.
        assert!(rows[0].to_value().get("bw_avg_mb_s").is_none());
        let s = Sample::Streaming(StreamingSample {
            bytes: 64,
            iterations: 10,
            window: 64,
            messages: 10,
            elapsed_ns: 10_000,
            peak_bytes_per_s: 64e6,
            busy_pct: 50.0,
        });
        let rows = [aggregate(&[s])];
        let v = Report { app: App::Streaming, rows: &rows, ..report }.to_json();
        // Streaming repeats nothing; both apps add Gbit/s after MB/s.
        let r = v["results"][0].as_object().unwrap();
        let keys: Vec<&str> = r.keys().map(String::as_str).collect();
        for (mb, gbit) in GBIT_KEYS {
            let at = keys.iter().position(|k| *k == mb).unwrap();
            assert_eq!(keys[at + 1], gbit, "{keys:?}");
            assert_eq!(r[gbit], json!(gbit_s(r[mb].as_f64().unwrap())));
        }
        let row = rows[0].to_value();
        assert_eq!(keys.len(), row.as_object().unwrap().len() + GBIT_KEYS.len());
        assert!(row.as_object().unwrap().iter().all(|(k, v)| r[k] == *v), "{r:?}");
    }
}
