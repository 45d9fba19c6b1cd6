//! Answering a request from a stored response: the stored fields with `Age`, `X-Cache` and
//! `Via`; a 304 when the client's own conditional holds; a 206 for a range of a stored 200;
//! and a stale response when the origin failed and the response or request allows it.

use super::directives::Directives;
use super::lookup::Entry;
use super::mode::{state, Proxy, X_CACHE};
use super::origin;
use super::policy;
use crate::app::App;
use crate::reply::{text, Body, Resp};
use crate::storeio;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AGE, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    IF_RANGE, LAST_MODIFIED, VIA,
};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::{now_ms, Part, Store};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The fields a stored response is answered with, and `Age`, `X-Cache`, `Via`.
pub(super) fn answer_headers(r: &mut Resp, stored: &HeaderMap, age: u64, x_cache: &'static str) {
    let h = r.headers_mut();
    for (n, v) in stored.iter().filter(|(n, _)| **n != origin::SURROGATE_CONTROL) {
        h.append(n.clone(), v.clone());
    }
    h.insert(AGE, HeaderValue::from(age));
    h.insert(X_CACHE.clone(), HeaderValue::from_static(x_cache));
    h.append(VIA, HeaderValue::from_static(origin::VIA_VALUE));
}

/// Whether the client's `If-None-Match` / `If-Modified-Since` hold for a response with
/// `headers` (RFC 9110 §13.1.2, §13.1.3), so that it gets a 304.
pub(super) fn client_not_modified(req: &HeaderMap, status: StatusCode, headers: &HeaderMap) -> bool {
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
pub(super) fn not_modified(headers: &HeaderMap, age: u64, x_cache: &'static str) -> Resp {
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
pub(super) fn if_range_holds(if_range: Option<&HeaderValue>, headers: &HeaderMap) -> bool {
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
pub(super) async fn serve(
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
        match storeio::read_body_of(app, store, &e.key, Part::Whole, false).await {
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
    let body = if head { Body::full(Bytes::new()) } else { storeio::body_of(app, None, e.read, body_len).await };
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

/// Whether `e` may be served because the origin failed (RFC 5861 §4, RFC 9111 §4.2.4).
pub(super) fn stale_on_error(p: &Proxy, req: &Request<Incoming>, e: &Entry, disconnected: bool) -> bool {
    let cc = Directives::of_response(&e.stored.headers);
    let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
    let age = policy::current_age(&e.stored.headers, e.stored.times, now_ms());
    // The server's default covers an origin that cannot be reached (RFC 9111 §4.2.4 lets a
    // disconnected cache serve stale); a 5xx answer needs the response's or request's own
    // stale-if-error (RFC 5861 §4).
    let default = if disconnected { p.stale_if_error } else { 0 };
    policy::stale_if_error(&Directives::of(req.headers()), &cc, age.saturating_sub(lifetime), default)
}

pub(super) async fn serve_stale(app: &Arc<App>, e: Entry, req: &Request<Incoming>) -> Resp {
    let p = state().expect("read-through mode");
    p.counters.stale.fetch_add(1, Ordering::Relaxed);
    let age = policy::current_age(&e.stored.headers, e.stored.times, now_ms());
    let store = app.store.get().expect("store is ready");
    serve(app, store, e, req, age, "STALE").await
}
