//! Several data directories in one store: placement by utilization, the order of the
//! directories not mattering, a directory failing while the store runs (through the fault
//! layer), and a directory missing at start (degraded, or refused with `strict_dirs`).
//!
//! What must hold throughout: every read returns the latest value written or a miss/error,
//! never an older value whose replacement is in a directory that cannot be read.

use larder_engine::faults::{self, Failure, Op, Rule};
use larder_engine::format::volume::{volume_path, VOLUME_HEADER_LEN};
use larder_engine::{DeleteOptions, DirState, ErrorKind, FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use std::path::{Path, PathBuf};

const VOLUME: u64 = 64 << 10;

fn config(dirs: &[&Path]) -> StoreConfig {
    let mut c = StoreConfig::new(dirs[0]);
    c.dirs = dirs.iter().map(|d| d.to_path_buf()).collect();
    (c.volume_size, c.volume_count, c.fsync, c.reinsert_min_hits) = (VOLUME, 8, FsyncPolicy::Never, 0);
    c.memory.capacity = 0; // every read goes to the volumes
    c
}

/// Which of `dirs` holds slot `slot`'s volume (a file with more than a header).
fn dir_of(dirs: &[&Path], slot: u32) -> Option<usize> {
    let holds = |d: &Path| std::fs::metadata(volume_path(d, slot as usize)).is_ok_and(|m| m.len() > VOLUME_HEADER_LEN);
    let found: Vec<usize> = (0..dirs.len()).filter(|&i| holds(dirs[i])).collect();
    assert!(found.len() <= 1, "slot {slot} has data in several directories: {found:?}");
    found.first().copied()
}

/// Puts `n` values of 4 KiB under `prefix{i}`; returns the slots they landed in.
fn fill(store: &Store, prefix: &str, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            store
                .put(format!("{prefix}{i}").as_bytes(), &value(prefix, i), &PutOptions::default())
                .unwrap()
                .position
                .volume
        })
        .collect()
}

fn value(prefix: &str, i: usize) -> Vec<u8> {
    let seed = format!("{prefix}{i}:");
    seed.bytes().cycle().take(4000).collect()
}

fn get(store: &Store, key: &str) -> Option<Vec<u8>> {
    store.get(key.as_bytes(), &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

/// The active slot, then the slots the ring fills next, in order.
fn slots_in_order(first: u32, last: u32) -> Vec<u32> {
    let mut s = vec![first];
    while *s.last().unwrap() != last {
        s.push((s.last().unwrap() + 1) % 8);
    }
    s
}

#[test]
fn two_empty_directories_alternate_and_their_order_does_not_matter() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let store = Store::open(config(&dirs)).unwrap();
    let slots = fill(&store, "k", 90); // about six volumes of 15 values
    let last = *slots.last().unwrap();
    assert!(last >= 5, "only reached slot {last}");
    let placed: Vec<usize> = (0..=last).map(|s| dir_of(&dirs, s).expect("a volume with data")).collect();
    for (s, d) in placed.iter().enumerate() {
        assert_eq!(*d, placed[0] ^ (s & 1), "slots placed {placed:?}: not alternating");
    }
    let st = store.stats();
    assert_eq!(st.dirs.len(), 2);
    assert!(st.dirs.iter().all(|d| d.state == DirState::Ok && d.volumes >= 3), "{:?}", st.dirs);
    drop(store);

    // The same directories given the other way round: every value is read back.
    let store = Store::open(config(&[b.path(), a.path()])).unwrap();
    for i in 0..90 {
        assert_eq!(get(&store, &format!("k{i}")), Some(value("k", i)), "k{i}");
    }
    assert!(!store.stats().degraded);
}

#[test]
fn a_fuller_directory_takes_no_new_volumes_until_the_other_catches_up() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let store = Store::open(config(&[a.path()])).unwrap();
    let before = fill(&store, "old", 45); // three volumes, all in `a`
    drop(store);
    let active = *before.last().unwrap();
    assert!(active >= 2);

    // `b` is added empty: the next volumes all go there, as many as `a` holds.
    let dirs = [a.path(), b.path()];
    let held_by_a = (0..8).filter(|&s| dir_of(&dirs, s) == Some(0)).count() as u32;
    assert_eq!(held_by_a, active + 1);
    let store = Store::open(config(&dirs)).unwrap();
    let after = fill(&store, "new", 60);
    let new_slots: Vec<u32> = slots_in_order(active, *after.last().unwrap()).into_iter().skip(1).collect();
    assert!(new_slots.len() as u32 >= held_by_a, "only {new_slots:?} new volumes");
    for &s in &new_slots[..held_by_a as usize] {
        assert_eq!(dir_of(&dirs, s), Some(1), "slot {s} went to the fuller directory");
    }
    for i in 0..45 {
        assert_eq!(get(&store, &format!("old{i}")), Some(value("old", i)));
    }
}

