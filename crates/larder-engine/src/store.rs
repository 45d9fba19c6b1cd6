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

use crate::index::{Index, Loc, MAX_SLOTS, MAX_VOLUME_SIZE};
use crate::record::{self, Header, FLAG_TOMBSTONE, HEADER_LEN, MAX_KEY_LEN};
use crate::recovery::{self, RecoveryReport};
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
    /// Data directory (created if missing).
    pub dir: PathBuf,
    /// Bytes per volume file.
    pub volume_size: u64,
    /// Volume slots in the ring.
    pub volume_count: u32,
    /// Largest value accepted, in bytes.
    pub max_value_size: u64,
    /// Durability policy.
    pub fsync: FsyncPolicy,
}

impl StoreConfig {
    /// A configuration with the server's defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            dir: dir.into(),
            volume_size: 1 << 30,
            volume_count: 16,
            max_value_size: 1 << 20,
            fsync: FsyncPolicy::Every(Duration::from_secs(1)),
        }
    }
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

/// A value read from the store.
#[derive(Debug, Clone)]
pub struct Value {
    /// The value bytes.
    pub data: Bytes,
    /// Where its record lives.
    pub position: Position,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// When it expires, ms since the Unix epoch; 0 = never.
    pub expiry_ms: u64,
}

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
    /// Reads whose record failed its checksum (answered as misses).
    pub corrupt_reads: u64,
    /// Times the ring moved to the next slot.
    pub rotations: u64,
    /// Index entries removed because the ring reused their volume.
    pub evicted_entries: u64,
    /// Hint files written.
    pub hints_written: u64,
    /// What the last recovery found.
    pub recovery: RecoveryReport,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    deletes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt_reads: AtomicU64,
    rotations: AtomicU64,
    evicted_entries: AtomicU64,
    hints_written: AtomicU64,
}

pub(crate) struct SlotState {
    pub file: OnceLock<File>,
    /// Current generation; 0 = the slot holds no data yet.
    pub generation: AtomicU32,
    /// Checksum salt of the current generation's records.
    pub salt: AtomicU32,
    pub sequence: AtomicU64,
    /// Bytes in the file (header and records).
    pub len: AtomicU64,
}

struct Writer {
    active: usize,
    offset: u64,
    next_sequence: u64,
    /// Records appended since open; group commit compares against it.
    appended: u64,
    /// Sealed slots whose data has not been fdatasynced yet.
    unsynced: Vec<usize>,
    prefix: Vec<u8>,
}

#[derive(Default)]
struct DurableState {
    synced: u64,
    failed_through: u64,
    syncing: bool,
}

enum Job {
    Hint { slot: usize, generation: u32, sequence: u64, len: u64 },
    Sweep,
    Manifest { active: usize },
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub cfg: StoreConfig,
    pub seed: u64,
    pub dir_id: [u8; 16],
    manifest: Mutex<Manifest>,
    pub index: Index,
    pub slots: Box<[SlotState]>,
    writer: Mutex<Writer>,
    durable: Mutex<DurableState>,
    durable_cv: Condvar,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    counters: Counters,
    recovery: RecoveryReport,
    _lock: File,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

const ZEROS: [u8; record::ALIGN as usize] = [0; record::ALIGN as usize];

impl Shared {
    pub fn hash(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed)
    }

    pub fn loc(&self, slot: usize, generation: u32, offset: u64, record_len: u64) -> Loc {
        Loc { slot: slot as u16, tag: generation as u8, offset, class: record::size_class(record_len) }
    }

    /// The generation `loc` must be read with, or `None` if its slot has moved on.
    fn live_generation(&self, loc: Loc) -> Option<u32> {
        let g = self.slots[loc.slot as usize].generation.load(Ordering::Acquire);
        (g != 0 && g as u8 == loc.tag).then_some(g)
    }

