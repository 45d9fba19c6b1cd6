//! The memory tier: values kept in process memory in front of the volumes, and the admission
//! rule that decides which disk reads earn a place there.
//!
//! Eviction is not written here; it comes from well-kept crates, chosen by measurement on
//! larder's own shape of work (`larder-bench memory`, BENCHMARKS.md "Memory tier"):
//! - `clock` (the default) is quick_cache's CLOCK-Pro-like policy. On a zipf(0.99) stream with
//!   a capacity of a tenth of the key space it had the best hit ratio of every candidate and
//!   the highest throughput (1.6x foyer's fastest policy, 3.6x moka).
//! - `sieve`, `s3fifo`, `lfu` (w-TinyLFU), `lru` and `fifo` come from foyer's in-memory cache,
//!   the one crate that offers all of them behind one interface, for workloads where another
//!   policy wins. moka measured slowest with no better hit ratio, so it is not offered.
//!
//! Consistency with the disk, one rule: a value enters memory only while the index names the
//! record it came from, and every write's change of a key's index entry (PUT, DELETE, the undo
//! after a failed fsync) and every expiry is followed by [`Memory::reconcile`], which drops the
//! key. Both happen under the key's stripe lock, so whichever comes second sees the other's
//! effect, and memory never holds a value older than its key's newest write: once a write has
//! returned no GET finds an older value here. (Changes that are not writes leave memory be:
//! the ring evicting a volume, a damaged record, reinsertion copying a record, a colliding
//! key taking an index slot. What memory holds then is still the key's newest write.)

pub(crate) mod flight;

use crate::config::{Eviction, MemoryConfig};
use crate::types::Position;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What memory keeps of a value.
#[derive(Clone)]
pub(crate) struct Cached {
    /// The value, or its coded bytes when `coded` names their codec, dictionary (0: none)
    /// and the value's length.
    pub data: Bytes,
    pub coded: Option<(crate::types::Codec, u32, u64)>,
    pub position: Position,
    pub stored_ms: u64,
    pub expiry_ms: u64,
    /// CRC32C of the value.
    pub crc: u32,
    pub content_type: Option<Bytes>,
    pub attrs: Option<Bytes>,
    pub flags: u32,
    pub stale: bool,
}

impl Cached {
    /// The value's length.
    pub fn len(&self) -> u64 {
        self.coded.map_or(self.data.len() as u64, |(_, _, len)| len)
    }
}

/// What [`Memory::reconcile`] did.
pub(crate) enum Settled {
    /// The value offered went in.
    Stored,
    /// The key was dropped; this is what it held.
    Dropped(Option<Cached>),
}

/// Charged per entry on top of key and value bytes: the cache's node, the key's and value's
/// headers. An estimate, so that a tier of tiny values does not hold far more than its capacity.
const ENTRY_OVERHEAD: usize = 96;

fn weight(key: &[u8], c: &Cached) -> usize {
    key.len()
        + c.data.len()
        + c.content_type.as_ref().map_or(0, |t| t.len())
        + c.attrs.as_ref().map_or(0, |a| a.len())
        + ENTRY_OVERHEAD
}

fn foyer_weight(key: &MemKey, c: &Cached) -> usize {
    weight(key.as_slice(), c)
}

#[derive(Clone)]
struct ClockWeight;
impl quick_cache::Weighter<MemKey, Cached> for ClockWeight {
    fn weight(&self, key: &MemKey, c: &Cached) -> u64 {
        weight(key.as_slice(), c) as u64
    }
}

enum Backend {
    Clock(quick_cache::sync::Cache<MemKey, Cached, ClockWeight, quick_cache::DefaultHashBuilder, Leaving>),
    Foyer(foyer_memory::Cache<MemKey, Cached>),
}

/// The values memory holds: how many, their bytes as sent and as held (a coded value is held
/// coded). Added to on every insert (under the key's stripe lock), taken from as values leave.
#[derive(Default)]
pub(crate) struct Held {
    values: AtomicI64,
    logical: AtomicI64,
    stored: AtomicI64,
}

impl Held {
    fn add(&self, c: &Cached, sign: i64) {
        self.values.fetch_add(sign, Ordering::Relaxed);
        self.logical.fetch_add(sign * c.len() as i64, Ordering::Relaxed);
        self.stored.fetch_add(sign * c.data.len() as i64, Ordering::Relaxed);
    }

