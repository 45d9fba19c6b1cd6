//! What a connection's timeouts are judged by, whoever serves it: the bytes and requests it
//! moves ([`Activity`]), a coarse clock cheap enough to read on every read and write, the
//! stream and body wrappers that count for hyper, the watchdog's idle and slow-header
//! timeouts, and what else serving a connection takes ([`Link`]).

use crate::app::App;
use bytes::Bytes;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

/// What a connection's watchdog needs to know: bytes moved, requests begun and answered.
#[derive(Default)]
pub(super) struct Activity {
    pub(super) read: AtomicU64,
    pub(super) written: AtomicU64,
    pub(super) started: AtomicU64,
    /// Responses whose body hyper has finished with (written or abandoned).
    pub(super) answered: AtomicU64,
    /// `read` when the last response was finished: bytes beyond it belong to the next request.
    pub(super) read_at_answer: AtomicU64,
    /// [`coarse_ms`] when a byte last moved either way (or the connection was accepted).
    pub(super) moved_at: AtomicU64,
    /// Requests of this connection the server itself holds up (a PUT waiting for room in the
    /// body budget): the connection is not idle meanwhile, however long that takes.
    pub(super) held: Arc<std::sync::atomic::AtomicU32>,
    /// A newcomer took this connection's room: it closes (the event loop's connections look
    /// at this; those on the runtime hear of it from [`Link::close`]).
    pub(super) claimed: std::sync::atomic::AtomicBool,
}

/// Milliseconds since the server started, updated every [`COARSE_TICK`] by a background task:
/// cheap enough to note on every read and write of a connection.
static COARSE_MS: AtomicU64 = AtomicU64::new(0);
const COARSE_TICK: Duration = Duration::from_millis(50);

pub(super) fn coarse_ms() -> u64 {
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
pub(super) struct AnswerBody {
    pub(super) inner: crate::reply::Body,
    pub(super) activity: Arc<Activity>,
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

/// A TCP stream that counts the bytes it moves, so a watchdog can enforce timeouts. `prefix`
/// is what the server's own connection read before it handed the connection to hyper: read
/// first, and not counted again.
pub(super) struct Tracked {
    pub(super) inner: TcpStream,
    pub(super) activity: Arc<Activity>,
    pub(super) prefix: Bytes,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
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
pub(super) struct Watchdog {
    idle: Duration,
    header: Duration,
    moved: u64,
    quiet_since: Instant,
    head_since: Option<Instant>,
}

impl Watchdog {
    pub(super) fn new(idle: Duration, header: Duration) -> Watchdog {
        Watchdog { idle, header, moved: 0, quiet_since: Instant::now(), head_since: None }
    }

    /// How often `expired` should be asked.
    pub(super) fn period(&self) -> Duration {
        let shortest = [self.idle, self.header].into_iter().filter(|d| !d.is_zero()).min();
        shortest.map_or(Duration::from_secs(5), |d| (d / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)))
    }

    /// Whether the connection should be closed now: `Some(true)` for a request head that
    /// missed its deadline, `Some(false)` for an idle connection.
    pub(super) fn expired(&mut self, a: &Activity) -> Option<bool> {
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

/// A connection must have been quiet this long to be closed for a newcomer or by a shutdown:
/// long enough that a request already sent is read, and that the tail of a response still
/// being written (hyper finishes with a body before the socket takes all of it) keeps moving
/// bytes.
pub(super) const QUIET_BEFORE_CLOSE_MS: u64 = 1000;

impl Activity {
    /// The last request answered and nothing of the next one read.
    pub(super) fn between_requests(&self) -> bool {
        self.started.load(Ordering::Relaxed) == self.answered.load(Ordering::Acquire)
            && self.read.load(Ordering::Relaxed) == self.read_at_answer.load(Ordering::Relaxed)
    }
}

/// What serving a connection needs besides its stream.
pub(super) struct Link {
    pub(super) app: Arc<App>,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) activity: Arc<Activity>,
    /// Notified when a newcomer needs this connection's room.
    pub(super) close: Arc<Notify>,
    /// Keeps the connection in the registry until it ends.
    pub(super) registered: Registered,
}

/// Removes a connection from the registry when its task ends, however it ends.
pub(super) struct Registered(pub(super) Option<Box<dyn FnOnce() + Send + Sync>>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(remove) = self.0.take() {
            remove();
        }
    }
}