    /// Whether the record at `loc` is of the current generation and has key `key` (header and
    /// key verified, value not).
    fn key_at(&self, loc: Loc, key: &[u8]) -> bool {
        let (Some(g), Some(file)) = (self.live_generation(loc), self.slots[loc.slot as usize].file.get()) else {
            return false;
        };
        let salt = self.slots[loc.slot as usize].salt.load(Ordering::Acquire);
        let want = (record::size_class_bytes(loc.class) as usize).min(HEADER_LEN + key.len());
        let mut buf = vec![0u8; want];
        let Ok(n) = io::read_at_most(file, &mut buf, loc.offset) else { return false };
        match record::decode_header(&buf[..n], salt) {
            Ok(h) => h.generation == g && &buf[HEADER_LEN..HEADER_LEN + h.key_len as usize] == key,
            Err(_) => false,
        }
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

    /// Starts a new generation of `slot`: its old records become unreachable at once.
    fn start_volume(&self, slot: usize, sequence: u64) -> Result<()> {
        let s = &self.slots[slot];
        let generation = s.generation.load(Ordering::Relaxed).wrapping_add(1).max(1);
        let mut salt = [0u8; 4];
        getrandom::fill(&mut salt).map_err(|e| Error::new(ErrorKind::Io, format!("no randomness for a salt: {e}")))?;
        let salt = u32::from_le_bytes(salt);
        // Readers holding entries of the old generation now fail the generation check; the
        // salt changes after it, so a reader that saw the old generation fails its checksum.
        s.generation.store(generation, Ordering::Release);
        s.salt.store(salt, Ordering::Release);
        io::remove_if_exists(&hint_path(&self.dir, slot)).map_err(|e| Error::io("removing a hint file", e))?;
        let created = s.file.get().is_none();
        if created {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(volume_path(&self.dir, slot))
                .map_err(|e| Error::io("creating a volume", e))?;
            let _ = s.file.set(f);
        }
        let file = s.file.get().expect("set above");
        file.set_len(0).map_err(|e| Error::io("resetting a volume", e))?;
        s.len.store(0, Ordering::Relaxed);
        let vh =
            VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms: now_ms(), dir_id: self.dir_id };
        io::write_all_vectored_at(file, &[&vh.encode()], 0).map_err(|e| Error::io("writing a volume header", e))?;
        if self.cfg.fsync != FsyncPolicy::Never {
            io::sync_data(file).map_err(|e| Error::io("syncing a volume header", e))?;
            if created {
                io::sync_dir(&self.dir).map_err(|e| Error::io("syncing the data directory", e))?;
            }
        }
        s.sequence.store(sequence, Ordering::Relaxed);
        s.len.store(VOLUME_HEADER_LEN, Ordering::Relaxed);
        Ok(())
    }

    /// Seals the active volume and moves the writer to the next slot of the ring.
    fn rotate(&self, w: &mut Writer) -> Result<()> {
        let old = w.active;
        let next = (old + 1) % self.slots.len();
        self.start_volume(next, w.next_sequence)?;
        w.next_sequence += 1;
        let os = &self.slots[old];
        if next != old {
            if self.cfg.fsync != FsyncPolicy::Never {
                w.unsynced.push(old);
            }
            self.send(Job::Hint {
                slot: old,
                generation: os.generation.load(Ordering::Relaxed),
                sequence: os.sequence.load(Ordering::Relaxed),
                len: w.offset,
            });
        }
        w.active = next;
        w.offset = VOLUME_HEADER_LEN;
        self.counters.rotations.fetch_add(1, Ordering::Relaxed);
        self.send(Job::Sweep);
        self.send(Job::Manifest { active: next });
        Ok(())
    }

