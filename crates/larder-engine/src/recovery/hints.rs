//! Hint files at both ends: recovery loads a sealed volume's hint instead of scanning it, and
//! maintenance builds a hint by scanning a sealed volume.

use super::bulk::Bulk;
use super::scan::{scan_volume, ScanRange};
use crate::disk::Ring;
use crate::format::hint::{self, HintEntry};
use crate::format::volume::VOLUME_HEADER_LEN;
use crate::stats::RecoveryProgress;
use std::sync::atomic::Ordering;

/// Gathers a hint's entries (see [`Bulk`]), on every core: each takes a share of them.
pub(super) fn load_hint(
    ring: &Ring,
    bulk: &mut Bulk<'_>,
    slot: usize,
    generation: u32,
    h: &hint::Hint<'_>,
    progress: &RecoveryProgress,
    heads: &mut Vec<(u16, u32, u64)>,
) {
    let found = bulk.lanes(h.len(), |lane, t, lanes| {
        let (mut found, mut told) = (Vec::new(), 0);
        for (n, e) in h.iter_part(t, lanes).enumerate() {
            match e {
                // Expired entries are indexed too: they must still shadow older values of
                // their key, and reads answer them as misses.
                HintEntry::Put { hash, offset, len, head, .. } => {
                    if head {
                        found.push((slot as u16, generation, offset));
                    }
                    lane.put(hash, ring.loc(slot, generation, offset, len as u64));
                }
                HintEntry::Drop { hash, offset, len, .. } => {
                    lane.drop(hash, ring.loc(slot, generation, offset, len as u64))
                }
            }
            if (n + 1).is_multiple_of(1 << 16) {
                progress.records.fetch_add(1 << 16, Ordering::Relaxed);
                told += 1 << 16;
            }
        }
        (found, told)
    });
    let told: u64 = found.iter().map(|f| f.1).sum();
    progress.records.fetch_add(h.len() - told, Ordering::Relaxed);
    heads.extend(found.into_iter().flat_map(|f| f.0));
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
