//! The meta commands that change an item in place: `md` (delete, or mark stale with `I`) and
//! `ma` (arithmetic), with their flags and answers as memcached 1.6 gives them.

use super::exec::{contended, expiry, keep, server_error, ROUNDS};
use super::meta::{echo, error_line, key_flag, preparse, ttl_left, Flags, MAX_OPAQUE, MAX_WORDS};
use super::text::KEY_MAX;
use super::{Conn, End};
use crate::storeio::blocking;
use bytes::Bytes;
use larder_engine::{now_ms, DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Value};
use std::borrow::Cow;

/// The key and flags of `md` or `ma`, or `None` once the error memcached gives is answered.
fn delete_or_arith_flags<'w>(c: &mut Conn, words: &[&'w [u8]]) -> Option<(Cow<'w, [u8]>, Flags)> {
    if words[1].len() > KEY_MAX {
        error_line(c, "CLIENT_ERROR bad command line format");
        return None;
    }
    if words.len() + 1 > MAX_WORDS {
        error_line(c, "CLIENT_ERROR options flags too long");
        return None;
    }
    let mut key = Cow::Borrowed(words[1]);
    match preparse(words, 2, &mut key) {
        Ok(f) => Some((key, f)),
        Err(_) => {
            error_line(c, "CLIENT_ERROR invalid or duplicate flag");
            None
        }
    }
}

pub(super) async fn md(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    let Some((key, f)) = delete_or_arith_flags(c, words) else { return Ok(()) };
    let mut tail = Vec::new();
    if let Err(e) = echo(&mut tail, &words[2..], &key, f.key_binary) {
        error_line(c, e);
        return Ok(());
    }
    let app = c.app.clone();
    let k = key.to_vec();
    let (cas, stale, ttl) = (f.cas, f.stale, f.ttl);
    let r = blocking(&app, move |s| {
        let Some(v) = s.get(&k, &ReadOptions { part: Part::Nothing, ..Default::default() })? else {
            return Ok(&b"NF"[..]);
        };
        if cas.is_some_and(|c| c != v.stored_ms) {
            return Ok(&b"EX"[..]);
        }
        let cond = [Precondition::StoredAt(v.stored_ms)];
        if !stale {
            return match s.delete(&k, &DeleteOptions { preconditions: &cond, ..Default::default() }) {
                Ok(true) => Ok(&b"HD"[..]),
                Ok(false) => Ok(&b"NF"[..]),
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => Ok(&b"EX"[..]),
                Err(e) => Err(e),
            };
        }
        // Invalidate: the value stays, marked stale, under a new cas (and TTL, if given).
        let Some(mut r) = s.reader(&k, Part::Whole)? else { return Ok(&b"NF"[..]) };
        let opts = PutOptions {
            expiry: ttl.map_or(Expiry::of(v.expiry_ms), expiry),
            flags: v.flags,
            stale: true,
            content_type: v.content_type.as_deref(),
            attrs: v.attrs.as_deref(),
            preconditions: &cond,
            nonblocking: false,
        };
        let mut w = s.writer(&k, &opts)?;
        while let Some(p) = r.next_piece()? {
            w.write(&p)?;
        }
        match w.finish() {
            Ok(_) => Ok(&b"HD"[..]),
            Err(e) if e.kind() == ErrorKind::PreconditionFailed => Ok(&b"EX"[..]),
            Err(e) => Err(e),
        }
    })
    .await;
    let code = match r {
        Ok(code) => code,
        Err(e) => {
            c.out.extend_from_slice(server_error(&e).as_bytes());
            return Ok(());
        }
    };
    if code == b"HD" && f.quiet {
        return Ok(());
    }
    c.out.extend_from_slice(code);
    c.out.extend_from_slice(&tail);
    c.out.extend_from_slice(b"\r\n");
    Ok(())
}

