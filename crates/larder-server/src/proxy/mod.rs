//! Read-through mode (`--origin`): the HTTP listener is a shared HTTP cache in front of one
//! origin, following RFC 9111 (docs/HTTP-CACHING.md says how, rule by rule). This file is the
//! mode's face: the entry point that decides, for each GET or HEAD, between a stored response
//! and a fetch, and the metrics; the mechanisms live one per file:
//!
//! - [`mode`]: the mode's state (the origin, the flights, hit-for-pass, the counters).
//! - [`lookup`]: cache keys, how a request finds the stored response it selects (the vary
//!   marker at the URI's key, a key per variant, selecting values as the origin saw them),
//!   and whether it may use it now ([`lookup::judge`]).
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
mod mode;
pub mod origin;
mod pass;
pub mod policy;
mod serve;
pub mod stored;

pub use invalidate::purge;
pub use mode::{start, state, Counters};

use crate::app::App;
use crate::reply::{text, Resp};
use directives::Directives;
use fetch::{fetch, revalidate_in_background, Share};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, IF_MATCH, IF_UNMODIFIED_SINCE};
use hyper::{Method, Request, StatusCode};
use larder_engine::now_ms;
use lookup::{cache_key, judge, Found};
use mode::effective_uri;
use pass::pass;
use policy::Use;
use serve::serve;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    // §3.5: a response to a request with Authorization only if the response allows it.
    let found = judge(app, store, &req, &uri, &key, &req_cc, pragma)
        .await
        .filter(|f| !h.contains_key(AUTHORIZATION) || f.cc.public || f.cc.must_revalidate || f.cc.s_maxage.is_some());
    if let Some(Found { e, age_ms, usable, .. }) = found {
        let age = age_ms / 1000;
        match usable {
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
