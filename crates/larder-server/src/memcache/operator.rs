//! memcached's `stats` (its groups, from the store and the listener's counters) and its
//! operator commands: the key dumps operators' tools use (`stats cachedump`, which
//! libmemcached's `memcdump` walks; `lru_crawler metadump`), `stats items`, `slabs` and `sizes`
//! from larder's own counters, and the rest answered as memcached answers them with the
//! feature off (`-W`, `no_slab_reassign`, `no_lru_maintainer`, no `-A`), so that no client or
//! tool waits for an answer that never comes.
//!
//! larder has no slab classes: every item is in class 1, as one class of memcached's would
//! hold them. Keys come from a scan of the volumes' record headers (the index keeps only
//! hashes), on the blocking pool, streamed to the client as they are found: memory stays at a
//! batch of lines whatever the number of keys.

use super::conn::{Conn, End};
use super::counters::{command_index, counters, version, Outcome, GETS};
use super::logs::{detail, stamp, FETCHERS, MUTATIONS};
use super::wire::{KEY_MAX, URI_ENCODE};
use crate::storeio::blocking;
use bytes::Bytes;
use larder_engine::{now_ms, KeyInfo, Store};
use std::sync::atomic::Ordering;
use tokio::sync::broadcast;
// `fmt::Write` for the stats strings, `io::Write` for the dump lines (a `Vec<u8>`).
use std::fmt::Write as _;
use std::io::Write as _;

/// memcached's slab class ids stop below this (`MAX_NUMBER_OF_SLAB_CLASSES`).
const CLASSES: i64 = 64;
/// The one class larder's items are in.
const CLASS: i64 = 1;
/// The longest a dump waits for its client to take a batch of lines.
const DUMP_STALL: std::time::Duration = std::time::Duration::from_secs(60);
/// Dump lines gathered before they are sent (a guess: a step's lines may be more or fewer).
const BATCH: usize = 32 << 10;
/// Volume bytes a step of a dump reads: its lines are a fraction of that.
const STEP: u64 = 1 << 20;

fn number(w: &[u8]) -> Option<i64> {
    std::str::from_utf8(w).ok()?.parse().ok()
}

/// `stats items`: class 1 holds every item (fields as memcached gives them without its LRU
/// maintainer: no hot, warm or cold segments).
pub fn items(s: &larder_engine::Stats) -> String {
    if s.keys == 0 {
        return "END\r\n".into();
    }
    let fields: [(&str, u64); 14] = [
        ("number", s.keys),
        ("age", 0),
        ("mem_requested", s.bytes_used),
        ("evicted", s.evicted_entries),
        ("evicted_nonzero", 0),
        ("evicted_time", 0),
        ("outofmemory", 0),
        ("tailrepairs", 0),
        ("reclaimed", 0),
        ("expired_unfetched", 0),
        ("evicted_unfetched", 0),
        ("crawler_reclaimed", 0),
        ("crawler_items_checked", 0),
        ("lrutail_reflocked", 0),
    ];
    let mut out = String::new();
    for (name, v) in fields {
        let _ = write!(out, "STAT items:{CLASS}:{name} {v}\r\n");
    }
    out.push_str("END\r\n");
    out
}

/// `stats slabs`: class 1 is the ring of volumes; a "page" is a volume, a "chunk" an item of
/// the average size; the per-class command counts are the listener's.
pub fn slabs(s: &larder_engine::Stats) -> String {
    if s.keys == 0 {
        return "STAT active_slabs 0\r\nSTAT total_malloced 0\r\nEND\r\n".into();
    }
    let m = counters();
    let avg = (s.bytes_used / s.keys).max(1);
    let fields: [(&str, u64); 15] = [
        ("chunk_size", avg),
        ("chunks_per_page", s.volume_size / avg),
        ("total_pages", s.volumes),
        ("total_chunks", s.keys),
        ("used_chunks", s.keys),
        ("free_chunks", 0),
        ("free_chunks_end", 0),
        ("get_hits", m.get_hits()),
        ("cmd_set", m.cmd_set()),
        ("delete_hits", m.get("delete", "deleted")),
        ("incr_hits", m.get("incr", "hit")),
        ("decr_hits", m.get("decr", "hit")),
        ("cas_hits", m.get("cas", "stored")),
        ("cas_badval", m.get("cas", "exists")),
        ("touch_hits", m.touch_hits()),
    ];
    let mut out = String::new();
    for (name, v) in fields {
        let _ = write!(out, "STAT {CLASS}:{name} {v}\r\n");
    }
    let _ = write!(out, "STAT active_slabs 1\r\nSTAT total_malloced {}\r\nEND\r\n", s.bytes_used);
    out
}

/// Whether memcached's text protocol can name `key`: it is a word of a command line.
fn speakable(key: &[u8]) -> bool {
    key.len() <= KEY_MAX && key.iter().all(|&b| b > b' ' && b != 0x7f)
}