    /// Appends one record under the writer lock and updates the index through `publish`.
    /// Returns the record's position and the append number to wait on for durability.
    fn append(
        &self,
        w: &mut Writer,
        header: Header,
        key: &[u8],
        value: &[u8],
        value_crc: u32,
    ) -> Result<(Position, Loc)> {
        let record_len = HEADER_LEN as u64 + key.len() as u64 + value.len() as u64;
        let padded = record::padded(record_len);
        if w.offset + padded > self.cfg.volume_size {
            self.rotate(w)?;
        }
        let slot = w.active;
        let generation = self.slots[slot].generation.load(Ordering::Relaxed);
        let salt = self.slots[slot].salt.load(Ordering::Relaxed);
        let header = Header { generation, ..header };
        let mut prefix = std::mem::take(&mut w.prefix);
        prefix.clear();
        record::encode_prefix(&mut prefix, &header, key, b"", value.len(), value_crc, salt);
        let pad = &ZEROS[..(padded - record_len) as usize];
        let file = self.slots[slot].file.get().expect("active volume is open");
        let res = io::write_all_vectored_at(file, &[&prefix, value, pad], w.offset);
        w.prefix = prefix;
        // On failure the offset does not move and whatever part of the record reached the file
        // is cut off (best effort): the index never points at it, and recovery never meets it.
        if let Err(e) = res {
            let _ = file.set_len(w.offset);
            return Err(Error::io("writing a record", e));
        }
        let loc = self.loc(slot, generation, w.offset, record_len);
        let pos = Position { volume: slot as u32, offset: w.offset, size: record_len };
        w.offset += padded;
        self.slots[slot].len.store(w.offset, Ordering::Relaxed);
        w.appended += 1;
        Ok((pos, loc))
    }

