//! The compact in-memory index: seeded 64-bit key hash -> packed location, 16 bytes a slot.
//!
//! Invariants and choices:
//! - The index stores hashes, not keys. It may answer for a key that merely shares the hash of
//!   a stored one; callers must compare the key stored in the record (a mismatch is a miss).
//! - A location is one `u64`: offset in 8-byte units (32 bits), volume slot (14), the low 7
//!   bits of the slot's generation (stale entries fail that cheap check after the ring reuses
//!   the slot; the record's own header settles the rest), a 9-bit size class (enough to read
//!   the record in one positional read), and a 2-bit saturating count of disk reads since the
//!   record was written, which decides whether the ring reinserts it before evicting it.
//!   Comparisons of locations ignore that count.
//! - 4096 shards, each an open-addressing table with linear probing, backward-shift deletion
//!   (no tombstones) and a non-power-of-two capacity grown by 1.5x at 80% load. Growing one
//!   small shard at a time keeps resize pauses short, and the 1.5x step keeps the load between
//!   53% and 80%: 20 to 30 bytes of RAM per key.
//! - Each shard has its own reader-writer lock held for a few probes; readers of different
//!   shards never meet.

use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARD_BITS: u32 = 12;
/// Number of shards (see [`Index::shard_of`]).
pub const SHARDS: usize = 1 << SHARD_BITS;
const MAX_LOAD_NUM: usize = 4; // grow above 4/5 full
const MAX_LOAD_DEN: usize = 5;
const MIN_CAPACITY: usize = 8;

/// Largest slot number a location can hold.
pub const MAX_SLOTS: usize = 1 << 14;
/// Largest volume size a location can address (offsets are 32-bit in 8-byte units).
pub const MAX_VOLUME_SIZE: u64 = (u32::MAX as u64 + 1) * crate::format::record::ALIGN;

/// Where a record lives, as the index keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Volume slot.
    pub slot: u16,
    /// Low 7 bits of the slot's generation when the record was written.
    pub tag: u8,
    /// Byte offset of the record in the volume (a multiple of 8).
    pub offset: u64,
    /// Size class of the record length (see `record::size_class`).
    pub class: u16,
    /// Disk reads since the record was written, saturating at [`MAX_HITS`].
    pub hits: u8,
}

/// Bits of the generation a location keeps.
pub const TAG_MASK: u32 = 0x7F;
/// Largest read count a location holds.
pub const MAX_HITS: u8 = 3;
const HITS_SHIFT: u32 = 62;
const PLACE_MASK: u64 = (1 << HITS_SHIFT) - 1;

impl Loc {
    fn pack(self) -> u64 {
        debug_assert!((self.slot as usize) < MAX_SLOTS && self.class < 512 && self.offset.is_multiple_of(8));
        debug_assert!(self.tag as u32 <= TAG_MASK && self.hits <= MAX_HITS);
        (self.offset / 8)
            | (self.slot as u64) << 32
            | (self.tag as u64) << 46
            | (self.class as u64) << 53
            | (self.hits as u64) << HITS_SHIFT
    }
    fn unpack(v: u64) -> Loc {
        Loc {
            offset: (v & 0xFFFF_FFFF) * 8,
            slot: ((v >> 32) & 0x3FFF) as u16,
            tag: ((v >> 46) & 0x7F) as u8,
            class: ((v >> 53) & 0x1FF) as u16,
            hits: (v >> HITS_SHIFT) as u8,
        }
    }
    /// Whether both name the same record (read counts aside).
    pub fn same_place(self, other: Loc) -> bool {
        self.pack() & PLACE_MASK == other.pack() & PLACE_MASK
    }
}

#[derive(Clone, Copy, Default)]
struct Slot {
    hash: u64, // 0 = empty
    loc: u64,
}

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    len: usize,
}

impl Table {
    fn home(&self, hash: u64) -> usize {
        // The top SHARD_BITS chose the shard; rotate them away so the position uses fresh bits.
        let h = hash.rotate_left(SHARD_BITS);
        ((h as u128 * self.slots.len() as u128) >> 64) as usize
    }

