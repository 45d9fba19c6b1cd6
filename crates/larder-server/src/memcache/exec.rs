//! Each memcached command against the store, with the answers memcached gives.
//!
//! How memcached's item model maps onto the store: client flags and expiry are stored with
//! the value; the cas unique is the value's store time (stamped under the writer lock, never
//! repeated in a store, kept by `touch`); `add`, `replace` and `cas` are writes with a
//! precondition the engine checks atomically; `append`, `prepend`, `incr` and `decr` read the
//! value and write the new one on the condition that it is still the one read (and go round
//! again if not); `flush_all` is the engine's flush, saved before it is answered.

use super::logs::{detail, Op as DetailOp};
use super::stats::{command_index, stats, Outcome};
use super::text::{self, Command, Parsed, StoreOp, LINE_MAX, REALTIME_MAXDELTA};
use super::{access, counters, Conn, End};
use crate::guard::Refusal;
use crate::storeio::{blocking, quick, read_body_of, Read};
use bytes::Bytes;
use larder_engine::{
    now_ms, DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Store, Value,
};
use std::time::Duration;

/// Rounds a read-modify-write (append, incr, …) goes before it gives up on a key written
/// faster than it can read and write it.
pub(super) const ROUNDS: usize = 64;

/// The error of a read-modify-write that lost [`ROUNDS`] races in a row.
pub(super) fn contended() -> larder_engine::Error {
    larder_engine::Error::new(ErrorKind::Io, "the key was written by others faster than this command could complete")
}

/// Whether `append` or `prepend` may make a value of `len` bytes: the one rule of every
/// encoding (text, meta `ms … MA`/`MP`, binary). Only up to a chunk, which the store reads
/// and writes whole: memcached's own items stop at 1 MiB by default, and a few bytes added to
/// a large value would rewrite all of it (20 one-byte appends to 32 MiB wrote 640 MiB).
pub(super) fn concat_fits(store: &Store, len: u64) -> bool {
    len <= store.config().chunk_size.min(store.config().max_value_size)
}

/// What [`concat_value`] did.
pub(super) enum Concat {
    /// Stored, under this cas unique.
    Stored(u64),
    /// The key has no value.
    Absent,
    /// The key's value is not the version named.
    Exists,
}

/// `append` (or, not `append`, `prepend`) of `data` to `key`'s value, for every encoding: on
/// the value read, if it is the version `cas` names (when given, not 0), written on the
/// condition that it is still that value (flags, expiry and content type kept), round again
/// when another write came in between. A result longer than [`concat_fits`] allows is
/// `TooLarge` ("object too large for cache", memcached's words) and changes nothing.
pub(super) fn concat_value(
    s: &Store,
    key: &[u8],
    data: &[u8],
    append: bool,
    cas: Option<u64>,
    wait: bool,
) -> larder_engine::Result<Concat> {
    let too_large = || larder_engine::Error::new(ErrorKind::TooLarge, "object too large for cache");
    for _ in 0..ROUNDS {
        let v = match s.get(key, &ReadOptions { part: Part::Whole, nonblocking: !wait }) {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(Concat::Absent),
            // A value longer than a chunk, which the store does not read whole.
            Err(e) if e.kind() == ErrorKind::TooLarge => return Err(too_large()),
            Err(e) => return Err(e),
        };
        if cas.is_some_and(|c| c != 0 && c != v.stored_ms) {
            return Ok(Concat::Exists);
        }
        if !concat_fits(s, (v.data.len() + data.len()) as u64) {
            return Err(too_large());
        }
        let joined = if append { [&v.data[..], data].concat() } else { [data, &v.data[..]].concat() };
        let cond = [Precondition::StoredAt(v.stored_ms)];
        match s.put(key, &joined, &PutOptions { nonblocking: !wait, ..keep(&v, &cond) }) {
            Ok(st) => return Ok(Concat::Stored(st.version.stored_ms)),
            Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
            Err(e) => return Err(e),
        }
    }
    Err(contended())
}

