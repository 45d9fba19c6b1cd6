//! `StoreConfig::compression`: values coded on the way in read back byte for byte, under any
//! later setting; incompressible values stay raw; the memory tier holds values coded; and a
//! coded record that does not decode is damage (counted, a miss, named by `check`), never
//! bytes served.

use larder_engine::format::record::{self, HEADER_LEN};
use larder_engine::format::volume::{volume_path, VolumeHeader};
use larder_engine::{
    ByteRange, Codec, Compression, ErrorKind, Expiry, FsyncPolicy, MemoryConfig, Part, PutOptions, ReadOptions, Store,
    StoreConfig, Tier,
};
use std::path::Path;

fn config(dir: &Path, codec: Option<Codec>, memory: u64) -> StoreConfig {
    StoreConfig {
        volume_size: 8 << 20,
        volume_count: 8,
        max_value_size: 4 << 20,
        chunk_size: 256 << 10,
        fsync: FsyncPolicy::Never,
        memory: MemoryConfig { capacity: memory, promote_after: 1, on_put: memory > 0, ..Default::default() },
        compression: Compression { codec, level: codec.map_or(0, |c| c.default_level()), ..Default::default() },
        ..StoreConfig::new(dir)
    }
}

/// Markup of `len` bytes, as compressible as a rendered page (about 4x with zstd).
fn page(len: usize, seed: u32) -> Vec<u8> {
    let mut s = String::new();
    let mut i = seed;
    while s.len() < len {
        i = i.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        s.push_str(&format!("<tr><td class=\"pkg\">lib{}</td><td>{}.{}</td></tr>\n", i % 977, i % 13, i % 101));
    }
    s.truncate(len);
    s.into_bytes()
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn read(s: &Store, key: &[u8]) -> Option<Vec<u8>> {
    s.get(key, &ReadOptions::default()).unwrap().map(|v| v.data.to_vec())
}

const SIZES: [usize; 5] = [300, 1000, 4096, 100_000, 256 << 10];

#[test]
fn coded_values_read_back_byte_for_byte_under_every_setting() {
    for (codec, _) in Codec::ALL {
        let dir = tempfile::tempdir().unwrap();
        let o = PutOptions::default();
        let mut logical = 0;
        {
            let s = Store::open(config(dir.path(), Some(codec), 0)).unwrap();
            for (i, &len) in SIZES.iter().enumerate() {
                let v = page(len, i as u32);
                let stored = s.put(format!("k{i}").as_bytes(), &v, &o).unwrap();
                assert!(stored.position.size < len as u64, "{codec:?} {len}: stored coded");
                let got = s.get(format!("k{i}").as_bytes(), &ReadOptions::default()).unwrap().unwrap();
                assert_eq!(&got.data[..], &v[..], "{codec:?} {len}");
                // The value's own length and checksum: its validators do not depend on coding.
                assert_eq!(got.version(), stored.version);
                assert_eq!((got.len, got.crc), (len as u64, crc32c::crc32c(&v)));
                assert_eq!(got.coded.as_ref().map(|c| c.codec), Some(codec));
                logical += len as u64;
            }
            // A value longer than a chunk is stored as a large value, its chunks coded.
            let big = page(600_000, 9);
            s.put(b"big", &big, &o).unwrap();
            logical += 600_000;
            let st = s.stats();
            assert_eq!((st.coded_puts, st.coded_logical_bytes), (SIZES.len() as u64, logical));
            assert!(st.coded_stored_bytes * 3 < logical, "{codec:?}: {} of {logical}", st.coded_stored_bytes);
        }
        let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
        assert!(report.clean(), "{:?}", report.corrupt);
        assert_eq!(report.coded_records, SIZES.len() as u64 + 3, "the values and the big one's three chunks");
        // Reopened with compression off, and with the other codec: everything reads; the
        // first time without hint files, as after a crash, so that recovery scans the records.
        let mut hints = 0;
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "hint") {
                std::fs::remove_file(p).unwrap();
                hints += 1;
            }
        }
        assert!(hints > 0);
        for other in [None, Some(Codec::Zstd), Some(Codec::Lz4)] {
            let s = Store::open(config(dir.path(), other, 0)).unwrap();
            for (i, &len) in SIZES.iter().enumerate() {
                assert_eq!(read(&s, format!("k{i}").as_bytes()), Some(page(len, i as u32)), "{codec:?} then {other:?}");
            }
            let mut r = s.reader(b"big", Part::Whole).unwrap().unwrap();
            let mut big = Vec::new();
            while let Some(p) = r.next_piece().unwrap() {
                big.extend_from_slice(&p);
            }
            assert_eq!(big, page(600_000, 9));
            if other.is_none() {
                assert_eq!(s.stats().recovery.scans, 1, "the volume was scanned");
            }
        }
    }
}

