//! Verified reads: a record is read with one positional read (non-blocking where the caller
//! may not wait), checked against its checksums and generation, and only then answered.
//! Only a complete blocking read can mark a record damaged.

use super::Disk;
use crate::clock::now_ms;
use crate::format::codec::{self, Codec};
use crate::format::large;
use crate::format::meta::{self, Meta};
use crate::format::record::{self, Header, HEADER_LEN, MAX_KEY_LEN};
use crate::index::Loc;
use crate::types::{ByteRange, CodedBytes, Part, Position, Tier, Value};
use crate::{Error, ErrorKind, Result};
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// Bytes read first for a part of a large record: header, longest key and metadata fit.
const PREFIX_READ: usize = 8192;
const _: () = assert!(HEADER_LEN + MAX_KEY_LEN + record::MAX_META_LEN <= PREFIX_READ);

/// A verified record as read from a volume.
pub(crate) struct Record {
    pub buf: Vec<u8>,
    pub header: Header,
    pub value: (usize, usize),
    /// CRC32C of the value.
    pub value_crc: u32,
}

impl Record {
    pub fn key(&self) -> &[u8] {
        &self.buf[HEADER_LEN..HEADER_LEN + self.header.key_len as usize]
    }

    pub fn meta(&self) -> &[u8] {
        &self.buf[HEADER_LEN + self.header.key_len as usize..self.value.0]
    }

    pub fn value(&self) -> &[u8] {
        &self.buf[self.value.0..self.value.1]
    }

    /// Whether its value is dead at `now`: expired, or flushed.
    pub fn dead(&self, disk: &Disk, now: u64) -> bool {
        disk.dead(self.header.stored_ms, self.header.expiry_ms, now)
    }
}

/// What a read of part of a value found. Returned once per read and matched at once: boxing
/// the value would cost an allocation a read to save a copy of a few hundred bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Got {
    /// The value, and the generation of the record it was read from.
    Value(Value, u32),
    /// Absent, expired, another key's record, or damaged.
    Gone,
    WouldBlock,
}

pub(crate) enum Fetch {
    Record(Record),
    /// Not there any more: the slot moved on, or the bytes failed verification.
    Gone,
    WouldBlock,
}

impl Disk {
    /// Reads and verifies the record at `loc`.
    pub fn fetch(&self, hash: u64, loc: Loc, nowait: bool) -> Result<Fetch> {
        let slot = &self.ring.slots[loc.slot as usize];
        let (Some(generation), Some(file)) = (self.ring.live_generation(loc), slot.file()) else {
            return Ok(Fetch::Gone);
        };
        let salt = slot.salt.load(Ordering::Acquire);
        let len = record::size_class_bytes(loc.class) as usize;
        let Some(buf) = self.ring.read_new(slot, file, len, loc.offset, nowait)? else { return Ok(Fetch::WouldBlock) };
        self.ring.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
        let (header, value) = match record::decode(&buf, salt) {
            Ok(r) => (r.header, r.value_range),
            // Only a complete blocking read marks damage: the blocking path reads again.
            Err(_) if nowait => return Ok(Fetch::WouldBlock),
            Err(err) => {
                self.damaged(hash, loc, generation, err);
                return Ok(Fetch::Gone);
            }
        };
        if header.generation != generation {
            return Ok(Fetch::Gone);
        }
        let value_crc = record::value_crc(&buf, &header, salt);
        Ok(Fetch::Record(Record { buf, header, value, value_crc }))
    }

