//! The write path: PUT and DELETE. Each looks at the key's current record outside the
//! writer lock when it must (a precondition, a delete), takes the lock only while the index
//! still names what it read, appends, updates the index, reconciles memory, and (with
//! `FsyncPolicy::Always`) waits for group commit after releasing the lock.

use super::coding::{Coding, INLINE_CODING};
use super::Store;
use crate::clock::now_ms;
use crate::config::FsyncPolicy;
use crate::disk::{same, Append, Fetch, Got, Seen, Undo, Writer};
use crate::format::large::{self, ChunkRef};
use crate::format::meta::{self, Meta};
use crate::format::record::{self, Header, FLAG_CHUNK, FLAG_CODED, FLAG_HEAD, FLAG_TOMBSTONE, HEADER_LEN, MAX_KEY_LEN};
use crate::format::volume::VOLUME_HEADER_LEN;
use crate::index::Loc;
use crate::memory::{Cached, Settled};
use crate::trace::{self, Step};
use crate::types::{Codec, Expiry, Part, Position, Precondition, PutOptions, Stored, Touch, Version};
use crate::{Error, ErrorKind, Result};
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// A value record ready to be committed: its value bytes (the value, or a large value's chunk
/// table), their CRC32C, metadata and flags; and the whole value's length and CRC32C.
pub(super) struct Prepared<'v> {
    pub(super) value: &'v [&'v [u8]],
    pub(super) value_crc: u32,
    pub(super) meta: Vec<u8>,
    pub(super) flags: u16,
    pub(super) len: u64,
    pub(super) crc: u32,
    /// A head's chunks, which must all still be on disk when it is committed.
    pub(super) chunks: &'v [ChunkRef],
    /// The store time to keep (a touch rewriting a value only memory holds keeps its
    /// version); `None` stamps a new one.
    pub(super) stored_ms: Option<u64>,
}

/// The chunks of a large value written so far, for its head.
#[derive(Default)]
pub(super) struct Upload {
    pub chunks: Vec<ChunkRef>,
    /// Bytes in the chunks, and their CRC32C.
    pub len: u64,
    pub crc: u32,
    /// The append counts of the first and last chunk, whose syncs vouch for them.
    first_append: u64,
    last_append: u64,
}

impl Upload {
    pub fn add(&mut self, (c, crc, appended): (ChunkRef, u32, u64), len: u64) {
        if self.chunks.is_empty() {
            self.first_append = appended;
        }
        self.last_append = appended;
        self.chunks.push(c);
        self.crc = record::crc32c_combine(self.crc, crc, len);
        self.len += len;
    }
}

/// What the index names for a key, as [`Store::lock_current`] saw it before the writer lock;
/// for a blind write (one that does not look), nothing, whatever the index names.
struct Current {
    loc: Option<Loc>,
    /// The version of the key's live value there (not a tombstone, expired or another key's),
    /// and its expiry time.
    live: Option<(Version, u64)>,
}

/// A header stamped now; `append` sets the generation and the encoder the lengths.
fn new_header(flags: u16) -> Header {
    Header { flags, key_len: 0, value_len: 0, meta_len: 0, generation: 0, stored_ms: now_ms(), expiry_ms: 0, crc: 0 }
}

/// Fails with `Invalid` for attributes longer than the limit.
pub(super) fn check_attrs(attrs: Option<&[u8]>) -> Result<()> {
    check_len("attributes", attrs, meta::MAX_ATTRS)
}

/// Fails with `Invalid` for a content type longer than the limit.
pub(super) fn check_content_type(content_type: Option<&[u8]>) -> Result<()> {
    check_len("content type", content_type, meta::MAX_CONTENT_TYPE)
}

/// Fails with `Invalid` when the metadata entry `what` is longer than `limit` bytes.
fn check_len(what: &str, entry: Option<&[u8]>, limit: usize) -> Result<()> {
    match entry.filter(|e| e.len() > limit) {
        Some(e) => Err(Error::new(
            ErrorKind::Invalid,
            format!("{what} of {} bytes is longer than the limit of {limit} bytes", e.len()),
        )),
        None => Ok(()),
    }
}

