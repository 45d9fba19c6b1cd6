//! Injected I/O faults (ENOSPC, EIO, short writes, failed fsync) and simulated power cuts,
//! through the engine's fault layer (feature `faults`, on for the engine's tests).
//!
//! What must hold: a failed write is an error of the right kind, the key keeps its previous
//! value (or stays absent), reads go on, and writes resume once the fault clears, without a
//! reopen; after a power cut, recovery finds what the fsync policy promised.

use larder_engine::faults::{self, Failure, Op, Rule};
use larder_engine::{DeleteOptions, ErrorKind, FsyncPolicy, MemoryConfig, PutOptions, ReadOptions, Store, StoreConfig};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn config(dir: &Path, fsync: FsyncPolicy) -> StoreConfig {
    StoreConfig { volume_size: 256 << 10, volume_count: 8, fsync, ..StoreConfig::new(dir) }
}

fn get(store: &Store, key: &str) -> Option<Vec<u8>> {
    store.get(key.as_bytes(), &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

/// Clears the directory's faults when a test ends, even by a panic.
struct Faulty<'a>(&'a Path);
impl Drop for Faulty<'_> {
    fn drop(&mut self) {
        faults::clear(self.0);
    }
}

fn rule(spec: &str) -> Rule {
    Rule::parse(spec).unwrap()
}

#[test]
fn no_space_fails_the_write_keeps_old_values_and_clears_without_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    store.put(b"k", b"first", &PutOptions::default()).unwrap();
    faults::inject(dir.path(), Rule::always(Op::Write, Failure::NoSpace)).unwrap();
    let e = store.put(b"k", b"second", &PutOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert_eq!(store.put(b"new", b"x", &PutOptions::default()).unwrap_err().kind(), ErrorKind::NoSpace);
    assert_eq!(store.delete(b"k", &DeleteOptions::default()).unwrap_err().kind(), ErrorKind::NoSpace);
    // Reads go on, and see the old state.
    assert_eq!(get(&store, "k").as_deref(), Some(&b"first"[..]));
    assert_eq!(get(&store, "new"), None);
    assert!(store.stats().write_failures >= 3);
    faults::clear(dir.path());
    store.put(b"k", b"second", &PutOptions::default()).unwrap();
    assert_eq!(get(&store, "k").as_deref(), Some(&b"second"[..]));
    drop(store);
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    assert_eq!(get(&store, "k").as_deref(), Some(&b"second"[..]));
    assert_eq!(get(&store, "new"), None);
}

#[test]
fn short_writes_leave_nothing_indexed_even_when_the_cut_fails() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    store.put(b"before", &[1u8; 3000], &PutOptions::default()).unwrap();
    // Half of the record lands, then ENOSPC; the cleanup cut also fails, so the half record
    // stays in the file after the last good one until the next write covers it.
    faults::inject(dir.path(), rule("write short count=1")).unwrap();
    faults::inject(dir.path(), rule("write eio count=1")).unwrap();
    assert_eq!(store.put(b"torn", &[2u8; 5000], &PutOptions::default()).unwrap_err().kind(), ErrorKind::NoSpace);
    assert_eq!(get(&store, "torn"), None);
    // The next write goes where the torn one was (the faults are spent).
    store.put(b"after", &[3u8; 100], &PutOptions::default()).unwrap();
    assert_eq!(get(&store, "after"), Some(vec![3u8; 100]));
    drop(store);
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    assert_eq!(get(&store, "before"), Some(vec![1u8; 3000]));
    assert_eq!(get(&store, "torn"), None);
    assert_eq!(get(&store, "after"), Some(vec![3u8; 100]));
    assert_eq!(store.stats().keys, 2);
}

