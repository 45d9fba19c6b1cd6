//! `--compression`, `--compression-level` and `--compression-min-size`: a level or a minimum
//! size that the codec chosen cannot use is refused, never ignored.

use larder_engine::{Codec, Compression, DEFAULT_COMPRESSION_MIN_SIZE};

/// The store's compression setting from the three flags (or their config-file keys).
pub(super) fn resolve(codec: Option<&str>, level: Option<i32>, min_size: Option<u64>) -> Result<Compression, String> {
    let codec = match codec.map(str::trim) {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => None,
        Some(s) => Some(s.parse::<Codec>().map_err(|e| format!("--compression: {e}"))?),
    };
    let Some(c) = codec else {
        if level.is_some() || min_size.is_some() {
            return Err("--compression-level and --compression-min-size need --compression zstd or lz4".into());
        }
        return Ok(Compression::default());
    };
    let level = match (level, c.levels()) {
        (None, _) => c.default_level(),
        (Some(l), Some(range)) if range.contains(&l) && l != 0 => l,
        (Some(l), Some(range)) => {
            return Err(format!(
                "--compression-level {l} is not a {} level: use {} to {} (not 0)",
                c.name(),
                range.start(),
                range.end()
            ))
        }
        (Some(_), None) => return Err(format!("--compression-level: {} has no levels", c.name())),
    };
    Ok(Compression { codec: Some(c), level, min_size: min_size.unwrap_or(DEFAULT_COMPRESSION_MIN_SIZE) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_be_honoured_are_refused() {
        assert_eq!(resolve(None, None, None), Ok(Compression::default()));
        assert_eq!(resolve(Some("none"), None, None), Ok(Compression::default()));
        let z = resolve(Some("zstd"), None, None).unwrap();
        assert_eq!((z.codec, z.level, z.min_size), (Some(Codec::Zstd), 3, DEFAULT_COMPRESSION_MIN_SIZE));
        let z = resolve(Some("ZSTD"), Some(-5), Some(0)).unwrap();
        assert_eq!((z.level, z.min_size), (-5, 0));
        assert_eq!(resolve(Some("lz4"), None, Some(512)).unwrap().codec, Some(Codec::Lz4));
        for (codec, level, min, says) in [
            (Some("brotli"), None, None, "unknown codec"),
            (None, Some(3), None, "need --compression"),
            (Some("none"), None, Some(100), "need --compression"),
            (Some("lz4"), Some(1), None, "lz4 has no levels"),
            (Some("zstd"), Some(23), None, "not a zstd level"),
            (Some("zstd"), Some(0), None, "not a zstd level"),
        ] {
            let e = resolve(codec, level, min).unwrap_err();
            assert!(e.contains(says), "{codec:?} {level:?} {min:?}: {e}");
        }
    }
}
