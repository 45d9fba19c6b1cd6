//! The manifest: the data directory's identity (format version, directory id, key-hash seed)
//! and the ring's shape. Rewritten atomically (temporary file, fsync, rename, directory fsync).
//!
//! The active slot it records is advisory: volume headers carry a sequence number, and
//! recovery takes the volume with the highest sequence as the active one, so a crash between
//! a rotation and a manifest update costs nothing.

use crate::io;
use std::path::Path;

/// Manifest format version written by this build.
pub const MANIFEST_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"LARDMANI";
const LEN: usize = 64;
/// File name of the manifest inside the data directory.
pub const FILE_NAME: &str = "MANIFEST";

/// The decoded manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    /// Random id of this data directory, written into every volume header.
    pub dir_id: [u8; 16],
    /// Seed of the key hash; hint files store hashes made with it.
    pub hash_seed: u64,
    /// Volume size the directory was last opened with.
    pub volume_size: u64,
    /// Volume count the directory was last opened with.
    pub volume_count: u32,
    /// Slot being written when the manifest was last saved (advisory).
    pub active_slot: u32,
}

impl Manifest {
    /// A new manifest with a fresh random id and seed.
    pub fn fresh(volume_size: u64, volume_count: u32) -> std::io::Result<Manifest> {
        let mut rnd = [0u8; 24];
        getrandom::fill(&mut rnd).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Manifest {
            dir_id: rnd[..16].try_into().unwrap(),
            hash_seed: u64::from_le_bytes(rnd[16..].try_into().unwrap()),
            volume_size,
            volume_count,
            active_slot: 0,
        })
    }

    /// Encodes to the 64-byte on-disk form.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&MANIFEST_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.active_slot.to_le_bytes());
        b[16..32].copy_from_slice(&self.dir_id);
        b[32..40].copy_from_slice(&self.hash_seed.to_le_bytes());
        b[40..48].copy_from_slice(&self.volume_size.to_le_bytes());
        b[48..52].copy_from_slice(&self.volume_count.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and verifies; `None` if the bytes are not a sound manifest of a known version.
    pub fn decode(b: &[u8]) -> Option<Manifest> {
        if b.len() != LEN || &b[0..8] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        if crc32c::crc32c(&b[..60]) != u32_at(60) || u32_at(8) != MANIFEST_VERSION {
            return None;
        }
        Some(Manifest {
            active_slot: u32_at(12),
            dir_id: b[16..32].try_into().unwrap(),
            hash_seed: u64::from_le_bytes(b[32..40].try_into().unwrap()),
            volume_size: u64::from_le_bytes(b[40..48].try_into().unwrap()),
            volume_count: u32_at(48),
        })
    }

    /// Reads the manifest of `dir`: `Ok(None)` when there is none, `Err` when unreadable.
    pub fn load(dir: &Path) -> std::io::Result<Option<Option<Manifest>>> {
        match std::fs::read(dir.join(FILE_NAME)) {
            Ok(b) => Ok(Some(Manifest::decode(&b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the manifest into `dir` atomically.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        io::write_atomic(&dir.join(FILE_NAME), &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let m = Manifest::fresh(1 << 20, 4).unwrap();
        assert_eq!(Manifest::decode(&m.encode()), Some(m));
        let mut b = m.encode();
        b[33] ^= 1;
        assert_eq!(Manifest::decode(&b), None);
    }
}
