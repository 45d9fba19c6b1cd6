//! `larder-bench crash-loop`: kills a larder server with SIGKILL, again and again, under a mixed
//! load, and checks after each restart every key against a model of what was acknowledged.
//!
//! The load: PUTs and overwrites (values that name their key and version), DELETEs, PUTs with a
//! TTL, touches (`PATCH` with `X-TTL`) and GETs, from a few clients, each owning its keys so
//! that a key has at most one request in flight. Among the keys are pairs the index cannot tell
//! apart (`larder_engine::twins`, for the store's own hash seed), which take each other's
//! entry. After a kill, a request that had no answer may or may not have taken effect; the
//! first read after the restart settles which. What a key may read as:
//! - its last acknowledged value, or what its unanswered request would have made it;
//! - absent, when that is what was acknowledged (a DELETE, an expiry), or the key shares an
//!   entry with another (a miss, never other bytes), or its TTL is within a second of ending;
//! - anything else is counted: a deleted value back (resurrected), an older version (stale),
//!   bytes that are no version of the key (wrong), or, for a key of its own entry, nothing
//!   where a value was acknowledged (lost).

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `larder-bench crash-loop` flags.
#[derive(Args, Debug, Clone)]
pub struct CrashArgs {
    /// The larder binary to run.
    #[arg(long, default_value = "target/release/larder")]
    pub larder: PathBuf,
    /// Kill -9 cycles.
    #[arg(long, default_value_t = 1000)]
    pub cycles: u32,
    /// The server's --fsync: with `always`, no acknowledged write may be lost.
    #[arg(long, default_value = "always")]
    pub fsync: String,
    /// Keys of their own index entry.
    #[arg(long, default_value_t = 400)]
    pub keys: usize,
    /// Pairs of keys that share an index entry.
    #[arg(long, default_value_t = 8)]
    pub twins: usize,
    /// Clients sending requests at once.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// The longest a cycle's load runs before the kill (each a random share of it).
    #[arg(long, default_value = "400ms", value_parser = crate::http::parse_duration)]
    pub load: Duration,
    /// The data directory (a fresh temporary one if not given).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Random seed.
    #[arg(long, default_value_t = 39)]
    pub seed: u64,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What a key holds, as the model knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Absent,
    /// A version, and when it expires (ms; 0 = never), within a second either way.
    Value {
        version: u64,
        expires: u64,
    },
}

#[derive(Debug, Clone)]
struct Key {
    name: String,
    /// Shares an index entry with another key: may read as absent.
    twin: bool,
    /// What it may hold by what was acknowledged: one state, or several where a read could
    /// not tell whether a request the server died under took effect.
    acked: Vec<Held>,
    /// What the request in flight when the server died would have made it.
    pending: Option<Held>,
    /// Versions written so far (the next is this + 1).
    versions: u64,
    /// Versions ever deleted after being written, for telling a resurrection from staleness.
    deleted_after: u64,
}

/// What the checks found, over every cycle.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Figures {
    pub cycles: u32,
    pub requests: u64,
    pub acknowledged_writes: u64,
    pub unanswered: u64,
    pub keys_checked: u64,
    pub resurrected_deletes: u64,
    pub stale: u64,
    pub wrong_bytes: u64,
    pub lost_acknowledged: u64,
    pub twin_misses: u64,
}

impl Figures {
    fn bad(&self) -> u64 {
        self.resurrected_deletes + self.stale + self.wrong_bytes + self.lost_acknowledged
    }
}

/// One HTTP/1.1 exchange on a fresh connection; `None` when the server gave no whole answer.
fn request(
    addr: SocketAddr,
    method: &str,
    key: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut head = format!("{method} /{key} HTTP/1.1\r\nHost: larder\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "PUT" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let mut len = None;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse::<usize>().ok();
            }
        }
    }
    let mut body = vec![0u8; if method == "HEAD" { 0 } else { len? }];
    r.read_exact(&mut body).ok()?;
    Some((status, body))
}

