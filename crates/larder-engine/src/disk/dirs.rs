//! Data directories: telling them apart, opening them, and choosing where a new volume goes.
//!
//! A store may span several directories (one per disk). Each carries a `DIR-ID` file naming
//! the store it belongs to and its own id; volume headers carry the id too. The manifest
//! (copied into every directory) maps each ring slot to a directory id, so the order of the
//! directories given never matters, and a directory that is missing at start is known by the
//! volumes it held: the store starts without it (degraded) unless told to be strict.
//!
//! Placement follows CFS: a new volume goes to the usable directory with the lowest
//! utilization, larder's bytes in it ÷ (its free space + larder's bytes), ties broken
//! round-robin, so that two directories on one filesystem alternate and a directory added
//! empty takes new volumes until it has caught up. Nothing is ever moved to rebalance.

use crate::format::dir_id::{DirId, ID_FILE};
use crate::format::manifest::{self, Manifest};
use crate::format::volume::{slot_of_file_name, VolumeHeader, VOLUME_HEADER_LEN};
use crate::{io, Error, ErrorKind, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Reads the id file of `dir`: `None` when absent or damaged.
pub(crate) fn load_dir_id(dir: &Path) -> Option<DirId> {
    std::fs::read(dir.join(ID_FILE)).ok().and_then(|b| DirId::decode(&b))
}

/// Reads the manifest of `dir`: `Ok(None)` when there is none, `Err` when unreadable.
pub(crate) fn load_manifest(dir: &Path) -> std::io::Result<Option<Option<Manifest>>> {
    match std::fs::read(dir.join(manifest::FILE_NAME)) {
        Ok(b) => Ok(Some(Manifest::decode(&b))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A data directory of an open store.
pub(crate) struct DataDir {
    /// Where it is (for a missing directory: where it was last seen).
    pub path: PathBuf,
    /// The only directory of the store: never marked failed (there is nowhere else to go).
    pub alone: bool,
    pub id: [u8; 16],
    /// Opened at start; a missing directory holds volumes that cannot be read.
    pub present: bool,
    /// Set when a write, sync or volume creation in it fails: no new volume is placed here
    /// until the next start.
    pub failed: AtomicBool,
    _lock: Option<File>,
}

impl DataDir {
    /// Whether new volumes may be placed here.
    pub fn usable(&self) -> bool {
        self.present && !self.failed.load(Ordering::Relaxed)
    }

    /// Marks the directory failed (once, loudly).
    pub fn fail(&self, why: &dyn std::fmt::Display) {
        if self.present && !self.alone && !self.failed.swap(true, Ordering::Relaxed) {
            tracing::error!(dir = %self.path.display(), error = %why,
                "data directory failed: new volumes go to the others; its keys answer as unavailable");
        }
    }

    /// A volume was created here after all: the directory works again.
    pub fn recovered(&self) {
        if self.failed.swap(false, Ordering::Relaxed) {
            tracing::warn!(dir = %self.path.display(), "data directory takes new volumes again");
        }
    }
}

/// The directories of a store being opened, aligned with `manifest.dirs`.
pub(crate) struct Opened {
    pub manifest: Manifest,
    pub dirs: Vec<DataDir>,
    /// Whether hint files may be used: false when the key-hash seed they were made with is
    /// gone (no sound manifest anywhere).
    pub hints_trusted: bool,
    /// A directory that held volumes is missing: the store opens degraded.
    pub missing: bool,
}

fn random_id() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| Error::new(ErrorKind::Io, format!("no randomness for an id: {e}")))?;
    Ok(id)
}

/// Whether `dir` holds any volume file.
fn has_volumes(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".lrv") && slot_of_file_name(n).is_some()))
    })
}

/// The directory id of the newest volume in `dir`, so that a directory whose id file and
/// manifest are both lost keeps its volumes.
pub(crate) fn newest_volume_dir_id(dir: &Path) -> Option<[u8; 16]> {
    let mut newest: Option<VolumeHeader> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        if !entry.file_name().to_string_lossy().ends_with(".lrv") {
            continue;
        }
        let Ok(f) = io::open(&entry.path(), io::Mode::Read) else { continue };
        let mut hb = [0u8; VOLUME_HEADER_LEN as usize];
        let Ok(n) = f.read_at_most(&mut hb, 0) else { continue };
        if let Some(h) = VolumeHeader::decode(&hb[..n]) {
            if newest.is_none_or(|n| h.sequence > n.sequence) {
                newest = Some(h);
            }
        }
    }
    newest.map(|h| h.dir_id)
}

/// What was found at one configured path before anything is written.
struct Seen {
    path: PathBuf,
    exists: bool,
    id: Option<DirId>,
    manifest: Option<Option<Manifest>>,
}

