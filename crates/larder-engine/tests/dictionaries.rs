//! `Compression::dictionary`: a prefix's small values train a zstd dictionary that codes its
//! later values much smaller; every value reads back byte for byte, after a restart too; a
//! dictionary file missing or damaged makes only its values unreadable (counted misses, named
//! by `check`), never wrong bytes.

use larder_engine::format::dict;
use larder_engine::{
    Codec, Compression, Dictionaries, ErrorKind, FsyncPolicy, MemoryConfig, ReadOptions, Store, StoreConfig,
};
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path, memory: u64) -> StoreConfig {
    StoreConfig {
        volume_size: 8 << 20,
        volume_count: 8,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: memory, promote_after: 1, on_put: memory > 0, ..Default::default() },
        compression: Compression {
            codec: Some(Codec::Zstd),
            level: 3,
            dictionary: Some(Dictionaries { sample_bytes: 64 << 10, ..Default::default() }),
            ..Default::default()
        },
        ..StoreConfig::new(dir)
    }
}

const WORDS: [&str; 24] = [
    "package",
    "version",
    "depends",
    "maintainer",
    "description",
    "homepage",
    "section",
    "priority",
    "library",
    "runtime",
    "development",
    "files",
    "headers",
    "documentation",
    "architecture",
    "source",
    "binary",
    "checksum",
    "translation",
    "upstream",
    "release",
    "security",
    "update",
    "status",
];

/// A JSON document of about `len` bytes, as the records of one API are: the same field names
/// and much the same words, in another order and with other numbers each time.
fn doc(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let mut s = format!("{{\"id\": {seed}, \"entries\": [");
    while s.len() < len {
        let words: Vec<&str> = (0..6).map(|_| WORDS[next() as usize % WORDS.len()]).collect();
        s.push_str(&format!(
            "{{\"name\": \"lib{}-{}\", \"{}\": \"{}.{}.{}\", \"summary\": \"{}\"}}, ",
            words[0],
            next() % 1000,
            words[1],
            next() % 10,
            next() % 40,
            next() % 9,
            words[2..].join(" ")
        ));
    }
    s.truncate(len);
    s.into_bytes()
}