#[test]
fn eio_on_write_is_an_io_error_and_eio_on_read_is_not_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    store.put(b"k", b"value", &PutOptions::default()).unwrap();
    faults::inject(dir.path(), rule("write eio")).unwrap();
    assert_eq!(store.put(b"k", b"other", &PutOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    faults::clear(dir.path());
    faults::inject(dir.path(), rule("read eio file=vol-")).unwrap();
    // An unreadable device is an error (the server answers 503), never "not found".
    assert_eq!(store.get(b"k", &ReadOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    assert!(store.stats().read_failures >= 1);
    // A DELETE that cannot read the record it would remove fails; it does not answer "absent"
    // (the server's power-cut test found that one).
    assert_eq!(store.delete(b"k", &DeleteOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    faults::clear(dir.path());
    assert_eq!(get(&store, "k").as_deref(), Some(&b"value"[..]));
}

#[test]
fn a_failed_fsync_fails_the_waiting_writes_and_undoes_them() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let memory = MemoryConfig { capacity: 1 << 20, on_put: true, ..MemoryConfig::default() };
    let cfg = StoreConfig { memory, ..config(dir.path(), FsyncPolicy::Always) };
    let store = std::sync::Arc::new(Store::open(cfg).unwrap());
    store.put(b"k", b"v1", &PutOptions::default()).unwrap();
    store.put(b"gone", b"kept", &PutOptions::default()).unwrap();
    faults::inject(dir.path(), rule("sync eio")).unwrap();
    assert_eq!(store.put(b"k", b"v2", &PutOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(store.delete(b"gone", &DeleteOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    // Concurrent writers sharing failed syncs all fail, and none of their values shows.
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let key = format!("w{t}/{i}");
                    assert!(store.put(key.as_bytes(), b"never", &PutOptions::default()).is_err());
                    assert!(store.put(b"k", key.as_bytes(), &PutOptions::default()).is_err());
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(get(&store, "k").as_deref(), Some(&b"v1"[..]), "a failed put's value is visible");
    assert_eq!(get(&store, "gone").as_deref(), Some(&b"kept"[..]), "a failed delete took effect");
    assert_eq!(get(&store, "w3/7"), None);
    assert_eq!(store.stats().keys, 2);
    assert!(store.stats().sync_failures >= 1);
    faults::clear(dir.path());
    store.put(b"k", b"v3", &PutOptions::default()).unwrap();
    assert!(store.delete(b"gone", &DeleteOptions::default()).unwrap());
    assert_eq!(get(&store, "k").as_deref(), Some(&b"v3"[..]));
    assert_eq!(get(&store, "gone"), None);
}

/// A put whose fsync failed is answered as failed, but its record may still reach the disk
/// (the page cache holds it). A later delete of that key, though the key is absent from the
/// index, must leave a tombstone: else the restart finds the failed put's record and brings
/// back a key whose delete was acknowledged.
#[test]
fn a_delete_after_a_failed_put_stays_deleted_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Always)).unwrap();
    store.put(b"other", b"kept", &PutOptions::default()).unwrap();
    faults::inject(dir.path(), rule("sync eio count=1")).unwrap();
    assert_eq!(store.put(b"k", b"failed put", &PutOptions::default()).unwrap_err().kind(), ErrorKind::Io);
    faults::clear(dir.path());
    assert_eq!(get(&store, "k"), None, "a failed put's value is visible");
    assert!(!store.delete(b"k", &DeleteOptions::default()).unwrap(), "the failed put's key counted as present");
    drop(store);
    let store = Store::open(config(dir.path(), FsyncPolicy::Always)).unwrap();
    assert_eq!(get(&store, "k"), None, "a key whose delete was acknowledged came back");
    assert_eq!(get(&store, "other").as_deref(), Some(&b"kept"[..]));
}

#[test]
fn a_volume_that_cannot_be_started_fails_writes_until_the_fault_clears() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Every(Duration::from_secs(1)))).unwrap();
    // The second volume's header write fails: every put that needs it fails, nothing else.
    faults::inject(dir.path(), rule("write nospace file=vol-00001")).unwrap();
    let mut stored = Vec::new();
    let mut failed = 0;
    for i in 0..200 {
        let key = format!("k{i}");
        match store.put(key.as_bytes(), &[i as u8; 4000], &PutOptions::default()) {
            Ok(_) => stored.push(i),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NoSpace);
                failed += 1;
            }
        }
    }
    assert!(failed > 100 && !stored.is_empty(), "stored {} failed {failed}", stored.len());
    for &i in &stored {
        assert_eq!(get(&store, &format!("k{i}")), Some(vec![i as u8; 4000]));
    }
    faults::clear(dir.path());
    store.put(b"later", &[9u8; 4000], &PutOptions::default()).unwrap();
    for i in 0..200 {
        store.put(format!("k{i}").as_bytes(), &[i as u8; 100], &PutOptions::default()).unwrap();
    }
    drop(store);
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    assert_eq!(get(&store, "later"), Some(vec![9u8; 4000]));
    assert_eq!(get(&store, "k150"), Some(vec![150u8; 100]));
}

#[test]
fn failed_hint_files_fall_back_to_scanning() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    faults::inject(dir.path(), rule("write eio file=.tmp")).unwrap();
    for i in 0..300u32 {
        store.put(format!("k{i}").as_bytes(), &i.to_le_bytes().repeat(500), &PutOptions::default()).unwrap();
    }
    store.settle();
    assert_eq!(store.stats().hints_written, 0);
    faults::clear(dir.path());
    drop(store);
    let store = Store::open(config(dir.path(), FsyncPolicy::Never)).unwrap();
    for i in 0..300u32 {
        assert_eq!(get(&store, &format!("k{i}")), Some(i.to_le_bytes().repeat(500)), "k{i}");
    }
}

