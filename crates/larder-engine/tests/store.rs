//! The engine used directly, as an embedding program would: reopen paths (hint files, scans,
//! damaged hints), stale entries after the ring reuses a slot, and group commit.

use larder_engine::{DeleteOptions, FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use std::path::Path;
use std::sync::Arc;

fn config(dir: &Path, volume_size: u64, volume_count: u32) -> StoreConfig {
    StoreConfig { volume_size, volume_count, fsync: FsyncPolicy::Never, ..StoreConfig::new(dir) }
}

fn value(i: u64) -> Vec<u8> {
    (0..(i * 131 % 3000) as usize).map(|j| (i as usize * 7 + j) as u8).collect()
}

fn fill(store: &Store, n: u64) {
    for i in 0..n {
        store.put(format!("key/{i}").as_bytes(), &value(i), &PutOptions::default()).unwrap();
    }
    for i in (0..n).step_by(5) {
        assert!(store.delete(format!("key/{i}").as_bytes(), &DeleteOptions::default()).unwrap());
    }
}

fn check(store: &Store, n: u64) {
    for i in 0..n {
        let got = store.get(format!("key/{i}").as_bytes(), &ReadOptions::default()).unwrap();
        if i % 5 == 0 {
            assert!(got.is_none(), "deleted key/{i} is back");
        } else {
            assert_eq!(got.expect("present").data.as_ref(), value(i).as_slice(), "key/{i}");
        }
    }
}

#[test]
fn reopen_from_hints_from_scans_and_from_damaged_hints_agree() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 128 << 10, 16);
    let active = {
        let store = Store::open(cfg.clone()).unwrap();
        fill(&store, 600);
        assert!(store.stats().rotations >= 3);
        store.stats().active_volume as usize
    };
    let checkpoint = dir.path().join(format!("vol-{active:05}.hint"));
    assert!(checkpoint.exists(), "closing writes the active volume's checkpoint");
    let hints: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "hint") && *p != checkpoint)
        .collect();
    assert!(hints.len() >= 3, "sealed volumes have hints");
    {
        let store = Store::open(cfg.clone()).unwrap();
        let r = store.stats().recovery;
        assert_eq!(r.hint_loads, hints.len() as u64);
        assert_eq!((r.checkpoint_loads, r.scans), (1, 0), "the active volume loads from its checkpoint");
        check(&store, 600);
    }
    // A damaged hint is ignored and its volume scanned.
    let mut bytes = std::fs::read(&hints[0]).unwrap();
    bytes[60] ^= 1;
    std::fs::write(&hints[0], bytes).unwrap();
    {
        let store = Store::open(cfg.clone()).unwrap();
        assert_eq!(store.stats().recovery.scans, 1);
        check(&store, 600);
    }
    // Without the checkpoint (as after a crash), the active volume is scanned.
    std::fs::remove_file(&checkpoint).unwrap();
    {
        let store = Store::open(cfg.clone()).unwrap();
        let r = store.stats().recovery;
        assert_eq!((r.checkpoint_loads, r.scans), (0, 1));
        check(&store, 600);
    }
    // No hints at all, and no manifest (new seed): everything is rebuilt from the volumes.
    for h in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if h.path().extension().is_some_and(|x| x == "hint") {
            std::fs::remove_file(h.path()).unwrap();
        }
    }
    std::fs::remove_file(dir.path().join("MANIFEST")).unwrap();
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.stats().recovery.hint_loads, 0);
    assert_eq!(store.stats().recovery.checkpoint_loads, 0);
    check(&store, 600);
}

