//! Read-through mode (`--origin`): the HTTP listener is a shared HTTP cache in front of one
//! origin, following RFC 9111 (docs/HTTP-CACHING.md says how, rule by rule).
//!
//! - GET and HEAD are answered from the store when a stored response may be used
//!   ([`policy::usable`]), else fetched through a [`flight::Flight`] (one origin request per
//!   cache key), stored while it streams to its clients.
//! - Other methods go to the origin as they are ([`pass`]); a success invalidates the URI's
//!   stored response (and those of `Location` and `Content-Location` on the same host).
//! - A stored response is the value (its body) and the record's attributes ([`stored`]). A
//!   response that varies is stored under a key of its own, found through a marker at the URI's
//!   key that names the `Vary` fields; replacing the marker orphans its variants.

pub mod flight;
pub mod origin;
pub mod policy;
pub mod stored;

use crate::api::{self, Read};
use crate::app::App;
use crate::reply::{text, text_owned, Body, Resp};
use bytes::Bytes;
use flight::{Flights, Head, Member, Outcome};
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AGE, AUTHORIZATION, CONTENT_LENGTH, CONTENT_LOCATION, CONTENT_RANGE, ETAG,
    HOST, IF_MATCH, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, LAST_MODIFIED, LOCATION, RANGE,
    VARY, VIA,
};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::{now_ms, Expiry, Part, PutOptions, Store, Touch, MAX_KEY_LEN};
use origin::{Origin, OriginError};
use policy::{Directives, Times, Use};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stored::{Kind, Stored};

static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// How long a URI whose response could not be stored is passed straight through, without its
/// requests waiting on one another (Varnish's hit-for-pass).
const PASS_FOR_MS: u64 = 30_000;
/// How long a stored response that has validators is kept after it goes stale, for
/// revalidation, unless the ring evicts it first.
const KEEP_FOR_REVALIDATION_SECS: u64 = 7 * 86_400;

/// Counters of the read-through mode, rendered at `/_larder/metrics`.
#[derive(Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub revalidated: AtomicU64,
    pub revalidated_changed: AtomicU64,
    pub stale: AtomicU64,
    pub passes: AtomicU64,
    pub coalesced: AtomicU64,
    pub stored: AtomicU64,
    pub not_stored: AtomicU64,
    pub origin_errors: AtomicU64,
    pub invalidations: AtomicU64,
    pub purges: AtomicU64,
}

/// The read-through mode's state.
pub struct Proxy {
    pub origin: Origin,
    flights: Flights,
    /// Cache keys passed through until a time (ms), after a response that could not be stored.
    pass_until: quick_cache::sync::Cache<Vec<u8>, u64>,
    pub counters: Counters,
    /// `--stale-if-error`: how long past freshness a response may be served when the origin fails.
    stale_if_error: u64,
    /// How long a request waits on another's fetch of the same key before fetching itself.
    lock_timeout: Duration,
    origin_latency: metrics::Histogram,
}

impl Proxy {
    /// The proxy for the settings' origin.
    pub fn new(s: &crate::config::Settings) -> Result<Option<Proxy>, String> {
        let Some(url) = &s.origin else { return Ok(None) };
        Ok(Some(Proxy {
            origin: Origin::new(url, s.origin_connect_timeout, s.origin_read_timeout)?,
            flights: Flights::default(),
            pass_until: quick_cache::sync::Cache::new(100_000),
            counters: Counters::default(),
            stale_if_error: s.stale_if_error.as_secs(),
            lock_timeout: s.cache_lock_timeout,
            origin_latency: metrics::histogram!("larder_origin_duration_seconds"),
        }))
    }

    fn passing(&self, key: &[u8], now: u64) -> bool {
        self.pass_until.get(key).is_some_and(|until| until > now)
    }
}

/// The effective request URI (RFC 9110 §7.1) without the scheme: host (lower-cased) and target;
/// `None` when `Host` is not one valid authority (a `/` in it would make two URIs one key).
fn effective_uri(req: &Request<Incoming>, origin: &Origin) -> Option<Vec<u8>> {
    // More than one Host is a bad request (RFC 9112 §3.2).
    if req.headers().get_all(HOST).iter().nth(1).is_some() {
        return None;
    }
    let host = req.headers().get(HOST).map(|h| h.as_bytes()).unwrap_or(origin.authority.as_bytes());
    let valid = hyper::http::uri::Authority::try_from(host).is_ok_and(|a| a.as_str().len() == host.len())
        && !host.iter().any(|&b| b == b'@' || b == b'/');
    if !valid {
        return None;
    }
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut uri = host.to_ascii_lowercase();
    uri.extend_from_slice(target.as_bytes());
    Some(uri)
}

/// Keys of stored responses start with a byte no HTTP or memcached key of larder's own can.
const KEY_PREFIX: &[u8] = b"\x00r ";

/// The store key of a URI: the URI itself when it fits, else its 128-bit hash (the stored URI
/// is compared on every read, so a collision is a miss, never another URI's response).
fn cache_key(uri: &[u8]) -> Vec<u8> {
    let mut k = KEY_PREFIX.to_vec();
    if KEY_PREFIX.len() + uri.len() <= MAX_KEY_LEN {
        k.extend_from_slice(uri);
    } else {
        k.extend_from_slice(format!("#{:032x}", xxhash_rust::xxh3::xxh3_128(uri)).as_bytes());
    }
    k
}

/// The key of one variant of a URI whose responses vary: the URI, the marker's store time (so a
/// new marker orphans the old variants) and the selecting values.
fn variant_key(uri: &[u8], marker_ms: u64, selecting: &[(HeaderName, Option<HeaderValue>)]) -> Vec<u8> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(uri);
    h.update(&marker_ms.to_le_bytes());
    for (name, value) in selecting {
        h.update(name.as_str().as_bytes());
        match value {
            Some(v) => {
                h.update(b"=");
                h.update(v.as_bytes());
            }
            None => h.update(b"!"),
        }
        h.update(b"\n");
    }
    let mut k = b"\x00v ".to_vec();
    k.extend_from_slice(format!("{:032x}", h.digest128()).as_bytes());
    k
}

/// The field names of a response's `Vary`, lower-cased, in order.
fn vary_names(h: &HeaderMap) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = Vec::new();
    for v in h.get_all(VARY).iter().filter_map(|v| v.to_str().ok()) {
        for n in v.split(',').map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if let Ok(n) = HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    names
}

/// A request's values of `names`, normalised (field lines joined, spaces around commas dropped)
/// so that equivalent requests select the same variant (RFC 9111 §4.1).
fn selecting(req: &HeaderMap, names: &[HeaderName]) -> Vec<(HeaderName, Option<HeaderValue>)> {
    names
        .iter()
        .map(|n| {
            let parts: Vec<String> = req
                .get_all(n)
                .iter()
                .map(|v| {
                    String::from_utf8_lossy(v.as_bytes()).split(',').map(|p| p.trim()).collect::<Vec<_>>().join(",")
                })
                .collect();
            let value = (!parts.is_empty()).then(|| HeaderValue::from_str(&parts.join(",")).ok()).flatten();
            (n.clone(), value)
        })
        .collect()
}

