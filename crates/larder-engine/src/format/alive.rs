//! The `ALIVE` file: when the store was last known to be open, renewed about every second,
//! so that the next open knows how long the store was down (docs/FORMAT.md, "Alive stamp").

use bytes::{Buf, BufMut};

/// Name of the stamp file in each data directory.
pub const FILE_NAME: &str = "ALIVE";
const MAGIC: &[u8; 8] = b"LARDALIV";
const VERSION: u32 = 1;
/// Length of the file.
pub const LEN: usize = super::BLOCK_LEN;

/// Encodes the stamp "open at `ms`" (ms since the Unix epoch) to its 64-byte form.
pub fn encode(ms: u64) -> [u8; LEN] {
    super::seal_block(MAGIC, VERSION, |w| w.put_u64_le(ms))
}

/// The time of a sound stamp; `None` for anything else (a torn or foreign file).
pub fn decode(b: &[u8]) -> Option<u64> {
    if b.len() != LEN {
        return None;
    }
    match super::open_block(b, MAGIC)? {
        (VERSION, mut r) => Some(r.get_u64_le()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let b = encode(1_700_000_000_123);
        assert_eq!(decode(&b), Some(1_700_000_000_123));
        for i in [0, 9, 14, 63] {
            let mut bad = b;
            bad[i] ^= 1;
            assert_eq!(decode(&bad), None, "byte {i}");
        }
        assert_eq!(decode(&b[..63]), None);
        assert_eq!(decode(&crate::format::flush::Flush::default().encode()), None);
    }
}