/// A crash after a graceful restart: the checkpoint still covers what was written before
/// the restart, so recovery loads it and scans only the records appended since.
#[test]
fn a_checkpoint_covers_its_prefix_and_the_tail_after_it_is_scanned() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 1 << 20, 4);
    {
        let store = Store::open(cfg.clone()).unwrap();
        fill(&store, 100);
    }
    {
        let store = Store::open(cfg).unwrap();
        assert_eq!(store.stats().recovery.checkpoint_loads, 1);
        for i in 100..140 {
            store.put(format!("key/{i}").as_bytes(), &value(i), &PutOptions::default()).unwrap();
        }
        assert!(store.delete(b"key/1", &DeleteOptions::default()).unwrap());
        // The files as a kill -9 would leave them: written, the checkpoint not rewritten.
        copy_as_crashed(dir.path(), crashed.path());
    }
    let store = Store::open(config(crashed.path(), 1 << 20, 4)).unwrap();
    let r = store.stats().recovery;
    assert_eq!((r.checkpoint_loads, r.scans), (1, 0), "{r:?}");
    assert!(r.tail_bytes_scanned > 0, "{r:?}");
    assert!(store.get(b"key/1", &ReadOptions::default()).unwrap().is_none(), "a delete after the checkpoint holds");
    for i in 2..140u64 {
        let got = store.get(format!("key/{i}").as_bytes(), &ReadOptions::default()).unwrap();
        if i < 100 && i % 5 == 0 {
            assert!(got.is_none(), "deleted key/{i} is back");
        } else {
            assert_eq!(got.expect("present").data.as_ref(), value(i).as_slice(), "key/{i}");
        }
    }
}

#[test]
fn entries_of_a_reused_slot_are_misses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Volumes of 20 KiB: a value of 11 KiB fits one (with room for the longest key and
    // metadata), two do not.
    let store = Store::open(config(dir.path(), 20 << 10, 2)).unwrap();
    store.put(b"first", b"in slot 0", &PutOptions::default()).unwrap();
    let big = vec![1u8; 11 << 10];
    store.put(b"fill-1", &big, &PutOptions::default()).unwrap(); // still slot 0
    store.put(b"fill-2", &big, &PutOptions::default()).unwrap(); // slot 1
    assert_eq!(store.stats().active_volume, 1);
    store.put(b"fill-3", &big, &PutOptions::default()).unwrap(); // slot 0 again: "first" and fill-1 are gone
    assert_eq!(store.stats().active_volume, 0);
    assert!(store.get(b"first", &ReadOptions::default()).unwrap().is_none());
    assert!(store.get(b"fill-1", &ReadOptions::default()).unwrap().is_none());
    assert!(!store.delete(b"first", &DeleteOptions::default()).unwrap());
    assert_eq!(store.get(b"fill-3", &ReadOptions::default()).unwrap().unwrap().data.len(), big.len());
    assert_eq!(store.get(b"fill-2", &ReadOptions::default()).unwrap().unwrap().data.len(), big.len());
}

#[test]
fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _a = Store::open(config(dir.path(), 1 << 20, 2)).unwrap();
    let err = Store::open(config(dir.path(), 1 << 20, 2)).err().expect("second open must fail");
    assert_eq!(err.kind(), larder_engine::ErrorKind::Locked);
}

#[test]
fn group_commit_acknowledges_every_concurrent_writer() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { fsync: FsyncPolicy::Always, ..config(dir.path(), 1 << 20, 8) };
    let store = Arc::new(Store::open(cfg.clone()).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    store.put(format!("t{t}/{i}").as_bytes(), &value(t * 1000 + i), &PutOptions::default()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(store.stats().keys, 800);
    drop(store);
    let store = Store::open(cfg).unwrap();
    for t in 0..8u64 {
        for i in 0..100 {
            let got = store.get(format!("t{t}/{i}").as_bytes(), &ReadOptions::default()).unwrap().unwrap();
            assert_eq!(got.data.as_ref(), value(t * 1000 + i).as_slice());
        }
    }
}

#[test]
fn invalid_keys_and_oversize_values_are_errors_not_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig { max_value_size: 100, ..config(dir.path(), 1 << 20, 2) }).unwrap();
    assert_eq!(store.put(b"", b"v", &PutOptions::default()).unwrap_err().kind(), larder_engine::ErrorKind::InvalidKey);
    assert_eq!(
        store.put(&[b'k'; 1025], b"v", &PutOptions::default()).unwrap_err().kind(),
        larder_engine::ErrorKind::InvalidKey
    );
    assert_eq!(
        store.put(b"k", &[0; 101], &PutOptions::default()).unwrap_err().kind(),
        larder_engine::ErrorKind::TooLarge
    );
    assert_eq!(store.stats().keys, 0);
    assert_eq!(store.stats().bytes_used, 64, "only the volume header was written");
}

