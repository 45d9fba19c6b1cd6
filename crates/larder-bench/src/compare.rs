//! `larder-bench compare`: larder next to nginx in one run, on one machine.
//!
//! Starts a release `larder` and Debian's nginx (one worker, access log off, sendfile on,
//! WebDAV PUT: one file per key) on loopback, both pinned to one core, the loader pinned to
//! the other; preloads the same values into both; then runs the standard suite, alternating
//! larder and nginx (A B A B), and reports medians with the min–max spread, server CPU per
//! request, as markdown and JSON.

use crate::http::{self, parse_duration, HttpArgs};
use crate::report::Summary;
use crate::workload::{Dist, Kind, Size, Workload};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `larder-bench compare` flags.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The larder binary (a release build).
    #[arg(long, default_value = "target/release/larder")]
    pub larder: PathBuf,
    /// The nginx binary.
    #[arg(long, default_value = "/usr/sbin/nginx")]
    pub nginx: PathBuf,
    /// nginx configuration template (@DIR@ and @PORT@ are replaced).
    #[arg(long, default_value = "bench/nginx.conf.in")]
    pub nginx_conf: PathBuf,
    /// Length of each measured run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Runs per server and workload (alternating larder, nginx, larder, nginx, …).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Scale of the key sets: 1.0 = 100,000 keys of 4 KiB, 10,000 of 64 KiB, 500 of 1 MiB.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Only these workloads (comma-separated names, e.g. G4K,P4K).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Core the servers are pinned to.
    #[arg(long, default_value_t = 1)]
    pub server_core: usize,
    /// Core the loader is pinned to.
    #[arg(long, default_value_t = 0)]
    pub loader_core: usize,
    /// Where to write the markdown table and the JSON results (`<out>.md`, `<out>.json`).
    #[arg(long, default_value = "bench/results/latest")]
    pub out: PathBuf,
    /// Also replace the table between the compare markers in this file (BENCHMARKS.md).
    #[arg(long)]
    pub update: Option<PathBuf>,
    /// Also run the large-value workloads (P64M, G64M, P1G, G1G; `--only` selects among them
    /// too): values streamed over a few connections, throughput, CPU per GiB and peak RSS.
    #[arg(long)]
    pub large: bool,
    /// More `larder serve` arguments, after the runner's own, e.g.
    /// `--larder-arg=--memory-capacity=2GiB` (not the runner's `--volume-size`,
    /// `--volume-count` or `--log-level`). The results' first line names them.
    #[arg(long = "larder-arg", allow_hyphen_values = true)]
    pub larder_args: Vec<String>,
    /// Instead of the nginx suite: larder's memcached protocol next to Debian's memcached 1.6,
    /// all in RAM, then a million keys over 64 MiB of RAM (memcached with extstore on disk).
    #[arg(long)]
    pub memcached: bool,
    /// Instead of the nginx suite: larder's read-through mode (`--origin`) next to nginx's
    /// proxy_cache, both in front of one nginx origin: cold pass, hits, restart without the origin.
    #[arg(long)]
    pub proxy: bool,
}

/// A large-value workload: `conns` connections at once, each making `per_conn` requests.
struct LargeSpec {
    name: &'static str,
    method: &'static str,
    size: u64,
    conns: usize,
    per_conn: usize,
}

fn large_suite() -> Vec<LargeSpec> {
    let s = |name, method, size, conns, per_conn| LargeSpec { name, method, size, conns, per_conn };
    vec![
        s("P64M", "PUT", 64 << 20, 4, 4),
        s("G64M", "GET", 64 << 20, 4, 8),
        s("P1G", "PUT", 1 << 30, 1, 2),
        s("G1G", "GET", 1 << 30, 1, 3),
    ]
}

/// One measured run of a large workload.
#[derive(Debug, Clone, Serialize)]
pub struct LargeRun {
    workload: String,
    server: String,
    round: usize,
    mib_per_s: f64,
    cpu_ms_per_gib: f64,
    rss_growth_mib: f64,
}

