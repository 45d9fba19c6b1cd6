//! Listing the live keys: the index keeps only key hashes, so the keys come from the volumes,
//! read in ring order from the oldest, by their record headers. A record is listed when the
//! index names it as its key's value and it is alive (not expired, not flushed), so each live
//! key is listed once, whichever of its older records the volumes still hold. Memory stays
//! bounded: one scan window and one key at a time.

use super::Store;
use crate::clock::now_ms;
use crate::format::meta::Meta;
use crate::format::record::HEADER_LEN;
use crate::format::volume::VOLUME_HEADER_LEN;
use crate::index::TAG_MASK;
use crate::recovery::scan::{scan_volume, ScanEvent, ScanRange};
use crate::{Error, Result};
use std::sync::atomic::Ordering;

/// A live key, as [`Store::keys`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct KeyInfo<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Length of its value in bytes.
    pub len: u64,
    /// When it expires (ms since the Unix epoch; 0 = never).
    pub expiry_ms: u64,
    /// When it was stored (its store time, ms).
    pub stored_ms: u64,
}

/// Where a listing of the keys goes on from ([`Store::keys_step`]): the volume of this
/// sequence at this offset, then the volumes of later sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCursor {
    sequence: u64,
    offset: u64,
}

/// Volume bytes a step of [`Store::keys`] reads.
const STEP: u64 = 4 << 20;

impl Store {
    /// Calls `each` with every live key, oldest write first, until it returns `false`; returns
    /// how many keys it was given. Keys written while the listing runs may or may not be
    /// listed, and one rewritten meanwhile may be listed twice. Reads the volumes' headers (not
    /// their values): for a background thread, not an async worker.
    pub fn keys(&self, mut each: impl FnMut(KeyInfo<'_>) -> bool) -> Result<u64> {
        let (mut cursor, mut listed, mut going) = (None, 0, true);
        loop {
            cursor = self.keys_step(cursor, STEP, |k| {
                if going {
                    listed += 1;
                    going = each(k);
                }
            })?;
            if cursor.is_none() || !going {
                return Ok(listed);
            }
        }
    }

    /// One step of a listing of the live keys (as [`Store::keys`]): calls `each` with those of
    /// about `bytes` of one volume from `from` (`None`: the start), and returns where the
    /// next step goes on (`None`: the listing is done). Between steps nothing is held, so a
    /// listing paced by a slow reader holds no thread while it waits; a volume the ring reuses
    /// meanwhile is listed afresh as the newer one it has become.
    pub fn keys_step(
        &self,
        from: Option<KeyCursor>,
        bytes: u64,
        mut each: impl FnMut(KeyInfo<'_>),
    ) -> Result<Option<KeyCursor>> {
        let ring = &self.disk.ring;
        let mut slots: Vec<(u64, usize)> = (ring.slots.iter().enumerate())
            .filter(|(_, s)| s.generation.load(Ordering::Acquire) != 0)
            .map(|(i, s)| (s.sequence.load(Ordering::Acquire), i))
            .filter(|&(seq, _)| from.is_none_or(|c| seq >= c.sequence))
            .collect();
        slots.sort_unstable();
        let active = self.disk.active.load(Ordering::Relaxed) as usize;
        for (sequence, slot) in slots {
            let s = &ring.slots[slot];
            let Some(file) = s.file() else { continue };
            let generation = s.generation.load(Ordering::Acquire);
            let start = match from {
                Some(c) if c.sequence == sequence => c.offset,
                _ => VOLUME_HEADER_LEN,
            };
            let len = s.len.load(Ordering::Acquire);
            if start >= len {
                continue;
            }
            let range = |end| ScanRange {
                start,
                end,
                generation,
                salt: s.salt.load(Ordering::Acquire),
                torn_tail_possible: slot == active,
                values_checked: false,
            };
            let now = now_ms();
            let mut failed = None;
            let mut on_event = |ev: ScanEvent<'_>| {
                let ScanEvent::Valid { offset, header: h, key } = ev else { return };
                if failed.is_some() || h.is_chunk() || h.is_tombstone() || self.disk.dead(h.stored_ms, h.expiry_ms, now)
                {
                    return;
                }
                let here = self.disk.index.get(ring.hash(key)).is_some_and(|l| {
                    l.slot as usize == slot && l.tag as u32 == generation & TAG_MASK && l.offset == offset
                });
                if !here {
                    return; // an older value of the key, or a hash another key took
                }
                let len = match h.is_head() || h.is_coded() {
                    false => h.value_len as u64,
                    // A large or coded value's length is in its metadata.
                    true => {
                        let mut meta = vec![0u8; h.meta_len as usize];
                        let at = offset + (HEADER_LEN + key.len()) as u64;
                        match ring.read(s, file, &mut meta, at, false) {
                            Ok(n) => {
                                let m = Meta::parse(&meta[..n.unwrap_or(0)]);
                                m.large.map(|(len, _)| len).or(m.coded.map(|c| c.len)).unwrap_or(0)
                            }
                            Err(e) => {
                                failed = Some(e);
                                return;
                            }
                        }
                    }
                };
                each(KeyInfo { key, len, expiry_ms: h.expiry_ms, stored_ms: h.stored_ms });
            };
            // A window of the volume; the scan stops at the last record whole within it. One
            // that makes no headway (a record, or damage, longer than the window) reads on to
            // the volume's end.
            let mut end = (start + bytes.max(1)).min(len);
            // The ring may reuse the slot while it is read: what was listed stands, the rest is gone.
            let scan = |end, f: &mut dyn FnMut(ScanEvent<'_>)| {
                scan_volume(file, range(end), f).map_err(|e| Error::io("reading a volume to list its keys", e))
            };
            let mut done = scan(end, &mut on_event)?;
            if done.valid_end == start && end < len {
                end = len;
                done = scan(end, &mut on_event)?;
            }
            if let Some(e) = failed {
                return Err(e);
            }
            return Ok(Some(match end < len && done.valid_end > start {
                true => KeyCursor { sequence, offset: done.valid_end },
                false => KeyCursor { sequence: sequence + 1, offset: VOLUME_HEADER_LEN },
            }));
        }
        Ok(None)
    }
}