/// Clears a directory's faults when a test ends, even by a panic.
struct Faulty<'a>(&'a Path);
impl Drop for Faulty<'_> {
    fn drop(&mut self) {
        faults::clear(self.0);
    }
}

#[test]
fn a_failing_directory_answers_errors_for_its_keys_and_writes_go_to_the_other() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let store = Store::open(config(&dirs)).unwrap();
    let slots = fill(&store, "k", 70);
    let in_b = |i: usize| dir_of(&dirs, slots[i]) == Some(1);
    assert!((0..70).any(in_b) && !(0..70).all(in_b));

    let _clear = Faulty(b.path());
    for op in [Op::Read, Op::Write, Op::Sync] {
        faults::inject(b.path(), Rule::always(op, Failure::Io)).unwrap();
    }
    // Keys in `b` are errors (a server answers 503), never misses or other bytes; `a` serves.
    for i in 0..70 {
        match store.get(format!("k{i}").as_bytes(), &ReadOptions::default()) {
            Ok(v) => {
                assert!(!in_b(i), "k{i} read from the failed directory");
                assert_eq!(v.map(|v| v.data.to_vec()), Some(value("k", i)));
            }
            Err(e) => {
                assert!(in_b(i), "k{i} in the healthy directory failed: {e}");
                assert_eq!(e.kind(), ErrorKind::Io);
            }
        }
    }
    // Every new write succeeds, in `a`, across several volumes.
    let new = fill(&store, "n", 50);
    for (i, &slot) in new.iter().enumerate() {
        assert_eq!(get(&store, &format!("n{i}")), Some(value("n", i)));
        if i >= 5 {
            assert_eq!(dir_of(&dirs[..1], slot), Some(0), "n{i} in slot {slot} is not in the healthy directory");
        }
    }
    let st = store.stats();
    assert_eq!(st.dirs.iter().map(|d| d.state).collect::<Vec<_>>(), vec![DirState::Ok, DirState::Failed]);
}

/// Puts `key` = `v1`, then turns the ring until the next volume is in the other directory,
/// and puts `key` = `v2` there. Returns the directories (by index) of the two records.
fn two_values_in_two_directories(store: &Store, dirs: &[&Path], key: &str) -> (usize, usize) {
    let first = store.put(key.as_bytes(), b"v1", &PutOptions::default()).unwrap().position.volume;
    let d1 = dir_of(dirs, first).unwrap();
    for i in 0.. {
        let p = store.put(format!("fill{i}").as_bytes(), &[7u8; 4000], &PutOptions::default()).unwrap();
        if dir_of(dirs, p.position.volume) != Some(d1) {
            break;
        }
    }
    let second = store.put(key.as_bytes(), b"v2", &PutOptions::default()).unwrap().position.volume;
    let d2 = dir_of(dirs, second).unwrap();
    assert_ne!(d1, d2);
    (d1, d2)
}