/// The write of a read-modify-write (append, incr, …) of the value `v`: on condition that it
/// is still the one read (`cond`, its store time), keeping its flags, expiry and content type.
pub(super) fn keep<'a>(v: &'a Value, cond: &'a [Precondition; 1]) -> PutOptions<'a> {
    PutOptions {
        expiry: Expiry::of(v.expiry_ms),
        flags: v.flags,
        content_type: v.content_type.as_deref(),
        preconditions: cond,
        ..Default::default()
    }
}

/// memcached's expiry time (0 never; up to 30 days, seconds from now; beyond, a Unix time;
/// negative, expired at once) as the store's.
pub(super) fn expiry(exptime: i64) -> Expiry {
    match exptime {
        0 => Expiry::Never,
        t if t < 0 => Expiry::After(Duration::ZERO),
        t if t <= REALTIME_MAXDELTA => Expiry::After(Duration::from_secs(t as u64)),
        t => Expiry::At(t as u64 * 1000),
    }
}

/// An engine failure as memcached's `SERVER_ERROR` line (one line, whatever the message); a
/// value the store refuses as invalid (`--verify-cas`) is the client's error.
pub(super) fn server_error(e: &larder_engine::Error) -> String {
    let msg: String = e.to_string().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match e.kind() {
        ErrorKind::Invalid => format!("CLIENT_ERROR {msg}\r\n"),
        _ => format!("SERVER_ERROR {msg}\r\n"),
    }
}

/// Whether a line too long to end in the buffer may go on: only a get's list of keys does,
/// as in memcached, up to a bound of larder's own.
fn long_get(input: &[u8]) -> bool {
    let start = input.iter().take(101).position(|&b| b != b' ');
    let Some(s) = start else { return false };
    (input[s..].starts_with(b"get ") || input[s..].starts_with(b"gets ")) && input.len() <= 2 << 20
}

/// Reads and runs commands until the connection ends.
pub(super) async fn session(c: &mut Conn) -> Result<(), End> {
    let mut first = true;
    // How much of a long line was already searched for its end.
    let mut scanned = 0;
    loop {
        loop {
            if first && !c.input.is_empty() {
                first = false;
                if c.input[0] == 0x80 {
                    // The binary protocol's request magic: this connection speaks it.
                    return super::binary::session(c).await;
                }
            }
            let Some(nl) = c.input[scanned..].iter().position(|&b| b == b'\n').map(|i| i + scanned) else {
                // A long line of keys is for authenticated connections only.
                if c.input.len() > LINE_MAX && !(long_get(&c.input) && access::may_hold(c)) {
                    return Err(End::Closed); // memcached closes a connection for a line this long
                }
                scanned = c.input.len();
                if !c.input.is_empty() {
                    c.line_pending();
                }
                break;
            };
            scanned = 0;
            c.unit_done();
            let line = c.input.split_to(nl + 1).freeze();
            let text = line[..nl].strip_suffix(b"\r").unwrap_or(&line[..nl]);
            match text::parse(text) {
                Parsed::Command(cmd) => {
                    run(c, cmd).await?;
                    c.command_done();
                }
                Parsed::Error { line, noreply } => {
                    let name = text.split(|&b| b == b' ').find(|w| !w.is_empty()).unwrap_or(b"");
                    let outcome =
                        if line.starts_with("CLIENT_ERROR") { Outcome::ClientError } else { Outcome::ServerError };
                    counters().count(command_index(name), outcome);
                    if !noreply {
                        c.out.extend_from_slice(line.as_bytes());
                        c.out.extend_from_slice(b"\r\n");
                    }
                }
                Parsed::Close => return Err(End::Closed),
            }
            c.maybe_flush().await?;
        }
        c.next_command().await?;
    }
}

