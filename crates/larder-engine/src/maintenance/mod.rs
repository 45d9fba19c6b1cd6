//! Background work, on one thread of low priority: hint files for sealed volumes, sweeping
//! the index of entries whose volume the ring reused, reinsertion, manifest updates; and,
//! with `FsyncPolicy::Every`, the syncer thread.

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
            disk.ring.counters.evicted_entries.fetch_add(removed, Ordering::Relaxed);
        }
        Job::Manifest => {
            if let Err(e) = crate::disk::dirs::save_manifest(&mut disk.ring.manifest.lock(), &disk.ring.dirs) {
                tracing::warn!(error = %e, "could not update the manifest");
            }
        }
    }
}

pub(crate) fn syncer(disk: Arc<Disk>, every: Duration) {
    let mut stop = disk.stop.lock();
    while !*stop {
        disk.stop_cv.wait_for(&mut stop, every);
        let appended = disk.writer.lock().appended;
        if appended > disk.synced() {
            let _ = disk.wait_durable(appended);
        }
    }
}
