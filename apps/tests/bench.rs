//! The benchmark apps end to end, through the `efapoll` binary: both sides
//! in one process on sim and shm, server and client as two processes,
//! and the errors a user meets.
//!
//! The machine may have two cores: tests whose runs busy-poll take
//! [`busy`] first, so that at most two polling threads run at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

static BUSY: Mutex<()> = Mutex::new(());

fn busy() -> MutexGuard<'static, ()> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

fn efapoll() -> Command {
    Command::new(env!("CARGO_BIN_EXE_efapoll"))
}

fn run(args: &[&str]) -> Output {
    let child = efapoll().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait(child, args)
}

/// Waits for `child` at most a minute, so a hung run fails the test.
fn wait(mut child: Child, args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("efapoll {args:?} hung; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    // A test that reads stderr as the run goes has taken it.
    if let Some(mut e) = child.stderr.take() {
        e.read_to_end(&mut stderr).unwrap();
    }
    Output { status, stdout, stderr }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The table's data rows: lines that start with a number.
fn rows(out: &Output) -> Vec<Vec<String>> {
    text(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|cols| cols.first().is_some_and(|c| c.parse::<u64>().is_ok()))
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("efapoll-test-{}-{name}", std::process::id()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn number(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

const PINGPONG_FIELDS: [&str; 10] = [
    "bytes",
    "iterations",
    "t_min_us",
    "t_p50_us",
    "t_avg_us",
    "t_p99_us",
    "t_p999_us",
    "t_max_us",
    "mb_per_s",
    "mmsg_per_s",
];

const STREAMING_FIELDS: [&str; 8] = [
    "bytes",
    "iterations",
    "window",
    "bw_peak_mb_s",
    "bw_avg_mb_s",
    "mmsg_per_s",
    "usec_per_xfer",
    "busy_pct",
];

/// Reads a `--json` file and checks what every report has.
fn read_report(path: &PathBuf, app: &str, device: &str, op: &str, sizes: &[u64]) -> Value {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    assert_eq!(v["app"], app);
    assert_eq!(v["device"], device);
    assert_eq!(v["op"], op);
    assert!(v["lcores"].as_str().is_some_and(|l| !l.is_empty()), "{v}");
    let counters = v["counters"].as_object().expect("counters object");
    assert!(counters.keys().any(|k| k.starts_with("tx.")), "{counters:?}");
    assert!(counters.values().all(Value::is_u64), "{counters:?}");
    let results = v["results"].as_array().expect("results array");
    let got: Vec<u64> = results.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(got, sizes);
    v
}

/// A pingpong row of `flows` flows: iterations and MB/s add up over them.
fn check_pingpong_row(r: &Value, iterations: u64, flows: f64) {
    for key in PINGPONG_FIELDS {
        assert!(number(r, key) >= 0.0, "{key} in {r}");
    }
    assert_eq!(r["iterations"], iterations);
    let t: Vec<f64> =
        ["t_min_us", "t_p50_us", "t_p99_us", "t_p999_us", "t_max_us"].map(|k| number(r, k)).into();
    assert!(t[0] > 0.0 && t.windows(2).all(|w| w[0] <= w[1]), "percentiles in order: {r}");
    // The average is exact; batched round trips are recorded as their
    // batch's mean rounded to the nearest ns, so within half a ns of it.
    let avg = number(r, "t_avg_us");
    assert!(avg >= t[0] - 0.0005 && avg <= t[4] + 0.0005, "{r}");
    assert!(number(r, "mb_per_s") > 0.0 || r["bytes"] == 0, "{r}");
    assert!(number(r, "mmsg_per_s") > 0.0, "{r}");
    // MB/s is each flow's bytes per its average half round trip, summed:
    // with one flow, bytes per average; with several, at least that
    // (the sum of rates is at least flows over the mean of their times,
    // equal when the flows ran alike) and at most every flow at t_min.
    let (bytes, mb_per_s) = (number(r, "bytes"), number(r, "mb_per_s"));
    let expect = flows * bytes / avg;
    if flows == 1.0 {
        assert!((mb_per_s - expect).abs() <= expect * 0.01 + 0.01, "{r}");
    } else {
        assert!(mb_per_s >= expect * 0.99 - 0.01, "{r}");
        assert!(mb_per_s <= flows * bytes / t[0] * 1.01 + 0.01, "{r}");
    }
}

fn check_streaming_row(r: &Value, iterations: u64) {
    for key in STREAMING_FIELDS {
        assert!(number(r, key) >= 0.0, "{key} in {r}");
    }
    assert_eq!(r["iterations"], iterations);
    assert!(number(r, "window") >= 1.0, "{r}");
    let (peak, avg) = (number(r, "bw_peak_mb_s"), number(r, "bw_avg_mb_s"));
    if r["bytes"] == 0 {
        assert!(avg == 0.0 && peak == 0.0, "{r}");
    } else {
        assert!(avg > 0.0 && peak >= avg * 0.999, "{r}");
    }
    assert!(number(r, "mmsg_per_s") > 0.0 && number(r, "usec_per_xfer") > 0.0, "{r}");
    let busy = number(r, "busy_pct");
    assert!(busy > 0.0 && busy <= 100.0, "{r}");
}

#[test]
fn sim_pingpong_and_streaming_print_a_row_per_size() {
    let _busy = busy();
    let out = run(&["pingpong", "-p", "sim", "-S", "64,4k,1m", "-I", "200", "-w", "3"]);
    assert_ok(&out, "pingpong -p sim");
    let table = rows(&out);
    assert_eq!(table.len(), 3, "{}", text(&out.stdout));
    assert!(table.iter().all(|r| r.len() == 12 && r[1] == "200"));
    assert_eq!(table[1][0], "4096");
    let header = text(&out.stdout);
    assert!(header.contains("t_p99.9") && header.contains("t_stddev batch\n"), "{header}");
    // 1 MiB round trips take tens of microseconds: each is timed.
    assert_eq!(table[2][11], "1");

    let out = run(&["streaming", "-p", "sim", "-o", "tagged", "-c", "-S", "64,70000", "-I", "300"]);
    assert_ok(&out, "streaming -p sim -o tagged -c");
    let table = rows(&out);
    assert_eq!(table.len(), 2);
    assert!(table.iter().all(|r| r.len() == 8 && r[1] == "300" && r[2] == "64"));
}

#[test]
fn sim_runs_a_flow_per_lcore_and_sums_them() {
    let _busy = busy();
    let out = run(&["streaming", "-p", "sim", "-l", "0-1", "-S", "64", "-I", "2000"]);
    if !out.status.success() && text(&out.stderr).contains("does not exist") {
        return; // a one-core machine
    }
    assert_ok(&out, "streaming -p sim -l 0-1");
    let table = rows(&out);
    assert_eq!(table[0][1], "4000", "iterations add up over the two flows");
    assert!(text(&out.stdout).contains("2 flow(s)"));
}

#[test]
fn shm_pingpong_verifies_every_byte_and_writes_json() {
    let _busy = busy();
    let json = tmp("pingpong.json");
    let plot = tmp("pingpong.svg");
    let sizes = [1u64, 64, 9000, 70000, 200_000];
    let out = run(&[
        "pingpong",
        "-S",
        "1,64,9000,70000,200000",
        "-I",
        "40",
        "-c",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_ok(&out, "pingpong -c --json");
    assert_eq!(rows(&out).len(), sizes.len());
    let v = read_report(&json, "pingpong", "shm", "send", &sizes);
    for r in v["results"].as_array().unwrap() {
        check_pingpong_row(r, 40, 1.0);
    }
    // The device's counters too: what it delivered (and would have
    // dropped: malformed slots, `device.malformed`).
    let delivered = v["counters"]["device.delivered"].as_u64().unwrap_or(0);
    assert!(delivered >= 40 * sizes.len() as u64, "{}", v["counters"]);
    let svg = std::fs::read_to_string(&plot).unwrap();
    let _ = std::fs::remove_file(&plot);
    assert!(svg.starts_with("<svg") && svg.contains("p50"), "{}", &svg[..svg.len().min(200)]);
}

#[test]
fn shm_streaming_verifies_every_byte_and_writes_json() {
    let _busy = busy();
    let json = tmp("streaming.json");
    let sizes = [64u64, 9000, 100_000, 1 << 20];
    let out = run(&[
        "streaming",
        "-o",
        "tagged",
        "-S",
        "64,9000,100000,1m",
        "-I",
        "100",
        "-W",
        "16",
        "-c",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_ok(&out, "streaming -c --json");
    let v = read_report(&json, "streaming", "shm", "tagged", &sizes);
    for r in v["results"].as_array().unwrap() {
        check_streaming_row(r, 100);
        assert_eq!(r["window"], 16);
    }
    // The receiver ran here: its counters too (the 64 B messages are eager).
    let passive = v["passive_counters"].as_object().expect("passive_counters object");
    assert!(passive["rx.EAGER_TAGRTM"].as_u64().is_some_and(|n| n >= 100), "{passive:?}");
    assert_eq!(passive["tx.EAGER_TAGRTM"], sizes.len(), "the receiver's: an ack per size");
    // On shm, what does not fit a packet is read, each read ended by an EOR.
    let c = &v["counters"];
    let reads = c["tx.LONGREAD_TAGRTM"].as_u64().unwrap_or(0);
    assert!(reads >= 3 * 100 && c["rx.EOR"] == reads, "{c}");
    assert!(c.get("tx.MEDIUM_TAGRTM").is_none() && c.get("tx.RUNTREAD_TAGRTM").is_none(), "{c}");
}

#[test]
fn five_hundred_and_twelve_lcores_on_two_cpus_set_up_and_run() {
    let _busy = busy();
    // 256 flows sharing two CPUs, in turn (yield): each CPU's lcores make
    // their devices one at a time, and none polls before all are set up
    // (set-up grew with the square of the lcores, and peers set up late
    // timed out: "no card from the peer"). Lcores sharing CPUs warm up
    // over -w only. The bound is set-up's, not a speed target: 256
    // threads a CPU each clear ~12 MiB of rings and slabs (8 s here).
    let map = "0-255@0,256-511@1";
    let args =
        ["pingpong", "-l", map, "--idle", "yield", "-S", "64", "-I", "10", "--timeout", "300"];
    let out = run(&args);
    if !out.status.success() && text(&out.stderr).contains("does not exist") {
        return; // a one-core machine
    }
    assert_ok(&out, "pingpong with 512 lcores");
    assert!(text(&out.stdout).contains("256 flow(s)"), "{}", text(&out.stdout));
    let rows = rows(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][1], "2560", "every flow's iterations: {rows:?}");
}

#[test]
fn shm_runs_a_flow_per_lcore_pair_with_pairs_sharing_cpus() {
    let _busy = busy();
    // Two flows, four lcores on two CPUs (DPDK's --lcores form): what a
    // two-core machine can check of -l with several pairs. Yield, so that
    // the lcores sharing a CPU take turns.
    let map = "0@0,1@1,2@0,3@1";
    for app in ["pingpong", "streaming"] {
        let json = tmp(&format!("{app}-pairs.json"));
        let args =
            [app, "-l", map, "--idle", "yield", "-S", "64,9000", "-I", "300", "-c", "--json"];
        let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
        if !out.status.success() && text(&out.stderr).contains("does not exist") {
            return; // a one-core machine
        }
        assert_ok(&out, &format!("{app} -l {map}"));
        assert!(text(&out.stdout).contains("2 flow(s)"), "{}", text(&out.stdout));
        let v = read_report(&json, app, "shm", "send", &[64, 9000]);
        assert_eq!(v["lcores"], map);
        for r in v["results"].as_array().unwrap() {
            // Both flows' iterations, every byte verified.
            if app == "pingpong" {
                check_pingpong_row(r, 600, 2.0);
            } else {
                check_streaming_row(r, 600);
            }
        }
        // Both flows' traffic: the 64 B messages (and their echoes) are eager.
        let sent = v["counters"]["tx.EAGER_MSGRTM"].as_u64().unwrap_or(0);
        assert!(sent >= 2 * 300, "{app}: {}", v["counters"]);
    }
}

/// The keys README.md's "The `--json` report" lists, each with its "in"
/// column: the reports that have it.
fn documented_keys() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let readme = readme.unwrap();
    let start = readme.find("### The `--json` report").expect("README lists the report's keys");
    let section = &readme[start..];
    let end = section[1..].find("\n#").map_or(section.len(), |e| e + 1);
    let keys: Vec<(String, String)> = section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (cells[0].trim_end_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect();
    assert!(keys.len() > 30, "{keys:?}");
    keys
}

/// Every key path of a report, as README.md writes them (jq's syntax):
/// `a.b`, `results[].x`, a name with a dot quoted. The counters' names are
/// theirs, not the report's.
fn key_paths(v: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    let Some(map) = v.as_object() else { return };
    for (key, value) in map {
        let name = if key.contains('.') { format!("\"{key}\"") } else { key.clone() };
        let path = if prefix.is_empty() { name } else { format!("{prefix}.{name}") };
        match value {
            Value::Object(_) if !key.ends_with("counters") => key_paths(value, &path, out),
            Value::Array(items) if items.iter().any(Value::is_object) => {
                for item in items {
                    key_paths(item, &format!("{path}[]"), out);
                }
            }
            _ => {
                out.insert(path);
            }
        }
    }
}

/// Whether a documented key with this "in" column is in the report of
/// `app` on `device`, both sides run here.
fn documented_in(column: &str, app: &str, device: &str) -> bool {
    match column {
        "all" | "both sides here" => true,
        "pingpong" | "streaming" => column == app,
        "`-p udp`" => device == "udp",
        // The duration test reads `meta.settings.duration_s`.
        "client" | "`-D`" => false,
        other => panic!("README: unknown \"in\" column `{other}`"),
    }
}

/// The report's keys are the ones README.md lists, no more, no fewer;
/// `meta` says when, where, which build and how the run was asked for.
#[test]
fn the_json_report_has_every_documented_key_and_no_other() {
    let _busy = busy();
    let documented = documented_keys();
    for (app, device, args) in [
        ("pingpong", "sim", &["-S", "64,4k", "-I", "100", "-c"][..]),
        ("streaming", "sim", &["-S", "64", "-I", "1000", "-W", "16"]),
        ("pingpong", "udp", &["-S", "64", "-I", "100", "--udp-window", "adaptive"]),
    ] {
        let json = tmp(&format!("{app}-{device}-meta.json"));
        let mut all = vec![app, "-p", device];
        all.extend_from_slice(args);
        all.extend(["--json", json.to_str().unwrap()]);
        let out = run(&all);
        assert_ok(&out, &format!("{all:?}"));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        let mut present = std::collections::BTreeSet::new();
        key_paths(&v, "", &mut present);
        for (key, column) in &documented {
            let expect = documented_in(column, app, device);
            assert_eq!(present.contains(key), expect, "{app} -p {device}: `{key}` ({column})");
        }
        let undocumented: Vec<&String> =
            present.iter().filter(|k| !documented.iter().any(|(d, _)| d == *k)).collect();
        assert!(undocumented.is_empty(), "{app} -p {device}: not in README: {undocumented:?}");

        let meta = &v["meta"];
        let commit = meta["commit"].as_str().unwrap();
        assert!(
            commit == "unknown" || {
                let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
                hash.len() >= 7 && hash.chars().all(|c| c.is_ascii_hexdigit())
            },
            "{commit}"
        );
        // RFC 3339 in UTC, to the second: 2026-11-26T04:34:12Z.
        let ts = meta["timestamp"].as_str().unwrap();
        let shape: Vec<u8> =
            ts.bytes().map(|b| if b.is_ascii_digit() { b'0' } else { b }).collect();
        assert_eq!(String::from_utf8(shape).unwrap(), "0000-00-00T00:00:00Z", "{ts}");
        assert!(ts >= "2024", "{ts}");
        let argv: Vec<&str> =
            meta["command_line"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(argv[1..], all[..], "the command line as given");
        assert!(meta["cores"].as_u64().is_some_and(|n| n >= 1), "{meta}");
        for key in ["host", "cpu", "efapoll_version"] {
            assert!(meta[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {meta}");
        }
        let settings = &meta["settings"];
        assert_eq!(settings["mode"], "self-contained");
        assert_eq!(settings["device"], device);
        assert_eq!(settings["op"], "send");
        assert_eq!(settings["lcores"], v["lcores"]);
        assert_eq!(settings["idle"], "spin");
        assert_eq!(settings["timeout_s"], 10);
        assert_eq!(settings["warmup"], 10);
        let sizes = settings["sizes"].as_array().unwrap();
        assert_eq!(sizes.len(), v["results"].as_array().unwrap().len());
        assert_eq!(settings["iterations"].as_array().unwrap().len(), sizes.len());
        for (r, size) in v["results"].as_array().unwrap().iter().zip(sizes) {
            assert_eq!(&r["bytes"], size);
            assert_eq!(&r["bw_avg_mb_s"], r.get("mb_per_s").unwrap_or(&r["bw_avg_mb_s"]));
            if app == "pingpong" {
                assert_eq!(r["t_p99.9_us"], r["t_p999_us"], "{r}");
            }
        }
        match (app, device) {
            ("pingpong", "sim") => {
                assert_eq!((&settings["verify"], &settings["window"]), (&json!(true), &json!(1)));
                assert_eq!(settings["iterations"], json!([100, 100]));
            }
            ("streaming", _) => assert_eq!(settings["window"], 16),
            _ => assert_eq!(settings["udp_window"], "adaptive"),
        }
    }
}

/// Starts `efapoll APP --server` on `port` with `args`.
fn server(app: &str, port: u16, args: &[&str]) -> Child {
    efapoll()
        .args([app, "--server", "-B", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn client(app: &str, port: u16, args: &[&str]) -> Output {
    let port = port.to_string();
    let mut all = vec![app, "127.0.0.1", "-B", &port];
    all.extend_from_slice(args);
    run(&all)
}

/// Runs `app -p device -o op` as a server and its client on localhost,
/// with `-c`; checks both ends, their tables and their reports.
fn server_and_client(app: &str, device: &str, op: &str) {
    let port = free_port();
    let args = ["-p", device, "-o", op, "-S", "64,9000,100k", "-I", "100", "-c"];
    let srv_json = tmp(&format!("{app}-{device}-{op}-server.json"));
    let mut srv_args = args.to_vec();
    srv_args.extend(["--json", srv_json.to_str().unwrap()]);
    let srv = server(app, port, &srv_args);
    let json = tmp(&format!("{app}-{device}-{op}-client.json"));
    let mut client_args = args.to_vec();
    client_args.extend(["--json", json.to_str().unwrap()]);
    let out = client(app, port, &client_args);
    let srv = wait(srv, &["--server"]);
    assert_ok(&out, &format!("{app} -o {op} client"));
    assert_ok(&srv, &format!("{app} -o {op} server"));
    assert_eq!(rows(&out).len(), 3, "{app}: {}", text(&out.stdout));
    // The server prints the client's measurements, row for row.
    assert_eq!(rows(&srv), rows(&out), "{app} server: {}", text(&srv.stdout));
    assert!(text(&srv.stderr).contains("served 1 flow(s)"), "{}", text(&srv.stderr));
    // And says, as the client does, which sizes were timed in batches.
    let note = |o: &Output| {
        text(&o.stderr).lines().find(|l| l.starts_with("note: batch")).map(str::to_owned)
    };
    assert_eq!(note(&srv), note(&out), "{app} server: {}", text(&srv.stderr));
    let sizes = [64, 9000, 102_400];
    let v = read_report(&json, app, device, op, &sizes);
    for r in v["results"].as_array().unwrap() {
        if app == "pingpong" {
            check_pingpong_row(r, 100, 1.0)
        } else {
            check_streaming_row(r, 100)
        }
    }
    // The server's report: the client's rows, the server's own counters.
    let s = read_report(&srv_json, app, device, op, &sizes);
    assert_eq!(s["results"], v["results"], "{app}");
    // Each report says which end wrote it; the client's, whom it ran against.
    let (mine, theirs) = (&v["meta"]["settings"], &s["meta"]["settings"]);
    assert_eq!((&mine["mode"], &mine["peer"]), (&json!("client"), &json!("127.0.0.1")));
    assert_eq!(theirs["mode"], "server");
    assert!(theirs.get("peer").is_none(), "{theirs}");
    let rx = |v: &Value| {
        v["counters"].as_object().unwrap().keys().filter(|k| k.starts_with("rx.")).count()
    };
    assert!(rx(&s) > 0, "{s}");
}

#[test]
fn server_and_client_run_as_two_processes() {
    let _busy = busy();
    for app in ["pingpong", "streaming"] {
        server_and_client(app, "shm", "send");
    }
}

#[test]
fn server_and_client_write_with_the_descriptor_sent_over_relink() {
    let _busy = busy();
    for app in ["pingpong", "streaming"] {
        server_and_client(app, "shm", "write");
    }
}

/// Across the udp device, as across hosts: the control link carries the
/// device addresses, every operation runs verified.
#[test]
fn udp_server_and_client_run_every_operation_as_two_processes() {
    let _busy = busy();
    for app in ["pingpong", "streaming"] {
        for op in ["send", "tagged", "write", "read"] {
            server_and_client(app, "udp", op);
        }
    }
}

/// A child killed when dropped, so that a failing test leaves no server
/// behind.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_server_on_port_0_prints_the_port_the_os_chose_and_serves_on_it() {
    let _busy = busy();
    let args = ["-S", "64", "-I", "100"];
    let mut srv = KillOnDrop(Some(server("pingpong", 0, &args)));
    // Forward the server's stderr line by line; the rest is kept for the end.
    let stderr = srv.0.as_mut().unwrap().stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let waiting = loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).expect("the server's first line");
        if line.contains("waiting for a client") {
            break line;
        }
    };
    // The last word is the port (or ADDR:PORT).
    let port: u16 = waiting
        .rsplit([' ', ':'])
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {waiting:?}"));
    assert_ne!(port, 0, "{waiting}");
    let out = client("pingpong", port, &args);
    let srv_out = wait(srv.0.take().unwrap(), &["--server", "-B", "0"]);
    reader.join().unwrap();
    let rest: Vec<String> = lines.try_iter().collect();
    assert_ok(&out, "client of the -B 0 server");
    assert_ok(&srv_out, "pingpong --server -B 0");
    assert_eq!(rows(&out).len(), 1, "{}", text(&out.stdout));
    assert_eq!(rows(&srv_out), rows(&out), "{}", text(&srv_out.stdout));
    assert!(rest.iter().any(|l| l.contains("served 1 flow(s)")), "{rest:?}");
}

#[test]
fn a_parameter_mismatch_fails_both_sides_before_any_traffic() {
    let _busy = busy();
    let port = free_port();
    let srv = server("pingpong", port, &["-S", "64", "-I", "100"]);
    let out = client("pingpong", port, &["-S", "128", "-I", "100", "-c"]);
    let srv = wait(srv, &["--server"]);
    for (side, o) in [("client", &out), ("server", &srv)] {
        assert_eq!(o.status.code(), Some(1), "{side}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains("parameter mismatch"), "{side}: {err}");
        assert!(err.contains("-S: here") && err.contains("-c: here"), "{side}: {err}");
        assert!(rows(o).is_empty(), "{side} ran no size");
    }
}

/// The bytes a pingpong client opens its handshake with, caught by a
/// listener that answers nothing.
fn client_hello() -> Vec<u8> {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = fake.local_addr().unwrap().port();
    let cl = Reap::new(spawn_client("pingpong", port, &["-S", "64", "--timeout", "2"]));
    let (mut stream, _) = fake.accept().unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = vec![0; 4096];
    let n = stream.read(&mut hello).unwrap();
    hello.truncate(n);
    drop(cl);
    hello
}

#[test]
fn a_server_rejects_bad_connections_and_waits_for_a_good_client() {
    let _busy = busy();
    let hello = client_hello();
    assert!(hello.len() > 2, "{hello:?}");
    let port = free_port();
    let args = ["-S", "64", "-I", "100", "--timeout", "30", "--bind", "127.0.0.1"];
    let srv = Reap::new(server("pingpong", port, &args));
    let addr = ("127.0.0.1", port);
    let listening = Instant::now() + Duration::from_secs(10);
    let connect = || loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(e) if Instant::now() > listening => panic!("the server does not listen: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // Garbage, then a handshake cut short.
    connect().write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    connect().write_all(&hello[..hello.len() / 2]).unwrap();
    // Another app's client: refused at the handshake.
    let other = client("streaming", port, &["-S", "64", "--timeout", "30"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(text(&other.stderr).contains("efapoll-streaming"), "{}", text(&other.stderr));
    // A slow loris: connected, silent, held open while the client comes.
    let _loris = connect();
    let out = client("pingpong", port, &args[..6]);
    assert_ok(&out, "the good client");
    let srv = wait_within(srv.take(), Duration::from_secs(25), "the server");
    assert_ok(&srv, "the server, after four bad connections");
    assert_eq!(rows(&srv), rows(&out));
    let err = text(&srv.stderr);
    let rejected: Vec<&str> = err.lines().filter(|l| l.contains("rejected a connection")).collect();
    assert_eq!(rejected.len(), 4, "{err}");
    assert!(rejected.iter().all(|l| l.contains("efapoll-pingpong")), "{err}");
    assert!(rejected.iter().any(|l| l.contains("efapoll-streaming")), "{err}");
    assert!(rejected.iter().any(|l| l.contains("no handshake within 3 s")), "{err}");
}

/// Runs `args`, expects exit 2, returns stderr.
fn usage_error(args: &[&str]) -> String {
    let out = run(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
    text(&out.stderr)
}

#[test]
fn devices_not_built_are_clear_errors() {
    if !cfg!(feature = "efa") {
        let err = usage_error(&["pingpong", "-p", "efa"]);
        assert!(err.contains("-p efa") && err.contains("feature"), "{err}");
        assert!(err.contains("--features efa"), "{err}");
    }
    let err = usage_error(&["pingpong", "-p", "sim", "--server"]);
    assert!(err.contains("-p sim"), "{err}");
}

#[test]
fn sizes_a_one_sided_op_cannot_run_are_refused() {
    for app in ["pingpong", "streaming"] {
        let err = usage_error(&[app, "-o", "atomic", "-S", "8,64"]);
        assert!(err.contains("-S 8,64") && err.contains("-o atomic"), "{err}");
        assert!(err.contains("-S 8 only"), "{err}");
    }
}

/// The first size warms up over at least this many operations.
const PRIME: u64 = 4096;

/// Runs `app -o op` with `-c` on `device`, both sides here, and checks its
/// table and report.
fn one_sided(app: &str, device: &str, op: &str, sizes: &[u64]) {
    let json = tmp(&format!("{app}-{device}-{op}.json"));
    let list = sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let mut args = vec![app, "-p", device, "-o", op, "-I", "60", "-c"];
    args.extend(["-S", &list, "--json", json.to_str().unwrap()]);
    let out = run(&args);
    assert_ok(&out, &format!("{app} -p {device} -o {op} -c"));
    assert_eq!(rows(&out).len(), sizes.len(), "{}", text(&out.stdout));
    let header = text(&out.stdout);
    let v = read_report(&json, app, device, op, sizes);
    for r in v["results"].as_array().unwrap() {
        if app == "pingpong" { check_pingpong_row(r, 60, 1.0) } else { check_streaming_row(r, 60) }
    }
    if app == "pingpong" {
        let whole = op != "write";
        assert_eq!(header.contains("whole round trips"), whole, "{header}");
        assert_eq!(header.contains("half round trips"), !whole, "{header}");
    }
    // The handshake came first: one-sided operations need it.
    assert_eq!(v["counters"]["handshakes_received"], 1, "{v}");
    if op == "atomic" {
        // Every fetch-add went as a FETCH_RTA and came back.
        let total = PRIME + 60;
        assert_eq!(v["counters"]["tx.FETCH_RTA"], total, "{v}");
        assert_eq!(v["counters"]["rx.ATOMRSP"], total, "{v}");
    }
    if op != "write" || app == "streaming" {
        // One fence per size went to the target.
        assert_eq!(v["counters"]["tx.EAGER_MSGRTM"], sizes.len(), "{v}");
    }
}

#[test]
fn sim_runs_every_one_sided_op_verified() {
    let _busy = busy();
    // A 0-byte write still carries pingpong's CQ data to the responder.
    one_sided("pingpong", "sim", "write", &[0, 1, 64, 9000, 100_000]);
    one_sided("streaming", "sim", "write", &[1, 64, 9000, 100_000]);
    for app in ["pingpong", "streaming"] {
        one_sided(app, "sim", "read", &[1, 64, 9000, 100_000]);
        one_sided(app, "sim", "atomic", &[8]);
    }
}

#[test]
fn shm_runs_every_one_sided_op_verified() {
    let _busy = busy();
    one_sided("pingpong", "shm", "write", &[0, 1, 64, 9000, 1 << 20]);
    one_sided("streaming", "shm", "write", &[1, 64, 9000, 1 << 20]);
    for app in ["pingpong", "streaming"] {
        one_sided(app, "shm", "read", &[64, 9000, 1 << 20]);
        one_sided(app, "shm", "atomic", &[8]);
    }
}

#[test]
fn udp_runs_every_one_sided_op_verified() {
    let _busy = busy();
    one_sided("pingpong", "udp", "write", &[0, 1, 64, 9000, 1 << 20]);
    one_sided("streaming", "udp", "write", &[1, 64, 9000, 1 << 20]);
    for app in ["pingpong", "streaming"] {
        one_sided(app, "udp", "read", &[64, 9000, 1 << 20]);
        one_sided(app, "udp", "atomic", &[8]);
    }
}

/// Self-contained over udp: two lcores, a loopback socket each, every
/// byte checked from 1 B to 1 MiB; the device's own counters reported.
#[test]
fn udp_pingpong_and_streaming_verify_every_byte_on_loopback() {
    let _busy = busy();
    let sizes = [1u64, 64, 9000, 70000, 1 << 20];
    for app in ["pingpong", "streaming"] {
        let json = tmp(&format!("{app}-udp.json"));
        // pingpong on the device's own window, streaming on the apps' fixed one.
        let window = if app == "pingpong" { "adaptive" } else { "64" };
        let out = run(&[
            app,
            "-p",
            "udp",
            "--udp-window",
            window,
            "-S",
            "1,64,9000,70000,1m",
            "-I",
            "50",
            "-c",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_ok(&out, &format!("{app} -p udp -c --json"));
        assert_eq!(rows(&out).len(), sizes.len());
        let v = read_report(&json, app, "udp", "send", &sizes);
        for r in v["results"].as_array().unwrap() {
            if app == "pingpong" {
                check_pingpong_row(r, 50, 1.0)
            } else {
                check_streaming_row(r, 50)
            }
        }
        // 1 MiB is 128 datagrams of 8 KiB at least, each way acknowledged.
        let c = &v["counters"];
        let tx = c["device.tx_datagrams"].as_u64().unwrap_or(0);
        assert!(tx >= 50 * 128, "{app}: {c}");
        assert!(c["device.rx_datagrams"].as_u64().unwrap_or(0) > 0, "{app}: {c}");
        assert!(c.get("device.malformed").is_none_or(|m| m == 0), "{app}: {c}");
    }
}

#[test]
fn zero_byte_sizes_that_would_not_reach_the_peer_are_refused() {
    for (app, op) in [("pingpong", "read"), ("streaming", "read"), ("streaming", "write")] {
        let err = usage_error(&[app, "-o", op, "-S", "0,64"]);
        assert!(err.contains("-S 0,64") && err.contains(&format!("-o {op}")), "{err}");
        assert!(err.contains("from 1 byte"), "{err}");
    }
    for app in ["pingpong", "streaming"] {
        let err = usage_error(&[app, "-o", "atomic", "-S", "0"]);
        assert!(err.contains("-S 0") && err.contains("-o atomic"), "{err}");
        assert!(err.contains("-S 8 only"), "{err}");
    }
}

#[test]
fn zero_byte_messages_are_headers_that_reach_the_peer() {
    let _busy = busy();
    for (app, op, counter) in [
        ("pingpong", "send", "tx.EAGER_MSGRTM"),
        ("streaming", "send", "tx.EAGER_MSGRTM"),
        ("streaming", "tagged", "tx.EAGER_TAGRTM"),
        ("pingpong", "write", "rdma_writes"),
    ] {
        let json = tmp(&format!("{app}-{op}-zero.json"));
        let args = [app, "-p", "sim", "-o", op, "-S", "0", "-I", "50", "-c", "--json"];
        let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
        assert_ok(&out, &format!("{app} -o {op} -S 0"));
        let v = read_report(&json, app, "sim", op, &[0]);
        let r = &v["results"][0];
        if app == "pingpong" {
            check_pingpong_row(r, 50, 1.0)
        } else {
            check_streaming_row(r, 50)
        }
        assert_eq!(r["mb_per_s"].as_f64().or(r["bw_avg_mb_s"].as_f64()), Some(0.0), "{r}");
        // Each measured message went to the peer (after the warmup's).
        let sent = v["counters"][counter].as_u64().unwrap_or(0);
        assert!(sent >= PRIME + 50, "{app} -o {op}: {}", v["counters"]);
    }
    // And -S's help says what a size of 0 times, and where it is refused.
    let help = text(&run(&["pingpong", "--help"]).stdout);
    assert!(help.contains("0 times messages with no payload"), "{help}");
    assert!(help.contains("-o read and streaming -o write take sizes from 1 B"), "{help}");
}

/// `-c` caps the buffers in flight: a window it shrinks is said on
/// stderr, and the JSON keeps both the asked and the run window.
#[test]
fn a_window_that_verifying_shrinks_is_said() {
    let _busy = busy();
    let json = tmp("streaming-shrunk.json");
    let args = ["streaming", "-p", "sim", "-S", "64,8m", "-W", "16", "-I", "20", "-c", "--json"];
    let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
    assert_ok(&out, "streaming -W 16 -c");
    let err = text(&out.stderr);
    assert!(err.contains("note: -W 16 with -c") && err.contains("8388608 B with 8"), "{err}");
    assert!(!err.contains("64 B with"), "64 B keeps its window: {err}");
    let v = read_report(&json, "streaming", "sim", "send", &[64, 8 << 20]);
    assert_eq!(v["window"], 16, "asked");
    assert_eq!(v["results"][0]["window"], 16);
    assert_eq!(v["results"][1]["window"], 8, "64 MiB of 8 MiB messages");
}

/// fabtests' and perftest's habits: -e rdm, -v (verify), -n (iterations)
/// and -a (every size) mean what they mean there; -e msg says why not.
#[test]
fn fabtests_and_perftest_options_are_understood() {
    let _busy = busy();
    let json = tmp("habits.json");
    let args = ["pingpong", "-p", "sim", "-e", "rdm", "-v", "-n", "30", "-S", "64", "--json"];
    let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
    assert_ok(&out, "pingpong -e rdm -v -n 30");
    let v = read_report(&json, "pingpong", "sim", "send", &[64]);
    assert_eq!(v["results"][0]["iterations"], 30, "-n is -I");
    let out = run(&["streaming", "-p", "sim", "-a", "-n", "5", "-W", "4"]);
    assert_ok(&out, "streaming -a");
    let sizes: Vec<String> = rows(&out).iter().map(|r| r[0].clone()).collect();
    assert_eq!(sizes.len(), 24, "1 B to 8 MiB: {sizes:?}");
    assert_eq!((sizes[0].as_str(), sizes[23].as_str()), ("1", "8388608"));
    let err = usage_error(&["pingpong", "-e", "msg"]);
    assert!(err.contains("-e msg") && err.contains("-e rdm"), "{err}");
    let err = usage_error(&["pingpong", "-a", "-S", "64"]);
    assert!(err.contains("--all-sizes") && err.contains("--size"), "{err}");
}

/// The measured time of a result, s: its iterations at its average (a
/// pingpong's times are of half round trips, but for reads and atomics).
fn measured_secs(app: &str, op: &str, r: &Value) -> f64 {
    let n = number(r, "iterations");
    match app {
        "pingpong" if matches!(op, "read" | "atomic") => n * number(r, "t_avg_us") / 1e6,
        "pingpong" => 2.0 * n * number(r, "t_avg_us") / 1e6,
        _ => n * number(r, "usec_per_xfer") / 1e6,
    }
}

/// Duration mode (perftest's -D): each size measures for the time given,
/// its row says how many iterations fit, and both sides agree on the count
/// however it ended (checked with -c, here and across processes).
#[test]
fn a_duration_run_measures_each_size_for_its_time() {
    let _busy = busy();
    let runs: [(&str, &str, &str, &[u64]); 5] = [
        ("pingpong", "sim", "send", &[64, 4096]),
        ("streaming", "sim", "tagged", &[64, 65_536]),
        ("pingpong", "shm", "read", &[64]),
        ("streaming", "shm", "write", &[64, 9000]),
        ("streaming", "shm", "atomic", &[8]),
    ];
    for (app, device, op, sizes) in runs {
        let json = tmp(&format!("duration-{app}-{device}-{op}.json"));
        let list = sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let args = [app, "-p", device, "-o", op, "-S", &list, "-D", "0.2", "-c", "--json"];
        let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
        assert_ok(&out, &format!("{app} -p {device} -o {op} -D 0.2 -c"));
        let v = read_report(&json, app, device, op, sizes);
        assert_eq!(v["meta"]["settings"]["duration_s"], 0.2, "{v}");
        for r in v["results"].as_array().unwrap() {
            let secs = measured_secs(app, op, r);
            // Time decides when a size ends, so at least the time given
            // was measured; 4 significant digits of rounding aside.
            assert!(secs >= 0.199, "{app} -o {op}: {secs} s measured: {r}");
            assert!(number(r, "iterations") >= 100.0, "{r}");
        }
    }
    // Across processes the count crosses the control link before the
    // size's last message: both ends verify every byte of every message.
    let port = free_port();
    let args = ["-S", "64,9000", "-D", "0.2", "-c"];
    let srv = server("streaming", port, &args);
    let out = client("streaming", port, &args);
    let srv = wait(srv, &["--server"]);
    assert_ok(&out, "streaming -D client");
    assert_ok(&srv, "streaming -D server");
    assert_eq!(rows(&srv), rows(&out), "{}", text(&srv.stdout));
    assert_eq!(rows(&out).len(), 2, "{}", text(&out.stdout));
    let err = usage_error(&["pingpong", "-D", "1", "-I", "10"]);
    assert!(err.contains("--duration") && err.contains("--iterations"), "{err}");
    let err = usage_error(&["pingpong", "-D", "0"]);
    assert!(err.contains("--duration") && err.contains("0.001"), "{err}");
}

/// perftest's --report_gbits turns the table's bandwidth into Gbit/s;
/// --csv and --output write the results for spreadsheets and scripts.
#[test]
fn results_in_gbits_and_as_csv() {
    let _busy = busy();
    let csv = tmp("results.csv");
    let args = ["streaming", "-p", "sim", "-S", "64,4k", "-I", "2000", "--report_gbits"];
    let out = run(&[&args[..], &["--output", csv.to_str().unwrap()]].concat());
    assert_ok(&out, "streaming --report_gbits --output FILE.csv");
    assert!(text(&out.stdout).contains("peak_Gb/s") && !text(&out.stdout).contains("MB/s"));
    let table = rows(&out);
    let text_csv = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let lines: Vec<Vec<&str>> = text_csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(lines.len(), 3, "a header and a line per size: {text_csv}");
    let column = |name: &str| lines[0].iter().position(|c| *c == name).expect(name);
    assert_eq!(&lines[0][..4], ["app", "device", "op", "bytes"]);
    for (line, row) in lines[1..].iter().zip(&table) {
        assert_eq!(&line[..3], ["streaming", "sim", "send"]);
        assert_eq!(line[column("bytes")], row[0]);
        let mb: f64 = line[column("bw_avg_mb_s")].parse().unwrap();
        let gbit: f64 = line[column("bw_avg_gbit_s")].parse().unwrap();
        assert!((gbit - mb * 8.0 / 1e3).abs() <= gbit * 1e-3, "{line:?}");
        // The table's avg column is the same figure in Gbit/s.
        let shown: f64 = row[4].parse().unwrap();
        assert!((shown - gbit).abs() <= gbit * 1e-3 + 1e-4, "{row:?} {line:?}");
    }
    let json = tmp("results-gbit.json");
    let args = ["pingpong", "-p", "sim", "-S", "4k", "-I", "200", "--output"];
    let out = run(&[&args[..], &[json.to_str().unwrap()]].concat());
    assert_ok(&out, "pingpong --output FILE.json");
    let v = read_report(&json, "pingpong", "sim", "send", &[4096]);
    let r = &v["results"][0];
    let gbit = number(r, "bw_avg_gbit_s");
    assert!((gbit - number(r, "bw_avg_mb_s") * 8.0 / 1e3).abs() <= gbit * 1e-3, "{r}");
    let err = usage_error(&["pingpong", "--output", "results.txt"]);
    assert!(err.contains("--output") && err.contains(".json or .csv"), "{err}");
    let err = usage_error(&["streaming", "-t", "128"]);
    assert!(err.contains("-t 128") && err.contains("-W") && err.contains("-D SECS"), "{err}");
}

/// A set-up slower than `--timeout` (1,024 lcores on two CPUs in a
/// second) fails at once, saying how far it got and what to do.
#[test]
fn a_set_up_slower_than_the_timeout_says_how_far_it_got() {
    let _busy = busy();
    let started = Instant::now();
    let args = ["pingpong", "-l", "0-511@0,512-1023@1", "--idle", "yield", "--timeout", "1"];
    let out = run(&[&args[..], &["-S", "64"]].concat());
    let err = text(&out.stderr);
    if err.contains("does not exist") {
        return; // a one-core machine
    }
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("of 1024 sides had made their device and endpoint after 1 s"), "{err}");
    assert!(err.contains("raise it"), "{err}");
    // Not after every lcore has set up anyway: the others stop at their
    // next step (the bound is generous, not a speed target).
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    // The header names the lcores as they were given, not one by one.
    assert!(text(&out.stdout).contains("lcores 0-511@0,512-1023@1,"), "{}", text(&out.stdout));
}

/// `--bind` is where the server listens, no other address; and it turns
/// away at most 16 connections that are not its clients, then gives up
/// saying so.
#[test]
fn a_server_listens_where_bind_says_and_gives_up_after_16_bad_connections() {
    let port = free_port();
    let args = ["-S", "64", "--timeout", "30", "--bind", "127.0.0.1"];
    let srv = Reap::new(server("pingpong", port, &args));
    let listening = Instant::now() + Duration::from_secs(10);
    let connect = |ip: &str| std::net::TcpStream::connect((ip, port));
    while connect("127.0.0.1").map(drop).is_err() {
        assert!(Instant::now() < listening, "the server does not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    // That first connection was the first bad one: it sent nothing and
    // closed. Another loopback address of this host is not the one bound.
    let elsewhere = connect("127.0.0.2");
    assert!(elsewhere.is_err(), "127.0.0.2 reached a server bound to 127.0.0.1");
    for _ in 1..16 {
        connect("127.0.0.1").unwrap().write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    }
    let out = wait_within(srv.take(), Duration::from_secs(20), "the server");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().filter(|l| l.contains("rejected a connection")).count(), 16, "{err}");
    assert!(err.contains("gave up after 16 connections"), "{err}");
}

/// A signal ends a run within a second wherever it is: during the set-up
/// of 512 lcores, and in a server whose handshake a silent connection
/// holds.
#[test]
fn a_signal_ends_set_up_and_a_held_handshake_within_a_second() {
    let _busy = busy();
    let args = ["pingpong", "-l", "0-255@0,256-511@1", "--idle", "yield", "-S", "64"];
    let child = Reap::new(
        efapoll().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(),
    );
    std::thread::sleep(Duration::from_millis(700));
    signal(child.id(), "-TERM");
    let out = wait_within(child.take(), Duration::from_secs(1), "512 lcores setting up");
    let err = text(&out.stderr);
    if !err.contains("does not exist") {
        assert_eq!(out.status.code(), Some(130), "{err}");
        assert!(err.contains("interrupted by a signal"), "{err}");
        assert!(rows(&out).is_empty(), "set-up was not over: {}", text(&out.stdout));
    }

    let port = free_port();
    let srv = Reap::new(server("pingpong", port, &["-S", "64"]));
    let listening = Instant::now() + Duration::from_secs(10);
    let _silent = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > listening => panic!("the server does not listen: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    signal(srv.id(), "-INT");
    let out = wait_within(srv.take(), Duration::from_secs(1), "a server in a handshake");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
}

/// Each subcommand's help and errors speak of it, not of the other.
#[test]
fn help_and_usage_errors_are_the_subcommands_own() {
    let pingpong = text(&run(&["pingpong", "--help"]).stdout);
    let streaming = text(&run(&["streaming", "--help"]).stdout);
    assert!(pingpong.contains("Measured round trips per size"), "{pingpong}");
    assert!(pingpong.contains("with CQ data"), "{pingpong}");
    assert!(!pingpong.contains("1 GiB per size"), "{pingpong}");
    assert!(streaming.contains("1 GiB per size"), "{streaming}");
    assert!(streaming.contains("write:  RDMA writes into the peer's buffer\n"), "{streaming}");
    assert!(!streaming.contains("whose completion tells") && !streaming.contains("round trips"));
    let err = usage_error(&["streaming", "-p", "sim", "--server"]);
    assert!(err.contains("Usage: efapoll streaming"), "{err}");
    let err = usage_error(&["pingpong", "-p", "sim", "--server"]);
    assert!(err.contains("Usage: efapoll pingpong"), "{err}");
}

#[test]
fn atomics_default_to_8_bytes() {
    let _busy = busy();
    let out = run(&["pingpong", "-p", "sim", "-o", "atomic", "-I", "20"]);
    assert_ok(&out, "pingpong -o atomic");
    let table = rows(&out);
    assert_eq!(table.len(), 1, "{}", text(&out.stdout));
    assert_eq!(table[0][0], "8");
}

#[test]
fn bad_values_name_the_argument_and_what_is_accepted() {
    // clap names an option by its long form.
    let err = usage_error(&["pingpong", "-S", "12x"]);
    assert!(err.contains("--size") && err.contains("`12x`") && err.contains("all"), "{err}");
    let err = usage_error(&["pingpong", "-S", "4g"]);
    assert!(err.contains("--size") && err.contains("largest size"), "{err}");
    let err = usage_error(&["pingpong", "-l", "x"]);
    assert!(err.contains("--lcores") && err.contains("core list like"), "{err}");
    let err = usage_error(&["pingpong", "-l", "1000"]);
    assert!(err.contains("--lcores") && err.contains("cores available are"), "{err}");
    let err = usage_error(&["pingpong", "-l", "0@"]);
    assert!(err.contains("--lcores") && err.contains("`0@` is not an lcore mapping"), "{err}");
    let err = usage_error(&["pingpong", "-l", "0@0,0@1"]);
    assert!(err.contains("lcore 0 is mapped twice"), "{err}");
    let err = usage_error(&["pingpong", "-l", "0"]);
    assert!(err.contains("-l 0") && err.contains("even number"), "{err}");
    for bad in ["0", "65", "fixed"] {
        let err = usage_error(&["pingpong", "-p", "udp", "--udp-window", bad]);
        assert!(err.contains("--udp-window") && err.contains("1 to 64, or `adaptive`"), "{err}");
    }
    let err = usage_error(&["streaming", "--idle", "sleep"]);
    assert!(err.contains("--idle") && err.contains("spin, pause, yield, backoff"), "{err}");
    let err = usage_error(&["pingpong", "-p", "tcp"]);
    assert!(err.contains("--provider") && err.contains("sim, shm, udp, efa"), "{err}");
    let err = usage_error(&["streaming", "-W", "0"]);
    assert!(err.contains("--window") && err.contains("1..=4096"), "{err}");
    let err = usage_error(&["pingpong", "-I", "0"]);
    assert!(err.contains("--iterations"), "{err}");
}

#[test]
fn a_timeout_past_a_year_is_refused_not_a_panic() {
    for app in ["pingpong", "streaming"] {
        for mode in [&["127.0.0.1"][..], &["--server"], &[]] {
            let mut args = vec![app, "--timeout", "9223372036854775807", "-B", "1"];
            args.extend_from_slice(mode);
            let err = usage_error(&args);
            assert!(err.contains("--timeout") && err.contains("1..=31536000"), "{err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

#[test]
fn info_lists_the_devices_and_what_is_not_built() {
    let out = run(&["info"]);
    assert_ok(&out, "info");
    let info = text(&out.stdout);
    for device in ["sim", "shm", "udp", "efa"] {
        assert!(info.contains(&format!("device: {device}\n")), "{info}");
    }
    // sim, shm, udp; and efa where a device (or softefa) is here.
    assert!(info.matches("status: available").count() >= 3, "{info}");
    if cfg!(feature = "efa") {
        let efa = &info[info.find("device: efa").unwrap()..];
        assert!(efa.contains("status: available") || efa.contains("no "), "{efa}");
    } else {
        assert_eq!(info.matches("status: not built").count(), 1, "{info}");
    }
    assert!(info.contains("mtu: 8192"), "{info}");
    // Caller-owned memory registers on sim and udp, not on shm (a peer
    // maps it).
    let external: Vec<_> = info.lines().filter(|l| l.contains("external_memory:")).collect();
    let (yes, no) = ("    external_memory: yes", "    external_memory: no");
    assert_eq!(external[..3], [yes, no, yes], "{info}");
    // udp: a loopback address (IPv4 mapped) and the buffers the kernel gave.
    let udp = &info[info.find("device: udp").unwrap()..];
    assert!(udp.contains("address: 0000:0000:0000:0000:0000:ffff:7f00:0001/qpn "), "{udp}");
    let buffers = udp.lines().find(|l| l.contains("socket_buffers: send ")).expect(udp);
    assert!(buffers.contains("receive ") && buffers.contains("(asked 4194304)"), "{buffers}");
    let memcpy = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("memcpy_1MiB_MB/s: "))
        .and_then(|v| v.split(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no memcpy reference: {info}"));
    assert!(memcpy > 100.0, "a 1 MiB copy at {memcpy} MB/s: {info}");
}

/// One device's `key: value` lines of `efapoll info`'s text.
fn info_fields<'a>(text: &'a str, device: &str) -> Vec<(&'a str, &'a str)> {
    let start = text.find(&format!("device: {device}\n")).unwrap_or_else(|| panic!("{text}"));
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .filter_map(|l| l.trim().split_once(": "))
        .collect()
}

/// `info --json` says what the text says, numbers as numbers and yes/no
/// as booleans.
#[test]
fn info_json_has_the_texts_fields() {
    let text = text(&run(&["info"]).stdout);
    let out = run(&["info", "--json"]);
    assert_ok(&out, "info --json");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = v["devices"].as_array().unwrap();
    let names: Vec<&str> = devices.iter().map(|d| d["device"].as_str().unwrap()).collect();
    assert_eq!(names, ["sim", "shm", "udp", "efa"]);
    for d in devices {
        let name = d["device"].as_str().unwrap();
        let fields = info_fields(&text, name);
        let about = fields.iter().find(|(k, _)| *k == "about").unwrap().1;
        assert_eq!(d["about"], about);
        if name == "efa" && !cfg!(feature = "efa") {
            assert_eq!(
                (&d["status"], &d["reason"]),
                (&json!("not built"), &json!("this efapoll has no efa feature"))
            );
            continue;
        }
        if name == "efa" && d["status"] != "available" {
            assert_eq!(d["status"], "unavailable", "{d}");
            continue;
        }
        assert_eq!(d["status"], "available", "{d}");
        // The text's keys are the JSON's, but for the address (another
        // device each run) and where the text writes a unit after a value.
        for (key, value) in fields {
            let json = match key {
                "about" | "status" | "address" => continue,
                "device_version" => format!("{:#x}", d[key].as_u64().unwrap()),
                "peer_timeout" => format!("{} s", d["peer_timeout_s"]),
                "retransmission_timeout" => {
                    let r = &d["retransmission_timeout_us"];
                    format!("{} us to {} us, from the measured round trip", r["min"], r["max"])
                }
                "socket_buffers" => {
                    let b = &d[key];
                    format!("send {}, receive {} (asked {})", b["send"], b["receive"], b["asked"])
                }
                "window" => {
                    assert_eq!(d[key], "adaptive");
                    continue;
                }
                _ => match &d[key] {
                    Value::Bool(b) => if *b { "yes" } else { "no" }.to_owned(),
                    Value::Number(n) => n.to_string(),
                    other => panic!("{name}: {key} is {other}, not a number or a boolean"),
                },
            };
            assert_eq!(json, value, "{name}: {key}");
        }
        assert!(d["address"].as_str().is_some_and(|a| a.contains("/qpn ")), "{d}");
    }
    assert!(v["host"]["memcpy_1mib_mb_s"].as_u64().is_some_and(|m| m > 100), "{v}");
}

/// `info DEVICE` lists that device alone; a name that is none of them is
/// a usage error naming those that are.
#[test]
fn info_lists_one_device_when_asked() {
    for device in ["sim", "shm", "udp", "efa"] {
        let out = run(&["info", device]);
        assert_ok(&out, &format!("info {device}"));
        let listed: Vec<String> = text(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("device: ").map(str::to_owned))
            .collect();
        assert_eq!(listed, [device]);
        let v: Value = serde_json::from_slice(&run(&["info", device, "--json"]).stdout).unwrap();
        assert_eq!(v["devices"].as_array().unwrap().len(), 1);
        assert_eq!(v["devices"][0]["device"], device);
    }
    let err = usage_error(&["info", "tcp"]);
    assert!(err.contains("'tcp'") && err.contains("DEVICE"), "{err}");
    assert!(err.contains("sim, shm, udp, efa"), "{err}");
}

/// `-v` adds each device's own limits and the address's parts to what
/// the text and the JSON always show.
#[test]
fn info_verbose_adds_each_devices_own_limits() {
    let plain = text(&run(&["info"]).stdout);
    let out = run(&["info", "-v"]);
    assert_ok(&out, "info -v");
    let verbose = text(&out.stdout);
    let keys = |text: &str, device: &str| -> Vec<String> {
        info_fields(text, device).iter().map(|(k, _)| k.to_string()).collect()
    };
    let extra = [
        ("sim", &["address_gid", "address_qpn", "address_connid", "seed", "retransmit_ns"][..]),
        ("shm", &["address_qpn", "lanes", "ring_slots", "segment_bytes"]),
        ("udp", &["address_qpn", "local_socket", "read_jobs", "ack_delay_us", "max_sessions"]),
    ];
    for (device, added) in extra {
        let (short, long) = (keys(&plain, device), keys(&verbose, device));
        assert!(short.iter().all(|k| long.contains(k)), "{device}: {long:?}");
        for key in added {
            assert!(long.iter().any(|k| k == key) && !short.contains(&key.to_string()), "{key}");
        }
    }
    let shm = info_fields(&verbose, "shm");
    let get = |k: &str| shm.iter().find(|(key, _)| *key == k).unwrap().1.parse::<u64>().unwrap();
    assert_eq!(get("segment_bytes"), get("lanes") * get("ring_slots") * get("mtu"));
    let v: Value = serde_json::from_slice(&run(&["info", "udp", "--json", "-v"]).stdout).unwrap();
    let udp = &v["devices"][0];
    for key in ["address_qpn", "read_jobs", "ack_delay_us", "max_sessions", "connected_peers"] {
        assert!(udp[key].is_u64(), "{key}: {udp}");
    }
    let socket = udp["local_socket"].as_str().unwrap();
    assert!(socket.ends_with(&format!(":{}", udp["address_qpn"])), "{udp}");
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    // `efapoll info | head -1`: the reader is gone before the report is
    // written.
    let mut child =
        efapoll().arg("info").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}: {}", out.status, text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
}

#[test]
fn help_documents_the_exit_status() {
    let out = run(&["--help"]);
    assert_ok(&out, "--help");
    let help = text(&out.stdout);
    assert!(help.contains("Exit status") && help.contains("2  bad arguments"), "{help}");
    for command in ["pingpong", "streaming", "info", "decode"] {
        assert!(help.contains(command), "{help}");
    }
}

/// Sends `signal` to the process `pid` with the system's `kill`.
fn signal(pid: u32, signal: &str) {
    let ok = Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill {signal} {pid}");
}

#[test]
fn a_peer_that_dies_or_stops_answering_fails_the_run() {
    let _busy = busy();
    let endless = ["-S", "64", "-I", "1000000000", "--timeout", "1"];
    for (how, expect) in [("-KILL", "peer gone"), ("-STOP", "timeout: nothing moved for 1 s")] {
        let port = free_port();
        let mut srv = server("pingpong", port, &endless);
        let port = port.to_string();
        let mut args = vec!["pingpong", "127.0.0.1", "-B", &port];
        args.extend_from_slice(&endless);
        let cl =
            efapoll().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(700));
        signal(srv.id(), how);
        let out = wait(cl, &args);
        let _ = srv.kill();
        let _ = srv.wait();
        assert_eq!(out.status.code(), Some(1), "{how}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(expect), "{how}: {}", text(&out.stderr));
    }
}

/// Waits for `child` at most `limit`; kills it and fails the test past it.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still ran after {limit:?}; stderr: {}", text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Starts the client of `app` on `port` with `args`.
fn spawn_client(app: &str, port: u16, args: &[&str]) -> Child {
    efapoll()
        .args([app, "127.0.0.1", "-B", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Kills a child that a test stopped or left running, and reaps it.
struct Reap(Option<Child>);

impl Reap {
    fn new(child: Child) -> Reap {
        Reap(Some(child))
    }

    fn id(&self) -> u32 {
        self.0.as_ref().expect("not taken").id()
    }

    /// The child, to wait for: no longer killed on drop.
    fn take(mut self) -> Child {
        self.0.take().expect("not taken")
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_one_sided_target_times_out_when_its_client_stops() {
    let _busy = busy();
    // The target sees none of the operations: only the control link can
    // tell it that the initiator stopped.
    let runs = [
        ("pingpong", "read"),
        ("streaming", "write"),
        ("streaming", "read"),
        ("streaming", "atomic"),
    ];
    for (app, op) in runs {
        let port = free_port();
        let args = ["-o", op, "-I", "1000000000", "--timeout", "2"];
        let srv = server(app, port, &args);
        let cl = Reap::new(spawn_client(app, port, &args));
        std::thread::sleep(Duration::from_millis(1000));
        signal(cl.id(), "-STOP");
        let out = wait_within(srv, Duration::from_secs(20), &format!("{app} -o {op} --server"));
        drop(cl);
        assert_eq!(out.status.code(), Some(1), "{app} -o {op}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains("timeout: nothing moved for 2 s"), "{app} -o {op}: {err}");
    }
}

#[test]
fn a_stopped_streaming_server_ends_its_client_after_one_timeout() {
    let _busy = busy();
    let port = free_port();
    let args = ["-S", "64", "-I", "1000000000", "--timeout", "3"];
    let srv = Reap::new(server("streaming", port, &args));
    let cl = spawn_client("streaming", port, &args);
    std::thread::sleep(Duration::from_millis(1000));
    signal(srv.id(), "-STOP");
    let stopped = Instant::now();
    let out = wait_within(cl, Duration::from_secs(30), "streaming client");
    let took = stopped.elapsed();
    drop(srv);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("timeout: nothing moved for 3 s"), "{}", text(&out.stderr));
    // One --timeout of silence, then the exit: no second wait for the
    // peer's end, nor a third for its shutdown.
    assert!(took < Duration::from_millis(5500), "the client took {took:?} after the stop");
}

#[test]
fn a_signal_ends_a_waiting_server_at_once_and_says_so() {
    for sig in ["-TERM", "-INT"] {
        let port = free_port();
        let srv = Reap::new(server("pingpong", port, &["-S", "64"]));
        std::thread::sleep(Duration::from_millis(500));
        signal(srv.id(), sig);
        let out = wait_within(srv.take(), Duration::from_secs(1), "the waiting server");
        assert_eq!(out.status.code(), Some(130), "{sig}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("interrupted by a signal"), "{}", text(&out.stderr));
    }
}

#[test]
fn a_signal_ends_a_client_whose_server_accepts_and_never_answers() {
    // A listener that takes the connection and says nothing: the client's
    // handshake would wait for its whole --timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    let args = ["pingpong", "127.0.0.1", "-B", &port.to_string(), "--timeout", "60"];
    let child = Reap::new(
        efapoll().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(),
    );
    let _held = silent.join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    signal(child.id(), "-TERM");
    let out = wait_within(child.take(), Duration::from_secs(1), "the client in its handshake");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("interrupted by a signal"), "{}", text(&out.stderr));
}

#[test]
fn a_signal_mid_run_prints_the_rows_done_and_says_it_was_interrupted() {
    let _busy = busy();
    // The first size is done in well under a second, the second takes
    // many: 100,000 round trips of 8 MiB, some 30 s on sim (5,000 took
    // 1.6 s in all on a fast host, and once ended before the signal).
    let args = ["pingpong", "-p", "sim", "-S", "64,8m", "-I", "100000"];
    let child = Reap::new(
        efapoll().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    signal(child.id(), "-TERM");
    let out = wait_within(child.take(), Duration::from_secs(1), "pingpong -p sim");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert_eq!(rows(&out).len(), 1, "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("interrupted by a signal"), "{}", text(&out.stderr));

    // A server and its client: the server says it was interrupted, not
    // that its peer failed; the client, that its peer was interrupted.
    let port = free_port();
    let args = ["-S", "64", "-I", "1000000000"];
    let srv = Reap::new(server("pingpong", port, &args));
    let cl = spawn_client("pingpong", port, &args);
    std::thread::sleep(Duration::from_millis(1000));
    signal(srv.id(), "-TERM");
    let srv = wait_within(srv.take(), Duration::from_secs(1), "the server");
    let out = wait_within(cl, Duration::from_secs(15), "the client");
    assert_eq!(srv.status.code(), Some(130), "{}", text(&srv.stderr));
    let err = text(&srv.stderr);
    assert!(err.contains("interrupted by a signal") && !err.contains("peer"), "{err}");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("the peer failed: interrupted"), "{}", text(&out.stderr));
}

/// `-o smbd`: both apps over sim and shm, every byte verified after
/// reassembly; the counters show SMB Direct's segments; and as server and
/// client, two processes that each make their side of the connection.
#[test]
fn smbd_frames_messages_as_smb_direct_and_verifies_them() {
    let _busy = busy();
    // With short messages alone every segment lands in the connection's
    // receive ring, 64 and 100 bytes as 88 and 124: the lengths shm
    // copies in line there (`Device::copy_to_slot`).
    let size_sets: [(&str, &[u64]); 2] =
        [("1,64,100,9000,1m", &[1, 64, 100, 9000, 1 << 20]), ("1,64,100", &[1, 64, 100])];
    let apps =
        [("pingpong", "sim"), ("streaming", "sim"), ("pingpong", "shm"), ("streaming", "shm")];
    let runs =
        apps.into_iter().flat_map(|a| size_sets.into_iter().enumerate().map(move |s| (a, s)));
    for ((app, device), (set, (size_arg, sizes))) in runs {
        let json = tmp(&format!("smbd-{app}-{device}-{set}.json"));
        let out = run(&[
            app,
            "-p",
            device,
            "-o",
            "smbd",
            "-S",
            size_arg,
            "-I",
            "50",
            "-c",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert_ok(&out, &format!("{app} -p {device} -o smbd -c -S {size_arg}"));
        let v = read_report(&json, app, device, "smbd", sizes);
        for r in v["results"].as_array().unwrap() {
            if app == "pingpong" {
                check_pingpong_row(r, 50, 1.0);
            } else {
                check_streaming_row(r, 50);
            }
        }
        let c = &v["counters"];
        let segments = c["smbd.segments_sent"].as_u64().unwrap_or(0);
        // A segment per message at least (segments hold the largest size).
        assert!(segments >= 50 * sizes.len() as u64, "{app} {device}: {c}");
        assert!(c.get("smbd.segments_received").is_some(), "{app} {device}: {c}");
        // Messages of 1, 64 and 100 bytes are lent where they landed,
        // checked there: at least the 50 measured of each size reached a
        // receiver that way.
        let receiver = if app == "pingpong" { c } else { &v["passive_counters"] };
        let lent = receiver["smbd.lent"].as_u64().unwrap_or(0);
        assert!(lent >= 150, "{app} {device}: {receiver}");
        // A stream's messages that short are sent by inject, which reports
        // nothing: counted done as they go.
        if app == "streaming" {
            let injected = c["smbd.injected"].as_u64().unwrap_or(0);
            assert!(injected >= 100, "{app} {device}: {c}");
        }
    }
    // An empty buffer is SMB Direct's empty message, which delivers nothing.
    let err = usage_error(&["streaming", "-o", "smbd", "-S", "0,64"]);
    assert!(err.contains("-o smbd takes sizes from 1 byte"), "{err}");
    for app in ["pingpong", "streaming"] {
        server_and_client(app, "shm", "smbd");
    }
}

/// `-p efa` on softefa (`LD_PRELOAD`), as two processes: against `-p efa`
/// and against `-p udp` (one wire), every operation verified (`-c`).
#[cfg(feature = "efa")]
mod efa {
    use super::*;

    /// The built `libsoftefa.so`, beside the test (`target/<profile>/deps`,
    /// where a test build of the workspace puts it) or in the profile's
    /// directory (`cargo build -p softefa`). A missing library fails: the
    /// feature promises these runs.
    fn softefa() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let dirs = [deps, deps.parent().unwrap()];
        let lib = dirs.iter().map(|d| d.join("libsoftefa.so")).find(|l| l.exists());
        lib.unwrap_or_else(|| panic!("no libsoftefa.so in {dirs:?}: `cargo build -p softefa`"))
    }

    /// `efapoll APP -p DEVICE ARGS`, preloaded with softefa for `-p efa`.
    fn side(app: &str, device: &str, args: &[&str]) -> Command {
        let mut cmd = efapoll();
        cmd.arg(app).args(["-p", device]).args(args);
        if device == "efa" {
            cmd.env("LD_PRELOAD", softefa());
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }

    /// A server on `server_dev` and a client on `client_dev` run `app -o
    /// op` over `sizes` with `-c`; both exit 0, report the sizes run and
    /// print the same rows.
    fn across(app: &str, server_dev: &str, client_dev: &str, op: &str, sizes: &[u64]) {
        let port = free_port().to_string();
        let list = sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let what = format!("{app} -o {op}: {server_dev} server, {client_dev} client");
        let json = tmp(&format!("{app}-{op}-{server_dev}-{client_dev}.json"));
        let common = ["-o", op, "-S", &list, "-I", "30", "-c", "-B", &port];
        let srv = side(app, server_dev, &common).arg("--server").spawn().unwrap();
        let mut srv = KillOnDrop(Some(srv));
        let json_arg = json.to_str().unwrap();
        let mut cli = side(app, client_dev, &common);
        let out = wait(cli.args(["127.0.0.1", "--json", json_arg]).spawn().unwrap(), &[&what]);
        let srv = wait(srv.0.take().unwrap(), &[&what]);
        assert_ok(&out, &format!("{what}: the client"));
        assert_ok(&srv, &format!("{what}: the server"));
        assert_eq!(rows(&out).len(), sizes.len(), "{what}: {}", text(&out.stdout));
        assert_eq!(rows(&srv), rows(&out), "{what}: {}", text(&srv.stdout));
        let v = read_report(&json, app, client_dev, op, sizes);
        assert!(v["counters"]["handshakes_received"].as_u64() >= Some(1), "{what}: {v}");
    }

    /// Every operation, pingpong and streaming, efa<->efa and efa<->udp
    /// (the efa side the server for pingpong, the client for streaming),
    /// up to 1 MiB.
    #[test]
    fn efa_on_softefa_runs_every_operation_against_efa_and_udp() {
        let _busy = busy();
        for app in ["pingpong", "streaming"] {
            for op in ["send", "tagged", "write", "read", "atomic", "smbd"] {
                let sizes: &[u64] = if op == "atomic" { &[8] } else { &[1, 9000, 1 << 20] };
                across(app, "efa", "efa", op, sizes);
                if app == "pingpong" {
                    across(app, "efa", "udp", op, sizes);
                } else {
                    across(app, "udp", "efa", op, sizes);
                }
            }
        }
    }
}
