//! What a cluster node needs of the engine: an expiry cap on the keys a predicate selects, the
//! downtime known at open from the alive stamp, and the live keys listed from the volumes.

use larder_engine::format::alive;
use larder_engine::{Expiry, ExpiryCap, FsyncPolicy, Part, PutOptions, Store, StoreConfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        volume_size: 1 << 20,
        volume_count: 8,
        max_value_size: 1 << 20,
        chunk_size: 64 << 10,
        fsync: FsyncPolicy::Never,
        ..StoreConfig::new(dir)
    }
}

fn expiry_of(s: &Store, key: &[u8]) -> u64 {
    s.reader(key, Part::Whole).unwrap().unwrap().value().expiry_ms
}

#[test]
fn capped_keys_live_at_most_the_cap_and_others_are_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let cap = ExpiryCap { most: Duration::from_secs(60), applies: Arc::new(|k: &[u8]| k.starts_with(b"foreign")) };
    let s = Store::open(StoreConfig { expiry_cap: Some(cap), ..config(dir.path()) }).unwrap();
    let now = larder_engine::now_ms();
    let put = |k: &[u8], e: Expiry| s.put(k, b"v", &PutOptions { expiry: e, ..Default::default() }).unwrap();
    put(b"foreign-never", Expiry::Never);
    put(b"foreign-hour", Expiry::After(Duration::from_secs(3600)));
    put(b"foreign-short", Expiry::After(Duration::from_secs(5)));
    put(b"own-never", Expiry::Never);
    put(b"own-hour", Expiry::After(Duration::from_secs(3600)));
    let near = |e: u64, want: u64| e >= now + want - 1000 && e <= now + want + 5000;
    assert!(near(expiry_of(&s, b"foreign-never"), 60_000));
    assert!(near(expiry_of(&s, b"foreign-hour"), 60_000));
    assert!(near(expiry_of(&s, b"foreign-short"), 5_000), "a shorter expiry is kept");
    assert_eq!(expiry_of(&s, b"own-never"), 0);
    assert!(near(expiry_of(&s, b"own-hour"), 3_600_000));
    assert_eq!(s.stats().capped_writes, 3, "every write of a capped key counts, shortened or not");
    // A touch asks for a new expiry: capped the same way.
    s.touch(b"foreign-short", Expiry::Never).unwrap().unwrap();
    assert!(near(expiry_of(&s, b"foreign-short"), 60_000));
    s.touch(b"own-hour", Expiry::Never).unwrap().unwrap();
    assert_eq!(expiry_of(&s, b"own-hour"), 0);
    assert_eq!(s.stats().capped_writes, 4);
    // A large value, written in pieces, too.
    let mut w = s.writer(b"foreign-large", &PutOptions::default()).unwrap();
    w.write(&vec![7u8; 200_000]).unwrap();
    w.finish().unwrap();
    assert!(near(expiry_of(&s, b"foreign-large"), 60_000));
}

#[test]
fn the_downtime_is_known_at_open_from_the_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join(alive::FILE_NAME);
    {
        let s = Store::open(config(dir.path())).unwrap();
        assert_eq!(s.stats().recovery.down_ms, None, "a new store has no stamp");
        // Renewed while open (a process killed leaves the last one: tests/crash.rs in the server).
        let first = alive::decode(&std::fs::read(&stamp).unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(2100));
        let later = alive::decode(&std::fs::read(&stamp).unwrap()).unwrap();
        assert!(later >= first + 900, "renewed: {first} then {later}");
    }
    // Closed: its last stamp is the time of the close.
    let s = Store::open(config(dir.path())).unwrap();
    assert!(s.stats().recovery.down_ms.unwrap() < 1_000);
    drop(s);
    // A stamp of ten seconds ago is ten seconds down.
    std::fs::write(&stamp, alive::encode(larder_engine::now_ms() - 10_000)).unwrap();
    let s = Store::open(config(dir.path())).unwrap();
    let down = s.stats().recovery.down_ms.unwrap();
    assert!((10_000..12_000).contains(&down), "down for {down} ms");
    drop(s);
    // A damaged stamp, or one ahead of the clock, is no stamp: unknown, never short.
    std::fs::write(&stamp, [0u8; 64]).unwrap();
    assert_eq!(Store::open(config(dir.path())).unwrap().stats().recovery.down_ms, None);
    std::fs::write(&stamp, alive::encode(larder_engine::now_ms() + 60_000)).unwrap();
    assert_eq!(Store::open(config(dir.path())).unwrap().stats().recovery.down_ms, None);
}

