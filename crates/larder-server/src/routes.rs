//! Where a request goes: the URI limit, key decoding, 405, the request's identity and
//! permission put to the policy ([`crate::guard`]), 503 while recovering, then the key handlers ([`api`]), WebDAV ([`dav`]) or, under the reserved
//! `/_larder/` prefix, the admin endpoints ([`admin`]). [`handle`] is the entry point, and
//! times each request for the metrics, the access log and the slow-request warning.

use crate::admin;
use crate::api::{self, ReqBody};
use crate::app::{App, Held};
use crate::dav;
use crate::guard::{Door, Identity, Permission, Refusal, Session};
use crate::h1;
use crate::headers;
use crate::key::{decode_key, KeyError, RESERVED_PREFIX};
use crate::reply::{method_not_allowed, text, Body, Ended, Resp};
use crate::watch::slow::{shown, SlowTrace};
use crate::watch::Door as WatchDoor;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, PROXY_AUTHORIZATION, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use larder_engine::trace::{Instant, Step, Trace, Traced};
use std::sync::Arc;

/// Handles one request, timing it for the slow-request warning and the access log.
/// `held` is the connection's count of held requests, given for a PUT and a GET (see [`Held`]).
pub async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
    held: Option<Held>,
) -> Result<Resp, std::convert::Infallible> {
    let started = Instant::now();
    let mut trace = app.watch.slow.start(started);
    let method = req.method().clone();
    // A Uri clone shares its bytes (no allocation); it is kept only for the logs below.
    let uri = req.uri().clone();
    let mut resp = Traced::new(route(&app, req, held), &mut trace).await;
    finish(&app, &method, uri.path(), started, &mut resp, trace);
    Ok(resp)
}

/// A plain request of the key API, read by the server's own HTTP/1.1 connection
/// (`conn::native`), with its whole body: answered as [`handle`] answers it. `None` when it
/// is not the key API's after all (its path decodes into larder's admin namespace): the
/// connection then hands it to hyper.
pub async fn handle_plain(app: &Arc<App>, head: &h1::Head, body: Bytes, held: Option<Held>) -> Option<Resp> {
    let started = Instant::now();
    let mut resp = if head.target_len as u64 > app.settings.max_uri_size {
        text(StatusCode::URI_TOO_LONG, "URI too long\n")
    } else {
        match decode_key(&head.path) {
            Ok(key) if key.starts_with(RESERVED_PREFIX) => return None,
            Ok(key) => {
                let mut trace = app.watch.slow.start(started);
                let answer = key_api(app, &head.method, key, &head.headers, ReqBody::Whole(body), held);
                let mut resp = Traced::new(answer, &mut trace).await;
                finish(app, &head.method, &head.path, started, &mut resp, trace);
                return Some(resp);
            }
            Err(e) => text(StatusCode::BAD_REQUEST, e.message()),
        }
    };
    finish(app, &head.method, &head.path, started, &mut resp, None);
    Some(resp)
}

/// Counts an answered request in the metrics and the operator's window, and logs it if asked
/// to; a slow one keeps its trace. A traced answer that is streamed (a large value, an
/// origin's body) is judged when its last piece has been handed to the connection, its
/// sending a `send` span: a client that reads slowly, or pieces slow to read, show there.
fn finish(app: &Arc<App>, method: &Method, path: &str, started: Instant, resp: &mut Resp, trace: Option<Box<Trace>>) {
    let elapsed = started.elapsed();
    let status = resp.status().as_u16();
    let admin = path.starts_with("/_larder/");
    let door = if crate::proxy::state().is_some() { WatchDoor::Proxy } else { WatchDoor::Http };
    if !admin {
        let body =
            if *method == Method::HEAD { 0 } else { hyper::body::Body::size_hint(resp.body()).exact().unwrap_or(0) };
        app.metrics.request(method, status, elapsed, body);
        app.watch.http(door, method, status, elapsed);
    }
    if app.settings.access_log {
        let bytes = hyper::body::Body::size_hint(resp.body()).exact().unwrap_or(0);
        tracing::info!(target: "larder::access", %method, path, status, bytes, micros = elapsed.as_micros() as u64);
    }
    if admin {
        // The operator's own requests (the page polls every second) keep no trace: they
        // would push the traces of the requests being looked for out of the list.
        if app.watch.slow.is_slow(elapsed) {
            tracing::warn!(%method, path, status, millis = elapsed.as_millis() as u64, "slow admin request");
        }
        if let Some(t) = trace {
            t.recycle();
        }
        return;
    }
    if trace.is_some() && !matches!(resp.body(), Body::Full(_)) {
        let answered = Instant::now();
        let (app, method, path, mut trace) = (app.clone(), method.clone(), path.to_owned(), trace);
        let ended = Ended::new(move |sent| {
            let end = Instant::now();
            if let Some(t) = &mut trace {
                t.add(Step::Send, answered, end, sent);
            }
            keep_if_slow(&app, door, &method, &path, status, end.saturating_duration_since(started), trace);
        });
        let body = std::mem::replace(resp.body_mut(), Body::full(Bytes::new()));
        *resp.body_mut() = Body::Watched(Box::new(body), ended);
        return;
    }
    keep_if_slow(app, door, method, path, status, elapsed, trace);
}

