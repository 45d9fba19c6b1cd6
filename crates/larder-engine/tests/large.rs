//! Values longer than a chunk: stored as chunk records behind a head, read back whole or in
//! ranges, and never served in part when a chunk is lost or damaged.

use larder_engine::format::volume::volume_path;
use larder_engine::{
    pause, ByteRange, DeleteOptions, FsyncPolicy, Part, PutOptions, ReadOptions, Store, StoreConfig, Version,
};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

const CHUNK: u64 = 64 << 10;

fn config(dir: &Path, volumes: u32) -> StoreConfig {
    StoreConfig {
        volume_size: 1 << 20,
        volume_count: volumes,
        chunk_size: CHUNK,
        max_value_size: 2 << 20,
        fsync: FsyncPolicy::Never,
        ..StoreConfig::new(dir)
    }
}

/// `len` bytes that differ at every offset and between seeds.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64).map(|i| ((i * 2654435761 + seed * 97) >> 7) as u8).collect()
}

/// The part of the value of `key`: with `get` when it is at most a chunk, else gathered from
/// the pieces of a reader (as `get` refuses to gather more than a chunk).
fn get(store: &Store, key: &[u8], part: Part) -> Option<larder_engine::Value> {
    match store.get(key, &ReadOptions { part, ..Default::default() }) {
        Err(e) if e.kind() == larder_engine::ErrorKind::TooLarge => {
            let mut r = store.reader(key, part).unwrap()?;
            let mut data = Vec::new();
            while let Some(p) = r.next_piece().ok()? {
                data.extend_from_slice(&p);
            }
            Some(larder_engine::Value { data: data.into(), ..r.value().clone() })
        }
        r => r.unwrap(),
    }
}

fn put(store: &Store, key: &[u8], value: &[u8]) -> Version {
    store.put(key, value, &PutOptions::default()).unwrap().version
}

#[test]
fn a_large_value_reads_back_whole_in_ranges_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let value = bytes(5 * CHUNK as usize + 1234, 1);
    let version = {
        let store = Store::open(config(dir.path(), 8)).unwrap();
        put(&store, b"small", b"beside it");
        let ct = b"video/mp4";
        let stored = store.put(b"big", &value, &PutOptions { content_type: Some(ct), ..Default::default() }).unwrap();
        assert_eq!(stored.version.len, value.len() as u64);
        assert_eq!(stored.version.crc, crc32c::crc32c(&value), "the version's CRC is the whole value's");
        stored.version
    };
    for restart in [false, true] {
        let store = Store::open(config(dir.path(), 8)).unwrap();
        let whole = get(&store, b"big", Part::Whole).expect("stored");
        assert!(whole.data[..] == value[..], "restart {restart}: the value reads back byte for byte");
        assert_eq!((whole.version(), whole.content_type.as_deref()), (version, Some(&b"video/mp4"[..])));
        let head = get(&store, b"big", Part::Nothing).unwrap();
        assert_eq!((head.version(), head.data.len()), (version, 0), "a HEAD needs no chunk");
        let c = CHUNK;
        for (from, to) in [(0, 9), (c - 5, c + 5), (2 * c, 3 * c - 1), (value.len() as u64 - 7, value.len() as u64 - 1)]
        {
            let r = get(&store, b"big", Part::Range(ByteRange::Span(from, Some(to)))).unwrap();
            assert_eq!(r.start, from);
            assert!(r.data[..] == value[from as usize..=to as usize], "restart {restart}: range {from}..={to}");
        }
        assert_eq!(&get(&store, b"small", Part::Whole).unwrap().data[..], b"beside it");
        drop(store);
    }
}

#[test]
fn overwrites_and_deletes_move_between_the_two_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let large = bytes(3 * CHUNK as usize, 2);
    put(&store, b"k", b"small first");
    put(&store, b"k", &large);
    assert!(get(&store, b"k", Part::Whole).unwrap().data[..] == large[..]);
    put(&store, b"k", b"small again");
    assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"small again");
    put(&store, b"k", &large);
    assert!(store.delete(b"k", &DeleteOptions::default()).unwrap());
    assert!(get(&store, b"k", Part::Whole).is_none());
    drop(store);
    let store = Store::open(config(dir.path(), 8)).unwrap();
    assert!(get(&store, b"k", Part::Whole).is_none(), "the delete holds after a restart");
    assert_eq!(store.stats().recovery.skipped, 0, "chunk records are not damage");
}

