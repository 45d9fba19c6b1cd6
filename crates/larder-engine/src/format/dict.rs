//! Dictionary files: a zstd dictionary trained on the values under one key prefix, kept in
//! every data directory as `DICT-<id>` and named by its id in each coded record that uses it
//! (docs/FORMAT.md, "Dictionaries").

use bytes::{Buf, BufMut};

const MAGIC: &[u8; 8] = b"LARDDICT";
const VERSION: u32 = 1;
/// Fixed fields before the key prefix: magic, version, id, codec, 3 reserved bytes, creation
/// time, prefix length, dictionary length.
const FIXED: usize = 8 + 4 + 4 + 1 + 3 + 8 + 2 + 4;
/// Longest key prefix a dictionary is kept for.
pub const MAX_PREFIX: usize = 1024;
/// Largest dictionary a file may hold.
pub const MAX_DICT: usize = 1 << 20;

/// A dictionary file's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DictFile<'a> {
    /// The id coded records name it by (never 0, which means "no dictionary").
    pub id: u32,
    /// The codec it is a dictionary of (`Codec::id`; zstd only, today).
    pub codec: u8,
    /// When it was trained, in ms since the Unix epoch.
    pub created_ms: u64,
    /// The key prefix whose values it was trained on and codes.
    pub key_prefix: &'a [u8],
    /// The dictionary.
    pub bytes: &'a [u8],
}

/// The file name of dictionary `id`.
pub fn file_name(id: u32) -> String {
    format!("DICT-{id:08x}")
}

/// The id a dictionary file's name gives, if it is one.
pub fn id_of_name(name: &str) -> Option<u32> {
    let hex = name.strip_prefix("DICT-")?;
    (hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(hex, 16).ok())
        .flatten()
        .filter(|&id| id != 0)
}

/// `d` as its file's bytes: the fields, the prefix, the dictionary and the CRC32C of all that.
pub fn encode(d: &DictFile<'_>) -> Vec<u8> {
    let mut b = Vec::with_capacity(FIXED + d.key_prefix.len() + d.bytes.len() + 4);
    b.put_slice(MAGIC);
    b.put_u32_le(VERSION);
    b.put_u32_le(d.id);
    b.put_u8(d.codec);
    b.put_bytes(0, 3);
    b.put_u64_le(d.created_ms);
    b.put_u16_le(d.key_prefix.len() as u16);
    b.put_u32_le(d.bytes.len() as u32);
    b.put_slice(d.key_prefix);
    b.put_slice(d.bytes);
    let crc = crc32c::crc32c(&b);
    b.put_u32_le(crc);
    b
}

/// The dictionary a sound file holds; `None` for a torn, damaged or foreign file.
pub fn decode(b: &[u8]) -> Option<DictFile<'_>> {
    if b.len() < FIXED + 4 || &b[..8] != MAGIC {
        return None;
    }
    let (body, mut tail) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body) != tail.get_u32_le() {
        return None;
    }
    let mut r = &body[8..];
    if r.get_u32_le() != VERSION {
        return None;
    }
    let id = r.get_u32_le();
    let codec = r.get_u8();
    r.advance(3);
    let created_ms = r.get_u64_le();
    let prefix_len = r.get_u16_le() as usize;
    let dict_len = r.get_u32_le() as usize;
    if id == 0 || prefix_len > MAX_PREFIX || dict_len > MAX_DICT || r.len() != prefix_len + dict_len {
        return None;
    }
    let (key_prefix, bytes) = r.split_at(prefix_len);
    Some(DictFile { id, codec, created_ms, key_prefix, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_names_and_damage() {
        let d = DictFile { id: 7, codec: 1, created_ms: 1_700_000_000_000, key_prefix: b"html", bytes: b"dictionary" };
        let b = encode(&d);
        assert_eq!(decode(&b), Some(d.clone()));
        for i in [0, 9, 13, 17, 21, 30, b.len() - 1] {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert_eq!(decode(&bad), None, "byte {i}");
        }
        assert_eq!(decode(&b[..b.len() - 1]), None);
        assert_eq!(file_name(7), "DICT-00000007");
        assert_eq!(id_of_name(&file_name(0xabcdef12)), Some(0xabcdef12));
        for bad in ["DICT-00000000", "DICT-7", "DICT-0000000g", "DICT-00000007.tmp", "MANIFEST"] {
            assert_eq!(id_of_name(bad), None, "{bad}");
        }
    }
}
