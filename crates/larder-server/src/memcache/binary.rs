//! memcached's binary protocol, for the clients that speak only it (Debian's Ruby Dalli 3.0,
//! libmemcached's tools with `--binary`). Deprecated upstream, but still what those clients
//! send. A connection is binary when its first byte is the request magic (0x80), as
//! memcached's auto-negotiation decides.
//!
//! Each request is a 24-byte header (magic, opcode, key length, extras length, data type,
//! vbucket, body length, opaque, cas; big-endian) and a body of extras, key and value. Every
//! answer echoes the opcode and opaque. Quiet variants answer only failures (and a quiet get
//! not even a miss); `noop` flushes the answers of a batch of them.

use super::exec::{
    concat_value, contended, drop_refused, expiry, keep, read_block, server_error, stream_value, swallow, Concat,
    ROUNDS,
};
use super::stats::Outcome;
use super::text::KEY_MAX;
use super::{access, counters, Conn, End};
use crate::guard::Refusal;
use crate::storeio::{blocking, quick, read_body_of, Read};
use bytes::{Buf, BufMut};
use larder_engine::{DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Store};
use std::time::Duration;

const REQUEST: u8 = 0x80;
const RESPONSE: u8 = 0x81;
const HEADER: usize = 24;

// Statuses, and memcached's text for each.
const OK: u16 = 0x00;
const NOT_FOUND: u16 = 0x01;
const EXISTS: u16 = 0x02;
const TOO_LARGE: u16 = 0x03;
const INVALID: u16 = 0x04;
const NOT_STORED: u16 = 0x05;
const NON_NUMERIC: u16 = 0x06;
const AUTH_ERROR: u16 = 0x20;
const UNKNOWN: u16 = 0x81;
const SERVER: u16 = 0x84;

fn status_text(status: u16) -> &'static [u8] {
    match status {
        NOT_FOUND => b"Not found",
        EXISTS => b"Data exists for key.",
        TOO_LARGE => b"Too large.",
        INVALID => b"Invalid arguments",
        NOT_STORED => b"Not stored.",
        NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        UNKNOWN => b"Unknown command",
        _ => b"Internal error",
    }
}

/// A request's header fields.
#[derive(Clone, Copy)]
struct Header {
    opcode: u8,
    key_len: usize,
    extras_len: usize,
    opaque: u32,
    cas: u64,
}

/// Appends an answer: header, extras, key, value.
fn answer(c: &mut Conn, h: &Header, status: u16, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
    answer_head(c, h, status, cas, extras.len(), key.len(), value.len());
    c.out.extend_from_slice(extras);
    c.out.extend_from_slice(key);
    c.out.extend_from_slice(value);
}

#[allow(clippy::too_many_arguments)]
fn answer_head(c: &mut Conn, h: &Header, status: u16, cas: u64, extras: usize, key: usize, value: usize) {
    c.status = status;
    let out = &mut c.out;
    out.put_u8(RESPONSE);
    out.put_u8(h.opcode);
    out.put_u16(key as u16);
    out.put_u8(extras as u8);
    out.put_u8(0);
    out.put_u16(status);
    out.put_u32((extras + key + value) as u32);
    out.put_u32(h.opaque);
    out.put_u64(cas);
}

fn error(c: &mut Conn, h: &Header, status: u16) {
    answer(c, h, status, 0, &[], &[], status_text(status));
}

/// A refusal of the policy: memcached's authentication error, or a server error that says
/// the server is read-only.
fn refuse(c: &mut Conn, h: &Header, r: Refusal) {
    match r {
        Refusal::Unauthenticated | Refusal::BadCredential => answer(c, h, AUTH_ERROR, 0, &[], &[], b"Auth failure."),
        Refusal::ReadOnly => answer(c, h, SERVER, 0, &[], &[], b"this server is read-only"),
    }
}

/// The text command a binary opcode is counted as, so both protocols reach the same counters.
fn command_of(opcode: u8) -> usize {
    let name: &[u8] = match opcode {
        0x00 | 0x09 | 0x0c | 0x0d => b"get",
        0x1d | 0x1e | 0x23 | 0x24 => b"gat",
        0x01 | 0x11 => b"set",
        0x02 | 0x12 => b"add",
        0x03 | 0x13 => b"replace",
        0x04 | 0x14 => b"delete",
        0x05 | 0x15 => b"incr",
        0x06 | 0x16 => b"decr",
        0x07 | 0x17 => b"quit",
        0x08 | 0x18 => b"flush_all",
        0x0a => b"noop",
        0x0b => b"version",
        0x0e | 0x19 => b"append",
        0x0f | 0x1a => b"prepend",
        0x10 => b"stats",
        0x1c => b"touch",
        0x20..=0x22 => b"auth",
        _ => b"other",
    };
    super::stats::command_index(name)
}

