//! `larder-bench engine`: the storage engines in-process, no HTTP, to separate engine cost
//! from protocol cost; with `--compare foyer`, foyer's HybridCache on the same workload, the
//! same value sizes and the same capacities, side by side.
//!
//! A trial inserts `--bytes` worth of distinct keys into a fresh store (optionally at a fixed
//! rate), waits until the store has settled, counts how many inserted keys are still
//! readable, and may then GET keys for `--duration`. foyer drops inserts when its disk write
//! queue is full where larder applies backpressure, so raw insert speeds are not comparable:
//! for each store the run finds the highest insert rate at which it keeps ≥99% of its keys,
//! and the measured (compared) run inserts at a rate every store sustains.

use crate::http::parse_duration;
use crate::report::{Summary, Tally};
use crate::workload::{parse_bytes, value_pool, Dist, Generator, Op, Size, Workload};
use anyhow::{Context, Result};
use clap::Args;
use larder_engine::{FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The peer to compare with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// foyer's HybridCache (memory + disk).
    Foyer,
}

/// `larder-bench engine` flags.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Run the same workload against this peer too.
    #[arg(long, value_enum)]
    pub compare: Option<Peer>,
    /// Value sizes to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "4KiB,64KiB", value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// Bytes of values inserted per size (distinct keys).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub bytes: u64,
    /// Memory capacity given to the stores that have a memory tier.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub memory: u64,
    /// Disk capacity given to every store.
    #[arg(long, default_value = "4GiB", value_parser = parse_bytes)]
    pub disk: u64,
    /// Length of the GET phase.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Client threads (larder) or concurrent tasks (foyer).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Directory for the stores' files (a temporary directory under it is used and removed).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Distribution of the GET phase: uniform or zipf:<s>.
    #[arg(long, default_value = "uniform")]
    pub distribution: String,
    /// Bisection steps when searching for the highest insert rate that keeps ≥99% of keys.
    #[arg(long, default_value_t = 4)]
    pub search_steps: usize,
    /// Also write the outcomes as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One insert phase (and, when asked, the GET phase after it) against a fresh store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Trial {
    /// The insert rate asked for (None = as fast as possible).
    pub rate: Option<f64>,
    /// The insert phase; its time runs until the store has settled (foyer: flushed).
    pub insert: Summary,
    /// Inserted keys still readable after the insert phase, as a fraction.
    pub readable: f64,
    /// The GET phase, if it ran.
    pub get: Option<Summary>,
}

/// What one store did at one value size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// Store name.
    pub store: String,
    /// Value size.
    pub size: u64,
    /// Inserting as fast as the client threads can.
    pub unthrottled: Trial,
    /// The highest insert rate found at which at least 99% of inserted keys stay readable.
    pub max_kept_rate: f64,
    /// The measured run: inserts at a rate every compared store sustains, then GETs.
    pub measured: Trial,
}

/// Share of inserted keys a store must keep for its insert rate to count.
const KEEP: f64 = 0.99;

/// A store under test, opened afresh for every trial so trials do not see each other's data.
pub trait Kv: Send + Sync {
    /// Stores a value; false if the store refused or failed.
    fn insert(&self, key: u64, value: &[u8]) -> bool;
    /// The length of the value stored under `key`, if it is there.
    fn get(&self, key: u64) -> Option<usize>;
    /// Waits until accepted inserts have reached the store's disk tier (or been dropped).
    fn settle(&self) {}
    /// Closes the store and removes its files.
    fn close(self: Box<Self>);
}

struct Larder {
    store: Store,
    dir: PathBuf,
}

