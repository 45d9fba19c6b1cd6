//! Expiry, content types, versions, partial reads and conditional writes, used directly.

use larder_engine::{
    now_ms, ByteRange, DeleteOptions, ErrorKind, Expiry, FsyncPolicy, MemoryConfig, Part, Precondition, PutOptions,
    ReadOptions, Store, StoreConfig, Tier,
};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path, memory: u64) -> StoreConfig {
    StoreConfig {
        volume_size: 8 << 20,
        volume_count: 4,
        max_value_size: 4 << 20,
        // Values up to 4 MiB stay one record here: these tests are about one record's blocks
        // (chunked values have tests/large.rs).
        chunk_size: 4 << 20,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: memory, promote_after: 1, ..MemoryConfig::default() },
        ..StoreConfig::new(dir)
    }
}

fn bytes(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

#[test]
fn expired_keys_are_absent_before_and_after_a_restart_and_dropped_when_read() {
    let dir = tempfile::tempdir().unwrap();
    for memory in [0, 1 << 20] {
        let store = Store::open(config(dir.path(), memory)).unwrap();
        let soon = PutOptions { expiry: Expiry::After(Duration::from_millis(600)), ..PutOptions::default() };
        store.put(b"short", b"lived", &soon).unwrap();
        store
            .put(b"later", b"lived", &PutOptions { expiry: Expiry::After(Duration::from_millis(600_000)), ..soon })
            .unwrap();
        store.put(b"forever", b"lived", &PutOptions::default()).unwrap();
        let v = store.get(b"short", &ReadOptions::default()).unwrap().expect("not expired yet");
        assert!(v.expiry_ms > now_ms());
        let _ = store.get(b"short", &ReadOptions::default()).unwrap(); // with memory on, now a memory hit
        let keys = store.stats().keys;
        std::thread::sleep(Duration::from_millis(700));
        assert!(store.get(b"short", &ReadOptions::default()).unwrap().is_none(), "memory {memory}: expired key served");
        assert!(store.get(b"short", &ReadOptions { part: Part::Nothing, ..Default::default() }).unwrap().is_none());
        assert_eq!(store.stats().keys, keys - 1, "the expired entry was dropped when read");
        assert!(
            store.get(b"later", &ReadOptions::default()).unwrap().is_some()
                && store.get(b"forever", &ReadOptions::default()).unwrap().is_some()
        );
        store
            .put(
                b"short",
                b"again",
                &PutOptions { expiry: Expiry::After(Duration::from_millis(600)), ..PutOptions::default() },
            )
            .unwrap();
        drop(store);
        std::thread::sleep(Duration::from_millis(700));
        let store = Store::open(config(dir.path(), memory)).unwrap();
        assert!(store.get(b"short", &ReadOptions::default()).unwrap().is_none(), "expired across a restart");
        let later = store.get(b"later", &ReadOptions::default()).unwrap().expect("still live");
        assert!(later.expiry_ms > now_ms() + 500_000, "the expiry survives a restart");
        drop(store);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }
}

#[test]
fn content_type_and_version_survive_memory_disk_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 1 << 20)).unwrap();
    let opts = PutOptions { content_type: Some(b"image/png"), ..PutOptions::default() };
    store.put(b"img", b"\x89PNG...", &opts).unwrap();
    store.put(b"plain", b"no type", &PutOptions::default()).unwrap();
    let disk = store.get(b"img", &ReadOptions::default()).unwrap().unwrap();
    let memory = store.get(b"img", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!((disk.tier, memory.tier), (Tier::Disk, Tier::Memory));
    for v in [&disk, &memory] {
        assert_eq!(v.content_type.as_deref(), Some(&b"image/png"[..]));
        assert_eq!(v.crc, crc32c::crc32c(b"\x89PNG..."));
        assert_eq!(v.len, 7);
    }
    assert_eq!(disk.version(), memory.version());
    assert!(store.get(b"plain", &ReadOptions::default()).unwrap().unwrap().content_type.is_none());
    // Storing the same bytes again makes a new version, even within the same millisecond.
    store.put(b"img", b"\x89PNG...", &opts).unwrap();
    let again = store.get(b"img", &ReadOptions::default()).unwrap().unwrap();
    assert_ne!(again.version(), disk.version());
    drop(store);
    let store = Store::open(config(dir.path(), 1 << 20)).unwrap();
    let after = store.get(b"img", &ReadOptions { part: Part::Nothing, ..Default::default() }).unwrap().unwrap();
    assert_eq!(after.version(), again.version());
    assert_eq!(after.content_type.as_deref(), Some(&b"image/png"[..]));
    assert!(after.data.is_empty());
    let long = vec![b'a'; 2000];
    let err = store.put(b"x", b"v", &PutOptions { content_type: Some(&long), ..opts }).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(store.get(b"x", &ReadOptions::default()).unwrap().is_none());
}

