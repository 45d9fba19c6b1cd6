//! memcached's log stream (`watch`, memcached's `-W`) and its per-prefix counters
//! (`stats detail`): what an operator watches live and what `memcached-tool` reads.
//!
//! `watch fetchers mutations` turns the connection into a stream of log lines, one per item
//! fetched (`type=item_get`) or stored (`type=item_store`), in memcached's format, `cfd`
//! being the connection id `stats conns` shows. Lines are made only while someone watches,
//! and a watcher that falls behind loses lines, never slows the commands it watches.

use super::stats::Outcome;
use super::text::REALTIME_MAXDELTA;
use super::{Conn, End};
use crate::storeio::read_body_of;
use bytes::Bytes;
use larder_engine::{Part, Store};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::io::AsyncReadExt;
use tokio::sync::broadcast;

/// Items fetched (memcached's `fetchers`).
pub const FETCHERS: u8 = 1;
/// Items stored (memcached's `mutations`).
pub const MUTATIONS: u8 = 2;

/// The log stream of a listener.
pub struct Log {
    tx: broadcast::Sender<(u8, Arc<str>)>,
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
struct Watching<'a>(&'a AtomicUsize);

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `key` as memcached's log writes it: URI-encoded.
fn encoded(key: &[u8]) -> String {
    percent_encoding::percent_encode(key, super::operator::URI_ENCODE).to_string()
}

fn stamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("ts={}.{:06}", now.as_secs(), now.subsec_micros())
}

impl Log {
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

/// Before a text storage command: whether anyone watches, and if so the lookup of the key a
/// store makes first, as memcached's does (its watchers see an `item_get` for it).
pub(super) async fn before_store(c: &Conn, store: &Store, key: &[u8]) -> bool {
    if !c.listener.log.watched() {
        return false;
    }
    let prior = read_body_of(&c.app, store, key, Part::Nothing).await.ok().flatten();
    c.listener.log.item_get(key, prior.map(|f| f.value().len), c.id);
    true
}

/// After a text storage command (`name`, `exptime` and `len` as the client sent them) that
/// [`before_store`] found watched: its `item_store` line.
pub(super) fn after_store(c: &Conn, key: &[u8], outcome: Outcome, name: &[u8], exptime: i64, len: i64) {
    let status = match outcome {
        Outcome::Stored => "stored",
        Outcome::Exists => "exists",
        Outcome::NotFound => "not_found",
        _ => "not_stored",
    };
    let ttl = match exptime {
        t if t <= 0 => 0,
        t if t <= REALTIME_MAXDELTA => t as u64,
        t => (t as u64).saturating_sub(larder_engine::now_ms() / 1000),
    };
    c.listener.log.item_store(key, status, &String::from_utf8_lossy(name), ttl, c.id, len.max(0) as u64);
}

/// `watch [fetchers] [mutations] …`: `OK`, then the lines of the kinds asked for (fetchers
/// alone when none is named) until the client goes. Kinds larder has no events of
/// (`evictions`, `sysevents`, …) are taken and stay quiet; an unknown word is `ERROR`.
pub(super) async fn watch(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    let mut kinds = 0u8;
    for w in &words[1..] {
        kinds |= match *w {
            b"fetchers" => FETCHERS,
            b"mutations" => MUTATIONS,
            b"rawcmds" | b"evictions" | b"sysevents" | b"connevents" | b"proxyreqs" | b"proxyevents" | b"proxyuser" => {
                0
            }
            _ => {
                c.out.extend_from_slice(b"ERROR\r\n");
                return Ok(());
            }
        };
    }
    if words.len() == 1 {
        kinds = FETCHERS;
    }
    let listener = c.listener.clone();
    let mut rx = listener.log.tx.subscribe();
    listener.log.watchers.fetch_add(1, Ordering::Relaxed);
    let _watching = Watching(&listener.log.watchers);
    c.out.extend_from_slice(b"OK\r\n");
    c.flush().await?;
    enum Event {
        Line(Result<(u8, Arc<str>), broadcast::error::RecvError>),
        /// The client went, or the server asks the connection to close (a stop, the limit).
        Gone,
        /// Bytes from the client, which a watching connection ignores (as memcached's).
        Input,
    }
    let mut scratch = [0u8; 512];
    loop {
        let (stream, close) = (&mut c.stream, &mut c.close);
        let asked = async {
            match close.as_mut() {
                Some(asked) => {
                    let _ = asked.await;
                }
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            r = rx.recv() => Event::Line(r),
            _ = asked => Event::Gone,
            n = stream.read(&mut scratch) => if matches!(n, Ok(0) | Err(_)) { Event::Gone } else { Event::Input },
        };
        match event {
            Event::Line(Ok((kind, line))) if kind & kinds != 0 => {
                c.send(Bytes::copy_from_slice(line.as_bytes())).await?
            }
            Event::Line(Err(broadcast::error::RecvError::Lagged(n))) => {
                c.send(Bytes::from(format!("{} type=skipped count={n}\n", stamp()))).await?
            }
            Event::Line(Err(broadcast::error::RecvError::Closed)) | Event::Gone => return Err(End::Closed),
            Event::Line(Ok(_)) | Event::Input => {}
        }
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
