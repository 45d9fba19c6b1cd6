//! The meta commands' flags, read as memcached's `_meta_flag_preparse` reads them, and the
//! flags their answers echo.

use super::number::{safe_strtol, safe_strtoul, safe_strtoull};
use base64::Engine;
use std::borrow::Cow;

/// memcached's limit on a meta command's words.
pub const MAX_WORDS: usize = 20;
/// memcached's limit on an opaque token (`O…`), in bytes.
pub const MAX_OPAQUE: usize = 32;

/// The flags of a meta command, read as memcached's `_meta_flag_preparse` reads them.
#[derive(Default)]
pub struct Flags {
    pub key_binary: bool,
    pub vivify: Option<i64>,
    pub ttl: Option<i64>,
    pub recache: Option<i64>,
    pub value: bool,
    pub no_update: bool,
    pub quiet: bool,
    pub stale: bool,
    pub cas: Option<u64>,
    pub client_flags: u32,
    pub mode: Option<u8>,
    pub delta: Option<u64>,
    pub initial: u64,
}

/// Reads the flags from `words[start..]`, decoding the key in place when `b` is given.
pub fn preparse(words: &[&[u8]], start: usize, key: &mut Cow<'_, [u8]>) -> Result<Flags, &'static str> {
    let mut f = Flags::default();
    let mut seen = [false; 128];
    let mut error = None;
    let num = |w: &[u8]| safe_strtol(&w[1..]);
    for w in &words[start..] {
        let o = w[0];
        if o >= 127 || seen[o as usize] {
            return Err("CLIENT_ERROR duplicate flag");
        }
        seen[o as usize] = true;
        let bad = "CLIENT_ERROR bad token in command line format";
        match o {
            b'b' => {
                f.key_binary = true;
                match base64::engine::general_purpose::STANDARD.decode(&key[..]) {
                    Ok(k) if !k.is_empty() => *key = Cow::Owned(k),
                    _ => error = Some("CLIENT_ERROR error decoding key"),
                }
            }
            b'N' => match num(w) {
                Some(t) => f.vivify = Some(t),
                None => error = Some(bad),
            },
            b'T' => match num(w) {
                Some(t) => f.ttl = Some(t),
                None => error = Some(bad),
            },
            b'R' => match num(w) {
                Some(t) => f.recache = Some(t),
                None => error = Some(bad),
            },
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => {}
            b'v' => f.value = true,
            b'u' => f.no_update = true,
            b'q' => f.quiet = true,
            // memcached sets no message of its own for a bad F: the command's default shows.
            b'F' => match safe_strtoul(&w[1..]) {
                Some(v) => f.client_flags = v,
                None => error = error.or(Some("CLIENT_ERROR bad command line format")),
            },
            b'C' => match safe_strtoull(&w[1..]) {
                Some(v) => f.cas = Some(v),
                None => error = Some(bad),
            },
            b'M' if w.len() != 2 => error = Some("CLIENT_ERROR incorrect length for M token"),
            b'M' => f.mode = Some(w[1]),
            b'J' => match safe_strtoull(&w[1..]) {
                Some(v) => f.initial = v,
                None => error = Some("CLIENT_ERROR invalid numeric initial value"),
            },
            b'D' => match safe_strtoull(&w[1..]) {
                Some(v) => f.delta = Some(v),
                None => error = Some("CLIENT_ERROR invalid numeric delta value"),
            },
            b'I' => f.stale = true,
            _ => return Err("CLIENT_ERROR invalid flag"),
        }
    }
    error.map_or(Ok(f), Err)
}

/// ` k<key>`, base64 and ` b` for a binary key.
pub fn key_flag(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(key).as_bytes());
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// Echoes `w` when it is an ` O…` or ` k…` flag, which every meta answer echoes; `Err` for
/// an opaque that is too long.
pub fn echo_flag(out: &mut Vec<u8>, w: &[u8], key: &[u8], binary: bool) -> Result<(), &'static str> {
    match w[0] {
        b'O' if w.len() > MAX_OPAQUE => return Err("CLIENT_ERROR opaque token too long"),
        b'O' => {
            out.push(b' ');
            out.extend_from_slice(w);
        }
        b'k' => key_flag(out, key, binary),
        _ => {}
    }
    Ok(())
}

/// The ` O…` and ` k…` flags of `words`, echoed (see [`echo_flag`]).
pub fn echo(out: &mut Vec<u8>, words: &[&[u8]], key: &[u8], binary: bool) -> Result<(), &'static str> {
    words.iter().try_for_each(|w| echo_flag(out, w, key, binary))
}

/// Seconds left before `expiry_ms` (memcached's `t`: -1 for none).
pub fn ttl_left(expiry_ms: u64, now: u64) -> i64 {
    match expiry_ms {
        0 => -1,
        e => (e.saturating_sub(now)).div_ceil(1000) as i64,
    }
}
