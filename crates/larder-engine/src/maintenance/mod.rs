//! Background work, on one thread of low priority: hint files for sealed volumes, sweeping
//! the index of entries whose volume the ring reused, reinsertion, manifest updates; and,
//! with `FsyncPolicy::Every`, the syncer thread; and the alive stamp's thread.

pub(crate) mod alive;
mod hint;
mod reinsert;

pub(crate) use hint::write_hint;

use crate::disk::{Disk, Job};
use crate::io;
use crate::memory::Memory;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub(crate) fn run(disk: Arc<Disk>, memory: Option<Arc<Memory>>, rx: mpsc::Receiver<Job>) {
    io::lower_thread_priority();
    while let Ok(job) = rx.recv() {
        // A bug in one job must not stop sweeps and hints for the life of the process.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_job(&disk, memory.as_deref(), job)));
        if done.is_err() {
            tracing::error!("a maintenance job panicked; continuing with the next one");
        }
    }
}

fn run_job(disk: &Disk, memory: Option<&Memory>, job: Job) {
    match job {
        Job::Hint { slot, generation, sequence, len, through } => {
            if let Err(e) = hint::write_hint(disk, slot, generation, sequence, len, through) {
                tracing::warn!(slot, error = %e, "could not write a hint file; recovery will scan the volume");
            }
        }
        Job::Reinsert { slot, generation } => reinsert::reinsert(disk, memory, slot, generation),
        Job::Barrier(done) => {
            let _ = done.send(());
        }
        Job::Sweep => {
            let removed = disk.index.retain(|l| disk.ring.live_generation(l).is_some());
            let slots = &disk.ring.slots;
            disk.heads.retain(|slot, g| slots[slot as usize].generation.load(Ordering::Acquire) == g);
            disk.ring.counters.evicted_entries.fetch_add(removed, Ordering::Relaxed);
            disk.collect_dictionaries();
        }
        Job::Punch { head, generation, after } => punch(disk, head, generation, after),
        Job::Replaced { loc, hash, after } => {
            disk.count_replaced(disk.ring.key_hash_at(loc, false).flatten(), loc, hash, after)
        }
        Job::Manifest => {
            if let Err(e) = crate::disk::dirs::save_manifest(&mut disk.ring.manifest.lock(), &disk.ring.dirs) {
                tracing::warn!(error = %e, "could not update the manifest");
            }
        }
    }
}

/// Frees the disk blocks of the chunks of the large value whose head is at `head`: the
/// whole pages of each chunk's body, whose record verifies as this value's chunk. Its header
/// stays, so that recovery and `larder check` read a chunk whose body is a hole (free space)
/// and never meet bare zeros, which they count as damage. Not before the write that retired
/// the value (append number `after`) is durable, whatever the fsync policy, nor while a reader
/// streams the value.
fn punch(disk: &Disk, head: crate::index::Loc, generation: u32, after: u64) {
    use crate::format::large;
    if disk.punch_waits(head, generation, after) {
        return; // the last reader sends it again
    }
    if after > 0 && disk.wait_durable(after).is_err() {
        return; // the ring frees the space when it comes round
    }
    // Hash 0: the head is no longer indexed, and damage here only counts.
    let Ok(crate::disk::Fetch::Record(r)) = disk.fetch(0, head, false) else { return };
    if !r.header.is_head() || r.header.generation != generation {
        return;
    }
    let Some(chunks) = large::decode(r.value()) else { return };
    for c in &chunks {
        // Only bytes that still are this value's chunk: the record there must verify (its
        // salted header checksum), be a chunk, of this key and of the length the table says.
        let cloc = disk.ring.loc(c.slot as usize, c.generation, c.offset, c.record_len as u64);
        let h = match disk.ring.holds(c).then(|| disk.ring.header_at(cloc, r.key())) {
            Some(Ok(Some(h))) if h.is_chunk() && h.record_len() == c.record_len as u64 => h,
            _ => continue,
        };
        let Some((from, to)) = large::punched_range(c.offset, &h) else { continue };
        // A slot's bytes change only when the ring restarts it, under the writer lock: with
        // the volume unchanged under the lock, what was verified above is still there. One
        // chunk at a time, so that writes wait for one `fallocate` at most.
        let _w = disk.writer.lock();
        if !disk.ring.holds(c) {
            continue; // the ring reused it: nothing of the value is left there
        }
        let Some(file) = disk.ring.slots[c.slot as usize].file() else { continue };
        match file.punch_hole(from, to - from) {
            Ok(()) => {
                disk.ring.counters.punched_bytes.fetch_add(to - from, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(slot = c.slot, error = %e, "could not free a dead value's chunks; the ring will");
                return;
            }
        }
    }
}

pub(crate) fn syncer(disk: Arc<Disk>, every: Duration) {
    let mut stop = disk.stop.lock();
    while !*stop {
        disk.stop_cv.wait_for(&mut stop, every);
        // Without the stop lock: the alive thread waits on it, and a sync may take seconds on
        // a slow disk (which must never look like a process that did not run).
        parking_lot::MutexGuard::unlocked(&mut stop, || {
            let appended = disk.writer.lock().appended;
            if appended > disk.synced() {
                let _ = disk.wait_durable(appended);
            }
        });
    }
}
