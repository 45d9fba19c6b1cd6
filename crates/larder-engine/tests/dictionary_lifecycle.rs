//! A dictionary's life: when its prefix's values compress markedly worse than at first, the
//! prefix is trained again and the old dictionary retired; a retired dictionary stays while
//! any volume holds records that name it (after a restart: until the ring has turned over
//! every volume written before), then its files go. Alone in its process: it sets the store's
//! clock forward (past the time a retired dictionary is kept at least).

use larder_engine::format::dict;
use larder_engine::{faults, Codec, Compression, Dictionaries, FsyncPolicy, ReadOptions, Store, StoreConfig};
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        volume_size: 1 << 20,
        volume_count: 4,
        reinsert_min_hits: 0,
        fsync: FsyncPolicy::Never,
        compression: Compression {
            codec: Some(Codec::Zstd),
            level: 3,
            dictionary: Some(Dictionaries { sample_bytes: 64 << 10, ..Default::default() }),
            ..Default::default()
        },
        ..StoreConfig::new(dir)
    }
}

/// Text of `len` bytes from a vocabulary of its own (`kind`), with numbers that differ.
fn text(kind: &[&str], len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    let mut s = String::new();
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        s.push_str(&format!("{} {} {}; ", kind[x as usize % kind.len()], x % 97, kind[(x >> 8) as usize % kind.len()]));
    }
    s.truncate(len);
    s.into_bytes()
}

const JSON: [&str; 8] =
    ["\"package\":", "\"version\":", "\"depends\":", "{\"name\":", "\"summary\":", "[", "]},", "null"];
const MARKUP: [&str; 8] =
    ["<tr><td class=x>", "</td></tr>", "<a href=\"/doc/", "</a>", "<span>", "</span>", "<li>", "<p>"];

fn put_texts(s: &Store, kind: &[&str], from: u32, count: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    (from..from + count)
        .map(|i| {
            let (k, v) = (format!("api/{i}").into_bytes(), text(kind, 800 + (i as usize * 53) % 2000, i));
            s.put(&k, &v, &Default::default()).unwrap();
            (k, v)
        })
        .collect()
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Random (incompressible) values, enough to turn the ring `turns` times.
fn turn_ring(s: &Store, turns: f64) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let value: Vec<u8> = (0..(64 << 10))
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    for i in 0..((4 << 20) as f64 * turns / value.len() as f64) as usize {
        s.put(format!("bulk/{i}").as_bytes(), &value, &Default::default()).unwrap();
    }
}

#[test]
fn a_retrained_prefix_retires_its_old_dictionary_which_goes_once_no_volume_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path())).unwrap();
    put_texts(&s, &JSON, 0, 120);
    until("a first dictionary", || s.stats().dictionaries.trained == 1);
    let first = s.stats().dictionaries.each[0].id;
    let settled = put_texts(&s, &JSON, 1000, 80);
    // The prefix's values change kind: they compress worse with the dictionary, so it is
    // trained again from the new values.
    let mut changed = put_texts(&s, &MARKUP, 2000, 600);
    until("a retraining", || s.stats().dictionaries.retrains == 1);
    let mut n = 3000;
    while s.stats().dictionaries.trained < 2 {
        changed.extend(put_texts(&s, &MARKUP, n, 20));
        n += 20;
        assert!(n < 6000, "no second dictionary: {:?}", s.stats().dictionaries);
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = s.stats().dictionaries;
    let second = st.each.iter().find(|d| !d.retired).unwrap().id;
    assert_ne!(first, second);
    assert!(st.each.iter().any(|d| d.id == first && d.retired), "{st:?}");
    let coded_with = |s: &Store| s.stats().dictionaries.each.iter().find(|d| d.id == second).unwrap().values;
    let before = coded_with(&s);
    let after = put_texts(&s, &MARKUP, 9000, 10);
    assert_eq!(coded_with(&s) - before, 10);
    for (k, v) in settled.iter().chain(&changed).chain(&after) {
        assert_eq!(s.get(k, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec()).as_ref(), Some(v));
    }

    // Past the least time a retired dictionary is kept, but its records are still in the
    // ring: it stays, and so do they.
    faults::skew_clock(60_000);
    turn_ring(&s, 0.3);
    s.settle();
    assert_eq!(s.stats().dictionaries.removed, 0);
    assert!(dir.path().join(dict::file_name(first)).exists());

    // After a restart the store cannot tell which old volume needs which dictionary: both
    // stay until the ring has turned over every volume written before.
    drop(s);
    let s = Store::open(config(dir.path())).unwrap();
    for (k, v) in settled.iter().chain(&after) {
        assert_eq!(s.get(k, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec()).as_ref(), Some(v));
    }
    turn_ring(&s, 0.5);
    s.settle();
    assert_eq!(s.stats().dictionaries.removed, 0, "volumes from before the restart may need it");
    // (Retired anew at open, by the clock as it was then.)
    faults::skew_clock(120_000);
    turn_ring(&s, 1.5);
    until("the retired dictionary removed", || s.stats().dictionaries.removed == 1);
    assert!(!dir.path().join(dict::file_name(first)).exists());
    // The one in use stays, whatever the ring holds.
    assert!(dir.path().join(dict::file_name(second)).exists());
    let st = s.stats().dictionaries;
    assert_eq!(st.each.iter().map(|d| d.id).collect::<Vec<_>>(), vec![second]);
    let last = put_texts(&s, &MARKUP, 20_000, 5);
    for (k, v) in &last {
        assert_eq!(s.get(k, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec()).as_ref(), Some(v));
    }
    faults::skew_clock(0);
}
