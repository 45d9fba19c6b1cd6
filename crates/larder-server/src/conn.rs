//! One client connection from accept to close: the bytes and requests it moves (which its
//! timeouts are judged by), the watchdog's idle and slow-header timeouts, the registry that
//! makes room past `--max-connections` or refuses a newcomer, and its part of a graceful stop:
//! answering what arrives with `Connection: close`, and closing once quiet between requests.

use crate::app::{App, Held};
use crate::routes::handle;
use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// What a connection's watchdog needs to know: bytes moved, requests begun and answered.
#[derive(Default)]
struct Activity {
    read: AtomicU64,
    written: AtomicU64,
    started: AtomicU64,
    /// Responses whose body hyper has finished with (written or abandoned).
    answered: AtomicU64,
    /// `read` when the last response was finished: bytes beyond it belong to the next request.
    read_at_answer: AtomicU64,
    /// [`coarse_ms`] when a byte last moved either way (or the connection was accepted).
    moved_at: AtomicU64,
    /// Requests of this connection the server itself holds up (a PUT waiting for room in the
    /// body budget): the connection is not idle meanwhile, however long that takes.
    held: Arc<std::sync::atomic::AtomicU32>,
}

/// Milliseconds since the server started, updated every [`COARSE_TICK`] by a background task:
/// cheap enough to note on every read and write of a connection.
static COARSE_MS: AtomicU64 = AtomicU64::new(0);
const COARSE_TICK: Duration = Duration::from_millis(50);

fn coarse_ms() -> u64 {
    COARSE_MS.load(Ordering::Relaxed)
}

