//! A memcached listener's state, which its connections share: the open connections (so that
//! past `--max-connections` a quiet one makes room, and `stats conns` lists them), a coarse
//! clock, the key dump running, the log stream, and the meta protocol's per-item state.
//!
//! Per-item state that memcached keeps in its RAM and larder does not write to disk on every
//! read lives in [`Items`]: whether the item was fetched, when it was last bumped, and whether
//! a win token was handed out for it. It is keyed by the key and the write (store time), so a
//! new value starts afresh, and bounded: an item it forgot reads as never fetched, last
//! accessed when stored, no token out. The stale mark (`I`) is part of the stored value.

use super::logs;
use crate::app::App;
use larder_engine::now_ms;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// A connection must have been quiet this long to be closed for a newcomer.
const QUIET_BEFORE_CLOSE: Duration = Duration::from_secs(1);

/// The open memcached connections, so that past `--max-connections` a quiet one makes room.
#[derive(Default)]
pub struct Registry {
    next_id: u64,
    pub open: HashMap<u64, Arc<Entry>>,
}

pub struct Entry {
    /// The client's address, for `stats conns`.
    pub peer: std::net::SocketAddr,
    /// Milliseconds since `epoch` when the connection last finished a command or read a byte.
    pub active_ms: AtomicU64,
    /// Inside a command (a data block being read, an answer being written).
    pub busy: AtomicBool,
    /// Asks the connection to close once it is between commands (a stop, a newcomer past the
    /// limit, the idle timeout). A one-shot channel: the connection polls it on every wait
    /// for the client, and a poll that finds it unchanged is a few atomic reads, where a
    /// `Notify` takes a lock to register and another to leave.
    close: Mutex<Option<oneshot::Sender<()>>>,
}

impl Entry {
    pub fn close(&self) {
        if let Some(tx) = self.close.lock().take() {
            let _ = tx.send(());
        }
    }
}

/// One memcached listener and its connections.
pub struct Listener {
    pub app: Arc<App>,
    /// The listening address, for `stats conns`.
    pub local: Option<std::net::SocketAddr>,
    /// The meta protocol's per-item state.
    pub items: Items,
    pub registry: Mutex<Registry>,
    pub epoch: Instant,
    /// Milliseconds since `epoch`, kept by the accept loop every [`CLOCK_TICK`]: connections
    /// note their activity several times per command, for timeouts that are checked every
    /// 100 ms at the finest, so they read this rather than the clock.
    pub clock_ms: AtomicU64,
    /// The key dump running, if any (`operator::dump`): one at a time, as memcached runs one
    /// crawler; another is answered `BUSY`.
    pub dumps: tokio::sync::Semaphore,
    /// The log stream `watch` reads.
    pub log: logs::Log,
}

pub const CLOCK_TICK: Duration = Duration::from_millis(20);

impl Listener {
    pub fn now_ms(&self) -> u64 {
        self.clock_ms.load(Ordering::Relaxed)
    }

