use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn geo() -> Geometry {
    Geometry::new(16, 1 << 30)
}

fn loc(n: u64) -> Loc {
    Loc { slot: (n % 16) as u16, tag: (n % 8) as u8, offset: (n % (1 << 27)) * 8, class: (n % 256) as u16, hits: 0 }
}

/// xorshift: hashes spread over all bits.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn pack_round_trips_extremes() {
    let big = Geometry::new(MAX_SLOTS as u32, MAX_VOLUME_SIZE);
    assert_eq!(big.loc_bits(), 59);
    assert_eq!(big.remainder_bits(), 13);
    assert_eq!(geo().loc_bits(), 44, "16 volumes of 1 GiB");
    assert_eq!(geo().remainder_bits(), 28);
    for (g, l) in [
        (geo(), Loc { slot: 0, tag: 0, offset: 0, class: 0, hits: 0 }),
        (geo(), Loc { slot: 15, tag: 7, offset: (1 << 30) - 8, class: 255, hits: MAX_HITS }),
        (big, Loc { slot: (MAX_SLOTS - 1) as u16, tag: 7, offset: MAX_VOLUME_SIZE - 8, class: 255, hits: MAX_HITS }),
    ] {
        assert_eq!(g.unpack(g.pack(l)), l);
    }
}

/// A model check against HashMap with every key in three shards, so tables grow from nothing
/// through many rebuilds (each moving remainder bits into quotients) and runs are long, with
/// many deletes, which is where backward-shift deletion goes wrong if it goes wrong.
#[test]
fn behaves_like_a_map_under_churn() {
    let idx = Index::new(geo());
    let mut model: HashMap<u64, Loc> = HashMap::new();
    let mut keys = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for step in 0..300_000u64 {
        let r = next(&mut x);
        let hash = if keys.len() < 40_000 || r.is_multiple_of(3) {
            let h = (r % 3) << 62 | next(&mut x) >> 2;
            keys.push(h);
            h
        } else {
            keys[(r >> 8) as usize % keys.len()]
        };
        match r % 5 {
            0..=2 => assert_eq!(idx.insert(hash, loc(step)), model.insert(hash, loc(step))),
            3 => {
                if let Some(l) = idx.get(hash) {
                    assert!(idx.remove_if_eq(hash, l));
                    model.remove(&hash);
                }
            }
            _ => assert_eq!(idx.get(hash), model.get(&hash).copied()),
        }
    }
    assert_eq!(idx.len(), model.len() as u64);
    assert_eq!(idx.dropped(), 0);
    for (h, l) in &model {
        assert_eq!(idx.get(*h), Some(*l));
    }
    let removed = idx.retain(|l| l.slot % 2 == 0);
    assert_eq!(removed as usize, model.values().filter(|l| l.slot % 2 == 1).count());
    for (h, l) in &model {
        assert_eq!(idx.get(*h), (l.slot % 2 == 0).then_some(*l));
    }
}

/// Grown one entry at a time, every table stays between 85% and 95% full.
#[test]
fn tables_stay_full() {
    let idx = Index::new(geo());
    let mut x = 7u64;
    for i in 0..2_000_000u64 {
        idx.insert(next(&mut x), loc(i));
    }
    for s in idx.shards.iter() {
        let t = s.read();
        let load = t.len as f64 / t.cap() as f64;
        assert!((0.85..=0.951).contains(&load), "load {load} with {} entries", t.len);
    }
}

#[test]
fn fit_shrinks_and_keeps_every_entry() {
    let idx = Index::new(geo());
    let mut x = 11u64;
    let hashes: Vec<u64> = (0..1_000_000).map(|_| next(&mut x)).collect();
    for (i, &h) in hashes.iter().enumerate() {
        idx.insert(h, loc(i as u64));
    }
    // Three quarters gone: the tables are about 23% full.
    assert_eq!(idx.retain(|l| l.offset.is_multiple_of(32)), 750_000);
    let before = idx.bytes();
    idx.fit();
    assert!(idx.bytes() * 2 < before, "fit shrank {before} to {}", idx.bytes());
    assert_eq!((idx.len(), idx.dropped()), (250_000, 0));
    for (i, &h) in hashes.iter().enumerate() {
        let l = loc(i as u64);
        assert_eq!(idx.get(h), l.offset.is_multiple_of(32).then_some(l));
    }
}

