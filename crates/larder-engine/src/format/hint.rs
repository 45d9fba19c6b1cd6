//! Hint files: a sealed volume's records in index form, so recovery need not read the volume.
//!
//! Written by a background thread after a volume is sealed (temporary name, fsync, rename,
//! directory fsync), and for the active volume when the store closes (a *checkpoint*). A hint
//! names the slot, generation and sequence it describes and the data length it covers, and
//! ends with a CRC32C of everything before it; recovery uses it only if all of these match the
//! volume and the volume is at least that long (records appended after a checkpoint are
//! scanned), and scans the whole volume otherwise.

use crate::format::volume::VolumeHeader;
use bytes::{Buf, BufMut};

/// Hint file format version written by this build. Version 1 (read too) lacks the newest
/// store time of the volume's records; version 2 (read too) cannot mark a large value's head.
pub const HINT_VERSION: u32 = 3;
const MAGIC: &[u8; 8] = b"LARDHINT";
/// Header length of version 1; version 2 adds the newest store time.
const HEADER_LEN_V1: usize = 48;
const HEADER_LEN: usize = 56;
/// Size of one fixed hint entry (a drop entry is followed by its key).
pub const ENTRY_LEN: usize = 24;
const DROP_BIT: u64 = 1 << 63;
/// In a put entry of version 3, the record is a large value's head (expiry times stay below).
const HEAD_BIT: u64 = 1 << 62;

/// One record of a volume, as recovery needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HintEntry {
    /// A live value: index `hash` at `offset`, `len` bytes long, expiring at `expiry_ms`.
    Put {
        /// Seeded key hash.
        hash: u64,
        /// Record offset in the volume.
        offset: u64,
        /// Record length without padding.
        len: u32,
        /// Expiry in ms since the epoch, 0 = never.
        expiry_ms: u64,
        /// The record is a large value's head.
        head: bool,
    },
    /// A tombstone, or a damaged record whose key is known: drop `key` if the index holds it.
    Drop {
        /// Seeded key hash.
        hash: u64,
        /// Record offset in the volume.
        offset: u64,
        /// Record length without padding.
        len: u32,
        /// The full key, to settle hash collisions.
        key: Vec<u8>,
    },
}

/// Encodes a hint for the volume `vh` covering `data_len` bytes of it, in memory (for tests
/// and small volumes; the store streams with [`Encoder`]).
pub fn encode(vh: &VolumeHeader, data_len: u64, entries: &[HintEntry]) -> Vec<u8> {
    let mut enc = Encoder::default();
    let mut body = Vec::new();
    for e in entries {
        enc.push(e, 0);
    }
    enc.flush(|b| {
        body.extend_from_slice(b);
        Ok(())
    })
    .expect("a Vec takes every byte");
    let (header, trailer) = enc.finish(vh, data_len);
    [&header[..], &body, &trailer].concat()
}

/// Builds a hint entry by entry with bounded memory. The header, whose entry count and newest
/// store time are known only at the end, goes first in the file but is made last; the
/// checksum over header and entries is combined from the checksums of the two parts.
///
/// Use: [`Encoder::push`] entries, [`Encoder::flush`] the bytes encoded so far (to be
/// written in order from offset [`Encoder::ENTRIES_AT`]) whenever [`Encoder::pending`] is
/// large, then [`Encoder::finish`]: the header for offset 0 and the trailer for the end.
#[derive(Default)]
pub struct Encoder {
    pending: Vec<u8>,
    crc: u32,
    written: u64,
    count: u64,
    max_stored_ms: u64,
}

impl Encoder {
    /// Where the entries start in the file.
    pub const ENTRIES_AT: u64 = HEADER_LEN as u64;

    /// Adds the entry of a record stored at `stored_ms`.
    pub fn push(&mut self, e: &HintEntry, stored_ms: u64) {
        let b = &mut self.pending;
        let (hash, offset, len, tail) = match e {
            HintEntry::Put { hash, offset, len, expiry_ms, head } => {
                (hash, offset, len, *expiry_ms & !(DROP_BIT | HEAD_BIT) | if *head { HEAD_BIT } else { 0 })
            }
            HintEntry::Drop { hash, offset, len, .. } => (hash, offset, len, DROP_BIT),
        };
        b.put_u64_le(*hash);
        b.put_u32_le((offset / 8) as u32);
        b.put_u32_le(*len);
        b.put_u64_le(tail);
        if let HintEntry::Drop { key, .. } = e {
            b.put_u16_le(key.len() as u16);
            b.put_slice(key);
        }
        self.count += 1;
        self.max_stored_ms = self.max_stored_ms.max(stored_ms);
    }

