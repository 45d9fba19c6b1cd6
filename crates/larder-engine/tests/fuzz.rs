//! Property tests of decoding and recovery: arbitrary or damaged bytes never panic the
//! decoders or recovery, and never become an index entry whose record fails its checksum.
//!
//! `LARDER_FUZZ_CASES` sets the number of cases of the volume-scan property (default 10,000);
//! the whole-store property runs a tenth as many (each opens a store).

use larder_engine::check::{scan_volume, ScanEvent, ScanRange};
use larder_engine::format::record::{self, Header, FLAG_TOMBSTONE};
use larder_engine::format::volume::{VolumeHeader, VOLUME_HEADER_LEN};
use larder_engine::format::{hint, meta};
use larder_engine::{DeleteOptions, FsyncPolicy, PutOptions, ReadOptions, Store, StoreConfig};
use proptest::prelude::*;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

fn cases() -> u32 {
    std::env::var("LARDER_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

const SALT: u32 = 0x5eed;
const GENERATION: u32 = 3;

/// A volume image with `n` valid records (some tombstones), and the offsets they start at.
fn valid_volume(seed: u64, n: usize) -> Vec<u8> {
    let vh = VolumeHeader { slot: 0, generation: GENERATION, sequence: 1, salt: SALT, created_ms: 1, dir_id: [1; 16] };
    let mut out = vh.encode().to_vec();
    for i in 0..n {
        let x = seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64);
        let key = format!("key-{}", x % 7);
        let value: Vec<u8> = (0..(x % 300) as usize).map(|j| (j as u64 ^ x) as u8).collect();
        let flags = if x.is_multiple_of(5) { FLAG_TOMBSTONE } else { 0 };
        let h = Header {
            flags,
            key_len: 0,
            value_len: 0,
            meta_len: 0,
            generation: GENERATION,
            stored_ms: 1,
            expiry_ms: 0,
            crc: 0,
        };
        let value = if flags == FLAG_TOMBSTONE { Vec::new() } else { value };
        record::encode_into(&mut out, &h, key.as_bytes(), b"", &value, SALT);
    }
    out
}

#[derive(Debug, Clone)]
enum Damage {
    Flip {
        at: usize,
        bit: u8,
    },
    Zero {
        at: usize,
        len: usize,
    },
    Garbage {
        at: usize,
        bytes: Vec<u8>,
    },
    Truncate {
        to: usize,
    },
    /// Copies a stretch elsewhere: whole valid records can turn up at other offsets.
    Copy {
        from: usize,
        to: usize,
        len: usize,
    },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
        (any::<usize>(), 1usize..200).prop_map(|(at, len)| Damage::Zero { at, len }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Damage::Garbage { at, bytes }),
        any::<usize>().prop_map(|to| Damage::Truncate { to }),
        (any::<usize>(), any::<usize>(), 1usize..400).prop_map(|(from, to, len)| Damage::Copy { from, to, len }),
    ]
}

/// Applies `d` to `v`, leaving the first `keep` bytes (a volume header) alone.
fn apply(v: &mut Vec<u8>, d: &Damage, keep: usize) {
    if v.len() <= keep {
        return;
    }
    let span = v.len() - keep;
    match d {
        Damage::Flip { at, bit } => v[keep + at % span] ^= 1 << bit,
        Damage::Zero { at, len } => {
            let s = keep + at % span;
            let e = (s + len).min(v.len());
            v[s..e].fill(0);
        }
        Damage::Garbage { at, bytes } => {
            let s = keep + at % span;
            let e = (s + bytes.len()).min(v.len());
            v[s..e].copy_from_slice(&bytes[..e - s]);
        }
        Damage::Truncate { to } => v.truncate(keep + to % span),
        Damage::Copy { from, to, len } => {
            let s = keep + from % span;
            let t = keep + (to % span) / 8 * 8;
            let n = (*len).min(v.len() - s).min(v.len().saturating_sub(t));
            let piece = v[s..s + n].to_vec();
            v[t..t + n].copy_from_slice(&piece);
        }
    }
}

fn temp_file(bytes: &[u8]) -> std::fs::File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f
}