    /// (values, bytes as sent, bytes as held)
    pub fn get(&self) -> (u64, u64, u64) {
        let n = |a: &AtomicI64| a.load(Ordering::Relaxed).max(0) as u64;
        (n(&self.values), n(&self.logical), n(&self.stored))
    }
}

/// Takes what leaves either cache off [`Held`]: quick_cache's evictions (a replaced or removed
/// value is taken off by `reconcile`), and everything foyer lets go (evicted, replaced,
/// removed).
#[derive(Clone)]
struct Leaving(Arc<Held>);

impl quick_cache::Lifecycle<MemKey, Cached> for Leaving {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _: MemKey, val: Cached) {
        self.0.add(&val, -1);
    }
}

impl foyer_common::event::EventListener for Leaving {
    type Key = MemKey;
    type Value = Cached;

    fn on_leave(&self, _: foyer_common::event::Event, _: &MemKey, value: &Cached) {
        self.0.add(value, -1);
    }
}

/// Keys up to this long are held inline in the cache's entry.
const INLINE_KEY: usize = 46;

/// A key as the memory tier holds it. A lookup compares the key it finds in the cache's entry
/// with the one asked for; a short key held inline is compared in the entry's own cache lines,
/// where a boxed one costs one more cache miss on every hit (measured: a tenth of a get's
/// CPU served from memory over the memcached protocol). Longer keys are boxed.
#[derive(Clone)]
enum MemKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Boxed(Box<[u8]>),
}

impl MemKey {
    fn new(key: &[u8]) -> MemKey {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            MemKey::Inline { len: key.len() as u8, bytes }
        } else {
            MemKey::Boxed(key.into())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            MemKey::Inline { len, bytes } => &bytes[..*len as usize],
            MemKey::Boxed(b) => b,
        }
    }
}

// Lookups are by `&[u8]`: `Borrow` requires that equality and hashing agree with the slice's.
impl std::borrow::Borrow<[u8]> for MemKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for MemKey {
    fn eq(&self, other: &MemKey) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for MemKey {}

impl std::hash::Hash for MemKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

const STRIPES: usize = 1024;

/// The memory tier.
pub(crate) struct Memory {
    backend: Backend,
    capacity: u64,
    on_put: bool,
    stripes: Box<[Mutex<()>]>,
    admission: Option<Admission>,
    pub hits: AtomicU64,
    pub promotions: AtomicU64,
    pub held: Arc<Held>,
}

impl Memory {
    /// The tier, or `None` when the capacity is 0.
    pub fn new(cfg: &MemoryConfig) -> Option<Memory> {
        if cfg.capacity == 0 {
            return None;
        }
        use foyer_memory::{CacheBuilder, FifoConfig, LfuConfig, LruConfig, S3FifoConfig, SieveConfig};
        let cap = cfg.capacity as usize;
        let held = Arc::new(Held::default());
        let leaving = Leaving(held.clone());
        let foyer = |e: foyer_memory::EvictionConfig| {
            let builder = CacheBuilder::new(cap).with_eviction_config(e).with_weighter(foyer_weight);
            Backend::Foyer(builder.with_event_listener(Arc::new(leaving.clone())).build())
        };
        let backend = match cfg.eviction {
            // The item estimate only sizes quick_cache's tables; assume 4 KiB values.
            Eviction::Clock => Backend::Clock(quick_cache::sync::Cache::with(
                (cap / 4096).max(64),
                cfg.capacity,
                ClockWeight,
                Default::default(),
                leaving.clone(),
            )),
            Eviction::Sieve => foyer(SieveConfig.into()),
            Eviction::S3Fifo => foyer(S3FifoConfig::default().into()),
            Eviction::Lfu => foyer(LfuConfig::default().into()),
            Eviction::Lru => foyer(LruConfig::default().into()),
            Eviction::Fifo => foyer(FifoConfig::default().into()),
        };
        let admission = (cfg.promote_after > 1).then(|| Admission::new(cfg.promote_after, cfg.promote_window));
        Some(Memory {
            backend,
            capacity: cfg.capacity,
            on_put: cfg.on_put,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            admission,
            hits: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            held,
        })
    }

    /// Whether PUT stores values here.
    pub fn on_put(&self) -> bool {
        self.on_put
    }

