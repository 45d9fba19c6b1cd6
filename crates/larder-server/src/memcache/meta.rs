//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `me`; `mn` is answered by the command
//! table), as memcached 1.6 answers them: the same flags, the same order of the returned
//! flags, the same errors; over the item core, with the per-item state memcached keeps in
//! RAM (fetched, last access, win token) from the listener (`listener::Items`).

use super::conn::{Conn, End};
use super::item::{self, Block, Counted, Put, Wrote};
use super::listener::{ItemState, BUMP_EVERY_MS};
use super::wire::meta::{echo, echo_flag, key_flag, preparse, ttl_left, Flags, MAX_OPAQUE, MAX_WORDS};
use super::wire::{safe_strtol, text, Answer, StoreOp, KEY_MAX};
use crate::storeio::{blocking, quick, read_body_of};
use base64::Engine;
use bytes::Bytes;
use larder_engine::{now_ms, DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Store};
use std::borrow::Cow;

fn error_line(c: &mut Conn, line: &str) {
    c.out.extend_from_slice(line.as_bytes());
    c.out.extend_from_slice(b"\r\n");
}

/// A store failure, as memcached's `SERVER_ERROR` (or `CLIENT_ERROR`) line.
fn failed(c: &mut Conn, e: &larder_engine::Error) {
    text::render(&mut c.out, &item::failed(e));
}

/// Runs the meta command `cmd` (`mg`, `ms`, `md`, `ma` or `me`) of the words `words`.
pub async fn run(c: &mut Conn, store: &Store, cmd: u8, words: &[&[u8]]) -> Result<(), End> {
    let n = words.len() + 1;
    if n < 3 && cmd != b'e' {
        error_line(c, "ERROR");
        return Ok(());
    }
    match cmd {
        b'g' => mg(c, store, words).await,
        b's' => ms(c, store, words).await,
        b'd' => md(c, words).await,
        b'a' => ma(c, words).await,
        _ => me(c, store, words).await,
    }
}

