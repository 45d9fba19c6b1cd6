//! The accept loop: connections, limits and timeouts, and graceful shutdown.

use crate::config::Settings;
use crate::http::{handle, App};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use larder_engine::{Store, StoreConfig};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// What a connection's watchdog needs to know: bytes moved and requests begun and answered.
#[derive(Default)]
struct Activity {
    read: AtomicU64,
    written: AtomicU64,
    started: AtomicU64,
    answered: AtomicU64,
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
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.activity.written.fetch_add(n as u64, Ordering::Relaxed);
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

/// Timeouts, checked on a coarse tick: `idle` closes a connection that moved no byte for that
/// long; `header` closes one whose next request started arriving but whose headers were not
/// complete within that time (slow-loris). hyper's own header timeout is not used because it
/// also runs while a keep-alive connection is idle, which would cut idle connections short.
struct Watchdog {
    idle: Duration,
    header: Duration,
    moved: u64,
    quiet_since: Instant,
    answered: u64,
    read_at_answer: u64,
    head_since: Option<Instant>,
}

impl Watchdog {
    fn new(idle: Duration, header: Duration) -> Watchdog {
        let now = Instant::now();
        Watchdog { idle, header, moved: 0, quiet_since: now, answered: 0, read_at_answer: 0, head_since: None }
    }

    /// Whether the connection should be closed now.
    fn expired(&mut self, a: &Activity) -> bool {
        let now = Instant::now();
        let read = a.read.load(Ordering::Relaxed);
        let moved = read + a.written.load(Ordering::Relaxed);
        if moved != self.moved {
            (self.moved, self.quiet_since) = (moved, now);
        } else if now.duration_since(self.quiet_since) >= self.idle {
            return true;
        }
        let (started, answered) = (a.started.load(Ordering::Relaxed), a.answered.load(Ordering::Relaxed));
        if started != answered {
            self.head_since = None; // inside a request: the body and the handler are not timed here
            return false;
        }
        if answered != self.answered {
            (self.answered, self.read_at_answer, self.head_since) = (answered, read, None);
        } else if read != self.read_at_answer && self.head_since.is_none() {
            self.head_since = Some(now); // bytes of the next request's head have arrived
        }
        self.head_since.is_some_and(|t| now.duration_since(t) >= self.header)
    }
}

async fn serve_connection(app: Arc<App>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let s = &app.settings;
    let mut watchdog = Watchdog::new(s.idle_timeout, s.header_timeout);
    let period = (s.idle_timeout.min(s.header_timeout) / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let max_buf = (s.max_header_size as usize).max(8192);
    let seen = activity.clone();
    let service = service_fn(move |req| {
        seen.started.fetch_add(1, Ordering::Relaxed);
        let (app, seen) = (app.clone(), seen.clone());
        async move {
            let r = handle(app, req).await;
            seen.answered.fetch_add(1, Ordering::Relaxed);
            r
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(max_buf)
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = shutdown.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
                return;
            }
            _ = tick.tick() => {
                if watchdog.expired(&activity) {
                    return; // dropping the connection closes it
                }
            }
        }
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Runs the server until SIGTERM or SIGINT; returns after data is durable.
pub async fn run(settings: Settings) -> Result<(), String> {
    raise_fd_limit();
    let addr = settings.listen;
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let listener = socket.listen(4096).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;

    let app = Arc::new(App { store: OnceLock::new(), settings: settings.clone() });
    // Recovery runs while the socket already answers (503 until ready).
    let (ready_tx, mut ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let s = &app.settings;
            let cfg = StoreConfig {
                dir: s.data_dir.clone(),
                volume_size: s.volume_size,
                volume_count: s.volume_count,
                max_value_size: s.max_value_size,
                fsync: s.fsync,
            };
            let r = Store::open(cfg).map(|store| {
                let _ = app.store.set(store);
            });
            let _ = ready_tx.send(r.map_err(|e| format!("cannot open the store in {}: {e}", s.data_dir.display())));
        });
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut waiting_ready = true;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(app.clone(), stream, shutdown_rx.clone()));
                }
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
    drop(listener);
    let _ = shutdown_tx.send(true);
    let drained =
        tokio::time::timeout(Duration::from_secs(30), async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(left = connections.len(), "connections still busy after 30s; closing them");
        connections.abort_all();
    }
    if waiting_ready {
        // Still recovering: wait for it so the store is closed cleanly.
        let _ = ready_rx.await;
    }
    let app2 = app.clone();
    tokio::task::spawn_blocking(move || app2.store.get().map(|s| s.close()).transpose())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("closing the store: {e}"))?;
    Ok(())
}
