//! A connection served by hyper: every request the server's own HTTP/1.1 loop
//! ([`super::native`]) does not take (WebDAV, the admin endpoints, the read-through proxy,
//! chunked or large bodies, `Expect`, HTTP/1.0, anything malformed), and every one after it
//! on that connection.

use super::activity::{coarse_ms, AnswerBody, Link, Tracked, Watchdog, QUIET_BEFORE_CLOSE_MS};
use crate::app::Held;
use crate::routes::handle;
use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpStream;

/// Serves one connection with hyper until the client closes it, an error, a timeout of the
/// watchdog, a newcomer that needs its room, or the drain of a stop. `prefix`: what was read
/// of it already (by `native`, which handed it over), to be parsed first.
pub(super) async fn serve(link: Link, stream: TcpStream, prefix: Bytes) {
    let Link { app, mut shutdown, activity, close, registered: _registered } = link;
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone(), prefix });
    let s = &app.settings;
    let mut watchdog = Watchdog::new(s.idle_timeout, s.header_timeout);
    let max_header = (s.max_header_size as usize).max(64);
    let seen = activity.clone();
    let policy_app = app.clone();
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        seen.started.fetch_add(1, Ordering::Relaxed);
        // What the server can hold up (see `Activity::held`) is marked; other requests pay
        // nothing for it: a PUT or PROPFIND may wait for room for its body, a GET for room for
        // a large value's pieces.
        let held = (matches!(*req.method(), hyper::Method::PUT | hyper::Method::GET) || req.method() == "PROPFIND")
            .then(|| Held(seen.held.clone()));
        let (app, seen) = (app.clone(), seen.clone());
        async move {
            let mut resp = handle(app.clone(), req, held).await?;
            if app.stopping() {
                // hyper closes the connection once this answer is written.
                resp.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(resp.map(|inner| AnswerBody { inner, activity: seen }))
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_header_size(max_header)
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(watchdog.period());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drain_tick = tokio::time::interval(Duration::from_millis(50));
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut draining, mut closing) = (false, false);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            // Requests in flight, and any that arrive meanwhile, are answered with
            // `Connection: close`; the watchdog keeps running so a stalled client cannot hold
            // the shutdown up past its timeouts.
            _ = shutdown.changed(), if !draining => draining = true,
            _ = drain_tick.tick(), if draining && !closing => {
                // A client still sending gets its next request answered (with `Connection:
                // close`) instead of finding the connection closed under a request it just sent
                // (which hyper-util's `GracefulShutdown` would do: see `lifecycle::run`).
                let quiet = coarse_ms().saturating_sub(activity.moved_at.load(Ordering::Relaxed)) >= QUIET_BEFORE_CLOSE_MS;
                if quiet && activity.between_requests() {
                    closing = true;
                    conn.as_mut().graceful_shutdown(); // between requests: hyper closes at once
                }
            }
            _ = tick.tick() => {
                if let Some(head) = watchdog.expired(&activity) {
                    if head {
                        policy_app.policy.late(crate::guard::Door::Http, crate::guard::Unit::Head);
                    }
                    return; // dropping the connection closes it
                }
            }
            _ = close.notified() => return, // room for a new connection
        }
    }
}
