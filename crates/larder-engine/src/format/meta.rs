//! The metadata block of a record: small typed entries between the key and the value.
//!
//! Each entry is a tag (u8), a length (u16, little-endian) and that many bytes. Readers skip
//! tags they do not know, so later builds can add entries without a format break. The block
//! has its own checksum in the record header (see `record::decode_prefix`), so it can be
//! trusted without reading the value. Byte table in docs/FORMAT.md.
//!
//! - [`TAG_CONTENT_TYPE`]: the value's media type, as the client sent it.
//! - [`TAG_BLOCKS`]: for values longer than [`BLOCKED_MIN_LEN`], a block size (as a shift) and
//!   the CRC32C of each block of the value, so that a range read verifies just the blocks it
//!   reads instead of reading the whole value to check the record checksum.
//! - [`TAG_ATTRS`]: application attributes, opaque to the engine (read-through mode keeps a
//!   response's status and headers there).
//! - [`TAG_CODED`]: in a coded record (`record::FLAG_CODED`), the codec, the dictionary (0:
//!   none) and the value's own length and CRC32C; the record's value is the coded bytes.

use bytes::{Buf, BufMut};

/// Entry tag: content type.
pub const TAG_CONTENT_TYPE: u8 = 1;
/// Entry tag: block checksums.
pub const TAG_BLOCKS: u8 = 2;
/// Entry tag: in a large value's head, the whole value's length (u64) and CRC32C (u32).
pub const TAG_LARGE: u8 = 3;
/// Entry tag: in a chunk record, its number in the value (u32).
pub const TAG_CHUNK: u8 = 4;
/// Entry tag: client flags (u32; memcached's item flags), written only when not zero.
pub const TAG_FLAGS: u8 = 5;
/// Entry tag: memcached's stale mark (no body).
pub const TAG_STALE: u8 = 6;
/// Entry tag: application attributes (opaque bytes, at most [`MAX_ATTRS`]).
pub const TAG_ATTRS: u8 = 7;
/// Entry tag: the coding of a coded record's value (see [`Coded`]).
pub const TAG_CODED: u8 = 8;
/// Longest attributes entry, in bytes: with the longest of every other entry, the block stays
/// within the record format's limit.
pub const MAX_ATTRS: usize = 3968;
/// Longest content type stored, in bytes.
pub const MAX_CONTENT_TYPE: usize = 1024;
/// Values longer than this carry block checksums; shorter ones are read whole.
pub const BLOCKED_MIN_LEN: u64 = 128 << 10;
/// Smallest block: 64 KiB.
const MIN_BLOCK_SHIFT: u8 = 16;
/// Most blocks per value (2 KiB of checksums); larger values get larger blocks.
const MAX_BLOCKS: u64 = 512;

/// A parsed metadata block, borrowing from the record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta<'a> {
    /// The content type, if one was stored.
    pub content_type: Option<&'a [u8]>,
    blocks: Option<(u8, &'a [u8])>,
    /// A large value's length and CRC32C (in its head).
    pub large: Option<(u64, u32)>,
    /// Client flags (0 when none were stored).
    pub flags: u32,
    /// memcached's stale mark.
    pub stale: bool,
    /// Application attributes, if any were stored.
    pub attrs: Option<&'a [u8]>,
    /// How the value is coded, in a coded record.
    pub coded: Option<Coded>,
}

/// How a coded record's value bytes decode to the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coded {
    /// The codec's number (`codec::Codec::id`; one this build does not know fails to decode).
    pub codec: u8,
    /// The dictionary the coding used; 0 for none.
    pub dictionary: u32,
    /// The value's own length.
    pub len: u64,
    /// The value's own CRC32C.
    pub crc: u32,
}

