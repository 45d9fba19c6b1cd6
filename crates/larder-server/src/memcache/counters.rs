//! The listener's counters (commands by outcome, every encoding; connections; bytes), which
//! memcached's `stats`, `/_larder/stats` and `/_larder/metrics` read; and the version larder
//! answers as.

use super::wire::Answer;
use crate::guard::Refusal;
use std::sync::atomic::{AtomicU64, Ordering};

/// The memcached listener's counters, process-wide.
pub fn counters() -> &'static Counters {
    static COUNTERS: std::sync::LazyLock<Counters> = std::sync::LazyLock::new(Counters::default);
    &COUNTERS
}

/// The listener's counters, copied into the metrics when scraped.
pub fn render_metrics() {
    use metrics::{counter, gauge};
    let memcache = counters();
    for (command, outcome, n) in memcache.nonzero() {
        counter!("larder_memcache_commands_total", "command" => command, "outcome" => outcome).absolute(n);
    }
    gauge!("larder_memcache_connections").set(memcache.curr_connections.load(Ordering::Relaxed) as f64);
    counter!("larder_memcache_received_bytes_total").absolute(memcache.bytes_read.load(Ordering::Relaxed));
    counter!("larder_memcache_sent_bytes_total").absolute(memcache.bytes_written.load(Ordering::Relaxed));
}

/// The version larder answers `version` and `stats` with: the memcached protocol level it
/// answers as first, as memcached's own number (libmemcached's tools read a major.minor.micro
/// there and refuse a major of 0), then larder's own.
pub fn version() -> String {
    format!("{MEMCACHED_LEVEL}-larder-{}", env!("CARGO_PKG_VERSION"))
}

/// The memcached release whose answers larder's are compared with (tests/memcache_diff.rs).
const MEMCACHED_LEVEL: &str = "1.6.18";

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
/// Where `incr` and `decr` are in [`COMMANDS`] (the kinds of get come first).
const INCR: usize = 11;
const DECR: usize = 12;
/// The kinds of get.
pub const GETS: [&str; 4] = ["get", "gets", "gat", "gats"];
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
pub enum Outcome {
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

#[inline]
pub fn command_index(name: &[u8]) -> usize {
    COMMANDS.iter().position(|c| c.as_bytes() == name).unwrap_or(COMMANDS.len() - 1)
}

/// How an answer to the command `command` ([`command_index`]) counts, whichever encoding it goes out in: a get's or
/// an arithmetic's miss is a miss; a refusal as read-only is the server's error, another the
/// client's.
#[inline]
pub fn outcome(command: usize, a: &Answer) -> Outcome {
    let lookup = command < GETS.len() || command == INCR || command == DECR;
    match a {
        Answer::Stored { .. } => Outcome::Stored,
        Answer::NotStored => Outcome::NotStored,
        Answer::Exists => Outcome::Exists,
        Answer::NotFound if lookup => Outcome::Miss,
        Answer::NotFound => Outcome::NotFound,
        Answer::Deleted => Outcome::Deleted,
        Answer::Touched { .. } => Outcome::Touched,
        Answer::Number { .. } => Outcome::Hit,
        Answer::Ok | Answer::Noop | Answer::Version(_) | Answer::Bye | Answer::Authenticated(_) => Outcome::Ok,
        Answer::TooLarge | Answer::NotReady | Answer::Refused(Refusal::ReadOnly) => Outcome::ServerError,
        Answer::Failed { client, .. } if !client => Outcome::ServerError,
        Answer::NonNumeric
        | Answer::BadChunk
        | Answer::AuthFailed
        | Answer::Refused(_)
        | Answer::Invalid
        | Answer::Unknown
        | Answer::Failed { .. } => Outcome::ClientError,
    }
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
    pub fn count(&self, command: usize, outcome: Outcome) {
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

    pub fn sum(&self, commands: &[&str], outcomes: &[&str]) -> u64 {
        commands.iter().flat_map(|c| outcomes.iter().map(move |o| self.get(c, o))).sum()
    }

    /// memcached's `get_hits`: keys found by any kind of get.
    pub fn get_hits(&self) -> u64 {
        self.sum(&GETS, &["hit"])
    }

    /// memcached's `cmd_set`: storage commands, whatever their outcome.
    pub fn cmd_set(&self) -> u64 {
        self.sum(&["set", "add", "replace", "append", "prepend", "cas"], &OUTCOMES)
    }

    /// memcached's `touch_hits`: touches and gets-and-touches that found their key.
    pub fn touch_hits(&self) -> u64 {
        self.get("touch", "touched") + self.sum(&["gat", "gats"], &["hit"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_of_a_lookup_is_a_miss_and_of_anything_else_not_found() {
        assert_eq!((COMMANDS[INCR], COMMANDS[DECR]), ("incr", "decr"));
        assert!(GETS.iter().enumerate().all(|(i, g)| COMMANDS[i] == *g), "the gets come first");
        for (name, want) in
            [("get", "miss"), ("gat", "miss"), ("decr", "miss"), ("delete", "not_found"), ("touch", "not_found")]
        {
            let o = outcome(command_index(name.as_bytes()), &Answer::NotFound);
            assert_eq!(OUTCOMES[o as usize], want, "{name}");
        }
    }
}