    /// Bytes encoded and not yet flushed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Hands the bytes encoded since the last flush to `write`, which puts them after the
    /// ones before.
    pub fn flush(&mut self, write: impl FnOnce(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
        write(&self.pending)?;
        self.crc = crc32c::crc32c_append(self.crc, &self.pending);
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The header and the trailer (checksum) of the hint; every entry must have been flushed.
    pub fn finish(&self, vh: &VolumeHeader, data_len: u64) -> ([u8; HEADER_LEN], [u8; 4]) {
        assert!(self.pending.is_empty(), "flush before finishing");
        let mut h = [0u8; HEADER_LEN];
        let mut w = &mut h[..];
        w.put_slice(MAGIC);
        w.put_u32_le(HINT_VERSION);
        w.put_u32_le(vh.slot);
        w.put_u32_le(vh.generation);
        w.put_u32_le(0); // reserved
        w.put_u64_le(vh.sequence);
        w.put_u64_le(data_len);
        w.put_u64_le(self.count);
        w.put_u64_le(self.max_stored_ms);
        let crc = crc32c::crc32c_combine(crc32c::crc32c(&h), self.crc, self.written as usize);
        (h, crc.to_le_bytes())
    }
}

/// Decodes a hint and checks it describes exactly `vh` with `data_len` bytes; `None` otherwise.
pub fn decode(b: &[u8], vh: &VolumeHeader, data_len: u64) -> Option<Vec<HintEntry>> {
    let hint = Hint::open(b, vh, data_len).filter(|h| h.data_len == data_len)?;
    let mut entries = Vec::with_capacity(hint.count as usize);
    hint.for_each(|e| entries.push(e));
    Some(entries)
}

/// A hint whose checksum, identity and structure have been verified, read without building
/// a list of its entries (a hint of millions of records is streamed into the index).
pub struct Hint<'a> {
    body: &'a [u8],
    /// Where the entries start (the header's length in this version).
    entries_at: usize,
    count: u64,
    /// The newest store time of the records it names (0 in a version-1 hint, which lacks it).
    pub max_stored_ms: u64,
    /// Bytes of the volume it covers: all of a sealed volume, or the part of the active
    /// volume written before a graceful stop (a checkpoint); records after it are scanned.
    pub data_len: u64,
    /// Whether put entries may carry the head mark (version 3).
    heads: bool,
}

impl<'a> Hint<'a> {
    /// Verifies `b` as a hint of the volume `vh` covering at most `file_len` bytes of it.
    /// A volume only grows by appends while its generation lasts, so a hint of a shorter
    /// length still describes the records it names.
    pub fn open(b: &'a [u8], vh: &VolumeHeader, file_len: u64) -> Option<Hint<'a>> {
        if b.len() < HEADER_LEN_V1 + 4 || &b[0..8] != MAGIC {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != (&crc[..]).get_u32_le() {
            return None;
        }
        let mut r = &body[8..];
        let version = r.get_u32_le();
        let (slot, generation) = (r.get_u32_le(), r.get_u32_le());
        r.advance(4); // reserved
        let (sequence, data_len, count) = (r.get_u64_le(), r.get_u64_le(), r.get_u64_le());
        let (entries_at, max_stored_ms) = match version {
            1 => (HEADER_LEN_V1, 0),
            2 | 3 if body.len() >= HEADER_LEN => (HEADER_LEN, r.get_u64_le()),
            _ => return None,
        };
        if slot != vh.slot || generation != vh.generation || sequence != vh.sequence || data_len > file_len {
            return None;
        }
        let hint = Hint { body, entries_at, count, max_stored_ms, data_len, heads: version >= 3 };
        // Walk the entries once before any is used, so that a hint is applied whole or not at all.
        let mut at = entries_at;
        for _ in 0..hint.count {
            at = hint.entry_end(at)?;
        }
        (at == body.len()).then_some(hint)
    }

    /// Entries in the hint.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether the hint names no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where the entry starting at `at` ends, if it fits.
    fn entry_end(&self, at: usize) -> Option<usize> {
        let mut r = self.body.get(at..).filter(|r| r.len() >= ENTRY_LEN)?;
        r.advance(16);
        if r.get_u64_le() & DROP_BIT == 0 {
            return Some(at + ENTRY_LEN);
        }
        let klen = r.get(..2).map(|mut k| k.get_u16_le())? as usize;
        Some(at + ENTRY_LEN + 2 + klen).filter(|&e| e <= self.body.len())
    }

    /// Calls `f` with each entry, in volume order.
    pub fn for_each(&self, f: impl FnMut(HintEntry)) {
        self.iter().for_each(f)
    }

    /// Part `part` of `parts` of the entries, in volume order: the parts are equal shares of
    /// a hint without drop entries (all 24 bytes long); of a hint with some, part 0 is all of
    /// them and the others are empty.
    pub fn iter_part(&self, part: usize, parts: usize) -> impl Iterator<Item = HintEntry> + '_ {
        let fixed = (self.body.len() - self.entries_at) as u64 == self.count * ENTRY_LEN as u64;
        let n = self.count as usize;
        let (from, to) = match fixed {
            true => (n * part / parts, n * (part + 1) / parts),
            false if part == 0 => (0, n),
            false => (0, 0),
        };
        self.entries(self.entries_at + from * ENTRY_LEN, (to - from) as u64)
    }

    /// The entries, in volume order.
    pub fn iter(&self) -> impl Iterator<Item = HintEntry> + '_ {
        self.entries(self.entries_at, self.count)
    }

