//! Values of any size in pieces: a [`ValueWriter`] takes a value as it arrives and keeps at most
//! one chunk of it in memory; a [`ValueReader`] hands a value out chunk by chunk, each verified
//! before it is handed out.

use super::write::{check_attrs, check_content_type, check_key, Upload};
use super::Store;
use crate::format::large::ChunkRef;
use crate::types::{Expiry, Part, Precondition, PutOptions, ReadOptions, Stored, Value};
use crate::{Error, ErrorKind, Result};
use bytes::Bytes;

/// A value being written in pieces ([`Store::writer`]). Nothing of it is visible until
/// [`ValueWriter::finish`] returns; dropped before that, it leaves the key as it was.
pub struct ValueWriter<'s> {
    store: &'s Store,
    key: Vec<u8>,
    expiry: Expiry,
    flags: u32,
    stale: bool,
    content_type: Option<Vec<u8>>,
    attrs: Option<Vec<u8>>,
    preconditions: Vec<Precondition>,
    /// Bytes not yet in a chunk record: at most one chunk's worth.
    pending: Vec<u8>,
    /// The chunk records written so far.
    upload: Upload,
    /// The hash of the chunks written so far, for a content-addressed key (one value no
    /// longer than a chunk is checked by the put that stores it).
    cas: Option<super::cas::Check>,
}

