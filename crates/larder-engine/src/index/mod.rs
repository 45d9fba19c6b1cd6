//! The compact in-memory index: key hash -> record location, 10 bytes a slot, 85 to 95% full.
//!
//! Invariants and choices (docs/FORMAT.md, "In-memory index entry"):
//! - The index keeps no key and not even a whole hash: the top 12 bits of the 64-bit hash pick
//!   one of 4096 shards, the next bits pick the entry's home in the shard's table (known from
//!   its position), and the entry keeps as many of the following bits as fit (28 with the
//!   default ring). Two keys that agree on all of them share an entry: the later write evicts
//!   the earlier key (a miss, never a wrong value; counted), and a read of the other key finds
//!   a record whose key differs (callers must compare the key stored in the record).
//! - A location is packed into as few bits as the ring needs: the offset in 8-byte units within
//!   a volume, the volume slot, the low 3 bits of the slot's generation (stale entries fail
//!   that cheap check after the ring reuses the slot; the record's own header settles the
//!   rest), an 8-bit size class (enough to read the record in one positional read) and a
//!   2-bit saturating count of disk reads, which decides whether the ring reinserts the
//!   record before evicting it. Comparisons of locations ignore that count.
//! - Each shard is a Robin Hood table (`table.rs`) grown by about 7% when 95% full, so it is
//!   always 88 to 95% full; growing one small shard at a time keeps pauses short.
//! - Each shard has its own reader-writer lock held for a few probes; readers of different
//!   shards never meet.

mod mem;
mod table;

use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use table::{Layout, Put, Table, GONE, SHARD_BITS};

/// Memory for a table, for [`Index::merge_shard`].
pub(crate) use mem::{Arena, Mem as TableMem, MAP_FROM};

/// Number of shards (see [`Index::shard_of`]).
pub const SHARDS: usize = 1 << SHARD_BITS;
/// Grow a table above 95% full ...
const MAX_LOAD: (usize, usize) = (95, 100);
/// ... by this much (a table grown is 88.5% full).
const GROW_NUM: usize = 15;
const GROW_DEN: usize = 14;
/// Load a table is sized for when its entry count is known in advance.
const FIT_LOAD: (usize, usize) = (92, 100);

/// Largest slot number a location can hold.
pub const MAX_SLOTS: usize = 1 << 14;
/// Largest volume size a location can address (offsets are 32-bit in 8-byte units).
pub const MAX_VOLUME_SIZE: u64 = (u32::MAX as u64 + 1) * crate::format::record::ALIGN;

/// Where a record lives, as the index keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    /// Volume slot.
    pub slot: u16,
    /// Low 3 bits of the slot's generation when the record was written.
    pub tag: u8,
    /// Byte offset of the record in the volume (a multiple of 8).
    pub offset: u64,
    /// Size class of the record length (see `record::size_class`).
    pub class: u16,
    /// Disk reads since the record was written, saturating at [`MAX_HITS`].
    pub hits: u8,
}

/// Bits of the generation a location keeps.
pub const TAG_MASK: u32 = 0x7;
/// Largest read count a location holds.
pub const MAX_HITS: u8 = 3;
const HITS_MASK: u64 = 0x3;
const CLASS_SHIFT: u32 = 2;
const TAG_SHIFT: u32 = 10;
const SLOT_SHIFT: u32 = 13;

/// How locations are packed for a ring of `volume_count` volumes of `volume_size` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    slot_bits: u32,
    offset_bits: u32,
}

fn bits_for(max: u64) -> u32 {
    64 - max.leading_zeros()
}

impl Geometry {
    pub fn new(volume_count: u32, volume_size: u64) -> Geometry {
        let volume_size = volume_size.clamp(8, MAX_VOLUME_SIZE);
        Geometry {
            slot_bits: bits_for(volume_count.clamp(1, MAX_SLOTS as u32) as u64 - 1),
            offset_bits: bits_for(volume_size.div_ceil(8) - 1),
        }
    }

    /// Bits a packed location takes.
    pub fn loc_bits(self) -> u32 {
        SLOT_SHIFT + self.slot_bits + self.offset_bits
    }

    /// Hash bits an entry keeps beyond its shard and home (see the module notes).
    #[cfg(test)]
    pub fn remainder_bits(self) -> u32 {
        self.layout().rb - 1
    }

    fn layout(self) -> Layout {
        let lb = self.loc_bits();
        Layout { lb, rb: 73 - lb }
    }

