//! The key API: GET, HEAD, PUT, PATCH (a touch) and DELETE of `/<key>`, with their headers
//! and the reading of a PUT's body.

use crate::app::{App, Held, Holding};
use crate::body::{charge, next_frame, read_body, too_slow, BodyError};
use crate::config::Settings;
use crate::guard::budget::Charge;
use crate::guard::BodyClock;
use crate::headers::{self, Coding};
use crate::reply::{engine_error, text, text_owned, Body, Op, Resp};
use crate::storeio::{blocking, body_of, quick, read, read_body_of, Read};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderValue, ACCEPT_ENCODING, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH,
    CONTENT_RANGE, CONTENT_TYPE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, TRANSFER_ENCODING, VARY,
};
use hyper::{Response, StatusCode};
use larder_engine::{
    now_ms, Codec, DeleteOptions, ErrorKind, Expiry, Part, Precondition, PutOptions, Store, Tier, Value,
    MAX_CONTENT_TYPE,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

static X_POSITION: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-position");
static X_CACHE: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-cache");

fn position_value(p: larder_engine::Position) -> HeaderValue {
    let mut l = headers::Line::new();
    l.dec(p.volume as u64, 1).push(b",").dec(p.offset, 1).push(b",").dec(p.size, 1);
    l.value()
}

/// The headers every answer about a stored value carries (200, 206, 304, HEAD), for the
/// representation it carries.
fn describe(r: &mut Resp, v: &Value, coding: Coding) {
    let h = r.headers_mut();
    let content_type = v.content_type.as_ref().and_then(|t| HeaderValue::from_maybe_shared(t.clone()).ok());
    h.insert(CONTENT_TYPE, content_type.unwrap_or(HeaderValue::from_static(DEFAULT_CONTENT_TYPE)));
    h.insert(ETAG, headers::etag_of(v.version(), coding));
    h.insert(LAST_MODIFIED, headers::last_modified(v));
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(CACHE_CONTROL, headers::cache_control(v, now_ms()));
    h.insert(X_POSITION.clone(), position_value(v.position));
    let tier = match v.tier {
        Tier::Memory => "MEMC",
        Tier::Disk => "DISK",
    };
    h.insert(X_CACHE.clone(), HeaderValue::from_static(tier));
    // A value stored as a Zstandard frame is answered in one of two representations,
    // chosen by Accept-Encoding: a cache in front must keep them apart.
    if sendable(v) {
        h.insert(VARY, HeaderValue::from_static("accept-encoding"));
    }
    if coding == Coding::Zstd {
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("zstd"));
    }
}

/// Whether `v` is stored as a Zstandard frame (no dictionary), which a client that accepts
/// `zstd` is sent as it is.
fn sendable(v: &Value) -> bool {
    v.coded.as_ref().is_some_and(|c| c.codec == Codec::Zstd && c.dictionary == 0)
}

const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

fn with_status(status: StatusCode, body: Bytes) -> Resp {
    with_body(status, Body::full(body))
}

fn with_body(status: StatusCode, body: Body) -> Resp {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    // Room for describe()'s headers and hyper's own without growing the map.
    *r.headers_mut() = HeaderMap::with_capacity(12);
    r
}