#[test]
fn a_value_whose_first_chunk_was_overwritten_is_gone_before_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Eight volumes of 1 MiB; a value of 1.5 MiB spans two or three of them.
    let store = Store::open(config(dir.path(), 8)).unwrap();
    put(&store, b"big", &bytes(24 * CHUNK as usize, 3));
    let turned = store.stats().rotations;
    // Turn the ring until the slot of the value's first chunk is reused: its head's slot is
    // reused only after eight turns, so what makes the value gone is the lost chunk.
    let mut i = 0;
    while get(&store, b"big", Part::Nothing).is_some() {
        assert!(store.stats().rotations - turned < 8, "the value outlived its first chunk");
        put(&store, format!("fill{i}").as_bytes(), &bytes(60_000, i));
        i += 1;
    }
    assert!(store.stats().rotations - turned < 8);
    assert!(get(&store, b"big", Part::Range(ByteRange::Span(20 * CHUNK, Some(20 * CHUNK + 9)))).is_none());
    drop(store);
    let store = Store::open(config(dir.path(), 8)).unwrap();
    assert!(get(&store, b"big", Part::Whole).is_none(), "a value that lost a chunk came back after a restart");
}

#[test]
fn a_damaged_chunk_never_yields_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let value = bytes(4 * CHUNK as usize, 4);
    put(&store, b"big", &value);
    let head = get(&store, b"big", Part::Nothing).unwrap().position;
    drop(store);
    // The chunks precede the head in its volume: flip a byte well inside the value's data.
    let f =
        std::fs::OpenOptions::new().read(true).write(true).open(volume_path(dir.path(), head.volume as usize)).unwrap();
    let at = head.offset - 2 * CHUNK;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    assert!(get(&store, b"big", Part::Whole).is_none(), "a damaged chunk served as part of a value");
    assert!(store.stats().corrupt_reads >= 1, "the damage is counted");
    assert!(get(&store, b"big", Part::Nothing).is_none(), "and the key is dropped");
}

#[test]
fn a_crash_before_the_head_leaves_the_previous_value() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    put(&store, b"k", b"previous");
    let held = pause::arm("put.chunks", b"k");
    std::thread::scope(|s| {
        let writer = s.spawn(|| put(&store, b"k", &bytes(6 * CHUNK as usize, 5)));
        assert!(held.wait_arrived(Duration::from_secs(10)), "the upload never wrote its chunks");
        // Every chunk is on disk, the head is not: what a crash at this point leaves.
        assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"previous", "a value before its head");
        for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if e.file_name() != "LOCK" {
                std::fs::copy(e.path(), crashed.path().join(e.file_name())).unwrap();
            }
        }
        held.release();
        writer.join().unwrap();
    });
    drop(store);
    let store = Store::open(config(crashed.path(), 8)).unwrap();
    assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"previous");
    assert_eq!(store.stats().recovery.skipped, 0);
}