#[test]
fn incompressible_and_short_values_stay_raw() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
    let o = PutOptions::default();
    let random = noise(4096, 3);
    let mut jpeg = b"\xff\xd8\xff\xe0".to_vec();
    jpeg.extend(page(4000, 1));
    let short = page(100, 2);
    let almost_random = noise(700, 5); // too short for the probe: coded, and kept raw
    for (k, v) in [(&b"random"[..], &random), (b"jpeg", &jpeg), (b"short", &short), (b"mid", &almost_random)] {
        let stored = s.put(k, v, &o).unwrap();
        assert!(stored.position.size > v.len() as u64, "{:?} is stored raw", String::from_utf8_lossy(k));
        let got = s.get(k, &ReadOptions::default()).unwrap().unwrap();
        assert_eq!((&got.data[..], got.coded.is_none()), (&v[..], true));
    }
    let st = s.stats();
    assert_eq!((st.coded_puts, st.raw_probed, st.raw_no_gain), (0, 2, 1), "the short one is not tried");
}

#[test]
fn ranges_descriptions_and_touches_of_coded_values() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
    let o = PutOptions::default();
    for len in [4096usize, 200_000] {
        let v = page(len, 7);
        let key = format!("r{len}");
        let stored = s.put(key.as_bytes(), &v, &o).unwrap();
        let part = |p: Part| {
            s.get(key.as_bytes(), &ReadOptions { part: p, nonblocking: false, coded: false }).unwrap().unwrap()
        };
        let r = part(Part::Range(ByteRange::Span(100, Some(1099))));
        assert_eq!((&r.data[..], r.start, r.len), (&v[100..1100], 100, len as u64));
        let tail = part(Part::Range(ByteRange::Suffix(10)));
        assert_eq!(&tail.data[..], &v[len - 10..]);
        let head = part(Part::Nothing);
        assert_eq!((head.data.len(), head.len, head.version()), (0, len as u64, stored.version));
        // A touch copies the coded record: same bytes, same version.
        let touched = s.touch(key.as_bytes(), Expiry::After(std::time::Duration::from_secs(60))).unwrap();
        assert_eq!(touched, Some(stored.version));
        assert_eq!(read(&s, key.as_bytes()), Some(v));
    }
    let mut keys = Vec::new();
    s.keys(|k| {
        keys.push((k.key.to_vec(), k.len));
        true
    })
    .unwrap();
    assert!(keys.contains(&(b"r4096".to_vec(), 4096)), "a listing gives the value's own length: {keys:?}");
}

#[test]
fn the_memory_tier_holds_coded_values_and_serves_them_decoded() {
    let (dir_raw, dir_coded) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = PutOptions::default();
    let mut held = Vec::new();
    for (dir, codec) in [(&dir_raw, None), (&dir_coded, Some(Codec::Zstd))] {
        let s = Store::open(config(dir.path(), codec, 1 << 20)).unwrap();
        for i in 0..1000u32 {
            s.put(format!("m{i}").as_bytes(), &page(4096, i), &o).unwrap();
        }
        let mut hits = 0;
        for i in 0..1000u32 {
            let v = s.get(format!("m{i}").as_bytes(), &ReadOptions::default()).unwrap().unwrap();
            assert_eq!(&v.data[..], &page(4096, i)[..]);
            hits += (v.tier == Tier::Memory) as u32;
        }
        held.push((s.stats().memory_entries, hits));
    }
    let ((raw_entries, raw_hits), (coded_entries, coded_hits)) = (held[0], held[1]);
    assert!(coded_entries >= 3 * raw_entries, "1 MiB of memory holds {coded_entries} coded, {raw_entries} raw");
    assert!(coded_hits >= 3 * raw_hits, "{coded_hits} memory hits coded, {raw_hits} raw");
}

