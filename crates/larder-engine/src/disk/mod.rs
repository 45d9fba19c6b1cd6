//! The disk engine: the ring of volumes, the index that finds records in it, the append log,
//! group commit, and verified reads. Everything here is about bytes on disk; the memory tier
//! and request coalescing sit above it (see `store`), and background work is done by
//! `maintenance`, which this layer only sends jobs to.

pub(crate) mod bufs;
pub(crate) mod dicts;
pub(crate) mod dirs;
mod durable;
mod flush;
mod held;
mod log;
mod read;
mod ring;

pub(crate) use durable::{same, Undo};
pub(crate) use flush::Flushes;
pub(crate) use log::{Append, Writer};
pub(crate) use read::{decode_checked, Fetch, Got, Record};
pub(crate) use ring::{Ring, NO_DIR};

use crate::format::volume::VOLUME_HEADER_LEN;
use crate::index::{Index, Loc};
use crate::stats::RecoveryReport;
use durable::DurableState;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;

/// The exact record a value was read from: its index location and the slot's whole
/// generation (the location keeps only 7 bits of it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub loc: Loc,
    pub generation: u32,
}

impl Seen {
    /// Whether two reads were of the same record (read counts aside).
    pub fn same(self, other: Seen) -> bool {
        self.loc.same_place(other.loc) && self.generation == other.generation
    }
}

pub(crate) enum Job {
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
    /// Frees the chunks of the large value whose head is at `head` (of the slot's whole
    /// `generation`): it was replaced, deleted or found expired.
    Punch {
        head: Loc,
        generation: u32,
        /// The append count of the write that retired it: the punch waits until that write is
        /// durable, so a crash never brings back a head whose chunks are holes.
        after: u64,
    },
    /// A write of the key hashed `hash` (append count `after`) replaced the entry naming
    /// `loc`, whose header was not in the page cache: counts a false eviction if that record
    /// is another key's, else retires it (`Disk::retired`).
    Replaced {
        loc: Loc,
        hash: u64,
        after: u64,
    },
}

/// The large values' heads on disk, by place (slot, the slot's whole generation, offset), so
/// that the write replacing or deleting one knows to free its chunks: heads written since the
/// store opened, and heads recovery met in scanned volumes and hint files (format 3).
#[derive(Default)]
pub(crate) struct Heads {
    set: Mutex<std::collections::HashSet<(u16, u32, u64)>>,
    /// How many: a store with no large value pays one atomic load per write.
    count: std::sync::atomic::AtomicUsize,
}

impl Heads {
    // The count changes under the set's lock, so that it never says none while some remain.
    pub fn insert(&self, slot: u16, generation: u32, offset: u64) {
        let mut set = self.set.lock();
        set.insert((slot, generation, offset));
        self.count.store(set.len(), Ordering::Relaxed);
    }

    /// Whether the record there was a large value's head (and it is forgotten).
    pub fn take(&self, slot: u16, generation: u32, offset: u64) -> bool {
        if self.count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut set = self.set.lock();
        let taken = set.remove(&(slot, generation, offset));
        self.count.store(set.len(), Ordering::Relaxed);
        taken
    }

    pub fn contains(&self, slot: u16, generation: u32, offset: u64) -> bool {
        self.set.lock().contains(&(slot, generation, offset))
    }

    /// Forgets the heads of volumes the ring has reused.
    pub fn retain(&self, live: impl Fn(u16, u32) -> bool) {
        let mut set = self.set.lock();
        set.retain(|&(slot, generation, _)| live(slot, generation));
        self.count.store(set.len(), Ordering::Relaxed);
    }
}

/// Large values being read, by head place: how many readers, and the punch that waits for them
/// (the head's index entry and the append count it waits for). A reader of a value that was
/// replaced keeps its snapshot: the chunks' blocks are freed when the last reader is done.
#[derive(Default)]
pub(crate) struct Pins {
    map: Mutex<std::collections::HashMap<(u16, u32, u64), Pinned>>,
}

/// Readers of one head, and the punch (head entry, append count) that waits for them.
type Pinned = (u32, Option<(Loc, u64)>);

