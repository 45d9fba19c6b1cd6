//! The on-disk formats, as pure encoders and decoders (no I/O): one module per table of
//! docs/FORMAT.md. Public for `larder check`, the fuzz tests and tools that read volumes.
//!
//! One byte-layout approach for all of them: fields are written in table order with
//! `bytes::BufMut` and read back in the same order with `bytes::Buf`, little-endian, reserved
//! bytes written as zeros and skipped by count; a decoder checks lengths before it reads.

pub mod alive;
pub mod codec;
pub mod dict;
pub mod dir_id;
pub mod flush;
pub mod hint;
pub mod large;
pub mod manifest;
pub mod meta;
pub mod record;
pub mod volume;

use bytes::{Buf, BufMut};

/// Length of the fixed blocks (volume header, `DIR-ID`, version-1 manifest): an 8-byte magic,
/// a `u32` version, 48 bytes of fields, and the CRC32C of the first 60 bytes.
pub(crate) const BLOCK_LEN: usize = 64;

/// A fixed block: `fields` writes at most 48 bytes after magic and version.
pub(crate) fn seal_block(magic: &[u8; 8], version: u32, fields: impl FnOnce(&mut &mut [u8])) -> [u8; BLOCK_LEN] {
    let mut b = [0u8; BLOCK_LEN];
    let mut w = &mut b[..BLOCK_LEN - 4];
    w.put_slice(magic);
    w.put_u32_le(version);
    fields(&mut w);
    let crc = crc32c::crc32c(&b[..BLOCK_LEN - 4]);
    (&mut b[BLOCK_LEN - 4..]).put_u32_le(crc);
    b
}

/// The version and the 48 bytes of fields of a sound fixed block at the start of `b`; `None`
/// when it is short, has another magic or fails its checksum.
pub(crate) fn open_block<'a>(b: &'a [u8], magic: &[u8; 8]) -> Option<(u32, &'a [u8])> {
    let b = b.get(..BLOCK_LEN)?;
    if &b[..8] != magic || crc32c::crc32c(&b[..BLOCK_LEN - 4]) != (&b[BLOCK_LEN - 4..]).get_u32_le() {
        return None;
    }
    Some(((&b[8..12]).get_u32_le(), &b[12..BLOCK_LEN - 4]))
}
