//! The read path: GET, HEAD and ranges. Memory first; then the index names the record, and a
//! disk read of that exact record is shared by the GETs that looked up the same one
//! (coalescing); a value read often enough is promoted to memory, if the index still names
//! the record it came from.

use super::write::check_key;
use super::Store;
use crate::clock::now_ms;
use crate::disk::dicts::Dicts;
use crate::disk::{decode_checked, Got, Seen};
use crate::format::meta;
use crate::memory::flight::{Join, Target};
use crate::memory::{Cached, Settled};
use crate::trace::{self, Step};
use crate::types::{Codec, CodedBytes, Part, Tier, Value};
use crate::Result;
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// What a disk read found: the value and the record it was read from.
pub(super) type Found = Option<(Value, Seen)>;

impl Target for Seen {
    fn same(self, other: Seen) -> bool {
        Seen::same(self, other)
    }
}

/// The value memory holds, decoded if memory holds it coded (unless `send_zstd` and it is
/// coded with Zstandard and no dictionary, or only a `describe`ion is wanted: then `data`
/// stays empty); `None` if decoding fails (a bug, or a dictionary long removed: memory holds
/// what a write coded or a verified read found).
pub(super) fn from_cached(dicts: &Dicts, c: Cached, send_zstd: bool, describe: bool) -> Option<Value> {
    let Cached { data, coded, position, stored_ms, expiry_ms, crc, content_type, attrs, flags, stale } = c;
    let mut len = data.len() as u64;
    let (data, coded) = match coded {
        None => (data, None),
        // A description (HEAD, a revalidation) needs no bytes of the value: none are decoded.
        // A client holds no dictionary: a value coded with one is always decoded for it.
        Some((codec, dictionary, n)) if describe || (send_zstd && codec == Codec::Zstd && dictionary == 0) => {
            len = n;
            (Bytes::new(), Some(CodedBytes { codec, dictionary, data }))
        }
        Some((codec, dictionary, n)) => {
            len = n;
            let entry = meta::Coded { codec: codec.id(), dictionary, len, crc };
            let (value, codec) = decode_checked(dicts, &data, &entry).ok()?;
            (value, Some(CodedBytes { codec, dictionary, data }))
        }
    };
    let start = 0;
    Some(Value {
        data,
        start,
        len,
        crc,
        content_type,
        position,
        stored_ms,
        expiry_ms,
        flags,
        stale,
        attrs,
        tier: Tier::Memory,
        coded,
    })
}

/// What the memory tier keeps of a whole value: exact-size copies, so that it never holds
/// on to a larger read buffer; its coded bytes when it is stored coded (more values fit).
fn to_cached(v: &Value) -> Cached {
    let (data, coded) = match &v.coded {
        Some(c) => (Bytes::copy_from_slice(&c.data), Some((c.codec, c.dictionary, v.len))),
        None => (Bytes::copy_from_slice(&v.data), None),
    };
    Cached {
        data,
        coded,
        position: v.position,
        stored_ms: v.stored_ms,
        expiry_ms: v.expiry_ms,
        crc: v.crc,
        content_type: v.content_type.as_deref().map(Bytes::copy_from_slice),
        attrs: v.attrs.as_deref().map(Bytes::copy_from_slice),
        flags: v.flags,
        stale: v.stale,
    }
}

impl Store {
    pub(super) fn get_part_inner(
        &self,
        key: &[u8],
        part: Part,
        wait: bool,
        send_zstd: bool,
    ) -> Result<Option<Option<Value>>> {
        if part == Part::Whole {
            return self.get_inner(key, wait, send_zstd);
        }
        check_key(key)?;
        let sh = &*self.disk;
        let hash = sh.ring.hash(key);
        // Hits and misses count reads of values: a look at a value's description (a HEAD, a
        // revalidation, a conditional write's early check) is not one.
        let count = part != Part::Nothing;
        if let Some(v) = self.memory_hit(hash, key, count, false, part == Part::Nothing) {
            return Ok(Some(Some(v.narrow(part))));
        }
        let mut found = None;
        // A large value replaced under the read is gone by the time its chunks are held: the
        // read goes round again for the value that replaced it (a few times at most).
        let mut looked: Option<crate::index::Loc> = None;
        for _ in 0..3 {
            let Some(loc) = sh.index.get(hash) else { break };
            if looked.is_some_and(|l| l.same_place(loc)) {
                break;
            }
            looked = Some(loc);
            match sh.fetch_part(hash, loc, key, part, !wait)? {
                Got::WouldBlock => return Ok(None),
                Got::Gone => continue,
                Got::Value(v, _) => {
                    if matches!(part, Part::Range(_)) && sh.ring.cfg.reinsert_min_hits > 0 {
                        sh.index.count_read(hash, loc, sh.ring.cfg.reinsert_min_hits);
                    }
                    found = Some(v);
                    break;
                }
            }
        }
        if count {
            let c = if found.is_some() { &sh.ring.counters.hits } else { &sh.ring.counters.misses };
            c.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(found))
    }

    /// A memory hit (counted if `count`); an expired entry is dropped. With `send_zstd`, a
    /// value held coded with Zstandard is not decoded (see `ReadOptions::coded`).
    fn memory_hit(&self, hash: u64, key: &[u8], count: bool, send_zstd: bool, describe: bool) -> Option<Value> {
        let sh = &*self.disk;
        let m = self.memory.as_ref()?;
        let c = m.get(key)?;
        if sh.dead(c.stored_ms, c.expiry_ms, now_ms()) {
            self.reconcile_memory(hash, key, None);
            return None;
        }
        let Some(v) = from_cached(&sh.dicts, c, send_zstd, describe) else {
            sh.ring.counters.decode_failures.fetch_add(1, Ordering::Relaxed);
            tracing::error!("a value memory held coded did not decode; dropped from memory");
            self.reconcile_memory(hash, key, None);
            return None;
        };
        if count {
            m.hits.fetch_add(1, Ordering::Relaxed);
            sh.ring.counters.hits.fetch_add(1, Ordering::Relaxed);
        }
        Some(v)
    }

