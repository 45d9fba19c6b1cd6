//! `hitratio`: larder's engine as a read-through cache under a zipf stream, reporting how
//! often each tier answers. Each request is a GET; a miss is filled with a PUT, as a cache in
//! front of an origin would. The key space's bytes are a multiple of the memory tier and of
//! the disk ring, so both tiers must choose what to keep. It runs every memory eviction policy
//! with reinsertion, then plain FIFO vs reinsertion on disk with the default policy.

use crate::memory::Stream;
use crate::workload::{parse_bytes, value_pool};
use anyhow::{Context, Result};
use clap::Args;
use larder_engine::{Eviction, FsyncPolicy, MemoryConfig, PutOptions, ReadOptions, Store, StoreConfig, Tier};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of the `hitratio` mode.
#[derive(Args, Debug)]
pub struct HitRatioArgs {
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Value size.
    #[arg(long, default_value = "4KiB", value_parser = parse_bytes)]
    pub value_size: u64,
    /// Zipf exponent.
    #[arg(long, default_value_t = 0.99)]
    pub zipf: f64,
    /// Key space bytes ÷ memory capacity.
    #[arg(long, default_value_t = 10.0)]
    pub memory_ratio: f64,
    /// Key space bytes ÷ disk ring capacity.
    #[arg(long, default_value_t = 2.0)]
    pub disk_ratio: f64,
    /// Volumes in the ring.
    #[arg(long, default_value_t = 8)]
    pub volume_count: u32,
    /// Requests before measuring (to fill both tiers).
    #[arg(long, default_value_t = 1_000_000)]
    pub warmup: u64,
    /// Requests measured.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Directory for the store (a temporary directory under it is used and removed); a
    /// memory file system keeps the run about the policies, not the device.
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Reinsertion thresholds compared with plain FIFO (with the default memory policy).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub reinsert_min_hits: Vec<u8>,
    /// Most bytes reinsertion copies per ring step, as a share of a volume.
    #[arg(long, default_value_t = 0.2)]
    pub reinsert_share: f64,
    /// Only compare disk policies (skip the memory policies other than the default).
    #[arg(long)]
    pub disk_only: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Row {
    memory: &'static str,
    reinsert_min_hits: u8,
    memory_hit_ratio: f64,
    disk_hit_ratio: f64,
    overall_hit_ratio: f64,
    reinserted: u64,
    reinsert_over_budget: u64,
    reinsert_skipped: u64,
    reinsert_in_memory: u64,
    seconds: f64,
}

fn one(a: &HitRatioArgs, eviction: Eviction, min_hits: u8) -> Result<Row> {
    let tmp = tempfile::tempdir_in(&a.dir).with_context(|| format!("temporary directory in {}", a.dir.display()))?;
    // Records carry a header and the key besides the value.
    let space = a.keys * (a.value_size + 100);
    let volume_size = (space as f64 / a.disk_ratio / a.volume_count as f64) as u64;
    let cfg = StoreConfig {
        volume_size,
        volume_count: a.volume_count,
        max_value_size: a.value_size,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: (space as f64 / a.memory_ratio) as u64, eviction, ..MemoryConfig::default() },
        reinsert_min_hits: min_hits,
        reinsert_share: a.reinsert_share,
        ..StoreConfig::new(tmp.path())
    };
    let store = Store::open(cfg)?;
    let pool = value_pool(a.value_size as usize, 3);
    let mut stream = Stream::new(a.keys, a.zipf, 11);
    let (mut mem, mut disk, mut key) = (0u64, 0u64, Vec::new());
    let started = Instant::now();
    for i in 0..a.warmup + a.requests {
        let k = stream.next();
        key.clear();
        key.extend_from_slice(format!("obj/{k:012}").as_bytes());
        let got = store.get(&key, &ReadOptions::default())?;
        if got.is_none() {
            store.put(&key, &pool, &PutOptions::default())?;
        }
        if i >= a.warmup {
            match got.map(|v| v.tier) {
                Some(Tier::Memory) => mem += 1,
                Some(Tier::Disk) => disk += 1,
                None => {}
            }
        }
    }
    // Let reinsertion queued by the last ring steps finish, so its counters are complete.
    store.settle();
    let s = store.stats();
    let n = a.requests as f64;
    Ok(Row {
        memory: eviction.name(),
        reinsert_min_hits: min_hits,
        memory_hit_ratio: mem as f64 / n,
        disk_hit_ratio: disk as f64 / n,
        overall_hit_ratio: (mem + disk) as f64 / n,
        reinserted: s.reinserted,
        reinsert_over_budget: s.reinsert_over_budget,
        reinsert_skipped: s.reinsert_skipped,
        reinsert_in_memory: s.reinsert_in_memory,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs every configuration and prints the table.
pub fn run(a: HitRatioArgs) -> Result<()> {
    let space = a.keys * (a.value_size + 100);
    eprintln!(
        "{} keys of {} bytes, zipf {}; memory {} MiB (1/{}), disk ring {} MiB (1/{}) in {} volumes",
        a.keys,
        a.value_size,
        a.zipf,
        (space as f64 / a.memory_ratio) as u64 >> 20,
        a.memory_ratio,
        (space as f64 / a.disk_ratio) as u64 >> 20,
        a.disk_ratio,
        a.volume_count
    );
    let first = a.reinsert_min_hits.first().copied().unwrap_or(1);
    let mut runs: Vec<(Eviction, u8)> = if a.disk_only {
        vec![(Eviction::Clock, first)]
    } else {
        Eviction::ALL.iter().map(|&(e, _)| (e, first)).collect()
    };
    runs.extend(a.reinsert_min_hits.iter().skip(1).map(|&m| (Eviction::Clock, m)));
    runs.push((Eviction::Clock, 0));
    let mut rows = Vec::new();
    for (e, min_hits) in runs {
        let r = one(&a, e, min_hits)?;
        eprintln!(
            "memory {:<6} reinsert-min-hits {}: memory {:.4}, disk {:.4}, overall {:.4} ({} reinserted, {:.0} s)",
            r.memory,
            r.reinsert_min_hits,
            r.memory_hit_ratio,
            r.disk_hit_ratio,
            r.overall_hit_ratio,
            r.reinserted,
            r.seconds
        );
        rows.push(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "| memory eviction | disk tier | memory hit ratio | disk hit ratio | overall hit ratio | reinserted | over budget | held by memory |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let disk = match r.reinsert_min_hits {
            0 => "plain FIFO".to_string(),
            n => format!("reinsertion, min hits {n}"),
        };
        println!(
            "| {} | {} | {:.4} | {:.4} | {:.4} | {} | {} | {} |",
            r.memory,
            disk,
            r.memory_hit_ratio,
            r.disk_hit_ratio,
            r.overall_hit_ratio,
            r.reinserted,
            r.reinsert_over_budget,
            r.reinsert_in_memory
        );
    }
    Ok(())
}