/// One workload of the standard suite.
struct Spec {
    name: &'static str,
    kind: Kind,
    size: usize,
    /// Key set (preloaded for GET and mixed; written fresh for PUT).
    set: &'static str,
    dist: Dist,
    /// Upper bound of PUTs in one run, to bound the disk a run fills.
    max_requests: Option<u64>,
}

fn suite() -> Vec<Spec> {
    let s = |name, kind, size, set, dist, max_requests| Spec { name, kind, size, set, dist, max_requests };
    vec![
        s("P4K", Kind::Put, 4 << 10, "p4k", Dist::Sequential, None),
        s("G4K", Kind::Get, 4 << 10, "g4k", Dist::Uniform, None),
        s("G4K-zipf", Kind::Get, 4 << 10, "g4k", Dist::Zipf(0.99), None),
        s("P64K", Kind::Put, 64 << 10, "p64k", Dist::Sequential, Some(30_000)),
        s("G64K", Kind::Get, 64 << 10, "g64k", Dist::Uniform, None),
        s("P1M", Kind::Put, 1 << 20, "p1m", Dist::Sequential, Some(2_000)),
        s("G1M", Kind::Get, 1 << 20, "g1m", Dist::Uniform, None),
        s("MIX4K", Kind::Mixed, 4 << 10, "g4k", Dist::Uniform, None),
    ]
}

/// A server under test.
pub(crate) struct Server {
    pub name: &'static str,
    pub port: u16,
    pub child: Child,
}

impl Server {
    /// The process and its children (nginx's worker).
    fn pids(&self) -> Vec<u32> {
        let pid = self.child.id();
        let mut pids = vec![pid];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    pids.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
                }
            }
        }
        pids
    }

    /// Server CPU time so far (the process and its children), in µs.
    pub fn cpu_us(&self) -> u64 {
        self.pids().iter().map(|p| proc_cpu_ticks(*p)).sum::<u64>() * 1_000_000 / clock_ticks()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: nginx's master then stops its worker, which would otherwise
        // keep the port (reuseport) and answer the next run from a deleted directory.
        // SAFETY: kill only sends a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of a process, in clock ticks (0 if it is gone).
fn proc_cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

pub(crate) fn wait_ready(port: u16) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on port {port} after 30 s")
}

/// Waits until larder's HTTP door on `port` answers `/_larder/health` with 200: it accepts
/// connections before its store is open and answers 503 "recovering" meanwhile, which a load
/// started too early would count as failures (on a busy machine recovery takes seconds).
pub(crate) fn wait_healthy(port: u16) -> Result<()> {
    use std::io::{Read, Write};
    wait_ready(port)?;
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        let answer = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET /_larder/health HTTP/1.1\r\nhost: larder\r\nconnection: close\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        });
        match answer {
            Ok(text) if text.starts_with("HTTP/1.1 200") => return Ok(()),
            Ok(text) => last = text.lines().next().unwrap_or_default().to_owned(),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("larder on port {port} was not healthy after 60 s (last answer: {last})")
}

