//! `--compression`, `--compression-level`, `--compression-min-size` and the dictionary flags:
//! a level, a minimum size or a dictionary that the codec chosen cannot use is refused, never
//! ignored.

use larder_engine::{Codec, Compression, Dictionaries, DEFAULT_COMPRESSION_MIN_SIZE};

/// The compression flags (or their config-file keys), as given.
#[derive(Default)]
pub(super) struct Flags<'a> {
    pub codec: Option<&'a str>,
    pub level: Option<i32>,
    pub min_size: Option<u64>,
    pub dictionary: Option<&'a str>,
    pub depth: Option<u32>,
    pub sample: Option<u64>,
}

/// The store's compression setting from the flags.
pub(super) fn resolve(f: &Flags<'_>) -> Result<Compression, String> {
    let codec = match f.codec.map(str::trim) {
        None => None,
        Some(s) if s.eq_ignore_ascii_case("none") => None,
        Some(s) => Some(s.parse::<Codec>().map_err(|e| format!("--compression: {e}"))?),
    };
    let dictionary = dictionary(f, codec)?;
    let Some(c) = codec else {
        if f.level.is_some() || f.min_size.is_some() {
            return Err("--compression-level and --compression-min-size need --compression zstd or lz4".into());
        }
        return Ok(Compression::default());
    };
    let level = match (f.level, c.levels()) {
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
    Ok(Compression { codec: Some(c), level, min_size: f.min_size.unwrap_or(DEFAULT_COMPRESSION_MIN_SIZE), dictionary })
}

fn dictionary(f: &Flags<'_>, codec: Option<Codec>) -> Result<Option<Dictionaries>, String> {
    let auto = match f.dictionary.map(str::trim) {
        None => false,
        Some(s) if s.eq_ignore_ascii_case("none") => false,
        Some(s) if s.eq_ignore_ascii_case("auto") => true,
        Some(s) => return Err(format!("--compression-dictionary {s}: use auto or none")),
    };
    if !auto {
        if f.depth.is_some() || f.sample.is_some() {
            return Err("--compression-dictionary-depth and -sample need --compression-dictionary auto".into());
        }
        return Ok(None);
    }
    if codec != Some(Codec::Zstd) {
        return Err("--compression-dictionary auto needs --compression zstd (dictionaries are zstd's)".into());
    }
    let mut d = Dictionaries::default();
    match f.depth {
        Some(0) => return Err("--compression-dictionary-depth 0: a prefix is at least one segment".into()),
        Some(n) => d.depth = n,
        None => {}
    }
    match f.sample {
        Some(n) if !(16 << 10..=64 << 20).contains(&n) => {
            return Err(format!("--compression-dictionary-sample {n}: use 16KiB to 64MiB"))
        }
        Some(n) => d.sample_bytes = n,
        None => {}
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags<'a>(codec: Option<&'a str>, level: Option<i32>, min_size: Option<u64>) -> Flags<'a> {
        Flags { codec, level, min_size, ..Default::default() }
    }

    #[test]
    fn settings_that_cannot_be_honoured_are_refused() {
        assert_eq!(resolve(&flags(None, None, None)), Ok(Compression::default()));
        assert_eq!(resolve(&flags(Some("none"), None, None)), Ok(Compression::default()));
        let z = resolve(&flags(Some("zstd"), None, None)).unwrap();
        assert_eq!(
            (z.codec, z.level, z.min_size, z.dictionary),
            (Some(Codec::Zstd), 3, DEFAULT_COMPRESSION_MIN_SIZE, None)
        );
        let z = resolve(&flags(Some("ZSTD"), Some(-5), Some(0))).unwrap();
        assert_eq!((z.level, z.min_size), (-5, 0));
        assert_eq!(resolve(&flags(Some("lz4"), None, Some(512))).unwrap().codec, Some(Codec::Lz4));
        for (codec, level, min, says) in [
            (Some("brotli"), None, None, "unknown codec"),
            (None, Some(3), None, "need --compression"),
            (Some("none"), None, Some(100), "need --compression"),
            (Some("lz4"), Some(1), None, "lz4 has no levels"),
            (Some("zstd"), Some(23), None, "not a zstd level"),
            (Some("zstd"), Some(0), None, "not a zstd level"),
        ] {
            let e = resolve(&flags(codec, level, min)).unwrap_err();
            assert!(e.contains(says), "{codec:?} {level:?} {min:?}: {e}");
        }
    }

    #[test]
    fn dictionaries_are_zstd_only_and_their_settings_need_them() {
        let auto =
            |codec, depth, sample| Flags { codec, dictionary: Some("auto"), depth, sample, ..Default::default() };
        let d = resolve(&auto(Some("zstd"), None, None)).unwrap().dictionary.unwrap();
        assert_eq!(d, Dictionaries::default());
        let d = resolve(&auto(Some("zstd"), Some(2), Some(1 << 20))).unwrap().dictionary.unwrap();
        assert_eq!((d.depth, d.sample_bytes), (2, 1 << 20));
        let none = Flags { codec: Some("zstd"), dictionary: Some("none"), ..Default::default() };
        assert_eq!(resolve(&none).unwrap().dictionary, None);
        let depth_alone = Flags { codec: Some("zstd"), depth: Some(2), ..Default::default() };
        let bad_name = Flags { codec: Some("zstd"), dictionary: Some("trained"), ..Default::default() };
        for (f, says) in [
            (auto(Some("lz4"), None, None), "needs --compression zstd"),
            (auto(None, None, None), "needs --compression zstd"),
            (auto(Some("zstd"), Some(0), None), "at least one segment"),
            (auto(Some("zstd"), None, Some(1024)), "16KiB to 64MiB"),
            (depth_alone, "need --compression-dictionary auto"),
            (bad_name, "use auto or none"),
        ] {
            let e = resolve(&f).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
