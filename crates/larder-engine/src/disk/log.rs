//! The append log: one writer at a time appends records at the active volume's end, and
//! turns the ring (seals the volume, starts the next slot's new generation) when it is full.
//!
//! Records, tombstones and rotations happen in log order under the writer lock, so the index
//! always agrees with what replay would build.

use super::dirs;
use super::{Disk, Job};
use crate::clock::{now_ms, sequence_after};
use crate::config::FsyncPolicy;
use crate::format::record::{self, Header, HEADER_LEN};
use crate::format::volume::{hint_path, volume_path, VolumeHeader, VOLUME_HEADER_LEN};
use crate::index::Loc;
use crate::types::Position;
use crate::{io, Error, ErrorKind, Result};
use std::sync::atomic::Ordering;

pub(crate) struct Writer {
    pub active: usize,
    pub offset: u64,
    pub next_sequence: u64,
    /// Records appended since open; group commit compares against it.
    pub appended: u64,
    /// Sealed slots whose data has not been fdatasynced yet.
    pub unsynced: Vec<usize>,
    /// With `FsyncPolicy::Always`: the index changes of writes not yet durable, oldest first,
    /// to be undone if their sync fails.
    pub undo: Vec<super::durable::Undo>,
    /// Volumes (slot, generation) holding records of puts that were undone after a failed
    /// sync. The page cache may still write them back, and recovery would then find them, so
    /// while one of these volumes lives a delete of an absent key writes a tombstone too.
    pub strays: Vec<(usize, u32)>,
    pub prefix: Vec<u8>,
    /// Store time of the last put or delete: each gets a later one (by a millisecond if the
    /// clock has not moved, or has stepped back), so no two writes share a version. Seeded
    /// at open with the newest store time recovery saw, so this holds across restarts too.
    pub last_stamp: u64,
    /// Set by `close`: no record is appended after the checkpoint is taken.
    pub closed: bool,
    /// Round-robin cursor of placement among equally used directories.
    pub cursor: usize,
    /// The key hashes of the records written last, by place: a write that replaces one of
    /// them learns whether it took another key's entry without reading that record.
    pub recent: Recent,
}

/// A direct-mapped table of (place, key hash) of recent writes (1 MiB).
pub(crate) struct Recent(Vec<(u64, u64)>);

const RECENT: usize = 1 << 16;

impl Default for Recent {
    fn default() -> Self {
        Recent(vec![(u64::MAX, 0); RECENT])
    }
}

impl Recent {
    fn place(loc: Loc) -> u64 {
        ((loc.tag as u64) << 61) | ((loc.slot as u64) << 44) | (loc.offset / 8)
    }

    fn at(place: u64) -> usize {
        (place.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as usize % RECENT
    }

    /// The record at `loc` has a key hashed `hash`.
    pub fn note(&mut self, loc: Loc, hash: u64) {
        let p = Self::place(loc);
        self.0[Self::at(p)] = (p, hash);
    }

    /// The key hash of the record at `loc`, if it was written recently.
    pub fn hash_of(&self, loc: Loc) -> Option<u64> {
        let p = Self::place(loc);
        let (q, h) = self.0[Self::at(p)];
        (q == p).then_some(h)
    }
}

impl Writer {
    /// Whether a volume may hold a record the index does not know of (see `strays`);
    /// forgets the volumes the ring has reused since.
    pub fn has_strays(&mut self, slots: &[super::ring::SlotState]) -> bool {
        self.strays.retain(|&(slot, generation)| slots[slot].generation.load(Ordering::Relaxed) == generation);
        !self.strays.is_empty()
    }

