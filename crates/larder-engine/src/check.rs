//! Offline verification of a data directory (`larder check`): every record of every volume
//! against its checksums, and every hint file against the volume it describes.
//!
//! It reads only and changes nothing, and holds the directory's lock meanwhile, so that no
//! server appends (or recovers) under it. What it calls *corrupt* is what recovery would skip
//! or discard as damage: records failing their checksums, unreadable stretches, bytes after
//! the last valid record of a sealed volume, a damaged volume header or manifest. A torn tail
//! of the active volume (a write cut short by a crash, never acknowledged) is reported but is
//! not damage. Hint files that do not match their volume are reported too; recovery would
//! scan those volumes instead, so they cost time, not data.

use crate::disk::dicts::Dicts;
use crate::format::hint::{Hint, HintEntry};
use crate::format::large;
use crate::format::record::{self, Header};
use crate::format::volume::{hint_path, slot_of_file_name, volume_path, VolumeHeader, VOLUME_HEADER_LEN};
pub use crate::recovery::scan::{scan_volume, ScanEvent, ScanOutcome, ScanRange};
use crate::{io, Error, ErrorKind, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// One finding, located as precisely as the damage allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file it is in.
    pub file: PathBuf,
    /// Byte offset in that file, when known.
    pub offset: Option<u64>,
    /// What is wrong, in a few words.
    pub what: String,
}

/// What a check found.
#[derive(Debug, Default, Clone)]
pub struct CheckReport {
    /// Volume files checked.
    pub volumes: u64,
    /// Records whose checksums verified.
    pub records: u64,
    /// Bytes of volume files read.
    pub bytes: u64,
    /// Hint files (and checkpoints) compared entry by entry with their volumes.
    pub hints_checked: u64,
    /// Sealed volumes without a hint file (recovery scans them; normal after a crash).
    pub unhinted: u64,
    /// Damage: records failing their checksums and the like. Non-empty means exit non-zero.
    pub corrupt: Vec<Finding>,
    /// Hint files that do not describe their volume.
    pub hint_mismatches: Vec<Finding>,
    /// The torn tail of the active volume, if any (not damage).
    pub torn_tail: Option<Finding>,
    /// Oddities that are neither damage nor mismatches (files of other slots and the like).
    pub notes: Vec<Finding>,
    /// Chunks of large values that died and whose bodies were freed (punched): free space.
    pub punched_chunks: u64,
    /// Coded (compressed) records, each decoded and checked against its value's checksum.
    pub coded_records: u64,
    /// Sound dictionary files (each id once, whatever the number of copies).
    pub dictionaries: u64,
}

impl CheckReport {
    /// Whether nothing was corrupt.
    pub fn clean(&self) -> bool {
        self.corrupt.is_empty()
    }
}

/// How far a check has come: volume bytes to read and read.
#[derive(Debug, Default)]
pub struct CheckProgress {
    /// Bytes of all volume files.
    pub bytes_total: AtomicU64,
    /// Of those, bytes checked.
    pub bytes_done: AtomicU64,
}

fn finding(file: &Path, offset: Option<u64>, what: impl Into<String>) -> Finding {
    Finding { file: file.to_path_buf(), offset, what: what.into() }
}

/// Checks the data directory `dir`. Fails only if the directory cannot be read or is in use;
/// everything found in it is in the report.
pub fn check_dir(dir: &Path, progress: &CheckProgress) -> Result<CheckReport> {
    check_dirs(&[dir.to_path_buf()], progress)
}

