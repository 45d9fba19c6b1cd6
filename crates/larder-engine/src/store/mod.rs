//! The public `Store`: put, get and delete over the disk engine and the memory tier.
//!
//! Concurrency: one writer at a time appends under the writer lock (see `disk`). Readers never
//! take that lock: they look up the index (a shard lock held for a few probes) and read with a
//! positional read on a file opened once. A record becomes visible in the index only after
//! its write returned.
//!
//! Durability: `FsyncPolicy::Always` makes each put and delete wait for an fdatasync that
//! covers it; concurrent writers share one fdatasync (group commit).

mod cas;
mod coding;
mod keys;
mod open;
mod read;
mod stream;
mod train;
mod write;

pub use keys::{KeyCursor, KeyInfo};
pub use stream::{ValueReader, ValueWriter};

use crate::config::StoreConfig;
use crate::disk::{dirs, Disk, Job, Seen};
use crate::memory::flight::Flights;
use crate::memory::Memory;
use crate::stats::{DirState, DirStats, Stats};
use crate::types::{Codec, DeleteOptions, Expiry, PutOptions, ReadOptions, Stored, Touch, Value, Version};
use crate::{io, Error, Result};
use parking_lot::Mutex;
use read::Found;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// The storage engine: a ring of volume files and an in-memory index. Cheap to share by
/// reference across threads; all methods take `&self`.
pub struct Store {
    disk: Arc<Disk>,
    memory: Option<Arc<Memory>>,
    flights: Flights<Seen, Found>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// With `Compression::dictionary`: the prefixes and the training of their dictionaries.
    trainer: Option<Arc<train::Trainer>>,
}

impl Store {
    /// The configuration in force (sizes after clamping).
    pub fn config(&self) -> &StoreConfig {
        &self.disk.ring.cfg
    }

    /// Stores `value` under `key`, replacing any previous value, with the expiry, content type
    /// and preconditions of `opts` (preconditions are checked atomically with the write;
    /// `ErrorKind::PreconditionFailed` when one does not hold).
    ///
    /// Returns once the record is written (and, with `FsyncPolicy::Always`, durable).
    pub fn put(&self, key: &[u8], value: &[u8], opts: &PutOptions<'_>) -> Result<Stored> {
        self.put_parts(key, &[value], opts)
    }

    /// The expiry time a write of `key` at clock time `now` gets when it asks for
    /// `expiry_ms`, cut where `StoreConfig::expiry_cap` applies; and whether it applies (the
    /// caller counts the write once it has landed: [`Store::count_capped`]).
    pub(crate) fn capped(&self, key: &[u8], expiry_ms: u64, now: u64) -> (u64, bool) {
        match &self.disk.ring.cfg.expiry_cap {
            Some(cap) => cap.apply(key, expiry_ms, now),
            None => (expiry_ms, false),
        }
    }

