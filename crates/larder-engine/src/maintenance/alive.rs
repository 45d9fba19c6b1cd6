//! The alive stamp: while the store is open, every usable data directory's `ALIVE` file holds
//! a time at most about a second old, so that the next open knows how long the store was down
//! (a cluster node that was away longer than its routers tolerate must not serve what it held).
//!
//! The stamp is overwritten in place (one 64-byte write a second, no fsync): a process killed
//! at any point leaves the last stamp in the page cache. A power cut may leave an older one,
//! or a torn one that fails its checksum: both make the downtime look longer, never shorter,
//! which is the safe side.

use crate::clock::now_ms;
use crate::disk::dirs::DataDir;
use crate::disk::Disk;
use crate::format::alive;
use crate::{io, Result};
use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the stamp is renewed.
pub const EVERY: Duration = Duration::from_secs(1);

/// The newest sound stamp among `dirs`, read before the store opens; `None` if none has one.
pub(crate) fn last_stamp(dirs: &[DataDir]) -> Option<u64> {
    let read = |d: &DataDir| std::fs::read(d.path.join(alive::FILE_NAME)).ok().and_then(|b| alive::decode(&b));
    dirs.iter().filter(|d| d.present).filter_map(read).max()
}

/// How long the store was down, from the last stamp to `now`; `None` when unknown (no stamp,
/// or one in the future: the clock stepped back, so no interval can be trusted).
pub(crate) fn downtime(stamp: Option<u64>, now: u64) -> Option<u64> {
    stamp.filter(|&s| s <= now.saturating_add(EVERY.as_millis() as u64)).map(|s| now.saturating_sub(s))
}

/// At open, before the store is stamped alive: a store down longer than
/// `StoreConfig::max_downtime` (or for a time it cannot know) is flushed as if `flush_all`
/// had been sent when it went down. A failure here fails the open and leaves the old stamp.
pub(crate) fn rejoin(disk: &mut Disk) -> Result<()> {
    let Some(max) = disk.ring.cfg.max_downtime else { return Ok(()) };
    let down = disk.recovery.down_ms;
    if down.is_some_and(|d| d <= max.as_millis() as u64) || disk.index.len() == 0 {
        return Ok(());
    }
    disk.flush_all(0)?;
    disk.recovery.started_empty = true;
    disk.ring.counters.downtime_flushes.fetch_add(1, Ordering::Relaxed);
    let down = down.map_or("an unknown time (no alive stamp)".to_string(), |d| format!("{:.1} s", d as f64 / 1000.0));
    tracing::warn!(
        keys = disk.index.len(),
        "down for {down}, more than the longest downtime allowed ({:.1} s): opened empty, as if flush_all had \
         been sent when it went down",
        max.as_secs_f64()
    );
    Ok(())
}

/// The stamp files of the usable data directories, kept open, and when they were last stamped.
pub(crate) struct Stamps(Vec<io::Handle>, Instant);

impl Stamps {
    /// Opens the stamp files and stamps them: from its return, the store is known open.
    pub fn start(disk: &Disk) -> Stamps {
        let open = |d: &DataDir| match io::open(&d.path.join(alive::FILE_NAME), io::Mode::Create) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(dir = %d.path.display(), error = %e, "cannot write the alive stamp here");
                None
            }
        };
        let stamps = Stamps(disk.ring.dirs.iter().filter(|d| d.usable()).filter_map(open).collect(), Instant::now());
        stamps.stamp();
        stamps
    }

    fn stamp(&self) {
        let b = alive::encode(now_ms());
        for f in &self.0 {
            // A failed stamp only makes the next downtime look longer.
            let _ = f.write_all_vectored_at(&[&b], 0);
        }
    }

    /// Renews the stamps until the store closes, then writes a last one. A wait for the next
    /// renewal that ends more than `max_downtime` (and two renewals) late means the process
    /// did not run that long (paused, starved), which a router may have taken for a node
    /// down: flushed, as a restart after that long would be. Timed by the monotonic clock,
    /// which a step of the wall clock does not move, over the wait alone: the stamp's own
    /// write, which a busy disk may hold up for seconds, is not counted, and nothing the
    /// wait needs is held across I/O (the stop lock is given up by the syncer while it
    /// syncs), so a slow disk never looks like a process that did not run.
    pub fn keep(self, disk: Arc<Disk>) {
        let late = disk.ring.cfg.max_downtime.map(|m| m + 2 * EVERY);
        // From the stamp at open, not from when this thread first runs: a process paused
        // before its new thread was scheduled has not run since then either.
        let mut last = self.1;
        let mut stop = disk.stop.lock();
        while !*stop {
            disk.stop_cv.wait_for(&mut stop, EVERY);
            let gap = last.elapsed();
            if late.is_some_and(|l| gap > l) {
                // Without the stop lock: the syncer takes it, then the writer lock a flush takes.
                match MutexGuard::unlocked(&mut stop, || disk.flush_all(0)) {
                    Ok(()) => {
                        disk.ring.counters.downtime_flushes.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            "the process did not run for {:.1} s, more than the longest downtime allowed: flushed, as \
                             after a restart",
                            gap.as_secs_f64()
                        );
                    }
                    Err(e) => tracing::error!(error = %e, "could not flush after the process stalled"),
                }
            }
            MutexGuard::unlocked(&mut stop, || self.stamp());
            last = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downtime_is_unknown_without_a_stamp_or_with_one_ahead() {
        assert_eq!(downtime(None, 10_000), None);
        assert_eq!(downtime(Some(4_000), 10_000), Some(6_000));
        assert_eq!(downtime(Some(10_500), 10_000), Some(0)); // within a renewal: clock jitter
        assert_eq!(downtime(Some(20_000), 10_000), None);
    }
}