/// Checks the data directories of one store together (the newest volume of all is the
/// active one). Fails only if a directory cannot be read or is in use.
pub fn check_dirs(dirs: &[PathBuf], progress: &CheckProgress) -> Result<CheckReport> {
    let mut locks = Vec::new();
    for dir in dirs {
        if !dir.is_dir() {
            return Err(Error::new(ErrorKind::Invalid, format!("{} is not a directory", dir.display())));
        }
        if let Ok(f) = File::open(dir.join("LOCK")) {
            if f.try_lock_shared().is_err() {
                let msg = format!("{} is in use by a running server; stop it first", dir.display());
                return Err(Error::new(ErrorKind::Locked, msg));
            }
            locks.push(f);
        }
    }
    let mut report = CheckReport::default();
    // The newest sound copy of the manifest holds the key-hash seed.
    let mut seed: Option<(u64, u64)> = None;
    let mut damaged = Vec::new();
    for dir in dirs {
        let path = dir.join(crate::format::manifest::FILE_NAME);
        match crate::disk::dirs::load_manifest(dir).map_err(|e| Error::io("reading the manifest", e))? {
            Some(Some(m)) if seed.is_none_or(|(epoch, _)| m.epoch > epoch) => seed = Some((m.epoch, m.hash_seed)),
            Some(Some(_)) => {}
            Some(None) => damaged.push(path),
            None => report.notes.push(finding(&path, None, "no manifest here")),
        }
    }
    for path in damaged {
        match seed {
            None => report.corrupt.push(finding(&path, None, "manifest fails its checksum")),
            Some(_) => report.notes.push(finding(&path, None, "manifest copy fails its checksum (another is sound)")),
        }
    }
    for dir in dirs {
        let path = dir.join(crate::format::flush::FILE_NAME);
        if let Ok(bytes) = std::fs::read(&path) {
            if crate::format::flush::Flush::decode(&bytes).is_none() {
                report.corrupt.push(finding(&path, None, "flush file fails its checksum"));
            }
        }
    }
    let seed = seed.map(|s| s.1);
    if seed.is_none() {
        report.notes.push(finding(&dirs[0], None, "no sound manifest: hint files cannot be compared"));
    }

    // Every volume and hint file, by slot.
    let mut volumes: Vec<(PathBuf, usize, io::Handle, u64, VolumeHeader)> = Vec::new();
    let mut hints: Vec<(PathBuf, usize)> = Vec::new();
    for dir in dirs {
        let dir_id = crate::disk::dirs::load_dir_id(dir).map(|d| d.dir_id);
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing the data directory", e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(slot) = slot_of_file_name(&name) else { continue };
            let path = entry.path();
            if name.ends_with(".hint") {
                hints.push((dir.clone(), slot));
                continue;
            }
            let file =
                io::open(&path, io::Mode::Read).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
            let len = file.len().map_err(|e| Error::io("reading a volume's length", e))?;
            let mut hb = [0u8; VOLUME_HEADER_LEN as usize];
            let n = file.read_at_most(&mut hb, 0).map_err(|e| Error::io("reading a volume header", e))?;
            match VolumeHeader::decode(&hb[..n]) {
                Some(h) if h.slot as usize != slot => {
                    report.notes.push(finding(&path, Some(0), "volume header names another slot"))
                }
                Some(h) if dir_id.is_some_and(|id| id != h.dir_id) => {
                    report.notes.push(finding(&path, Some(0), "volume header names another data directory"))
                }
                Some(h) => volumes.push((dir.clone(), slot, file, len, h)),
                None if len < VOLUME_HEADER_LEN => {
                    report.notes.push(finding(&path, None, "empty volume (a slot not yet used, or reset)"))
                }
                None => report.corrupt.push(finding(&path, Some(0), "volume header fails its checksum")),
            }
        }
    }
    volumes.sort_by_key(|v| v.4.sequence);
    // A slot's older copy in another directory (left where a reset failed) is not its volume.
    let mut i = 0;
    while i < volumes.len() {
        if volumes[i + 1..].iter().any(|v| v.1 == volumes[i].1) {
            let old = volumes.remove(i);
            let what = "older copy of a slot whose newer volume is in another directory; the server empties it";
            report.notes.push(finding(&volume_path(&old.0, old.1), Some(0), what));
        } else {
            i += 1;
        }
    }
    hints.retain(|(dir, slot)| !volumes.iter().any(|v| v.0 == *dir && v.1 == *slot));
    for (dir, slot) in hints {
        report.hint_mismatches.push(finding(&hint_path(&dir, slot), None, "hint file without a volume"));
    }
    progress.bytes_total.store(volumes.iter().map(|v| v.3).sum(), Ordering::Relaxed);

    // The dictionaries coded records may name (any directory's sound copy serves).
    let paths: Vec<&Path> = dirs.iter().map(|d| d.as_path()).collect();
    let (dicts, damaged) = Dicts::load_paths(&paths, zstd::DEFAULT_COMPRESSION_LEVEL);
    for path in damaged {
        let id = path.file_name().and_then(|n| crate::format::dict::id_of_name(&n.to_string_lossy()));
        match id.and_then(|id| dicts.get(id)) {
            Some(_) => report.notes.push(finding(&path, None, "dictionary copy fails its checks (another is sound)")),
            None => report.corrupt.push(finding(&path, None, "dictionary file fails its checks")),
        }
    }
    report.dictionaries = dicts.all().len() as u64;

    let count = volumes.len();
    for (i, (dir, slot, file, len, vh)) in volumes.iter().enumerate() {
        let is_active = i + 1 == count;
        check_volume(dir, *slot, &**file, *len, vh, is_active, seed, &dicts, &mut report, progress)
            .map_err(|e| Error::io(format!("reading {}", volume_path(dir, *slot).display()), e))?;
        report.volumes += 1;
        report.bytes += len;
        progress.bytes_done.store(report.bytes, Ordering::Relaxed);
    }
    drop(locks);
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn check_volume(
    dir: &Path,
    slot: usize,
    file: &dyn io::FileIo,
    len: u64,
    vh: &VolumeHeader,
    is_active: bool,
    seed: Option<u64>,
    dicts: &Dicts,
    report: &mut CheckReport,
    progress: &CheckProgress,
) -> std::io::Result<()> {
    let path = volume_path(dir, slot);
    let hpath = hint_path(dir, slot);
    let hint_bytes = std::fs::read(&hpath).ok();
    let hint = match (&hint_bytes, seed) {
        (Some(b), Some(_)) => {
            let h = Hint::open(b, vh, len);
            match &h {
                None => report.hint_mismatches.push(finding(&hpath, None, "hint does not match its volume")),
                Some(h) if !is_active && h.data_len != len => report.hint_mismatches.push(finding(
                    &hpath,
                    None,
                    format!("hint covers {} of the sealed volume's {len} bytes", h.data_len),
                )),
                Some(_) => {}
            }
            h
        }
        (None, _) if !is_active => {
            report.unhinted += 1;
            None
        }
        _ => None,
    };
    let covered = hint.as_ref().map_or(0, |h| h.data_len);
    let mut expected = hint.as_ref().map(|h| h.iter());
    let mut hint_ok = true;
    let mut compare = |offset: u64, got: HintEntry| {
        let Some(it) = expected.as_mut().filter(|_| hint_ok && offset < covered) else { return };
        if it.next().as_ref() != Some(&got) {
            hint_ok = false;
        }
    };
    let done_before = progress.bytes_done.load(Ordering::Relaxed);
    let mut damaged = 0u64;
    let range = ScanRange {
        start: VOLUME_HEADER_LEN,
        end: len,
        generation: vh.generation,
        salt: vh.salt,
        torn_tail_possible: is_active,
        values_checked: true,
    };
    let outcome = scan_volume(file, range, |ev| {
        if let Some(entry) = seed.and_then(|seed| ev.hint_entry(xxhash_rust::xxh3::xxh3_64_with_seed(ev.key(), seed))) {
            compare(ev.offset(), entry);
        }
        match ev {
            ScanEvent::Valid { offset, header, key } => {
                if offset % (64 << 20) < header.padded_len() {
                    progress.bytes_done.store(done_before + offset, Ordering::Relaxed);
                }
                // A coded record's checksum covers its coded bytes: they must also decode (a
                // chunk's, once its body is known sound: a dead one may be punched).
                let coded = |report: &mut CheckReport| {
                    report.coded_records += 1;
                    if let Some(why) = coded_body(dicts, file, offset, &header, vh.salt) {
                        let what = format!("coded record of key {:?}: {why}", String::from_utf8_lossy(key));
                        report.corrupt.push(finding(&path, Some(offset), what));
                    }
                };
                if header.is_coded() && !header.is_chunk() {
                    coded(report);
                }
                // The scan trusts a chunk's header; its body is verified here.
                if header.is_chunk() {
                    match chunk_body(file, offset, &header, vh.salt) {
                        Ok(ChunkBody::Sound) if header.is_coded() => coded(report),
                        Ok(ChunkBody::Sound) => {}
                        Ok(ChunkBody::Punched) => report.punched_chunks += 1,
                        // Not among the scan's skipped records: `damaged` counts those.
                        Ok(ChunkBody::Damaged) | Err(_) => {
                            let what = format!(
                                "chunk of key {:?} ({} bytes) fails its checksum",
                                String::from_utf8_lossy(key),
                                header.record_len()
                            );
                            report.corrupt.push(finding(&path, Some(offset), what));
                        }
                    }
                }
            }
            ScanEvent::Damaged { offset, header, key } => {
                damaged += 1;
                let what = format!(
                    "record of key {:?} ({} bytes) fails its checksum",
                    String::from_utf8_lossy(key),
                    header.record_len()
                );
                report.corrupt.push(finding(&path, Some(offset), what));
            }
        }
    })?;
    report.records += outcome.records;
    if outcome.skipped > damaged {
        let what = format!("{} damaged stretches skipped (record headers unreadable)", outcome.skipped - damaged);
        report.corrupt.push(finding(&path, None, what));
    }
    if outcome.valid_end < len {
        let what = format!("{} bytes after the last valid record", len - outcome.valid_end);
        let f = finding(&path, Some(outcome.valid_end), what);
        if is_active {
            report.torn_tail = Some(f); // a write cut short: recovery truncates it
        } else {
            report.corrupt.push(f);
        }
    }
    if let Some(h) = &hint {
        report.hints_checked += 1;
        // Entries the scan never reached (damage ended it early) are mismatches too.
        let left = expected.map_or(0, |it| it.count());
        if !hint_ok || left > 0 || covered > outcome.valid_end {
            let what = format!("hint of {} entries differs from the records it covers", h.len());
            report.hint_mismatches.push(finding(&hpath, None, what));
        }
    }
    Ok(())
}