#[test]
fn a_missing_directory_starts_degraded_and_never_serves_an_older_value() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let store = Store::open(config(&dirs)).unwrap();
    let (d1, d2) = two_values_in_two_directories(&store, &dirs, "key");
    store.put(b"gone", b"deleted while missing", &PutOptions::default()).unwrap();
    drop(store);

    // The directory with the newer value is missing: `key` must not come back as "v1".
    let present = dirs[d1];
    let mut strict = config(&[present, dirs[d2]]);
    strict.dirs = vec![present.to_path_buf(), PathBuf::from(dirs[d2]).join("not-here")];
    strict.strict_dirs = true;
    let refused = Store::open(strict).err().expect("strict_dirs refuses to start");
    assert!(refused.to_string().contains("missing"), "{refused}");

    let store = Store::open(config(&[present])).unwrap();
    let st = store.stats();
    assert!(st.degraded && st.recovery.unavailable > 0, "{:?}", st.recovery);
    assert_eq!(st.dirs.iter().filter(|d| d.state == DirState::Missing).count(), 1);
    assert_eq!(get(&store, "key"), None, "an older value served while the newer one is missing");
    // Writes and deletes go on; a delete holds when the missing directory returns.
    store.put(b"while", b"degraded", &PutOptions::default()).unwrap();
    assert!(!store.delete(b"gone", &DeleteOptions::default()).unwrap());
    drop(store);

    // Both back: the latest value, the delete, and what was written meanwhile.
    let store = Store::open(config(&dirs)).unwrap();
    assert!(!store.stats().degraded);
    assert_eq!(get(&store, "key").as_deref(), Some(&b"v2"[..]));
    assert_eq!(get(&store, "while").as_deref(), Some(&b"degraded"[..]));
    assert_eq!(get(&store, "gone"), None);
}

#[test]
fn an_empty_mount_point_is_not_taken_for_a_new_directory() {
    let (a, parent) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = parent.path().join("disk2");
    let dirs = [a.path(), b.as_path()];
    let store = Store::open(config(&dirs)).unwrap();
    two_values_in_two_directories(&store, &dirs, "key");
    drop(store);

    // "Unmount" b: its path is an empty directory now.
    let away = parent.path().join("elsewhere");
    std::fs::rename(&b, &away).unwrap();
    std::fs::create_dir(&b).unwrap();
    let store = Store::open(config(&dirs)).unwrap();
    let st = store.stats();
    assert!(st.degraded);
    assert_eq!(st.dirs.iter().find(|d| d.path == b).map(|d| d.state), Some(DirState::Missing));
    store.put(b"meanwhile", b"x", &PutOptions::default()).unwrap();
    drop(store);
    assert_eq!(std::fs::read_dir(&b).unwrap().count(), 0, "larder wrote into the empty mount point");

    // "Mounted" again: everything is there.
    std::fs::remove_dir(&b).unwrap();
    std::fs::rename(&away, &b).unwrap();
    let store = Store::open(config(&dirs)).unwrap();
    assert_eq!(get(&store, "key").as_deref(), Some(&b"v2"[..]));
    assert_eq!(get(&store, "meanwhile").as_deref(), Some(&b"x"[..]));
}

#[test]
fn a_directory_of_another_store_is_refused() {
    let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    Store::open(config(&[a.path()])).unwrap().put(b"k", b"a", &PutOptions::default()).unwrap();
    Store::open(config(&[b.path()])).unwrap().put(b"k", b"b", &PutOptions::default()).unwrap();
    let err = Store::open(config(&[a.path(), b.path()])).err().expect("two stores mixed");
    assert!(err.to_string().contains("different larder stores"), "{err}");
    // A new empty directory joins fine, and the data is untouched.
    let store = Store::open(config(&[a.path(), c.path()])).unwrap();
    assert_eq!(get(&store, "k").as_deref(), Some(&b"a"[..]));
}

