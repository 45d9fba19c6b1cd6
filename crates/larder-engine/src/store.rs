//! The public `Store`: put, get and delete over the ring of volumes and the index.
//!
//! Concurrency: one writer at a time appends under the writer lock (records, tombstones and
//! ring rotation happen in log order, so the index always agrees with what replay would
//! build). Readers never take that lock: they look up the index (a shard lock held for a few
//! probes) and read with a positional read on a file opened once. A record becomes visible in
//! the index only after its write returned. A reader that races with the ring reusing a slot
//! reads either the old bytes or bytes of the new generation, which fail the generation check.
//!
//! Durability: `FsyncPolicy::Always` makes each put and delete wait for an fdatasync that
//! covers it; concurrent writers share one fdatasync (group commit: the first waiter syncs
//! on behalf of everyone who appended before it started).

use crate::dirs::{self, DataDir};
use crate::flight::{Flights, Found, Join};
use crate::index::{Index, Loc, MAX_HITS, MAX_SLOTS, MAX_VOLUME_SIZE, TAG_MASK};
use crate::memory::{Cached, Memory, MemoryConfig, Settled};
use crate::meta::{self, Meta};
use crate::ops::{Part, Precondition, PutOptions, Version};
use crate::record::{self, Header, FLAG_TOMBSTONE, HEADER_LEN, MAX_KEY_LEN};
use crate::recovery::{self, RecoveryProgress, RecoveryReport};
use crate::volume::{hint_path, volume_path, VolumeHeader, VOLUME_HEADER_LEN};
use crate::{hint, io, manifest::Manifest, Error, ErrorKind, Result};
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// Durability policy.
    pub fsync: FsyncPolicy,
    /// The memory tier in front of the volumes.
    pub memory: MemoryConfig,
    /// Before the ring overwrites its oldest volume, entries of it read from disk at least
    /// this many times since written (at most 3) are copied forward; 0 = plain FIFO.
    pub reinsert_min_hits: u8,
    /// Most bytes reinsertion copies per ring step, as a share of a volume.
    pub reinsert_share: f64,
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
            fsync: FsyncPolicy::Every(Duration::from_secs(1)),
            memory: MemoryConfig::default(),
            reinsert_min_hits: 1,
            reinsert_share: 0.2,
        }
    }
}

/// Which tier answered a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier.
    Memory,
    /// A volume file.
    Disk,
}

/// Smallest volume accepted; smaller settings are raised to it (with a warning).
pub const MIN_VOLUME_SIZE: u64 = 4096;

/// Where a record lives on disk, as reported in `X-Position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Volume slot (0-based).
    pub volume: u32,
    /// Byte offset of the record's start in the volume file.
    pub offset: u64,
    /// Length of the record on disk in bytes (header, key, metadata and value).
    pub size: u64,
}

/// The exact record a value was read from: its index location and the slot's whole
/// generation (the location keeps only 7 bits of it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub loc: Loc,
    pub generation: u32,
}

/// What a put stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Where the record was written.
    pub position: Position,
    /// The new value's version.
    pub version: Version,
}

/// A value read from the store.
#[derive(Debug, Clone)]
pub struct Value {
    /// The bytes asked for: the whole value, a range of it (starting at `start`), or none.
    pub data: Bytes,
    /// Offset of `data` in the value.
    pub start: u64,
    /// Length of the whole value in bytes.
    pub len: u64,
    /// CRC32C of the whole value.
    pub crc: u32,
    /// The content type stored with the value, if any.
    pub content_type: Option<Bytes>,
    /// Where its record lives.
    pub position: Position,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// When it expires, ms since the Unix epoch; 0 = never.
    pub expiry_ms: u64,
    /// Which tier answered. For a memory hit, `position` is where the value was read from
    /// when it was promoted (reinsertion may have moved the record since).
    pub tier: Tier,
}

impl Value {
    /// The stored value's version, a strong validator.
    pub fn version(&self) -> Version {
        Version { len: self.len, crc: self.crc, stored_ms: self.stored_ms }
    }

    fn from_cached(c: Cached) -> Value {
        let Cached { data, position, stored_ms, expiry_ms, crc, content_type } = c;
        let (start, len) = (0, data.len() as u64);
        Value { data, start, len, crc, content_type, position, stored_ms, expiry_ms, tier: Tier::Memory }
    }

    /// Narrows `data`, the whole value, to `part`.
    fn narrow(mut self, part: Part) -> Value {
        let (start, end) = match part {
            Part::Whole => (0, self.len),
            Part::Nothing => (0, 0),
            Part::Range(r) => r.resolve(self.len).unwrap_or((0, 0)),
        };
        self.data = self.data.slice(start as usize..end as usize);
        self.start = start;
        self
    }

    /// What the memory tier keeps of a whole value: exact-size copies, so that it never holds
    /// on to a larger read buffer.
    fn to_cached(&self) -> Cached {
        Cached {
            data: Bytes::copy_from_slice(&self.data),
            position: self.position,
            stored_ms: self.stored_ms,
            expiry_ms: self.expiry_ms,
            crc: self.crc,
            content_type: self.content_type.as_deref().map(Bytes::copy_from_slice),
        }
    }
}

/// Encoded hint entries buffered before they are written out.
const HINT_CHUNK: usize = 1 << 20;

/// Bytes read first for a part of a large record: header, longest key and metadata fit.
const PREFIX_READ: usize = 8192;
const _: () = assert!(HEADER_LEN + MAX_KEY_LEN + record::MAX_META_LEN <= PREFIX_READ);

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
    /// What the last recovery found.
    pub recovery: RecoveryReport,
    /// Opened without a data directory that held volumes (or with volumes withheld).
    pub degraded: bool,
    /// Each data directory, in the manifest's order.
    pub dirs: Vec<DirStats>,
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

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    deletes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    disk_reads: AtomicU64,
    coalesced_reads: AtomicU64,
    reinsert_candidates: AtomicU64,
    reinserted: AtomicU64,
    reinserted_bytes: AtomicU64,
    reinsert_over_budget: AtomicU64,
    reinsert_skipped: AtomicU64,
    reinsert_in_memory: AtomicU64,
    corrupt_reads: AtomicU64,
    rotations: AtomicU64,
    volumes_evicted: AtomicU64,
    evicted_entries: AtomicU64,
    hints_written: AtomicU64,
    write_failures: AtomicU64,
    sync_failures: AtomicU64,
    read_failures: AtomicU64,
}

pub(crate) struct SlotState {
    /// The slot's volume file in each data directory it has been placed in (a file stays
    /// open, emptied, after the slot moves on, so that moving back needs no new handle).
    pub files: Box<[OnceLock<File>]>,
    /// The directory holding the current generation ([`NO_DIR`] = none yet).
    pub dir: AtomicU32,
    /// Current generation; 0 = the slot holds no data yet.
    pub generation: AtomicU32,
    /// Checksum salt of the current generation's records.
    pub salt: AtomicU32,
    pub sequence: AtomicU64,
    /// Bytes in the file (header and records).
    pub len: AtomicU64,
}

/// `SlotState::dir` of a slot that holds no volume.
pub(crate) const NO_DIR: u32 = u32::MAX;

impl SlotState {
    /// The file of the current generation, if the slot has one.
    pub fn file(&self) -> Option<&File> {
        self.files.get(self.dir.load(Ordering::Acquire) as usize)?.get()
    }

    /// The directory of the current generation.
    pub fn dir(&self) -> Option<usize> {
        let d = self.dir.load(Ordering::Acquire);
        (d != NO_DIR).then_some(d as usize)
    }
}

struct Writer {
    active: usize,
    offset: u64,
    next_sequence: u64,
    /// Records appended since open; group commit compares against it.
    appended: u64,
    /// Sealed slots whose data has not been fdatasynced yet.
    unsynced: Vec<usize>,
    /// With `FsyncPolicy::Always`: the index changes of writes not yet durable, oldest first,
    /// to be undone if their sync fails.
    undo: Vec<Undo>,
    /// Volumes (slot, generation) holding records of puts that were undone after a failed
    /// sync. The page cache may still write them back, and recovery would then find them, so
    /// while one of these volumes lives a delete of an absent key writes a tombstone too.
    strays: Vec<(usize, u32)>,
    prefix: Vec<u8>,
    /// Store time of the last put or delete: each gets a later one (by a millisecond if the
    /// clock has not moved, or has stepped back), so no two writes share a version. Seeded
    /// at open with the newest store time recovery saw, so this holds across restarts too.
    last_stamp: u64,
    /// Set by `close`: no record is appended after the checkpoint is taken.
    closed: bool,
    /// Round-robin cursor of placement among equally used directories.
    cursor: usize,
}

impl Writer {
    /// Whether a volume may hold a record the index does not know of (see `strays`);
    /// forgets the volumes the ring has reused since.
    fn has_strays(&mut self, slots: &[SlotState]) -> bool {
        self.strays.retain(|&(slot, generation)| slots[slot].generation.load(Ordering::Relaxed) == generation);
        !self.strays.is_empty()
    }

    /// A store time for a write made now, later than every earlier one.
    fn stamp(&mut self) -> u64 {
        self.last_stamp = now_ms().max(self.last_stamp + 1);
        self.last_stamp
    }
}

/// An index change to undo: the entry for `hash` went from `before` to `after`.
struct Undo {
    hash: u64,
    key: Box<[u8]>,
    before: Option<Loc>,
    after: Option<Loc>,
}

