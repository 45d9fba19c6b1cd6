//! Volume files: naming, and the 64-byte header every volume file starts with.
//!
//! A volume is one slot of the ring: an append-only file of records, at most `volume_size`
//! bytes. Its header says which slot it is, its **generation** (incremented each time the slot
//! is reused) and its **sequence** (a store-wide counter of volume activations, which orders
//! the volumes oldest to newest at recovery). Records follow the header, 8-byte aligned.

use std::path::{Path, PathBuf};

/// Volume file format version written by this build.
pub const VOLUME_VERSION: u32 = 1;
/// Length of the volume header; the first record starts here.
pub const VOLUME_HEADER_LEN: u64 = 64;
const MAGIC: &[u8; 8] = b"LARDRVOL";

/// The decoded volume header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeHeader {
    /// Ring slot this file belongs to.
    pub slot: u32,
    /// Times the slot has been (re)started; records carry it too.
    pub generation: u32,
    /// Store-wide activation counter: higher is newer.
    pub sequence: u64,
    /// Random checksum salt of this generation's records.
    pub salt: u32,
    /// When this generation of the slot was started, ms since the Unix epoch.
    pub created_ms: u64,
    /// The data directory's id (from the manifest), so a volume copied from elsewhere is noticed.
    pub dir_id: [u8; 16],
}

impl VolumeHeader {
    /// Encodes to the 64-byte on-disk form.
    pub fn encode(&self) -> [u8; VOLUME_HEADER_LEN as usize] {
        let mut b = [0u8; VOLUME_HEADER_LEN as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VOLUME_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.slot.to_le_bytes());
        b[16..20].copy_from_slice(&self.generation.to_le_bytes());
        b[20..24].copy_from_slice(&self.salt.to_le_bytes());
        b[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        b[32..40].copy_from_slice(&self.created_ms.to_le_bytes());
        b[40..56].copy_from_slice(&self.dir_id);
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and verifies; `None` for anything that is not a sound volume header.
    pub fn decode(b: &[u8]) -> Option<VolumeHeader> {
        if b.len() < VOLUME_HEADER_LEN as usize || &b[0..8] != MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        if crc32c::crc32c(&b[..60]) != u32_at(60) || u32_at(8) != VOLUME_VERSION {
            return None;
        }
        Some(VolumeHeader {
            slot: u32_at(12),
            generation: u32_at(16),
            sequence: u64_at(24),
            salt: u32_at(20),
            created_ms: u64_at(32),
            dir_id: b[40..56].try_into().unwrap(),
        })
    }
}

/// Path of slot `slot`'s volume file.
pub fn volume_path(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("vol-{slot:05}.lrv"))
}

/// Path of slot `slot`'s hint file.
pub fn hint_path(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("vol-{slot:05}.hint"))
}

/// The slot number of a volume or hint file name, if it is one.
pub fn slot_of_file_name(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("vol-")?;
    let num = rest.strip_suffix(".lrv").or_else(|| rest.strip_suffix(".hint"))?;
    num.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_damage() {
        let h = VolumeHeader { slot: 3, generation: 9, sequence: 77, salt: 3, created_ms: 5, dir_id: [7; 16] };
        let b = h.encode();
        assert_eq!(VolumeHeader::decode(&b), Some(h));
        for i in 0..64 {
            let mut d = b;
            d[i] ^= 0x10;
            assert_eq!(VolumeHeader::decode(&d), None, "flip at {i}");
        }
        assert_eq!(slot_of_file_name("vol-00012.lrv"), Some(12));
        assert_eq!(slot_of_file_name("vol-00012.hint"), Some(12));
        assert_eq!(slot_of_file_name("manifest"), None);
    }
}