/// Rewrites the coded record at `pos` of slot `slot` in `dir` with `value` as its coded
/// bytes, under valid checksums: damage a checksum cannot see.
fn forge(dir: &Path, slot: u32, offset: u64, size: u64, value: impl Fn(&[u8]) -> Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let path = volume_path(dir, slot as usize);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let mut vh = vec![0u8; 64];
    f.read_exact_at(&mut vh, 0).unwrap();
    let salt = VolumeHeader::decode(&vh).unwrap().salt;
    let mut buf = vec![0u8; size as usize];
    f.read_exact_at(&mut buf, offset).unwrap();
    let r = record::decode(&buf, salt).unwrap();
    assert!(r.header.is_coded());
    let new = value(&buf[r.value_range.0..r.value_range.1]);
    assert_eq!(new.len(), r.value_range.1 - r.value_range.0, "same length, same place");
    let mut out = Vec::new();
    record::encode_into(&mut out, &r.header, r.key, r.meta, &new, salt);
    assert_eq!(out.len(), record::padded(size) as usize);
    f.write_all_at(&out, offset).unwrap();
    assert!(HEADER_LEN < out.len());
}

#[test]
fn a_coded_record_that_does_not_decode_is_a_counted_miss_and_check_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let v = page(8192, 4);
    let (garbled, truncated, intact) = {
        let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
        let o = PutOptions::default();
        let a = s.put(b"garbled", &v, &o).unwrap().position;
        let b = s.put(b"other-bytes", &v, &o).unwrap().position;
        let c = s.put(b"intact", &v, &o).unwrap().position;
        (a, b, c)
    };
    // Sound checksums over coded bytes that are not a zstd frame, and over a frame that
    // decodes to other bytes of the same length (a codec bug, as the reader sees it).
    forge(dir.path(), garbled.volume, garbled.offset, garbled.size, |c| c.iter().map(|b| b ^ 0x5a).collect());
    // A frame of other bytes of the value's length, then a skippable frame to the coded
    // length: a decoder reads it whole and gives 8192 bytes that are not the value.
    let other = vec![b'x'; 8192];
    forge(dir.path(), truncated.volume, truncated.offset, truncated.size, |c| {
        let mut f = zstd::bulk::compress(&other, 3).unwrap();
        let pad = c.len() - f.len() - 8;
        f.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
        f.extend_from_slice(&(pad as u32).to_le_bytes());
        f.resize(c.len(), 0);
        f
    });
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert_eq!(report.corrupt.len(), 2, "{:?}", report.corrupt);
    assert!(report.corrupt.iter().all(|f| f.what.contains("coded record")), "{:?}", report.corrupt);
    let s = Store::open(config(dir.path(), None, 0)).unwrap();
    assert_eq!(read(&s, b"garbled"), None);
    assert_eq!(read(&s, b"other-bytes"), None);
    assert_eq!(read(&s, b"intact"), Some(v));
    let st = s.stats();
    assert_eq!((st.decode_failures, st.corrupt_reads), (2, 2));
    let _ = intact;
}

#[test]
fn a_caller_that_sends_coded_bytes_gets_them_undecoded_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 1 << 20)).unwrap();
    let v = page(4096, 11);
    let stored = s.put(b"p", &v, &PutOptions::default()).unwrap();
    let coded = ReadOptions { coded: true, ..Default::default() };
    let got = s.get(b"p", &coded).unwrap().unwrap();
    assert_eq!((got.tier, got.data.len(), got.len, got.version()), (Tier::Memory, 0, 4096, stored.version));
    let c = got.coded.expect("coded bytes");
    assert_eq!(c.codec, Codec::Zstd);
    assert_eq!(zstd::bulk::decompress(&c.data, 4096).unwrap(), v, "a plain zstd frame of the value");
    // Any other read decodes; a range never hands out coded bytes.
    assert_eq!(&s.get(b"p", &ReadOptions::default()).unwrap().unwrap().data[..], &v[..]);
    let r =
        s.get(b"p", &ReadOptions { part: Part::Range(ByteRange::Span(0, Some(9))), coded: true, ..Default::default() });
    assert_eq!(&r.unwrap().unwrap().data[..], &v[..10]);
    // From disk (memory off): decoded and checked, and the coded bytes come along.
    drop(s);
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
    let got = s.get(b"p", &coded).unwrap().unwrap();
    assert_eq!((got.tier, &got.data[..]), (Tier::Disk, &v[..]));
    assert_eq!(zstd::bulk::decompress(&got.coded.unwrap().data, 4096).unwrap(), v);
}

