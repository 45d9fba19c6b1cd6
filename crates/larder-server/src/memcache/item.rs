//! memcached's item semantics, each written once, for every encoding (text, meta, binary).
//!
//! How memcached's item model maps onto the store: client flags and expiry are stored with
//! the value; the cas unique is the value's store time (stamped under the writer lock, never
//! repeated in a store, kept by `touch`); `add`, `replace` and `cas` are writes with a
//! precondition the engine checks atomically; `append`, `prepend`, `incr` and `decr` read the
//! value and write the new one on the condition that it is still the one read (and go round
//! again if not); `flush_all` is the engine's flush, saved before it is answered.

use super::conn::{Conn, End};
use super::wire::{safe_strtoull, Answer, StoreOp, REALTIME_MAXDELTA};
use crate::storeio::{blocking, quick, read_body_of, Read};
use bytes::Bytes;
use larder_engine::{
    now_ms, DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, ReadOptions, Store, Value,
};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Rounds a read-modify-write (append, incr, …) goes before it gives up on a key written
/// faster than it can read and write it.
const ROUNDS: usize = 64;

/// The error of a read-modify-write that lost [`ROUNDS`] races in a row.
fn contended() -> larder_engine::Error {
    larder_engine::Error::new(ErrorKind::Io, "the key was written by others faster than this command could complete")
}

/// memcached's expiry time (0 never; up to 30 days, seconds from now; beyond, a Unix time;
/// negative, expired at once) as the store's.
pub fn expiry(exptime: i64) -> Expiry {
    match exptime {
        0 => Expiry::Never,
        t if t < 0 => Expiry::After(Duration::ZERO),
        t if t <= REALTIME_MAXDELTA => Expiry::After(Duration::from_secs(t as u64)),
        t => Expiry::At(t as u64 * 1000),
    }
}

/// Seconds from now to an expiry time as [`expiry`] reads it (0: none, or already past).
pub fn ttl_secs(exptime: i64) -> u64 {
    match exptime {
        t if t <= 0 => 0,
        t if t <= REALTIME_MAXDELTA => t as u64,
        t => (t as u64).saturating_sub(now_ms() / 1000),
    }
}

/// An engine failure as an answer: a value the store refuses as invalid (`--verify-cas`) is
/// the client's error, anything else the server's; the message on one line, whatever it holds.
pub fn failed(e: &larder_engine::Error) -> Answer {
    let message = e.to_string().chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    Answer::Failed { client: e.kind() == ErrorKind::Invalid, message }
}

/// The write of a read-modify-write (append, incr, …) of the value `v`: on condition that it
/// is still the one read (`cond`, its store time), keeping its flags, expiry and content type.
fn keep<'a>(v: &'a Value, cond: &'a [Precondition; 1]) -> PutOptions<'a> {
    PutOptions {
        expiry: Expiry::of(v.expiry_ms),
        flags: v.flags,
        content_type: v.content_type.as_deref(),
        preconditions: cond,
        ..Default::default()
    }
}

/// What a storage command writes, owned so that it can move to the blocking pool.
#[derive(Clone)]
pub struct Put {
    pub key: Vec<u8>,
    pub flags: u32,
    pub expiry: Expiry,
    /// The version the write is conditioned on, if any (also in `preconditions`).
    pub cas: Option<u64>,
    pub preconditions: Vec<Precondition>,
}

