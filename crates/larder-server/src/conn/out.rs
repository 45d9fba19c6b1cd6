//! Answers on their way out, whichever loop wrote them ([`super::reactor`] or
//! [`super::native`]): heads written as hyper writes them, and bodies gathered for one
//! vectored write.

use crate::app::App;
use crate::h1::{self, Framing};
use bytes::{Buf, Bytes};
use hyper::header::{HeaderValue, CONNECTION};
use hyper::http::response::Parts;
use hyper::Method;
use std::io::IoSlice;

/// Answers gathered before they are written; a body that would pass it is written on its own.
const OUT_SIZE: usize = 64 * 1024;
/// A body shorter than this is copied (a slice of its own costs more than the copy).
const COPY_BELOW: usize = 512;
/// Bodies sent by reference in one write at most (each takes two slices).
const MAX_BODIES: usize = 16;
/// The slices of one write, at most.
pub(super) const MAX_SLICES: usize = 2 * MAX_BODIES + 1;

/// Answers gathered for one write: their heads (and short bodies) copied into `bytes`, each
/// longer body sent from where it lies (a value in the memory tier is not copied).
#[derive(Default)]
pub(super) struct Out {
    bytes: Vec<u8>,
    /// Bodies, each after the first `.0` bytes of `bytes`.
    bodies: Vec<(usize, Bytes)>,
    len: usize,
}

impl Out {
    pub(super) fn extend(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
        self.len += b.len();
    }

    pub(super) fn push(&mut self, b: Bytes) {
        if b.len() < COPY_BELOW {
            self.extend(&b);
        } else {
            self.len += b.len();
            self.bodies.push((self.bytes.len(), b));
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it should be written before more is added.
    pub(super) fn full(&self) -> bool {
        self.len >= OUT_SIZE || self.bodies.len() >= MAX_BODIES
    }

    /// Fills `iov` with what is to be written, in order; returns how many slices it took.
    pub(super) fn slices<'a>(&'a self, iov: &mut [IoSlice<'a>; MAX_SLICES]) -> usize {
        let mut n = 0;
        let mut at = 0;
        for (end, body) in &self.bodies {
            iov[n] = IoSlice::new(&self.bytes[at..*end]);
            iov[n + 1] = IoSlice::new(body);
            (n, at) = (n + 2, *end);
        }
        iov[n] = IoSlice::new(&self.bytes[at..]);
        n + 1
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.bodies.clear();
        self.len = 0;
    }

    /// Drops the first `n` bytes, which a write took (rare: most writes take all). What is
    /// left keeps its shape: heads copied, bodies by reference.
    pub(super) fn advance(&mut self, mut n: usize) {
        if n >= self.len {
            self.clear();
            return;
        }
        let (bytes, bodies) = (std::mem::take(&mut self.bytes), std::mem::take(&mut self.bodies));
        self.len = 0;
        let mut skip = |len: usize| {
            let s = n.min(len);
            n -= s;
            s
        };
        let mut at = 0;
        for (end, mut body) in bodies {
            let s = skip(end - at);
            self.extend(&bytes[at + s..end]);
            let s = skip(body.len());
            body.advance(s);
            if !body.is_empty() {
                self.len += body.len();
                self.bodies.push((self.bytes.len(), body));
            }
            at = end;
        }
        let s = skip(bytes.len() - at);
        self.extend(&bytes[at + s..]);
    }
}

/// Writes the head of `parts`, the answer to a request of `method`, into `out` as hyper
/// would: a client that asked to close (`close`), or a server stopping, is told so. Returns
/// how the body follows, and whether the connection closes once this answer is written.
pub(super) fn head(
    out: &mut Out,
    app: &App,
    method: &Method,
    close: bool,
    parts: &mut Parts,
    len: Option<u64>,
) -> (Framing, bool) {
    if app.stopping() || (close && !parts.headers.contains_key(CONNECTION)) {
        parts.headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let last = close || parts.headers.get(CONNECTION).is_some_and(|v| v.as_bytes() == b"close");
    let before = out.bytes.len();
    let framing = h1::write_head(&mut out.bytes, method, parts.status, &parts.headers, len);
    out.len += out.bytes.len() - before;
    (framing, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(out: &Out) -> Vec<u8> {
        let mut iov = [IoSlice::new(&[]); MAX_SLICES];
        let n = out.slices(&mut iov);
        iov[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    /// Two heads, each with a body sent by reference, and a tail.
    fn sample() -> Out {
        let mut out = Out::default();
        out.extend(b"head one\r\n");
        out.push(Bytes::from(vec![b'a'; 600]));
        out.extend(b"head two\r\n");
        out.push(Bytes::from(vec![b'b'; 700]));
        out.extend(b"tail");
        out
    }

    #[test]
    fn advance_drops_exactly_what_was_written_across_heads_and_bodies() {
        let whole = sample();
        let all = written(&whole);
        assert_eq!(all.len(), whole.len);
        for n in [0, 1, 10, 11, 609, 610, 620, 1320, all.len() - 1, all.len()] {
            let mut out = sample();
            out.advance(n);
            assert_eq!(written(&out), all[n..], "after {n} bytes");
            assert_eq!(out.len, all.len() - n);
            assert_eq!(out.is_empty(), n == all.len());
        }
    }
}