#[test]
fn values_sent_coded_are_kept_as_sent_once_they_decode() {
    let dir = tempfile::tempdir().unwrap();
    // Compression off: a value that arrives coded is kept coded all the same.
    let s = Store::open(config(dir.path(), None, 1 << 20)).unwrap();
    let o = PutOptions::default();
    let v = page(20_000, 12);
    // Two frames, the first with a checksum: a reader that takes zstd gets exactly these.
    let mut sent = zstd::bulk::Compressor::new(19).unwrap();
    sent.include_checksum(true).unwrap();
    let mut frames = sent.compress(&v[..5000]).unwrap();
    frames.extend(zstd::bulk::compress(&v[5000..], 1).unwrap());
    let stored = s.put_coded(b"sent", Codec::Zstd, &frames, &o).unwrap();
    assert_eq!((stored.version.len, stored.version.crc), (v.len() as u64, crc32c::crc32c(&v)));
    assert_eq!(read(&s, b"sent"), Some(v.clone()));
    let coded = ReadOptions { coded: true, ..Default::default() };
    for _ in 0..2 {
        let got = s.get(b"sent", &coded).unwrap().unwrap();
        assert_eq!(&got.coded.unwrap().data[..], &frames[..], "the bytes as sent, from disk and from memory");
    }
    assert_eq!(s.stats().coded_puts, 1);
    for (bytes, kind) in [
        (&b""[..], ErrorKind::Invalid),
        (&b"not a frame at all"[..], ErrorKind::Invalid),
        (&frames[..frames.len() - 3], ErrorKind::Invalid),
        (&zstd::bulk::compress(&vec![b'a'; (256 << 10) + 1], 3).unwrap()[..], ErrorKind::TooLarge),
    ] {
        assert_eq!(s.put_coded(b"bad", Codec::Zstd, bytes, &o).unwrap_err().kind(), kind, "{} bytes", bytes.len());
    }
    assert_eq!(s.put_coded(b"bad", Codec::Lz4, b"x", &o).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(read(&s, b"bad"), None, "nothing refused was stored");
    drop(s);
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert!(report.clean() && report.coded_records == 1, "{report:?}");
}

#[test]
fn a_large_value_is_coded_chunk_by_chunk_and_a_range_decodes_only_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
    let o = PutOptions::default();
    let v = page(1_000_000, 31); // four chunks of 256 KiB, the last shorter
    let before = s.stats();
    s.put(b"large", &v, &o).unwrap();
    let after = s.stats();
    assert!(after.bytes_used - before.bytes_used < 400_000, "stored in {} bytes", after.bytes_used - before.bytes_used);
    // Whole, streamed, and ranges within a chunk and across two.
    let mut r = s.reader(b"large", Part::Whole).unwrap().unwrap();
    let mut whole = Vec::new();
    while let Some(p) = r.next_piece().unwrap() {
        whole.extend_from_slice(&p);
    }
    assert!(whole == v);
    drop(r);
    for (a, b) in [(0u64, 99u64), (262_100, 262_200), (999_990, 999_999)] {
        let got =
            s.get(b"large", &ReadOptions { part: Part::Range(ByteRange::Span(a, Some(b))), ..Default::default() });
        assert_eq!(&got.unwrap().unwrap().data[..], &v[a as usize..=b as usize], "{a}-{b}");
    }
    let head = s.get(b"large", &ReadOptions { part: Part::Nothing, ..Default::default() }).unwrap().unwrap();
    assert_eq!((head.len, head.crc), (1_000_000, crc32c::crc32c(&v)));
    // Replaced: its dead chunks are punched, which check tells from damage.
    s.put(b"large", b"small now", &o).unwrap();
    s.settle();
    drop(s);
    let report = larder_engine::check::check_dir(dir.path(), &Default::default()).unwrap();
    assert!(report.clean(), "{:?}", report.corrupt);
    let s = Store::open(config(dir.path(), None, 0)).unwrap();
    assert_eq!(read(&s, b"large"), Some(b"small now".to_vec()));
}

