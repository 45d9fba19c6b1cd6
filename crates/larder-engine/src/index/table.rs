//! One shard's table: Robin Hood linear probing over 10-byte entries, no wrap-around.
//!
//! An entry is 80 bits, little-endian in 10 bytes:
//! `[loc: lb bits][rem: rb bits][dib: 7 bits]` with `lb + rb = 73` (see `Layout`).
//! - `dib` is the entry's distance from its home slot: the home, and through it the top
//!   `qb` hash bits after the shard's (the quotient `q`), are known from the position.
//! - `rem` holds the hash bits that follow `q`, as many as fit, behind a sentinel bit:
//!   `(1 << k) | bits`, `k` known bits. 0 marks an empty slot.
//! - A table of `cap` homes has `qb = floor(log2(cap))` and puts quotient `q` at home
//!   `q * cap >> qb`, which is one-to-one because `cap >= 2^qb`. When a rebuild raises `qb`,
//!   the top known bit of each `rem` moves into `q`; when it lowers `qb`, the low bit of `q`
//!   moves back into `rem` (or the lowest `rem` bit is given up when `rem` is full). Entries
//!   inserted since the last rebuild know every bit they can hold.
//! - Probes run from the home upwards and never wrap: the table has `TAIL` slots past the
//!   last home. An insert that would need a distance above 127 or run off the tail reports
//!   `Full`, and the caller grows the table.

use super::mem::{self, Mem};

pub(super) const ENTRY: usize = 10;
pub(super) const SHARD_BITS: u32 = 12;
const TAIL: usize = 128;
const DIB_MAX: u64 = 127;
const DIB_SHIFT: u32 = 73;
const _: () = assert!(DIB_SHIFT >= 72, "dib lives in an entry's last byte");

/// How a location and a remainder share an entry's 73 low bits.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    /// Bits of a packed location.
    pub lb: u32,
    /// Bits of the remainder field, sentinel included.
    pub rb: u32,
}

impl Layout {
    fn loc(self, e: u128) -> u64 {
        (e as u64) & ((1u64 << self.lb) - 1)
    }
    fn rem(self, e: u128) -> u64 {
        ((e >> self.lb) as u64) & ((1u64 << self.rb) - 1)
    }
    fn pack(self, loc: u64, rem: u64, dib: u64) -> u128 {
        loc as u128 | (rem as u128) << self.lb | (dib as u128) << DIB_SHIFT
    }
}

fn dib(e: u128) -> u64 {
    (e >> DIB_SHIFT) as u64
}

/// Known bits of a remainder value (its sentinel's position).
fn known(v: u64) -> u32 {
    63 - v.leading_zeros()
}

/// Whether the remainder `v` agrees with `after` (the bits after the quotient, top-aligned,
/// `ka` of them known) on the bits both know.
fn agrees(v: u64, after: u64, ka: u32) -> bool {
    let k = known(v).min(ka);
    k == 0 || (v ^ (1 << known(v))) >> (known(v) - k) == after >> (64 - k)
}

/// What a hash is in a table: its home, and the bits after its quotient.
#[derive(Clone, Copy)]
pub(super) struct Key {
    home: usize,
    after: u64,
    /// How many bits of `after` are known.
    ka: u32,
}

/// What an insert did.
pub(super) enum Put {
    New,
    Replaced(u64),
    Full,
}

#[derive(Default)]
pub(super) struct Table {
    mem: Mem,
    /// Number of homes; the table has `cap + TAIL` slots (none when `cap` is 0).
    cap: usize,
    qb: u32,
    pub len: usize,
}

impl Table {
    /// A table with room for `cap` homes (at least 1), in `given` if that is large enough.
    fn with_cap(cap: usize, given: &mut Option<Mem>) -> Table {
        let cap = cap.max(1);
        let mem = match given.take() {
            Some(m) if m.len() >= Self::bytes_for(cap) => m,
            _ => mem::zeroed(Self::bytes_for(cap)),
        };
        // Memory comes in whole pages (or cache lines): use all of it.
        let cap = (mem.len() / ENTRY - TAIL).max(cap);
        Table { mem, cap, qb: usize::BITS - 1 - cap.leading_zeros(), len: 0 }
    }

    /// Bytes of a table of `cap` homes.
    pub fn bytes_for(cap: usize) -> usize {
        (cap.max(1) + TAIL) * ENTRY
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes this table holds.
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }

