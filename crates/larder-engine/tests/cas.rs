//! `StoreConfig::verify_cas`: a content-addressed key takes only the value it names, however
//! the value is written (one put, a put in parts, a streamed value of many chunks), and a
//! refused write leaves the key's previous value in place.

use larder_engine::{ErrorKind, FsyncPolicy, Part, PutOptions, Store, StoreConfig};
use sha2::{Digest, Sha256};

fn open(dir: &std::path::Path, verify_cas: bool) -> Store {
    Store::open(StoreConfig {
        volume_size: 4 << 20,
        volume_count: 8,
        max_value_size: 1 << 20,
        chunk_size: 64 << 10,
        fsync: FsyncPolicy::Never,
        verify_cas,
        ..StoreConfig::new(dir)
    })
    .unwrap()
}

fn key_of(value: &[u8]) -> Vec<u8> {
    let hex: String = Sha256::digest(value).iter().map(|b| format!("{b:02x}")).collect();
    format!("bazel/cas/{hex}").into_bytes()
}

fn get(s: &Store, key: &[u8]) -> Option<Vec<u8>> {
    let mut r = s.reader(key, Part::Whole).unwrap()?;
    let mut out = Vec::new();
    while let Some(piece) = r.next_piece().unwrap() {
        out.extend_from_slice(&piece);
    }
    Some(out)
}

#[test]
fn only_the_value_a_key_names_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), true);
    let o = PutOptions::default();
    let good = b"the object".to_vec();
    let key = key_of(&good);
    let e = s.put(&key, b"another object", &o).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid);
    assert_eq!(get(&s, &key), None, "a refused write stores nothing");
    s.put_parts(&key, &[b"the ", b"object"], &o).unwrap();
    assert_eq!(get(&s, &key), Some(good.clone()));
    assert_eq!(s.put(&key, b"tampered", &o).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(get(&s, &key), Some(good), "a refused write leaves the value it would replace");
    // Other keys, action results among them, are not content-addressed.
    s.put(b"bazel/ac/0000000000000000000000000000000000000000000000000000000000000000", b"x", &o).unwrap();
    assert_eq!(s.stats().cas_refused, 2);

    // A value of many chunks, written as it arrives: the check spans every chunk.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let key = key_of(&big);
    let mut w = s.writer(&key, &o).unwrap();
    for piece in big.chunks(10_000) {
        w.write(piece).unwrap();
    }
    w.finish().unwrap();
    assert_eq!(get(&s, &key).as_deref(), Some(&big[..]));
    let mut bad = big.clone();
    bad[299_999] ^= 1; // in the last chunk
    let mut w = s.writer(&key_of(&[1]), &o).unwrap();
    w.write(&bad).unwrap();
    assert_eq!(w.finish().unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(get(&s, &key_of(&[1])), None);
    // One put of many chunks is checked before any of them is written.
    assert_eq!(s.put(&key_of(b"y"), &big, &o).unwrap_err().kind(), ErrorKind::Invalid);
    assert_eq!(s.stats().cas_refused, 4);
}

#[test]
fn without_the_setting_any_value_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path(), false);
    let key = key_of(b"named");
    s.put(&key, b"not what it names", &PutOptions::default()).unwrap();
    assert_eq!(get(&s, &key).as_deref(), Some(&b"not what it names"[..]));
}
