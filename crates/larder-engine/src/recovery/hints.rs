//! Hint files at both ends: recovery loads a sealed volume's hint instead of scanning it, and
//! maintenance builds a hint by scanning a sealed volume.

use super::scan::{scan_volume, ScanRange};
use crate::disk::Ring;
use crate::format::hint::{self, HintEntry};
use crate::format::volume::VOLUME_HEADER_LEN;
use crate::index::Index;
use crate::stats::RecoveryProgress;
use std::sync::atomic::Ordering;

/// Applies a hint's entries to the index, in chunks: each chunk is sorted by index shard
/// (stably, so a key's entries keep their order) and applied one shard's run at a time under
/// one lock, so that a shard's table stays in cache while its entries go in, instead of one
/// cache miss and one lock per entry; with several cores, each thread applies a disjoint
/// range of shards.
pub(super) fn load_hint(
    ring: &Ring,
    index: &Index,
    slot: usize,
    generation: u32,
    h: &hint::Hint<'_>,
    progress: &RecoveryProgress,
    heads: &mut Vec<(u16, u32, u64)>,
) {
    use crate::index::{Loc, SHARDS};
    const CHUNK: usize = 1 << 18;
    /// A hint entry, compact: a location to insert, or the number of a key to drop.
    #[derive(Clone, Copy)]
    enum Op {
        Put(Loc),
        Drop(u32),
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let mut entries = h.iter();
    let mut chunk: Vec<(u64, Op)> = Vec::with_capacity(CHUNK.min(h.len() as usize));
    let mut sorted: Vec<(u64, Op)> = Vec::new();
    let mut drops: Vec<Vec<u8>> = Vec::new();
    let mut starts = vec![0usize; SHARDS + 1];
    loop {
        chunk.clear();
        drops.clear();
        for e in entries.by_ref().take(CHUNK) {
            chunk.push(match e {
                // Expired entries are indexed too: they must still shadow older values of their
                // key, and reads answer them as misses.
                HintEntry::Put { hash, offset, len, head, .. } => {
                    if head {
                        heads.push((slot as u16, generation, offset));
                    }
                    (hash, Op::Put(ring.loc(slot, generation, offset, len as u64)))
                }
                HintEntry::Drop { hash, key, .. } => {
                    drops.push(key);
                    (hash, Op::Drop(drops.len() as u32 - 1))
                }
            });
        }
        if chunk.is_empty() {
            return;
        }
        starts.fill(0);
        for &(hash, _) in &chunk {
            starts[Index::shard_of(hash) + 1] += 1;
        }
        for s in 1..=SHARDS {
            starts[s] += starts[s - 1];
        }
        let mut next = starts.clone();
        sorted.clear();
        sorted.resize(chunk.len(), (0, Op::Drop(0)));
        for &item in &chunk {
            let s = Index::shard_of(item.0);
            sorted[next[s]] = item;
            next[s] += 1;
        }
        let (sorted, drops, starts) = (&sorted, &drops, &starts);
        let apply = |shards: std::ops::Range<usize>| {
            let mut puts: Vec<(u64, Loc)> = Vec::new();
            for s in shards {
                for &(hash, op) in &sorted[starts[s]..starts[s + 1]] {
                    match op {
                        Op::Put(loc) => puts.push((hash, loc)),
                        Op::Drop(k) => {
                            // Earlier puts of the shard first: the drop may be of one of them.
                            index.insert_batch(&puts);
                            puts.clear();
                            ring.drop_if_key(index, hash, &drops[k as usize]);
                        }
                    }
                }
                index.insert_batch(&puts);
                puts.clear();
            }
        };
        if threads == 1 || chunk.len() < 1 << 16 {
            apply(0..SHARDS);
        } else {
            let part = |t: usize| t * SHARDS / threads..(t + 1) * SHARDS / threads;
            std::thread::scope(|s| {
                for t in 1..threads {
                    s.spawn(move || apply(part(t)));
                }
                apply(part(0));
            });
        }
        progress.records.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}

/// Scans the first `len` bytes of a volume and hands `f` each record's hint entry and store
/// time, in volume order (nothing is collected: the caller streams them). `values_checked`: see
/// [`ScanRange::values_checked`].
pub(crate) fn scan_hint_entries(
    ring: &Ring,
    file: &dyn crate::io::FileIo,
    len: u64,
    generation: u32,
    salt: u32,
    values_checked: bool,
    mut f: impl FnMut(HintEntry, u64),
) -> std::io::Result<()> {
    let range =
        ScanRange { start: VOLUME_HEADER_LEN, end: len, generation, salt, torn_tail_possible: false, values_checked };
    scan_volume(file, range, |ev| {
        if let Some(entry) = ev.hint_entry(ring.hash(ev.key())) {
            f(entry, ev.header().stored_ms)
        }
    })?;
    Ok(())
}