#[test]
fn a_call_that_may_not_wait_leaves_coding_a_long_value_to_one_that_may() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Zstd), 0)).unwrap();
    let quick = PutOptions { nonblocking: true, ..Default::default() };
    let long = page(100_000, 40);
    assert_eq!(s.put(b"long", &long, &quick).unwrap_err().kind(), ErrorKind::WouldBlock);
    assert_eq!(read(&s, b"long"), None, "nothing written");
    s.put(b"long", &long, &PutOptions::default()).unwrap();
    assert_eq!(read(&s, b"long"), Some(long.clone()));
    let frame = zstd::bulk::compress(&noise(40_000, 2), 1).unwrap();
    assert_eq!(s.put_coded(b"sent", Codec::Zstd, &frame, &quick).unwrap_err().kind(), ErrorKind::WouldBlock);
    // A short one is coded inline.
    s.put(b"short", &page(4096, 1), &quick).unwrap();
    assert_eq!(s.stats().coded_puts, 2);
}

/// `Stats::held`: what the ring holds, by how each value is stored (a large value's chunks
/// each once, its head and tombstones not at all).
#[test]
fn the_ring_tallies_what_it_holds_by_how_it_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(config(dir.path(), Some(Codec::Lz4), 0)).unwrap();
    let large = page(600 << 10, 5);
    for (k, v) in [(&b"p"[..], page(4096, 1)), (b"n", noise(4096, 2)), (b"large", large.clone())] {
        s.put(k, &v, &Default::default()).unwrap();
    }
    s.delete(b"n", &Default::default()).unwrap();
    let held = s.stats().held;
    assert_eq!(held.raw, larder_engine::Tally { values: 1, logical_bytes: 4096, stored_bytes: 4096 });
    assert_eq!((held.lz4.values, held.lz4.logical_bytes), (4, 4096 + large.len() as u64), "{held:?}");
    assert!(held.lz4.stored_bytes * 2 < held.lz4.logical_bytes);
    assert_eq!((held.zstd.values, held.zstd_dictionary.values, held.volumes_unaccounted), (0, 0, 0));
}

/// `Stats::memory_logical_bytes` and `memory_value_bytes`: what the memory tier holds, as sent
/// and as held, through puts, overwrites, deletes and evictions, with either cache.
#[test]
fn the_memory_tier_tallies_what_it_holds() {
    for eviction in [larder_engine::Eviction::Clock, larder_engine::Eviction::Sieve] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), Some(Codec::Zstd), 64 << 20);
        cfg.memory.eviction = eviction;
        let s = Store::open(cfg).unwrap();
        for i in 0..10 {
            s.put(format!("p{i}").as_bytes(), &page(4096, i), &Default::default()).unwrap();
        }
        s.put(b"p3", &page(4096, 33), &Default::default()).unwrap();
        s.put(b"n", &noise(1000, 1), &Default::default()).unwrap();
        s.delete(b"p4", &Default::default()).unwrap();
        let st = s.stats();
        assert_eq!((st.memory_entries, st.memory_logical_bytes), (10, 9 * 4096 + 1000), "{eviction:?}");
        assert!(st.memory_value_bytes < 9 * 4096 / 2 + 1000 && st.memory_value_bytes > 1000, "{eviction:?}");
        assert!(st.memory_value_bytes < st.memory_bytes);
        drop(s);

        // A tier far smaller than what is put: evictions take their values off.
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), Some(Codec::Zstd), 64 << 10);
        cfg.memory.eviction = eviction;
        let s = Store::open(cfg).unwrap();
        for i in 0..500 {
            s.put(format!("p{i}").as_bytes(), &page(4096, i), &Default::default()).unwrap();
        }
        let st = s.stats();
        assert!(st.memory_entries < 500 && st.memory_entries > 0, "{eviction:?}");
        assert_eq!(st.memory_logical_bytes, st.memory_entries * 4096, "{eviction:?}: {st:?}");
        assert!(st.memory_value_bytes <= st.memory_bytes);
    }
}