/// Waits (boundedly) until the store has trained `n` dictionaries.
fn trained(s: &Store, n: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    while s.stats().dictionaries.trained < n {
        assert!(Instant::now() < until, "no dictionary trained: {:?}", s.stats().dictionaries);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(s: &Store, key: &[u8]) -> Option<Vec<u8>> {
    s.get(key, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

/// Puts `count` documents under `prefix`, numbered from `from`; returns the keys and values.
fn put_docs(s: &Store, prefix: &str, from: u32, count: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    (from..from + count)
        .map(|i| {
            let (k, v) = (format!("{prefix}/{i}.json").into_bytes(), doc(600 + (i as usize * 37) % 2500, i));
            s.put(&k, &v, &Default::default()).unwrap();
            (k, v)
        })
        .collect()
}

#[test]
fn a_prefix_trains_a_dictionary_that_codes_its_small_values_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 0)).unwrap();
    let mut all = put_docs(&s, "api", 0, 150);
    trained(&s, 1);
    let st = s.stats();
    let d = &st.dictionaries.each[0];
    assert_eq!((d.key_prefix.as_str(), d.retired), ("api", false));
    assert!(d.bytes > 1024, "{d:?}");
    assert!(dir.path().join(dict::file_name(d.id)).exists(), "kept on disk before it codes anything");

    // The same documents coded alone, against the same coded with the dictionary.
    let before = st.coded_stored_bytes;
    let later = put_docs(&s, "api", 1000, 200);
    let with_dict = s.stats().coded_stored_bytes - before;
    let alone: usize =
        later.iter().map(|(_, v)| larder_engine::format::codec::encode(Codec::Zstd, 3, v).unwrap().len()).sum();
    let st = s.stats();
    assert_eq!(st.dictionaries.each[0].values, 200, "{:?}", st.dictionaries);
    assert!(
        (with_dict as f64) < alone as f64 * 0.8,
        "with the dictionary {with_dict} bytes, alone {alone}: a dictionary pays on small values"
    );
    // Another prefix has no dictionary yet: its values are coded alone.
    let other = put_docs(&s, "other", 0, 5);
    assert_eq!(s.stats().dictionaries.each[0].values, 200);
    // What the ring holds, by how it is stored: each value once, as sent and as stored.
    let held = s.stats().held;
    assert_eq!(held.zstd_dictionary.values, 200);
    assert_eq!(held.zstd_dictionary.logical_bytes, later.iter().map(|(_, v)| v.len() as u64).sum::<u64>());
    assert_eq!(held.zstd_dictionary.stored_bytes, with_dict);
    assert_eq!((held.zstd.values, held.raw.values, held.lz4.values, held.volumes_unaccounted), (155, 0, 0, 0));
    assert!(held.zstd.stored_bytes * 3 < held.zstd.logical_bytes, "{held:?}");
    all.extend(later);
    all.extend(other);
    for (k, v) in &all {
        assert_eq!(read(&s, k).as_ref(), Some(v), "{}", String::from_utf8_lossy(k));
    }
    // Read back after a restart, from a directory `check` finds sound.
    drop(s);
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert!(report.clean(), "{report:?}");
    assert_eq!(report.dictionaries, 1);
    assert!(report.coded_records >= all.len() as u64);
    let s = Store::open(config(dir.path(), 0)).unwrap();
    for (k, v) in &all {
        assert_eq!(read(&s, k).as_ref(), Some(v));
    }
    // A volume written before the restart is not accounted (its hint says nothing of codings).
    let held = s.stats().held;
    assert_eq!((held.volumes_unaccounted, held.zstd.values), (1, 0), "{held:?}");
    assert!(held.bytes_unaccounted > 0);
    // The dictionary codes its prefix again after the restart (none is trained anew).
    let more = put_docs(&s, "api", 5000, 10);
    let st = s.stats();
    assert_eq!((st.dictionaries.trained, st.dictionaries.each.len(), st.dictionaries.each[0].values), (0, 1, 10));
    for (k, v) in &more {
        assert_eq!(read(&s, k).as_ref(), Some(v));
    }
    // Under a store that codes nothing now, everything still reads.
    drop(s);
    let plain = StoreConfig { compression: Compression::default(), ..config(dir.path(), 0) };
    let s = Store::open(plain).unwrap();
    for (k, v) in all.iter().chain(&more) {
        assert_eq!(read(&s, k).as_ref(), Some(v));
    }
}

#[test]
fn memory_holds_values_coded_with_a_dictionary_and_never_sends_them_coded() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 64 << 20)).unwrap();
    put_docs(&s, "api", 0, 150);
    trained(&s, 1);
    let (k, v) = put_docs(&s, "api", 900, 1).remove(0);
    // A client asking for zstd gets the value itself: it does not hold the dictionary.
    let got = s.get(&k, &ReadOptions { coded: true, ..Default::default() }).unwrap().unwrap();
    assert_eq!(got.tier, larder_engine::Tier::Memory);
    assert_eq!(&got.data[..], &v[..]);
    let coded = got.coded.expect("held coded");
    assert_eq!((coded.codec, coded.dictionary), (Codec::Zstd, s.stats().dictionaries.each[0].id));
    assert!(coded.data.len() * 3 < v.len(), "memory holds the coded bytes");
}

