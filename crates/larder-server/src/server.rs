//! The accept loop: connections, limits and timeouts, and graceful shutdown.

use crate::admin;
use crate::app::{App, BodyBudget, Held};
use crate::config::Settings;
use crate::metrics::Metrics;
use crate::routes::handle;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use larder_engine::{RecoveryProgress, Store, StoreConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};

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

/// A response body that tells the watchdog when hyper is done with it.
struct AnswerBody {
    inner: Full<Bytes>,
    activity: Arc<Activity>,
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
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

/// Raises the open-file limit to its hard maximum: each connection is a descriptor.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
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

    /// Whether the connection should be closed now.
    fn expired(&mut self, a: &Activity) -> bool {
        let now = Instant::now();
        let read = a.read.load(Ordering::Relaxed);
        let moved = read + a.written.load(Ordering::Relaxed);
        if moved != self.moved || a.held.load(Ordering::Relaxed) > 0 {
            (self.moved, self.quiet_since) = (moved, now);
        } else if !self.idle.is_zero() && now.duration_since(self.quiet_since) >= self.idle {
            return true;
        }
        let answered = a.answered.load(Ordering::Acquire);
        let in_request = a.started.load(Ordering::Relaxed) != answered;
        if in_request || read == a.read_at_answer.load(Ordering::Relaxed) {
            self.head_since = None; // inside a request, or nothing of the next one yet
            return false;
        }
        let since = *self.head_since.get_or_insert(now);
        !self.header.is_zero() && now.duration_since(since) >= self.header
    }
}