#[test]
fn a_lost_manifest_costs_nothing_even_over_two_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 128 << 10, 16);
    {
        let store = Store::open(cfg.clone()).unwrap();
        fill(&store, 300);
    }
    std::fs::remove_file(dir.path().join("MANIFEST")).unwrap();
    {
        let store = Store::open(cfg.clone()).unwrap();
        check(&store, 300);
        // Writes made under the replacement manifest must survive the next restart too.
        store.put(b"after", b"manifest loss", &PutOptions::default()).unwrap();
    }
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.stats().recovery.discarded, 0);
    check(&store, 300);
    assert_eq!(store.get(b"after", &ReadOptions::default()).unwrap().unwrap().data.as_ref(), b"manifest loss");
}

/// Discarding a volume that is not the oldest would let older values of its keys come back;
/// recovery discards every older volume with it.
#[test]
fn a_discarded_volume_takes_the_older_ones_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![9u8; 40 << 10];
    let cfg = config(dir.path(), 64 << 10, 8);
    {
        let store = Store::open(cfg.clone()).unwrap();
        store.put(b"k", b"v1", &PutOptions::default()).unwrap(); // slot 0
        for i in 0..6 {
            store.put(format!("fill{i}").as_bytes(), &big, &PutOptions::default()).unwrap();
            // slots 0, 1, …, 5
        }
        assert_eq!(store.stats().active_volume, 5);
        store.put(b"k", b"v2", &PutOptions::default()).unwrap(); // slot 5
        store.put(b"gone", b"x", &PutOptions::default()).unwrap();
        store.delete(b"gone", &DeleteOptions::default()).unwrap(); // tombstone in slot 5
        store.put(b"newest", b"n", &PutOptions::default()).unwrap();
    }
    // Fewer slots: slot 5 (holding v2 and the tombstone) leaves the ring.
    let store = Store::open(config(dir.path(), 64 << 10, 4)).unwrap();
    assert!(
        store.get(b"k", &ReadOptions::default()).unwrap().is_none(),
        "v1 came back after its overwrite was discarded"
    );
    assert!(store.get(b"gone", &ReadOptions::default()).unwrap().is_none());
    assert!(store.stats().recovery.discarded >= 4);
    assert!(store.stats().volumes <= 4);
    drop(store);

    // A damaged header in the middle of the ring: older volumes go, newer ones stay.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 << 10, 8);
    {
        let store = Store::open(cfg.clone()).unwrap();
        store.put(b"k", b"v1", &PutOptions::default()).unwrap(); // slot 0
        store.put(b"fill0", &big, &PutOptions::default()).unwrap();
        store.put(b"fill1", &big, &PutOptions::default()).unwrap(); // slot 1
        store.put(b"k", b"v2", &PutOptions::default()).unwrap(); // slot 1
        store.put(b"fill2", &big, &PutOptions::default()).unwrap(); // slot 2
        store.put(b"later", b"kept", &PutOptions::default()).unwrap(); // slot 2
        assert_eq!(store.stats().active_volume, 2);
    }
    let vol1 = dir.path().join("vol-00001.lrv");
    let mut bytes = std::fs::read(&vol1).unwrap();
    bytes[30] ^= 0xff; // inside the volume header
    std::fs::write(&vol1, bytes).unwrap();
    let store = Store::open(cfg).unwrap();
    assert!(
        store.get(b"k", &ReadOptions::default()).unwrap().is_none(),
        "v1 came back after its overwrite was discarded"
    );
    assert_eq!(store.get(b"later", &ReadOptions::default()).unwrap().unwrap().data.as_ref(), b"kept");
    assert_eq!(store.stats().recovery.discarded, 2);
}

