//! A run's metrics against a baseline: each metric's change, its verdict,
//! the table, the exit status.
//!
//! What is gated: a metric present in both files regresses when it moves
//! the wrong way by more than its measure's threshold (percent of the
//! baseline), and improves when it moves the right way by as much. A
//! metric of the baseline that the run lacks is `missing` and fails the
//! gate, like a regression: a renamed or dropped bench must be taken out of
//! the baseline deliberately (`--update-baseline`), never pass silently. A
//! metric the baseline lacks is `new`: reported, not gated, until the
//! baseline is updated. Baseline benches outside the run's scope (its
//! `--filter`) are skipped.
//!
//! The verdict is also written for machines ([`Comparison::summary_json`])
//! and for a pull request's comment ([`Comparison::summary_md`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::bmf::Report;

/// Which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
}

/// Every measure the gate knows: its direction and default threshold (%).
pub const MEASURES: [(&str, Better, f64); 5] = [
    // Deterministic (callgrind), so a small change is real.
    ("instructions", Better::Lower, 2.0),
    // Wall clock, per operation: ns.
    ("latency", Better::Lower, 5.0),
    ("latency-p99", Better::Lower, 15.0),
    // Operations or messages per second.
    ("throughput", Better::Higher, 5.0),
    // Bytes per second.
    ("bandwidth", Better::Higher, 5.0),
];

fn direction(measure: &str) -> Option<Better> {
    MEASURES.iter().find(|(m, _, _)| *m == measure).map(|(_, b, _)| *b)
}

/// Thresholds in percent, by measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds(BTreeMap<String, f64>);

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds(MEASURES.iter().map(|(m, _, t)| (m.to_string(), *t)).collect())
    }
}

impl Thresholds {
    /// Applies an override `MEASURE=PERCENT`.
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let (measure, pct) =
            spec.split_once('=').ok_or_else(|| format!("`{spec}`: expected MEASURE=PERCENT"))?;
        if direction(measure).is_none() {
            return Err(format!("`{measure}`: not a measure; known: {}", measure_names()));
        }
        let pct: f64 = pct
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| format!("`{pct}`: expected a percentage, 0 or more"))?;
        self.0.insert(measure.to_string(), pct);
        Ok(())
    }

    pub fn get(&self, measure: &str) -> Option<f64> {
        self.0.get(measure).copied()
    }
}

fn measure_names() -> String {
    MEASURES.iter().map(|(m, _, _)| *m).collect::<Vec<_>>().join(", ")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the threshold.
    Ok,
    Improved,
    Regressed,
    /// In the baseline, not in the run: fails.
    Missing,
    /// In the run, not in the baseline: not gated.
    New,
}

impl Verdict {
    /// Every verdict, in the order the summaries list them: what fails the
    /// gate first, then what asks for a new baseline, then the rest.
    pub const BY_URGENCY: [Verdict; 5] =
        [Verdict::Regressed, Verdict::Missing, Verdict::Improved, Verdict::New, Verdict::Ok];

    /// The name in `--summary-json`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Improved => "improved",
            Verdict::Regressed => "regressed",
            Verdict::Missing => "missing",
            Verdict::New => "new",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Improved => "IMPROVED",
            Verdict::Regressed => "REGRESSED",
            Verdict::Missing => "MISSING",
            Verdict::New => "new",
        }
    }
}

/// One metric's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub bench: String,
    pub measure: String,
    pub baseline: Option<f64>,
    pub current: Option<f64>,
    /// Percent of the baseline, signed (positive: the value grew).
    pub change_pct: Option<f64>,
    pub threshold_pct: f64,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub rows: Vec<Row>,
    /// Baseline metrics outside the run's scope.
    pub skipped: usize,
}

/// A measure neither the baseline nor the run should carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{bench}: unknown measure `{measure}` (known: {known})")]
pub struct UnknownMeasure {
    pub bench: String,
    pub measure: String,
    known: String,
}

