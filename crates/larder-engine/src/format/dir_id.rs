//! The `DIR-ID` file: which store a data directory belongs to, and the directory's own id
//! (docs/FORMAT.md, "Directory id").

/// Name of the id file in each data directory.
pub const ID_FILE: &str = "DIR-ID";
const ID_MAGIC: &[u8; 8] = b"LARDDIRI";
const ID_VERSION: u32 = 1;
const ID_LEN: usize = 64;

/// The contents of a `DIR-ID` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirId {
    /// The store the directory belongs to (the manifest's store id).
    pub store_id: [u8; 16],
    /// The directory's own id.
    pub dir_id: [u8; 16],
}

impl DirId {
    /// Encodes to the 64-byte on-disk form.
    pub fn encode(&self) -> [u8; ID_LEN] {
        let mut b = [0u8; ID_LEN];
        b[0..8].copy_from_slice(ID_MAGIC);
        b[8..12].copy_from_slice(&ID_VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.store_id);
        b[32..48].copy_from_slice(&self.dir_id);
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and verifies; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<DirId> {
        if b.len() != ID_LEN || &b[0..8] != ID_MAGIC {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        if u32_at(8) != ID_VERSION || crc32c::crc32c(&b[..60]) != u32_at(60) {
            return None;
        }
        Some(DirId { store_id: b[16..32].try_into().unwrap(), dir_id: b[32..48].try_into().unwrap() })
    }
}
