//! Volume files: naming, and the 64-byte header every volume file starts with.
//!
//! A volume is one slot of the ring: an append-only file of records, at most `volume_size`
//! bytes. Its header says which slot it is, its **generation** (incremented each time the slot
//! is reused) and its **sequence** (a store-wide counter of volume activations, which orders
//! the volumes oldest to newest at recovery). Records follow the header, 8-byte aligned.

use bytes::{Buf, BufMut};
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
        super::seal_block(MAGIC, VOLUME_VERSION, |w| {
            w.put_u32_le(self.slot);
            w.put_u32_le(self.generation);
            w.put_u32_le(self.salt);
            w.put_u64_le(self.sequence);
            w.put_u64_le(self.created_ms);
            w.put_slice(&self.dir_id);
        })
    }

    /// Decodes and verifies; `None` for anything that is not a sound volume header.
    pub fn decode(b: &[u8]) -> Option<VolumeHeader> {
        let (version, mut r) = super::open_block(b, MAGIC)?;
        if version != VOLUME_VERSION {
            return None;
        }
        let (slot, generation, salt) = (r.get_u32_le(), r.get_u32_le(), r.get_u32_le());
        let (sequence, created_ms) = (r.get_u64_le(), r.get_u64_le());
        let mut dir_id = [0u8; 16];
        r.copy_to_slice(&mut dir_id);
        Some(VolumeHeader { slot, generation, sequence, salt, created_ms, dir_id })
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
