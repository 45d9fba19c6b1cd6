//! Memory for the index's tables.
//!
//! Small tables come from the allocator. A table of 16 KiB or more is mapped from the kernel
//! in whole pages, populated at once: an allocator would round it up to a size class and keep
//! the slack resident, and on a virtual machine faulting memory in a page at a time costs
//! about 10 µs a page. Recovery, which makes all 4096 tables at once, cuts the tables of a
//! group from the memory that held the group's gathered entries (zeroing memory already in
//! use is much cheaper than having fresh pages zeroed, on a virtual machine twice: by the
//! host and by the guest), and thousands of small mappings made by two threads at once would
//! spend most of their time waiting for the process's memory-map lock.

use memmap2::{MmapMut, MmapOptions, UncheckedAdvice};
use std::sync::Arc;

/// Tables of at least this many bytes are mapped.
pub(crate) const MAP_FROM: usize = 16 << 10;
const PAGE: usize = 4096;

/// A table's bytes.
#[derive(Default)]
pub(crate) enum Mem {
    #[default]
    None,
    Heap(Vec<u8>),
    Map(MmapMut),
    Piece(Piece),
}

/// Zeroed memory of at least `bytes` bytes.
pub(crate) fn zeroed(bytes: usize) -> Mem {
    if bytes >= MAP_FROM {
        if let Ok(m) = MmapOptions::new().len(bytes.next_multiple_of(PAGE)).populate().map_anon() {
            return Mem::Map(m);
        }
    }
    Mem::Heap(vec![0; bytes])
}

impl std::ops::Deref for Mem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Mem::None => &[],
            Mem::Heap(v) => v,
            Mem::Map(m) => m,
            // SAFETY: a piece is a range of its arena's mapping that no other piece overlaps
            // (`Arena::cut` hands out each range once), and the arena lives while it does.
            Mem::Piece(p) => unsafe { std::slice::from_raw_parts(p.arena.base.add(p.start), p.len) },
        }
    }
}

impl std::ops::DerefMut for Mem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Mem::None => &mut [],
            Mem::Heap(v) => v,
            Mem::Map(m) => m,
            // SAFETY: as for `deref`; `&mut self` makes this the piece's only access.
            Mem::Piece(p) => unsafe { std::slice::from_raw_parts_mut(p.arena.base.add(p.start), p.len) },
        }
    }
}

/// One populated mapping that several tables' memory is cut from.
pub(crate) struct Arena {
    map: MmapMut,
    base: *mut u8,
}

// SAFETY: the arena's bytes are reached only through pieces, each a disjoint range owned by
// one table (behind its shard's lock); the arena itself only keeps the mapping alive.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

/// A range of an arena, owned by one table.
pub(crate) struct Piece {
    arena: Arc<Arena>,
    start: usize,
    len: usize,
}

impl Arena {
    /// Pieces of the given sizes (each rounded up to whole pages, so that a piece's pages can
    /// be given back on its own), cut in order from `maps` (memory that held something else:
    /// each piece is zeroed; what is left of a map is given back), then from one new populated
    /// mapping if they run out. `None` if that cannot be mapped.
    pub fn cut(maps: Vec<MmapMut>, sizes: &[usize]) -> Option<Vec<Mem>> {
        let mut out = Vec::with_capacity(sizes.len());
        let mut sizes = sizes.iter().map(|s| s.next_multiple_of(PAGE)).peekable();
        for map in maps {
            let arena = Arena::new(map);
            let mut start = 0;
            while let Some(&len) = sizes.peek().filter(|&&l| start + l <= arena.map.len()) {
                sizes.next();
                let mut piece = Mem::Piece(Piece { arena: arena.clone(), start, len });
                piece.fill(0);
                out.push(piece);
                start += len;
            }
            if start < arena.map.len() {
                // SAFETY: no piece covers this range, and nothing else reads it.
                let _ = unsafe {
                    arena.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, arena.map.len() - start)
                };
            }
        }
        let rest: Vec<usize> = sizes.collect();
        if !rest.is_empty() {
            let map = MmapOptions::new().len(rest.iter().sum()).populate().map_anon().ok()?;
            let arena = Arena::new(map);
            let mut start = 0;
            for len in rest {
                out.push(Mem::Piece(Piece { arena: arena.clone(), start, len }));
                start += len;
            }
        }
        Some(out)
    }

    fn new(mut map: MmapMut) -> Arc<Arena> {
        let base = map.as_mut_ptr();
        Arc::new(Arena { map, base })
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        // A table that grew out of its piece gives the pages back now, not when the last
        // table of its arena does.
        // SAFETY: the range is this piece's alone, and nothing reads it after this.
        let _ = unsafe { self.arena.map.unchecked_advise_range(UncheckedAdvice::DontNeed, self.start, self.len) };
    }
}