    /// `count` entries from the one at byte `at`.
    fn entries(&self, mut at: usize, count: u64) -> impl Iterator<Item = HintEntry> + '_ {
        let b = self.body;
        // Without drop entries every entry is 24 bytes: no need to look for each one's end.
        let fixed = (b.len() - self.entries_at) as u64 == self.count * ENTRY_LEN as u64;
        (0..count).map(move |_| {
            let e: &[u8; ENTRY_LEN] = b[at..at + ENTRY_LEN].try_into().expect("verified by open");
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
            let (hash, tail) = (word(0), word(16));
            let (offset, len) = ((word(8) & 0xFFFF_FFFF) * 8, (word(8) >> 32) as u32);
            let end = if fixed { at + ENTRY_LEN } else { self.entry_end(at).expect("verified by open") };
            let head = self.heads && tail & HEAD_BIT != 0;
            let e = if tail & DROP_BIT == 0 {
                let expiry_ms = if self.heads { tail & !HEAD_BIT } else { tail };
                HintEntry::Put { hash, offset, len, expiry_ms, head }
            } else {
                HintEntry::Drop { hash, offset, len, key: b[at + ENTRY_LEN + 2..end].to_vec() }
            };
            at = end;
            e
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mismatch() {
        let vh = VolumeHeader { slot: 2, generation: 5, sequence: 9, salt: 1, created_ms: 0, dir_id: [0; 16] };
        let entries = vec![
            HintEntry::Put { hash: 1, offset: 64, len: 60, expiry_ms: 0, head: false },
            HintEntry::Drop { hash: 2, offset: 128, len: 52, key: b"gone".to_vec() },
            HintEntry::Put { hash: 3, offset: 184, len: 4096, expiry_ms: 12345, head: true },
        ];
        let b = encode(&vh, 5000, &entries);
        assert_eq!(decode(&b, &vh, 5000), Some(entries));
        assert_eq!(decode(&b, &vh, 5008), None);
        // As a checkpoint, it covers the first 5000 bytes of a longer volume, never a shorter one.
        assert_eq!(Hint::open(&b, &vh, 5008).map(|h| (h.data_len, h.len())), Some((5000, 3)));
        assert!(Hint::open(&b, &vh, 4992).is_none());
        assert_eq!(decode(&b, &VolumeHeader { generation: 6, ..vh }, 5000), None);
        let mut d = b.clone();
        d[60] ^= 1;
        assert_eq!(decode(&d, &vh, 5000), None);
        assert_eq!(decode(&b[..b.len() - 1], &vh, 5000), None);
    }

    #[test]
    fn streamed_in_pieces_it_is_the_same_file_and_keeps_the_newest_store_time() {
        let vh = VolumeHeader { slot: 1, generation: 2, sequence: 3, salt: 4, created_ms: 0, dir_id: [0; 16] };
        let entries: Vec<HintEntry> = (0..1000u64)
            .map(|i| match i % 7 {
                0 => HintEntry::Drop { hash: i, offset: i * 64, len: 60, key: format!("k{i}").into_bytes() },
                _ => HintEntry::Put { hash: i, offset: i * 64, len: 60, expiry_ms: i, head: i % 3 == 0 },
            })
            .collect();
        let mut enc = Encoder::default();
        let mut body = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            enc.push(e, 1000 + (i as u64 * 37) % 500);
            if enc.pending() > 100 {
                enc.flush(|b| std::io::Write::write_all(&mut body, b)).unwrap();
            }
        }
        enc.flush(|b| std::io::Write::write_all(&mut body, b)).unwrap();
        let (header, trailer) = enc.finish(&vh, 64_000);
        let file = [&header[..], &body, &trailer].concat();
        let h = Hint::open(&file, &vh, 64_000).expect("a sound hint");
        assert_eq!(h.max_stored_ms, 1499);
        assert_eq!(h.iter().collect::<Vec<_>>(), entries);
    }

    #[test]
    fn version_one_hints_are_still_read() {
        let vh = VolumeHeader { slot: 2, generation: 5, sequence: 9, salt: 1, created_ms: 0, dir_id: [0; 16] };
        let entry = HintEntry::Put { hash: 1, offset: 64, len: 60, expiry_ms: 0, head: false };
        // Version 1: the 48-byte header, no newest store time.
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        for v in [1u32, 2, 5, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [9u64, 5000, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&60u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        let h = Hint::open(&b, &vh, 5000).expect("a version-1 hint");
        assert_eq!((h.max_stored_ms, h.iter().collect::<Vec<_>>()), (0, vec![entry]));
    }
}
