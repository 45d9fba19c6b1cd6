//! The on-disk record: encode, decode and verify. Pure functions, no IO.
//!
//! A record is a 48-byte header, the key, a metadata block and the value, padded with zeros
//! to a multiple of [`ALIGN`] bytes so that index offsets can be stored in 8-byte units. Two
//! checksums protect it: `hcrc` covers the header and key (so a record whose value is damaged
//! still says reliably *which* key it belonged to), `crc` covers everything after itself up to
//! the end of the value. Both CRC32Cs start from the volume's random **salt** instead of 0:
//! bytes a client stored inside a value can never pass for a record of that volume, even when
//! recovery searches for the next record after damage. The byte table lives in
//! docs/FORMAT.md; change both together.

use bytes::{Buf, BufMut};

/// Record format version written by this build. Bump when the header layout changes, and keep
/// a decoder for the previous version so an upgrade does not throw the cache away.
pub const RECORD_VERSION: u8 = 1;
/// Magic at the start of every record: "LRC" and the record format version.
pub const MAGIC: u32 = u32::from_le_bytes([b'L', b'R', b'C', RECORD_VERSION]);
/// Magic of the records of large values (chunks and heads), version 2: a build that predates
/// them finds a magic it does not know, so it takes them for damage and never serves a chunk
/// table as a value.
pub const MAGIC_LARGE: u32 = u32::from_le_bytes([b'L', b'R', b'C', 2]);
/// Magic of coded records (`FLAG_CODED`), version 3: a build that predates codings takes them
/// for damage, never serving compressed bytes as a value.
pub const MAGIC_CODED: u32 = u32::from_le_bytes([b'L', b'R', b'C', 3]);

/// The magic a record with `flags` starts with.
fn magic_of(flags: u16) -> u32 {
    // Coded first: a build that knows large values but not codings must not take a coded
    // chunk's bytes for the value's.
    if flags & FLAG_CODED != 0 {
        MAGIC_CODED
    } else if flags & (FLAG_CHUNK | FLAG_HEAD) != 0 {
        MAGIC_LARGE
    } else {
        MAGIC
    }
}

/// Whether `b` starts with the magic of some record.
pub fn starts_like_record(b: &[u8]) -> bool {
    b.len() >= 4 && [MAGIC, MAGIC_LARGE, MAGIC_CODED].contains(&(&b[..4]).get_u32_le())
}
/// Size of the fixed record header in bytes.
pub const HEADER_LEN: usize = 48;
/// Records start at multiples of this many bytes.
pub const ALIGN: u64 = 8;
/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Longest metadata block accepted, in bytes: what fits, with the longest header and key, in
/// the one read of a record's front (8 KiB). Version 1 records held at most 4096 bytes; the
/// longer limit came with application attributes (read-through mode's stored headers).
pub const MAX_META_LEN: usize = 8192 - HEADER_LEN - MAX_KEY_LEN;

/// Flag bit: this record is a tombstone (a DELETE); it has no value.
pub const FLAG_TOMBSTONE: u16 = 1;
/// Flag bit: this record is one chunk of a large value (its metadata holds the chunk's number).
/// Never indexed: only the value's head names it.
pub const FLAG_CHUNK: u16 = 2;
/// Flag bit: this record is the head of a large value: its value is the chunk table (see
/// `format::large`), its metadata the value's length and checksum.
pub const FLAG_HEAD: u16 = 4;
/// Flag bit: this record's value is coded (compressed); its metadata says how (`meta::Coded`)
/// and holds the value's (or chunk's) own length and checksum. Set on values and on a large
/// value's chunks, never on its head (whose value is the chunk table).
pub const FLAG_CODED: u16 = 8;

const _: () = assert!(HEADER_LEN.is_multiple_of(ALIGN as usize));

/// The decoded fixed header of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Key length in bytes.
    pub key_len: u16,
    /// Value length in bytes.
    pub value_len: u32,
    /// Metadata block length in bytes (content type, block checksums; see `meta`).
    pub meta_len: u16,
    /// Generation of the volume slot the record was written in.
    pub generation: u32,
    /// Store time, milliseconds since the Unix epoch.
    pub stored_ms: u64,
    /// Expiry time, milliseconds since the Unix epoch; 0 = never.
    pub expiry_ms: u64,
    /// The record checksum as stored (filled by the decoder; the encoder computes its own).
    pub crc: u32,
}