    /// Blocks until append number `seq` is durable (group commit).
    fn wait_durable(&self, seq: u64) -> Result<()> {
        let mut st = self.durable.lock();
        loop {
            // Failure first: a later successful sync does not cover pages whose writeback failed.
            if st.failed_through >= seq {
                return Err(Error::new(ErrorKind::Io, "fdatasync failed; the write may not be durable"));
            }
            if st.synced >= seq {
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
            match res {
                Ok(()) => st.synced = st.synced.max(target),
                Err(e) => {
                    tracing::error!(error = %e, "fdatasync failed");
                    st.failed_through = st.failed_through.max(target);
                }
            }
            self.durable_cv.notify_all();
        }
    }

    /// fdatasyncs every volume written since the last sync; returns the append count covered.
    fn sync_now(&self) -> (u64, std::io::Result<()>) {
        let (target, mut slots) = {
            let mut w = self.writer.lock();
            let mut slots = std::mem::take(&mut w.unsynced);
            slots.push(w.active);
            (w.appended, slots)
        };
        slots.sort_unstable();
        slots.dedup();
        let mut result = Ok(());
        for &slot in &slots {
            if let Some(f) = self.slots[slot].file.get() {
                if let Err(e) = io::sync_data(f) {
                    result = Err(e);
                }
            }
        }
        if result.is_err() {
            // Try these volumes again at the next sync.
            self.writer.lock().unsynced.extend(slots);
        }
        (target, result)
    }

    fn write_hint(&self, slot: usize, generation: u32, sequence: u64, len: u64) -> std::io::Result<()> {
        let s = &self.slots[slot];
        let Some(file) = s.file.get() else { return Ok(()) };
        let salt = s.salt.load(Ordering::Acquire);
        let entries = recovery::hint_entries(self, file, len, generation, salt)?;
        if s.generation.load(Ordering::Acquire) != generation {
            return Ok(()); // the ring reused the slot meanwhile
        }
        let vh = VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms: 0, dir_id: self.dir_id };
        let bytes = hint::encode(&vh, len, &entries);
        io::write_atomic(&hint_path(&self.dir, slot), &bytes)?;
        self.counters.hints_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
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
            Job::Hint { slot, generation, sequence, len } => {
                if let Err(e) = self.write_hint(slot, generation, sequence, len) {
                    tracing::warn!(slot, error = %e, "could not write a hint file; recovery will scan the volume");
                }
            }
            Job::Sweep => {
                let removed = self.index.retain(|l| self.live_generation(l).is_some());
                self.counters.evicted_entries.fetch_add(removed, Ordering::Relaxed);
            }
            Job::Manifest { active } => {
                let mut m = self.manifest.lock();
                m.active_slot = active as u32;
                if let Err(e) = m.save(&self.dir) {
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

/// The storage engine: a ring of volume files and an in-memory index. Cheap to share by
/// reference across threads; all methods take `&self`.
pub struct Store {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A header stamped now; `append` sets the generation and the encoder the lengths.
fn new_header(flags: u16) -> Header {
    Header { flags, key_len: 0, value_len: 0, meta_len: 0, generation: 0, stored_ms: now_ms(), expiry_ms: 0 }
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
    pub fn open(mut cfg: StoreConfig) -> Result<Store> {
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
        std::fs::create_dir_all(&cfg.dir).map_err(|e| Error::io(format!("creating {}", cfg.dir.display()), e))?;
        let lock = File::create(cfg.dir.join("LOCK")).map_err(|e| Error::io("creating the lock file", e))?;
        if lock.try_lock().is_err() {
            return Err(Error::new(ErrorKind::Locked, format!("{} is in use by another process", cfg.dir.display())));
        }
        let loaded = Manifest::load(&cfg.dir).map_err(|e| Error::io("reading the manifest", e))?;
        let (manifest, hints_trusted) = match loaded {
            Some(Some(m)) => {
                if m.volume_size != cfg.volume_size || m.volume_count != cfg.volume_count {
                    tracing::warn!(
                        was_size = m.volume_size,
                        was_count = m.volume_count,
                        "ring shape changed since the last run; volumes that no longer fit are discarded"
                    );
                }
                (Manifest { volume_size: cfg.volume_size, volume_count: cfg.volume_count, ..m }, true)
            }
            found => {
                if found.is_some() {
                    tracing::warn!("manifest is damaged; making a new one and scanning every volume");
                }
                let mut m = Manifest::fresh(cfg.volume_size, cfg.volume_count)
                    .map_err(|e| Error::io("generating a directory id", e))?;
                // Keep the volumes' identity; hints hold hashes of a seed that is gone.
                if let Some(id) = recovery::newest_dir_id(&cfg.dir) {
                    m.dir_id = id;
                }
                recovery::remove_hints(&cfg.dir).map_err(|e| Error::io("removing stale hint files", e))?;
                (m, false)
            }
        };
        // Saved before any volume is created, so that no volume exists without its manifest.
        manifest.save(&cfg.dir).map_err(|e| Error::io("writing the manifest", e))?;
        let slots = (0..cfg.volume_count)
            .map(|_| SlotState {
                file: OnceLock::new(),
                generation: AtomicU32::new(0),
                salt: AtomicU32::new(0),
                sequence: AtomicU64::new(0),
                len: AtomicU64::new(0),
            })
            .collect();
        let mut shared = Shared {
            dir: cfg.dir.clone(),
            seed: manifest.hash_seed,
            dir_id: manifest.dir_id,
            manifest: Mutex::new(manifest),
            index: Index::new(),
            slots,
            writer: Mutex::new(Writer {
                active: 0,
                offset: VOLUME_HEADER_LEN,
                next_sequence: 1,
                appended: 0,
                unsynced: Vec::new(),
                prefix: Vec::new(),
            }),
            durable: Mutex::new(DurableState::default()),
            durable_cv: Condvar::new(),
            jobs: Mutex::new(None),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            counters: Counters::default(),
            recovery: RecoveryReport::default(),
            cfg,
            _lock: lock,
        };
        let rec = recovery::recover(&shared, hints_trusted)?;
        shared.recovery = rec.report;
        let (active, next_sequence) = match rec.active {
            Some(a) => (a, rec.next_sequence),
            None => {
                shared.start_volume(0, rec.next_sequence)?;
                ((0, VOLUME_HEADER_LEN), rec.next_sequence + 1)
            }
        };
        {
            let w = shared.writer.get_mut();
            (w.active, w.offset, w.next_sequence) = (active.0, active.1, next_sequence);
        }
        shared.manifest.get_mut().active_slot = active.0 as u32;
        shared.manifest.lock().save(&shared.dir).map_err(|e| Error::io("writing the manifest", e))?;

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
        Ok(self.put_inner(key, value, true)?.expect("a put that may wait completes"))
    }

    /// Like [`Store::put`], but answers `Ok(None)`, having written nothing, where `put` would
    /// wait: for the writer lock, for a ring rotation (which truncates a volume) or for an
    /// fdatasync (`FsyncPolicy::Always`). An async caller runs the quick common case inline
    /// and moves only the rest to a blocking thread.
    pub fn try_put(&self, key: &[u8], value: &[u8]) -> Result<Option<Position>> {
        self.put_inner(key, value, false)
    }

    /// The writer lock, unless `wait` is false and taking it (or appending `need` bytes) could
    /// block: the lock is held, a rotation is due, or the policy syncs every write.
    fn writer(&self, wait: bool, need: u64) -> Option<parking_lot::MutexGuard<'_, Writer>> {
        let sh = &*self.shared;
        if wait {
            return Some(sh.writer.lock());
        }
        if sh.cfg.fsync == FsyncPolicy::Always {
            return None;
        }
        let w = sh.writer.try_lock()?;
        (w.offset + need <= sh.cfg.volume_size).then_some(w)
    }

    fn put_inner(&self, key: &[u8], value: &[u8], wait: bool) -> Result<Option<Position>> {
        check_key(key)?;
        let sh = &*self.shared;
        if value.len() as u64 > sh.cfg.max_value_size {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {} bytes exceeds the limit of {} bytes", value.len(), sh.cfg.max_value_size),
            ));
        }
        let record_len = record::padded((HEADER_LEN + key.len() + value.len()) as u64);
        if VOLUME_HEADER_LEN + record_len > sh.cfg.volume_size || value.len() > u32::MAX as usize {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {} bytes does not fit in a volume of {} bytes", value.len(), sh.cfg.volume_size),
            ));
        }
        let value_crc = crc32c::crc32c(value);
        let hash = sh.hash(key);
        let header = new_header(0);
        let (pos, seq) = {
            let Some(mut w) = self.writer(wait, record_len) else { return Ok(None) };
            let (pos, loc) = sh.append(&mut w, header, key, value, value_crc)?;
            // A colliding key loses its entry here: it becomes a miss, never a wrong value.
            sh.index.insert(hash, loc);
            (pos, w.appended)
        };
        if sh.cfg.fsync == FsyncPolicy::Always {
            sh.wait_durable(seq)?;
        }
        sh.counters.puts.fetch_add(1, Ordering::Relaxed);
        Ok(Some(pos))
    }

