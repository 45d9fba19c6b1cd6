//! The store-wide flush (memcached's `flush_all`): every value stored before it reads as
//! absent, at once or from a time set in advance. Nothing is erased: a flushed value is
//! judged dead by its store time wherever liveness is decided (reads, preconditions,
//! reinsertion, recovery), like an expired one, and the ring reclaims its space in turn.
//!
//! An immediate flush cuts at a store time stamped under the writer lock, so it covers every
//! write acknowledged before it and none after, even when stamps run ahead of the clock (they
//! do, past a write per millisecond). A delayed flush is a clock time; the first stamp after
//! it turns it into a cut in store-time space (every stamp issued before is covered), and until
//! then a reader past the deadline counts every stamp issued so far as flushed. The flushes in
//! force are saved (`FLUSHED`, in every data directory) before the flush returns and when a
//! deadline turns into a cut, and recovery seeds the stamp above the cut.

use super::dirs::{self, DataDir};
use super::{Disk, Writer};
use crate::format::flush::{Flush, FILE_NAME};
use crate::Result;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The flushes in force, read without a lock on every liveness check.
pub(crate) struct Flushes {
    /// Values stored before this store time are flushed.
    cut: AtomicU64,
    /// From this clock time on, values stored before it are flushed; 0 = none pending.
    deadline: AtomicU64,
    /// The last saved state, for the next save's epoch.
    saved: Mutex<Flush>,
    /// The newest store time issued (mirrors the writer's, for readers without its lock).
    issued: AtomicU64,
}

impl Flushes {
    pub fn new(f: Flush) -> Flushes {
        Flushes {
            cut: AtomicU64::new(f.cut_ms),
            deadline: AtomicU64::new(f.deadline_ms),
            saved: Mutex::new(f),
            issued: AtomicU64::new(0),
        }
    }

    /// The saved flushes of the store: the copy with the highest epoch among `dirs`. A copy
    /// that fails its checksum, with no sound one beside it, is taken as a flush of
    /// everything stored before now: a cache may lose values, but must not bring flushed
    /// ones back.
    pub fn load(dirs: &[DataDir]) -> Flush {
        let mut damaged = false;
        let mut best: Option<Flush> = None;
        for d in dirs.iter().filter(|d| d.present) {
            let Ok(bytes) = std::fs::read(d.path.join(FILE_NAME)) else { continue };
            match Flush::decode(&bytes) {
                Some(f) if best.is_none_or(|b| f.epoch > b.epoch) => best = Some(f),
                Some(_) => {}
                None => damaged = true,
            }
        }
        match best {
            Some(f) => f,
            None if damaged => {
                tracing::error!("the flush file fails its checksum: every value stored before now is taken as flushed");
                Flush { epoch: 1, cut_ms: crate::clock::now_ms(), deadline_ms: 0 }
            }
            None => Flush::default(),
        }
    }

    /// Whether a value stored at `stored_ms` is flushed at clock time `now`.
    pub fn flushed(&self, stored_ms: u64, now: u64) -> bool {
        // In this order: a stamp issued after a deadline turned into a cut is seen with that
        // cut and with the deadline gone (the writer stores the cut, clears the deadline,
        // then issues the stamp).
        let issued = self.issued.load(Ordering::Acquire);
        let d = self.deadline.load(Ordering::Acquire);
        if stored_ms < self.cut.load(Ordering::Acquire) {
            return true;
        }
        // Past a deadline no stamp has been issued since: every stamp issued was before it.
        d != 0 && now >= d && (stored_ms < d || stored_ms <= issued)
    }

    /// Turns a deadline that has come into a cut above `last` (the newest store time issued,
    /// all of them before the deadline) and saves it; `false` if the save failed (the deadline
    /// then stays, and is tried again).
    fn settle(&self, now: u64, last: u64, dirs: &[DataDir]) -> bool {
        let d = self.deadline.load(Ordering::Acquire);
        if d == 0 || now < d {
            return true;
        }
        let mut next = *self.saved.lock();
        next.cut_ms = next.cut_ms.max(d).max(last + 1);
        next.deadline_ms = 0;
        next.epoch += 1;
        if let Err(e) = dirs::save_everywhere(dirs, FILE_NAME, &next.encode(), "the flush file") {
            tracing::warn!(error = %e, "could not save a delayed flush that came due; it stays in force");
            return false;
        }
        self.cut.store(next.cut_ms, Ordering::Release);
        self.deadline.store(0, Ordering::Release);
        *self.saved.lock() = next;
        true
    }