    /// A record at `loc` failed verification. A slot reused under the reader explains any
    /// garbage; otherwise it is damage: counted, logged, and answered as a miss from now on.
    fn damaged(&self, hash: u64, loc: Loc, generation: u32, err: impl std::fmt::Debug) {
        if self.ring.slots[loc.slot as usize].generation.load(Ordering::Acquire) == generation {
            self.ring.counters.corrupt_reads.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                volume = loc.slot,
                offset = loc.offset,
                ?err,
                "record failed verification; answered as a miss"
            );
            self.index.remove_if_eq(hash, loc);
        }
    }

    /// The value of `key` in a verified record read from `loc`, or `None` when the record is
    /// another key's, a tombstone, or expired (an expired entry is dropped from the index).
    fn value_of(&self, hash: u64, loc: Loc, key: &[u8], rec: Record) -> Option<Value> {
        let h = rec.header;
        if rec.key() != key {
            self.ring.collided();
            return None;
        }
        if h.is_tombstone() {
            return None;
        }
        if rec.dead(self, now_ms()) {
            self.expire(hash, loc, key);
            return None;
        }
        let meta_at = HEADER_LEN + h.key_len as usize..rec.value.0;
        let buf = super::bufs::into_bytes(rec.buf);
        let meta = Meta::parse(&buf[meta_at]);
        let content_type = meta.content_type.map(|t| buf.slice_ref(t));
        let attrs = meta.attrs.map(|a| buf.slice_ref(a));
        let stored = buf.slice(rec.value.0..rec.value.1);
        // The record checksum held for the coded bytes; the value must decode from them to
        // exactly its own length and checksum, or it is damage, never served.
        let (data, len, crc, coded) = match (h.is_coded(), meta.coded) {
            (false, _) => (stored, h.value_len as u64, rec.value_crc, None),
            (true, Some(c)) => match decode_checked(&self.dicts, &stored, &c) {
                Ok((value, codec)) => {
                    (value, c.len, c.crc, Some(CodedBytes { codec, dictionary: c.dictionary, data: stored }))
                }
                Err(err) => {
                    self.ring.counters.decode_failures.fetch_add(1, Ordering::Relaxed);
                    self.damaged(hash, loc, h.generation, err);
                    return None;
                }
            },
            (true, None) => {
                self.ring.counters.decode_failures.fetch_add(1, Ordering::Relaxed);
                self.damaged(hash, loc, h.generation, "a coded record without its coding");
                return None;
            }
        };
        Some(Value {
            data,
            start: 0,
            len,
            crc,
            coded,
            content_type,
            attrs,
            position: Position { volume: loc.slot as u32, offset: loc.offset, size: h.record_len() },
            stored_ms: h.stored_ms,
            expiry_ms: h.expiry_ms,
            flags: meta.flags,
            stale: meta.stale,
            tier: Tier::Disk,
        })
    }

    /// Reads `part` of the value of `key` at `loc`. A small record is read and verified whole.
    /// Of a large one only the front (header, key and metadata, verified by their own
    /// checksums) is read, then just the blocks that hold the range, each verified against
    /// its block checksum: a range or a HEAD of a large value never reads all of it.
    pub fn fetch_part(&self, hash: u64, loc: Loc, key: &[u8], part: Part, nowait: bool) -> Result<Got> {
        let class = record::size_class_bytes(loc.class) as usize;
        // A record this small holds no block checksums (or barely more than 128 KiB of them):
        // a range of it is read whole, in one read, rather than front first.
        let small = class as u64 <= (meta::BLOCKED_MIN_LEN + PREFIX_READ as u64) * 17 / 16;
        let whole = part == Part::Whole || matches!(part, Part::Range(_)) && small;
        if whole || class <= PREFIX_READ {
            return Ok(match self.fetch(hash, loc, nowait)? {
                Fetch::WouldBlock => Got::WouldBlock,
                Fetch::Gone => Got::Gone,
                Fetch::Record(r) if r.header.is_head() => return self.fetch_large(hash, loc, key, r, part, nowait),
                Fetch::Record(r) => {
                    let generation = r.header.generation;
                    self.value_of(hash, loc, key, r).map_or(Got::Gone, |v| Got::Value(v.narrow(part), generation))
                }
            });
        }
        let slot = &self.ring.slots[loc.slot as usize];
        let (Some(generation), Some(file)) = (self.ring.live_generation(loc), slot.file()) else {
            return Ok(Got::Gone);
        };
        let salt = slot.salt.load(Ordering::Acquire);
        let Some(front) = self.ring.read_new(slot, file, PREFIX_READ, loc.offset, nowait)? else {
            return Ok(Got::WouldBlock);
        };
        self.ring.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
        let (h, meta_block) = match record::decode_prefix(&front, salt) {
            Ok(x) => x,
            Err(_) if nowait => return Ok(Got::WouldBlock),
            Err(err) => {
                self.damaged(hash, loc, generation, err);
                return Ok(Got::Gone);
            }
        };
        if h.generation != generation || h.is_tombstone() {
            return Ok(Got::Gone);
        }
        if &front[HEADER_LEN..HEADER_LEN + h.key_len as usize] != key {
            self.ring.collided();
            return Ok(Got::Gone);
        }
        if self.dead(h.stored_ms, h.expiry_ms, now_ms()) {
            self.expire(hash, loc, key);
            return Ok(Got::Gone);
        }
        if h.is_head() {
            // A head with a long chunk table: read it whole, then the chunks.
            return Ok(match self.fetch(hash, loc, nowait)? {
                Fetch::WouldBlock => Got::WouldBlock,
                Fetch::Gone => Got::Gone,
                Fetch::Record(r) => return self.fetch_large(hash, loc, key, r, part, nowait),
            });
        }
        let meta = Meta::parse(meta_block);
        if let (true, Some(c)) = (h.is_coded(), meta.coded) {
            // A coded value is read and decoded whole for any part of it but its description.
            if part != Part::Nothing {
                return self.fetch_part(hash, loc, key, Part::Whole, nowait).map(|g| match g {
                    Got::Value(v, g) => Got::Value(v.narrow(part), g),
                    other => other,
                });
            }
            let mut v = part_of(loc, &h, Bytes::new(), (0, c.len, c.crc), &meta);
            // Names the coding (not its bytes, which were not read): a door's choice of
            // representation depends on it.
            v.coded =
                Codec::from_id(c.codec).map(|codec| CodedBytes { codec, dictionary: c.dictionary, data: Bytes::new() });
            return Ok(Got::Value(v, h.generation));
        }
        let len = h.value_len as u64;
        let (start, end) = match part {
            Part::Range(r) => r.resolve(len).unwrap_or((0, 0)),
            _ => (0, 0),
        };
        let data = if start == end {
            Bytes::new()
        } else {
            let Some(blocks) = meta.blocks(len) else {
                // A value without block checksums is verified whole.
                return self.fetch_part(hash, loc, key, Part::Whole, nowait).map(|g| match g {
                    Got::Value(v, g) => Got::Value(v.narrow(part), g),
                    other => other,
                });
            };
            let size = blocks.size();
            let (first, last) = (start / size, (end - 1) / size);
            let (from, to) = (first * size, ((last + 1) * size).min(len));
            let value_at = loc.offset + (HEADER_LEN + h.key_len as usize + h.meta_len as usize) as u64;
            let want = (to - from) as usize;
            let Some(buf) = self.ring.read_new(slot, file, want, value_at + from, nowait)? else {
                return Ok(Got::WouldBlock);
            };
            self.ring.counters.disk_reads.fetch_add(1, Ordering::Relaxed);
            if buf.len() < want {
                if nowait {
                    return Ok(Got::WouldBlock);
                }
                self.damaged(hash, loc, generation, record::DecodeError::Short);
                return Ok(Got::Gone);
            }
            for (i, block) in buf.chunks(size as usize).enumerate() {
                if crc32c::crc32c(block) != blocks.crc(first + i as u64) {
                    if nowait {
                        return Ok(Got::WouldBlock);
                    }
                    self.damaged(hash, loc, generation, record::DecodeError::BadBody);
                    return Ok(Got::Gone);
                }
            }
            super::bufs::into_bytes(buf).slice((start - from) as usize..(end - from) as usize)
        };
        let crc = record::value_crc(&front, &h, salt);
        Ok(Got::Value(part_of(loc, &h, data, (start, len, crc), &meta), h.generation))
    }

    /// An expired entry found at `loc`: out of the index, then out of memory.
    fn expire(&self, hash: u64, loc: Loc, key: &[u8]) {
        if self.index.remove_if_eq(hash, loc) {
            self.retired(loc, 0);
        }
        (self.forget)(hash, key);
    }

    /// The large value whose head is at `loc` lost a chunk: its entry goes, and the chunks it
    /// still has are freed.
    fn lost(&self, hash: u64, loc: Loc) {
        if self.index.remove_if_eq(hash, loc) {
            self.retired(loc, 0);
        }
    }

    /// Reads `part` of the large value whose verified head record `head` was read from `loc`:
    /// only the chunks the part overlaps, each verified. The value is gone (and its entry
    /// dropped) when the ring has reused the slot of any of its chunks, which is known from
    /// the table alone, or when a chunk fails verification.
    fn fetch_large(&self, hash: u64, loc: Loc, key: &[u8], head: Record, part: Part, nowait: bool) -> Result<Got> {
        let h = head.header;
        if head.key() != key {
            return Ok(Got::Gone);
        }
        if head.dead(self, now_ms()) {
            self.expire(hash, loc, key);
            return Ok(Got::Gone);
        }
        let meta = Meta::parse(head.meta());
        let (Some((len, crc)), Some(chunks)) = (meta.large, large::decode(head.value())) else {
            self.damaged(hash, loc, h.generation, "a head without its length or chunk table");
            return Ok(Got::Gone);
        };
        if !chunks.iter().all(|c| self.ring.holds(c)) {
            self.lost(hash, loc);
            return Ok(Got::Gone);
        }
        let (start, end) = match part {
            Part::Whole => (0, len),
            Part::Nothing => (0, 0),
            Part::Range(r) => r.resolve(len).unwrap_or((0, 0)),
        };
        // Chunks are read with the punch held off: a value replaced meanwhile reads whole.
        let _pin = match start < end {
            true => match self.pin(loc, h.generation) {
                true => Some(Unpin { disk: self, head: loc, generation: h.generation }),
                false => return Ok(Got::Gone),
            },
            false => None,
        };
        // More than a chunk's worth is never gathered in memory: it is read in pieces
        // (`Store::reader`), each verified as it is handed out.
        if end - start > chunks.first().map_or(0, |c| c.len as u64) {
            return Err(Error::new(ErrorKind::TooLarge, "a part longer than a chunk: read it with Store::reader"));
        }
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut at = 0u64;
        for c in &chunks {
            let (from, to) = (at, at + c.len as u64);
            at = to;
            if to <= start || from >= end {
                continue;
            }
            let (s, e) = (start.max(from) - from, end.min(to) - from);
            let sub =
                if (s, e) == (0, c.len as u64) { Part::Whole } else { Part::Range(ByteRange::Span(s, Some(e - 1))) };
            let cloc = self.ring.loc(c.slot as usize, c.generation, c.offset, c.record_len as u64);
            match self.fetch_part(hash, cloc, key, sub, nowait)? {
                Got::WouldBlock => return Ok(Got::WouldBlock),
                Got::Value(v, g) if g == c.generation && v.data.len() as u64 == e - s => {
                    data.extend_from_slice(&v.data)
                }
                // A chunk lost or damaged: the value is gone as a whole, never served in part.
                _ => {
                    self.lost(hash, loc);
                    return Ok(Got::Gone);
                }
            }
        }
        Ok(Got::Value(part_of(loc, &h, Bytes::from(data), (start, len, crc), &meta), h.generation))
    }

    /// The chunk table of the large value `key`'s index entry names, with that entry and the
    /// head's store time (which names one write); `None` when it names no large value.
    pub fn chunk_table(&self, hash: u64, key: &[u8]) -> Result<Option<(Loc, Vec<large::ChunkRef>, u64)>> {
        let Some(loc) = self.index.get(hash) else { return Ok(None) };
        let Fetch::Record(head) = self.fetch(hash, loc, false)? else { return Ok(None) };
        if head.key() != key {
            self.ring.collided();
            return Ok(None);
        }
        if !head.header.is_head() {
            return Ok(None);
        }
        Ok(large::decode(head.value()).map(|t| (loc, t, head.header.stored_ms)))
    }

    /// Bytes `s..e` of chunk `c` of the large value of `key` whose head is at `head`, verified;
    /// `None` when the chunk is lost or damaged, and then the value's entry is dropped.
    pub fn read_chunk(
        &self,
        hash: u64,
        head: Loc,
        key: &[u8],
        c: &large::ChunkRef,
        s: u64,
        e: u64,
    ) -> Result<Option<Bytes>> {
        let sub = if (s, e) == (0, c.len as u64) { Part::Whole } else { Part::Range(ByteRange::Span(s, Some(e - 1))) };
        let cloc = self.ring.loc(c.slot as usize, c.generation, c.offset, c.record_len as u64);
        match self.ring.holds(c).then(|| self.fetch_part(hash, cloc, key, sub, false)).transpose()? {
            Some(Got::Value(v, g)) if g == c.generation && v.data.len() as u64 == e - s => Ok(Some(v.data)),
            _ => {
                self.lost(hash, head);
                Ok(None)
            }
        }
    }
}

