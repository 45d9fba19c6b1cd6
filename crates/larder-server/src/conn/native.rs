//! The server's own HTTP/1.1 loop on the runtime, for the key API's plain requests (GET, HEAD,
//! DELETE, and PUT that fits with its head in `h1::MAX_WITH_BODY`, and came with it), where a
//! connection goes when [`super::reactor`] meets an answer that must wait: one read takes in
//! as many pipelined requests as arrived, each is answered as soon as it is parsed, and all
//! their answers go out in one write.
//!
//! It answers what hyper would, byte for byte (`tests/http_diff.rs`), by taking only what
//! `h1::parse` is sure of: at the first request it is not (WebDAV, admin, chunked or large
//! bodies, `Expect`, HTTP/1.0, a malformed head…) the connection is handed to hyper with
//! every byte not yet answered, and hyper serves it from there on. The timeouts, the room for
//! newcomers and the graceful stop are the same as under hyper ([`super::activity`]).

use super::activity::{coarse_ms, Activity, Link, Watchdog, QUIET_BEFORE_CLOSE_MS};
use super::out::{self, Out, MAX_SLICES};
use super::via_hyper;
use crate::app::{App, Held};
use crate::guard::{Door, Unit};
use crate::h1::{self, Framing, Parsed};
use crate::reply::Resp;
use crate::routes::handle_plain;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::Method;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Interval, MissedTickBehavior};

/// Room kept free in the read buffer before each read.
pub(super) const READ_SIZE: usize = 16 * 1024;

/// What ends a connection's wait early: the watchdog, on its tick. (A newcomer's claim on the
/// connection's room is heard only between requests: only an idle connection is claimed.)
struct Guard {
    app: Arc<App>,
    activity: Arc<Activity>,
    watchdog: Watchdog,
    tick: Interval,
}

impl Guard {
    /// Whether the watchdog says to close now (a request head that missed its deadline is the
    /// policy's to count, as under hyper).
    fn expired(&mut self) -> bool {
        match self.watchdog.expired(&self.activity) {
            Some(head) => {
                if head {
                    self.app.policy.late(Door::Http, Unit::Head);
                }
                true
            }
            None => false,
        }
    }

    /// `fut`'s output, unless the connection must close first. Most answers are ready at
    /// once, and pay for no timer.
    async fn run<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        let mut fut = std::pin::pin!(fut);
        if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
            return Some(v);
        }
        loop {
            tokio::select! {
                biased;
                v = &mut fut => return Some(v),
                _ = self.tick.tick() => if self.expired() { return None },
            }
        }
    }
}

/// How the loop ended.
enum End {
    Closed,
    /// The first request not taken, and what follows, go to hyper.
    Handover(TcpStream, Out, BytesMut),
}

/// An answer begun elsewhere (by [`super::reactor`]) that this loop finishes: the request's
/// method, whether it asked to close, the bytes it takes at the front of the buffer, and the
/// answer, which may still be on its way.
pub(super) struct Pending {
    pub(super) method: Method,
    pub(super) close: bool,
    pub(super) whole: usize,
    pub(super) answer: Pin<Box<dyn Future<Output = Option<Resp>> + Send>>,
}

/// Serves a connection from where [`super::reactor`] left it (`buf` read and not yet
/// answered, `out` answered and not yet written, perhaps an answer under way) until it closes,
/// or hands it to hyper. (The loop's waits are dropped before hyper takes over: a newcomer's
/// claim on the connection must reach hyper's.)
pub(super) async fn resume(link: Link, stream: TcpStream, buf: BytesMut, out: Out, pending: Option<Pending>) {
    let s = &link.app.settings;
    let watchdog = Watchdog::new(s.idle_timeout, s.header_timeout);
    let mut tick = tokio::time::interval(watchdog.period());
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut guard = Guard { app: link.app.clone(), activity: link.activity.clone(), watchdog, tick };
    if let End::Handover(stream, out, buf) = run(&link, stream, &mut guard, buf, out, pending).await {
        handover(link, stream, &mut guard, out, buf).await;
    }
}