impl Header {
    /// Length of header + key + metadata + value, without padding.
    pub fn record_len(&self) -> u64 {
        HEADER_LEN as u64 + self.key_len as u64 + self.meta_len as u64 + self.value_len as u64
    }

    /// Length the record occupies in its volume, padding included.
    pub fn padded_len(&self) -> u64 {
        padded(self.record_len())
    }

    /// Whether this record is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.flags & FLAG_TOMBSTONE != 0
    }

    /// Whether this record is a chunk of a large value.
    pub fn is_chunk(&self) -> bool {
        self.flags & FLAG_CHUNK != 0
    }

    /// Whether this record is the head of a large value.
    pub fn is_head(&self) -> bool {
        self.flags & FLAG_HEAD != 0
    }

    /// Whether this record's value is coded.
    pub fn is_coded(&self) -> bool {
        self.flags & FLAG_CODED != 0
    }
}

/// `len` rounded up to the record alignment.
pub fn padded(len: u64) -> u64 {
    len.div_ceil(ALIGN) * ALIGN
}

/// Why bytes did not decode as a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header (or the lengths it announces) need.
    Short,
    /// The magic number is wrong: not a record start.
    BadMagic,
    /// The header or key checksum failed: nothing in the header can be trusted.
    BadHeader,
    /// Header and key are sound but the value or metadata checksum failed.
    BadBody,
}

/// Bytes needed for a record with these lengths, padding included.
pub fn encoded_len(key_len: usize, meta_len: usize, value_len: usize) -> usize {
    padded((HEADER_LEN + key_len + meta_len + value_len) as u64) as usize
}

/// Appends one encoded record (padded) to `out`.
///
/// The caller guarantees `key.len() <= MAX_KEY_LEN`, `meta.len() <= MAX_META_LEN` and
/// `value.len() <= u32::MAX`.
pub fn encode_into(out: &mut Vec<u8>, h: &Header, key: &[u8], meta: &[u8], value: &[u8], salt: u32) {
    let start = out.len();
    encode_prefix(out, h, key, meta, value.len(), crc32c::crc32c(value), salt);
    out.extend_from_slice(value);
    let len = out.len() - start;
    out.resize(start + padded(len as u64) as usize, 0);
}

/// Appends header, key and metadata of a record whose value (of `value_len` bytes with
/// CRC32C `value_crc`) the caller writes right after, followed by zero padding up to
/// [`padded`] of the record length. Lets the writer hand the value to the kernel without
/// copying it into a record buffer. `value_crc` is the plain (unsalted) CRC32C of the value.
pub fn encode_prefix(
    out: &mut Vec<u8>,
    h: &Header,
    key: &[u8],
    meta: &[u8],
    value_len: usize,
    value_crc: u32,
    salt: u32,
) {
    debug_assert!(key.len() <= MAX_KEY_LEN && meta.len() <= MAX_META_LEN);
    debug_assert!(value_len <= u32::MAX as usize);
    let start = out.len();
    out.put_u32_le(magic_of(h.flags));
    out.put_bytes(0, 8); // crc and hcrc, filled below
    out.put_u16_le(h.flags);
    out.put_u16_le(key.len() as u16);
    out.put_u32_le(value_len as u32);
    out.put_u16_le(meta.len() as u16);
    out.put_u16_le(0); // reserved
    out.put_u32_le(h.generation);
    // The metadata's own checksum, inside the part `hcrc` covers: a reader can trust the
    // metadata (a large value's block checksums) without reading the value. 0 without one.
    let meta_crc = if meta.is_empty() { 0 } else { crc32c::crc32c_append(salt, meta) };
    out.put_u32_le(meta_crc);
    out.put_u64_le(h.stored_ms);
    out.put_u64_le(h.expiry_ms);
    debug_assert_eq!(out.len() - start, HEADER_LEN);
    out.put_slice(key);
    let hcrc = crc32c::crc32c_append(crc32c::crc32c_append(salt, &out[start + 12..start + HEADER_LEN]), key);
    (&mut out[start + 8..start + 12]).put_u32_le(hcrc);
    out.put_slice(meta);
    let prefix_crc = crc32c::crc32c_append(salt, &out[start + 8..]);
    let crc = crc32c_combine(prefix_crc, value_crc, value_len as u64);
    (&mut out[start + 4..start + 8]).put_u32_le(crc);
}

/// Reflected CRC-32C (Castagnoli) polynomial.
const POLY: u32 = 0x82F6_3B78;