fn value_of(name: &str, version: u64, rng: &mut SmallRng) -> Vec<u8> {
    let mut v = format!("{name}|{version}|").into_bytes();
    // Mostly small, now and then past a chunk (streamed, in pieces on disk).
    let len = if rng.random_ratio(1, 50) { rng.random_range(1 << 20..3 << 20) } else { rng.random_range(0..4000) };
    v.extend((0..len).map(|i| b'a' + ((version as usize + i) % 26) as u8));
    v
}

/// The version a body holds, if it is a value written for `name` and whole.
fn version_in(name: &str, body: &[u8]) -> Option<u64> {
    let rest = body.strip_prefix(name.as_bytes())?.strip_prefix(b"|")?;
    let bar = rest.iter().position(|&b| b == b'|')?;
    let version: u64 = std::str::from_utf8(&rest[..bar]).ok()?.parse().ok()?;
    let fill = &rest[bar + 1..];
    fill.iter().enumerate().all(|(i, &b)| b == b'a' + ((version as usize + i) % 26) as u8).then_some(version)
}

/// An expiry not known (after a read the model did not allow): the value may or may not be
/// there.
const UNKNOWN: u64 = u64::MAX;

/// Whether `seen` may be what a key held as `h` reads as at `now` (ms).
fn allows(h: Held, seen: Option<u64>, now: u64) -> bool {
    const SLACK: u64 = 1_500;
    match (h, seen) {
        (Held::Absent, None) => true,
        (Held::Absent, Some(_)) => false,
        (Held::Value { expires, .. }, None) => {
            expires == UNKNOWN || (expires != 0 && now.saturating_add(SLACK) >= expires)
        }
        (Held::Value { version, expires }, Some(v)) => {
            v == version && (expires == 0 || expires == UNKNOWN || now <= expires + SLACK)
        }
    }
}

/// Checks one key after a restart (or on a read under load), settling an unanswered request.
fn check(k: &mut Key, seen: Option<u64>, f: &mut Figures) {
    let now = now_ms();
    f.keys_checked += 1;
    let mut all: Vec<Held> = k.acked.iter().chain(k.pending.iter()).copied().collect();
    all.dedup();
    k.pending = None;
    let could: Vec<Held> = all.iter().copied().filter(|h| allows(*h, seen, now)).collect();
    if !could.is_empty() {
        // A key that shares an entry may read as absent while its value is still on disk:
        // that settles nothing.
        k.acked = if seen.is_some() || !k.twin { could } else { all };
        return;
    }
    let held_value = k.acked.iter().any(|h| matches!(h, Held::Value { .. }));
    match seen {
        None if k.twin && held_value => {
            f.twin_misses += 1;
            return; // a miss, never other bytes: its value may come back, so it is kept
        }
        None => {
            f.lost_acknowledged += 1;
            eprintln!("lost: {} ({:?})", k.name, k.acked);
        }
        Some(v) if v > k.versions => {
            f.wrong_bytes += 1;
            eprintln!("wrong: {} read version {v} never written", k.name);
        }
        Some(v) if v <= k.deleted_after && !held_value => {
            f.resurrected_deletes += 1;
            eprintln!("resurrected: {} read version {v} after its delete", k.name);
        }
        Some(v) => {
            f.stale += 1;
            eprintln!("stale: {} read version {v}, acknowledged {:?}", k.name, k.acked);
        }
    }
    // From here on, the key holds what was read (so one fault counts once).
    k.acked = vec![match seen {
        Some(version) => Held::Value { version, expires: UNKNOWN },
        None => Held::Absent,
    }];
}

/// Reads `k` and checks it; `Err` with the status (0: no answer) when the server did not
/// answer 200 or 404 (it died, or failed).
fn read_check(addr: SocketAddr, k: &mut Key, f: &mut Figures) -> Result<(), u16> {
    let (status, body) = request(addr, "GET", &k.name, &[], b"").ok_or(0u16)?;
    let seen = match status {
        200 => Some(version_in(&k.name, &body).unwrap_or(u64::MAX)),
        404 => None,
        s => return Err(s),
    };
    check(k, seen, f);
    Ok(())
}