/// A stored response found for a request.
struct Entry {
    key: Vec<u8>,
    stored: Stored,
    read: Read,
}

impl Entry {
    fn value(&self) -> &larder_engine::Value {
        self.read.value()
    }
}

/// Looks up the stored response for `uri` that `req` may select; `None` is a miss.
async fn lookup(app: &Arc<App>, store: &Store, uri: &[u8], key: &[u8], req: &HeaderMap, part: Part) -> Option<Entry> {
    let mut key = key.to_vec();
    for _ in 0..2 {
        let read = match api::read_body_of(app, store, &key, part).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "a stored response could not be read; fetching it again");
                return None;
            }
        };
        let stored = Stored::decode(read.value().attrs.as_deref()?)?;
        if stored.uri != uri {
            return None; // another URI's hash, or a record of another use
        }
        match stored.kind {
            Kind::Response => {
                let names: Vec<HeaderName> = stored.selecting.iter().map(|(n, _)| n.clone()).collect();
                if selecting(req, &names) != stored.selecting {
                    return None;
                }
                return Some(Entry { key, stored, read });
            }
            Kind::VaryMarker => {
                key = variant_key(uri, read.value().stored_ms, &selecting(req, &vary_names(&stored.headers)));
            }
        }
    }
    None
}

/// Handles a request in read-through mode.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Resp {
    let p = app.proxy.as_ref().expect("read-through mode");
    let method = req.method().clone();
    if method != Method::GET && method != Method::HEAD {
        return unsafe_method(app, p, req).await;
    }
    let Some(store) = app.store.get() else {
        // While the store recovers, requests go straight to the origin.
        return pass(p, req).await;
    };
    let now = now_ms();
    let Some(uri) = effective_uri(&req, &p.origin) else {
        return text(StatusCode::BAD_REQUEST, "the Host header is not a valid host[:port]\n");
    };
    let key = cache_key(&uri);
    let h = req.headers();
    let req_cc = Directives::of(h);
    // Preconditions that only the origin can judge go to it.
    if h.contains_key(IF_MATCH) || h.contains_key(IF_UNMODIFIED_SINCE) {
        if req_cc.only_if_cached {
            return text(StatusCode::GATEWAY_TIMEOUT, "the origin must judge this request (only-if-cached)\n");
        }
        return pass(p, req).await;
    }
    let pragma = policy::pragma_no_cache(h);
    let head = method == Method::HEAD;
    let range = if head { None } else { crate::headers::range(h) };
    let part = if head { Part::Nothing } else { range.map_or(Part::Whole, Part::Range) };
    let found = lookup(app, store, &uri, &key, h, part).await;
    // §3.5: a response to a request with Authorization only if the response allows it.
    let found = found
        .map(|e| (Directives::of_response(&e.stored.headers), e))
        .filter(|(cc, _)| !h.contains_key(AUTHORIZATION) || cc.public || cc.must_revalidate || cc.s_maxage.is_some());
    if let Some((cc, e)) = found {
        let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
        let age_ms = policy::current_age_ms(&e.stored.headers, e.stored.times, now);
        let age = age_ms / 1000;
        match policy::usable(&req_cc, pragma, &cc, age_ms, lifetime) {
            Use::Fresh => {
                p.counters.hits.fetch_add(1, Ordering::Relaxed);
                return serve(app, store, e, &req, age, "HIT").await;
            }
            Use::StaleAllowed => {
                p.counters.stale.fetch_add(1, Ordering::Relaxed);
                return serve(app, store, e, &req, age, "STALE").await;
            }
            // A revalidation in the background is shared: never with a request's credentials.
            Use::StaleWhileRevalidate if h.contains_key(AUTHORIZATION) && !req_cc.only_if_cached => {
                return fetch(app, req, uri, key, Some(e), Share::Alone).await;
            }
            Use::StaleWhileRevalidate => {
                p.counters.stale.fetch_add(1, Ordering::Relaxed);
                revalidate_in_background(app, &req, &uri, &key, &e);
                return serve(app, store, e, &req, age, "STALE").await;
            }
            Use::Validate if req_cc.only_if_cached => {}
            Use::Validate => return fetch(app, req, uri, key, Some(e), Share::Shared).await,
        }
    }
    if req_cc.only_if_cached {
        return text(StatusCode::GATEWAY_TIMEOUT, "not in the cache (only-if-cached)\n");
    }
    // A URI whose last response could not be stored goes to the origin as it is asked (its
    // range, its conditionals, HEAD), and its requests do not wait on each other.
    if p.passing(&key, now) {
        return pass(p, req).await;
    }
    fetch(app, req, uri, key, None, Share::Shared).await
}

/// The fields a stored response is answered with, and `Age`, `X-Cache`, `Via`.
fn answer_headers(r: &mut Resp, stored: &HeaderMap, age: u64, x_cache: &'static str) {
    let h = r.headers_mut();
    for (n, v) in stored {
        h.append(n.clone(), v.clone());
    }
    h.insert(AGE, HeaderValue::from(age));
    h.insert(X_CACHE.clone(), HeaderValue::from_static(x_cache));
    h.append(VIA, HeaderValue::from_static(origin::VIA_VALUE));
}

/// Whether the client's `If-None-Match` / `If-Modified-Since` hold for a response with
/// `headers` (RFC 9110 §13.1.2, §13.1.3), so that it gets a 304.
fn client_not_modified(req: &HeaderMap, status: StatusCode, headers: &HeaderMap) -> bool {
    if status != StatusCode::OK {
        return false;
    }
    if req.contains_key(IF_NONE_MATCH) {
        let Some(tag) = headers.get(ETAG).and_then(|t| t.to_str().ok()) else { return false };
        let opaque = |t: &str| t.trim().trim_start_matches("W/").to_string();
        return req
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|m| m.trim() == "*" || opaque(m) == opaque(tag)));
    }
    let since = req.get(IF_MODIFIED_SINCE).and_then(|v| v.to_str().ok()).and_then(policy::parse_date);
    let modified = headers
        .get(LAST_MODIFIED)
        .or(headers.get(hyper::header::DATE))
        .and_then(|v| v.to_str().ok())
        .and_then(policy::parse_date);
    matches!((since, modified), (Some(s), Some(m)) if m <= s)
}

