//! Where a request goes: the URI limit, key decoding, the bearer-token check, 405, read-only
//! mode, 503 while recovering, then the key handlers ([`api`]) or, under the reserved
//! `/_larder/` prefix, the admin endpoints ([`admin`]). [`handle`] is the entry point, and
//! times each request for the metrics, the access log and the slow-request warning.

use crate::admin;
use crate::api;
use crate::app::{App, Held};
use crate::headers;
use crate::key::{decode_key, RESERVED_PREFIX};
use crate::reply::{method_not_allowed, text, Resp};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use std::sync::Arc;
use std::time::Instant;

/// The methods a key takes, for the `Allow` header of a 405.
const ALLOWED: &str = "GET, HEAD, PUT, DELETE";

/// Handles one request, timing it for the slow-request warning and the access log.
/// `held` is the connection's count of held requests, given for a PUT and a GET (see [`Held`]).
pub async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
    held: Option<Held>,
) -> Result<Resp, std::convert::Infallible> {
    let started = Instant::now();
    let method = req.method().clone();
    // A Uri clone shares its bytes (no allocation); it is kept only for the logs below.
    let uri = req.uri().clone();
    let resp = route(&app, req, held).await;
    let elapsed = started.elapsed();
    if !uri.path().starts_with("/_larder/") {
        let body =
            if method == Method::HEAD { 0 } else { hyper::body::Body::size_hint(resp.body()).exact().unwrap_or(0) };
        app.metrics.request(&method, resp.status().as_u16(), elapsed, body);
    }
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

async fn route(app: &Arc<App>, req: Request<Incoming>, held: Option<Held>) -> Resp {
    let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len as u64 > app.settings.max_uri_size {
        return text(StatusCode::URI_TOO_LONG, "URI too long\n");
    }
    // Read-through mode: everything outside larder's admin namespace goes to the proxy.
    if app.proxy.is_some() && !req.uri().path().starts_with("/_larder/") {
        let mut req = req;
        if app.settings.auth_reads {
            if let Some(refused) = unauthorized(app, req.headers()) {
                return refused;
            }
            // larder's own token is not the origin's business (nor a reason not to store).
            req.headers_mut().remove(AUTHORIZATION);
        }
        return Box::pin(crate::proxy::handle(app, req)).await;
    }
    let key = match decode_key(req.uri().path()) {
        Ok(k) => k,
        Err(e) => return text(StatusCode::BAD_REQUEST, e.message()),
    };
    if key.starts_with(RESERVED_PREFIX) {
        let what = &key[RESERVED_PREFIX.len()..];
        // Health stays open so that load balancers need no secret.
        if what != b"health" {
            if let Some(refused) = unauthorized(app, req.headers()) {
                return refused;
            }
        }
        if what == b"purge" {
            if !matches!(*req.method(), Method::POST | Method::DELETE) {
                return method_not_allowed("POST, DELETE");
            }
            return Box::pin(crate::proxy::purge(app, req.uri().query())).await;
        }
        if what == b"faults" {
            return Box::pin(admin::faults(app, req)).await;
        }
        return Box::pin(admin::endpoint(app, req.method(), what)).await;
    }
    let write = match *req.method() {
        Method::GET | Method::HEAD => false,
        Method::PUT | Method::DELETE => true,
        _ => return method_not_allowed(ALLOWED),
    };
    if write || app.settings.auth_reads {
        if let Some(refused) = unauthorized(app, req.headers()) {
            return refused;
        }
    }
    if write && app.settings.read_only {
        return text(StatusCode::FORBIDDEN, "this server is read-only\n");
    }
    let Some(store) = app.store.get() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering; try again shortly\n");
    };
    match *req.method() {
        Method::GET => api::get(app, store, key, req.headers(), false, held.as_ref()).await,
        Method::HEAD => api::get(app, store, key, req.headers(), true, None).await,
        Method::PUT => {
            let key = key.into_owned();
            // Boxed, as are DELETE and the admin handlers: this future is moved whole for every
            // request, and PUT's (the body budget's wait, the body, the blocking write) would
            // make every GET's larger too (measured: ~240 instructions a GET, all memcpy, with
            // bench/instructions-ab.sh).
            Box::pin(api::put(app, req, key, held)).await
        }
        _ => {
            let preconditions = headers::write_preconditions(req.headers());
            Box::pin(api::delete(app, key.into_owned(), preconditions)).await
        }
    }
}

/// `None` if the request may go on: no token is configured, or it carries
/// `Authorization: Bearer <token>` with the right token (compared in constant time).
fn unauthorized(app: &App, headers: &HeaderMap) -> Option<Resp> {
    use subtle::ConstantTimeEq;
    let token = app.settings.auth_token.as_ref()?;
    let given = headers.get(AUTHORIZATION).map(|v| v.as_bytes());
    let bearer = given.and_then(|v| {
        let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
        scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
    });
    if bearer.is_some_and(|b| bool::from(b.ct_eq(&token.0))) {
        return None;
    }
    let (msg, challenge) = match given {
        None => ("this request needs Authorization: Bearer <token>\n", r#"Bearer realm="larder""#),
        Some(_) => ("wrong bearer token\n", r#"Bearer realm="larder", error="invalid_token""#),
    };
    let mut r = text(StatusCode::UNAUTHORIZED, msg);
    r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    Some(r)
}
