//! What memcached's items need of the engine: client flags, compare-and-swap by store time,
//! absolute expiry, touch (a new expiry, same version) and the store-wide flush, each across a
//! restart, from memory and disk, for small and large values.

use larder_engine::{
    ErrorKind, Expiry, FsyncPolicy, MemoryConfig, Part, Precondition, PutOptions, ReadOptions, Store, StoreConfig, Tier,
};
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path, memory: u64) -> StoreConfig {
    StoreConfig {
        volume_size: 4 << 20,
        volume_count: 8,
        max_value_size: 4 << 20,
        chunk_size: 64 << 10,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: memory, promote_after: 1, ..MemoryConfig::default() },
        ..StoreConfig::new(dir)
    }
}

fn get(s: &Store, key: &[u8]) -> Option<larder_engine::Value> {
    s.get(
        key,
        &ReadOptions { part: Part::Range(larder_engine::ByteRange::Span(0, Some(60_000))), ..Default::default() },
    )
    .unwrap()
}

fn put(s: &Store, key: &[u8], value: &[u8], opts: PutOptions<'_>) -> larder_engine::Stored {
    let mut w = s.writer(key, &opts).unwrap();
    w.write(value).unwrap();
    w.finish().unwrap()
}

fn big(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn flags_come_back_from_disk_memory_and_large_values_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let large = big(200_000);
    {
        let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
        put(&s, b"small", b"v", PutOptions { flags: 0xdead_beef, ..Default::default() });
        put(&s, b"large", &large, PutOptions { flags: 7, ..Default::default() });
        put(&s, b"none", b"v", PutOptions::default());
        let first = s.get(b"small", &ReadOptions::default()).unwrap().unwrap();
        let again = s.get(b"small", &ReadOptions::default()).unwrap().unwrap();
        assert_eq!((first.tier, first.flags), (Tier::Disk, 0xdead_beef));
        assert_eq!((again.tier, again.flags), (Tier::Memory, 0xdead_beef));
        assert_eq!(get(&s, b"large").unwrap().flags, 7);
        assert_eq!(s.reader(b"large", Part::Whole).unwrap().unwrap().value().flags, 7);
        assert_eq!(get(&s, b"none").unwrap().flags, 0);
    }
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert_eq!(get(&s, b"small").unwrap().flags, 0xdead_beef);
    assert_eq!(get(&s, b"large").unwrap().flags, 7);
}

#[test]
fn a_write_conditional_on_a_store_time_wins_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
    let first = s.put(b"k", b"one", &PutOptions::default()).unwrap().version.stored_ms;
    let cas = |ms| PutOptions { preconditions: std::slice::from_ref(ms), ..Default::default() };
    let at = Precondition::StoredAt(first);
    let second = s.put(b"k", b"two", &cas(&at)).unwrap().version.stored_ms;
    assert!(second > first);
    let e = s.put(b"k", b"three", &cas(&at)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PreconditionFailed);
    assert_eq!(&s.get(b"k", &ReadOptions::default()).unwrap().unwrap().data[..], b"two");
    let e = s.put(b"missing", b"x", &cas(&Precondition::StoredAt(second))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PreconditionFailed);
    assert!(s.get(b"missing", &ReadOptions::default()).unwrap().is_none());
}

#[test]
fn an_absolute_expiry_in_the_past_stores_an_expired_value_and_one_ahead_holds() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 0)).unwrap();
    s.put(b"k", b"old", &PutOptions::default()).unwrap();
    let now = larder_engine::now_ms();
    s.put(b"k", b"past", &PutOptions { expiry: Expiry::At(now - 1000), ..Default::default() }).unwrap();
    assert!(s.get(b"k", &ReadOptions::default()).unwrap().is_none(), "replaced by an expired value");
    s.put(b"k", b"ahead", &PutOptions { expiry: Expiry::At(now + 60_000), ..Default::default() }).unwrap();
    let v = s.get(b"k", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!((&v.data[..], v.expiry_ms), (&b"ahead"[..], now + 60_000));
}