/// A 304 for a client's conditional request, with the fields RFC 9110 §15.4.5 lists.
fn not_modified(headers: &HeaderMap, age: u64, x_cache: &'static str) -> Resp {
    let mut kept = HeaderMap::new();
    for n in ["cache-control", "content-location", "date", "etag", "expires", "vary", "last-modified"] {
        for v in headers.get_all(n) {
            kept.append(HeaderName::from_static(n), v.clone());
        }
    }
    let mut r = Response::new(Body::full(Bytes::new()));
    *r.status_mut() = StatusCode::NOT_MODIFIED;
    answer_headers(&mut r, &kept, age, x_cache);
    r
}

/// Whether `If-Range` (if any) names the stored response: a strong ETag match, or its exact
/// `Last-Modified` date (RFC 9110 §13.1.5).
fn if_range_holds(if_range: Option<&HeaderValue>, headers: &HeaderMap) -> bool {
    let Some(v) = if_range.and_then(|v| v.to_str().ok()).map(str::trim) else { return true };
    if v.starts_with('"') {
        return headers.get(ETAG).and_then(|t| t.to_str().ok()).is_some_and(|t| t.trim() == v);
    }
    if v.starts_with("W/") {
        return false;
    }
    let lm = headers.get(LAST_MODIFIED).and_then(|t| t.to_str().ok()).and_then(policy::parse_date);
    lm.is_some() && lm == policy::parse_date(v)
}

/// Answers a request from a stored response: a 304 for a client's conditional that holds, a
/// 206 for a satisfiable range of a 200, else the response.
async fn serve(
    app: &Arc<App>,
    store: &Store,
    mut e: Entry,
    req: &Request<Incoming>,
    age: u64,
    x: &'static str,
) -> Resp {
    let h = req.headers();
    let status = e.stored.status;
    if client_not_modified(h, status, &e.stored.headers) {
        return not_modified(&e.stored.headers, age, x);
    }
    let head = req.method() == Method::HEAD;
    let range = if head { None } else { crate::headers::range(h) };
    let ranged = range.filter(|_| status == StatusCode::OK && if_range_holds(h.get(IF_RANGE), &e.stored.headers));
    // The read was of the range; a range that does not apply needs the whole body.
    if range.is_some() && ranged.is_none() {
        let stored_ms = e.value().stored_ms;
        match api::read_body_of(app, store, &e.key, Part::Whole).await {
            Ok(Some(r)) if r.value().stored_ms == stored_ms => e.read = r,
            _ => return text(StatusCode::SERVICE_UNAVAILABLE, "the stored response changed while read; try again\n"),
        }
    }
    let len = e.value().len;
    let (status, body_len, content_range) = match ranged {
        None => (status, len, None),
        Some(r) => match r.resolve(len) {
            Some((s, end)) => (StatusCode::PARTIAL_CONTENT, end - s, Some(format!("bytes {}-{}/{}", s, end - 1, len))),
            None => {
                let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "range not satisfiable\n");
                r.headers_mut().insert(CONTENT_RANGE, HeaderValue::try_from(format!("bytes */{len}")).expect("ASCII"));
                return r;
            }
        },
    };
    let body = if head { Body::full(Bytes::new()) } else { api::body_of(app, None, e.read, body_len).await };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    answer_headers(&mut r, &e.stored.headers, age, x);
    if let Some(cr) = content_range {
        r.headers_mut().insert(CONTENT_RANGE, HeaderValue::try_from(cr).expect("ASCII"));
    }
    // The body's length, whatever the origin's header said when it was stored (for a HEAD
    // too); none for a status that has no body (RFC 9110 §8.6).
    if status == StatusCode::NO_CONTENT {
        r.headers_mut().remove(CONTENT_LENGTH);
    } else {
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    r
}

/// What a flight's leader sends and stores.
struct Plan {
    uri: Vec<u8>,
    key: Vec<u8>,
    target: String,
    /// The leader's request fields (end-to-end, larder's `Via` added, conditionals removed).
    headers: HeaderMap,
    /// The leader request's own fields, for `Vary` and storability.
    client: HeaderMap,
    /// The stored response being revalidated: its key, store time and description.
    validating: Option<(Vec<u8>, u64, Stored)>,
}

fn plan(req: &Request<Incoming>, uri: Vec<u8>, key: Vec<u8>, stale: Option<&Entry>) -> Plan {
    let mut headers = origin::request_headers(req.headers());
    // The cache fetches whole responses it can store; the client's own conditionals and range
    // are answered from that response.
    // A GET's body (if a client sent one) is not sent: neither are the fields describing it.
    for n in [IF_NONE_MATCH, IF_MODIFIED_SINCE, IF_RANGE, RANGE, CONTENT_LENGTH, hyper::header::TRANSFER_ENCODING] {
        headers.remove(n);
    }
    let validating = stale.map(|e| (e.key.clone(), e.value().stored_ms, e.stored.clone()));
    if let Some((_, _, s)) = &validating {
        if let Some(tag) = s.headers.get(ETAG) {
            headers.insert(IF_NONE_MATCH, tag.clone());
        }
        if let Some(lm) = s.headers.get(LAST_MODIFIED) {
            headers.insert(IF_MODIFIED_SINCE, lm.clone());
        }
    }
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    Plan { uri, key, target, headers, client: req.headers().clone(), validating }
}

/// Starts a background revalidation of a stale response, unless one of its key is under way.
fn revalidate_in_background(app: &Arc<App>, req: &Request<Incoming>, uri: &[u8], key: &[u8], e: &Entry) {
    let p = app.proxy.as_ref().expect("read-through mode");
    if p.flights.busy(key) {
        return;
    }
    let (flight, leader) = p.flights.lead_or_join(key);
    if leader {
        let plan = plan(req, uri.to_vec(), key.to_vec(), Some(e));
        tokio::spawn(lead(app.clone(), flight, plan, true));
    }
}

/// How a request takes part in an origin fetch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Share {
    /// Lead or join the key's shared flight.
    Shared,
    /// Fetch alone: a request with credentials, a URI passed through, or one that could not use
    /// another's fetch (another variant, a response that may not be shared, a slow leader).
    Alone,
}