/// How a binary answer counts: its status read as the text protocol's outcome of the command.
fn outcome(opcode: u8, status: u16) -> Outcome {
    let name = super::stats::COMMANDS[command_of(opcode)];
    match (status, name) {
        (OK, "get" | "gat" | "incr" | "decr") => Outcome::Hit,
        (NOT_FOUND, "get" | "gat" | "incr" | "decr") => Outcome::Miss,
        (OK, "delete") => Outcome::Deleted,
        (OK, "touch") => Outcome::Touched,
        (OK, "set" | "add" | "replace" | "append" | "prepend") => Outcome::Stored,
        (OK, _) => Outcome::Ok,
        (NOT_FOUND, _) => Outcome::NotFound,
        (EXISTS, _) => Outcome::Exists,
        (NOT_STORED, _) => Outcome::NotStored,
        (TOO_LARGE | SERVER, _) => Outcome::ServerError,
        _ => Outcome::ClientError,
    }
}

/// memcached's binary expiration: unsigned, else read as the text protocol reads one
/// (0 never, up to 30 days relative, beyond a Unix time).
fn exptime(e: u32) -> Expiry {
    expiry(e as i64)
}

/// The status of an engine failure: a value the store refuses as invalid (`--verify-cas`) is
/// the client's error, anything else the server's.
fn failure(e: &larder_engine::Error) -> u16 {
    match e.kind() {
        ErrorKind::Invalid => INVALID,
        _ => SERVER,
    }
}

/// A request whose parts do not fit its command: memcached answers "Invalid arguments" and
/// closes the connection.
fn invalid(c: &mut Conn, h: &Header) -> Result<bool, End> {
    error(c, h, INVALID);
    Ok(true)
}

/// Reads and answers binary requests until the connection ends.
pub(super) async fn session(c: &mut Conn) -> Result<(), End> {
    c.binary = true;
    loop {
        while c.input.len() >= HEADER {
            let mut b = &c.input[..HEADER];
            if b.get_u8() != REQUEST {
                return Err(End::Closed); // memcached closes a connection that stops making sense
            }
            let opcode = b.get_u8();
            let key_len = b.get_u16() as usize;
            let extras_len = b.get_u8() as usize;
            let _data_type = b.get_u8();
            let _vbucket = b.get_u16();
            let body_len = b.get_u32() as usize;
            let opaque = b.get_u32();
            let cas = b.get_u64();
            let h = Header { opcode, key_len, extras_len, opaque, cas };
            let app = c.app.clone();
            // The policy first, before a byte of the body is held.
            if let Err(refusal) = access::admit_binary(c, opcode) {
                counters().count(command_of(opcode), Outcome::ClientError);
                refuse(c, &h, refusal);
                // Answered at once; the body is read past so the stream stays in step.
                c.flush().await?;
                swallow(c, (HEADER + body_len) as u64).await?;
                continue;
            }
            // Before a connection authenticates, what it may send is small (a credential): it
            // holds no room in the budget.
            if !access::may_hold(c) && body_len > access::CREDENTIAL_MAX as usize {
                counters().count(command_of(opcode), Outcome::ClientError);
                error(c, &h, INVALID);
                c.flush().await?;
                swallow(c, (HEADER + body_len) as u64).await?;
                continue;
            }
            let Some(store) = app.store.get() else {
                swallow(c, (HEADER + body_len) as u64).await?;
                error(c, &h, SERVER);
                continue;
            };
            // Larger than a chunk is for HTTP and the text protocol, which stream (as
            // docs/MEMCACHED.md says). Checked before a byte of the body is held.
            let most = store.config().chunk_size.min(store.config().max_value_size) as usize;
            let value_len = body_len.checked_sub(key_len + extras_len);
            if value_len.is_none_or(|v| v > most) || key_len > KEY_MAX {
                // A set (not add or replace) drops the key, as memcached's does: its key is
                // read (it comes before the value), the rest is read past below.
                let well_formed = extras_len == 8 && value_len.is_some() && key_len > 0 && key_len <= KEY_MAX;
                if matches!(opcode, 0x01 | 0x11) && well_formed {
                    read_block(c, HEADER + extras_len + key_len).await?;
                    let key = c.input[HEADER + extras_len..HEADER + extras_len + key_len].to_vec();
                    drop_refused(c, &key).await;
                }
                counters().count(command_of(opcode), Outcome::ClientError);
                error(c, &h, if value_len.is_none() || key_len > KEY_MAX { INVALID } else { TOO_LARGE });
                // Answered at once; the body is read past so the stream stays in step.
                c.flush().await?;
                swallow(c, (HEADER + body_len) as u64).await?;
                continue;
            }
            read_block(c, HEADER + body_len).await?;
            let packet = c.input.split_to(HEADER + body_len).freeze();
            let body = packet.slice(HEADER..);
            c.status = OK; // quiet answers write nothing when they succeed
            let quit = run(c, store, &h, &body).await?;
            counters().count(command_of(opcode), outcome(opcode, c.status));
            c.command_done();
            if quit {
                return Err(End::Closed);
            }
            c.maybe_flush().await?;
        }
        if !c.input.is_empty() {
            c.line_pending(); // a header begun
        }
        c.next_command().await?;
    }
}

