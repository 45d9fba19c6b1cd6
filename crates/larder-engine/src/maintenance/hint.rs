//! Hint files: once a volume is sealed, an index of its records is written beside it, so that
//! recovery loads the hint instead of scanning the volume.

use crate::disk::Disk;
use crate::format::hint;
use crate::format::volume::{hint_path, VolumeHeader};
use crate::recovery::scan_hint_entries;
use crate::{io, Error, Result};
use std::sync::atomic::Ordering;

/// Encoded hint entries buffered before they are written out.
const HINT_CHUNK: usize = 1 << 20;

pub(crate) fn write_hint(
    disk: &Disk,
    slot: usize,
    generation: u32,
    sequence: u64,
    len: u64,
    through: Option<u64>,
) -> Result<()> {
    let s = &disk.ring.slots[slot];
    let (Some(d), Some(file)) = (s.dir(), s.file()) else { return Ok(()) };
    let dir = &disk.ring.dirs[d];
    let salt = s.salt.load(Ordering::Acquire);
    // The hint is durable once written, so the records it names must be first: else a
    // power cut leaves a hint pointing at bytes that never reached the disk. The sync goes
    // through group commit, so that a failure reaches the writes waiting on it (Linux
    // reports a writeback error once).
    match through {
        Some(n) => disk.wait_durable(n)?,
        None => file.sync_data().map_err(|e| Error::io("syncing a recovered volume", e))?,
    }
    // Streamed: a volume of tiny records has millions of entries, and neither they nor
    // the encoded file are ever held whole (the scan reads in 4 MiB windows; entries are
    // written out every `HINT_CHUNK` bytes).
    let path = hint_path(&dir.path, slot);
    let out = io::AtomicFile::create(&path).map_err(|e| Error::io("writing a hint file", e))?;
    let mut enc = hint::Encoder::default();
    let mut at = hint::Encoder::ENTRIES_AT;
    let mut failed = None;
    let mut write = |enc: &mut hint::Encoder| {
        enc.flush(|b| {
            let r = out.write_at(b, at);
            at += b.len() as u64;
            r
        })
    };
    // A volume this process wrote is read by its headers only; one found at recovery is read
    // whole, so that its hint names exactly the records recovery took as valid.
    let values_checked = through.is_none();
    scan_hint_entries(&disk.ring, file, len, generation, salt, values_checked, |entry, stored_ms| {
        if failed.is_some() {
            return; // the scan runs to its end; nothing more is kept
        }
        enc.push(&entry, stored_ms);
        if enc.pending() >= HINT_CHUNK {
            failed = write(&mut enc).err();
        }
    })
    .map_err(|e| Error::io("reading a volume", e))?;
    if let Some(e) = failed {
        return Err(Error::io("writing a hint file", e));
    }
    write(&mut enc).map_err(|e| Error::io("writing a hint file", e))?;
    if s.generation.load(Ordering::Acquire) != generation {
        return Ok(()); // the ring reused the slot meanwhile
    }
    let vh = VolumeHeader { slot: slot as u32, generation, sequence, salt, created_ms: 0, dir_id: dir.id };
    let (header, trailer) = enc.finish(&vh, len);
    out.write_at(&trailer, at)
        .and_then(|()| out.write_at(&header, 0))
        .and_then(|()| out.commit())
        .map_err(|e| Error::io("writing a hint file", e))?;
    disk.ring.counters.hints_written.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
