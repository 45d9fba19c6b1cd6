//! What the operator's window reads that the metrics do not keep: each door's request times
//! and outcomes ([`latency`]), its hot keys and largest values ([`hot`]), the slow requests'
//! traces ([`slow`]), and the last minutes of figures a second apart (the series the status
//! page and `larder top` draw, filled by `admin`'s sampler from the same stats
//! `/_larder/stats` shows).

pub mod hot;
pub mod latency;
pub mod slow;

use hyper::Method;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The doors the window tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    Http,
    Proxy,
    Memcache,
}

/// Their names, in [`Door`]'s order.
pub const DOORS: [&str; 3] = ["http", "proxy", "memcache"];

/// What a request came to, in the window's terms (every door's outcomes map onto these).
pub const OUTCOMES: [&str; 7] = ["hit", "miss", "write", "delete", "client_error", "server_error", "other"];

/// Seconds of figures kept.
pub const SERIES_SECONDS: usize = 300;

/// The window's state.
pub struct Watch {
    latency: [latency::Latency; 3],
    outcomes: [[AtomicU64; OUTCOMES.len()]; 2],
    hot: [hot::Hot; 3],
    /// The slow requests' threshold and traces.
    pub slow: slow::Slow,
    series: Mutex<VecDeque<serde_json::Value>>,
    /// When the server started (ms since the Unix epoch): a page that sees it change knows
    /// the server restarted.
    pub started_ms: u64,
}

impl Watch {
    /// A window keeping traces of requests slower than `slow_request` (zero: none).
    pub fn new(slow_request: Duration) -> Watch {
        Watch {
            latency: Default::default(),
            outcomes: Default::default(),
            hot: Default::default(),
            slow: slow::Slow::new(slow_request),
            series: Mutex::new(VecDeque::with_capacity(SERIES_SECONDS)),
            started_ms: larder_engine::now_ms(),
        }
    }

    /// An answered HTTP request (the key API's or the proxy's).
    pub fn http(&self, door: Door, method: &Method, status: u16, elapsed: Duration) {
        self.latency[door as usize].record(elapsed);
        let read = matches!(*method, Method::GET | Method::HEAD);
        let outcome = match status {
            500.. => 5,
            404 if read => 1,
            404 if *method == Method::DELETE => 3,
            400..=499 => 4,
            200..=399 if read => 0,
            200..=299 if *method == Method::DELETE => 3,
            200..=299 if matches!(*method, Method::PUT | Method::PATCH | Method::POST) => 2,
            _ => 6,
        };
        if let Some(o) = self.outcomes.get(door as usize) {
            o[outcome].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A memcached command's time (its outcome is in the listener's own counters).
    pub fn memcache(&self, elapsed: Duration) {
        self.latency[Door::Memcache as usize].record(elapsed);
    }

    /// The HTTP doors' outcome counts so far (`None` for memcached's).
    pub fn outcomes(&self, door: Door) -> Option<[u64; OUTCOMES.len()]> {
        let o = self.outcomes.get(door as usize)?;
        Some(std::array::from_fn(|i| o[i].load(Ordering::Relaxed)))
    }

    /// A door's request times so far.
    pub fn latency(&self, door: Door) -> [u64; latency::BUCKETS] {
        self.latency[door as usize].snapshot()
    }

    /// A door's hot keys.
    pub fn hot(&self, door: Door) -> &hot::Hot {
        &self.hot[door as usize]
    }

    /// A read of `key` through `door` served `bytes` (none for a miss): counted for the hot
    /// keys one time in [`hot::SAMPLE_EVERY`], and for the largest values.
    #[inline]
    pub fn read(&self, door: Door, key: &[u8], bytes: Option<u64>) {
        let h = &self.hot[door as usize];
        if hot::sampled() {
            h.count(key);
        }
        if let Some(b) = bytes {
            h.served(key, b);
        }
    }

    /// Keeps a second's figures, dropping the oldest past [`SERIES_SECONDS`].
    pub fn push_point(&self, point: serde_json::Value) {
        let mut s = self.series.lock();
        if s.len() == SERIES_SECONDS {
            s.pop_front();
        }
        s.push_back(point);
        drop(s);
        self.hot.iter().for_each(hot::Hot::tick);
    }

    /// The seconds after `since_ms` (each point's `t`).
    pub fn points_since(&self, since_ms: u64) -> Vec<serde_json::Value> {
        let s = self.series.lock();
        s.iter().filter(|p| p["t"].as_u64().unwrap_or(0) > since_ms).cloned().collect()
    }
}
