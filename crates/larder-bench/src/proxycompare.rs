//! `larder-bench compare --proxy`: larder's read-through mode next to nginx's `proxy_cache`,
//! both in front of the same nginx origin, in one run.
//!
//! The origin (bench/nginx-origin.conf.in) serves 100,000 files of 4 KiB and 10,000 of 64 KiB
//! (`--scale` scales them) with a day's freshness; it runs on the loader's core, the two caches
//! on the server core. Three parts:
//! 1. **Cold**: one pass over every key through each cache (all misses: fetched, stored,
//!    answered), req/s and the cache's CPU per request.
//! 2. **Hits**: uniform GETs over the same keys, alternating the caches round by round.
//! 3. **Restart**: the origin is stopped, each cache is stopped (SIGTERM) and started again;
//!    the time until it answers its first stored response, then a pass over every 4 KiB key:
//!    how many it still answers from its cache (without the origin) and how fast.

use crate::compare::{median, wait_healthy, wait_ready, CompareArgs, Server};
use crate::http::{self, HttpArgs};
use crate::report::Summary;
use crate::workload::{Dist, Kind, Size, Workload};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ORIGIN_PORT: u16 = 18_090;
const LARDER_PORT: u16 = 18_235;
const NGINX_PORT: u16 = 18_091;

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyRun {
    part: String,
    server: String,
    round: usize,
    summary: Summary,
    cpu_us_per_request: f64,
}

/// A key set: its URL prefix on the origin, value size and key count.
#[derive(Clone, Copy)]
struct Set {
    name: &'static str,
    size: u64,
    keys: u64,
}

/// One cache's restart.
#[derive(Debug, Clone, Serialize)]
pub struct Restart {
    server: String,
    /// From the start of the process to its first answer from the cache, in ms.
    first_hit_ms: Option<u64>,
    /// Keys answered 200 in the pass after the restart, of `keys`.
    answered: u64,
    keys: u64,
    req_per_s: f64,
}

fn conf(a: &CompareArgs, template: &str, dir: &Path, port: u16) -> Result<std::path::PathBuf> {
    let path = a.nginx_conf.parent().unwrap_or(Path::new("bench")).join(template);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path:?}"))?;
    let text = text
        .replace("@DIR@", &dir.to_string_lossy())
        .replace("@PORT@", &port.to_string())
        .replace("@ORIGIN@", &ORIGIN_PORT.to_string());
    for d in ["logs", "tmp", "root", "cache"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let out = dir.join("nginx.conf");
    std::fs::write(&out, text)?;
    Ok(out)
}

fn nginx(a: &CompareArgs, name: &'static str, conf: &Path, port: u16, core: usize) -> Result<Server> {
    let child = Command::new("taskset")
        .args(["-c", &core.to_string()])
        .arg(&a.nginx)
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {:?} (scripts/install-bench-deps.sh installs it)", a.nginx))?;
    Ok(Server { name, port, child })
}

fn larder(a: &CompareArgs, dir: &Path) -> Result<Server> {
    let child = Command::new("taskset")
        .args(["-c", &a.server_core.to_string()])
        .arg(&a.larder)
        .args(["serve", "--listen", &format!("127.0.0.1:{LARDER_PORT}"), "--data-dir"])
        .arg(dir)
        .args(["--origin", &format!("http://127.0.0.1:{ORIGIN_PORT}")])
        .args(["--volume-size", "1GiB", "--volume-count", "8", "--log-level", "error"])
        .args(&a.larder_args)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {:?} (build it with cargo build --release)", a.larder))?;
    Ok(Server { name: "larder", port: LARDER_PORT, child })
}

/// GET `path` on a fresh connection: the status and the X-Cache value.
fn probe(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // The Host the loader sends: read-through mode keys stored responses by host and target.
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut x = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = line.split_once(':') {
            if n.eq_ignore_ascii_case("x-cache") {
                x = v.trim().to_string();
            }
        }
    }
    Some((status, x))
}

