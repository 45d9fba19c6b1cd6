//! Workload description shared by the `http` and `engine` modes: which operation comes next,
//! on which key, with how many bytes. Pure and deterministic per seed, so two runs against
//! two servers issue the same sequence.

use clap::Args;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Only PUTs.
    Put,
    /// Only GETs.
    Get,
    /// GETs with probability `--get-ratio`, PUTs otherwise.
    Mixed,
}

/// How keys are chosen.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Dist {
    /// Every key equally likely.
    Uniform,
    /// Zipf with exponent s: a few keys get most requests.
    Zipf(f64),
    /// start, start+1, … (wrapping at `--keys`): every request a new key until it wraps.
    Sequential,
}

fn parse_dist(s: &str) -> Result<Dist, String> {
    match s {
        "uniform" => Ok(Dist::Uniform),
        "sequential" => Ok(Dist::Sequential),
        _ => match s.strip_prefix("zipf:").map(str::parse::<f64>) {
            Some(Ok(e)) if e > 0.0 => Ok(Dist::Zipf(e)),
            _ => Err(format!("invalid distribution {s:?}: use uniform, sequential or zipf:<s> (s > 0)")),
        },
    }
}

/// A value size: fixed, or a range each key maps into (a key always has the same size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Size {
    /// Smallest value in bytes.
    pub min: usize,
    /// Largest value in bytes.
    pub max: usize,
}

/// Parses a byte count: a bare number, or `KiB`/`MiB`/`GiB` (also `k`/`m`/`g`) and `KB`/`MB`/`GB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(format!("invalid size unit in {s:?}: use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

fn parse_one_size(s: &str) -> Result<usize, String> {
    parse_bytes(s).map(|n| n as usize)
}

fn parse_size(s: &str) -> Result<Size, String> {
    match s.split_once("..") {
        Some((a, b)) => {
            let (min, max) = (parse_one_size(a)?, parse_one_size(b)?);
            if min > max {
                return Err(format!("empty size range {s:?}"));
            }
            Ok(Size { min, max })
        }
        None => parse_one_size(s).map(|n| Size { min: n, max: n }),
    }
}

/// Workload options (flags shared by both modes).
#[derive(Args, Debug, Clone)]
pub struct Workload {
    /// put, get or mixed.
    #[arg(long, value_enum, default_value = "get")]
    pub workload: Kind,
    /// Share of GETs in a mixed workload.
    #[arg(long, default_value_t = 0.9)]
    pub get_ratio: f64,
    /// Value size in bytes: fixed (4096, 4KiB) or a range (1KiB..64KiB).
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub value_size: Size,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// First key number of a sequential run (use a fresh range to write new keys).
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// uniform, zipf:<s> or sequential.
    #[arg(long, default_value = "uniform", value_parser = parse_dist)]
    pub distribution: Dist,
    /// Seed of the random choices (same seed, same sequence).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// One operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read key n.
    Get(u64),
    /// Write key n.
    Put(u64),
}

/// Generates operations for one worker; sequential runs share one counter between workers.
pub struct Generator {
    w: Workload,
    rng: SmallRng,
    zipf: Option<Zipf<f64>>,
    scatter: Scatter,
    counter: Arc<AtomicU64>,
}

impl Generator {
    /// A generator for worker `id`; workers sharing `counter` split a sequential run.
    pub fn new(w: &Workload, id: u64, counter: Arc<AtomicU64>) -> Generator {
        let zipf = match w.distribution {
            Dist::Zipf(s) => Some(Zipf::new(w.keys.max(1) as f64, s).expect("valid zipf parameters")),
            _ => None,
        };
        let rng = SmallRng::seed_from_u64(w.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Generator { w: w.clone(), rng, zipf, scatter: Scatter::new(w.keys), counter }
    }

    fn key(&mut self) -> u64 {
        let keys = self.w.keys.max(1);
        match self.w.distribution {
            Dist::Uniform => self.w.start + self.rng.random_range(0..keys),
            Dist::Sequential => self.w.start + self.counter.fetch_add(1, Ordering::Relaxed) % keys,
            Dist::Zipf(_) => {
                let rank = self.zipf.as_ref().expect("zipf").sample(&mut self.rng) as u64 - 1;
                // Scatter the popular ranks over the key space so hot keys are not neighbours.
                self.w.start + self.scatter.key(rank)
            }
        }
    }

    /// The next operation.
    pub fn next_op(&mut self) -> Op {
        let get = match self.w.workload {
            Kind::Get => true,
            Kind::Put => false,
            Kind::Mixed => self.rng.random_bool(self.w.get_ratio.clamp(0.0, 1.0)),
        };
        let k = self.key();
        if get {
            Op::Get(k)
        } else {
            Op::Put(k)
        }
    }

    /// The value size of key `k` (always the same for a key).
    pub fn size_of(&self, k: u64) -> usize {
        size_of(self.w.value_size, k)
    }
}

/// Maps popularity ranks (0-based, below `keys`) to key numbers, one to one, so that popular
/// keys are spread over the key space instead of being neighbours.
#[derive(Debug, Clone, Copy)]
pub struct Scatter {
    keys: u64,
    mult: u64,
}

impl Scatter {
    /// The permutation of `0..keys`.
    pub fn new(keys: u64) -> Scatter {
        let keys = keys.max(1);
        // Multiplication by a number coprime to `keys` permutes 0..keys.
        let mut mult = 0x9E37_79B9_7F4A_7C15u64 % keys;
        while gcd(mult, keys) != 1 {
            mult += 1;
        }
        Scatter { keys, mult }
    }