    /// A store time for a write made now, later than every earlier one.
    pub(super) fn stamp(&mut self) -> u64 {
        self.last_stamp = now_ms().max(self.last_stamp + 1);
        self.last_stamp
    }
}

/// A record to append: its header (the generation is set by the append), key, metadata
/// block and value, with the value's CRC32C. The value comes in parts (as a request body
/// arrives), written with the rest of the record by one vectored write, never joined.
#[derive(Clone, Copy)]
pub(crate) struct Append<'a> {
    pub header: Header,
    pub key: &'a [u8],
    pub meta: &'a [u8],
    pub value: &'a [&'a [u8]],
    pub value_crc: u32,
}

const ZEROS: [u8; record::ALIGN as usize] = [0; record::ALIGN as usize];

impl Disk {
    /// Starts a new generation of `slot`: its old records become unreachable at once, its old
    /// file is emptied, and the new volume is placed on the least utilized usable directory.
    ///
    /// `created_ms` is the time written into its header: no earlier than any store time
    /// stamped so far, so that recovery, which takes the newest it finds, never seeds the
    /// writer's stamps below a write already made.
    pub fn start_volume(&self, slot: usize, sequence: u64, created_ms: u64, cursor: &mut usize) -> Result<()> {
        let s = &self.ring.slots[slot];
        let generation = s.generation.load(Ordering::Relaxed).wrapping_add(1).max(1);
        if s.len.load(Ordering::Relaxed) > VOLUME_HEADER_LEN {
            self.ring.counters.volumes_evicted.fetch_add(1, Ordering::Relaxed);
        }
        let mut salt = [0u8; 4];
        getrandom::fill(&mut salt).map_err(|e| Error::new(ErrorKind::Io, format!("no randomness for a salt: {e}")))?;
        let salt = u32::from_le_bytes(salt);
        // Readers holding entries of the old generation now fail the generation check; the
        // salt changes after it, so a reader that saw the old generation fails its checksum.
        s.generation.store(generation, Ordering::Release);
        s.salt.store(salt, Ordering::Release);
        self.held.started(slot, generation);
        // Free the old volume's space first, so that placement sees it free. In a failed
        // directory this may not work: recovery then finds two files of the slot and keeps
        // the one with the higher sequence.
        if let (Some(d), Some(file)) = (s.dir(), s.file()) {
            let dir = &self.ring.dirs[d];
            let reset = io::remove_if_exists(&hint_path(&dir.path, slot))
                .map_err(|e| Error::io("removing a hint file", e))
                .and_then(|()| file.set_len(0).map_err(|e| Error::io("resetting a volume", e)));
            if let Err(e) = reset {
                dir.fail(&e);
                if !self.ring.another_usable(d) {
                    return Err(e);
                }
            }
        }
        s.len.store(0, Ordering::Relaxed);
        let mut last_err = None;
        for _ in 0..self.ring.dirs.len() {
            let Some(d) = self.ring.place(cursor) else { break };
            match self.create_volume(slot, d, generation, sequence, salt, created_ms) {
                Ok(()) => {
                    s.sequence.store(sequence, Ordering::Release);
                    s.len.store(VOLUME_HEADER_LEN, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    self.ring.dirs[d].fail(&e);
                    let retry = self.ring.another_usable(d);
                    last_err = Some(e);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last_err.unwrap_or_else(|| Error::new(ErrorKind::Io, "no data directory is usable")))
    }

    /// Records `slot`'s new volume in the manifest, then creates it in directory `d`.
    fn create_volume(
        &self,
        slot: usize,
        d: usize,
        generation: u32,
        sequence: u64,
        salt: u32,
        created_ms: u64,
    ) -> Result<()> {
        let s = &self.ring.slots[slot];
        let dir = &self.ring.dirs[d];
        {
            let mut m = self.ring.manifest.lock();
            m.slots[slot] = crate::format::manifest::SlotEntry { dir: d as u16, sequence };
            m.active_slot = slot as u32;
            // With several directories the manifest must name the volume's directory before
            // the volume exists: if that directory goes missing, recovery knows what it held.
            if self.ring.dirs.len() > 1 {
                dirs::save_manifest(&mut m, &self.ring.dirs)?;
                if !dir.usable() && self.ring.another_usable(d) {
                    return Err(Error::new(ErrorKind::Io, "the directory failed while the manifest was saved"));
                }
            } else {
                self.send(Job::Manifest);
            }
        }
        io::remove_if_exists(&hint_path(&dir.path, slot)).map_err(|e| Error::io("removing a hint file", e))?;
        let created = s.files[d].get().is_none();
        if created {
            let f = io::open(&volume_path(&dir.path, slot), io::Mode::Create)
                .map_err(|e| Error::io("creating a volume", e))?;
            let _ = s.files[d].set(f);
        }
        let file = s.files[d].get().expect("set above");
        file.set_len(0).map_err(|e| Error::io("resetting a volume", e))?;
        let vh = VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms, dir_id: dir.id };
        file.write_all_vectored_at(&[&vh.encode()], 0).map_err(|e| Error::io("writing a volume header", e))?;
        if self.ring.cfg.fsync != FsyncPolicy::Never {
            file.sync_data().map_err(|e| Error::io("syncing a volume header", e))?;
            if created {
                io::sync_dir(&dir.path).map_err(|e| Error::io("syncing the data directory", e))?;
            }
        }
        s.dir.store(d as u32, Ordering::Release);
        dir.recovered();
        Ok(())
    }

    /// Seals the active volume and moves the writer to the next slot of the ring.
    pub fn rotate(&self, w: &mut Writer) -> Result<()> {
        let old = w.active;
        let next = (old + 1) % self.ring.slots.len();
        let sequence = sequence_after(w.next_sequence);
        self.start_volume(next, sequence, now_ms().max(w.last_stamp), &mut w.cursor)?;
        w.next_sequence = sequence + 1;
        // The slot after the new active one is the next to be overwritten: copy its hot
        // entries forward while the new volume fills.
        let oldest = (next + 1) % self.ring.slots.len();
        let og = self.ring.slots[oldest].generation.load(Ordering::Relaxed);
        if self.ring.cfg.reinsert_min_hits > 0 && oldest != next && og != 0 {
            self.send(Job::Reinsert { slot: oldest, generation: og });
        }
        let os = &self.ring.slots[old];
        if next != old {
            // Whatever the policy, so that an explicit sync covers sealed volumes too; a slot
            // is listed once, which bounds the list by the ring's size.
            if !w.unsynced.contains(&old) {
                w.unsynced.push(old);
            }
            self.send(Job::Hint {
                slot: old,
                generation: os.generation.load(Ordering::Relaxed),
                sequence: os.sequence.load(Ordering::Relaxed),
                len: w.offset,
                through: Some(w.appended),
            });
        }
        w.active = next;
        self.active.store(next as u32, Ordering::Relaxed);
        w.offset = VOLUME_HEADER_LEN;
        self.ring.counters.rotations.fetch_add(1, Ordering::Relaxed);
        self.send(Job::Sweep);
        Ok(())
    }

    /// Appends one record under the writer lock. Returns the record's position and index
    /// entry; the caller publishes it. `Ok(None)`, with nothing written, if `wait` is false
    /// and the record could only go in after turning the ring (which truncates and syncs
    /// files): the caller retries on a thread that may block.
    pub fn append(&self, w: &mut Writer, wait: bool, rec: &Append<'_>) -> Result<Option<(Position, Loc)>> {
        let dir = self.ring.slots[w.active].dir();
        match self.write_record(w, wait, rec) {
            // The device is full but the ring's next slot holds older data, or another
            // directory may have room: turn the ring now, as it would turn later anyway;
            // emptying that slot, or placing the next volume elsewhere, makes the room.
            Err(e)
                if e.kind() == ErrorKind::NoSpace
                    && w.offset > VOLUME_HEADER_LEN
                    && (self.next_holds_data(w) || dir.is_some_and(|d| self.ring.another_usable(d))) =>
            {
                if !wait {
                    return Ok(None);
                }
                tracing::warn!(slot = w.active, "device full: turning the ring early");
                self.rotate(w)?;
                self.write_record(w, wait, rec)
            }
            // The directory failed: the write goes to a new volume in another one.
            Err(e) if e.kind() == ErrorKind::Io && !w.closed && dir.is_some_and(|d| self.ring.another_usable(d)) => {
                if !wait {
                    return Ok(None);
                }
                tracing::warn!(slot = w.active, error = %e, "write failed: moving on to a volume in another directory");
                self.rotate(w)?;
                self.write_record(w, wait, rec)
            }
            r => r,
        }
    }

    /// Whether the slot the ring turns to next holds records (emptying it frees space).
    fn next_holds_data(&self, w: &Writer) -> bool {
        let next = (w.active + 1) % self.ring.slots.len();
        next != w.active && self.ring.slots[next].len.load(Ordering::Relaxed) > VOLUME_HEADER_LEN
    }

    /// Writes one record at the writer's offset, turning the ring first if it does not fit
    /// (`Ok(None)` instead, if `wait` is false).
    fn write_record(&self, w: &mut Writer, wait: bool, rec: &Append<'_>) -> Result<Option<(Position, Loc)>> {
        let &Append { header, key, meta, value, value_crc } = rec;
        if w.closed {
            return Err(Error::new(ErrorKind::Io, "the store is closed"));
        }
        let value_len: usize = value.iter().map(|p| p.len()).sum();
        let record_len = (HEADER_LEN + key.len() + meta.len() + value_len) as u64;
        let padded = record::padded(record_len);
        // A volume in a directory that failed (a write or sync there did) takes no more
        // records when another directory can.
        let failed =
            self.ring.slots[w.active].dir().is_some_and(|d| !self.ring.dirs[d].usable() && self.ring.another_usable(d));
        if w.offset + padded > self.ring.cfg.volume_size || (failed && w.offset > VOLUME_HEADER_LEN) {
            if !wait {
                return Ok(None);
            }
            self.rotate(w)?;
        }
        let slot = w.active;
        let generation = self.ring.slots[slot].generation.load(Ordering::Relaxed);
        let salt = self.ring.slots[slot].salt.load(Ordering::Relaxed);
        let header = Header { generation, ..header };
        let mut prefix = std::mem::take(&mut w.prefix);
        prefix.clear();
        record::encode_prefix(&mut prefix, &header, key, meta, value_len, value_crc, salt);
        let pad = &ZEROS[..(padded - record_len) as usize];
        let file = self.ring.slots[slot].file().expect("active volume is open");
        let res = match value {
            [one] => file.write_all_vectored_at(&[&prefix, one, pad], w.offset),
            parts => {
                let mut all = Vec::with_capacity(parts.len() + 2);
                all.push(&prefix[..]);
                all.extend_from_slice(parts);
                all.push(pad);
                file.write_all_vectored_at(&all, w.offset)
            }
        };
        w.prefix = prefix;
        // On failure the offset does not move and whatever part of the record reached the file
        // is cut off (best effort): the index never points at it, and recovery never meets it.
        if let Err(e) = res {
            let _ = file.set_len(w.offset);
            self.ring.counters.write_failures.fetch_add(1, Ordering::Relaxed);
            let e = Error::io("writing a record", e);
            if e.kind() == ErrorKind::Io {
                self.ring.fail_dir_of(slot, &e);
            }
            return Err(e);
        }
        let loc = self.ring.loc(slot, generation, w.offset, record_len);
        let pos = Position { volume: slot as u32, offset: w.offset, size: record_len };
        w.offset += padded;
        self.ring.slots[slot].len.store(w.offset, Ordering::Release);
        w.appended += 1;
        // What the volume holds, and the dictionary this record needs as long as it lives.
        self.held.note(slot, generation, &header, meta, value_len as u64);
        Ok(Some((pos, loc)))
    }
}