/// Keys that agree on every bit the index keeps share an entry: the later one evicts the
/// earlier, and a read of either finds the later key's location (the caller then compares
/// the record's key).
#[test]
fn keys_the_index_cannot_tell_apart_share_an_entry() {
    let idx = Index::new(geo());
    let a = 0xABCD_EF01_2345_6780;
    let b = a | 1; // differs only in the last bit, which no entry keeps
    assert_eq!(idx.insert(a, loc(1)), None);
    assert_eq!(idx.insert(b, loc(2)), Some(loc(1)));
    assert_eq!(idx.get(a), Some(loc(2)));
    assert_eq!(idx.len(), 1);
    // A key that differs in a kept bit does not.
    let c = a ^ (1 << 40);
    assert_eq!(idx.insert(c, loc(3)), None);
    assert_eq!(idx.get(b), Some(loc(2)));
}

/// With the largest ring, an entry keeps 13 bits; a table grown from one entry to 2^14 times
/// as many gives up the entries whose bits ran out: counted, and never answered for another
/// key.
#[test]
fn entries_whose_bits_run_out_are_dropped_and_counted() {
    let idx = Index::new(Geometry::new(MAX_SLOTS as u32, MAX_VOLUME_SIZE));
    let first = 0x0000_1234_5678_9ABC; // shard 0
    idx.insert(first, loc(0));
    let mut x = 5u64;
    let mut model = HashMap::new();
    for i in 1..300_000u64 {
        let h = next(&mut x) >> 12; // shard 0 too
        idx.insert(h, loc(i));
        model.insert(h, loc(i));
    }
    assert!(idx.dropped() > 0, "the first entries lose their last bits");
    // Some keys also evicted others: 300,000 keys in one shard tell apart by about 31 bits.
    assert!(idx.len() + idx.dropped() <= model.len() as u64 + 1);
    assert_ne!(idx.get(first), Some(loc(0)), "dropped");
    let mut found = 0;
    for (h, l) in &model {
        let got = idx.get(*h);
        // Never another location than this key's or another key's that shares its bits.
        assert!(got.is_none_or(|g| g == *l || model.values().any(|m| *m == g)));
        found += (got == Some(*l)) as usize;
    }
    assert!(found as f64 > 0.99 * model.len() as f64, "{found} of {}", model.len());
}

#[test]
fn remove_if_eq_refuses_a_replaced_entry() {
    let idx = Index::new(geo());
    idx.insert(42, loc(1));
    idx.insert(42, loc(2));
    assert!(!idx.remove_if_eq(42, loc(1)));
    assert!(idx.remove_if_eq(42, loc(2)));
    assert_eq!(idx.len(), 0);
}

#[test]
fn read_counts_saturate_and_do_not_change_the_place() {
    let idx = Index::new(geo());
    let at = loc(7);
    idx.insert(9, at);
    for _ in 0..5 {
        let seen = idx.get(9).unwrap();
        idx.count_read(9, seen, 2);
    }
    let now = idx.get(9).unwrap();
    assert_eq!(now.hits, 2, "capped at the asked count");
    assert!(now.same_place(at) && now != at);
    idx.count_read(9, now, MAX_HITS + 5);
    assert_eq!(idx.get(9).unwrap().hits, MAX_HITS);
    // A stale location is not counted, and comparisons ignore counts.
    idx.count_read(9, loc(8), 3);
    assert!(!idx.replace_if_eq(9, loc(8), loc(10)));
    assert!(idx.replace_if_eq(9, at, loc(10)));
    assert_eq!(idx.get(9), Some(loc(10)));
    assert!(idx.remove_if_eq(9, Loc { hits: 1, ..loc(10) }));
}

/// Merging ops into a shard (recovery's path) agrees with applying them one by one, into an
/// empty table, into a full one, and into one of another size.
#[test]
fn merge_shard_agrees_with_single_inserts() {
    let (merged, single) = (Index::new(geo()), Index::new(geo()));
    let mut x = 3u64;
    let mut all: Vec<u64> = Vec::new();
    for round in 0..4u64 {
        let mut ops = Vec::new();
        for i in 0..20_000u64 {
            let r = next(&mut x);
            // New hashes of shard 5, old ones again, and drops of old ones.
            let h = if all.is_empty() || r.is_multiple_of(3) {
                let h = 5 << 52 | next(&mut x) >> 12;
                all.push(h);
                h
            } else {
                all[(r >> 8) as usize % all.len()]
            };
            // Ops name their records, newest last: with every slot ranked alike, by offset.
            let l = loc(round * 100_000 + i);
            if r % 7 == 1 {
                ops.push((h, merged.pack(l) | DROP));
                if let Some(l) = single.get(h) {
                    single.remove_if_eq(h, l);
                }
            } else {
                ops.push((h, merged.pack(l)));
                single.insert(h, l);
            }
        }
        // In any order.
        ops.reverse();
        merged.merge_shard(5, &mut ops, None, &[0; 16]);
        assert_eq!(merged.len(), single.len(), "round {round}");
        for h in &all {
            assert_eq!(merged.get(*h), single.get(*h));
        }
    }
    assert_eq!(merged.dropped(), 0);
    merged.fit();
    let t = merged.shards[5].read();
    assert!(t.len * 100 >= t.cap() * 85, "merged and fitted: {} in {}", t.len, t.cap());
}