/// Hints of more than 65,536 entries are applied by several threads, each taking its own
/// index shards: every key must still end at its newest record, though its put, overwrite
/// and delete sit in the same hint.
#[test]
fn large_hints_applied_in_parallel_keep_each_keys_order() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 8 << 20, 8);
    let n = 100_000u64;
    let val = |i: u64, round: u64| (i * 3 + round).to_le_bytes();
    {
        let store = Store::open(cfg.clone()).unwrap();
        for i in 0..n {
            let key = format!("p/{i}");
            store.put(key.as_bytes(), &val(i, 0), &PutOptions::default()).unwrap();
            if i % 5 == 0 {
                store.put(key.as_bytes(), &val(i, 1), &PutOptions::default()).unwrap();
            }
            if i % 7 == 1 {
                store.delete(key.as_bytes(), &DeleteOptions::default()).unwrap();
            }
        }
        assert!(store.stats().rotations >= 1, "a sealed volume with its hint");
    }
    let store = Store::open(cfg).unwrap();
    let r = store.stats().recovery;
    assert_eq!((r.scans, r.checkpoint_loads), (0, 1), "{r:?}");
    assert!(r.hint_loads >= 1 && r.records > n, "{r:?}");
    for i in 0..n {
        let got = store.get(format!("p/{i}").as_bytes(), &ReadOptions::default()).unwrap().map(|v| v.data.to_vec());
        let want = match (i % 7 == 1, i % 5 == 0) {
            (true, _) => None,
            (false, true) => Some(val(i, 1).to_vec()),
            (false, false) => Some(val(i, 0).to_vec()),
        };
        assert_eq!(got, want, "p/{i}");
    }
}

/// A checkpoint describes one generation of its slot. When the ring comes back to that slot
/// after a graceful restart and a crash follows, the old checkpoint must not be taken for the
/// new records: every key reads as its newest value or, if the ring evicted it, as absent.
#[test]
fn a_checkpoint_does_not_outlive_the_generation_it_describes() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64 << 10, 3);
    let first = {
        let store = Store::open(cfg.clone()).unwrap();
        for i in 0..30u64 {
            store.put(format!("a/{i}").as_bytes(), &value(i), &PutOptions::default()).unwrap();
        }
        store.stats().active_volume
    };
    assert!(dir.path().join(format!("vol-{first:05}.hint")).exists());
    let mut latest = std::collections::HashMap::new();
    {
        let store = Store::open(cfg).unwrap();
        assert_eq!(store.stats().recovery.checkpoint_loads, 1);
        let mut i = 0u64;
        // Around the ring and back into the checkpoint's slot (3 slots: 4 turns).
        while store.stats().rotations < 4 {
            let key = format!("b/{}", i % 50);
            store.put(key.as_bytes(), &value(i + 1000), &PutOptions::default()).unwrap();
            latest.insert(key, i + 1000);
            i += 1;
        }
        copy_as_crashed(dir.path(), crashed.path());
        store.close().unwrap();
        let e = store.put(b"late", b"x", &PutOptions::default()).unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }
    let store = Store::open(config(crashed.path(), 64 << 10, 3)).unwrap();
    let mut present = 0;
    for (key, &v) in &latest {
        if let Some(got) = store.get(key.as_bytes(), &ReadOptions::default()).unwrap() {
            assert_eq!(got.data.as_ref(), value(v).as_slice(), "{key} is not its newest value");
            present += 1;
        }
    }
    assert!(present >= 10, "the newest writes are there: {present}");
    assert_eq!(store.stats().corrupt_reads, 0);
}

/// Copies a live store's files as a kill -9 would leave them. A hint being written in the
/// background may be renamed away between the listing and the copy: a crash would not have
/// that file either.
fn copy_as_crashed(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_name() != "LOCK" {
            match std::fs::copy(e.path(), to.join(e.file_name())) {
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                r => {
                    r.unwrap();
                }
            }
        }
    }
}
