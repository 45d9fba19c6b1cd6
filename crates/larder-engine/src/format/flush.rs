//! The `FLUSHED` file: the store-wide flush (memcached's `flush_all`), which makes every value
//! stored before it read as absent, at once or from a time set in advance (docs/FORMAT.md,
//! "Flushes").

use bytes::{Buf, BufMut};

/// Name of the flush file in each data directory.
pub const FILE_NAME: &str = "FLUSHED";
const MAGIC: &[u8; 8] = b"LARDFLSH";
const VERSION: u32 = 1;
const LEN: usize = super::BLOCK_LEN;

/// The flushes in force: a value is flushed if its store time is before `cut_ms`, or before
/// `deadline_ms` once the clock has reached it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flush {
    /// Raised by each save; the copy with the highest wins (one per data directory).
    pub epoch: u64,
    /// Values stored before this store time (ms) are flushed; 0 = none.
    pub cut_ms: u64,
    /// A flush set in advance: from this time (ms since the Unix epoch) on, values stored
    /// before it are flushed; 0 = none.
    pub deadline_ms: u64,
}

impl Flush {
    /// Encodes to the 64-byte on-disk form.
    pub fn encode(&self) -> [u8; LEN] {
        super::seal_block(MAGIC, VERSION, |w| {
            w.put_u64_le(self.epoch);
            w.put_u64_le(self.cut_ms);
            w.put_u64_le(self.deadline_ms);
        })
    }

    /// Decodes and verifies; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Flush> {
        if b.len() != LEN {
            return None;
        }
        let (version, mut r) = super::open_block(b, MAGIC)?;
        if version != VERSION {
            return None;
        }
        Some(Flush { epoch: r.get_u64_le(), cut_ms: r.get_u64_le(), deadline_ms: r.get_u64_le() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let f = Flush { epoch: 3, cut_ms: 1_700_000_000_123, deadline_ms: 1_700_000_060_000 };
        let b = f.encode();
        assert_eq!(Flush::decode(&b), Some(f));
        let mut bad = b;
        bad[20] ^= 1;
        assert_eq!(Flush::decode(&bad), None);
        assert_eq!(Flush::decode(&b[..63]), None);
    }
}
