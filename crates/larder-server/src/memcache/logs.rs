//! memcached's log stream (`watch`, memcached's `-W`) and its per-prefix counters
//! (`stats detail`): what an operator watches live and what `memcached-tool` reads.
//!
//! `watch fetchers mutations` (`operator.rs`) turns a connection into a stream of these log
//! lines, one per item fetched (`type=item_get`) or stored (`type=item_store`), in memcached's
//! format, `cfd` being the connection id `stats conns` shows. Lines are made only while
//! someone watches, and a watcher that falls behind loses lines, never slows the commands it
//! watches.

use super::wire::URI_ENCODE;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::broadcast;

/// Items fetched (memcached's `fetchers`).
pub const FETCHERS: u8 = 1;
/// Items stored (memcached's `mutations`).
pub const MUTATIONS: u8 = 2;

/// The log stream of a listener.
pub struct Log {
    tx: broadcast::Sender<Line>,
    gid: AtomicU64,
    /// Connections watching: read on every get, so an atomic, not the channel's own count
    /// (which takes a lock).
    watchers: AtomicUsize,
}

impl Default for Log {
    fn default() -> Log {
        Log { tx: broadcast::channel(4096).0, gid: AtomicU64::new(0), watchers: AtomicUsize::new(0) }
    }
}

/// A watching connection, counted while it lives.
pub struct Watching<'a>(&'a AtomicUsize);

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `key` as memcached's log writes it: URI-encoded.
fn encoded(key: &[u8]) -> String {
    percent_encoding::percent_encode(key, URI_ENCODE).to_string()
}

/// A log line's time stamp, as memcached's.
pub fn stamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("ts={}.{:06}", now.as_secs(), now.subsec_micros())
}

/// A line of the stream: its kind ([`FETCHERS`], [`MUTATIONS`]) and text.
pub type Line = (u8, Arc<str>);

impl Log {
    /// A new watcher: the lines from now on, and its count while the guard lives.
    pub fn subscribe(&self) -> (broadcast::Receiver<Line>, Watching<'_>) {
        let rx = self.tx.subscribe();
        self.watchers.fetch_add(1, Ordering::Relaxed);
        (rx, Watching(&self.watchers))
    }

    /// Whether anyone watches: lines are made only then.
    pub fn watched(&self) -> bool {
        self.watchers.load(Ordering::Relaxed) > 0
    }

    fn send(&self, kind: u8, line: String) {
        let _ = self.tx.send((kind, line.into()));
    }

    /// An item looked up by connection `cfd`: found (`size` bytes) or not.
    pub fn item_get(&self, key: &[u8], found: Option<u64>, cfd: u64) {
        if !self.watched() {
            return;
        }
        let gid = self.gid.fetch_add(1, Ordering::Relaxed) + 1;
        let (status, clsid, size) = match found {
            Some(size) => ("found", 1, size),
            None => ("not_found", 0, 0),
        };
        let key = encoded(key);
        self.send(
            FETCHERS,
            format!(
                "{} gid={gid} type=item_get key={key} status={status} clsid={clsid} cfd={cfd} size={size}\n",
                stamp()
            ),
        );
    }

    /// An item stored by connection `cfd` with storage command `cmd`: its outcome (memcached's
    /// words: stored, not_stored, exists, not_found, too_large), TTL in seconds and size.
    pub fn item_store(&self, key: &[u8], status: &str, cmd: &str, ttl: u64, cfd: u64, size: u64) {
        if !self.watched() {
            return;
        }
        let gid = self.gid.fetch_add(1, Ordering::Relaxed) + 1;
        let key = encoded(key);
        self.send(
            MUTATIONS,
            format!(
                "{} gid={gid} type=item_store key={key} status={status} cmd={cmd} ttl={ttl} clsid=1 cfd={cfd} size={size}\n",
                stamp()
            ),
        );
    }
}

/// Per-prefix counters (`stats detail on|off|dump`): gets, hits, sets and deletes of keys by
/// the part before the first `:`, as memcached's `-D :` counts them.
#[derive(Default)]
pub struct Detail {
    on: AtomicBool,
    prefixes: Mutex<BTreeMap<Vec<u8>, [u64; 4]>>,
}

/// What [`Detail::record`] counts.
#[derive(Clone, Copy)]
pub enum Op {
    /// A get: hit or miss.
    Get {
        hit: bool,
    },
    Set,
    Delete,
}

/// Most prefixes counted: a stream of keys with ever-new prefixes may not grow memory without
/// bound (memcached's table grows; larder keeps the first ones).
const MAX_PREFIXES: usize = 4096;

/// The server's per-prefix counters.
pub fn detail() -> &'static Detail {
    static D: OnceLock<Detail> = OnceLock::new();
    D.get_or_init(Detail::default)
}

impl Detail {
    /// `stats detail on` / `off`.
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// Counts `op` of `key`, while on, if the key has a prefix.
    pub fn record(&self, key: &[u8], op: Op) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let Some(end) = key.iter().position(|&b| b == b':') else { return };
        // A prefix `PREFIX` lines cannot carry (a space or control byte: binary keys may hold
        // them) is not counted.
        if key[..end].iter().any(|&b| b <= b' ' || b == 0x7f) {
            return;
        }
        let mut p = self.prefixes.lock();
        let n = p.len();
        let counts = match p.get_mut(&key[..end]) {
            Some(c) => c,
            None if n < MAX_PREFIXES => p.entry(key[..end].to_vec()).or_default(),
            None => return,
        };
        match op {
            Op::Get { hit } => {
                counts[0] += 1;
                counts[1] += hit as u64;
            }
            Op::Set => counts[2] += 1,
            Op::Delete => counts[3] += 1,
        }
    }

    /// `stats detail dump`: a `PREFIX` line per prefix, then `END`.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (prefix, [get, hit, set, del]) in self.prefixes.lock().iter() {
            let prefix = String::from_utf8_lossy(prefix);
            out.push_str(&format!("PREFIX {prefix} get {get} hit {hit} set {set} del {del}\r\n"));
        }
        out.push_str("END\r\n");
        out
    }

    /// `stats reset`.
    pub fn reset(&self) {
        self.prefixes.lock().clear();
    }
}
