//! Durability: group commit (concurrent writers share one fdatasync) and, with
//! `FsyncPolicy::Always`, the undo of the index changes whose sync failed.

use super::Disk;
use crate::index::Loc;
use crate::{Error, ErrorKind, Result};
use std::sync::atomic::Ordering;

/// An index change to undo: the entry for `hash` went from `before` to `after`.
pub(crate) struct Undo {
    pub hash: u64,
    pub key: Box<[u8]>,
    pub before: Option<Loc>,
    pub after: Option<Loc>,
}

/// Whether two optional index entries name the same record (read counts aside).
pub(crate) fn same(a: Option<Loc>, b: Option<Loc>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.same_place(b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

#[derive(Default)]
pub(crate) struct DurableState {
    synced: u64,
    /// The highest append count a sync has been attempted for.
    attempted: u64,
    /// The append ranges `(after, through]` whose sync failed (the most recent 1024 runs).
    failed: std::collections::VecDeque<(u64, u64)>,
    syncing: bool,
}

impl Disk {
    /// The append count the last successful sync covered.
    pub fn synced(&self) -> u64 {
        self.durable.lock().synced
    }

    /// Blocks until append number `seq` is durable (group commit).
    pub fn wait_durable(&self, seq: u64) -> Result<()> {
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

    /// Blocks until appends `first..=last` are durable: the sync that covered `last` succeeded
    /// and none that covered an append in between failed (a later success does not vouch for
    /// pages whose writeback failed). For a large value's chunks, with other writes among them.
    pub fn durable_span(&self, first: u64, last: u64) -> Result<()> {
        self.wait_durable(last)?;
        if self.durable.lock().failed.iter().any(|&(after, through)| after < last && through >= first) {
            return Err(Error::new(ErrorKind::Io, "fdatasync failed; a chunk of the value may not be durable"));
        }
        Ok(())
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
            if let Some(f) = self.ring.slots[slot].file() {
                let started = std::time::Instant::now();
                let r = f.sync_data();
                // A no-op unless the embedding program installed a `metrics` recorder.
                metrics::histogram!("larder_fsync_duration_seconds").record(started.elapsed().as_secs_f64());
                if let Err(e) = r {
                    self.ring.fail_dir_of(slot, &e);
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
                self.ring.slots[*slot].dir().is_some_and(|d| !self.ring.dirs[d].usable() && self.ring.another_usable(d))
            };
            w.unsynced.extend(slots.into_iter().filter(|s| !dead(s)));
            // The writes this sync covered are answered as failed, so their keys must keep
            // their previous values: undo their index changes, newest first, under the writer
            // lock so no append interleaves. A later write of the same key wins the compare.
            for u in undo.iter().rev() {
                if let Some(loc) = u.after {
                    let slot = loc.slot as usize;
                    let stray = (slot, self.ring.slots[slot].generation.load(Ordering::Relaxed));
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
                (self.forget)(u.hash, &u.key);
            }
            self.ring.counters.sync_failures.fetch_add(1, Ordering::Relaxed);
        }
        (target, result)
    }
}