async fn run(c: &mut Conn, cmd: Command<'_>) -> Result<(), End> {
    let app = c.app.clone();
    let m = counters();
    if let Err(refusal) = access::admit_text(c, &cmd) {
        if access::is_login(c, &cmd, refusal) {
            let Command::Store { len, .. } = cmd else { unreachable!("a login is a set") };
            return access::login(c, len).await;
        }
        let name = cmd.name();
        let outcome = if refusal == Refusal::ReadOnly { Outcome::ServerError } else { Outcome::ClientError };
        m.count(command_index(name), outcome);
        let line = access::refusal_line(refusal);
        match data_block(&cmd) {
            Some(len) => answer_then_swallow(c, line, len + 2).await?,
            None => c.out.extend_from_slice(line.as_bytes()),
        }
        return Ok(());
    }
    let Some(store) = app.store.get() else {
        // Still recovering: a data block is read past, then the answer is an error.
        if let Some(len) = data_block(&cmd) {
            swallow(c, len + 2).await?;
        }
        c.out.extend_from_slice(b"SERVER_ERROR recovering the store; try again shortly\r\n");
        return Ok(());
    };
    match cmd {
        Command::Get { keys, cas, touch } => get(c, store, &keys, cas, touch).await,
        Command::Store { op, key, flags, exptime, len, cas, noreply } => {
            let name = cmd.name();
            detail().record(key, DetailOp::Set);
            let watched = super::logs::before_store(c, store, key).await;
            let r = store_cmd(c, store, op, key, flags, exptime, len as u64, cas).await?;
            if watched {
                super::logs::after_store(c, key, answer_outcome(&r), name, exptime, len);
            }
            reply(c, command_index(name), r, noreply);
            Ok(())
        }
        Command::Delete { key, noreply } => {
            detail().record(key, DetailOp::Delete);
            let k = key.to_vec();
            let r =
                quick(&c.app, move |s, wait| s.delete(&k, &DeleteOptions { nonblocking: !wait, ..Default::default() }))
                    .await;
            let r = match r {
                Ok(true) => Answer::Line(Outcome::Deleted, "DELETED\r\n"),
                Ok(false) => Answer::Line(Outcome::NotFound, "NOT_FOUND\r\n"),
                Err(e) => failed(&e),
            };
            reply(c, command_index(b"delete"), r, noreply);
            Ok(())
        }
        Command::Arith { incr, key, delta, noreply } => {
            let r = arith(c, key, incr, delta).await;
            reply(c, command_index(if incr { b"incr" } else { b"decr" }), r, noreply);
            Ok(())
        }
        Command::Touch { key, exptime, noreply } => {
            let k = key.to_vec();
            let r = match blocking(&c.app, move |s| s.touch(&k, expiry(exptime))).await {
                Ok(Some(_)) => Answer::Line(Outcome::Touched, "TOUCHED\r\n"),
                Ok(None) => Answer::Line(Outcome::NotFound, "NOT_FOUND\r\n"),
                Err(e) => failed(&e),
            };
            reply(c, command_index(b"touch"), r, noreply);
            Ok(())
        }
        Command::FlushAll { delay, noreply } => {
            // A delay beyond 30 days is a Unix time, as memcached reads it.
            let secs = match delay {
                d if d <= 0 => 0,
                d if d <= REALTIME_MAXDELTA => d as u64,
                d => (d as u64).saturating_sub(now_ms() / 1000),
            };
            let r = match blocking(&c.app, move |s| s.flush_all(Duration::from_secs(secs))).await {
                Ok(()) => Answer::Line(Outcome::Ok, "OK\r\n"),
                Err(e) => failed(&e),
            };
            reply(c, command_index(b"flush_all"), r, noreply);
            Ok(())
        }
        Command::Version => {
            m.count(command_index(b"version"), Outcome::Ok);
            c.out.extend_from_slice(format!("VERSION {}\r\n", version()).as_bytes());
            Ok(())
        }
        Command::Verbosity { noreply } => {
            reply(c, command_index(b"verbosity"), Answer::Line(Outcome::Ok, "OK\r\n"), noreply);
            Ok(())
        }
        Command::Stats(args) if args.first() == Some(&&b"cachedump"[..]) => super::operator::cachedump(c, &args).await,
        Command::Operator(words) => super::operator::run(c, &words).await,
        Command::Stats(args) => {
            let out = stats(c, store, &args).await;
            c.out.extend_from_slice(out.as_bytes());
            Ok(())
        }
        Command::Quit => {
            m.count(command_index(b"quit"), Outcome::Ok);
            Err(End::Closed)
        }
        Command::Meta { cmd, words } => super::meta::run(c, store, cmd, &words).await,
        Command::MetaNoop => {
            m.count(command_index(b"mn"), Outcome::Ok);
            c.out.extend_from_slice(b"MN\r\n");
            Ok(())
        }
    }
}