/// Keeps the trace of a request that took `total`, if that is slow; gives the trace's memory back.
fn keep_if_slow(
    app: &App,
    door: WatchDoor,
    method: &Method,
    path: &str,
    status: u16,
    total: std::time::Duration,
    trace: Option<Box<Trace>>,
) {
    if app.watch.slow.is_slow(total) {
        let (spans, dropped) = trace.as_ref().map_or((Vec::new(), 0), |t| (t.spans(), t.dropped()));
        app.watch.slow.keep(SlowTrace {
            at_ms: larder_engine::now_ms(),
            door: crate::watch::DOORS[door as usize],
            method: method.to_string(),
            key: shown(path.as_bytes()),
            status: status.to_string(),
            total,
            spans,
            dropped,
        });
    }
    if let Some(t) = trace {
        t.recycle();
    }
}

async fn route(app: &Arc<App>, req: Request<Incoming>, held: Option<Held>) -> Resp {
    let uri_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri_len as u64 > app.settings.max_uri_size {
        return text(StatusCode::URI_TOO_LONG, "URI too long\n");
    }
    // Read-through mode: everything outside larder's admin namespace goes to the proxy.
    if crate::proxy::state().is_some() && !req.uri().path().starts_with("/_larder/") {
        let mut req = req;
        // Safe methods read; any other is forwarded, and its success invalidates stored
        // responses: a write to the cache.
        let what = match *req.method() {
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE => Permission::Read,
            _ => Permission::Forward,
        };
        let who = proxy_identity(app, req.headers());
        if let Err(r) = app.policy.admit(Door::Proxy, Session::PerRequest, who, what) {
            return refused(r);
        }
        // larder's own credential is not the origin's business (nor a reason not to store);
        // any other is the origin's.
        req.headers_mut().remove(PROXY_AUTHORIZATION);
        let larders = app.policy.needs_credentials()
            && bearer_of(req.headers().get(AUTHORIZATION))
                .is_some_and(|b| app.policy.identify(Some(b)) == Identity::Token);
        if larders {
            req.headers_mut().remove(AUTHORIZATION);
        }
        let path = req.uri().path().as_bytes().to_vec();
        let r = Box::pin(crate::proxy::handle(app, req)).await;
        if what == Permission::Read {
            let served =
                (r.status() == StatusCode::OK).then(|| hyper::body::Body::size_hint(r.body()).upper().unwrap_or(0));
            app.watch.read(WatchDoor::Proxy, &path, served);
        }
        return r;
    }
    let uri = req.uri().clone();
    let key = match decode_key(uri.path()) {
        Ok(k) => k,
        // The root is no key, but WebDAV's clients ask about it as a collection.
        Err(KeyError::Empty) if dav::is_dav(req.method()) => std::borrow::Cow::Borrowed(&b""[..]),
        Err(e) => return text(StatusCode::BAD_REQUEST, e.message()),
    };
    if key.starts_with(RESERVED_PREFIX) {
        let what = &key[RESERVED_PREFIX.len()..];
        // Health stays open so that load balancers need no secret.
        let permission = match what {
            // The status page's own files: no figures in them (it asks for the token, if
            // one is set, before it reads any).
            b"health" => Permission::Health,
            _ if admin::page::is_asset(what) => Permission::Health,
            b"purge" => Permission::Purge,
            b"flush" => Permission::Flush,
            b"slow" if *req.method() == Method::POST => Permission::Tune,
            _ => Permission::Admin,
        };
        if let Err(r) = admit(app, Door::Admin, req.headers(), permission) {
            return refused(r);
        }
        if what == b"purge" {
            if !matches!(*req.method(), Method::POST | Method::DELETE) {
                return method_not_allowed("POST, DELETE");
            }
            return Box::pin(crate::proxy::purge(app, req.uri().query())).await;
        }
        if what == b"flush" {
            return Box::pin(admin::flush(app, req.method(), req.uri().query())).await;
        }
        if what == b"faults" {
            return Box::pin(admin::faults(app, req)).await;
        }
        return Box::pin(admin::endpoint(app, req.method(), what, req.uri().query())).await;
    }
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::PUT | Method::PATCH | Method::DELETE) {
        let (parts, body) = req.into_parts();
        return key_api(app, &parts.method, key, &parts.headers, ReqBody::Hyper(body), held).await;
    }
    let Some(what) = dav::permission(&req, &key) else {
        return method_not_allowed(dav::ALLOWED);
    };
    if let Err(r) = admit(app, Door::Http, req.headers(), what) {
        return refused(r);
    }
    let Some(store) = app.store.get() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering; try again shortly\n");
    };
    let key = key.into_owned();
    Box::pin(dav::handle(app, store, &key, req, held)).await
}

