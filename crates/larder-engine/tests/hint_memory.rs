//! Sealing a volume writes its hint file with bounded memory: a 64 MiB volume of tiny records
//! (about 900,000 entries) must not be turned into a list of entries and an encoded file in
//! RAM (that was about 1.2 GiB for a 1 GiB volume). Its own test binary, so that the peak
//! resident memory measured is this test's alone.

use larder_engine::{FsyncPolicy, MemoryConfig, PutOptions, Store, StoreConfig};

/// (current, peak) resident memory of this process, in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        let v = status.lines().find_map(|l| l.strip_prefix(name)).unwrap();
        v.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() << 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
fn sealing_a_volume_of_tiny_records_streams_its_hint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        volume_size: 64 << 20,
        volume_count: 4,
        fsync: FsyncPolicy::Never,
        reinsert_min_hits: 0,
        memory: MemoryConfig { capacity: 0, ..MemoryConfig::default() },
        ..StoreConfig::new(dir.path())
    };
    let store = Store::open(cfg).unwrap();
    let mut i = 0u64;
    let put = |i: &mut u64| {
        store.put(format!("{i:016x}").as_bytes(), b"", &PutOptions::default()).unwrap();
        *i += 1;
    };
    // 64-byte records (header and a 16-byte key, no value) until the first volume has room
    // for one more.
    while store.stats().bytes_used < (64 << 20) - (256 << 10) {
        (0..1000).for_each(|_| put(&mut i));
    }
    while store.stats().bytes_used + 64 < 64 << 20 {
        put(&mut i);
    }
    assert_eq!(store.stats().rotations, 0);
    store.settle();
    // Start the peak afresh (Linux: writing 5 to clear_refs resets VmHWM).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let (before, _) = rss();
    while store.stats().rotations == 0 {
        put(&mut i);
    }
    store.settle(); // the hint of the sealed volume is written
    let (_, peak) = rss();
    let s = store.stats();
    assert_eq!(s.hints_written, 1);
    let grew = peak.saturating_sub(before);
    eprintln!("{i} records; RSS before the seal {} MiB, peak during it +{} KiB", before >> 20, grew >> 10);
    assert!(grew < 12 << 20, "sealing a volume of {i} records took {} MiB more memory", grew >> 20);
    drop(store);
    // The hint file is sound: the next open loads it instead of scanning.
    let store =
        Store::open(StoreConfig { volume_size: 64 << 20, volume_count: 4, ..StoreConfig::new(dir.path()) }).unwrap();
    assert_eq!(store.stats().recovery.hint_loads, 1);
    assert_eq!(store.stats().keys, i);
}
