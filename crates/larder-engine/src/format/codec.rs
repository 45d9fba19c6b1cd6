//! Value codings: how a record's value bytes may be compressed, and the probe that decides
//! whether compressing a value is worth it. Pure functions (no I/O); the compressors keep
//! their contexts per thread, as creating one costs more than compressing a small value.
//!
//! A coded record carries `record::FLAG_CODED` (and so the coded records' magic: a build that
//! predates codings takes it for damage, never serving compressed bytes as a value) and a
//! `meta::TAG_CODED` entry naming the codec and the value's own length and CRC32C. The record
//! checksum covers the stored (coded) bytes and is verified before anything is decoded; the
//! decoded bytes are then checked against the value's own CRC32C.

use std::cell::RefCell;

pub use crate::types::Codec;

/// Why a value was stored as sent: [`encode`]'s verdict when it does not code it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raw {
    /// It starts like a compressed format (JPEG, PNG, gzip, zstd, …) or its bytes look
    /// random: not even tried.
    Probed,
    /// Coding it saved less than an eighth.
    NoGain,
}

thread_local! {
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    // Contexts for coding with a prepared dictionary (the dictionary comes with each call).
    static DICT_C: RefCell<Option<zstd::zstd_safe::CCtx<'static>>> = const { RefCell::new(None) };
    static DICT_D: RefCell<Option<zstd::zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

/// Leading bytes of formats that are compressed already: coding them again gains nothing.
const COMPRESSED_MAGIC: &[&[u8]] = &[
    b"\xff\xd8\xff", // JPEG
    b"\x89PNG",      // PNG
    b"GIF8",         // GIF
    b"\x1f\x8b",     // gzip
    b"\x78\x9c",     // zlib (Dalli's and pymemcache's own compression), by level
    b"\x78\xda",
    b"\x78\x01",
    b"\x78\x5e",
    b"\x28\xb5\x2f\xfd",     // zstd
    b"\x04\x22\x4d\x18",     // LZ4 frame
    b"\xfd7zXZ\x00",         // xz
    b"BZh",                  // bzip2
    b"PK\x03\x04",           // zip, jar, docx, …
    b"7z\xbc\xaf\x27\x1c",   // 7-Zip
    b"RIFF",                 // WebP, WAV, AVI
    b"OggS",                 // Ogg
    b"fLaC",                 // FLAC
    b"ID3",                  // MP3
    b"\x00\x00\x00\x18ftyp", // MP4, HEIF, AVIF (two common box sizes)
    b"\x00\x00\x00\x20ftyp",
];

/// Bits of order-0 entropy per byte above which a sample is taken for random (compressed or
/// encrypted) data: real text and markup sit at 4.5–6, compressed data at 7.8 and more (in a
/// sample this short: the estimate runs low by about 0.2 bits).
const RANDOM_BITS: f32 = 7.5;
/// The entropy probe looks at this many slices of this many bytes, spread over the value.
const PROBE_SLICE: usize = 256;
const PROBE_SLICES: usize = 4;
const PROBED: usize = PROBE_SLICE * PROBE_SLICES;

/// `c · log2 c` for every count a sample can hold: the probe sums these instead of calling
/// `log2` per byte value, which cost it five times as much.
fn n_log_n() -> &'static [f32; PROBED + 1] {
    static TABLE: std::sync::OnceLock<[f32; PROBED + 1]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| if c == 0 { 0.0 } else { c as f32 * (c as f32).log2() }))
}

/// Whether `value` is worth trying to code: not a known compressed format, and (for a value
/// long enough to tell) not random-looking. Costs well under a microsecond.
pub fn worth_trying(value: &[u8]) -> bool {
    if COMPRESSED_MAGIC.iter().any(|m| value.starts_with(m)) {
        return false;
    }
    // Shorter samples read as less random than they are; the eighth rule decides for them.
    if value.len() < PROBED {
        return true;
    }
    let mut counts = [0u16; 256];
    let step = (value.len() - PROBE_SLICE) / (PROBE_SLICES - 1);
    for i in 0..PROBE_SLICES {
        for &b in &value[i * step..i * step + PROBE_SLICE] {
            counts[b as usize] += 1;
        }
    }
    // H = log2 N − Σ c·log2 c / N, for N = PROBED.
    let table = n_log_n();
    let sum: f32 = counts.iter().map(|&c| table[c as usize]).sum();
    (PROBED as f32).log2() - sum / (PROBED as f32) < RANDOM_BITS
}

