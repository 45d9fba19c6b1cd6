//! Rebuilding the index at start, and the record scanner it shares with hint building.
//!
//! Rules (DESIGN §4): volumes are replayed oldest to newest by their header's sequence; a
//! sealed volume loads from its hint file when the hint matches it exactly, otherwise it is
//! scanned record by record. While scanning, a damaged record that has valid records after it
//! is skipped and counted, and if its header and key are sound its key is dropped from the
//! index (an older value of that key must not come back in its place); the tail after the last
//! valid record is truncated; a record of another generation ends the scan (it is data from
//! the slot's previous turn of the ring).

mod bulk;
mod hints;
pub(crate) mod scan;

pub(crate) use hints::scan_hint_entries;

use crate::clock::now_ms;
use crate::disk::{Flushes, Ring, NO_DIR};
use crate::format::hint;
use crate::format::volume::{hint_path, slot_of_file_name, volume_path, VolumeHeader, VOLUME_HEADER_LEN};
use crate::index::{Geometry, Index};
use crate::stats::{RecoveryProgress, RecoveryReport};
use crate::{io, Error, Result};
use hints::load_hint;
use scan::{scan_volume, ScanEvent, ScanRange};
use std::path::Path;
use std::sync::atomic::Ordering;

/// What recovery rebuilt: the index, and where the writer continues.
pub(crate) struct Recovered {
    pub index: Index,
    /// The large values' heads met in scanned volumes (slot, generation, offset).
    pub heads: Vec<(u16, u32, u64)>,
    pub active: Option<(usize, u64)>,
    /// Where a new active volume goes when `active` is `None`.
    pub start_slot: usize,
    pub next_sequence: u64,
    pub unhinted: Vec<usize>,
    pub report: RecoveryReport,
    /// The newest store time recovery saw (records, hint files, volume creation times): the
    /// writer stamps every later write after it, even if the clock has stepped back since.
    pub max_stored_ms: u64,
}

/// Reads the file at `path` into `buf`, which is kept for the next file and grown in
/// memory the kernel maps in at once (see `bulk.rs`); `None` if it cannot be read.
fn read_into<'b>(buf: &'b mut Option<memmap2::MmapMut>, path: &Path) -> Option<&'b [u8]> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    if buf.as_ref().is_none_or(|b| b.len() < len) {
        *buf = None;
        *buf = Some(memmap2::MmapOptions::new().len(len.max(1)).populate().map_anon().ok()?);
    }
    let b = buf.as_mut()?;
    f.read_exact(&mut b[..len]).ok()?;
    Some(&b[..len])
}

fn read_volume_header(file: &dyn io::FileIo) -> std::io::Result<Option<VolumeHeader>> {
    let mut hb = [0u8; VOLUME_HEADER_LEN as usize];
    let n = file.read_at_most(&mut hb, 0)?;
    Ok(VolumeHeader::decode(&hb[..n]))
}

/// What recovery found in a slot.
#[derive(Clone)]
enum Found {
    /// A sound header and a length within the volume size.
    Valid(VolumeHeader),
    /// In a directory that is missing; started with this sequence.
    Unavailable(u64),
    /// Shorter than a header: a reset of the slot was cut short. It held the oldest data of
    /// the ring, which was being evicted anyway.
    Empty,
    /// Unusable: damaged or foreign header, or larger than a volume.
    Bad,
}

/// Removes what an interrupted atomic write left in `dir`, and volumes beyond the ring's
/// size (raising `keep_from` past them: their keys may have older values in the ring).
fn remove_strays(ring: &Ring, dir: &Path, keep_from: &mut u64) -> Result<()> {
    let count = ring.slots.len();
    let read_dir = std::fs::read_dir(dir).map_err(|e| Error::io("listing the data directory", e))?;
    for entry in read_dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            // Left by an interrupted atomic write; the file it was replacing is intact.
            io::remove_if_exists(&entry.path()).map_err(|e| Error::io("removing a temporary file", e))?;
            continue;
        }
        let Some(slot) = slot_of_file_name(&name).filter(|&s| s >= count) else { continue };
        if name.ends_with(".lrv") {
            let f = io::open(&entry.path(), io::Mode::Read).map_err(|e| Error::io("opening a volume", e))?;
            let len = f.len().map_err(|e| Error::io("reading a volume's length", e))?;
            match read_volume_header(&*f).map_err(|e| Error::io("reading a volume header", e))? {
                Some(h) => *keep_from = (*keep_from).max(h.sequence),
                None if len >= VOLUME_HEADER_LEN => *keep_from = u64::MAX,
                None => {}
            }
            tracing::warn!(slot, "volume beyond --volume-count; removing it with every older volume");
        }
        io::remove_if_exists(&entry.path()).map_err(|e| Error::io("removing an out-of-ring volume", e))?;
    }
    Ok(())
}

