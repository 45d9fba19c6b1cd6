//! Keys the index cannot tell apart, made on purpose: with the largest ring a location takes
//! 59 bits and an entry keeps only 13 hash bits beyond its shard and home, so among a thousand
//! stored keys another one that agrees with one of them is found in about 2^18 tries. A read
//! of it pays one extra disk read (`collision_reads`) and answers a miss; a write of it evicts
//! the other key (`false_evictions`), which then reads as a miss, never as the wrong value.

use larder_engine::{PutOptions, ReadOptions, Store, StoreConfig};

#[test]
fn indistinguishable_keys_cost_a_read_and_evict_each_other_counted() {
    let dir = tempfile::tempdir().unwrap();
    // 16384 volumes of 32 GiB: the largest location. Volume files are made only as the ring
    // reaches them, and are sparse.
    let cfg = StoreConfig { volume_count: 16384, volume_size: 32 << 30, ..StoreConfig::new(dir.path()) };
    let store = Store::open(cfg).unwrap();
    let stored: Vec<String> = (0..1024).map(|i| format!("stored/{i}")).collect();
    for k in &stored {
        store.put(k.as_bytes(), k.as_bytes(), &PutOptions::default()).unwrap();
    }
    let read = ReadOptions::default();
    let misses = |from: u64, n: u64| {
        let before = store.stats().collision_reads;
        for i in from..from + n {
            let c = format!("candidate/{i}");
            assert!(store.get(c.as_bytes(), &read).unwrap().is_none(), "{c} was never stored");
        }
        store.stats().collision_reads > before
    };
    // Windows of candidates, then the one that paid an extra read, one by one.
    let window = (0..5_000u64).find(|&w| misses(w << 12, 1 << 12));
    let twin = window.and_then(|w| (w << 12..(w + 1) << 12).find(|&i| misses(i, 1))).map(|i| format!("candidate/{i}"));
    let twin = twin.expect("a key that agrees with a stored one on every kept bit");
    assert_eq!(store.stats().false_evictions, 0);
    // Every stored key still reads as itself.
    for k in &stored {
        assert_eq!(store.get(k.as_bytes(), &read).unwrap().unwrap().data.as_ref(), k.as_bytes());
    }
    // Writing the twin takes the other key's entry: counted, and that key becomes a miss.
    store.put(twin.as_bytes(), b"twin", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 1);
    assert_eq!(store.get(twin.as_bytes(), &read).unwrap().unwrap().data.as_ref(), b"twin");
    let lost: Vec<&String> = stored.iter().filter(|k| store.get(k.as_bytes(), &read).unwrap().is_none()).collect();
    assert_eq!(lost.len(), 1, "exactly the key the twin agreed with");
    // Writing it again takes the entry back, counted again; the twin is then the miss.
    store.put(lost[0].as_bytes(), b"back", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 2);
    assert!(store.get(twin.as_bytes(), &read).unwrap().is_none());
    // An overwrite of a key by itself is no false eviction.
    store.put(lost[0].as_bytes(), b"again", &PutOptions::default()).unwrap();
    assert_eq!(store.stats().false_evictions, 2);
}