/// `stats cachedump CLASS LIMIT`: `ITEM <key> [<bytes> b; <expiry, Unix seconds, 0 = never> s]`
/// per item of the class (LIMIT of them; 0 = all), then `END`. Keys memcached's text protocol
/// cannot name (HTTP keys with spaces, longer than 250 bytes) are left out.
pub async fn cachedump(c: &mut Conn, args: &[&[u8]]) -> Result<(), End> {
    counters().count(command_index(b"stats"), Outcome::Ok);
    let (class, limit) = match args {
        [_, class, limit, ..] => match (number(class), number(limit)) {
            (Some(c), Some(l)) if c >= 0 && l >= 0 => (c, l as u64),
            _ => return line(c, "CLIENT_ERROR bad command line format\r\n"),
        },
        _ => return line(c, "CLIENT_ERROR bad command line\r\n"),
    };
    if class >= CLASSES {
        return line(c, "CLIENT_ERROR Illegal slab id\r\n");
    }
    if class != CLASS {
        return line(c, "END\r\n");
    }
    dump(c, limit, |out, k| {
        if !speakable(k.key) {
            return false;
        }
        out.extend_from_slice(b"ITEM ");
        out.extend_from_slice(k.key);
        let _ = write!(out, " [{} b; {} s]\r\n", k.len, k.expiry_ms.div_ceil(1000));
        true
    })
    .await
}

/// `lru_crawler metadump all|hash|CLASS[,CLASS…]`: `key=<key, URL-encoded> exp=<Unix seconds,
/// -1 = never> la=<last access> cas=<cas> fetch=<yes|no> cls=1 size=<bytes>` per item, each
/// line ending in `\n` alone as memcached's do, then `END`.
async fn metadump(c: &mut Conn, which: &[u8]) -> Result<(), End> {
    let all = which == b"all" || which == b"hash";
    let mut ours = all;
    if !all {
        for class in which.split(|&b| b == b',') {
            match number(class) {
                Some(n) if (0..CLASSES).contains(&n) => ours |= n == CLASS,
                _ => return line(c, "BADCLASS invalid class id\r\n"),
            }
        }
    }
    if !ours {
        return line(c, "END\r\n");
    }
    let listener = c.listener.clone();
    dump(c, 0, move |out, k| {
        let (last, fetched) = listener.items.seen(k.key, k.stored_ms);
        out.extend_from_slice(b"key=");
        for piece in percent_encoding::percent_encode(k.key, URI_ENCODE) {
            out.extend_from_slice(piece.as_bytes());
        }
        let exp = if k.expiry_ms == 0 { -1 } else { k.expiry_ms.div_ceil(1000) as i64 };
        let fetch = if fetched { "yes" } else { "no" };
        let _ =
            writeln!(out, " exp={exp} la={} cas={} fetch={fetch} cls={CLASS} size={}", last / 1000, k.stored_ms, k.len);
        true
    })
    .await
}

