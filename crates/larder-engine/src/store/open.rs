//! Opening a store: the directories, recovery, the disk engine built from what recovery
//! rebuilt, the memory tier, and the background threads.

use super::Store;
use crate::clock::{now_ms, sequence_after};
use crate::config::{FsyncPolicy, StoreConfig, MIN_VOLUME_SIZE};
use crate::disk::{dirs, Disk, Flushes, Forget, Job, Ring, Start};
use crate::format::record::{HEADER_LEN, MAX_KEY_LEN, MAX_META_LEN};
use crate::format::volume::VOLUME_HEADER_LEN;
use crate::index::{MAX_SLOTS, MAX_VOLUME_SIZE};
use crate::memory::flight::Flights;
use crate::memory::Memory;
use crate::stats::RecoveryProgress;
use crate::{recovery, Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

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
        // Any chunk record fits in a volume (longest key and metadata included); tiny chunks
        // make huge tables. Volumes too small for a 4 KiB chunk hold every value whole.
        // (and its length fits the record header's 32 bits).
        let fits = cfg
            .volume_size
            .saturating_sub(VOLUME_HEADER_LEN + (HEADER_LEN + MAX_KEY_LEN + MAX_META_LEN) as u64)
            .min(u32::MAX as u64 / 2);
        if fits < 4096 {
            cfg.chunk_size = u64::MAX;
        } else if !(4096..=fits).contains(&cfg.chunk_size) {
            let c = cfg.chunk_size.clamp(4096, fits);
            tracing::warn!(asked = cfg.chunk_size, using = c, "chunk size out of range");
            cfg.chunk_size = c;
        }
        // A value longer than a chunk spans volumes; a quarter of the ring keeps room for others
        // (a value of one record, up to a chunk, is allowed in any ring: it needs one volume).
        // A larger value could reach round onto its own first chunk. Without chunks a value
        // must fit in one volume, which each put checks.
        let ring = cfg.volume_size * cfg.volume_count as u64;
        let most = (ring / 4).max(cfg.chunk_size);
        if cfg.chunk_size != u64::MAX && cfg.max_value_size > most {
            tracing::warn!(asked = cfg.max_value_size, using = most, "largest value above a quarter of the ring");
            cfg.max_value_size = most;
        }
        if let (Some(_), codec) = (cfg.compression.dictionary, cfg.compression.codec) {
            if codec != Some(crate::types::Codec::Zstd) {
                return Err(Error::new(
                    crate::ErrorKind::Invalid,
                    "dictionaries are zstd's: they need zstd compression",
                ));
            }
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
        let flushes = Flushes::new(Flushes::load(&dirs));
        // Read before recovery: the time it takes is downtime too.
        let alive = crate::maintenance::alive::last_stamp(&dirs);
        let ring = Ring::new(cfg, manifest, dirs, opened.missing);
        let mut rec = recovery::recover(&ring, &flushes, hints_trusted, progress)?;
        rec.report.down_ms = crate::maintenance::alive::downtime(alive, now_ms());
        // Store times go on from the newest stored: a clock stepped back (or a restart within
        // the millisecond of the last write) never repeats a version's stamp.
        let ahead = rec.max_stored_ms.saturating_sub(now_ms());
        if ahead > 60_000 {
            tracing::warn!(
                seconds = ahead / 1000,
                "stored versions are newer than the clock (it stepped back, or was once ahead): \
                 new writes are stamped after the newest, not by the clock"
            );
        }
        let memory = Memory::new(&ring.cfg.memory).map(Arc::new);
        // The disk engine drops a key from memory through this (expiry, the undo of a failed
        // sync): memory sits above it, so it is handed down rather than imported.
        let forget: Forget = match &memory {
            Some(m) => {
                let m = m.clone();
                Box::new(move |hash, key| m.forget(hash, key))
            }
            None => Box::new(|_, _| {}),
        };
        let (slot, offset) = rec.active.unwrap_or((rec.start_slot, VOLUME_HEADER_LEN));
        // Above a flush's cut, so that no new write is taken for one stored before it.
        let last_stamp = rec.max_stored_ms.max(flushes.floor(now_ms()));
        let start = Start { slot, offset, next_sequence: rec.next_sequence, last_stamp };
        let level = match ring.cfg.compression.codec {
            Some(crate::types::Codec::Zstd) => ring.cfg.compression.level,
            _ => zstd::DEFAULT_COMPRESSION_LEVEL,
        };
        let dicts = crate::disk::dicts::Dicts::load(&ring.dirs, level);
        let mut disk = Disk::new(ring, rec.index, start, rec.report, forget, flushes, dicts);
        for (slot, generation, offset) in rec.heads {
            disk.heads.insert(slot, generation, offset);
        }
        disk.settle_flushes(last_stamp);
        if rec.active.is_none() {
            // A new store, or one whose newest volume is in a missing directory: a new volume
            // in the slot after the newest.
            let sequence = sequence_after(rec.next_sequence);
            disk.start_fresh(slot, sequence, now_ms().max(rec.max_stored_ms))?;
        }
        {
            let active = disk.writer.get_mut().active;
            let ring = &mut disk.ring;
            let m = ring.manifest.get_mut();
            m.active_slot = active as u32;
            dirs::save_manifest(m, &ring.dirs)?;
        }

        // Before the store is stamped alive (below), so that a failure leaves the old stamp.
        crate::maintenance::alive::rejoin(&mut disk)?;
        let disk = Arc::new(disk);
        let (tx, rx) = mpsc::channel();
        disk.set_jobs(Some(tx));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io(format!("starting {name}"), e))
        };
        let (d, m) = (disk.clone(), memory.clone());
        let mut threads = vec![spawn("larder-maint", Box::new(move || crate::maintenance::run(d, m, rx)))?];
        let (d, stamps) = (disk.clone(), crate::maintenance::alive::Stamps::start(&disk));
        threads.push(spawn("larder-alive", Box::new(move || stamps.keep(d)))?);
        if let FsyncPolicy::Every(every) = disk.ring.cfg.fsync {
            let d = disk.clone();
            threads.push(spawn("larder-sync", Box::new(move || crate::maintenance::syncer(d, every)))?);
        }
        for slot in rec.unhinted {
            let s = &disk.ring.slots[slot];
            disk.send(Job::Hint {
                slot,
                generation: s.generation.load(Ordering::Relaxed),
                sequence: s.sequence.load(Ordering::Relaxed),
                len: s.len.load(Ordering::Relaxed),
                through: None,
            });
        }
        let trainer =
            disk.ring.cfg.compression.dictionary.map(|d| Arc::new(super::train::Trainer::new(d, &disk.dicts.all())));
        Ok(Store { disk, memory, flights: Flights::default(), threads: Mutex::new(threads), trainer })
    }
}