impl<'a> Meta<'a> {
    /// Parses `block`; entries it does not know, and a truncated last entry, are ignored.
    pub fn parse(block: &'a [u8]) -> Meta<'a> {
        let mut m = Meta::default();
        let mut rest = block;
        while rest.len() >= 3 {
            let mut r = rest;
            let (tag, len) = (r.get_u8(), r.get_u16_le() as usize);
            let Some(body) = r.get(..len) else { break };
            match tag {
                TAG_CONTENT_TYPE => m.content_type = Some(body),
                TAG_BLOCKS if !body.is_empty() && (body.len() - 1) % 4 == 0 => m.blocks = Some((body[0], &body[1..])),
                TAG_FLAGS if body.len() == 4 => m.flags = (&body[..]).get_u32_le(),
                TAG_STALE => m.stale = true,
                TAG_ATTRS => m.attrs = Some(body),
                TAG_CODED if body.len() == 17 => {
                    let mut b = body;
                    let (codec, dictionary, len, crc) = (b.get_u8(), b.get_u32_le(), b.get_u64_le(), b.get_u32_le());
                    m.coded = Some(Coded { codec, dictionary, len, crc });
                }
                TAG_LARGE if body.len() == 12 => {
                    let mut b = body;
                    m.large = Some((b.get_u64_le(), b.get_u32_le()));
                }
                _ => {}
            }
            rest = &rest[3 + len..];
        }
        m
    }

    /// Block size and per-block CRC32Cs, if they cover a value of `value_len` bytes exactly.
    pub fn blocks(&self, value_len: u64) -> Option<Blocks<'a>> {
        let (shift, crcs) = self.blocks?;
        if !(MIN_BLOCK_SHIFT..=40).contains(&shift) {
            return None;
        }
        let count = value_len.div_ceil(1 << shift);
        (count == (crcs.len() / 4) as u64).then_some(Blocks { shift, crcs })
    }
}

/// The block checksums of a value.
#[derive(Debug, Clone, Copy)]
pub struct Blocks<'a> {
    shift: u8,
    crcs: &'a [u8],
}

impl Blocks<'_> {
    /// Bytes per block (the last block may be shorter).
    pub fn size(&self) -> u64 {
        1 << self.shift
    }

    /// The CRC32C of block `i`.
    pub fn crc(&self, i: u64) -> u32 {
        let at = i as usize * 4;
        (&self.crcs[at..at + 4]).get_u32_le()
    }
}

/// The block shift for a value of `len` bytes, or `None` when it is read whole.
pub fn block_shift(len: u64) -> Option<u8> {
    if len <= BLOCKED_MIN_LEN {
        return None;
    }
    let per_block = len.div_ceil(MAX_BLOCKS).next_power_of_two();
    Some((per_block.trailing_zeros() as u8).max(MIN_BLOCK_SHIFT))
}

/// Checksums `value`: its CRC32C and, when it is large, the CRC32C of each block. One pass:
/// the whole-value checksum is combined from the blocks'.
pub fn checksum(value: &[u8]) -> (u32, Option<(u8, Vec<u32>)>) {
    checksum_parts(&[value])
}

/// [`checksum`] of the value made of `parts` in order, without joining them (a block may
/// span parts).
pub fn checksum_parts(parts: &[&[u8]]) -> (u32, Option<(u8, Vec<u32>)>) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let Some(shift) = block_shift(len as u64) else {
        return (parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p)), None);
    };
    let size = 1usize << shift;
    let mut crcs = Vec::with_capacity(len.div_ceil(size));
    let (mut crc, mut filled) = (0u32, 0usize);
    for mut p in parts.iter().copied() {
        while !p.is_empty() {
            let take = (size - filled).min(p.len());
            crc = crc32c::crc32c_append(crc, &p[..take]);
            (filled, p) = (filled + take, &p[take..]);
            if filled == size {
                crcs.push(std::mem::take(&mut crc));
                filled = 0;
            }
        }
    }
    if filled > 0 {
        crcs.push(crc);
    }
    let whole = crcs.iter().enumerate().fold(0, |acc, (i, &c)| {
        let block = size.min(len - i * size);
        crate::format::record::crc32c_combine(acc, c, block as u64)
    });
    (whole, Some((shift, crcs)))
}

