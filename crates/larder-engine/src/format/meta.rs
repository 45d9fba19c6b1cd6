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

use bytes::{Buf, BufMut};

/// Entry tag: content type.
pub const TAG_CONTENT_TYPE: u8 = 1;
/// Entry tag: block checksums.
pub const TAG_BLOCKS: u8 = 2;
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
    let Some(shift) = block_shift(value.len() as u64) else { return (crc32c::crc32c(value), None) };
    let crcs: Vec<u32> = value.chunks(1 << shift).map(crc32c::crc32c).collect();
    let whole = value
        .chunks(1 << shift)
        .zip(&crcs)
        .fold(0, |acc, (chunk, &c)| crate::format::record::crc32c_combine(acc, c, chunk.len() as u64));
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // The largest metadata block fits the record format's limit.
        assert!(3 + MAX_CONTENT_TYPE + 4 + 4 * MAX_BLOCKS as usize <= crate::format::record::MAX_META_LEN);
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
