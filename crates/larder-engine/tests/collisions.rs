//! Keys the index cannot tell apart, made on purpose: with the largest ring a location takes
//! 59 bits and an entry keeps only 13 hash bits beyond its shard and home, so among a thousand
//! stored keys another one that agrees with one of them is found in about 2^18 tries. A read
//! of it pays one extra disk read (`collision_reads`) and answers a miss; a write of it evicts
//! the other key (`false_evictions`), which then reads as a miss, never as the wrong value.

use larder_engine::{faults, twins, DeleteOptions, Expiry, FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};

struct Faulty<'a>(&'a std::path::Path);
impl Drop for Faulty<'_> {
    fn drop(&mut self) {
        faults::clear(self.0);
    }
}

#[test]
fn indistinguishable_keys_cost_a_read_and_evict_each_other_counted() {
    let dir = tempfile::tempdir().unwrap();
    // 16384 volumes of 32 GiB: the largest location. Volume files are made only as the ring
    // reaches them, and are sparse.
    let cfg = StoreConfig { volume_count: 16384, volume_size: 32 << 30, ..StoreConfig::new(dir.path()) };
    let store = Store::open(cfg).unwrap();
    let stored: Vec<String> = (0..1024).map(|i| format!("stored/{i}")).collect();
    for k in &stored {
        store.put(k.as_bytes(), k.as_bytes(), &PutOptions::default()).unwrap();
    }
    let read = ReadOptions::default();
    let misses = |from: u64, n: u64| {
        let before = store.stats().collision_reads;
        for i in from..from + n {
            let c = format!("candidate/{i}");
            assert!(store.get(c.as_bytes(), &read).unwrap().is_none(), "{c} was never stored");
        }
        store.stats().collision_reads > before
    };
    // Windows of candidates, then the one that paid an extra read, one by one.
    let window = (0..5_000u64).find(|&w| misses(w << 12, 1 << 12));
    let twin = window.and_then(|w| (w << 12..(w + 1) << 12).find(|&i| misses(i, 1))).map(|i| format!("candidate/{i}"));
    let twin = twin.expect("a key that agrees with a stored one on every kept bit");
    assert_eq!(store.stats().false_evictions, 0);
    // Every stored key still reads as itself.
    for k in &stored {
        assert_eq!(store.get(k.as_bytes(), &read).unwrap().unwrap().data.as_ref(), k.as_bytes());
    }
    // Writing the twin takes the other key's entry: counted, and that key becomes a miss.
    store.put(twin.as_bytes(), b"twin", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 1);
    assert_eq!(store.get(twin.as_bytes(), &read).unwrap().unwrap().data.as_ref(), b"twin");
    let lost: Vec<&String> = stored.iter().filter(|k| store.get(k.as_bytes(), &read).unwrap().is_none()).collect();
    assert_eq!(lost.len(), 1, "exactly the key the twin agreed with");
    // Writing it again takes the entry back, counted again; the twin is then the miss.
    store.put(lost[0].as_bytes(), b"back", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 2);
    assert!(store.get(twin.as_bytes(), &read).unwrap().is_none());
    // An overwrite of a key by itself is no false eviction.
    store.put(lost[0].as_bytes(), b"again", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 2);
}

/// How a test store stops before it is opened again.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// `close`: hint files and checkpoints are written, recovery loads them.
    Graceful,
    /// A power cut with every write synced before it was acknowledged: no checkpoint for
    /// the active volume, recovery scans it.
    Crash,
}

fn twin_config(dir: &std::path::Path, fsync: FsyncPolicy) -> StoreConfig {
    StoreConfig { fsync, ..StoreConfig::new(dir) }
}

fn restart(dir: &std::path::Path, store: Store, how: Stop) -> Store {
    match how {
        Stop::Graceful => {
            store.close().unwrap();
            drop(store);
        }
        Stop::Crash => {
            faults::power_cut(dir).unwrap();
            drop(store);
            faults::clear(dir);
        }
    }
    Store::open(twin_config(dir, FsyncPolicy::Always)).unwrap()
}