#[derive(Debug, Clone)]
enum Op {
    Insert(usize, u64),
    Remove(usize),
    Cas(usize, Option<u64>, Option<u64>),
    Count(usize),
    Retain(u16),
    Merge(Vec<(usize, Option<u64>)>),
    Fit,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..64usize;
    prop_oneof![
        4 => (k.clone(), any::<u64>()).prop_map(|(k, l)| Op::Insert(k, l)),
        2 => k.clone().prop_map(Op::Remove),
        1 => (k.clone(), proptest::option::of(any::<u64>()), proptest::option::of(any::<u64>()))
            .prop_map(|(k, a, b)| Op::Cas(k, a, b)),
        1 => k.prop_map(Op::Count),
        1 => (0..16u16).prop_map(Op::Retain),
        1 => proptest::collection::vec((0..64usize, proptest::option::of(any::<u64>())), 0..40).prop_map(Op::Merge),
        1 => Just(Op::Fit),
    ]
}

proptest! {
    /// Any sequence of operations on keys of one or two shards agrees with a map.
    #[test]
    fn agrees_with_a_map(seed in any::<u64>(), ops in proptest::collection::vec(op(), 1..300)) {
        let idx = Index::new(geo());
        let mut x = seed | 1;
        let keys: Vec<u64> = (0..64).map(|i| (i % 2) << 63 | next(&mut x) >> 1).collect();
        let mut model: HashMap<u64, Loc> = HashMap::new();
        let mut seq = 1 << 20;
        for op in ops {
            match op {
                Op::Insert(k, l) => prop_assert_eq!(idx.insert(keys[k], loc(l)), model.insert(keys[k], loc(l))),
                Op::Remove(k) => {
                    let expected = model.get(&keys[k]).copied().unwrap_or(loc(u64::MAX));
                    let did = idx.remove_if_eq(keys[k], expected);
                    prop_assert_eq!(did, model.remove(&keys[k]).is_some());
                }
                Op::Cas(k, a, b) => {
                    let (a, b) = (a.map(loc), b.map(loc));
                    let now = model.get(&keys[k]).map(|l| Loc { hits: 0, ..*l });
                    let ok = idx.compare_and_set(keys[k], a, b);
                    prop_assert_eq!(ok, now == a);
                    if ok {
                        match b {
                            Some(l) => model.insert(keys[k], l),
                            None => model.remove(&keys[k]),
                        };
                    }
                }
                Op::Count(k) => {
                    if let Some(l) = model.get_mut(&keys[k]) {
                        idx.count_read(keys[k], *l, MAX_HITS);
                        l.hits = (l.hits + 1).min(MAX_HITS);
                    }
                }
                Op::Retain(s) => {
                    let removed = idx.retain(|l| l.slot != s);
                    let before = model.len();
                    model.retain(|_, l| l.slot != s);
                    prop_assert_eq!(removed as usize, before - model.len());
                }
                Op::Merge(batch) => {
                    // Per shard; ops name records newer than any before (by offset), and come
                    // in any order.
                    for shard in [0, SHARDS / 2] {
                        let mut ops = Vec::new();
                        for &(k, l) in &batch {
                            if Index::shard_of(keys[k]) != shard {
                                continue;
                            }
                            seq += 1;
                            let at = Loc { slot: 0, tag: 0, offset: seq * 8, class: l.unwrap_or(0) as u16 % 256, hits: 0 };
                            match l {
                                Some(_) => {
                                    ops.push((keys[k], idx.pack(at)));
                                    model.insert(keys[k], at);
                                }
                                None => {
                                    ops.push((keys[k], idx.pack(at) | DROP));
                                    model.remove(&keys[k]);
                                }
                            }
                        }
                        ops.reverse();
                        idx.merge_shard(shard, &mut ops, None, &[0; 16]);
                    }
                }
                Op::Fit => idx.fit(),
            }
            prop_assert_eq!(idx.len(), model.len() as u64);
        }
        for (i, h) in keys.iter().enumerate() {
            prop_assert_eq!(idx.get(*h), model.get(h).copied(), "key {}", i);
        }
    }
}