/// Whether two optional index entries name the same record (read counts aside).
fn same(a: Option<Loc>, b: Option<Loc>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.same_place(b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

#[derive(Default)]
struct DurableState {
    synced: u64,
    /// The highest append count a sync has been attempted for.
    attempted: u64,
    /// The append ranges `(after, through]` whose sync failed (the most recent 1024 runs).
    failed: std::collections::VecDeque<(u64, u64)>,
    syncing: bool,
}

enum Job {
    Hint {
        slot: usize,
        generation: u32,
        sequence: u64,
        len: u64,
        /// The append count when the volume was sealed (`None` for a volume recovered at
        /// open): its records must be durable before the hint names them.
        through: Option<u64>,
    },
    Reinsert {
        slot: usize,
        generation: u32,
    },
    /// Answers once every job queued before it has run.
    Barrier(mpsc::Sender<()>),
    Sweep,
    /// Saves the manifest (with one directory, its updates are not waited for).
    Manifest,
}

pub(crate) struct Shared {
    pub cfg: StoreConfig,
    pub seed: u64,
    /// The data directories, indexed as in the manifest's table.
    pub dirs: Vec<DataDir>,
    /// Opened without a directory that held volumes, or with volumes left out of the index:
    /// keys may have older records there, so deletes always write a tombstone.
    pub degraded: bool,
    pub manifest: Mutex<Manifest>,
    pub index: Index,
    memory: Option<Memory>,
    flights: Flights,
    pub slots: Box<[SlotState]>,
    /// The slot being written (the writer's `active`), for stats without the writer lock.
    active: AtomicU32,
    writer: Mutex<Writer>,
    durable: Mutex<DurableState>,
    durable_cv: Condvar,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    counters: Counters,
    recovery: RecoveryReport,
}

/// The sequence of a volume started now: at least `next`, and above that of every volume
/// started earlier in wall-clock time (milliseconds × 1024), so that the volumes written while
/// a data directory was missing sort after everything it holds when it returns, even though
/// this run could not know its highest sequence.
fn sequence_after(next: u64) -> u64 {
    next.max(now_ms() << 10)
}

/// Milliseconds since the Unix epoch (in builds with the fault layer, set off by
/// [`crate::faults::skew_clock`]).
pub fn now_ms() -> u64 {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    #[cfg(feature = "faults")]
    let ms = ms.saturating_add_signed(crate::faults::clock_skew());
    ms
}

const ZEROS: [u8; record::ALIGN as usize] = [0; record::ALIGN as usize];

impl Shared {
    pub fn hash(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed)
    }

    pub fn loc(&self, slot: usize, generation: u32, offset: u64, record_len: u64) -> Loc {
        Loc {
            slot: slot as u16,
            tag: (generation & TAG_MASK) as u8,
            offset,
            class: record::size_class(record_len),
            hits: 0,
        }
    }

    /// The generation `loc` must be read with, or `None` if its slot has moved on.
    fn live_generation(&self, loc: Loc) -> Option<u32> {
        let g = self.slots[loc.slot as usize].generation.load(Ordering::Acquire);
        (g != 0 && (g & TAG_MASK) as u8 == loc.tag).then_some(g)
    }

    /// Whether the record at `loc` is of the current generation and has key `key` (header and
    /// key verified, value not).
    fn key_at(&self, loc: Loc, key: &[u8]) -> bool {
        matches!(self.header_at(loc, key), Ok(Some(_)))
    }

    /// The header of the record at `loc` if it is of the current generation and has key `key`.
    /// A read that fails is an error, not an absence.
    fn header_at(&self, loc: Loc, key: &[u8]) -> Result<Option<Header>> {
        let (Some(g), Some(file)) = (self.live_generation(loc), self.slots[loc.slot as usize].file()) else {
            return Ok(None);
        };
        let salt = self.slots[loc.slot as usize].salt.load(Ordering::Acquire);
        let want = (record::size_class_bytes(loc.class) as usize).min(HEADER_LEN + key.len());
        let mut buf = vec![0u8; want];
        let n = self.read(&self.slots[loc.slot as usize], file, &mut buf, loc.offset, false)?.unwrap_or(0);
        let Ok(h) = record::decode_header(&buf[..n], salt) else { return Ok(None) };
        Ok((h.generation == g && &buf[HEADER_LEN..HEADER_LEN + h.key_len as usize] == key).then_some(h))
    }

    /// Drops `key` from the index if the entry for its hash really is that key.
    pub fn drop_if_key(&self, hash: u64, key: &[u8]) {
        if let Some(loc) = self.index.get(hash) {
            if self.key_at(loc, key) {
                self.index.remove_if_eq(hash, loc);
            }
        }
    }

    fn send(&self, job: Job) {
        if let Some(tx) = self.jobs.lock().as_ref() {
            let _ = tx.send(job);
        }
    }

    /// Starts a new generation of `slot`: its old records become unreachable at once, its old
    /// file is emptied, and the new volume is placed on the least utilized usable directory.
    ///
    /// `created_ms` is the time written into its header: no earlier than any store time
    /// stamped so far, so that recovery, which takes the newest it finds, never seeds the
    /// writer's stamps below a write already made.
    fn start_volume(&self, slot: usize, sequence: u64, created_ms: u64, cursor: &mut usize) -> Result<()> {
        let s = &self.slots[slot];
        let generation = s.generation.load(Ordering::Relaxed).wrapping_add(1).max(1);
        if s.len.load(Ordering::Relaxed) > VOLUME_HEADER_LEN {
            self.counters.volumes_evicted.fetch_add(1, Ordering::Relaxed);
        }
        let mut salt = [0u8; 4];
        getrandom::fill(&mut salt).map_err(|e| Error::new(ErrorKind::Io, format!("no randomness for a salt: {e}")))?;
        let salt = u32::from_le_bytes(salt);
        // Readers holding entries of the old generation now fail the generation check; the
        // salt changes after it, so a reader that saw the old generation fails its checksum.
        s.generation.store(generation, Ordering::Release);
        s.salt.store(salt, Ordering::Release);
        // Free the old volume's space first, so that placement sees it free. In a failed
        // directory this may not work: recovery then finds two files of the slot and keeps
        // the one with the higher sequence.
        if let (Some(d), Some(file)) = (s.dir(), s.file()) {
            let dir = &self.dirs[d];
            let reset = io::remove_if_exists(&hint_path(&dir.path, slot))
                .map_err(|e| Error::io("removing a hint file", e))
                .and_then(|()| io::set_len(file, 0).map_err(|e| Error::io("resetting a volume", e)));
            if let Err(e) = reset {
                dir.fail(&e);
                if !self.another_usable(d) {
                    return Err(e);
                }
            }
        }
        s.len.store(0, Ordering::Relaxed);
        let mut last_err = None;
        for _ in 0..self.dirs.len() {
            let Some(d) = self.place(cursor) else { break };
            match self.create_volume(slot, d, generation, sequence, salt, created_ms) {
                Ok(()) => {
                    s.sequence.store(sequence, Ordering::Relaxed);
                    s.len.store(VOLUME_HEADER_LEN, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    self.dirs[d].fail(&e);
                    let retry = self.another_usable(d);
                    last_err = Some(e);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| Error::new(ErrorKind::Io, "no data directory is usable")))
    }

    /// Whether a usable directory other than `d` exists (a write that failed in `d` can go
    /// there).
    fn another_usable(&self, d: usize) -> bool {
        self.dirs.iter().enumerate().any(|(i, x)| i != d && x.usable())
    }

    /// The directory for a new volume: the usable one with the lowest utilization (see
    /// [`dirs::choose`]); if none is usable, a failed one, which may have recovered.
    fn place(&self, cursor: &mut usize) -> Option<usize> {
        let mut used = vec![0u64; self.dirs.len()];
        for s in self.slots.iter() {
            if let Some(d) = s.dir() {
                used[d] += s.len.load(Ordering::Relaxed);
            }
        }
        let any_usable = self.dirs.iter().any(|d| d.usable());
        let mut free_by_dev: Vec<(u64, u64)> = Vec::new();
        let mut cands = Vec::new();
        for (i, d) in self.dirs.iter().enumerate() {
            if !d.present || (any_usable && !d.usable()) {
                continue;
            }
            // Directories on one filesystem share one reading, so that they compare exactly.
            let free = match io::free_space(&d.path) {
                Ok((dev, free)) => match free_by_dev.iter().find(|f| f.0 == dev) {
                    Some(f) => f.1,
                    None => {
                        free_by_dev.push((dev, free));
                        free
                    }
                },
                Err(e) => {
                    d.fail(&e);
                    if any_usable {
                        continue;
                    }
                    0
                }
            };
            cands.push(dirs::Candidate { dir: i, used: used[i], free });
        }
        let d = dirs::choose(&cands, *cursor)?;
        *cursor = d + 1;
        Some(d)
    }

    /// Records `slot`'s new volume in the manifest, then creates it in directory `d`.
    fn create_volume(
        &self,
        slot: usize,
        d: usize,
        generation: u32,
        sequence: u64,
        salt: u32,
        created_ms: u64,
    ) -> Result<()> {
        let s = &self.slots[slot];
        let dir = &self.dirs[d];
        {
            let mut m = self.manifest.lock();
            m.slots[slot] = crate::manifest::SlotEntry { dir: d as u16, sequence };
            m.active_slot = slot as u32;
            // With several directories the manifest must name the volume's directory before
            // the volume exists: if that directory goes missing, recovery knows what it held.
            if self.dirs.len() > 1 {
                dirs::save_manifest(&mut m, &self.dirs)?;
                if !dir.usable() && self.another_usable(d) {
                    return Err(Error::new(ErrorKind::Io, "the directory failed while the manifest was saved"));
                }
            } else {
                self.send(Job::Manifest);
            }
        }
        io::remove_if_exists(&hint_path(&dir.path, slot)).map_err(|e| Error::io("removing a hint file", e))?;
        let created = s.files[d].get().is_none();
        if created {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(volume_path(&dir.path, slot))
                .map_err(|e| Error::io("creating a volume", e))?;
            let _ = s.files[d].set(f);
        }
        let file = s.files[d].get().expect("set above");
        io::set_len(file, 0).map_err(|e| Error::io("resetting a volume", e))?;
        let vh = VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms, dir_id: dir.id };
        io::write_all_vectored_at(file, &[&vh.encode()], 0).map_err(|e| Error::io("writing a volume header", e))?;
        if self.cfg.fsync != FsyncPolicy::Never {
            io::sync_data(file).map_err(|e| Error::io("syncing a volume header", e))?;
            if created {
                io::sync_dir(&dir.path).map_err(|e| Error::io("syncing the data directory", e))?;
            }
        }
        s.dir.store(d as u32, Ordering::Release);
        dir.recovered();
        Ok(())
    }

    /// Seals the active volume and moves the writer to the next slot of the ring.
    fn rotate(&self, w: &mut Writer) -> Result<()> {
        let old = w.active;
        let next = (old + 1) % self.slots.len();
        let sequence = sequence_after(w.next_sequence);
        self.start_volume(next, sequence, now_ms().max(w.last_stamp), &mut w.cursor)?;
        w.next_sequence = sequence + 1;
        // The slot after the new active one is the next to be overwritten: copy its hot
        // entries forward while the new volume fills.
        let oldest = (next + 1) % self.slots.len();
        let og = self.slots[oldest].generation.load(Ordering::Relaxed);
        if self.cfg.reinsert_min_hits > 0 && oldest != next && og != 0 {
            self.send(Job::Reinsert { slot: oldest, generation: og });
        }
        let os = &self.slots[old];
        if next != old {
            // Whatever the policy, so that an explicit sync covers sealed volumes too; a slot
            // is listed once, which bounds the list by the ring's size.
            if !w.unsynced.contains(&old) {
                w.unsynced.push(old);
            }
            self.send(Job::Hint {
                slot: old,
                generation: os.generation.load(Ordering::Relaxed),
                sequence: os.sequence.load(Ordering::Relaxed),
                len: w.offset,
                through: Some(w.appended),
            });
        }
        w.active = next;
        self.active.store(next as u32, Ordering::Relaxed);
        w.offset = VOLUME_HEADER_LEN;
        self.counters.rotations.fetch_add(1, Ordering::Relaxed);
        self.send(Job::Sweep);
        Ok(())
    }

    /// Appends one record under the writer lock. Returns the record's position and index
    /// entry; the caller publishes it. `Ok(None)`, with nothing written, if `wait` is false
    /// and the record could only go in after turning the ring (which truncates and syncs
    /// files): the caller retries on a thread that may block.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        w: &mut Writer,
        wait: bool,
        header: Header,
        key: &[u8],
        meta: &[u8],
        value: &[u8],
        value_crc: u32,
    ) -> Result<Option<(Position, Loc)>> {
        let dir = self.slots[w.active].dir();
        match self.write_record(w, wait, header, key, meta, value, value_crc) {
            // The device is full but the ring's next slot holds older data, or another
            // directory may have room: turn the ring now, as it would turn later anyway;
            // emptying that slot, or placing the next volume elsewhere, makes the room.
            Err(e)
                if e.kind() == ErrorKind::NoSpace
                    && w.offset > VOLUME_HEADER_LEN
                    && (self.next_holds_data(w) || dir.is_some_and(|d| self.another_usable(d))) =>
            {
                if !wait {
                    return Ok(None);
                }
                tracing::warn!(slot = w.active, "device full: turning the ring early");
                self.rotate(w)?;
                self.write_record(w, wait, header, key, meta, value, value_crc)
            }
            // The directory failed: the write goes to a new volume in another one.
            Err(e) if e.kind() == ErrorKind::Io && !w.closed && dir.is_some_and(|d| self.another_usable(d)) => {
                if !wait {
                    return Ok(None);
                }
                tracing::warn!(slot = w.active, error = %e, "write failed: moving on to a volume in another directory");
                self.rotate(w)?;
                self.write_record(w, wait, header, key, meta, value, value_crc)
            }
            r => r,
        }
    }

    /// Whether the slot the ring turns to next holds records (emptying it frees space).
    fn next_holds_data(&self, w: &Writer) -> bool {
        let next = (w.active + 1) % self.slots.len();
        next != w.active && self.slots[next].len.load(Ordering::Relaxed) > VOLUME_HEADER_LEN
    }

    /// Marks the directory of `slot` failed.
    fn fail_dir_of(&self, slot: usize, why: &dyn std::fmt::Display) {
        if let Some(d) = self.slots[slot].dir() {
            self.dirs[d].fail(why);
        }
    }

    /// Writes one record at the writer's offset, turning the ring first if it does not fit
    /// (`Ok(None)` instead, if `wait` is false).
    #[allow(clippy::too_many_arguments)]
    fn write_record(
        &self,
        w: &mut Writer,
        wait: bool,
        header: Header,
        key: &[u8],
        meta: &[u8],
        value: &[u8],
        value_crc: u32,
    ) -> Result<Option<(Position, Loc)>> {
        if w.closed {
            return Err(Error::new(ErrorKind::Io, "the store is closed"));
        }
        let record_len = (HEADER_LEN + key.len() + meta.len() + value.len()) as u64;
        let padded = record::padded(record_len);
        // A volume in a directory that failed (a write or sync there did) takes no more
        // records when another directory can.
        let failed = self.slots[w.active].dir().is_some_and(|d| !self.dirs[d].usable() && self.another_usable(d));
        if w.offset + padded > self.cfg.volume_size || (failed && w.offset > VOLUME_HEADER_LEN) {
            if !wait {
                return Ok(None);
            }
            self.rotate(w)?;
        }
        let slot = w.active;
        let generation = self.slots[slot].generation.load(Ordering::Relaxed);
        let salt = self.slots[slot].salt.load(Ordering::Relaxed);
        let header = Header { generation, ..header };
        let mut prefix = std::mem::take(&mut w.prefix);
        prefix.clear();
        record::encode_prefix(&mut prefix, &header, key, meta, value.len(), value_crc, salt);
        let pad = &ZEROS[..(padded - record_len) as usize];
        let file = self.slots[slot].file().expect("active volume is open");
        let res = io::write_all_vectored_at(file, &[&prefix, value, pad], w.offset);
        w.prefix = prefix;
        // On failure the offset does not move and whatever part of the record reached the file
        // is cut off (best effort): the index never points at it, and recovery never meets it.
        if let Err(e) = res {
            let _ = io::set_len(file, w.offset);
            self.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            let e = Error::io("writing a record", e);
            if e.kind() == ErrorKind::Io {
                self.fail_dir_of(slot, &e);
            }
            return Err(e);
        }
        let loc = self.loc(slot, generation, w.offset, record_len);
        let pos = Position { volume: slot as u32, offset: w.offset, size: record_len };
        w.offset += padded;
        self.slots[slot].len.store(w.offset, Ordering::Release);
        w.appended += 1;
        Ok(Some((pos, loc)))
    }

    /// Blocks until append number `seq` is durable (group commit).
    fn wait_durable(&self, seq: u64) -> Result<()> {
        let mut st = self.durable.lock();
        loop {
            // Only the sync that covered `seq` decides: a later successful one does not cover
            // pages whose writeback failed, and a failure after a success does not undo it.
            if seq <= st.attempted {
                let failed = st.failed.iter().any(|&(after, through)| seq > after && seq <= through);
                // Syncs only raise `synced`: below `seq`, the one that covered it failed.
                if failed || st.synced < seq {
                    return Err(Error::new(ErrorKind::Io, "fdatasync failed; the write may not be durable"));
                }
                return Ok(());
            }
            if st.syncing {
                self.durable_cv.wait(&mut st);
                continue;
            }
            st.syncing = true;
            drop(st);
            let (target, res) = self.sync_now();
            st = self.durable.lock();
            st.syncing = false;
            // Syncs run one at a time, each covering the appends after the previous one's.
            let covered = (st.attempted, target);
            st.attempted = st.attempted.max(target);
            match res {
                Ok(()) => st.synced = st.synced.max(target),
                Err(e) => {
                    tracing::error!(error = %e, "fdatasync failed");
                    match st.failed.back_mut() {
                        // Failures in a row make one range.
                        Some(last) if last.1 == covered.0 => last.1 = covered.1,
                        _ => {
                            if st.failed.len() == 1024 {
                                st.failed.pop_front();
                            }
                            st.failed.push_back(covered);
                        }
                    }
                }
            }
            self.durable_cv.notify_all();
        }
    }

    /// fdatasyncs every volume written since the last sync; returns the append count covered.
    fn sync_now(&self) -> (u64, std::io::Result<()>) {
        let (target, mut slots, undo) = {
            let mut w = self.writer.lock();
            let mut slots = std::mem::take(&mut w.unsynced);
            slots.push(w.active);
            (w.appended, slots, std::mem::take(&mut w.undo))
        };
        slots.sort_unstable();
        slots.dedup();
        let mut result = Ok(());
        for &slot in &slots {
            if let Some(f) = self.slots[slot].file() {
                let started = std::time::Instant::now();
                let r = io::sync_data(f);
                // A no-op unless the embedding program installed a `metrics` recorder.
                metrics::histogram!("larder_fsync_duration_seconds").record(started.elapsed().as_secs_f64());
                if let Err(e) = r {
                    self.fail_dir_of(slot, &e);
                    result = Err(e);
                }
            }
        }
        if result.is_err() {
            let mut w = self.writer.lock();
            // Try these volumes again at the next sync, except those of a directory that has
            // failed while another works: the writes they held were answered as failed (or
            // are undone below), and retrying would fail every later sync too.
            let dead = |slot: &usize| {
                self.slots[*slot].dir().is_some_and(|d| !self.dirs[d].usable() && self.another_usable(d))
            };
            w.unsynced.extend(slots.into_iter().filter(|s| !dead(s)));
            // The writes this sync covered are answered as failed, so their keys must keep
            // their previous values: undo their index changes, newest first, under the writer
            // lock so no append interleaves. A later write of the same key wins the compare.
            for u in undo.iter().rev() {
                if let Some(loc) = u.after {
                    let slot = loc.slot as usize;
                    let stray = (slot, self.slots[slot].generation.load(Ordering::Relaxed));
                    if !w.strays.contains(&stray) {
                        w.strays.push(stray);
                    }
                }
                if !self.index.compare_and_set(u.hash, u.after, u.before) {
                    // A write after this sync's target replaced the entry: if that one is
                    // undone later, it must go back to what was there before this one.
                    for later in w.undo.iter_mut().filter(|l| l.hash == u.hash && same(l.before, u.after)) {
                        later.before = u.before;
                    }
                }
                crate::pause::point("undo.between", &u.key);
                // Index first, memory second (the one rule): a GET meanwhile may have promoted
                // the value being undone, and from here on no promotion of it can pass.
                self.reconcile_memory(u.hash, &u.key, None);
            }
            self.counters.sync_failures.fetch_add(1, Ordering::Relaxed);
        }
        (target, result)
    }

    fn write_hint(&self, slot: usize, generation: u32, sequence: u64, len: u64, through: Option<u64>) -> Result<()> {
        let s = &self.slots[slot];
        let (Some(d), Some(file)) = (s.dir(), s.file()) else { return Ok(()) };
        let dir = &self.dirs[d];
        let salt = s.salt.load(Ordering::Acquire);
        // The hint is durable once written, so the records it names must be first: else a
        // power cut leaves a hint pointing at bytes that never reached the disk. The sync goes
        // through group commit, so that a failure reaches the writes waiting on it (Linux
        // reports a writeback error once).
        match through {
            Some(n) => self.wait_durable(n)?,
            None => io::sync_data(file).map_err(|e| Error::io("syncing a recovered volume", e))?,
        }
        // Streamed: a volume of tiny records has millions of entries, and neither they nor
        // the encoded file are ever held whole (the scan reads in 4 MiB windows; entries are
        // written out every `HINT_CHUNK` bytes).
        let path = hint_path(&dir.path, slot);
        let out = io::AtomicFile::create(&path).map_err(|e| Error::io("writing a hint file", e))?;
        let mut enc = hint::Encoder::default();
        let mut at = hint::Encoder::ENTRIES_AT;
        let mut failed = None;
        let mut write = |enc: &mut hint::Encoder| {
            enc.flush(|b| {
                let r = out.write_at(b, at);
                at += b.len() as u64;
                r
            })
        };
        recovery::scan_hint_entries(self, file, len, generation, salt, |entry, stored_ms| {
            if failed.is_some() {
                return; // the scan runs to its end; nothing more is kept
            }
            enc.push(&entry, stored_ms);
            if enc.pending() >= HINT_CHUNK {
                failed = write(&mut enc).err();
            }
        })
        .map_err(|e| Error::io("reading a volume", e))?;
        if let Some(e) = failed {
            return Err(Error::io("writing a hint file", e));
        }
        write(&mut enc).map_err(|e| Error::io("writing a hint file", e))?;
        if s.generation.load(Ordering::Acquire) != generation {
            return Ok(()); // the ring reused the slot meanwhile
        }
        let vh = VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms: 0, dir_id: dir.id };
        let (header, trailer) = enc.finish(&vh, len);
        out.write_at(&trailer, at)
            .and_then(|()| out.write_at(&header, 0))
            .and_then(|()| out.commit())
            .map_err(|e| Error::io("writing a hint file", e))?;
        self.counters.hints_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Reads into `buf` at `offset` of `slot`'s file; `Ok(None)` if `nowait` and the read
    /// would wait for the device. A failure is an error, not a miss: the data may be fine once
    /// the device is.
    ///
    /// A non-blocking read that returns fewer bytes than the file holds there is "would
    /// block" too: Linux 5.9 and 5.10 may answer a `RWF_NOWAIT` read that would block with 0 or
    /// a short count instead of `EAGAIN`. Only a blocking read can come back short for real.
    fn read(&self, slot: &SlotState, file: &File, buf: &mut [u8], offset: u64, nowait: bool) -> Result<Option<usize>> {
        let r = if nowait {
            io::read_cached_at_most(file, buf, offset)
        } else {
            io::read_at_most(file, buf, offset).map(Some)
        };
        let n = r.map_err(|e| {
            self.counters.read_failures.fetch_add(1, Ordering::Relaxed);
            Error::io("reading a record", e)
        })?;
        // The slot's length is stored before the index names a record in it, so a reader that
        // found the record sees at least its end.
        let there = slot.len.load(Ordering::Acquire).saturating_sub(offset).min(buf.len() as u64) as usize;
        Ok(n.filter(|&n| !nowait || n >= there))
    }

    /// Reads and verifies the record at `loc`.
    fn fetch(&self, hash: u64, loc: Loc, nowait: bool) -> Result<Fetch> {
        let slot = &self.slots[loc.slot as usize];
        let (Some(generation), Some(file)) = (self.live_generation(loc), slot.file()) else {
            return Ok(Fetch::Gone);
        };
        let salt = slot.salt.load(Ordering::Acquire);
        let mut buf = vec![0u8; record::size_class_bytes(loc.class) as usize];
        let Some(n) = self.read(slot, file, &mut buf, loc.offset, nowait)? else { return Ok(Fetch::WouldBlock) };
        self.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
        buf.truncate(n);
        let (header, value) = match record::decode(&buf, salt) {
            Ok(r) => (r.header, r.value_range),
            // Only a complete blocking read marks damage: the blocking path reads again.
            Err(_) if nowait => return Ok(Fetch::WouldBlock),
            Err(err) => {
                self.damaged(hash, loc, generation, err);
                return Ok(Fetch::Gone);
            }
        };
        if header.generation != generation {
            return Ok(Fetch::Gone);
        }
        let value_crc = record::value_crc(&buf, &header, salt);
        Ok(Fetch::Record(Record { buf, header, value, value_crc }))
    }

    /// A record at `loc` failed verification. A slot reused under the reader explains any
    /// garbage; otherwise it is damage: counted, logged, and answered as a miss from now on.
    fn damaged(&self, hash: u64, loc: Loc, generation: u32, err: impl std::fmt::Debug) {
        if self.slots[loc.slot as usize].generation.load(Ordering::Acquire) == generation {
            self.counters.corrupt_reads.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                volume = loc.slot,
                offset = loc.offset,
                ?err,
                "record failed verification; answered as a miss"
            );
            self.index.remove_if_eq(hash, loc);
        }
    }

    /// The value of `key` in a verified record read from `loc`, or `None` when the record is
    /// another key's, a tombstone, or expired (an expired entry is dropped from the index).
    fn value_of(&self, hash: u64, loc: Loc, key: &[u8], rec: Record) -> Option<Value> {
        let h = rec.header;
        if rec.key() != key || h.is_tombstone() {
            return None;
        }
        if rec.expired(now_ms()) {
            self.expire(hash, loc, key);
            return None;
        }
        let meta_at = HEADER_LEN + h.key_len as usize..rec.value.0;
        let buf = Bytes::from(rec.buf);
        let content_type = Meta::parse(&buf[meta_at]).content_type.map(|t| buf.slice_ref(t));
        Some(Value {
            data: buf.slice(rec.value.0..rec.value.1),
            start: 0,
            len: h.value_len as u64,
            crc: rec.value_crc,
            content_type,
            position: Position { volume: loc.slot as u32, offset: loc.offset, size: h.record_len() },
            stored_ms: h.stored_ms,
            expiry_ms: h.expiry_ms,
            tier: Tier::Disk,
        })
    }

    /// Reads `part` of the value of `key` at `loc`. A small record is read and verified whole.
    /// Of a large one only the front (header, key and metadata, verified by their own
    /// checksums) is read, then just the blocks that hold the range, each verified against
    /// its block checksum: a range or a HEAD of a large value never reads all of it.
    fn fetch_part(&self, hash: u64, loc: Loc, key: &[u8], part: Part, nowait: bool) -> Result<Got> {
        let class = record::size_class_bytes(loc.class) as usize;
        // A record this small holds no block checksums (or barely more than 128 KiB of them):
        // a range of it is read whole, in one read, rather than front first.
        let small = class as u64 <= (meta::BLOCKED_MIN_LEN + PREFIX_READ as u64) * 17 / 16;
        let whole = part == Part::Whole || matches!(part, Part::Range(_)) && small;
        if whole || class <= PREFIX_READ {
            return Ok(match self.fetch(hash, loc, nowait)? {
                Fetch::WouldBlock => Got::WouldBlock,
                Fetch::Gone => Got::Gone,
                Fetch::Record(r) => {
                    let generation = r.header.generation;
                    self.value_of(hash, loc, key, r).map_or(Got::Gone, |v| Got::Value(v.narrow(part), generation))
                }
            });
        }
        let slot = &self.slots[loc.slot as usize];
        let (Some(generation), Some(file)) = (self.live_generation(loc), slot.file()) else {
            return Ok(Got::Gone);
        };
        let salt = slot.salt.load(Ordering::Acquire);
        let mut front = vec![0u8; PREFIX_READ];
        let Some(n) = self.read(slot, file, &mut front, loc.offset, nowait)? else { return Ok(Got::WouldBlock) };
        self.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
        front.truncate(n);
        let (h, meta_block) = match record::decode_prefix(&front, salt) {
            Ok(x) => x,
            Err(_) if nowait => return Ok(Got::WouldBlock),
            Err(err) => {
                self.damaged(hash, loc, generation, err);
                return Ok(Got::Gone);
            }
        };
        if h.generation != generation || &front[HEADER_LEN..HEADER_LEN + h.key_len as usize] != key || h.is_tombstone()
        {
            return Ok(Got::Gone);
        }
        if h.expiry_ms != 0 && h.expiry_ms <= now_ms() {
            self.expire(hash, loc, key);
            return Ok(Got::Gone);
        }
        let len = h.value_len as u64;
        let meta = Meta::parse(meta_block);
        let (start, end) = match part {
            Part::Range(r) => r.resolve(len).unwrap_or((0, 0)),
            _ => (0, 0),
        };
        let data = if start == end {
            Bytes::new()
        } else {
            let Some(blocks) = meta.blocks(len) else {
                // A value without block checksums is verified whole.
                return self.fetch_part(hash, loc, key, Part::Whole, nowait).map(|g| match g {
                    Got::Value(v, g) => Got::Value(v.narrow(part), g),
                    other => other,
                });
            };
            let size = blocks.size();
            let (first, last) = (start / size, (end - 1) / size);
            let (from, to) = (first * size, ((last + 1) * size).min(len));
            let value_at = loc.offset + (HEADER_LEN + h.key_len as usize + h.meta_len as usize) as u64;
            let mut buf = vec![0u8; (to - from) as usize];
            let Some(n) = self.read(slot, file, &mut buf, value_at + from, nowait)? else { return Ok(Got::WouldBlock) };
            self.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
            if n < buf.len() {
                if nowait {
                    return Ok(Got::WouldBlock);
                }
                self.damaged(hash, loc, generation, record::DecodeError::Short);
                return Ok(Got::Gone);
            }
            for (i, block) in buf.chunks(size as usize).enumerate() {
                if crc32c::crc32c(block) != blocks.crc(first + i as u64) {
                    if nowait {
                        return Ok(Got::WouldBlock);
                    }
                    self.damaged(hash, loc, generation, record::DecodeError::BadBody);
                    return Ok(Got::Gone);
                }
            }
            Bytes::from(buf).slice((start - from) as usize..(end - from) as usize)
        };
        let value = Value {
            data,
            start,
            len,
            crc: record::value_crc(&front, &h, salt),
            content_type: meta.content_type.map(Bytes::copy_from_slice),
            position: Position { volume: loc.slot as u32, offset: loc.offset, size: h.record_len() },
            stored_ms: h.stored_ms,
            expiry_ms: h.expiry_ms,
            tier: Tier::Disk,
        };
        Ok(Got::Value(value, h.generation))
    }

    /// The memory tier's one rule (see memory.rs): memory never holds a value older than its
    /// key's newest write. Called after every write's change of `key`'s index entry (put,
    /// delete, the undo after a failed fsync) and on expiry with no offer, which drops the key,
    /// and by promotion and `memory_on_put` with the value and the record it came from, which
    /// goes in only if the index still names that record, whole generation compared. Returns
    /// what happened (and what was dropped).
    pub(crate) fn reconcile_memory(&self, hash: u64, key: &[u8], offer: Option<(Cached, Seen)>) -> Settled {
        let Some(m) = &self.memory else { return Settled::Dropped(None) };
        match offer {
            None => m.reconcile(hash, key, None, || false),
            Some((value, seen)) => m.reconcile(hash, key, Some(value), || {
                self.index.get(hash).is_some_and(|l| l.same_place(seen.loc))
                    && self.slots[seen.loc.slot as usize].generation.load(Ordering::Acquire) == seen.generation
            }),
        }
    }

    /// An expired entry found at `loc`: out of the index, then out of memory.
    fn expire(&self, hash: u64, loc: Loc, key: &[u8]) {
        self.index.remove_if_eq(hash, loc);
        self.reconcile_memory(hash, key, None);
    }

    /// The current version of `key`, under the writer lock (`indexed` is what its index entry
    /// names, read before the lock by [`Store::lock_current`]).
    fn current_version(&self, key: &[u8], indexed: Option<Version>) -> Option<Version> {
        if indexed.is_some() {
            return indexed;
        }
        // Memory may hold a value whose record the ring has overwritten. Every write drops the
        // key from memory under the writer lock, so what it holds here is current.
        let now = now_ms();
        let cached = self.memory.as_ref().and_then(|m| m.get(key));
        cached.filter(|c| c.expiry_ms == 0 || c.expiry_ms > now).map(|c| Version {
            len: c.data.len() as u64,
            crc: c.crc,
            stored_ms: c.stored_ms,
        })
    }

    /// Fails unless every precondition holds for the current value of `key`. Under the writer
    /// lock; `indexed` as for [`Shared::current_version`].
    fn check(&self, key: &[u8], preconditions: &[Precondition], indexed: Option<Version>) -> Result<()> {
        if preconditions.is_empty() {
            return Ok(());
        }
        match crate::ops::unmet(preconditions, self.current_version(key, indexed)) {
            None => Ok(()),
            Some(why) => Err(Error::new(ErrorKind::PreconditionFailed, why)),
        }
    }

    /// Copies the entries of `slot` (the next volume the ring overwrites) that were read at
    /// least `reinsert_min_hits` times to the active volume, hottest first within the byte
    /// budget, so that they survive the overwrite. A put or delete of the key since wins.
    fn reinsert(&self, slot: usize, generation: u32) {
        let c = &self.counters;
        let min = self.cfg.reinsert_min_hits.min(MAX_HITS);
        let tag = (generation & TAG_MASK) as u8;
        let mut cands: Vec<(u64, Loc)> = Vec::new();
        self.index.for_each(|h, l| {
            if l.slot as usize == slot && l.tag == tag && l.hits >= min {
                cands.push((h, l));
            }
        });
        c.reinsert_candidates.fetch_add(cands.len() as u64, Ordering::Relaxed);
        cands.sort_unstable_by_key(|&(_, l)| (std::cmp::Reverse(l.hits), l.offset));
        let budget = (self.cfg.volume_size as f64 * self.cfg.reinsert_share.clamp(0.0, 1.0)) as u64;
        let (mut spent, now) = (0, now_ms());
        let (mut batch, mut batch_bytes) = (Vec::new(), 0);
        for (i, &(hash, loc)) in cands.iter().enumerate() {
            let r = match self.fetch(hash, loc, false) {
                Ok(Fetch::Record(r)) if !r.header.is_tombstone() && !r.expired(now) => r,
                _ => {
                    c.reinsert_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            // Memory answers for a key it holds: the disk's budget goes to keys it does not.
            if self.memory.as_ref().is_some_and(|m| m.contains(r.key())) {
                c.reinsert_in_memory.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            spent += record::padded(r.header.record_len());
            if spent > budget {
                c.reinsert_over_budget.fetch_add((cands.len() - i) as u64, Ordering::Relaxed);
                break;
            }
            batch_bytes += r.buf.len();
            batch.push((hash, loc, r));
            // Small batches: puts wait for the writer lock while a batch is appended.
            if batch_bytes >= 256 << 10 {
                self.copy_forward(&mut batch);
                batch_bytes = 0;
            }
        }
        self.copy_forward(&mut batch);
    }

    fn copy_forward(&self, batch: &mut Vec<(u64, Loc, Record)>) {
        if batch.is_empty() {
            return;
        }
        let c = &self.counters;
        let mut w = self.writer.lock();
        let mut left = batch.len() as u64;
        for (hash, old, r) in batch.drain(..) {
            left -= 1;
            // Under the writer lock no put or delete of the key can come between this check
            // and the replacement.
            if !self.index.get(hash).is_some_and(|l| l.same_place(old)) {
                c.reinsert_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match self.append(&mut w, true, r.header, r.key(), r.meta(), r.value(), r.value_crc) {
                Ok(Some((pos, new))) => {
                    self.index.replace_if_eq(hash, old, new);
                    c.reinserted.fetch_add(1, Ordering::Relaxed);
                    c.reinserted_bytes.fetch_add(pos.size, Ordering::Relaxed);
                }
                Ok(None) => unreachable!("an append that may wait completes"),
                Err(e) => {
                    tracing::warn!(error = %e, "reinsertion stopped");
                    c.reinsert_skipped.fetch_add(1 + left, Ordering::Relaxed);
                    return;
                }
            }
        }
    }

    fn maintenance(self: Arc<Self>, rx: mpsc::Receiver<Job>) {
        io::lower_thread_priority();
        while let Ok(job) = rx.recv() {
            // A bug in one job must not stop sweeps and hints for the life of the process.
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_job(job)));
            if done.is_err() {
                tracing::error!("a maintenance job panicked; continuing with the next one");
            }
        }
    }

    fn run_job(&self, job: Job) {
        match job {
            Job::Hint { slot, generation, sequence, len, through } => {
                if let Err(e) = self.write_hint(slot, generation, sequence, len, through) {
                    tracing::warn!(slot, error = %e, "could not write a hint file; recovery will scan the volume");
                }
            }
            Job::Reinsert { slot, generation } => self.reinsert(slot, generation),
            Job::Barrier(done) => {
                let _ = done.send(());
            }
            Job::Sweep => {
                let removed = self.index.retain(|l| self.live_generation(l).is_some());
                self.counters.evicted_entries.fetch_add(removed, Ordering::Relaxed);
            }
            Job::Manifest => {
                if let Err(e) = dirs::save_manifest(&mut self.manifest.lock(), &self.dirs) {
                    tracing::warn!(error = %e, "could not update the manifest");
                }
            }
        }
    }

    fn syncer(self: Arc<Self>, every: Duration) {
        let mut stop = self.stop.lock();
        while !*stop {
            self.stop_cv.wait_for(&mut stop, every);
            let appended = self.writer.lock().appended;
            if appended > self.durable.lock().synced {
                let _ = self.wait_durable(appended);
            }
        }
    }
}

/// A verified record as read from a volume.
struct Record {
    buf: Vec<u8>,
    header: Header,
    value: (usize, usize),
    /// CRC32C of the value.
    value_crc: u32,
}

impl Record {
    fn key(&self) -> &[u8] {
        &self.buf[HEADER_LEN..HEADER_LEN + self.header.key_len as usize]
    }
    fn meta(&self) -> &[u8] {
        &self.buf[HEADER_LEN + self.header.key_len as usize..self.value.0]
    }
    fn value(&self) -> &[u8] {
        &self.buf[self.value.0..self.value.1]
    }
    fn expired(&self, now: u64) -> bool {
        self.header.expiry_ms != 0 && self.header.expiry_ms <= now
    }
}

/// What the index names for a key, as [`Store::lock_current`] saw it before the writer lock.
struct Current {
    loc: Option<Loc>,
    /// The version of the key's live value there (not a tombstone, expired or another key's).
    live: Option<Version>,
}

/// What a read of part of a value found.
enum Got {
    /// The value, and the generation of the record it was read from.
    Value(Value, u32),
    /// Absent, expired, another key's record, or damaged.
    Gone,
    WouldBlock,
}

enum Fetch {
    Record(Record),
    /// Not there any more: the slot moved on, or the bytes failed verification.
    Gone,
    WouldBlock,
}

/// The storage engine: a ring of volume files and an in-memory index. Cheap to share by
/// reference across threads; all methods take `&self`.
pub struct Store {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A header stamped now; `append` sets the generation and the encoder the lengths.
fn new_header(flags: u16) -> Header {
    Header { flags, key_len: 0, value_len: 0, meta_len: 0, generation: 0, stored_ms: now_ms(), expiry_ms: 0, crc: 0 }
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            format!("key must be 1 to {MAX_KEY_LEN} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

impl Store {
    /// Opens (or creates) the store in `cfg.dir` and recovers its index.
    pub fn open(cfg: StoreConfig) -> Result<Store> {
        Store::open_observed(cfg, &RecoveryProgress::default())
    }

    /// As [`Store::open`], reporting the recovery's progress in `progress` as it goes.
    pub fn open_observed(mut cfg: StoreConfig, progress: &RecoveryProgress) -> Result<Store> {
        if cfg.volume_count == 0 || cfg.volume_count as usize > MAX_SLOTS {
            let c = cfg.volume_count.clamp(1, MAX_SLOTS as u32);
            tracing::warn!(asked = cfg.volume_count, using = c, "volume count out of range");
            cfg.volume_count = c;
        }
        if !(MIN_VOLUME_SIZE..=MAX_VOLUME_SIZE).contains(&cfg.volume_size) {
            let v = cfg.volume_size.clamp(MIN_VOLUME_SIZE, MAX_VOLUME_SIZE);
            tracing::warn!(asked = cfg.volume_size, using = v, "volume size out of range");
            cfg.volume_size = v;
        }
        let fits = cfg.volume_size - VOLUME_HEADER_LEN - HEADER_LEN as u64 - MAX_KEY_LEN as u64;
        if cfg.max_value_size > fits {
            tracing::warn!(
                max_value_size = cfg.max_value_size,
                volume_size = cfg.volume_size,
                "values larger than about {fits} bytes do not fit in one volume and will be refused"
            );
        }
        let opened = dirs::open(&cfg.dirs, cfg.volume_size, cfg.volume_count, cfg.strict_dirs)?;
        let (mut manifest, dirs, hints_trusted) = (opened.manifest, opened.dirs, opened.hints_trusted);
        cfg.volume_count = manifest.volume_count; // kept while a directory is missing
        if !hints_trusted {
            // Hints hold hashes of a seed that is gone.
            for d in dirs.iter().filter(|d| d.present) {
                dirs::remove_hints(&d.path).map_err(|e| Error::io("removing stale hint files", e))?;
            }
        }
        // Saved before any volume is created, so that no volume exists without its manifest.
        dirs::save_manifest(&mut manifest, &dirs)?;
        let slots = (0..cfg.volume_count)
            .map(|_| SlotState {
                files: (0..dirs.len()).map(|_| OnceLock::new()).collect(),
                dir: AtomicU32::new(NO_DIR),
                generation: AtomicU32::new(0),
                salt: AtomicU32::new(0),
                sequence: AtomicU64::new(0),
                len: AtomicU64::new(0),
            })
            .collect();
        let mut shared = Shared {
            seed: manifest.hash_seed,
            dirs,
            degraded: opened.missing,
            manifest: Mutex::new(manifest),
            index: Index::new(),
            memory: Memory::new(&cfg.memory),
            flights: Flights::default(),
            slots,
            active: AtomicU32::new(0),
            writer: Mutex::new(Writer {
                active: 0,
                offset: VOLUME_HEADER_LEN,
                next_sequence: 1,
                appended: 0,
                unsynced: Vec::new(),
                undo: Vec::new(),
                strays: Vec::new(),
                prefix: Vec::new(),
                last_stamp: 0,
                closed: false,
                cursor: 0,
            }),
            durable: Mutex::new(DurableState::default()),
            durable_cv: Condvar::new(),
            jobs: Mutex::new(None),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            counters: Counters::default(),
            recovery: RecoveryReport::default(),
            cfg,
        };
        let rec = recovery::recover(&shared, hints_trusted, progress)?;
        shared.recovery = rec.report;
        let (active, next_sequence) = match rec.active {
            Some(a) => (a, rec.next_sequence),
            None => {
                // A new store, or one whose newest volume is in a missing directory: a new
                // volume in the slot after the newest.
                let slot = rec.start_slot;
                let w = shared.writer.get_mut();
                let mut cursor = w.cursor;
                let sequence = sequence_after(rec.next_sequence);
                shared.start_volume(slot, sequence, now_ms().max(rec.max_stored_ms), &mut cursor)?;
                shared.writer.get_mut().cursor = cursor;
                ((slot, VOLUME_HEADER_LEN), sequence + 1)
            }
        };
        {
            let w = shared.writer.get_mut();
            (w.active, w.offset, w.next_sequence) = (active.0, active.1, next_sequence);
            // Store times go on from the newest stored: a clock stepped back (or a restart
            // within the millisecond of the last write) never repeats a version's stamp.
            w.last_stamp = rec.max_stored_ms;
            let ahead = rec.max_stored_ms.saturating_sub(now_ms());
            if ahead > 60_000 {
                tracing::warn!(
                    seconds = ahead / 1000,
                    "stored versions are newer than the clock (it stepped back, or was once ahead): \
                     new writes are stamped after the newest, not by the clock"
                );
            }
            shared.active.store(active.0 as u32, Ordering::Relaxed);
        }
        {
            let m = shared.manifest.get_mut();
            m.active_slot = active.0 as u32;
            dirs::save_manifest(m, &shared.dirs)?;
        }

        let shared = Arc::new(shared);
        let (tx, rx) = mpsc::channel();
        *shared.jobs.lock() = Some(tx);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io(format!("starting {name}"), e))
        };
        let sh = shared.clone();
        let mut threads = vec![spawn("larder-maint", Box::new(move || sh.maintenance(rx)))?];
        if let FsyncPolicy::Every(every) = shared.cfg.fsync {
            let sh = shared.clone();
            threads.push(spawn("larder-sync", Box::new(move || sh.syncer(every)))?);
        }
        for slot in rec.unhinted {
            let s = &shared.slots[slot];
            shared.send(Job::Hint {
                slot,
                generation: s.generation.load(Ordering::Relaxed),
                sequence: s.sequence.load(Ordering::Relaxed),
                len: s.len.load(Ordering::Relaxed),
                through: None,
            });
        }
        Ok(Store { shared, threads: Mutex::new(threads) })
    }

    /// The configuration in force (sizes after clamping).
    pub fn config(&self) -> &StoreConfig {
        &self.shared.cfg
    }

    /// Stores `value` under `key`, replacing any previous value.
    ///
    /// Returns once the record is written (and, with `FsyncPolicy::Always`, durable).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<Position> {
        Ok(self.put_with(key, value, &PutOptions::default())?.position)
    }

    /// Stores `value` under `key` with an expiry, a content type and preconditions (checked
    /// atomically with the write; `ErrorKind::PreconditionFailed` when one does not hold).
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: &PutOptions<'_>) -> Result<Stored> {
        Ok(self.put_inner(key, value, opts, true)?.expect("a put that may wait completes"))
    }

    /// Like [`Store::put`], but answers `Ok(None)`, having written nothing, where `put` would
    /// wait: for the writer lock, for a ring rotation (which truncates a volume) or for an
    /// fdatasync (`FsyncPolicy::Always`). An async caller runs the quick common case inline
    /// and moves only the rest to a blocking thread.
    pub fn try_put(&self, key: &[u8], value: &[u8]) -> Result<Option<Position>> {
        Ok(self.put_inner(key, value, &PutOptions::default(), false)?.map(|s| s.position))
    }

    /// [`Store::put_with`] that does not wait (see [`Store::try_put`]); a put with
    /// preconditions also answers `Ok(None)` when the current record is not in the page cache.
    pub fn try_put_with(&self, key: &[u8], value: &[u8], opts: &PutOptions<'_>) -> Result<Option<Stored>> {
        self.put_inner(key, value, opts, false)
    }

    /// The writer lock, unless `wait` is false and taking it (or appending `need` bytes) could
    /// block: the lock is held, a rotation is due (the volume is full, or its directory
    /// failed), or the policy syncs every write.
    fn writer(&self, wait: bool, need: u64) -> Option<parking_lot::MutexGuard<'_, Writer>> {
        let sh = &*self.shared;
        if wait {
            return Some(sh.writer.lock());
        }
        if sh.cfg.fsync == FsyncPolicy::Always {
            return None;
        }
        let w = sh.writer.try_lock()?;
        let usable = sh.slots[w.active].dir().is_none_or(|d| sh.dirs[d].usable());
        (w.offset + need <= sh.cfg.volume_size && usable).then_some(w)
    }

    /// The writer lock, taken while the index still names what was read of `key` before it
    /// (if `look`: its live value, for a precondition or a delete). The read happens outside
    /// the lock, so that every writer never waits on one key's disk read; if a write of the
    /// key (or a turn of the ring) came in between, it is read again. After a few such rounds
    /// (a key written faster than one read takes) the read is made under the lock, which always
    /// finishes. `Ok(None)` where a call that may not wait would (see [`Store::writer`]; a read
    /// that would wait for the device too).
    fn lock_current(
        &self,
        hash: u64,
        key: &[u8],
        look: bool,
        wait: bool,
        need: u64,
    ) -> Result<Option<(parking_lot::MutexGuard<'_, Writer>, Current)>> {
        const ROUNDS: u32 = 3;
        let sh = &*self.shared;
        let mut round = 0;
        loop {
            let last = round == ROUNDS;
            if last && !wait {
                return Ok(None); // the blocking path reads under the lock
            }
            let locked = (look && last).then(|| sh.writer.lock());
            let loc = sh.index.get(hash);
            // The whole generation: the location keeps only 7 bits of it.
            let generation = loc.and_then(|l| sh.live_generation(l));
            let live = match (look, loc) {
                (true, Some(l)) => match sh.fetch_part(hash, l, key, Part::Nothing, !wait)? {
                    Got::WouldBlock => return Ok(None),
                    Got::Gone => None,
                    Got::Value(v, _) => Some(v.version()),
                },
                _ => None,
            };
            if look && locked.is_none() {
                crate::pause::point("write.looked", key);
            }
            let Some(w) = locked.or_else(|| self.writer(wait, need)) else { return Ok(None) };
            let now = sh.index.get(hash);
            if !look || last || (same(now, loc) && now.and_then(|l| sh.live_generation(l)) == generation) {
                return Ok(Some((w, Current { loc, live })));
            }
            round += 1;
        }
    }

    fn put_inner(&self, key: &[u8], value: &[u8], opts: &PutOptions<'_>, wait: bool) -> Result<Option<Stored>> {
        check_key(key)?;
        let sh = &*self.shared;
        if value.len() as u64 > sh.cfg.max_value_size {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {} bytes exceeds the limit of {} bytes", value.len(), sh.cfg.max_value_size),
            ));
        }
        if let Some(t) = opts.content_type.filter(|t| t.len() > meta::MAX_CONTENT_TYPE) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("content type of {} bytes exceeds the limit of {} bytes", t.len(), meta::MAX_CONTENT_TYPE),
            ));
        }
        // Outside the writer lock: one pass over the value for its checksum and, when it is
        // large, the block checksums a range read verifies.
        let (value_crc, blocks) = meta::checksum(value);
        let mut meta_block = Vec::new();
        meta::encode(&mut meta_block, opts.content_type, blocks.as_ref());
        let record_len = record::padded((HEADER_LEN + key.len() + meta_block.len() + value.len()) as u64);
        if VOLUME_HEADER_LEN + record_len > sh.cfg.volume_size || value.len() > u32::MAX as usize {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {} bytes does not fit in a volume of {} bytes", value.len(), sh.cfg.volume_size),
            ));
        }
        let hash = sh.hash(key);
        let always = sh.cfg.fsync == FsyncPolicy::Always;
        // What memory keeps of the value with `memory_on_put` (times are set below).
        let mut cached = sh.memory.as_ref().filter(|m| m.on_put()).map(|_| Cached {
            data: Bytes::copy_from_slice(value),
            position: Position { volume: 0, offset: 0, size: 0 },
            stored_ms: 0,
            expiry_ms: 0,
            crc: value_crc,
            content_type: opts.content_type.map(Bytes::copy_from_slice),
        });
        let mut header = new_header(0);
        let looked = !opts.preconditions.is_empty();
        let (pos, seen, seq) = {
            let Some((mut w, current)) = self.lock_current(hash, key, looked, wait, record_len)? else {
                return Ok(None);
            };
            sh.check(key, opts.preconditions, current.live)?;
            // Stamped under the lock, so store times (and versions) are unique and ordered.
            header.stored_ms = w.stamp();
            // By the clock, which expiry is checked against, not by the stamp: the stamp runs
            // ahead of the clock after it stepped back. A zero TTL expires at once.
            header.expiry_ms = match opts.ttl {
                None => 0,
                Some(t) if t.is_zero() => 1,
                Some(t) => now_ms().max(1).saturating_add(t.as_millis() as u64),
            };
            let Some((pos, loc)) = sh.append(&mut w, wait, header, key, &meta_block, value, value_crc)? else {
                return Ok(None);
            };
            // A colliding key loses its entry here: it becomes a miss, never a wrong value.
            let before = sh.index.insert(hash, loc);
            let seen = Seen { loc, generation: sh.slots[loc.slot as usize].generation.load(Ordering::Relaxed) };
            if always {
                w.undo.push(Undo { hash, key: key.into(), before, after: Some(loc) });
            }
            if let Some(c) = &mut cached {
                (c.position, c.stored_ms, c.expiry_ms) = (pos, header.stored_ms, header.expiry_ms);
            }
            // Under the writer lock, so that a conditional write after this one never finds
            // the replaced value in memory. A value that must be durable first enters memory
            // only once it is: a failed sync undoes the index change.
            let offer = if always { None } else { cached.take().map(|c| (c, seen)) };
            sh.reconcile_memory(hash, key, offer);
            (pos, seen, w.appended)
        };
        crate::pause::point("put.unlocked", key);
        if always {
            sh.wait_durable(seq)?;
            if let Some(c) = cached {
                sh.reconcile_memory(hash, key, Some((c, seen)));
            }
        }
        sh.counters.puts.fetch_add(1, Ordering::Relaxed);
        let version = Version { len: value.len() as u64, crc: value_crc, stored_ms: header.stored_ms };
        Ok(Some(Stored { position: pos, version }))
    }

    /// Reads the value of `key`; `Ok(None)` when absent, expired, evicted or unreadable.
    ///
    /// Looks in the memory tier first. A disk read that another thread is already making for
    /// the same key is shared rather than repeated. May block on the device.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        Ok(self.get_inner(key, true)?.expect("a get that may wait completes"))
    }

    /// Like [`Store::get`], but answers `Ok(None)` where `get` would wait for the device (the
    /// record is not in the page cache) or for another thread's read of the same key. An
    /// async caller answers memory and page-cache hits inline and moves only the rest to a
    /// thread that may block.
    pub fn try_get(&self, key: &[u8]) -> Result<Option<Option<Value>>> {
        self.get_inner(key, false)
    }

    /// Reads `part` of the value of `key` (see [`Part`]); `Part::Whole` is [`Store::get`].
    /// Partial reads are not shared between threads and do not count towards promotion to
    /// memory (memory holds whole values), but a range read counts towards reinsertion.
    pub fn get_part(&self, key: &[u8], part: Part) -> Result<Option<Value>> {
        Ok(self.get_part_inner(key, part, true)?.expect("a get that may wait completes"))
    }

    /// [`Store::get_part`] that answers `Ok(None)` where it would wait for the device.
    pub fn try_get_part(&self, key: &[u8], part: Part) -> Result<Option<Option<Value>>> {
        self.get_part_inner(key, part, false)
    }

    fn get_part_inner(&self, key: &[u8], part: Part, wait: bool) -> Result<Option<Option<Value>>> {
        if part == Part::Whole {
            return self.get_inner(key, wait);
        }
        check_key(key)?;
        let sh = &*self.shared;
        let hash = sh.hash(key);
        // Hits and misses count reads of values: a look at a value's description (a HEAD, a
        // revalidation, a conditional write's early check) is not one.
        let count = part != Part::Nothing;
        if let Some(v) = self.memory_hit(hash, key, count) {
            return Ok(Some(Some(v.narrow(part))));
        }
        let found = match sh.index.get(hash) {
            None => None,
            Some(loc) => match sh.fetch_part(hash, loc, key, part, !wait)? {
                Got::WouldBlock => return Ok(None),
                Got::Gone => None,
                Got::Value(v, _) => {
                    if matches!(part, Part::Range(_)) && sh.cfg.reinsert_min_hits > 0 {
                        sh.index.count_read(hash, loc, sh.cfg.reinsert_min_hits);
                    }
                    Some(v)
                }
            },
        };
        if count {
            let c = if found.is_some() { &sh.counters.hits } else { &sh.counters.misses };
            c.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(found))
    }

    /// A memory hit (counted if `count`); an expired entry is dropped.
    fn memory_hit(&self, hash: u64, key: &[u8], count: bool) -> Option<Value> {
        let sh = &*self.shared;
        let m = sh.memory.as_ref()?;
        let c = m.get(key)?;
        if c.expiry_ms != 0 && c.expiry_ms <= now_ms() {
            sh.reconcile_memory(hash, key, None);
            return None;
        }
        if count {
            m.hits.fetch_add(1, Ordering::Relaxed);
            sh.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
        Some(Value::from_cached(c))
    }

    fn get_inner(&self, key: &[u8], wait: bool) -> Result<Option<Option<Value>>> {
        check_key(key)?;
        let sh = &*self.shared;
        let hash = sh.hash(key);
        if let Some(v) = self.memory_hit(hash, key, true) {
            return Ok(Some(Some(v)));
        }
        // The record to read is looked up once, before a shared read is joined: a read in the
        // air answers only the gets that looked up the same record (see flight.rs).
        // A location whose slot has moved on names nothing (its record is gone).
        let seen = sh.index.get(hash).and_then(|loc| Some(Seen { loc, generation: sh.live_generation(loc)? }));
        let found = match seen {
            None => None,
            Some(seen) if wait => match sh.flights.join(hash, key, seen) {
                Join::Lead(lead) => {
                    crate::pause::point("flight.lead", key);
                    let r = self.read_disk(hash, key, seen, false).map(|d| d.expect("a blocking read completes"));
                    // Counted (and promoted) before the followers and later gets look again,
                    // so that a hot key costs one disk read, not one per racing get.
                    if let Ok(Some((v, seen))) = &r {
                        self.after_disk_read(hash, key, v, *seen, 1 + lead.followers());
                    }
                    lead.finish(&r);
                    r?
                }
                Join::Follow(flight) => {
                    sh.counters.coalesced_reads.fetch_add(1, Ordering::Relaxed);
                    flight.wait()?
                }
                Join::Alone => {
                    let found = self.read_disk(hash, key, seen, false)?.expect("a blocking read completes");
                    if let Some((v, seen)) = &found {
                        self.after_disk_read(hash, key, v, *seen, 1);
                    }
                    found
                }
            },
            Some(seen) => {
                if sh.flights.busy(hash) {
                    return Ok(None);
                }
                let Some(found) = self.read_disk(hash, key, seen, true)? else { return Ok(None) };
                if let Some((v, seen)) = &found {
                    self.after_disk_read(hash, key, v, *seen, 1);
                }
                found
            }
        };
        let c = if found.is_some() { &sh.counters.hits } else { &sh.counters.misses };
        c.fetch_add(1, Ordering::Relaxed);
        Ok(Some(found.map(|(value, _)| value)))
    }

    /// A value was read from disk for `reads` gets: count them for reinsertion and for
    /// admission to memory, promoting the value when it has earned it.
    fn after_disk_read(&self, hash: u64, key: &[u8], v: &Value, seen: Seen, reads: u32) {
        let sh = &*self.shared;
        if sh.cfg.reinsert_min_hits > 0 {
            sh.index.count_read(hash, seen.loc, sh.cfg.reinsert_min_hits);
        }
        let Some(m) = &sh.memory else { return };
        if !m.admit(hash, now_ms(), reads) {
            return;
        }
        crate::pause::point("promote", key);
        // An exact-size copy: the read buffer also holds the header and padding.
        if let Settled::Stored = sh.reconcile_memory(hash, key, Some((v.to_cached(), seen))) {
            m.promotions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads the record of `key` that `seen` names; `Ok(None)` if `nowait` and the read would
    /// wait for the device. A record of another generation (the slot moved on) is gone.
    fn read_disk(&self, hash: u64, key: &[u8], seen: Seen, nowait: bool) -> Result<Option<Found>> {
        Ok(match self.shared.fetch_part(hash, seen.loc, key, Part::Whole, nowait)? {
            Got::WouldBlock => None,
            Got::Value(v, generation) if generation == seen.generation => Some(Some((v, seen))),
            Got::Gone | Got::Value(..) => Some(None),
        })
    }

    /// Deletes `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.delete_if(key, &[])
    }

    /// Deletes `key` if every precondition holds for its current value (checked atomically
    /// with the delete); `ErrorKind::PreconditionFailed` otherwise.
    pub fn delete_if(&self, key: &[u8], preconditions: &[Precondition]) -> Result<bool> {
        Ok(self.delete_inner(key, preconditions, true)?.expect("a delete that may wait completes"))
    }

    /// Like [`Store::delete`], but answers `Ok(None)`, having done nothing, where `delete`
    /// would wait (see [`Store::try_put`]), a read of the key's record from the device
    /// included.
    pub fn try_delete(&self, key: &[u8]) -> Result<Option<bool>> {
        self.delete_inner(key, &[], false)
    }

    fn delete_inner(&self, key: &[u8], preconditions: &[Precondition], wait: bool) -> Result<Option<bool>> {
        check_key(key)?;
        let sh = &*self.shared;
        let hash = sh.hash(key);
        let need = record::padded((HEADER_LEN + key.len()) as u64);
        let (seq, tombstone_only, in_memory) = {
            let Some((mut w, current)) = self.lock_current(hash, key, true, wait, need)? else { return Ok(None) };
            sh.check(key, preconditions, current.live)?;
            // A live value gets a tombstone; so does any key while a volume is left out of the
            // index (or in a missing directory), or holds a put undone after a failed sync: it
            // may hold the key, and the tombstone keeps it deleted when recovery meets that
            // record. An expired value needs none: it stays expired across restarts.
            let (seq, tombstone_only) = if current.live.is_some() || sh.degraded || w.has_strays(&sh.slots) {
                let header = Header { stored_ms: w.stamp(), ..new_header(FLAG_TOMBSTONE) };
                let Some(_) = sh.append(&mut w, wait, header, key, b"", b"", crc32c::crc32c(b""))? else {
                    return Ok(None);
                };
                if let (Some(loc), Some(_)) = (current.loc, current.live) {
                    if sh.index.remove_if_eq(hash, loc) && sh.cfg.fsync == FsyncPolicy::Always {
                        w.undo.push(Undo { hash, key: key.into(), before: Some(loc), after: None });
                    }
                }
                (Some(w.appended), current.live.is_none())
            } else {
                (None, false)
            };
            // Memory may hold the key after the ring evicted its record: that counts as
            // present, unless expired. Dropped under the writer lock, so that a conditional
            // write after this delete never finds the value in memory.
            let held = match sh.reconcile_memory(hash, key, None) {
                Settled::Dropped(held) => held,
                Settled::Stored => None,
            };
            let now = now_ms();
            (seq, tombstone_only, held.is_some_and(|c| c.expiry_ms == 0 || c.expiry_ms > now))
        };
        if let (Some(seq), FsyncPolicy::Always) = (seq, sh.cfg.fsync) {
            sh.wait_durable(seq)?;
        }
        let found = (seq.is_some() && !tombstone_only) || in_memory;
        if found {
            sh.counters.deletes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(found))
    }

    /// Waits until the background work queued so far (hint files, index sweeps,
    /// reinsertion) has run. For tests and benchmarks that want a settled state.
    pub fn settle(&self) {
        let (tx, rx) = mpsc::channel();
        self.shared.send(Job::Barrier(tx));
        let _ = rx.recv();
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> Result<()> {
        let appended = self.shared.writer.lock().appended;
        self.shared.wait_durable(appended)
    }

    /// Current counters and gauges.
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let c = &sh.counters;
        let (bytes_used, volumes) = sh
            .slots
            .iter()
            .filter(|s| s.file().is_some())
            .fold((0, 0), |(b, v), s| (b + s.len.load(Ordering::Relaxed), v + 1));
        let (memory_bytes, memory_entries, memory_capacity, admission_tracked) =
            sh.memory.as_ref().map_or((0, 0, 0, 0), |m| m.usage());
        Stats {
            keys: sh.index.len(),
            bytes_used,
            capacity_bytes: sh.cfg.volume_size * sh.cfg.volume_count as u64,
            volumes,
            active_volume: sh.active.load(Ordering::Relaxed) as u64,
            volume_size: sh.cfg.volume_size,
            volume_count: sh.cfg.volume_count as u64,
            puts: c.puts.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            memory_hits: sh.memory.as_ref().map_or(0, |m| m.hits.load(Ordering::Relaxed)),
            disk_reads: c.disk_reads.load(Ordering::Relaxed),
            coalesced_reads: c.coalesced_reads.load(Ordering::Relaxed),
            promotions: sh.memory.as_ref().map_or(0, |m| m.promotions.load(Ordering::Relaxed)),
            memory_capacity,
            memory_bytes,
            memory_entries,
            admission_tracked,
            reinsert_candidates: c.reinsert_candidates.load(Ordering::Relaxed),
            reinserted: c.reinserted.load(Ordering::Relaxed),
            reinserted_bytes: c.reinserted_bytes.load(Ordering::Relaxed),
            reinsert_over_budget: c.reinsert_over_budget.load(Ordering::Relaxed),
            reinsert_skipped: c.reinsert_skipped.load(Ordering::Relaxed),
            reinsert_in_memory: c.reinsert_in_memory.load(Ordering::Relaxed),
            corrupt_reads: c.corrupt_reads.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            sync_failures: c.sync_failures.load(Ordering::Relaxed),
            read_failures: c.read_failures.load(Ordering::Relaxed),
            rotations: c.rotations.load(Ordering::Relaxed),
            volumes_evicted: c.volumes_evicted.load(Ordering::Relaxed),
            evicted_entries: c.evicted_entries.load(Ordering::Relaxed),
            hints_written: c.hints_written.load(Ordering::Relaxed),
            recovery: sh.recovery,
            degraded: sh.degraded,
            dirs: sh
                .dirs
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let here = sh.slots.iter().filter(|s| s.dir() == Some(i) && s.len.load(Ordering::Relaxed) > 0);
                    let (volumes, bytes_used) =
                        here.fold((0, 0), |(v, b), s| (v + 1, b + s.len.load(Ordering::Relaxed)));
                    DirStats {
                        path: d.path.clone(),
                        id: dirs::hex(&d.id),
                        state: match (d.present, d.usable()) {
                            (false, _) => DirState::Missing,
                            (true, false) => DirState::Failed,
                            (true, true) => DirState::Ok,
                        },
                        volumes,
                        bytes_used,
                        free_bytes: if d.present { io::free_space(&d.path).map_or(0, |f| f.1) } else { 0 },
                    }
                })
                .collect(),
        }
    }

    /// Stops the background threads, makes all data durable and writes the checkpoint of the
    /// active volume. Called by `Drop` too.
    pub fn close(&self) -> Result<()> {
        let threads = std::mem::take(&mut *self.threads.lock());
        if threads.is_empty() {
            return Ok(());
        }
        *self.shared.jobs.lock() = None;
        *self.shared.stop.lock() = true;
        self.shared.stop_cv.notify_all();
        for t in threads {
            let _ = t.join();
        }
        let sh = &*self.shared;
        // Writers still running (a shutdown that timed out) fail from here on, so that the
        // sync below covers every record and the checkpoint describes the volume as it stays.
        let (active, offset) = {
            let mut w = sh.writer.lock();
            w.closed = true;
            (w.active, w.offset)
        };
        self.sync()?;
        // The checkpoint: a hint of the active volume as it is now, so that the next open
        // loads it instead of scanning the volume (it scans only what is appended after).
        let s = &sh.slots[active];
        let (generation, sequence) = (s.generation.load(Ordering::Acquire), s.sequence.load(Ordering::Relaxed));
        if let Err(e) = sh.write_hint(active, generation, sequence, offset, None) {
            tracing::warn!(slot = active, error = %e, "could not write the checkpoint; the next start scans the volume");
        }
        let mut m = sh.manifest.lock();
        m.active_slot = active as u32;
        dirs::save_manifest(&mut m, &sh.dirs)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "closing the store");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn concurrent_reads_of_a_cold_key_share_one_disk_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::new(dir.path());
        (cfg.volume_size, cfg.volume_count) = (1 << 20, 2);
        cfg.memory.promote_after = 1_000; // keep memory out of it: every get goes to disk
        let store = Store::open(cfg).unwrap();
        let value: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
        store.put(b"cold", &value).unwrap();
        let before = store.stats();
        // The leader is held inside its read (a slow device) until the 63 others have joined.
        let lead = crate::pause::arm("flight.lead", b"cold");
        let barrier = Barrier::new(64);
        std::thread::scope(|s| {
            for _ in 0..64 {
                s.spawn(|| {
                    barrier.wait();
                    let v = store.get(b"cold").unwrap().expect("stored");
                    assert_eq!(&v.data[..], &value[..]);
                });
            }
            assert!(lead.wait_arrived(Duration::from_secs(10)));
            let joined = std::time::Instant::now();
            while store.stats().coalesced_reads - before.coalesced_reads < 63 {
                assert!(joined.elapsed() < Duration::from_secs(10), "the other reads never joined");
                std::thread::sleep(Duration::from_millis(1));
            }
            lead.release();
        });
        let after = store.stats();
        assert_eq!(after.disk_reads - before.disk_reads, 1, "64 concurrent gets of one record, one disk read");
        assert_eq!(after.coalesced_reads - before.coalesced_reads, 63);
        // With no flight in the air, try_get answers inline from the page cache.
        assert!(store.try_get(b"cold").unwrap().is_some());
    }
}
