//! Coded values: how a value is coded under the store's compression setting, and a value a
//! client sends coded already (HTTP's `Content-Encoding: zstd`), stored as sent once it is
//! known to decode.

use super::write::Prepared;
use super::Store;
use crate::disk::dicts::Dict;
use crate::format::codec;
use crate::format::meta;
use crate::format::record::FLAG_CODED;
use crate::types::{Codec, PutOptions, Stored};
use crate::{Error, ErrorKind, Result};
use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How a value is stored: coded with a codec, or as sent (and why, when compression is on).
pub(super) enum Coding {
    /// The coded bytes, their codec and the dictionary they were coded with: held until the
    /// record is written, so that it is not removed before the record that names it is noted.
    Coded(Vec<u8>, codec::Codec, Option<Arc<Dict>>),
    Raw(Option<codec::Raw>),
}

/// The longest value coded (or a coded one decoded) by a call that may not wait: past it,
/// the work goes to a thread that may block (a megabyte at zstd's top levels takes a tenth of
/// a second).
pub(super) const INLINE_CODING: u64 = 16 << 10;

impl Store {
    /// Whether a value of `len` bytes is coded under the store's setting.
    pub(super) fn codes(&self, len: u64) -> bool {
        let cfg = self.disk.ring.cfg.compression;
        cfg.codec.is_some() && len >= cfg.min_size
    }

    /// How the value made of `parts` (`len` bytes) is stored under the store's compression
    /// setting: coded, or as sent (and, when compression is on and the value long enough,
    /// why). With dictionaries, the value of `key` is coded with its prefix's (and sampled for
    /// it while there is none); a chunk (no key) is coded alone.
    pub(super) fn code(&self, key: Option<&[u8]>, parts: &[&[u8]], len: u64) -> Coding {
        let cfg = self.disk.ring.cfg.compression;
        let Some(codec) = cfg.codec.filter(|_| len >= cfg.min_size) else { return Coding::Raw(None) };
        let joined;
        let value: &[u8] = match parts {
            [one] => one,
            _ => {
                joined = parts.concat();
                &joined
            }
        };
        let prefix = match (&self.trainer, key) {
            (Some(t), Some(key)) if codec == Codec::Zstd && t.takes(len) => t.prefix(key).map(|p| (t, p)),
            _ => None,
        };
        if let Some((t, p)) = &prefix {
            if let Some(d) = p.active() {
                match codec::encode_with(&d.prepared, value) {
                    Ok(bytes) => {
                        t.coded(p, &d, len, bytes.len() as u64);
                        t.offer(&self.disk, p, &[value]); // sampled while it is trained anew
                        return Coding::Coded(bytes, codec, Some(d));
                    }
                    Err(codec::Raw::Probed) => return Coding::Raw(Some(codec::Raw::Probed)),
                    Err(codec::Raw::NoGain) => {} // alone, it may still gain
                }
            }
        }
        match codec::encode(codec, cfg.level, value) {
            Ok(bytes) => {
                // Only values that compress are worth a dictionary's room.
                if let Some((t, p)) = &prefix {
                    t.offer(&self.disk, p, &[value]);
                }
                Coding::Coded(bytes, codec, None)
            }
            Err(why) => Coding::Raw(Some(why)),
        }
    }

    /// Stores under `key` the value `coded` decodes to, as those coded bytes: they are
    /// decoded once, to check that they are one or more whole frames of the codec, to measure
    /// the value (at most a chunk: a coded value is one record) and to take its checksum,
    /// and are then written as they are. Only Zstandard frames are taken.
    /// `stored_ms`: the store time to keep (a touch rewriting a value only memory holds).
    pub(super) fn put_coded_inner(
        &self,
        key: &[u8],
        codec: Codec,
        coded: &[u8],
        opts: &PutOptions<'_>,
        wait: bool,
        stored_ms: Option<u64>,
    ) -> Result<Option<Stored>> {
        super::write::check_key(key)?;
        if !wait && coded.len() as u64 > INLINE_CODING {
            return Ok(None); // decoded on a thread that may take its time
        }
        let cfg = &self.disk.ring.cfg;
        if codec != Codec::Zstd {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("values are taken coded with zstd only, not {}", codec.name()),
            ));
        }
        let most = cfg.chunk_size.min(cfg.max_value_size);
        let value = decode_upload(coded, most)?;
        let len = value.len() as u64;
        super::write::check_content_type(opts.content_type)?;
        super::write::check_attrs(opts.attrs)?;
        if let Some(mut check) = super::cas::Check::of(cfg.verify_cas, key) {
            check.update(&value);
            self.cas_verdict(check)?;
        }
        let crc = crc32c::crc32c(&value);
        let mut m = Vec::new();
        meta::encode(&mut m, opts.content_type, None);
        meta::encode_flags(&mut m, opts.flags, opts.stale);
        meta::encode_attrs(&mut m, opts.attrs);
        meta::encode_coded(&mut m, &meta::Coded { codec: codec.id(), dictionary: 0, len, crc });
        let parts: [&[u8]; 1] = [coded];
        let p = Prepared {
            value: &parts,
            value_crc: crc32c::crc32c(coded),
            meta: m,
            flags: FLAG_CODED,
            len,
            crc,
            chunks: &[],
            stored_ms,
        };
        let hash = self.disk.ring.hash(key);
        let stored = self.commit(key, hash, p, opts, wait)?;
        if stored.is_some() {
            let c = &self.disk.ring.counters;
            c.coded_puts.fetch_add(1, Ordering::Relaxed);
            c.coded_logical_bytes.fetch_add(len, Ordering::Relaxed);
            c.coded_stored_bytes.fetch_add(coded.len() as u64, Ordering::Relaxed);
        }
        Ok(stored)
    }
}

/// The value Zstandard frames decode to, if they are whole frames and it is at most `most`
/// bytes (decoding stops there: a small upload cannot make the server allocate a large value).
fn decode_upload(coded: &[u8], most: u64) -> Result<Vec<u8>> {
    let invalid = |why: String| Error::new(ErrorKind::Invalid, format!("the body is not a zstd-coded value: {why}"));
    if coded.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    let decoder = zstd::stream::read::Decoder::with_buffer(coded).map_err(|e| invalid(e.to_string()))?;
    let mut value = Vec::new();
    decoder.take(most + 1).read_to_end(&mut value).map_err(|e| invalid(e.to_string()))?;
    if value.len() as u64 > most {
        return Err(Error::new(
            ErrorKind::TooLarge,
            format!("a coded value is stored as one record: it decodes to more than {most} bytes"),
        ));
    }
    Ok(value)
}