async fn mg(c: &mut Conn, store: &Store, words: &[&[u8]]) -> Result<(), End> {
    if words[1].len() > KEY_MAX {
        error_line(c, "CLIENT_ERROR bad command line format");
        return Ok(());
    }
    if words.len() + 1 > MAX_WORDS {
        error_line(c, "CLIENT_ERROR options flags are too long");
        return Ok(());
    }
    let mut key = Cow::Borrowed(words[1]);
    let f = match preparse(words, 2, &mut key) {
        Ok(f) => f,
        Err(e) => {
            error_line(c, e);
            return Ok(());
        }
    };
    let app = c.app.clone();
    let part = if f.value { Part::Whole } else { Part::Nothing };
    // With `T`, the value found is given its new TTL after the read (as gat's).
    let found = read_body_of(&app, store, &key, part, false).await;
    if let Ok(found) = &found {
        app.watch.read(crate::watch::Door::Memcache, &key, found.as_ref().map(|f| f.value().len));
    }
    let found = match (found, f.ttl) {
        (Ok(found), Some(t)) => item::touch_after_read(c, &key, found, t).await,
        (found, _) => found,
    };
    let mut found = match found {
        Ok(found) => found,
        Err(e) => {
            failed(c, &e);
            return Ok(());
        }
    };
    let mut created = false;
    if found.is_none() {
        if let Some(t) = f.vivify {
            // An empty placeholder whose first asker wins the right to fill it.
            let (k, exp) = (key.to_vec(), item::expiry(t));
            let made = blocking(&app, move |s| {
                let absent = [Precondition::Absent];
                s.put(&k, b"", &PutOptions { expiry: exp, preconditions: &absent, ..Default::default() })
            })
            .await;
            match made {
                Ok(_) => created = true,
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => {}
                Err(e) => {
                    failed(c, &e);
                    return Ok(());
                }
            }
            found = read_body_of(&app, store, &key, part, false).await.unwrap_or(None);
            if let Some(t) = f.ttl {
                found = item::touch_after_read(c, &key, found, t).await.unwrap_or(None);
            }
        }
    }
    let Some(found) = found else {
        if !f.quiet {
            let mut out = b"EN".to_vec();
            if let Err(e) = echo(&mut out, &words[2..], &key, f.key_binary) {
                error_line(c, e);
                return Ok(());
            }
            out.extend_from_slice(b"\r\n");
            c.out.extend_from_slice(&out);
        }
        return Ok(());
    };
    let v = found.value().clone();
    let now = now_ms();
    let listener = c.listener.clone();
    let items = &listener.items;
    let mut state = items.state(&key, v.stored_ms);
    let mut expiry_ms = v.expiry_ms;
    let mut won = false;
    let mut out = Vec::with_capacity(64);
    if f.value {
        out.extend_from_slice(format!("VA {}", v.len).as_bytes());
    } else {
        out.extend_from_slice(b"HD");
    }
    for w in &words[2..] {
        match w[0] {
            b'T' => expiry_ms = item::expiry(f.ttl.expect("parsed")).at_ms(now),
            b'N' if created => won = true,
            b'R' => {
                let left = ttl_left(expiry_ms, now);
                if !state.token_sent && !created && expiry_ms != 0 && left < f.recache.expect("parsed") {
                    won = true;
                }
            }
            b's' => out.extend_from_slice(format!(" s{}", v.len).as_bytes()),
            b't' => out.extend_from_slice(format!(" t{}", ttl_left(expiry_ms, now)).as_bytes()),
            b'c' => out.extend_from_slice(format!(" c{}", v.stored_ms).as_bytes()),
            b'f' => out.extend_from_slice(format!(" f{}", v.flags).as_bytes()),
            b'l' => out.extend_from_slice(format!(" l{}", now.saturating_sub(state.bumped_ms) / 1000).as_bytes()),
            b'h' => out.extend_from_slice(if state.fetched { b" h1" } else { b" h0" }),
            _ => {
                if let Err(e) = echo_flag(&mut out, w, &key, f.key_binary) {
                    error_line(c, e);
                    return Ok(());
                }
            }
        }
    }
    if state.token_sent {
        out.extend_from_slice(b" Z");
    }
    if v.stale {
        out.extend_from_slice(b" X");
        won |= !state.token_sent;
    }
    if won {
        out.extend_from_slice(b" W");
        state.token_sent = true;
    }
    out.extend_from_slice(b"\r\n");
    c.out.extend_from_slice(&out);
    if !f.no_update {
        state.fetched = true;
        if now.saturating_sub(state.bumped_ms) >= BUMP_EVERY_MS {
            state.bumped_ms = now;
        }
    }
    items.set(&key, state);
    if f.value {
        if let Some(rest) = item::send_value(c, store, found) {
            rest.await?;
        }
        c.out.extend_from_slice(b"\r\n");
    }
    Ok(())
}