/// Compares `current` with `baseline`; baseline benches for which
/// `in_scope` is false are skipped.
pub fn compare(
    baseline: &Report,
    current: &Report,
    thresholds: &Thresholds,
    in_scope: impl Fn(&str) -> bool,
) -> Result<Comparison, UnknownMeasure> {
    let mut rows = Vec::new();
    let mut skipped = 0;
    let check = |bench: &str, measure: &str| {
        direction(measure).ok_or_else(|| UnknownMeasure {
            bench: bench.to_string(),
            measure: measure.to_string(),
            known: measure_names(),
        })
    };
    for (bench, measure, base) in baseline.iter() {
        let better = check(bench, measure)?;
        let threshold_pct = thresholds.get(measure).expect("every known measure has a threshold");
        let current = current.get(bench, measure).map(|m| m.value);
        if current.is_none() && !in_scope(bench) {
            skipped += 1;
            continue;
        }
        let (change_pct, verdict) = match current {
            None => (None, Verdict::Missing),
            Some(cur) => {
                let change = change_pct(base.value, cur);
                (Some(change), judge(change, better, threshold_pct))
            }
        };
        rows.push(Row {
            bench: bench.to_string(),
            measure: measure.to_string(),
            baseline: Some(base.value),
            current,
            change_pct,
            threshold_pct,
            verdict,
        });
    }
    for (bench, measure, cur) in current.iter() {
        check(bench, measure)?;
        if baseline.get(bench, measure).is_none() {
            rows.push(Row {
                bench: bench.to_string(),
                measure: measure.to_string(),
                baseline: None,
                current: Some(cur.value),
                change_pct: None,
                threshold_pct: thresholds.get(measure).expect("known measure"),
                verdict: Verdict::New,
            });
        }
    }
    rows.sort_by(|a, b| (&a.bench, &a.measure).cmp(&(&b.bench, &b.measure)));
    Ok(Comparison { rows, skipped })
}

fn change_pct(base: f64, cur: f64) -> f64 {
    if base == cur {
        0.0
    } else if base == 0.0 {
        // From nothing to something: beyond any threshold.
        f64::INFINITY.copysign(cur)
    } else {
        (cur - base) / base.abs() * 100.0
    }
}

fn judge(change_pct: f64, better: Better, threshold_pct: f64) -> Verdict {
    let worse_by = match better {
        Better::Lower => change_pct,
        Better::Higher => -change_pct,
    };
    if worse_by > threshold_pct {
        Verdict::Regressed
    } else if -worse_by > threshold_pct {
        Verdict::Improved
    } else {
        Verdict::Ok
    }
}

/// Exit status of a gate whose comparison failed.
pub const EXIT_REGRESSION: u8 = 3;