/// Fetches a response for a request that found nothing usable (`stale`: what it found).
async fn fetch(
    app: &Arc<App>,
    req: Request<Incoming>,
    uri: Vec<u8>,
    key: Vec<u8>,
    stale: Option<Entry>,
    share: Share,
) -> Resp {
    let p = app.proxy.as_ref().expect("read-through mode");
    let h = req.headers();
    let head = req.method() == Method::HEAD;
    let range = if head { None } else { crate::headers::range(h).map(|r| (r, h.get(IF_RANGE).cloned())) };
    // A request with credentials never shares another's fetch, nor lets others share its own.
    let shared = share == Share::Shared && !h.contains_key(AUTHORIZATION);
    let (flight, leader) = if shared { p.flights.lead_or_join(&key) } else { (Arc::new(flight::Flight::new()), true) };
    let (m, outcome, data) = flight::member(range);
    let (outcome, data) = match flight.join(m) {
        Ok(()) => (outcome, data),
        // Its body has begun: wait for the flight's end, bounded, then look again.
        Err(_) => return Box::pin(after_flight(app, req, uri, key, stale)).await,
    };
    if leader {
        let plan = plan(&req, uri.clone(), key.clone(), stale.as_ref());
        tokio::spawn(lead(app.clone(), flight, plan, shared));
    } else {
        p.counters.coalesced.fetch_add(1, Ordering::Relaxed);
    }
    // The leader's own wait is bounded by the origin's timeouts; a member's by the lock timeout.
    let waited = if leader { Ok(outcome.await) } else { tokio::time::timeout(p.lock_timeout, outcome).await };
    let alone = |req, uri, key, stale| Box::pin(fetch(app, req, uri, key, stale, Share::Alone));
    let outcome = match waited {
        Ok(Ok(o)) => o,
        Ok(Err(_)) if leader => return text(StatusCode::BAD_GATEWAY, "the origin fetch ended without an answer\n"),
        // The leader is slow (past the lock timeout) or went away: fetch alone.
        _ => return alone(req, uri, key, stale).await,
    };
    match outcome {
        Outcome::Response(head_, window) => {
            let error = matches!(head_.status.as_u16(), 500 | 502 | 503 | 504);
            if error && stale.as_ref().is_some_and(|e| stale_on_error(p, &req, e, false)) {
                drop(data);
                return serve_stale(app, stale.expect("checked"), &req).await;
            }
            if !leader {
                // A response that may not be shared is the leader's alone (private, no-store,
                // Set-Cookie…); another variant than this request selects is not its either.
                let names: Vec<HeaderName> = head_.selecting.iter().map(|(n, _)| n.clone()).collect();
                if !head_.shareable || selecting(req.headers(), &names) != head_.selecting {
                    drop(data);
                    return alone(req, uri, key, stale).await;
                }
            }
            respond_from_flight(p, &req, &head_, window, data, leader)
        }
        Outcome::Refreshed(validated) => {
            // The refreshed entry, if it is the one this request selects and may use now.
            let store = app.store.get().expect("store is ready");
            let part = if head {
                Part::Nothing
            } else {
                crate::headers::range(req.headers()).map_or(Part::Whole, Part::Range)
            };
            if let Some(e) = lookup(app, store, &uri, &key, req.headers(), part).await {
                let cc = Directives::of_response(&e.stored.headers);
                let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
                let age_ms = policy::current_age_ms(&e.stored.headers, e.stored.times, now_ms());
                let req_cc = Directives::of(req.headers());
                // The response this request found stale, just validated, answers it whatever
                // its own bounds (max-age=0, no-cache); a request that found nothing uses it
                // only if it may use it as it is now.
                let revalidated = stale.as_ref().is_some_and(|s| s.key == e.key && e.key == validated);
                if revalidated || policy::usable(&req_cc, false, &cc, age_ms, lifetime) == Use::Fresh {
                    p.counters.revalidated.fetch_add(1, Ordering::Relaxed);
                    return serve(app, store, e, &req, age_ms / 1000, "REVALIDATED").await;
                }
            }
            alone(req, uri, key, stale).await
        }
        Outcome::Failed { message, timeout } => {
            if let Some(e) = stale.filter(|e| stale_on_error(p, &req, e, true)) {
                return serve_stale(app, e, &req).await;
            }
            let status = if timeout { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
            text_owned(status, format!("{message}\n"))
        }
    }
}

/// Whether `e` may be served because the origin failed (RFC 5861 §4, RFC 9111 §4.2.4).
fn stale_on_error(p: &Proxy, req: &Request<Incoming>, e: &Entry, disconnected: bool) -> bool {
    let cc = Directives::of_response(&e.stored.headers);
    let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
    let age = policy::current_age(&e.stored.headers, e.stored.times, now_ms());
    // The server's default covers an origin that cannot be reached (RFC 9111 §4.2.4 lets a
    // disconnected cache serve stale); a 5xx answer needs the response's or request's own
    // stale-if-error (RFC 5861 §4).
    let default = if disconnected { p.stale_if_error } else { 0 };
    policy::stale_if_error(&Directives::of(req.headers()), &cc, age.saturating_sub(lifetime), default)
}

async fn serve_stale(app: &Arc<App>, e: Entry, req: &Request<Incoming>) -> Resp {
    let p = app.proxy.as_ref().expect("read-through mode");
    p.counters.stale.fetch_add(1, Ordering::Relaxed);
    let age = policy::current_age(&e.stored.headers, e.stored.times, now_ms());
    let store = app.store.get().expect("store is ready");
    serve(app, store, e, req, age, "STALE").await
}

/// After a flight this request could not join: waits for its end (at most the lock timeout),
/// then serves what it stored, or fetches alone.
async fn after_flight(
    app: &Arc<App>,
    req: Request<Incoming>,
    uri: Vec<u8>,
    key: Vec<u8>,
    stale: Option<Entry>,
) -> Resp {
    let p = app.proxy.as_ref().expect("read-through mode");
    let deadline = Instant::now() + p.lock_timeout;
    while p.flights.busy(&key) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let store = app.store.get().expect("store is ready");
    let head = req.method() == Method::HEAD;
    let part = if head { Part::Nothing } else { crate::headers::range(req.headers()).map_or(Part::Whole, Part::Range) };
    if let Some(e) = lookup(app, store, &uri, &key, req.headers(), part).await {
        let cc = Directives::of_response(&e.stored.headers);
        let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
        let age = policy::current_age(&e.stored.headers, e.stored.times, now_ms());
        let req_cc = Directives::of(req.headers());
        let age_ms = policy::current_age_ms(&e.stored.headers, e.stored.times, now_ms());
        if policy::usable(&req_cc, policy::pragma_no_cache(req.headers()), &cc, age_ms, lifetime) == Use::Fresh {
            p.counters.hits.fetch_add(1, Ordering::Relaxed);
            return serve(app, store, e, &req, age, "HIT").await;
        }
    }
    fetch(app, req, uri, key, stale, Share::Alone).await
}

/// The answer to a flight member: the response as it streams, or a 304 / 206 of it.
fn respond_from_flight(
    p: &Proxy,
    req: &Request<Incoming>,
    head: &Head,
    window: Option<(u64, u64)>,
    data: tokio::sync::mpsc::Receiver<Result<Bytes, larder_engine::Error>>,
    leader: bool,
) -> Resp {
    let x = if head.storing { "MISS" } else { "PASS" };
    if leader || !head.storing {
        let c = if head.storing { &p.counters.misses } else { &p.counters.passes };
        c.fetch_add(1, Ordering::Relaxed);
    } else {
        p.counters.misses.fetch_add(1, Ordering::Relaxed);
    }
    if client_not_modified(req.headers(), head.status, &head.headers) {
        // A 304's fields are ones the cache may reuse (none of them is ever withheld).
        return not_modified(&head.headers, head.age, x);
    }
    let no_body = req.method() == Method::HEAD
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    let (status, len) = match window {
        Some((s, e)) => (StatusCode::PARTIAL_CONTENT, Some(e - s)),
        None => (head.status, head.len),
    };
    let body = match (no_body, len) {
        (true, _) => Body::full(Bytes::new()),
        (false, Some(left)) => Body::Pieces { rx: data, left },
        (false, None) => Body::Stream { rx: data },
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    answer_headers(&mut r, &head.headers, head.age, x);
    let h = r.headers_mut();
    if !leader {
        for n in &head.withheld {
            h.remove(n);
        }
    }
    h.remove(CONTENT_LENGTH);
    if let (Some((s, e)), Some(total)) = (window, head.len) {
        h.insert(CONTENT_RANGE, HeaderValue::try_from(format!("bytes {}-{}/{}", s, e - 1, total)).expect("ASCII"));
    }
    if let Some(l) = len.filter(|_| status != StatusCode::NO_CONTENT) {
        h.insert(CONTENT_LENGTH, HeaderValue::from(l));
    }
    r
}

/// The engine expiry of a stored response: when it can serve no request any more. One with
/// validators is kept a while longer for revalidation (the ring may evict it sooner).
fn keep_until(stored: &Stored, cc: &Directives, default_sie: u64) -> Expiry {
    let lifetime = policy::freshness_lifetime(stored.status, &stored.headers, cc, stored.times);
    let age_at_response = policy::current_age(&stored.headers, stored.times, stored.times.response_ms);
    let secs = |d: Option<policy::Delta>| match d {
        Some(policy::Delta::Secs(s)) => s,
        _ => 0,
    };
    let mut grace = secs(cc.stale_while_revalidate).max(secs(cc.stale_if_error)).max(default_sie);
    if stored.headers.contains_key(ETAG) || stored.headers.contains_key(LAST_MODIFIED) {
        grace = grace.max(KEEP_FOR_REVALIDATION_SECS);
    }
    let left = lifetime.saturating_sub(age_at_response).saturating_add(grace);
    Expiry::At(stored.times.response_ms.saturating_add(left.min(policy::MAX_DELTA * 50).saturating_mul(1000)))
}

/// Adds the `Date` a response came without: the time it was received (RFC 9110 §6.6.1), so
/// that its age is counted from then wherever it is stored or sent.
fn with_date(h: &mut HeaderMap, received_ms: u64) {
    if !h.contains_key(hyper::header::DATE) {
        let t = std::time::UNIX_EPOCH + Duration::from_millis(received_ms);
        h.insert(hyper::header::DATE, HeaderValue::try_from(httpdate::fmt_http_date(t)).expect("ASCII"));
    }
}

/// Fields of a response that are stored and sent on: end-to-end, minus what the cache must not
/// reuse (`no-cache="…"`, `private="…"` fields) and what it computes itself.
fn storable_headers(resp: &HeaderMap, cc: &Directives) -> HeaderMap {
    let mut h = origin::end_to_end(resp);
    for n in cc.no_cache_fields.iter().chain(&cc.private_fields) {
        if let Ok(n) = HeaderName::from_bytes(n.as_bytes()) {
            h.remove(n);
        }
    }
    // Age stays: it is the age_value the current age is computed from (sent replaced).
    h.remove(X_CACHE.clone());
    h
}

/// A flight's leader: fetches from the origin, stores, and streams to the members.
async fn lead(app: Arc<App>, flight: Arc<flight::Flight>, mut plan: Plan, registered: bool) {
    let p = app.proxy.as_ref().expect("read-through mode");
    // However the leader ends (a panic included), its flight leaves the table and members not
    // yet answered are told, so nobody waits on it for ever.
    struct Ends<'a>(&'a Proxy, Vec<u8>, Arc<flight::Flight>, bool);
    impl Drop for Ends<'_> {
        fn drop(&mut self) {
            for m in self.2.close() {
                if let Some(o) = m.outcome {
                    let _ = o.send(Outcome::Failed { message: "the origin fetch failed".into(), timeout: false });
                }
            }
            if self.3 {
                self.0.flights.end(&self.1, &self.2);
            }
        }
    }
    let _ends = Ends(p, plan.key.clone(), flight.clone(), registered);
    // An invalidation of the key after this point keeps what is fetched out of the store.
    let epoch = p.flights.epoch();
    loop {
        let request_ms = now_ms();
        let started = Instant::now();
        let sent = p
            .origin
            .send(
                Method::GET,
                &plan.target,
                plan.headers.clone(),
                http_body_util::Either::Right(http_body_util::Empty::new()),
            )
            .await;
        p.origin_latency.record(started.elapsed().as_secs_f64());
        let resp = match sent {
            Ok(r) => r,
            Err(e) => {
                p.counters.origin_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "origin request failed");
                let timeout = matches!(e, OriginError::Timeout);
                for m in flight.close() {
                    if let Some(o) = m.outcome {
                        let _ = o.send(Outcome::Failed { message: e.to_string(), timeout });
                    }
                }
                break;
            }
        };
        let times = Times { request_ms, response_ms: now_ms() };
        if resp.status() == StatusCode::NOT_MODIFIED {
            if let Some((vkey, stored_ms, old)) = plan.validating.take() {
                if refresh(&app, &vkey, stored_ms, old, resp.headers(), times).await {
                    for m in flight.close() {
                        if let Some(o) = m.outcome {
                            let _ = o.send(Outcome::Refreshed(vkey.clone()));
                        }
                    }
                    break;
                }
                // The 304 names another response than the stored one: fetch it whole.
                for n in [IF_NONE_MATCH, IF_MODIFIED_SINCE] {
                    plan.headers.remove(n);
                }
                continue;
            }
        }
        if plan.validating.is_some() {
            p.counters.revalidated_changed.fetch_add(1, Ordering::Relaxed);
        }
        deliver(&app, &flight, &plan, resp, times, epoch, registered).await;
        break;
    }
}

