//! `memory`: the in-memory cache crates larder could put in front of its disk, measured on
//! larder's own shape of work (URL-like byte keys, `Bytes` values weighted by their length,
//! read-through: a miss inserts the value). It reports each candidate's hit ratio on one
//! deterministic zipf stream and its throughput with one thread per core, which is how the
//! memory tier's crate and default policy were chosen (see larder-engine's `memory.rs`).

use crate::workload::{parse_bytes, value_pool};
use anyhow::Result;
use bytes::Bytes;
use clap::Args;
use foyer_memory::{Cache, CacheBuilder, EvictionConfig, FifoConfig, LfuConfig, LruConfig, S3FifoConfig, SieveConfig};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of the `memory` mode.
#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Distinct keys in the stream.
    #[arg(long, default_value_t = 200_000)]
    pub keys: u64,
    /// Value size.
    #[arg(long, default_value = "4KiB", value_parser = parse_bytes)]
    pub value_size: u64,
    /// Cache capacity as a fraction of the key space's bytes.
    #[arg(long, default_value_t = 0.1)]
    pub capacity_ratio: f64,
    /// Zipf exponent of the key popularity.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Requests in the hit-ratio pass (one thread, so the stream is the same for everyone).
    #[arg(long, default_value_t = 2_000_000)]
    pub requests: u64,
    /// Length of the throughput pass per candidate.
    #[arg(long, default_value = "3", value_parser = crate::http::parse_duration)]
    pub duration: Duration,
    /// Threads in the throughput pass.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The operations a candidate offers, as larder would use them.
trait Mem: Send + Sync {
    fn get(&self, key: &[u8]) -> Option<Bytes>;
    fn insert(&self, key: &[u8], value: Bytes);
}

/// Per-entry weight: the bytes held plus a rough per-entry overhead, as larder charges it.
fn weight(key: &[u8], value: &Bytes) -> usize {
    key.len() + value.len() + 64
}

struct Foyer(Cache<Vec<u8>, Bytes>);
impl Mem for Foyer {
    fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.0.get(key).map(|e| e.value().clone())
    }
    fn insert(&self, key: &[u8], value: Bytes) {
        self.0.insert(key.to_vec(), value);
    }
}

#[derive(Clone)]
struct QcWeight;
impl quick_cache::Weighter<Vec<u8>, Bytes> for QcWeight {
    fn weight(&self, key: &Vec<u8>, value: &Bytes) -> u64 {
        weight(key, value) as u64
    }
}
struct Quick(quick_cache::sync::Cache<Vec<u8>, Bytes, QcWeight>);
impl Mem for Quick {
    fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.0.get(key)
    }
    fn insert(&self, key: &[u8], value: Bytes) {
        self.0.insert(key.to_vec(), value);
    }
}

struct Moka(moka::sync::Cache<Vec<u8>, Bytes>);
impl Mem for Moka {
    fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.0.get(key)
    }
    fn insert(&self, key: &[u8], value: Bytes) {
        self.0.insert(key.to_vec(), value);
    }
}

const CANDIDATES: [&str; 8] = [
    "foyer fifo",
    "foyer lru",
    "foyer lfu (w-TinyLFU)",
    "foyer s3fifo",
    "foyer sieve",
    "quick_cache (CLOCK-Pro)",
    "moka tinylfu",
    "moka lru",
];

fn build(name: &str, capacity: usize, items: usize) -> Option<Arc<dyn Mem>> {
    let foyer = |e: EvictionConfig| -> Arc<dyn Mem> {
        Arc::new(Foyer(
            CacheBuilder::new(capacity)
                .with_eviction_config(e)
                .with_weighter(|k: &Vec<u8>, v: &Bytes| weight(k, v))
                .build(),
        ))
    };
    let moka = |p: moka::policy::EvictionPolicy| -> Arc<dyn Mem> {
        Arc::new(Moka(
            moka::sync::Cache::builder()
                .max_capacity(capacity as u64)
                .eviction_policy(p)
                .weigher(|k: &Vec<u8>, v: &Bytes| weight(k, v) as u32)
                .build(),
        ))
    };
    Some(match name {
        "foyer fifo" => foyer(FifoConfig::default().into()),
        "foyer lru" => foyer(LruConfig::default().into()),
        "foyer lfu (w-TinyLFU)" => foyer(LfuConfig::default().into()),
        "foyer s3fifo" => foyer(S3FifoConfig::default().into()),
        "foyer sieve" => foyer(SieveConfig.into()),
        "quick_cache (CLOCK-Pro)" => {
            Arc::new(Quick(quick_cache::sync::Cache::with_weighter(items, capacity as u64, QcWeight)))
        }
        "moka tinylfu" => moka(moka::policy::EvictionPolicy::tiny_lfu()),
        "moka lru" => moka(moka::policy::EvictionPolicy::lru()),
        _ => return None,
    })
}

