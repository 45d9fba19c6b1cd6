//! A large value's chunk table: the value of its head record (docs/FORMAT.md, "Large values").
//!
//! A value longer than the store's chunk size is written as chunk records (each a record of
//! its own, with its own checksums), then a head record whose value lists them in order. Only
//! the head is indexed; a chunk is found through the head, at the slot, generation, volume
//! sequence and offset written here, so a chunk whose slot the ring reused is known dead
//! without reading it. The sequence makes that hold across restarts too: a slot whose volume
//! recovery discarded starts its generations again, but every volume started after a head was
//! written has a higher sequence than any volume holding its chunks.

use super::record::{Header, HEADER_LEN};
use bytes::{Buf, BufMut};

/// The unit of a punch: the file system frees whole pages only.
const PAGE: u64 = 4096;

/// What a punch frees of the chunk record at `offset` when its value dies: the whole pages of
/// its body. The header stays, so that a scan still knows the record and reads the hole as
/// free space. `None` when the body holds no whole page.
pub fn punched_range(offset: u64, h: &Header) -> Option<(u64, u64)> {
    let body = offset + (HEADER_LEN + h.key_len as usize + h.meta_len as usize) as u64;
    let (from, to) = (body.next_multiple_of(PAGE), (offset + h.record_len()) / PAGE * PAGE);
    (from < to).then_some((from, to))
}

/// Bytes per table entry.
pub const CHUNK_REF_LEN: usize = 32;

/// Where one chunk of a large value lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    /// Volume slot.
    pub slot: u16,
    /// The slot's whole generation when the chunk was written.
    pub generation: u32,
    /// The sequence of the volume the chunk was written in.
    pub sequence: u64,
    /// Offset of the chunk's record in its volume.
    pub offset: u64,
    /// Length of the chunk's record (header, key, metadata and data), without padding.
    pub record_len: u32,
    /// Bytes of the value in this chunk.
    pub len: u32,
}

/// Encodes a chunk table.
pub fn encode(chunks: &[ChunkRef]) -> Vec<u8> {
    let mut b = Vec::with_capacity(chunks.len() * CHUNK_REF_LEN);
    for c in chunks {
        b.put_u16_le(c.slot);
        b.put_u16_le(0); // reserved
        b.put_u32_le(c.generation);
        b.put_u64_le(c.sequence);
        b.put_u64_le(c.offset);
        b.put_u32_le(c.record_len);
        b.put_u32_le(c.len);
    }
    b
}

/// Decodes a chunk table; `None` unless it is a whole number of entries.
pub fn decode(mut b: &[u8]) -> Option<Vec<ChunkRef>> {
    if !b.len().is_multiple_of(CHUNK_REF_LEN) {
        return None;
    }
    let mut chunks = Vec::with_capacity(b.len() / CHUNK_REF_LEN);
    while b.has_remaining() {
        let slot = b.get_u16_le();
        b.advance(2); // reserved
        let (generation, sequence) = (b.get_u32_le(), b.get_u64_le());
        let (offset, record_len, len) = (b.get_u64_le(), b.get_u32_le(), b.get_u32_le());
        chunks.push(ChunkRef { slot, generation, sequence, offset, record_len, len });
    }
    Some(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_a_torn_one_is_refused() {
        let chunks: Vec<ChunkRef> = (0..5u32)
            .map(|i| ChunkRef {
                slot: i as u16,
                generation: 7 + i,
                sequence: 1000 + i as u64,
                offset: 64 + 8 * i as u64,
                record_len: 100 + i,
                len: 40 + i,
            })
            .collect();
        let b = encode(&chunks);
        assert_eq!(b.len(), 5 * CHUNK_REF_LEN);
        assert_eq!(decode(&b), Some(chunks));
        assert_eq!(decode(&b[..b.len() - 1]), None);
    }
}
