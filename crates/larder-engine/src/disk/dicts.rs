//! The store's zstd dictionaries: loaded from every data directory at open, written to every
//! one (atomically, before any record names them) when trained, and removed once no record on
//! disk can need them (docs/FORMAT.md, "Dictionaries").
//!
//! Which volumes need which dictionary is known for the volumes written since open (each
//! append notes it: `disk::held`). A volume written before open may need any dictionary, so
//! none is removed until the ring has turned over every such volume.

use super::dirs::DataDir;
use crate::format::codec::{self, Codec, Prepared};
use crate::format::dict::{self, DictFile};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Dictionaries removed from disk whose decoders are kept, newest last: memory may still hold
/// values coded with them (past this many, such a value decodes to a counted miss).
const GHOSTS: usize = 64;

/// One dictionary, ready to code and decode with.
pub struct Dict {
    pub prepared: Prepared,
    pub key_prefix: Vec<u8>,
    pub created_ms: u64,
    /// Length of the dictionary, in bytes.
    pub len: usize,
    /// Its file, as written (to copy into a directory that lacks it).
    pub file: Vec<u8>,
    /// When it stopped coding new values (a newer one codes its prefix), in ms since the
    /// epoch; 0 while it codes them. Removed once unneeded.
    pub retired_ms: AtomicU64,
    /// Values coded with it since open, their bytes as sent and as stored.
    pub values: AtomicU64,
    pub logical_bytes: AtomicU64,
    pub stored_bytes: AtomicU64,
}

/// How long a retired dictionary is kept at least. A write that coded with it holds it until
/// its record is appended (`collect` skips one held elsewhere); this is a margin on top.
const RETIRED_FOR_MS: u64 = 10_000;

impl Dict {
    pub fn id(&self) -> u32 {
        self.prepared.id()
    }

    pub fn retire(&self) {
        self.retired_ms.store(crate::clock::now_ms().max(1), Ordering::Relaxed);
    }

    pub fn retired(&self) -> bool {
        self.retired_ms.load(Ordering::Relaxed) != 0
    }
}

/// The store's dictionaries and what the volumes written since open need of them.
pub(crate) struct Dicts {
    level: i32,
    live: RwLock<HashMap<u32, Arc<Dict>>>,
    ghosts: Mutex<VecDeque<Arc<Dict>>>,
    next_id: AtomicU32,
    /// Dictionary files found damaged at open (each copy), and dictionaries removed since.
    pub damaged_files: AtomicU64,
    pub removed: AtomicU64,
}

impl Dicts {
    /// The dictionaries found in `dirs` (a copy that fails its checks is skipped, counted and
    /// logged; a sound copy in another directory stands in for it), prepared at `level`.
    pub fn load(dirs: &[DataDir], level: i32) -> Dicts {
        let paths: Vec<&Path> = dirs.iter().filter(|d| d.present).map(|d| d.path.as_path()).collect();
        let (d, damaged) = Dicts::load_paths(&paths, level);
        for path in damaged {
            tracing::error!(file = %path.display(), "a dictionary file is damaged: values coded with it are unreadable unless another directory holds a sound copy");
        }
        // Every usable directory gets a sound copy of each (one that missed a write while it
        // had failed, or whose copy is damaged), so that losing any one directory loses none.
        for x in d.live.read().values() {
            let name = dict::file_name(x.id());
            for dir in dirs.iter().filter(|dir| dir.usable()) {
                let path = dir.path.join(&name);
                if std::fs::read(&path).ok().and_then(|b| dict::decode(&b).map(|f| f.id == x.id())) == Some(true) {
                    continue;
                }
                if let Err(e) = crate::io::write_atomic(&path, &x.file) {
                    tracing::warn!(error = %e, file = %path.display(), "could not copy a dictionary");
                }
            }
        }
        d
    }