/// One client's load on its keys until the server stops answering or `until`.
fn load(addr: SocketAddr, keys: &mut [Key], until: Instant, seed: u64, f: &mut Figures) {
    let mut rng = SmallRng::seed_from_u64(seed);
    while Instant::now() < until {
        let k = &mut keys[rng.random_range(0..keys.len())];
        let roll = rng.random_range(0..100);
        f.requests += 1;
        if roll < 25 {
            if read_check(addr, k, f).is_err() {
                return;
            }
            continue;
        }
        let sent = now_ms();
        let (method, headers, body, next) = if roll < 60 {
            k.versions += 1;
            let ttl = rng.random_ratio(1, 4).then(|| rng.random_range(1..5u64));
            let expires = ttl.map_or(0, |t| sent + t * 1000);
            let headers = ttl.map(|t| vec![("X-TTL", t.to_string())]).unwrap_or_default();
            let body = value_of(&k.name, k.versions, &mut rng);
            ("PUT", headers, body, Some(Held::Value { version: k.versions, expires }))
        } else if roll < 80 {
            k.deleted_after = k.versions;
            ("DELETE", vec![], vec![], Some(Held::Absent))
        } else {
            let ttl = rng.random_range(0..5u64);
            // Of the values the key may hold, the live one gets the new expiry.
            let next = k.acked.iter().find_map(|h| match *h {
                Held::Value { version, .. } => {
                    Some(Held::Value { version, expires: if ttl == 0 { 0 } else { sent + ttl * 1000 } })
                }
                Held::Absent => None,
            });
            ("PATCH", vec![("X-TTL", ttl.to_string())], vec![], next)
        };
        k.pending = next;
        let Some((status, _)) = request(addr, method, &k.name, &headers, &body) else {
            f.unanswered += 1;
            return; // the server died: the request stays pending
        };
        match (method, status, next) {
            ("PUT", 200, Some(h)) | ("DELETE", 200 | 404, Some(h)) => {
                f.acknowledged_writes += 1;
                k.acked = vec![h];
            }
            ("PATCH", 200, Some(Held::Value { expires: e, .. })) => {
                // The live value, whichever version of those the key may hold, now expires
                // at `e`; none was absent.
                k.acked.retain(|h| matches!(h, Held::Value { .. }));
                for h in &mut k.acked {
                    if let Held::Value { expires, .. } = h {
                        *expires = e;
                    }
                }
                k.acked.dedup();
            }
            // Live where the model has nothing live: the read says what it is, and is checked.
            ("PATCH", 200, None) => {
                k.pending = None;
                if read_check(addr, k, f).is_err() {
                    return;
                }
            }
            // A value that expired meanwhile, or that a twin took: as it was.
            ("PATCH", 404, _) => {}
            _ => {
                f.unanswered += 1;
                return;
            }
        }
        k.pending = None;
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

fn start(a: &CrashArgs, dir: &std::path::Path) -> Result<Server> {
    let mut child = Command::new(&a.larder)
        .args(["serve", "--listen", "127.0.0.1:0", "--fsync", &a.fsync, "--data-dir"])
        .arg(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        // The server's log, kept beside the data directory, for a failure's report.
        .stderr(Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(dir.with_extension("log"))?))
        .spawn()
        .with_context(|| format!("starting {}", a.larder.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("larder listening on ")
        .with_context(|| format!("unexpected first line {line:?}"))?
        .parse()?;
    let started = Instant::now();
    while request(addr, "GET", "_larder/health", &[], b"").map(|r| r.0) != Some(200) {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the server did not recover within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(Server { child, addr })
}

pub fn run(a: CrashArgs) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = a.data_dir.clone().unwrap_or_else(|| tmp.path().join("data"));
    let mut first = start(&a, &dir)?;
    first.child.kill()?;
    first.child.wait()?;
    let seed = larder_engine::twins::seed(&dir).context("reading the store's hash seed from its manifest")?;
    let found = Instant::now();
    let pairs = larder_engine::twins::find(seed, "crash/twin/", larder_engine::twins::DEFAULT_RING_BITS, a.twins);
    println!("{} pairs of keys sharing an index entry, found in {:.1} s", pairs.len(), found.elapsed().as_secs_f64());
    let key = |name: String, twin| Key {
        name,
        twin,
        acked: vec![Held::Absent],
        pending: None,
        versions: 0,
        deleted_after: 0,
    };
    // Each client owns its keys; a pair goes to one client.
    let clients = a.clients.max(1);
    let mut owned: Vec<Vec<Key>> = vec![Vec::new(); clients];
    for (i, (x, y)) in pairs.into_iter().take(a.twins).enumerate() {
        owned[i % clients].extend([key(x, true), key(y, true)]);
    }
    for i in 0..a.keys {
        owned[i % clients].push(key(format!("crash/key/{i}"), false));
    }
    let figures = Arc::new(Mutex::new(Figures::default()));
    let mut rng = SmallRng::seed_from_u64(a.seed);
    let started = Instant::now();
    for cycle in 0..a.cycles {
        let mut s = start(&a, &dir)?;
        let mut f = figures.lock().unwrap().clone();
        for keys in owned.iter_mut() {
            for k in keys.iter_mut() {
                if let Err(status) = read_check(s.addr, k, &mut f) {
                    let alive = s.child.try_wait().ok().flatten().is_none();
                    let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(20).collect();
                    bail!(
                        "cycle {cycle}: GET {} answered {status} while the keys were checked (server {}); its log ends:\n{}",
                        k.name,
                        if alive { "running" } else { "exited" },
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
            }
        }
        *figures.lock().unwrap() = f;
        // The load, and the kill at a random moment of it.
        let run_for = a.load.mul_f64(rng.random_range(0.05..1.0));
        let until = Instant::now() + a.load * 4;
        let addr = s.addr;
        let cycle_seed: u64 = rng.random();
        std::thread::scope(|scope| {
            for (c, keys) in owned.iter_mut().enumerate() {
                let figures = figures.clone();
                scope.spawn(move || {
                    let mut f = Figures::default();
                    load(addr, keys, until, cycle_seed ^ c as u64, &mut f);
                    let mut all = figures.lock().unwrap();
                    all.requests += f.requests;
                    all.acknowledged_writes += f.acknowledged_writes;
                    all.unanswered += f.unanswered;
                    all.keys_checked += f.keys_checked;
                    all.resurrected_deletes += f.resurrected_deletes;
                    all.stale += f.stale;
                    all.wrong_bytes += f.wrong_bytes;
                    all.lost_acknowledged += f.lost_acknowledged;
                    all.twin_misses += f.twin_misses;
                });
            }
            std::thread::sleep(run_for);
            let _ = s.child.kill(); // SIGKILL
            let _ = s.child.wait();
        });
        let mut f = figures.lock().unwrap();
        f.cycles = cycle + 1;
        if (cycle + 1) % 50 == 0 || cycle + 1 == a.cycles {
            println!(
                "cycle {:>5}  {:>8} requests  {:>7} writes acknowledged  {:>5} unanswered  bad {}",
                cycle + 1,
                f.requests,
                f.acknowledged_writes,
                f.unanswered,
                f.bad()
            );
        }
    }
    // A last restart, checked, and a graceful stop.
    let mut s = start(&a, &dir)?;
    {
        let mut f = figures.lock().unwrap();
        for k in owned.iter_mut().flatten() {
            read_check(s.addr, k, &mut f).map_err(|st| anyhow::anyhow!("GET {} answered {st}", k.name))?;
        }
    }
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    s.child.wait()?;
    let f = figures.lock().unwrap().clone();
    println!(
        "{} kill -9 cycles in {:.0} s, --fsync {}: {} requests, {} writes acknowledged, {} unanswered at a kill, \
         {} key reads checked; resurrected deletes {}, stale {}, wrong bytes {}, acknowledged writes lost {} \
         ({} misses of keys sharing an entry)",
        f.cycles,
        started.elapsed().as_secs_f64(),
        a.fsync,
        f.requests,
        f.acknowledged_writes,
        f.unanswered,
        f.keys_checked,
        f.resurrected_deletes,
        f.stale,
        f.wrong_bytes,
        f.lost_acknowledged,
        f.twin_misses
    );
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&f)?)?;
    }
    if f.bad() > 0 {
        bail!("{} violations", f.bad());
    }
    Ok(())
}