/// `a * b mod P` over GF(2), both in the reflected bit order CRCs use (x^0 is bit 31).
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `X_POW_2K[k]` = x^(2^k) mod P.
const X_POW_2K: [u32; 64] = {
    let mut table = [0u32; 64];
    let mut p = 1u32 << 30; // x^1
    let mut k = 0;
    while k < 64 {
        table[k] = p;
        p = mul_mod_p(p, p);
        k += 1;
    }
    table
};

/// CRC32C of `A ‖ B` from `crc_a` (which may start from a salt), `crc_b` (started from 0)
/// and `len_b`: `crc_a` is multiplied by x^(8·len_b) mod P, one table multiplication per set
/// bit of the length. The crc32c crate's `crc32c_combine` squares 32×32 bit matrices
/// instead, which a profile showed taking 38% of the engine's 4 KiB insert run (under the
/// write lock); this computes the same value with at most 64 small multiplications.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    mul_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b
}

/// x^(8·n) mod P: what appending `n` bytes multiplies a CRC by.
fn x_pow_8n(n: u64) -> u32 {
    let (mut n, mut k, mut shift) = (n, 3, 1u32 << 31); // 8·n bits = 2^3·n
    while n != 0 {
        if n & 1 != 0 {
            shift = mul_mod_p(X_POW_2K[k], shift);
        }
        n >>= 1;
        k += 1;
    }
    shift
}

/// The plain CRC32C of a record's value, derived from the record checksum and the bytes before
/// the value (`buf` holds at least header, key and metadata), without reading the value: the
/// inverse of the combination `encode_prefix` makes. Lets a validator (ETag) be answered from
/// the front of a large record.
pub fn value_crc(buf: &[u8], h: &Header, salt: u32) -> u32 {
    let prefix_end = HEADER_LEN + h.key_len as usize + h.meta_len as usize;
    let prefix_crc = crc32c::crc32c_append(salt, &buf[8..prefix_end]);
    h.crc ^ mul_mod_p(x_pow_8n(h.value_len as u64), prefix_crc)
}

/// Decodes and verifies the header and key at the start of `buf`.
///
/// Needs `HEADER_LEN + key_len` bytes; returns `Short` when `buf` has fewer. `salt` is the
/// volume's checksum salt.
pub fn decode_header(buf: &[u8], salt: u32) -> Result<Header, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Short);
    }
    let mut r = buf;
    let magic = r.get_u32_le();
    if magic != MAGIC && magic != MAGIC_LARGE && magic != MAGIC_CODED {
        return Err(DecodeError::BadMagic);
    }
    let (crc, hcrc) = (r.get_u32_le(), r.get_u32_le());
    let (flags, key_len, value_len, meta_len) = (r.get_u16_le(), r.get_u16_le(), r.get_u32_le(), r.get_u16_le());
    // The magic is outside the checksums; the flags it must agree with are not.
    if magic != magic_of(flags) {
        return Err(DecodeError::BadMagic);
    }
    r.advance(2); // reserved
    let generation = r.get_u32_le();
    r.advance(4); // the metadata's checksum, checked by `decode_prefix`
    let (stored_ms, expiry_ms) = (r.get_u64_le(), r.get_u64_le());
    let h = Header { flags, key_len, value_len, meta_len, generation, stored_ms, expiry_ms, crc };
    let key_end = HEADER_LEN + h.key_len as usize;
    if h.key_len as usize > MAX_KEY_LEN || h.meta_len as usize > MAX_META_LEN {
        return Err(DecodeError::BadHeader);
    }
    if buf.len() < key_end {
        return Err(DecodeError::Short);
    }
    if hcrc != crc32c::crc32c_append(crc32c::crc32c_append(salt, &buf[12..HEADER_LEN]), &buf[HEADER_LEN..key_end]) {
        return Err(DecodeError::BadHeader);
    }
    Ok(h)
}

/// Decodes the header, key and metadata at the start of `buf` and verifies them (header and
/// key by `hcrc`, metadata by its own checksum), but not the value, which `buf` need not hold.
/// Returns the header and the metadata block.
pub fn decode_prefix(buf: &[u8], salt: u32) -> Result<(Header, &[u8]), DecodeError> {
    let h = decode_header(buf, salt)?;
    let key_end = HEADER_LEN + h.key_len as usize;
    let meta_end = key_end + h.meta_len as usize;
    if buf.len() < meta_end {
        return Err(DecodeError::Short);
    }
    let meta = &buf[key_end..meta_end];
    let want = if meta.is_empty() { 0 } else { crc32c::crc32c_append(salt, meta) };
    if (&buf[28..32]).get_u32_le() != want {
        return Err(DecodeError::BadBody);
    }
    Ok((h, meta))
}