/// The key API's methods (GET, HEAD, PUT, PATCH, DELETE) on `key`, whichever connection read
/// the request: its permission put to the policy, 503 while recovering, then the handler.
async fn key_api(
    app: &Arc<App>,
    method: &Method,
    key: std::borrow::Cow<'_, [u8]>,
    headers: &HeaderMap,
    body: ReqBody,
    held: Option<Held>,
) -> Resp {
    let what = match *method {
        Method::GET | Method::HEAD => Permission::Read,
        Method::DELETE => Permission::Delete,
        _ => Permission::Write,
    };
    if let Err(r) = admit(app, Door::Http, headers, what) {
        return refused(r);
    }
    let Some(store) = app.store.get() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "recovering; try again shortly\n");
    };
    match *method {
        Method::GET | Method::HEAD => {
            let head = *method == Method::HEAD;
            let r = api::get(app, store, &key, headers, head, if head { None } else { held.as_ref() }).await;
            // What a hit served, for the largest values (a HEAD serves none).
            let served = matches!(r.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT)
                .then(|| hyper::body::Body::size_hint(r.body()).upper().unwrap_or(0))
                .filter(|_| !head);
            let door = if crate::proxy::state().is_some() { WatchDoor::Proxy } else { WatchDoor::Http };
            app.watch.read(door, &key, served);
            r
        }
        // Boxed, as are PATCH and DELETE: this future is moved whole for every request, and
        // PUT's (the body budget's wait, the body, the blocking write) would make every GET's
        // larger too (measured: ~240 instructions a GET, all memcpy, with
        // bench/instructions-ab.sh).
        Method::PUT => Box::pin(api::put(app, headers, body, key.into_owned(), held)).await,
        Method::PATCH => Box::pin(api::touch(app, headers, key.into_owned())).await,
        _ => {
            let preconditions = headers::write_preconditions(headers);
            Box::pin(api::delete(app, key.into_owned(), preconditions)).await
        }
    }
}

/// HTTP's credential (`Authorization: Bearer <token>`) mapped onto an identity, and the
/// policy asked.
fn admit(app: &App, door: Door, headers: &HeaderMap, what: Permission) -> Result<Identity, Refusal> {
    let given = headers.get(AUTHORIZATION).map(|v| {
        // A credential in another scheme, or none in this one, is a wrong credential.
        bearer_of(Some(v)).unwrap_or(b"\0")
    });
    let who = app.policy.identify(given);
    app.policy.admit(door, Session::PerRequest, who, what).map(|()| who)
}

/// The token of a `Bearer` credential.
fn bearer_of(v: Option<&HeaderValue>) -> Option<&[u8]> {
    let v = v?.as_bytes();
    let at = v.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = v.split_at(at);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
}

/// The identity of a request to the read-through proxy. `Authorization` may be the origin's
/// credential, so larder's is taken from `Proxy-Authorization: Bearer <token>` (what a
/// gateway's own credential is for), else from `Authorization` only when it is larder's
/// token; any other `Authorization` is the origin's and leaves the request anonymous.
fn proxy_identity(app: &App, headers: &HeaderMap) -> Identity {
    if let Some(v) = headers.get(PROXY_AUTHORIZATION) {
        return app.policy.identify(Some(bearer_of(Some(v)).unwrap_or(b"\0")));
    }
    match bearer_of(headers.get(AUTHORIZATION)).map(|b| app.policy.identify(Some(b))) {
        Some(Identity::Token) => Identity::Token,
        _ => Identity::Anonymous,
    }
}

/// A refusal in HTTP: 401 with a challenge, or 403 for read-only.
fn refused(refusal: Refusal) -> Resp {
    let (msg, challenge) = match refusal {
        Refusal::ReadOnly => return text(StatusCode::FORBIDDEN, "this server is read-only\n"),
        Refusal::Unauthenticated => {
            ("this request needs Authorization: Bearer <token> (or Proxy-Authorization through the read-through proxy)\n", r#"Bearer realm="larder""#)
        }
        Refusal::BadCredential => ("wrong bearer token\n", r#"Bearer realm="larder", error="invalid_token""#),
    };
    let mut r = text(StatusCode::UNAUTHORIZED, msg);
    r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    r
}
