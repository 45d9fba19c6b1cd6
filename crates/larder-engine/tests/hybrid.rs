//! The hybrid tier through the engine's public API: the memory tier's admission and
//! invalidation, and the ring's reinsertion of entries read from disk.

use larder_engine::{DeleteOptions, FsyncPolicy, MemoryConfig, PutOptions, ReadOptions, Store, StoreConfig, Tier};
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path, memory: u64, min_hits: u8) -> StoreConfig {
    StoreConfig {
        volume_size: 64 << 10,
        volume_count: 4,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: memory, ..MemoryConfig::default() },
        reinsert_min_hits: min_hits,
        ..StoreConfig::new(dir)
    }
}

/// Writes 1 KiB fillers until the ring has turned `turns` more times, settling after each
/// write so reinsertion keeps pace as it would at a sane write rate; reads `hot` every 8 writes.
fn turn_ring(store: &Store, turns: u64, hot: Option<&[u8]>) {
    let until = store.stats().rotations + turns * store.stats().volume_count;
    let mut i = 0u64;
    while store.stats().rotations < until {
        store.put(format!("filler/{i}").as_bytes(), &[i as u8; 1024], &PutOptions::default()).unwrap();
        store.settle();
        if let (Some(k), 0) = (hot, i % 8) {
            assert!(
                store.get(k, &ReadOptions::default()).unwrap().is_some(),
                "{} vanished after {i} fillers",
                String::from_utf8_lossy(k)
            );
        }
        i += 1;
    }
}

#[test]
fn a_key_read_from_disk_survives_ring_turns_that_evict_an_unread_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 0, 1)).unwrap();
    store.put(b"hot", b"read often", &PutOptions::default()).unwrap();
    store.put(b"cold", b"never read", &PutOptions::default()).unwrap();
    turn_ring(&store, 3, Some(b"hot"));
    assert_eq!(store.get(b"hot", &ReadOptions::default()).unwrap().unwrap().data.as_ref(), b"read often");
    assert!(
        store.get(b"cold", &ReadOptions::default()).unwrap().is_none(),
        "an unread key outlived three turns of the ring"
    );
    let s = store.stats();
    assert!(s.reinserted >= 3, "the hot key is copied forward once per turn: {s:?}");
}

#[test]
fn plain_fifo_evicts_the_hot_key_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 0, 0)).unwrap();
    store.put(b"hot", b"read often", &PutOptions::default()).unwrap();
    for _ in 0..10 {
        store.get(b"hot", &ReadOptions::default()).unwrap();
    }
    turn_ring(&store, 1, None);
    assert!(store.get(b"hot", &ReadOptions::default()).unwrap().is_none());
    assert_eq!(store.stats().reinserted, 0);
}

#[test]
fn nearly_every_qualifying_entry_of_an_evicted_volume_is_reinserted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 0, 1)).unwrap();
    let key = |i: u32| format!("item/{i}").into_bytes();
    for i in 0..200 {
        store.put(&key(i), &[i as u8; 200], &PutOptions::default()).unwrap();
    }
    // 30 read entries of about 300 bytes: well within 20% of a 64 KiB volume.
    for i in (0..200).step_by(6).take(30) {
        assert!(store.get(&key(i), &ReadOptions::default()).unwrap().is_some());
    }
    turn_ring(&store, 1, None);
    let s = store.stats();
    let qualifying = s.reinsert_candidates - s.reinsert_over_budget;
    assert!(qualifying >= 30 && s.reinsert_over_budget == 0, "{s:?}");
    assert!(s.reinserted * 10 >= qualifying * 9, "only {} of {qualifying} reinserted", s.reinserted);
    for i in 0..200 {
        let read = i % 6 == 0 && i / 6 < 30;
        let got = store.get(&key(i), &ReadOptions::default()).unwrap();
        assert_eq!(got.is_some(), read, "item/{i}");
        if let Some(v) = got {
            assert_eq!(v.data.as_ref(), &[i as u8; 200][..]);
        }
    }
}

