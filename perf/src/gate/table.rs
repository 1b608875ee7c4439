//! The committed baseline as a markdown table, and perf/README.md's copy
//! of it: the README's figures table is this table, between two marker
//! lines, so that it says what the baseline says (`efapoll-perf
//! baseline-table --write perf/README.md`, and every `--update-baseline`
//! of the default baseline, rewrite it; a test fails when they differ).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::bmf::Report;
use super::compare::{MEASURES, md_code};

/// The line before the generated table.
pub const BEGIN: &str = "<!-- baseline-table:begin -->";
/// The line after it.
pub const END: &str = "<!-- baseline-table:end -->";

/// perf/README.md, where the generated table goes.
pub fn readme() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")
}

/// Why the README's table cannot be rewritten.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpliceError {
    #[error("no `{BEGIN}` line followed by an `{END}` line")]
    NoMarkers,
    #[error("more than one `{BEGIN}` line")]
    TwoTables,
}

/// A column's head: the measure and its unit.
fn head(measure: &str) -> String {
    match measure {
        "instructions" => "instructions / op".into(),
        "latency" => "latency (ns)".into(),
        "latency-p99" => "latency p99 (ns)".into(),
        "throughput" => "operations / s".into(),
        "bandwidth" => "bytes / s".into(),
        other => other.into(),
    }
}

/// `v` with one decimal and its thousands grouped: 1,053,439.1.
fn grouped(v: f64) -> String {
    let text = format!("{:.1}", v.abs());
    let (int, frac) = text.split_once('.').expect("one decimal");
    let mut out = String::from(if v < 0.0 { "-" } else { "" });
    for (i, digit) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    format!("{out}.{frac}")
}

/// The table of `report`: a row per bench in name order, a column per
/// measure it has (in the gate's order), each value with one decimal.
pub fn markdown(report: &Report) -> String {
    let known = MEASURES.iter().map(|(m, _, _)| *m);
    let mut measures: Vec<&str> =
        known.filter(|m| report.0.values().any(|ms| ms.contains_key(*m))).collect();
    for (_, measure, _) in report.iter() {
        if !measures.contains(&measure) {
            measures.push(measure);
        }
    }
    let mut out = String::from("| workload |");
    for m in &measures {
        let _ = write!(out, " {} |", head(m));
    }
    out.push_str("\n|---|");
    out.push_str(&"--:|".repeat(measures.len()));
    out.push('\n');
    for (bench, metrics) in &report.0 {
        let _ = write!(out, "| {} |", md_code(bench));
        for m in &measures {
            let value = metrics.get(*m).map_or("-".into(), |metric| grouped(metric.value));
            let _ = write!(out, " {value} |");
        }
        out.push('\n');
    }
    out
}

/// `text` with the lines between its markers replaced by `table`; all
/// else, the markers included, as it was.
pub fn splice(text: &str, table: &str) -> Result<String, SpliceError> {
    let line_at = |marker: &str, from: usize| {
        text[from..].match_indices(marker).map(|(i, _)| from + i).find(|&i| {
            let starts = i == 0 || text.as_bytes()[i - 1] == b'\n';
            let rest = &text[i + marker.len()..];
            starts && (rest.is_empty() || rest.starts_with('\n'))
        })
    };
    let begin = line_at(BEGIN, 0).ok_or(SpliceError::NoMarkers)?;
    let after_begin = begin + BEGIN.len() + 1;
    let end = line_at(END, after_begin.min(text.len())).ok_or(SpliceError::NoMarkers)?;
    if line_at(BEGIN, after_begin).is_some() {
        return Err(SpliceError::TwoTables);
    }
    Ok(format!("{}{table}{}", &text[..after_begin], &text[end..]))
}

/// Why a README's table was not written.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Markers { path: PathBuf, source: SpliceError },
}