fn value(store: &Store, key: &str) -> Option<Vec<u8>> {
    store.get(key.as_bytes(), &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

/// Issue 39's first defect and its neighbours, on keys that share an entry. Each pair is
/// ordered by hash, so that both orders are played: recovery must hand a shared entry to the
/// newer record, not to the larger hash.
#[test]
fn a_delete_of_a_key_whose_entry_another_took_survives_every_restart() {
    let dir = tempfile::tempdir().unwrap();
    let seed = {
        Store::open(twin_config(dir.path(), FsyncPolicy::Always)).unwrap().close().unwrap();
        twins::seed(dir.path()).expect("the store's manifest names its seed")
    };
    let by_hash = |(x, y): (String, String)| {
        if twins::hash(seed, x.as_bytes()) < twins::hash(seed, y.as_bytes()) {
            (x, y)
        } else {
            (y, x)
        }
    };
    let pairs: Vec<(String, String)> =
        twins::find(seed, "twin/", twins::DEFAULT_RING_BITS, 4).into_iter().map(by_hash).collect();
    let (put, del) = (PutOptions::default(), DeleteOptions::default());
    let _f = Faulty(dir.path());
    faults::track(dir.path()).unwrap();
    let mut store = Store::open(twin_config(dir.path(), FsyncPolicy::Always)).unwrap();
    for (round, how) in [Stop::Graceful, Stop::Crash].into_iter().enumerate() {
        // A written, held in memory, then B takes its entry; A is deleted: larger hash first,
        // then smaller first.
        let deleted = [(&pairs[0].1, &pairs[0].0), (&pairs[1].0, &pairs[1].1)];
        for (a, b) in deleted {
            let evicted = store.stats().false_evictions;
            store.put(a.as_bytes(), format!("{a} {round}").as_bytes(), &put).unwrap();
            for _ in 0..2 {
                assert!(value(&store, a).is_some()); // the second disk read promotes it
            }
            store.put(b.as_bytes(), format!("{b} {round}").as_bytes(), &put).unwrap();
            assert_eq!(store.stats().false_evictions, evicted + 1, "{b} took {a}'s entry");
            // Memory still holds A's value, its newest: a read and a touch agree on it.
            assert_eq!(value(&store, a), Some(format!("{a} {round}").into_bytes()));
            assert!(store.touch(a.as_bytes(), Expiry::Never).unwrap().is_some(), "a touch sees what a read sees");
            assert!(store.delete(a.as_bytes(), &del).unwrap());
            assert_eq!(value(&store, a), None);
        }
        // A written, B takes its entry, B is deleted (the entry goes), then A is deleted: the
        // index names nothing for A, yet its record is on disk.
        for (a, b) in [(&pairs[2].0, &pairs[2].1), (&pairs[3].1, &pairs[3].0)] {
            store.put(a.as_bytes(), b"gone", &put).unwrap();
            store.put(b.as_bytes(), b"gone too", &put).unwrap();
            assert!(store.delete(b.as_bytes(), &del).unwrap());
            assert!(!store.delete(a.as_bytes(), &del).unwrap(), "nothing of A was live");
        }
        store = restart(dir.path(), store, how);
        for (a, b) in [(&pairs[0].1, &pairs[0].0), (&pairs[1].0, &pairs[1].1)] {
            assert_eq!(value(&store, a), None, "{a} was deleted ({how:?})");
            assert_eq!(
                value(&store, b),
                Some(format!("{b} {round}").into_bytes()),
                "{b}'s put is the newest ({how:?})"
            );
            assert!(store.delete(b.as_bytes(), &del).unwrap());
        }
        for (a, b) in [&pairs[2], &pairs[3]] {
            assert_eq!((value(&store, a), value(&store, b)), (None, None), "both deleted ({how:?})");
        }
    }
    store.close().unwrap();
}

/// The whole bytes of `key`'s value, read in pieces (a large value too).
fn whole(store: &Store, key: &str) -> Option<Vec<u8>> {
    let mut r = store.reader(key.as_bytes(), larder_engine::Part::Whole).unwrap()?;
    let mut out = Vec::new();
    while let Some(piece) = r.next_piece().unwrap() {
        out.extend_from_slice(&piece);
    }
    Some(out)
}

/// A key that takes the entry of a large value another key wrote leaves that value's chunks
/// whole: recovery may give the value back to its key (here, once the taker is deleted), and
/// it must then read whole, never as holes. (Found by the crash loop: the write freed the
/// other key's chunks as if it had replaced its own value.)
#[test]
fn a_false_eviction_never_frees_the_other_key_s_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = || StoreConfig { chunk_size: 64 << 10, fsync: FsyncPolicy::Always, ..StoreConfig::new(dir.path()) };
    Store::open(cfg()).unwrap().close().unwrap();
    let seed = twins::seed(dir.path()).unwrap();
    let pairs = twins::find(seed, "twin/", twins::DEFAULT_RING_BITS, 2);
    let store = Store::open(cfg()).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    for (a, b) in &pairs {
        store.put(a.as_bytes(), &big, &PutOptions::default()).unwrap();
        store.put(b.as_bytes(), b"small", &PutOptions::default()).unwrap();
        assert!(store.delete(b.as_bytes(), &DeleteOptions::default()).unwrap());
    }
    // Give the maintenance thread its time: a punch it was sent would have happened.
    std::thread::sleep(std::time::Duration::from_millis(500));
    store.close().unwrap();
    drop(store);
    let store = Store::open(cfg()).unwrap();
    for (a, b) in &pairs {
        assert_eq!(value(&store, b), None);
        // Back (its key was never deleted) and whole, or a miss: never holes.
        if let Some(bytes) = whole(&store, a) {
            assert!(bytes == big, "{a} came back with other bytes");
        }
    }
    assert!(pairs.iter().any(|(a, _)| whole(&store, a).is_some()), "recovery gives the entry back to the put");
}
