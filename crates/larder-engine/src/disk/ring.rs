//! The ring of volumes: one slot per volume file, each with its current generation, the data
//! directories the slots are placed in, and positional reads of a slot's file.
//!
//! A slot's generation changes when the ring reuses it; an index entry keeps 7 bits of the
//! generation it was written in, and every read compares the whole generation it looked up
//! with the one in the record's header, so a reader racing with reuse reads either the old
//! bytes or bytes that fail the check, never another record as this one.

use super::dirs::{self, DataDir};
use crate::config::StoreConfig;
use crate::format::large::ChunkRef;
use crate::format::manifest::Manifest;
use crate::format::record::{self, Header, HEADER_LEN};
use crate::index::{Loc, TAG_MASK};
use crate::stats::Counters;
use crate::{io, Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

pub(crate) struct SlotState {
    /// The slot's volume file in each data directory it has been placed in (a file stays
    /// open, emptied, after the slot moves on, so that moving back needs no new handle).
    pub files: Box<[OnceLock<io::Handle>]>,
    /// The directory holding the current generation ([`NO_DIR`] = none yet).
    pub dir: AtomicU32,
    /// Current generation; 0 = the slot holds no data yet.
    pub generation: AtomicU32,
    /// Checksum salt of the current generation's records.
    pub salt: AtomicU32,
    pub sequence: AtomicU64,
    /// Bytes in the file (header and records).
    pub len: AtomicU64,
}

/// `SlotState::dir` of a slot that holds no volume.
pub(crate) const NO_DIR: u32 = u32::MAX;

impl SlotState {
    /// The file of the current generation, if the slot has one.
    pub fn file(&self) -> Option<&dyn io::FileIo> {
        self.files.get(self.dir.load(Ordering::Acquire) as usize)?.get().map(|f| &**f)
    }

    /// The directory of the current generation.
    pub fn dir(&self) -> Option<usize> {
        let d = self.dir.load(Ordering::Acquire);
        (d != NO_DIR).then_some(d as usize)
    }
}

/// The volumes and where they live; shared by the writer, readers, recovery and maintenance.
pub(crate) struct Ring {
    pub cfg: StoreConfig,
    /// Seed of the key hash (from the manifest).
    pub seed: u64,
    /// The data directories, indexed as in the manifest's table.
    pub dirs: Vec<DataDir>,
    /// Opened without a directory that held volumes, or with volumes left out of the index:
    /// keys may have older records there, so deletes always write a tombstone.
    pub degraded: bool,
    pub manifest: Mutex<Manifest>,
    pub slots: Box<[SlotState]>,
    pub counters: Counters,
}

impl Ring {
    /// A ring of `cfg.volume_count` empty slots over `dirs`; recovery fills the slots in.
    pub fn new(cfg: StoreConfig, manifest: Manifest, dirs: Vec<DataDir>, degraded: bool) -> Ring {
        let slots = (0..cfg.volume_count)
            .map(|_| SlotState {
                files: (0..dirs.len()).map(|_| OnceLock::new()).collect(),
                dir: AtomicU32::new(NO_DIR),
                generation: AtomicU32::new(0),
                salt: AtomicU32::new(0),
                sequence: AtomicU64::new(0),
                len: AtomicU64::new(0),
            })
            .collect();
        Ring {
            seed: manifest.hash_seed,
            dirs,
            degraded,
            manifest: Mutex::new(manifest),
            slots,
            counters: Counters::default(),
            cfg,
        }
    }

    pub fn hash(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed)
    }

    pub fn loc(&self, slot: usize, generation: u32, offset: u64, record_len: u64) -> Loc {
        Loc {
            slot: slot as u16,
            tag: (generation & TAG_MASK) as u8,
            offset,
            class: record::size_class(record_len),
            hits: 0,
        }
    }

    /// The generation `loc` must be read with, or `None` if its slot has moved on.
    pub fn live_generation(&self, loc: Loc) -> Option<u32> {
        let g = self.slots[loc.slot as usize].generation.load(Ordering::Acquire);
        (g != 0 && (g & TAG_MASK) as u8 == loc.tag).then_some(g)
    }

    /// Whether the volume chunk `c` was written in is still in its slot (its generation and
    /// its sequence: generations restart in a slot whose volume recovery discarded).
    pub fn holds(&self, c: &ChunkRef) -> bool {
        self.slots.get(c.slot as usize).is_some_and(|s| {
            s.generation.load(Ordering::Acquire) == c.generation && s.sequence.load(Ordering::Acquire) == c.sequence
        })
    }

    /// The header of the record at `loc` if it is of the current generation and has key `key`.
    /// A read that fails is an error, not an absence.
    pub fn header_at(&self, loc: Loc, key: &[u8]) -> Result<Option<Header>> {
        let (Some(g), Some(file)) = (self.live_generation(loc), self.slots[loc.slot as usize].file()) else {
            return Ok(None);
        };
        let salt = self.slots[loc.slot as usize].salt.load(Ordering::Acquire);
        let want = (record::size_class_bytes(loc.class) as usize).min(HEADER_LEN + key.len());
        let mut buf = vec![0u8; want];
        let n = self.read(&self.slots[loc.slot as usize], file, &mut buf, loc.offset, false)?.unwrap_or(0);
        let Ok(h) = record::decode_header(&buf[..n], salt) else { return Ok(None) };
        if h.generation != g {
            return Ok(None);
        }
        if &buf[HEADER_LEN..HEADER_LEN + h.key_len as usize] != key {
            self.collided();
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Counts a read that found another key's record where the index pointed.
    pub fn collided(&self) {
        self.counters.collision_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the live record at `loc` is of another key than `key`, from a read that does
    /// not wait (of its header and up to 256 key bytes, or as many as `key` has, into a buffer
    /// on the stack for most keys): `None` when the read would wait for the device or its key
    /// is longer than was read; `Some(None)` when the slot has moved on or the record does not
    /// verify.
    pub fn other_key_at(&self, loc: Loc, key: &[u8]) -> Option<Option<bool>> {
        let (Some(g), Some(file)) = (self.live_generation(loc), self.slots[loc.slot as usize].file()) else {
            return Some(None);
        };
        let s = &self.slots[loc.slot as usize];
        let want = (HEADER_LEN + key.len().max(256)).min(record::size_class_bytes(loc.class) as usize);
        let (mut small, mut large) = ([0u8; HEADER_LEN + 256], Vec::new());
        let buf = if want <= small.len() {
            &mut small[..want]
        } else {
            large.resize(want, 0);
            &mut large[..]
        };
        let n = match self.read(s, file, buf, loc.offset, true) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(_) => return Some(None),
        };
        let h = match record::decode_header(&buf[..n], s.salt.load(Ordering::Acquire)) {
            Ok(h) => h,
            Err(record::DecodeError::Short) => return None,
            Err(_) => return Some(None),
        };
        if h.generation != g {
            return Some(None);
        }
        Some(Some(&buf[HEADER_LEN..HEADER_LEN + h.key_len as usize] != key))
    }

    /// The hash of the key of the live record at `loc`, from its header and key: `Some(None)`
    /// when the slot has moved on or the read fails; `None` when `nowait` and the read would
    /// wait for the device.
    pub fn key_hash_at(&self, loc: Loc, nowait: bool) -> Option<Option<u64>> {
        let (Some(g), Some(file)) = (self.live_generation(loc), self.slots[loc.slot as usize].file()) else {
            return Some(None);
        };
        let s = &self.slots[loc.slot as usize];
        let want = (record::size_class_bytes(loc.class) as usize).min(HEADER_LEN + record::MAX_KEY_LEN);
        let mut buf = vec![0u8; want];
        let n = match self.read(s, file, &mut buf, loc.offset, nowait) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(_) => return Some(None),
        };
        let Ok(h) = record::decode_header(&buf[..n], s.salt.load(Ordering::Acquire)) else { return Some(None) };
        let end = HEADER_LEN + h.key_len as usize;
        Some((h.generation == g && n >= end).then(|| self.hash(&buf[HEADER_LEN..end])))
    }

    /// Whether a usable directory other than `d` exists (a write that failed in `d` can go
    /// there).
    pub fn another_usable(&self, d: usize) -> bool {
        self.dirs.iter().enumerate().any(|(i, x)| i != d && x.usable())
    }

    /// The directory for a new volume: the usable one with the lowest utilization (see
    /// [`dirs::choose`]); if none is usable, a failed one, which may have recovered.
    pub fn place(&self, cursor: &mut usize) -> Option<usize> {
        let mut used = vec![0u64; self.dirs.len()];
        for s in self.slots.iter() {
            if let Some(d) = s.dir() {
                used[d] += s.len.load(Ordering::Relaxed);
            }
        }
        let any_usable = self.dirs.iter().any(|d| d.usable());
        let mut free_by_dev: Vec<(u64, u64)> = Vec::new();
        let mut cands = Vec::new();
        for (i, d) in self.dirs.iter().enumerate() {
            if !d.present || (any_usable && !d.usable()) {
                continue;
            }
            // Directories on one filesystem share one reading, so that they compare exactly.
            let free = match io::free_space(&d.path) {
                Ok((dev, free)) => match free_by_dev.iter().find(|f| f.0 == dev) {
                    Some(f) => f.1,
                    None => {
                        free_by_dev.push((dev, free));
                        free
                    }
                },
                Err(e) => {
                    d.fail(&e);
                    if any_usable {
                        continue;
                    }
                    0
                }
            };
            cands.push(dirs::Candidate { dir: i, used: used[i], free });
        }
        let d = dirs::choose(&cands, *cursor)?;
        *cursor = d + 1;
        Some(d)
    }

    /// Marks the directory of `slot` failed.
    pub fn fail_dir_of(&self, slot: usize, why: &dyn std::fmt::Display) {
        if let Some(d) = self.slots[slot].dir() {
            self.dirs[d].fail(why);
        }
    }

    /// Reads into `buf` at `offset` of `slot`'s file; `Ok(None)` if `nowait` and the read
    /// would wait for the device. A failure is an error, not a miss: the data may be fine once
    /// the device is.
    ///
    /// A non-blocking read that returns fewer bytes than the file holds there is "would
    /// block" too: Linux 5.9 and 5.10 may answer a `RWF_NOWAIT` read that would block with 0 or
    /// a short count instead of `EAGAIN`. Only a blocking read can come back short for real.
    pub fn read(
        &self,
        slot: &SlotState,
        file: &dyn io::FileIo,
        buf: &mut [u8],
        offset: u64,
        nowait: bool,
    ) -> Result<Option<usize>> {
        let r = if nowait { file.read_cached_at_most(buf, offset) } else { file.read_at_most(buf, offset).map(Some) };
        let n = r.map_err(|e| self.read_failed(e))?;
        Ok(n.filter(|&n| !nowait || n >= self.there(slot, offset, buf.len())))
    }

    /// [`Ring::read`] into a buffer of `len` bytes, not zeroed first (an idle one, for a large
    /// record); it is as long as what was read.
    pub fn read_new(
        &self,
        slot: &SlotState,
        file: &dyn io::FileIo,
        len: usize,
        offset: u64,
        nowait: bool,
    ) -> Result<Option<Vec<u8>>> {
        let buf = io::read_new(file, super::bufs::take(len), len, offset, nowait).map_err(|e| self.read_failed(e))?;
        Ok(buf.filter(|b| !nowait || b.len() >= self.there(slot, offset, len)))
    }

    fn read_failed(&self, e: std::io::Error) -> Error {
        self.counters.read_failures.fetch_add(1, Ordering::Relaxed);
        Error::io("reading a record", e)
    }

    /// Bytes of `len` at `offset` that the slot's file holds. Its length is stored before the
    /// index names a record in it, so a reader that found the record sees at least its end.
    fn there(&self, slot: &SlotState, offset: u64, len: usize) -> usize {
        slot.len.load(Ordering::Acquire).saturating_sub(offset).min(len as u64) as usize
    }
}