/// A small deterministic generator (xorshift64*), so a failing seed can be rerun.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn versioned(key: u64, version: u64) -> Vec<u8> {
    let mut v = format!("key {key} version {version} ").into_bytes();
    let len = (key * 37 + version * 101) % 6000;
    v.extend((0..len).map(|i| (i ^ key ^ version) as u8));
    v
}

/// The "key K version V" prefix of a value written by [`versioned`].
fn version_of(v: &[u8]) -> String {
    String::from_utf8_lossy(&v[..v.len().min(24)]).split(' ').take(4).collect::<Vec<_>>().join(" ")
}

/// Acknowledged history per key: (acknowledged at, value or `None` for a delete), in order.
type History = HashMap<u64, Vec<(Instant, Option<Vec<u8>>)>>;

/// Per key, the writes that failed after its last acknowledged one: a write cut off by the
/// power may still have reached the disk (an error means "not known to be stored").
type Unacked = HashMap<u64, Vec<Option<Vec<u8>>>>;

/// Writes a random put/delete/overwrite load for `ops` operations or until `until`, with
/// several threads, and returns the acknowledged history.
fn load(store: &Store, seed: u64, ops: u64, keys: u64) -> History {
    load_range(store, seed, ops, 0..keys, &AtomicU64::new(0)).0
}

/// [`load`] on the keys in `range` only, so several threads can load at once.
/// Counts each acknowledged write in `acked`.
fn load_range(
    store: &Store,
    seed: u64,
    ops: u64,
    range: std::ops::Range<u64>,
    acked: &AtomicU64,
) -> (History, Unacked) {
    let mut rng = Rng(seed | 1);
    let mut history = History::new();
    let mut unacked = Unacked::new();
    for n in 0..ops {
        let key = range.start + rng.below(range.end - range.start);
        let name = format!("key/{key}");
        let (value, ok) = if rng.below(5) == 0 {
            (None, store.delete(name.as_bytes(), &DeleteOptions::default()).is_ok())
        } else {
            let v = versioned(key, seed << 20 | n);
            let ok = store.put(name.as_bytes(), &v, &PutOptions::default()).is_ok();
            (Some(v), ok)
        };
        if ok {
            acked.fetch_add(1, Ordering::Relaxed);
            history.entry(key).or_default().push((Instant::now(), value));
            unacked.remove(&key);
        } else {
            unacked.entry(key).or_default().push(value);
        }
    }
    (history, unacked)
}

/// A ring large enough that nothing the power-cut tests write is evicted by it, with volumes
/// small enough that they fill and get hint files.
fn roomy(dir: &Path, fsync: FsyncPolicy) -> StoreConfig {
    StoreConfig { volume_size: 1 << 20, volume_count: 32, fsync, ..StoreConfig::new(dir) }
}

/// Cuts the power to a store opened on `dir`, reopens it, and returns it.
fn cut_and_reopen(dir: &Path, store: Store) -> Store {
    let report = faults::power_cut(dir).unwrap();
    drop(store); // its last writes and syncs fail: the power is off
    faults::clear(dir);
    println!("power cut undid {} changes in {} files", report.changes, report.files);
    Store::open(roomy(dir, FsyncPolicy::Never)).unwrap()
}

#[test]
fn power_cut_with_fsync_always_keeps_every_acknowledged_write() {
    let mut undone = 0;
    for seed in 1..=6u64 {
        let dir = tempfile::tempdir().unwrap();
        let _f = Faulty(dir.path());
        faults::track(dir.path()).unwrap();
        let store = Store::open(roomy(dir.path(), FsyncPolicy::Always)).unwrap();
        let mut rng = Rng(seed * 7919);
        let ops = 100 + rng.below(300);
        // Four writers at once, so that group commit has writes in flight when the power goes.
        let acked = AtomicU64::new(0);
        let (history, unacked) = std::thread::scope(|s| {
            let (store, acked) = (&store, &acked);
            let writers: Vec<_> = (0..4u64)
                .map(|t| s.spawn(move || load_range(store, seed * 10 + t, ops, t * 40..t * 40 + 40, acked)))
                .collect();
            // The cut lands while they write (or just after the fastest finish), once they
            // have got going: on a loaded machine the threads may start late.
            let started = Instant::now();
            while acked.load(Ordering::Relaxed) < 40 && started.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(rng.below(30)));
            let report = faults::power_cut(dir.path()).unwrap();
            undone += report.changes;
            let mut all = (History::new(), Unacked::new());
            for w in writers {
                let (h, u) = w.join().unwrap();
                all.0.extend(h);
                all.1.extend(u);
            }
            all
        });
        drop(store);
        faults::clear(dir.path());
        let store = Store::open(roomy(dir.path(), FsyncPolicy::Never)).unwrap();
        let mut checked = 0;
        for (key, h) in &history {
            // Writes acknowledged before the cut are durable; after it, writes fail. A write
            // in progress at the cut may have made it although it failed.
            let want = h.last().unwrap().1.as_deref();
            let got = get(&store, &format!("key/{key}"));
            let maybe = unacked.get(key).into_iter().flatten();
            assert!(
                got.as_deref() == want || maybe.clone().any(|m| *m == got),
                "seed {seed} key {key}: found {:?}, acknowledged in order {:?}; {:?}",
                got.as_deref().map(version_of),
                h.iter().map(|(_, v)| v.as_deref().map(version_of)).collect::<Vec<_>>(),
                store.stats()
            );
            checked += 1;
        }
        assert!(checked > 20, "seed {seed}: {checked} keys written before the cut");
    }
    println!("the cuts undid {undone} changes of writes in flight");
}