    /// Counts a write the expiry cap applied to, once it is in the index.
    pub(crate) fn count_capped(&self, applied: bool) {
        if applied {
            self.disk.ring.counters.capped_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A content-addressed value's check, counted when it refuses the value.
    pub(crate) fn cas_verdict(&self, check: cas::Check) -> Result<()> {
        let verdict = check.verdict();
        if verdict.is_err() {
            self.disk.ring.counters.cas_refused.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Whether a value of `len` bytes may enter the memory tier (`MemoryConfig::max_value`).
    pub(crate) fn memory_takes(&self, len: u64) -> bool {
        let cfg = &self.disk.ring.cfg;
        let most = match cfg.memory.max_value {
            0 => cfg.chunk_size,
            n => n.min(cfg.chunk_size),
        };
        len <= most
    }

    /// [`Store::put`] of the value made of `parts` in order (a request body as it arrived):
    /// they are checksummed and written as they are, with one vectored write, never joined
    /// (a value longer than a chunk joins only the chunks that span parts).
    pub fn put_parts(&self, key: &[u8], parts: &[&[u8]], opts: &PutOptions<'_>) -> Result<Stored> {
        self.put_inner(key, parts, opts, !opts.nonblocking, None)?.ok_or_else(Error::would_block)
    }

    /// Stores the value that `coded`, the value coded with `codec` by the caller (an HTTP
    /// body sent with `Content-Encoding: zstd`), decodes to, keeping the coded bytes as they
    /// are: a reader that takes them (`ReadOptions::coded`) gets exactly these bytes. Fails
    /// with `Invalid` when they are not whole frames of the codec (only Zstandard is taken)
    /// and `TooLarge` when the value is longer than a chunk.
    pub fn put_coded(&self, key: &[u8], codec: Codec, coded: &[u8], opts: &PutOptions<'_>) -> Result<Stored> {
        self.put_coded_inner(key, codec, coded, opts, !opts.nonblocking, None)?.ok_or_else(Error::would_block)
    }

    /// Reads the value of `key`, or the part of it `opts` asks for; `Ok(None)` when absent,
    /// expired, evicted or unreadable.
    ///
    /// Looks in the memory tier first. A disk read of a whole value that another thread is
    /// already making for the same record is shared rather than repeated.
    pub fn get(&self, key: &[u8], opts: &ReadOptions) -> Result<Option<Value>> {
        self.get_part_inner(key, opts.part, !opts.nonblocking, opts.coded)?.ok_or_else(Error::would_block)
    }

    /// Deletes `key` if the preconditions of `opts` hold for its current value (checked
    /// atomically with the delete); returns whether it was present.
    pub fn delete(&self, key: &[u8], opts: &DeleteOptions<'_>) -> Result<bool> {
        self.delete_inner(key, opts.preconditions, !opts.nonblocking)?.ok_or_else(Error::would_block)
    }

    /// Gives the live value of `key` a new expiry, keeping its bytes, flags and version;
    /// returns the version, or `None` when the key has no live value (memcached's `touch`).
    pub fn touch(&self, key: &[u8], expiry: Expiry) -> Result<Option<Version>> {
        self.touch_inner(key, &Touch { expiry, attrs: None, stored_at: None })
    }

    /// [`Store::touch`] that may also replace the value's attributes (`Touch::attrs`) and
    /// applies only to the value stored at `Touch::stored_at` when that is given: read-through
    /// mode refreshes a stored response's headers after a 304 without rewriting its body, and
    /// never onto a response stored since it asked.
    pub fn update(&self, key: &[u8], touch: &Touch<'_>) -> Result<Option<Version>> {
        if let Some(a) = touch.attrs {
            write::check_attrs(a)?;
        }
        self.touch_inner(key, touch)
    }

    /// Flushes the store (memcached's `flush_all`): with no delay, every value stored before
    /// the call reads as absent from its return; with one, every value stored before that
    /// time does from then on (a later flush replaces one still pending). Saved before it
    /// returns, so it holds across a restart. Nothing is erased: the ring reclaims the space.
    pub fn flush_all(&self, delay: std::time::Duration) -> Result<()> {
        self.disk.flush_all(delay.as_millis() as u64)
    }

    /// Waits until the background work queued so far (hint files, index sweeps,
    /// reinsertion) has run. For tests and benchmarks that want a settled state.
    pub fn settle(&self) {
        let (tx, rx) = mpsc::channel();
        self.disk.send(Job::Barrier(tx));
        let _ = rx.recv();
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> Result<()> {
        let appended = self.disk.writer.lock().appended;
        self.disk.wait_durable(appended)
    }

    /// Current counters and gauges.
    pub fn stats(&self) -> Stats {
        let sh = &*self.disk;
        let c = &sh.ring.counters;
        let (bytes_used, volumes) = sh
            .ring
            .slots
            .iter()
            .filter(|s| s.file().is_some())
            .fold((0, 0), |(b, v), s| (b + s.len.load(Ordering::Relaxed), v + 1));
        let (_, memory_logical_bytes, memory_value_bytes) = self.memory.as_ref().map_or((0, 0, 0), |m| m.held.get());
        let (memory_bytes, memory_entries, memory_capacity, admission_tracked) =
            self.memory.as_ref().map_or((0, 0, 0, 0), |m| m.usage());
        let slots = sh
            .ring
            .slots
            .iter()
            .map(|s| crate::stats::SlotStats {
                generation: s.generation.load(Ordering::Relaxed),
                dir: s.dir(),
                bytes: if s.file().is_some() { s.len.load(Ordering::Relaxed) } else { 0 },
                // A sequence is the volume's start in ms × 1024 (`clock::sequence_after`).
                started_ms: s.sequence.load(Ordering::Relaxed) >> 10,
            })
            .collect();
        Stats {
            slots,
            keys: sh.index.len(),
            bytes_used,
            capacity_bytes: sh.ring.cfg.volume_size * sh.ring.cfg.volume_count as u64,
            volumes,
            active_volume: sh.active.load(Ordering::Relaxed) as u64,
            volume_size: sh.ring.cfg.volume_size,
            volume_count: sh.ring.cfg.volume_count as u64,
            puts: c.puts.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            memory_hits: self.memory.as_ref().map_or(0, |m| m.hits.load(Ordering::Relaxed)),
            disk_reads: c.disk_reads.load(Ordering::Relaxed),
            coalesced_reads: c.coalesced_reads.load(Ordering::Relaxed),
            promotions: self.memory.as_ref().map_or(0, |m| m.promotions.load(Ordering::Relaxed)),
            memory_capacity,
            memory_bytes,
            memory_logical_bytes,
            memory_value_bytes,
            memory_entries,
            admission_tracked,
            reinsert_candidates: c.reinsert_candidates.load(Ordering::Relaxed),
            reinserted: c.reinserted.load(Ordering::Relaxed),
            reinserted_bytes: c.reinserted_bytes.load(Ordering::Relaxed),
            reinsert_over_budget: c.reinsert_over_budget.load(Ordering::Relaxed),
            reinsert_skipped: c.reinsert_skipped.load(Ordering::Relaxed),
            reinsert_in_memory: c.reinsert_in_memory.load(Ordering::Relaxed),
            corrupt_reads: c.corrupt_reads.load(Ordering::Relaxed),
            collision_reads: c.collision_reads.load(Ordering::Relaxed),
            false_evictions: c.false_evictions.load(Ordering::Relaxed) + sh.index.dropped(),
            index_bytes: sh.index.bytes(),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            sync_failures: c.sync_failures.load(Ordering::Relaxed),
            read_failures: c.read_failures.load(Ordering::Relaxed),
            punched_bytes: c.punched_bytes.load(Ordering::Relaxed),
            capped_writes: c.capped_writes.load(Ordering::Relaxed),
            cas_refused: c.cas_refused.load(Ordering::Relaxed),
            downtime_flushes: c.downtime_flushes.load(Ordering::Relaxed),
            coded_puts: c.coded_puts.load(Ordering::Relaxed),
            coded_logical_bytes: c.coded_logical_bytes.load(Ordering::Relaxed),
            coded_stored_bytes: c.coded_stored_bytes.load(Ordering::Relaxed),
            raw_probed: c.raw_probed.load(Ordering::Relaxed),
            raw_no_gain: c.raw_no_gain.load(Ordering::Relaxed),
            decode_failures: c.decode_failures.load(Ordering::Relaxed),
            allocated_bytes: sh.ring.slots.iter().filter_map(|s| s.file()?.allocated().ok()).sum(),
            rotations: c.rotations.load(Ordering::Relaxed),
            volumes_evicted: c.volumes_evicted.load(Ordering::Relaxed),
            evicted_entries: c.evicted_entries.load(Ordering::Relaxed),
            hints_written: c.hints_written.load(Ordering::Relaxed),
            recovery: sh.recovery,
            degraded: sh.ring.degraded,
            dirs: sh
                .ring
                .dirs
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let here = sh.ring.slots.iter().filter(|s| s.dir() == Some(i) && s.len.load(Ordering::Relaxed) > 0);
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
            dictionaries: self.dictionary_stats(),
            held: sh.held.stats(&sh.slot_fill()),
        }
    }

    fn dictionary_stats(&self) -> crate::stats::DictionaryStats {
        let (d, t) = (&self.disk.dicts, self.trainer.as_deref());
        let n = |f: fn(&train::Trainer) -> &std::sync::atomic::AtomicU64| t.map_or(0, |t| f(t).load(Ordering::Relaxed));
        crate::stats::DictionaryStats {
            trained: n(|t| &t.trained),
            retrains: n(|t| &t.retrains),
            training_failures: n(|t| &t.failures),
            removed: d.removed.load(Ordering::Relaxed),
            damaged_files: d.damaged_files.load(Ordering::Relaxed),
            each: d
                .all()
                .iter()
                .map(|x| crate::stats::DictionaryInfo {
                    id: x.id(),
                    key_prefix: String::from_utf8_lossy(&x.key_prefix).into_owned(),
                    bytes: x.len as u64,
                    created_ms: x.created_ms,
                    retired: x.retired(),
                    values: x.values.load(Ordering::Relaxed),
                    logical_bytes: x.logical_bytes.load(Ordering::Relaxed),
                    stored_bytes: x.stored_bytes.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }

    /// Stops the background threads, makes all data durable and writes the checkpoint of the
    /// active volume. Called by `Drop` too.
    pub fn close(&self) -> Result<()> {
        if let Some(t) = &self.trainer {
            t.finish();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        if threads.is_empty() {
            return Ok(());
        }
        self.disk.set_jobs(None);
        *self.disk.stop.lock() = true;
        self.disk.stop_cv.notify_all();
        for t in threads {
            let _ = t.join();
        }
        let sh = &*self.disk;
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
        let s = &sh.ring.slots[active];
        let (generation, sequence) = (s.generation.load(Ordering::Acquire), s.sequence.load(Ordering::Relaxed));
        if let Err(e) = crate::maintenance::write_hint(sh, active, generation, sequence, offset, None) {
            tracing::warn!(slot = active, error = %e, "could not write the checkpoint; the next start scans the volume");
        }
        let mut m = sh.ring.manifest.lock();
        m.active_slot = active as u32;
        dirs::save_manifest(&mut m, &sh.ring.dirs)
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
    use std::time::Duration;

    #[test]
    fn concurrent_reads_of_a_cold_key_share_one_disk_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = StoreConfig::new(dir.path());
        (cfg.volume_size, cfg.volume_count) = (1 << 20, 2);
        cfg.memory.promote_after = 1_000; // keep memory out of it: every get goes to disk
        let store = Store::open(cfg).unwrap();
        let value: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
        store.put(b"cold", &value, &PutOptions::default()).unwrap();
        let before = store.stats();
        // The leader is held inside its read (a slow device) until the 63 others have joined.
        let lead = crate::pause::arm("flight.lead", b"cold");
        let barrier = Barrier::new(64);
        std::thread::scope(|s| {
            for _ in 0..64 {
                s.spawn(|| {
                    barrier.wait();
                    let v = store.get(b"cold", &ReadOptions::default()).unwrap().expect("stored");
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
        // With no flight in the air, a non-blocking get answers inline from the page cache.
        assert!(store.get(b"cold", &ReadOptions { nonblocking: true, ..Default::default() }).unwrap().is_some());
    }
}