/// GET and HEAD, with preconditions (412), validators (304), a single byte range (206/416)
/// and `If-Range`.
///
/// A plain or ranged GET is one read: of the whole value, or of just the blocks that hold the
/// range. A HEAD or a revalidation first reads only what describes the value (for a large
/// value, the front of its record), so that a 304 never reads the body.
pub async fn get(app: &Arc<App>, store: &Store, key: &[u8], req: &HeaderMap, head: bool, held: Option<&Held>) -> Resp {
    let found = |r: larder_engine::Result<Option<Value>>| match r {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(Box::new(text(StatusCode::NOT_FOUND, "not found\n"))),
        Err(e) => Err(Box::new(engine_error(&e, Op::Read))),
    };
    let failed = || text(StatusCode::PRECONDITION_FAILED, "precondition failed\n");
    // A client that takes zstd gets a value stored as a Zstandard frame as it is: no decoding.
    // A ranged request is answered from the value itself, whatever it accepts.
    let range = headers::range(req);
    let takes_zstd = headers::accepts_zstd(req) && range.is_none();
    let revalidation = req.contains_key(IF_NONE_MATCH) || req.contains_key(IF_MODIFIED_SINCE);
    if head || revalidation {
        let d = match found(read(app, store, key, Part::Nothing, false).await) {
            Ok(d) => d,
            Err(r) => return *r,
        };
        let coding = if takes_zstd && sendable(&d) { Coding::Zstd } else { Coding::Identity };
        if headers::read_precondition_failed(req, &d, coding) {
            return failed();
        }
        if headers::not_modified(req, &d, coding) {
            let mut r = with_status(StatusCode::NOT_MODIFIED, Bytes::new());
            describe(&mut r, &d, coding);
            r.headers_mut().remove(CONTENT_TYPE);
            r.headers_mut().remove(CONTENT_ENCODING);
            return r;
        }
        if head && coding == Coding::Identity {
            let mut r = with_status(StatusCode::OK, Bytes::new());
            describe(&mut r, &d, coding);
            r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(d.len));
            return r;
        }
        if head {
            // The coded length is that of the bytes stored: read them (a coded value is at
            // most a chunk, and not decoded).
            let v = match found(read(app, store, key, Part::Whole, true).await) {
                Ok(v) => v,
                Err(r) => return *r,
            };
            let coding = if sendable(&v) { Coding::Zstd } else { Coding::Identity };
            let len = match (&v.coded, coding) {
                (Some(c), Coding::Zstd) => c.data.len() as u64,
                _ => v.len,
            };
            let mut r = with_status(StatusCode::OK, Bytes::new());
            describe(&mut r, &v, coding);
            r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
            return r;
        }
    }
    // Ranges are of the value itself (the identity representation), never of coded bytes.
    let mut part = range.map_or(Part::Whole, Part::Range);
    let body_found = |r: larder_engine::Result<Option<Read>>| match r {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(Box::new(text(StatusCode::NOT_FOUND, "not found\n"))),
        Err(e) => Err(Box::new(engine_error(&e, Op::Read))),
    };
    let coded = takes_zstd && part == Part::Whole;
    let mut read = match body_found(read_body_of(app, store, key, part, coded).await) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    // If-Range names the version a client already holds parts of: for any other, the whole
    // value. Checked on what was read, so a write between two reads cannot mix versions.
    if part != Part::Whole && !headers::if_range_holds(req, read.value()) {
        part = Part::Whole;
        read = match body_found(read_body_of(app, store, key, part, false).await) {
            Ok(v) => v,
            Err(r) => return *r,
        };
    }
    let coding = if coded && sendable(read.value()) { Coding::Zstd } else { Coding::Identity };
    // Checked on the bytes about to be sent, whichever read they came from.
    if headers::read_precondition_failed(req, read.value(), coding) {
        return failed();
    }
    let v = read.value().clone();
    if coding == Coding::Zstd {
        let bytes = v.coded.as_ref().map(|c| c.data.clone()).unwrap_or_default();
        let mut r = with_status(StatusCode::OK, bytes);
        describe(&mut r, &v, coding);
        return r;
    }
    let Part::Range(range) = part else {
        let mut r = with_body(StatusCode::OK, body_of(app, held, read, v.len).await);
        describe(&mut r, &v, coding);
        return r;
    };
    let Some((start, end)) = range.resolve(v.len) else {
        let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable\n");
        let unsatisfied = HeaderValue::try_from(format!("bytes */{}", v.len)).expect("ASCII");
        r.headers_mut().insert(CONTENT_RANGE, unsatisfied);
        return r;
    };
    let mut r = with_body(StatusCode::PARTIAL_CONTENT, body_of(app, held, read, end - start).await);
    describe(&mut r, &v, coding);
    let content_range = format!("bytes {}-{}/{}", start, end - 1, v.len);
    r.headers_mut().insert(CONTENT_RANGE, HeaderValue::try_from(content_range).expect("ASCII"));
    r
}

/// The slices of a body's frames, for [`Store::put_parts`].
fn parts(body: &[Bytes]) -> Vec<&[u8]> {
    body.iter().map(|p| &p[..]).collect()
}

fn too_large(limit: u64) -> Resp {
    text_owned(StatusCode::PAYLOAD_TOO_LARGE, format!("value larger than the limit of {limit} bytes\n"))
}