    /// The store times below which values are flushed at `now`: new writes are stamped above
    /// it (a deadline not yet reached must still cover them).
    pub fn floor(&self, now: u64) -> u64 {
        let d = self.deadline.load(Ordering::Acquire);
        self.cut.load(Ordering::Acquire).max(if now >= d { d } else { 0 })
    }
}

impl Disk {
    /// A new store time, under the writer lock: a delayed flush that has come is first turned
    /// into a cut covering every stamp issued before it.
    pub fn stamp(&self, w: &mut Writer) -> u64 {
        let f = &self.flushes;
        if f.deadline.load(Ordering::Relaxed) != 0 {
            f.settle(crate::clock::now_ms(), w.last_stamp, &self.ring.dirs);
        }
        let s = w.stamp();
        f.issued.store(s, Ordering::Release);
        s
    }

    /// At open: the newest store time recovered is the writer's last; a deadline that came
    /// while the store was closed turns into a cut above it.
    pub fn settle_flushes(&self, last: u64) {
        self.flushes.issued.store(last, Ordering::Release);
        self.flushes.settle(crate::clock::now_ms(), last, &self.ring.dirs);
    }

    /// Flushes every value stored before now (`delay_ms` = 0), or from `delay_ms` on every
    /// value stored before then. As memcached's `flush_all`, a new flush replaces one still
    /// pending; one already in force stays. Returns once the flush is saved.
    pub fn flush_all(&self, delay_ms: u64) -> Result<()> {
        let mut w = self.writer.lock();
        let now = crate::clock::now_ms();
        let f = &self.flushes;
        // A deadline already reached becomes a cut before it can be replaced.
        f.settle(now, w.last_stamp, &self.ring.dirs);
        let mut next = *f.saved.lock();
        if next.deadline_ms != 0 && now >= next.deadline_ms {
            next.cut_ms = next.cut_ms.max(next.deadline_ms).max(w.last_stamp + 1);
        }
        if delay_ms == 0 {
            // Under the writer lock: every write acknowledged so far has a lower stamp, and
            // every later one a higher.
            next.cut_ms = next.cut_ms.max(self.stamp(&mut w));
            next.deadline_ms = 0;
        } else {
            next.deadline_ms = now.saturating_add(delay_ms);
        }
        next.epoch += 1;
        dirs::save_everywhere(&self.ring.dirs, FILE_NAME, &next.encode(), "the flush file")?;
        f.cut.store(next.cut_ms, Ordering::Release);
        f.deadline.store(next.deadline_ms, Ordering::Release);
        *f.saved.lock() = next;
        drop(w);
        Ok(())
    }

    /// Whether a value with this store time and expiry (0 = none) is dead at `now`: expired,
    /// or flushed.
    pub fn dead(&self, stored_ms: u64, expiry_ms: u64, now: u64) -> bool {
        (expiry_ms != 0 && expiry_ms <= now) || self.flushes.flushed(stored_ms, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_flushes_at_once_and_a_deadline_from_its_time() {
        let f = Flushes::new(Flush { epoch: 1, cut_ms: 100, deadline_ms: 500 });
        assert!(f.flushed(99, 0) && !f.flushed(100, 0));
        assert!(!f.flushed(400, 499), "a deadline not yet reached flushes nothing");
        assert!(f.flushed(400, 500) && !f.flushed(500, 500) && !f.flushed(600, 900));
        // Stamps ahead of the clock, issued before the deadline, are covered too.
        f.issued.store(700, Ordering::Release);
        assert!(f.flushed(700, 500) && !f.flushed(701, 500));
        assert_eq!((f.floor(499), f.floor(500)), (100, 500));
    }
}
