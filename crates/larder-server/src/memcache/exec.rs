//! The command table: each request, whichever encoding brought it (text, binary), run once
//! over the item core and answered in its encoding. The meta commands and the operator's
//! are dispatched to their own files, over the same core.
//!
//! Where the encodings mean different things by the same command, it is said here: a binary
//! write refused for its condition says whether the key has a value (`EXISTS` or
//! `NOT_FOUND`), a text one only for `cas` (else `NOT_STORED`); a text get answers `END` after
//! its keys.

use super::access;
use super::conn::{Conn, End};
use super::counters::{command_index, counters, outcome, version, Outcome};
use super::item::{self, Block, Counted, Put, Wrote};
use super::logs::{detail, Op as DetailOp};
use super::meta;
use super::operator;
use super::wire::{binary, text, Answer, Data, Reply, Request, StoreOp};
use crate::storeio::{blocking, read_body_of};
use crate::watch::Door as WatchDoor;
use larder_engine::{ErrorKind, Part, Store};

/// [`run`], timed for the operator's window, and traced while a slow-request threshold is
/// set: a slower command keeps its trace.
pub async fn run_watched(c: &mut Conn, store: &Store, req: Request<'_>, reply: Reply) -> Result<(), End> {
    let started = larder_engine::trace::Instant::now();
    let mut trace = c.app.watch.slow.start(started);
    // The key as text only for a traced command (the one that may be kept).
    let (name, key) = (req.name(), trace.is_some().then(|| crate::watch::slow::shown(req.key())));
    let r = larder_engine::trace::Traced::new(run(c, store, req, reply), &mut trace).await;
    let elapsed = started.elapsed();
    c.app.watch.memcache(elapsed);
    if c.app.watch.slow.is_slow(elapsed) {
        let (spans, dropped) = trace.as_ref().map_or((Vec::new(), 0), |t| (t.spans(), t.dropped()));
        c.app.watch.slow.keep(crate::watch::slow::SlowTrace {
            at_ms: larder_engine::now_ms(),
            door: if reply.binary() { "memcache_binary" } else { "memcache_text" },
            method: String::from_utf8_lossy(name).into_owned(),
            key: key.unwrap_or_default(),
            status: if r.is_ok() { "answered" } else { "closed" }.to_string(),
            total: elapsed,
            spans,
            dropped,
        });
    }
    if let Some(t) = trace {
        t.recycle();
    }
    r
}

