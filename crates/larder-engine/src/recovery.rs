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

/// Scans records of generation `generation` in `file` between `start` and `end`.
///
/// `on_event` sees valid records in order, and damaged ones (in their place) only once a later
/// valid record shows they are not the torn tail.
pub fn scan_volume(
    file: &File,
    start: u64,
    end: u64,
    generation: u32,
    mut on_event: impl FnMut(ScanEvent<'_>),
) -> std::io::Result<ScanOutcome> {
    let mut w = Window { file, end, start: 0, buf: Vec::new() };
    let mut out = ScanOutcome { valid_end: start, ..Default::default() };
    let mut pending: Vec<(u64, Header, Vec<u8>)> = Vec::new();
    let mut pending_gaps = 0;
    let mut pos = start;
    while pos + HEADER_LEN as u64 <= end {
        let head = w.at(pos, HEADER_LEN + MAX_KEY_LEN)?;
        match record::decode_header(head) {
            Ok(h) if h.generation != generation => break,
            Ok(h) => {
                let len = h.record_len();
                if pos + len > end {
                    break; // torn tail
                }
                let rec = w.at(pos, len as usize)?;
                match record::decode(rec) {
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
                        pending.push((pos, h, rec[HEADER_LEN..HEADER_LEN + h.key_len as usize].to_vec()));
                        pending_gaps += 1;
                        pos += h.padded_len();
                    }
                }
            }
            Err(DecodeError::Short) => break,
            Err(_) => match resync(&mut w, pos + record::ALIGN, end, generation)? {
                Some(next) => {
                    pending_gaps += 1;
                    pos = next;
                }
                None => break,
            },
        }
    }
    Ok(out)
}