    /// Registers a new connection, closing the longest-quiet idle one if the limit is reached;
    /// `None` when every connection is busy.
    pub fn admit(&self, peer: std::net::SocketAddr) -> Option<(u64, Arc<Entry>, oneshot::Receiver<()>)> {
        let mut r = self.registry.lock();
        if r.open.len() >= self.app.settings.memcache_max_connections {
            let now = self.now_ms();
            let quiet = QUIET_BEFORE_CLOSE.as_millis() as u64;
            let victim = r
                .open
                .iter()
                .filter(|(_, e)| {
                    // `busy` first: a connection stores its activity, then `busy` (Release).
                    !e.busy.load(Ordering::Acquire) && now.saturating_sub(e.active_ms.load(Ordering::Relaxed)) >= quiet
                })
                .min_by_key(|(_, e)| e.active_ms.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let e = r.open.remove(&victim?)?;
            e.close();
        }
        let (tx, rx) = oneshot::channel();
        let entry = Arc::new(Entry {
            peer,
            active_ms: AtomicU64::new(self.now_ms()),
            busy: AtomicBool::new(false),
            close: Mutex::new(Some(tx)),
        });
        let id = r.next_id;
        r.next_id += 1;
        r.open.insert(id, entry.clone());
        Some((id, entry, rx))
    }

    /// `stats conns`: the listening socket, then each connection with its address, whether
    /// it is inside a command, and the seconds since it last was.
    pub fn conns(&self) -> String {
        let now = self.now_ms();
        let mut out = String::new();
        let tcp = |a: std::net::SocketAddr| format!("tcp:{a}");
        let local = self.local.map_or_else(String::new, tcp);
        let _ = write!(out, "STAT 0:addr {local}\r\nSTAT 0:state conn_listening\r\nSTAT 0:secs_since_last_cmd 0\r\n");
        let r = self.registry.lock();
        let mut open: Vec<_> = r.open.iter().collect();
        open.sort_by_key(|(id, _)| **id);
        for (id, e) in open {
            let state = if e.busy.load(Ordering::Acquire) { "conn_nread" } else { "conn_parse_cmd" };
            let quiet = now.saturating_sub(e.active_ms.load(Ordering::Relaxed)) / 1000;
            let _ = write!(
                out,
                "STAT {id}:addr {}\r\nSTAT {id}:listen_addr {local}\r\nSTAT {id}:state {state}\r\nSTAT {id}:secs_since_last_cmd {quiet}\r\n",
                tcp(e.peer)
            );
        }
        out.push_str("END\r\n");
        out
    }

    /// Closes the connections that have waited between commands for longer than `idle`.
    pub fn close_idle(&self, idle: Duration) {
        let now = self.now_ms();
        for e in self.registry.lock().open.values() {
            // `busy` first, then the activity stored before it: a connection that has just
            // finished a long command is not seen idle with its old activity time.
            if e.busy.load(Ordering::Acquire) {
                continue;
            }
            let quiet = now.saturating_sub(e.active_ms.load(Ordering::Relaxed));
            if quiet >= idle.as_millis() as u64 {
                e.close();
            }
        }
    }
}

/// memcached bumps an item's last access at most this often (`ITEM_UPDATE_INTERVAL`).
pub const BUMP_EVERY_MS: u64 = 60_000;

/// What memcached keeps of an item in RAM, for the write (store time) it belongs to.
#[derive(Clone, Copy)]
pub struct ItemState {
    pub stored_ms: u64,
    pub bumped_ms: u64,
    pub fetched: bool,
    pub token_sent: bool,
}

/// The per-item state of the meta protocol, for the items it was asked about or fetched.
/// Fetches are tracked from the first meta command that reads the state (`h`, `l`, `me`) or
/// hands out a win token on: until then a get costs nothing here.
pub struct Items {
    cache: quick_cache::sync::Cache<Vec<u8>, ItemState>,
    tracking: std::sync::atomic::AtomicBool,
}

impl Default for Items {
    fn default() -> Items {
        Items { cache: quick_cache::sync::Cache::new(1 << 18), tracking: Default::default() }
    }
}

impl Items {
    pub fn state(&self, key: &[u8], stored_ms: u64) -> ItemState {
        self.tracking.store(true, std::sync::atomic::Ordering::Relaxed);
        match self.cache.get(key) {
            Some(s) if s.stored_ms == stored_ms => s,
            _ => ItemState { stored_ms, bumped_ms: stored_ms, fetched: false, token_sent: false },
        }
    }

    /// When the item was last bumped (ms) and whether it was fetched, for `lru_crawler
    /// metadump`; fetches are tracked from the first such question on.
    pub fn seen(&self, key: &[u8], stored_ms: u64) -> (u64, bool) {
        let s = self.state(key, stored_ms);
        (s.bumped_ms, s.fetched)
    }

    /// A fetch of the item (a get of any kind, not `mg … u`): fetched from now on, and bumped
    /// if its last bump is older than a minute.
    pub fn fetched(&self, key: &[u8], stored_ms: u64) {
        if !self.tracking.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut s = self.state(key, stored_ms);
        let now = now_ms();
        let bump = now.saturating_sub(s.bumped_ms) >= BUMP_EVERY_MS;
        if s.fetched && !bump {
            return;
        }
        s.fetched = true;
        if bump {
            s.bumped_ms = now;
        }
        self.cache.insert(key.to_vec(), s);
    }

    pub fn set(&self, key: &[u8], s: ItemState) {
        self.cache.insert(key.to_vec(), s);
    }
}
