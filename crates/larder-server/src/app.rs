//! The state every request shares ([`App`]), and what the server holds request bodies to: the
//! body budget and the count of a connection's held requests, which pauses its idle timeout.

use crate::config::Settings;
use crate::metrics::Metrics;
use larder_engine::{RecoveryProgress, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Shared state of the server.
pub struct App {
    /// The store, set once recovery has finished; until then requests get 503.
    pub store: OnceLock<Store>,
    /// Settings in force.
    pub settings: Settings,
    /// Whether `/_larder/faults` answers: a build with the engine's fault layer, started with
    /// `LARDER_FAULTS` set (tests only).
    pub faults: bool,
    /// Request counters and histograms, rendered at `/_larder/metrics`.
    pub metrics: Metrics,
    /// How far the recovery has come while the store opens.
    pub progress: RecoveryProgress,
    /// When the recovery started, for its estimate of the time left.
    pub started: Instant,
    /// Set on SIGTERM/SIGINT: health answers 503 and every answer closes its connection.
    pub shutting_down: AtomicBool,
    /// Room for request bodies held in memory (`--max-body-memory`), and for the pieces of
    /// large values being sent.
    pub body_budget: BodyBudget,
    /// Streamed uploads being written: each holds a thread of the blocking pool while its body
    /// arrives, so their number is bounded ([`MAX_STREAMED_UPLOADS`]); more wait their turn.
    pub uploads: tokio::sync::Semaphore,
    /// The memcached listener's counters (zero when it is off).
    pub memcache: crate::memcache::Counters,
    /// The memcached meta protocol's per-item state.
    pub memcache_items: crate::memcache::Items,
    /// Read-through mode (`--origin`), if on.
    pub proxy: Option<crate::proxy::Proxy>,
}

/// Streamed uploads written at once: a quarter of the blocking pool's 512 threads, so that
/// reads that must wait for the disk always find threads.
pub const MAX_STREAMED_UPLOADS: usize = 128;

/// The connection's count of requests the server holds up, handed to the handler of a PUT.
/// While it is above zero the connection's idle timeout does not run, so that waiting for room
/// in the body budget, however long, never closes a connection.
pub struct Held(pub Arc<std::sync::atomic::AtomicU32>);

/// Counts one held request until dropped (the wait may end by the request being cancelled).
pub struct Holding(Arc<std::sync::atomic::AtomicU32>);

impl Holding {
    /// Starts counting, if the connection gave its count.
    pub fn new(held: Option<&Held>) -> Option<Holding> {
        let h = held?;
        h.0.fetch_add(1, Ordering::Relaxed);
        Some(Holding(h.0.clone()))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The bytes of request bodies held in memory at once, across all connections: a request
/// waits for its share before its body is read (backpressure: never a drop, never a 5xx for
/// load). Counted in KiB, the semaphore's unit, so that any size fits its permit counts.
pub struct BodyBudget {
    room: Arc<tokio::sync::Semaphore>,
    kib: u32,
}

impl BodyBudget {
    /// A budget of `bytes` (at least 1 KiB).
    pub fn new(bytes: u64) -> BodyBudget {
        let kib = bytes.div_ceil(1024).clamp(1, u32::MAX as u64) as u32;
        BodyBudget { room: Arc::new(tokio::sync::Semaphore::new(kib as usize)), kib }
    }

    /// Waits for room for a body of `bytes`, charged with the connection's read buffer it
    /// passes through too (hyper grows it up to about 400 KiB while a large body streams in).
    /// A body larger than the whole budget waits until it has the budget to itself, rather
    /// than forever. Requests are served in the order they asked.
    pub async fn reserve(&self, bytes: u64) -> tokio::sync::OwnedSemaphorePermit {
        let kib = Self::charge(bytes).div_ceil(1024).min(self.kib as u64) as u32;
        self.room.clone().acquire_many_owned(kib).await.expect("the budget is never closed")
    }

    /// Waits for room for `bytes` exactly: the pieces of a large value being sent, which pass
    /// through no read buffer.
    pub async fn reserve_exact(&self, bytes: u64) -> tokio::sync::OwnedSemaphorePermit {
        let kib = bytes.div_ceil(1024).min(self.kib as u64) as u32;
        self.room.clone().acquire_many_owned(kib).await.expect("the budget is never closed")
    }

    /// What a body of `bytes` costs the budget: itself and its share of the read buffer.
    pub fn charge(bytes: u64) -> u64 {
        bytes + bytes.min(400 << 10)
    }
}

impl App {
    /// Whether the server is stopping.
    pub fn stopping(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}