    fn slots(&self) -> usize {
        if self.cap == 0 {
            0
        } else {
            self.cap + TAIL
        }
    }

    fn read(&self, i: usize) -> u128 {
        let b: &[u8; ENTRY] = self.mem[i * ENTRY..(i + 1) * ENTRY].try_into().expect("entry");
        let mut w = [0u8; 16];
        w[..ENTRY].copy_from_slice(b);
        u128::from_le_bytes(w)
    }

    fn write(&mut self, i: usize, e: u128) {
        self.mem[i * ENTRY..(i + 1) * ENTRY].copy_from_slice(&e.to_le_bytes()[..ENTRY]);
    }

    fn home(&self, q: u64) -> usize {
        ((q as u128 * self.cap as u128) >> self.qb) as usize
    }

    /// The quotient of the entry whose home is `home`.
    fn quotient(&self, home: usize) -> u64 {
        (((home as u128) << self.qb).div_ceil(self.cap as u128)) as u64
    }

    pub fn key(&self, hash: u64) -> Key {
        let h = hash << SHARD_BITS;
        let q = if self.qb == 0 { 0 } else { h >> (64 - self.qb) };
        let ka = 64 - SHARD_BITS - self.qb;
        Key { home: self.home(q), after: h.checked_shl(self.qb).unwrap_or(0), ka }
    }

    /// The remainder value a new entry for `k` stores.
    fn rem_of(k: Key, l: Layout) -> u64 {
        let n = k.ka.min(l.rb - 1);
        (1 << n) | if n == 0 { 0 } else { k.after >> (64 - n) }
    }

    /// Position of the entry for `k`, if any.
    pub fn find(&self, k: Key, l: Layout) -> Option<usize> {
        let (mut i, mut d) = (k.home, 0);
        while i < self.slots() {
            let e = self.read(i);
            let v = l.rem(e);
            if v == 0 || dib(e) < d {
                return None;
            }
            if dib(e) == d && agrees(v, k.after, k.ka) {
                return Some(i);
            }
            (i, d) = (i + 1, d + 1);
        }
        None
    }

    pub fn loc_at(&self, i: usize, l: Layout) -> u64 {
        l.loc(self.read(i))
    }

    pub fn set_loc(&mut self, i: usize, loc: u64, l: Layout) {
        let e = self.read(i);
        self.write(i, l.pack(loc, l.rem(e), dib(e)));
    }

    /// Inserts, or replaces the location of the entry that agrees with `k`. `Full` changes
    /// nothing: the table must grow first.
    pub fn put(&mut self, k: Key, loc: u64, l: Layout, max_load: (usize, usize)) -> Put {
        self.put_rem(k, Self::rem_of(k, l), loc, l, max_load)
    }

    fn put_rem(&mut self, k: Key, rem: u64, loc: u64, l: Layout, (num, den): (usize, usize)) -> Put {
        let slots = self.slots();
        let (mut i, mut d) = (k.home, 0u64);
        loop {
            if i >= slots {
                return Put::Full;
            }
            let e = self.read(i);
            let v = l.rem(e);
            if v == 0 || dib(e) < d {
                break;
            }
            if dib(e) == d && agrees(v, k.after, k.ka) {
                self.write(i, l.pack(loc, v, d));
                return Put::Replaced(l.loc(e));
            }
            (i, d) = (i + 1, d + 1);
        }
        if (self.len + 1) * den > self.cap * num || d > DIB_MAX {
            return Put::Full;
        }
        // Entries from `i` up to the first empty slot move up by one.
        let mut j = i;
        loop {
            if j >= slots {
                return Put::Full;
            }
            let e = self.read(j);
            if l.rem(e) == 0 {
                break;
            }
            if dib(e) == DIB_MAX {
                return Put::Full;
            }
            j += 1;
        }
        // One move of the bytes, then each moved entry's distance up by one: `dib` is the top
        // 7 bits of an entry's last byte, and never 127 here, so that byte gains 2.
        self.mem.copy_within(i * ENTRY..j * ENTRY, (i + 1) * ENTRY);
        for m in i + 1..=j {
            self.mem[m * ENTRY + ENTRY - 1] += 1 << (DIB_SHIFT - 72);
        }
        self.write(i, l.pack(loc, rem, d));
        self.len += 1;
        Put::New
    }