/// Runs an admitted request and answers it; `Err` when the connection is to end.
pub async fn run(c: &mut Conn, store: &Store, req: Request<'_>, reply: Reply) -> Result<(), End> {
    let name = req.name();
    let a = match req {
        Request::Get { keys, cas, touch } => return get(c, store, name, keys.as_slice(), cas, touch, reply).await,
        Request::Store { op, key, flags, exptime, cas, data } => {
            detail().record(key, DetailOp::Set);
            // Boxed: only while someone watches, and its state would be moved on every set.
            let watched = c.listener.log.watched();
            if watched {
                Box::pin(before_store(c, store, key)).await;
            }
            let len = match &data {
                Data::Follows(len) => *len,
                Data::Here(b) => b.len() as u64,
            };
            let put = Put::new(op, key, flags, exptime, cas);
            let (a, sent) = store_cmd(c, store, op, key, put, data, reply).await?;
            if watched {
                after_store(c, key, &a, name, exptime, len);
            }
            if sent {
                let command = command_index(name);
                counters().count(command, outcome(command, &a));
                return Ok(());
            }
            a
        }
        Request::Delete { key, cas } => {
            detail().record(key, DetailOp::Delete);
            item::delete(c, key, cas).await.unwrap_or_else(|e| item::failed(&e))
        }
        Request::Arith { incr, key, delta, cas, create } => {
            let (k, create) = (key.to_vec(), create.map(|(n, t)| (n, item::expiry(t))));
            match blocking(&c.app, move |s| item::arith(s, &k, incr, delta, cas, create)).await {
                Ok(Counted::Number { n, cas, .. }) => Answer::Number { n, cas },
                Ok(Counted::NotFound) => Answer::NotFound,
                Ok(Counted::Exists) => Answer::Exists,
                Ok(Counted::NotNumeric) => Answer::NonNumeric,
                Err(e) => item::failed(&e),
            }
        }
        Request::Touch { key, exptime } => {
            item::touch(c, store, key, exptime).await.unwrap_or_else(|e| item::failed(&e))
        }
        Request::FlushAll { delay } => item::flush(c, delay).await.map_or_else(|e| item::failed(&e), |()| Answer::Ok),
        Request::Version => Answer::Version(version()),
        Request::Verbosity => Answer::Ok,
        Request::MetaNoop | Request::Noop => Answer::Noop,
        Request::Quit => Answer::Bye,
        // A key dump streams text lines: the text protocol's alone.
        // The operator's commands are boxed: their state is large and they are rare, and the
        // table's own state is moved for every request.
        Request::Stats(args) if !reply.binary() && args.first() == Some(&&b"cachedump"[..]) => {
            return Box::pin(operator::cachedump(c, &args)).await;
        }
        Request::Stats(args) => {
            let text = operator::stats(c, store, &args).await;
            match reply {
                Reply::Text { .. } => c.out.extend_from_slice(text.as_bytes()),
                Reply::Binary(h) => binary::stats(&mut c.out, &h, &text),
            }
            return Ok(());
        }
        Request::Operator(words) => return Box::pin(operator::run(c, &words)).await,
        Request::Meta { cmd, words } => return meta::run(c, store, cmd, &words).await,
        Request::Sasl { opcode, mechanism, data } => access::sasl(c, opcode, mechanism, data),
        Request::Unknown => Answer::Unknown,
    };
    answer(c, name, &a, reply);
    match a {
        Answer::Bye => Err(End::Closed),
        _ => Ok(()),
    }
}

/// Counts an answer to the command `name` and renders it in the request's encoding (nothing
/// for a text command sent with `noreply`).
#[inline]
pub fn answer(c: &mut Conn, name: &[u8], a: &Answer, reply: Reply) {
    let command = command_index(name);
    counters().count(command, outcome(command, a));
    match reply {
        Reply::Text { noreply: true } => {}
        Reply::Text { noreply: false } => text::render(&mut c.out, a),
        Reply::Binary(h) => binary::render(&mut c.out, &h, a),
    }
}

/// A get: each key's value (gat: given its new expiry after the read), or its miss; a text
/// get ends with `END`.
async fn get(
    c: &mut Conn,
    store: &Store,
    name: &[u8],
    keys: &[&[u8]],
    cas: bool,
    touch: Option<i64>,
    reply: Reply,
) -> Result<(), End> {
    let command = command_index(name);
    for &key in keys {
        let found = match (read_body_of(&c.app, store, key, Part::Whole, false).await, touch) {
            (Ok(found), Some(t)) => item::touch_after_read(c, key, found, t).await,
            (found, None) => found,
            (Err(e), _) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                answer(c, name, &item::failed(&e), reply);
                return Ok(());
            }
        };
        detail().record(key, DetailOp::Get { hit: found.is_some() });
        c.app.watch.read(WatchDoor::Memcache, key, found.as_ref().map(|f| f.value().len));
        c.listener.log.item_get(key, found.as_ref().map(|f| f.value().len), c.id);
        let Some(found) = found else {
            counters().count(command, Outcome::Miss);
            if let Reply::Binary(h) = reply {
                binary::miss(&mut c.out, &h, key);
            }
            continue;
        };
        counters().count(command, Outcome::Hit);
        let v = found.value();
        c.listener.items.fetched(key, v.stored_ms);
        match reply {
            Reply::Text { .. } => text::value_line(&mut c.out, key, v.flags, v.len, cas.then_some(v.stored_ms)),
            Reply::Binary(h) => binary::value_head(&mut c.out, &h, key, v.flags, v.len, v.stored_ms),
        }
        if let Some(rest) = item::send_value(c, store, found) {
            rest.await?;
        }
        if !reply.binary() {
            c.out.extend_from_slice(text::VALUE_END);
        }
        c.maybe_flush().await?;
    }
    if !reply.binary() {
        c.out.extend_from_slice(text::GET_END);
    }
    Ok(())
}