/// What a PUT asks for besides its body, read from its headers before the body.
struct PutHeaders {
    /// `X-TTL: keep` is `Expiry::Keep`: the value keeps the expiry of the one it replaces, as
    /// it stands when the write takes the writer lock.
    expiry: Expiry,
    content_type: Option<Bytes>,
    preconditions: Vec<Precondition>,
}

impl PutHeaders {
    /// The headers, or the one-line message of a 400.
    fn parse(h: &HeaderMap, settings: &Settings) -> Result<PutHeaders, String> {
        let keep = h.get(&headers::X_TTL).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"keep"));
        let expiry = match keep {
            true => Expiry::Keep { otherwise: (!settings.default_ttl.is_zero()).then_some(settings.default_ttl) },
            false => headers::ttl(h, settings.default_ttl)?.map_or(Expiry::Never, Expiry::After),
        };
        let content_type = match h.get(CONTENT_TYPE) {
            Some(t) if t.len() > MAX_CONTENT_TYPE => {
                return Err(format!("Content-Type longer than {} bytes\n", MAX_CONTENT_TYPE));
            }
            // The default is what GET answers for a value stored without a type (or an empty one).
            Some(t) if !t.is_empty() && t.as_bytes() != DEFAULT_CONTENT_TYPE.as_bytes() => {
                Some(Bytes::copy_from_slice(t.as_bytes()))
            }
            _ => None,
        };
        Ok(PutHeaders { expiry, content_type, preconditions: headers::write_preconditions(h) })
    }

    fn options(&self) -> PutOptions<'_> {
        PutOptions {
            expiry: self.expiry,
            flags: 0,
            stale: false,
            content_type: self.content_type.as_deref(),
            attrs: None,
            preconditions: &self.preconditions,
            nonblocking: false,
        }
    }
}

/// A request's body as its connection hands it over: hyper's, to be read as it arrives; or
/// whole, read with the head by the server's own connection (within `h1::MAX_WITH_BODY`, and never
/// longer than a chunk).
pub enum ReqBody {
    Hyper(Incoming),
    Whole(Bytes),
}

/// PUT: its headers and preconditions checked, then room in the body budget, then the body,
/// then the write.
pub async fn put(app: &Arc<App>, headers: &HeaderMap, body: ReqBody, key: Vec<u8>, held: Option<Held>) -> Resp {
    let extra = match PutHeaders::parse(headers, &app.settings) {
        Ok(p) => p,
        Err(m) => return text_owned(StatusCode::BAD_REQUEST, m),
    };
    // A body coded with zstd is stored as sent (and must be one record: at most a chunk); any
    // other coding is refused before the body is read (RFC 9110 §15.5.16).
    let coded = match headers::content_coding(headers) {
        Ok(c) => c,
        Err(name) => {
            let mut r = text_owned(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding {name} is not taken: send the value as it is, or coded with zstd\n"),
            );
            r.headers_mut().insert(ACCEPT_ENCODING, HeaderValue::from_static("zstd"));
            return r;
        }
    };
    // A write that is bound to fail its precondition is refused before its body is read
    // (with `Expect: 100-continue` the client does not even send it). The engine checks
    // again, atomically with the write.
    if !extra.preconditions.is_empty() {
        let store = app.store.get().expect("store is ready before writes are routed");
        let current = match read(app, store, &key, Part::Nothing, false).await {
            Ok(v) => v,
            Err(e) => return engine_error(&e, Op::Read),
        };
        if let Some(why) = larder_engine::unmet(&extra.preconditions, current.as_ref().map(|v| v.version())) {
            return text_owned(StatusCode::PRECONDITION_FAILED, format!("precondition failed: {why}\n"));
        }
    }
    // The store's own limit: it lowers a setting above a quarter of its ring. A coded value
    // is one record: its coded bytes (and the value, which the store checks) at most a chunk.
    let config = app.store.get().expect("store is ready before writes are routed").config();
    let limit = if coded { config.chunk_size.min(config.max_value_size) } else { config.max_value_size };
    let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large(limit); // refused before a byte of the body is read
    }
    // A body longer than a chunk (or of unknown length that may be) goes to disk chunk by
    // chunk as it arrives, holding room for two chunks of it, not the whole.
    let chunk = app.store.get().expect("store is ready before writes are routed").config().chunk_size;
    let streamed = declared.is_none_or(|n| n > chunk) && limit > chunk && !coded;
    // A streamed upload takes its turn among them first (each holds a blocking thread).
    let turn = match streamed {
        true => {
            let _holding = Holding::new(held.as_ref());
            Some(app.uploads.acquire().await.expect("the uploads' semaphore is never closed"))
        }
        false => None,
    };
    // Room in the budget is taken as the body arrives, never for a length merely declared:
    // a client that trickles holds what it sent.
    let mut room = app.body_budget.body();
    let incoming = match body {
        ReqBody::Hyper(b) => b,
        // Taken whole only when it is no longer than a chunk (`conn::native`): never streamed.
        ReqBody::Whole(b) => {
            let len = b.len() as u64;
            charge(&mut room, len, len, held.as_ref()).await;
            let parts = if b.is_empty() { vec![] } else { vec![b] };
            return write(app, key, parts, len, extra, room, coded).await;
        }
    };
    if streamed {
        let result = put_streamed(app, incoming, key, extra, limit, &mut room, held.as_ref()).await;
        drop((room, turn));
        return result.unwrap_or_else(|r| *r);
    }
    let expected = declared.unwrap_or(limit);
    let (body, len) = match read_body(app, incoming, limit, expected, &mut room, held.as_ref()).await {
        Ok(b) => {
            let len = b.iter().map(|p| p.len() as u64).sum::<u64>();
            (b, len)
        }
        Err(BodyError::TooLarge) => return too_large(limit),
        Err(BodyError::TooSlow) => return too_slow(),
        Err(BodyError::Broken(e)) => return text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n")),
    };
    write(app, key, body, len, extra, room, coded).await
}

