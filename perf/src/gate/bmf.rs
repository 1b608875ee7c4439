//! Bencher Metric Format, the JSON that Bencher and similar dashboards
//! read: `{"bench": {"measure": {"value": v, "lower_value": l,
//! "upper_value": u}}}`. Results and baselines are both files of this
//! format.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One measurement: a median, with the smallest and largest sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    pub value: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_value: Option<f64>,
}

impl Metric {
    /// The median of `samples`, bounded by the smallest and the largest.
    /// Panics on an empty slice.
    pub fn from_samples(samples: &[f64]) -> Metric {
        assert!(!samples.is_empty(), "a metric needs a sample");
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let value = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Metric { value, lower_value: Some(s[0]), upper_value: Some(s[n - 1]) }
    }
}

/// Metrics by bench name, then by measure name, in name order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Report(pub BTreeMap<String, BTreeMap<String, Metric>>);

/// Why a file is not a usable report.
#[derive(Debug, thiserror::Error)]
pub enum BmfError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not Bencher Metric Format JSON: {source}")]
    Json { path: String, source: serde_json::Error },
}

impl Report {
    pub fn insert(&mut self, bench: &str, measure: &str, metric: Metric) {
        self.0.entry(bench.to_string()).or_default().insert(measure.to_string(), metric);
    }

    pub fn get(&self, bench: &str, measure: &str) -> Option<&Metric> {
        self.0.get(bench)?.get(measure)
    }

    /// Every `(bench, measure, metric)`, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &Metric)> {
        self.0.iter().flat_map(|(b, ms)| ms.iter().map(move |(m, v)| (b.as_str(), m.as_str(), v)))
    }

    pub fn len(&self) -> usize {
        self.0.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parses a report; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Report, BmfError> {
        // JSON has no NaN or infinity (serde_json refuses 1e400), so every
        // value that parses is finite.
        serde_json::from_str(text)
            .map_err(|source| BmfError::Json { path: origin.to_string(), source })
    }

    pub fn read(path: &Path) -> Result<Report, BmfError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| BmfError::Io { path: origin.clone(), source })?;
        Report::parse(&text, &origin)
    }

    /// Pretty JSON with a final newline, so that baselines diff well.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a report serializes");
        text.push('\n');
        text
    }

    pub fn write(&self, path: &Path) -> Result<(), BmfError> {
        let io = |source| BmfError::Io { path: path.display().to_string(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, self.to_json()).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bencher_metric_format() {
        let text = r#"{
            "sim/pingpong_64B": {
                "latency": {"value": 310.5, "lower_value": 300.0, "upper_value": 330.25},
                "instructions": {"value": 2048}
            },
            "codec/parse/CTS": {"instructions": {"value": 40.5}}
        }"#;
        let r = Report::parse(text, "t").unwrap();
        assert_eq!(r.len(), 3);
        let lat = r.get("sim/pingpong_64B", "latency").unwrap();
        assert_eq!(
            (lat.value, lat.lower_value, lat.upper_value),
            (310.5, Some(300.0), Some(330.25))
        );
        let ins = r.get("sim/pingpong_64B", "instructions").unwrap();
        assert_eq!((ins.value, ins.lower_value), (2048.0, None));
        // Name order, whatever the file's order.
        let names: Vec<_> = r.iter().map(|(b, m, _)| format!("{b} {m}")).collect();
        assert_eq!(
            names,
            [
                "codec/parse/CTS instructions",
                "sim/pingpong_64B instructions",
                "sim/pingpong_64B latency"
            ]
        );
    }

    #[test]
    fn round_trips_through_its_json() {
        let mut r = Report::default();
        r.insert("a/b", "throughput", Metric::from_samples(&[3.0, 1.0, 2.0]));
        r.insert(
            "a/b",
            "instructions",
            Metric { value: 7.25, lower_value: None, upper_value: None },
        );
        let text = r.to_json();
        assert!(!text.contains("lower_value\": null"), "absent bounds are left out: {text}");
        assert_eq!(Report::parse(&text, "t").unwrap(), r);
    }

    #[test]
    fn rejects_what_is_not_a_report() {
        for bad in [
            "[]",
            r#"{"a": {"latency": 5}}"#,
            r#"{"a": {"latency": {"lower_value": 1}}}"#,
            r#"{"a": {"latency": {"value": "fast"}}}"#,
            r#"{"a": {"latency": {"value": 1, "units": "ns"}}}"#,
            "{",
            r#"{"a": {"latency": {"value": 1e400}}}"#,
        ] {
            assert!(matches!(Report::parse(bad, "t"), Err(BmfError::Json { .. })), "{bad}");
        }
    }

    #[test]
    fn the_median_of_odd_and_even_counts() {
        let m = Metric::from_samples(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((m.value, m.lower_value, m.upper_value), (3.0, Some(1.0), Some(5.0)));
        assert_eq!(Metric::from_samples(&[4.0, 1.0, 2.0, 3.0]).value, 2.5);
        assert_eq!(Metric::from_samples(&[9.0]).value, 9.0);
    }
}
