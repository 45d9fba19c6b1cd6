//! The manifest: the store's identity (store id, key-hash seed), the ring's shape, and where
//! each volume lives: a table of the data directories (by id) and, per ring slot, the
//! directory holding it and the sequence it was started with.
//!
//! Every data directory holds a copy, rewritten atomically (temporary file, fsync, rename,
//! directory fsync); each save raises an epoch and the copy with the highest epoch wins, so
//! losing one directory loses no knowledge of the others. Paths in the table are only what
//! each directory was last seen as, for messages: directories are told apart by the id in
//! their `DIR-ID` file, so reordering `--data-dir` flags never misreads data.
//!
//! With one directory the active slot is advisory: volume headers carry a sequence number and
//! recovery takes the highest as the active volume. With several, the slot table is written
//! before each volume is started, so that a directory that goes missing is known to have held
//! exactly the volumes the table names.

use bytes::{Buf, BufMut};
use std::path::{Path, PathBuf};

/// Manifest format version written by this build (1 = one directory, 64 bytes, still read).
pub const MANIFEST_VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"LARDMANI";
const V1_LEN: usize = 64;
const FIXED_LEN: usize = 64;
/// File name of the manifest inside each data directory.
pub const FILE_NAME: &str = "MANIFEST";
/// `SlotEntry::dir` of a slot that has never held a volume.
pub const NO_DIR: u16 = u16::MAX;
const MAX_PATH: usize = 4096;

/// A data directory the store knows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The id in the directory's `DIR-ID` file (and in its volumes' headers).
    pub id: [u8; 16],
    /// Where it was last seen; for messages only.
    pub path: PathBuf,
}

/// Where a ring slot's current volume lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotEntry {
    /// Index into the directory table, or [`NO_DIR`].
    pub dir: u16,
    /// The sequence the volume was started with (0 when unknown).
    pub sequence: u64,
}

impl SlotEntry {
    const NONE: SlotEntry = SlotEntry { dir: NO_DIR, sequence: 0 };
}

/// The decoded manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Random id of the store, written into every directory's `DIR-ID` file, so that a
    /// directory of another store is never taken for one of this store's.
    pub store_id: [u8; 16],
    /// Seed of the key hash; hint files store hashes made with it.
    pub hash_seed: u64,
    /// Volume size the store was last opened with.
    pub volume_size: u64,
    /// Volume count the store was last opened with.
    pub volume_count: u32,
    /// Slot being written when the manifest was last saved.
    pub active_slot: u32,
    /// Raised by every save; the copy with the highest epoch is the current one.
    pub epoch: u64,
    /// The data directories, as the slot table refers to them.
    pub dirs: Vec<DirEntry>,
    /// One entry per ring slot (at most `volume_count`; missing ones are `SlotEntry::NONE`: no directory).
    pub slots: Vec<SlotEntry>,
}

