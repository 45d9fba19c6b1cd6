//! HTTP handlers: requests become engine calls, engine outcomes become statuses, in one place.

use crate::config::Settings;
use crate::key::{decode_key, RESERVED_PREFIX};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::{ErrorKind, Store, Tier};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Shared state of the server.
pub struct App {
    /// The store, set once recovery has finished; until then requests get 503.
    pub store: OnceLock<Store>,
    /// Settings in force.
    pub settings: Settings,
}

type Resp = Response<Full<Bytes>>;

const ALLOWED: &str = "GET, HEAD, PUT, DELETE";
static X_POSITION: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-position");
static X_CACHE: hyper::header::HeaderName = hyper::header::HeaderName::from_static("x-cache");

fn text(status: StatusCode, msg: &'static str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn text_owned(status: StatusCode, msg: String) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(msg)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Whether a request reads or writes: an I/O failure on a read means the data is
/// unavailable (503, DESIGN §2), on a write that the write failed (500).
#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
}

/// The one table from engine errors to HTTP statuses.
fn engine_error(e: &larder_engine::Error, op: Op) -> Resp {
    let status = match (e.kind(), op) {
        (ErrorKind::NoSpace, _) => StatusCode::INSUFFICIENT_STORAGE,
        (ErrorKind::TooLarge, _) => StatusCode::PAYLOAD_TOO_LARGE,
        (ErrorKind::InvalidKey, _) => StatusCode::BAD_REQUEST,
        (ErrorKind::Io | ErrorKind::Corrupt, Op::Read) => StatusCode::SERVICE_UNAVAILABLE,
        (ErrorKind::Io | ErrorKind::Corrupt | ErrorKind::Locked, _) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %e, "request failed");
    }
    text_owned(status, format!("{e}\n"))
}

fn position_value(p: larder_engine::Position) -> HeaderValue {
    let mut s = String::with_capacity(32);
    use std::fmt::Write;
    let _ = write!(s, "{},{},{}", p.volume, p.offset, p.size);
    HeaderValue::try_from(s).expect("digits and commas are valid header bytes")
}

/// Handles one request, timing it for the slow-request warning and the access log.
pub async fn handle(app: Arc<App>, req: Request<Incoming>) -> Result<Resp, std::convert::Infallible> {
    let started = Instant::now();
    let method = req.method().clone();
    // A Uri clone shares its bytes (no allocation); it is kept only for the logs below.
    let uri = req.uri().clone();
    let resp = route(&app, req).await;
    let elapsed = started.elapsed();
    let s = &app.settings;
    let slow = !s.slow_request.is_zero() && elapsed >= s.slow_request;
    if s.access_log || slow {
        let (path, status) = (uri.path(), resp.status().as_u16());
        if s.access_log {
            let bytes = hyper::body::Body::size_hint(resp.body()).exact().unwrap_or(0);
            tracing::info!(target: "larder::access", %method, path, status, bytes, micros = elapsed.as_micros() as u64);
        }
        if slow {
            tracing::warn!(%method, path, status, millis = elapsed.as_millis() as u64, "slow request");
        }
    }
    Ok(resp)
}

async fn route(app: &Arc<App>, req: Request<Incoming>) -> Resp {
    let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len as u64 > app.settings.max_uri_size {
        return text(StatusCode::URI_TOO_LONG, "URI too long\n");
    }
    let key = match decode_key(req.uri().path()) {
        Ok(k) => k,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.message()),
    };
    if key.starts_with(RESERVED_PREFIX) {
        return admin(app, req.method(), &key[RESERVED_PREFIX.len()..]);
    }
    if !matches!(*req.method(), Method::GET | Method::HEAD | Method::PUT | Method::DELETE) {
        return method_not_allowed(ALLOWED);
    }
    let Some(store) = app.store.get() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering; try again shortly\n");
    };
    match *req.method() {
        Method::GET => get(app, store, key, false).await,
        Method::HEAD => get(app, store, key, true).await,
        Method::PUT => {
            let key = key.into_owned();
            put(app, req, key).await
        }
        _ => delete(app, key.into_owned()).await,
    }
}

fn method_not_allowed(allowed: &'static str) -> Resp {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut().insert(ALLOW, HeaderValue::from_static(allowed));
    r
}