/// Identifies and locks the configured directories and settles the manifest.
///
/// `volume_size`/`volume_count` are the shape asked for. A directory the manifest names but
/// which is not among `paths` (or is there but empty where it was last seen, as an unmounted
/// mount point is) is missing: an error if `strict`, else a loud warning.
pub(crate) fn open(paths: &[PathBuf], volume_size: u64, volume_count: u32, strict: bool) -> Result<Opened> {
    if paths.is_empty() {
        return Err(Error::new(ErrorKind::Invalid, "no data directory given"));
    }
    let mut seen: Vec<Seen> = Vec::new();
    let mut canonical: Vec<PathBuf> = Vec::new();
    for p in paths {
        let exists = p.exists();
        if exists && !p.is_dir() {
            return Err(Error::new(ErrorKind::Invalid, format!("{} is not a directory", p.display())));
        }
        let canon = if exists { p.canonicalize().unwrap_or_else(|_| p.clone()) } else { p.clone() };
        if canonical.contains(&canon) {
            return Err(Error::new(ErrorKind::Invalid, format!("data directory {} is given twice", p.display())));
        }
        canonical.push(canon);
        let manifest = if exists {
            load_manifest(p).map_err(|e| Error::io(format!("reading the manifest in {}", p.display()), e))?
        } else {
            None
        };
        seen.push(Seen { path: p.clone(), exists, id: if exists { load_dir_id(p) } else { None }, manifest });
    }

    // The newest sound copy of the manifest wins.
    let copies: Vec<&Manifest> = seen.iter().filter_map(|s| s.manifest.as_ref()?.as_ref()).collect();
    if copies.iter().any(|m| m.store_id != copies[0].store_id) {
        return Err(Error::new(ErrorKind::Corrupt, "the data directories belong to different larder stores"));
    }
    let best = copies.into_iter().max_by_key(|m| m.epoch).cloned();
    let hints_trusted = best.is_some();
    let mut manifest = match best {
        Some(m) => {
            if m.volume_size != volume_size || m.volume_count != volume_count {
                tracing::warn!(
                    was_size = m.volume_size,
                    was_count = m.volume_count,
                    "ring shape changed since the last run; volumes that no longer fit are discarded"
                );
            }
            // The slot table keeps its old length until the missing directories are known.
            Manifest { volume_size, volume_count, ..m }
        }
        None => {
            if seen.iter().any(|s| s.manifest.is_some() || (s.exists && has_volumes(&s.path))) {
                tracing::warn!("manifest is damaged or lost; making a new one and scanning every volume");
            }
            let mut m =
                Manifest::fresh(volume_size, volume_count).map_err(|e| Error::io("generating a store id", e))?;
            // Keep the store's identity, so its directories stay its own.
            if let Some(id) = seen.iter().find_map(|s| s.id) {
                m.store_id = id.store_id;
            }
            m
        }
    };
    let fresh_store = manifest.dirs.is_empty();

    // Each present directory's id: its id file, else (an upgraded one-directory store) the
    // id its own version 1 manifest gave it, else its newest volume's, else a new one.
    let mut ids: Vec<Option<[u8; 16]>> = Vec::new();
    for s in &seen {
        if !s.exists {
            ids.push(None);
            continue;
        }
        let id = match s.id {
            Some(d) if d.store_id != manifest.store_id => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{} belongs to another larder store; refusing to mix them", s.path.display()),
                ));
            }
            Some(d) => Some(d.dir_id),
            None => match &s.manifest {
                Some(Some(m)) if m.dirs.len() == 1 && m.store_id == manifest.store_id => Some(m.dirs[0].id),
                _ => newest_volume_dir_id(&s.path),
            },
        };
        ids.push(id);
    }

    // Directories the manifest names that none of the configured paths is.
    let found: Vec<[u8; 16]> = ids.iter().flatten().copied().collect();
    if let Some(dup) = (0..found.len()).find(|&i| found[i + 1..].contains(&found[i])) {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("two data directories have the same id {} (one is a copy of the other)", hex(&found[dup])),
        ));
    }
    let mut missing: Vec<usize> = (0..manifest.dirs.len())
        .filter(|&i| !found.contains(&manifest.dirs[i].id) && manifest.slots.iter().any(|s| s.dir as usize == i))
        .collect();
    // A path without an id, where a missing directory was last seen, is taken for that
    // directory unmounted (an empty mount point), not for a new one: volumes written there
    // would land on the wrong filesystem.
    let mut stand_in = vec![false; seen.len()];
    for (i, s) in seen.iter().enumerate() {
        let unknown = ids[i].is_none() && !(s.exists && has_volumes(&s.path));
        let same =
            |a: &Path, b: &Path| a == b || a.canonicalize().ok().is_some_and(|x| b.canonicalize().ok() == Some(x));
        if unknown && missing.iter().any(|&m| same(&manifest.dirs[m].path, &s.path)) {
            stand_in[i] = true;
        }
    }
    if !fresh_store {
        for (i, s) in seen.iter().enumerate() {
            if !s.exists && !stand_in[i] {
                tracing::warn!(dir = %s.path.display(), "data directory does not exist; creating it as a new, empty one");
            }
        }
    }
    missing.sort_unstable();
    if !missing.is_empty() {
        let list: Vec<String> = missing
            .iter()
            .map(|&m| {
                let volumes = manifest.slots.iter().filter(|s| s.dir as usize == m).count();
                format!("{} (id {}, {volumes} volumes)", manifest.dirs[m].path.display(), hex(&manifest.dirs[m].id))
            })
            .collect();
        let what = format!("data directories missing: {}", list.join(", "));
        if strict {
            return Err(Error::new(ErrorKind::Io, format!("{what}; refusing to start (--strict-dirs)")));
        }
        tracing::error!(
            "{what}; starting degraded: what was stored before is left out until it returns (new writes are served)"
        );
        // Slots beyond a smaller ring would take the missing directories' volumes out of
        // the table: keep the ring's size until they return.
        if (volume_count as usize) < manifest.slots.len() {
            tracing::warn!(
                asked = volume_count,
                keeping = manifest.slots.len(),
                "not shrinking the ring while a data directory is missing"
            );
            manifest.volume_count = manifest.slots.len() as u32;
        }
    }
    let count = manifest.volume_count as usize;
    manifest.slots.resize(count, manifest.slot(usize::MAX));

    // Open, lock and identify every usable configured directory.
    let mut opened: Vec<(usize, PathBuf, [u8; 16], File)> = Vec::new();
    for (i, s) in seen.iter().enumerate() {
        if stand_in[i] {
            tracing::error!(dir = %s.path.display(),
                "data directory is empty where a missing one was last seen (not mounted?); not using it");
            continue;
        }
        std::fs::create_dir_all(&s.path).map_err(|e| Error::io(format!("creating {}", s.path.display()), e))?;
        let lock = File::create(s.path.join("LOCK")).map_err(|e| Error::io("creating the lock file", e))?;
        if lock.try_lock().is_err() {
            return Err(Error::new(ErrorKind::Locked, format!("{} is in use by another process", s.path.display())));
        }
        let id = match ids[i] {
            Some(id) => id,
            None => random_id()?,
        };
        if s.id.map(|d| d.dir_id) != Some(id) {
            let file = DirId { store_id: manifest.store_id, dir_id: id };
            io::write_atomic(&s.path.join(ID_FILE), &file.encode())
                .map_err(|e| Error::io(format!("writing the id file in {}", s.path.display()), e))?;
        }
        opened.push((i, s.path.clone(), id, lock));
    }
    if opened.is_empty() {
        return Err(Error::new(ErrorKind::Io, "no data directory is usable"));
    }

    for (_, path, id, _) in &opened {
        manifest.dir_index(*id, path);
    }
    let keep: Vec<[u8; 16]> = opened.iter().map(|o| o.2).collect();
    manifest.forget_unused_dirs(&keep);
    let mut dirs: Vec<DataDir> = manifest
        .dirs
        .iter()
        .map(|d| DataDir {
            path: d.path.clone(),
            alone: manifest.dirs.len() == 1,
            id: d.id,
            present: false,
            failed: AtomicBool::new(false),
            _lock: None,
        })
        .collect();
    for (_, path, id, lock) in opened {
        let d = dirs.iter_mut().find(|d| d.id == id).expect("added above");
        (d.path, d.present, d._lock) = (path, true, Some(lock));
    }
    Ok(Opened { manifest, dirs, hints_trusted, missing: !missing.is_empty() })
}