impl Kv for Larder {
    fn insert(&self, key: u64, value: &[u8]) -> bool {
        self.store.put(&key.to_le_bytes(), value, &PutOptions::default()).is_ok()
    }
    fn get(&self, key: u64) -> Option<usize> {
        self.store.get(&key.to_le_bytes(), &ReadOptions::default()).ok().flatten().map(|v| v.data.len())
    }
    fn close(self: Box<Self>) {
        let dir = self.dir.clone();
        drop(self);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Runs `work` on `threads` threads until each returns; merges their tallies.
fn parallel(threads: usize, work: impl Fn(usize, &mut Tally) + Sync) -> (Tally, Duration) {
    let started = Instant::now();
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let work = &work;
                s.spawn(move || {
                    let mut tally = Tally::default();
                    work(t, &mut tally);
                    tally
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    let mut all = Tally::default();
    for t in &tallies {
        all.merge(t);
    }
    (all, started.elapsed())
}

/// Inserts `--bytes` worth of distinct keys at `rate` (None = unthrottled), lets the store
/// settle, counts what is readable, and optionally runs the GET phase.
fn trial(name: &str, kv: &dyn Kv, a: &EngineArgs, size: u64, rate: Option<f64>, with_get: bool) -> Result<Trial> {
    let entries = (a.bytes / size).max(1);
    let pool = value_pool(size as usize, 7);
    let next = AtomicU64::new(0);
    let threads = a.threads.max(1);
    let per_thread_interval = rate.map(|r| Duration::from_secs_f64(threads as f64 / r.max(1.0)));
    let started = Instant::now();
    let (tally, _) = parallel(threads, |_, tally| {
        let mut due = Instant::now();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= entries {
                break;
            }
            if let Some(iv) = per_thread_interval {
                due += iv;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let t = Instant::now();
            let ok = kv.insert(k, &pool);
            tally.record(t.elapsed(), ok, pool.len());
        }
    });
    // foyer accepts an insert into memory and writes it to disk later: the phase is over
    // when that has happened, not when the last call returned.
    kv.settle();
    let insert = tally.summary(&format!("{name} insert {size} B"), started.elapsed());
    let found = AtomicU64::new(0);
    let next = AtomicU64::new(0);
    parallel(threads, |_, _| loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= entries {
            break;
        }
        if kv.get(k) == Some(size as usize) {
            found.fetch_add(1, Ordering::Relaxed);
        }
    });
    let readable = found.load(Ordering::Relaxed) as f64 / entries as f64;
    let get = if with_get { Some(get_phase(name, kv, a, size, entries)?) } else { None };
    Ok(Trial { rate, insert, readable, get })
}

fn get_phase(name: &str, kv: &dyn Kv, a: &EngineArgs, size: u64, entries: u64) -> Result<Summary> {
    let dist = match a.distribution.strip_prefix("zipf:") {
        Some(s) => Dist::Zipf(s.parse().context("zipf exponent")?),
        None => Dist::Uniform,
    };
    let w = Workload {
        workload: crate::workload::Kind::Get,
        get_ratio: 1.0,
        value_size: Size { min: size as usize, max: size as usize },
        keys: entries,
        start: 0,
        distribution: dist,
        seed: 42,
    };
    let deadline = Instant::now() + a.duration;
    let (tally, took) = parallel(a.threads.max(1), |t, tally| {
        let mut gen = Generator::new(&w, t as u64, Arc::default());
        while Instant::now() < deadline {
            let Op::Get(k) = gen.next_op() else { unreachable!("a GET workload") };
            let t = Instant::now();
            let got = kv.get(k);
            // A miss is not an error here: `readable` already says how much was kept.
            tally.record(t.elapsed(), true, got.unwrap_or(0));
        }
    });
    Ok(tally.summary(&format!("{name} get {size} B"), took))
}

/// Opens a fresh store of the given kind with the run's capacities.
fn open(store: &str, a: &EngineArgs, size: u64) -> Result<Box<dyn Kv>> {
    let dir = tempfile_dir(&a.dir, store)?;
    Ok(match store {
        "larder" => {
            // Same disk capacity; larder has no memory tier yet, so it runs disk-only (reads
            // come from the page cache, as foyer's buffered file device's do).
            let volume_count = 16u32;
            let cfg = StoreConfig {
                volume_size: (a.disk / volume_count as u64).max(larder_engine::MIN_VOLUME_SIZE),
                volume_count,
                max_value_size: size.max(1 << 20),
                fsync: FsyncPolicy::Never,
                ..StoreConfig::new(&dir)
            };
            Box::new(Larder { store: Store::open(cfg).context("opening larder")?, dir })
        }
        _ => Box::new(crate::foyer_kv::FoyerKv::open(&dir, a.memory, a.disk, a.threads)?),
    })
}

fn run_trial(store: &str, a: &EngineArgs, size: u64, rate: Option<f64>, with_get: bool) -> Result<Trial> {
    let kv = open(store, a, size)?;
    let t = trial(store, &*kv, a, size, rate, with_get);
    kv.close();
    let t = t?;
    eprintln!(
        "{store} {} KiB at {}: {:.0} inserts/s, {:.2}% readable",
        size / 1024,
        rate.map_or("full speed".to_string(), |r| format!("{r:.0}/s")),
        t.insert.req_per_s,
        t.readable * 100.0
    );
    Ok(t)
}

/// The highest insert rate at which `store` keeps at least [`KEEP`] of its keys: the
/// unthrottled rate if it keeps them there, else a bisection below it.
fn max_kept_rate(store: &str, a: &EngineArgs, size: u64, unthrottled: &Trial) -> Result<f64> {
    if unthrottled.readable >= KEEP {
        return Ok(unthrottled.insert.req_per_s);
    }
    let (mut lo, mut hi) = (0.0, unthrottled.insert.req_per_s);
    for _ in 0..a.search_steps {
        let mid = (lo + hi) / 2.0;
        let t = run_trial(store, a, size, Some(mid), false)?;
        // A store that cannot reach the asked rate is judged at the rate it reached.
        if t.readable >= KEEP {
            lo = t.insert.req_per_s.min(mid);
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

fn print_side_by_side(outcomes: &[Outcome]) {
    println!(
        "| store | size | unthrottled inserts/s (readable) | max inserts/s keeping ≥99% | measured at | inserts/s | insert p99 µs | readable | gets/s | get p99 µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let m = &o.measured;
        let (gets, get_p99) = m.get.as_ref().map_or((0.0, 0), |g| (g.req_per_s, g.latency.p99_us));
        println!(
            "| {} | {} KiB | {:.0} ({:.2}%) | {:.0} | {} | {:.0} | {} | {:.2}% | {:.0} | {} |",
            o.store,
            o.size / 1024,
            o.unthrottled.insert.req_per_s,
            o.unthrottled.readable * 100.0,
            o.max_kept_rate,
            m.rate.map_or("full speed".to_string(), |r| format!("{r:.0}/s")),
            m.insert.req_per_s,
            m.insert.latency.p99_us,
            m.readable * 100.0,
            gets,
            get_p99
        );
    }
}

/// Runs the engine benchmark.
pub fn run(a: EngineArgs) -> Result<()> {
    let mut stores = vec!["larder"];
    if let Some(Peer::Foyer) = a.compare {
        stores.push("foyer");
    }
    let mut outcomes = Vec::new();
    for &size in &a.sizes {
        let mut found = Vec::new();
        for &s in &stores {
            let unthrottled = run_trial(s, &a, size, None, false)?;
            let max = max_kept_rate(s, &a, size, &unthrottled)?;
            found.push((s, unthrottled, max));
        }
        // Throughput is compared only where every store keeps ≥99% of what it was given:
        // at full speed if all do, else at the lowest of their highest such rates.
        let common = if found.iter().all(|f| f.1.readable >= KEEP) {
            None
        } else {
            Some(found.iter().map(|f| f.2).fold(f64::INFINITY, f64::min).max(1.0))
        };
        for (s, unthrottled, max_kept_rate) in found {
            let measured = run_trial(s, &a, size, common, true)?;
            outcomes.push(Outcome { store: s.into(), size, unthrottled, max_kept_rate, measured });
        }
    }
    print_side_by_side(&outcomes);
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&outcomes)?).with_context(|| format!("writing {path:?}"))?;
    }
    Ok(())
}

fn tempfile_dir(base: &std::path::Path, name: &str) -> Result<PathBuf> {
    let dir = base.join(format!("larder-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {dir:?}"))?;
    Ok(dir)
}
