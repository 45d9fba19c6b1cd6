//! `larder-bench compare --memcached`: larder's memcached protocol next to Debian's memcached
//! 1.6 on one machine, each pinned to the same core, the loader on the other, the same load.
//!
//! Two parts:
//! - **In RAM**: 100,000 keys of 4 KiB that fit both (memcached `-m 1024`, larder's memory tier
//!   1 GiB); uniform gets one in flight per connection, gets in pipelined batches of 100, and
//!   sets, alternating servers round by round.
//! - **Larger than RAM**: a million keys of 4 KiB with 64 MiB of RAM each: memcached `-m 64`
//!   with a 4 GiB extstore file, larder `--memory-capacity 64MiB` with a 4 GiB ring. After the
//!   sets: how many keys each still answers, and gets over the keys memcached kept (the
//!   newest), uniform, with server CPU per get.

use crate::compare::{median, wait_healthy, wait_ready, CompareArgs, Server};
use crate::memcache::{self, MemcacheArgs};
use crate::report::Summary;
use crate::workload::{Dist, Kind, Size, Workload};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const LARDER_PORT: u16 = 18_212;
const MEMCACHED_PORT: u16 = 18_211;
/// larder's HTTP door in the memcached comparison: only its health is asked there.
const LARDER_HTTP_PORT: u16 = 18_213;
const RAM_KEYS: u64 = 100_000;
const DISK_KEYS: u64 = 1_000_000;
/// The measured loads in RAM: name, operation, key prefix, requests in flight per connection.
/// The sets go to keys of their own: a replaced value is read from larder's disk tier until it
/// is promoted again, which the next round's gets would measure instead.
const RAM_PARTS: &[(&str, Kind, &str, usize)] = &[
    ("ram gets", Kind::Get, "r", 1),
    ("ram gets, batches of 100", Kind::Get, "r", 100),
    ("ram sets", Kind::Put, "w", 1),
];

/// One measured run.
#[derive(Debug, Clone, Serialize)]
pub struct McRun {
    part: String,
    server: String,
    round: usize,
    summary: Summary,
    cpu_us_per_op: f64,
}

fn start(a: &CompareArgs, dir: &Path, in_ram: bool) -> Result<(Server, Server)> {
    let core = a.server_core.to_string();
    for port in [LARDER_PORT, MEMCACHED_PORT] {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            anyhow::bail!("port {port} is already in use: stop whatever listens there first");
        }
    }
    let data = dir.join(if in_ram { "larder-ram" } else { "larder-disk" });
    let mut larder = Command::new("taskset");
    larder
        .args(["-c", &core])
        .arg(&a.larder)
        .args(["serve", "--listen", &format!("127.0.0.1:{LARDER_HTTP_PORT}"), "--data-dir"])
        .arg(&data)
        .args(["--memcache-listen", &format!("127.0.0.1:{LARDER_PORT}"), "--log-level", "error"]);
    if in_ram {
        larder.args([
            "--memory-capacity",
            "1GiB",
            "--promote-after",
            "1",
            "--volume-size",
            "256MiB",
            "--volume-count",
            "8",
        ]);
    } else {
        larder.args(["--memory-capacity", "64MiB", "--volume-size", "256MiB", "--volume-count", "16"]);
    }
    let larder = larder.stdout(Stdio::null()).spawn().with_context(|| format!("starting {:?}", a.larder))?;
    let larder = Server { name: "larder", port: LARDER_PORT, child: larder };
    let bin = "/usr/bin/memcached";
    if !Path::new(bin).exists() {
        anyhow::bail!("{bin} is missing: scripts/install-bench-deps.sh installs Debian's memcached");
    }
    let ext = dir.join("extstore");
    std::fs::create_dir_all(&ext)?;
    // memcached drops to this user before it opens its extstore file.
    let _ = Command::new("chmod").arg("777").arg(&ext).status();
    let mut mc = Command::new("taskset");
    mc.args(["-c", &core, bin, "-l", "127.0.0.1", "-p", &MEMCACHED_PORT.to_string(), "-U", "0", "-t", "1"]);
    mc.args(["-u", "nobody", "-c", "4096"]);
    if in_ram {
        mc.args(["-m", "1024"]);
    } else {
        mc.args(["-m", "64", "-o"]).arg(format!("ext_path={}:4G", ext.join("extstore").display()));
    }
    let mc = mc.stdout(Stdio::null()).spawn().context("starting memcached")?;
    let mc = Server { name: "memcached", port: MEMCACHED_PORT, child: mc };
    wait_healthy(LARDER_HTTP_PORT)?;
    wait_ready(LARDER_PORT)?;
    wait_ready(MEMCACHED_PORT)?;
    Ok((larder, mc))
}