impl Store {
    /// Starts writing the value of `key` in pieces, with the expiry, content type and
    /// preconditions of `opts` (checked when the value is finished). A value no longer than
    /// a chunk is stored as one record, as [`Store::put`] does; a longer one goes to disk
    /// chunk by chunk as it arrives. Blocks on the device: not for an async worker.
    pub fn writer(&self, key: &[u8], opts: &PutOptions<'_>) -> Result<ValueWriter<'_>> {
        check_key(key)?;
        check_content_type(opts.content_type)?;
        check_attrs(opts.attrs)?;
        Ok(ValueWriter {
            store: self,
            key: key.to_vec(),
            expiry: opts.expiry,
            flags: opts.flags,
            stale: opts.stale,
            content_type: opts.content_type.map(<[u8]>::to_vec),
            attrs: opts.attrs.map(<[u8]>::to_vec),
            preconditions: opts.preconditions.to_vec(),
            pending: Vec::new(),
            upload: Upload::default(),
            cas: super::cas::Check::of(self.disk.ring.cfg.verify_cas, key),
        })
    }
}

impl ValueWriter<'_> {
    /// Adds `data` to the value.
    pub fn write(&mut self, mut data: &[u8]) -> Result<()> {
        let chunk = self.store.disk.ring.cfg.chunk_size as usize;
        self.store.check_size(self.len() + data.len() as u64)?;
        while !data.is_empty() {
            // A full chunk goes to disk only once more follows: a value of exactly one chunk
            // stays one record.
            if self.pending.len() == chunk {
                self.flush()?;
            }
            let take = (chunk - self.pending.len()).min(data.len());
            if self.pending.capacity() == 0 {
                self.pending.reserve_exact(chunk.min(data.len().max(4096)));
            }
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.upload.len + self.pending.len() as u64
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn flush(&mut self) -> Result<()> {
        if let Some(c) = &mut self.cas {
            c.update(&self.pending);
        }
        let written = self.store.append_chunk(&self.key, self.upload.chunks.len() as u32, &self.pending)?;
        self.upload.add(written, self.pending.len() as u64);
        self.pending.clear();
        Ok(())
    }

    /// Stores the value: its head (or, for a value no longer than a chunk, the value itself)
    /// is written and indexed, and from then on reads find it.
    pub fn finish(mut self) -> Result<Stored> {
        if !self.upload.chunks.is_empty() && !self.pending.is_empty() {
            self.flush()?;
        }
        let opts = PutOptions {
            expiry: self.expiry,
            flags: self.flags,
            stale: self.stale,
            content_type: self.content_type.as_deref(),
            attrs: self.attrs.as_deref(),
            preconditions: &self.preconditions,
            nonblocking: false,
        };
        if self.upload.chunks.is_empty() {
            return self.store.put(&self.key, &self.pending, &opts);
        }
        // Its chunks are on disk, unreachable: refused, they are dead space the ring reclaims.
        if let Some(check) = self.cas.take() {
            self.store.cas_verdict(check)?;
        }
        let hash = self.store.disk.ring.hash(&self.key);
        let stored = self.store.put_head(&self.key, hash, &self.upload, &opts)?;
        Ok(stored.expect("a put that may wait completes"))
    }
}

/// A value being read in pieces ([`Store::reader`]). It holds the store's disk engine, not a
/// borrow of the store, so it can be moved to the thread that reads it.
pub struct ValueReader {
    disk: std::sync::Arc<crate::disk::Disk>,
    key: Vec<u8>,
    /// The value's description (length, version, content type, where); `data` is empty.
    value: Value,
    pieces: Pieces,
}

/// The index entry of the head being read, to drop if a chunk turns out lost.
type HeadLoc = crate::index::Loc;

enum Pieces {
    /// A value of one record, read whole: handed out at once.
    Whole(Option<Bytes>),
    /// A large value's chunks and the part of the value wanted; the head's generation, whose
    /// pin holds off the punch of the chunks while they are read.
    Chunks { head: HeadLoc, generation: u32, chunks: Vec<ChunkRef>, next: usize, at: u64, start: u64, end: u64 },
}

impl Drop for ValueReader {
    fn drop(&mut self) {
        if let Pieces::Chunks { head, generation, .. } = self.pieces {
            self.disk.unpin(head, generation);
        }
    }
}

impl Store {
    /// Opens `part` of the value of `key` for reading in pieces: `Ok(None)` when absent. A
    /// large value's pieces are its chunks (only those the part overlaps), each read and
    /// verified when asked for; any other value comes in one piece. Blocks on the device.
    pub fn reader(&self, key: &[u8], part: Part) -> Result<Option<ValueReader>> {
        let hash = self.disk.ring.hash(key);
        // The description and the table must come from the same head: a write in between
        // (rare) makes the look go round again.
        for _ in 0..3 {
            let Some(head) = self.get(key, &ReadOptions { part: Part::Nothing, nonblocking: false, coded: false })?
            else {
                return Ok(None);
            };
            let (start, end) = match part {
                Part::Whole => (0, head.len),
                Part::Nothing => (0, 0),
                Part::Range(r) => r.resolve(head.len).unwrap_or((0, 0)),
            };
            let pieces = match self.disk.chunk_table(hash, key)? {
                // The same write: store times are unique.
                Some((loc, chunks, stored_ms)) if stored_ms == head.stored_ms => {
                    // Not pinned: replaced or deleted since the look, perhaps already punched.
                    let Some(generation) = self.disk.ring.live_generation(loc).filter(|&g| self.disk.pin(loc, g))
                    else {
                        continue;
                    };
                    Pieces::Chunks { head: loc, generation, chunks, next: 0, at: 0, start, end }
                }
                Some(_) => continue,
                None => match self.get(key, &ReadOptions { part, nonblocking: false, coded: false })? {
                    Some(v) if v.version() == head.version() => Pieces::Whole(Some(v.data)),
                    Some(_) => continue,
                    None => return Ok(None),
                },
            };
            let value = Value { data: Bytes::new(), start, ..head };
            return Ok(Some(ValueReader { disk: self.disk.clone(), key: key.to_vec(), value, pieces }));
        }
        Err(Error::new(ErrorKind::WouldBlock, "the value changed under three reads in a row"))
    }
}

impl ValueReader {
    /// What is being read: length, version, content type, where its record lives, and the
    /// offset of the first byte the pieces hold (`start`).
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The next piece, verified; `Ok(None)` after the last. A chunk that is gone or fails
    /// verification is an error (`ErrorKind::Corrupt`), and the value is dropped from the
    /// store: a caller streaming it must not complete the answer.
    pub fn next_piece(&mut self) -> Result<Option<Bytes>> {
        match &mut self.pieces {
            Pieces::Whole(data) => Ok(data.take()),
            Pieces::Chunks { head, chunks, next, at, start, end, .. } => {
                while let Some(c) = chunks.get(*next) {
                    *next += 1;
                    let (from, to) = (*at, *at + c.len as u64);
                    *at = to;
                    if to <= *start || from >= *end {
                        continue;
                    }
                    let (s, e) = ((*start).max(from) - from, (*end).min(to) - from);
                    let hash = self.disk.ring.hash(&self.key);
                    return match self.disk.read_chunk(hash, *head, &self.key, c, s, e)? {
                        Some(data) => Ok(Some(data)),
                        None => Err(Error::new(ErrorKind::Corrupt, "a chunk of the value is lost or damaged")),
                    };
                }
                Ok(None)
            }
        }
    }
}