/// The loop itself.
async fn run(
    link: &Link,
    mut stream: TcpStream,
    guard: &mut Guard,
    mut buf: BytesMut,
    mut out: Out,
    pending: Option<Pending>,
) -> End {
    let app = &link.app;
    let activity = &link.activity;
    let mut shutdown = link.shutdown.clone();
    let max_head = (app.settings.max_header_size as usize).max(64);
    let mut drain_tick = tokio::time::interval(Duration::from_millis(50));
    drain_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut draining = *shutdown.borrow();
    // Made once and polled at each wait, rather than made anew for every request.
    let mut claimed = std::pin::pin!(link.close.notified());
    let mut stopping = std::pin::pin!(shutdown.changed());
    // How much of the buffer was parsed and found no whole head: a head that trickles in is
    // parsed again only once a blank line may have come (as hyper does).
    let mut scanned = 0;
    if let Some(p) = pending {
        let Pending { method, close, whole, mut answer } = p;
        match respond(app, &mut stream, guard, &mut out, &mut buf, &method, close, whole, answer.as_mut()).await {
            Then::Next => {}
            Then::Close => return End::Closed,
            Then::Handover => return End::Handover(stream, out, buf),
        }
    }
    loop {
        // Every whole request in the buffer, answered in order.
        loop {
            if scanned > 0 && buf.len() < max_head && !h1::head_ends(&buf, scanned) {
                scanned = buf.len();
                break;
            }
            let head = match h1::parse(&buf, max_head) {
                Parsed::Partial => {
                    scanned = buf.len();
                    break;
                }
                Parsed::Other => return End::Handover(stream, out, buf),
                Parsed::Request(head) => head,
            };
            // A body is taken only whole and no longer than a chunk (the store's, once open):
            // a longer one is streamed, by hyper.
            let max_body = app.store.get().map_or(0, |st| st.config().chunk_size as usize);
            if head.body > max_body {
                return End::Handover(stream, out, buf);
            }
            let whole = head.len + head.body;
            if buf.len() < whole {
                // The rest of the body may already be waiting; if not, hyper, which keeps the
                // body's minimum rate, takes the request.
                if read_now(&mut stream, &mut buf, activity) == Some(0) || buf.len() < whole {
                    return End::Handover(stream, out, buf);
                }
            }
            activity.started.fetch_add(1, Ordering::Relaxed);
            let body = Bytes::copy_from_slice(&buf[head.len..whole]);
            let held = matches!(head.method, Method::GET | Method::PUT).then(|| Held(activity.held.clone()));
            let answering = std::pin::pin!(handle_plain(app, &head, body, held));
            match respond(app, &mut stream, guard, &mut out, &mut buf, &head.method, head.close, whole, answering).await
            {
                Then::Next => scanned = 0,
                Then::Close => return End::Closed,
                Then::Handover => return End::Handover(stream, out, buf),
            }
        }
        if !out.is_empty() && !flush(&mut stream, guard, &mut out).await {
            return End::Closed;
        }
        // Wait for more of the next request. (A read that fills less than the buffer marks
        // the socket drained, so the next wait costs no read that would only say so.)
        if buf.capacity() - buf.len() < READ_SIZE / 4 {
            buf.reserve(READ_SIZE);
        }
        loop {
            tokio::select! {
                biased;
                r = stream.read_buf(&mut buf) => match r {
                    Ok(n) if n > 0 => {
                        activity.read.fetch_add(n as u64, Ordering::Relaxed);
                        activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
                        break;
                    }
                    _ => return End::Closed, // the client closed, or the read failed
                },
                _ = &mut claimed => return End::Closed, // room for a new connection
                _ = &mut stopping, if !draining => draining = true,
                _ = drain_tick.tick(), if draining => {
                    // Between requests and quiet for a while: close (a client still sending
                    // gets its next request answered, with `Connection: close`).
                    let quiet = coarse_ms().saturating_sub(activity.moved_at.load(Ordering::Relaxed)) >= QUIET_BEFORE_CLOSE_MS;
                    if quiet && activity.between_requests() && buf.is_empty() {
                        return End::Closed;
                    }
                }
                _ = guard.tick.tick() => if guard.expired() { return End::Closed },
            }
        }
    }
}

