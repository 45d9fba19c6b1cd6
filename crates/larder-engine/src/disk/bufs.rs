//! Read buffers of large records, used again. A fresh buffer of a mebibyte is page-faulted in
//! as the kernel fills it (9% of the server's CPU in a profile of 1 GiB GETs); a buffer that
//! held a value already sent is faulted in already. A buffer goes back to the pool when the
//! last `Bytes` of it is dropped (a value sent, a chunk verified and passed on).

use bytes::Bytes;
use parking_lot::Mutex;

/// Smaller buffers come from the allocator's arenas, which fault rarely.
const MIN: usize = 64 << 10;
/// Bytes, and number, of idle buffers kept at most.
const MAX_IDLE: usize = 64 << 20;
const MAX_COUNT: usize = 64;

struct Pool {
    idle: Vec<Vec<u8>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { idle: Vec::new(), bytes: 0 });

/// An empty buffer with room for `len` bytes: an idle one of about that size if there is one.
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len >= MIN {
        let mut pool = POOL.lock();
        // Not one much larger: it would hold memory a smaller value does not need.
        if let Some(i) = pool.idle.iter().position(|b| (len..=2 * len).contains(&b.capacity())) {
            let b = pool.idle.swap_remove(i);
            pool.bytes -= b.capacity();
            return b;
        }
    }
    Vec::with_capacity(len)
}

/// The buffer as `Bytes`, going back to the pool when they are dropped.
pub(crate) fn into_bytes(buf: Vec<u8>) -> Bytes {
    if buf.capacity() < MIN {
        return Bytes::from(buf);
    }
    Bytes::from_owner(Pooled(buf))
}

struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        buf.clear();
        let mut pool = POOL.lock();
        if pool.bytes + buf.capacity() <= MAX_IDLE && pool.idle.len() < MAX_COUNT {
            pool.bytes += buf.capacity();
            pool.idle.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_bytes_are_dropped_and_small_ones_never_enter() {
        let mut b = take(1 << 20);
        b.extend_from_slice(&[7u8; 1 << 20]);
        let ptr = b.as_ptr();
        let bytes = into_bytes(b);
        let part = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(&part[..], &[7u8; 10]);
        drop(part);
        // Other tests may take it meanwhile: look for it among a few.
        let again: Vec<Vec<u8>> = (0..4).map(|_| take(1 << 20)).collect();
        assert!(again.iter().any(|b| b.as_ptr() == ptr && b.is_empty()), "the buffer was not used again");
        assert!(take(100).capacity() < MIN);
        assert_eq!(into_bytes(vec![1, 2, 3]), Bytes::from_static(&[1, 2, 3]));
    }
}