#[derive(Debug, Clone)]
enum TwinOp {
    Put(usize, u64),
    /// A delete as the store makes it: it removes the entry only where it names the key's own
    /// record (the store compares the record's key).
    Delete(usize),
    /// Recovery's ops, newest last: a put (`Some`) or a drop of each key.
    Merge(Vec<(usize, bool)>),
    Fit,
}

fn twin_op() -> impl Strategy<Value = TwinOp> {
    let k = 0..48usize;
    prop_oneof![
        4 => (k.clone(), any::<u64>()).prop_map(|(k, l)| TwinOp::Put(k, l)),
        2 => k.prop_map(TwinOp::Delete),
        2 => proptest::collection::vec((0..48usize, any::<bool>()), 0..40).prop_map(TwinOp::Merge),
        1 => Just(TwinOp::Fit),
    ]
}

proptest! {
    /// Keys in groups of three that no entry can tell apart (their hashes differ only in bits
    /// no table keeps) share one entry, modelled as one cell per group holding its owner and
    /// location. Live writes take the cell; a delete empties it only when it names the key's
    /// own record; recovery's merge hands each cell to its newest put, and a drop empties a
    /// cell only of what was there before the merge (never another key's put of the same
    /// merge): so a key whose newest op was a drop is never found at its old record.
    #[test]
    fn twins_share_an_entry_through_puts_deletes_and_merges(
        seed in any::<u64>(),
        ops in proptest::collection::vec(twin_op(), 1..200),
    ) {
        let idx = Index::new(geo());
        let mut x = seed | 1;
        // 16 groups in shards 0 and 2048; members differ in their low 16 bits.
        let bases: Vec<u64> = (0..16u64).map(|g| (g % 2) << 63 | (next(&mut x) >> 12) & !0xFFFF).collect();
        let keys: Vec<u64> = (0..48).map(|k| bases[k / 3] | ((k % 3) as u64 + 1)).collect();
        let mut cells: Vec<Option<(usize, Loc)>> = vec![None; 16];
        let mut seq = 1u64 << 20;
        for op in ops {
            match op {
                TwinOp::Put(k, l) => {
                    let before = cells[k / 3].map(|c| c.1);
                    prop_assert_eq!(idx.insert(keys[k], loc(l)), before);
                    cells[k / 3] = Some((k, loc(l)));
                }
                TwinOp::Delete(k) => {
                    let seen = idx.get(keys[k]);
                    prop_assert_eq!(seen, cells[k / 3].map(|c| c.1));
                    if let Some((owner, at)) = cells[k / 3] {
                        if owner == k {
                            prop_assert!(idx.remove_if_eq(keys[k], at));
                            cells[k / 3] = None;
                        }
                    }
                }
                TwinOp::Merge(batch) => {
                    let mut newest: HashMap<usize, (bool, Loc)> = HashMap::new();
                    let mut per_shard: [Vec<(u64, u64)>; 2] = [Vec::new(), Vec::new()];
                    for &(k, put) in &batch {
                        seq += 1;
                        let at = Loc { slot: 0, tag: 0, offset: seq * 8, class: 0, hits: 0 };
                        let v = if put { idx.pack(at) } else { idx.pack(at) | DROP };
                        per_shard[(keys[k] >> 63) as usize].push((keys[k], v));
                        newest.insert(k, (put, at));
                    }
                    for (g, cell) in cells.iter_mut().enumerate() {
                        let members: Vec<(usize, bool, Loc)> =
                            newest.iter().filter(|(k, _)| **k / 3 == g).map(|(k, (p, l))| (*k, *p, *l)).collect();
                        let put = members.iter().filter(|m| m.1).max_by_key(|m| m.2.offset);
                        if let Some(&(k, _, l)) = put {
                            *cell = Some((k, l));
                        } else if !members.is_empty() {
                            *cell = None;
                        }
                    }
                    for (s, mut ops) in per_shard.into_iter().enumerate() {
                        ops.reverse();
                        idx.merge_shard(s * SHARDS / 2, &mut ops, None, &[0; 16]);
                    }
                }
                TwinOp::Fit => idx.fit(),
            }
            prop_assert_eq!(idx.len(), cells.iter().flatten().count() as u64);
        }
        for (k, h) in keys.iter().enumerate() {
            prop_assert_eq!(idx.get(*h), cells[k / 3].map(|c| c.1), "key {}", k);
        }
    }
}
