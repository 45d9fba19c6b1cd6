//! Read-after-write under races: a read that starts after a write was acknowledged never
//! returns an older value of its key, from a shared disk read, from the memory tier, or after
//! a failed fsync's undo (shared/DESIGN.md §6).
//!
//! Each race is made deterministic with a pause point (`larder_engine::pause`): one thread is
//! held at the exact place where the old ordering went wrong while the test does the other
//! side, then let go. A fast page cache would otherwise close every window before it opens.

use larder_engine::faults::{self, Rule};
use larder_engine::pause;
use larder_engine::{
    ByteRange, DeleteOptions, ErrorKind, Expiry, FsyncPolicy, MemoryConfig, Part, Precondition, PutOptions,
    ReadOptions, Store, StoreConfig,
};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

const ARRIVAL: Duration = Duration::from_secs(10);

fn config(dir: &Path) -> StoreConfig {
    StoreConfig { volume_size: 1 << 20, volume_count: 4, fsync: FsyncPolicy::Never, ..StoreConfig::new(dir) }
}

fn data(store: &Store, key: &[u8]) -> Option<Vec<u8>> {
    store.get(key, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

/// Clears the directory's faults when a test ends, even by a panic.
struct Faulty<'a>(&'a Path);
impl Drop for Faulty<'_> {
    fn drop(&mut self) {
        faults::clear(self.0);
    }
}

/// A GET is held inside the disk read it leads; a write of the key is acknowledged; a second
/// GET starts. It must not join the read in the air (which began before the write) and must
/// answer what the write left. Before the fix it joined, and answered the old value.
fn get_after_write_skips_the_read_in_the_air(k: &[u8], write: impl FnOnce(&Store), expect: Option<&[u8]>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path())).unwrap();
    store.put(k, b"old value", &PutOptions::default()).unwrap();
    let lead = pause::arm("flight.lead", k);
    std::thread::scope(|s| {
        let leader = s.spawn(|| data(&store, k));
        assert!(lead.wait_arrived(ARRIVAL), "the first GET never led a disk read");
        write(&store);
        let (tx, rx) = mpsc::channel();
        let store = &store;
        s.spawn(move || tx.send(data(store, k)).unwrap());
        // A GET that joined the held read waits for it: give it a moment, then let the
        // leader go either way, so that a wrong answer shows as a failure, not a hang.
        let quick = rx.recv_timeout(Duration::from_secs(1)).ok();
        lead.release();
        let after = quick.unwrap_or_else(|| rx.recv().unwrap());
        assert_eq!(after.as_deref(), expect, "a GET after the write's acknowledgement saw an older value");
        // The held GET began before the write: either answer is fine for it.
        leader.join().unwrap();
    });
    assert_eq!(data(&store, k).as_deref(), expect);
}

#[test]
fn a_get_after_a_put_never_joins_a_read_that_began_before_it() {
    get_after_write_skips_the_read_in_the_air(
        b"put-k",
        |s| assert!(s.put(b"put-k", b"new value", &PutOptions::default()).is_ok()),
        Some(b"new value"),
    );
}

#[test]
fn a_get_after_a_delete_never_joins_a_read_that_began_before_it() {
    get_after_write_skips_the_read_in_the_air(
        b"delete-k",
        |s| assert!(s.delete(b"delete-k", &DeleteOptions::default()).unwrap()),
        None,
    );
}

/// Linux 5.9 and 5.10 may answer a non-blocking read that would block with a short count
/// instead of EAGAIN. That is "would block": the read is retried on the blocking path, and
/// the key, an acknowledged value, stays. Before the fix it was taken as a damaged record
/// and the key was dropped from the index.
#[test]
fn a_short_non_blocking_read_is_would_block_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig {
        memory: MemoryConfig { capacity: 0, ..MemoryConfig::default() },
        ..config(dir.path())
    })
    .unwrap();
    let small: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
    let large: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    store.put(b"small", &small, &PutOptions::default()).unwrap();
    store.put(b"large", &large, &PutOptions::default()).unwrap();
    let _faulty = Faulty(dir.path());
    faults::inject(dir.path(), Rule::parse("read short").unwrap()).unwrap();
    let range = Part::Range(ByteRange::Span(200_000, Some(200_099)));
    for (key, part) in
        [(&b"small"[..], Part::Whole), (b"large", Part::Whole), (b"large", range), (b"large", Part::Nothing)]
    {
        assert!(
            store.get(key, &ReadOptions { part, nonblocking: true, coded: false }).unwrap_err().kind()
                == ErrorKind::WouldBlock,
            "a short non-blocking read was not taken as would-block"
        );
        let v = store
            .get(key, &ReadOptions { part, ..Default::default() })
            .unwrap()
            .expect("the blocking read finds the value");
        let whole = if key == b"small" { &small } else { &large };
        let want = match part {
            Part::Range(r) => {
                let (a, b) = r.resolve(whole.len() as u64).unwrap();
                &whole[a as usize..b as usize]
            }
            Part::Nothing => &[][..],
            Part::Whole => &whole[..],
        };
        assert_eq!(&v.data[..], want);
    }
    faults::clear(dir.path());
    assert_eq!(store.stats().corrupt_reads, 0);
    assert_eq!(data(&store, b"small").as_deref(), Some(&small[..]));
    assert_eq!(data(&store, b"large").as_deref(), Some(&large[..]));
}