#[test]
fn a_value_written_in_pieces_reads_back_in_pieces_one_chunk_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let value = bytes(7 * CHUNK as usize + 999, 6);
    put(&store, b"k", b"previous");
    let mut w =
        store.writer(b"k", &PutOptions { content_type: Some(b"application/x-tar"), ..Default::default() }).unwrap();
    // Pieces of odd sizes, none a chunk: the writer cuts the chunks itself.
    for piece in value.chunks(10_007) {
        w.write(piece).unwrap();
        assert_eq!(
            &get(&store, b"k", Part::Whole).unwrap().data[..],
            b"previous",
            "a value seen before it is finished"
        );
    }
    let stored = w.finish().unwrap();
    assert_eq!((stored.version.len, stored.version.crc), (value.len() as u64, crc32c::crc32c(&value)));
    let mut r = store.reader(b"k", Part::Whole).unwrap().unwrap();
    assert_eq!(r.value().version(), stored.version);
    let mut got = Vec::new();
    while let Some(piece) = r.next_piece().unwrap() {
        assert!(piece.len() as u64 <= CHUNK, "a piece is at most a chunk");
        got.extend_from_slice(&piece);
    }
    assert!(got == value, "the pieces make up the value");
    // A range hands out only the chunks it overlaps, cut to the range.
    let (from, to) = (3 * CHUNK - 10, 4 * CHUNK + 10);
    let mut r = store.reader(b"k", Part::Range(ByteRange::Span(from, Some(to)))).unwrap().unwrap();
    assert_eq!(r.value().start, from);
    let pieces: Vec<_> = std::iter::from_fn(|| r.next_piece().unwrap()).collect();
    assert_eq!(pieces.len(), 3);
    assert!(pieces.concat() == value[from as usize..=to as usize]);
    // A value that fits in a chunk is one record, read in one piece.
    let mut w = store.writer(b"small", &PutOptions::default()).unwrap();
    w.write(&value[..CHUNK as usize]).unwrap();
    w.finish().unwrap();
    let mut r = store.reader(b"small", Part::Whole).unwrap().unwrap();
    assert!(r.next_piece().unwrap().unwrap()[..] == value[..CHUNK as usize]);
    assert!(r.next_piece().unwrap().is_none());
}

#[test]
fn a_writer_dropped_before_it_finishes_leaves_the_key_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    put(&store, b"k", b"kept");
    let mut w = store.writer(b"k", &PutOptions::default()).unwrap();
    w.write(&bytes(3 * CHUNK as usize, 7)).unwrap();
    drop(w); // a client gone mid-upload
    assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"kept");
    drop(store);
    let store = Store::open(config(dir.path(), 8)).unwrap();
    assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"kept", "and after a restart");
    let mut too_long = store.writer(b"k", &PutOptions::default()).unwrap();
    let e = too_long.write(&bytes(3 << 20, 8)).unwrap_err();
    assert_eq!(e.kind(), larder_engine::ErrorKind::TooLarge);
}

#[test]
fn a_reader_stops_with_an_error_at_a_damaged_chunk_and_the_key_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let value = bytes(4 * CHUNK as usize, 9);
    put(&store, b"big", &value);
    let head = get(&store, b"big", Part::Nothing).unwrap().position;
    drop(store);
    let f =
        std::fs::OpenOptions::new().read(true).write(true).open(volume_path(dir.path(), head.volume as usize)).unwrap();
    let at = head.offset - CHUNK; // inside the last chunk
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 1], at).unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let mut r = store.reader(b"big", Part::Whole).unwrap().unwrap();
    let mut served = 0;
    let err = loop {
        match r.next_piece() {
            Ok(Some(p)) => served += p.len(),
            Ok(None) => panic!("a damaged value was read to its end"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), larder_engine::ErrorKind::Corrupt);
    assert!(served < value.len());
    assert!(get(&store, b"big", Part::Nothing).is_none(), "the key is dropped");
}

/// Disk blocks the data directory's volume files occupy.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lrv"))
        .map(|e| e.metadata().unwrap().blocks() * 512)
        .sum()
}