/// Called when the disk engine drops a key for good reason (an expired record met by a read,
/// the undo of a write whose sync failed), after the index change: the layer above drops the
/// key from memory (the memory tier's one rule).
pub(crate) type Forget = Box<dyn Fn(u64, &[u8]) + Send + Sync>;

/// Where the writer starts: the active slot and the offset appends go on from.
pub(crate) struct Start {
    pub slot: usize,
    pub offset: u64,
    pub next_sequence: u64,
    /// The newest store time seen: new writes are stamped after it.
    pub last_stamp: u64,
}

/// The ring, the index and the log, as one engine shared by readers, the writer and the
/// maintenance thread.
pub(crate) struct Disk {
    pub ring: Ring,
    pub index: Index,
    /// The slot being written (the writer's `active`), for stats without the writer lock.
    pub active: AtomicU32,
    pub writer: Mutex<Writer>,
    durable: Mutex<DurableState>,
    durable_cv: Condvar,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Set by `close`: the syncer thread stops.
    pub stop: Mutex<bool>,
    pub stop_cv: Condvar,
    forget: Forget,
    pub recovery: RecoveryReport,
    pub heads: Heads,
    pins: Pins,
    /// The flushes in force (`flush_all`).
    pub flushes: Flushes,
    /// `Job::Replaced` checks queued and not yet done (at most `MAX_REPLACED_CHECKS`).
    replaced_checks: std::sync::atomic::AtomicUsize,
    /// The zstd dictionaries coded records name.
    pub dicts: dicts::Dicts,
    /// What the volumes written since open hold.
    pub held: held::Held,
}

/// A bound on the checks of replaced records left to the maintenance thread: overwrites of
/// cold keys faster than it reads their headers must not grow its queue without end. Past it
/// a check is not made (the count of false evictions may then miss one).
const MAX_REPLACED_CHECKS: usize = 4096;

impl Disk {
    /// The engine over `ring` with the index recovery rebuilt; the writer goes on at `start`.
    pub fn new(
        ring: Ring,
        index: Index,
        start: Start,
        recovery: RecoveryReport,
        forget: Forget,
        flushes: Flushes,
        dicts: dicts::Dicts,
    ) -> Disk {
        let ring_slots = ring.slots.len();
        let writer = Writer {
            active: start.slot,
            offset: start.offset,
            next_sequence: start.next_sequence,
            appended: 0,
            unsynced: Vec::new(),
            undo: Vec::new(),
            strays: Vec::new(),
            prefix: Vec::new(),
            last_stamp: start.last_stamp,
            closed: false,
            cursor: 0,
            recent: Default::default(),
        };
        Disk {
            ring,
            index,
            active: AtomicU32::new(start.slot as u32),
            writer: Mutex::new(writer),
            durable: Mutex::new(DurableState::default()),
            durable_cv: Condvar::new(),
            jobs: Mutex::new(None),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            forget,
            recovery,
            heads: Heads::default(),
            pins: Pins::default(),
            flushes,
            replaced_checks: Default::default(),
            held: held::Held::new(ring_slots),
            dicts,
        }
    }

    /// The record at `loc` is no longer its key's value, by append number `after` (0: by
    /// expiry, which needs no record): if it was a large value's head, its chunks are freed in
    /// the background once that append is durable. Called after the sync where the policy
    /// waits for one, so an undone write never loses the value it replaced.
    pub fn retired(&self, loc: Loc, after: u64) {
        let Some(generation) = self.ring.live_generation(loc) else { return };
        if self.heads.take(loc.slot, generation, loc.offset) {
            self.send(Job::Punch { head: loc, generation, after });
        }
    }