/// Rewrites the table in the file at `readme` from `report`; whether it
/// changed.
pub fn write_into(readme: &Path, report: &Report) -> Result<bool, TableError> {
    let io = |source| TableError::Io { path: readme.to_owned(), source };
    let text = std::fs::read_to_string(readme).map_err(io)?;
    let new = splice(&text, &markdown(report))
        .map_err(|source| TableError::Markers { path: readme.to_owned(), source })?;
    if new == text {
        return Ok(false);
    }
    std::fs::write(readme, new).map_err(io)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::bmf::Metric;
    use super::*;

    fn metric(value: f64) -> Metric {
        Metric { value, lower_value: None, upper_value: None }
    }

    #[test]
    fn values_have_one_decimal_and_grouped_thousands() {
        assert_eq!(grouped(169.0), "169.0");
        assert_eq!(grouped(2357.6), "2,357.6");
        assert_eq!(grouped(1_053_439.14), "1,053,439.1");
        assert_eq!(grouped(999.96), "1,000.0");
        assert_eq!(grouped(0.04), "0.0");
        assert_eq!(grouped(-12_345.0), "-12,345.0");
    }

    #[test]
    fn the_table_has_a_row_per_bench_and_a_column_per_measure() {
        let mut r = Report::default();
        r.insert("sim/pingpong_64B", "instructions", metric(2357.6));
        r.insert("codec/parse/CTS", "instructions", metric(169.0));
        assert_eq!(
            markdown(&r),
            "| workload | instructions / op |\n\
             |---|--:|\n\
             | `codec/parse/CTS` | 169.0 |\n\
             | `sim/pingpong_64B` | 2,357.6 |\n"
        );
        r.insert("sim/pingpong_64B", "latency", metric(280.0));
        r.insert("shm/ring", "odd", metric(1.0));
        let table = markdown(&r);
        assert!(table.starts_with("| workload | instructions / op | latency (ns) | odd |\n"));
        assert!(table.contains("| `codec/parse/CTS` | 169.0 | - | - |\n"), "{table}");
    }

    #[test]
    fn splicing_replaces_only_what_is_between_the_markers() {
        let text = format!("# t\n\nbefore\n{BEGIN}\n| old |\n|---|\n{END}\nafter\n");
        let new = splice(&text, "| new |\n").unwrap();
        assert_eq!(new, format!("# t\n\nbefore\n{BEGIN}\n| new |\n{END}\nafter\n"));
        assert_eq!(splice(&new, "| new |\n").unwrap(), new, "the same table changes nothing");
        let empty = format!("{BEGIN}\n{END}");
        assert_eq!(splice(&empty, "| t |\n").unwrap(), format!("{BEGIN}\n| t |\n{END}"));
    }

    #[test]
    fn markers_must_be_whole_lines_in_order_and_once() {
        for bad in [
            "no markers\n".to_owned(),
            format!("{END}\n{BEGIN}\n"),
            format!("{BEGIN}\n"),
            format!("a {BEGIN}\n{END}\n"),
            format!("`{BEGIN}` quoted\n{END}\n"),
        ] {
            assert_eq!(splice(&bad, "x\n"), Err(SpliceError::NoMarkers), "{bad}");
        }
        let two = format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n");
        assert_eq!(splice(&two, "x\n"), Err(SpliceError::TwoTables));
    }

    /// The README's figures table is the committed baseline's: a baseline
    /// updated without it (or an edit by hand) fails here.
    #[test]
    fn the_readme_table_is_the_committed_baseline() {
        let baseline = Path::new(super::super::BASELINES).join("instructions.json");
        let report = Report::read(&baseline).unwrap();
        let text = std::fs::read_to_string(readme()).unwrap();
        let expected = splice(&text, &markdown(&report)).unwrap();
        assert!(
            text == expected,
            "perf/README.md's table differs from {}: run `efapoll-perf baseline-table --write \
             perf/README.md` (scripts/perf-gate.sh --update-baseline does it too)",
            baseline.display()
        );
    }
}