/// A verified record borrowed from a buffer.
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    /// The header.
    pub header: Header,
    /// The key bytes.
    pub key: &'a [u8],
    /// The metadata block.
    pub meta: &'a [u8],
    /// Byte range of the value inside the buffer given to [`decode`].
    pub value_range: (usize, usize),
}

/// Decodes and fully verifies (both checksums) the record at the start of `buf`.
pub fn decode(buf: &[u8], salt: u32) -> Result<RecordRef<'_>, DecodeError> {
    let header = decode_header(buf, salt)?;
    let len = header.record_len() as usize;
    if buf.len() < len {
        return Err(DecodeError::Short);
    }
    if crc32c::crc32c_append(salt, &buf[8..len]) != header.crc {
        return Err(DecodeError::BadBody);
    }
    let key_end = HEADER_LEN + header.key_len as usize;
    let meta_end = key_end + header.meta_len as usize;
    Ok(RecordRef {
        header,
        key: &buf[HEADER_LEN..key_end],
        meta: &buf[key_end..meta_end],
        value_range: (meta_end, len),
    })
}

/// Encodes a record length (bytes) into an 8-bit size class whose upper bound is at most 1/8
/// above the length (exact below 128 bytes). The index stores the class instead of the length:
/// a reader reads the upper bound in one positional read and learns the exact length from the
/// header.
pub fn size_class(len: u64) -> u16 {
    let units = len.div_ceil(ALIGN).max(1);
    if units < 16 {
        return units as u16;
    }
    let top = 63 - units.leading_zeros() as u64; // >= 4
    let mut shift = top - 3;
    let mut mant = units >> shift; // 8..=15
    if units & ((1 << shift) - 1) != 0 {
        mant += 1;
    }
    if mant == 16 {
        mant = 8;
        shift += 1;
    }
    (16 + (shift - 1) * 8 + (mant - 8)) as u16
}

