//! A flight's leader, a task of its own: sends the origin request, refreshes the stored
//! response on a 304, or delivers a full response: decides whether and where it is stored,
//! tells the members, and streams the body to them and into the store ([`Sink`]). Only a
//! complete body, of a fetch no invalidation overtook, is stored. What it sends is a
//! request's [`Plan`].

use super::directives::{Delta, Directives, MAX_DELTA};
use super::flight::{self, end_members, send_to_members, Head, Outcome, MEMBER_STALL};
use super::invalidate::delete;
use super::lookup::{marker, selecting, variant_key, vary_names, Entry};
use super::mode::{state, Proxy, PASS_FOR_MS, X_CACHE};
use super::origin::{self, OriginError};
use super::policy::{self, Times};
use super::serve::if_range_holds;
use super::stored::{Kind, Stored};
use crate::app::App;
use crate::storeio;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, AGE, AUTHORIZATION, CONTENT_LENGTH, ETAG, IF_MODIFIED_SINCE, IF_NONE_MATCH,
    LAST_MODIFIED,
};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::{now_ms, Expiry, PutOptions, Touch};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a flight's leader sends and stores.
pub(super) struct Plan {
    pub(super) uri: Vec<u8>,
    pub(super) key: Vec<u8>,
    pub(super) target: String,
    /// The leader's request fields (end-to-end, larder's `Via` added, conditionals removed).
    pub(super) headers: HeaderMap,
    /// The leader request's own fields, for `Vary` and storability.
    pub(super) client: HeaderMap,
    /// The stored response being revalidated: its key, store time and description.
    pub(super) validating: Option<(Vec<u8>, u64, Stored)>,
}