    pub(super) fn get_inner(&self, key: &[u8], wait: bool, send_zstd: bool) -> Result<Option<Option<Value>>> {
        check_key(key)?;
        let sh = &*self.disk;
        let hash = sh.ring.hash(key);
        // No span for a memory tier that is off (two clock readings for nothing).
        let memory = self.memory.is_some().then(|| trace::span(Step::Memory));
        if let Some(v) = self.memory_hit(hash, key, true, send_zstd, false) {
            return Ok(Some(Some(v)));
        }
        drop(memory);
        // The record to read is looked up once, before a shared read is joined: a read in the
        // air answers only the gets that looked up the same record (see flight.rs).
        // A location whose slot has moved on names nothing (its record is gone).
        let probe = trace::span(Step::Index);
        let seen = sh.index.get(hash).and_then(|loc| Some(Seen { loc, generation: sh.ring.live_generation(loc)? }));
        drop(probe);
        let found = match seen {
            None => None,
            Some(seen) if wait => match self.flights.join(hash, key, seen) {
                Join::Lead(lead) => {
                    crate::pause::point("flight.lead", key);
                    let r = self.read_disk(hash, key, seen, false).map(|d| d.expect("a blocking read completes"));
                    // Counted (and promoted) before the followers and later gets look again,
                    // so that a hot key costs one disk read, not one per racing get.
                    if let Ok(Some((v, seen))) = &r {
                        self.after_disk_read(hash, key, v, *seen, 1 + lead.followers());
                    }
                    lead.finish(&r);
                    r?
                }
                Join::Follow(flight) => {
                    sh.ring.counters.coalesced_reads.fetch_add(1, Ordering::Relaxed);
                    let _wait = trace::span(Step::Coalesced);
                    flight.wait()?
                }
                Join::Alone => {
                    let found = self.read_disk(hash, key, seen, false)?.expect("a blocking read completes");
                    if let Some((v, seen)) = &found {
                        self.after_disk_read(hash, key, v, *seen, 1);
                    }
                    found
                }
            },
            Some(seen) => {
                if self.flights.busy(hash) {
                    return Ok(None);
                }
                let Some(found) = self.read_disk(hash, key, seen, true)? else { return Ok(None) };
                if let Some((v, seen)) = &found {
                    self.after_disk_read(hash, key, v, *seen, 1);
                }
                found
            }
        };
        let c = if found.is_some() { &sh.ring.counters.hits } else { &sh.ring.counters.misses };
        c.fetch_add(1, Ordering::Relaxed);
        Ok(Some(found.map(|(value, _)| value)))
    }

    /// A value was read from disk for `reads` gets: count them for reinsertion and for
    /// admission to memory, promoting the value when it has earned it.
    fn after_disk_read(&self, hash: u64, key: &[u8], v: &Value, seen: Seen, reads: u32) {
        let sh = &*self.disk;
        if sh.ring.cfg.reinsert_min_hits > 0 {
            sh.index.count_read(hash, seen.loc, sh.ring.cfg.reinsert_min_hits);
        }
        let Some(m) = &self.memory else { return };
        // A value above the tier's limit stays on disk: memory is for values it holds many of.
        if !self.memory_takes(v.len) || !m.admit(hash, now_ms(), reads) {
            return;
        }
        crate::pause::point("promote", key);
        // An exact-size copy: the read buffer also holds the header and padding.
        if let Settled::Stored = self.reconcile_memory(hash, key, Some((to_cached(v), seen))) {
            m.promotions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads the record of `key` that `seen` names; `Ok(None)` if `nowait` and the read would
    /// wait for the device. A record of another generation (the slot moved on) is gone.
    fn read_disk(&self, hash: u64, key: &[u8], seen: Seen, nowait: bool) -> Result<Option<Found>> {
        let mut span = trace::span(Step::Disk);
        let got = self.disk.fetch_part(hash, seen.loc, key, Part::Whole, nowait)?;
        if let Got::Value(v, _) = &got {
            span.bytes(v.position.size);
        }
        Ok(match got {
            Got::WouldBlock => None,
            Got::Value(v, generation) if generation == seen.generation => Some(Some((v, seen))),
            Got::Gone | Got::Value(..) => Some(None),
        })
    }

    /// The memory tier's one rule (see memory.rs): memory never holds a value older than its
    /// key's newest write. Called after every write's change of `key`'s index entry (put,
    /// delete, the undo after a failed fsync) and on expiry with no offer, which drops the key,
    /// and by promotion and `memory_on_put` with the value and the record it came from, which
    /// goes in only if the index still names that record, whole generation compared. Returns
    /// what happened (and what was dropped).
    pub(super) fn reconcile_memory(&self, hash: u64, key: &[u8], offer: Option<(Cached, Seen)>) -> Settled {
        let Some(m) = &self.memory else { return Settled::Dropped(None) };
        match offer {
            None => m.reconcile(hash, key, None, || false),
            Some((value, seen)) => m.reconcile(hash, key, Some(value), || self.disk.names(hash, seen)),
        }
    }
}