#[test]
fn a_missing_or_damaged_dictionary_makes_only_its_values_counted_misses() {
    for damage in ["missing", "damaged"] {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(config(dir.path(), 0)).unwrap();
        let early = put_docs(&s, "api", 0, 150);
        trained(&s, 1);
        let id = s.stats().dictionaries.each[0].id;
        let coded = put_docs(&s, "api", 1000, 20);
        let raw = vec![(b"short".to_vec(), b"tiny".to_vec())];
        s.put(&raw[0].0, &raw[0].1, &Default::default()).unwrap();
        drop(s);
        let file = dir.path().join(dict::file_name(id));
        match damage {
            "missing" => std::fs::remove_file(&file).unwrap(),
            _ => {
                let mut b = std::fs::read(&file).unwrap();
                let i = b.len() / 2;
                b[i] ^= 0x40;
                std::fs::write(&file, b).unwrap();
            }
        }
        let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
        let named: Vec<_> = report.corrupt.iter().filter(|f| format!("{f:?}").contains("dictionary")).collect();
        assert!(named.len() >= coded.len(), "{damage}: check names each value's dictionary: {:?}", report.corrupt);
        let s = Store::open(config(dir.path(), 0)).unwrap();
        assert_eq!(s.stats().dictionaries.damaged_files, u64::from(damage == "damaged"));
        for (k, _) in &coded {
            assert_eq!(read(&s, k), None, "{damage}: a value whose dictionary is gone is a miss");
        }
        let st = s.stats();
        assert_eq!(st.decode_failures, coded.len() as u64, "{damage}");
        // Values coded alone (before the dictionary existed), and raw ones, are untouched.
        for (k, v) in early.iter().chain(&raw) {
            assert_eq!(read(&s, k).as_ref(), Some(v), "{damage}");
        }
        // A dictionary trained anew codes the prefix again; a frame of the lost one still
        // never decodes to wrong bytes.
        let again = put_docs(&s, "api", 3000, 150);
        trained(&s, 1);
        let st = s.stats();
        assert_eq!(st.dictionaries.each.iter().filter(|d| !d.retired).count(), 1, "{damage}: {:?}", st.dictionaries);
        for (k, v) in put_docs(&s, "api", 4000, 5).iter().chain(&again) {
            assert_eq!(read(&s, k).as_ref(), Some(v), "{damage}");
        }
        for (k, _) in &coded {
            assert_eq!(read(&s, k), None, "{damage}");
        }
    }
}

#[test]
fn dictionaries_need_zstd() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 0);
    cfg.compression.codec = Some(Codec::Lz4);
    assert_eq!(Store::open(cfg).err().map(|e| e.kind()), Some(ErrorKind::Invalid));
    let mut cfg = config(dir.path(), 0);
    cfg.compression.codec = None;
    assert_eq!(Store::open(cfg).err().map(|e| e.kind()), Some(ErrorKind::Invalid));
}

/// Each data directory keeps a copy of each dictionary: one that lost its copy (or holds a
/// damaged one) gets it back at open, so that losing any one directory loses no dictionary.
#[test]
fn every_data_directory_gets_a_sound_copy_back_at_open() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cfg = || StoreConfig { dirs: vec![a.path().to_path_buf(), b.path().to_path_buf()], ..config(a.path(), 0) };
    let s = Store::open(cfg()).unwrap();
    put_docs(&s, "api", 0, 150);
    trained(&s, 1);
    let id = s.stats().dictionaries.each[0].id;
    let coded = put_docs(&s, "api", 1000, 20);
    drop(s);
    let name = dict::file_name(id);
    let sound = std::fs::read(a.path().join(&name)).unwrap();
    assert_eq!(std::fs::read(b.path().join(&name)).unwrap(), sound, "written to both");
    std::fs::remove_file(a.path().join(&name)).unwrap();
    let mut damaged = sound.clone();
    damaged[40] ^= 1;
    std::fs::write(b.path().join(&name), &damaged).unwrap();
    // One damaged copy, one missing: the values are unreadable (never wrong), and nothing is
    // copied from a damaged file.
    let s = Store::open(cfg()).unwrap();
    assert_eq!(read(&s, &coded[0].0), None);
    drop(s);
    // A sound copy in one directory restores the other's.
    std::fs::write(b.path().join(&name), &sound).unwrap();
    let s = Store::open(cfg()).unwrap();
    assert_eq!(std::fs::read(a.path().join(&name)).unwrap(), sound);
    for (k, v) in &coded {
        assert_eq!(read(&s, k).as_ref(), Some(v));
    }
}