/// Replays everything in the data directories: fills in `ring`'s slot table and returns the
/// index it rebuilt.
///
/// A volume that must be discarded takes every older volume with it: otherwise an older value
/// of one of its keys (or a value its tombstone deleted) would come back.
pub(crate) fn recover(
    ring: &Ring,
    flushes: &Flushes,
    hints_trusted: bool,
    progress: &RecoveryProgress,
) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let index = Index::new(Geometry::new(ring.slots.len() as u32, ring.cfg.volume_size));
    let mut heads = Vec::new();
    let count = ring.slots.len();
    let mut report = RecoveryReport::default();
    // Volumes with a sequence below this are discarded.
    let mut keep_from = 0u64;
    for dir in ring.dirs.iter().filter(|d| d.present) {
        remove_strays(ring, &dir.path, &mut keep_from)?;
    }
    let manifest = ring.manifest.lock().clone();

    // Each slot's current volume: the newest of its files in the present directories, unless
    // the manifest places the slot in a missing directory with a newer sequence. Older files
    // are turns of the slot left behind where a reset failed: emptied.
    let mut states: Vec<Option<Found>> = Vec::with_capacity(count);
    for slot in 0..count {
        let mut files: Vec<(usize, Found)> = Vec::new();
        for (d, dir) in ring.dirs.iter().enumerate().filter(|(_, d)| d.present) {
            let path = volume_path(&dir.path, slot);
            if !path.exists() {
                io::remove_if_exists(&hint_path(&dir.path, slot))
                    .map_err(|e| Error::io("removing an orphan hint", e))?;
                continue;
            }
            let file = io::open(&path, io::Mode::ReadWrite).map_err(|e| Error::io("opening a volume", e))?;
            let len = file.len().map_err(|e| Error::io("reading a volume's length", e))?;
            let header = read_volume_header(&*file).map_err(|e| Error::io("reading a volume header", e))?;
            let found = match header {
                Some(h) if h.slot as usize != slot || h.dir_id != dir.id => {
                    tracing::warn!(?path, "volume belongs to another slot or data directory; discarding it");
                    Found::Bad
                }
                Some(h) if len > ring.cfg.volume_size => {
                    tracing::warn!(
                        ?path,
                        len,
                        "volume larger than --volume-size; discarding it with every older volume"
                    );
                    keep_from = keep_from.max(h.sequence);
                    Found::Bad
                }
                Some(h) => Found::Valid(h),
                None if len < VOLUME_HEADER_LEN => Found::Empty,
                None => {
                    tracing::warn!(?path, "volume header damaged; discarding it with every older volume");
                    Found::Bad
                }
            };
            let _ = ring.slots[slot].files[d].set(file);
            files.push((d, found));
        }
        let entry = manifest.slot(slot);
        let placed = crate::disk::dirs::placed(entry);
        let seq_of = |f: &Found| if let Found::Valid(h) = f { h.sequence } else { 0 };
        let newest = files.iter().filter(|f| matches!(f.1, Found::Valid(_))).max_by_key(|f| seq_of(&f.1));
        let current = match newest {
            Some(&(d, Found::Valid(h))) if h.sequence >= entry.sequence => Some((d, Found::Valid(h))),
            // The file in the directory the manifest names (damaged or empty), if present.
            _ => match placed {
                Some(p) if !ring.dirs[p].present => {
                    report.unavailable += 1;
                    Some((p, Found::Unavailable(entry.sequence)))
                }
                Some(p) => files.iter().find(|f| f.0 == p).map(|&(d, ref f)| (d, f.clone())),
                None => files.iter().find(|f| !matches!(f.1, Found::Valid(_))).map(|&(d, ref f)| (d, f.clone())),
            },
        };
        for (d, f) in &files {
            if current.as_ref().is_some_and(|c| c.0 == *d) || matches!(f, Found::Empty) {
                continue;
            }
            tracing::warn!(slot, dir = %ring.dirs[*d].path.display(), "older copy of a volume left behind; emptying it");
            // Normally the slot's previous turn, older than every volume kept. Not so when two
            // runs each reused the slot while the other's directory was missing: then what
            // this copy held (a delete, say) must not be lost while older values stay.
            if let Found::Valid(h) = f {
                keep_from = keep_from.max(h.sequence + 1);
            }
            let file = ring.slots[slot].files[*d].get().expect("opened above");
            file.set_len(0).map_err(|e| Error::io("emptying a stale volume", e))?;
            io::remove_if_exists(&hint_path(&ring.dirs[*d].path, slot)).map_err(|e| Error::io("removing a hint", e))?;
        }
        if let Some((d, _)) = &current {
            ring.slots[slot].dir.store(*d as u32, Ordering::Release);
        }
        states.push(current.map(|c| c.1));
    }
    let seq = |f: &Found| match f {
        Found::Valid(h) => Some(h.sequence),
        Found::Unavailable(s) => Some(*s),
        _ => None,
    };
    let newest = states.iter().flatten().filter_map(seq).max();
    for d in 0..count {
        if !matches!(states[d], Some(Found::Bad)) {
            continue;
        }
        // The ring always moves to the next slot, so a bad volume is one newer than its
        // predecessor in the ring, unless that predecessor is the newest (then it was oldest).
        match states[(d + count - 1) % count].as_ref().and_then(seq) {
            Some(p) if Some(p) == newest => {}
            Some(p) => keep_from = keep_from.max(p + 1),
            None => keep_from = keep_from.max(newest.unwrap_or(u64::MAX)),
        }
    }
    // With a directory missing, any present volume may hold a value that a volume there
    // replaced or deleted, and the newest copy of the manifest (which would say what it held)
    // may be there too: every present volume stays on disk but out of the index until it
    // returns. Volumes written meanwhile get later sequences (see `clock::sequence_after`),
    // so when it does, replaying by sequence puts every write in its place.
    let withhold_below = if ring.degraded { u64::MAX } else { 0 };

    let mut found: Vec<VolumeHeader> = Vec::new();
    for (slot, state) in states.iter().enumerate() {
        let keep = match state {
            None | Some(Found::Unavailable(_)) => continue,
            Some(Found::Valid(h)) if h.sequence >= keep_from => {
                found.push(*h);
                true
            }
            Some(Found::Valid(_)) | Some(Found::Bad) => {
                report.discarded += 1;
                false
            }
            Some(Found::Empty) => false,
        };
        if !keep {
            // Nothing here can be served: reclaim the space; the slot starts afresh when the
            // ring reaches it.
            let s = &ring.slots[slot];
            let dir = &ring.dirs[s.dir().expect("set above")];
            (s.file().expect("opened above")).set_len(0).map_err(|e| Error::io("emptying a discarded volume", e))?;
            io::remove_if_exists(&hint_path(&dir.path, slot)).map_err(|e| Error::io("removing a hint", e))?;
            s.dir.store(NO_DIR, Ordering::Release);
        }
    }
    if report.discarded > 0 {
        tracing::warn!(volumes = report.discarded, "discarded volumes; their keys are misses");
    }
    found.sort_by_key(|h| h.sequence);
    // The newest volume of all, wherever it is: the ring continues after it.
    let newest_slot = states
        .iter()
        .enumerate()
        .filter_map(|(slot, f)| Some((f.as_ref().and_then(seq)?, slot)))
        .filter(|&(s, _)| s >= keep_from)
        .max()
        .map(|(_, slot)| slot);
    let max_sequence = manifest.slots.iter().map(|e| e.sequence).chain(found.iter().map(|h| h.sequence)).max();
    let dir_of = |slot: usize| &ring.dirs[ring.slots[slot].dir().expect("placed above")].path;
    let mut max_stored_ms = found.iter().map(|h| h.created_ms).max().unwrap_or(0);
    let withheld = found.iter().take_while(|h| h.sequence < withhold_below).count();
    for vh in found.drain(..withheld) {
        let s = &ring.slots[vh.slot as usize];
        s.generation.store(vh.generation, Ordering::Release);
        s.salt.store(vh.salt, Ordering::Release);
        s.sequence.store(vh.sequence, Ordering::Relaxed);
        let len = s.file().expect("opened above").len().map_err(|e| Error::io("reading a volume's length", e))?;
        s.len.store(len, Ordering::Relaxed);
        report.withheld += 1;
    }
    if report.withheld > 0 {
        tracing::error!(
            volumes = report.withheld,
            "a data directory is missing: the volumes of the others are left out of the index until it returns"
        );
    }
    report.volumes = found.len() as u64;

    // The work ahead, for progress reports: a hint's bytes where one exists, else the volume's.
    // (Each hint is read when its volume's turn comes: together they may be hundreds of MiB.)
    // Each with a guess of how many entries it holds, at most: one per 24-byte hint entry, or
    // one per smallest record (56 bytes) of a volume without a hint.
    let (mut costs, guesses): (Vec<u64>, Vec<u64>) = found
        .iter()
        .map(|vh| {
            let slot = vh.slot as usize;
            let hint = hints_trusted.then(|| std::fs::metadata(hint_path(dir_of(slot), slot)).ok()).flatten();
            let volume = || ring.slots[slot].file().and_then(|f| f.len().ok());
            match hint {
                Some(m) => (m.len(), m.len() / hint::ENTRY_LEN as u64),
                None => volume().map_or((0, 0), |v| (v, v / 56)),
            }
        })
        .unzip();
    let total: u64 = costs.iter().sum();
    // Entries are gathered in volume order and applied a shard at a time.
    let mut rank = vec![0u32; count];
    for (i, vh) in found.iter().enumerate() {
        rank[vh.slot as usize] = i as u32;
    }
    let mut bulk = bulk::Bulk::new(&index, guesses.iter().sum(), rank);
    // One buffer for every hint: a fresh one would be faulted in page by page each time.
    let mut hint_buf = None;
    progress.volumes_total.store(found.len() as u64, Ordering::Relaxed);
    progress.bytes_total.store(total, Ordering::Relaxed);

    let mut unhinted = Vec::new();
    let mut active = None;
    let mut done_bytes = 0u64;
    for (i, vh) in found.iter().enumerate() {
        let slot = vh.slot as usize;
        let is_active = i + 1 == found.len();
        let s = &ring.slots[slot];
        s.generation.store(vh.generation, Ordering::Release);
        s.salt.store(vh.salt, Ordering::Release);
        s.sequence.store(vh.sequence, Ordering::Relaxed);
        let file = s.file().expect("opened above");
        let file_len = file.len().map_err(|e| Error::io("reading a volume's length", e))?;
        // A hint covers the whole volume (sealed) or what was written before a graceful stop
        // (the active volume's checkpoint); only the records after it are scanned.
        let mut scan_from = VOLUME_HEADER_LEN;
        let hint_bytes = if hints_trusted { read_into(&mut hint_buf, &hint_path(dir_of(slot), slot)) } else { None };
        if let Some(bytes) = &hint_bytes {
            match hint::Hint::open(bytes, vh, file_len) {
                Some(h) => {
                    max_stored_ms = max_stored_ms.max(h.max_stored_ms);
                    load_hint(ring, &mut bulk, slot, vh.generation, &h, progress, &mut heads);
                    report.records += h.len();
                    scan_from = h.data_len.max(VOLUME_HEADER_LEN);
                    match (is_active, scan_from == file_len) {
                        (true, _) => report.checkpoint_loads += 1,
                        (false, true) => report.hint_loads += 1,
                        (false, false) => {} // sealed after its checkpoint: scanned below
                    }
                }
                None => {
                    tracing::warn!(slot, "hint file does not match its volume; scanning the volume");
                    // The work is the volume, not the hint.
                    progress.bytes_total.fetch_add(file_len.saturating_sub(costs[i]), Ordering::Relaxed);
                    costs[i] = costs[i].max(file_len);
                }
            }
        }
        done_bytes += costs[i];
        if scan_from == file_len && !is_active {
            s.len.store(file_len, Ordering::Relaxed);
            progress.volumes_done.fetch_add(1, Ordering::Relaxed);
            progress.bytes_done.store(done_bytes, Ordering::Relaxed);
            continue;
        }
        if scan_from == VOLUME_HEADER_LEN {
            report.scans += 1;
        } else {
            report.tail_bytes_scanned += file_len - scan_from;
        }
        let now = now_ms();
        let range = ScanRange {
            start: scan_from,
            end: file_len,
            generation: vh.generation,
            salt: vh.salt,
            torn_tail_possible: is_active,
            values_checked: true,
        };
        let scan_base = done_bytes - costs[i];
        let mut seen = 0u64;
        let outcome = scan_volume(file, range, |ev| match ev {
            ScanEvent::Valid { offset, header, key } => {
                max_stored_ms = max_stored_ms.max(header.stored_ms);
                let hash = ring.hash(key);
                if header.is_chunk() {
                    // Named only by its value's head; shadows nothing.
                } else if header.is_tombstone()
                    || (header.expiry_ms != 0 && header.expiry_ms <= now)
                    || flushes.flushed(header.stored_ms, now)
                {
                    bulk.drop(hash, ring.loc(slot, vh.generation, offset, header.record_len()));
                } else {
                    bulk.put(hash, ring.loc(slot, vh.generation, offset, header.record_len()));
                    if header.is_head() {
                        heads.push((slot as u16, vh.generation, offset));
                    }
                }
                seen += 1;
                if seen.is_multiple_of(1 << 16) {
                    progress.records.fetch_add(1 << 16, Ordering::Relaxed);
                    progress.bytes_done.store(scan_base + (offset - scan_from).min(costs[i]), Ordering::Relaxed);
                }
            }
            ScanEvent::Damaged { offset, header, key } => {
                tracing::warn!(slot, offset, record_len = header.record_len(), "damaged record skipped");
                // A damaged chunk shadows nothing: its head, if any, fails when read.
                if !header.is_chunk() {
                    bulk.drop(ring.hash(key), ring.loc(slot, vh.generation, offset, header.record_len()));
                }
            }
        })
        .map_err(|e| Error::io("scanning a volume", e))?;
        progress.records.fetch_add(seen % (1 << 16), Ordering::Relaxed);
        progress.volumes_done.fetch_add(1, Ordering::Relaxed);
        progress.bytes_done.store(done_bytes, Ordering::Relaxed);
        report.records += outcome.records;
        report.skipped += outcome.skipped;
        let mut len = file_len;
        if is_active && outcome.valid_end < file_len {
            report.truncated_bytes += file_len - outcome.valid_end;
            tracing::warn!(
                slot,
                from = outcome.valid_end,
                bytes = file_len - outcome.valid_end,
                "truncating the tail after the last valid record"
            );
            file.set_len(outcome.valid_end).map_err(|e| Error::io("truncating a torn tail", e))?;
            len = outcome.valid_end;
        }
        s.len.store(len, Ordering::Relaxed);
        if is_active {
            active = Some((slot, len));
        } else {
            unhinted.push(slot);
        }
    }
    // The slot table names every volume found, so that a directory that goes missing later is
    // known by what it holds (a table made afresh, or read from version 1, names none yet).
    {
        let mut m = ring.manifest.lock();
        for (slot, s) in ring.slots.iter().enumerate() {
            if let (Some(d), true) = (s.dir(), s.generation.load(Ordering::Relaxed) != 0) {
                m.slots[slot] =
                    crate::format::manifest::SlotEntry { dir: d as u16, sequence: s.sequence.load(Ordering::Relaxed) };
            }
        }
    }
    bulk.apply();
    drop(bulk);
    index.fit();
    report.millis = started.elapsed().as_millis() as u64;
    // A new store starts at slot 0; otherwise, when the newest volume is missing, the ring
    // goes on after it.
    let start_slot = newest_slot.map_or(0, |s| (s + 1) % count);
    let next_sequence = max_sequence.map_or(1, |s| s + 1);
    Ok(Recovered { index, heads, active, start_slot, next_sequence, unhinted, report, max_stored_ms })
}