/// Pins the calling thread, and so every thread it starts afterwards, to `core`.
fn pin_current_thread(core: usize) {
    // SAFETY: the cpu_set_t is zeroed and then filled with the libc helpers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn start_servers(a: &CompareArgs, dir: &Path) -> Result<(Server, Server)> {
    if !a.nginx.exists() {
        // Debian's nginx, as the peer configuration expects; the same script the tests use.
        eprintln!("{:?} is missing: running scripts/install-bench-deps.sh", a.nginx);
        let ok = Command::new("scripts/install-bench-deps.sh").status().is_ok_and(|s| s.success());
        if !ok || !a.nginx.exists() {
            bail!("no nginx at {:?}: install Debian's nginx-light (scripts/install-bench-deps.sh)", a.nginx);
        }
    }
    let core = a.server_core.to_string();
    let larder_port = 18_234;
    let nginx_port = 18_080;
    for port in [larder_port, nginx_port] {
        // Both servers listen with SO_REUSEPORT semantics available: a stale server on the
        // same port would silently take part of the load.
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            bail!("port {port} is already in use: stop whatever listens there first");
        }
    }
    let larder = Command::new("taskset")
        .args(["-c", &core])
        .arg(&a.larder)
        .args(["serve", "--listen", &format!("127.0.0.1:{larder_port}"), "--data-dir"])
        .arg(dir.join("larder"))
        .args(["--volume-size", "1GiB", "--volume-count", "24"])
        // Slow-request warnings would bury the progress lines; errors still show.
        .args(["--log-level", "error"])
        .args(&a.larder_args)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {:?} (build it with cargo build --release)", a.larder))?;
    let larder = Server { name: "larder", port: larder_port, child: larder };
    let ngx = dir.join("ngx");
    for d in ["logs", "tmp", "root"] {
        std::fs::create_dir_all(ngx.join(d))?;
    }
    let conf = std::fs::read_to_string(&a.nginx_conf).with_context(|| format!("reading {:?}", a.nginx_conf))?;
    let conf = conf.replace("@DIR@", &ngx.to_string_lossy()).replace("@PORT@", &nginx_port.to_string());
    std::fs::write(ngx.join("nginx.conf"), conf)?;
    let nginx = Command::new("taskset")
        .args(["-c", &core])
        .arg(&a.nginx)
        .arg("-c")
        .arg(ngx.join("nginx.conf"))
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {:?} (scripts/install-bench-deps.sh installs it)", a.nginx))?;
    let nginx = Server { name: "nginx", port: nginx_port, child: nginx };
    wait_healthy(larder_port)?;
    wait_ready(nginx_port)?;
    Ok((larder, nginx))
}

fn load(port: u16, spec: &Spec, keys: u64, start: u64, duration: Duration, requests: Option<u64>) -> Result<Summary> {
    let args = HttpArgs {
        url: format!("http://127.0.0.1:{port}/{}-", spec.set),
        connections: 64,
        threads: 1,
        duration,
        requests,
        rate: None,
        check_length: spec.kind == Kind::Get,
        keyed_values: false,
        allow_misses: false,
        max_error_ratio: 0.001,
        json: None,
        quiet: true,
        workload: Workload {
            workload: spec.kind,
            get_ratio: 0.9,
            value_size: Size { min: spec.size, max: spec.size },
            keys,
            start,
            distribution: spec.dist,
            seed: 42,
        },
    };
    http::run(args)
}

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    workload: String,
    server: String,
    round: usize,
    summary: Summary,
    cpu_us_per_request: f64,
}

/// Medians and spread of a workload on one server.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    workload: String,
    server: String,
    req_per_s: f64,
    req_per_s_min: f64,
    req_per_s_max: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us_per_request: f64,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn rows(runs: &[Run], workload: &str, server: &str) -> Row {
    let sel: Vec<&Run> = runs.iter().filter(|r| r.workload == workload && r.server == server).collect();
    let rps: Vec<f64> = sel.iter().map(|r| r.summary.req_per_s).collect();
    Row {
        workload: workload.to_string(),
        server: server.to_string(),
        req_per_s: median(rps.clone()),
        req_per_s_min: rps.iter().copied().fold(f64::INFINITY, f64::min),
        req_per_s_max: rps.iter().copied().fold(0.0, f64::max),
        p50_ms: median(sel.iter().map(|r| r.summary.latency.p50_us as f64 / 1000.0).collect()),
        p99_ms: median(sel.iter().map(|r| r.summary.latency.p99_us as f64 / 1000.0).collect()),
        cpu_us_per_request: median(sel.iter().map(|r| r.cpu_us_per_request).collect()),
    }
}