/// The open connections, so that past `--max-connections` an idle one can make room.
#[derive(Default)]
struct Conns {
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
    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        seen.started.fetch_add(1, Ordering::Relaxed);
        // Only a PUT can be held up by the server (see `Activity::held`); other requests pay
        // nothing for it.
        let held = (req.method() == hyper::Method::PUT).then(|| Held(seen.held.clone()));
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
                // close`) instead of finding the connection closed under a request it just sent.
                let quiet = coarse_ms().saturating_sub(activity.moved_at.load(Ordering::Relaxed)) >= QUIET_BEFORE_CLOSE_MS;
                if quiet && activity.between_requests() {
                    closing = true;
                    conn.as_mut().graceful_shutdown(); // between requests: hyper closes at once
                }
            }
            _ = tick.tick() => {
                if watchdog.expired(&activity) {
                    return; // dropping the connection closes it
                }
            }
            _ = close.notified() => return, // room for a new connection
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, so call it
/// before anything that a signal should not interrupt.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("installing a SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("installing a SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Runs the server until SIGTERM or SIGINT; returns after data is durable.
pub async fn run(settings: Settings) -> Result<(), String> {
    raise_fd_limit();
    let signal = shutdown_signal()?;
    let addr = settings.listen;
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let listener = socket.listen(4096).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;

    // Fault injection needs a test build *and* an explicit opt-in, so that a release build
    // made with dev-dependency features never exposes it by accident.
    let faults = larder_engine::faults::available().then(|| std::env::var("LARDER_FAULTS").ok()).flatten();
    if let Some(mode) = &faults {
        tracing::warn!(mode, "fault injection is on (/_larder/faults): for tests only");
    }
    let track = faults.as_deref() == Some("track");
    let app = Arc::new(App {
        store: OnceLock::new(),
        settings: settings.clone(),
        faults: faults.is_some(),
        metrics: Metrics::install()?,
        progress: RecoveryProgress::default(),
        started: Instant::now(),
        shutting_down: AtomicBool::new(false),
        body_budget: BodyBudget::new(settings.max_body_memory),
    });
    // Recovery runs while the socket already answers (503 until ready).
    let (ready_tx, mut ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let s = &app.settings;
            let cfg = StoreConfig {
                dirs: s.data_dir.clone(),
                strict_dirs: s.strict_dirs,
                volume_size: s.volume_size,
                volume_count: s.volume_count,
                max_value_size: s.max_value_size,
                fsync: s.fsync,
                memory: s.memory.clone(),
                reinsert_min_hits: s.reinsert_min_hits,
                ..StoreConfig::new(&s.data_dir[0])
            };
            // Test builds only: log writes from the start, for a simulated power cut.
            if track {
                for dir in &s.data_dir {
                    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| larder_engine::faults::track(dir)) {
                        tracing::error!(error = %e, "cannot track the data directory for power cuts");
                    }
                }
            }
            let r = Store::open_observed(cfg, &app.progress).map(|store| {
                log_recovered(&store, app.started.elapsed());
                let _ = app.store.set(store);
            });
            let dirs: Vec<String> = s.data_dir.iter().map(|d| d.display().to_string()).collect();
            let _ = ready_tx.send(r.map_err(|e| format!("cannot open the store in {}: {e}", dirs.join(", "))));
        });
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let conns = Arc::new(Mutex::new(Conns::default()));
    let clock = tokio::spawn(async {
        let start = Instant::now();
        let mut tick = tokio::time::interval(COARSE_TICK);
        loop {
            tick.tick().await;
            COARSE_MS.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    });
    let background = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut last_report = Instant::now();
            loop {
                tick.tick().await;
                if app.store.get().is_none() && last_report.elapsed() >= RECOVERY_REPORT_EVERY {
                    last_report = Instant::now();
                    let status = admin::recovery_status(&app.progress, app.started.elapsed());
                    tracing::info!(target: "larder::lifecycle", "recovering: {status}");
                }
                app.metrics.upkeep();
            }
        })
    };
    let mut connections = tokio::task::JoinSet::new();
    let admit = |stream: TcpStream, connections: &mut tokio::task::JoinSet<()>| {
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
        connections.spawn(serve_connection(app.clone(), stream, shutdown_rx.clone(), activity, close, registered));
    };
    tokio::pin!(signal);
    let mut waiting_ready = true;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => admit(stream, &mut connections),
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            r = &mut ready_rx, if waiting_ready => {
                waiting_ready = false;
                match r {
                    Ok(Ok(())) => println!("larder listening on {local}"),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err("store task ended unexpectedly".into()),
                }
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = &mut signal => break,
        }
    }
    // Connections the kernel completed but nobody accepted yet would be reset when the
    // listener closes: take them in and answer them too (for at most 100 ms, so that a flood
    // of connects cannot hold the stop up).
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
            Ok(Ok((stream, _))) => admit(stream, &mut connections),
            _ => break,
        }
    }
    drop(listener);
    // From here on every answer closes its connection (only now: a client told to reconnect
    // before the listener closed could land in its queue and be reset), and health says so.
    app.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!(target: "larder::lifecycle", connections = connections.len(), "stopping: finishing requests in flight");
    let _ = shutdown_tx.send(true);
    let limit = app.settings.shutdown_timeout;
    let drained = tokio::time::timeout(limit, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = connections.len(), "connections still busy after {limit:?}; closing them");
        connections.abort_all();
    }
    clock.abort();
    background.abort();
    if waiting_ready {
        // Still recovering: wait for it so the store is closed cleanly.
        let _ = ready_rx.await;
    }
    let app2 = app.clone();
    let closing = Instant::now();
    tokio::task::spawn_blocking(move || app2.store.get().map(|s| s.close()).transpose())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("closing the store: {e}"))?;
    tracing::info!(target: "larder::lifecycle", millis = closing.elapsed().as_millis() as u64, "stopped: data synced, checkpoint written");
    Ok(())
}

/// How often a recovery in progress is logged.
const RECOVERY_REPORT_EVERY: Duration = Duration::from_secs(2);

fn log_recovered(store: &Store, elapsed: Duration) {
    let s = store.stats();
    let r = s.recovery;
    tracing::info!(
        target: "larder::lifecycle",
        keys = s.keys,
        volumes = r.volumes,
        hint_loads = r.hint_loads,
        checkpoint_loads = r.checkpoint_loads,
        scans = r.scans,
        tail_bytes_scanned = r.tail_bytes_scanned,
        truncated_bytes = r.truncated_bytes,
        millis = elapsed.as_millis() as u64,
        "recovered"
    );
}
