//! Keys the index cannot tell apart, made on purpose: tests and the crash loop (bench/) need
//! keys that share an index entry (docs/FORMAT.md, "In-memory index entry") to show that a
//! shared entry never serves one key's bytes for another, nor brings a deleted value back.
//!
//! An entry keeps the top bits of a key's 64-bit hash: 12 for the shard, the table's quotient
//! bits (3 for a table of up to 15 entries) and as many more as the location leaves room for
//! (28 with the default ring). Two keys whose hashes agree on the top 43 bits therefore share
//! an entry in any small table of the default ring. The hash is xxh3 seeded with the store's
//! own seed, kept in its manifest, so such keys are found by a birthday search: among `n`
//! keys, about `n² / 2^(bits+1)` pairs agree.

use crate::format::manifest::{Manifest, FILE_NAME};
use std::path::Path;

/// Hash bits that keys sharing an entry of a small table of the default ring agree on.
pub const DEFAULT_RING_BITS: u32 = 43;

/// The key-hash seed of the store whose data directory is `dir`, if its manifest is sound.
pub fn seed(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(dir.join(FILE_NAME)).ok()?;
    Manifest::decode(&bytes).map(|m| m.hash_seed)
}

/// The key hash a store with `seed` gives `key`.
pub fn hash(seed: u64, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, seed)
}

/// At least `pairs` pairs of distinct keys `{prefix}{n}` whose hashes under `seed` agree on
/// their top `bits` bits (at most 52), no key in two pairs. Searches twice as many keys each
/// round until enough are found: for 43 bits and a few pairs, about 2^24 keys (a few seconds,
/// 128 MiB at most).
pub fn find(seed: u64, prefix: &str, bits: u32, pairs: usize) -> Vec<(String, String)> {
    assert!(bits <= 52, "a search for more than 52 bits would not end");
    let key = |n: u64| format!("{prefix}{n}");
    let mut idx_bits = 20;
    loop {
        // Each candidate as its hash's top bits (as many as fit) above its number: sorted,
        // candidates that agree on those bits sit side by side.
        let n = 1u64 << idx_bits;
        let top = bits.min(64 - idx_bits);
        let mut cands: Vec<u64> =
            (0..n).map(|i| (hash(seed, key(i).as_bytes()) >> (64 - top)) << idx_bits | i).collect();
        cands.sort_unstable();
        let mut found = Vec::new();
        let mut i = 0;
        while i + 1 < cands.len() && found.len() < pairs {
            let (a, b) = (cands[i], cands[i + 1]);
            let mask = n - 1;
            let (ka, kb) = (key(a & mask), key(b & mask));
            if a >> idx_bits == b >> idx_bits
                && hash(seed, ka.as_bytes()) >> (64 - bits) == hash(seed, kb.as_bytes()) >> (64 - bits)
            {
                found.push((ka, kb));
                i += 2;
            } else {
                i += 1;
            }
        }
        if found.len() >= pairs {
            return found;
        }
        idx_bits += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_agree_on_the_bits_asked() {
        let pairs = find(7, "k/", 30, 3);
        assert!(pairs.len() >= 3);
        for (a, b) in &pairs {
            assert_ne!(a, b);
            assert_eq!(hash(7, a.as_bytes()) >> 34, hash(7, b.as_bytes()) >> 34);
        }
    }
}
