//! The `DIR-ID` file: which store a data directory belongs to, and the directory's own id
//! (docs/FORMAT.md, "Directory id").

use bytes::{Buf, BufMut};

/// Name of the id file in each data directory.
pub const ID_FILE: &str = "DIR-ID";
const ID_MAGIC: &[u8; 8] = b"LARDDIRI";
const ID_VERSION: u32 = 1;
const ID_LEN: usize = super::BLOCK_LEN;

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
        super::seal_block(ID_MAGIC, ID_VERSION, |w| {
            w.put_bytes(0, 4); // reserved
            w.put_slice(&self.store_id);
            w.put_slice(&self.dir_id);
        })
    }

    /// Decodes and verifies; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<DirId> {
        if b.len() != ID_LEN {
            return None;
        }
        let (version, mut r) = super::open_block(b, ID_MAGIC)?;
        if version != ID_VERSION {
            return None;
        }
        r.advance(4); // reserved
        let (mut store_id, mut dir_id) = ([0u8; 16], [0u8; 16]);
        r.copy_to_slice(&mut store_id);
        r.copy_to_slice(&mut dir_id);
        Some(DirId { store_id, dir_id })
    }
}