#[test]
fn a_store_down_longer_than_max_downtime_opens_empty_and_a_shorter_absence_keeps_all() {
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join(alive::FILE_NAME);
    let with = |max: u64| StoreConfig { max_downtime: Some(Duration::from_secs(max)), ..config(dir.path()) };
    {
        let s = Store::open(with(60)).unwrap();
        s.put(b"k", b"v", &PutOptions::default()).unwrap();
    }
    // Ten seconds down, sixty allowed: everything is kept.
    std::fs::write(&stamp, alive::encode(larder_engine::now_ms() - 10_000)).unwrap();
    let s = Store::open(with(60)).unwrap();
    assert!(!s.stats().recovery.started_empty);
    assert!(s.get(b"k", &Default::default()).unwrap().is_some());
    drop(s);
    // Ten seconds down, five allowed: opened as if flushed when it went down, and counted.
    std::fs::write(&stamp, alive::encode(larder_engine::now_ms() - 10_000)).unwrap();
    let s = Store::open(with(5)).unwrap();
    let st = s.stats();
    assert!(st.recovery.started_empty && st.downtime_flushes == 1, "{st:?}");
    assert!(s.get(b"k", &Default::default()).unwrap().is_none());
    // New writes are taken at once, and the flush holds across a restart.
    s.put(b"new", b"v", &PutOptions::default()).unwrap();
    drop(s);
    let s = Store::open(with(60)).unwrap();
    assert!(s.get(b"k", &Default::default()).unwrap().is_none());
    assert!(s.get(b"new", &Default::default()).unwrap().is_some());
    drop(s);
    // No stamp: the downtime is unknown, which is taken as too long.
    std::fs::remove_file(&stamp).unwrap();
    let s = Store::open(with(60)).unwrap();
    assert!(s.stats().recovery.started_empty);
    assert!(s.get(b"new", &Default::default()).unwrap().is_none());
}

#[test]
fn keys_lists_each_live_key_once_with_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path())).unwrap();
    let mut want = BTreeMap::new();
    for i in 0..3_000u32 {
        let key = format!("key-{i}");
        let len = (i % 50) as usize;
        s.put(key.as_bytes(), &vec![1u8; len], &PutOptions::default()).unwrap();
        want.insert(key.into_bytes(), len as u64);
    }
    // Rewritten (the older records stay in the volumes), deleted, expired, large.
    for i in (0..3_000u32).step_by(3) {
        let key = format!("key-{i}");
        s.put(key.as_bytes(), b"again", &PutOptions::default()).unwrap();
        want.insert(key.into_bytes(), 5);
    }
    for i in (1..3_000u32).step_by(7) {
        let key = format!("key-{i}");
        s.delete(key.as_bytes(), &Default::default()).unwrap();
        want.remove(key.as_bytes());
    }
    s.put(b"gone", b"v", &PutOptions { expiry: Expiry::After(Duration::ZERO), ..Default::default() }).unwrap();
    let mut w = s.writer(b"large", &PutOptions::default()).unwrap();
    w.write(&vec![3u8; 300_000]).unwrap();
    w.finish().unwrap();
    want.insert(b"large".to_vec(), 300_000);
    let mut got = BTreeMap::new();
    let n = s
        .keys(|k| {
            assert!(got.insert(k.key.to_vec(), k.len).is_none(), "listed twice: {:?}", k.key);
            true
        })
        .unwrap();
    assert_eq!(n as usize, want.len());
    assert_eq!(got, want);
    // The same after a restart (from hints and scans), and a listing can stop early.
    drop(s);
    let s = Store::open(config(dir.path())).unwrap();
    let mut again = BTreeMap::new();
    s.keys(|k| again.insert(k.key.to_vec(), k.len).is_none()).unwrap();
    assert_eq!(again, want);
    let mut seen = 0;
    assert_eq!(
        s.keys(|_| {
            seen += 1;
            seen < 10
        })
        .unwrap(),
        10
    );
    // Flushed keys are not listed.
    s.flush_all(Duration::ZERO).unwrap();
    assert_eq!(s.keys(|_| true).unwrap(), 0);
}

/// Issue 39's second defect: with `max_downtime` 0 s and syncs every second, a disk whose
/// syncs take 3.5 s under a burst of writes is slow, not a process that did not run. Before,
/// the syncer held the lock the alive stamp's thread waits on for its whole sync, and the
/// store flushed itself. Nothing written may be lost, running or across a graceful restart
/// (the kill -9 restart: the server's tests/restart.rs).
#[test]
fn a_slow_fsync_under_a_write_burst_never_flushes_a_running_store() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |max: u64| StoreConfig {
        volume_size: 8 << 20,
        volume_count: 8,
        max_downtime: Some(Duration::from_secs(max)),
        fsync: FsyncPolicy::Every(Duration::from_secs(1)),
        ..config(dir.path())
    };
    let s = Store::open(cfg(0)).unwrap();
    s.put(b"first", b"before the burst", &PutOptions::default()).unwrap();
    larder_engine::faults::inject(dir.path(), larder_engine::faults::Rule::parse("sync delay ms=3500").unwrap())
        .unwrap();
    let value = vec![5u8; 64 << 10];
    let (started, mut n, mut held) = (std::time::Instant::now(), 0u32, false);
    while started.elapsed() < Duration::from_secs(6) || !held {
        s.put(format!("burst/{n}").as_bytes(), &value, &PutOptions::default()).unwrap();
        n += 1;
        held |= larder_engine::faults::delayed() > 0;
        std::thread::sleep(Duration::from_millis(20));
        assert!(started.elapsed() < Duration::from_secs(30), "no sync was ever held up");
    }
    let st = s.stats();
    assert_eq!(st.downtime_flushes, 0, "flushed a store that ran all along: {st:?}");
    let all_there = |s: &Store| {
        s.get(b"first", &Default::default()).unwrap().is_some()
            && (0..n).all(|i| s.get(format!("burst/{i}").as_bytes(), &Default::default()).unwrap().is_some())
    };
    assert!(all_there(&s), "{n} values written");
    drop(s);
    larder_engine::faults::clear(dir.path());
    let s = Store::open(cfg(60)).unwrap();
    assert!(!s.stats().recovery.started_empty);
    assert!(all_there(&s), "{n} values after a restart");
}