pub(super) fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            format!("key must be 1 to {MAX_KEY_LEN} bytes, got {}", key.len()),
        ));
    }
    Ok(())
}

impl Store {
    /// The writer lock, unless `wait` is false and taking it (or appending `need` bytes) could
    /// block: the lock is held, a rotation is due (the volume is full, or its directory
    /// failed), or the policy syncs every write.
    fn writer_lock(&self, wait: bool, need: u64) -> Option<parking_lot::MutexGuard<'_, Writer>> {
        let sh = &*self.disk;
        if wait {
            return Some(sh.writer.lock());
        }
        if sh.ring.cfg.fsync == FsyncPolicy::Always {
            return None;
        }
        let w = sh.writer.try_lock()?;
        let usable = sh.ring.slots[w.active].dir().is_none_or(|d| sh.ring.dirs[d].usable());
        (w.offset + need <= sh.ring.cfg.volume_size && usable).then_some(w)
    }

    /// The writer lock, taken while the index still names what was read of `key` before it
    /// (if `look`: its live value, for a precondition or a delete). The read happens outside
    /// the lock, so that every writer never waits on one key's disk read; if a write of the
    /// key (or a turn of the ring) came in between, it is read again. After a few such rounds
    /// (a key written faster than one read takes) the read is made under the lock, which always
    /// finishes. `Ok(None)` where a call that may not wait would (see [`Store::writer_lock`]; a read
    /// that would wait for the device too).
    fn lock_current(
        &self,
        hash: u64,
        key: &[u8],
        look: bool,
        wait: bool,
        need: u64,
    ) -> Result<Option<(parking_lot::MutexGuard<'_, Writer>, Current)>> {
        const ROUNDS: u32 = 3;
        let sh = &*self.disk;
        if !look {
            // A blind write depends on nothing stored: no lookup before the lock or under it.
            let Some(w) = self.writer_lock(wait, need) else { return Ok(None) };
            return Ok(Some((w, Current { loc: None, live: None })));
        }
        let mut round = 0;
        loop {
            let last = round == ROUNDS;
            if last && !wait {
                return Ok(None); // the blocking path reads under the lock
            }
            let locked = last.then(|| sh.writer.lock());
            let loc = sh.index.get(hash);
            // The whole generation: the location keeps only 7 bits of it.
            let generation = loc.and_then(|l| sh.ring.live_generation(l));
            let live = match loc {
                Some(l) => match sh.fetch_part(hash, l, key, Part::Nothing, !wait)? {
                    Got::WouldBlock => return Ok(None),
                    Got::Gone => None,
                    Got::Value(v, _) => Some((v.version(), v.expiry_ms)),
                },
                None => None,
            };
            if locked.is_none() {
                crate::pause::point("write.looked", key);
            }
            let Some(w) = locked.or_else(|| self.writer_lock(wait, need)) else { return Ok(None) };
            let now = sh.index.get(hash);
            if last || (same(now, loc) && now.and_then(|l| sh.ring.live_generation(l)) == generation) {
                return Ok(Some((w, Current { loc, live })));
            }
            round += 1;
        }
    }

    /// Stores the value made of `value`'s parts in order, under a new store time or, for a
    /// value no longer than a chunk, `stored_ms` if given.
    pub(super) fn put_inner(
        &self,
        key: &[u8],
        value: &[&[u8]],
        opts: &PutOptions<'_>,
        wait: bool,
        stored_ms: Option<u64>,
    ) -> Result<Option<Stored>> {
        check_key(key)?;
        let sh = &*self.disk;
        let total_len: u64 = value.iter().map(|p| p.len() as u64).sum();
        self.check_size(total_len)?;
        check_content_type(opts.content_type)?;
        check_attrs(opts.attrs)?;
        // Before a byte is written: a refused value leaves the key as it was.
        if let Some(mut check) = super::cas::Check::of(sh.ring.cfg.verify_cas, key) {
            value.iter().for_each(|p| check.update(p));
            self.cas_verdict(check)?;
        }
        let hash = sh.ring.hash(key);
        // A value longer than a chunk goes to disk as chunk records first, each appended under
        // the writer lock on its own so other writes flow meanwhile; then its head, below, is
        // written and indexed as any value is. Until the head lands the key keeps its value.
        let large = total_len > sh.ring.cfg.chunk_size;
        if large && !wait {
            return Ok(None);
        }
        if large {
            let mut upload = Upload::default();
            let size = sh.ring.cfg.chunk_size as usize;
            // A chunk within one part is written from it; one across parts is joined first.
            let (mut joined, mut i) = (Vec::new(), 0u32);
            for mut part in value.iter().copied() {
                while !part.is_empty() {
                    if joined.is_empty() && part.len() >= size {
                        upload.add(self.append_chunk(key, i, &part[..size])?, size as u64);
                        (part, i) = (&part[size..], i + 1);
                        continue;
                    }
                    let take = (size - joined.len()).min(part.len());
                    joined.extend_from_slice(&part[..take]);
                    part = &part[take..];
                    if joined.len() == size {
                        upload.add(self.append_chunk(key, i, &joined)?, size as u64);
                        (joined, i) = (Vec::new(), i + 1);
                    }
                }
            }
            if !joined.is_empty() {
                upload.add(self.append_chunk(key, i, &joined)?, joined.len() as u64);
            }
            return self.put_head(key, hash, &upload, opts);
        }
        // Outside the writer lock: one pass over the value for its checksum and, when it is
        // large, the block checksums a range read verifies.
        let (value_crc, blocks) = meta::checksum_parts(value);
        let mut meta = Vec::new();
        // A coded value is verified whole: block checksums of the coded bytes would not
        // serve a range of the value.
        // Coding a long value holds a thread longer than an async worker should be held.
        if !wait && total_len > INLINE_CODING && self.codes(total_len) {
            return Ok(None);
        }
        let coded = self.code(Some(key), value, total_len);
        let blocks = if matches!(coded, Coding::Coded(..)) { None } else { blocks };
        meta::encode(&mut meta, opts.content_type, blocks.as_ref());
        meta::encode_flags(&mut meta, opts.flags, opts.stale);
        meta::encode_attrs(&mut meta, opts.attrs);
        let raw = Prepared { value, value_crc, meta, flags: 0, len: total_len, crc: value_crc, chunks: &[], stored_ms };
        let c = &sh.ring.counters;
        let stored = match coded {
            // `_dict` lives until the record is written (and noted as needing it).
            Coding::Coded(bytes, codec, _dict) => {
                let mut p = raw;
                let dictionary = _dict.as_ref().map_or(0, |d| d.id());
                let entry = meta::Coded { codec: codec.id(), dictionary, len: total_len, crc: value_crc };
                meta::encode_coded(&mut p.meta, &entry);
                let parts: [&[u8]; 1] = [&bytes];
                let p = Prepared { value: &parts, value_crc: crc32c::crc32c(&bytes), flags: FLAG_CODED, ..p };
                let stored = self.commit(key, hash, p, opts, wait)?;
                if stored.is_some() {
                    c.coded_puts.fetch_add(1, Ordering::Relaxed);
                    c.coded_logical_bytes.fetch_add(total_len, Ordering::Relaxed);
                    c.coded_stored_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
                return Ok(stored);
            }
            Coding::Raw(why) => (self.commit(key, hash, raw, opts, wait)?, why),
        };
        match stored {
            (Some(s), Some(why)) => {
                let counter = if why == crate::format::codec::Raw::Probed { &c.raw_probed } else { &c.raw_no_gain };
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(Some(s))
            }
            (s, _) => Ok(s),
        }
    }

    /// Writes the head of a large value whose chunks are on disk.
    pub(super) fn put_head(&self, key: &[u8], hash: u64, up: &Upload, opts: &PutOptions<'_>) -> Result<Option<Stored>> {
        crate::pause::point("put.chunks", key);
        // With every write durable when acknowledged, so are the chunks: a sync that covered
        // one of them and failed fails the value (the head's own sync cannot vouch for them).
        if self.disk.ring.cfg.fsync == FsyncPolicy::Always {
            self.disk.durable_span(up.first_append, up.last_append)?;
        }
        let table = large::encode(&up.chunks);
        let mut meta = Vec::new();
        meta::encode(&mut meta, opts.content_type, None);
        meta::encode_flags(&mut meta, opts.flags, opts.stale);
        meta::encode_attrs(&mut meta, opts.attrs);
        meta::encode_large(&mut meta, up.len, up.crc);
        let p = Prepared {
            value: &[&table],
            value_crc: crc32c::crc32c(&table),
            meta,
            flags: FLAG_HEAD,
            len: up.len,
            crc: up.crc,
            chunks: &up.chunks,
            stored_ms: None,
        };
        self.commit(key, hash, p, opts, true)
    }

    /// Appends, indexes and (with `FsyncPolicy::Always`) makes durable one value record: a
    /// whole value, or a large value's head.
    pub(super) fn commit(
        &self,
        key: &[u8],
        hash: u64,
        p: Prepared<'_>,
        opts: &PutOptions<'_>,
        wait: bool,
    ) -> Result<Option<Stored>> {
        let sh = &*self.disk;
        let Prepared { value, value_crc, meta: meta_block, flags, len: total_len, crc: total_crc, chunks, stored_ms } =
            p;
        let large = flags == FLAG_HEAD;
        let value_len: usize = value.iter().map(|p| p.len()).sum();
        let record_len = record::padded((HEADER_LEN + key.len() + meta_block.len() + value_len) as u64);
        if VOLUME_HEADER_LEN + record_len > sh.ring.cfg.volume_size || value_len > u32::MAX as usize {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {value_len} bytes does not fit in a volume of {} bytes", sh.ring.cfg.volume_size),
            ));
        }
        let always = sh.ring.cfg.fsync == FsyncPolicy::Always;
        // What memory keeps of the value with `memory_on_put` (times are set below); never a
        // large value.
        let mut cached =
            self.memory.as_ref().filter(|m| m.on_put() && !large && self.memory_takes(total_len)).map(|_| Cached {
                data: Bytes::from(value.concat()),
                // A coded value stays coded in memory: more of them fit.
                coded: (flags == FLAG_CODED)
                    .then(|| Meta::parse(&meta_block).coded)
                    .flatten()
                    .and_then(|c| Some((crate::types::Codec::from_id(c.codec)?, c.dictionary, c.len))),
                position: Position { volume: 0, offset: 0, size: 0 },
                stored_ms: 0,
                expiry_ms: 0,
                crc: total_crc,
                content_type: opts.content_type.map(Bytes::copy_from_slice),
                attrs: opts.attrs.map(Bytes::copy_from_slice),
                flags: opts.flags,
                stale: opts.stale,
            });
        let mut header = new_header(flags);
        let keep = matches!(opts.expiry, Expiry::Keep { .. });
        let looked = !opts.preconditions.is_empty() || keep;
        let write = trace::span(Step::Write);
        let (pos, seen, seq, before, other) = {
            let Some((mut w, current)) = self.lock_current(hash, key, looked, wait, record_len)? else {
                return Ok(None);
            };
            self.check(key, opts.preconditions, current.live)?;
            // The ring turns only under this lock: a slow upload whose first chunks it already
            // reused must not become a value that reads as gone. A head that will not fit turns
            // the ring here, before the check, rather than in the append after it.
            if large && w.offset + record_len > sh.ring.cfg.volume_size {
                sh.rotate(&mut w)?;
            }
            if !chunks.iter().all(|c| sh.ring.holds(c)) {
                return Err(chunks_reused());
            }
            // Stamped under the lock, so store times (and versions) are unique and ordered; a
            // kept time is the value's own, as a touch's copy on disk keeps it.
            header.stored_ms = stored_ms.unwrap_or_else(|| sh.stamp(&mut w));
            // By the clock, which expiry is checked against, not by the stamp: the stamp runs
            // ahead of the clock after it stepped back.
            let now = now_ms();
            let capped;
            let kept = keep.then(|| self.current(key, current.live)).flatten().map(|(_, expiry_ms)| expiry_ms);
            (header.expiry_ms, capped) = self.capped(key, kept.unwrap_or_else(|| opts.expiry.at_ms(now)), now);
            let rec = Append { header, key, meta: &meta_block, value, value_crc };
            let Some((pos, loc)) = sh.append(&mut w, wait, &rec)? else {
                return Ok(None);
            };
            // The append itself may have turned the ring (a full device, a failed directory):
            // the head then stays unindexed. Recovery may index it, and reads answer its key
            // as absent (its first chunk is gone), never with other bytes.
            if large && !chunks.iter().all(|c| sh.ring.holds(c)) {
                return Err(chunks_reused());
            }
            // A colliding key loses its entry here: it becomes a miss, never a wrong value.
            let generation = sh.ring.slots[loc.slot as usize].generation.load(Ordering::Relaxed);
            // Known as a head before the index names it, so an expiry in between frees it.
            if large {
                sh.heads.insert(loc.slot, generation, loc.offset);
            }
            let before = sh.index.insert(hash, loc);
            // Whether it took another key's entry, where the replaced record is recent enough
            // to be known without reading it (`None`: read after the lock).
            let other = before.map(|b| w.recent.hash_of(b).map(|h| h != hash));
            if other.is_some_and(|o| o != Some(false)) {
                // Perhaps another key's record, which recovery will find: see `delete_inner`.
                sh.index.taint(hash);
            }
            w.recent.note(loc, hash);
            self.count_capped(capped);
            let seen = Seen { loc, generation };
            if always {
                w.undo.push(Undo { hash, key: key.into(), before, after: Some(loc) });
            }
            if let Some(c) = &mut cached {
                (c.position, c.stored_ms, c.expiry_ms) = (pos, header.stored_ms, header.expiry_ms);
            }
            // Under the writer lock, so that a conditional write after this one never finds
            // the replaced value in memory. A value that must be durable first enters memory
            // only once it is: a failed sync undoes the index change.
            let offer = if always { None } else { cached.take().map(|c| (c, seen)) };
            self.reconcile_memory(hash, key, offer);
            (pos, seen, w.appended, before, other)
        };
        drop(write);
        crate::pause::point("put.unlocked", key);
        if always {
            let sync = trace::span(Step::Sync);
            sh.wait_durable(seq)?;
            drop(sync);
            if let Some(c) = cached {
                self.reconcile_memory(hash, key, Some((c, seen)));
            }
        }
        if let (Some(before), Some(other)) = (before, other) {
            sh.replaced(before, other, hash, key, seq);
        }
        sh.ring.counters.puts.fetch_add(1, Ordering::Relaxed);
        let version = Version { len: total_len, crc: total_crc, stored_ms: header.stored_ms };
        Ok(Some(Stored { position: pos, version }))
    }

    /// Fails with `TooLarge` for a value longer than the configured limit.
    pub(super) fn check_size(&self, len: u64) -> Result<()> {
        let most = self.disk.ring.cfg.max_value_size;
        if len > most {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("value of {len} bytes exceeds the limit of {most} bytes"),
            ));
        }
        Ok(())
    }

    /// Appends chunk number `index` of a large value of `key` under the writer lock (taken for
    /// this chunk alone, so other writes flow between chunks); returns where it went and the
    /// chunk's CRC32C and append count.
    pub(super) fn append_chunk(&self, key: &[u8], index: u32, chunk: &[u8]) -> Result<(ChunkRef, u32, u64)> {
        let sh = &*self.disk;
        let (crc, blocks) = meta::checksum(chunk);
        let mut m = Vec::new();
        // Each chunk is coded on its own, as a small value is: a range decodes only the
        // chunks it covers (a coded chunk has no block checksums: it is read whole).
        let coded = self.code(None, &[chunk], chunk.len() as u64);
        let (flags, stored, stored_crc) = match &coded {
            Coding::Coded(bytes, codec, _) => {
                meta::encode(&mut m, None, None);
                meta::encode_chunk(&mut m, index);
                let entry = meta::Coded { codec: codec.id(), dictionary: 0, len: chunk.len() as u64, crc };
                meta::encode_coded(&mut m, &entry);
                let c = &sh.ring.counters;
                c.coded_logical_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                c.coded_stored_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                (FLAG_CHUNK | FLAG_CODED, &bytes[..], crc32c::crc32c(bytes))
            }
            Coding::Raw(_) => {
                meta::encode(&mut m, None, blocks.as_ref());
                meta::encode_chunk(&mut m, index);
                (FLAG_CHUNK, chunk, crc)
            }
        };
        let mut w = sh.writer.lock();
        let header = Header { stored_ms: sh.stamp(&mut w), ..new_header(flags) };
        let rec = Append { header, key, meta: &m, value: &[stored], value_crc: stored_crc };
        let (pos, _) = sh.append(&mut w, true, &rec)?.expect("an append that may wait completes");
        let s = &sh.ring.slots[pos.volume as usize];
        let (generation, sequence) = (s.generation.load(Ordering::Relaxed), s.sequence.load(Ordering::Relaxed));
        let appended = w.appended;
        drop(w);
        let c = ChunkRef {
            slot: pos.volume as u16,
            generation,
            sequence,
            offset: pos.offset,
            record_len: pos.size as u32,
            len: chunk.len() as u32,
        };
        Ok((c, crc, appended))
    }

    pub(super) fn delete_inner(&self, key: &[u8], preconditions: &[Precondition], wait: bool) -> Result<Option<bool>> {
        check_key(key)?;
        let sh = &*self.disk;
        let hash = sh.ring.hash(key);
        let need = record::padded((HEADER_LEN + key.len()) as u64);
        let (seq, tombstone_only, in_memory, removed) = {
            let Some((mut w, current)) = self.lock_current(hash, key, true, wait, need)? else { return Ok(None) };
            self.check(key, preconditions, current.live)?;
            // A tombstone wherever recovery could meet a record of the key and index it
            // again: a live value; an entry that names another key's record (which took it
            // from this key: this key's record is still on disk) or an expired one; a shard
            // where such an entry may have been taken and since removed (`Index::tainted`);
            // any key while a volume is left out of the index (or in a missing directory), or
            // holds a put undone after a failed sync. Only a key the index never lost track
            // of, with no entry, needs none.
            let mut removed = None;
            let unnamed = current.loc.is_some() || sh.index.tainted(hash);
            let (seq, tombstone_only) =
                if current.live.is_some() || unnamed || sh.ring.degraded || w.has_strays(&sh.ring.slots) {
                    let header = Header { stored_ms: sh.stamp(&mut w), ..new_header(FLAG_TOMBSTONE) };
                    let rec = Append { header, key, meta: b"", value: &[], value_crc: crc32c::crc32c(b"") };
                    let Some(_) = sh.append(&mut w, wait, &rec)? else {
                        return Ok(None);
                    };
                    if let (Some(loc), Some(_)) = (current.loc, current.live) {
                        if sh.index.remove_if_eq(hash, loc) {
                            removed = Some(loc);
                            if sh.ring.cfg.fsync == FsyncPolicy::Always {
                                w.undo.push(Undo { hash, key: key.into(), before: Some(loc), after: None });
                            }
                        }
                    }
                    (Some(w.appended), current.live.is_none())
                } else {
                    (None, false)
                };
            // Memory may hold the key after the ring evicted its record: that counts as
            // present, unless expired. Dropped under the writer lock, so that a conditional
            // write after this delete never finds the value in memory.
            let held = match self.reconcile_memory(hash, key, None) {
                Settled::Dropped(held) => held,
                Settled::Stored => None,
            };
            let now = now_ms();
            (seq, tombstone_only, held.is_some_and(|c| !sh.dead(c.stored_ms, c.expiry_ms, now)), removed)
        };
        if let (Some(seq), FsyncPolicy::Always) = (seq, sh.ring.cfg.fsync) {
            sh.wait_durable(seq)?;
        }
        if let (Some(loc), Some(seq)) = (removed, seq) {
            sh.retired(loc, seq);
        }
        let found = (seq.is_some() && !tombstone_only) || in_memory;
        if found {
            sh.ring.counters.deletes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Some(found))
    }

    /// Gives the live value of `key` the expiry `expiry`, keeping its bytes and its version:
    /// the record is copied forward with the new expiry time (as reinsertion copies one),
    /// so its store time (memcached's cas unique, the HTTP ETag) stays. `Ok(None)` when the
    /// key has no live value. A value only memory still holds (the ring has overwritten its
    /// record) is written anew, under a new version.
    pub(super) fn touch_inner(&self, key: &[u8], touch: &Touch<'_>) -> Result<Option<Version>> {
        let expiry = touch.expiry;
        check_key(key)?;
        let sh = &*self.disk;
        let hash = sh.ring.hash(key);
        const ROUNDS: u32 = 3;
        for round in 0..=ROUNDS {
            // Read outside the writer lock, then take it while the index still names what was
            // read; after a few rounds lost to writes of the key, read under it.
            let locked = (round == ROUNDS).then(|| sh.writer.lock());
            let Some(loc) = sh.index.get(hash) else {
                drop(locked);
                return self.touch_held(key, touch);
            };
            let generation = sh.ring.live_generation(loc);
            if generation.is_none() {
                // An entry the ring has moved past (the sweep drops it soon): the key is on disk
                // no more, though memory may still hold its value.
                drop(locked);
                return self.touch_held(key, touch);
            }
            let rec = match sh.fetch(hash, loc, false)? {
                Fetch::Record(r) if r.key() == key && !r.header.is_tombstone() && !r.header.is_chunk() => r,
                // Another key the index cannot tell apart took the entry: memory may still
                // hold this key's value, as a read would answer it.
                Fetch::Record(r) if r.key() != key => {
                    drop(locked);
                    return self.touch_held(key, touch);
                }
                _ if locked.is_some() => return Ok(None),
                _ => continue,
            };
            let now = now_ms();
            if rec.dead(sh, now) || touch.stored_at.is_some_and(|t| t != rec.header.stored_ms) {
                return Ok(None);
            }
            let last = locked.is_some();
            let mut w = locked.unwrap_or_else(|| sh.writer.lock());
            let current = sh.index.get(hash);
            if !same(current, Some(loc)) || current.and_then(|l| sh.ring.live_generation(l)) != generation {
                // Under the lock only a read that expired or lost the value moves it: gone.
                if last {
                    return Ok(None);
                }
                continue;
            }
            let mut header = rec.header;
            let capped;
            (header.expiry_ms, capped) = self.capped(key, expiry.at_ms(now), now);
            let value = [rec.value()];
            let replaced = touch.attrs.map(|a| meta::with_attrs(rec.meta(), a));
            let meta_block = replaced.as_deref().unwrap_or(rec.meta());
            let app = Append { header, key, meta: meta_block, value: &value, value_crc: rec.value_crc };
            let (pos, new) = sh.append(&mut w, true, &app)?.expect("an append that may wait completes");
            let new_generation = sh.ring.slots[new.slot as usize].generation.load(Ordering::Relaxed);
            // A read that expired the value may drop it even under the writer lock: the copy
            // then stays unindexed (recovery finds it expired or shadowed) and nothing changed.
            if !sh.index.replace_if_eq(hash, loc, new) {
                return Ok(None);
            }
            self.count_capped(capped);
            if header.is_head() {
                // The copy names the same chunks: the old head goes without freeing them.
                sh.heads.take(loc.slot, generation.unwrap_or(0), loc.offset);
                sh.heads.insert(new.slot, new_generation, new.offset);
            }
            let always = sh.ring.cfg.fsync == FsyncPolicy::Always;
            if always {
                w.undo.push(Undo { hash, key: key.into(), before: Some(loc), after: Some(new) });
            }
            // Memory keeps the value, with its new expiry, naming the copy.
            let held = self.memory.as_ref().and_then(|m| m.get(key)).filter(|c| c.stored_ms == header.stored_ms);
            let seen = Seen { loc: new, generation: new_generation };
            let attrs = |c: &Cached| match touch.attrs {
                Some(a) => a.map(Bytes::copy_from_slice),
                None => c.attrs.clone(),
            };
            let offer =
                held.map(|c| (Cached { expiry_ms: header.expiry_ms, position: pos, attrs: attrs(&c), ..c }, seen));
            // As a put's: a copy that must be durable first enters memory only once it is.
            let (now_offer, later) = if always { (None, offer) } else { (offer, None) };
            self.reconcile_memory(hash, key, now_offer);
            let seq = w.appended;
            drop(w);
            if always {
                sh.wait_durable(seq)?;
                if later.is_some() {
                    self.reconcile_memory(hash, key, later);
                }
            }
            let m = Meta::parse(meta_block);
            let (len, crc) = match (m.large, m.coded) {
                (Some(large), _) => large,
                (None, Some(c)) if header.is_coded() => (c.len, c.crc),
                _ => (header.value_len as u64, rec.value_crc),
            };
            return Ok(Some(Version { len, crc, stored_ms: header.stored_ms }));
        }
        Ok(None)
    }

    /// [`Store::touch_inner`] of a key the index does not name: a value memory still holds is
    /// written again with the new expiry.
    fn touch_held(&self, key: &[u8], touch: &Touch<'_>) -> Result<Option<Version>> {
        let Some(c) = self.memory.as_ref().and_then(|m| m.get(key)) else { return Ok(None) };
        if self.disk.dead(c.stored_ms, c.expiry_ms, now_ms()) || touch.stored_at.is_some_and(|t| t != c.stored_ms) {
            return Ok(None);
        }
        let opts = PutOptions {
            expiry: touch.expiry,
            flags: c.flags,
            stale: c.stale,
            content_type: c.content_type.as_deref(),
            attrs: touch.attrs.unwrap_or(c.attrs.as_deref()),
            preconditions: &[Precondition::StoredAt(c.stored_ms)],
            nonblocking: false,
        };
        // Written anew, but the same value: its store time, and so its version, stay; a
        // Zstandard frame stays the same bytes (its strong ETag names them).
        let written = match c.coded {
            Some((Codec::Zstd, 0, _)) => {
                self.put_coded_inner(key, Codec::Zstd, &c.data, &opts, true, Some(c.stored_ms))
            }
            _ => {
                let Some(value) = super::read::from_cached(&self.disk.dicts, c.clone(), false, false) else {
                    return Ok(None);
                };
                self.put_inner(key, &[&value.data], &opts, true, Some(c.stored_ms))
            }
        };
        match written {
            Ok(stored) => Ok(Some(stored.expect("a put that may wait completes").version)),
            Err(e) if e.kind() == ErrorKind::PreconditionFailed => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The version and expiry time of `key`'s current value, under the writer lock
    /// (`indexed` is what its index entry names, read before the lock by
    /// [`Store::lock_current`]).
    fn current(&self, key: &[u8], indexed: Option<(Version, u64)>) -> Option<(Version, u64)> {
        if indexed.is_some() {
            return indexed;
        }
        // Memory may hold a value whose record the ring has overwritten. Every write drops the
        // key from memory under the writer lock, so what it holds here is current.
        let now = now_ms();
        let cached = self.memory.as_ref().and_then(|m| m.get(key));
        cached
            .filter(|c| !self.disk.dead(c.stored_ms, c.expiry_ms, now))
            .map(|c| (Version { len: c.len(), crc: c.crc, stored_ms: c.stored_ms }, c.expiry_ms))
    }

    /// Fails unless every precondition holds for the current value of `key`. Under the writer
    /// lock; `indexed` as for [`Store::current`].
    fn check(&self, key: &[u8], preconditions: &[Precondition], indexed: Option<(Version, u64)>) -> Result<()> {
        if preconditions.is_empty() {
            return Ok(());
        }
        match crate::types::unmet(preconditions, self.current(key, indexed).map(|(v, _)| v)) {
            None => Ok(()),
            Some(why) => Err(Error::new(ErrorKind::PreconditionFailed, why)),
        }
    }
}

fn chunks_reused() -> Error {
    Error::new(
        ErrorKind::NoSpace,
        "the ring reused the volume of the value's first chunks while it was written: \
         the value is too large for the ring at this write rate",
    )
}