#[test]
fn a_directory_of_the_one_directory_format_opens_with_its_data_and_hints() {
    use larder_engine::format::dir_id::{DirId, ID_FILE};
    use larder_engine::format::manifest::{Manifest, FILE_NAME};
    let a = tempfile::tempdir().unwrap();
    let store = Store::open(config(&[a.path()])).unwrap();
    fill(&store, "k", 40);
    drop(store);
    // Rewrite it as the previous version left it: a 64-byte manifest whose id is the
    // directory's (and its volumes'), and no id file.
    let id = DirId::decode(&std::fs::read(a.path().join(ID_FILE)).unwrap()).unwrap().dir_id;
    let m = Manifest::decode(&std::fs::read(a.path().join(FILE_NAME)).unwrap()).unwrap();
    let mut v1 = [0u8; 64];
    v1[0..8].copy_from_slice(b"LARDMANI");
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    v1[12..16].copy_from_slice(&m.active_slot.to_le_bytes());
    v1[16..32].copy_from_slice(&id);
    v1[32..40].copy_from_slice(&m.hash_seed.to_le_bytes());
    v1[40..48].copy_from_slice(&m.volume_size.to_le_bytes());
    v1[48..52].copy_from_slice(&m.volume_count.to_le_bytes());
    let crc = crc32c::crc32c(&v1[..60]);
    v1[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(a.path().join(FILE_NAME), v1).unwrap();
    std::fs::remove_file(a.path().join(ID_FILE)).unwrap();

    let store = Store::open(config(&[a.path()])).unwrap();
    let r = store.stats().recovery;
    assert_eq!((r.discarded, r.scans), (0, 0), "hints and the checkpoint were not used: {r:?}");
    for i in 0..40 {
        assert_eq!(get(&store, &format!("k{i}")), Some(value("k", i)));
    }
    assert_eq!(
        DirId::decode(&std::fs::read(a.path().join(ID_FILE)).unwrap()).unwrap().dir_id,
        id,
        "the directory keeps its id"
    );
}

#[test]
fn two_runs_each_missing_the_other_directory_never_bring_back_a_deleted_value() {
    let (a, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), c.path()];
    let store = Store::open(config(&dirs)).unwrap();
    store.put(b"key", b"v1", &PutOptions::default()).unwrap();
    fill(&store, "f", 60); // volumes in both directories
    drop(store);

    // Run 1 without `a`: the key is deleted, `x` written.
    let store = Store::open(config(&[c.path()])).unwrap();
    assert!(store.stats().degraded);
    assert_eq!(get(&store, "key"), None);
    store.delete(b"key", &DeleteOptions::default()).unwrap();
    store.put(b"x", b"run 1", &PutOptions::default()).unwrap();
    drop(store);
    // Run 2 without `c` (whose manifest copy is the newer one): nothing from before.
    let store = Store::open(config(&[a.path()])).unwrap();
    assert!(store.stats().degraded);
    assert_eq!(get(&store, "key"), None, "a deleted value came back");
    store.put(b"y", b"run 2", &PutOptions::default()).unwrap();
    drop(store);
    // Both back: the delete holds; what each run wrote is there or a miss, never older.
    let store = Store::open(config(&dirs)).unwrap();
    assert_eq!(get(&store, "key"), None, "a deleted value came back");
    assert_eq!(get(&store, "y").as_deref(), Some(&b"run 2"[..]));
    assert!(matches!(get(&store, "x").as_deref(), None | Some(b"run 1")));
}

#[test]
fn with_fsync_always_a_directory_whose_syncs_fail_stops_failing_the_other_ones_writes() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let mut cfg = config(&dirs);
    cfg.fsync = FsyncPolicy::Always;
    let store = Store::open(cfg).unwrap();
    fill(&store, "k", 40);
    let _clear = Faulty(b.path());
    faults::inject(b.path(), Rule::always(Op::Sync, Failure::Io)).unwrap();
    let results: Vec<bool> = (0..60)
        .map(|i| store.put(format!("n{i}").as_bytes(), &value("n", i), &PutOptions::default()).is_ok())
        .collect();
    let first_ok = results.iter().position(|&ok| ok).expect("no write succeeded");
    assert!(first_ok <= 3 && results[first_ok..].iter().all(|&ok| ok), "{results:?}");
    for i in first_ok..60 {
        assert_eq!(get(&store, &format!("n{i}")), Some(value("n", i)));
    }
}

#[test]
fn writes_resume_when_every_directory_failed_and_the_fault_clears() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = [a.path(), b.path()];
    let store = Store::open(config(&dirs)).unwrap();
    fill(&store, "k", 20);
    {
        let _clear = (Faulty(a.path()), Faulty(b.path()));
        for d in dirs {
            faults::inject(d, Rule::always(Op::Write, Failure::Io)).unwrap();
        }
        for i in 0..40 {
            assert!(store.put(format!("n{i}").as_bytes(), &value("n", i), &PutOptions::default()).is_err());
        }
        assert!(store.stats().dirs.iter().all(|d| d.state == DirState::Failed));
    }
    // The devices are back: the next volume goes to a directory marked failed, which works.
    fill(&store, "m", 40); // every put must succeed
    for i in 0..40 {
        assert_eq!(get(&store, &format!("m{i}")), Some(value("m", i)));
    }
    assert!(store.stats().dirs.iter().any(|d| d.state == DirState::Ok));
}