/// Runs one request; `Ok(true)` when the connection is to close.
async fn run(c: &mut Conn, store: &Store, h: &Header, body: &bytes::Bytes) -> Result<bool, End> {
    let extras = &body[..h.extras_len];
    let key = &body[h.extras_len..h.extras_len + h.key_len];
    let value = body.slice(h.extras_len + h.key_len..);
    let quiet = matches!(h.opcode, 0x09 | 0x0d | 0x11..=0x1a | 0x1e | 0x24);
    let app = c.app.clone();
    if key.len() > KEY_MAX {
        error(c, h, INVALID);
        return Ok(false);
    }
    match h.opcode {
        // get, getq, getk, getkq, gat, gatq, gatk, gatkq
        0x00 | 0x09 | 0x0c | 0x0d | 0x1d | 0x1e | 0x23 | 0x24 => {
            let touch = matches!(h.opcode, 0x1d | 0x1e | 0x23 | 0x24);
            let with_key = matches!(h.opcode, 0x0c | 0x0d | 0x23 | 0x24);
            if (touch && extras.len() != 4) || (!touch && !extras.is_empty()) || key.is_empty() || !value.is_empty() {
                return invalid(c, h);
            }
            let found = match read_body_of(&app, store, key, Part::Whole).await {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %server_error(&e).trim_end(), "binary get failed");
                    error(c, h, SERVER);
                    return Ok(false);
                }
            };
            let found = match (found, touch) {
                (Some(f), true) => {
                    let (k, e) = (key.to_vec(), exptime((&extras[..]).get_u32()));
                    match blocking(&app, move |s| s.touch(&k, e)).await {
                        Ok(Some(v)) if v == f.value().version() => Some(f),
                        _ => None,
                    }
                }
                (f, _) => f,
            };
            let Some(found) = found else {
                // A miss names its key instead of saying "Not found" when the key was asked for.
                match (quiet, with_key) {
                    (true, _) => {}
                    (false, true) => answer(c, h, NOT_FOUND, 0, &[], key, &[]),
                    (false, false) => error(c, h, NOT_FOUND),
                }
                return Ok(false);
            };
            let v = found.value().clone();
            c.listener.items.fetched(key, v.stored_ms);
            let k: &[u8] = if with_key { key } else { &[] };
            answer_head(c, h, OK, v.stored_ms, 4, k.len(), v.len as usize);
            c.out.put_u32(v.flags);
            c.out.extend_from_slice(k);
            match found {
                Read::Value(v) => c.out.value(v.data),
                Read::Pieces(r) => stream_value(c, store, r).await?,
            }
        }
        // set, add, replace and their quiet forms
        0x01..=0x03 | 0x11..=0x13 => {
            if extras.len() != 8 || key.is_empty() {
                return invalid(c, h);
            }
            let mut x = extras;
            let (flags, exp) = (x.get_u32(), exptime(x.get_u32()));
            let op = h.opcode & 0x0f;
            let mut preconditions = match op {
                0x02 => vec![Precondition::Absent],
                0x03 => vec![Precondition::Present],
                _ => vec![],
            };
            if h.cas != 0 {
                preconditions.push(Precondition::StoredAt(h.cas));
            }
            let k = key.to_vec();
            let r = quick(&app, move |s, wait| {
                let opts = PutOptions {
                    expiry: exp,
                    flags,
                    preconditions: &preconditions,
                    nonblocking: !wait,
                    ..Default::default()
                };
                s.put(&k, &value, &opts)
            })
            .await;
            match r {
                Ok(stored) if !quiet => answer(c, h, OK, stored.version.stored_ms, &[], &[], &[]),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => {
                    let present = read_body_of(&app, store, key, Part::Nothing).await.ok().flatten().is_some();
                    let status = match (op, present) {
                        (0x02, _) => EXISTS,
                        (_, false) => NOT_FOUND,
                        _ => EXISTS,
                    };
                    error(c, h, status);
                }
                Err(e) if e.kind() == ErrorKind::TooLarge => {
                    if op == 0x01 {
                        drop_refused(c, key).await;
                    }
                    error(c, h, TOO_LARGE)
                }
                Err(e) => error(c, h, failure(&e)),
            }
        }
        // delete, deleteq
        0x04 | 0x14 => {
            if !extras.is_empty() || key.is_empty() || !value.is_empty() {
                return invalid(c, h);
            }
            let (k, cas) = (key.to_vec(), h.cas);
            let cond: Vec<Precondition> = if cas != 0 { vec![Precondition::StoredAt(cas)] } else { vec![] };
            let r = quick(&app, move |s, wait| {
                match s.delete(&k, &DeleteOptions { preconditions: &cond, nonblocking: !wait }) {
                    Err(e) if e.kind() == ErrorKind::PreconditionFailed => {
                        let present = s.get(&k, &ReadOptions { part: Part::Nothing, nonblocking: !wait })?.is_some();
                        Ok(if present { EXISTS } else { NOT_FOUND })
                    }
                    r => r.map(|found| if found { OK } else { NOT_FOUND }),
                }
            })
            .await;
            match r {
                Ok(OK) if quiet => {}
                Ok(OK) => answer(c, h, OK, 0, &[], &[], &[]),
                Ok(status) => error(c, h, status),
                Err(e) => error(c, h, failure(&e)),
            }
        }
        // increment, decrement and their quiet forms
        0x05 | 0x06 | 0x15 | 0x16 => {
            if extras.len() != 20 || key.is_empty() || !value.is_empty() {
                return invalid(c, h);
            }
            let mut x = extras;
            let (delta, initial, exp) = (x.get_u64(), x.get_u64(), x.get_u32());
            let incr = h.opcode & 0x0f == 0x05;
            let (k, cas) = (key.to_vec(), h.cas);
            let r = blocking(&app, move |s| {
                for _ in 0..ROUNDS {
                    let v = match s.get(&k, &ReadOptions::default()) {
                        Ok(v) => v,
                        // Longer than a chunk: no number is that long.
                        Err(e) if e.kind() == ErrorKind::TooLarge => return Ok(Err(NON_NUMERIC)),
                        Err(e) => return Err(e),
                    };
                    let Some(v) = v else {
                        // Missing: created with the initial value, unless the expiration says not to.
                        if exp == u32::MAX {
                            return Ok(Err(NOT_FOUND));
                        }
                        let absent = [Precondition::Absent];
                        let opts = PutOptions { expiry: exptime(exp), preconditions: &absent, ..Default::default() };
                        match s.put(&k, initial.to_string().as_bytes(), &opts) {
                            Ok(st) => return Ok(Ok((initial, st.version.stored_ms))),
                            Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
                            Err(e) => return Err(e),
                        }
                    };
                    if cas != 0 && cas != v.stored_ms {
                        return Ok(Err(EXISTS));
                    }
                    let Some((n, bytes)) = super::text::apply_delta(&v.data, incr, delta) else {
                        return Ok(Err(NON_NUMERIC));
                    };
                    let cond = [Precondition::StoredAt(v.stored_ms)];
                    let opts = keep(&v, &cond);
                    match s.put(&k, &bytes, &opts) {
                        Ok(st) => return Ok(Ok((n, st.version.stored_ms))),
                        Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(contended())
            })
            .await;
            match r {
                Ok(Ok(_)) if quiet => {}
                Ok(Ok((n, cas))) => answer(c, h, OK, cas, &[], &[], &n.to_be_bytes()),
                Ok(Err(status)) => error(c, h, status),
                Err(e) => error(c, h, failure(&e)),
            }
        }
        // quit, quitq
        0x07 | 0x17 => {
            if h.opcode == 0x07 {
                answer(c, h, OK, 0, &[], &[], &[]);
            }
            return Ok(true);
        }
        // flush, flushq
        0x08 | 0x18 => {
            if !(extras.is_empty() || extras.len() == 4) || !key.is_empty() || !value.is_empty() {
                return invalid(c, h);
            }
            // As the text protocol's: beyond 30 days, a Unix time.
            let delay = match if extras.len() == 4 { (&extras[..]).get_u32() as u64 } else { 0 } {
                d if d as i64 <= super::text::REALTIME_MAXDELTA => d,
                d => d.saturating_sub(larder_engine::now_ms() / 1000),
            };
            match blocking(&app, move |s| s.flush_all(Duration::from_secs(delay))).await {
                Ok(()) if quiet => {}
                Ok(()) => answer(c, h, OK, 0, &[], &[], &[]),
                Err(e) => error(c, h, failure(&e)),
            }
        }
        // SASL: the mechanisms, and PLAIN's one step (access.rs)
        0x20..=0x22 => match access::sasl(c, h.opcode, key, &value) {
            Ok(said) => answer(c, h, OK, 0, &[], &[], said),
            Err(()) => answer(c, h, AUTH_ERROR, 0, &[], &[], b"Auth failure."),
        },
        0x0a => answer(c, h, OK, 0, &[], &[], &[]),
        0x0b => answer(c, h, OK, 0, &[], &[], super::exec::version().as_bytes()),
        // append, prepend and their quiet forms
        0x0e | 0x0f | 0x19 | 0x1a => {
            if !extras.is_empty() || key.is_empty() {
                return invalid(c, h);
            }
            let append = matches!(h.opcode, 0x0e | 0x19);
            let (k, cas) = (key.to_vec(), h.cas);
            let r = blocking(&app, move |s| {
                Ok(match concat_value(s, &k, &value, append, Some(cas), true)? {
                    Concat::Stored(cas) => Ok(cas),
                    Concat::Absent => Err(NOT_STORED),
                    Concat::Exists => Err(EXISTS),
                })
            })
            .await;
            match r {
                Ok(Ok(_)) if quiet => {}
                Ok(Ok(cas)) => answer(c, h, OK, cas, &[], &[], &[]),
                Ok(Err(status)) => error(c, h, status),
                Err(e) if e.kind() == ErrorKind::TooLarge => error(c, h, TOO_LARGE),
                Err(e) => error(c, h, failure(&e)),
            }
        }
        // stat: one packet per statistic, then an empty one
        0x10 => {
            let group: Vec<&[u8]> = if key.is_empty() { vec![] } else { vec![key] };
            let text = super::stats::stats(c, store, &group).await;
            for line in text.split("\r\n") {
                let Some(rest) = line.strip_prefix("STAT ") else { continue };
                let (name, val) = rest.split_once(' ').unwrap_or((rest, ""));
                answer(c, h, OK, 0, &[], name.as_bytes(), val.as_bytes());
            }
            answer(c, h, OK, 0, &[], &[], &[]);
        }
        // touch
        0x1c => {
            if extras.len() != 4 || key.is_empty() || !value.is_empty() {
                return invalid(c, h);
            }
            let (k, e) = (key.to_vec(), exptime((&extras[..]).get_u32()));
            match blocking(&app, move |s| s.touch(&k, e)).await {
                // As memcached, the item's flags come back (but not its value).
                Ok(Some(v)) => {
                    let flags = read_body_of(&app, store, key, Part::Nothing).await.ok().flatten();
                    let flags = flags.map_or(0, |r| r.value().flags);
                    answer(c, h, OK, v.stored_ms, &flags.to_be_bytes(), &[], &[])
                }
                Ok(None) => error(c, h, NOT_FOUND),
                Err(e) => error(c, h, failure(&e)),
            }
        }
        _ => error(c, h, UNKNOWN),
    }
    Ok(false)
}
