//! How a store is configured: its directories and ring, durability, and the memory tier.

use std::path::PathBuf;
use std::time::Duration;

/// When writes are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Leave it to the OS.
    Never,
    /// fdatasync before acknowledging (group commit).
    Always,
    /// fdatasync in the background at this interval: bounds what a power loss can take.
    Every(Duration),
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Data directories (created if missing), one per disk: the ring of volumes spans them.
    /// Their order does not matter.
    pub dirs: Vec<PathBuf>,
    /// Refuse to open when a directory the store had is missing, instead of opening without
    /// it (degraded).
    pub strict_dirs: bool,
    /// Bytes per volume file.
    pub volume_size: u64,
    /// Volume slots in the ring.
    pub volume_count: u32,
    /// Largest value accepted, in bytes.
    pub max_value_size: u64,
    /// Values longer than this are stored as chunk records of this size behind a head record
    /// (see `format::large`); shorter ones as one record.
    pub chunk_size: u64,
    /// Durability policy.
    pub fsync: FsyncPolicy,
    /// The memory tier in front of the volumes.
    pub memory: MemoryConfig,
    /// Before the ring overwrites its oldest volume, entries of it read from disk at least
    /// this many times since written (at most 3) are copied forward; 0 = plain FIFO.
    pub reinsert_min_hits: u8,
    /// Most bytes reinsertion copies per ring step, as a share of a volume.
    pub reinsert_share: f64,
    /// Writes of the keys it selects live at most this long, whatever expiry they ask for
    /// (a cluster node caps the keys it does not own); counted in `Stats::capped_writes`.
    pub expiry_cap: Option<ExpiryCap>,
    /// A store down longer than this, by its alive stamp (or for a time it cannot know), opens
    /// as if `flush_all` had been sent when it went down: before it is stamped alive again, so
    /// that a failure in between leaves the old stamp. While open, a process that did not run
    /// for longer than this (plus two renewals: paused, starved) flushes the same way. Counted
    /// in `Stats::downtime_flushes`. `None`: never (a restart keeps everything).
    pub max_downtime: Option<Duration>,
    /// Content-addressed keys (a last segment of 64 hex digits after a segment `cas`, as
    /// Bazel's HTTP cache writes them) take only a value whose SHA-256 they name; any other
    /// write of one fails with `ErrorKind::Invalid` and is counted in `Stats::cas_refused`.
    pub verify_cas: bool,
    /// Whether and how values are compressed on their way to disk and memory.
    pub compression: Compression,
}

/// How values are coded when stored (`format::codec`). Whatever it says, a store reads every
/// record it holds, coded under any setting or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compression {
    /// The codec new values are tried with; `None` stores every value as sent.
    pub codec: Option<crate::types::Codec>,
    /// The codec's level (zstd's; LZ4 has none).
    pub level: i32,
    /// Values shorter than this are stored as sent: too short to gain.
    pub min_size: u64,
    /// Dictionaries trained per key prefix (zstd only); `None`: values are coded alone.
    pub dictionary: Option<Dictionaries>,
}

impl Default for Compression {
    fn default() -> Self {
        Compression { codec: None, level: 0, min_size: DEFAULT_COMPRESSION_MIN_SIZE, dictionary: None }
    }
}

/// How zstd dictionaries are trained, one per key prefix, from the prefix's small values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dictionaries {
    /// A key's prefix is its first `depth` segments (split at `/`; keys with fewer share the
    /// empty prefix, and its dictionary).
    pub depth: u32,
    /// A prefix's dictionary is trained once this many bytes of its values are sampled.
    pub sample_bytes: u64,
    /// Values longer than this are coded without a dictionary (where one gains little) and
    /// are not sampled.
    pub max_value: u64,
}

impl Default for Dictionaries {
    fn default() -> Self {
        Dictionaries { depth: 1, sample_bytes: 512 << 10, max_value: 32 << 10 }
    }
}

/// [`Compression::min_size`] unless set: below a few hundred bytes a value's coding (and its
/// metadata entry) rarely saves an eighth without a dictionary.
pub const DEFAULT_COMPRESSION_MIN_SIZE: u64 = 256;

