//! Index entries gathered in volume order and applied a shard at a time, in one pass over
//! each shard's table ([`Index::merge_shard`]), on every core.
//!
//! Gathered ops go to 64 groups by the top 6 bits of their hash (few write streams, so few
//! cache and TLB misses), in memory the kernel maps in at once: on a virtual machine, faulting
//! in fresh memory a page at a time cost about 10 µs a page, more than the work itself.
//! Applying sorts each group by shard (a counting sort), then each shard's ops by hash. Ops of
//! one key may be gathered in any order (each names its record, and the newest record wins),
//! so every core gathers a share of each hint file.

use crate::index::{Arena, Index, Loc, TableMem, DROP, MAP_FROM, SHARDS};
use memmap2::{MmapMut, MmapOptions};

/// Ops gathered before they are applied: 16 bytes each, so at most 2 GiB at a time (and the
/// runs are sized for what is expected). A store with more entries than this applies them in
/// rounds, each a pass over the tables.
const LIMIT: usize = 1 << 27;
const GROUPS: usize = 64;
const GROUP_SHIFT: u32 = 64 - 6;
const OP: usize = 16;

/// A growable array of ops in populated anonymous memory.
struct Run {
    mem: Option<MmapMut>,
    len: usize,
}

impl Run {
    fn with_capacity(n: usize) -> Run {
        Run { mem: Self::map(n), len: 0 }
    }

    fn map(n: usize) -> Option<MmapMut> {
        (n > 0).then(|| MmapOptions::new().len(n * OP).populate().map_anon().expect("mapping memory for recovery"))
    }

    fn cap(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.len() / OP)
    }

    fn push(&mut self, hash: u64, v: u64) {
        if self.len == self.cap() {
            let mut bigger = Self::map((self.cap() * 2).max(1024)).expect("non-empty");
            if let Some(old) = &self.mem {
                bigger[..self.len * OP].copy_from_slice(&old[..self.len * OP]);
            }
            self.mem = Some(bigger);
        }
        let m = self.mem.as_mut().expect("mapped above");
        let at = self.len * OP;
        m[at..at + 8].copy_from_slice(&hash.to_le_bytes());
        m[at + 8..at + OP].copy_from_slice(&v.to_le_bytes());
        self.len += 1;
    }

    fn get(&self, i: usize) -> (u64, u64) {
        let m = &self.mem.as_ref().expect("non-empty")[i * OP..(i + 1) * OP];
        (u64::from_le_bytes(m[..8].try_into().expect("8")), u64::from_le_bytes(m[8..].try_into().expect("8")))
    }
}

pub(super) struct Bulk<'a> {
    index: &'a Index,
    /// Each lane's runs, one per group: a lane's ops in the order it gathered them.
    lanes: Vec<Vec<Run>>,
    count: usize,
    /// Each slot's volume's place in recovery's order, which decides between two ops of a
    /// key (see [`Index::merge_shard`]).
    rank: Vec<u32>,
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8)
}

