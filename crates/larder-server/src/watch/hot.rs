//! The most requested keys of a door, and the largest values it served: a bounded, sampled
//! sketch (Metwally's Space-Saving) a request updates one time in [`SAMPLE_EVERY`].
//!
//! Keys are split by hash over [`SHARDS`] sketches of [`PER_SHARD`] counters, each under its
//! own lock: a key is always counted in the same one, so their tops merge exactly, and two
//! cores rarely meet on a lock. A key new to a full sketch takes the place of its least
//! counted one and inherits that count as its possible overcount (`error`), so a key that is
//! truly hot is never lost. Counts are halved every [`HALF_LIFE_TICKS`] ticks (seconds):
//! the sketch tells what is hot now, not what was once.

use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One request in this many is counted (per thread, in turn).
pub const SAMPLE_EVERY: u32 = 8;
/// Sketches a door's keys are split over.
pub const SHARDS: usize = 8;
/// Counters of each sketch.
pub const PER_SHARD: usize = 128;
/// The longest key kept; a longer one is kept cut (and marked so).
pub const KEY_MAX: usize = 200;
/// The largest values kept per door.
pub const LARGEST: usize = 10;
/// Seconds over which counts halve.
pub const HALF_LIFE_TICKS: u32 = 10;

/// The most memory one door's sketch can hold (280,928 bytes): its counters with their keys at
/// the longest, their hash map, and the largest values' list.
pub const MAX_BYTES: usize =
    SHARDS * PER_SHARD * (std::mem::size_of::<Entry>() + KEY_MAX + MAP_ENTRY) + LARGEST * (KEY_MAX + 40);

/// A counter's place in its sketch's hash map (hash and index, control byte, spare room).
const MAP_ENTRY: usize = 24;

struct Entry {
    key: Box<[u8]>,
    hash: u64,
    count: u64,
    error: u64,
    /// The key was longer than [`KEY_MAX`].
    cut: bool,
}

#[derive(Default)]
struct Shard {
    entries: Vec<Entry>,
    at: HashMap<u64, usize>,
}

impl Shard {
    fn count(&mut self, hash: u64, key: &[u8]) {
        if let Some(&i) = self.at.get(&hash) {
            self.entries[i].count += 1;
            return;
        }
        let cut = key.len() > KEY_MAX;
        let key: Box<[u8]> = key[..key.len().min(KEY_MAX)].into();
        if self.entries.len() < PER_SHARD {
            self.at.insert(hash, self.entries.len());
            self.entries.push(Entry { key, hash, count: 1, error: 0, cut });
            return;
        }
        let (i, min) =
            self.entries.iter().enumerate().map(|(i, e)| (i, e.count)).min_by_key(|&(_, c)| c).unwrap_or((0, 0));
        let e = &mut self.entries[i];
        self.at.remove(&e.hash);
        *e = Entry { key, hash, count: min + 1, error: min, cut };
        self.at.insert(hash, i);
    }

    fn halve(&mut self) {
        self.entries.iter_mut().for_each(|e| (e.count, e.error) = (e.count / 2, e.error / 2));
    }
}

/// One of the largest values served: its size, its key (cut) and the key's hash.
type Large = (u64, Box<[u8]>, u64);

/// A door's sketch.
pub struct Hot {
    shards: [Mutex<Shard>; SHARDS],
    largest: Mutex<Vec<Large>>,
    /// The smallest of the largest values kept, once the list is full: most values are
    /// turned away by this one load.
    floor: AtomicU64,
    /// The hashes of the keys listed, and their sizes: a hot key among the largest is found
    /// here and never takes the lock.
    listed: [(AtomicU64, AtomicU64); LARGEST],
    ticks: AtomicU64,
}

/// A key and its estimated requests (counted samples times [`SAMPLE_EVERY`]), at most
/// `error` of them perhaps another key's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub key: Vec<u8>,
    pub requests: u64,
    pub error: u64,
    /// The key was longer than [`KEY_MAX`] bytes.
    pub cut: bool,
}