/// A bound on the life of the values of some keys: [`StoreConfig::expiry_cap`].
#[derive(Clone)]
pub struct ExpiryCap {
    /// The longest life a capped write gets.
    pub most: Duration,
    /// Whether the writes of a key are capped. Called on every put and touch: keep it cheap.
    pub applies: KeyTest,
}

/// A test of keys, shared: [`ExpiryCap::applies`].
pub type KeyTest = std::sync::Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

impl std::fmt::Debug for ExpiryCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpiryCap").field("most", &self.most).finish_non_exhaustive()
    }
}

impl ExpiryCap {
    /// The expiry time (ms, 0 = never) a write of `key` at clock time `now` gets when it asks
    /// for `expiry_ms`, and whether the cap applies to the key (whether or not it shortened
    /// the expiry).
    pub fn apply(&self, key: &[u8], expiry_ms: u64, now: u64) -> (u64, bool) {
        if !(self.applies)(key) {
            return (expiry_ms, false);
        }
        let most = now.max(1).saturating_add(self.most.as_millis() as u64);
        (if expiry_ms == 0 { most } else { expiry_ms.min(most) }, true)
    }
}

impl StoreConfig {
    /// A configuration with the server's defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            dirs: vec![dir.into()],
            strict_dirs: false,
            volume_size: 1 << 30,
            volume_count: 16,
            max_value_size: 1 << 20,
            chunk_size: 1 << 20,
            fsync: FsyncPolicy::Every(Duration::from_secs(1)),
            memory: MemoryConfig::default(),
            reinsert_min_hits: 1,
            reinsert_share: 0.2,
            expiry_cap: None,
            max_downtime: None,
            verify_cas: false,
            compression: Compression::default(),
        }
    }
}

/// Smallest volume accepted; smaller settings are raised to it (with a warning).
pub const MIN_VOLUME_SIZE: u64 = 4096;

/// Eviction policy of the memory tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// quick_cache's CLOCK-Pro-like policy (the default).
    Clock,
    /// foyer's SIEVE.
    Sieve,
    /// foyer's S3-FIFO.
    S3Fifo,
    /// foyer's w-TinyLFU.
    Lfu,
    /// foyer's LRU.
    Lru,
    /// foyer's FIFO.
    Fifo,
}

impl Eviction {
    /// Every policy, with the name the command line uses.
    pub const ALL: [(Eviction, &'static str); 6] = [
        (Eviction::Clock, "clock"),
        (Eviction::Sieve, "sieve"),
        (Eviction::S3Fifo, "s3fifo"),
        (Eviction::Lfu, "lfu"),
        (Eviction::Lru, "lru"),
        (Eviction::Fifo, "fifo"),
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(e, _)| *e == self).map_or("?", |(_, n)| n)
    }
}

impl std::str::FromStr for Eviction {
    type Err = String;
    fn from_str(s: &str) -> Result<Eviction, String> {
        let t = s.trim().to_ascii_lowercase();
        Self::ALL.iter().find(|(_, n)| *n == t).map(|(e, _)| *e).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|(_, n)| *n).collect();
            format!("unknown eviction policy {s:?}: use one of {}", names.join(", "))
        })
    }
}

/// How the memory tier behaves.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Bytes of values (and keys, and a per-entry overhead) held; 0 turns the tier off.
    pub capacity: u64,
    /// Eviction policy.
    pub eviction: Eviction,
    /// A value read from disk enters memory on its Nth disk read within `promote_window`;
    /// 0 and 1 both mean on the first.
    pub promote_after: u32,
    /// The window the reads are counted in.
    pub promote_window: Duration,
    /// Whether PUT also stores the value in memory (otherwise it only invalidates).
    pub on_put: bool,
    /// The largest value memory takes, in bytes; 0 = the chunk size. Never more than the
    /// chunk size: a longer value is a large value, read in pieces, never held whole.
    pub max_value: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            capacity: 256 << 20,
            eviction: Eviction::Clock,
            promote_after: 2,
            promote_window: Duration::from_secs(60),
            on_put: false,
            max_value: 0,
        }
    }
}