/// One load: `kind` on keys `<prefix><start>..<start+keys>`.
#[allow(clippy::too_many_arguments)]
fn load(
    port: u16,
    prefix: &str,
    kind: Kind,
    dist: Dist,
    start: u64,
    keys: u64,
    duration: Duration,
    requests: Option<u64>,
    pipeline: usize,
) -> Result<Summary> {
    memcache::run(MemcacheArgs {
        addr: format!("127.0.0.1:{port}"),
        prefix: prefix.into(),
        connections: 64,
        pipeline,
        threads: 1,
        duration,
        requests,
        check_length: kind == Kind::Get,
        allow_misses: true,
        max_error_ratio: 0.001,
        json: None,
        quiet: true,
        workload: Workload {
            workload: kind,
            get_ratio: 0.9,
            value_size: Size { min: 4096, max: 4096 },
            keys,
            start,
            distribution: dist,
            seed: 42,
        },
    })
}

/// A measured load: its summary and the server's CPU per operation.
fn measured(s: &Server, f: impl FnOnce() -> Result<Summary>) -> Result<(Summary, f64)> {
    let before = s.cpu_us();
    let summary = f()?;
    let cpu = (s.cpu_us() - before) as f64 / summary.requests.max(1) as f64;
    Ok((summary, cpu))
}

/// Median get/s, its min and max, median p50 and p99 (ms) and CPU µs/op of a part's runs.
fn row(runs: &[McRun], part: &str, server: &str) -> (f64, f64, f64, f64, f64, f64) {
    let sel: Vec<&McRun> = runs.iter().filter(|r| r.part == part && r.server == server).collect();
    let rps: Vec<f64> = sel.iter().map(|r| r.summary.req_per_s).collect();
    (
        median(rps.clone()),
        rps.iter().copied().fold(f64::INFINITY, f64::min),
        rps.iter().copied().fold(0.0, f64::max),
        median(sel.iter().map(|r| r.summary.latency.p50_us as f64 / 1000.0).collect()),
        median(sel.iter().map(|r| r.summary.latency.p99_us as f64 / 1000.0).collect()),
        median(sel.iter().map(|r| r.cpu_us_per_op).collect()),
    )
}

/// Medians of the per-round ratios larder/memcached (get/s, CPU per get) of a part: each
/// larder run against the memcached run right after it. On a machine whose speed drifts
/// between rounds, a pair run seconds apart shares the drift that the medians of each server
/// taken apart do not.
fn paired(runs: &[McRun], part: &str) -> (f64, f64) {
    let of = |server: &str| -> Vec<&McRun> { runs.iter().filter(|r| r.part == part && r.server == server).collect() };
    let (l, m) = (of("larder"), of("memcached"));
    let pairs: Vec<(f64, f64)> = l
        .iter()
        .filter_map(|a| {
            let b = m.iter().find(|b| b.round == a.round)?;
            Some((a.summary.req_per_s / b.summary.req_per_s.max(1e-9), a.cpu_us_per_op / b.cpu_us_per_op.max(1e-9)))
        })
        .collect();
    (median(pairs.iter().map(|p| p.0).collect()), median(pairs.iter().map(|p| p.1).collect()))
}

