//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `me`; `mn` is answered with the text
//! commands), as memcached 1.6 answers them: the same flags, the same order of the returned
//! flags, the same errors.
//!
//! Per-item state that memcached keeps in its RAM and larder does not write to disk on every
//! read lives in [`Items`]: whether the item was fetched, when it was last bumped, and whether
//! a win token was handed out for it. It is keyed by the key and the write (store time), so a
//! new value starts afresh, and bounded: an item it forgot reads as never fetched, last
//! accessed when stored, no token out. The stale mark (`I`) is part of the stored value.

use super::exec::{
    answer_then_swallow, concat_fits, concat_value, drop_refused, expiry, put_streamed, read_block, server_error,
    stream_value, swallow, Concat, Put,
};
use super::text::{safe_strtol, safe_strtoul, safe_strtoull, KEY_MAX};
use super::{mdma, Conn, End};
use crate::storeio::{blocking, quick, read_body_of, Read};
use base64::Engine;
use bytes::Bytes;
use larder_engine::{now_ms, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Store};
use std::borrow::Cow;

/// memcached's limit on a meta command's words.
pub(super) const MAX_WORDS: usize = 20;
pub(super) const MAX_OPAQUE: usize = 32;
/// memcached bumps an item's last access at most this often (`ITEM_UPDATE_INTERVAL`).
const BUMP_EVERY_MS: u64 = 60_000;

/// What memcached keeps of an item in RAM, for the write (store time) it belongs to.
#[derive(Clone, Copy)]
pub(super) struct ItemState {
    stored_ms: u64,
    bumped_ms: u64,
    fetched: bool,
    token_sent: bool,
}

/// The per-item state of the meta protocol, for the items it was asked about or fetched.
/// Fetches are tracked from the first meta command that reads the state (`h`, `l`, `me`) or
/// hands out a win token on: until then a get costs nothing here.
pub struct Items {
    cache: quick_cache::sync::Cache<Vec<u8>, ItemState>,
    tracking: std::sync::atomic::AtomicBool,
}

impl Default for Items {
    fn default() -> Items {
        Items { cache: quick_cache::sync::Cache::new(1 << 18), tracking: Default::default() }
    }
}

impl Items {
    fn state(&self, key: &[u8], stored_ms: u64) -> ItemState {
        self.tracking.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.cache.get(key) {
            Some(s) if s.stored_ms == stored_ms => s,
            _ => ItemState { stored_ms, bumped_ms: stored_ms, fetched: false, token_sent: false },
        }
    }

    /// When the item was last bumped (ms) and whether it was fetched, for `lru_crawler
    /// metadump`; fetches are tracked from the first such question on.
    pub fn seen(&self, key: &[u8], stored_ms: u64) -> (u64, bool) {
        let s = self.state(key, stored_ms);
        (s.bumped_ms, s.fetched)
    }

    /// A fetch of the item (a get of any kind, not `mg … u`): fetched from now on, and bumped
    /// if its last bump is older than a minute.
    pub fn fetched(&self, key: &[u8], stored_ms: u64) {
        if !self.tracking.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut s = self.state(key, stored_ms);
        let now = now_ms();
        let bump = now.saturating_sub(s.bumped_ms) >= BUMP_EVERY_MS;
        if s.fetched && !bump {
            return;
        }
        s.fetched = true;
        if bump {
            s.bumped_ms = now;
        }
        self.cache.insert(key.to_vec(), s);
    }

    fn set(&self, key: &[u8], s: ItemState) {
        self.cache.insert(key.to_vec(), s);
    }
}

/// The flags of a meta command, read as memcached's `_meta_flag_preparse` reads them.
#[derive(Default)]
pub(super) struct Flags {
    pub(super) key_binary: bool,
    pub(super) vivify: Option<i64>,
    pub(super) ttl: Option<i64>,
    pub(super) recache: Option<i64>,
    pub(super) value: bool,
    pub(super) no_update: bool,
    pub(super) quiet: bool,
    pub(super) stale: bool,
    pub(super) cas: Option<u64>,
    pub(super) client_flags: u32,
    pub(super) mode: Option<u8>,
    pub(super) delta: Option<u64>,
    pub(super) initial: u64,
}

