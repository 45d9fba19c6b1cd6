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

/// A TCP stream that counts the bytes it moves, so a watchdog can close idle connections.
struct Tracked {
    inner: TcpStream,
    moved: Arc<AtomicU64>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.moved.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.moved.fetch_add(n as u64, Ordering::Relaxed);
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
            self.moved.fetch_add(n as u64, Ordering::Relaxed);
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

async fn serve_connection(app: Arc<App>, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let moved = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Tracked { inner: stream, moved: moved.clone() });
    let s = &app.settings;
    let idle = s.idle_timeout;
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(s.header_timeout)
        .max_buf_size((s.max_header_size as usize).max(8192))
        .keep_alive(true)
        .serve_connection(io, service_fn(move |req| handle(app.clone(), req)));
    tokio::pin!(conn);
    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seen, mut quiet_since) = (0, Instant::now());
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = shutdown.changed() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
                return;
            }
            _ = tick.tick() => {
                let now = moved.load(Ordering::Relaxed);
                if now != seen {
                    (seen, quiet_since) = (now, Instant::now());
                } else if quiet_since.elapsed() >= idle {
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