impl Put {
    /// A storage command's write: `add` on the key's absence, `replace` on its presence, and
    /// on the version `cas` names when one does.
    pub fn new(op: StoreOp, key: &[u8], flags: u32, exptime: i64, cas: Option<u64>) -> Put {
        let mut preconditions = match op {
            StoreOp::Add => vec![Precondition::Absent],
            StoreOp::Replace => vec![Precondition::Present],
            _ => vec![],
        };
        preconditions.extend(cas.map(Precondition::StoredAt));
        Put { key: key.to_vec(), flags, expiry: expiry(exptime), cas, preconditions }
    }

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

/// What a write came to.
pub enum Wrote {
    /// Stored, under this cas unique.
    Stored(u64),
    /// A precondition did not hold ([`lost`] tells whether the key has a value).
    Refused,
    /// append, prepend: the key has no value.
    Absent,
    /// append, prepend: the key's value is not the version named.
    Exists,
}

/// Writes a storage command's data (at most a chunk): set, add, replace and cas inline when
/// the write need not wait, else on the blocking pool; append and prepend as [`concat`].
pub async fn write(c: &Conn, op: StoreOp, put: Put, data: Bytes) -> larder_engine::Result<Wrote> {
    if let StoreOp::Append | StoreOp::Prepend = op {
        return blocking(&c.app, move |s| concat(s, &put.key, &data, op == StoreOp::Append, put.cas, true)).await;
    }
    let r =
        quick(&c.app, move |s, wait| s.put(&put.key, &data, &PutOptions { nonblocking: !wait, ..put.options() })).await;
    match r {
        Ok(st) => Ok(Wrote::Stored(st.version.stored_ms)),
        Err(e) if e.kind() == ErrorKind::PreconditionFailed => Ok(Wrote::Refused),
        Err(e) => Err(e),
    }
}

/// After a write refused for its condition (a cas, a replace): `Exists` when the key has a
/// value (another version), `NotFound` when it has none.
pub fn lost(s: &Store, key: &[u8], wait: bool) -> larder_engine::Result<Answer> {
    let found = s.get(key, &ReadOptions { part: Part::Nothing, nonblocking: !wait, coded: false })?;
    Ok(if found.is_some() { Answer::Exists } else { Answer::NotFound })
}

/// [`lost`], from a connection.
pub async fn lost_by(c: &Conn, key: &[u8]) -> larder_engine::Result<Answer> {
    let k = key.to_vec();
    quick(&c.app, move |s, wait| lost(s, &k, wait)).await
}

/// Whether `append` or `prepend` may make a value of `len` bytes. Only up to a chunk, which
/// the store reads and writes whole: memcached's own items stop at 1 MiB by default, and a
/// few bytes added to a large value would rewrite all of it (20 one-byte appends to 32 MiB
/// wrote 640 MiB).
pub fn concat_fits(store: &Store, len: u64) -> bool {
    len <= store.config().chunk_size.min(store.config().max_value_size)
}

/// What a read-modify-write makes of the value it read.
enum Edit<A, M> {
    /// Answer this; nothing is written.
    Answer(A),
    /// Write these bytes in the value's place (flags, expiry and content type kept).
    Replace(Vec<u8>, M),
    /// The key has no value: make it with these bytes and this expiry.
    Create(Vec<u8>, Expiry, M),
}

/// What [`modify`] came to.
enum Modified<A, M> {
    Answer(A),
    /// The key's value is not the version named.
    Exists,
    /// Written: what the edit made, the new value's cas unique and expiry (ms, 0 none), and
    /// whether the key was made.
    Written {
        made: M,
        cas: u64,
        expiry_ms: u64,
        created: bool,
    },
}

/// The one read-modify-write of every encoding's append, prepend, incr and decr: reads
/// `key`'s value whole; if it is not the version `cas` names (when given, not 0), `Exists`;
/// else asks `edit` what to make of it (`None`: the key has no value), and writes that on
/// the condition that the key still holds what was read (to create, still nothing), going
/// round again when another write came in between.
fn modify<A, M>(
    s: &Store,
    key: &[u8],
    cas: Option<u64>,
    wait: bool,
    mut edit: impl FnMut(Option<&Value>) -> larder_engine::Result<Edit<A, M>>,
) -> larder_engine::Result<Modified<A, M>> {
    for _ in 0..ROUNDS {
        let v = s.get(key, &ReadOptions { part: Part::Whole, nonblocking: !wait, coded: false })?;
        if let Some(v) = &v {
            if cas.is_some_and(|c| c != 0 && c != v.stored_ms) {
                return Ok(Modified::Exists);
            }
        }
        let (written, made, expiry_ms, created) = match (edit(v.as_ref())?, &v) {
            (Edit::Answer(a), _) => return Ok(Modified::Answer(a)),
            (Edit::Replace(bytes, made), Some(v)) => {
                let cond = [Precondition::StoredAt(v.stored_ms)];
                (s.put(key, &bytes, &PutOptions { nonblocking: !wait, ..keep(v, &cond) }), made, v.expiry_ms, false)
            }
            (Edit::Replace(..), None) => unreachable!("an edit replaces only a value it read"),
            (Edit::Create(bytes, expiry, made), _) => {
                let absent = [Precondition::Absent];
                let opts = PutOptions { expiry, preconditions: &absent, nonblocking: !wait, ..Default::default() };
                (s.put(key, &bytes, &opts), made, expiry.at_ms(now_ms()), true)
            }
        };
        match written {
            // Answered from what was written, not read back: with a TTL already past, the
            // value is expired at once, and a read would miss it.
            Ok(st) => return Ok(Modified::Written { made, cas: st.version.stored_ms, expiry_ms, created }),
            Err(e) if e.kind() == ErrorKind::PreconditionFailed => continue,
            Err(e) => return Err(e),
        }
    }
    Err(contended())
}

/// `append` (or, not `append`, `prepend`) of `data` to `key`'s value ([`modify`]), if it is
/// the version `cas` names. A result longer than [`concat_fits`] allows is `TooLarge`
/// ("object too large for cache", memcached's words) and changes nothing.
pub fn concat(
    s: &Store,
    key: &[u8],
    data: &[u8],
    append: bool,
    cas: Option<u64>,
    wait: bool,
) -> larder_engine::Result<Wrote> {
    let too_large = || larder_engine::Error::new(ErrorKind::TooLarge, "object too large for cache");
    let r = modify(s, key, cas, wait, |v| {
        let Some(v) = v else { return Ok(Edit::Answer(Wrote::Absent)) };
        if !concat_fits(s, (v.data.len() + data.len()) as u64) {
            return Err(too_large());
        }
        Ok(Edit::Replace(if append { [&v.data[..], data].concat() } else { [data, &v.data[..]].concat() }, ()))
    });
    match r {
        Ok(Modified::Answer(a)) => Ok(a),
        Ok(Modified::Exists) => Ok(Wrote::Exists),
        Ok(Modified::Written { cas, .. }) => Ok(Wrote::Stored(cas)),
        // A value longer than a chunk, which the store does not read whole.
        Err(e) if e.kind() == ErrorKind::TooLarge => Err(too_large()),
        Err(e) => Err(e),
    }
}

/// What `incr` or `decr` came to.
pub enum Counted {
    /// The new number; the cas unique and expiry (ms, 0 none) of the value written; whether
    /// the key was made with its initial value.
    Number {
        n: u64,
        cas: u64,
        expiry_ms: u64,
        created: bool,
    },
    NotFound,
    /// The key's value is not the version named.
    Exists,
    NotNumeric,
}

/// `incr` (or, not `incr`, `decr`) of `key` by `delta` ([`modify`]), as memcached computes
/// and stores it ([`apply_delta`]), if it is the version `cas` names. A missing key is made
/// with `create`'s initial value and expiry when given (binary, meta `N`), else not found.
pub fn arith(
    s: &Store,
    key: &[u8],
    incr: bool,
    delta: u64,
    cas: Option<u64>,
    create: Option<(u64, Expiry)>,
) -> larder_engine::Result<Counted> {
    let r = modify(s, key, cas, true, |v| {
        Ok(match (v, create) {
            (None, None) => Edit::Answer(Counted::NotFound),
            (None, Some((initial, exp))) => Edit::Create(initial.to_string().into_bytes(), exp, initial),
            (Some(v), _) => match apply_delta(&v.data, incr, delta) {
                Some((n, bytes)) => Edit::Replace(bytes, n),
                None => Edit::Answer(Counted::NotNumeric),
            },
        })
    });
    match r {
        Ok(Modified::Answer(a)) => Ok(a),
        Ok(Modified::Exists) => Ok(Counted::Exists),
        Ok(Modified::Written { made, cas, expiry_ms, created }) => {
            Ok(Counted::Number { n: made, cas, expiry_ms, created })
        }
        // Longer than a chunk: no number is that long.
        Err(e) if e.kind() == ErrorKind::TooLarge => Ok(Counted::NotNumeric),
        Err(e) => Err(e),
    }
}

/// The answer to `incr`/`decr` on a stored `value`: the new number, and the bytes to store (as
/// memcached, which rewrites a number in place when it is no longer, padded with spaces to the
/// old length); `None` when the value is not a number.
fn apply_delta(value: &[u8], incr: bool, delta: u64) -> Option<(u64, Vec<u8>)> {
    if value.is_empty() {
        return None;
    }
    // memcached reads the number from the item's data, which its `\r\n` ends.
    let mut data = value.to_vec();
    data.extend_from_slice(b"\r\n");
    let n = safe_strtoull(&data)?;
    let n = if incr { n.wrapping_add(delta) } else { n.saturating_sub(delta) };
    let mut out = n.to_string().into_bytes();
    if out.len() <= value.len() {
        out.resize(value.len(), b' ');
    }
    Some((n, out))
}

/// Deletes `key` (if it is the version `cas` names, when given): `Deleted`, `NotFound`, or
/// for another version `Exists`.
pub async fn delete(c: &Conn, key: &[u8], cas: Option<u64>) -> larder_engine::Result<Answer> {
    let k = key.to_vec();
    let cond: Vec<Precondition> = cas.map(Precondition::StoredAt).into_iter().collect();
    quick(&c.app, move |s, wait| match s.delete(&k, &DeleteOptions { preconditions: &cond, nonblocking: !wait }) {
        Err(e) if e.kind() == ErrorKind::PreconditionFailed => lost(s, &k, wait),
        r => r.map(|found| if found { Answer::Deleted } else { Answer::NotFound }),
    })
    .await
}

/// Gives `key` a new expiry: `Touched` with its cas unique and flags, or `NotFound`.
pub async fn touch(c: &Conn, store: &Store, key: &[u8], exptime: i64) -> larder_engine::Result<Answer> {
    let (k, e) = (key.to_vec(), expiry(exptime));
    let Some(v) = blocking(&c.app, move |s| s.touch(&k, e)).await? else { return Ok(Answer::NotFound) };
    // The touch is done: a failure to read the flags back answers 0 for them, not an error.
    let flags =
        read_body_of(&c.app, store, key, Part::Nothing, false).await.ok().flatten().map_or(0, |r| r.value().flags);
    Ok(Answer::Touched { cas: v.stored_ms, flags })
}

/// gat, mg `T`: gives `key`, just read as `found`, the expiry `exptime` after the read (the
/// value found is answered, then expires as asked, a negative one after this answer, as in
/// memcached). A value written or deleted between the read and the touch is a miss. Boxed:
/// its state is large and a touch is rare, and the plain get that holds it stays small to move.
pub fn touch_after_read<'a>(
    c: &'a Conn,
    key: &'a [u8],
    found: Option<Read>,
    exptime: i64,
) -> Pin<Box<dyn Future<Output = larder_engine::Result<Option<Read>>> + Send + 'a>> {
    Box::pin(async move {
        let Some(f) = found else { return Ok(None) };
        let (k, e, version) = (key.to_vec(), expiry(exptime), f.value().version());
        Ok(match blocking(&c.app, move |s| s.touch(&k, e)).await? {
            Some(v) if v == version => Some(f),
            _ => None,
        })
    })
}

