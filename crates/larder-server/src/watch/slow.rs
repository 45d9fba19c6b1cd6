//! The slow requests' traces: every request is traced while a threshold is set
//! (`--slow-request`, changed at run time through `/_larder/slow`), and a request that took
//! longer keeps its trace here (the last [`KEEP`]) and in its warning line; the others'
//! traces are dropped with them.

use larder_engine::trace::{Instant, Span, Trace};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Slow traces kept.
pub const KEEP: usize = 64;
/// The longest key (as text) a kept trace shows.
const KEY_SHOWN: usize = 200;

/// One slow request and where its time went.
#[derive(Clone, Debug)]
pub struct SlowTrace {
    /// When it ended (ms since the Unix epoch).
    pub at_ms: u64,
    /// The door it came through.
    pub door: &'static str,
    /// Its method or command.
    pub method: String,
    /// Its key or path, as text, cut to 200 characters.
    pub key: String,
    /// Its answer: an HTTP status, or memcached's outcome.
    pub status: String,
    /// Its whole time.
    pub total: Duration,
    /// Its spans, in the order they ended.
    pub spans: Vec<Span>,
    /// Spans not kept.
    pub dropped: u32,
}

/// The threshold and the kept traces.
pub struct Slow {
    threshold_ns: AtomicU64,
    kept: Mutex<VecDeque<SlowTrace>>,
    total: AtomicU64,
    /// The second (since the Unix epoch) of the last warning lines, and how many were written
    /// in it: at most [`LOG_PER_SECOND`] a second, the rest counted in the next line.
    log_second: AtomicU64,
    logged: AtomicU64,
    unlogged: AtomicU64,
}

/// Warning lines for slow requests written a second at most (they are all kept and counted).
pub const LOG_PER_SECOND: u64 = 10;

impl Slow {
    /// Traces kept for requests slower than `threshold` (zero: none, and none traced).
    pub fn new(threshold: Duration) -> Slow {
        // The clock calibrates on its first reading: here, not in the first request.
        Instant::now();
        Slow {
            threshold_ns: AtomicU64::new(threshold.as_nanos() as u64),
            kept: Mutex::new(VecDeque::with_capacity(KEEP)),
            total: AtomicU64::new(0),
            log_second: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// The threshold (zero: off).
    pub fn threshold(&self) -> Duration {
        Duration::from_nanos(self.threshold_ns.load(Ordering::Relaxed))
    }

    /// Sets the threshold from now on.
    pub fn set_threshold(&self, t: Duration) {
        self.threshold_ns.store(t.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A trace for a request that started at `started`, while a threshold is set.
    #[inline]
    pub fn start(&self, started: Instant) -> Option<Box<Trace>> {
        (self.threshold_ns.load(Ordering::Relaxed) != 0).then(|| Trace::starting(started))
    }

    /// Whether a request that took `elapsed` is slow.
    #[inline]
    pub fn is_slow(&self, elapsed: Duration) -> bool {
        let t = self.threshold_ns.load(Ordering::Relaxed);
        t != 0 && elapsed.as_nanos() as u64 >= t
    }

    /// Keeps a slow request's trace, and logs it.
    pub fn keep(&self, s: SlowTrace) {
        if self.may_log(s.at_ms / 1000) {
            tracing::warn!(
                door = s.door,
                method = %s.method,
                key = %s.key,
                status = %s.status,
                millis = s.total.as_millis() as u64,
                spans = %breakdown(&s),
                not_logged_before = self.unlogged.swap(0, Ordering::Relaxed),
                "slow request"
            );
        } else {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut k = self.kept.lock();
        if k.len() == KEEP {
            k.pop_front();
        }
        k.push_back(s);
    }

    /// Whether a warning line may be written in `second` (a threshold set too low must not
    /// flood the log).
    fn may_log(&self, second: u64) -> bool {
        if self.log_second.swap(second, Ordering::Relaxed) != second {
            self.logged.store(0, Ordering::Relaxed);
        }
        self.logged.fetch_add(1, Ordering::Relaxed) < LOG_PER_SECOND
    }

    /// The last `n` kept traces, newest first.
    pub fn last(&self, n: usize) -> Vec<SlowTrace> {
        self.kept.lock().iter().rev().take(n).cloned().collect()
    }

    /// Slow requests seen since start.
    pub fn seen(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// A key or path as text for a trace: lossy UTF-8, control characters escaped, cut.
pub fn shown(key: &[u8]) -> String {
    let cut = &key[..key.len().min(KEY_SHOWN)];
    let mut s: String = String::from_utf8_lossy(cut).chars().flat_map(char::escape_default).collect();
    if key.len() > KEY_SHOWN {
        s.push('…');
    }
    s
}

/// The top-level spans in one line (`disk_read 301.2ms 4096B, wake 0.1ms`), then the time
/// no span covers.
pub fn breakdown(s: &SlowTrace) -> String {
    let mut line = String::new();
    let mut covered = 0;
    for sp in s.spans.iter().filter(|sp| sp.depth == 0) {
        covered += sp.dur_ns;
        if !line.is_empty() {
            line.push_str(", ");
        }
        let _ = write!(line, "{} {:.1}ms", sp.step.name(), sp.dur_ns as f64 / 1e6);
        if sp.bytes > 0 {
            let _ = write!(line, " {}B", sp.bytes);
        }
    }
    let rest = (s.total.as_nanos() as u64).saturating_sub(covered);
    let _ = write!(line, "{}untraced {:.1}ms", if line.is_empty() { "" } else { ", " }, rest as f64 / 1e6);
    line
}

/// A kept trace as JSON: its spans with their step, depth, start and length in µs, and bytes.
pub fn to_json(s: &SlowTrace) -> serde_json::Value {
    let us = |ns: u64| ns as f64 / 1e3;
    let covered: u64 = s.spans.iter().filter(|sp| sp.depth == 0).map(|sp| sp.dur_ns).sum();
    serde_json::json!({
        "at_ms": s.at_ms,
        "door": s.door,
        "method": s.method,
        "key": s.key,
        "status": s.status,
        "total_us": us(s.total.as_nanos() as u64),
        "untraced_us": us((s.total.as_nanos() as u64).saturating_sub(covered)),
        "dropped_spans": s.dropped,
        "spans": s.spans.iter().map(|sp| serde_json::json!({
            "step": sp.step.name(),
            "depth": sp.depth,
            "start_us": us(sp.start_ns),
            "us": us(sp.dur_ns),
            "bytes": sp.bytes,
        })).collect::<Vec<_>>(),
    })
}