    /// As [`Dicts::load`], from directories by path; also returns each damaged copy's path.
    pub fn load_paths(dirs: &[&Path], level: i32) -> (Dicts, Vec<PathBuf>) {
        let d = Dicts {
            level,
            live: Default::default(),
            ghosts: Default::default(),
            next_id: AtomicU32::new(1),
            damaged_files: AtomicU64::new(0),
            removed: AtomicU64::new(0),
        };
        let (mut highest, mut damaged) = (0, Vec::new());
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = dict::id_of_name(&name) else { continue };
                highest = highest.max(id);
                match std::fs::read(e.path()).ok().and_then(|b| d.prepare(id, &b)) {
                    Some(one) => {
                        d.live.write().entry(id).or_insert_with(|| Arc::new(one));
                    }
                    None => {
                        d.damaged_files.fetch_add(1, Ordering::Relaxed);
                        damaged.push(e.path());
                    }
                }
            }
        }
        d.next_id.store(highest.saturating_add(1).max(1), Ordering::Relaxed);
        // Of each prefix's dictionaries, the newest codes it; the others are retired.
        let live = d.live.read();
        let mut newest: HashMap<&[u8], u32> = HashMap::new();
        for x in live.values() {
            let n = newest.entry(&x.key_prefix).or_insert(x.id());
            *n = (*n).max(x.id());
        }
        for x in live.values().filter(|x| newest.get(&x.key_prefix[..]) != Some(&x.id())) {
            x.retire();
        }
        drop(live);
        (d, damaged)
    }

    fn prepare(&self, id: u32, file: &[u8]) -> Option<Dict> {
        let f = dict::decode(file).filter(|f| f.id == id && f.codec == Codec::Zstd.id())?;
        Some(Dict {
            prepared: Prepared::new(id, f.bytes, self.level)?,
            key_prefix: f.key_prefix.to_vec(),
            created_ms: f.created_ms,
            len: f.bytes.len(),
            file: file.to_vec(),
            retired_ms: AtomicU64::new(0),
            values: AtomicU64::new(0),
            logical_bytes: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
        })
    }

    /// The dictionary `id`, to code or decode with (a removed one memory may still need too).
    pub fn get(&self, id: u32) -> Option<Arc<Dict>> {
        if let Some(d) = self.live.read().get(&id) {
            return Some(d.clone());
        }
        self.ghosts.lock().iter().find(|d| d.id() == id).cloned()
    }

    /// The dictionaries on disk, by id.
    pub fn all(&self) -> Vec<Arc<Dict>> {
        let mut v: Vec<_> = self.live.read().values().cloned().collect();
        v.sort_by_key(|d| d.id());
        v
    }

    /// The id a new dictionary takes: above every id this run handed out or found on disk,
    /// and above the seconds since 2020 (so that one whose file was lost, which its records
    /// still name, is not named again by a later run).
    pub fn next_id(&self) -> u32 {
        let secs = (crate::clock::now_ms() / 1000).saturating_sub(1_577_836_800).min(u32::MAX as u64 - 1) as u32;
        let mut id = self.next_id.load(Ordering::Relaxed);
        loop {
            let take = id.max(secs).max(1);
            match self.next_id.compare_exchange(id, take.saturating_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return take,
                Err(now) => id = now,
            }
        }
    }

    /// Keeps `bytes`, a dictionary trained (naming `id`) for `key_prefix`, in every usable
    /// directory, durably, and only then makes it usable: no record names a dictionary that a
    /// crash could lose.
    pub fn add(&self, dirs: &[DataDir], id: u32, key_prefix: &[u8], bytes: &[u8]) -> crate::Result<Arc<Dict>> {
        let file = dict::encode(&DictFile {
            id,
            codec: Codec::Zstd.id(),
            created_ms: crate::clock::now_ms(),
            key_prefix,
            bytes,
        });
        let one = self
            .prepare(id, &file)
            .ok_or_else(|| crate::Error::new(crate::ErrorKind::Invalid, "a trained dictionary did not load"))?;
        super::dirs::save_everywhere(dirs, &dict::file_name(id), &file, "a dictionary")?;
        let one = Arc::new(one);
        self.live.write().insert(id, one.clone());
        Ok(one)
    }

    /// Removes from every directory the retired dictionaries not `needed`; keeps their
    /// decoders for what memory holds. Returns how many were removed.
    pub fn collect(&self, dirs: &[DataDir], needed: &BTreeSet<u32>) -> usize {
        let long_ago = crate::clock::now_ms().saturating_sub(RETIRED_FOR_MS);
        // One held elsewhere (a write that coded a value with it and has not written its
        // record yet, a reader decoding with it) is not removed this time.
        let retired: Vec<u32> = self
            .live
            .read()
            .values()
            .filter(|d| d.retired() && d.retired_ms.load(Ordering::Relaxed) <= long_ago && Arc::strong_count(d) == 1)
            .map(|d| d.id())
            .collect();
        if retired.is_empty() {
            return 0;
        }
        let mut removed = 0;
        for id in retired.into_iter().filter(|id| !needed.contains(id)) {
            let name = dict::file_name(id);
            for d in dirs.iter().filter(|d| d.present) {
                if let Err(e) = crate::io::remove_if_exists(&d.path.join(&name)) {
                    tracing::warn!(error = %e, id, "could not remove an unneeded dictionary");
                }
            }
            if let Some(one) = self.live.write().remove(&id) {
                let mut g = self.ghosts.lock();
                g.push_back(one);
                while g.len() > GHOSTS {
                    g.pop_front();
                }
            }
            removed += 1;
        }
        self.removed.fetch_add(removed as u64, Ordering::Relaxed);
        removed
    }
}

impl super::Disk {
    /// Removes the retired dictionaries no volume needs any more (after the ring turns).
    pub fn collect_dictionaries(&self) -> usize {
        // A missing directory's volumes may need any of them.
        if self.ring.dirs.iter().any(|d| !d.present) {
            return 0;
        }
        match self.held.dictionaries_needed(&self.slot_fill()) {
            Some(needed) => self.dicts.collect(&self.ring.dirs, &needed),
            None => 0, // a volume from before open holds records: it may need any
        }
    }

    /// Each slot's generation and the bytes its records take (0: none).
    pub fn slot_fill(&self) -> Vec<(u32, u64)> {
        let header = crate::format::volume::VOLUME_HEADER_LEN;
        self.ring
            .slots
            .iter()
            .map(|s| (s.generation.load(Ordering::Acquire), s.len.load(Ordering::Acquire).saturating_sub(header)))
            .collect()
    }
}

/// Decodes `stored` with the dictionary `id` into exactly `len` bytes.
pub(crate) fn decode_with(dicts: &Dicts, id: u32, stored: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let d = dicts.get(id).ok_or_else(|| format!("a value coded with dictionary {id}, which is missing or damaged"))?;
    codec::decode_with(&d.prepared, stored, len)
        .map_err(|e| format!("a value coded with dictionary {id} did not decode: {e:?}"))
}