/// Upper bound in bytes of a size class made by [`size_class`].
pub fn size_class_bytes(class: u16) -> u64 {
    let c = class as u64;
    let units = if c < 16 { c } else { (8 + (c - 16) % 8) << ((c - 16) / 8 + 1) };
    units * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    const SALT: u32 = 0x5eed_1234;

    #[test]
    fn combine_matches_one_pass_crc() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for split in [0, 1, 7, 48, 4096, 65_536, 69_999, 70_000] {
            let (a, b) = data.split_at(split);
            for start in [0, SALT] {
                let whole = crc32c::crc32c_append(start, &data);
                let combined = crc32c_combine(crc32c::crc32c_append(start, a), crc32c::crc32c(b), b.len() as u64);
                assert_eq!(combined, whole, "split at {split}, start {start:#x}");
                assert_eq!(
                    combined,
                    crc32c::crc32c_combine(crc32c::crc32c_append(start, a), crc32c::crc32c(b), b.len())
                );
            }
        }
    }

    #[test]
    fn value_crc_is_derived_from_the_front_of_a_record() {
        for (meta, len) in [(&b""[..], 0usize), (b"\x01\x03\x00abc", 5), (b"", 70_000), (b"xy", 4096)] {
            let value: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(40_503) >> 5) as u8).collect();
            let mut buf = Vec::new();
            encode_into(&mut buf, &header(0), b"some/key", meta, &value, SALT);
            let (h, m) = decode_prefix(&buf[..HEADER_LEN + 8 + meta.len()], SALT).unwrap();
            assert_eq!(m, meta);
            let prefix = &buf[..HEADER_LEN + 8 + meta.len()]; // no byte of the value
            assert_eq!(value_crc(prefix, &h, SALT), crc32c::crc32c(&value), "value of {len} bytes");
        }
    }

    #[test]
    fn damaged_metadata_fails_its_own_checksum() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"k", b"metadata", b"value", SALT);
        assert!(decode_prefix(&buf, SALT).is_ok());
        buf[HEADER_LEN + 1 + 3] ^= 4;
        assert_eq!(decode_prefix(&buf, SALT).unwrap_err(), DecodeError::BadBody);
        assert_eq!(decode(&buf, SALT).unwrap_err(), DecodeError::BadBody);
    }

    #[test]
    fn large_records_have_a_magic_older_builds_refuse_and_it_must_agree_with_the_flags() {
        for flags in [FLAG_CHUNK, FLAG_HEAD] {
            let mut buf = Vec::new();
            encode_into(&mut buf, &header(flags), b"key", b"", b"table", SALT);
            // A build before large values compares the magic with MAGIC alone.
            assert_ne!((&buf[..4]).get_u32_le(), MAGIC);
            assert_eq!(decode(&buf, SALT).unwrap().header.flags, flags);
            (&mut buf[..4]).put_u32_le(MAGIC);
            assert_eq!(decode(&buf, SALT).unwrap_err(), DecodeError::BadMagic);
        }
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"key", b"", b"value", SALT);
        assert_eq!((&buf[..4]).get_u32_le(), MAGIC);
        (&mut buf[..4]).put_u32_le(MAGIC_LARGE);
        assert_eq!(decode(&buf, SALT).unwrap_err(), DecodeError::BadMagic);
    }

    #[test]
    fn another_salt_fails_both_checksums() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"key", b"", b"value", SALT);
        assert!(decode(&buf, SALT).is_ok());
        assert_eq!(decode_header(&buf, SALT ^ 1).unwrap_err(), DecodeError::BadHeader);
    }

    fn header(flags: u16) -> Header {
        Header { flags, key_len: 0, value_len: 0, meta_len: 0, generation: 7, stored_ms: 1, expiry_ms: 0, crc: 0 }
    }

    #[test]
    fn round_trip_and_padding() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"some/key", b"", b"hello world", SALT);
        assert_eq!(buf.len() % ALIGN as usize, 0);
        assert_eq!(buf.len(), encoded_len(8, 0, 11));
        let r = decode(&buf, SALT).unwrap();
        assert_eq!(r.key, b"some/key");
        assert_eq!(&buf[r.value_range.0..r.value_range.1], b"hello world");
        assert_eq!(r.header.generation, 7);
        assert_eq!(r.header.record_len(), (HEADER_LEN + 8 + 11) as u64);
    }

    #[test]
    fn value_damage_keeps_header_trustworthy() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"k", b"", &[9u8; 100], SALT);
        buf[HEADER_LEN + 10] ^= 0x40;
        assert_eq!(decode(&buf, SALT).unwrap_err(), DecodeError::BadBody);
        assert_eq!(decode_header(&buf, SALT).unwrap().value_len, 100);
    }

    #[test]
    fn header_or_key_damage_is_detected() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(FLAG_TOMBSTONE), b"key", b"", b"", SALT);
        for at in 8..HEADER_LEN + 3 {
            let mut b = buf.clone();
            b[at] ^= 1;
            assert!(decode(&b, SALT).is_err(), "flip at {at} went unnoticed");
        }
        let mut b = buf.clone();
        b[0] ^= 1;
        assert_eq!(decode(&b, SALT).unwrap_err(), DecodeError::BadMagic);
    }

    #[test]
    fn short_buffers_say_short() {
        let mut buf = Vec::new();
        encode_into(&mut buf, &header(0), b"key", b"", b"value", SALT);
        for cut in [0, 10, HEADER_LEN, HEADER_LEN + 2, HEADER_LEN + 5] {
            assert_eq!(decode(&buf[..cut], SALT).unwrap_err(), DecodeError::Short, "cut {cut}");
        }
    }

    #[test]
    fn size_class_bounds_are_tight_and_monotone() {
        let mut last = 0;
        // Up to the longest possible record: a u32 value plus header, key and metadata.
        let longest = u32::MAX as u64 + (HEADER_LEN + MAX_KEY_LEN + MAX_META_LEN) as u64;
        for (i, len) in (1..5000u64).chain((1..33).map(|s| 1u64 << s)).chain([longest]).enumerate() {
            let c = size_class(len);
            assert!(c < 256, "class {c} for {len} does not fit 8 bits");
            let ub = size_class_bytes(c);
            assert!(ub >= len, "bound {ub} below {len}");
            assert!(ub <= padded(len) + padded(len) / 8, "bound {ub} too loose for {len}");
            if i < 4999 {
                assert!(c >= last, "class of {len} smaller than of {}", len - 1);
                last = c;
            }
        }
    }
}