impl Manifest {
    /// A new manifest with a fresh random store id and seed, no directories and no volumes.
    pub fn fresh(volume_size: u64, volume_count: u32) -> std::io::Result<Manifest> {
        let mut rnd = [0u8; 24];
        getrandom::fill(&mut rnd).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Manifest {
            store_id: rnd[..16].try_into().unwrap(),
            hash_seed: (&rnd[16..]).get_u64_le(),
            volume_size,
            volume_count,
            active_slot: 0,
            epoch: 0,
            dirs: Vec::new(),
            slots: vec![SlotEntry::NONE; volume_count as usize],
        })
    }

    /// The slot entry of `slot` (none if the table is shorter).
    pub fn slot(&self, slot: usize) -> SlotEntry {
        self.slots.get(slot).copied().unwrap_or(SlotEntry::NONE)
    }

    /// The table index of directory `id`, adding it (at `path`) if it is new.
    pub fn dir_index(&mut self, id: [u8; 16], path: &Path) -> usize {
        match self.dirs.iter().position(|d| d.id == id) {
            Some(i) => {
                self.dirs[i].path = path.to_path_buf();
                i
            }
            None => {
                self.dirs.push(DirEntry { id, path: path.to_path_buf() });
                self.dirs.len() - 1
            }
        }
    }

    /// Drops directories no slot refers to (a missing directory is forgotten once the ring
    /// has moved all of its volumes elsewhere), keeping those in `keep`.
    pub fn forget_unused_dirs(&mut self, keep: &[[u8; 16]]) {
        let used: Vec<bool> = (0..self.dirs.len())
            .map(|i| keep.contains(&self.dirs[i].id) || self.slots.iter().any(|s| s.dir as usize == i))
            .collect();
        let mut renumber = vec![NO_DIR; self.dirs.len()];
        let mut next = 0u16;
        for (i, &u) in used.iter().enumerate() {
            if u {
                renumber[i] = next;
                next += 1;
            }
        }
        let mut i = 0;
        self.dirs.retain(|_| {
            i += 1;
            used[i - 1]
        });
        for s in &mut self.slots {
            if s.dir != NO_DIR {
                s.dir = renumber[s.dir as usize];
            }
        }
    }

    /// Encodes to the on-disk form (see docs/FORMAT.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_LEN + 4 + 10 * self.volume_count as usize);
        b.put_slice(MAGIC);
        b.put_u32_le(MANIFEST_VERSION);
        b.put_u32_le(self.active_slot);
        b.put_slice(&self.store_id);
        b.put_u64_le(self.hash_seed);
        b.put_u64_le(self.volume_size);
        b.put_u32_le(self.volume_count);
        b.put_u16_le(self.dirs.len() as u16);
        b.put_u16_le(0); // reserved
        b.put_u64_le(self.epoch);
        debug_assert_eq!(b.len(), FIXED_LEN);
        for d in &self.dirs {
            let p = d.path.as_os_str().as_encoded_bytes();
            let p = &p[..p.len().min(MAX_PATH)];
            b.put_slice(&d.id);
            b.put_u16_le(p.len() as u16);
            b.put_slice(p);
        }
        for i in 0..self.volume_count as usize {
            let s = self.slot(i);
            b.put_u16_le(s.dir);
            b.put_u64_le(s.sequence);
        }
        let crc = crc32c::crc32c(&b);
        b.put_u32_le(crc);
        b
    }

    /// Decodes and verifies; `None` if the bytes are not a sound manifest of a known version.
    /// A version 1 manifest (one directory, whose id was the manifest's) reads as a store of
    /// one directory holding every slot.
    pub fn decode(b: &[u8]) -> Option<Manifest> {
        if b.len() < V1_LEN || &b[0..8] != MAGIC {
            return None;
        }
        // The fields versions 1 and 2 share, in order.
        let mut r = &b[8..];
        let version = r.get_u32_le();
        let active_slot = r.get_u32_le();
        let mut store_id = [0u8; 16];
        r.copy_to_slice(&mut store_id);
        let (hash_seed, volume_size, volume_count) = (r.get_u64_le(), r.get_u64_le(), r.get_u32_le());
        let mut m = Manifest {
            store_id,
            hash_seed,
            volume_size,
            volume_count,
            active_slot,
            epoch: 0,
            dirs: Vec::new(),
            slots: Vec::new(),
        };
        match version {
            1 => {
                if b.len() != V1_LEN || super::open_block(b, MAGIC).is_none() {
                    return None;
                }
                m.dirs.push(DirEntry { id: m.store_id, path: PathBuf::new() });
                m.slots = vec![SlotEntry { dir: 0, sequence: 0 }; m.volume_count as usize];
                Some(m)
            }
            MANIFEST_VERSION => {
                let body = b.len().checked_sub(4)?;
                if crc32c::crc32c(&b[..body]) != (&b[body..]).get_u32_le() {
                    return None;
                }
                let dirs = r.get_u16_le();
                r.advance(2); // reserved
                m.epoch = r.get_u64_le();
                let mut r = b.get(FIXED_LEN..body)?;
                for _ in 0..dirs {
                    if r.remaining() < 18 {
                        return None;
                    }
                    let mut id = [0u8; 16];
                    r.copy_to_slice(&mut id);
                    let len = r.get_u16_le() as usize;
                    let p = r.get(..len)?;
                    let path = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(p));
                    r.advance(len);
                    m.dirs.push(DirEntry { id, path });
                }
                for _ in 0..m.volume_count {
                    if r.remaining() < 10 {
                        return None;
                    }
                    let dir = r.get_u16_le();
                    if dir != NO_DIR && dir as usize >= m.dirs.len() {
                        return None;
                    }
                    m.slots.push(SlotEntry { dir, sequence: r.get_u64_le() });
                }
                r.is_empty().then_some(m)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut m = Manifest::fresh(1 << 20, 4).unwrap();
        m.dir_index([1; 16], Path::new("/srv/a"));
        m.dir_index([2; 16], Path::new("/srv/b"));
        m.slots[0] = SlotEntry { dir: 0, sequence: 5 };
        m.slots[1] = SlotEntry { dir: 1, sequence: 6 };
        m.epoch = 9;
        m
    }

    #[test]
    fn round_trip_and_damage() {
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(&b), Some(m));
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 1;
            assert_eq!(Manifest::decode(&d), None, "flip at {i}");
        }
        assert_eq!(Manifest::decode(&b[..b.len() - 1]), None);
    }

    #[test]
    fn version_1_reads_as_one_directory() {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&2u32.to_le_bytes());
        b[16..32].copy_from_slice(&[7; 16]);
        b[32..40].copy_from_slice(&99u64.to_le_bytes());
        b[40..48].copy_from_slice(&(1u64 << 20).to_le_bytes());
        b[48..52].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        let m = Manifest::decode(&b).unwrap();
        assert_eq!((m.store_id, m.hash_seed, m.active_slot, m.volume_count), ([7; 16], 99, 2, 3));
        assert_eq!(m.dirs.len(), 1);
        assert_eq!(m.dirs[0].id, [7; 16]);
        assert!(m.slots.iter().all(|s| s.dir == 0));
    }

    #[test]
    fn unused_directories_are_forgotten() {
        let mut m = sample();
        m.dir_index([3; 16], Path::new("/srv/c"));
        m.slots[0] = SlotEntry { dir: 2, sequence: 7 };
        m.forget_unused_dirs(&[]);
        assert_eq!(m.dirs.iter().map(|d| d.id[0]).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!((m.slots[0].dir, m.slots[1].dir), (1, 0));
    }
}