/// Updates a stored response's header fields from a 304 (RFC 9111 §3.2, §4.3.4); false when
/// the 304 does not select it (another strong validator) or it is gone.
async fn refresh(app: &Arc<App>, key: &[u8], stored_ms: u64, mut old: Stored, h: &HeaderMap, times: Times) -> bool {
    // §4.3.4: a 304 with a strong validator selects only a stored response with the same one.
    if let Some(new) = h.get(ETAG).filter(|t| !t.as_bytes().starts_with(b"W/")) {
        if old.headers.get(ETAG) != Some(new) {
            return false;
        }
    }
    let mut fresh = origin::end_to_end(h);
    with_date(&mut fresh, times.response_ms);
    for name in fresh.keys() {
        if [CONTENT_LENGTH, hyper::header::CONTENT_ENCODING, CONTENT_RANGE].contains(name) || *name == X_CACHE {
            continue;
        }
        old.headers.remove(name);
        for v in fresh.get_all(name) {
            old.headers.append(name.clone(), v.clone());
        }
    }
    // The age of the stored response now counts from this exchange (its Date, if it sent one).
    old.times = times;
    if !h.contains_key(AGE) {
        old.headers.remove(AGE);
    }
    let cc = Directives::of_response(&old.headers);
    old.headers = storable_headers(&old.headers, &cc);
    let p = app.proxy.as_ref().expect("read-through mode");
    let expiry = keep_until(&old, &cc, p.stale_if_error);
    let Some(attrs) = old.encode() else { return false };
    let key = key.to_vec();
    let done = api::blocking(app, move |s| {
        s.update(&key, &Touch { expiry, attrs: Some(Some(&attrs)), stored_at: Some(stored_ms) })
    })
    .await;
    matches!(done, Ok(Some(_)))
}