fn key_bytes(buf: &mut Vec<u8>, k: u64) {
    use std::io::Write;
    buf.clear();
    let _ = write!(buf, "thumbs/{k:016x}.jpg");
}

/// A deterministic zipf stream of key numbers.
pub struct Stream {
    zipf: Zipf<f64>,
    rng: SmallRng,
    scatter: crate::workload::Scatter,
}

impl Stream {
    /// `keys` keys, exponent `s`, seeded.
    pub fn new(keys: u64, s: f64, seed: u64) -> Stream {
        let zipf = Zipf::new(keys as f64, s).expect("valid zipf parameters");
        Stream { zipf, rng: SmallRng::seed_from_u64(seed), scatter: crate::workload::Scatter::new(keys) }
    }
    /// The next key number.
    pub fn next(&mut self) -> u64 {
        // Popular ranks scattered over the key space, as the http mode does.
        self.scatter.key(self.zipf.sample(&mut self.rng) as u64 - 1)
    }
}

/// One read-through request: returns whether it hit.
fn request(mem: &dyn Mem, key: &[u8], value: &Bytes) -> bool {
    if mem.get(key).is_some() {
        return true;
    }
    mem.insert(key, value.clone());
    false
}

#[derive(serde::Serialize)]
struct Row {
    candidate: String,
    hit_ratio: f64,
    mops: f64,
}

/// Runs every candidate and prints the table.
pub fn run(a: MemoryArgs) -> Result<()> {
    let total = a.keys * (a.value_size + 64);
    let capacity = (total as f64 * a.capacity_ratio) as usize;
    let items = (capacity as u64 / (a.value_size + 64)).max(1) as usize;
    // Values share one buffer: the measurement is of the cache, not of allocating values.
    let pool = Bytes::from(value_pool(a.value_size as usize, 7));
    eprintln!(
        "{} keys of {} bytes, capacity {} MiB ({}% of the key space), zipf {}",
        a.keys,
        a.value_size,
        capacity >> 20,
        a.capacity_ratio * 100.0,
        a.zipf
    );
    let mut rows = Vec::new();
    for name in CANDIDATES {
        let mem = build(name, capacity, items).expect("known candidate");
        let (mut stream, mut key, mut hits) = (Stream::new(a.keys, a.zipf, 1), Vec::new(), 0u64);
        // Warm up with as many requests again, so the ratio is of a full cache.
        for i in 0..a.requests * 2 {
            key_bytes(&mut key, stream.next());
            let hit = request(&*mem, &key, &pool);
            if i >= a.requests {
                hits += hit as u64;
            }
        }
        let hit_ratio = hits as f64 / a.requests as f64;
        let deadline = Instant::now() + a.duration;
        let ops: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..a.threads.max(1))
                .map(|t| {
                    let (mem, a, pool) = (mem.clone(), &a, pool.clone());
                    s.spawn(move || {
                        let (mut stream, mut key, mut n) =
                            (Stream::new(a.keys, a.zipf, 100 + t as u64), Vec::new(), 0u64);
                        while Instant::now() < deadline {
                            for _ in 0..256 {
                                key_bytes(&mut key, stream.next());
                                request(&*mem, &key, &pool);
                            }
                            n += 256;
                        }
                        n
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("worker")).sum()
        });
        let row = Row { candidate: name.to_string(), hit_ratio, mops: ops as f64 / a.duration.as_secs_f64() / 1e6 };
        eprintln!("{:<26} hit ratio {:.4}  {:.2} M req/s", row.candidate, row.hit_ratio, row.mops);
        rows.push(row);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("| candidate | hit ratio | M req/s ({} threads) |", a.threads);
        println!("|---|---|---|");
        for r in &rows {
            println!("| {} | {:.4} | {:.2} |", r.candidate, r.hit_ratio, r.mops);
        }
    }
    Ok(())
}