/// Stores a body read whole (its room in the budget held until it is written); `coded`, a
/// body coded with zstd, as it was sent.
async fn write(
    app: &Arc<App>,
    key: Vec<u8>,
    body: Vec<Bytes>,
    len: u64,
    extra: PutHeaders,
    room: Charge,
    coded: bool,
) -> Resp {
    app.metrics.bytes_in.fetch_add(len, Ordering::Relaxed);
    let body = match (coded, &body[..]) {
        (true, [_, _, ..]) => vec![Bytes::from(body.concat())],
        _ => body,
    };
    let result = quick(app, move |store, wait| {
        let opts = PutOptions { nonblocking: !wait, ..extra.options() };
        match coded {
            true => store.put_coded(&key, Codec::Zstd, body.first().map_or(&[][..], |b| &b[..]), &opts),
            false => store.put_parts(&key, &parts(&body), &opts),
        }
    })
    .await;
    // The body is written (or its write failed) and about to be freed: its room goes back.
    drop(room);
    match result {
        Ok(stored) => {
            let mut r = text(StatusCode::OK, "stored\n");
            r.headers_mut().insert(X_POSITION.clone(), position_value(stored.position));
            r.headers_mut().insert(ETAG, headers::etag(stored.version));
            r
        }
        Err(e) => engine_error(&e, Op::Write),
    }
}

/// A step of a streamed upload, from the connection to the writer.
enum Piece {
    Data(Bytes),
    /// The body is complete: the value may be stored.
    End,
}