/// Appends a metadata block holding `content_type` and `blocks` to `out`. The caller keeps
/// `content_type` within [`MAX_CONTENT_TYPE`] bytes.
pub fn encode(out: &mut Vec<u8>, content_type: Option<&[u8]>, blocks: Option<&(u8, Vec<u32>)>) {
    if let Some(ct) = content_type {
        debug_assert!(ct.len() <= MAX_CONTENT_TYPE);
        out.put_u8(TAG_CONTENT_TYPE);
        out.put_u16_le(ct.len() as u16);
        out.put_slice(ct);
    }
    if let Some((shift, crcs)) = blocks {
        out.put_u8(TAG_BLOCKS);
        out.put_u16_le((1 + 4 * crcs.len()) as u16);
        out.put_u8(*shift);
        for &c in crcs {
            out.put_u32_le(c);
        }
    }
}

/// Appends the client flags entry, unless `flags` is 0 (what a value without one reads as),
/// and the stale mark if `stale`.
pub fn encode_flags(out: &mut Vec<u8>, flags: u32, stale: bool) {
    if flags != 0 {
        out.put_u8(TAG_FLAGS);
        out.put_u16_le(4);
        out.put_u32_le(flags);
    }
    if stale {
        out.put_u8(TAG_STALE);
        out.put_u16_le(0);
    }
}

/// Appends the attributes entry, if there are attributes. The caller keeps them within
/// [`MAX_ATTRS`] bytes.
pub fn encode_attrs(out: &mut Vec<u8>, attrs: Option<&[u8]>) {
    if let Some(a) = attrs {
        debug_assert!(a.len() <= MAX_ATTRS);
        out.put_u8(TAG_ATTRS);
        out.put_u16_le(a.len() as u16);
        out.put_slice(a);
    }
}

/// `block` with its attributes replaced by `attrs` (removed when `None`); every other entry,
/// known or not, is kept as it was.
pub fn with_attrs(block: &[u8], attrs: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + attrs.map_or(0, |a| a.len() + 3));
    let mut rest = block;
    while rest.len() >= 3 {
        let len = 3 + u16::from_le_bytes([rest[1], rest[2]]) as usize;
        let Some(entry) = rest.get(..len) else { break };
        if entry[0] != TAG_ATTRS {
            out.extend_from_slice(entry);
        }
        rest = &rest[len..];
    }
    encode_attrs(&mut out, attrs);
    out
}

/// Appends the entry that makes a record a large value's head: the value's length and CRC32C.
pub fn encode_large(out: &mut Vec<u8>, len: u64, crc: u32) {
    out.put_u8(TAG_LARGE);
    out.put_u16_le(12);
    out.put_u64_le(len);
    out.put_u32_le(crc);
}

/// Appends the entry that says how a coded record's value decodes.
pub fn encode_coded(out: &mut Vec<u8>, c: &Coded) {
    out.put_u8(TAG_CODED);
    out.put_u16_le(17);
    out.put_u8(c.codec);
    out.put_u32_le(c.dictionary);
    out.put_u64_le(c.len);
    out.put_u32_le(c.crc);
}