impl Comparison {
    pub fn count(&self, verdict: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == verdict).count()
    }

    /// Whether any metric regressed or went missing.
    pub fn failed(&self) -> bool {
        self.count(Verdict::Regressed) + self.count(Verdict::Missing) > 0
    }

    pub fn exit_code(&self) -> u8 {
        if self.failed() { EXIT_REGRESSION } else { 0 }
    }

    /// The table: bench, measure, baseline, current, change, threshold,
    /// verdict.
    pub fn table(&self) -> String {
        let header = ["bench", "measure", "baseline", "current", "change", "threshold", "verdict"];
        let cells: Vec<[String; 7]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.bench.clone(),
                    r.measure.clone(),
                    r.baseline.map_or("-".into(), human),
                    r.current.map_or("-".into(), human),
                    r.change_pct.map_or("-".into(), |c| format!("{c:+.2}%")),
                    format!("{}%", r.threshold_pct),
                    r.verdict.label().to_string(),
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for row in &cells {
            for (w, c) in width.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, row: &[&str]| {
            for (i, (c, w)) in row.iter().zip(width).enumerate() {
                // Names left-aligned, numbers right-aligned.
                if i < 2 || i == 6 {
                    let _ = write!(out, "{c:<w$}");
                } else {
                    let _ = write!(out, "{c:>w$}");
                }
                out.push_str(if i + 1 < row.len() { "  " } else { "\n" });
            }
        };
        line(&mut out, &header);
        for row in &cells {
            line(&mut out, &row.each_ref().map(String::as_str));
        }
        out
    }

    /// What happened, in a few lines: the verdict first, then what
    /// improved, regressed, went missing or is new.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let list = |out: &mut String, verdict: Verdict, title: &str| {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.verdict == verdict).collect();
            if rows.is_empty() {
                return;
            }
            let _ = writeln!(out, "{title} ({}):", rows.len());
            for r in rows {
                let change = r.change_pct.map_or(String::new(), |c| format!(" {c:+.2}%"));
                let _ = writeln!(out, "  {} {}{change}", r.bench, r.measure);
            }
        };
        list(&mut out, Verdict::Regressed, "regressed beyond threshold");
        list(&mut out, Verdict::Missing, "in the baseline but not measured (renamed or dropped?)");
        list(&mut out, Verdict::Improved, "improved beyond threshold: consider --update-baseline");
        list(&mut out, Verdict::New, "new, not gated until the baseline has them");
        if self.skipped > 0 {
            let _ = writeln!(out, "{} baseline metrics outside --filter skipped", self.skipped);
        }
        let _ = writeln!(out, "{}", self.verdict_line());
        out
    }

    /// `PASS: 3 metrics, 0 regressed, 0 missing, 1 improved, 0 new`.
    pub fn verdict_line(&self) -> String {
        format!(
            "{}: {} metrics, {} regressed, {} missing, {} improved, {} new",
            if self.failed() { "FAIL" } else { "PASS" },
            self.rows.len(),
            self.count(Verdict::Regressed),
            self.count(Verdict::Missing),
            self.count(Verdict::Improved),
            self.count(Verdict::New),
        )
    }

    /// The verdict as JSON (`--summary-json`): pass or fail, the count of
    /// each status, and every metric in name order. Values are in the
    /// measure's unit; a change is `null` where a side is missing or the
    /// baseline is 0 (JSON has no infinity).
    pub fn summary_json(&self) -> String {
        #[derive(Serialize)]
        struct Counts {
            metrics: usize,
            regressed: usize,
            missing: usize,
            improved: usize,
            new: usize,
            ok: usize,
            skipped: usize,
        }
        #[derive(Serialize)]
        struct MetricJson<'a> {
            bench: &'a str,
            measure: &'a str,
            better: &'static str,
            baseline: Option<f64>,
            current: Option<f64>,
            change_pct: Option<f64>,
            threshold_pct: f64,
            status: &'static str,
        }
        #[derive(Serialize)]
        struct Summary<'a> {
            verdict: &'static str,
            counts: Counts,
            metrics: Vec<MetricJson<'a>>,
        }
        let summary = Summary {
            verdict: if self.failed() { "fail" } else { "pass" },
            counts: Counts {
                metrics: self.rows.len(),
                regressed: self.count(Verdict::Regressed),
                missing: self.count(Verdict::Missing),
                improved: self.count(Verdict::Improved),
                new: self.count(Verdict::New),
                ok: self.count(Verdict::Ok),
                skipped: self.skipped,
            },
            metrics: self
                .rows
                .iter()
                .map(|r| MetricJson {
                    bench: &r.bench,
                    measure: &r.measure,
                    better: match direction(&r.measure) {
                        Some(Better::Higher) => "higher",
                        _ => "lower",
                    },
                    baseline: r.baseline,
                    current: r.current,
                    change_pct: r.change_pct.filter(|c| c.is_finite()),
                    threshold_pct: r.threshold_pct,
                    status: r.verdict.name(),
                })
                .collect(),
        };
        let mut text = serde_json::to_string_pretty(&summary).expect("a summary serializes");
        text.push('\n');
        text
    }

    /// The verdict as markdown for a pull request's comment
    /// (`--summary-md`): the verdict line, then one table of every metric,
    /// what fails the gate first ([`Verdict::BY_URGENCY`]).
    pub fn summary_md(&self) -> String {
        let mut out = String::new();
        // `**FAIL**: 4 metrics, ...`
        let _ = writeln!(out, "**{}", self.verdict_line().replacen(':', "**:", 1));
        let _ = writeln!(out);
        if self.rows.is_empty() {
            let _ = writeln!(out, "No metrics compared.");
        } else {
            let _ = writeln!(
                out,
                "| bench | measure | baseline | current | change | threshold | status |"
            );
            let _ = writeln!(out, "|---|---|--:|--:|--:|--:|---|");
            for verdict in Verdict::BY_URGENCY {
                for r in self.rows.iter().filter(|r| r.verdict == verdict) {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {} | {} | {}% | {} |",
                        md_code(&r.bench),
                        md_code(&r.measure),
                        r.baseline.map_or("-".into(), human),
                        r.current.map_or("-".into(), human),
                        r.change_pct.map_or("-".into(), |c| format!("{c:+.2}%")),
                        r.threshold_pct,
                        r.verdict.label(),
                    );
                }
            }
        }
        if self.skipped > 0 {
            let _ = writeln!(out);
            let _ = writeln!(out, "{} baseline metrics outside --filter skipped.", self.skipped);
        }
        out
    }
}