thread_local! {
    static DICE: Cell<u64> = const { Cell::new(0) };
}

/// Whether this request is one the sketches count: one in [`SAMPLE_EVERY`], at random (a
/// thread's own xorshift). Not in turn: a client that alternates two keys on one connection
/// would have one of them never counted.
#[inline]
pub fn sampled() -> bool {
    DICE.with(|d| {
        let mut x = d.get();
        if x == 0 {
            use std::hash::BuildHasher;
            x = std::collections::hash_map::RandomState::new().hash_one(0u64) | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        d.set(x);
        x % SAMPLE_EVERY as u64 == 0
    })
}

/// Keys are told apart by a 64-bit hash seeded at random when the process starts, so that
/// no client can choose keys that merge with another's count.
fn hash_of(key: &[u8]) -> u64 {
    static SEED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0u64)
    });
    xxhash_rust::xxh3::xxh3_64_with_seed(key, *SEED)
}

impl Default for Hot {
    fn default() -> Hot {
        Hot {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            largest: Mutex::new(Vec::with_capacity(LARGEST + 1)),
            floor: AtomicU64::new(0),
            listed: std::array::from_fn(|_| (AtomicU64::new(0), AtomicU64::new(0))),
            ticks: AtomicU64::new(0),
        }
    }
}

impl Hot {
    /// Counts a request for `key` that was sampled (see [`sampled`]).
    pub fn count(&self, key: &[u8]) {
        let hash = hash_of(key);
        self.shards[(hash >> 61) as usize % SHARDS].lock().count(hash, key);
    }

    /// A value of `bytes` was served for `key`: kept if among the largest.
    #[inline]
    pub fn served(&self, key: &[u8], bytes: u64) {
        if bytes <= self.floor.load(Ordering::Relaxed) {
            return;
        }
        let hash = hash_of(key);
        let known =
            self.listed.iter().any(|(h, b)| h.load(Ordering::Relaxed) == hash && b.load(Ordering::Relaxed) >= bytes);
        if !known {
            self.served_large(key, hash, bytes);
        }
    }

    #[cold]
    fn served_large(&self, key: &[u8], hash: u64, bytes: u64) {
        let key = &key[..key.len().min(KEY_MAX)];
        let mut l = self.largest.lock();
        match l.iter_mut().find(|(_, _, h)| *h == hash) {
            Some(e) => e.0 = e.0.max(bytes),
            None => l.push((bytes, key.into(), hash)),
        }
        l.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        l.truncate(LARGEST);
        if l.len() == LARGEST {
            self.floor.store(l[LARGEST - 1].0, Ordering::Relaxed);
        }
        for (i, (h, b)) in self.listed.iter().enumerate() {
            let (size, hash) = l.get(i).map_or((0, 0), |(size, _, h)| (*size, *h));
            h.store(hash, Ordering::Relaxed);
            b.store(size, Ordering::Relaxed);
        }
    }

    /// The `n` most requested keys, most first.
    pub fn top(&self, n: usize) -> Vec<Counted> {
        let mut all: Vec<Counted> = Vec::new();
        for s in &self.shards {
            let s = s.lock();
            all.extend(s.entries.iter().filter(|e| e.count > 0).map(|e| Counted {
                key: e.key.to_vec(),
                requests: e.count * SAMPLE_EVERY as u64,
                error: e.error * SAMPLE_EVERY as u64,
                cut: e.cut,
            }));
        }
        all.sort_unstable_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }

    /// The largest values served, largest first.
    pub fn largest(&self) -> Vec<(Vec<u8>, u64)> {
        self.largest.lock().iter().map(|(b, k, _)| (k.to_vec(), *b)).collect()
    }