/// A storage command's write: its answer, and whether that answer was sent already (a
/// refusal sent before its data block was read past).
async fn store_cmd(
    c: &mut Conn,
    store: &Store,
    op: StoreOp,
    key: &[u8],
    put: Put,
    data: Data,
    reply: Reply,
) -> Result<(Answer, bool), End> {
    let wrote = match data {
        // A binary value, whose size was checked before its packet was read.
        Data::Here(data) => item::write(c, op, put, data).await,
        Data::Follows(len) => {
            let cfg = store.config();
            // Larger than the store takes; or than an append or prepend may make.
            let joins = matches!(op, StoreOp::Append | StoreOp::Prepend);
            if len > cfg.max_value_size || (joins && !item::concat_fits(store, len)) {
                if op == StoreOp::Set {
                    item::drop_refused(c, key).await;
                }
                // Sent at once, whatever `noreply` says, as memcached's errors are.
                text::render(&mut c.out, &Answer::TooLarge);
                c.flush_then_swallow(len + 2).await?;
                return Ok((Answer::TooLarge, true));
            }
            match item::read_data(c, store, &put, len).await? {
                None => return Ok((Answer::BadChunk, false)),
                Some(Block::Streamed(r)) => r.map(Wrote::Stored).or_else(|e| match e.kind() {
                    ErrorKind::PreconditionFailed => Ok(Wrote::Refused),
                    _ => Err(e),
                }),
                Some(Block::Data(data)) => item::write(c, op, put, data).await,
            }
        }
    };
    let a = match wrote {
        Ok(Wrote::Stored(cas)) => Answer::Stored { cas },
        Ok(Wrote::Absent) => Answer::NotStored,
        Ok(Wrote::Exists) => Answer::Exists,
        Ok(Wrote::Refused) => match (reply.binary(), op) {
            (true, StoreOp::Add) => Answer::Exists,
            (true, _) | (false, StoreOp::Cas) => item::lost_by(c, key).await.unwrap_or_else(|e| item::failed(&e)),
            (false, _) => Answer::NotStored,
        },
        Err(e) if e.kind() == ErrorKind::TooLarge => {
            if op == StoreOp::Set {
                item::drop_refused(c, key).await;
            }
            Answer::TooLarge
        }
        Err(e) => item::failed(&e),
    };
    Ok((a, false))
}

/// Before a storage command that someone watches: the lookup of the key a store makes
/// first, as memcached's does (its watchers see an `item_get` for it).
async fn before_store(c: &Conn, store: &Store, key: &[u8]) {
    let prior = read_body_of(&c.app, store, key, Part::Nothing, false).await.ok().flatten();
    c.listener.log.item_get(key, prior.map(|f| f.value().len), c.id);
}

/// After a storage command (`name`, `exptime` and `len` as the client sent them) that
/// someone watches: its `item_store` line.
fn after_store(c: &Conn, key: &[u8], a: &Answer, name: &[u8], exptime: i64, len: u64) {
    let status = match a {
        Answer::Stored { .. } => "stored",
        Answer::Exists => "exists",
        Answer::NotFound => "not_found",
        _ => "not_stored",
    };
    let ttl = item::ttl_secs(exptime);
    c.listener.log.item_store(key, status, &String::from_utf8_lossy(name), ttl, c.id, len);
}