    /// The key number of `rank`.
    pub fn key(&self, rank: u64) -> u64 {
        ((rank as u128 * self.mult as u128) % self.keys as u128) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The value size of key `k` within `size`.
pub fn size_of(size: Size, k: u64) -> usize {
    if size.min == size.max {
        return size.min;
    }
    let span = (size.max - size.min + 1) as u64;
    size.min + (k.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as usize % span as usize
}

/// Random (incompressible) bytes that values are sliced from.
pub fn value_pool(max: usize, seed: u64) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut v = vec![0u8; max.max(1)];
    rng.fill(&mut v[..]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation() {
        for keys in [1u64, 2, 10, 1000, 20_000, 65_536, 99_991] {
            let mut seen = vec![false; keys as usize];
            for r in 0..keys {
                let k = Scatter::new(keys).key(r) as usize;
                assert!(!seen[k], "{keys} keys: {k} twice");
                seen[k] = true;
            }
        }
    }

    fn workload(kind: Kind, dist: &str) -> Workload {
        Workload {
            workload: kind,
            get_ratio: 0.9,
            value_size: parse_size("1KiB..4KiB").unwrap(),
            keys: 1000,
            start: 5,
            distribution: parse_dist(dist).unwrap(),
            seed: 1,
        }
    }

    #[test]
    fn parsing() {
        assert_eq!(parse_size("4096").unwrap(), Size { min: 4096, max: 4096 });
        assert_eq!(parse_size("64KiB").unwrap(), Size { min: 65536, max: 65536 });
        assert_eq!(parse_size("1k..2k").unwrap(), Size { min: 1024, max: 2048 });
        assert!(parse_size("2k..1k").is_err());
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert!(parse_bytes("3 parsecs").is_err());
        assert_eq!(parse_dist("zipf:0.99").unwrap(), Dist::Zipf(0.99));
        assert!(parse_dist("zipf:x").is_err());
        assert!(parse_dist("normal").is_err());
    }

    #[test]
    fn keys_stay_in_range_and_sizes_are_stable() {
        for dist in ["uniform", "zipf:0.99", "sequential"] {
            let w = workload(Kind::Mixed, dist);
            let mut g = Generator::new(&w, 0, Arc::default());
            let (mut gets, mut puts) = (0, 0);
            for _ in 0..10_000 {
                let k = match g.next_op() {
                    Op::Get(k) => {
                        gets += 1;
                        k
                    }
                    Op::Put(k) => {
                        puts += 1;
                        k
                    }
                };
                assert!((5..1005).contains(&k), "{dist}: key {k}");
                let s = g.size_of(k);
                assert!((1024..=4096).contains(&s) && s == size_of(w.value_size, k));
            }
            assert!(gets > 8500 && puts > 500, "{dist}: {gets} gets, {puts} puts");
        }
    }

    #[test]
    fn zipf_concentrates_and_sequential_covers() {
        let mut g = Generator::new(&workload(Kind::Get, "zipf:0.99"), 0, Arc::default());
        let mut counts = std::collections::HashMap::new();
        for _ in 0..20_000 {
            if let Op::Get(k) = g.next_op() {
                *counts.entry(k).or_insert(0) += 1;
            }
        }
        let top = counts.values().max().unwrap();
        assert!(*top > 20_000 / 100, "the hottest key got only {top}");
        let counter = Arc::new(AtomicU64::new(0));
        let mut a = Generator::new(&workload(Kind::Put, "sequential"), 0, counter.clone());
        let mut b = Generator::new(&workload(Kind::Put, "sequential"), 1, counter);
        let seen: Vec<_> = (0..4).map(|i| if i % 2 == 0 { a.next_op() } else { b.next_op() }).collect();
        assert_eq!(seen, [Op::Put(5), Op::Put(6), Op::Put(7), Op::Put(8)]);
    }
}