/// The length of the data block that follows a command's line, if one does.
fn data_block(cmd: &Command<'_>) -> Option<u64> {
    let len = match cmd {
        Command::Store { len, .. } => Some(*len),
        Command::Meta { cmd: b's', words } => words.get(2).and_then(|w| super::text::safe_strtol(w)),
        _ => None,
    };
    len.filter(|&l| l >= 0).map(|l| l as u64)
}

/// The version larder answers `version` and `stats` with: the memcached protocol level it
/// answers as first, as memcached's own number (libmemcached's tools read a major.minor.micro
/// there and refuse a major of 0), then larder's own.
pub(super) fn version() -> String {
    format!("{MEMCACHED_LEVEL}-larder-{}", env!("CARGO_PKG_VERSION"))
}

/// The memcached release whose answers larder's are compared with (tests/memcache_diff.rs).
const MEMCACHED_LEVEL: &str = "1.6.18";

/// An answer line and how it counts.
enum Answer {
    Line(Outcome, &'static str),
    Owned(Outcome, String),
    /// Already sent (a refusal answered before its data block was read past).
    Sent(Outcome),
}

/// An engine failure as an answer, counted as the client's error or the server's.
fn failed(e: &larder_engine::Error) -> Answer {
    let outcome = match e.kind() {
        ErrorKind::Invalid => Outcome::ClientError,
        _ => Outcome::ServerError,
    };
    Answer::Owned(outcome, server_error(e))
}

fn answer_outcome(a: &Answer) -> Outcome {
    match a {
        Answer::Line(o, _) | Answer::Owned(o, _) | Answer::Sent(o) => *o,
    }
}

fn reply(c: &mut Conn, command: usize, a: Answer, noreply: bool) {
    let (outcome, line) = match &a {
        Answer::Line(o, l) => (*o, l.as_bytes()),
        Answer::Owned(o, l) => (*o, l.as_bytes()),
        Answer::Sent(o) => (*o, &b""[..]),
    };
    counters().count(command, outcome);
    if !noreply {
        c.out.extend_from_slice(line);
    }
}

/// Sends a refusal at once, then reads past the `n` bytes of its data block: the client
/// learns at once (memcached answers only once it has read them), and the stream stays in
/// step. The error goes out whatever `noreply` says, as memcached's errors do.
pub(super) async fn answer_then_swallow(c: &mut Conn, line: &str, n: u64) -> Result<(), End> {
    c.out.extend_from_slice(line.as_bytes());
    c.flush().await?;
    swallow(c, n).await
}

/// Reads past `n` bytes of a data block that will not be stored (at the minimum rate too).
pub(super) async fn swallow(c: &mut Conn, mut n: u64) -> Result<(), End> {
    c.block_begins(0);
    loop {
        let take = (c.input.len() as u64).min(n) as usize;
        let _ = c.input.split_to(take);
        n -= take as u64;
        if n == 0 {
            c.unit_done();
            return Ok(());
        }
        c.fill().await?;
    }
}

/// Reads a data block of `n` bytes into the input buffer, at the minimum rate.
pub(super) async fn read_block(c: &mut Conn, n: usize) -> Result<(), End> {
    c.block_begins(n as u64);
    c.want(n).await?;
    c.unit_done();
    Ok(())
}

/// `get`, `gets`, `gat`, `gats`: a `VALUE` line and the data of each key found, then `END`.
async fn get(c: &mut Conn, store: &Store, keys: &[&[u8]], cas: bool, touch: Option<i64>) -> Result<(), End> {
    let command = command_index(match (cas, touch.is_some()) {
        (false, false) => b"get",
        (true, false) => b"gets",
        (false, true) => b"gat",
        (true, true) => b"gats",
    });
    for &key in keys {
        let found = match read_body_of(&c.app, store, key, Part::Whole).await {
            Ok(f) => f,
            Err(e) => {
                counters().count(command, Outcome::ServerError);
                c.out.extend_from_slice(server_error(&e).as_bytes());
                return Ok(());
            }
        };
        // gat answers the value it found, then gives it the new expiry (a negative one
        // expires it after this answer, as in memcached).
        let found = match (found, touch) {
            (Some(f), Some(t)) => {
                let k = key.to_vec();
                match blocking(&c.app, move |s| s.touch(&k, expiry(t))).await {
                    Ok(Some(v)) if v == f.value().version() => Some(f),
                    Ok(_) => None, // written or deleted in between: a miss
                    Err(e) => {
                        counters().count(command, Outcome::ServerError);
                        c.out.extend_from_slice(server_error(&e).as_bytes());
                        return Ok(());
                    }
                }
            }
            (found, _) => found,
        };
        detail().record(key, DetailOp::Get { hit: found.is_some() });
        c.listener.log.item_get(key, found.as_ref().map(|f| f.value().len), c.id);
        let Some(found) = found else {
            counters().count(command, Outcome::Miss);
            continue;
        };
        counters().count(command, Outcome::Hit);
        c.listener.items.fetched(key, found.value().stored_ms);
        value_line(&mut c.out, key, found.value(), cas);
        match found {
            Read::Value(v) => c.out.value(v.data),
            Read::Pieces(r) => stream_value(c, store, r).await?,
        }
        c.out.extend_from_slice(b"\r\n");
        c.maybe_flush().await?;
    }
    c.out.extend_from_slice(b"END\r\n");
    Ok(())
}

fn value_line(out: &mut bytes::BytesMut, key: &[u8], v: &Value, cas: bool) {
    // itoa rather than `write!`: this line is built for every value a get answers.
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.extend_from_slice(b" ");
    out.extend_from_slice(n.format(v.flags).as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(n.format(v.len).as_bytes());
    if cas {
        out.extend_from_slice(b" ");
        out.extend_from_slice(n.format(v.stored_ms).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// Sends a value longer than a chunk piece by piece, each verified before it goes, within
/// the body budget (two pieces). A piece that fails closes the connection: the client never
/// takes a short or wrong value for a whole one.
pub(super) async fn stream_value(c: &mut Conn, store: &Store, mut r: larder_engine::ValueReader) -> Result<(), End> {
    let len = r.value().len;
    let room = c.app.body_budget.reserve_exact(len.min(2 * store.config().chunk_size)).await;
    loop {
        let Ok((back, piece)) = tokio::task::spawn_blocking(move || {
            let p = r.next_piece();
            (r, p)
        })
        .await
        else {
            return Err(End::Closed);
        };
        r = back;
        match piece {
            Ok(Some(p)) => c.send(p).await?,
            Ok(None) => break,
            Err(e) => {
                tracing::error!(error = %e, "a large value failed while it was sent over memcached; the connection is closed");
                return Err(End::Closed);
            }
        }
    }
    drop(room);
    Ok(())
}

/// A storage command: its data block is read (streamed to disk when longer than a chunk),
/// checked for its `\r\n`, and stored as `op` says.
#[allow(clippy::too_many_arguments)]
async fn store_cmd(
    c: &mut Conn,
    store: &Store,
    op: StoreOp,
    key: &[u8],
    flags: u32,
    exptime: i64,
    len: u64,
    cas: u64,
) -> Result<Answer, End> {
    let cfg = store.config();
    let streamed = len > cfg.chunk_size;
    // Larger than the store takes; or than an append or prepend may make (`concat_fits`).
    let joins = matches!(op, StoreOp::Append | StoreOp::Prepend);
    if len > cfg.max_value_size || (joins && !concat_fits(store, len)) {
        if op == StoreOp::Set {
            drop_refused(c, key).await;
        }
        answer_then_swallow(c, "SERVER_ERROR object too large for cache\r\n", len + 2).await?;
        return Ok(Answer::Sent(Outcome::ServerError));
    }
    let preconditions = match op {
        StoreOp::Add => vec![Precondition::Absent],
        StoreOp::Replace => vec![Precondition::Present],
        StoreOp::Cas => vec![Precondition::StoredAt(cas)],
        _ => vec![],
    };
    let put = Put { key: key.to_vec(), flags, expiry: expiry(exptime), preconditions };
    let stored = if streamed {
        match put_streamed(c, put, len).await? {
            Some(r) => r.map(|_| ()),
            None => return Ok(Answer::Line(Outcome::ClientError, "CLIENT_ERROR bad data chunk\r\n")),
        }
    } else {
        read_block(c, len as usize + 2).await?;
        let block = c.input.split_to(len as usize + 2).freeze();
        if &block[len as usize..] != b"\r\n" {
            return Ok(Answer::Line(Outcome::ClientError, "CLIENT_ERROR bad data chunk\r\n"));
        }
        let data = block.slice(..len as usize);
        let r = match op {
            StoreOp::Append | StoreOp::Prepend => concat(c, put, data, op == StoreOp::Append).await,
            _ => put_value(c, put, data).await,
        };
        r
    };
    Ok(match stored {
        Ok(()) => Answer::Line(Outcome::Stored, "STORED\r\n"),
        Err(e) if e.kind() == ErrorKind::PreconditionFailed => match op {
            StoreOp::Cas => {
                // EXISTS when the key has a value (another version), NOT_FOUND when none.
                match read_body_of(&c.app, store, key, Part::Nothing).await {
                    Ok(Some(_)) => Answer::Line(Outcome::Exists, "EXISTS\r\n"),
                    Ok(None) => Answer::Line(Outcome::NotFound, "NOT_FOUND\r\n"),
                    Err(e) => failed(&e),
                }
            }
            _ => Answer::Line(Outcome::NotStored, "NOT_STORED\r\n"),
        },
        Err(e) if e.kind() == ErrorKind::TooLarge => {
            if op == StoreOp::Set {
                drop_refused(c, key).await;
            }
            Answer::Line(Outcome::ServerError, "SERVER_ERROR object too large for cache\r\n")
        }
        Err(e) => failed(&e),
    })
}

/// memcached's rule for a `set` refused as too large (text, binary, and every meta set): the
/// key's old value is dropped, so that no reader takes it for the value the client believes
/// it replaced. Only after the policy admitted the write.
pub(super) async fn drop_refused(c: &Conn, key: &[u8]) {
    let k = key.to_vec();
    let r =
        quick(&c.app, move |s, wait| s.delete(&k, &DeleteOptions { nonblocking: !wait, ..Default::default() })).await;
    if let Err(e) = r {
        tracing::error!(error = %e, "the old value of a key whose set was refused as too large could not be dropped");
    }
}

/// What a storage command writes, owned so that it can move to the blocking pool.
pub(super) struct Put {
    pub key: Vec<u8>,
    pub flags: u32,
    pub expiry: Expiry,
    pub preconditions: Vec<Precondition>,
}

impl Put {
    pub fn options(&self) -> PutOptions<'_> {
        PutOptions {
            expiry: self.expiry,
            flags: self.flags,
            stale: false,
            content_type: None,
            attrs: None,
            preconditions: &self.preconditions,
            nonblocking: false,
        }
    }
}

/// Stores `data` (at most a chunk): inline when the write need not wait, else on the
/// blocking pool.
async fn put_value(c: &Conn, put: Put, data: Bytes) -> larder_engine::Result<()> {
    quick(&c.app, move |s, wait| {
        s.put(&put.key, &data, &PutOptions { nonblocking: !wait, ..put.options() }).map(|_| ())
    })
    .await
}

/// A data block longer than a chunk, written to disk as it arrives (as an HTTP upload is):
/// `Ok(None)` when it does not end with `\r\n`, and then nothing is stored.
pub(super) async fn put_streamed(
    c: &mut Conn,
    put: Put,
    len: u64,
) -> Result<Option<larder_engine::Result<Option<larder_engine::Stored>>>, End> {
    let app = c.app.clone();
    let chunk = app.store.get().expect("ready").config().chunk_size;
    let _turn = app.uploads.acquire().await.expect("the uploads' semaphore is never closed");
    // The pieces on their way to the writer and the chunk it gathers, charged as they arrive
    // (the input buffer they pass through is charged by the connection).
    let mut room = app.body_budget.body();
    c.block_begins(0);
    // An empty piece ends the value: it may be stored.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    let app2 = app.clone();
    let writing = tokio::task::spawn_blocking(move || {
        let store = app2.store.get().expect("ready");
        let mut w = store.writer(&put.key, &put.options())?;
        while let Some(piece) = rx.blocking_recv() {
            if piece.is_empty() {
                return w.finish().map(Some);
            }
            w.write(&piece)?;
        }
        Ok(None) // cut short: nothing is stored
    });
    let mut left = len;
    let mut writer_gone = false;
    while left > 0 {
        if c.input.is_empty() {
            if let Err(end) = c.fill().await {
                drop(tx);
                let _ = writing.await;
                return Err(end);
            }
        }
        let take = (c.input.len() as u64).min(left) as usize;
        let piece = c.input.split_to(take).freeze();
        left -= take as u64;
        let have = (len - left).min(2 * chunk);
        if !room.try_arrived(have, have) {
            room.grow_to(len.min(2 * chunk)).await;
        }
        // A writer that failed reads no more: the rest of the block is read past.
        if !writer_gone && tx.send(piece).await.is_err() {
            writer_gone = true;
        }
    }
    let ended = match c.want(2).await.inspect(|_| c.unit_done()) {
        Ok(()) => &c.input.split_to(2)[..] == b"\r\n",
        Err(end) => {
            drop(tx);
            let _ = writing.await;
            return Err(end);
        }
    };
    if ended {
        let _ = tx.send(Bytes::new()).await;
    }
    drop(tx);
    let written = writing.await.expect("store call panicked");
    Ok(match (ended, written) {
        (false, Ok(_)) => None,
        (_, r) => Some(r),
    })
}

/// `append` and `prepend` (see [`concat_value`]).
async fn concat(c: &Conn, put: Put, data: Bytes, append: bool) -> larder_engine::Result<()> {
    blocking(&c.app, move |s| match concat_value(s, &put.key, &data, append, None, true)? {
        Concat::Stored(_) => Ok(()),
        Concat::Absent | Concat::Exists => {
            Err(larder_engine::Error::new(ErrorKind::PreconditionFailed, "the key has no value"))
        }
    })
    .await
}

/// `incr` and `decr`, as memcached computes and stores them.
async fn arith(c: &Conn, key: &[u8], incr: bool, delta: u64) -> Answer {
    enum Done {
        Number(u64),
        NotFound,
        NotNumeric,
    }
    let k = key.to_vec();
    let r = blocking(&c.app, move |s| {
        for _ in 0..ROUNDS {
            let v = match s.get(&k, &ReadOptions::default()) {
                Ok(Some(v)) => v,
                Ok(None) => return Ok(Done::NotFound),
                // Longer than a chunk: no number is that long.
                Err(e) if e.kind() == ErrorKind::TooLarge => return Ok(Done::NotNumeric),
                Err(e) => return Err(e),
            };
            let Some((n, bytes)) = text::apply_delta(&v.data, incr, delta) else { return Ok(Done::NotNumeric) };
            let cond = [Precondition::StoredAt(v.stored_ms)];
            let opts = keep(&v, &cond);
            match s.put(&k, &bytes, &opts) {
                Ok(_) => return Ok(Done::Number(n)),
                Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
                Err(e) => return Err(e),
            }
        }
        Err(contended())
    })
    .await;
    match r {
        Ok(Done::Number(n)) => Answer::Owned(Outcome::Hit, format!("{n}\r\n")),
        Ok(Done::NotFound) => Answer::Line(Outcome::Miss, "NOT_FOUND\r\n"),
        Ok(Done::NotNumeric) => {
            Answer::Line(Outcome::ClientError, "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")
        }
        Err(e) => failed(&e),
    }
}