/// Hands a full response to the flight's members and, if it may be stored, to the store.
async fn deliver(
    app: &Arc<App>,
    flight: &flight::Flight,
    plan: &Plan,
    resp: Response<Incoming>,
    times: Times,
    epoch: u64,
    registered: bool,
) {
    let p = app.proxy.as_ref().expect("read-through mode");
    let (parts, mut body) = resp.into_parts();
    let cc = Directives::of_response(&parts.headers);
    let req_cc = Directives::of(&plan.client);
    let mut headers = storable_headers(&parts.headers, &cc);
    with_date(&mut headers, times.response_ms);
    let len = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let store = app.store.get().expect("store is ready");
    let limit = store.config().max_value_size;
    let names = vary_names(&parts.headers);
    let selecting_values = selecting(&plan.client, &names);
    let mut why_not = policy::not_storable(&plan.client, &req_cc, parts.status, &parts.headers, &cc);
    if why_not.is_none() && len.is_some_and(|l| l > limit) {
        why_not = Some("larger than --max-value-size");
    }
    let description = Stored {
        kind: Kind::Response,
        status: parts.status,
        times,
        uri: plan.uri.clone(),
        headers: headers.clone(),
        selecting: selecting_values.clone(),
    };
    let attrs = match why_not {
        None => match description.encode() {
            Some(a) => Some(a),
            None => {
                why_not = Some("header fields larger than the stored limit");
                None
            }
        },
        Some(_) => None,
    };
    if let Some(why) = why_not {
        p.counters.not_stored.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(why, "response passed through, not stored");
        // Remembered only for what the response said: a request (its no-store, its
        // credentials) cannot turn the cache off for everyone else.
        let asked = req_cc.no_store || plan.client.contains_key(AUTHORIZATION);
        let not_modified = parts.status == StatusCode::NOT_MODIFIED;
        if !asked && !not_modified && (parts.status.is_success() || parts.status.is_redirection()) {
            p.pass_until.insert(plan.key.clone(), now_ms() + PASS_FOR_MS);
        }
    }
    // Where it is stored: the URI's key, or a variant's key behind a marker.
    // A fetch of its own while another fetch of the key is under way (a request that waited
    // past the lock timeout) is answered, not stored: one copy is written, not one per waiter.
    let store_key = match (&attrs, names.is_empty()) {
        (None, _) => None,
        (Some(_), _) if !registered && p.flights.busy(&plan.key) => None,
        (Some(_), true) => Some(plan.key.clone()),
        (Some(_), false) => marker(app, plan, &names).await.map(|ms| variant_key(&plan.uri, ms, &selecting_values)),
    };
    let age = policy::current_age(&headers, times, now_ms());
    let storing = store_key.is_some();
    // The leader's client gets the response whole; what the cache may not reuse is withheld
    // from the others.
    let mut whole = origin::end_to_end(&parts.headers);
    whole.remove(X_CACHE.clone());
    with_date(&mut whole, times.response_ms);
    let withheld = cc
        .no_cache_fields
        .iter()
        .chain(&cc.private_fields)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    // Members may take a response being stored, and an origin error that holds nothing of
    // anyone's (during an outage, not one refetch per waiting request).
    let error = matches!(parts.status.as_u16(), 500 | 502 | 503 | 504);
    let personal = cc.private || cc.no_store || parts.headers.contains_key(hyper::header::SET_COOKIE);
    let shareable = storing || (error && !personal);
    let head = Arc::new(Head {
        status: parts.status,
        headers: whole,
        withheld,
        len,
        selecting: selecting_values,
        age,
        storing,
        shareable,
    });
    let mut members = flight.close();
    for m in &mut members {
        let window = match (&m.range, len) {
            (Some((r, if_range)), Some(total))
                if parts.status == StatusCode::OK && if_range_holds(if_range.as_ref(), &head.headers) =>
            {
                r.resolve(total)
            }
            _ => None,
        };
        if let Some((s, e)) = window {
            (m.skip, m.take) = (s, e - s);
        }
    }
    let mut live = Vec::with_capacity(members.len());
    for mut m in members {
        let window = (m.take != u64::MAX).then_some((m.skip, m.skip + m.take));
        let told = m.outcome.take().is_some_and(|o| o.send(Outcome::Response(head.clone(), window)).is_ok());
        if told {
            live.push(m);
        }
    }
    let mut sink = match (store_key, attrs) {
        (Some(key), Some(attrs)) => {
            let expiry = keep_until(&description, &cc, p.stale_if_error);
            let chunk = store.config().chunk_size;
            match len {
                Some(l) if l <= chunk => Sink::Gather { key, attrs, expiry, parts: Vec::new() },
                _ => Sink::stream(app, key, attrs, expiry),
            }
        }
        _ => Sink::None,
    };
    let mut received = 0u64;
    // Each piece goes to the members one piece late: the last is held until the response is
    // stored, so that a client that has the whole response finds it stored on its next request.
    let mut held: Option<Bytes> = None;
    let broke = loop {
        match p.origin.next(&mut body).await {
            Ok(Some(d)) => {
                received += d.len() as u64;
                if received > limit {
                    sink = Sink::None; // too large to store: passed on only
                }
                sink.push(&d).await;
                if let Some(prev) = held.replace(d) {
                    send_to_members(&mut live, prev, p.origin.read_timeout).await;
                }
                if live.is_empty() && matches!(sink, Sink::None) {
                    break false; // nobody is listening and nothing is stored
                }
            }
            Ok(None) => break false,
            Err(e) => {
                p.counters.origin_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "origin response body failed");
                break true;
            }
        }
    };
    if broke {
        for m in &live {
            let _ =
                m.data.try_send(Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, "the origin broke off")));
        }
        return; // the writer is dropped unfinished: nothing is stored
    }
    let complete = len.is_none_or(|l| l == received) && !p.flights.invalidated_since(&plan.key, epoch);
    match sink.finish(app, complete).await {
        Ok(true) => {
            p.counters.stored.fetch_add(1, Ordering::Relaxed);
            p.pass_until.remove(&plan.key);
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "a response could not be stored"),
    }
    if let Some(last) = held {
        send_to_members(&mut live, last, p.origin.read_timeout).await;
    }
    // The end, said explicitly: a body of unknown length that just stops was cut short.
    for m in &live {
        let _ = tokio::time::timeout(p.origin.read_timeout, m.data.send(Ok(Bytes::new()))).await;
    }
}

