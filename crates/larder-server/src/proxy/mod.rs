//! Read-through mode (`--origin`): the HTTP listener is a shared HTTP cache in front of one
//! origin, following RFC 9111 (docs/HTTP-CACHING.md says how, rule by rule). This file holds
//! the mode's state and the entry point that decides, for each GET or HEAD, between a stored
//! response and a fetch; the mechanisms live one per file:
//!
//! - [`lookup`]: cache keys, and how a request finds the stored response it selects (the vary
//!   marker at the URI's key, a key per variant, selecting values as the origin saw them).
//! - [`serve`]: answering from a stored response (304s, ranges, stale on an origin error).
//! - [`fetch`]: a request's side of an origin fetch: leading or joining the key's
//!   [`flight::Flight`] (one origin request per cache key), and its answer from the flight.
//! - [`lead`]: a flight's leader: the origin request, 304 refreshes, storing the response while
//!   it streams to the members ([`flight`] holds the table and the delivery to members).
//! - [`pass`]: requests forwarded as they are; [`invalidate`]: unsafe methods, purge, and the
//!   invalidation of what is stored and of fetches under way.
//! - [`policy`]: RFC 9111's rules as pure functions ([`directives`] parses `Cache-Control`);
//!   [`stored`]: the stored description's format; [`origin`]: the connection to the origin and
//!   which fields cross the proxy.

mod directives;
mod fetch;
pub mod flight;
mod invalidate;
mod lead;
mod lookup;
pub mod origin;
mod pass;
pub mod policy;
mod serve;
pub mod stored;

pub use invalidate::purge;

use crate::app::App;
use crate::reply::{text, Resp};
use directives::Directives;
use fetch::{fetch, revalidate_in_background, Share};
use flight::Flights;
use hyper::body::Incoming;
use hyper::header::{HeaderName, AUTHORIZATION, HOST, IF_MATCH, IF_UNMODIFIED_SINCE};
use hyper::{Method, Request, StatusCode};
use larder_engine::{now_ms, Part};
use lookup::{cache_key, lookup};
use origin::Origin;
use pass::pass;
use policy::Use;
use serve::serve;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// How long a URI whose response could not be stored is passed straight through, without its
/// requests waiting on one another (Varnish's hit-for-pass).
const PASS_FOR_MS: u64 = 30_000;

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

/// The read-through mode's state, process-wide: set once at start when `--origin` is given.
static STATE: std::sync::OnceLock<Proxy> = std::sync::OnceLock::new();

/// Turns read-through mode on for the settings' origin, if they name one.
pub fn start(s: &crate::config::Settings) -> Result<(), String> {
    if let Some(p) = Proxy::new(s)? {
        let _ = STATE.set(p);
    }
    Ok(())
}

/// The read-through mode's state, when it is on.
pub fn state() -> Option<&'static Proxy> {
    STATE.get()
}

impl Proxy {
    /// The proxy for the settings' origin.
    fn new(s: &crate::config::Settings) -> Result<Option<Proxy>, String> {
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
pub(crate) fn effective_uri(req: &Request<Incoming>, origin: &Origin) -> Option<Vec<u8>> {
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

/// Handles a request in read-through mode.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Resp {
    let p = state().expect("read-through mode");
    let method = req.method().clone();
    if method != Method::GET && method != Method::HEAD {
        return invalidate::unsafe_method(app, p, req).await;
    }
    let Some(store) = app.store.get() else {
        // While the store recovers, requests go straight to the origin.
        return pass(app, p, req).await;
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
        return pass(app, p, req).await;
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
        return pass(app, p, req).await;
    }
    fetch(app, req, uri, key, None, Share::Shared).await
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