/// Writes `manifest` (with a raised epoch) into every usable directory. A directory where it
/// cannot be written is marked failed; it is an error only if no copy was written.
pub(crate) fn save_manifest(manifest: &mut Manifest, dirs: &[DataDir]) -> Result<()> {
    // From the clock, so that of two copies written in different runs (each while the other's
    // directory was missing) the later wins, not the one saved more often.
    manifest.epoch = (manifest.epoch + 1).max(crate::clock::now_ms());
    save_everywhere(dirs, manifest::FILE_NAME, &manifest.encode(), "the manifest")
}

/// Writes the file `name` atomically into every usable directory (the store's own files,
/// of which each directory keeps a copy). A directory where it cannot be written is marked
/// failed; it is an error only if no copy was written.
pub(crate) fn save_everywhere(dirs: &[DataDir], name: &str, bytes: &[u8], what: &str) -> Result<()> {
    // If every present directory has failed, try them anyway: they may have recovered.
    let any_usable = dirs.iter().any(|d| d.usable());
    let mut saved = false;
    let mut last = None;
    for d in dirs.iter().filter(|d| d.usable() || (!any_usable && d.present)) {
        match io::write_atomic(&d.path.join(name), bytes) {
            Ok(()) => saved = true,
            Err(e) => {
                d.fail(&e);
                last = Some(e);
            }
        }
    }
    match (saved, last) {
        (true, _) => Ok(()),
        (false, Some(e)) => Err(Error::io(format!("writing {what}"), e)),
        (false, None) => Err(Error::new(ErrorKind::Io, format!("no data directory is usable to write {what}"))),
    }
}