    fn find(&self, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let cap = self.slots.len();
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s.hash == hash {
                return Some(i);
            }
            if s.hash == 0 {
                return None;
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    /// Inserts or replaces; returns the previous location.
    fn insert(&mut self, hash: u64, loc: u64) -> Option<u64> {
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            self.grow();
        }
        let cap = self.slots.len();
        let mut i = self.home(hash);
        loop {
            let s = &mut self.slots[i];
            if s.hash == hash {
                return Some(std::mem::replace(&mut s.loc, loc));
            }
            if s.hash == 0 {
                *s = Slot { hash, loc };
                self.len += 1;
                return None;
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    fn grow(&mut self) {
        let new_cap = (self.slots.len() * 3 / 2).max(MIN_CAPACITY);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); new_cap]);
        self.len = 0;
        for s in old.into_iter().filter(|s| s.hash != 0) {
            self.insert(s.hash, s.loc);
        }
    }

    /// Removes the entry at position `i`, shifting later members of its probe run back.
    fn remove_at(&mut self, mut i: usize) {
        let cap = self.slots.len();
        let dist = |from: usize, to: usize| (to + cap - from) % cap;
        let mut j = i;
        loop {
            j = if j + 1 == cap { 0 } else { j + 1 };
            let s = self.slots[j];
            if s.hash == 0 {
                break;
            }
            if dist(self.home(s.hash), j) >= dist(i, j) {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i] = Slot::default();
        self.len -= 1;
    }
}

/// The index. All methods take `&self`; see the module notes for the locking.
pub struct Index {
    shards: Box<[RwLock<Table>]>,
    len: AtomicU64,
}

impl Default for Index {
    fn default() -> Self {
        Self::new()
    }
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index { shards: (0..SHARDS).map(|_| RwLock::new(Table::default())).collect(), len: AtomicU64::new(0) }
    }

    fn shard(&self, hash: u64) -> &RwLock<Table> {
        &self.shards[Self::shard_of(hash)]
    }

    /// The shard that holds `hash` (0 to 4095). Entries of different shards never meet, so
    /// threads that each take a disjoint set of shards can load entries in parallel and still
    /// apply the entries of any one key in order.
    pub fn shard_of(hash: u64) -> usize {
        (Self::norm(hash) >> (64 - SHARD_BITS)) as usize
    }

    /// The hash value the table uses: 0 marks an empty slot, so it is folded onto 1.
    fn norm(hash: u64) -> u64 {
        hash.max(1)
    }

    /// Number of entries (stale ones included until they are swept).
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// The location stored for `hash`, if any.
    pub fn get(&self, hash: u64) -> Option<Loc> {
        let hash = Self::norm(hash);
        let t = self.shard(hash).read();
        t.find(hash).map(|i| Loc::unpack(t.slots[i].loc))
    }

    /// Stores `loc` for `hash`; returns the location it replaced.
    pub fn insert(&self, hash: u64, loc: Loc) -> Option<Loc> {
        let hash = Self::norm(hash);
        let old = self.shard(hash).write().insert(hash, loc.pack());
        if old.is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        old.map(Loc::unpack)
    }

    /// Stores each `(hash, loc)` in order, under one lock: all hashes must belong to one shard
    /// ([`Index::shard_of`]). For recovery, which loads entries sorted by shard.
    pub fn insert_batch(&self, items: &[(u64, Loc)]) {
        let Some(&(first, _)) = items.first() else { return };
        let shard = Self::shard_of(first);
        let mut t = self.shards[shard].write();
        let mut added = 0;
        for &(hash, loc) in items {
            debug_assert_eq!(Self::shard_of(hash), shard);
            if t.insert(Self::norm(hash), loc.pack()).is_none() {
                added += 1;
            }
        }
        self.len.fetch_add(added, Ordering::Relaxed);
    }

    /// Removes the entry for `hash` only if it still names the record at `expected`; returns
    /// whether it did.
    pub fn remove_if_eq(&self, hash: u64, expected: Loc) -> bool {
        let hash = Self::norm(hash);
        let mut t = self.shard(hash).write();
        match t.find(hash) {
            Some(i) if t.slots[i].loc & PLACE_MASK == expected.pack() & PLACE_MASK => {
                t.remove_at(i);
                self.len.fetch_sub(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Replaces the entry for `hash` with `new` only if it still names the record at
    /// `expected`; returns whether it did.
    pub fn replace_if_eq(&self, hash: u64, expected: Loc, new: Loc) -> bool {
        let hash = Self::norm(hash);
        let mut t = self.shard(hash).write();
        match t.find(hash) {
            Some(i) if t.slots[i].loc & PLACE_MASK == expected.pack() & PLACE_MASK => {
                t.slots[i].loc = new.pack();
                true
            }
            _ => false,
        }
    }

    /// Sets the entry for `hash` to `new` (absent if `None`) only if it is `expected` now
    /// (absent if `None`); returns whether it did. Undoes a write whose sync failed.
    pub fn compare_and_set(&self, hash: u64, expected: Option<Loc>, new: Option<Loc>) -> bool {
        let hash = Self::norm(hash);
        let mut t = self.shard(hash).write();
        let at = t.find(hash);
        let now = at.map(|i| t.slots[i].loc & PLACE_MASK);
        if now != expected.map(|l| l.pack() & PLACE_MASK) {
            return false;
        }
        match (at, new) {
            (Some(i), Some(l)) => t.slots[i].loc = l.pack(),
            (Some(i), None) => {
                t.remove_at(i);
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            (None, Some(l)) => {
                t.insert(hash, l.pack());
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            (None, None) => {}
        }
        true
    }

    /// Counts one disk read of the record at `at`, saturating at `cap` (at most [`MAX_HITS`]).
    /// `at.hits` is the count the caller saw; at or past `cap` nothing is locked.
    pub fn count_read(&self, hash: u64, at: Loc, cap: u8) {
        if at.hits >= cap.min(MAX_HITS) {
            return;
        }
        let hash = Self::norm(hash);
        let mut t = self.shard(hash).write();
        if let Some(i) = t.find(hash) {
            let cur = t.slots[i].loc;
            if cur & PLACE_MASK == at.pack() & PLACE_MASK && ((cur >> HITS_SHIFT) as u8) < cap.min(MAX_HITS) {
                t.slots[i].loc = cur + (1 << HITS_SHIFT);
            }
        }
    }

    /// Calls `f` with every entry, one shard at a time under its read lock.
    pub fn for_each(&self, mut f: impl FnMut(u64, Loc)) {
        for shard in self.shards.iter() {
            let t = shard.read();
            for s in t.slots.iter().filter(|s| s.hash != 0) {
                f(s.hash, Loc::unpack(s.loc));
            }
        }
    }

    /// Removes every entry for which `keep` is false, one shard at a time (each shard's lock is
    /// held only while that shard is walked). Returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(Loc) -> bool) -> u64 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut t = shard.write();
            let mut i = 0;
            while i < t.slots.len() {
                let s = t.slots[i];
                if s.hash != 0 && !keep(Loc::unpack(s.loc)) {
                    // Backward shift may move a later entry into `i`: look at `i` again.
                    t.remove_at(i);
                    removed += 1;
                } else {
                    i += 1;
                }
            }
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn loc(n: u64) -> Loc {
        Loc {
            slot: (n % 16000) as u16,
            tag: (n % 128) as u8,
            offset: (n % (1 << 32)) * 8,
            class: (n % 512) as u16,
            hits: 0,
        }
    }

    #[test]
    fn pack_round_trips_extremes() {
        for l in [
            Loc { slot: 0, tag: 0, offset: 0, class: 0, hits: 0 },
            Loc { slot: (MAX_SLOTS - 1) as u16, tag: 127, offset: MAX_VOLUME_SIZE - 8, class: 511, hits: MAX_HITS },
        ] {
            assert_eq!(Loc::unpack(l.pack()), l);
        }
    }

    /// A model check against HashMap with heavy collisions in the top bits (one shard) and
    /// many deletes, which is where backward-shift deletion goes wrong if it goes wrong.
    #[test]
    fn behaves_like_a_map_under_churn() {
        let idx = Index::new();
        let mut model: HashMap<u64, Loc> = HashMap::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Keys confined to a few shards and a small space so probe runs collide and wrap.
            let hash = ((x % 3) << 62) | ((x >> 20) % 5000);
            match x % 4 {
                0 | 1 => {
                    assert_eq!(idx.insert(hash, loc(step)), model.insert(hash.max(1), loc(step)));
                }
                2 => {
                    if let Some(l) = idx.get(hash) {
                        assert!(idx.remove_if_eq(hash, l));
                        model.remove(&hash.max(1));
                    }
                }
                _ => assert_eq!(idx.get(hash), model.get(&hash.max(1)).copied()),
            }
        }
        assert_eq!(idx.len(), model.len() as u64);
        for (h, l) in &model {
            assert_eq!(idx.get(*h), Some(*l));
        }
        let removed = idx.retain(|l| l.slot % 2 == 0);
        assert_eq!(removed as usize, model.values().filter(|l| l.slot % 2 == 1).count());
        for (h, l) in &model {
            assert_eq!(idx.get(*h), (l.slot % 2 == 0).then_some(*l));
        }
    }

    #[test]
    fn remove_if_eq_refuses_a_replaced_entry() {
        let idx = Index::new();
        idx.insert(42, loc(1));
        idx.insert(42, loc(2));
        assert!(!idx.remove_if_eq(42, loc(1)));
        assert!(idx.remove_if_eq(42, loc(2)));
        assert_eq!(idx.len(), 0);
    }

    #[test]
    fn read_counts_saturate_and_do_not_change_the_place() {
        let idx = Index::new();
        let at = loc(7);
        idx.insert(9, at);
        for _ in 0..5 {
            let seen = idx.get(9).unwrap();
            idx.count_read(9, seen, 2);
        }
        let now = idx.get(9).unwrap();
        assert_eq!(now.hits, 2, "capped at the asked count");
        assert!(now.same_place(at) && now != at);
        idx.count_read(9, now, MAX_HITS + 5);
        assert_eq!(idx.get(9).unwrap().hits, MAX_HITS);
        // A stale location is not counted, and comparisons ignore counts.
        idx.count_read(9, loc(8), 3);
        assert!(!idx.replace_if_eq(9, loc(8), loc(10)));
        assert!(idx.replace_if_eq(9, at, loc(10)));
        assert_eq!(idx.get(9), Some(loc(10)));
        assert!(idx.remove_if_eq(9, Loc { hits: 1, ..loc(10) }));
    }
}