/// With `fsync always`, a PUT whose fdatasync fails is answered as failed and undone. A GET
/// that runs while the undo is half done must not leave the failed value in memory: the undo
/// restores the index first and only then drops the key from memory (the one rule every
/// index change follows). Before the fix memory was cleared first, and the GET promoted the
/// failed value in between, to be served as a hit from then on.
#[test]
fn a_failed_sync_undo_racing_a_promotion_keeps_the_old_value() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryConfig { promote_after: 1, ..MemoryConfig::default() };
    let store = Store::open(StoreConfig { fsync: FsyncPolicy::Always, memory, ..config(dir.path()) }).unwrap();
    store.put(b"undo-k", b"durable", &PutOptions::default()).unwrap();
    let _faulty = Faulty(dir.path());
    faults::inject(dir.path(), Rule::parse("sync eio count=1").unwrap()).unwrap();
    let undo = pause::arm("undo.between", b"undo-k");
    std::thread::scope(|s| {
        let writer = s.spawn(|| store.put(b"undo-k", b"never acknowledged", &PutOptions::default()));
        assert!(undo.wait_arrived(ARRIVAL), "the failed sync never undid the write");
        // Whatever this GET answers (the write is not acknowledged yet), it must not leave
        // the failed value behind.
        let _ = data(&store, b"undo-k");
        undo.release();
        assert_eq!(writer.join().unwrap().unwrap_err().kind(), ErrorKind::Io);
    });
    for _ in 0..3 {
        assert_eq!(data(&store, b"undo-k").as_deref(), Some(&b"durable"[..]), "the failed write is served");
    }
}

/// A PUT drops the key from memory before it releases the writer lock, so that a conditional
/// write right after it is checked against what the PUT left, not against the value it
/// replaced. Here the PUT stores a value that is expired at once (a zero TTL): the key is
/// absent, and `If-Match` with the replaced value's tag must fail. Before the fix memory was
/// cleared after the lock was released, and the conditional write succeeded.
#[test]
fn a_conditional_write_after_a_put_never_checks_against_the_replaced_value() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryConfig { promote_after: 1, ..MemoryConfig::default() };
    let store = Store::open(StoreConfig { memory, ..config(dir.path()) }).unwrap();
    let v1 = store.put(b"cas-k", b"first", &PutOptions::default()).unwrap().version;
    store.get(b"cas-k", &ReadOptions::default()).unwrap();
    assert_eq!(store.get(b"cas-k", &ReadOptions::default()).unwrap().unwrap().tier, larder_engine::Tier::Memory);
    let unlocked = pause::arm("put.unlocked", b"cas-k");
    let store = &store;
    std::thread::scope(|s| {
        let expired = PutOptions { expiry: Expiry::After(Duration::ZERO), ..PutOptions::default() };
        let put = s.spawn(move || store_put(store, &expired));
        assert!(unlocked.wait_arrived(ARRIVAL), "the PUT never released the writer lock");
        let cas = PutOptions { preconditions: &[Precondition::OneOf(vec![v1])], ..PutOptions::default() };
        let r = store.put(b"cas-k", b"third", &cas);
        unlocked.release();
        put.join().unwrap();
        assert_eq!(r.map(|_| ()).unwrap_err().kind(), ErrorKind::PreconditionFailed);
    });
    assert!(store.get(b"cas-k", &ReadOptions::default()).unwrap().is_none());
}

fn store_put(store: &Store, opts: &PutOptions<'_>) {
    store.put(b"cas-k", b"second", opts).unwrap();
}