pub fn run_in(a: &CompareArgs, dir: &Path, machine: &str) -> Result<(String, serde_json::Value)> {
    let mut runs: Vec<McRun> = Vec::new();
    let mut md = format!(
        "Machine: {machine}. Servers on core {}, one loader thread on core {}, 64 connections, one request in flight each unless said; medians of {} alternating runs of {:?} (min–max in brackets).\n\n",
        a.server_core, a.loader_core, a.rounds, a.duration
    );

    // `--only ram` or `--only disk` runs one part.
    let want = |part: &str| a.only.is_empty() || a.only.iter().any(|o| o.eq_ignore_ascii_case(part));
    // In RAM.
    if want("ram") {
        let (larder, mc) = start(a, dir, true)?;
        for s in [&larder, &mc] {
            let sets = RAM_KEYS;
            load(s.port, "r", Kind::Put, Dist::Sequential, 0, RAM_KEYS, a.duration, Some(sets), 16)?;
            // One read of each key: larder's memory tier takes a value on its first read here.
            load(s.port, "r", Kind::Get, Dist::Sequential, 0, RAM_KEYS, a.duration, Some(RAM_KEYS), 16)?;
            // The sets' keys too, so that every round's sets replace values, not add them.
            load(s.port, "w", Kind::Put, Dist::Sequential, 0, RAM_KEYS, a.duration, Some(RAM_KEYS), 16)?;
        }
        for round in 1..=a.rounds {
            for &(part, kind, prefix, pipeline) in RAM_PARTS {
                for s in [&larder, &mc] {
                    let (summary, cpu) = measured(s, || {
                        load(s.port, prefix, kind, Dist::Uniform, 0, RAM_KEYS, a.duration, None, pipeline)
                    })?;
                    eprintln!(
                        "[{part}] round {round} {:<9} {:>8.0} op/s  cpu {cpu:.1} us/op",
                        s.name, summary.req_per_s
                    );
                    runs.push(McRun { part: part.into(), server: s.name.into(), round, summary, cpu_us_per_op: cpu });
                }
            }
        }
        md.push_str(&format!(
            "**In RAM**: {RAM_KEYS} keys of 4 KiB, uniform (memcached `-m 1024 -t 1`; larder `--memory-capacity 1GiB --promote-after 1`, every key read once before, the sets' keys stored once before): gets one in flight per connection, gets in pipelined batches of 100 a connection, and sets (larder's also go to a volume) one in flight.\n\n\
             | load | server | op/s (min–max) | p50 / p99 ms | server CPU µs/op |\n|---|---|---|---|---|\n"
        ));
        let mut ratios = String::new();
        for &(part, ..) in RAM_PARTS {
            let (l, m) = (row(&runs, part, "larder"), row(&runs, part, "memcached"));
            for (name, r) in [("larder", l), ("memcached", m)] {
                md.push_str(&format!(
                    "| {part} | {name} | {:.0} ({:.0}–{:.0}) | {:.2} / {:.2} | {:.1} |\n",
                    r.0, r.1, r.2, r.3, r.4, r.5
                ));
            }
            let (pr, pc) = paired(&runs, part);
            ratios.push_str(&format!(
                "- {part}: larder/memcached {:.2}× op/s, {:.2}× CPU per op (medians of each); round by round, medians of the ratios: {pr:.2}× op/s, {pc:.2}× CPU per op.\n",
                l.0 / m.0.max(1e-9),
                l.5 / m.5.max(1e-9),
            ));
        }
        md.push('\n');
        md.push_str(&ratios);
        md.push('\n');
    }
    if !want("disk") {
        return Ok((md, serde_json::to_value(&runs)?));
    }

    // Larger than RAM.
    let (larder, mc) = start(a, dir, false)?;
    let mut kept = Vec::new();
    for s in [&larder, &mc] {
        let (sets, cpu) = measured(s, || {
            load(s.port, "d", Kind::Put, Dist::Sequential, 0, DISK_KEYS, a.duration, Some(DISK_KEYS), 16)
        })?;
        eprintln!("[disk] {:<9} {} sets in {:.1} s, cpu {cpu:.1} us/set", s.name, sets.requests, sets.seconds);
        // memcached writes to its extstore file in the background: let it settle.
        std::thread::sleep(Duration::from_secs(3));
        let all = load(s.port, "d", Kind::Get, Dist::Sequential, 0, DISK_KEYS, a.duration, Some(DISK_KEYS), 16)?;
        let readable = all.requests - all.misses;
        eprintln!("[disk] {:<9} {readable} of {DISK_KEYS} keys readable", s.name);
        kept.push((s.name, sets.req_per_s, cpu, readable));
    }
    // Gets over the keys both still hold: memcached keeps the newest.
    let common = kept.iter().map(|k| k.3).min().unwrap_or(0).max(1);
    let first = DISK_KEYS - common;
    for round in 1..=a.rounds {
        for s in [&larder, &mc] {
            let (summary, cpu) =
                measured(s, || load(s.port, "d", Kind::Get, Dist::Uniform, first, common, a.duration, None, 1))?;
            eprintln!(
                "[disk] round {round} {:<9} {:>8.0} get/s  misses {}  cpu {cpu:.1} us/get",
                s.name, summary.req_per_s, summary.misses
            );
            runs.push(McRun { part: "disk".into(), server: s.name.into(), round, summary, cpu_us_per_op: cpu });
        }
    }
    let (l, m) = (row(&runs, "disk", "larder"), row(&runs, "disk", "memcached"));
    let miss = |server: &str| {
        let sel: Vec<&McRun> = runs.iter().filter(|r| r.part == "disk" && r.server == server).collect();
        let (m, n) = sel.iter().fold((0, 0), |(m, n), r| (m + r.summary.misses, n + r.summary.requests));
        100.0 * m as f64 / n.max(1) as f64
    };
    md.push_str(&format!(
        "**Larger than RAM**: {DISK_KEYS} keys of 4 KiB set in order, 64 MiB of RAM each (memcached `-m 64 -t 1 -o ext_path=…:4G`; larder `--memory-capacity 64MiB`, a ring of 16 × 256 MiB). Then every key read once, then uniform gets over the newest {common} keys (the ones both still hold).\n\n\
         | server | sets/s | server CPU µs/set | keys readable | get/s over the newest {common} (min–max) | misses there | p50 / p99 ms | server CPU µs/get |\n|---|---|---|---|---|---|---|---|\n"
    ));
    for ((name, sets, set_cpu, readable), r, server) in [(kept[0], l, "larder"), (kept[1], m, "memcached")] {
        md.push_str(&format!(
            "| {name} | {sets:.0} | {set_cpu:.1} | {readable} ({:.1}%) | {:.0} ({:.0}–{:.0}) | {:.2}% | {:.2} / {:.2} | {:.1} |\n",
            100.0 * readable as f64 / DISK_KEYS as f64,
            r.0,
            r.1,
            r.2,
            miss(server),
            r.3,
            r.4,
            r.5
        ));
    }
    md.push_str(&format!(
        "\nlarder/memcached over those keys: {:.2}× get/s, {:.2}× CPU per get (medians of each); round by round, medians of the ratios: {:.2}× get/s, {:.2}× CPU per get.\n",
        l.0 / m.0.max(1e-9),
        l.5 / m.5.max(1e-9),
        paired(&runs, "disk").0,
        paired(&runs, "disk").1
    ));
    Ok((md, serde_json::to_value(&runs)?))
}