    /// Removes the entry at `i`, moving the rest of its run back by one.
    pub fn remove_at(&mut self, i: usize, l: Layout) {
        let mut j = i + 1;
        while j < self.slots() {
            let e = self.read(j);
            if l.rem(e) == 0 || dib(e) == 0 {
                break;
            }
            j += 1;
        }
        // Entries `i + 1 .. j` move down by one, each one step nearer its home.
        self.mem.copy_within((i + 1) * ENTRY..j * ENTRY, i * ENTRY);
        for m in i..j - 1 {
            self.mem[m * ENTRY + ENTRY - 1] -= 1 << (DIB_SHIFT - 72);
        }
        self.write(j - 1, 0);
        self.len -= 1;
    }

    /// Calls `f` with each entry's position and location.
    pub fn each(&self, l: Layout, mut f: impl FnMut(usize, u64)) {
        for i in 0..self.slots() {
            let e = self.read(i);
            if l.rem(e) != 0 {
                f(i, l.loc(e));
            }
        }
    }

    /// The table rebuilt with `cap` homes (raised if too small for every entry); returns it
    /// and how many entries it had to give up: their remainder had no bit left for a larger
    /// quotient, or, after a shrink that gave up a bit, two became indistinguishable.
    pub fn rebuilt(&self, cap: usize, l: Layout) -> (Table, u64) {
        self.merged(&[], cap, l, None, &|_| 0)
    }
}

/// One entry on its way into a table being merged: its home there, its remainder (a value
/// with its sentinel, as stored), and its location, or `GONE` for an op that removes.
#[derive(Clone, Copy)]
pub(super) struct Moving {
    pub home: usize,
    pub rem: u64,
    pub loc: u64,
}

/// In the ops [`Table::merged`] takes, the location of an op that removes its hash's entry.
pub(super) const GONE: u64 = u64::MAX;

impl Table {
    /// This table's entries as they would sit in a table of `cap` homes, in home order
    /// (entries whose bits ran out are left out and counted).
    fn moving(&self, t: &Table, l: Layout, out: &mut Vec<Moving>) -> u64 {
        let mut dropped = 0;
        out.clear();
        for i in 0..self.slots() {
            let e = self.read(i);
            let mut v = l.rem(e);
            if v == 0 {
                continue;
            }
            let mut q = self.quotient(i - dib(e) as usize);
            let mut qb = self.qb;
            while qb < t.qb && known(v) > 0 {
                let k = known(v);
                q = q << 1 | (v >> (k - 1)) & 1;
                v = (1 << (k - 1)) | (v & ((1 << (k - 1)) - 1));
                qb += 1;
            }
            if qb < t.qb {
                dropped += 1;
                continue;
            }
            while qb > t.qb {
                let k = known(v);
                let bits = (q & 1) << k | (v ^ (1 << k));
                v = if k + 1 < l.rb { 1 << (k + 1) | bits } else { 1 << k | bits >> 1 };
                q >>= 1;
                qb -= 1;
            }
            out.push(Moving { home: t.home(q), rem: v, loc: l.loc(e) });
        }
        // Entries of one old home may come apart in the new table's order.
        out.sort_by_key(|m| m.home);
        dropped
    }

    /// This table merged with `ops` (hashes in ascending order, at most one op per hash: a
    /// location, or `GONE`), into a table of at least `cap` homes (in `given` memory if it is
    /// large enough), written in one pass from the lowest home up instead of entry by entry.
    /// Returns the table and how many entries were given up (see [`Table::rebuilt`]).
    ///
    /// Ops are newer than this table's entries. Of ops of hashes that agree on every kept bit
    /// (keys the index cannot tell apart, sharing one entry as they did when written), the
    /// put of the newest record wins by `newness` (of a location), whatever the hashes' order,
    /// and the others count as given up; a `GONE` removes an entry of this table, never one an
    /// op put (that op is another hash's newest record: its key's current value).
    pub fn merged(
        &self,
        ops: &[(u64, u64)],
        cap: usize,
        l: Layout,
        mut given: Option<Mem>,
        newness: &dyn Fn(u64) -> u64,
    ) -> (Table, u64) {
        thread_local! {
            /// Kept between merges: fresh buffers would be faulted in a page at a time.
            static BUFS: std::cell::RefCell<(Vec<Moving>, Vec<Moving>)> =
                const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
        }
        BUFS.with_borrow_mut(|(old, new)| {
            let mut cap = cap.max(1);
            loop {
                let mut t = Table::with_cap(cap, &mut given);
                if self.len == 0 {
                    // Recovery's common case: nothing to merge with.
                    match t.fill_fresh(ops, l, newness) {
                        Some(lost) => return (t, lost),
                        None => {
                            cap += cap / 8 + 1;
                            continue;
                        }
                    }
                }
                let mut dropped = self.moving(&t, l, old);
                new.clear();
                new.extend(ops.iter().map(|&(h, loc)| {
                    let k = t.key(h);
                    Moving { home: k.home, rem: Self::rem_of(k, l), loc }
                }));
                match t.fill(old, new, l, newness) {
                    Some(lost) => {
                        dropped += lost;
                        return (t, dropped);
                    }
                    None => cap += cap / 8 + 1,
                }
            }
        })
    }