/// Reads the flags from `words[start..]`, decoding the key in place when `b` is given.
pub(super) fn preparse(words: &[&[u8]], start: usize, key: &mut Cow<'_, [u8]>) -> Result<Flags, &'static str> {
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
pub(super) fn key_flag(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(key).as_bytes());
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// The ` O…` and ` k…` flags every meta answer echoes; `Err` for an opaque that is too long.
pub(super) fn echo(out: &mut Vec<u8>, words: &[&[u8]], key: &[u8], binary: bool) -> Result<(), &'static str> {
    for w in words {
        match w[0] {
            b'O' if w.len() > MAX_OPAQUE => return Err("CLIENT_ERROR opaque token too long"),
            b'O' => {
                out.push(b' ');
                out.extend_from_slice(w);
            }
            b'k' => key_flag(out, key, binary),
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn error_line(c: &mut Conn, line: &str) {
    c.out.extend_from_slice(line.as_bytes());
    c.out.extend_from_slice(b"\r\n");
}

/// Seconds left before `expiry_ms` (memcached's `t`: -1 for none).
pub(super) fn ttl_left(expiry_ms: u64, now: u64) -> i64 {
    match expiry_ms {
        0 => -1,
        e => (e.saturating_sub(now)).div_ceil(1000) as i64,
    }
}

/// Runs the meta command `cmd` (`mg`, `ms`, `md`, `ma` or `me`) of the words `words`.
pub(super) async fn run(c: &mut Conn, store: &Store, cmd: u8, words: &[&[u8]]) -> Result<(), End> {
    let n = words.len() + 1;
    if n < 3 && cmd != b'e' {
        error_line(c, "ERROR");
        return Ok(());
    }
    match cmd {
        b'g' => mg(c, store, words).await,
        b's' => ms(c, store, words).await,
        b'd' => mdma::md(c, words).await,
        b'a' => mdma::ma(c, words).await,
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
    let mut found = match read_body_of(&app, store, &key, part).await {
        Ok(found) => found,
        Err(e) => {
            c.out.extend_from_slice(server_error(&e).as_bytes());
            return Ok(());
        }
    };
    let mut created = false;
    if found.is_none() {
        if let Some(t) = f.vivify {
            // An empty placeholder whose first asker wins the right to fill it.
            let k = key.to_vec();
            let absent = [Precondition::Absent];
            let opts = PutOptions { expiry: expiry(t), preconditions: &absent, ..Default::default() };
            let opts = PutOptions { expiry: opts.expiry, ..Default::default() };
            let made = blocking(&app, move |s| {
                let absent = [Precondition::Absent];
                s.put(&k, b"", &PutOptions { preconditions: &absent, ..opts })
            })
            .await;
            match made {
                Ok(_) => created = true,
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => {}
                Err(e) => {
                    c.out.extend_from_slice(server_error(&e).as_bytes());
                    return Ok(());
                }
            }
            found = read_body_of(&app, store, &key, part).await.unwrap_or(None);
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
    let mut new_ttl = None;
    let mut won = false;
    let mut out = Vec::with_capacity(64);
    if f.value {
        out.extend_from_slice(format!("VA {}", v.len).as_bytes());
    } else {
        out.extend_from_slice(b"HD");
    }
    for w in &words[2..] {
        match w[0] {
            b'T' => {
                let e = expiry(f.ttl.expect("parsed"));
                expiry_ms = e.at_ms(now);
                new_ttl = Some(e);
            }
            b'N' if created => {
                won = true;
            }
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
    if let Some(e) = new_ttl {
        let k = key.to_vec();
        if let Err(e) = blocking(&app, move |s| s.touch(&k, e)).await {
            tracing::warn!(error = %e, "mg could not set the new TTL");
        }
    }
    if !f.no_update {
        state.fetched = true;
        if now.saturating_sub(state.bumped_ms) >= BUMP_EVERY_MS {
            state.bumped_ms = now;
        }
    }
    items.set(&key, state);
    if f.value {
        match found {
            Read::Value(v) => c.out.value(v.data),
            Read::Pieces(r) => stream_value(c, store, r).await?,
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
            swallow(c, len + 2).await?;
            error_line(c, e);
            return Ok(());
        }
    };
    let cfg = store.config();
    let append = matches!(f.mode, Some(b'A' | b'P'));
    if len > cfg.max_value_size || (append && !concat_fits(store, len)) {
        // memcached drops the key whatever the mode (set, add, replace, append, prepend).
        drop_refused(c, &key).await;
        return answer_then_swallow(c, "SERVER_ERROR object too large for cache\r\n", len + 2).await;
    }
    let app = c.app.clone();
    let exp = f.ttl.map_or(Expiry::Never, expiry);
    // Which write this is, memcached's way: a cas turns set and replace into a cas.
    let cas_mode = f.cas.is_some() && matches!(f.mode, None | Some(b'S' | b'R'));
    let preconditions = match (f.mode, cas_mode) {
        (_, true) => vec![Precondition::StoredAt(f.cas.expect("cas mode"))],
        (Some(b'E'), _) => vec![Precondition::Absent],
        (Some(b'R'), _) => vec![Precondition::Present],
        _ => vec![],
    };
    let put = Put { key: key.to_vec(), flags: f.client_flags, expiry: exp, preconditions };
    // The store time of what this command wrote: its new cas.
    let result: larder_engine::Result<u64> = if len > cfg.chunk_size {
        match put_streamed(c, put, len).await? {
            Some(r) => r.map(|st| st.map_or(0, |st| st.version.stored_ms)),
            None => {
                error_line(c, "CLIENT_ERROR bad data chunk");
                return Ok(());
            }
        }
    } else {
        read_block(c, len as usize + 2).await?;
        let block = c.input.split_to(len as usize + 2).freeze();
        if &block[len as usize..] != b"\r\n" {
            error_line(c, "CLIENT_ERROR bad data chunk");
            return Ok(());
        }
        let data = block.slice(..len as usize);
        let (stale, mode, cas) = (f.stale, f.mode, f.cas);
        let r = match quick(&app, move |s, wait| ms_write(s, &put, &data, mode, cas, cas_mode && stale, wait)).await {
            Ok((new, Some(old))) => {
                // A stale store keeps the win token of the value it replaced.
                let was = c.listener.items.state(&key, old);
                c.listener.items.set(&key, ItemState { stored_ms: new, ..was });
                Ok(new)
            }
            r => r.map(|(new, _)| new),
        };
        r
    };
    let code: &[u8] = match &result {
        Ok(_) => b"HD",
        Err(e) if e.kind() == ErrorKind::PreconditionFailed => {
            let present = read_body_of(&app, store, &key, Part::Nothing).await.ok().flatten().is_some();
            match (cas_mode || append, present) {
                (true, true) => b"EX",
                (true, false) if cas_mode => b"NF",
                _ => b"NS",
            }
        }
        Err(e) => {
            c.out.extend_from_slice(server_error(e).as_bytes());
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
    mode: Option<u8>,
    cas: Option<u64>,
    stale_allowed: bool,
    wait: bool,
) -> larder_engine::Result<(u64, Option<u64>)> {
    let opts = PutOptions { nonblocking: !wait, ..put.options() };
    let reading = |part| ReadOptions { part, nonblocking: !wait };
    match mode {
        Some(m @ (b'A' | b'P')) => match concat_value(s, &put.key, data, m == b'A', cas, wait)? {
            Concat::Stored(cas) => Ok((cas, None)),
            Concat::Absent => Err(larder_engine::Error::new(ErrorKind::PreconditionFailed, "absent")),
            Concat::Exists => Err(larder_engine::Error::new(ErrorKind::PreconditionFailed, "cas")),
        },
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
    let Some(found) = read_body_of(&app, store, &key, Part::Nothing).await.ok().flatten() else {
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
