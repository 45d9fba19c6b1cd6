//! memcached's protocol on the same store (`--memcache-listen`): every memcached client is a
//! larder client. A key set here is the HTTP key of the same bytes.
//!
//! The door's layers, bottom to top (`tests/architecture.rs` holds each to importing only
//! those below it):
//!
//! - `wire/`: the encodings, pure: text, meta and binary bytes in, one [`wire::Request`] out;
//!   an answer in, its bytes out.
//! - `counters.rs`: commands by outcome, connections and bytes; the version.
//! - `logs.rs`: the log stream `watch` reads, and the per-prefix counts of `stats detail`.
//! - `listener.rs`: what a listener's connections share: the registry of connections, the
//!   coarse clock, the meta protocol's per-item state.
//! - `conn.rs`: a connection's transport: reads under deadline and budget, data blocks,
//!   vectored writes.
//! - `access.rs`: the door's side of the policy: a request's permission, the `-Y` login and
//!   SASL `PLAIN`.
//! - `item.rs`: each item semantic once (expiry, read-modify-write and cas, incr and decr,
//!   append and prepend, touch after read, the refused set's drop, values in and out).
//! - `meta.rs`: `mg`, `ms`, `md`, `ma`, `me` over the item core.
//! - `operator.rs`: `stats` and the operator commands (dumps, `watch`, the rest).
//! - `exec.rs`: the command table: every request, whatever its encoding, to its answer.
//! - `session.rs`: a connection's loop: the text/binary sniff, framing, admission, counting.
//! - this file: the listener: bind, accept, the connection limit, the stop.

mod access;
mod conn;
mod counters;
mod exec;
mod item;
mod listener;
mod logs;
mod meta;
mod operator;
mod session;
mod wire;

use crate::app::App;
use conn::Conn;
use listener::{Entry, Listener, Registry, CLOCK_TICK};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

pub use counters::{counters, render_metrics, Counters};

/// Binds the memcached listener (before recovery, so a bad address fails the start at once).
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
        .map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(addr).map_err(|e| format!("cannot listen for memcached clients on {addr}: {e}"))?;
    socket.listen(4096).map_err(|e| format!("cannot listen for memcached clients on {addr}: {e}"))
}

/// Accepts memcached connections until `shutdown`; then lets each finish the commands it has
/// read and closes it, waiting for them up to `--shutdown-timeout`.
pub async fn run(app: Arc<App>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let l = Arc::new(Listener {
        local: listener.local_addr().ok(),
        app: app.clone(),
        items: listener::Items::default(),
        registry: Mutex::new(Registry::default()),
        epoch: Instant::now(),
        clock_ms: AtomicU64::new(0),
        dumps: tokio::sync::Semaphore::new(1),
        log: logs::Log::default(),
    });
    // Each connection's session runs on a lane (one thread per core, see `lanes`).
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let lanes = match crate::lanes::Lanes::start(n, "larder-mc", tokio::runtime::Handle::current()) {
        Ok(lanes) => lanes,
        Err(e) => {
            tracing::error!(error = %e, "the memcached door cannot start its threads; it is closed");
            return;
        }
    };
    let mut conns = JoinSet::new();
    let mut clock = tokio::time::interval(CLOCK_TICK);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The idle timeout between commands is enforced from here, a few times per timeout, so
    // that a connection arms no timer for each wait. Inside a command, the connection's own
    // read times out (see `Conn::fill`).
    let idle = app.settings.idle_timeout;
    let period = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut scan = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = clock.tick() => l.clock_ms.store(l.epoch.elapsed().as_millis() as u64, Ordering::Relaxed),
            _ = scan.tick(), if !idle.is_zero() => l.close_idle(idle),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    counters().total_connections.fetch_add(1, Ordering::Relaxed);
                    match l.admit(peer) {
                        Some((id, entry, close)) => match stream.into_std() {
                            Ok(stream) => {
                                let _ = stream.set_nodelay(true);
                                let open = Open::new(l.clone(), id);
                                conns.spawn(lanes.run(stream, move |s| serve(open, s, close, entry)));
                            }
                            Err(_) => drop(Open::new(l.clone(), id)), // closed at once
                        },
                        None => {
                            counters().rejected_connections.fetch_add(1, Ordering::Relaxed);
                            conns.spawn(refuse(stream));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "memcached accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    // Each connection finishes the commands it has read, then closes.
    for e in l.registry.lock().open.values() {
        e.close();
    }
    let limit = app.settings.shutdown_timeout;
    if tokio::time::timeout(limit, async { while conns.join_next().await.is_some() {} }).await.is_err() {
        tracing::warn!(left = conns.len(), "memcached connections still busy after {limit:?}; closing them");
        conns.abort_all();
    }
}

/// Past the connection limit with every connection busy: memcached's answer, then close.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(b"ERROR Too many open connections\r\n").await?;
        stream.shutdown().await
    })
    .await;
}

/// Serves one connection: commands are read, run in order and answered; answers to
/// pipelined commands go out in one write once no complete command is left to run.
/// A connection counted open: in `curr_connections` and the registry until it is dropped,
/// however its session ends (closed, aborted at a stop, panicked, or never started).
struct Open {
    l: Arc<Listener>,
    id: u64,
}

impl Open {
    fn new(l: Arc<Listener>, id: u64) -> Open {
        counters().curr_connections.fetch_add(1, Ordering::Relaxed);
        Open { l, id }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        counters().curr_connections.fetch_sub(1, Ordering::Relaxed);
        self.l.registry.lock().open.remove(&self.id);
    }
}

async fn serve(open: Open, stream: crate::lanes::LaneStream, close: oneshot::Receiver<()>, entry: Arc<Entry>) {
    let mut c = Conn::new(open.l.clone(), stream, close, open.id, entry);
    let _ = session::run(&mut c).await;
    c.close().await;
}
