//! What each volume written since open holds: its records' values by how they are stored
//! (as sent, or coded with zstd alone, zstd and a dictionary, or LZ4), their bytes as sent and
//! as stored, and the dictionaries its records name (which `Dicts::collect` keeps).
//!
//! Noted as records are appended, under the writer lock, and forgotten when the ring reuses
//! the volume. A volume written before open is not accounted: recovery reads hint files, which
//! say nothing of codings.

use crate::format::meta::Meta;
use crate::format::record::Header;
use crate::stats::{HeldStats, Tally};
use crate::types::Codec;
use parking_lot::Mutex;
use std::collections::BTreeSet;

/// How a record's value is stored, as an index into a volume's tallies.
const RAW: usize = 0;
const ZSTD: usize = 1;
const ZSTD_DICTIONARY: usize = 2;
const LZ4: usize = 3;

#[derive(Clone, Default)]
struct Volume {
    /// The generation written since open (0: none, or one written before open).
    generation: u32,
    dictionaries: BTreeSet<u32>,
    by: [Tally; 4],
}

/// Each slot's volume, as written since open.
pub(crate) struct Held {
    slots: Mutex<Vec<Volume>>,
}

impl Held {
    pub fn new(slots: usize) -> Held {
        Held { slots: Mutex::new(vec![Volume::default(); slots]) }
    }

    /// A volume (of `slot`, at `generation`) was started: it holds nothing yet.
    pub fn started(&self, slot: usize, generation: u32) {
        if let Some(v) = self.slots.lock().get_mut(slot) {
            *v = Volume { generation, ..Default::default() };
        }
    }

    /// A record was appended to the volume of `slot` at `generation`: its value, `stored`
    /// bytes, is tallied by how it is stored (a tombstone or a large value's head holds none).
    pub fn note(&self, slot: usize, generation: u32, header: &Header, meta: &[u8], stored: u64) {
        if header.is_tombstone() || header.is_head() {
            return;
        }
        let (kind, logical, dictionary) = match header.is_coded().then(|| Meta::parse(meta).coded).flatten() {
            None => (RAW, stored, 0),
            Some(c) => match (Codec::from_id(c.codec), c.dictionary) {
                (Some(Codec::Lz4), _) => (LZ4, c.len, 0),
                (_, 0) => (ZSTD, c.len, 0),
                (_, d) => (ZSTD_DICTIONARY, c.len, d),
            },
        };
        let mut slots = self.slots.lock();
        let Some(v) = slots.get_mut(slot).filter(|v| v.generation == generation) else { return };
        let t = &mut v.by[kind];
        t.values += 1;
        t.logical_bytes += logical;
        t.stored_bytes += stored;
        if dictionary != 0 {
            v.dictionaries.insert(dictionary);
        }
    }

    /// The dictionaries the volumes that hold records need, given each slot's generation and
    /// whether it holds records; `None` while a volume written before open holds records (it
    /// may need any).
    pub fn dictionaries_needed(&self, slots: &[(u32, u64)]) -> Option<BTreeSet<u32>> {
        let held = self.slots.lock();
        let mut needed = BTreeSet::new();
        for (&(generation, len), v) in slots.iter().zip(held.iter()) {
            if len == 0 {
                continue;
            }
            if v.generation != generation {
                return None;
            }
            needed.extend(v.dictionaries.iter().copied());
        }
        Some(needed)
    }

    /// The tallies of the volumes written since open, given each slot's generation and the
    /// bytes its records take (0: none); volumes from before open are counted apart.
    pub fn stats(&self, slots: &[(u32, u64)]) -> HeldStats {
        let held = self.slots.lock();
        let mut s = HeldStats::default();
        for (&(generation, len), v) in slots.iter().zip(held.iter()) {
            if len == 0 {
                continue;
            }
            if v.generation != generation {
                s.volumes_unaccounted += 1;
                s.bytes_unaccounted += len;
                continue;
            }
            for (sum, t) in [&mut s.raw, &mut s.zstd, &mut s.zstd_dictionary, &mut s.lz4].into_iter().zip(&v.by) {
                sum.values += t.values;
                sum.logical_bytes += t.logical_bytes;
                sum.stored_bytes += t.stored_bytes;
            }
        }
        s
    }
}