    /// Writes `ops` (as for [`Table::merged`]) into this empty table, as `fill` would with no
    /// old entries, without building the list of homes first.
    fn fill_fresh(&mut self, ops: &[(u64, u64)], l: Layout, newness: &dyn Fn(u64) -> u64) -> Option<u64> {
        let (mut next, mut lost) = (0usize, 0);
        let (mut home, mut first) = (usize::MAX, 0);
        for &(h, loc) in ops {
            if loc == GONE {
                continue;
            }
            let k = self.key(h);
            if k.home != home {
                (home, first) = (k.home, next.max(k.home));
            }
            // Another hash of this home that agrees on every kept bit: the older record loses.
            if let Some(i) = (first..next).find(|&i| agrees(l.rem(self.read(i)), k.after, k.ka)) {
                if newness(loc) > newness(l.loc(self.read(i))) {
                    self.set_loc(i, loc, l);
                }
                lost += 1;
                continue;
            }
            let pos = next.max(home);
            if pos >= self.slots() || (pos - home) as u64 > DIB_MAX {
                return None;
            }
            self.write(pos, l.pack(loc, Self::rem_of(k, l), (pos - home) as u64));
            next = pos + 1;
            self.len += 1;
        }
        Some(lost)
    }

    /// Writes `old` and `new` (each in home order) into this empty table; an op of `new`
    /// replaces or drops the entry of `old` it agrees with. `None` if some entry would sit
    /// too far from its home: the table must be larger.
    fn fill(&mut self, old: &[Moving], new: &[Moving], l: Layout, newness: &dyn Fn(u64) -> u64) -> Option<u64> {
        let (mut i, mut j, mut next, mut lost) = (0, 0, 0usize, 0);
        // The entries of one home: (entry, whether an op of `new` put it there).
        let mut group: Vec<(Moving, bool)> = Vec::new();
        while i < old.len() || j < new.len() {
            let home = old.get(i).map_or(usize::MAX, |m| m.home).min(new.get(j).map_or(usize::MAX, |m| m.home));
            group.clear();
            while i < old.len() && old[i].home == home {
                // Two old entries agree only after a shrink gave up a bit: one is kept.
                let m = old[i];
                let k = known(m.rem);
                let after = if k == 0 { 0 } else { (m.rem ^ (1 << k)) << (64 - k) };
                match group.iter().position(|(g, _)| agrees(g.rem, after, k)) {
                    Some(at) => {
                        lost += 1;
                        group[at] = (m, false);
                    }
                    None => group.push((m, false)),
                }
                i += 1;
            }
            while j < new.len() && new[j].home == home {
                let op = new[j];
                j += 1;
                let k = known(op.rem);
                let after = if k == 0 { 0 } else { (op.rem ^ (1 << k)) << (64 - k) };
                match group.iter().position(|(g, _)| agrees(g.rem, after, k)) {
                    // Put by an earlier op: another hash, a key the index cannot tell from
                    // this one, whose newest record that is.
                    Some(at) if group[at].1 && op.loc == GONE => {}
                    Some(at) if op.loc == GONE => {
                        group.remove(at);
                    }
                    Some(at) if group[at].1 => {
                        lost += 1;
                        if newness(op.loc) > newness(group[at].0.loc) {
                            group[at] = (op, true);
                        }
                    }
                    Some(at) => group[at] = (op, true),
                    None if op.loc == GONE => {}
                    None => group.push((op, true)),
                }
            }
            for (g, _) in &group {
                let pos = next.max(home);
                if pos >= self.slots() || (pos - home) as u64 > DIB_MAX {
                    return None;
                }
                self.write(pos, l.pack(g.loc, g.rem, (pos - home) as u64));
                next = pos + 1;
                self.len += 1;
            }
        }
        Some(lost)
    }
}