fn table(rows: &[(Row, Row)]) -> String {
    let mut s = String::from(
        "| workload | larder req/s (min–max) | nginx req/s (min–max) | larder/nginx | larder p50 / p99 ms | nginx p50 / p99 ms | server CPU µs/req larder / nginx |\n|---|---|---|---|---|---|---|\n",
    );
    for (l, n) in rows {
        s.push_str(&format!(
            "| {} | {:.0} ({:.0}–{:.0}) | {:.0} ({:.0}–{:.0}) | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} / {:.1} |\n",
            l.workload,
            l.req_per_s,
            l.req_per_s_min,
            l.req_per_s_max,
            n.req_per_s,
            n.req_per_s_min,
            n.req_per_s_max,
            l.req_per_s / n.req_per_s.max(1e-9),
            l.p50_ms,
            l.p99_ms,
            n.p50_ms,
            n.p99_ms,
            l.cpu_us_per_request,
            n.cpu_us_per_request
        ));
    }
    s
}

fn command_output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine(dir: &Path) -> String {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string()))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or("?".into(), |kb| format!("{:.1} GiB", kb as f64 / 1048576.0));
    let disk = command_output("df", &["-h", "--output=source,fstype,size,avail", &dir.to_string_lossy()]);
    let disk = disk.lines().last().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ");
    format!(
        "nproc {}, RAM {mem}, disk {disk}; {}; commit {}",
        command_output("nproc", &[]),
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        command_output("git", &["rev-parse", "--short", "HEAD"])
    )
}

/// The space left on the file system of `dir`, for people.
fn free_space(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return "unknown space left".into() };
    // SAFETY: a NUL-terminated path and a zeroed struct, which the call fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return "unknown space left".into();
    }
    format!("{:.1} GiB left", st.f_bavail as f64 * st.f_frsize as f64 / (1u64 << 30) as f64)
}