/// Removes every hint file of `dir`: used when the key-hash seed they were made with is gone.
pub(crate) fn remove_hints(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_name().to_string_lossy().ends_with(".hint") {
            io::remove_if_exists(&entry.path())?;
        }
    }
    Ok(())
}

/// One directory a volume may be placed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Its index in the directory table.
    pub dir: usize,
    /// Bytes of larder's volumes in it.
    pub used: u64,
    /// Free bytes on its filesystem.
    pub free: u64,
}

/// The candidate with the lowest utilization `used / (free + used)`; among equals, the first
/// at or after `cursor` in table order (round-robin). Exact integer comparison, so that two
/// directories on one filesystem (one free-space reading) tie when they hold the same bytes.
pub fn choose(cands: &[Candidate], cursor: usize) -> Option<usize> {
    // used/total as a fraction; an empty, full filesystem counts as full.
    let frac = |c: &Candidate| match (c.used as u128, c.free as u128 + c.used as u128) {
        (_, 0) => (1, 1),
        f => f,
    };
    let less = |a: &Candidate, b: &Candidate| {
        let ((an, ad), (bn, bd)) = (frac(a), frac(b));
        an * bd < bn * ad
    };
    let n = cands.iter().map(|c| c.dir + 1).max().unwrap_or(1);
    let order = |c: &Candidate| (c.dir + n - cursor % n) % n;
    let mut best: Option<&Candidate> = None;
    for c in cands {
        best = match best {
            None => Some(c),
            Some(b) if less(c, b) || (!less(b, c) && order(c) < order(b)) => Some(c),
            keep => keep,
        };
    }
    best.map(|c| c.dir)
}

/// Lower-case hex of an id, for messages and stats.
pub fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a manifest slot entry names a directory.
pub(crate) fn placed(e: manifest::SlotEntry) -> Option<usize> {
    (e.dir != manifest::NO_DIR).then_some(e.dir as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(dir: usize, used: u64, free: u64) -> Candidate {
        Candidate { dir, used, free }
    }

    #[test]
    fn lowest_utilization_wins_and_ties_go_round_robin() {
        // One filesystem: the directory holding fewer bytes.
        assert_eq!(choose(&[c(0, 300, 1000), c(1, 100, 1000)], 0), Some(1));
        // Different filesystems: 100 of 200 (50%) loses to 300 of 1300 (23%).
        assert_eq!(choose(&[c(0, 100, 100), c(1, 300, 1000)], 0), Some(1));
        // Ties: the first at or after the cursor, wrapping.
        let tie = [c(0, 5, 10), c(1, 5, 10), c(2, 5, 10)];
        assert_eq!(choose(&tie, 0), Some(0));
        assert_eq!(choose(&tie, 1), Some(1));
        assert_eq!(choose(&tie, 2), Some(2));
        assert_eq!(choose(&tie, 3), Some(0));
        // Only the tied minimum takes part in the round-robin.
        assert_eq!(choose(&[c(0, 5, 10), c(1, 9, 10), c(2, 5, 10)], 1), Some(2));
        // A full filesystem is the last choice; no candidates, no choice.
        assert_eq!(choose(&[c(0, 0, 0), c(1, 999, 1)], 0), Some(1));
        assert_eq!(choose(&[], 0), None);
    }

    #[test]
    fn id_file_round_trips_and_rejects_damage() {
        let d = DirId { store_id: [1; 16], dir_id: [2; 16] };
        let b = d.encode();
        assert_eq!(DirId::decode(&b), Some(d));
        for i in 0..b.len() {
            let mut x = b;
            x[i] ^= 4;
            assert_eq!(DirId::decode(&x), None, "flip at {i}");
        }
    }
}