#[test]
fn a_deleted_or_overwritten_large_value_gives_its_disk_blocks_back_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { volume_size: 16 << 20, max_value_size: 16 << 20, ..config(dir.path(), 8) };
    let store = Store::open(cfg.clone()).unwrap();
    put(&store, b"small", b"stays");
    for (round, end) in ["delete", "overwrite"].into_iter().enumerate() {
        let value = bytes(12 << 20, round as u64);
        put(&store, b"big", &value);
        store.sync().unwrap();
        let before = allocated(dir.path());
        let punched = store.stats().punched_bytes;
        match end {
            "delete" => assert!(store.delete(b"big", &DeleteOptions::default()).unwrap()),
            _ => {
                put(&store, b"big", b"now small");
            }
        }
        store.settle(); // the punch runs on the maintenance thread
        let freed = before.saturating_sub(allocated(dir.path()));
        let stats = store.stats();
        println!("{end}: {} MiB freed, {} MiB punched", freed >> 20, (stats.punched_bytes - punched) >> 20);
        assert!(freed >= 11 << 20, "{end}: only {freed} bytes of a 12 MiB value came back");
        // The whole pages of each chunk's body: with 64 KiB chunks, 15 of every 16 pages.
        assert!(stats.punched_bytes - punched >= 11 << 20);
        assert!(
            stats.allocated_bytes < stats.bytes_used,
            "allocated {} of {}",
            stats.allocated_bytes,
            stats.bytes_used
        );
    }
    assert_eq!(&get(&store, b"big", Part::Whole).unwrap().data[..], b"now small");
    drop(store);
    // The holes are free space to recovery and to `larder check`, never damage.
    let store = Store::open(cfg).unwrap();
    assert_eq!(store.stats().recovery.skipped, 0, "a punched range taken for damage");
    assert_eq!(&get(&store, b"small", Part::Whole).unwrap().data[..], b"stays");
    assert_eq!(&get(&store, b"big", Part::Whole).unwrap().data[..], b"now small");
    drop(store);
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert!(report.corrupt.is_empty() && report.hint_mismatches.is_empty(), "{report:?}");
    assert!(report.punched_chunks >= 2 * 192, "{} chunks seen as punched", report.punched_chunks);
}

#[test]
fn zeros_that_are_not_a_punched_hole_are_damage_to_recovery_and_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 8);
    let store = Store::open(cfg.clone()).unwrap();
    let big = bytes(300 << 10, 1);
    put(&store, b"big", &big); // its first chunk starts the first volume
    put(&store, b"small", &[7u8; 3000]);
    put(&store, b"after", b"a later record");
    let at = store.get(b"small", &ReadOptions::default()).unwrap().unwrap().position;
    drop(store);
    let f = std::fs::OpenOptions::new().write(true).open(volume_path(dir.path(), at.volume as usize)).unwrap();
    // Zeros written (allocated), not punched: over a page of the live chunk's body, and over
    // the whole of the small record, header included.
    f.write_all_at(&[0u8; 4096], 8192).unwrap();
    f.write_all_at(&vec![0u8; at.size as usize], at.offset).unwrap();
    drop(f);
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert_eq!(report.punched_chunks, 0, "{report:?}");
    assert!(report.corrupt.iter().any(|f| f.what.contains("chunk of key \"big\"")), "{report:?}");
    assert!(report.corrupt.len() >= 2, "the zeroed record is not reported: {report:?}");
    // Without its hint file, recovery scans the volume.
    std::fs::remove_file(larder_engine::format::volume::hint_path(dir.path(), at.volume as usize)).unwrap();
    let store = Store::open(cfg).unwrap();
    assert!(store.stats().recovery.skipped >= 1, "recovery took the zeroed record for free space");
    assert!(get(&store, b"small", Part::Whole).is_none());
    assert!(get(&store, b"big", Part::Whole).is_none(), "a value with a zeroed chunk was served");
    assert_eq!(&get(&store, b"after", Part::Whole).unwrap().data[..], b"a later record");
}

#[test]
fn a_large_value_loaded_from_a_hint_is_still_freed_when_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { volume_size: 16 << 20, max_value_size: 16 << 20, ..config(dir.path(), 8) };
    {
        let store = Store::open(cfg.clone()).unwrap();
        put(&store, b"big", &bytes(6 << 20, 11));
    } // closed: the checkpoint (a hint) describes the active volume
    let store = Store::open(cfg).unwrap();
    let r = store.stats().recovery;
    assert_eq!((r.checkpoint_loads, r.scans), (1, 0), "the volume was not loaded from its hint");
    assert!(store.delete(b"big", &DeleteOptions::default()).unwrap());
    store.settle();
    assert!(store.stats().punched_bytes >= 5 << 20, "a head known only from a hint was not freed");
}