/// Byte offset of a value in its volume file, from the position the store reports.
fn value_offset(store: &Store, key: &[u8]) -> (u32, u64, u64) {
    let v = store.get(key, &ReadOptions { part: Part::Nothing, ..Default::default() }).unwrap().unwrap();
    let p = v.position;
    (p.volume, p.offset + p.size - v.len, v.len)
}

fn flip(dir: &Path, volume: u32, at: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(larder_engine::format::volume::volume_path(dir, volume as usize))
        .unwrap();
    let mut b = [0u8; 1];
    use std::io::Read;
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x10]).unwrap();
}

#[test]
fn ranges_of_a_large_value_verify_only_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 0)).unwrap();
    let big = bytes(3 << 20, 1); // 3 MiB: 64 KiB blocks
    store.put(b"big", &big, &PutOptions::default()).unwrap();
    for r in [ByteRange::Span(0, Some(99)), ByteRange::Span(65_530, Some(65_545)), ByteRange::Suffix(70_000)] {
        let (a, b) = r.resolve(big.len() as u64).unwrap();
        let v = store.get(b"big", &ReadOptions { part: Part::Range(r), ..Default::default() }).unwrap().unwrap();
        assert_eq!((v.start, v.len), (a, big.len() as u64));
        assert_eq!(&v.data[..], &big[a as usize..b as usize], "{r:?}");
    }
    let none = store
        .get(b"big", &ReadOptions { part: Part::Range(ByteRange::Span(3 << 20, None)), ..Default::default() })
        .unwrap()
        .unwrap();
    assert!(none.data.is_empty(), "an unsatisfiable range reads no bytes");
    // Damage in the last block: ranges elsewhere still verify and are served, since only
    // their blocks are read; a range over the damaged block is a miss, never wrong bytes.
    let (volume, at, len) = value_offset(&store, b"big");
    flip(dir.path(), volume, at + len - 10);
    let head = store
        .get(b"big", &ReadOptions { part: Part::Range(ByteRange::Span(0, Some(1023))), ..Default::default() })
        .unwrap()
        .unwrap();
    assert_eq!(&head.data[..], &big[..1024]);
    assert!(
        store.get(b"big", &ReadOptions { part: Part::Nothing, ..Default::default() }).unwrap().is_some(),
        "the front of the record is intact"
    );
    let before = store.stats().corrupt_reads;
    assert!(store
        .get(b"big", &ReadOptions { part: Part::Range(ByteRange::Suffix(5)), ..Default::default() })
        .unwrap()
        .is_none());
    assert_eq!(store.stats().corrupt_reads, before + 1);
    assert!(store.get(b"big", &ReadOptions::default()).unwrap().is_none(), "a damaged record is dropped");
}