    fn pack(self, l: Loc) -> u64 {
        debug_assert!(bits_for(l.slot as u64) <= self.slot_bits && l.class < 256 && l.offset.is_multiple_of(8));
        debug_assert!(bits_for(l.offset / 8) <= self.offset_bits);
        debug_assert!(l.tag as u32 <= TAG_MASK && l.hits <= MAX_HITS);
        l.hits as u64
            | (l.class as u64) << CLASS_SHIFT
            | (l.tag as u64) << TAG_SHIFT
            | (l.slot as u64) << SLOT_SHIFT
            | (l.offset / 8) << (SLOT_SHIFT + self.slot_bits)
    }

    fn unpack(self, v: u64) -> Loc {
        Loc {
            hits: (v & HITS_MASK) as u8,
            class: ((v >> CLASS_SHIFT) & 0xFF) as u16,
            tag: ((v >> TAG_SHIFT) as u32 & TAG_MASK) as u8,
            slot: ((v >> SLOT_SHIFT) & ((1 << self.slot_bits) - 1)) as u16,
            offset: (v >> (SLOT_SHIFT + self.slot_bits)) * 8,
        }
    }

    fn place(self, l: Loc) -> u64 {
        self.pack(l) & !HITS_MASK
    }
}

impl Loc {
    /// Whether both name the same record (read counts aside).
    pub fn same_place(self, other: Loc) -> bool {
        Loc { hits: 0, ..self } == Loc { hits: 0, ..other }
    }
}

/// The index. All methods take `&self`; see the module notes for the locking.
pub struct Index {
    shards: Box<[RwLock<Table>]>,
    geo: Geometry,
    layout: Layout,
    len: AtomicU64,
    /// Entries given up when a table was rebuilt (see `Table::rebuilt`).
    dropped: AtomicU64,
    /// A bit per shard: set once an entry of the shard may have been taken from a key the
    /// index could not tell apart ([`Index::taint`]), whose record then lies on disk unnamed.
    tainted: Box<[AtomicU64]>,
}