#[test]
fn touch_changes_the_expiry_and_keeps_bytes_flags_and_version_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let large = big(300_000);
    let (small_v, large_v);
    {
        let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
        let soon = PutOptions { expiry: Expiry::After(Duration::from_millis(300)), flags: 9, ..Default::default() };
        small_v = put(&s, b"small", b"bytes", soon).version;
        large_v = put(&s, b"large", &large, soon).version;
        // In memory too: the touch must not leave the old expiry there.
        assert!(s.get(b"small", &ReadOptions::default()).unwrap().is_some());
        let later = Expiry::After(Duration::from_secs(3600));
        assert_eq!(s.touch(b"small", later).unwrap(), Some(small_v));
        assert_eq!(s.touch(b"large", later).unwrap(), Some(large_v));
        assert_eq!(s.touch(b"absent", later).unwrap(), None);
        std::thread::sleep(Duration::from_millis(400));
        let v = s.get(b"small", &ReadOptions::default()).unwrap().expect("touched past its first expiry");
        assert_eq!((v.version(), v.flags, &v.data[..]), (small_v, 9, &b"bytes"[..]));
        assert!(v.expiry_ms > larder_engine::now_ms() + 3_000_000);
        let mut r = s.reader(b"large", Part::Whole).unwrap().expect("the large value touched");
        assert_eq!(r.value().version(), large_v);
        let mut got = Vec::new();
        while let Some(piece) = r.next_piece().unwrap() {
            got.extend_from_slice(&piece);
        }
        assert!(got == large, "a touched large value reads back whole");
    }
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert_eq!(s.get(b"small", &ReadOptions::default()).unwrap().unwrap().version(), small_v);
    assert_eq!(get(&s, b"large").unwrap().version(), large_v);
    // A touch to the past expires the value, and that holds after a restart too.
    assert_eq!(s.touch(b"small", Expiry::At(1)).unwrap(), Some(small_v));
    assert!(s.get(b"small", &ReadOptions::default()).unwrap().is_none());
    assert_eq!(s.touch(b"small", Expiry::Never).unwrap(), None, "an expired key is not touched back to life");
    drop(s);
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert!(s.get(b"small", &ReadOptions::default()).unwrap().is_none());
}

#[test]
fn flush_all_hides_everything_stored_before_it_and_holds_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let large = big(200_000);
    {
        let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
        s.put(b"a", b"1", &PutOptions::default()).unwrap();
        put(&s, b"large", &large, PutOptions::default());
        assert!(s.get(b"a", &ReadOptions::default()).unwrap().is_some()); // now in memory too
        s.flush_all(Duration::ZERO).unwrap();
        assert!(s.get(b"a", &ReadOptions::default()).unwrap().is_none(), "flushed from memory");
        assert!(get(&s, b"large").is_none());
        // Preconditions see the flush: the key is absent.
        let absent = [Precondition::Absent];
        s.put(b"a", b"2", &PutOptions { preconditions: &absent, ..Default::default() }).unwrap();
        s.put(b"b", b"3", &PutOptions::default()).unwrap();
    }
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert_eq!(&s.get(b"a", &ReadOptions::default()).unwrap().unwrap().data[..], b"2");
    assert_eq!(&s.get(b"b", &ReadOptions::default()).unwrap().unwrap().data[..], b"3");
    assert!(get(&s, b"large").is_none(), "the flush holds after a restart");
    assert_eq!(s.stats().keys, 2, "recovery indexes no flushed record");
    // Writes right after a restart are stamped above the cut, whatever the clock says.
    s.put(b"c", b"4", &PutOptions::default()).unwrap();
    assert!(s.get(b"c", &ReadOptions::default()).unwrap().is_some());
}

#[test]
fn a_delayed_flush_takes_effect_at_its_time_for_what_was_stored_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
    s.put(b"before", b"1", &PutOptions::default()).unwrap();
    s.flush_all(Duration::from_millis(700)).unwrap();
    s.put(b"meanwhile", b"2", &PutOptions::default()).unwrap();
    assert!(s.get(b"before", &ReadOptions::default()).unwrap().is_some(), "not yet");
    drop(s);
    // The pending flush is saved: a restart before its time keeps it.
    let s = Store::open(config(dir.path(), 1 << 20)).unwrap();
    s.put(b"after-restart", b"3", &PutOptions::default()).unwrap();
    assert!(s.get(b"meanwhile", &ReadOptions::default()).unwrap().is_some());
    std::thread::sleep(Duration::from_millis(800));
    for k in [&b"before"[..], b"meanwhile", b"after-restart"] {
        assert!(s.get(k, &ReadOptions::default()).unwrap().is_none(), "{}", String::from_utf8_lossy(k));
    }
    s.put(b"later", b"4", &PutOptions::default()).unwrap();
    assert!(s.get(b"later", &ReadOptions::default()).unwrap().is_some());
    // A new delayed flush replaces a pending one, never one already in force.
    s.flush_all(Duration::from_secs(3600)).unwrap();
    assert!(s.get(b"before", &ReadOptions::default()).unwrap().is_none());
    assert!(s.get(b"later", &ReadOptions::default()).unwrap().is_some());
    s.flush_all(Duration::ZERO).unwrap();
    assert!(s.get(b"later", &ReadOptions::default()).unwrap().is_none());
}