#[test]
fn ranges_of_small_values_and_of_memory_hits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 1 << 20)).unwrap();
    let v = bytes(10_000, 2);
    store.put(b"small", &v, &PutOptions::default()).unwrap();
    for tier in [Tier::Disk, Tier::Memory] {
        let got = store
            .get(b"small", &ReadOptions { part: Part::Range(ByteRange::Span(100, Some(199))), ..Default::default() })
            .unwrap()
            .unwrap();
        assert_eq!((got.tier, &got.data[..]), (tier, &v[100..200]));
        let _ = store.get(b"small", &ReadOptions::default()).unwrap(); // promotes (promote_after 1)
    }
    // Damage in a small value is caught by a range read too: it reads the record whole.
    store.put(b"other", &v, &PutOptions::default()).unwrap();
    let (volume, at, _) = value_offset(&store, b"other");
    flip(dir.path(), volume, at + 9_000);
    assert!(store
        .get(b"other", &ReadOptions { part: Part::Range(ByteRange::Span(0, Some(9))), ..Default::default() })
        .unwrap()
        .is_none());
}

#[test]
fn conditional_writes_check_the_current_version_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 1 << 20)).unwrap();
    let absent = [Precondition::Absent];
    store.put(b"k", b"one", &PutOptions { preconditions: &absent, ..PutOptions::default() }).unwrap();
    let err = store.put(b"k", b"two", &PutOptions { preconditions: &absent, ..PutOptions::default() });
    assert_eq!(err.unwrap_err().kind(), ErrorKind::PreconditionFailed);
    let one = store.get(b"k", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!(&one.data[..], b"one");
    // A conditional write that need not wait (the record is in the page cache) answers inline.
    let quick =
        store.put(b"k", b"x", &PutOptions { preconditions: &absent, nonblocking: true, ..PutOptions::default() });
    assert_eq!(quick.unwrap_err().kind(), ErrorKind::PreconditionFailed);

    let if_one = [Precondition::OneOf(vec![one.version()])];
    store.put(b"k", b"two", &PutOptions { preconditions: &if_one, ..PutOptions::default() }).unwrap();
    // The version moved on: the same condition fails now, and the value stays.
    let again = store.put(b"k", b"three", &PutOptions { preconditions: &if_one, ..PutOptions::default() });
    assert_eq!(again.unwrap_err().kind(), ErrorKind::PreconditionFailed);
    let two = store.get(b"k", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!(&two.data[..], b"two");
    let _ = store.get(b"k", &ReadOptions::default()).unwrap(); // promoted: memory and disk agree
    let stale = store.delete(b"k", &DeleteOptions { preconditions: &if_one, ..Default::default() });
    assert_eq!(stale.unwrap_err().kind(), ErrorKind::PreconditionFailed);
    assert!(store
        .delete(
            b"k",
            &DeleteOptions { preconditions: &[Precondition::OneOf(vec![two.version()])], ..Default::default() }
        )
        .unwrap());
    let present = [Precondition::Present];
    let gone = store.put(b"k", b"four", &PutOptions { preconditions: &present, ..PutOptions::default() });
    assert_eq!(gone.unwrap_err().kind(), ErrorKind::PreconditionFailed, "deleted: If-Match * fails");
    assert!(store.get(b"k", &ReadOptions::default()).unwrap().is_none());

    // Racing writers with If-None-Match: * — exactly one wins.
    let wins = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for i in 0..8u8 {
            let (store, wins) = (&store, &wins);
            s.spawn(move || {
                let opts = PutOptions { preconditions: &[Precondition::Absent], ..PutOptions::default() };
                match store.put(b"race", &[i], &opts) {
                    Ok(_) => {
                        wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => assert_eq!(e.kind(), ErrorKind::PreconditionFailed),
                }
            });
        }
    });
    assert_eq!(wins.into_inner(), 1);
}

