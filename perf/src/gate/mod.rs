//! The regression gate: measure a suite, write the results as Bencher
//! Metric Format JSON, compare them with a committed baseline, print the
//! table, and fail (exit 3) on a regression. See perf/README.md.

pub mod app;
pub mod bmf;
pub mod compare;
pub mod instructions;
pub mod table;
pub mod wall;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};

use crate::workloads::{self, Workload};
use bmf::{BmfError, Report};
use compare::{Thresholds, UnknownMeasure};

/// Why the gate could not give a verdict (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A tool or a measured program failed.
    #[error("{0}")]
    Tool(String),
    #[error(transparent)]
    Bmf(#[from] BmfError),
    #[error(transparent)]
    Measure(#[from] UnknownMeasure),
    /// A README's baseline table (`baseline-table --write`, `--readme`).
    #[error(transparent)]
    Table(#[from] table::TableError),
    #[error("no baseline at {0}: write one with --update-baseline")]
    NoBaseline(PathBuf),
    /// A summary file (`--summary-json`, `--summary-md`) could not be written.
    #[error("{option} {}: {source}", path.display())]
    Write { option: &'static str, path: PathBuf, source: std::io::Error },
    /// Arguments that do not fit together (exit 2, as clap's errors).
    #[error("{0}")]
    Usage(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Instructions per operation under valgrind's callgrind: for noisy or
    /// shared machines (CI).
    Instructions,
    /// Wall clock in this process, medians of --runs samples: for metal.
    Wall,
    /// `efapoll pingpong` and `efapoll streaming --json`, medians of --runs.
    App,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Instructions => "instructions",
            Mode::Wall => "wall",
            Mode::App => "app",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// The workloads CI gates on (a few minutes under callgrind).
    Small,
    /// Every workload.
    Full,
}

/// Where the verdict goes besides stdout (`gate` and `compare`).
#[derive(Debug, Args)]
pub struct SummaryFiles {
    /// Also write the verdict as JSON to FILE: pass or fail, the count of
    /// each status, and per metric its bench, measure, baseline, current,
    /// change and threshold (percent) and status.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// Also write the verdict as markdown to FILE, for a pull request's
    /// comment: the verdict line, then a table of the metrics, regressions
    /// first.
    #[arg(long, value_name = "FILE")]
    pub summary_md: Option<PathBuf>,
}

impl SummaryFiles {
    /// Writes the summaries asked for, making their directories (as the
    /// results file's), so that CI can name a path under target/.
    pub fn write(&self, c: &compare::Comparison) -> Result<(), GateError> {
        let files = [
            ("--summary-json", &self.summary_json, c.summary_json()),
            ("--summary-md", &self.summary_md, c.summary_md()),
        ];
        for (option, path, text) in files {
            let Some(path) = path else { continue };
            let write = || -> std::io::Result<()> {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(path, text)
            };
            write().map_err(|source| GateError::Write { option, path: path.clone(), source })?;
        }
        Ok(())
    }
}

/// The gate's options.
#[derive(Debug, Args)]
pub struct GateArgs {
    #[arg(long, value_enum, default_value_t = Mode::Instructions)]
    pub mode: Mode,
    /// Which workloads [default: small for instructions, full for wall].
    #[arg(long, value_enum)]
    pub suite: Option<Suite>,
    /// Only workloads whose name contains this; baseline metrics of other
    /// benches are skipped, not missing.
    #[arg(long)]
    pub filter: Option<String>,
    /// The baseline [default: perf/baselines/instructions.json;
    /// perf/baselines/MODE-MACHINE.json for wall and app].
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Names the machine in the wall and app baseline path, e.g. the
    /// instance type: a stable label (a CI runner's host name changes
    /// from run to run). Wall and app modes need it, or --baseline.
    #[arg(long, value_name = "LABEL", value_parser = parse_machine)]
    pub machine: Option<String>,
    /// Where the results go [default: target/perf-gate/MODE.json].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the results to the baseline (merged into it with --filter)
    /// instead of failing on a difference.
    #[arg(long)]
    pub update_baseline: bool,
    /// With --update-baseline: rewrite the baseline's table between
    /// FILE's `<!-- baseline-table:begin -->` and `end` lines [default:
    /// perf/README.md for perf/baselines/instructions.json, else none].
    #[arg(long, value_name = "FILE", requires = "update_baseline")]
    pub readme: Option<PathBuf>,
    /// Samples per metric, the median kept [default: instructions 1, wall
    /// and app 5; at least 5 for wall and app].
    #[arg(long)]
    pub runs: Option<usize>,
    /// Instruction mode: valgrind processes at a time [default: the cores].
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Overrides a measure's threshold in percent, e.g. `latency=8`
    /// (defaults: instructions 2, latency 5, latency-p99 15, throughput 5,
    /// bandwidth 5). Repeatable.
    #[arg(long = "threshold", value_name = "MEASURE=PERCENT")]
    pub thresholds: Vec<String>,
    /// App mode: sizes, as efapoll's -S takes them.
    #[arg(long, default_value = "64,4096,65536,1m")]
    pub sizes: String,
    /// App mode: the device (efapoll's -p).
    #[arg(long, default_value = "shm")]
    pub device: String,
    /// App mode: the efapoll binary [default: efapoll beside this one].
    #[arg(long)]
    pub efapoll: Option<PathBuf>,
    /// App mode: one more argument for both apps (`--app-arg=-l
    /// --app-arg=2,3`). Repeatable.
    #[arg(long = "app-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub app_args: Vec<String>,
    #[command(flatten)]
    pub summary: SummaryFiles,
}

const BASELINES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/baselines");

/// The committed baseline of the instruction gate, which perf/README.md's
/// figures table shows.
pub fn instructions_baseline() -> PathBuf {
    Path::new(BASELINES).join("instructions.json")
}

/// Where results go by default: target/perf-gate in the workspace.
fn out_dir() -> PathBuf {
    let perf = Path::new(env!("CARGO_MANIFEST_DIR"));
    perf.parent().unwrap_or(perf).join("target").join("perf-gate")
}

/// This host's name, for default baseline paths.
/// `--machine`: it becomes part of a file name.
fn parse_machine(label: &str) -> Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if label.is_empty() || !label.chars().all(ok) {
        return Err(
            "expected a label of letters, digits, `.`, `_` and `-` (e.g. c7gn.metal)".into()
        );
    }
    Ok(label.to_owned())
}

/// The workloads a run measures.
pub fn select(suite: Suite, filter: Option<&str>) -> Vec<Workload> {
    workloads::all()
        .into_iter()
        .filter(|w| suite == Suite::Full || w.small)
        .filter(|w| filter.is_none_or(|f| w.name.contains(f)))
        .collect()
}

/// Runs the gate; returns the exit status (0 pass, 3 regression).
pub fn run(args: &GateArgs) -> Result<u8, GateError> {
    let started = Instant::now();
    let mut thresholds = Thresholds::default();
    for t in &args.thresholds {
        thresholds.set(t).map_err(GateError::Usage)?;
    }
    let runs = args.runs.unwrap_or(if args.mode == Mode::Instructions { 1 } else { 5 });
    if runs == 0 || (args.mode != Mode::Instructions && runs < 5) {
        return Err(GateError::Usage(format!(
            "--runs {runs}: wall-clock medians need at least 5 runs (instructions: 1)"
        )));
    }
    let mode = args.mode.name();
    let baseline_path = match (&args.baseline, args.mode, &args.machine) {
        (Some(path), _, _) => path.clone(),
        (None, Mode::Instructions, _) => instructions_baseline(),
        (None, _, Some(machine)) => Path::new(BASELINES).join(format!("{mode}-{machine}.json")),
        (None, _, None) => {
            return Err(GateError::Usage(format!(
                "--mode {mode} needs --machine LABEL (a stable name for this kind of machine, \
                 e.g. c7gn.metal: the baseline is {BASELINES}/{mode}-LABEL.json) or --baseline FILE"
            )));
        }
    };
    let out_path = args.out.clone().unwrap_or_else(|| out_dir().join(format!("{mode}.json")));
    let exe = std::env::current_exe().map_err(|e| GateError::Tool(format!("own path: {e}")))?;

    let current = match args.mode {
        Mode::Instructions | Mode::Wall => {
            let default_suite = if args.mode == Mode::Wall { Suite::Full } else { Suite::Small };
            let suite = args.suite.unwrap_or(default_suite);
            let selected = select(suite, args.filter.as_deref());
            if selected.is_empty() {
                return Err(GateError::Usage("no workload matches --suite and --filter".into()));
            }
            let refs: Vec<&Workload> = selected.iter().collect();
            if args.mode == Mode::Instructions {
                let version = instructions::valgrind_version()?;
                let jobs = args
                    .jobs
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
                eprintln!(
                    "{version}: {} workloads, {runs} run(s) of 2 processes each, {jobs} at a time",
                    refs.len()
                );
                // Private to this process: gates may run side by side.
                let dir = std::env::temp_dir()
                    .join(format!("efapoll-perf-callgrind-{}", std::process::id()));
                let report = instructions::measure(&exe, &refs, runs, jobs, &dir);
                let _ = std::fs::remove_dir_all(&dir);
                report?
            } else {
                eprintln!("{} workloads, {runs} samples each", refs.len());
                wall::measure(&refs, runs, |name| eprintln!("  {name}"))
            }
        }
        Mode::App => {
            let efapoll = args.efapoll.clone().unwrap_or_else(|| exe.with_file_name("efapoll"));
            let run = app::AppRun {
                efapoll,
                device: args.device.clone(),
                sizes: args.sizes.clone(),
                runs,
                extra: args.app_args.clone(),
                dir: out_dir().join("app"),
            };
            app::measure(&run, |what| eprintln!("  {what}"))?
        }
    };
    current.write(&out_path)?;
    println!("results: {}", out_path.display());

    let in_scope = |bench: &str| args.filter.as_deref().is_none_or(|f| bench.contains(f));
    let baseline = if baseline_path.exists() { Some(Report::read(&baseline_path)?) } else { None };
    let comparison = compare::compare(
        baseline.as_ref().unwrap_or(&Report::default()),
        &current,
        &thresholds,
        in_scope,
    )?;
    print!("{}", comparison.table());
    // Without a baseline there is nothing to pass or fail: the one verdict
    // is the error below (or the baseline written), not a PASS of "new"s.
    if baseline.is_some() || args.update_baseline {
        print!("{}", comparison.summary());
        args.summary.write(&comparison)?;
    }
    eprintln!("gate: {:.0} s", started.elapsed().as_secs_f64());

    if args.update_baseline {
        // With a filter, the other benches of the baseline stay.
        let mut updated = baseline.unwrap_or_default();
        if args.filter.is_some() {
            updated.0.retain(|bench, _| !in_scope(bench));
        } else {
            updated.0.clear();
        }
        updated.0.extend(current.0);
        updated.write(&baseline_path)?;
        println!("baseline written: {}", baseline_path.display());
        let readme = args
            .readme
            .clone()
            .or_else(|| same_file(&baseline_path, &instructions_baseline()).then(table::readme));
        if let Some(readme) = readme
            && table::write_into(&readme, &updated)?
        {
            println!("its table rewritten: {}", readme.display());
        }
        return Ok(0);
    }
    if baseline.is_none() {
        return Err(GateError::NoBaseline(baseline_path));
    }
    Ok(comparison.exit_code())
}

/// Whether `a` and `b` name one file (both exist).
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// Compares two result files as the gate does.
pub fn compare_files(
    baseline: &Path,
    current: &Path,
    thresholds: &[String],
    summary: &SummaryFiles,
) -> Result<u8, GateError> {
    let mut t = Thresholds::default();
    for s in thresholds {
        t.set(s).map_err(GateError::Usage)?;
    }
    let c = compare::compare(&Report::read(baseline)?, &Report::read(current)?, &t, |_| true)?;
    print!("{}", c.table());
    print!("{}", c.summary());
    summary.write(&c)?;
    Ok(c.exit_code())
}