#[test]
fn a_slot_restarted_after_recovery_discarded_its_volume_does_not_revive_a_value_it_held_a_chunk_of() {
    let dir = tempfile::tempdir().unwrap();
    let value = bytes(24 * CHUNK as usize, 21);
    let head = {
        let store = Store::open(config(dir.path(), 8)).unwrap();
        put(&store, b"big", &value);
        get(&store, b"big", Part::Nothing).unwrap().position
    };
    assert_eq!(head.volume, 1, "a value of 1.5 MiB starts in volume 0 and ends in volume 1");
    // Volume 0's header damaged: recovery discards it, and the slot's generations start over.
    let f = std::fs::OpenOptions::new().write(true).open(volume_path(dir.path(), 0)).unwrap();
    f.write_all_at(b"XX", 20).unwrap();
    drop(f);
    let store = Store::open(config(dir.path(), 8)).unwrap();
    assert_eq!(store.stats().recovery.discarded, 1);
    // Turn the ring into slot 0 again (seven turns from slot 1), not yet into the head's slot.
    let turned = store.stats().rotations;
    let mut i = 0;
    while store.stats().rotations - turned < 7 {
        put(&store, format!("fill{i}").as_bytes(), &bytes(60_000, i));
        i += 1;
    }
    assert!(
        get(&store, b"big", Part::Nothing).is_none(),
        "a value whose chunk's volume was discarded came back when the slot restarted at the same generation"
    );
}

#[test]
fn a_reader_keeps_a_value_deleted_under_it_and_its_blocks_are_freed_when_it_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { volume_size: 16 << 20, max_value_size: 16 << 20, ..config(dir.path(), 8) };
    let store = Store::open(cfg).unwrap();
    let value = bytes(8 << 20, 22);
    put(&store, b"big", &value);
    let mut reader = store.reader(b"big", Part::Whole).unwrap().unwrap();
    let mut data = reader.next_piece().unwrap().unwrap().to_vec();
    assert!(store.delete(b"big", &DeleteOptions::default()).unwrap());
    store.settle();
    assert_eq!(store.stats().punched_bytes, 0, "chunks punched while a reader streamed them");
    while let Some(p) = reader.next_piece().unwrap() {
        data.extend_from_slice(&p);
    }
    assert!(data == value, "the reader's snapshot changed under it");
    assert!(get(&store, b"big", Part::Nothing).is_none());
    drop(reader);
    store.settle(); // the last reader out sends the punch
    assert!(store.stats().punched_bytes >= 7 << 20, "the blocks were never freed");
    assert_eq!(store.stats().corrupt_reads, 0);
}

#[test]
fn a_punch_waits_until_the_delete_is_durable_so_a_power_cut_never_revives_a_value_with_holes() {
    use larder_engine::faults;
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { volume_size: 16 << 20, max_value_size: 16 << 20, ..config(dir.path(), 8) };
    faults::track(dir.path()).unwrap();
    let store = Store::open(cfg.clone()).unwrap();
    let value = bytes(6 << 20, 23);
    put(&store, b"big", &value);
    store.sync().unwrap();
    // With FsyncPolicy::Never the DELETE is acknowledged before its tombstone is durable; the
    // fault layer takes a punch as durable at once, as a file system may.
    assert!(store.delete(b"big", &DeleteOptions::default()).unwrap());
    store.settle();
    assert!(store.stats().punched_bytes >= 5 << 20);
    faults::power_cut(dir.path()).unwrap();
    drop(store);
    faults::clear(dir.path());
    let store = Store::open(cfg).unwrap();
    // Losing an unsynced DELETE is allowed with this policy; a value with holes is not.
    if get(&store, b"big", Part::Nothing).is_some() {
        assert!(get(&store, b"big", Part::Whole).is_some_and(|v| v.data == value), "a value came back with holes");
    }
    assert_eq!(store.stats().corrupt_reads, 0);
}

#[test]
fn an_upload_whose_first_chunks_the_ring_reused_meanwhile_fails_and_leaves_the_key_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    put(&store, b"k", b"previous");
    let mut w = store.writer(b"k", &PutOptions::default()).unwrap();
    w.write(&bytes(4 * CHUNK as usize, 24)).unwrap();
    // Other writes turn the whole ring while the upload is slow.
    let turned = store.stats().rotations;
    let mut i = 0;
    while store.stats().rotations - turned < 9 {
        put(&store, format!("fill{i}").as_bytes(), &bytes(60_000, i));
        i += 1;
    }
    w.write(&bytes(CHUNK as usize, 25)).unwrap();
    let err = w.finish().unwrap_err();
    assert_eq!(err.kind(), larder_engine::ErrorKind::NoSpace, "{err}");
    // "previous" was evicted by the same turns: the key must not name the broken value.
    assert!(get(&store, b"k", Part::Nothing).is_none());
}

