//! What a `--json` report says of its run besides the results: when and
//! where it ran, which build, how it was invoked and with what settings,
//! so that two reports can be told apart and compared fairly (README.md,
//! "The `--json` report", lists every key).

use std::time::{SystemTime, UNIX_EPOCH};

use efapoll::device::udp::Window;
use serde_json::{Value, json};

use super::probe::CoreToCore;
use super::run::{DeviceKind, Mode, RunArgs};

/// The git commit the binary was built from (apps/build.rs), or "unknown".
pub const COMMIT: &str = env!("EFAPOLL_COMMIT");

/// The report's `meta` object for the run `a`, with the core-to-core
/// looks around it where there were.
pub fn of_run(a: &RunArgs, probe: Option<&CoreToCore>) -> Value {
    let p = &a.params;
    let mode = match &a.mode {
        Mode::SelfContained => "self-contained",
        Mode::Server => "server",
        Mode::Client(_) => "client",
    };
    let mut settings = json!({
        "mode": mode,
        "device": p.device,
        "op": p.op,
        "sizes": p.sizes,
        "iterations": p.iterations,
        "warmup": p.warmup,
        "window": p.window,
        "verify": p.verify,
        "lcores": a.lcores.to_string(),
        "flows": p.flows,
        "idle": a.idle.to_string(),
        "timeout_s": a.timeout.as_secs(),
    });
    if let Mode::Client(host) = &a.mode {
        settings["peer"] = json!(host);
    }
    if let Some(ms) = p.duration_ms {
        settings["duration_s"] = json!(ms as f64 / 1e3);
    }
    if a.device == DeviceKind::Udp {
        settings["udp_window"] = match a.udp_window {
            Window::Fixed(n) => json!(n),
            Window::Adaptive => json!("adaptive"),
        };
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut meta = json!({
        "timestamp": rfc3339_utc(a.started),
        "host": host_name(),
        "cpu": cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
        "cores": cores(),
        "efapoll_version": env!("CARGO_PKG_VERSION"),
        "commit": COMMIT,
        "command_line": std::env::args_os()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        "settings": settings,
    });
    if let Some(p) = probe {
        let round = |ns: f64| (ns * 10.0).round() / 10.0;
        meta["core_to_core"] = json!({
            "cpus": [p.cpus.0, p.cpus.1],
            "before_ns": round(p.before_ns),
            "after_ns": p.after_ns.map(round),
        });
    }
    meta
}

/// This host's name, as the kernel has it (no libc call for one string).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The CPUs this process may run on: those `-l` chooses from.
fn cores() -> usize {
    efapoll_lcores::available_cores()
        .map(|cores| cores.len())
        .or_else(|_| std::thread::available_parallelism().map(usize::from))
        .unwrap_or(1)
}

/// The CPU's model from /proc/cpuinfo text: x86's `model name`, or Arm's
/// implementer and part numbers, which is all an Arm kernel says (a
/// Graviton 3 is `implementer 0x41, part 0xd40`).
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    let field = |key: &str| {
        cpuinfo.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned()).filter(|v| !v.is_empty())
        })
    };
    field("model name").or_else(|| {
        Some(format!("implementer {}, part {}", field("CPU implementer")?, field("CPU part")?))
    })
}

/// `t` as RFC 3339 in UTC, to the second: `2026-11-26T04:34:12Z`.
pub fn rfc3339_utc(t: SystemTime) -> String {
    // A clock before 1970 is a broken clock: the epoch says so plainly.
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days since the epoch only).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Counted from 0000-03-01, so that a leap day ends its year.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |secs| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(951_868_799), "2000-02-29T23:59:59Z");
        assert_eq!(at(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z", "2100 is not a leap year");
        assert_eq!(rfc3339_utc(UNIX_EPOCH - Duration::from_secs(1)), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn the_cpu_model_of_x86_and_arm() {
        let x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7R13 \
                   Processor\nflags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7R13 \
                   Processor\n";
        assert_eq!(cpu_model(x86).as_deref(), Some("AMD EPYC 7R13 Processor"));
        let arm = "processor\t: 0\nBogoMIPS\t: 2100.00\nCPU implementer\t: 0x41\n\
                   CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n";
        assert_eq!(cpu_model(arm).as_deref(), Some("implementer 0x41, part 0xd40"));
        assert_eq!(cpu_model(""), None);
    }
}
