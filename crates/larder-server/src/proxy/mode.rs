//! The read-through mode's state, process-wide: the origin, the flights under way, the URIs
//! passed through for a while, the counters; and the effective request URI every cache key
//! is made from.

use super::flight::Flights;
use super::origin::Origin;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HOST};
use hyper::Request;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub(super) static X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// How long a URI whose response could not be stored is passed straight through, without its
/// requests waiting on one another (Varnish's hit-for-pass).
pub(super) const PASS_FOR_MS: u64 = 30_000;

/// Counters of the read-through mode, rendered at `/_larder/metrics`.
#[derive(Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub revalidated: AtomicU64,
    pub revalidated_changed: AtomicU64,
    pub stale: AtomicU64,
    pub passes: AtomicU64,
    pub coalesced: AtomicU64,
    pub stored: AtomicU64,
    pub not_stored: AtomicU64,
    pub origin_errors: AtomicU64,
    pub invalidations: AtomicU64,
    pub purges: AtomicU64,
}

/// The read-through mode's state.
pub struct Proxy {
    pub origin: Origin,
    pub(super) flights: Flights,
    /// Cache keys passed through until a time (ms), after a response that could not be stored.
    pub(super) pass_until: quick_cache::sync::Cache<Vec<u8>, u64>,
    pub counters: Counters,
    /// `--stale-if-error`: how long past freshness a response may be served when the origin fails.
    pub(super) stale_if_error: u64,
    /// How long a request waits on another's fetch of the same key before fetching itself.
    pub(super) lock_timeout: Duration,
    pub(super) origin_latency: metrics::Histogram,
}

/// The read-through mode's state, process-wide: set once at start when `--origin` is given.
static STATE: std::sync::OnceLock<Proxy> = std::sync::OnceLock::new();

/// Turns read-through mode on for the settings' origin, if they name one.
pub fn start(s: &crate::config::Settings) -> Result<(), String> {
    if let Some(p) = Proxy::new(s)? {
        let _ = STATE.set(p);
    }
    Ok(())
}

/// The read-through mode's state, when it is on.
pub fn state() -> Option<&'static Proxy> {
    STATE.get()
}

impl Proxy {
    /// The proxy for the settings' origin.
    fn new(s: &crate::config::Settings) -> Result<Option<Proxy>, String> {
        let Some(url) = &s.origin else { return Ok(None) };
        Ok(Some(Proxy {
            origin: Origin::new(url, s.origin_connect_timeout, s.origin_read_timeout)?,
            flights: Flights::default(),
            pass_until: quick_cache::sync::Cache::new(100_000),
            counters: Counters::default(),
            stale_if_error: s.stale_if_error.as_secs(),
            lock_timeout: s.cache_lock_timeout,
            origin_latency: metrics::histogram!("larder_origin_duration_seconds"),
        }))
    }

    pub(super) fn passing(&self, key: &[u8], now: u64) -> bool {
        self.pass_until.get(key).is_some_and(|until| until > now)
    }
}

/// The effective request URI (RFC 9110 §7.1) without the scheme: host (lower-cased) and target;
/// `None` when `Host` is not one valid authority (a `/` in it would make two URIs one key).
pub(crate) fn effective_uri(req: &Request<Incoming>, origin: &Origin) -> Option<Vec<u8>> {
    // More than one Host is a bad request (RFC 9112 §3.2).
    if req.headers().get_all(HOST).iter().nth(1).is_some() {
        return None;
    }
    let host = req.headers().get(HOST).map(|h| h.as_bytes()).unwrap_or(origin.authority.as_bytes());
    let valid = hyper::http::uri::Authority::try_from(host).is_ok_and(|a| a.as_str().len() == host.len())
        && !host.iter().any(|&b| b == b'@' || b == b'/');
    if !valid {
        return None;
    }
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut uri = host.to_ascii_lowercase();
    uri.extend_from_slice(target.as_bytes());
    Some(uri)
}