#[test]
fn memory_admission_invalidation_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    // No reinsertion: the ring drops what it overwrites.
    let mut cfg = config(dir.path(), 1 << 20, 0);
    cfg.memory.promote_window = Duration::from_millis(300);
    let store = Store::open(cfg).unwrap();
    let tier = |k: &[u8]| store.get(k, &ReadOptions::default()).unwrap().map(|v| v.tier);
    store.put(b"k", b"one", &PutOptions::default()).unwrap();
    assert_eq!(tier(b"k"), Some(Tier::Disk));
    assert_eq!(tier(b"k"), Some(Tier::Disk));
    assert_eq!(tier(b"k"), Some(Tier::Memory), "promoted on the second disk read");
    // A put invalidates: the new value comes from disk.
    store.put(b"k", b"two", &PutOptions::default()).unwrap();
    let v = store.get(b"k", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!((v.data.as_ref(), v.tier), (&b"two"[..], Tier::Disk));
    // A pause longer than the window starts the count again: without it, the read after the
    // pause would be the second and the one after it a memory hit.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(tier(b"k"), Some(Tier::Disk));
    assert_eq!(tier(b"k"), Some(Tier::Disk));
    assert_eq!(tier(b"k"), Some(Tier::Memory));
    // Delete removes it from both tiers.
    assert!(store.delete(b"k", &DeleteOptions::default()).unwrap());
    assert_eq!(tier(b"k"), None);
    assert!(!store.delete(b"k", &DeleteOptions::default()).unwrap());
    // A value held only by memory (its volume overwritten) is still deletable, and gone after.
    store.put(b"m", b"memory only", &PutOptions::default()).unwrap();
    store.get(b"m", &ReadOptions::default()).unwrap();
    store.get(b"m", &ReadOptions::default()).unwrap();
    {
        let s = store.stats();
        assert_eq!((s.promotions, s.memory_entries), (3, 1), "{s:?}");
    }
    turn_ring(&store, 1, None);
    assert_eq!(tier(b"m"), Some(Tier::Memory));
    assert!(store.delete(b"m", &DeleteOptions::default()).unwrap());
    assert_eq!(tier(b"m"), None);
}

#[test]
fn memory_on_put_and_memory_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1 << 20, 1);
    cfg.memory.on_put = true;
    let store = Store::open(cfg).unwrap();
    store.put(b"k", b"v1", &PutOptions::default()).unwrap();
    let v = store.get(b"k", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!((v.data.as_ref(), v.tier), (&b"v1"[..], Tier::Memory));
    store.put(b"k", b"v2", &PutOptions::default()).unwrap();
    assert_eq!(store.get(b"k", &ReadOptions::default()).unwrap().unwrap().data.as_ref(), b"v2");
    drop(store);

    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 0, 1)).unwrap();
    store.put(b"k", b"v", &PutOptions::default()).unwrap();
    for _ in 0..5 {
        assert_eq!(store.get(b"k", &ReadOptions::default()).unwrap().unwrap().tier, Tier::Disk);
    }
    let s = store.stats();
    assert_eq!((s.memory_hits, s.memory_capacity, s.promotions), (0, 0, 0));
}

#[test]
fn memory_takes_no_value_above_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryConfig { capacity: 64 << 20, promote_after: 1, max_value: 1000, ..MemoryConfig::default() };
    let store = Store::open(StoreConfig { memory, ..config(dir.path(), 0, 0) }).unwrap();
    let opts = ReadOptions::default();
    store.put(b"small", &[1u8; 1000], &PutOptions::default()).unwrap();
    store.put(b"over", &[2u8; 1001], &PutOptions::default()).unwrap();
    for _ in 0..3 {
        store.get(b"small", &opts).unwrap().unwrap();
        store.get(b"over", &opts).unwrap().unwrap();
    }
    assert_eq!(store.get(b"small", &opts).unwrap().unwrap().tier, Tier::Memory);
    assert_eq!(store.get(b"over", &opts).unwrap().unwrap().tier, Tier::Disk, "a value over the limit entered memory");
}
