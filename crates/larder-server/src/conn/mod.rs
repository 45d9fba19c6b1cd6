//! One client connection from accept to close: the registry that makes room past
//! `--max-connections` or refuses a newcomer, and what a connection is served by: the
//! server's own HTTP/1.1 loop for the key API's plain requests ([`native`]), handing the
//! connection to hyper at the first request it does not take ([`via_hyper`]). Both keep the
//! same timeouts ([`activity`]) and the same part in a graceful stop: answering what arrives
//! with `Connection: close`, and closing once quiet between requests.

mod activity;
mod native;
mod out;
mod reactor;
mod via_hyper;

pub use activity::coarse_clock;

use crate::app::App;
use activity::{coarse_ms, Activity, Link, Registered, QUIET_BEFORE_CLOSE_MS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

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
                c.activity.claimed.store(true, Ordering::Relaxed);
                c.close.notify_one();
                true
            }
            None => false,
        }
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
    let conns = conns.clone();
    let registered = Registered(Some(Box::new(move || {
        conns.lock().open.remove(&id);
    })));
    let link = Link { app: app.clone(), shutdown: shutdown.clone(), activity, close, registered };
    let _ = stream.set_nodelay(true);
    // The read-through proxy's requests are all hyper's (see `native`).
    if app.settings.http_server == crate::config::HttpServer::Hyper || crate::proxy::state().is_some() {
        connections.spawn(via_hyper::serve(link, stream, bytes::Bytes::new()));
        return;
    }
    let reactors = REACTORS.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        reactor::Reactors::start(n, tokio::runtime::Handle::current())
    });
    let (reactors, stream) = match (reactors, stream.into_std()) {
        (Ok(r), Ok(s)) => (r, s),
        (Err(e), _) => {
            tracing::error!(error = %e, "no HTTP event loop for a connection");
            return;
        }
        (_, Err(e)) => {
            tracing::warn!(error = %e, "a connection could not leave the runtime");
            return;
        }
    };
    // The connection's task only waits: for the loop to end it, or to hand it to the runtime.
    let (done, handed) = tokio::sync::oneshot::channel();
    reactors.take(reactor::Arrival { stream, link, done });
    connections.spawn(async move {
        if let Ok(h) = handed.await {
            if let Ok(stream) = TcpStream::from_std(h.stream) {
                native::resume(h.link, stream, h.buf, h.out, h.pending).await;
            }
        }
    });
}

/// The event loops, started with the first connection, on the runtime that accepted it.
static REACTORS: std::sync::OnceLock<io::Result<reactor::Reactors>> = std::sync::OnceLock::new();