/// Scans `bytes` as a volume and checks every record reported valid really is.
fn scan_checks(bytes: &[u8], torn_tail_possible: bool) -> Result<(), TestCaseError> {
    let f = temp_file(bytes);
    let range = ScanRange {
        start: VOLUME_HEADER_LEN,
        end: bytes.len() as u64,
        generation: GENERATION,
        salt: SALT,
        torn_tail_possible,
        values_checked: true,
    };
    let mut valid = Vec::new();
    let outcome = scan_volume(&f, range, |e| {
        if let ScanEvent::Valid { offset, header, key } = e {
            valid.push((offset, header, key.to_vec()));
        }
    })
    .unwrap();
    // The end of the last valid record, padding included: the padding may be cut off.
    prop_assert!(outcome.valid_end <= record::padded(bytes.len() as u64));
    for (offset, header, key) in valid {
        let at = offset as usize;
        let len = header.record_len() as usize;
        prop_assert!(
            at.is_multiple_of(8) && at + len <= bytes.len(),
            "record at {} of {} bytes out of bounds",
            at,
            len
        );
        let r = record::decode(&bytes[at..at + len], SALT);
        prop_assert!(r.is_ok(), "scan reported a record at {} that fails to decode: {:?}", at, r.err());
        let r = r.unwrap();
        prop_assert_eq!(r.key, &key[..]);
        prop_assert_eq!(r.header.generation, GENERATION);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Valid volumes with damage, and pure garbage after a sound header, in the active
    /// (torn tail possible) and sealed modes.
    #[test]
    fn scanning_damaged_volumes_reports_only_sound_records(
        seed in any::<u64>(),
        n in 0usize..40,
        damages in prop::collection::vec(damage(), 0..6),
        garbage in prop::collection::vec(any::<u8>(), 0..2048),
        pure_garbage in any::<bool>(),
        torn in any::<bool>(),
    ) {
        let mut v = if pure_garbage {
            let mut v = valid_volume(seed, 0);
            v.extend_from_slice(&garbage);
            v
        } else {
            valid_volume(seed, n)
        };
        for d in &damages {
            apply(&mut v, d, VOLUME_HEADER_LEN as usize);
        }
        scan_checks(&v, torn)?;
    }

    /// The decoders take any bytes without panicking.
    #[test]
    fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), salt in any::<u32>(), len in any::<u64>()) {
        let _ = record::decode(&bytes, salt);
        let _ = record::decode_prefix(&bytes, salt);
        let _ = record::decode_header(&bytes, salt);
        let m = meta::Meta::parse(&bytes);
        let _ = m.blocks(len % (1 << 40));
        let _ = VolumeHeader::decode(&bytes);
        let vh = VolumeHeader { slot: 0, generation: 1, sequence: 1, salt, created_ms: 0, dir_id: [0; 16] };
        let _ = hint::decode(&bytes, &vh, len);
        // A sound record prefix followed by arbitrary bytes: decoded only if they verify.
        let mut rec = Vec::new();
        let h = Header { flags: 0, key_len: 0, value_len: 0, meta_len: 0, generation: 1, stored_ms: 0, expiry_ms: 0, crc: 0 };
        record::encode_into(&mut rec, &h, b"k", b"", &bytes, salt);
        let cut = (len as usize) % (rec.len() + 1);
        if let Ok(r) = record::decode(&rec[..cut], salt) {
            prop_assert_eq!(&rec[r.value_range.0..r.value_range.1], &bytes[..]);
        }
    }
}

/// A store's data directory after a known history and a crash: (manifest, active volume
/// bytes, every value each key ever had).
struct Pristine {
    dir: tempfile::TempDir,
    versions: HashMap<String, Vec<Vec<u8>>>,
}

fn pristine() -> &'static Pristine {
    static P: OnceLock<Pristine> = OnceLock::new();
    P.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            volume_size: 1 << 20,
            volume_count: 2,
            fsync: FsyncPolicy::Never,
            ..StoreConfig::new(dir.path())
        };
        let store = Store::open(cfg).unwrap();
        let mut versions: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
        for i in 0..120u64 {
            let key = format!("k{}", i % 40);
            if i.is_multiple_of(9) {
                store.delete(key.as_bytes(), &DeleteOptions::default()).unwrap();
                continue;
            }
            let value: Vec<u8> = (0..(i * 53 % 2000) as usize).map(|j| (j as u64 * 31 + i) as u8).collect();
            store.put(key.as_bytes(), &value, &PutOptions::default()).unwrap();
            versions.entry(key).or_default().push(value);
        }
        drop(store);
        // As after a crash: without the checkpoint a graceful close writes, recovery scans the
        // active volume (a checkpoint is trusted as a sealed volume's hint is, and damage
        // under it is caught when read).
        std::fs::remove_file(dir.path().join("vol-00000.hint")).unwrap();
        Pristine { dir, versions }
    })
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "LOCK" {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / 10).max(1), failure_persistence: None, ..ProptestConfig::default() })]

    /// A damaged active volume: the store opens, and every key reads as a value it once had
    /// or as absent, with no index entry pointing at a record that fails its checksum.
    #[test]
    fn recovery_of_a_damaged_volume_serves_only_written_values(damages in prop::collection::vec(damage(), 1..5)) {
        let p = pristine();
        let dir = tempfile::tempdir().unwrap();
        copy_dir(p.dir.path(), dir.path());
        let vol = dir.path().join("vol-00000.lrv");
        let mut bytes = std::fs::read(&vol).unwrap();
        for d in &damages {
            apply(&mut bytes, d, 0);
        }
        std::fs::write(&vol, &bytes).unwrap();
        let store = Store::open(StoreConfig { volume_size: 1 << 20, volume_count: 2, fsync: FsyncPolicy::Never, ..StoreConfig::new(dir.path()) }).unwrap();
        for (key, versions) in &p.versions {
            if let Some(v) = store.get(key.as_bytes(), &ReadOptions::default()).unwrap() {
                prop_assert!(versions.iter().any(|w| w[..] == v.data[..]), "{} read bytes never written for it", key);
            }
        }
        prop_assert_eq!(store.stats().corrupt_reads, 0, "an index entry pointed at a damaged record");
        prop_assert!(store.stats().keys <= p.versions.len() as u64);
    }
}