impl<'a> Bulk<'a> {
    /// Gathers for `index`, expecting about `expected` ops in all, from volumes ranked by
    /// `rank` (slot to place in recovery's order, oldest first).
    pub fn new(index: &'a Index, expected: u64, rank: Vec<u32>) -> Bulk<'a> {
        let lanes = threads();
        // Room for the expected ops with a margin for uneven groups (their spread is a few
        // hundred in a million): a run that fills up grows, into fresh memory.
        let per = (expected.min(LIMIT as u64) as usize / GROUPS / lanes) * 21 / 20 + 4096;
        let runs = || (0..GROUPS).map(|_| Run::with_capacity(per)).collect();
        Bulk { index, lanes: (0..lanes).map(|_| runs()).collect(), count: 0, rank }
    }

    /// The key hashed `hash` now has the record at `loc`.
    pub fn put(&mut self, hash: u64, loc: Loc) {
        let v = self.index.pack(loc);
        self.push(hash, v);
    }

    /// The key hashed `hash` has no value from the record at `loc` on (deleted, expired, or
    /// damaged there). Only the hash is compared: of two keys with one 64-bit hash, the other
    /// loses its entry too (a miss).
    pub fn drop(&mut self, hash: u64, loc: Loc) {
        let v = self.index.pack(loc) | DROP;
        self.push(hash, v);
    }

    fn push(&mut self, hash: u64, v: u64) {
        // Any lane will do (order does not matter): spread them.
        let lane = (hash >> 20) as usize % self.lanes.len();
        self.lanes[lane][(hash >> GROUP_SHIFT) as usize].push(hash, v);
        self.count += 1;
        if self.count >= LIMIT {
            self.apply();
        }
    }

    /// Gathers on every core: `f` runs once per lane (`f(lane, its number, how many)`), each
    /// pushing a share of the ops. `ops` is how many they push in all: what was gathered is
    /// applied first if they would not fit. Returns what each lane's `f` returned, in order.
    pub fn lanes<R: Send>(&mut self, ops: u64, f: impl Fn(&mut Lane<'_>, usize, usize) -> R + Sync) -> Vec<R> {
        if self.count + ops as usize > LIMIT {
            self.apply();
        }
        let (index, f, n) = (self.index, &f, self.lanes.len());
        let (results, counts): (Vec<R>, Vec<usize>) = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .lanes
                .iter_mut()
                .enumerate()
                .map(|(t, runs)| {
                    s.spawn(move || {
                        let mut lane = Lane { index, runs, count: 0 };
                        (f(&mut lane, t, n), lane.count)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a lane panicked")).unzip()
        });
        self.count += counts.iter().sum::<usize>();
        results
    }

    /// Applies what was gathered.
    pub fn apply(&mut self) {
        if self.count == 0 {
            return;
        }
        let threads = threads();
        let per = GROUPS.div_ceil(threads);
        let (index, rank) = (self.index, &self.rank[..]);
        // Each group's runs, one from every lane, handed to the thread that applies the group.
        let mut groups: Vec<Vec<Run>> = (0..GROUPS).map(|_| Vec::new()).collect();
        for lane in &mut self.lanes {
            for (g, run) in lane.iter_mut().enumerate() {
                groups[g].push(std::mem::replace(run, Run::with_capacity(0)));
            }
        }
        // Tests hold recovery here, halfway through loading, to kill the process in it.
        crate::pause::point("recovery.apply", b"");
        std::thread::scope(|s| {
            for (t, part) in groups.chunks_mut(per).enumerate() {
                s.spawn(move || {
                    let mut sorted: Vec<(u64, u64)> = Vec::new();
                    for (i, runs) in part.iter_mut().enumerate() {
                        apply_group(index, (t * per + i) * (SHARDS / GROUPS), runs, &mut sorted, rank);
                    }
                });
            }
        });
        self.count = 0;
    }
}

/// Applies one group's ops (from every lane), whose shards start at `first`: sorted by shard
/// (a counting sort), each shard's in one merge.
fn apply_group(index: &Index, first: usize, runs: &mut [Run], sorted: &mut Vec<(u64, u64)>, rank: &[u32]) {
    const PER: usize = SHARDS / GROUPS;
    let shard = |h: u64| Index::shard_of(h) - first;
    let mut starts = [0usize; PER + 1];
    let mut total = 0;
    for run in runs.iter() {
        for i in 0..run.len {
            starts[shard(run.get(i).0) + 1] += 1;
        }
        total += run.len;
    }
    for s in 1..=PER {
        starts[s] += starts[s - 1];
    }
    sorted.clear();
    sorted.resize(total, (0, 0));
    let mut next = starts;
    for run in runs.iter() {
        for i in 0..run.len {
            let op = run.get(i);
            let s = shard(op.0);
            sorted[next[s]] = op;
            next[s] += 1;
        }
    }
    // The new tables' memory, the large ones cut from one mapping.
    let bytes: Vec<usize> = (0..PER)
        .map(|s| {
            let puts = sorted[starts[s]..starts[s + 1]].iter().filter(|o| o.1 & DROP == 0).count();
            if puts == 0 {
                return 0;
            }
            Some(index.merge_bytes(first + s, puts)).filter(|&b| b >= MAP_FROM).unwrap_or(0)
        })
        .collect();
    let large: Vec<usize> = bytes.iter().copied().filter(|&b| b > 0).collect();
    // The ops are in `sorted` now: their runs' memory holds the new tables.
    let maps = runs.iter_mut().filter_map(|r| r.mem.take()).collect();
    let mut pieces = Arena::cut(maps, &large).unwrap_or_default().into_iter();
    for s in 0..PER {
        let mem: Option<TableMem> = if bytes[s] > 0 { pieces.next() } else { None };
        if starts[s] < starts[s + 1] {
            index.merge_shard(first + s, &mut sorted[starts[s]..starts[s + 1]], mem, rank);
        }
    }
}

/// One core's share of a gathering, with its own runs.
pub(super) struct Lane<'b> {
    index: &'b Index,
    runs: &'b mut [Run],
    count: usize,
}

impl Lane<'_> {
    /// As [`Bulk::put`].
    pub fn put(&mut self, hash: u64, loc: Loc) {
        let v = self.index.pack(loc);
        self.runs[(hash >> GROUP_SHIFT) as usize].push(hash, v);
        self.count += 1;
    }

    /// As [`Bulk::drop`].
    pub fn drop(&mut self, hash: u64, loc: Loc) {
        let v = self.index.pack(loc) | DROP;
        self.runs[(hash >> GROUP_SHIFT) as usize].push(hash, v);
        self.count += 1;
    }
}