#[test]
fn expired_entries_are_neither_promoted_nor_reinserted() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1 << 20);
    (cfg.volume_size, cfg.volume_count, cfg.memory.promote_after, cfg.reinsert_min_hits) = (64 << 10, 3, 2, 1);
    let store = Store::open(cfg).unwrap();
    let ttl = || PutOptions { expiry: Expiry::After(Duration::from_millis(600)), ..PutOptions::default() };
    store.put(b"promote-me", b"v", &ttl()).unwrap();
    store.put(b"reinsert-me", b"v", &ttl()).unwrap();
    // One disk read each before expiry: half-way to promotion, and read enough to reinsert.
    assert!(
        store.get(b"promote-me", &ReadOptions::default()).unwrap().is_some()
            && store.get(b"reinsert-me", &ReadOptions::default()).unwrap().is_some()
    );
    std::thread::sleep(Duration::from_millis(700));
    assert!(store.get(b"promote-me", &ReadOptions::default()).unwrap().is_none(), "the second read finds it expired");
    assert_eq!(store.stats().memory_entries, 0, "an expired value is not promoted");
    // Turn the ring past the volume holding reinsert-me, settling after each write so the
    // reinsertion job runs before the volume is overwritten.
    let filler = bytes(4000, 9);
    let mut i = 0;
    while store.stats().rotations < 3 {
        store.put(format!("fill/{i}").as_bytes(), &filler, &PutOptions::default()).unwrap();
        store.settle();
        i += 1;
    }
    let st = store.stats();
    assert!(st.reinsert_candidates >= 1, "{st:?}");
    assert_eq!(st.reinserted, 0, "an expired entry is not copied forward");
    assert!(st.reinsert_skipped >= 1);
    assert!(store.get(b"reinsert-me", &ReadOptions::default()).unwrap().is_none());
}

#[test]
fn compare_and_swap_increments_are_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 1 << 20)).unwrap();
    store.put(b"counter", b"0", &PutOptions::default()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut done = 0;
                while done < 50 {
                    let v = store.get(b"counter", &ReadOptions::default()).unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&v.data).unwrap().parse().unwrap();
                    let cas = [Precondition::OneOf(vec![v.version()])];
                    let opts = PutOptions { preconditions: &cas, ..PutOptions::default() };
                    match store.put(b"counter", (n + 1).to_string().as_bytes(), &opts) {
                        Ok(_) => done += 1,
                        Err(e) => assert_eq!(e.kind(), ErrorKind::PreconditionFailed),
                    }
                }
            });
        }
        // Unconditional writes of other keys meanwhile move the writer and the ring.
        s.spawn(|| {
            for i in 0..500 {
                store.put(format!("other/{i}").as_bytes(), &bytes(3000, i), &PutOptions::default()).unwrap();
            }
        });
    });
    assert_eq!(&store.get(b"counter", &ReadOptions::default()).unwrap().unwrap().data[..], b"200");
}

#[test]
fn a_value_only_memory_holds_is_the_current_one_for_conditions() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1 << 20);
    (cfg.volume_size, cfg.volume_count, cfg.reinsert_min_hits) = (64 << 10, 3, 0);
    let store = Store::open(cfg).unwrap();
    store.put(b"k", b"held in memory", &PutOptions::default()).unwrap();
    let v = store.get(b"k", &ReadOptions::default()).unwrap().unwrap(); // promoted (promote_after 1)
    let mut i = 0;
    while store.stats().rotations < 4 {
        store.put(format!("fill/{i}").as_bytes(), &bytes(4000, i), &PutOptions::default()).unwrap();
        store.settle();
        i += 1;
    }
    assert_eq!(
        store.get(b"k", &ReadOptions::default()).unwrap().unwrap().tier,
        Tier::Memory,
        "the volume is gone, memory answers"
    );
    let absent = [Precondition::Absent];
    let err = store.put(b"k", b"x", &PutOptions { preconditions: &absent, ..PutOptions::default() });
    assert_eq!(err.unwrap_err().kind(), ErrorKind::PreconditionFailed);
    let cas = [Precondition::OneOf(vec![v.version()])];
    store.put(b"k", b"replaced", &PutOptions { preconditions: &cas, ..PutOptions::default() }).unwrap();
    assert_eq!(&store.get(b"k", &ReadOptions::default()).unwrap().unwrap().data[..], b"replaced");
}