/// The next 8-aligned offset after a damaged stretch where a whole valid record of
/// `generation` starts, if any.
fn resync(w: &mut Window<'_>, from: u64, end: u64, generation: u32) -> std::io::Result<Option<u64>> {
    let mut p = from;
    while p + HEADER_LEN as u64 <= end {
        let b = w.at(p, HEADER_LEN + MAX_KEY_LEN)?;
        if b.len() >= 4 && b[..4] == record::MAGIC.to_le_bytes() {
            if let Ok(h) = record::decode_header(b) {
                if h.generation == generation && p + h.record_len() <= end {
                    let len = h.record_len() as usize;
                    if record::decode(w.at(p, len)?).is_ok() {
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
    /// Volumes found.
    pub volumes: u64,
    /// Sealed volumes loaded from hint files.
    pub hint_loads: u64,
    /// Volumes scanned record by record.
    pub scans: u64,
    /// Records replayed (from scans and hints).
    pub records: u64,
    /// Damaged records or stretches skipped.
    pub skipped: u64,
    /// Bytes cut from torn tails.
    pub truncated_bytes: u64,
    /// Wall time of the recovery in milliseconds.
    pub millis: u64,
}

/// Where the writer continues after recovery.
pub(crate) struct Recovered {
    pub active: Option<(usize, u64)>,
    pub next_sequence: u64,
    pub unhinted: Vec<usize>,
    pub report: RecoveryReport,
}

/// Replays everything in the data directory into `sh`'s index and slot table.
pub(crate) fn recover(sh: &Shared, hints_trusted: bool) -> Result<Recovered> {
    let started = std::time::Instant::now();
    let count = sh.slots.len();
    let mut report = RecoveryReport::default();
    let read_dir = std::fs::read_dir(&sh.dir).map_err(|e| Error::io("listing the data directory", e))?;
    for entry in read_dir.flatten() {
        let name = entry.file_name();
        if let Some(slot) = name.to_str().and_then(slot_of_file_name) {
            if slot >= count {
                tracing::warn!(file = ?name, "slot beyond --volume-count; removing it (its keys are evicted)");
                io::remove_if_exists(&entry.path()).map_err(|e| Error::io("removing an out-of-ring volume", e))?;
            }
        }
    }

    let mut found: Vec<(u64, usize, VolumeHeader)> = Vec::new();
    for slot in 0..count {
        let path = volume_path(&sh.dir, slot);
        if !path.exists() {
            io::remove_if_exists(&hint_path(&sh.dir, slot)).map_err(|e| Error::io("removing an orphan hint", e))?;
            continue;
        }
        let file =
            OpenOptions::new().read(true).write(true).open(&path).map_err(|e| Error::io("opening a volume", e))?;
        let mut hb = [0u8; VOLUME_HEADER_LEN as usize];
        let n = io::read_at_most(&file, &mut hb, 0).map_err(|e| Error::io("reading a volume header", e))?;
        let header = VolumeHeader::decode(&hb[..n]).filter(|h| h.slot as usize == slot);
        let header = match header {
            Some(h) if hints_trusted && h.dir_id != sh.dir_id => {
                tracing::warn!(?path, "volume belongs to another data directory; discarding it");
                None
            }
            h => h,
        };
        let s = &sh.slots[slot];
        match header {
            Some(h) => {
                s.generation.store(h.generation, std::sync::atomic::Ordering::Release);
                s.sequence.store(h.sequence, std::sync::atomic::Ordering::Relaxed);
                found.push((h.sequence, slot, h));
            }
            None => {
                // A torn reset or foreign bytes: nothing here can be served. Reclaim the space.
                tracing::warn!(?path, "volume header unreadable; treating the slot as empty");
                file.set_len(0).map_err(|e| Error::io("emptying a damaged volume", e))?;
                io::remove_if_exists(&hint_path(&sh.dir, slot)).map_err(|e| Error::io("removing a hint", e))?;
            }
        }
        let _ = s.file.set(file);
    }
    found.sort_by_key(|f| f.0);
    report.volumes = found.len() as u64;

    let mut unhinted = Vec::new();
    let mut active = None;
    for (i, &(_, slot, vh)) in found.iter().enumerate() {
        let is_active = i + 1 == found.len();
        let s = &sh.slots[slot];
        let file = s.file.get().expect("opened above");
        let file_len = file.metadata().map_err(|e| Error::io("reading a volume's length", e))?.len();
        if !is_active && hints_trusted {
            if let Ok(bytes) = std::fs::read(hint_path(&sh.dir, slot)) {
                if let Some(entries) = hint::decode(&bytes, &vh, file_len) {
                    for e in entries {
                        report.records += 1;
                        apply_hint(sh, slot, vh.generation, e);
                    }
                    report.hint_loads += 1;
                    s.len.store(file_len, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                tracing::warn!(slot, "hint file does not match its volume; scanning the volume");
            }
        }
        report.scans += 1;
        let now = crate::store::now_ms();
        let outcome = scan_volume(file, VOLUME_HEADER_LEN, file_len, vh.generation, |ev| match ev {
            ScanEvent::Valid { offset, header, key } => {
                let hash = sh.hash(key);
                if header.is_tombstone() || (header.expiry_ms != 0 && header.expiry_ms <= now) {
                    sh.drop_if_key(hash, key);
                } else {
                    sh.index.insert(hash, sh.loc(slot, vh.generation, offset, header.record_len()));
                }
            }
            ScanEvent::Damaged { offset, header, key } => {
                tracing::warn!(slot, offset, record_len = header.record_len(), "damaged record skipped");
                sh.drop_if_key(sh.hash(key), key);
            }
        })
        .map_err(|e| Error::io("scanning a volume", e))?;
        report.records += outcome.records;
        report.skipped += outcome.skipped;
        if outcome.valid_end < file_len {
            report.truncated_bytes += file_len - outcome.valid_end;
            tracing::warn!(
                slot,
                from = outcome.valid_end,
                bytes = file_len - outcome.valid_end,
                "truncating the tail after the last valid record"
            );
            file.set_len(outcome.valid_end).map_err(|e| Error::io("truncating a torn tail", e))?;
        }
        s.len.store(outcome.valid_end, std::sync::atomic::Ordering::Relaxed);
        if is_active {
            active = Some((slot, outcome.valid_end));
        } else {
            unhinted.push(slot);
        }
    }
    report.millis = started.elapsed().as_millis() as u64;
    Ok(Recovered { active, next_sequence: found.last().map_or(1, |f| f.0 + 1), unhinted, report })
}

fn apply_hint(sh: &Shared, slot: usize, generation: u32, e: HintEntry) {
    match e {
        HintEntry::Put { hash, offset, len, expiry_ms } => {
            if expiry_ms != 0 && expiry_ms <= crate::store::now_ms() {
                return; // expired while down; older values of the key stay shadowed by the index
            }
            sh.index.insert(hash, sh.loc(slot, generation, offset, len as u64));
        }
        HintEntry::Drop { hash, key, .. } => sh.drop_if_key(hash, &key),
    }
}

/// Builds the hint entries of a sealed volume by scanning it.
pub(crate) fn hint_entries(sh: &Shared, file: &File, len: u64, generation: u32) -> std::io::Result<Vec<HintEntry>> {
    let mut entries = Vec::new();
    scan_volume(file, VOLUME_HEADER_LEN, len, generation, |ev| {
        let (offset, header, key, dropped) = match ev {
            ScanEvent::Valid { offset, header, key } => (offset, header, key, header.is_tombstone()),
            ScanEvent::Damaged { offset, header, key } => (offset, header, key, true),
        };
        let hash = sh.hash(key);
        let len = header.record_len() as u32;
        entries.push(if dropped {
            HintEntry::Drop { hash, offset, len, key: key.to_vec() }
        } else {
            HintEntry::Put { hash, offset, len, expiry_ms: header.expiry_ms }
        });
    })?;
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn rec(key: &[u8], value: &[u8], generation: u32) -> Vec<u8> {
        let mut b = Vec::new();
        let h = Header { flags: 0, key_len: 0, value_len: 0, meta_len: 0, generation, stored_ms: 0, expiry_ms: 0 };
        record::encode_into(&mut b, &h, key, b"", value);
        b
    }

    fn scan_bytes(bytes: &[u8], generation: u32) -> (ScanOutcome, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let f =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(dir.path().join("v")).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        let mut seen = Vec::new();
        let out = scan_volume(&f, 0, bytes.len() as u64, generation, |ev| {
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
    }

    #[test]
    fn another_generation_ends_the_scan() {
        let all = [rec(b"a", b"1", 2), rec(b"old", b"2", 1), rec(b"c", b"3", 2)].concat();
        let (_, seen) = scan_bytes(&all, 2);
        assert_eq!(seen, ["ok a"]);
    }
}