    /// Bytes the sketch holds now (at most [`MAX_BYTES`]).
    pub fn memory_bytes(&self) -> usize {
        let per = std::mem::size_of::<Entry>() + MAP_ENTRY;
        let shards: usize =
            self.shards.iter().map(|s| s.lock().entries.iter().map(|e| per + e.key.len()).sum::<usize>()).sum();
        shards + self.largest.lock().iter().map(|(_, k, _)| 40 + k.len()).sum::<usize>()
    }

    /// A second passed: every [`HALF_LIFE_TICKS`] of them the counts halve.
    pub fn tick(&self) {
        if (self.ticks.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(HALF_LIFE_TICKS as u64) {
            self.shards.iter().for_each(|s| s.lock().halve());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Zipf(s) sampler over `n` ranks by inverting its cumulative distribution.
    struct Zipf {
        cdf: Vec<f64>,
    }

    impl Zipf {
        fn new(n: usize, s: f64) -> Zipf {
            let mut acc = 0.0;
            let mut cdf: Vec<f64> = (1..=n)
                .map(|k| {
                    acc += 1.0 / (k as f64).powf(s);
                    acc
                })
                .collect();
            cdf.iter_mut().for_each(|c| *c /= acc);
            Zipf { cdf }
        }

        fn rank(&self, u: f64) -> usize {
            self.cdf.partition_point(|&c| c < u)
        }
    }

    /// xorshift64*: the workload is the same on every run (which requests are sampled is not).
    fn uniform(state: &mut u64) -> f64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn key(rank: usize) -> Vec<u8> {
        // Ranks scattered over the key space, so hotness has nothing to do with the order.
        format!("/thumbs/{:016x}.jpg", (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).into_bytes()
    }

    #[test]
    fn zipf_top_ten_is_found_in_bounded_memory() {
        for (s, seed) in [(0.9, 7u64), (1.0, 11), (1.1, 13)] {
            let zipf = Zipf::new(100_000, s);
            let hot = Hot::default();
            let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
            let mut state = seed;
            for _ in 0..1_000_000 {
                let k = key(zipf.rank(uniform(&mut state)));
                *truth.entry(k.clone()).or_default() += 1;
                if sampled() {
                    hot.count(&k);
                }
                hot.served(&k, k.len() as u64);
            }
            let mut true_top: Vec<_> = truth.into_iter().collect();
            true_top.sort_by_key(|e| std::cmp::Reverse(e.1));
            let true_top: Vec<_> = true_top[..10].iter().map(|(k, _)| k.clone()).collect();
            let found = hot.top(10);
            let shared = found.iter().filter(|c| true_top.contains(&c.key)).count();
            eprintln!("Zipf s={s}: {shared} of the true top 10 found, {} bytes held", hot.memory_bytes());
            assert!(shared >= 9, "s={s}: {shared} of the true top 10 found");
            let mem = hot.memory_bytes();
            assert!(mem <= MAX_BYTES, "{mem} bytes held, over the bound {MAX_BYTES}");
            assert!(found.windows(2).all(|w| w[0].requests >= w[1].requests));
        }
    }

    #[test]
    fn memory_stays_bounded_whatever_the_key_count() {
        let hot = Hot::default();
        for i in 0..200_000u64 {
            let mut k = format!("k{i}").into_bytes();
            k.resize(KEY_MAX + 50, b'x');
            hot.count(&k);
            hot.served(&k, i);
        }
        assert!(hot.memory_bytes() <= MAX_BYTES);
        assert!(hot.top(3).iter().all(|c| c.cut && c.key.len() == KEY_MAX));
        let largest = hot.largest();
        assert_eq!(largest.len(), LARGEST);
        assert_eq!(largest[0].1, 199_999);
        assert_eq!(largest[LARGEST - 1].1, 199_990);
    }

    #[test]
    fn counts_halve_with_time() {
        let hot = Hot::default();
        (0..64).for_each(|_| hot.count(b"a"));
        (0..HALF_LIFE_TICKS).for_each(|_| hot.tick());
        assert_eq!(hot.top(1)[0].requests, 32 * SAMPLE_EVERY as u64);
    }
}