#[test]
fn a_damaged_flush_file_flushes_everything_rather_than_bring_values_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(config(dir.path(), 0)).unwrap();
        s.put(b"old", b"1", &PutOptions::default()).unwrap();
        s.flush_all(Duration::ZERO).unwrap();
        s.put(b"new", b"2", &PutOptions::default()).unwrap();
    }
    let path = dir.path().join("FLUSHED");
    let mut b = std::fs::read(&path).unwrap();
    b[30] ^= 0xff;
    std::fs::write(&path, &b).unwrap();
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert!(report.corrupt.iter().any(|f| f.what.contains("flush file")), "{:?}", report.corrupt);
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert!(s.get(b"old", &ReadOptions::default()).unwrap().is_none());
    assert!(s.get(b"new", &ReadOptions::default()).unwrap().is_none(), "taken as flushed, never as absent");
    s.put(b"newer", b"3", &PutOptions::default()).unwrap();
    assert!(s.get(b"newer", &ReadOptions::default()).unwrap().is_some());
}

#[test]
fn a_delayed_flush_covers_values_whose_store_times_ran_ahead_of_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), 0)).unwrap();
    // Faster than one write per millisecond: the store times run ahead of the clock.
    for i in 0..20_000u32 {
        s.put(format!("k{i}").as_bytes(), b"v", &PutOptions::default()).unwrap();
    }
    let last = s.get(b"k19999", &ReadOptions::default()).unwrap().unwrap().stored_ms;
    s.flush_all(Duration::from_millis(300)).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert!(s.get(b"k19999", &ReadOptions::default()).unwrap().is_none(), "stored at {last}, before the deadline");
    // The first write after the deadline turns it into a cut, and is itself above it.
    s.put(b"after", b"v", &PutOptions::default()).unwrap();
    assert!(s.get(b"after", &ReadOptions::default()).unwrap().is_some());
    assert!(s.get(b"k0", &ReadOptions::default()).unwrap().is_none());
    drop(s);
    let s = Store::open(config(dir.path(), 0)).unwrap();
    assert!(s.get(b"k19999", &ReadOptions::default()).unwrap().is_none(), "after a restart too");
    assert!(s.get(b"after", &ReadOptions::default()).unwrap().is_some());
}

#[test]
fn a_touch_of_a_value_only_memory_still_holds_keeps_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let v;
    {
        let s = Store::open(StoreConfig { reinsert_min_hits: 0, ..config(dir.path(), 1 << 20) }).unwrap();
        v = s.put(b"k", b"held", &PutOptions::default()).unwrap().version;
        for _ in 0..2 {
            s.get(b"k", &ReadOptions::default()).unwrap().unwrap(); // promoted
        }
        // The ring turns past its volume: only memory holds the value now.
        for i in 0..800 {
            s.put(format!("filler{i}").as_bytes(), &[7u8; 60_000], &PutOptions::default()).unwrap();
        }
        assert_eq!(s.get(b"k", &ReadOptions::default()).unwrap().unwrap().tier, Tier::Memory);
        // Written to disk again with its new expiry, as the same version (ETag, cas unique).
        assert_eq!(s.touch(b"k", Expiry::After(Duration::from_secs(3600))).unwrap(), Some(v));
        let got = s.get(b"k", &ReadOptions::default()).unwrap().unwrap();
        assert_eq!((got.version(), &got.data[..]), (v, &b"held"[..]));
        assert!(got.expiry_ms > larder_engine::now_ms() + 3_000_000);
    }
    let s = Store::open(config(dir.path(), 0)).unwrap();
    let got = s.get(b"k", &ReadOptions::default()).unwrap().expect("the touched copy is on disk");
    assert_eq!((got.version(), got.tier), (v, Tier::Disk), "the same version after a restart");
}