/// Reads what the socket holds now: `Some(n)` bytes (0: closed or failed), or `None` if
/// nothing is there yet.
fn read_now(stream: &mut TcpStream, buf: &mut BytesMut, activity: &Activity) -> Option<usize> {
    if buf.capacity() - buf.len() < READ_SIZE / 4 {
        buf.reserve(READ_SIZE);
    }
    match stream.try_read_buf(buf) {
        Ok(n) => {
            if n > 0 {
                activity.read.fetch_add(n as u64, Ordering::Relaxed);
                activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
            }
            Some(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(_) => Some(0),
    }
}

/// What a request's answer leaves the connection to do.
enum Then {
    /// Go on to the next request.
    Next,
    Close,
    /// Not the key API's after all: hyper answers it, from its first byte.
    Handover,
}

/// Waits for `answering` (the answer to the request of `whole` bytes at the front of `buf`)
/// if it is not ready, and adds it to `out`, writing as a large body fills it.
#[allow(clippy::too_many_arguments)]
async fn respond<F: Future<Output = Option<Resp>> + ?Sized>(
    app: &App,
    stream: &mut TcpStream,
    guard: &mut Guard,
    out: &mut Out,
    buf: &mut BytesMut,
    method: &Method,
    close: bool,
    whole: usize,
    mut answering: Pin<&mut F>,
) -> Then {
    let activity = guard.activity.clone();
    let answer = match std::future::poll_fn(|cx| Poll::Ready(answering.as_mut().poll(cx))).await {
        Poll::Ready(a) => Some(a),
        Poll::Pending => {
            // Answers gathered so far go out before this one is waited for.
            if !out.is_empty() && !flush(stream, guard, out).await {
                return Then::Close;
            }
            guard.run(answering).await
        }
    };
    let resp = match answer {
        Some(Some(r)) => r,
        Some(None) => {
            activity.answered.fetch_add(1, Ordering::Release);
            return Then::Handover;
        }
        None => return Then::Close,
    };
    buf.advance(whole);
    let (mut parts, body) = resp.into_parts();
    let len = hyper::body::Body::size_hint(&body).exact();
    let (framing, last) = out::head(out, app, method, close, &mut parts, len);
    let sent = match framing {
        Framing::Length(0) => true,
        framing => send_body(stream, guard, out, body, framing).await,
    };
    let a = &activity;
    a.read_at_answer.store(a.read.load(Ordering::Relaxed) - buf.len() as u64, Ordering::Relaxed);
    a.answered.fetch_add(1, Ordering::Release);
    if !sent {
        // The body failed: what was gathered goes out, this answer's head and what of its
        // body came, and the connection closes: the client sees the answer cut short (as
        // under hyper), never takes it for whole.
        flush(stream, guard, out).await;
        return Then::Close;
    }
    if last {
        if flush(stream, guard, out).await {
            let _ = stream.shutdown().await;
        }
        return Then::Close;
    }
    Then::Next
}

/// Writes the gathered answers, in one vectored write unless the socket takes less; `false`
/// if the connection failed or must close.
async fn flush(stream: &mut TcpStream, guard: &mut Guard, out: &mut Out) -> bool {
    let mut iov = [IoSlice::new(&[]); MAX_SLICES];
    let n = out.slices(&mut iov);
    let mut slices = &mut iov[..n];
    let ok = loop {
        if slices.iter().all(|s| s.is_empty()) {
            break true;
        }
        // Most writes go at once; only a full socket buffer waits.
        match stream.try_write_vectored(slices) {
            Ok(0) => break false,
            Ok(n) => {
                guard.activity.written.fetch_add(n as u64, Ordering::Relaxed);
                guard.activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
                IoSlice::advance_slices(&mut slices, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match guard.run(stream.writable()).await {
                Some(Ok(())) => {}
                _ => break false,
            },
            Err(_) => break false,
        }
    };
    out.clear();
    ok
}

/// Adds an answer's body to `out`, writing as it fills: `false` if the body failed (a large
/// value's piece lost or damaged) or the connection did.
async fn send_body(
    stream: &mut TcpStream,
    guard: &mut Guard,
    out: &mut Out,
    mut body: crate::reply::Body,
    framing: Framing,
) -> bool {
    let chunked = framing == Framing::Chunked;
    loop {
        let frame = match guard.run(body.frame()).await {
            Some(Some(Ok(f))) => f,
            Some(None) => break,
            Some(Some(Err(_))) | None => return false,
        };
        let Ok(data) = frame.into_data() else { continue };
        if data.is_empty() {
            continue;
        }
        if chunked {
            out.extend(format!("{:X}\r\n", data.len()).as_bytes());
        }
        out.push(data);
        if chunked {
            out.extend(b"\r\n");
        }
        if out.full() && !flush(stream, guard, out).await {
            return false;
        }
    }
    if chunked {
        out.extend(b"0\r\n\r\n");
    }
    true
}

/// Hands the connection to hyper: what was answered is written first, and what is left of the
/// buffer (the first request not taken, and anything after it) is hyper's to parse.
async fn handover(link: Link, mut stream: TcpStream, guard: &mut Guard, mut out: Out, buf: BytesMut) {
    if !out.is_empty() && !flush(&mut stream, guard, &mut out).await {
        return;
    }
    link.app.metrics.handovers.fetch_add(1, Ordering::Relaxed);
    let a = &link.activity;
    a.read_at_answer.store(a.read.load(Ordering::Relaxed) - buf.len() as u64, Ordering::Relaxed);
    Box::pin(via_hyper::serve(link, stream, buf.freeze())).await
}