#[test]
fn deleting_an_expired_key_finds_nothing_and_a_zero_ttl_replaces_with_an_expired_value() {
    let dir = tempfile::tempdir().unwrap();
    for memory in [0, 1 << 20] {
        let store = Store::open(config(dir.path(), memory)).unwrap();
        store
            .put(b"k", b"v", &PutOptions { expiry: Expiry::After(Duration::from_millis(100)), ..PutOptions::default() })
            .unwrap();
        let _ = store.get(b"k", &ReadOptions::default()).unwrap(); // into memory when it is on
        std::thread::sleep(Duration::from_millis(150));
        let deletes = store.stats().deletes;
        assert!(!store.delete(b"k", &DeleteOptions::default()).unwrap(), "memory {memory}: an expired key is absent");
        assert_eq!(store.stats().deletes, deletes);
        store.put(b"z", b"old", &PutOptions::default()).unwrap();
        store
            .put(b"z", b"new", &PutOptions { expiry: Expiry::After(Duration::ZERO), ..PutOptions::default() })
            .unwrap();
        assert!(
            store.get(b"z", &ReadOptions::default()).unwrap().is_none(),
            "expired at once, and the old value is gone"
        );
        drop(store);
        std::fs::remove_dir_all(dir.path()).unwrap();
    }
}

#[test]
fn attributes_are_kept_with_the_value_and_an_update_replaces_them_only_on_the_version_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1 << 20);
    cfg.chunk_size = 64 << 10; // the second value below is a large one: its head keeps them
    let store = Store::open(cfg.clone()).unwrap();
    // The whole value, through a reader (the large one is longer than a chunk).
    let read = |s: &Store, k: &[u8]| {
        let mut r = s.reader(k, Part::Whole).unwrap().expect("stored");
        let mut v = r.value().clone();
        let mut data = Vec::new();
        while let Some(piece) = r.next_piece().unwrap() {
            data.extend_from_slice(&piece);
        }
        v.data = data.into();
        v
    };
    let long = bytes(300_000, 5);
    for (key, value) in [(&b"small"[..], &b"body"[..]), (b"large", &long)] {
        let opts = PutOptions { attrs: Some(b"status=200"), ..PutOptions::default() };
        let stored = store.put(key, value, &opts).unwrap();
        for _ in 0..3 {
            // from the disk, then (small) from memory
            assert_eq!(read(&store, key).attrs.as_deref(), Some(&b"status=200"[..]));
        }
        let other = larder_engine::Touch {
            attrs: Some(Some(b"x")),
            stored_at: Some(stored.version.stored_ms + 1),
            ..Default::default()
        };
        assert!(store.update(key, &other).unwrap().is_none(), "another version is not changed");
        let touch = larder_engine::Touch {
            attrs: Some(Some(b"status=200;fresh")),
            stored_at: Some(stored.version.stored_ms),
            ..Default::default()
        };
        assert_eq!(store.update(key, &touch).unwrap(), Some(stored.version), "the version stays");
        let v = read(&store, key);
        assert_eq!((v.attrs.as_deref(), &v.data[..]), (Some(&b"status=200;fresh"[..]), value));
        let too_long = vec![b'a'; larder_engine::MAX_ATTRS + 1];
        let refused = store.put(key, value, &PutOptions { attrs: Some(&too_long), ..PutOptions::default() });
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::Invalid);
        let refused = store.update(key, &larder_engine::Touch { attrs: Some(Some(&too_long)), ..Default::default() });
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::Invalid);
    }
    drop(store);
    let store = Store::open(cfg).unwrap();
    assert_eq!(read(&store, b"small").attrs.as_deref(), Some(&b"status=200;fresh"[..]));
    assert_eq!(read(&store, b"large").attrs.as_deref(), Some(&b"status=200;fresh"[..]));
    assert_eq!(&read(&store, b"large").data[..], &long[..]);
    // A value stored without attributes has none; an update can remove them.
    store.put(b"plain", b"v", &PutOptions::default()).unwrap();
    assert!(read(&store, b"plain").attrs.is_none());
    store.update(b"small", &larder_engine::Touch { attrs: Some(None), ..Default::default() }).unwrap();
    assert!(read(&store, b"small").attrs.is_none());
}