    /// Reads the value of `key`; `Ok(None)` when absent, expired, evicted or unreadable.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        check_key(key)?;
        let sh = &*self.shared;
        let hash = sh.hash(key);
        let found = match sh.index.get(hash) {
            Some(loc) => self.read(hash, loc, key)?,
            None => None,
        };
        let c = if found.is_some() { &sh.counters.hits } else { &sh.counters.misses };
        c.fetch_add(1, Ordering::Relaxed);
        Ok(found)
    }

    fn read(&self, hash: u64, loc: Loc, key: &[u8]) -> Result<Option<Value>> {
        let sh = &*self.shared;
        let slot = &sh.slots[loc.slot as usize];
        let (Some(generation), Some(file)) = (sh.live_generation(loc), slot.file.get()) else {
            return Ok(None);
        };
        let salt = slot.salt.load(Ordering::Acquire);
        let mut buf = vec![0u8; record::size_class_bytes(loc.class) as usize];
        let n = io::read_at_most(file, &mut buf, loc.offset).map_err(|e| Error::io("reading a record", e))?;
        buf.truncate(n);
        let (header, range) = match record::decode(&buf, salt) {
            Ok(r) => (r.header, r.value_range),
            Err(err) => {
                // A slot reused under our feet explains any garbage; otherwise it is damage.
                if slot.generation.load(Ordering::Acquire) == generation {
                    sh.counters.corrupt_reads.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        volume = loc.slot,
                        offset = loc.offset,
                        ?err,
                        "record failed verification; answered as a miss"
                    );
                    sh.index.remove_if_eq(hash, loc);
                }
                return Ok(None);
            }
        };
        let key_ok = &buf[HEADER_LEN..HEADER_LEN + header.key_len as usize] == key;
        if header.generation != generation || !key_ok || header.is_tombstone() {
            return Ok(None);
        }
        if header.expiry_ms != 0 && header.expiry_ms <= now_ms() {
            return Ok(None);
        }
        let position = Position { volume: loc.slot as u32, offset: loc.offset, size: header.record_len() };
        let data = Bytes::from(buf).slice(range.0..range.1);
        Ok(Some(Value { data, position, stored_ms: header.stored_ms, expiry_ms: header.expiry_ms }))
    }

    /// Deletes `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        Ok(self.delete_inner(key, true)?.expect("a delete that may wait completes"))
    }

    /// Like [`Store::delete`], but answers `Ok(None)`, having done nothing, where `delete`
    /// would wait (see [`Store::try_put`]).
    pub fn try_delete(&self, key: &[u8]) -> Result<Option<bool>> {
        self.delete_inner(key, false)
    }

    fn delete_inner(&self, key: &[u8], wait: bool) -> Result<Option<bool>> {
        check_key(key)?;
        let sh = &*self.shared;
        let hash = sh.hash(key);
        let seq = {
            let need = record::padded((HEADER_LEN + key.len()) as u64);
            let Some(mut w) = self.writer(wait, need) else { return Ok(None) };
            let Some(loc) = sh.index.get(hash) else { return Ok(Some(false)) };
            if !sh.key_at(loc, key) {
                return Ok(Some(false));
            }
            sh.append(&mut w, new_header(FLAG_TOMBSTONE), key, b"", crc32c::crc32c(b""))?;
            sh.index.remove_if_eq(hash, loc);
            w.appended
        };
        if sh.cfg.fsync == FsyncPolicy::Always {
            sh.wait_durable(seq)?;
        }
        sh.counters.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(Some(true))
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
            .filter(|s| s.file.get().is_some())
            .fold((0, 0), |(b, v), s| (b + s.len.load(Ordering::Relaxed), v + 1));
        Stats {
            keys: sh.index.len(),
            bytes_used,
            capacity_bytes: sh.cfg.volume_size * sh.cfg.volume_count as u64,
            volumes,
            active_volume: sh.writer.lock().active as u64,
            volume_size: sh.cfg.volume_size,
            volume_count: sh.cfg.volume_count as u64,
            puts: c.puts.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            corrupt_reads: c.corrupt_reads.load(Ordering::Relaxed),
            rotations: c.rotations.load(Ordering::Relaxed),
            evicted_entries: c.evicted_entries.load(Ordering::Relaxed),
            hints_written: c.hints_written.load(Ordering::Relaxed),
            recovery: sh.recovery,
        }
    }

    /// Stops the background threads and makes all data durable. Called by `Drop` too.
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
        self.sync()?;
        let sh = &*self.shared;
        let mut m = sh.manifest.lock();
        m.active_slot = sh.writer.lock().active as u32;
        m.save(&sh.dir).map_err(|e| Error::io("writing the manifest", e))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, "closing the store");
        }
    }
}