/// A value enters memory only if the index still names the record it was read from, and
/// "names" compares the whole generation of the slot, not the 7 bits the index keeps. Here a
/// GET is held between its disk read and its promotion while the only slot of the ring turns
/// 128 times and the key is written again at the very same offset: slot, offset and 7-bit tag
/// all match. Before the fix the old value was promoted and then served.
#[test]
fn a_promotion_compares_the_whole_generation() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        volume_size: 4096,
        volume_count: 1,
        reinsert_min_hits: 0,
        memory: MemoryConfig { promote_after: 1, ..MemoryConfig::default() },
        ..config(dir.path())
    };
    let store = Store::open(cfg).unwrap();
    let first = store.put(b"gen-k", &[1u8; 3000], &PutOptions::default()).unwrap().position;
    let promote = pause::arm("promote", b"gen-k");
    std::thread::scope(|s| {
        let reader = s.spawn(|| data(&store, b"gen-k"));
        assert!(promote.wait_arrived(ARRIVAL), "the GET never reached its promotion");
        // One record fills a volume: each write turns the ring (generation + 1).
        for i in 0..127 {
            store.put(format!("f{i:03}").as_bytes(), &[0u8; 3000], &PutOptions::default()).unwrap();
        }
        let again = store.put(b"gen-k", &[2u8; 3000], &PutOptions::default()).unwrap().position;
        assert_eq!((again.volume, again.offset, again.size), (first.volume, first.offset, first.size));
        // The held reader still leads its flight. A GET now looks up the same slot, offset and
        // 7-bit tag, but another generation: it must not join that read.
        let (tx, rx) = mpsc::channel();
        let store = &store;
        s.spawn(move || tx.send(data(store, b"gen-k").map(|d| d[0])).unwrap());
        let quick = rx.recv_timeout(Duration::from_secs(1)).ok();
        promote.release();
        let after = quick.unwrap_or_else(|| rx.recv().unwrap());
        assert_eq!(after, Some(2), "a GET joined a read of the record 128 generations ago");
        reader.join().unwrap();
    });
    let first_byte = data(&store, b"gen-k").map(|d| d[0]);
    assert_eq!(first_byte, Some(2), "a value of 128 generations ago was promoted");
}

/// A DELETE reads the key's record before it takes the writer lock (so that no writer waits on
/// its disk read) and checks, under the lock, that the index still names what it read. Here a
/// PUT of the key lands between the read and the lock, three times over: each time the DELETE
/// must read again, and in the end delete the newest value, not answer `200` and leave it.
#[test]
fn a_delete_whose_key_is_written_between_its_read_and_the_lock_reads_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path())).unwrap();
    store.put(b"reread-k", b"v0", &PutOptions::default()).unwrap();
    std::thread::scope(|s| {
        let mut looked = pause::arm("write.looked", b"reread-k");
        let delete = s.spawn(|| store.delete(b"reread-k", &DeleteOptions::default()));
        for round in 1..=3 {
            assert!(looked.wait_arrived(ARRIVAL), "round {round}: the DELETE never read the key");
            let next = pause::arm("write.looked", b"reread-k");
            store.put(b"reread-k", format!("v{round}").as_bytes(), &PutOptions::default()).unwrap();
            looked.release();
            looked = next;
        }
        drop(looked); // the last round reads under the lock: nothing may hold it now
        assert!(delete.join().unwrap().unwrap(), "the key had a value");
    });
    assert!(
        store.get(b"reread-k", &ReadOptions::default()).unwrap().is_none(),
        "the DELETE answered 200 and left a newer value"
    );
}

/// A put with `Expiry::Keep` (HTTP's `X-TTL: keep`) keeps the expiry of the value it replaces
/// as it stands under the writer lock: a touch that lands between the put's read of the key and
/// the lock is kept, never undone. With no value to keep, the put's `otherwise` applies.
#[test]
fn a_put_that_keeps_the_expiry_keeps_a_touch_made_between_its_read_and_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path())).unwrap();
    let opts = |expiry| PutOptions { expiry, ..Default::default() };
    let left_ms = |key: &[u8]| {
        let v = store.get(key, &ReadOptions::default()).unwrap().expect("the key has a value");
        v.expiry_ms.saturating_sub(larder_engine::now_ms())
    };
    store.put(b"keep-k", b"v0", &opts(Expiry::After(Duration::from_secs(100)))).unwrap();
    std::thread::scope(|s| {
        let looked = pause::arm("write.looked", b"keep-k");
        let put = s.spawn(|| store.put(b"keep-k", b"v1", &opts(Expiry::Keep { otherwise: None })));
        assert!(looked.wait_arrived(ARRIVAL), "the put never read the key");
        store.touch(b"keep-k", Expiry::After(Duration::from_secs(5000))).unwrap().expect("touched");
        looked.release();
        put.join().unwrap().unwrap();
    });
    assert_eq!(data(&store, b"keep-k").as_deref(), Some(&b"v1"[..]));
    let left = left_ms(b"keep-k");
    assert!(left > 4_000_000, "the touch's expiry was undone: {left} ms left");

    let otherwise = Expiry::Keep { otherwise: Some(Duration::from_secs(60)) };
    store.put(b"keep-new", b"n", &opts(otherwise)).unwrap();
    assert!((50_000..=60_000).contains(&left_ms(b"keep-new")), "no value to keep: `otherwise` applies");
    store.put(b"keep-never", b"n", &opts(Expiry::Keep { otherwise: None })).unwrap();
    let v = store.get(b"keep-never", &ReadOptions::default()).unwrap().unwrap();
    assert_eq!(v.expiry_ms, 0, "no value to keep, no otherwise: never expires");
}