/// Why the coded record at `offset`, whose checksums the scan verified, does not decode to
/// its value; `None` when it does.
fn coded_body(dicts: &Dicts, file: &dyn io::FileIo, offset: u64, h: &Header, salt: u32) -> Option<String> {
    let mut buf = vec![0u8; h.record_len() as usize];
    match file.read_at_most(&mut buf, offset) {
        Ok(n) if n == buf.len() => {}
        Ok(_) => return Some("cut short".into()),
        Err(e) => return Some(format!("unreadable: {e}")),
    }
    let r = match record::decode(&buf, salt) {
        Ok(r) => r,
        Err(e) => return Some(format!("{e:?}")),
    };
    let Some(c) = crate::format::meta::Meta::parse(r.meta).coded else {
        return Some("no coding in its metadata".into());
    };
    crate::disk::decode_checked(dicts, &buf[r.value_range.0..r.value_range.1], &c).err()
}

enum ChunkBody {
    Sound,
    /// Its value died and the whole pages of its body were punched: free space.
    Punched,
    Damaged,
}

/// Verifies the body of the chunk record at `offset`. A body that fails is a punched one if
/// the pages a punch frees (those wholly inside the body) are a hole, and damage otherwise.
fn chunk_body(file: &dyn io::FileIo, offset: u64, h: &Header, salt: u32) -> std::io::Result<ChunkBody> {
    let len = h.record_len();
    let mut buf = vec![0u8; len as usize];
    let n = file.read_at_most(&mut buf, offset)?;
    if n == buf.len() && record::decode(&buf, salt).is_ok() {
        return Ok(ChunkBody::Sound);
    }
    Ok(match large::punched_range(offset, h) {
        Some((from, to)) if file.is_hole(from, to - from)? => ChunkBody::Punched,
        _ => ChunkBody::Damaged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeleteOptions, FsyncPolicy, PutOptions, Store, StoreConfig};
    use std::os::unix::fs::FileExt;

    fn filled(dir: &Path) {
        let cfg =
            StoreConfig { volume_size: 64 << 10, volume_count: 8, fsync: FsyncPolicy::Never, ..StoreConfig::new(dir) };
        let store = Store::open(cfg).unwrap();
        for i in 0..300u32 {
            store.put(format!("k{i}").as_bytes(), &vec![i as u8; 500], &PutOptions::default()).unwrap();
        }
        store.delete(b"k7", &DeleteOptions::default()).unwrap();
        store.close().unwrap();
    }

    #[test]
    fn a_clean_directory_checks_clean_and_hints_match() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let r = check_dir(dir.path(), &CheckProgress::default()).unwrap();
        assert!(r.clean(), "{r:?}");
        assert!(r.hint_mismatches.is_empty() && r.torn_tail.is_none(), "{r:?}");
        assert_eq!(r.records, 301);
        assert_eq!(r.hints_checked, r.volumes, "sealed hints and the checkpoint: {r:?}");
    }

    #[test]
    fn a_flipped_value_byte_and_a_stale_hint_are_found() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let vol = volume_path(dir.path(), 0);
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&vol).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 2000).unwrap();
        f.write_all_at(&[b[0] ^ 0x01], 2000).unwrap();
        let r = check_dir(dir.path(), &CheckProgress::default()).unwrap();
        assert_eq!(r.corrupt.len(), 1, "{r:?}");
        assert_eq!(r.corrupt[0].file, vol);
        assert!(r.corrupt[0].offset.unwrap() <= 2000);
        // The hint still says Put where the record is now damaged.
        assert_eq!(r.hint_mismatches.len(), 1, "{r:?}");
    }

    #[test]
    fn a_torn_tail_of_the_active_volume_is_not_damage() {
        let dir = tempfile::tempdir().unwrap();
        filled(dir.path());
        let r = check_dir(dir.path(), &CheckProgress::default()).unwrap();
        let active = r.volumes as usize - 1; // slots fill in order from 0, the ring has not turned
        let vol = volume_path(dir.path(), active);
        let f = std::fs::OpenOptions::new().append(true).open(&vol).unwrap();
        std::io::Write::write_all(&mut &f, &[0x4c; 40]).unwrap();
        let r = check_dir(dir.path(), &CheckProgress::default()).unwrap();
        assert!(r.clean(), "{r:?}");
        assert_eq!(r.torn_tail.as_ref().map(|t| t.file.clone()), Some(vol));
    }

    #[test]
    fn a_directory_in_use_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _store = Store::open(StoreConfig::new(dir.path())).unwrap();
        let e = check_dir(dir.path(), &CheckProgress::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Locked);
    }
}