#[test]
fn with_fsync_always_a_failed_sync_of_a_chunk_fails_the_value_even_when_its_head_syncs() {
    use larder_engine::faults;
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { fsync: FsyncPolicy::Always, ..config(dir.path(), 8) };
    let store = Store::open(cfg).unwrap();
    put(&store, b"k", b"previous");
    let mut w = store.writer(b"k", &PutOptions::default()).unwrap();
    w.write(&bytes(3 * CHUNK as usize, 26)).unwrap();
    // Another write's sync covers the chunks so far, and fails.
    faults::inject(dir.path(), faults::Rule::parse("sync eio count=1").unwrap()).unwrap();
    assert!(store.put(b"other", b"x", &PutOptions::default()).is_err());
    faults::clear(dir.path());
    w.write(&bytes(CHUNK as usize, 27)).unwrap();
    let err = w.finish().unwrap_err();
    assert_eq!(err.kind(), larder_engine::ErrorKind::Io, "{err}");
    assert_eq!(&get(&store, b"k", Part::Whole).unwrap().data[..], b"previous");
}

#[test]
fn a_value_given_in_parts_reads_back_as_if_it_had_been_given_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Store::open(StoreConfig { volume_size: 16 << 20, max_value_size: 8 << 20, ..config(dir.path(), 8) }).unwrap();
    // Below a chunk (one record, block checksums above 128 KiB in the engine's default), and
    // above it (chunks, some cut across parts).
    for (n, len) in [1000usize, CHUNK as usize - 1, 3 * CHUNK as usize + 17].into_iter().enumerate() {
        let value = bytes(len, 30 + n as u64);
        for cuts in [vec![len / 2], vec![1, 2, 3, len / 3, len - 1], vec![CHUNK as usize / 2, CHUNK as usize + 5]] {
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().map(|c| c.min(len)) {
                parts.push(&value[at..c.max(at)]);
                at = c.max(at);
            }
            parts.push(&value[at..]);
            let stored = store.put_parts(b"k", &parts, &PutOptions::default()).unwrap();
            assert_eq!(stored.version.crc, crc32c::crc32c(&value));
            assert!(get(&store, b"k", Part::Whole).unwrap().data == value, "len {len}");
            let (from, to) = (len as u64 / 3, len as u64 / 3 + 100);
            let r = get(&store, b"k", Part::Range(ByteRange::Span(from, Some(to)))).unwrap();
            assert!(r.data[..] == value[from as usize..=to as usize], "len {len}: a range");
        }
    }
    // One record with block checksums (above 128 KiB), its blocks cut across parts.
    drop(store);
    let store = Store::open(StoreConfig { chunk_size: 1 << 20, ..config(dir.path(), 8) }).unwrap();
    let value = bytes(300_000, 40);
    let parts = [&value[..1], &value[1..70_000], &value[70_000..]];
    store.put_parts(b"blocks", &parts, &PutOptions::default()).unwrap();
    let r = get(&store, b"blocks", Part::Range(ByteRange::Span(131_000, Some(132_000)))).unwrap();
    assert!(r.data[..] == value[131_000..=132_000]);
    assert!(get(&store, b"blocks", Part::Whole).unwrap().data == value);
}

#[test]
fn a_look_at_a_large_value_reads_its_head_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), 8)).unwrap();
    let value = bytes(1 << 20, 3);
    put(&store, b"big", &value);
    for nonblocking in [false, true] {
        let reads = store.stats().disk_reads;
        let v = store.get(b"big", &ReadOptions { part: Part::Nothing, nonblocking, coded: false }).unwrap().unwrap();
        assert_eq!(v.len, value.len() as u64);
        assert_eq!(store.stats().disk_reads - reads, 1, "nonblocking: {nonblocking}");
    }
}
