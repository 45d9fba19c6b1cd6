//! Request coalescing: concurrent reads of one record that must go to disk share one read.
//!
//! A reader looks the key up in the index first, then joins the flight of that exact record
//! (slot, offset and the slot's whole generation) or, if none is in the air, registers one and reads. A write
//! changes the index before it is acknowledged, so a reader that starts after the
//! acknowledgement looks up the new record and never joins a read of the old one: it leads a
//! read of its own, which replaces the old flight in the table (the old one still answers the
//! readers that joined it, which all started before the write). Flights are found by the key's
//! hash and confirmed by the full key, so two keys sharing a hash never share bytes.

use crate::{Error, ErrorKind};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// What identifies the read a flight makes (the record, for the store): readers join only a
/// flight of the same one.
pub(crate) trait Target: Copy + Send + Sync {
    fn same(self, other: Self) -> bool;
}

type Outcome<T> = std::result::Result<T, (ErrorKind, String)>;

/// One read in the air, of `target` for `key`, whose outcome (a `T`) its followers share.
pub(crate) struct Flight<R, T> {
    key: Box<[u8]>,
    /// The record being read.
    seen: R,
    followers: AtomicU32,
    outcome: Mutex<Option<Outcome<T>>>,
    done: Condvar,
}

impl<R, T: Clone> Flight<R, T> {
    /// Blocks until the leader has finished; returns its outcome.
    pub fn wait(&self) -> crate::Result<T> {
        let mut o = self.outcome.lock();
        while o.is_none() {
            self.done.wait(&mut o);
        }
        match o.as_ref().expect("checked above") {
            Ok(found) => Ok(found.clone()),
            Err((kind, msg)) => Err(Error::new(*kind, msg.clone())),
        }
    }
}

const SHARDS: usize = 64;

/// The flights in the air.
type Shard<R, T> = Mutex<HashMap<u64, Arc<Flight<R, T>>>>;

/// The flights in the air, by key hash.
pub(crate) struct Flights<R, T> {
    shards: Box<[Shard<R, T>]>,
    /// Flights registered and not yet finished: lets the common case skip the shard lock.
    active: AtomicUsize,
}

/// How a reader takes part.
pub(crate) enum Join<'a, R: Target, T: Clone> {
    /// Read, then hand the outcome to the followers.
    Lead(Lead<'a, R, T>),
    /// Wait for the leader's outcome.
    Follow(Arc<Flight<R, T>>),
    /// Another key with the same hash is in the air: read alone.
    Alone,
}

impl<R, T> Default for Flights<R, T> {
    fn default() -> Self {
        Flights { shards: (0..SHARDS).map(|_| Mutex::default()).collect(), active: AtomicUsize::new(0) }
    }
}

impl<R: Target, T: Clone> Flights<R, T> {
    fn shard(&self, hash: u64) -> &Shard<R, T> {
        &self.shards[(hash % SHARDS as u64) as usize]
    }

    /// Whether a read of `hash` is in the air.
    pub fn busy(&self, hash: u64) -> bool {
        self.active.load(Ordering::Acquire) != 0 && self.shard(hash).lock().contains_key(&hash)
    }

    /// Joins the read of the record `seen` (which the index named for `key`: its location and
    /// the slot's whole generation), or leads one.
    pub fn join(&self, hash: u64, key: &[u8], seen: R) -> Join<'_, R, T> {
        let mut m = self.shard(hash).lock();
        if let Some(f) = m.get(&hash) {
            if &*f.key != key {
                return Join::Alone;
            }
            if f.seen.same(seen) {
                f.followers.fetch_add(1, Ordering::Relaxed);
                return Join::Follow(f.clone());
            }
            // A read of another record of the key is in the air: an older one (its outcome
            // must not answer a reader that started after the write that replaced it) or, if
            // this reader's lookup is the older one, a newer one. Either way, lead a read of
            // `seen`; readers of the same record from now on join this one.
        }
        let flight = Arc::new(Flight {
            key: key.into(),
            seen,
            followers: AtomicU32::new(0),
            outcome: Mutex::new(None),
            done: Condvar::new(),
        });
        m.insert(hash, flight.clone());
        self.active.fetch_add(1, Ordering::AcqRel);
        Join::Lead(Lead { flights: self, hash, flight, finished: false })
    }
}

/// The leader's duty: publish an outcome exactly once, even if the read panics.
pub(crate) struct Lead<'a, R: Target, T: Clone> {
    flights: &'a Flights<R, T>,
    hash: u64,
    flight: Arc<Flight<R, T>>,
    finished: bool,
}

impl<R: Target, T: Clone> Lead<'_, R, T> {
    /// Readers waiting on this flight so far.
    pub fn followers(&self) -> u32 {
        self.flight.followers.load(Ordering::Relaxed)
    }

    pub fn finish(mut self, outcome: &crate::Result<T>) {
        let o = match outcome {
            Ok(found) => Ok(found.clone()),
            Err(e) => Err((e.kind(), e.to_string())),
        };
        self.publish(o);
    }

    fn publish(&mut self, o: Outcome<T>) {
        self.finished = true;
        // Unregister first (unless a newer flight of the key took the place): a reader
        // arriving now reads for itself rather than waiting on a flight that has landed.
        {
            let mut m = self.flights.shard(self.hash).lock();
            if m.get(&self.hash).is_some_and(|f| Arc::ptr_eq(f, &self.flight)) {
                m.remove(&self.hash);
            }
        }
        self.flights.active.fetch_sub(1, Ordering::AcqRel);
        *self.flight.outcome.lock() = Some(o);
        self.flight.done.notify_all();
    }
}

impl<R: Target, T: Clone> Drop for Lead<'_, R, T> {
    fn drop(&mut self) {
        if !self.finished {
            self.publish(Err((ErrorKind::Io, "the read this request was waiting on failed".into())));
        }
    }
}
