//! What a store reports about itself: counters and gauges, per-directory figures, and what
//! recovery found and is doing.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

/// Counters and gauges of a store.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Live keys in the index (entries of evicted volumes are counted until swept).
    pub keys: u64,
    /// Bytes of volume files on disk.
    pub bytes_used: u64,
    /// volume-count x volume-size.
    pub capacity_bytes: u64,
    /// Volume files that exist.
    pub volumes: u64,
    /// Slot being written.
    pub active_volume: u64,
    /// Configured volume size (after clamping).
    pub volume_size: u64,
    /// Configured volume count (after clamping).
    pub volume_count: u64,
    /// Successful puts.
    pub puts: u64,
    /// Successful deletes.
    pub deletes: u64,
    /// Gets that found a value.
    pub hits: u64,
    /// Gets that found nothing.
    pub misses: u64,
    /// Gets answered by the memory tier.
    pub memory_hits: u64,
    /// Record reads from volume files made for gets.
    pub disk_reads: u64,
    /// Gets that shared another get's disk read instead of reading.
    pub coalesced_reads: u64,
    /// Values moved into the memory tier after a disk read.
    pub promotions: u64,
    /// Memory tier capacity in bytes (0 = off).
    pub memory_capacity: u64,
    /// Bytes the memory tier holds (values, keys and per-entry overhead).
    pub memory_bytes: u64,
    /// The values the memory tier holds: their bytes as sent, and as held (a coded value is
    /// held coded), without keys and overheads.
    pub memory_logical_bytes: u64,
    /// (See `memory_logical_bytes`.)
    pub memory_value_bytes: u64,
    /// Entries in the memory tier.
    pub memory_entries: u64,
    /// Keys whose disk reads admission is counting.
    pub admission_tracked: u64,
    /// Entries of volumes about to be overwritten that qualified for reinsertion.
    pub reinsert_candidates: u64,
    /// Qualifying entries copied forward.
    pub reinserted: u64,
    /// Bytes of records copied forward.
    pub reinserted_bytes: u64,
    /// Qualifying entries left out because the step's byte budget was spent.
    pub reinsert_over_budget: u64,
    /// Qualifying entries not copied because they changed or vanished meanwhile.
    pub reinsert_skipped: u64,
    /// Qualifying entries not copied because the memory tier holds their key.
    pub reinsert_in_memory: u64,
    /// Reads whose record failed its checksum (answered as misses).
    pub corrupt_reads: u64,
    /// Disk reads that found another key's record where the index pointed: two keys the index
    /// cannot tell apart (see docs/FORMAT.md, "In-memory index entry"). Answered as misses.
    pub collision_reads: u64,
    /// Keys whose index entry another key took (a write of a key the index could not tell
    /// from it), or that the index gave up when a table grew: misses from then on.
    pub false_evictions: u64,
    /// Bytes the index's tables hold.
    pub index_bytes: u64,
    /// Times the ring moved to the next slot (sealing the volume it left).
    pub rotations: u64,
    /// Volumes whose data the ring overwrote (a slot holding records started afresh).
    pub volumes_evicted: u64,
    /// Index entries removed because the ring reused their volume.
    pub evicted_entries: u64,
    /// Hint files written.
    pub hints_written: u64,
    /// Records whose write failed (nothing of them is indexed).
    pub write_failures: u64,
    /// fdatasync calls that failed (with `--fsync always`, their writes were undone).
    pub sync_failures: u64,
    /// Reads that failed with an I/O error (answered as unavailable, not as a miss).
    pub read_failures: u64,
    /// Bytes of dead large values' chunks given back to the file system (holes punched).
    pub punched_bytes: u64,
    /// Writes (puts and touches) of keys `StoreConfig::expiry_cap` applies to.
    pub capped_writes: u64,
    /// Writes of content-addressed keys refused because the value did not hash to its key
    /// (`StoreConfig::verify_cas`).
    pub cas_refused: u64,
    /// Flushes for `StoreConfig::max_downtime`: at open, or after a stall while open.
    pub downtime_flushes: u64,
    /// Values stored coded (`StoreConfig::compression`).
    pub coded_puts: u64,
    /// Bytes those values, and the coded chunks of large values, were sent with.
    pub coded_logical_bytes: u64,
    /// Bytes they were stored in.
    pub coded_stored_bytes: u64,
    /// Values stored as sent although compression is on: the probe took them for compressed
    /// or random data, so coding was not tried.
    pub raw_probed: u64,
    /// Values stored as sent because coding them saved less than an eighth.
    pub raw_no_gain: u64,
    /// Coded records whose checksum held but whose bytes did not decode to the value (also
    /// in `corrupt_reads`): answered as misses.
    pub decode_failures: u64,
    /// Bytes of disk the volume files occupy (less than `bytes_used` where holes were punched).
    pub allocated_bytes: u64,
    /// What the last recovery found.
    pub recovery: RecoveryReport,
    /// Opened without a data directory that held volumes (or with volumes withheld).
    pub degraded: bool,
    /// Each data directory, in the manifest's order.
    pub dirs: Vec<DirStats>,
    /// The zstd dictionaries (`Compression::dictionary`).
    pub dictionaries: DictionaryStats,
    /// What the ring's volumes hold, by how values are stored.
    pub held: HeldStats,
    /// The ring's slots, in order (the write head is `active_volume`).
    pub slots: Vec<SlotStats>,
}

