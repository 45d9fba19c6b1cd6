//! A request's side of an origin fetch: leading (with its [`super::lead::Plan`]) or joining the cache
//! key's flight (or fetching alone), and the answer from the flight's outcome: the response
//! as it streams, the stored response a 304 refreshed, a stale one on an origin error. A
//! request that comes after a flight's body began waits for its end and reads the store.

use super::directives::Directives;
use super::flight::{self, Head, Outcome};
use super::lead::{lead, plan};
use super::lookup::{judge, selecting, Entry};
use super::mode::{state, Proxy};
use super::policy::{self, Use};
use super::serve::{answer_headers, client_not_modified, not_modified, serve, serve_stale, stale_on_error};
use crate::app::App;
use crate::reply::{text, text_owned, Body, Resp};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, IF_RANGE};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::trace::Step;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Starts a background revalidation of a stale response, unless one of its key is under way.
pub(super) fn revalidate_in_background(app: &Arc<App>, req: &Request<Incoming>, uri: &[u8], key: &[u8], e: &Entry) {
    let p = state().expect("read-through mode");
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
pub(super) enum Share {
    /// Lead or join the key's shared flight.
    Shared,
    /// Fetch alone: a request with credentials, a URI passed through, or one that could not use
    /// another's fetch (another variant, a response that may not be shared, a slow leader).
    Alone,
}

/// Fetches a response for a request that found nothing usable (`stale`: what it found).
pub(super) async fn fetch(
    app: &Arc<App>,
    req: Request<Incoming>,
    uri: Vec<u8>,
    key: Vec<u8>,
    stale: Option<Entry>,
    share: Share,
) -> Resp {
    let p = state().expect("read-through mode");
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
    // The origin's answer (the leader's task fetches it), or a member's wait for it.
    let wait = larder_engine::trace::span(if leader { Step::Origin } else { Step::Coalesced });
    let waited = if leader { Ok(outcome.await) } else { tokio::time::timeout(p.lock_timeout, outcome).await };
    drop(wait);
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
            let req_cc = Directives::of(req.headers());
            if let Some(found) = judge(app, store, &req, &uri, &key, &req_cc, false).await {
                // The response this request found stale, just validated, answers it whatever
                // its own bounds (max-age=0, no-cache); a request that found nothing uses it
                // only if it may use it as it is now.
                let e = found.e;
                let revalidated = stale.as_ref().is_some_and(|s| s.key == e.key && e.key == validated);
                if revalidated || found.usable == Use::Fresh {
                    p.counters.revalidated.fetch_add(1, Ordering::Relaxed);
                    return serve(app, store, e, &req, found.age_ms / 1000, "REVALIDATED").await;
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

/// After a flight this request could not join: waits for its end (at most the lock timeout),
/// then serves what it stored, or fetches alone.
pub(super) async fn after_flight(
    app: &Arc<App>,
    req: Request<Incoming>,
    uri: Vec<u8>,
    key: Vec<u8>,
    stale: Option<Entry>,
) -> Resp {
    let p = state().expect("read-through mode");
    let deadline = Instant::now() + p.lock_timeout;
    // Waiting on another request's fetch of the same key.
    let wait = larder_engine::trace::span(Step::Coalesced);
    while p.flights.busy(&key) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(wait);
    let store = app.store.get().expect("store is ready");
    let (req_cc, pragma) = (Directives::of(req.headers()), policy::pragma_no_cache(req.headers()));
    if let Some(found) = judge(app, store, &req, &uri, &key, &req_cc, pragma).await {
        if found.usable == Use::Fresh {
            p.counters.hits.fetch_add(1, Ordering::Relaxed);
            return serve(app, store, found.e, &req, found.age_ms / 1000, "HIT").await;
        }
    }
    fetch(app, req, uri, key, stale, Share::Alone).await
}

/// The answer to a flight member: the response as it streams, or a 304 / 206 of it.
pub(super) fn respond_from_flight(
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