pub(super) fn plan(req: &Request<Incoming>, uri: Vec<u8>, key: Vec<u8>, stale: Option<&Entry>) -> Plan {
    let mut headers = origin::fetch_headers(req.headers());
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

/// How long a stored response that has validators is kept after it goes stale, for
/// revalidation, unless the ring evicts it first.
const KEEP_FOR_REVALIDATION_SECS: u64 = 7 * 86_400;

/// The engine expiry of a stored response: when it can serve no request any more. One with
/// validators is kept a while longer for revalidation (the ring may evict it sooner).
pub(super) fn keep_until(stored: &Stored, cc: &Directives, default_sie: u64) -> Expiry {
    let lifetime = policy::freshness_lifetime(stored.status, &stored.headers, cc, stored.times);
    let age_at_response = policy::current_age(&stored.headers, stored.times, stored.times.response_ms);
    let secs = |d: Option<Delta>| match d {
        Some(Delta::Secs(s)) => s,
        _ => 0,
    };
    let mut grace = secs(cc.stale_while_revalidate).max(secs(cc.stale_if_error)).max(default_sie);
    if stored.headers.contains_key(ETAG) || stored.headers.contains_key(LAST_MODIFIED) {
        grace = grace.max(KEEP_FOR_REVALIDATION_SECS);
    }
    let left = lifetime.saturating_sub(age_at_response).saturating_add(grace);
    Expiry::At(stored.times.response_ms.saturating_add(left.min(MAX_DELTA * 50).saturating_mul(1000)))
}

/// Adds the `Date` a response came without: the time it was received (RFC 9110 §6.6.1), so
/// that its age is counted from then wherever it is stored or sent.
pub(super) fn with_date(h: &mut HeaderMap, received_ms: u64) {
    if !h.contains_key(hyper::header::DATE) {
        let t = std::time::UNIX_EPOCH + Duration::from_millis(received_ms);
        h.insert(hyper::header::DATE, HeaderValue::try_from(httpdate::fmt_http_date(t)).expect("ASCII"));
    }
}

/// Fields of a response that are stored and sent on: end-to-end, minus what the cache must not
/// reuse (`no-cache="…"`, `private="…"` fields) and what it computes itself.
pub(super) fn storable_headers(resp: &HeaderMap, cc: &Directives) -> HeaderMap {
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
pub(super) async fn lead(app: Arc<App>, flight: Arc<flight::Flight>, mut plan: Plan, registered: bool) {
    let p = state().expect("read-through mode");
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
pub(super) async fn refresh(
    app: &Arc<App>,
    key: &[u8],
    stored_ms: u64,
    mut old: Stored,
    h: &HeaderMap,
    times: Times,
) -> bool {
    // The validation asked about this stored response alone (its own validators, none of the
    // client's: `fetch::plan`), so the 304 selects it (§4.3.4), whatever ETag it now carries:
    // that is the representation's tag from now on. Fetching again instead would be a second
    // request the client did not make.
    let mut fresh = origin::end_to_end(h);
    with_date(&mut fresh, times.response_ms);
    // Every field replaces the stored one (§3.2) but Content-Length, which describes the
    // stored body: the 304 has none.
    for name in fresh.keys() {
        if *name == CONTENT_LENGTH || *name == X_CACHE {
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
    let p = state().expect("read-through mode");
    let expiry = keep_until(&old, &cc, p.stale_if_error);
    let Some(attrs) = old.encode() else { return false };
    let key = key.to_vec();
    let done = storeio::blocking(app, move |s| {
        s.update(&key, &Touch { expiry, attrs: Some(Some(&attrs)), stored_at: Some(stored_ms) })
    })
    .await;
    matches!(done, Ok(Some(_)))
}

/// Hands a full response to the flight's members and, if it may be stored, to the store.
pub(super) async fn deliver(
    app: &Arc<App>,
    flight: &flight::Flight,
    plan: &Plan,
    resp: Response<Incoming>,
    times: Times,
    epoch: u64,
    registered: bool,
) {
    let p = state().expect("read-through mode");
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
        (Some(_), false) => {
            marker(app, &plan.key, &plan.uri, &names).await.map(|ms| variant_key(&plan.uri, ms, &selecting_values))
        }
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
    let patience = MEMBER_STALL.min(p.origin.read_timeout);
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
                    send_to_members(&mut live, prev, patience).await;
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
    let stored_key = sink.key().map(<[u8]>::to_vec);
    match sink.finish(app, complete).await {
        // An invalidation that came while the write finished may have deleted before it: what
        // was written goes too.
        Ok(true) if p.flights.invalidated_since(&plan.key, epoch) => {
            if let Some(k) = stored_key {
                delete(app, store, k).await;
            }
        }
        Ok(true) => {
            p.counters.stored.fetch_add(1, Ordering::Relaxed);
            p.pass_until.remove(&plan.key);
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "a response could not be stored"),
    }
    if let Some(last) = held {
        send_to_members(&mut live, last, patience).await;
    }
    end_members(&live, patience).await;
}

/// Where a response's body goes in the store while it streams; only a complete body is stored.
pub(super) enum Sink {
    /// Not stored.
    None,
    /// A body of known length within a chunk: its pieces kept (shared with the members, not
    /// copied) and stored in one write at the end, inline when the write need not wait.
    Gather { key: Vec<u8>, attrs: Vec<u8>, expiry: Expiry, parts: Vec<Bytes> },
    /// Anything longer, or of unknown length: a writer on the blocking pool fed piece by
    /// piece, holding about a chunk of it.
    Stream {
        key: Vec<u8>,
        tx: tokio::sync::mpsc::Sender<Option<Bytes>>,
        task: tokio::task::JoinHandle<larder_engine::Result<bool>>,
    },
}

impl Sink {
    fn stream(app: &Arc<App>, key: Vec<u8>, attrs: Vec<u8>, expiry: Expiry) -> Sink {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Option<Bytes>>(2);
        let app = app.clone();
        let k = key.clone();
        let task = tokio::task::spawn_blocking(move || -> larder_engine::Result<bool> {
            let store = app.store.get().expect("store is ready");
            let opts = PutOptions { expiry, attrs: Some(&attrs), ..PutOptions::default() };
            let mut w = store.writer(&k, &opts)?;
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
        Sink::Stream { key, tx, task }
    }

    /// The key the body is stored under, if it is.
    fn key(&self) -> Option<&[u8]> {
        match self {
            Sink::None => None,
            Sink::Gather { key, .. } | Sink::Stream { key, .. } => Some(key),
        }
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
                    Err(e) if e.kind() == larder_engine::ErrorKind::WouldBlock => storeio::blocking(app, move |s| {
                        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                        let opts = PutOptions { expiry, attrs: Some(&attrs), ..PutOptions::default() };
                        s.put_parts(&key, &slices, &opts)
                    })
                    .await
                    .map(|_| true),
                    done => done.map(|_| true),
                }
            }
            Sink::Stream { tx, task, .. } => {
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