/// One slot of the ring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Times a volume was started in it (0: never).
    pub generation: u32,
    /// The data directory of its volume (by `--data-dir` order), if it has one.
    pub dir: Option<usize>,
    /// Bytes in its volume (header and records).
    pub bytes: u64,
    /// When its volume was started (ms since the Unix epoch; 0: never), from its sequence.
    pub started_ms: u64,
}

/// The values in the ring's volumes written since open (a replaced or deleted value too,
/// until the ring reuses its volume), by how they are stored.
#[derive(Debug, Clone, Default)]
pub struct HeldStats {
    /// Stored as sent.
    pub raw: Tally,
    /// Coded with zstd alone.
    pub zstd: Tally,
    /// Coded with zstd and a dictionary.
    pub zstd_dictionary: Tally,
    /// Coded with LZ4.
    pub lz4: Tally,
    /// Volumes written before open that hold records: not accounted (hint files say nothing
    /// of codings) until the ring reuses them.
    pub volumes_unaccounted: u64,
    /// The bytes of their records.
    pub bytes_unaccounted: u64,
}

/// Values (a large value's chunks each count as one), their bytes as sent and as stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many.
    pub values: u64,
    /// Their bytes as sent.
    pub logical_bytes: u64,
    /// The bytes they take in their records.
    pub stored_bytes: u64,
}

/// The store's dictionaries and their training.
#[derive(Debug, Clone, Default)]
pub struct DictionaryStats {
    /// Dictionaries trained since open.
    pub trained: u64,
    /// Trainings started again because a prefix's values compressed worse than at first.
    pub retrains: u64,
    /// Trainings that produced no dictionary.
    pub training_failures: u64,
    /// Retired dictionaries removed since open, once no volume needed them.
    pub removed: u64,
    /// Dictionary files found damaged at open (each copy).
    pub damaged_files: u64,
    /// Each dictionary on disk.
    pub each: Vec<DictionaryInfo>,
}

/// One dictionary.
#[derive(Debug, Clone, Default)]
pub struct DictionaryInfo {
    /// The id its records name it by.
    pub id: u32,
    /// The key prefix it codes (lossily as text).
    pub key_prefix: String,
    /// Its length, in bytes.
    pub bytes: u64,
    /// When it was trained, in ms since the Unix epoch.
    pub created_ms: u64,
    /// Whether a newer dictionary codes its prefix now (it stays while records need it).
    pub retired: bool,
    /// Values coded with it since open.
    pub values: u64,
    /// Their bytes as sent.
    pub logical_bytes: u64,
    /// Their bytes as stored.
    pub stored_bytes: u64,
}

/// The state of one data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirState {
    /// Serving and taking new volumes.
    #[default]
    Ok,
    /// A write, sync or volume creation failed in it: no new volumes go there.
    Failed,
    /// It was not there at start; its volumes are unavailable.
    Missing,
}

impl DirState {
    /// `ok`, `failed` or `missing`.
    pub fn as_str(self) -> &'static str {
        match self {
            DirState::Ok => "ok",
            DirState::Failed => "failed",
            DirState::Missing => "missing",
        }
    }
}