/// Keeps [`COARSE_MS`] current; runs until aborted.
pub async fn coarse_clock() {
    let start = Instant::now();
    let mut tick = tokio::time::interval(COARSE_TICK);
    loop {
        tick.tick().await;
        COARSE_MS.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// A response body that tells the watchdog when hyper is done with it.
struct AnswerBody {
    inner: crate::reply::Body,
    activity: Arc<Activity>,
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for AnswerBody {
    fn drop(&mut self) {
        let a = &self.activity;
        a.read_at_answer.store(a.read.load(Ordering::Relaxed), Ordering::Relaxed);
        a.answered.fetch_add(1, Ordering::Release);
    }
}

/// A TCP stream that counts the bytes it moves, so a watchdog can enforce timeouts.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.activity.read.fetch_add(n as u64, Ordering::Relaxed);
            self.activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.written.fetch_add(n as u64, Ordering::Relaxed);
            self.activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
        }
        r
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.written.fetch_add(n as u64, Ordering::Relaxed);
            self.activity.moved_at.store(coarse_ms(), Ordering::Relaxed);
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Timeouts, checked on a coarse tick (zero turns one off): `idle` closes a connection that
/// moved no byte for that long; `header` closes one whose next request head started arriving
/// but was not complete within that time (slow-loris). hyper's own header timeout is not used
/// because it also runs while a keep-alive connection is idle, cutting idle connections short.
struct Watchdog {
    idle: Duration,
    header: Duration,
    moved: u64,
    quiet_since: Instant,
    head_since: Option<Instant>,
}

impl Watchdog {
    fn new(idle: Duration, header: Duration) -> Watchdog {
        Watchdog { idle, header, moved: 0, quiet_since: Instant::now(), head_since: None }
    }

    /// How often `expired` should be asked.
    fn period(&self) -> Duration {
        let shortest = [self.idle, self.header].into_iter().filter(|d| !d.is_zero()).min();
        shortest.map_or(Duration::from_secs(5), |d| (d / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)))
    }

    /// Whether the connection should be closed now: `Some(true)` for a request head that
    /// missed its deadline, `Some(false)` for an idle connection.
    fn expired(&mut self, a: &Activity) -> Option<bool> {
        let now = Instant::now();
        let read = a.read.load(Ordering::Relaxed);
        let moved = read + a.written.load(Ordering::Relaxed);
        if moved != self.moved || a.held.load(Ordering::Relaxed) > 0 {
            (self.moved, self.quiet_since) = (moved, now);
        } else if !self.idle.is_zero() && now.duration_since(self.quiet_since) >= self.idle {
            return Some(false);
        }
        let answered = a.answered.load(Ordering::Acquire);
        let in_request = a.started.load(Ordering::Relaxed) != answered;
        if in_request || read == a.read_at_answer.load(Ordering::Relaxed) {
            self.head_since = None; // inside a request, or nothing of the next one yet
            return None;
        }
        let since = *self.head_since.get_or_insert(now);
        (!self.header.is_zero() && now.duration_since(since) >= self.header).then_some(true)
    }
}

/// The open connections, so that past `--max-connections` an idle one can make room.
#[derive(Default)]
pub struct Conns {
    next_id: u64,
    open: HashMap<u64, Conn>,
}

struct Conn {
    activity: Arc<Activity>,
    close: Arc<Notify>,
}

/// A connection must have been quiet this long to be closed for a newcomer or by a shutdown:
/// long enough that a request already sent is read, and that the tail of a response still
/// being written (hyper finishes with a body before the socket takes all of it) keeps moving
/// bytes.
const QUIET_BEFORE_CLOSE_MS: u64 = 1000;

impl Conn {
    fn quiet(&self, now: u64) -> bool {
        now.saturating_sub(self.activity.moved_at.load(Ordering::Relaxed)) >= QUIET_BEFORE_CLOSE_MS
    }
    /// Connected a while ago and never sent a byte.
    fn never_used(&self, now: u64) -> bool {
        self.activity.read.load(Ordering::Relaxed) == 0 && self.quiet(now)
    }
    /// Between requests, quiet: the last one answered and nothing of the next one read.
    fn idle(&self, now: u64) -> bool {
        self.activity.between_requests() && self.quiet(now)
    }
}

impl Activity {
    /// The last request answered and nothing of the next one read.
    fn between_requests(&self) -> bool {
        self.started.load(Ordering::Relaxed) == self.answered.load(Ordering::Acquire)
            && self.read.load(Ordering::Relaxed) == self.read_at_answer.load(Ordering::Relaxed)
    }
}

impl Conns {
    /// Makes room for one more connection if there are `max` already: closes the
    /// longest-quiet never-used connection, else the longest-quiet idle keep-alive one.
    /// `false` if every connection is busy (or too recently active).
    fn make_room(&mut self, max: usize) -> bool {
        if self.open.len() < max {
            return true;
        }
        let now = coarse_ms();
        let quietest = |f: &dyn Fn(&Conn) -> bool| {
            self.open
                .iter()
                .filter(|(_, c)| f(c))
                .min_by_key(|(_, c)| c.activity.moved_at.load(Ordering::Relaxed))
                .map(|(id, _)| *id)
        };
        let victim = quietest(&|c| c.never_used(now)).or_else(|| quietest(&|c| c.idle(now)));
        match victim.and_then(|id| self.open.remove(&id)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Removes a connection from the registry when its task ends, however it ends.
struct Registered {
    conns: Arc<Mutex<Conns>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns.lock().open.remove(&self.id);
    }
}

/// Answers a connection past the limit when every open one is busy, and closes it.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let msg = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
                content-length: 21\r\nconnection: close\r\n\r\ntoo many connections\n";
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(msg).await?;
        stream.shutdown().await?;
        // Read what the client sent before closing: closing with unread bytes sends a reset,
        // which can destroy the answer before the client reads it.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// Serves one connection until the client closes it, an error, a timeout of the watchdog, a
/// newcomer that needs its room, or the drain of a stop.
async fn serve_connection(
    app: Arc<App>,
    stream: TcpStream,
    mut shutdown: watch::Receiver<bool>,
    activity: Arc<Activity>,
    close: Arc<Notify>,
    _registered: Registered,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
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

/// Takes in an accepted connection and spawns its task on `connections`: served, or refused
/// when it is past `--max-connections` and every open connection is busy.
pub fn admit(
    app: &Arc<App>,
    conns: &Arc<Mutex<Conns>>,
    shutdown: &watch::Receiver<bool>,
    stream: TcpStream,
    connections: &mut JoinSet<()>,
) {
    let mut c = conns.lock();
    if !c.make_room(app.settings.max_connections) {
        drop(c);
        connections.spawn(refuse(stream));
        return;
    }
    let activity = Arc::new(Activity { moved_at: AtomicU64::new(coarse_ms()), ..Activity::default() });
    let close = Arc::new(Notify::new());
    let id = c.next_id;
    c.next_id += 1;
    c.open.insert(id, Conn { activity: activity.clone(), close: close.clone() });
    drop(c);
    let registered = Registered { conns: conns.clone(), id };
    connections.spawn(serve_connection(app.clone(), stream, shutdown.clone(), activity, close, registered));
}
