//! The listener's counters (commands by outcome, both protocols; connections; bytes) and
//! memcached's `stats` command over them and the store.

use super::exec::version;
use super::{counters, Conn};
use crate::storeio::blocking;
use larder_engine::{now_ms, Store};
use std::sync::atomic::{AtomicU64, Ordering};

/// The commands counted apart.
pub const COMMANDS: [&str; 28] = [
    "get",
    "gets",
    "gat",
    "gats",
    "set",
    "add",
    "replace",
    "append",
    "prepend",
    "cas",
    "delete",
    "incr",
    "decr",
    "touch",
    "flush_all",
    "stats",
    "version",
    "verbosity",
    "quit",
    "mn",
    "mg",
    "ms",
    "md",
    "ma",
    "me",
    "noop",
    "auth",
    "other",
];
/// The kinds of get.
const GETS: [&str; 4] = ["get", "gets", "gat", "gats"];
/// The outcomes counted apart.
pub const OUTCOMES: [&str; 11] = [
    "hit",
    "miss",
    "stored",
    "not_stored",
    "exists",
    "not_found",
    "deleted",
    "touched",
    "ok",
    "client_error",
    "server_error",
];

#[derive(Clone, Copy)]
pub(super) enum Outcome {
    Hit,
    Miss,
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Touched,
    Ok,
    ClientError,
    ServerError,
}

pub(super) fn command_index(name: &[u8]) -> usize {
    COMMANDS.iter().position(|c| c.as_bytes() == name).unwrap_or(COMMANDS.len() - 1)
}

/// The memcached listener's counters: connections and bytes, and commands by outcome (one per
/// key of a get). `/_larder/stats`, `/_larder/metrics` and memcached's own `stats` read them.
pub struct Counters {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    commands: [[AtomicU64; OUTCOMES.len()]; COMMANDS.len()],
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            commands: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }
}

