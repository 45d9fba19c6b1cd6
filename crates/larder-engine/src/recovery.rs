//! Rebuilding the index at start, and the record scanner it shares with hint building.
//!
//! Rules (DESIGN §4): volumes are replayed oldest to newest by their header's sequence; a
//! sealed volume loads from its hint file when the hint matches it exactly, otherwise it is
//! scanned record by record. While scanning, a damaged record that has valid records after it
//! is skipped and counted, and if its header and key are sound its key is dropped from the
//! index (an older value of that key must not come back in its place); the tail after the last
//! valid record is truncated; a record of another generation ends the scan (it is data from
//! the slot's previous turn of the ring).

use crate::hint::{self, HintEntry};
use crate::io;
use crate::record::{self, DecodeError, Header, HEADER_LEN, MAX_KEY_LEN};
use crate::store::Shared;
use crate::volume::{hint_path, slot_of_file_name, volume_path, VolumeHeader, VOLUME_HEADER_LEN};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

const CHUNK: usize = 4 << 20;

/// One record met by [`scan_volume`].
#[derive(Debug)]
pub enum ScanEvent<'a> {
    /// A record that verified.
    Valid {
        /// Record offset.
        offset: u64,
        /// Its header.
        header: Header,
        /// Its key.
        key: &'a [u8],
    },
    /// A record with a sound header and key but a damaged body, followed by valid records.
    Damaged {
        /// Record offset.
        offset: u64,
        /// Its header.
        header: Header,
        /// Its key.
        key: &'a [u8],
    },
}

impl ScanEvent<'_> {
    /// The record's key.
    pub fn key(&self) -> &[u8] {
        match self {
            ScanEvent::Valid { key, .. } | ScanEvent::Damaged { key, .. } => key,
        }
    }

    /// The record's header.
    pub fn header(&self) -> &Header {
        match self {
            ScanEvent::Valid { header, .. } | ScanEvent::Damaged { header, .. } => header,
        }
    }

    /// The record's offset in the volume.
    pub fn offset(&self) -> u64 {
        match self {
            ScanEvent::Valid { offset, .. } | ScanEvent::Damaged { offset, .. } => *offset,
        }
    }

    /// The record as a hint file describes it (`hash` is its seeded key hash): a put, or a
    /// drop for a tombstone or a damaged record. Hint files are made of these, and
    /// `larder check` compares hint files with them.
    pub fn hint_entry(&self, hash: u64) -> HintEntry {
        let (offset, header, key, dropped) = match *self {
            ScanEvent::Valid { offset, header, key } => (offset, header, key, header.is_tombstone()),
            ScanEvent::Damaged { offset, header, key } => (offset, header, key, true),
        };
        let len = header.record_len() as u32;
        if dropped {
            HintEntry::Drop { hash, offset, len, key: key.to_vec() }
        } else {
            HintEntry::Put { hash, offset, len, expiry_ms: header.expiry_ms }
        }
    }
}

/// What a scan found.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScanOutcome {
    /// End of the last valid record: where appending may continue.
    pub valid_end: u64,
    /// Damaged records or unreadable stretches skipped between valid records.
    pub skipped: u64,
    /// Valid records seen.
    pub records: u64,
}

/// A window of file bytes, refilled in large chunks as the scan moves forward.
struct Window<'f> {
    file: &'f File,
    end: u64,
    start: u64,
    buf: Vec<u8>,
}

impl Window<'_> {
    /// The bytes from `pos`, at least `need` of them unless the scan range ends first.
    fn at(&mut self, pos: u64, need: usize) -> std::io::Result<&[u8]> {
        let have_end = self.start + self.buf.len() as u64;
        if pos < self.start || pos + need as u64 > have_end.min(self.end) || pos >= have_end {
            let len = (need.max(CHUNK) as u64).min(self.end.saturating_sub(pos)) as usize;
            self.buf.resize(len, 0);
            let n = io::read_at_most(self.file, &mut self.buf, pos)?;
            self.buf.truncate(n);
            self.start = pos;
        }
        let from = (pos - self.start) as usize;
        Ok(&self.buf[from.min(self.buf.len())..])
    }
}