pub(super) async fn ma(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    let Some((key, f)) = delete_or_arith_flags(c, words) else { return Ok(()) };
    let incr = match f.mode {
        None | Some(b'I' | b'+') => true,
        Some(b'D' | b'-') => false,
        Some(_) => {
            error_line(c, "CLIENT_ERROR invalid mode for ma M token");
            return Ok(());
        }
    };
    enum Done {
        Number(u64, Value, bool),
        NotFound,
        Exists,
        NotNumeric,
    }
    let app = c.app.clone();
    let k = key.to_vec();
    let (delta, cas, vivify, initial) = (f.delta.unwrap_or(1), f.cas, f.vivify, f.initial);
    let r = blocking(&app, move |s| {
        for _ in 0..ROUNDS {
            let v = match s.get(&k, &ReadOptions::default()) {
                Ok(Some(v)) => v,
                Ok(None) => {
                    let Some(t) = vivify else { return Ok(Done::NotFound) };
                    let absent = [Precondition::Absent];
                    let opts = PutOptions { expiry: expiry(t), preconditions: &absent, ..Default::default() };
                    let text = initial.to_string();
                    // Answered from what was written, not read back: with a TTL already past, the
                    // value is expired at once, and a read would miss it.
                    match s.put(&k, text.as_bytes(), &opts) {
                        Ok(st) => {
                            let now = now_ms();
                            let v = Value {
                                data: Bytes::from(text.into_bytes()),
                                start: 0,
                                len: st.version.len,
                                crc: st.version.crc,
                                content_type: None,
                                attrs: None,
                                position: st.position,
                                stored_ms: st.version.stored_ms,
                                expiry_ms: expiry(t).at_ms(now),
                                flags: 0,
                                stale: false,
                                tier: larder_engine::Tier::Disk,
                            };
                            return Ok(Done::Number(initial, v, true));
                        }
                        Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if e.kind() == ErrorKind::TooLarge => return Ok(Done::NotNumeric),
                Err(e) => return Err(e),
            };
            if cas.is_some_and(|c| c != 0 && c != v.stored_ms) {
                return Ok(Done::Exists);
            }
            let Some((n, bytes)) = super::text::apply_delta(&v.data, incr, delta) else { return Ok(Done::NotNumeric) };
            let cond = [Precondition::StoredAt(v.stored_ms)];
            let opts = keep(&v, &cond);
            match s.put(&k, &bytes, &opts) {
                Ok(stored) => {
                    let v = Value { stored_ms: stored.version.stored_ms, ..v };
                    return Ok(Done::Number(n, v, false));
                }
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
                Err(e) => return Err(e),
            }
        }
        Err(contended())
    })
    .await;
    let mut out = Vec::new();
    match r {
        Err(e) => {
            c.out.extend_from_slice(server_error(&e).as_bytes());
            return Ok(());
        }
        Ok(Done::NotNumeric) => {
            error_line(c, "CLIENT_ERROR cannot increment or decrement non-numeric value");
            return Ok(());
        }
        Ok(done @ (Done::NotFound | Done::Exists)) => {
            out.extend_from_slice(if matches!(done, Done::NotFound) { b"NF" } else { b"EX" });
            if let Err(e) = echo(&mut out, &words[2..], &key, f.key_binary) {
                error_line(c, e);
                return Ok(());
            }
        }
        Ok(Done::Number(number, v, created)) => {
            if f.quiet {
                return Ok(());
            }
            let text = number.to_string();
            if f.value {
                out.extend_from_slice(format!("VA {}", text.len()).as_bytes());
            } else {
                out.extend_from_slice(b"HD");
            }
            let now = now_ms();
            let mut expiry_ms = v.expiry_ms;
            let mut new_ttl = None;
            for w in &words[2..] {
                match w[0] {
                    b'c' => out.extend_from_slice(format!(" c{}", v.stored_ms).as_bytes()),
                    b't' => out.extend_from_slice(format!(" t{}", ttl_left(expiry_ms, now)).as_bytes()),
                    b'T' => {
                        let e = expiry(f.ttl.expect("parsed"));
                        expiry_ms = e.at_ms(now);
                        new_ttl = Some(e);
                    }
                    b'N' if created => {
                        let e = expiry(f.vivify.expect("parsed"));
                        expiry_ms = e.at_ms(now);
                    }
                    b'O' if w.len() > MAX_OPAQUE => {
                        error_line(c, "CLIENT_ERROR opaque token too long");
                        return Ok(());
                    }
                    b'O' => {
                        out.push(b' ');
                        out.extend_from_slice(w);
                    }
                    b'k' => key_flag(&mut out, &key, f.key_binary),
                    _ => {}
                }
            }
            if let Some(e) = new_ttl {
                let k = key.to_vec();
                let _ = blocking(&app, move |s| s.touch(&k, e)).await;
            }
            if f.value {
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    c.out.extend_from_slice(&out);
    Ok(())
}