/// The part `data` (from byte `start`) of the value of length `len` and checksum `crc` whose
/// record, with header `h` and metadata `meta`, is at `loc`.
fn part_of(loc: Loc, h: &Header, data: Bytes, (start, len, crc): (u64, u64, u32), meta: &Meta<'_>) -> Value {
    Value {
        data,
        start,
        len,
        crc,
        content_type: meta.content_type.map(Bytes::copy_from_slice),
        attrs: meta.attrs.map(Bytes::copy_from_slice),
        flags: meta.flags,
        stale: meta.stale,
        position: Position { volume: loc.slot as u32, offset: loc.offset, size: h.record_len() },
        stored_ms: h.stored_ms,
        expiry_ms: h.expiry_ms,
        tier: Tier::Disk,
        coded: None,
    }
}

/// The value coded as `c` says in `stored`, checked against its own length and CRC32C, and
/// the codec that decoded it.
pub(crate) fn decode_checked(
    dicts: &super::dicts::Dicts,
    stored: &[u8],
    c: &meta::Coded,
) -> std::result::Result<(Bytes, Codec), String> {
    let codec = Codec::from_id(c.codec).ok_or_else(|| format!("a value coded with unknown codec {}", c.codec))?;
    let len = usize::try_from(c.len).map_err(|_| "a coded value longer than memory".to_string())?;
    let value = match c.dictionary {
        0 => codec::decode(c.codec, stored, len).map_err(|e| format!("{codec:?} value did not decode: {e:?}"))?,
        id if codec == Codec::Zstd => super::dicts::decode_with(dicts, id, stored, len)?,
        id => return Err(format!("a {codec:?} value coded with dictionary {id}: only zstd has dictionaries")),
    };
    if crc32c::crc32c(&value) != c.crc {
        return Err(format!("{codec:?} value decoded to other bytes than were stored"));
    }
    Ok((Bytes::from(value), codec))
}

/// Lets go of a [`Disk::pin`] when dropped.
struct Unpin<'d> {
    disk: &'d Disk,
    head: Loc,
    generation: u32,
}

impl Drop for Unpin<'_> {
    fn drop(&mut self) {
        self.disk.unpin(self.head, self.generation);
    }
}
