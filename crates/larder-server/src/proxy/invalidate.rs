//! Invalidation: a non-error answer to an unsafe method (RFC 9111 §4.4) and a purge
//! (`/_larder/purge`) delete what is stored for a URI (its response, or its vary marker, which
//! orphans every variant) and mark the URI invalidated in the flight table, so that no fetch
//! of it already under way stores what it fetched from before.

use super::lookup::cache_key;
use super::mode::{effective_uri, state, Proxy};
use super::pass::pass;
use crate::app::App;
use crate::reply::{text, Resp};
use crate::storeio;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LOCATION, LOCATION};
use hyper::{Method, Request, StatusCode};
use larder_engine::Store;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Methods other than GET and HEAD: forwarded; a non-error answer invalidates what is stored
/// for the URI and for `Location` / `Content-Location` on the same host (RFC 9111 §4.4).
pub(super) async fn unsafe_method(app: &Arc<App>, p: &Proxy, req: Request<Incoming>) -> Resp {
    let safe = matches!(*req.method(), Method::OPTIONS | Method::TRACE);
    let Some(uri) = effective_uri(&req, &p.origin) else {
        return text(StatusCode::BAD_REQUEST, "the Host header is not a valid host[:port]\n");
    };
    let host_len = uri.iter().position(|&b| b == b'/').unwrap_or(uri.len());
    let host = uri[..host_len].to_vec();
    let r = pass(app, p, req).await;
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
            if forget(app, p, store, cache_key(&u)).await.0 {
                p.counters.invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    r
}

/// Forgets what the cache knows of the URI whose cache key is `key`: its hit-for-pass, any
/// fetch of it under way (which may have fetched what came before, so it is not stored; see
/// [`super::flight::Flights::invalidate`]) and what is stored. Whether something stored was
/// deleted, and whether a shared fetch was under way.
async fn forget(app: &Arc<App>, p: &Proxy, store: &Store, key: Vec<u8>) -> (bool, bool) {
    p.pass_until.remove(&key);
    let fetching = p.flights.busy(&key);
    // Before the delete: a fetch that stores in between is caught by the check after its write.
    p.flights.invalidate(&key);
    (delete(app, store, key).await, fetching)
}

/// `reference` resolved on a request to `host`, if it names the same host.
pub(super) fn same_host(host: &[u8], reference: &str) -> Option<Vec<u8>> {
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
pub(super) async fn delete(app: &Arc<App>, store: &Store, key: Vec<u8>) -> bool {
    let quick = store.delete(&key, &larder_engine::DeleteOptions { nonblocking: true, ..Default::default() });
    match quick {
        Err(e) if e.kind() == larder_engine::ErrorKind::WouldBlock => {
            storeio::blocking(app, move |s| s.delete(&key, &larder_engine::DeleteOptions::default()))
                .await
                .unwrap_or(false)
        }
        done => done.unwrap_or(false),
    }
}

/// `/_larder/purge?uri=HOST/PATH`: drops the stored response of a URI (all its variants), and
/// keeps a fetch of it under way from storing what it fetched.
pub async fn purge(app: &Arc<App>, query: Option<&str>) -> Resp {
    let Some(p) = state() else {
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
    match forget(app, p, store, cache_key(&uri_l)).await {
        (false, false) => text(StatusCode::NOT_FOUND, "not in the cache\n"),
        (deleted, _) => {
            p.counters.purges.fetch_add(1, Ordering::Relaxed);
            text(StatusCode::OK, if deleted { "purged\n" } else { "purged: the fetch under way will not be stored\n" })
        }
    }
}