/// Where a response's body goes in the store while it streams; only a complete body is stored.
enum Sink {
    /// Not stored.
    None,
    /// A body of known length within a chunk: its pieces kept (shared with the members, not
    /// copied) and stored in one write at the end, inline when the write need not wait.
    Gather { key: Vec<u8>, attrs: Vec<u8>, expiry: Expiry, parts: Vec<Bytes> },
    /// Anything longer, or of unknown length: a writer on the blocking pool fed piece by
    /// piece, holding about a chunk of it.
    Stream { tx: tokio::sync::mpsc::Sender<Option<Bytes>>, task: tokio::task::JoinHandle<larder_engine::Result<bool>> },
}

impl Sink {
    fn stream(app: &Arc<App>, key: Vec<u8>, attrs: Vec<u8>, expiry: Expiry) -> Sink {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Option<Bytes>>(2);
        let app = app.clone();
        let task = tokio::task::spawn_blocking(move || -> larder_engine::Result<bool> {
            let store = app.store.get().expect("store is ready");
            let opts = PutOptions { expiry, attrs: Some(&attrs), ..PutOptions::default() };
            let mut w = store.writer(&key, &opts)?;
            while let Some(piece) = rx.blocking_recv() {
                match piece {
                    Some(d) => w.write(&d)?,
                    None => {
                        w.finish()?;
                        return Ok(true);
                    }
                }
            }
            Ok(false) // cut short: the writer is dropped and nothing is stored
        });
        Sink::Stream { tx, task }
    }

    async fn push(&mut self, d: &Bytes) {
        match self {
            Sink::None => {}
            Sink::Gather { parts, .. } => parts.push(d.clone()),
            Sink::Stream { tx, .. } => {
                if tx.send(Some(d.clone())).await.is_err() {
                    // The writer stopped on an error: say which, and store nothing.
                    if let Sink::Stream { task, .. } = std::mem::replace(self, Sink::None) {
                        if let Ok(Err(e)) = task.await {
                            tracing::warn!(error = %e, "a response could not be stored");
                        }
                    }
                }
            }
        }
    }

    /// Stores the body if it is `complete`; whether it was stored.
    async fn finish(self, app: &Arc<App>, complete: bool) -> larder_engine::Result<bool> {
        match self {
            Sink::None => Ok(false),
            Sink::Gather { .. } if !complete => Ok(false),
            Sink::Gather { key, attrs, expiry, parts } => {
                let store = app.store.get().expect("store is ready");
                let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                let opts = PutOptions { expiry, attrs: Some(&attrs), nonblocking: true, ..PutOptions::default() };
                match store.put_parts(&key, &slices, &opts) {
                    Err(e) if e.kind() == larder_engine::ErrorKind::WouldBlock => api::blocking(app, move |s| {
                        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                        let opts = PutOptions { expiry, attrs: Some(&attrs), ..PutOptions::default() };
                        s.put_parts(&key, &slices, &opts)
                    })
                    .await
                    .map(|_| true),
                    done => done.map(|_| true),
                }
            }
            Sink::Stream { tx, task } => {
                if complete {
                    let _ = tx.send(None).await;
                }
                drop(tx);
                task.await
                    .unwrap_or_else(|e| Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, e.to_string())))
            }
        }
    }
}

/// Sends a piece of body to each member, cut to its window; a member that is gone, or takes
/// no piece for the read timeout, is dropped.
async fn send_to_members(live: &mut Vec<Member>, d: Bytes, timeout: Duration) {
    let mut i = 0;
    while i < live.len() {
        let m = &mut live[i];
        let n = d.len() as u64;
        let start = m.skip.min(n);
        m.skip -= start;
        let end = (start + m.take.min(n - start)).min(n);
        if m.take != u64::MAX {
            m.take -= end - start;
        }
        let ok = if end > start {
            matches!(
                tokio::time::timeout(timeout, m.data.send(Ok(d.slice(start as usize..end as usize)))).await,
                Ok(Ok(()))
            )
        } else {
            !m.data.is_closed()
        };
        if ok {
            i += 1;
        } else {
            // Told, where its channel has room, so a body of unknown length does not look whole.
            let gone = live.swap_remove(i);
            let _ = gone.data.try_send(Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, "fell behind")));
        }
    }
}

/// The store time of the URI's vary marker naming `names`, writing one if there is none.
async fn marker(app: &Arc<App>, plan: &Plan, names: &[HeaderName]) -> Option<u64> {
    let store = app.store.get().expect("store is ready");
    if let Ok(Some(r)) = api::read_body_of(app, store, &plan.key, Part::Nothing).await {
        let v = r.value();
        if let Some(s) = v.attrs.as_deref().and_then(Stored::decode) {
            if s.kind == Kind::VaryMarker && s.uri == plan.uri && vary_names(&s.headers) == names {
                return Some(v.stored_ms);
            }
        }
    }
    let mut headers = HeaderMap::new();
    let list = names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ");
    headers.insert(VARY, HeaderValue::from_str(&list).ok()?);
    let m = Stored {
        kind: Kind::VaryMarker,
        status: StatusCode::OK,
        times: Times { request_ms: 0, response_ms: 0 },
        uri: plan.uri.clone(),
        headers,
        selecting: Vec::new(),
    };
    let attrs = m.encode()?;
    let key = plan.key.clone();
    let put =
        api::blocking(app, move |s| s.put(&key, b"", &PutOptions { attrs: Some(&attrs), ..PutOptions::default() }));
    put.await.ok().map(|st| st.version.stored_ms)
}

/// Forwards a request to the origin as it is and passes its answer back (`X-Cache: PASS`).
async fn pass(p: &Proxy, req: Request<Incoming>) -> Resp {
    p.counters.passes.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |q| q.as_str()).to_string();
    let headers = origin::request_headers(&parts.headers);
    match p.origin.send(parts.method.clone(), &target, headers, http_body_util::Either::Left(body)).await {
        Ok(r) => relay(p, r, parts.method == Method::HEAD),
        Err(e) => {
            p.counters.origin_errors.fetch_add(1, Ordering::Relaxed);
            let status =
                if matches!(e, OriginError::Timeout) { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
            text_owned(status, format!("{e}\n"))
        }
    }
}