/// What to scan: records of `generation` (checksums salted with `salt`) from `start` to `end`.
#[derive(Debug, Clone, Copy)]
pub struct ScanRange {
    /// First byte of the first record.
    pub start: u64,
    /// End of the data (file length).
    pub end: u64,
    /// Generation the records must carry.
    pub generation: u32,
    /// The volume's checksum salt.
    pub salt: u32,
    /// Whether the last records may be a torn write (only in the volume being written). A
    /// damaged record at the end of a sealed volume is damage, not a torn write.
    pub torn_tail_possible: bool,
}

/// Scans the records of `file` in `range`.
///
/// `on_event` sees valid records in order, and damaged ones in their place: at once in a
/// sealed volume, and in the active volume only once a later valid record shows they are not
/// a torn write (a torn write was never acknowledged, so the value before it stays).
pub fn scan_volume(
    file: &File,
    range: ScanRange,
    mut on_event: impl FnMut(ScanEvent<'_>),
) -> std::io::Result<ScanOutcome> {
    let ScanRange { start, end, generation, salt, torn_tail_possible } = range;
    let mut w = Window { file, end, start: 0, buf: Vec::new() };
    let mut out = ScanOutcome { valid_end: start, ..Default::default() };
    let mut pending: Vec<(u64, Header, Vec<u8>)> = Vec::new();
    let mut pending_gaps = 0;
    let mut pos = start;
    while pos + HEADER_LEN as u64 <= end {
        let head = w.at(pos, HEADER_LEN + MAX_KEY_LEN)?;
        match record::decode_header(head, salt) {
            Ok(h) if h.generation != generation => break,
            Ok(h) => {
                let len = h.record_len();
                if pos + len > end {
                    break; // torn tail
                }
                let rec = w.at(pos, len as usize)?;
                if rec.len() < len as usize {
                    break; // the file shrank under us (the ring reused the slot)
                }
                match record::decode(rec, salt) {
                    Ok(r) => {
                        for (offset, header, key) in pending.drain(..) {
                            on_event(ScanEvent::Damaged { offset, header, key: &key });
                        }
                        out.skipped += pending_gaps;
                        pending_gaps = 0;
                        on_event(ScanEvent::Valid { offset: pos, header: h, key: r.key });
                        out.records += 1;
                        pos += h.padded_len();
                        out.valid_end = pos;
                    }
                    Err(_) => {
                        let key = &rec[HEADER_LEN..HEADER_LEN + h.key_len as usize];
                        if torn_tail_possible {
                            pending.push((pos, h, key.to_vec()));
                            pending_gaps += 1;
                        } else {
                            on_event(ScanEvent::Damaged { offset: pos, header: h, key });
                            out.skipped += 1;
                        }
                        pos += h.padded_len();
                    }
                }
            }
            Err(DecodeError::Short) => break,
            Err(_) => match resync(&mut w, pos + record::ALIGN, end, generation, salt)? {
                Some(next) => {
                    pending_gaps += 1;
                    pos = next;
                }
                None => break,
            },
        }
    }
    if !torn_tail_possible {
        out.skipped += pending_gaps;
    }
    Ok(out)
}

/// The next 8-aligned offset after a damaged stretch where a whole valid record of
/// `generation` starts, if any.
fn resync(w: &mut Window<'_>, from: u64, end: u64, generation: u32, salt: u32) -> std::io::Result<Option<u64>> {
    let mut p = from;
    while p + HEADER_LEN as u64 <= end {
        let b = w.at(p, HEADER_LEN + MAX_KEY_LEN)?;
        if b.len() >= 4 && b[..4] == record::MAGIC.to_le_bytes() {
            if let Ok(h) = record::decode_header(b, salt) {
                if h.generation == generation && p + h.record_len() <= end {
                    let len = h.record_len() as usize;
                    if record::decode(w.at(p, len)?, salt).is_ok() {
                        return Ok(Some(p));
                    }
                }
            }
        }
        p += record::ALIGN;
    }
    Ok(None)
}

/// Figures from a recovery, reported in stats.
#[derive(Debug, Default, Clone, Copy)]
pub struct RecoveryReport {
    /// Volumes replayed.
    pub volumes: u64,
    /// Volumes discarded: damaged headers, outside the ring or larger than a volume, and every
    /// volume older than one of those.
    pub discarded: u64,
    /// Volumes in data directories that are missing (their keys are misses meanwhile).
    pub unavailable: u64,
    /// Volumes left out of the index, but kept, because a data directory is missing, which may
    /// hold newer values or deletes of their keys (and the newest manifest).
    pub withheld: u64,
    /// Sealed volumes loaded from hint files.
    pub hint_loads: u64,
    /// Active volumes loaded from the checkpoint a graceful stop wrote (then 0 scans).
    pub checkpoint_loads: u64,
    /// Volumes scanned record by record from their start.
    pub scans: u64,
    /// Bytes scanned after a hint or checkpoint: records appended after a graceful restart.
    pub tail_bytes_scanned: u64,
    /// Records replayed (from scans and hints).
    pub records: u64,
    /// Damaged records or stretches skipped.
    pub skipped: u64,
    /// Bytes cut from torn tails.
    pub truncated_bytes: u64,
    /// Wall time of the recovery in milliseconds.
    pub millis: u64,
}

/// How far a recovery in progress has come, updated as it goes (every 65,536 records), so
/// that a server can report progress and an estimate of the time left while it opens.
#[derive(Debug, Default)]
pub struct RecoveryProgress {
    /// Volumes to replay.
    pub volumes_total: AtomicU64,
    /// Volumes replayed.
    pub volumes_done: AtomicU64,
    /// Bytes to read: hint files where they exist, volume files otherwise.
    pub bytes_total: AtomicU64,
    /// Of those, bytes read.
    pub bytes_done: AtomicU64,
    /// Records replayed so far.
    pub records: AtomicU64,
}

/// Where the writer continues after recovery.
pub(crate) struct Recovered {
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

fn read_volume_header(file: &File) -> std::io::Result<Option<VolumeHeader>> {
    let mut hb = [0u8; VOLUME_HEADER_LEN as usize];
    let n = io::read_at_most(file, &mut hb, 0)?;
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
fn remove_strays(sh: &Shared, dir: &Path, keep_from: &mut u64) -> Result<()> {
    let count = sh.slots.len();
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
            let f = File::open(entry.path()).map_err(|e| Error::io("opening a volume", e))?;
            let len = f.metadata().map_err(|e| Error::io("reading a volume's length", e))?.len();
            match read_volume_header(&f).map_err(|e| Error::io("reading a volume header", e))? {
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

/// Replays everything in the data directories into `sh`'s index and slot table.
///
/// A volume that must be discarded takes every older volume with it: otherwise an older value
/// of one of its keys (or a value its tombstone deleted) would come back.
pub(crate) fn recover(sh: &Shared, hints_trusted: bool, progress: &RecoveryProgress) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let count = sh.slots.len();
    let mut report = RecoveryReport::default();
    // Volumes with a sequence below this are discarded.
    let mut keep_from = 0u64;
    for dir in sh.dirs.iter().filter(|d| d.present) {
        remove_strays(sh, &dir.path, &mut keep_from)?;
    }
    let manifest = sh.manifest.lock().clone();

    // Each slot's current volume: the newest of its files in the present directories, unless
    // the manifest places the slot in a missing directory with a newer sequence. Older files
    // are turns of the slot left behind where a reset failed: emptied.
    let mut states: Vec<Option<Found>> = Vec::with_capacity(count);
    for slot in 0..count {
        let mut files: Vec<(usize, Found)> = Vec::new();
        for (d, dir) in sh.dirs.iter().enumerate().filter(|(_, d)| d.present) {
            let path = volume_path(&dir.path, slot);
            if !path.exists() {
                io::remove_if_exists(&hint_path(&dir.path, slot))
                    .map_err(|e| Error::io("removing an orphan hint", e))?;
                continue;
            }
            let file =
                OpenOptions::new().read(true).write(true).open(&path).map_err(|e| Error::io("opening a volume", e))?;
            let len = file.metadata().map_err(|e| Error::io("reading a volume's length", e))?.len();
            let header = read_volume_header(&file).map_err(|e| Error::io("reading a volume header", e))?;
            let found = match header {
                Some(h) if h.slot as usize != slot || h.dir_id != dir.id => {
                    tracing::warn!(?path, "volume belongs to another slot or data directory; discarding it");
                    Found::Bad
                }
                Some(h) if len > sh.cfg.volume_size => {
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
            let _ = sh.slots[slot].files[d].set(file);
            files.push((d, found));
        }
        let entry = manifest.slot(slot);
        let placed = crate::dirs::placed(entry);
        let seq_of = |f: &Found| if let Found::Valid(h) = f { h.sequence } else { 0 };
        let newest = files.iter().filter(|f| matches!(f.1, Found::Valid(_))).max_by_key(|f| seq_of(&f.1));
        let current = match newest {
            Some(&(d, Found::Valid(h))) if h.sequence >= entry.sequence => Some((d, Found::Valid(h))),
            // The file in the directory the manifest names (damaged or empty), if present.
            _ => match placed {
                Some(p) if !sh.dirs[p].present => {
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
            tracing::warn!(slot, dir = %sh.dirs[*d].path.display(), "older copy of a volume left behind; emptying it");
            // Normally the slot's previous turn, older than every volume kept. Not so when two
            // runs each reused the slot while the other's directory was missing: then what
            // this copy held (a delete, say) must not be lost while older values stay.
            if let Found::Valid(h) = f {
                keep_from = keep_from.max(h.sequence + 1);
            }
            let file = sh.slots[slot].files[*d].get().expect("opened above");
            io::set_len(file, 0).map_err(|e| Error::io("emptying a stale volume", e))?;
            io::remove_if_exists(&hint_path(&sh.dirs[*d].path, slot)).map_err(|e| Error::io("removing a hint", e))?;
        }
        if let Some((d, _)) = &current {
            sh.slots[slot].dir.store(*d as u32, Ordering::Release);
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
    // returns. Volumes written meanwhile get later sequences (see `Shared::sequence_after`),
    // so when it does, replaying by sequence puts every write in its place.
    let withhold_below = if sh.degraded { u64::MAX } else { 0 };

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
            let s = &sh.slots[slot];
            let dir = &sh.dirs[s.dir().expect("set above")];
            io::set_len(s.file().expect("opened above"), 0).map_err(|e| Error::io("emptying a discarded volume", e))?;
            io::remove_if_exists(&hint_path(&dir.path, slot)).map_err(|e| Error::io("removing a hint", e))?;
            s.dir.store(crate::store::NO_DIR, Ordering::Release);
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
    let dir_of = |slot: usize| &sh.dirs[sh.slots[slot].dir().expect("placed above")].path;
    let mut max_stored_ms = found.iter().map(|h| h.created_ms).max().unwrap_or(0);
    let withheld = found.iter().take_while(|h| h.sequence < withhold_below).count();
    for vh in found.drain(..withheld) {
        let s = &sh.slots[vh.slot as usize];
        s.generation.store(vh.generation, Ordering::Release);
        s.salt.store(vh.salt, Ordering::Release);
        s.sequence.store(vh.sequence, Ordering::Relaxed);
        let len = s.file().expect("opened above").metadata().map_err(|e| Error::io("reading a volume's length", e))?;
        s.len.store(len.len(), Ordering::Relaxed);
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
    let mut costs: Vec<u64> = found
        .iter()
        .map(|vh| {
            let slot = vh.slot as usize;
            let hint = hints_trusted.then(|| std::fs::metadata(hint_path(dir_of(slot), slot)).ok()).flatten();
            let volume = || sh.slots[slot].file().and_then(|f| f.metadata().ok());
            hint.or_else(volume).map_or(0, |m| m.len())
        })
        .collect();
    let total: u64 = costs.iter().sum();
    progress.volumes_total.store(found.len() as u64, Ordering::Relaxed);
    progress.bytes_total.store(total, Ordering::Relaxed);

    let mut unhinted = Vec::new();
    let mut active = None;
    let mut done_bytes = 0u64;
    for (i, vh) in found.iter().enumerate() {
        let slot = vh.slot as usize;
        let is_active = i + 1 == found.len();
        let s = &sh.slots[slot];
        s.generation.store(vh.generation, Ordering::Release);
        s.salt.store(vh.salt, Ordering::Release);
        s.sequence.store(vh.sequence, Ordering::Relaxed);
        let file = s.file().expect("opened above");
        let file_len = file.metadata().map_err(|e| Error::io("reading a volume's length", e))?.len();
        // A hint covers the whole volume (sealed) or what was written before a graceful stop
        // (the active volume's checkpoint); only the records after it are scanned.
        let mut scan_from = VOLUME_HEADER_LEN;
        let hint_bytes = if hints_trusted { std::fs::read(hint_path(dir_of(slot), slot)).ok() } else { None };
        if let Some(bytes) = &hint_bytes {
            match hint::Hint::open(bytes, vh, file_len) {
                Some(h) => {
                    max_stored_ms = max_stored_ms.max(h.max_stored_ms);
                    load_hint(sh, slot, vh.generation, &h, progress);
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
        drop(hint_bytes);
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
        let now = crate::store::now_ms();
        let range = ScanRange {
            start: scan_from,
            end: file_len,
            generation: vh.generation,
            salt: vh.salt,
            torn_tail_possible: is_active,
        };
        let scan_base = done_bytes - costs[i];
        let mut seen = 0u64;
        let outcome = scan_volume(file, range, |ev| match ev {
            ScanEvent::Valid { offset, header, key } => {
                max_stored_ms = max_stored_ms.max(header.stored_ms);
                let hash = sh.hash(key);
                if header.is_tombstone() || (header.expiry_ms != 0 && header.expiry_ms <= now) {
                    sh.drop_if_key(hash, key);
                } else {
                    sh.index.insert(hash, sh.loc(slot, vh.generation, offset, header.record_len()));
                }
                seen += 1;
                if seen.is_multiple_of(1 << 16) {
                    progress.records.fetch_add(1 << 16, Ordering::Relaxed);
                    progress.bytes_done.store(scan_base + (offset - scan_from).min(costs[i]), Ordering::Relaxed);
                }
            }
            ScanEvent::Damaged { offset, header, key } => {
                tracing::warn!(slot, offset, record_len = header.record_len(), "damaged record skipped");
                sh.drop_if_key(sh.hash(key), key);
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
            io::set_len(file, outcome.valid_end).map_err(|e| Error::io("truncating a torn tail", e))?;
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
        let mut m = sh.manifest.lock();
        for (slot, s) in sh.slots.iter().enumerate() {
            if let (Some(d), true) = (s.dir(), s.generation.load(Ordering::Relaxed) != 0) {
                m.slots[slot] =
                    crate::manifest::SlotEntry { dir: d as u16, sequence: s.sequence.load(Ordering::Relaxed) };
            }
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    // A new store starts at slot 0; otherwise, when the newest volume is missing, the ring
    // goes on after it.
    let start_slot = newest_slot.map_or(0, |s| (s + 1) % count);
    let next_sequence = max_sequence.map_or(1, |s| s + 1);
    Ok(Recovered { active, start_slot, next_sequence, unhinted, report, max_stored_ms })
}

/// Applies a hint's entries to the index, in chunks: each chunk is sorted by index shard
/// (stably, so a key's entries keep their order) and applied one shard's run at a time under
/// one lock, so that a shard's table stays in cache while its entries go in, instead of one
/// cache miss and one lock per entry; with several cores, each thread applies a disjoint
/// range of shards.
fn load_hint(sh: &Shared, slot: usize, generation: u32, h: &hint::Hint<'_>, progress: &RecoveryProgress) {
    use crate::index::{Index, Loc, SHARDS};
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
                HintEntry::Put { hash, offset, len, .. } => {
                    (hash, Op::Put(sh.loc(slot, generation, offset, len as u64)))
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
                            sh.index.insert_batch(&puts);
                            puts.clear();
                            sh.drop_if_key(hash, &drops[k as usize]);
                        }
                    }
                }
                sh.index.insert_batch(&puts);
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
/// time, in volume order (nothing is collected: the caller streams them).
pub(crate) fn scan_hint_entries(
    sh: &Shared,
    file: &File,
    len: u64,
    generation: u32,
    salt: u32,
    mut f: impl FnMut(HintEntry, u64),
) -> std::io::Result<()> {
    let range = ScanRange { start: VOLUME_HEADER_LEN, end: len, generation, salt, torn_tail_possible: false };
    scan_volume(file, range, |ev| f(ev.hint_entry(sh.hash(ev.key())), ev.header().stored_ms))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn rec(key: &[u8], value: &[u8], generation: u32) -> Vec<u8> {
        let mut b = Vec::new();
        let h =
            Header { flags: 0, key_len: 0, value_len: 0, meta_len: 0, generation, stored_ms: 0, expiry_ms: 0, crc: 0 };
        record::encode_into(&mut b, &h, key, b"", value, SALT);
        b
    }

    const SALT: u32 = 77;

    fn scan_bytes(bytes: &[u8], generation: u32) -> (ScanOutcome, Vec<String>) {
        scan_bytes_as(bytes, generation, true)
    }

    fn scan_bytes_as(bytes: &[u8], generation: u32, torn_tail_possible: bool) -> (ScanOutcome, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let f =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.path().join("v")).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        let mut seen = Vec::new();
        let range = ScanRange { start: 0, end: bytes.len() as u64, generation, salt: SALT, torn_tail_possible };
        let out = scan_volume(&f, range, |ev| {
            seen.push(match ev {
                ScanEvent::Valid { key, .. } => format!("ok {}", String::from_utf8_lossy(key)),
                ScanEvent::Damaged { key, .. } => format!("bad {}", String::from_utf8_lossy(key)),
            })
        })
        .unwrap();
        (out, seen)
    }

    #[test]
    fn damaged_value_between_valid_records_is_reported_in_place() {
        let (a, mut b, c) = (rec(b"a", b"1111", 1), rec(b"b", b"2222", 1), rec(b"c", b"3333", 1));
        b[HEADER_LEN + 2] ^= 0xff;
        let all = [a.clone(), b.clone(), c.clone()].concat();
        let (out, seen) = scan_bytes(&all, 1);
        assert_eq!(seen, ["ok a", "bad b", "ok c"]);
        assert_eq!((out.valid_end, out.skipped, out.records), (all.len() as u64, 1, 2));
    }

    #[test]
    fn damaged_header_is_skipped_by_resync() {
        let (a, mut b, c) = (rec(b"a", b"1111", 1), rec(b"b", &[5; 300], 1), rec(b"c", b"3333", 1));
        b[14] ^= 0x7f; // key length
        let (out, seen) = scan_bytes(&[a, b, c].concat(), 1);
        assert_eq!(seen, ["ok a", "ok c"]);
        assert_eq!(out.skipped, 1);
    }

    #[test]
    fn torn_or_damaged_tail_is_not_reported_and_ends_valid_data() {
        let (a, b) = (rec(b"a", b"1111", 1), rec(b"b", &[5; 300], 1));
        let mut torn = [a.clone(), b.clone()].concat();
        torn.truncate(a.len() + 100);
        let (out, seen) = scan_bytes(&torn, 1);
        assert_eq!((seen.as_slice(), out.valid_end), (&["ok a".to_string()][..], a.len() as u64));
        let mut bad_tail = [a.clone(), b].concat();
        let at = bad_tail.len() - 20;
        bad_tail[at] ^= 1;
        let (out, seen) = scan_bytes(&bad_tail, 1);
        assert_eq!((seen.len(), out.valid_end, out.skipped), (1, a.len() as u64, 0));
        // In a sealed volume the same damage is damage: its key must be dropped.
        let (out, seen) = scan_bytes_as(&bad_tail, 1, false);
        assert_eq!(seen, ["ok a", "bad b"]);
        assert_eq!(out.skipped, 1);
    }

    #[test]
    fn a_record_hidden_in_a_value_is_never_taken_for_one() {
        // A client stores bytes that form a perfect record of key "victim" (under some other
        // salt): after damage before it, resync must not find it.
        let mut forged = Vec::new();
        let h = Header {
            flags: 0,
            key_len: 0,
            value_len: 0,
            meta_len: 0,
            generation: 1,
            stored_ms: 0,
            expiry_ms: 0,
            crc: 0,
        };
        record::encode_into(&mut forged, &h, b"victim", b"", b"forged", SALT ^ 0xdead);
        let (mut a, c) = (rec(b"8bytekey", &forged, 1), rec(b"c", b"3", 1)); // value 8-aligned
        a[14] ^= 0x7f; // damage a's header: the scan must resync
        let (_, seen) = scan_bytes(&[a, c].concat(), 1);
        assert_eq!(seen, ["ok c"]);
    }

    #[test]
    fn another_generation_ends_the_scan() {
        let all = [rec(b"a", b"1", 2), rec(b"old", b"2", 1), rec(b"c", b"3", 2)].concat();
        let (_, seen) = scan_bytes(&all, 2);
        assert_eq!(seen, ["ok a"]);
    }
}