impl Counters {
    pub(super) fn count(&self, command: usize, outcome: Outcome) {
        self.commands[command][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many `command`s ended in `outcome` (both by name).
    pub fn get(&self, command: &str, outcome: &str) -> u64 {
        let c = COMMANDS.iter().position(|&n| n == command);
        let o = OUTCOMES.iter().position(|&n| n == outcome);
        c.zip(o).map_or(0, |(c, o)| self.commands[c][o].load(Ordering::Relaxed))
    }

    /// Every (command, outcome, count) with a count above zero.
    pub fn nonzero(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut v = Vec::new();
        for (c, row) in self.commands.iter().enumerate() {
            for (o, n) in row.iter().enumerate() {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    v.push((COMMANDS[c], OUTCOMES[o], n));
                }
            }
        }
        v
    }

    pub(super) fn sum(&self, commands: &[&str], outcomes: &[&str]) -> u64 {
        commands.iter().flat_map(|c| outcomes.iter().map(move |o| self.get(c, o))).sum()
    }

    /// memcached's `get_hits`: keys found by any kind of get.
    pub(super) fn get_hits(&self) -> u64 {
        self.sum(&GETS, &["hit"])
    }

    /// memcached's `cmd_set`: storage commands, whatever their outcome.
    pub(super) fn cmd_set(&self) -> u64 {
        self.sum(&["set", "add", "replace", "append", "prepend", "cas"], &OUTCOMES)
    }

    /// memcached's `touch_hits`: touches and gets-and-touches that found their key.
    pub(super) fn touch_hits(&self) -> u64 {
        self.get("touch", "touched") + self.sum(&["gat", "gats"], &["hit"])
    }
}

/// `stats settings`: the settings of memcached's that larder has a counterpart of.
fn settings(c: &Conn, store: &Store) -> String {
    let cfg = store.config();
    let s = &c.app.settings;
    let lines = [
        ("maxbytes", cfg.volume_size * cfg.volume_count as u64),
        ("maxconns", s.memcache_max_connections as u64),
        ("tcpport", s.memcache_listen.map_or(0, |a| a.port() as u64)),
        ("item_size_max", cfg.max_value_size),
        ("idle_timeout", s.idle_timeout.as_secs()),
    ];
    let mut out: String = lines.iter().map(|(k, v)| format!("STAT {k} {v}\r\n")).collect();
    // What larder has of memcached's switches: no slab reassignment, LRU maintainer, size
    // tracking, detail counts or shutdown command; dumps are on.
    out.push_str(concat!(
        "STAT evictions on\r\nSTAT cas_enabled yes\r\nSTAT flush_enabled yes\r\nSTAT dump_enabled yes\r\n",
        "STAT shutdown_command no\r\nSTAT detail_enabled no\r\nSTAT slab_reassign no\r\nSTAT lru_crawler yes\r\n",
        "STAT lru_maintainer_thread no\r\nSTAT track_sizes no\r\nEND\r\n"
    ));
    out
}

/// `stats`: memcached's general statistics, under its field names, from the store and this
/// listener's counters. `stats reset` and the detail groups larder has no counterpart for
/// answer as memcached's do when empty.
pub(super) async fn stats(c: &Conn, store: &Store, args: &[&[u8]]) -> String {
    let m = counters();
    m.count(command_index(b"stats"), Outcome::Ok);
    match args.first().copied() {
        None | Some(b"items" | b"slabs") => {}
        // The counters are the server's own (metrics read them); the per-prefix ones go.
        Some(b"reset") => {
            super::logs::detail().reset();
            return "RESET\r\n".into();
        }
        // Per-prefix counts (`watch::Detail`).
        Some(b"detail") => match args.get(1).copied() {
            Some(w @ (b"on" | b"off")) => {
                super::logs::detail().set(w == b"on");
                return "OK\r\n".into();
            }
            Some(b"dump") => return super::logs::detail().dump(),
            _ => return "CLIENT_ERROR usage: stats detail on|off|dump\r\n".into(),
        },
        Some(b"settings") => return settings(c, store),
        // As memcached without -o track_sizes.
        Some(b"sizes") => return "STAT sizes_status disabled\r\nEND\r\n".into(),
        Some(b"conns") => return c.listener.conns(),
        Some(b"extstore") => return "END\r\n".into(),
        Some(_) => return "ERROR\r\n".into(),
    }
    let Ok(s) = blocking(&c.app, |s| Ok(s.stats())).await else { return "SERVER_ERROR stats unavailable\r\n".into() };
    match args.first().copied() {
        Some(b"items") => return super::operator::items(&s),
        Some(b"slabs") => return super::operator::slabs(&s),
        _ => {}
    }
    let now = now_ms();
    let mut out = String::new();
    let mut stat = |name: &str, value: String| {
        out.push_str("STAT ");
        out.push_str(name);
        out.push(' ');
        out.push_str(&value);
        out.push_str("\r\n");
    };
    stat("pid", std::process::id().to_string());
    stat("uptime", c.app.started.elapsed().as_secs().to_string());
    stat("time", (now / 1000).to_string());
    stat("version", version());
    stat("pointer_size", (8 * std::mem::size_of::<usize>()).to_string());
    stat("max_connections", c.app.settings.memcache_max_connections.to_string());
    stat("curr_connections", m.curr_connections.load(Ordering::Relaxed).to_string());
    stat("total_connections", m.total_connections.load(Ordering::Relaxed).to_string());
    stat("rejected_connections", m.rejected_connections.load(Ordering::Relaxed).to_string());
    stat("cmd_get", m.sum(&GETS, &["hit", "miss"]).to_string());
    stat("cmd_set", m.cmd_set().to_string());
    stat("cmd_flush", m.sum(&["flush_all"], &["ok"]).to_string());
    stat("cmd_touch", m.sum(&["touch", "gat", "gats"], &["touched", "not_found", "hit", "miss"]).to_string());
    stat("get_hits", m.get_hits().to_string());
    stat("get_misses", m.sum(&GETS, &["miss"]).to_string());
    stat("delete_misses", m.get("delete", "not_found").to_string());
    stat("delete_hits", m.get("delete", "deleted").to_string());
    stat("incr_misses", m.get("incr", "miss").to_string());
    stat("incr_hits", m.get("incr", "hit").to_string());
    stat("decr_misses", m.get("decr", "miss").to_string());
    stat("decr_hits", m.get("decr", "hit").to_string());
    stat("cas_misses", m.get("cas", "not_found").to_string());
    stat("cas_hits", m.get("cas", "stored").to_string());
    stat("cas_badval", m.get("cas", "exists").to_string());
    stat("touch_hits", m.touch_hits().to_string());
    stat("touch_misses", (m.get("touch", "not_found") + m.sum(&["gat", "gats"], &["miss"])).to_string());
    stat("bytes_read", m.bytes_read.load(Ordering::Relaxed).to_string());
    stat("bytes_written", m.bytes_written.load(Ordering::Relaxed).to_string());
    stat("limit_maxbytes", s.capacity_bytes.to_string());
    stat("threads", std::thread::available_parallelism().map_or(1, |n| n.get()).to_string());
    stat("bytes", s.bytes_used.to_string());
    stat("curr_items", s.keys.to_string());
    stat("total_items", s.puts.to_string());
    stat("evictions", s.evicted_entries.to_string());
    stat("accepting_conns", u64::from(!c.app.stopping()).to_string());
    // larder's own, after memcached's fields.
    stat("foreign_writes", s.capped_writes.to_string());
    stat("started_empty", u64::from(s.recovery.started_empty).to_string());
    stat("downtime_flushes", s.downtime_flushes.to_string());
    out.push_str("END\r\n");
    out
}