impl Index {
    /// An empty index for locations of `geo`.
    pub fn new(geo: Geometry) -> Index {
        Index {
            shards: (0..SHARDS).map(|_| RwLock::new(Table::default())).collect(),
            geo,
            layout: geo.layout(),
            len: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            tainted: (0..SHARDS / 64).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Notes that the shard of `hash` may hold a key's record on disk that no entry names: an
    /// insert replaced an entry that may have been another key's, or a rebuild or merge gave
    /// entries up. Recovery would find that record again, so a delete of a key the index does
    /// not name must still write a tombstone there ([`Index::tainted`]).
    pub fn taint(&self, hash: u64) {
        self.taint_shard(Self::shard_of(hash));
    }

    fn taint_shard(&self, shard: usize) {
        self.tainted[shard / 64].fetch_or(1 << (shard % 64), Ordering::Relaxed);
    }

    /// Whether [`Index::taint`] was called for the shard of `hash` since the index was made.
    pub fn tainted(&self, hash: u64) -> bool {
        let shard = Self::shard_of(hash);
        self.tainted[shard / 64].load(Ordering::Relaxed) & (1 << (shard % 64)) != 0
    }

    fn shard(&self, hash: u64) -> &RwLock<Table> {
        &self.shards[Self::shard_of(hash)]
    }

    /// The shard that holds `hash` (0 to 4095). Entries of different shards never meet, so
    /// threads that each take a disjoint set of shards can load entries in parallel and still
    /// apply the entries of any one key in order.
    pub fn shard_of(hash: u64) -> usize {
        (hash >> (64 - SHARD_BITS)) as usize
    }

    /// Number of entries (stale ones included until they are swept).
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// Entries given up since open because the index could no longer tell them from another
    /// (see `Table::rebuilt`); evictions like those of [`Index::insert`], counted apart.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Bytes the tables hold.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.read().bytes() as u64).sum()
    }

    /// The location stored for `hash`, if any.
    pub fn get(&self, hash: u64) -> Option<Loc> {
        let t = self.shard(hash).read();
        if t.cap() == 0 {
            return None;
        }
        t.find(t.key(hash), self.layout).map(|i| self.geo.unpack(t.loc_at(i, self.layout)))
    }

    /// Puts `loc` in `t`, growing it as needed; returns the location replaced.
    fn put(&self, t: &mut Table, hash: u64, loc: u64) -> Option<u64> {
        loop {
            if t.cap() > 0 {
                match t.put(t.key(hash), loc, self.layout, MAX_LOAD) {
                    Put::New => {
                        self.len.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                    Put::Replaced(old) => return Some(old),
                    Put::Full => {}
                }
            }
            self.resize(Self::shard_of(hash), t, (t.cap() * GROW_NUM / GROW_DEN).max(t.cap() + 8));
        }
    }

    fn resize(&self, shard: usize, t: &mut Table, cap: usize) {
        // Tests hold a growth here (with the shard's lock) to kill the process in it.
        crate::pause::point("index.grow", b"");
        let (new, dropped) = t.rebuilt(cap, self.layout);
        if dropped > 0 {
            self.taint_shard(shard);
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
            self.len.fetch_sub(dropped, Ordering::Relaxed);
        }
        *t = new;
    }

    /// Stores `loc` for `hash`; returns the location it replaced (which may be another key's:
    /// see the module notes).
    pub fn insert(&self, hash: u64, loc: Loc) -> Option<Loc> {
        let mut t = self.shard(hash).write();
        self.put(&mut t, hash, self.geo.pack(loc)).map(|v| self.geo.unpack(v))
    }

    /// The packed form of `loc`, for [`Index::merge_shard`].
    pub fn pack(&self, loc: Loc) -> u64 {
        self.geo.pack(loc)
    }

    /// Applies `ops` to shard `shard` in one pass over its table. Each is a hash of the shard
    /// and the packed location ([`Index::pack`]) of a record of its key: a value to index, or,
    /// with [`DROP`] set, a record that removes the key's entry (a tombstone, an expired or
    /// damaged record). Of a hash's ops the newest record decides, newest by the volume's rank
    /// in `rank` (by slot), then by offset: ops may come in any order. Of hashes the index
    /// cannot tell apart, the newest put wins the entry they share (`Table::merged`), as it
    /// did when they were written; one's drop never removes another's put. For recovery, which
    /// gathers the entries of every volume, on every core, before it applies them: inserting
    /// them one by one would move most entries of a table many times. Leaves `ops` reordered.
    pub(crate) fn merge_shard(&self, shard: usize, ops: &mut [Op], mem: Option<TableMem>, rank: &[u32]) {
        let newness = |v: u64| {
            let l = self.geo.unpack(v & !DROP);
            ((rank[l.slot as usize] as u64) << 32) | (l.offset / 8)
        };
        sort_ops(ops);
        let mut n = 0;
        for i in 0..ops.len() {
            if n > 0 && ops[n - 1].0 == ops[i].0 {
                if newness(ops[i].1) > newness(ops[n - 1].1) {
                    ops[n - 1].1 = ops[i].1;
                }
            } else {
                ops[n] = ops[i];
                n += 1;
            }
        }
        for o in &mut ops[..n] {
            if o.1 & DROP != 0 {
                o.1 = GONE;
            }
        }
        let ops = &ops[..n];
        debug_assert!(ops.iter().all(|o| Self::shard_of(o.0) == shard));
        let mut t = self.shards[shard].write();
        // Sized as if every put were of a new key: looking each up first would cost a cache
        // miss per op. When many replace entries, `fit` gives the room back afterwards.
        let after = t.len + ops.iter().filter(|o| o.1 != GONE).count();
        let cap = after * FIT_LOAD.1 / FIT_LOAD.0 + 1;
        let before = t.len;
        let (new, dropped) = t.merged(ops, cap, self.layout, mem, &newness);
        *t = new;
        // Merged into entries already there (a later round of a large recovery), an op's drop
        // may have removed another key's entry, or a put taken it.
        if dropped > 0 || before > 0 {
            self.taint_shard(shard);
        }
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        self.len.fetch_add(t.len as u64, Ordering::Relaxed);
        self.len.fetch_sub(before as u64, Ordering::Relaxed);
    }

    /// Bytes of the table [`Index::merge_shard`] makes for `shard` with `puts` more entries at
    /// most: recovery maps the memory of many tables at once.
    pub(crate) fn merge_bytes(&self, shard: usize, puts: usize) -> usize {
        let len = self.shards[shard].read().len;
        Table::bytes_for((len + puts) * FIT_LOAD.1 / FIT_LOAD.0 + 1)
    }

    /// Shrinks the tables left less than 85% full (after a `reserve` that guessed high) to
    /// 92%.
    pub fn fit(&self) {
        for (shard, s) in self.shards.iter().enumerate() {
            let mut t = s.write();
            if t.len * 100 < t.cap() * 85 && t.cap() > 64 {
                let cap = t.len * FIT_LOAD.1 / FIT_LOAD.0 + 1;
                self.resize(shard, &mut t, cap);
            }
        }
    }

    /// Runs `f` on the entry for `hash` if it is at `expected` (read counts aside).
    fn with_entry(&self, hash: u64, expected: Loc, f: impl FnOnce(&mut Table, usize)) -> bool {
        let mut t = self.shard(hash).write();
        if t.cap() == 0 {
            return false;
        }
        match t.find(t.key(hash), self.layout) {
            Some(i) if t.loc_at(i, self.layout) & !HITS_MASK == self.geo.place(expected) => {
                f(&mut t, i);
                true
            }
            _ => false,
        }
    }

    /// Removes the entry for `hash` only if it still names the record at `expected`; returns
    /// whether it did.
    pub fn remove_if_eq(&self, hash: u64, expected: Loc) -> bool {
        let removed = self.with_entry(hash, expected, |t, i| t.remove_at(i, self.layout));
        if removed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Replaces the entry for `hash` with `new` only if it still names the record at
    /// `expected`; returns whether it did.
    pub fn replace_if_eq(&self, hash: u64, expected: Loc, new: Loc) -> bool {
        let v = self.geo.pack(new);
        self.with_entry(hash, expected, |t, i| t.set_loc(i, v, self.layout))
    }

    /// Sets the entry for `hash` to `new` (absent if `None`) only if it is `expected` now
    /// (absent if `None`); returns whether it did. Undoes a write whose sync failed.
    pub fn compare_and_set(&self, hash: u64, expected: Option<Loc>, new: Option<Loc>) -> bool {
        let mut t = self.shard(hash).write();
        let at = if t.cap() == 0 { None } else { t.find(t.key(hash), self.layout) };
        let now = at.map(|i| t.loc_at(i, self.layout) & !HITS_MASK);
        if now != expected.map(|l| self.geo.place(l)) {
            return false;
        }
        match (at, new) {
            (Some(i), Some(l)) => t.set_loc(i, self.geo.pack(l), self.layout),
            (Some(i), None) => {
                t.remove_at(i, self.layout);
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            (None, Some(l)) => {
                self.put(&mut t, hash, self.geo.pack(l));
            }
            (None, None) => {}
        }
        true
    }

    /// Counts one disk read of the record at `at`, saturating at `cap` (at most [`MAX_HITS`]).
    /// `at.hits` is the count the caller saw; at or past `cap` nothing is locked.
    pub fn count_read(&self, hash: u64, at: Loc, cap: u8) {
        let cap = cap.min(MAX_HITS);
        if at.hits >= cap {
            return;
        }
        self.with_entry(hash, at, |t, i| {
            let cur = t.loc_at(i, self.layout);
            if ((cur & HITS_MASK) as u8) < cap {
                t.set_loc(i, cur + 1, self.layout);
            }
        });
    }

    /// Calls `f` with every entry's location, one shard at a time under its read lock.
    pub fn for_each(&self, mut f: impl FnMut(Loc)) {
        for shard in self.shards.iter() {
            let t = shard.read();
            t.each(self.layout, |_, v| f(self.geo.unpack(v)));
        }
    }

    /// Removes every entry for which `keep` is false, one shard at a time (each shard's lock is
    /// held only while that shard is walked). Returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(Loc) -> bool) -> u64 {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut t = shard.write();
            let mut gone = Vec::new();
            t.each(self.layout, |i, v| {
                if !keep(self.geo.unpack(v)) {
                    gone.push(i);
                }
            });
            // From the top down: removing an entry moves only entries above it.
            for &i in gone.iter().rev() {
                t.remove_at(i, self.layout);
            }
            removed += gone.len() as u64;
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}

/// An op of [`Index::merge_shard`]: a hash and a packed location, [`DROP`] set or not.
pub type Op = (u64, u64);

/// The mark of an op of [`Index::merge_shard`] that removes its hash's entry (no packed
/// location reaches bit 63).
pub const DROP: u64 = 1 << 63;

/// Sorts `ops` by hash: a radix sort on the 16 bits below the shard's (which order
/// them by home in any table of up to 65,536 homes), then an insertion sort, which finds the
/// ops nearly in order.
fn sort_ops(ops: &mut [Op]) {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<Op>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    if ops.len() > 64 {
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            scratch.resize(ops.len(), (0, 0));
            for (pass, shift) in [64 - SHARD_BITS - 16, 64 - SHARD_BITS - 8].into_iter().enumerate() {
                let (from, to): (&[Op], &mut [Op]) =
                    if pass == 0 { (ops, &mut scratch[..]) } else { (&scratch[..], ops) };
                let mut starts = [0usize; 257];
                for o in from {
                    starts[((o.0 >> shift) & 0xFF) as usize + 1] += 1;
                }
                for b in 1..=256 {
                    starts[b] += starts[b - 1];
                }
                for &o in from {
                    let b = ((o.0 >> shift) & 0xFF) as usize;
                    to[starts[b]] = o;
                    starts[b] += 1;
                }
            }
        });
    }
    for i in 1..ops.len() {
        let mut j = i;
        while j > 0 && ops[j - 1].0 > ops[j].0 {
            ops.swap(j - 1, j);
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