/// Runs the suite.
pub fn run(a: CompareArgs) -> Result<()> {
    let started = Instant::now();
    let tmp = std::env::temp_dir().join(format!("larder-compare-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    // Described before pinning: `nproc` counts only the cores this process may use.
    let machine = machine(&tmp);
    pin_current_thread(a.loader_core);
    let result = if a.memcached {
        crate::memcompare::run_in(&a, &tmp, &machine)
    } else if a.proxy {
        crate::proxycompare::run_in(&a, &tmp, &machine)
    } else {
        run_in(&a, &tmp, &machine).map(|(md, runs)| (md, serde_json::to_value(runs).unwrap_or_default()))
    };
    // A server that cannot write answers 500s: the space left says whether that is why.
    let result = result.map_err(|e| e.context(format!("the suite failed; {} at {}", free_space(&tmp), tmp.display())));
    let _ = std::fs::remove_dir_all(&tmp);
    let (md, runs) = result?;
    eprintln!("suite done in {:.0} s", started.elapsed().as_secs_f64());
    if let Some(parent) = a.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(a.out.with_extension("md"), &md)?;
    std::fs::write(a.out.with_extension("json"), serde_json::to_vec_pretty(&runs)?)?;
    if a.memcached || a.proxy {
        println!("{md}");
        return Ok(());
    }
    println!("{md}");
    if let Some(path) = &a.update {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path:?}"))?;
        let (begin, end) = ("<!-- compare:begin -->", "<!-- compare:end -->");
        let (Some(b), Some(e)) = (text.find(begin), text.find(end)) else {
            bail!("{path:?} has no {begin} … {end} markers");
        };
        let new = format!("{}{begin}\n{md}{}", &text[..b], &text[e..]);
        std::fs::write(path, new)?;
    }
    Ok(())
}

fn run_in(a: &CompareArgs, dir: &Path, machine: &str) -> Result<(String, Vec<Run>)> {
    let (larder, nginx) = start_servers(a, dir)?;
    let specs: Vec<Spec> = suite()
        .into_iter()
        .filter(|s| a.only.is_empty() || a.only.iter().any(|o| o.eq_ignore_ascii_case(s.name)))
        .collect();
    if specs.is_empty() && !a.large {
        bail!("--only names no workload of the suite (the large ones need --large)");
    }
    let scaled = |n: f64| ((n * a.scale).round() as u64).max(10);
    let set_keys = |set: &str| match set {
        "g4k" => scaled(100_000.0),
        "g64k" => scaled(10_000.0),
        "g1m" => scaled(500.0),
        _ => 1 << 40, // PUT sets: every request a new key
    };
    // Preload the GET key sets into both servers, identical values (same seed).
    let mut preloaded = Vec::new();
    for s in specs.iter().filter(|s| s.kind != Kind::Put) {
        if preloaded.contains(&s.set) {
            continue;
        }
        preloaded.push(s.set);
        for srv in [&larder, &nginx] {
            let keys = set_keys(s.set);
            eprintln!("preloading {keys} keys of {} B ({}) into {}", s.size, s.set, srv.name);
            let pre = Spec { kind: Kind::Put, dist: Dist::Sequential, max_requests: None, ..*s };
            load(srv.port, &pre, keys, 0, Duration::from_secs(3600), Some(keys))?;
        }
    }
    let mut runs = Vec::new();
    let mut run_no = 0u64;
    for spec in &specs {
        for round in 1..=a.rounds {
            for srv in [&larder, &nginx] {
                let keys = set_keys(spec.set);
                // PUT runs write keys never written before; both servers get the same ones.
                let start = if spec.kind == Kind::Put { 1_000_000_000 * round as u64 } else { 0 };
                run_no += 1;
                // Start every run from clean page cache: otherwise the dirty pages of the
                // previous run (the other server's) are written back during this one.
                // SAFETY: sync takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let cpu0 = srv.cpu_us();
                let summary = load(srv.port, spec, keys, start, a.duration, spec.max_requests)
                    .with_context(|| format!("{} against {}", spec.name, srv.name))?;
                let cpu = srv.cpu_us().saturating_sub(cpu0) as f64 / summary.requests.max(1) as f64;
                eprintln!(
                    "[{:>2}] {:<8} round {round} {:<6} {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  cpu {:>5.1} us/req",
                    run_no,
                    spec.name,
                    srv.name,
                    summary.req_per_s,
                    summary.latency.p50_us as f64 / 1000.0,
                    summary.latency.p99_us as f64 / 1000.0,
                    cpu
                );
                if summary.errors > 0 {
                    // Below the 0.1% that fails a run, but worth seeing: a preloaded key must
                    // never answer anything but 200.
                    eprintln!("     {} errors: {:?}", summary.errors, summary.failures);
                }
                runs.push(Run {
                    workload: spec.name.into(),
                    server: srv.name.into(),
                    round,
                    summary,
                    cpu_us_per_request: cpu,
                });
            }
        }
    }
    let pairs: Vec<(Row, Row)> =
        specs.iter().map(|s| (rows(&runs, s.name, "larder"), rows(&runs, s.name, "nginx"))).collect();
    let mut md = format!(
        "Machine: {machine}. Each row: median of {} alternating runs of {:?} per server (min–max in brackets), 64 connections, one loader thread on core {}, servers on core {}.\n\n",
        a.rounds, a.duration, a.loader_core, a.server_core
    );
    if !a.larder_args.is_empty() {
        md.push_str(&format!("larder ran with `{}`.\n\n", a.larder_args.join(" ")));
    }
    md.push_str(&table(&pairs));
    if a.large {
        md.push_str(&run_large(a, &larder, &nginx)?);
    }
    Ok((md, runs))
}

/// The large-value workloads, alternating the servers; returns their table.
fn run_large(a: &CompareArgs, larder: &Server, nginx: &Server) -> Result<String> {
    let specs: Vec<LargeSpec> = large_suite()
        .into_iter()
        .filter(|s| a.only.is_empty() || a.only.iter().any(|o| o.eq_ignore_ascii_case(s.name)))
        .collect();
    let set = |s: &LargeSpec| s.name.to_ascii_lowercase();
    for s in specs.iter().filter(|s| s.method == "GET") {
        for srv in [larder, nginx] {
            eprintln!("preloading {} values of {} MiB into {}", s.conns, s.size >> 20, srv.name);
            let paths = (0..s.conns).map(|c| vec![format!("/{}-{c}", set(s))]).collect();
            crate::large::run(srv.port, "PUT", paths, s.size)?;
        }
    }
    let mut runs: Vec<LargeRun> = Vec::new();
    for s in &specs {
        for round in 1..=a.rounds {
            for srv in [larder, nginx] {
                let paths: Vec<Vec<String>> = (0..s.conns)
                    .map(|c| {
                        (0..s.per_conn)
                            .map(|i| match s.method {
                                "PUT" => format!("/{}-r{round}-{c}-{i}", set(s)),
                                _ => format!("/{}-{c}", set(s)),
                            })
                            .collect()
                    })
                    .collect();
                // SAFETY: sync takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let pids = srv.pids();
                let base = crate::large::rss(&pids);
                let done = std::sync::atomic::AtomicBool::new(false);
                let (moved, peak) = std::thread::scope(|sc| {
                    let sampler = sc.spawn(|| {
                        let mut peak = base;
                        while !done.load(std::sync::atomic::Ordering::Relaxed) {
                            peak = peak.max(crate::large::rss(&pids));
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        peak
                    });
                    let cpu0 = srv.cpu_us();
                    let moved = crate::large::run(srv.port, s.method, paths, s.size).map(|m| (m, srv.cpu_us() - cpu0));
                    done.store(true, std::sync::atomic::Ordering::Relaxed);
                    (moved, sampler.join().expect("the sampler panicked"))
                });
                let (m, cpu_us) = moved.with_context(|| format!("{} against {}", s.name, srv.name))?;
                let gib = m.bytes as f64 / (1u64 << 30) as f64;
                let run = LargeRun {
                    workload: s.name.into(),
                    server: srv.name.into(),
                    round,
                    mib_per_s: m.bytes as f64 / (1 << 20) as f64 / m.secs,
                    cpu_ms_per_gib: cpu_us as f64 / 1000.0 / gib,
                    rss_growth_mib: peak.saturating_sub(base) as f64 / (1 << 20) as f64,
                };
                eprintln!(
                    "{:<5} round {round} {:<6} {:>7.0} MiB/s  cpu {:>6.0} ms/GiB  rss +{:.0} MiB  ({} requests)",
                    s.name, srv.name, run.mib_per_s, run.cpu_ms_per_gib, run.rss_growth_mib, m.requests
                );
                runs.push(run);
            }
        }
    }
    let mut md = String::from(
        "\nLarge values (each row: median of the rounds; connections × requests per connection in brackets):\n\n| workload | larder MiB/s (min–max) | nginx MiB/s (min–max) | larder/nginx | server CPU ms per GiB larder / nginx | peak RSS growth MiB larder / nginx |\n|---|---|---|---|---|---|\n",
    );
    for s in &specs {
        let pick = |server: &str, f: fn(&LargeRun) -> f64| -> Vec<f64> {
            runs.iter().filter(|r| r.workload == s.name && r.server == server).map(f).collect()
        };
        let (l, n) = (pick("larder", |r| r.mib_per_s), pick("nginx", |r| r.mib_per_s));
        let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        md.push_str(&format!(
            "| {} ({}×{}) | {:.0} ({:.0}–{:.0}) | {:.0} ({:.0}–{:.0}) | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |\n",
            s.name,
            s.conns,
            s.per_conn,
            median(l.clone()),
            lo(&l),
            hi(&l),
            median(n.clone()),
            lo(&n),
            hi(&n),
            median(l.clone()) / median(n.clone()).max(1e-9),
            median(pick("larder", |r| r.cpu_ms_per_gib)),
            median(pick("nginx", |r| r.cpu_ms_per_gib)),
            median(pick("larder", |r| r.rss_growth_mib)),
            median(pick("nginx", |r| r.rss_growth_mib)),
        ));
    }
    Ok(md)
}