/// `value` coded with `codec` at `level`, when that saves at least an eighth of its length;
/// otherwise why it stays raw.
pub fn encode(codec: Codec, level: i32, value: &[u8]) -> Result<Vec<u8>, Raw> {
    if !worth_trying(value) {
        return Err(Raw::Probed);
    }
    // Coded bytes no longer than this are kept: a bound the compressors stop at.
    let most = value.len() - value.len() / 8;
    let coded = match codec {
        Codec::Zstd => ZSTD_C.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().is_none_or(|(l, _)| *l != level) {
                *c = Some((level, zstd::bulk::Compressor::new(level).ok()?));
            }
            let (_, z) = c.as_mut()?;
            let mut out = Vec::with_capacity(most);
            // A buffer too small for the frame is an error: it did not gain an eighth.
            z.compress_to_buffer(value, &mut out).ok()?;
            Some(out)
        }),
        Codec::Lz4 => {
            let mut out = vec![0u8; lz4::block::compress_bound(value.len()).ok().unwrap_or(0)];
            match lz4::block::compress_to_buffer(value, None, false, &mut out) {
                Ok(n) => {
                    out.truncate(n);
                    Some(out)
                }
                Err(_) => None,
            }
        }
    };
    match coded {
        Some(c) if c.len() <= most => Ok(c),
        _ => Err(Raw::NoGain),
    }
}

/// A zstd dictionary made ready to code and decode with. Its own id field is zero, so frames
/// coded with it carry no dictionary id (the record's metadata names the dictionary, and the
/// value's CRC32C catches a frame decoded with any other).
pub struct Prepared {
    id: u32,
    cdict: zstd::zstd_safe::CDict<'static>,
    ddict: zstd::zstd_safe::DDict<'static>,
}

/// Leading bytes of a zstd dictionary (the trained kind, with entropy tables); its id follows.
const DICT_MAGIC: [u8; 4] = [0x37, 0xa4, 0x30, 0xec];

impl Prepared {
    /// `bytes` (a trained zstd dictionary, its own id field zero), known to records as `id`,
    /// ready to code with at `level`; `None` if they are not such a dictionary.
    pub fn new(id: u32, bytes: &[u8], level: i32) -> Option<Prepared> {
        if id == 0 || !bytes.starts_with(&DICT_MAGIC) || bytes.len() < 8 || bytes[4..8] != [0; 4] {
            return None;
        }
        let cdict = zstd::zstd_safe::CDict::try_create(bytes, level)?;
        let ddict = zstd::zstd_safe::DDict::try_create(bytes)?;
        Some(Prepared { id, cdict, ddict })
    }

    /// The id records name the dictionary by.
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// A zstd dictionary of at most `most` bytes trained on `samples` (concatenated; `sizes` gives
/// each one's length), its id field zeroed (frames then spend no bytes naming it); `None` if
/// zstd could not train one from them.
pub fn train(samples: &[u8], sizes: &[usize], most: usize) -> Option<Vec<u8>> {
    let mut dict = zstd::dict::from_continuous(samples, sizes, most).ok()?;
    if !dict.starts_with(&DICT_MAGIC) || dict.len() < 8 {
        return None;
    }
    dict[4..8].copy_from_slice(&[0; 4]);
    Some(dict)
}

/// `value` coded with zstd and the dictionary `d`, when that saves at least an eighth;
/// otherwise why it stays raw (as [`encode`]).
pub fn encode_with(d: &Prepared, value: &[u8]) -> Result<Vec<u8>, Raw> {
    if !worth_trying(value) {
        return Err(Raw::Probed);
    }
    let most = value.len() - value.len() / 8;
    let coded = DICT_C.with(|c| {
        let mut c = c.borrow_mut();
        let z = c.get_or_insert_with(zstd::zstd_safe::CCtx::create);
        let mut out = Vec::with_capacity(most);
        z.compress_using_cdict(&mut out, value, &d.cdict).ok()?;
        Some(out)
    });
    match coded {
        Some(c) if c.len() <= most => Ok(c),
        _ => Err(Raw::NoGain),
    }
}

/// Decodes `coded`, a zstd frame coded with the dictionary `d`, into exactly `len` bytes.
pub fn decode_with(d: &Prepared, coded: &[u8], len: usize) -> Result<Vec<u8>, DecodeError> {
    let out = DICT_D.with(|x| {
        let mut x = x.borrow_mut();
        let z = x.get_or_insert_with(zstd::zstd_safe::DCtx::create);
        let mut out = Vec::with_capacity(len);
        z.decompress_using_ddict(&mut out, coded, &d.ddict).ok()?;
        Some(out)
    });
    match out {
        Some(v) if v.len() == len => Ok(v),
        _ => Err(DecodeError::Corrupt),
    }
}

/// Why coded bytes did not decode to their value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The codec's own check failed, or the output was not exactly `len` bytes.
    Corrupt,
    /// A codec this build does not know.
    Unknown(u8),
}

