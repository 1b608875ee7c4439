//! `efapoll-perf`: list and run the benchmark workloads, and the regression
//! gate (scripts/perf-gate.sh runs it). See perf/README.md.
#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use efapoll_perf::gate::bmf::Report;
use efapoll_perf::gate::{self, GateArgs, GateError, SummaryFiles, table};
use efapoll_perf::workloads::{self, Unit};

const EXIT_STATUS: &str = "\
Exit status:
  0  pass (or baseline written)
  1  error: a tool or a measured program failed, no baseline, unreadable file
  2  bad arguments
  3  a metric regressed beyond its threshold, or a baseline metric is missing";

#[derive(Debug, Parser)]
#[command(name = "efapoll-perf", version, about = "efapoll's benchmark suite and regression gate", after_help = EXIT_STATUS)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The workloads: name, kind, unit, operations per wall-clock sample,
    /// whether in the small suite.
    List {
        /// Only the small suite.
        #[arg(long)]
        small: bool,
    },
    /// Set up one workload and run ITERS operations (what the gate runs
    /// under callgrind; also a target for perf and other profilers).
    Exec { name: String, iters: u64 },
    /// Measure a suite, compare with the baseline, fail on a regression.
    #[command(after_help = EXIT_STATUS)]
    Gate(Box<GateArgs>),
    /// Compare two result files (Bencher Metric Format) as the gate does.
    #[command(after_help = EXIT_STATUS)]
    Compare {
        baseline: PathBuf,
        current: PathBuf,
        /// Overrides a measure's threshold in percent. Repeatable.
        #[arg(long = "threshold", value_name = "MEASURE=PERCENT")]
        thresholds: Vec<String>,
        #[command(flatten)]
        summary: SummaryFiles,
    },
    /// Print a baseline as a markdown table (a row per workload, a column
    /// per measure), or write it into a README between the lines
    /// `<!-- baseline-table:begin -->` and `<!-- baseline-table:end -->`.
    BaselineTable {
        /// The baseline [default: perf/baselines/instructions.json].
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Rewrite the table in FILE (perf/README.md's is the default
        /// baseline's) instead of printing it.
        #[arg(long, value_name = "FILE")]
        write: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List { small } => {
            let mut out = String::new();
            for w in workloads::all().iter().filter(|w| !small || w.small) {
                let unit = match w.unit {
                    Unit::Ops => "ops".to_string(),
                    Unit::Bytes(n) => format!("{n}B"),
                };
                let suite = if w.small { "small" } else { "" };
                let kind = format!("{:?}", w.kind);
                let _ = writeln!(out, "{:<40} {kind:<8} {unit:>9} {:>9} {suite}", w.name, w.iters);
            }
            match io::stdout().lock().write_all(out.as_bytes()) {
                // A reader that stopped early (`| head`) is not an error.
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                    Err(GateError::Tool(format!("stdout: {e}")))
                }
                _ => Ok(0),
            }
        }
        Command::Exec { name, iters } => match workloads::find(&name) {
            Some(w) => {
                w.setup().run(iters);
                Ok(0)
            }
            None => {
                Err(GateError::Usage(format!("no workload `{name}` (see `efapoll-perf list`)")))
            }
        },
        Command::Gate(args) => gate::run(&args),
        Command::Compare { baseline, current, thresholds, summary } => {
            gate::compare_files(&baseline, &current, &thresholds, &summary)
        }
        Command::BaselineTable { baseline, write } => {
            baseline_table(&baseline.unwrap_or_else(gate::instructions_baseline), write)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("efapoll-perf: {e}");
            ExitCode::from(if matches!(e, GateError::Usage(_)) { 2 } else { 1 })
        }
    }
}

/// `baseline-table`: the table on stdout, or into `write`'s markers.
fn baseline_table(baseline: &Path, write: Option<PathBuf>) -> Result<u8, GateError> {
    let report = Report::read(baseline)?;
    match write {
        None => print!("{}", table::markdown(&report)),
        Some(readme) => {
            let changed = table::write_into(&readme, &report)?;
            let what = if changed { "rewritten" } else { "already the baseline's" };
            println!("{}: table {what} ({})", readme.display(), baseline.display());
        }
    }
    Ok(0)
}