/// `part / whole`, 0 when there is no whole.
fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn admin(app: &App, method: &Method, what: &[u8]) -> Resp {
    match *method {
        Method::GET | Method::HEAD => {}
        Method::PUT | Method::DELETE => return text(StatusCode::BAD_REQUEST, "keys under _larder/ are reserved\n"),
        _ => return method_not_allowed("GET, HEAD"),
    }
    match what {
        b"health" => match app.store.get() {
            Some(_) => text(StatusCode::OK, "ok\n"),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n"),
        },
        b"stats" => {
            let Some(store) = app.store.get() else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "recovering\n");
            };
            let s = store.stats();
            let body = serde_json::json!({
                "keys": s.keys,
                "bytes_used": s.bytes_used,
                "capacity_bytes": s.capacity_bytes,
                "volumes": s.volumes,
                "active_volume": s.active_volume,
                "volume_size": s.volume_size,
                "volume_count": s.volume_count,
                "puts": s.puts,
                "deletes": s.deletes,
                "hits": s.hits,
                "misses": s.misses,
                "hit_ratio": ratio(s.hits, s.hits + s.misses),
                "memory_hits": s.memory_hits,
                "memory_hit_ratio": ratio(s.memory_hits, s.hits + s.misses),
                "disk_reads": s.disk_reads,
                "coalesced_reads": s.coalesced_reads,
                "promotions": s.promotions,
                "memory_capacity": s.memory_capacity,
                "memory_bytes": s.memory_bytes,
                "memory_entries": s.memory_entries,
                "admission_tracked": s.admission_tracked,
                "reinsert_candidates": s.reinsert_candidates,
                "reinserted": s.reinserted,
                "reinserted_bytes": s.reinserted_bytes,
                "reinsert_over_budget": s.reinsert_over_budget,
                "reinsert_skipped": s.reinsert_skipped,
                "corrupt_reads": s.corrupt_reads,
                "rotations": s.rotations,
                "evicted_entries": s.evicted_entries,
                "hints_written": s.hints_written,
                "recovery": {
                    "volumes": s.recovery.volumes,
                    "discarded": s.recovery.discarded,
                    "hint_loads": s.recovery.hint_loads,
                    "scans": s.recovery.scans,
                    "records": s.recovery.records,
                    "skipped": s.recovery.skipped,
                    "truncated_bytes": s.recovery.truncated_bytes,
                    "millis": s.recovery.millis,
                },
            });
            let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        _ => text(StatusCode::NOT_FOUND, "no such admin endpoint\n"),
    }
}

/// Memory and page-cache hits are answered inline; a read that would wait for the device
/// (or for another request's read of the same key, which it then shares) runs on the
/// blocking pool, so a cold disk never stalls the async workers.
async fn get(app: &Arc<App>, store: &Store, key: std::borrow::Cow<'_, [u8]>, head: bool) -> Resp {
    let found = match store.try_get(&key) {
        Ok(Some(found)) => Ok(found),
        Ok(None) => {
            let key = key.into_owned();
            blocking(app, move |store| store.get(&key)).await
        }
        Err(e) => Err(e),
    };
    match found {
        Ok(Some(v)) => {
            let len = v.data.len();
            let mut r = Response::new(Full::new(if head { Bytes::new() } else { v.data }));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            h.insert(X_POSITION.clone(), position_value(v.position));
            let tier = match v.tier {
                Tier::Memory => "MEMC",
                Tier::Disk => "DISK",
            };
            h.insert(X_CACHE.clone(), HeaderValue::from_static(tier));
            if head {
                h.insert(CONTENT_LENGTH, HeaderValue::from(len));
            }
            r
        }
        Ok(None) => text(StatusCode::NOT_FOUND, "not found\n"),
        Err(e) => engine_error(&e, Op::Read),
    }
}

/// Why a request body was not taken.
enum BodyError {
    TooLarge,
    Broken(hyper::Error),
}

/// Reads the body, refusing as soon as it passes `limit` (nothing is buffered past it).
async fn read_body(mut body: Incoming, limit: u64, expected: u64) -> Result<Bytes, BodyError> {
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Broken)?.into_data() else { continue };
        let have = first.as_ref().map_or(0, |f| f.len()) + buf.len();
        if (have + data.len()) as u64 > limit {
            return Err(BodyError::TooLarge);
        }
        // The common case, the whole body in one frame, needs no copy.
        match first.take() {
            None if buf.is_empty() => first = Some(data),
            f => {
                if buf.is_empty() {
                    buf.reserve(expected.min(limit) as usize);
                }
                if let Some(f) = f {
                    buf.extend_from_slice(&f);
                }
                buf.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

fn too_large(limit: u64) -> Resp {
    text_owned(StatusCode::PAYLOAD_TOO_LARGE, format!("value larger than the limit of {limit} bytes\n"))
}

/// Runs a write that has to wait (for the writer lock, a ring rotation truncating a volume,
/// or a group-commit fdatasync) on the blocking pool, so that it never stalls the async
/// workers serving GETs. The common case runs inline through `try_put`/`try_delete`.
async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Store) -> larder_engine::Result<T> + Send + 'static,
) -> larder_engine::Result<T> {
    let app = app.clone();
    tokio::task::spawn_blocking(move || f(app.store.get().expect("store is ready before writes are routed")))
        .await
        .expect("store call panicked")
}

async fn put(app: &Arc<App>, req: Request<Incoming>, key: Vec<u8>) -> Resp {
    let limit = app.settings.max_value_size;
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large(limit); // refused before a byte of the body is read
    }
    let body = match read_body(req.into_body(), limit, declared.unwrap_or(0)).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return too_large(limit),
        Err(BodyError::Broken(e)) => return text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n")),
    };
    let store = app.store.get().expect("store is ready before writes are routed");
    let result = match store.try_put(&key, &body) {
        Ok(Some(pos)) => Ok(pos),
        Ok(None) => blocking(app, move |store| store.put(&key, &body)).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(pos) => {
            let mut r = text(StatusCode::OK, "stored\n");
            r.headers_mut().insert(X_POSITION.clone(), position_value(pos));
            r
        }
        Err(e) => engine_error(&e, Op::Write),
    }
}

async fn delete(app: &Arc<App>, key: Vec<u8>) -> Resp {
    let store = app.store.get().expect("store is ready before writes are routed");
    let result = match store.try_delete(&key) {
        Ok(Some(found)) => Ok(found),
        Ok(None) => blocking(app, move |store| store.delete(&key)).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(true) => text(StatusCode::OK, "deleted\n"),
        Ok(false) => text(StatusCode::NOT_FOUND, "not found\n"),
        Err(e) => engine_error(&e, Op::Write),
    }
}