/// Streams a body into the store: the connection hands its frames to a writer on the blocking
/// pool (a few frames may wait in between); the value is stored only once the body is
/// complete, so a client that goes away (or sends too much) leaves the key as it was.
async fn put_streamed(
    app: &Arc<App>,
    mut body: Incoming,
    key: Vec<u8>,
    extra: PutHeaders,
    limit: u64,
    room: &mut Charge,
    held: Option<&Held>,
) -> Result<Resp, Box<Resp>> {
    // Frames are at most hyper's read buffer (about 400 KiB): with the writer's one pending
    // chunk, an upload holds about two chunks.
    let chunk = app.store.get().expect("store is ready before writes are routed").config().chunk_size;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Piece>(2);
    // Spawned now, not when awaited: it must take frames while they are sent.
    let app2 = app.clone();
    let writing = tokio::task::spawn_blocking(move || {
        let store = app2.store.get().expect("store is ready before writes are routed");
        let mut w = store.writer(&key, &extra.options())?;
        while let Some(piece) = rx.blocking_recv() {
            match piece {
                Piece::Data(d) => w.write(&d)?,
                Piece::End => return w.finish().map(Some),
            }
        }
        Ok(None) // the upload stopped short: nothing is stored
    });
    let mut received = 0u64;
    let mut clock = BodyClock::new();
    let sent: Result<(), Resp> = loop {
        let frame = match next_frame(app, &mut body, &mut clock).await {
            Ok(f) => f,
            Err(_) => break Err(too_slow()),
        };
        match frame {
            None => {
                let _ = tx.send(Piece::End).await;
                break Ok(());
            }
            Some(Err(e)) => break Err(text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n"))),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else { continue };
                received += data.len() as u64;
                if received > limit {
                    break Err(too_large(limit));
                }
                // What is on its way to the writer and the chunk it gathers: two chunks at most.
                charge(room, received.min(2 * chunk), 2 * chunk, held).await;
                app.metrics.bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
                if tx.send(Piece::Data(data)).await.is_err() {
                    break Ok(()); // the writer failed: its error is the answer
                }
            }
        }
    };
    drop(tx);
    let written = writing.await.expect("store call panicked");
    sent.map_err(Box::new)?;
    match written {
        Ok(Some(stored)) => {
            let mut r = text(StatusCode::OK, "stored\n");
            r.headers_mut().insert(X_POSITION.clone(), position_value(stored.position));
            r.headers_mut().insert(ETAG, headers::etag(stored.version));
            Ok(r)
        }
        Ok(None) => Err(Box::new(text(StatusCode::BAD_REQUEST, "request body ended short\n"))),
        Err(e) => Err(Box::new(engine_error(&e, Op::Write))),
    }
}

/// DELETE, with its preconditions (read from the headers by the caller).
pub async fn delete(app: &Arc<App>, key: Vec<u8>, preconditions: Vec<Precondition>) -> Resp {
    let store = app.store.get().expect("store is ready before writes are routed");
    // A delete with preconditions goes to the blocking pool at once: it reads the record.
    let quick = if preconditions.is_empty() {
        store.delete(&key, &DeleteOptions { nonblocking: true, ..DeleteOptions::default() })
    } else {
        Err(larder_engine::Error::new(ErrorKind::WouldBlock, "a conditional delete reads"))
    };
    let result = match quick {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            blocking(app, move |store| {
                store.delete(&key, &DeleteOptions { preconditions: &preconditions, nonblocking: false })
            })
            .await
        }
        done => done,
    };
    match result {
        Ok(true) => text(StatusCode::OK, "deleted\n"),
        Ok(false) => text(StatusCode::NOT_FOUND, "not found\n"),
        Err(e) => engine_error(&e, Op::Write),
    }
}

/// PATCH with `X-TTL` and no body (a touch): the stored value gets a new expiry, counted from
/// now (`X-TTL: 0` = none); its bytes, type and version (`ETag`) stay, whichever tier holds it.
pub async fn touch(app: &Arc<App>, h: &HeaderMap, key: Vec<u8>) -> Resp {
    if h.get(CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0") || h.contains_key(TRANSFER_ENCODING) {
        return text(StatusCode::BAD_REQUEST, "PATCH takes no body: it changes only the expiry, given in X-TTL\n");
    }
    if !h.contains_key(&headers::X_TTL) {
        return text(StatusCode::BAD_REQUEST, "PATCH needs X-TTL: the new time to live in seconds (0 = none)\n");
    }
    if !headers::write_preconditions(h).is_empty() {
        // Not silently ignored: a touch keeps the version, so a condition on it says nothing
        // about what the touch would change.
        return text(StatusCode::BAD_REQUEST, "a touch (PATCH) takes no preconditions\n");
    }
    let ttl = match headers::ttl(h, std::time::Duration::ZERO) {
        Ok(t) => t,
        Err(m) => return text_owned(StatusCode::BAD_REQUEST, m),
    };
    let expiry = ttl.map_or(Expiry::Never, Expiry::After);
    match blocking(app, move |store| store.touch(&key, expiry)).await {
        Ok(Some(version)) => {
            let mut r = text(StatusCode::OK, "touched\n");
            r.headers_mut().insert(ETAG, headers::etag(version));
            r
        }
        Ok(None) => text(StatusCode::NOT_FOUND, "not found\n"),
        Err(e) => engine_error(&e, Op::Write),
    }
}