/// `flush_all`'s delay: ≤ 0 now; beyond 30 days a Unix time, as memcached reads it.
pub async fn flush(c: &Conn, delay: i64) -> larder_engine::Result<()> {
    let secs = if delay <= 0 { 0 } else { ttl_secs(delay) };
    blocking(&c.app, move |s| s.flush_all(Duration::from_secs(secs))).await
}

/// What is left to send of a value once [`send_value`] has put what it could in the answer.
pub type Rest<'a> = Pin<Box<dyn Future<Output = Result<(), End>> + Send + 'a>>;

/// Sends a value found: in place when in memory (the value's bytes by reference: the answers
/// go out with one vectored write); a value longer than a chunk piece by piece, in the
/// [`Rest`] to await. Not itself async: the common answer adds no state to move.
pub fn send_value<'a>(c: &'a mut Conn, store: &'a Store, found: Read) -> Option<Rest<'a>> {
    match found {
        Read::Value(v) => {
            c.out.value(v.data);
            None
        }
        Read::Pieces(r) => Some(Box::pin(stream_value(c, store, r))),
    }
}

/// A value longer than a chunk, piece by piece, each verified before it goes, within the body
/// budget (two pieces). A piece that fails closes the connection: the client never takes a
/// short or wrong value for a whole one.
async fn stream_value(c: &mut Conn, store: &Store, mut r: larder_engine::ValueReader) -> Result<(), End> {
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

/// memcached's rule for a `set` refused as too large (text, binary, and every meta set): the
/// key's old value is dropped, so that no reader takes it for the value the client believes
/// it replaced. Only after the policy admitted the write.
pub async fn drop_refused(c: &Conn, key: &[u8]) {
    let k = key.to_vec();
    let r =
        quick(&c.app, move |s, wait| s.delete(&k, &DeleteOptions { nonblocking: !wait, ..Default::default() })).await;
    if let Err(e) = r {
        tracing::error!(error = %e, "the old value of a key whose set was refused as too large could not be dropped");
    }
}

/// A data block of `len` bytes and `\r\n` (text, meta): `None` when it does not end with
/// `\r\n`, and then nothing is stored. Read whole when it fits a chunk; longer, written to
/// disk as it arrives (as an HTTP upload is), in which case the write is done here.
pub enum Block {
    Data(Bytes),
    Streamed(larder_engine::Result<u64>),
}

/// Reads a storage command's data block (see [`Block`]).
pub async fn read_data(c: &mut Conn, store: &Store, put: &Put, len: u64) -> Result<Option<Block>, End> {
    if len > store.config().chunk_size {
        // Boxed, as `stream_value`: large and rare.
        let streamed = Box::pin(put_streamed(c, put.clone(), len)).await?;
        return Ok(streamed.map(|r| Block::Streamed(r.map(|st| st.map_or(0, |st| st.version.stored_ms)))));
    }
    c.read_block(len as usize + 2).await?;
    let block = c.input.split_to(len as usize + 2).freeze();
    if &block[len as usize..] != b"\r\n" {
        return Ok(None);
    }
    Ok(Some(Block::Data(block.slice(..len as usize))))
}

/// A data block longer than a chunk, written to disk as it arrives: `Ok(None)` when it does
/// not end with `\r\n`, and then nothing is stored.
async fn put_streamed(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incr_and_decr_as_memcached_store_them() {
        assert_eq!(apply_delta(b"10", false, 1), Some((9, b"9 ".to_vec())));
        assert_eq!(apply_delta(b"99", true, 1), Some((100, b"100".to_vec())));
        assert_eq!(apply_delta(b"5", false, 9), Some((0, b"0".to_vec())));
        assert_eq!(apply_delta(b"18446744073709551615", true, 2), Some((1, b"1                   ".to_vec())));
        assert_eq!(apply_delta(b"12 34", true, 1), Some((13, b"13   ".to_vec())));
        assert_eq!(apply_delta(b"x", true, 1), None);
        assert_eq!(apply_delta(b"", true, 1), None);
    }

    #[test]
    fn expiry_times_read_as_memcached_reads_them() {
        assert_eq!(expiry(0), Expiry::Never);
        assert_eq!(expiry(-1), Expiry::After(Duration::ZERO));
        assert_eq!(expiry(REALTIME_MAXDELTA), Expiry::After(Duration::from_secs(REALTIME_MAXDELTA as u64)));
        assert_eq!(expiry(REALTIME_MAXDELTA + 1), Expiry::At((REALTIME_MAXDELTA as u64 + 1) * 1000));
        assert_eq!(ttl_secs(-5), 0);
        assert_eq!(ttl_secs(60), 60);
        // A Unix time: the seconds left (99 if a second turns between the two readings).
        assert!((99..=100).contains(&ttl_secs((now_ms() / 1000 + 100) as i64)));
    }
}