/// `text` as a markdown code span inside a table cell: a `|` would end the
/// cell, so it is escaped (GitHub honours `\|` even in code), and a
/// backtick would end the span, so it becomes `'`.
pub(super) fn md_code(text: &str) -> String {
    format!("`{}`", text.replace('`', "'").replace('|', "\\|"))
}

/// A value with an SI suffix and four significant digits, for the table.
pub fn human(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = match a {
        _ if a >= 1e12 => (v / 1e12, "T"),
        _ if a >= 1e9 => (v / 1e9, "G"),
        _ if a >= 1e6 => (v / 1e6, "M"),
        _ if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let digits = if scaled.abs() >= 100.0 {
        1
    } else if scaled.abs() >= 10.0 {
        2
    } else {
        3
    };
    format!("{scaled:.digits$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::super::bmf::Metric;
    use super::*;

    fn report(entries: &[(&str, &str, f64)]) -> Report {
        let mut r = Report::default();
        for &(bench, measure, value) in entries {
            r.insert(bench, measure, Metric { value, lower_value: None, upper_value: None });
        }
        r
    }

    fn verdict(base: &[(&str, &str, f64)], cur: &[(&str, &str, f64)]) -> Vec<Verdict> {
        let c = compare(&report(base), &report(cur), &Thresholds::default(), |_| true).unwrap();
        c.rows.iter().map(|r| r.verdict).collect()
    }

    #[test]
    fn instructions_regress_above_two_percent_and_improve_below_minus_two() {
        let base = [("b", "instructions", 1000.0)];
        assert_eq!(verdict(&base, &[("b", "instructions", 1020.0)]), [Verdict::Ok]);
        assert_eq!(verdict(&base, &[("b", "instructions", 1020.5)]), [Verdict::Regressed]);
        assert_eq!(verdict(&base, &[("b", "instructions", 980.0)]), [Verdict::Ok]);
        assert_eq!(verdict(&base, &[("b", "instructions", 979.0)]), [Verdict::Improved]);
        assert_eq!(verdict(&base, &[("b", "instructions", 1000.0)]), [Verdict::Ok]);
    }

    #[test]
    fn rates_regress_when_they_fall() {
        let base = [("b", "throughput", 100e6), ("b", "bandwidth", 10e9)];
        let cur = [("b", "throughput", 94e6), ("b", "bandwidth", 10.6e9)];
        // Rows in name order: bandwidth, throughput.
        assert_eq!(verdict(&base, &cur), [Verdict::Improved, Verdict::Regressed]);
        let cur = [("b", "throughput", 96e6), ("b", "bandwidth", 9.6e9)];
        assert_eq!(verdict(&base, &cur), [Verdict::Ok, Verdict::Ok]);
    }

    #[test]
    fn p50_and_p99_latency_have_their_own_thresholds() {
        let base = [("b", "latency", 1000.0), ("b", "latency-p99", 1000.0)];
        let cur = [("b", "latency", 1060.0), ("b", "latency-p99", 1140.0)];
        assert_eq!(verdict(&base, &cur), [Verdict::Regressed, Verdict::Ok]);
        let cur = [("b", "latency", 1040.0), ("b", "latency-p99", 1160.0)];
        assert_eq!(verdict(&base, &cur), [Verdict::Ok, Verdict::Regressed]);
        let cur = [("b", "latency", 900.0), ("b", "latency-p99", 800.0)];
        assert_eq!(verdict(&base, &cur), [Verdict::Improved, Verdict::Improved]);
    }

    #[test]
    fn overridden_thresholds_apply_to_their_measure_only() {
        let mut t = Thresholds::default();
        t.set("instructions=10").unwrap();
        let base = report(&[("b", "instructions", 100.0), ("b", "latency", 100.0)]);
        let cur = report(&[("b", "instructions", 108.0), ("b", "latency", 108.0)]);
        let c = compare(&base, &cur, &t, |_| true).unwrap();
        let got: Vec<_> = c.rows.iter().map(|r| (r.threshold_pct, r.verdict)).collect();
        assert_eq!(got, [(10.0, Verdict::Ok), (5.0, Verdict::Regressed)]);
        assert_eq!(c.exit_code(), EXIT_REGRESSION);
        for bad in ["instructions", "latency=fast", "speed=5", "latency=-1", "latency=inf"] {
            assert!(t.set(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_metric_fails_and_a_new_one_does_not() {
        // A rename: the old name is missing, the new one is new.
        let c = compare(
            &report(&[("old/name", "instructions", 10.0), ("kept", "instructions", 5.0)]),
            &report(&[("new/name", "instructions", 10.0), ("kept", "instructions", 5.0)]),
            &Thresholds::default(),
            |_| true,
        )
        .unwrap();
        let got: Vec<_> = c.rows.iter().map(|r| (r.bench.as_str(), r.verdict)).collect();
        assert_eq!(
            got,
            [("kept", Verdict::Ok), ("new/name", Verdict::New), ("old/name", Verdict::Missing)]
        );
        assert!(c.failed());
        assert_eq!(c.exit_code(), 3);
        assert!(c.summary().contains("renamed or dropped"), "{}", c.summary());
        // Only new metrics: passes.
        let c = compare(
            &report(&[("kept", "instructions", 5.0)]),
            &report(&[("kept", "instructions", 5.0), ("more", "latency", 1.0)]),
            &Thresholds::default(),
            |_| true,
        )
        .unwrap();
        assert_eq!((c.count(Verdict::New), c.exit_code()), (1, 0));
    }

    #[test]
    fn a_missing_measure_of_a_present_bench_fails() {
        let base = [("b", "latency", 1.0), ("b", "latency-p99", 2.0)];
        assert_eq!(verdict(&base, &[("b", "latency", 1.0)]), [Verdict::Ok, Verdict::Missing]);
    }

    #[test]
    fn benches_outside_the_filter_are_skipped_not_missing() {
        let base = report(&[("codec/a", "instructions", 1.0), ("sim/b", "instructions", 1.0)]);
        let cur = report(&[("codec/a", "instructions", 1.0)]);
        let c = compare(&base, &cur, &Thresholds::default(), |b| b.contains("codec/")).unwrap();
        assert_eq!((c.rows.len(), c.skipped, c.exit_code()), (1, 1, 0));
    }

    #[test]
    fn an_unknown_measure_is_an_error() {
        let base = report(&[("b", "speed", 1.0)]);
        let e = compare(&base, &base, &Thresholds::default(), |_| true).unwrap_err();
        assert_eq!(e.measure, "speed");
    }

    #[test]
    fn from_zero_is_an_infinite_change() {
        let base = [("b", "instructions", 0.0)];
        assert_eq!(verdict(&base, &[("b", "instructions", 0.0)]), [Verdict::Ok]);
        assert_eq!(verdict(&base, &[("b", "instructions", 1.0)]), [Verdict::Regressed]);
    }

    #[test]
    fn the_table_shows_each_change_and_verdict() {
        let c = compare(
            &report(&[("sim/pingpong_64B", "instructions", 2000.0), ("x", "bandwidth", 1e9)]),
            &report(&[("sim/pingpong_64B", "instructions", 2100.0), ("x", "bandwidth", 1.1e9)]),
            &Thresholds::default(),
            |_| true,
        )
        .unwrap();
        let table = c.table();
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(
            lines,
            [
                vec!["bench", "measure", "baseline", "current", "change", "threshold", "verdict"],
                vec![
                    "sim/pingpong_64B",
                    "instructions",
                    "2000.0",
                    "2100.0",
                    "+5.00%",
                    "2%",
                    "REGRESSED"
                ],
                vec!["x", "bandwidth", "1.000G", "1.100G", "+10.00%", "5%", "IMPROVED"],
            ]
        );
        let summary = c.summary();
        assert!(summary.contains("improved beyond threshold"), "{summary}");
        assert!(summary.ends_with("FAIL: 2 metrics, 1 regressed, 0 missing, 1 improved, 0 new\n"));
    }

    #[test]
    fn the_markdown_summary_has_the_verdict_on_top_and_regressions_first() {
        let c = compare(
            &report(&[
                ("a", "instructions", 100.0),
                ("b|c", "latency", 1e3),
                ("z", "bandwidth", 1e9),
            ]),
            &report(&[
                ("a", "instructions", 100.0),
                ("b|c", "latency", 1.1e3),
                ("z", "bandwidth", 2e9),
            ]),
            &Thresholds::default(),
            |_| true,
        )
        .unwrap();
        let md = c.summary_md();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "**FAIL**: 3 metrics, 1 regressed, 0 missing, 1 improved, 0 new");
        assert_eq!(
            lines[2],
            "| bench | measure | baseline | current | change | threshold | status |"
        );
        assert_eq!(
            lines[4..],
            [
                "| `b\\|c` | `latency` | 1000.0 | 1100.0 | +10.00% | 5% | REGRESSED |",
                "| `z` | `bandwidth` | 1.000G | 2.000G | +100.00% | 5% | IMPROVED |",
                "| `a` | `instructions` | 100.0 | 100.0 | +0.00% | 2% | ok |",
            ]
        );
        let empty =
            compare(&Report::default(), &Report::default(), &Thresholds::default(), |_| true)
                .unwrap();
        assert!(empty.summary_md().starts_with("**PASS**: 0 metrics"), "{}", empty.summary_md());
    }

    #[test]
    fn the_json_summary_counts_each_status_and_has_no_infinity() {
        let c = compare(
            &report(&[("a", "instructions", 0.0), ("b", "latency", 5.0), ("gone", "latency", 1.0)]),
            &report(&[("a", "instructions", 7.0), ("b", "latency", 5.0)]),
            &Thresholds::default(),
            |_| true,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&c.summary_json()).unwrap();
        assert_eq!(v["verdict"], "fail");
        let counts = &v["counts"];
        assert_eq!(
            (&counts["regressed"], &counts["missing"], &counts["ok"]),
            (&1.into(), &1.into(), &1.into())
        );
        let a = &v["metrics"][0];
        // From 0 the change is infinite: null, as JSON has no infinity.
        assert_eq!(
            (&a["bench"], &a["status"], &a["change_pct"]),
            (&"a".into(), &"regressed".into(), &serde_json::Value::Null)
        );
        assert_eq!(v["metrics"][2]["current"], serde_json::Value::Null, "missing");
    }

    #[test]
    fn human_values() {
        assert_eq!(human(41.25), "41.25");
        assert_eq!(human(5.0), "5.000");
        assert_eq!(human(2000.0), "2000.0");
        assert_eq!(human(12_345.0), "12.35k");
        assert_eq!(human(3.2e9), "3.200G");
    }
}
