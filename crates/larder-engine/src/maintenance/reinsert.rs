//! Reinsertion: before the ring overwrites its oldest volume, the entries of it that were
//! read often enough are copied forward to the active volume, so that hot keys survive.

use crate::clock::now_ms;
use crate::disk::{Append, Disk, Fetch, Record};
use crate::format::record;
use crate::index::{Loc, MAX_HITS, TAG_MASK};
use crate::memory::Memory;
use std::sync::atomic::Ordering;

/// Copies the entries of `slot` (the next volume the ring overwrites) that were read at
/// least `reinsert_min_hits` times to the active volume, hottest first within the byte
/// budget, so that they survive the overwrite. A put or delete of the key since wins.
pub(crate) fn reinsert(disk: &Disk, memory: Option<&Memory>, slot: usize, generation: u32) {
    let c = &disk.ring.counters;
    let min = disk.ring.cfg.reinsert_min_hits.min(MAX_HITS);
    let tag = (generation & TAG_MASK) as u8;
    let mut cands: Vec<Loc> = Vec::new();
    disk.index.for_each(|l| {
        if l.slot as usize == slot && l.tag == tag && l.hits >= min {
            cands.push(l);
        }
    });
    c.reinsert_candidates.fetch_add(cands.len() as u64, Ordering::Relaxed);
    cands.sort_unstable_by_key(|&l| (std::cmp::Reverse(l.hits), l.offset));
    let budget = (disk.ring.cfg.volume_size as f64 * disk.ring.cfg.reinsert_share.clamp(0.0, 1.0)) as u64;
    let (mut spent, now) = (0, now_ms());
    let (mut batch, mut batch_bytes) = (Vec::new(), 0);
    for (i, &loc) in cands.iter().enumerate() {
        // The index keeps no hash: the record's key gives it (a damaged record, answered as
        // gone, stays for the reader that meets it).
        let r = match disk.fetch(0, loc, false) {
            // A large value's head is not copied: its chunks are as old as it is, and die with
            // their volumes whatever happens to the head.
            Ok(Fetch::Record(r)) if !r.header.is_tombstone() && !r.header.is_head() && !r.dead(disk, now) => r,
            _ => {
                c.reinsert_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        // Memory answers for a key it holds: the disk's budget goes to keys it does not.
        if memory.is_some_and(|m| m.contains(r.key())) {
            c.reinsert_in_memory.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        spent += record::padded(r.header.record_len());
        if spent > budget {
            c.reinsert_over_budget.fetch_add((cands.len() - i) as u64, Ordering::Relaxed);
            break;
        }
        batch_bytes += r.buf.len();
        batch.push((disk.ring.hash(r.key()), loc, r));
        // Small batches: puts wait for the writer lock while a batch is appended.
        if batch_bytes >= 256 << 10 {
            copy_forward(disk, &mut batch);
            batch_bytes = 0;
        }
    }
    copy_forward(disk, &mut batch);
}

fn copy_forward(disk: &Disk, batch: &mut Vec<(u64, Loc, Record)>) {
    if batch.is_empty() {
        return;
    }
    let c = &disk.ring.counters;
    let mut w = disk.writer.lock();
    let mut left = batch.len() as u64;
    for (hash, old, r) in batch.drain(..) {
        left -= 1;
        // Under the writer lock no put or delete of the key can come between this check
        // and the replacement.
        if !disk.index.get(hash).is_some_and(|l| l.same_place(old)) {
            c.reinsert_skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let rec =
            Append { header: r.header, key: r.key(), meta: r.meta(), value: &[r.value()], value_crc: r.value_crc };
        match disk.append(&mut w, true, &rec) {
            Ok(Some((pos, new))) => {
                disk.index.replace_if_eq(hash, old, new);
                c.reinserted.fetch_add(1, Ordering::Relaxed);
                c.reinserted_bytes.fetch_add(pos.size, Ordering::Relaxed);
            }
            Ok(None) => unreachable!("an append that may wait completes"),
            Err(e) => {
                tracing::warn!(error = %e, "reinsertion stopped");
                c.reinsert_skipped.fetch_add(1 + left, Ordering::Relaxed);
                return;
            }
        }
    }
}