/// Streams the lines `each` writes for the live keys (at most `limit` listed; 0 = all), then
/// `END`. One dump runs at a time (another is answered `BUSY`, memcached's line for a crawler
/// already running), and it holds no thread while its client reads: the keys are listed a
/// step at a time on the blocking pool ([`Store::keys_step`]), each step's lines sent before
/// the next is read.
async fn dump(
    c: &mut Conn,
    limit: u64,
    each: impl FnMut(&mut Vec<u8>, KeyInfo<'_>) -> bool + Send + 'static,
) -> Result<(), End> {
    let listener = c.listener.clone();
    let Ok(_running) = listener.dumps.try_acquire() else {
        return line(c, "BUSY currently processing crawler request\r\n");
    };
    let (mut cursor, mut listed, mut each) = (None, 0u64, each);
    loop {
        let step = blocking(&c.app, move |s| {
            let mut out = Vec::with_capacity(BATCH);
            let next = s.keys_step(cursor, STEP, |k| {
                if limit == 0 || listed < limit {
                    listed += each(&mut out, k) as u64;
                }
            });
            next.map(|next| (out, next, listed, each))
        })
        .await;
        let out;
        (out, cursor, listed, each) = match step {
            Ok(step) => step,
            Err(e) => {
                // What was sent stands; the client sees the dump cut short, never a false END.
                tracing::error!(error = %e, "listing the keys failed");
                return line(c, "SERVER_ERROR reading the volumes failed\r\n");
            }
        };
        if !out.is_empty() {
            // A client that stops taking a dump is closed, whatever --idle-timeout says.
            match tokio::time::timeout(DUMP_STALL, c.send(Bytes::from(out))).await {
                Ok(sent) => sent?,
                Err(_) => return Err(End::Closed),
            }
        }
        if cursor.is_none() || (limit != 0 && listed >= limit) {
            return line(c, "END\r\n");
        }
    }
}

fn line(c: &mut Conn, l: &str) -> Result<(), End> {
    c.out.extend_from_slice(l.as_bytes());
    Ok(())
}

/// The operator commands other than `stats`, by their words (the name first).
pub async fn run(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    counters().count(command_index(b"other"), Outcome::Ok);
    // As memcached: `noreply` silences a success, never an error.
    let noreply = words.len() > 1 && words.last() == Some(&&b"noreply"[..]);
    let words = if noreply { &words[..words.len() - 1] } else { words };
    let arg = |i: usize| words.get(i).copied();
    let n = words.len();
    let answer = match (words[0], arg(1)) {
        (b"watch", _) => return watch(c, words).await,
        (b"slabs", Some(b"automove")) if n == 3 => match number(words[2]) {
            Some(0..=2) => "OK\r\n",
            Some(_) => "ERROR\r\n",
            None => "CLIENT_ERROR bad command line format\r\n",
        },
        // `-o no_slab_reassign`: there are no slab pages to move.
        (b"slabs", Some(b"reassign")) if n == 4 && !noreply => "CLIENT_ERROR slab reassignment disabled\r\n",
        (b"lru_crawler", Some(b"metadump")) if n >= 3 => return metadump(c, words[2]).await,
        // Expired and flushed items are never served, and the ring reclaims their space: a
        // crawl has nothing to do.
        (b"lru_crawler", Some(b"crawl")) if n >= 3 => "OK\r\n",
        (b"lru_crawler", Some(b"sleep")) if n >= 3 => match number(words[2]) {
            Some(us) if (0..=1_000_000).contains(&us) => "OK\r\n",
            Some(_) => "CLIENT_ERROR sleep must be one second or less\r\n",
            None => "CLIENT_ERROR bad command line format\r\n",
        },
        (b"lru_crawler", Some(b"tocrawl")) if n >= 3 => match number(words[2]) {
            Some(_) => "OK\r\n",
            None => "CLIENT_ERROR bad command line format\r\n",
        },
        // The "crawler" (the scan behind metadump) is always there, as in memcached when its
        // thread already runs; it cannot be turned off.
        (b"lru_crawler", Some(b"enable")) => "ERROR failed to start lru crawler thread\r\n",
        // `-o no_lru_maintainer`: only `lru tune` is taken.
        (b"lru", Some(b"tune")) if n == 6 && words[2..].iter().all(|w| float(w)) => "OK\r\n",
        // memcached without `-A`.
        (b"shutdown", _) => "ERROR: shutdown not enabled\r\n",
        (b"cache_memlimit", Some(_)) if n <= 3 => {
            "SERVER_ERROR the memory tier's size is set at start (--memory-capacity)\r\n"
        }
        _ => "ERROR\r\n",
    };
    if noreply && answer == "OK\r\n" {
        return Ok(());
    }
    line(c, answer)
}

/// `watch [fetchers] [mutations] …`: `OK`, then the lines of the kinds asked for (fetchers
/// alone when none is named) until the client goes. Kinds larder has no events of
/// (`evictions`, `sysevents`, …) are taken and stay quiet; an unknown word is `ERROR`.
async fn watch(c: &mut Conn, words: &[&[u8]]) -> Result<(), End> {
    let mut kinds = 0u8;
    for w in &words[1..] {
        kinds |= match *w {
            b"fetchers" => FETCHERS,
            b"mutations" => MUTATIONS,
            b"rawcmds" | b"evictions" | b"sysevents" | b"connevents" | b"proxyreqs" | b"proxyevents" | b"proxyuser" => {
                0
            }
            _ => return line(c, "ERROR\r\n"),
        };
    }
    if words.len() == 1 {
        kinds = FETCHERS;
    }
    let listener = c.listener.clone();
    let (mut rx, _watching) = listener.log.subscribe();
    c.out.extend_from_slice(b"OK\r\n");
    c.flush().await?;
    // Bytes from the client meanwhile are read and ignored, as memcached's watchers do.
    while let Some(event) = c.while_here(rx.recv()).await {
        match event {
            Ok((kind, line)) if kind & kinds != 0 => c.send(Bytes::copy_from_slice(line.as_bytes())).await?,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                c.send(Bytes::from(format!("{} type=skipped count={n}\n", stamp()))).await?
            }
            Err(broadcast::error::RecvError::Closed) => break,
            Ok(_) => {}
        }
    }
    Err(End::Closed)
}

fn float(w: &[u8]) -> bool {
    std::str::from_utf8(w).ok().and_then(|s| s.parse::<f64>().ok()).is_some()
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
pub async fn stats(c: &Conn, store: &Store, args: &[&[u8]]) -> String {
    let m = counters();
    m.count(command_index(b"stats"), Outcome::Ok);
    match args.first().copied() {
        None | Some(b"items" | b"slabs") => {}
        // The counters are the server's own (metrics read them); the per-prefix ones go.
        Some(b"reset") => {
            detail().reset();
            return "RESET\r\n".into();
        }
        // Per-prefix counts (`watch::Detail`).
        Some(b"detail") => match args.get(1).copied() {
            Some(w @ (b"on" | b"off")) => {
                detail().set(w == b"on");
                return "OK\r\n".into();
            }
            Some(b"dump") => return detail().dump(),
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
        Some(b"items") => return items(&s),
        Some(b"slabs") => return slabs(&s),
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