#[test]
fn power_cut_without_fsync_loses_writes_but_never_serves_wrong_bytes() {
    let mut lost = 0;
    for seed in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let _f = Faulty(dir.path());
        faults::track(dir.path()).unwrap();
        let store = Store::open(roomy(dir.path(), FsyncPolicy::Never)).unwrap();
        // Some of it is durable: a checkpoint of everything so far, halfway.
        let mut history = load(&store, seed, 400, 120);
        store.sync().unwrap();
        // Per key, how many of its writes the sync covered.
        let synced: HashMap<u64, usize> = history.iter().map(|(k, h)| (*k, h.len())).collect();
        for (k, later) in load(&store, seed + 100, 600, 120) {
            history.entry(k).or_default().extend(later);
        }
        // Let the hint files of the volumes sealed since the sync be written: they must not
        // name records that the cut takes away.
        store.settle();
        assert!(store.stats().hints_written > 0);
        // Sealing a volume syncs (before its hint is written): these last writes stay unsynced.
        for (k, later) in load(&store, seed + 200, 100, 120) {
            history.entry(k).or_default().extend(later);
        }
        let store = cut_and_reopen(dir.path(), store);
        for (key, h) in &history {
            let got = get(&store, &format!("key/{key}"));
            // Anything acknowledged since the last sync may be lost, but what is served is
            // a value written for this key, and not older than the synced one.
            let from = synced.get(key).map_or(0, |n| n - 1);
            let allowed: Vec<_> = h[from..].iter().map(|(_, v)| v.clone()).collect();
            let fresh = !synced.contains_key(key) && got.is_none();
            assert!(allowed.contains(&got) || fresh, "seed {seed} key {key}: not a value acknowledged since the sync");
            if got != h.last().unwrap().1 {
                lost += 1;
            }
        }
    }
    // The simulation must be able to tell fsync from no fsync.
    assert!(lost > 0, "a power cut without fsync lost nothing: the simulation is not cutting");
}

#[test]
fn power_cut_with_fsync_every_second_keeps_what_is_older_than_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let _f = Faulty(dir.path());
    faults::track(dir.path()).unwrap();
    let store = Store::open(roomy(dir.path(), FsyncPolicy::Every(Duration::from_secs(1)))).unwrap();
    let start = Instant::now();
    let mut history = History::new();
    let mut round = 0;
    while start.elapsed() < Duration::from_millis(4500) {
        for (k, h) in load(&store, 1000 + round, 50, 200) {
            history.entry(k).or_default().extend(h);
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let cut_at = Instant::now();
    let store = cut_and_reopen(dir.path(), store);
    // The background sync runs every second; allow two more for a loaded machine.
    let promised = cut_at - Duration::from_secs(3);
    let (mut keys, mut old_enough) = (0, 0);
    for (key, h) in &history {
        let got = get(&store, &format!("key/{key}"));
        let from = h.iter().rposition(|(at, _)| *at <= promised);
        match from {
            Some(i) => {
                old_enough += 1;
                let allowed: Vec<_> = h[i..].iter().map(|(_, v)| v.clone()).collect();
                assert!(allowed.contains(&got), "key {key}: lost a write acknowledged over 3 s before the cut");
            }
            None => assert!(got.is_none() || h.iter().any(|(_, v)| *v == got), "key {key}: foreign bytes"),
        }
        keys += 1;
    }
    assert!(old_enough > 50, "{old_enough} of {keys} keys were written early enough to check");
}