async fn ms(c: &mut Conn, store: &Store, words: &[&[u8]]) -> Result<(), End> {
    let n = words.len() + 1;
    if words[1].len() > KEY_MAX || n == 3 {
        error_line(c, "CLIENT_ERROR bad command line format");
        return Ok(());
    }
    if n > MAX_WORDS {
        error_line(c, "CLIENT_ERROR options flags too long");
        return Ok(());
    }
    let len = match safe_strtol(words[2]) {
        // As memcached bounds it (see text.rs `parse_store`).
        Some(l) if (0..=i32::MAX as i64 - 3).contains(&l) => l as u64,
        _ => {
            error_line(c, "CLIENT_ERROR bad command line format");
            return Ok(());
        }
    };
    let mut key = Cow::Borrowed(words[1]);
    let parsed = preparse(words, 3, &mut key).and_then(|f| {
        // The flags echoed once stored: opaque, key and the new cas, in their order.
        let mut echoed = Vec::new();
        for w in &words[3..] {
            match w[0] {
                b'O' if w.len() > MAX_OPAQUE => return Err("CLIENT_ERROR opaque token too long"),
                b'O' | b'k' | b'c' => echoed.push(*w),
                _ => {}
            }
        }
        match f.mode {
            None | Some(b'S' | b'E' | b'A' | b'P' | b'R') => Ok((f, echoed)),
            Some(_) => Err("CLIENT_ERROR invalid mode for ms M token"),
        }
    });
    let (f, echoed) = match parsed {
        Ok(p) => p,
        Err(e) => {
            c.swallow(len + 2).await?;
            error_line(c, e);
            return Ok(());
        }
    };
    let op = match f.mode {
        None | Some(b'S') => StoreOp::Set,
        Some(b'E') => StoreOp::Add,
        Some(b'A') => StoreOp::Append,
        Some(b'P') => StoreOp::Prepend,
        _ => StoreOp::Replace,
    };
    let append = matches!(op, StoreOp::Append | StoreOp::Prepend);
    if len > store.config().max_value_size || (append && !item::concat_fits(store, len)) {
        // memcached drops the key whatever the mode (set, add, replace, append, prepend).
        item::drop_refused(c, &key).await;
        text::render(&mut c.out, &Answer::TooLarge);
        return c.flush_then_swallow(len + 2).await;
    }
    let app = c.app.clone();
    // Which write this is, memcached's way: a cas turns set and replace into a cas.
    let cas_mode = f.cas.is_some() && matches!(op, StoreOp::Set | StoreOp::Replace);
    let put = Put::new(op, &key, f.client_flags, f.ttl.unwrap_or(0), f.cas.filter(|_| cas_mode));
    // The store time of what this command wrote: its new cas.
    let result: larder_engine::Result<u64> = match item::read_data(c, store, &put, len).await? {
        None => {
            error_line(c, "CLIENT_ERROR bad data chunk");
            return Ok(());
        }
        Some(Block::Streamed(r)) => r,
        Some(Block::Data(data)) => {
            let (stale, cas) = (f.stale, f.cas);
            match quick(&app, move |s, wait| ms_write(s, &put, &data, op, cas, cas_mode && stale, wait)).await {
                Ok((new, Some(old))) => {
                    // A stale store keeps the win token of the value it replaced.
                    let was = c.listener.items.state(&key, old);
                    c.listener.items.set(&key, ItemState { stored_ms: new, ..was });
                    Ok(new)
                }
                r => r.map(|(new, _)| new),
            }
        }
    };
    let code: &[u8] = match &result {
        Ok(_) => b"HD",
        Err(e) if e.kind() == ErrorKind::PreconditionFailed => {
            let present = matches!(item::lost_by(c, &key).await, Ok(Answer::Exists));
            match (cas_mode || append, present) {
                (true, true) => b"EX",
                (true, false) if cas_mode => b"NF",
                _ => b"NS",
            }
        }
        Err(e) => {
            failed(c, e);
            return Ok(());
        }
    };
    if code == b"HD" && f.quiet {
        return Ok(());
    }
    let mut out = code.to_vec();
    for w in echoed {
        match w[0] {
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(w);
            }
            b'k' => key_flag(&mut out, &key, f.key_binary),
            _ => {
                let cas = match (&result, code) {
                    (Ok(cas), b"HD") => *cas,
                    _ => 0,
                };
                out.extend_from_slice(format!(" c{cas}").as_bytes());
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    c.out.extend_from_slice(&out);
    Ok(())
}

/// The write of an `ms` whose data is in memory: the new value's store time and, for a stale
/// store (`I` with an older cas), the store time of the value it replaced. Each store call
/// waits only if `wait` (see `storeio::quick`): none comes after a write that took effect.
fn ms_write(
    s: &Store,
    put: &Put,
    data: &Bytes,
    op: StoreOp,
    cas: Option<u64>,
    stale_allowed: bool,
    wait: bool,
) -> larder_engine::Result<(u64, Option<u64>)> {
    let opts = PutOptions { nonblocking: !wait, ..put.options() };
    let reading = |part| ReadOptions { part, nonblocking: !wait, coded: false };
    match op {
        StoreOp::Append | StoreOp::Prepend => {
            match item::concat(s, &put.key, data, op == StoreOp::Append, cas, wait)? {
                Wrote::Stored(cas) => Ok((cas, None)),
                _ => Err(larder_engine::Error::new(ErrorKind::PreconditionFailed, "absent, or another version")),
            }
        }
        _ => match s.put(&put.key, data, &opts) {
            // With `I`, a cas older than the value's stores anyway, marked stale, keeping the
            // value's expiry (a slow recache under an invalidation).
            Err(e) if e.kind() == ErrorKind::PreconditionFailed && stale_allowed => {
                let Some(v) = s.get(&put.key, &reading(Part::Nothing))? else {
                    return Err(e);
                };
                if cas.is_none_or(|c| c >= v.stored_ms) {
                    return Err(e);
                }
                let cond = [Precondition::StoredAt(v.stored_ms)];
                let stale = PutOptions { expiry: Expiry::of(v.expiry_ms), stale: true, preconditions: &cond, ..opts };
                s.put(&put.key, data, &stale).map(|st| (st.version.stored_ms, Some(v.stored_ms)))
            }
            r => r.map(|st| (st.version.stored_ms, None)),
        },
    }
}

async fn me(c: &mut Conn, store: &Store, words: &[&[u8]]) -> Result<(), End> {
    let n = words.len() + 1;
    if n < 3 || words[1].len() > KEY_MAX {
        error_line(c, "CLIENT_ERROR bad command line format");
        return Ok(());
    }
    let mut key = Cow::Borrowed(words[1]);
    let binary = n >= 4 && words[2] == b"b";
    if binary {
        match base64::engine::general_purpose::STANDARD.decode(words[1]) {
            Ok(k) if !k.is_empty() => key = Cow::Owned(k),
            _ => {
                error_line(c, "CLIENT_ERROR bad command line format");
                return Ok(());
            }
        }
    }
    let app = c.app.clone();
    let Some(found) = read_body_of(&app, store, &key, Part::Nothing, false).await.ok().flatten() else {
        error_line(c, "EN");
        return Ok(());
    };
    let v = found.value();
    let now = now_ms();
    let state = c.listener.items.state(&key, v.stored_ms);
    // memcached prints exptime as now minus expiry (negative while it lives).
    let exp = match v.expiry_ms {
        0 => -1,
        e => -ttl_left(e, now),
    };
    let shown = if binary {
        base64::engine::general_purpose::STANDARD.encode(&key[..])
    } else {
        String::from_utf8_lossy(&key).into_owned()
    };
    let line = format!(
        "ME {shown} exp={exp} la={} cas={} fetch={} cls=1 size={}\r\n",
        now.saturating_sub(state.bumped_ms) / 1000,
        v.stored_ms,
        if state.fetched { "yes" } else { "no" },
        v.position.size,
    );
    c.out.extend_from_slice(line.as_bytes());
    Ok(())
}

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

async fn md(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
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
            expiry: ttl.map_or(Expiry::of(v.expiry_ms), item::expiry),
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
            failed(c, &e);
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

async fn ma(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    let Some((key, f)) = delete_or_arith_flags(c, words) else { return Ok(()) };
    let incr = match f.mode {
        None | Some(b'I' | b'+') => true,
        Some(b'D' | b'-') => false,
        Some(_) => {
            error_line(c, "CLIENT_ERROR invalid mode for ma M token");
            return Ok(());
        }
    };
    let k = key.to_vec();
    let (delta, cas, initial) = (f.delta.unwrap_or(1), f.cas, f.initial);
    let create = f.vivify.map(|t| (initial, item::expiry(t)));
    let r = blocking(&c.app, move |s| item::arith(s, &k, incr, delta, cas, create)).await;
    let mut out = Vec::new();
    match r {
        Err(e) => {
            failed(c, &e);
            return Ok(());
        }
        Ok(Counted::NotNumeric) => {
            error_line(c, "CLIENT_ERROR cannot increment or decrement non-numeric value");
            return Ok(());
        }
        Ok(done @ (Counted::NotFound | Counted::Exists)) => {
            out.extend_from_slice(if matches!(done, Counted::NotFound) { b"NF" } else { b"EX" });
            if let Err(e) = echo(&mut out, &words[2..], &key, f.key_binary) {
                error_line(c, e);
                return Ok(());
            }
        }
        Ok(Counted::Number { n: number, cas, expiry_ms, created }) => {
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
            let mut expiry_ms = expiry_ms;
            let mut new_ttl = None;
            for w in &words[2..] {
                match w[0] {
                    b'c' => out.extend_from_slice(format!(" c{cas}").as_bytes()),
                    b't' => out.extend_from_slice(format!(" t{}", ttl_left(expiry_ms, now)).as_bytes()),
                    b'T' => {
                        let e = item::expiry(f.ttl.expect("parsed"));
                        expiry_ms = e.at_ms(now);
                        new_ttl = Some(e);
                    }
                    b'N' if created => expiry_ms = item::expiry(f.vivify.expect("parsed")).at_ms(now),
                    _ => {
                        if let Err(e) = echo_flag(&mut out, w, &key, f.key_binary) {
                            error_line(c, e);
                            return Ok(());
                        }
                    }
                }
            }
            if let Some(e) = new_ttl {
                let k = key.to_vec();
                let _ = blocking(&c.app, move |s| s.touch(&k, e)).await;
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