/// An origin's response passed on as it streams.
fn relay(p: &Proxy, r: Response<Incoming>, head: bool) -> Resp {
    let (parts, mut body) = r.into_parts();
    let len = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let no_body = head || parts.status == StatusCode::NO_CONTENT || parts.status == StatusCode::NOT_MODIFIED;
    let out = if no_body {
        Body::full(Bytes::new())
    } else {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let timeout = p.origin.read_timeout;
        tokio::spawn(async move {
            loop {
                let piece = match tokio::time::timeout(timeout, http_body_util::BodyExt::frame(&mut body)).await {
                    Err(_) => Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, "the origin timed out")),
                    Ok(None) => {
                        let _ = tx.send(Ok(Bytes::new())).await; // the end mark
                        break;
                    }
                    Ok(Some(Err(e))) => Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, e.to_string())),
                    Ok(Some(Ok(f))) => match f.into_data() {
                        // An empty piece is the end mark of `Body::Stream`: never pass one on.
                        Ok(d) if d.is_empty() => continue,
                        Ok(d) => Ok(d),
                        Err(_) => continue,
                    },
                };
                let failed = piece.is_err();
                if tx.send(piece).await.is_err() || failed {
                    break;
                }
            }
        });
        match len {
            Some(left) => Body::Pieces { rx, left },
            None => Body::Stream { rx },
        }
    };
    let mut resp = Response::new(out);
    *resp.status_mut() = parts.status;
    let mut h = origin::end_to_end(&parts.headers);
    if no_body && !head {
        h.remove(CONTENT_LENGTH);
    }
    *resp.headers_mut() = h;
    resp.headers_mut().insert(X_CACHE.clone(), HeaderValue::from_static("PASS"));
    resp.headers_mut().append(VIA, HeaderValue::from_static(origin::VIA_VALUE));
    resp
}

/// Methods other than GET and HEAD: forwarded; a non-error answer invalidates what is stored
/// for the URI and for `Location` / `Content-Location` on the same host (RFC 9111 §4.4).
async fn unsafe_method(app: &Arc<App>, p: &Proxy, req: Request<Incoming>) -> Resp {
    let safe = matches!(*req.method(), Method::OPTIONS | Method::TRACE);
    let Some(uri) = effective_uri(&req, &p.origin) else {
        return text(StatusCode::BAD_REQUEST, "the Host header is not a valid host[:port]\n");
    };
    let host_len = uri.iter().position(|&b| b == b'/').unwrap_or(uri.len());
    let host = uri[..host_len].to_vec();
    let r = pass(p, req).await;
    if safe || !(r.status().is_success() || r.status().is_redirection()) {
        return r;
    }
    let mut uris = vec![uri];
    for name in [LOCATION, CONTENT_LOCATION] {
        let Some(v) = r.headers().get(&name).and_then(|v| v.to_str().ok()) else { continue };
        if let Some(u) = same_host(&host, v) {
            uris.push(u);
        }
    }
    if let Some(store) = app.store.get() {
        for u in uris {
            let key = cache_key(&u);
            p.pass_until.remove(&key);
            p.flights.invalidate(&key);
            if invalidate(app, store, key).await {
                p.counters.invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    r
}

/// `reference` resolved on a request to `host`, if it names the same host.
fn same_host(host: &[u8], reference: &str) -> Option<Vec<u8>> {
    if let Some(rest) = reference.strip_prefix("http://") {
        let (h, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if !h.as_bytes().eq_ignore_ascii_case(host) {
            return None;
        }
        let mut u = host.to_vec();
        u.extend_from_slice(if path.is_empty() { b"/" } else { path.as_bytes() });
        return Some(u);
    }
    if reference.starts_with('/') && !reference.starts_with("//") {
        let mut u = host.to_vec();
        u.extend_from_slice(reference.as_bytes());
        return Some(u);
    }
    None
}

/// Deletes the stored response (or vary marker, orphaning its variants) under `key`.
async fn invalidate(app: &Arc<App>, store: &Store, key: Vec<u8>) -> bool {
    let quick = store.delete(&key, &larder_engine::DeleteOptions { nonblocking: true, ..Default::default() });
    match quick {
        Err(e) if e.kind() == larder_engine::ErrorKind::WouldBlock => {
            api::blocking(app, move |s| s.delete(&key, &larder_engine::DeleteOptions::default())).await.unwrap_or(false)
        }
        done => done.unwrap_or(false),
    }
}

/// `/_larder/purge?uri=HOST/PATH`: drops the stored response of a URI (all its variants).
pub async fn purge(app: &Arc<App>, query: Option<&str>) -> Resp {
    let Some(p) = app.proxy.as_ref() else {
        return text(StatusCode::NOT_FOUND, "purge is for read-through mode (--origin)\n");
    };
    let Some(store) = app.store.get() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering; try again shortly\n");
    };
    let uri = query.and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("uri="))
            .map(|v| percent_encoding::percent_decode_str(v).collect::<Vec<u8>>())
    });
    let Some(uri) = uri.filter(|u| !u.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "give the URI to purge: /_larder/purge?uri=HOST/PATH\n");
    };
    // Hosts are compared lower-cased, as requests are keyed.
    let slash = uri.iter().position(|&b| b == b'/').unwrap_or(uri.len());
    let mut uri_l = uri[..slash].to_ascii_lowercase();
    uri_l.extend_from_slice(&uri[slash..]);
    let key = cache_key(&uri_l);
    p.pass_until.remove(&key);
    if invalidate(app, store, key).await {
        p.counters.purges.fetch_add(1, Ordering::Relaxed);
        text(StatusCode::OK, "purged\n")
    } else {
        text(StatusCode::NOT_FOUND, "not in the cache\n")
    }
}

/// The mode's metrics, copied in when scraped.
pub fn render_metrics(c: &Counters) {
    use metrics::counter;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    for (outcome, v) in [
        ("hit", &c.hits),
        ("miss", &c.misses),
        ("revalidated", &c.revalidated),
        ("stale", &c.stale),
        ("pass", &c.passes),
    ] {
        counter!("larder_proxy_requests_total", "cache" => outcome).absolute(load(v));
    }
    counter!("larder_proxy_revalidations_total", "result" => "304").absolute(load(&c.revalidated));
    counter!("larder_proxy_revalidations_total", "result" => "200").absolute(load(&c.revalidated_changed));
    counter!("larder_proxy_coalesced_total").absolute(load(&c.coalesced));
    counter!("larder_proxy_stored_total").absolute(load(&c.stored));
    counter!("larder_proxy_not_stored_total").absolute(load(&c.not_stored));
    counter!("larder_proxy_origin_errors_total").absolute(load(&c.origin_errors));
    counter!("larder_proxy_invalidations_total").absolute(load(&c.invalidations));
    counter!("larder_proxy_purges_total").absolute(load(&c.purges));
}