/// Decodes `coded` with the codec numbered `codec` into exactly `len` bytes (never more: a
/// damaged record cannot make a reader allocate beyond its value's length).
pub fn decode(codec: u8, coded: &[u8], len: usize) -> Result<Vec<u8>, DecodeError> {
    let Some(codec) = Codec::from_id(codec) else { return Err(DecodeError::Unknown(codec)) };
    let out = match codec {
        Codec::Zstd => ZSTD_D.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(zstd::bulk::Decompressor::new().ok()?);
            }
            let mut out = Vec::with_capacity(len);
            d.as_mut()?.decompress_to_buffer(coded, &mut out).ok()?;
            Some(out)
        }),
        Codec::Lz4 => {
            let n = i32::try_from(len).ok();
            n.and_then(|n| lz4::block::decompress(coded, Some(n)).ok())
        }
    };
    match out {
        Some(v) if v.len() == len => Ok(v),
        _ => Err(DecodeError::Corrupt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn html(len: usize) -> Vec<u8> {
        let mut s = String::new();
        let mut i = 0;
        while s.len() < len {
            s.push_str(&format!("<li class=\"entry\"><a href=\"/pkg/{i}\">package {i}</a> version 1.{}</li>\n", i % 7));
            i += 1;
        }
        s.truncate(len);
        s.into_bytes()
    }

    fn random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn text_codes_and_decodes_to_the_same_bytes_with_every_codec() {
        for (codec, _) in Codec::ALL {
            for len in [300, 1000, 4096, 70_000] {
                let v = html(len);
                let coded =
                    encode(codec, codec.default_level(), &v).unwrap_or_else(|e| panic!("{codec:?} {len}: {e:?}"));
                assert!(coded.len() <= len - len / 8);
                assert_eq!(decode(codec.id(), &coded, len).unwrap(), v, "{codec:?} {len}");
            }
        }
    }

    #[test]
    fn compressed_and_random_data_stays_raw() {
        let mut jpeg = b"\xff\xd8\xff\xe0".to_vec();
        jpeg.extend(html(4000));
        assert_eq!(encode(Codec::Zstd, 3, &jpeg), Err(Raw::Probed), "a known magic is not tried");
        assert_eq!(encode(Codec::Zstd, 3, &random(4096, 7)), Err(Raw::Probed), "random bytes are not tried");
        assert_eq!(encode(Codec::Zstd, 3, &random(1024, 5)), Err(Raw::Probed), "the shortest value probed");
        assert_eq!(encode(Codec::Zstd, 3, &random(1 << 20, 6)), Err(Raw::Probed));
        // Too short for the probe to tell: tried, and kept raw by the eighth rule.
        assert_eq!(encode(Codec::Zstd, 3, &random(600, 9)), Err(Raw::NoGain));
        assert_eq!(encode(Codec::Lz4, 0, &random(600, 9)), Err(Raw::NoGain));
        // Text is tried however long, and so is text with a random stretch inside.
        let mut mixed = html(8192);
        mixed[2000..3000].copy_from_slice(&random(1000, 4));
        assert!(worth_trying(&html(1024)) && worth_trying(&html(1 << 20)) && worth_trying(&mixed));
    }

    #[test]
    fn damaged_or_unknown_codings_fail_and_never_exceed_the_length() {
        let v = html(4096);
        for (codec, _) in Codec::ALL {
            let coded = encode(codec, codec.default_level(), &v).unwrap();
            assert_eq!(decode(codec.id(), &coded, v.len() - 1), Err(DecodeError::Corrupt), "{codec:?} shorter");
            assert_eq!(decode(codec.id(), &coded, v.len() + 1), Err(DecodeError::Corrupt), "{codec:?} longer");
            let mut bad = coded.clone();
            bad.truncate(coded.len() / 2);
            assert_eq!(decode(codec.id(), &bad, v.len()), Err(DecodeError::Corrupt), "{codec:?} truncated");
        }
        assert_eq!(decode(9, b"x", 1), Err(DecodeError::Unknown(9)));
    }

    #[test]
    fn names_parse_and_levels_change_between_calls() {
        assert_eq!("ZSTD".parse::<Codec>(), Ok(Codec::Zstd));
        assert!("brotli".parse::<Codec>().unwrap_err().contains("zstd"));
        let v = html(8192);
        // The thread's compressor follows the level asked for.
        for level in [1, 19, 3] {
            let coded = encode(Codec::Zstd, level, &v).unwrap();
            assert_eq!(coded, zstd::bulk::compress(&v, level).unwrap(), "level {level}");
            assert_eq!(decode(1, &coded, v.len()).unwrap(), v);
        }
    }
}