/// Figures of one data directory.
#[derive(Debug, Clone, Default)]
pub struct DirStats {
    /// Where it is (for a missing one, where it was last seen).
    pub path: PathBuf,
    /// Its id (hex), as in its `DIR-ID` file.
    pub id: String,
    /// Whether it serves.
    pub state: DirState,
    /// Volumes it holds.
    pub volumes: u64,
    /// Bytes of those volumes.
    pub bytes_used: u64,
    /// Free bytes on its filesystem (0 when unknown).
    pub free_bytes: u64,
}

/// The engine's counters, bumped where things happen and read by `Store::stats`.
#[derive(Default)]
pub(crate) struct Counters {
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub disk_reads: AtomicU64,
    pub coalesced_reads: AtomicU64,
    pub reinsert_candidates: AtomicU64,
    pub reinserted: AtomicU64,
    pub reinserted_bytes: AtomicU64,
    pub reinsert_over_budget: AtomicU64,
    pub reinsert_skipped: AtomicU64,
    pub reinsert_in_memory: AtomicU64,
    pub corrupt_reads: AtomicU64,
    pub collision_reads: AtomicU64,
    pub false_evictions: AtomicU64,
    pub rotations: AtomicU64,
    pub volumes_evicted: AtomicU64,
    pub evicted_entries: AtomicU64,
    pub hints_written: AtomicU64,
    pub write_failures: AtomicU64,
    pub sync_failures: AtomicU64,
    pub read_failures: AtomicU64,
    pub punched_bytes: AtomicU64,
    pub capped_writes: AtomicU64,
    pub cas_refused: AtomicU64,
    pub downtime_flushes: AtomicU64,
    pub coded_puts: AtomicU64,
    pub coded_logical_bytes: AtomicU64,
    pub coded_stored_bytes: AtomicU64,
    pub raw_probed: AtomicU64,
    pub raw_no_gain: AtomicU64,
    pub decode_failures: AtomicU64,
}

/// Figures from a recovery, reported in stats.
#[derive(Debug, Default, Clone, Copy)]
pub struct RecoveryReport {
    /// Volumes replayed.
    pub volumes: u64,
    /// Volumes discarded: damaged headers, outside the ring or larger than a volume, and every
    /// volume older than one of those.
    pub discarded: u64,
    /// Volumes in data directories that are missing (their keys are misses meanwhile).
    pub unavailable: u64,
    /// Volumes left out of the index, but kept, because a data directory is missing, which may
    /// hold newer values or deletes of their keys (and the newest manifest).
    pub withheld: u64,
    /// Sealed volumes loaded from hint files.
    pub hint_loads: u64,
    /// Active volumes loaded from the checkpoint a graceful stop wrote (then 0 scans).
    pub checkpoint_loads: u64,
    /// Volumes scanned record by record from their start.
    pub scans: u64,
    /// Bytes scanned after a hint or checkpoint: records appended after a graceful restart.
    pub tail_bytes_scanned: u64,
    /// Records replayed (from scans and hints).
    pub records: u64,
    /// Damaged records or stretches skipped.
    pub skipped: u64,
    /// Bytes cut from torn tails.
    pub truncated_bytes: u64,
    /// Wall time of the recovery in milliseconds.
    pub millis: u64,
    /// How long the store was down before this open, in milliseconds: from the last alive
    /// stamp its directories hold (renewed about every second while open) to the end of the
    /// recovery. `None` when unknown: no directory had a sound stamp (a new store, or one
    /// last open before stamps existed), or the stamp is ahead of the clock.
    pub down_ms: Option<u64>,
    /// Whether the store opened empty: down longer than `StoreConfig::max_downtime`.
    pub started_empty: bool,
}

/// How far a recovery in progress has come, updated as it goes (every 65,536 records), so
/// that a server can report progress and an estimate of the time left while it opens.
#[derive(Debug, Default)]
pub struct RecoveryProgress {
    /// Volumes to replay.
    pub volumes_total: AtomicU64,
    /// Volumes replayed.
    pub volumes_done: AtomicU64,
    /// Bytes to read: hint files where they exist, volume files otherwise.
    pub bytes_total: AtomicU64,
    /// Of those, bytes read.
    pub bytes_done: AtomicU64,
    /// Records replayed so far.
    pub records: AtomicU64,
}