    /// What a write of `key` (hashed `hash`, append count `after`) that replaced the entry
    /// naming `before` does about it: the key's own record is retired (a large value's chunks
    /// freed); another key's (a false eviction) is counted and left whole, since recovery may
    /// find it again as that key's value, which must then read whole. `other` is whether it is
    /// another key's, if known without a read; else a read that does not wait, after the
    /// writer lock, or the maintenance thread's, which reads what is not in the page cache.
    pub fn replaced(&self, before: Loc, other: Option<bool>, hash: u64, key: &[u8], after: u64) {
        match other.map(Some).or_else(|| self.ring.other_key_at(before, key)) {
            Some(Some(true)) => {
                self.ring.counters.false_evictions.fetch_add(1, Ordering::Relaxed);
            }
            Some(Some(false)) => self.retired(before, after),
            Some(None) => {}
            None => {
                let queued = self.replaced_checks.fetch_add(1, Ordering::Relaxed) < MAX_REPLACED_CHECKS
                    && self.send(Job::Replaced { loc: before, hash, after });
                if !queued {
                    // Unchecked: neither counted nor freed early (the ring reclaims it).
                    self.replaced_checks.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The maintenance thread's half of [`Disk::replaced`]: `found` is the key hash of the
    /// replaced record at `loc`, read blocking.
    pub fn count_replaced(&self, found: Option<u64>, loc: Loc, hash: u64, after: u64) {
        self.replaced_checks.fetch_sub(1, Ordering::Relaxed);
        match found {
            Some(h) if h != hash => {
                self.ring.counters.false_evictions.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => self.retired(loc, after),
            None => {}
        }
    }

    /// Holds off the punch of the large value whose head is at `head` until [`Disk::unpin`]:
    /// `false` (nothing held) when the value was already retired, and its chunks may be gone.
    pub fn pin(&self, head: Loc, generation: u32) -> bool {
        let place = (head.slot, generation, head.offset);
        self.pins.map.lock().entry(place).or_insert((0, None)).0 += 1;
        // Retiring takes the head out of `heads` before its punch looks for pins: either the
        // punch sees this pin, or this sees the head gone.
        if self.heads.contains(place.0, place.1, place.2) {
            return true;
        }
        self.unpin(head, generation);
        false
    }

    /// Lets go of a [`Disk::pin`]; the last reader out sends the punch that waited.
    pub fn unpin(&self, head: Loc, generation: u32) {
        let mut map = self.pins.map.lock();
        let place = (head.slot, generation, head.offset);
        let Some(entry) = map.get_mut(&place) else { return };
        entry.0 -= 1;
        if entry.0 == 0 {
            if let Some((_, Some((head, after)))) = map.remove(&place) {
                drop(map);
                self.send(Job::Punch { head, generation, after });
            }
        }
    }

    /// Whether the punch of the head at `head` must wait for readers (it is then sent again
    /// by the last of them).
    pub fn punch_waits(&self, head: Loc, generation: u32, after: u64) -> bool {
        match self.pins.map.lock().get_mut(&(head.slot, generation, head.offset)) {
            Some(entry) => {
                entry.1 = Some((head, after));
                true
            }
            None => false,
        }
    }

    /// Connects the maintenance thread: jobs sent before this are dropped.
    pub fn set_jobs(&self, tx: Option<mpsc::Sender<Job>>) {
        *self.jobs.lock() = tx;
    }

    /// Whether the index still names the record `seen` (whole generation compared).
    pub fn names(&self, hash: u64, seen: Seen) -> bool {
        self.index.get(hash).is_some_and(|l| l.same_place(seen.loc))
            && self.ring.slots[seen.loc.slot as usize].generation.load(Ordering::Acquire) == seen.generation
    }

    /// The active slot's volume starts fresh at `slot` (a new store, or one whose newest volume
    /// is in a missing directory).
    pub fn start_fresh(&mut self, slot: usize, sequence: u64, created_ms: u64) -> crate::Result<()> {
        let mut cursor = self.writer.get_mut().cursor;
        self.start_volume(slot, sequence, created_ms, &mut cursor)?;
        let w = self.writer.get_mut();
        (w.cursor, w.active, w.offset, w.next_sequence) = (cursor, slot, VOLUME_HEADER_LEN, sequence + 1);
        self.active.store(slot as u32, Ordering::Relaxed);
        Ok(())
    }

    /// Sends `job` to the maintenance thread; false if none is connected.
    pub fn send(&self, job: Job) -> bool {
        self.jobs.lock().as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }
}
