//! The state every request shares ([`App`]), and the count of a connection's held requests,
//! which pauses its idle timeout.

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
    /// Who may do what: every door asks it.
    pub policy: crate::guard::Policy,
    /// Whether `/_larder/faults` answers: a build with the engine's fault layer, started with
    /// `LARDER_FAULTS` set (tests only).
    pub faults: bool,
    /// Request counters and histograms, rendered at `/_larder/metrics`.
    pub metrics: Metrics,
    /// The operator's window: each door's times and hot keys, slow requests' traces, the
    /// last minutes' figures.
    pub watch: crate::watch::Watch,
    /// How far the recovery has come while the store opens.
    pub progress: RecoveryProgress,
    /// When the recovery started, for its estimate of the time left.
    pub started: Instant,
    /// Set on SIGTERM/SIGINT: health answers 503 and every answer closes its connection.
    pub shutting_down: AtomicBool,
    /// Room for client input held in memory (`--max-body-memory`), and for the pieces of
    /// large values being sent.
    pub body_budget: crate::guard::budget::Budget,
    /// Streamed uploads being written: each holds a thread of the blocking pool while its body
    /// arrives, so their number is bounded ([`MAX_STREAMED_UPLOADS`]); more wait their turn.
    pub uploads: tokio::sync::Semaphore,
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

impl App {
    /// Whether the server is stopping.
    pub fn stopping(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}