/// Appends the entry naming a chunk record's number in its value.
pub fn encode_chunk(out: &mut Vec<u8>, index: u32) {
    out.put_u8(TAG_CHUNK);
    out.put_u16_le(4);
    out.put_u32_le(index);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_parts_agrees_with_checksum_of_the_joined_value_wherever_it_is_cut() {
        for len in [0usize, 1000, 200_000, 1 << 20, (1 << 20) + 4097] {
            let value: Vec<u8> = (0..len).map(|i| (i * 31 % 253) as u8).collect();
            let whole = checksum(&value);
            for cuts in [vec![], vec![1], vec![7, 65_536, 65_537], vec![len / 3, len / 2]] {
                let mut parts = Vec::new();
                let mut at = 0;
                for c in cuts.into_iter().filter(|&c| c <= len) {
                    parts.push(&value[at..c.max(at)]);
                    at = c.max(at);
                }
                parts.push(&value[at..]);
                assert_eq!(checksum_parts(&parts), whole, "len {len}");
            }
        }
    }

    #[test]
    fn round_trip_skips_unknown_entries() {
        let value: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let (whole, blocks) = checksum(&value);
        assert_eq!(whole, crc32c::crc32c(&value));
        let mut block = vec![9, 2, 0, 0xaa, 0xbb]; // a tag from the future
        encode(&mut block, Some(b"image/png"), blocks.as_ref());
        assert!(block.len() <= crate::format::record::MAX_META_LEN);
        let m = Meta::parse(&block);
        assert_eq!(m.content_type, Some(&b"image/png"[..]));
        let b = m.blocks(value.len() as u64).expect("blocks cover the value");
        assert_eq!(b.size(), 64 << 10);
        for (i, chunk) in value.chunks(b.size() as usize).enumerate() {
            assert_eq!(b.crc(i as u64), crc32c::crc32c(chunk));
        }
        assert!(m.blocks(value.len() as u64 + (64 << 10)).is_none(), "a count that does not fit is ignored");
    }

    #[test]
    fn block_count_stays_bounded() {
        assert_eq!(block_shift(BLOCKED_MIN_LEN), None);
        for len in [BLOCKED_MIN_LEN + 1, 1 << 20, 64 << 20, u32::MAX as u64] {
            let shift = block_shift(len).unwrap();
            assert!(len.div_ceil(1 << shift) <= MAX_BLOCKS, "{len}");
        }
        // The largest metadata block, every entry at its longest, fits the record format's limit.
        let longest =
            (3 + MAX_CONTENT_TYPE) + (3 + 1 + 4 * MAX_BLOCKS as usize) + (3 + 4) + 3 + (3 + 12) + (3 + 4) + (3 + 17);
        assert!(longest + 3 + MAX_ATTRS <= crate::format::record::MAX_META_LEN);
    }

    #[test]
    fn attributes_are_replaced_and_other_entries_kept() {
        let mut block = vec![9, 2, 0, 0xaa, 0xbb];
        encode(&mut block, Some(b"text/html"), None);
        encode_attrs(&mut block, Some(b"old"));
        encode_flags(&mut block, 7, false);
        let new = with_attrs(&block, Some(b"newer"));
        let m = Meta::parse(&new);
        assert_eq!((m.attrs, m.content_type, m.flags), (Some(&b"newer"[..]), Some(&b"text/html"[..]), 7));
        assert_eq!(&new[..5], &[9, 2, 0, 0xaa, 0xbb], "an unknown entry stays");
        assert!(Meta::parse(&with_attrs(&new, None)).attrs.is_none());
    }

    #[test]
    fn coded_entry_round_trips() {
        let c = Coded { codec: 1, dictionary: 7, len: 4096, crc: 0xdead_beef };
        let mut block = Vec::new();
        encode(&mut block, Some(b"text/html"), None);
        encode_coded(&mut block, &c);
        let m = Meta::parse(&block);
        assert_eq!((m.coded, m.content_type), (Some(c), Some(&b"text/html"[..])));
        assert_eq!(Meta::parse(&with_attrs(&block, Some(b"a"))).coded, Some(c), "kept when attributes change");
    }

    #[test]
    fn truncated_entries_are_ignored() {
        let mut block = Vec::new();
        encode(&mut block, Some(b"text/html"), None);
        block.truncate(block.len() - 1);
        assert!(Meta::parse(&block).content_type.is_none());
        assert!(Meta::parse(&[]).content_type.is_none());
    }
}