    pub fn get(&self, key: &[u8]) -> Option<Cached> {
        match &self.backend {
            Backend::Clock(c) => c.get(key),
            Backend::Foyer(c) => c.get(key).map(|e| e.value().clone()),
        }
    }

    /// Whether `key` is held, without counting as an access.
    pub fn contains(&self, key: &[u8]) -> bool {
        match &self.backend {
            Backend::Clock(c) => c.contains_key(key),
            Backend::Foyer(c) => c.contains(key),
        }
    }

    fn stripe(&self, hash: u64) -> &Mutex<()> {
        &self.stripes[(hash % STRIPES as u64) as usize]
    }

    /// Counts `reads` disk answers for `hash`; true when the value should be promoted now.
    pub fn admit(&self, hash: u64, now_ms: u64, reads: u32) -> bool {
        self.admission.as_ref().is_none_or(|a| a.count(hash, now_ms, reads))
    }

    /// Under the key's stripe lock: stores `offer` if `current()` holds, and otherwise drops
    /// the key, returning what it held. The store calls it after every write's change of a
    /// key's index entry and on expiry (with no offer), and to promote a value (see
    /// `Store::reconcile_memory`).
    pub fn reconcile(&self, hash: u64, key: &[u8], offer: Option<Cached>, current: impl FnOnce() -> bool) -> Settled {
        let _g = self.stripe(hash).lock();
        if let Some(value) = offer.filter(|_| current()) {
            self.held.add(&value, 1);
            match &self.backend {
                Backend::Clock(c) => {
                    // quick_cache says nothing of the value an insert replaces: taken off here.
                    if let Some((_, old)) = c.remove(key) {
                        self.held.add(&old, -1);
                    }
                    c.insert(MemKey::new(key), value)
                }
                Backend::Foyer(c) => {
                    c.insert(MemKey::new(key), value);
                }
            }
            return Settled::Stored;
        }
        Settled::Dropped(match &self.backend {
            Backend::Clock(c) => c.remove(key).map(|(_, v)| {
                self.held.add(&v, -1);
                v
            }),
            Backend::Foyer(c) => c.remove(key).map(|e| e.value().clone()),
        })
    }

    /// Drops `key`: the disk engine dropped it (the rule's `None` offer).
    pub fn forget(&self, hash: u64, key: &[u8]) {
        self.reconcile(hash, key, None, || false);
    }

    /// (bytes charged, entries, capacity, keys tracked by admission)
    pub fn usage(&self) -> (u64, u64, u64, u64) {
        let (bytes, entries) = match &self.backend {
            Backend::Clock(c) => (c.weight(), c.len() as u64),
            Backend::Foyer(c) => (c.usage() as u64, c.entries() as u64),
        };
        (bytes, entries, self.capacity, self.admission.as_ref().map_or(0, |a| a.tracked()))
    }
}

/// Keys whose disk reads admission remembers at once: the oldest is forgotten first when full.
/// At about 40 bytes each (map slot and queue entry), the full table is about 10 MiB.
pub const ADMISSION_KEYS: usize = 1 << 18;
const ADMISSION_SHARDS: usize = 64;

/// Exact per-key counts of recent disk reads (CacheFS's rule: promote on the Nth read within
/// the window; a longer pause starts the count again). Keys are the store's seeded 64-bit
/// hashes; two keys sharing one would only share a count.
struct Admission {
    after: u32,
    window_ms: u64,
    shards: Box<[Mutex<AdmitShard>]>,
}

#[derive(Default)]
struct AdmitShard {
    /// hash -> (first read of this window, reads in it)
    seen: HashMap<u64, (u64, u32)>,
    /// Insertion order, for forgetting the oldest; entries whose key was promoted or restarted
    /// its window since are skipped when they come up.
    order: VecDeque<(u64, u64)>,
}

impl Admission {
    fn new(after: u32, window: Duration) -> Admission {
        Admission {
            after,
            window_ms: window.as_millis() as u64,
            shards: (0..ADMISSION_SHARDS).map(|_| Mutex::new(AdmitShard::default())).collect(),
        }
    }

