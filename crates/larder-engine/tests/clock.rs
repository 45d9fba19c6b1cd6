//! ETags stay unique across restarts. A version is (length, CRC32C, store time), and store
//! times only go forward within a run. Across a restart they must too: if the clock stepped
//! back meanwhile, the same bytes written again could otherwise be stamped with a time an
//! earlier version had, and a client holding that version's ETag would take the new value
//! for the one it has. The store seeds its stamps from the newest store time recovery saw:
//! from a checkpoint (graceful stop), a sealed volume's hint file, or a scan (crash).
//!
//! Its own test binary: the clock skew is process-wide.

use larder_engine::faults;
use larder_engine::{FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use std::path::Path;

const HOUR: i64 = 3_600_000;

fn config(dir: &Path) -> StoreConfig {
    StoreConfig { volume_size: 64 << 10, volume_count: 4, fsync: FsyncPolicy::Always, ..StoreConfig::new(dir) }
}

/// Writes `k` an hour ahead of the clock, lets `stop` end the store, steps the clock back and
/// reopens: the same bytes written again must be stamped later than the first write.
fn write_after_clock_steps_back(stop: impl FnOnce(&Path, Store)) {
    let dir = tempfile::tempdir().unwrap();
    faults::skew_clock(HOUR);
    let store = Store::open(config(dir.path())).unwrap();
    // Later than the active volume's creation time, so that only the records' own store
    // times (from the checkpoint, the hint file or a scan) can tell recovery about it.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let first = store.put(b"k", b"same bytes", &Default::default()).unwrap().version;
    stop(dir.path(), store);
    faults::skew_clock(0);
    let store = Store::open(config(dir.path())).unwrap();
    assert_eq!(&store.get(b"k", &ReadOptions::default()).unwrap().expect("kept").data[..], b"same bytes");
    let again = store.put(b"k", b"same bytes", &Default::default()).unwrap().version;
    assert!(
        again.stored_ms > first.stored_ms,
        "stamped {} after {}: a version could repeat",
        again.stored_ms,
        first.stored_ms
    );
    assert_ne!(again, first);
}

#[test]
fn store_times_go_on_from_the_newest_recovered_after_the_clock_steps_back() {
    // A graceful stop: the active volume loads from its checkpoint.
    write_after_clock_steps_back(|_, store| store.close().unwrap());
    // The record in a sealed volume, loaded from its hint file.
    write_after_clock_steps_back(|_, store| {
        for i in 0..40 {
            store.put(format!("fill{i}").as_bytes(), &[0u8; 4096], &PutOptions::default()).unwrap();
        }
        assert!(store.stats().rotations >= 1);
        store.settle();
        store.close().unwrap();
    });
    // A crash: no checkpoint, the active volume is scanned.
    write_after_clock_steps_back(|dir, store| {
        faults::track(dir).unwrap();
        faults::power_cut(dir).unwrap();
        drop(store);
        faults::clear(dir);
    });
}