fn load(
    port: u16,
    set: Set,
    dist: Dist,
    duration: Duration,
    requests: Option<u64>,
    max_errors: f64,
) -> Result<Summary> {
    http::run(HttpArgs {
        url: format!("http://127.0.0.1:{port}/{}-", set.name),
        connections: 64,
        threads: 1,
        duration,
        requests,
        rate: None,
        check_length: true,
        keyed_values: false,
        allow_misses: false,
        max_error_ratio: max_errors,
        json: None,
        quiet: true,
        workload: Workload {
            workload: Kind::Get,
            get_ratio: 1.0,
            value_size: Size { min: set.size as usize, max: set.size as usize },
            keys: set.keys,
            start: 0,
            distribution: dist,
            seed: 42,
        },
    })
}

/// Runs the comparison in `dir`; returns the markdown and the runs as JSON.
pub fn run_in(a: &CompareArgs, dir: &Path, machine: &str) -> Result<(String, serde_json::Value)> {
    for port in [ORIGIN_PORT, LARDER_PORT, NGINX_PORT] {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            bail!("port {port} is already in use: stop whatever listens there first");
        }
    }
    let scaled = |n: f64| ((n * a.scale).round() as u64).max(10);
    let sets = [
        Set { name: "o4k", size: 4 << 10, keys: scaled(100_000.0) },
        Set { name: "o64k", size: 64 << 10, keys: scaled(10_000.0) },
    ];
    let origin_dir = dir.join("origin");
    std::fs::create_dir_all(origin_dir.join("root"))?;
    for set in sets {
        eprintln!("writing {} origin files of {} B ({})", set.keys, set.size, set.name);
        let body: Vec<u8> = (0..set.size).map(|i| (i * 31 % 251) as u8).collect();
        for k in 0..set.keys {
            std::fs::write(origin_dir.join("root").join(format!("{}-{k}", set.name)), &body)?;
        }
    }
    let origin_conf = conf(a, "nginx-origin.conf.in", &origin_dir, ORIGIN_PORT)?;
    let mut origin = Some(nginx(a, "origin", &origin_conf, ORIGIN_PORT, a.loader_core)?);
    let larder_dir = dir.join("larder");
    let ngx_dir = dir.join("nginx-cache");
    let ngx_conf = conf(a, "nginx-proxy-cache.conf.in", &ngx_dir, NGINX_PORT)?;
    let mut caches = vec![larder(a, &larder_dir)?, nginx(a, "nginx", &ngx_conf, NGINX_PORT, a.server_core)?];
    for p in [ORIGIN_PORT, NGINX_PORT] {
        wait_ready(p)?;
    }
    wait_healthy(LARDER_PORT)?;
    let mut runs = Vec::new();
    let mut measure = |srv: &Server, part: &str, round: usize, f: &dyn Fn(u16) -> Result<Summary>| -> Result<()> {
        // SAFETY: sync takes no arguments and cannot fail.
        unsafe { libc::sync() };
        let cpu0 = srv.cpu_us();
        let summary = f(srv.port).with_context(|| format!("{part} through {}", srv.name))?;
        let cpu = srv.cpu_us().saturating_sub(cpu0) as f64 / summary.requests.max(1) as f64;
        eprintln!(
            "{part:<10} round {round} {:<6} {:>8.0} req/s  cpu {:>6.1} us/req  errors {}",
            srv.name, summary.req_per_s, cpu, summary.errors
        );
        runs.push(ProxyRun { part: part.into(), server: srv.name.into(), round, summary, cpu_us_per_request: cpu });
        Ok(())
    };
    // 1. Cold: every key once, each a miss.
    for set in sets {
        for srv in &caches {
            let part = format!("cold {}", set.name);
            measure(srv, &part, 1, &|port| {
                load(port, set, Dist::Sequential, Duration::from_secs(3600), Some(set.keys), 0.001)
            })?;
        }
    }
    // 2. Hits, alternating.
    for set in sets {
        for round in 1..=a.rounds {
            for srv in &caches {
                let part = format!("hit {}", set.name);
                measure(srv, &part, round, &|port| load(port, set, Dist::Uniform, a.duration, None, 0.001))?;
            }
        }
    }
    // 3. Restart without the origin.
    drop(origin.take());
    let mut restarts = Vec::new();
    let set = sets[0];
    let keys = set.keys;
    for i in 0..caches.len() {
        let name = caches[i].name;
        drop(caches.remove(i));
        let started = Instant::now();
        let srv = if name == "larder" {
            larder(a, &larder_dir)?
        } else {
            nginx(a, "nginx", &ngx_conf, NGINX_PORT, a.server_core)?
        };
        let mut first_hit_ms = None;
        while started.elapsed() < Duration::from_secs(30) {
            if let Some((200, _)) = probe(srv.port, &format!("/{}-0", set.name)) {
                first_hit_ms = Some(started.elapsed().as_millis() as u64);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let pass = load(srv.port, set, Dist::Sequential, Duration::from_secs(3600), Some(keys), 1.0)?;
        eprintln!(
            "restart {name}: first hit after {first_hit_ms:?} ms; {} of {keys} answered, {:.0} req/s",
            keys - pass.errors,
            pass.req_per_s
        );
        restarts.push(Restart {
            server: name.into(),
            first_hit_ms,
            answered: keys - pass.errors,
            keys,
            req_per_s: pass.req_per_s,
        });
        caches.insert(i, srv);
    }
    drop(caches);
    let md = report(a, machine, &runs, &restarts, &sets);
    Ok((md, serde_json::json!({ "runs": runs, "restarts": restarts })))
}

fn report(a: &CompareArgs, machine: &str, runs: &[ProxyRun], restarts: &[Restart], sets: &[Set]) -> String {
    let mut md = format!(
        "Machine: {machine}. Both caches on core {}, the loader and the origin (nginx) on core {}; 64 connections. \
         Cold: one pass over every key (each a miss). Hits: median of {} alternating runs of {:?} per cache (min–max).\n\n",
        a.server_core, a.loader_core, a.rounds, a.duration
    );
    md.push_str("| part | larder req/s | nginx req/s | req/s larder/nginx | larder CPU µs/req | nginx CPU µs/req | CPU larder/nginx |\n|---|---|---|---|---|---|---|\n");
    let mut parts: Vec<String> = sets.iter().map(|s| format!("cold {}", s.name)).collect();
    parts.extend(sets.iter().map(|s| format!("hit {}", s.name)));
    for part in parts {
        let of = |server: &str| -> (Vec<f64>, Vec<f64>) {
            let r: Vec<&ProxyRun> = runs.iter().filter(|r| r.part == part && r.server == server).collect();
            (r.iter().map(|r| r.summary.req_per_s).collect(), r.iter().map(|r| r.cpu_us_per_request).collect())
        };
        let ((lr, lc), (nr, nc)) = (of("larder"), of("nginx"));
        let spread = |v: &[f64]| {
            if v.len() < 2 {
                String::new()
            } else {
                let (lo, hi) = v.iter().fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
                format!(" ({lo:.0}–{hi:.0})")
            }
        };
        let (l, n, lcpu, ncpu) = (median(lr.clone()), median(nr.clone()), median(lc), median(nc));
        md.push_str(&format!(
            "| {part} | {l:.0}{} | {n:.0}{} | {:.2}× | {lcpu:.1} | {ncpu:.1} | {:.2}× |\n",
            spread(&lr),
            spread(&nr),
            l / n.max(1.0),
            lcpu / ncpu.max(0.001)
        ));
    }
    md.push_str("\nRestart with the origin stopped: time from the process start to its first answer from the cache, then one pass over every 4 KiB key.\n\n| cache | first stored answer after | keys answered from the cache | req/s in that pass |\n|---|---|---|---|\n");
    for r in restarts {
        let first = r.first_hit_ms.map_or("none in 30 s".to_string(), |ms| format!("{ms} ms"));
        md.push_str(&format!(
            "| {} | {first} | {} of {} ({:.1}%) | {:.0} |\n",
            r.server,
            r.answered,
            r.keys,
            100.0 * r.answered as f64 / r.keys as f64,
            r.req_per_s
        ));
    }
    md
}