    fn count(&self, hash: u64, now: u64, reads: u32) -> bool {
        let per_shard = ADMISSION_KEYS / ADMISSION_SHARDS;
        let mut s = self.shards[(hash % ADMISSION_SHARDS as u64) as usize].lock();
        let s = &mut *s;
        if let Some(e) = s.seen.get_mut(&hash) {
            if now.saturating_sub(e.0) <= self.window_ms {
                e.1 = e.1.saturating_add(reads);
                if e.1 >= self.after {
                    s.seen.remove(&hash);
                    return true;
                }
                return false;
            }
            // The window passed: these reads are the first of a new one.
            *e = (now, reads);
        } else {
            s.seen.insert(hash, (now, reads));
        }
        if reads >= self.after {
            s.seen.remove(&hash);
            return true;
        }
        if s.order.len() >= per_shard {
            if let Some((old, since)) = s.order.pop_front() {
                if s.seen.get(&old).is_some_and(|e| e.0 == since) {
                    s.seen.remove(&old);
                }
            }
        }
        s.order.push_back((hash, now));
        false
    }

    fn tracked(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().seen.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_counts_within_the_window() {
        let a = Admission::new(3, Duration::from_millis(100));
        assert!(!a.count(1, 1000, 1));
        assert!(!a.count(1, 1050, 1));
        assert!(a.count(1, 1100, 1), "third read within 100 ms promotes");
        // Promotion forgets the key: the count starts over.
        assert!(!a.count(1, 1101, 1));
        // A pause longer than the window starts a new count.
        assert!(!a.count(2, 2000, 1));
        assert!(!a.count(2, 2050, 1));
        assert!(!a.count(2, 2300, 1));
        assert!(!a.count(2, 2310, 1));
        assert!(a.count(2, 2320, 1));
        // Several reads at once (a shared disk read) count as several.
        assert!(a.count(3, 3000, 3));
        assert!(!a.count(4, 3000, 2));
        assert!(a.count(4, 3001, 1));
    }

    #[test]
    fn admission_forgets_the_oldest_when_full() {
        let a = Admission::new(2, Duration::from_secs(60));
        let per_shard = (ADMISSION_KEYS / ADMISSION_SHARDS) as u64;
        // Keys 0, 64, 128, ... all land in shard 0.
        for i in 0..=per_shard {
            assert!(!a.count(i * ADMISSION_SHARDS as u64, 5, 1));
        }
        assert!(a.tracked() <= per_shard);
        assert!(!a.count(0, 6, 1), "the oldest key was forgotten, so this is its first read again");
        assert!(a.count(per_shard * ADMISSION_SHARDS as u64, 6, 1), "the newest key was remembered");
    }

    #[test]
    fn keys_inline_and_boxed_look_up_alike() {
        use std::hash::BuildHasher;
        let h = std::collections::hash_map::RandomState::new();
        for len in [0, 1, INLINE_KEY - 1, INLINE_KEY, INLINE_KEY + 1, 250] {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let k = MemKey::new(&key);
            assert_eq!(matches!(k, MemKey::Inline { .. }), len <= INLINE_KEY);
            assert_eq!(k.as_slice(), &key[..]);
            assert_eq!(h.hash_one(&k), h.hash_one(&key[..]), "hashes as the slice does");
        }
        assert_eq!(std::mem::size_of::<MemKey>(), 48);
        let c = Cached {
            data: Bytes::from_static(b"v"),
            coded: None,
            position: Position { volume: 0, offset: 0, size: 1 },
            stored_ms: 1,
            expiry_ms: 0,
            crc: 0,
            content_type: None,
            attrs: None,
            flags: 0,
            stale: false,
        };
        let long = [7u8; 200];
        for (eviction, _) in Eviction::ALL {
            let m = Memory::new(&MemoryConfig { capacity: 1 << 20, eviction, ..Default::default() }).unwrap();
            for key in [&b"short"[..], &long[..]] {
                assert!(matches!(m.reconcile(1, key, Some(c.clone()), || true), Settled::Stored));
                assert_eq!(m.get(key).map(|c| c.data), Some(Bytes::from_static(b"v")));
                assert!(m.contains(key));
            }
            assert!(m.get(&long[..199]).is_none());
            m.forget(1, b"short");
            assert!(!m.contains(b"short"));
        }
    }

    #[test]
    fn eviction_names_round_trip() {
        for (e, n) in Eviction::ALL {
            assert_eq!(n.parse::<Eviction>(), Ok(e));
            assert_eq!(e.name(), n);
        }
        assert!("arc".parse::<Eviction>().unwrap_err().contains("clock"));
    }
}
