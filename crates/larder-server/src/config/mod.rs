//! Configuration: command-line flags and the TOML file (same names), flags winning, and the
//! parsers for sizes and durations. Parsing is pure so it is tested without a server.

use crate::cluster::{self, Placement, Ring};
use clap::Args;
use larder_engine::{Compression, Eviction, FsyncPolicy, MemoryConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Who serves HTTP/1.1 connections (`--http-server`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpServer {
    Native,
    Hyper,
}

impl std::str::FromStr for HttpServer {
    type Err = String;
    fn from_str(s: &str) -> Result<HttpServer, String> {
        match s {
            "native" => Ok(HttpServer::Native),
            "hyper" => Ok(HttpServer::Hyper),
            _ => Err(format!("invalid --http-server {s:?}: use native or hyper")),
        }
    }
}

/// Parses a size: a bare integer is bytes; KB/MB/GB/TB are powers of 1000 and
/// KiB/MiB/GiB/TiB powers of 1024; case-insensitive; `B` alone is bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}: expected e.g. 4096, 64KiB, 1GB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(format!("invalid size unit in {s:?}: use KB, MB, GB, KiB, MiB or GiB")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

/// Parses a duration: `ms`, `s`, `m`, `h`, `d` suffixes; a bare integer is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}: expected e.g. 500ms, 1s, 5m"))?;
    let secs =
        |per: u64| n.checked_mul(per).map(Duration::from_secs).ok_or_else(|| format!("duration {s:?} is too long"));
    match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => Err(format!("invalid duration unit in {s:?}: use ms, s, m, h or d")),
    }
}

/// Parses `never`, `always` or a duration.
pub fn parse_fsync(s: &str) -> Result<FsyncPolicy, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "never" => Ok(FsyncPolicy::Never),
        "always" => Ok(FsyncPolicy::Always),
        other => match parse_duration(other) {
            Ok(d) if d.is_zero() => Ok(FsyncPolicy::Always),
            Ok(d) => Ok(FsyncPolicy::Every(d)),
            Err(_) => Err(format!("invalid --fsync {s:?}: use never, always or a duration such as 1s")),
        },
    }
}

/// Warnings, and the start-up and shutdown progress (target `larder::lifecycle`).
pub const DEFAULT_LOG_LEVEL: &str = "warn,larder::lifecycle=info";

/// `larder serve` flags. Every flag has a same-named key (with `_`) in the TOML file.
#[derive(Args, Debug, Default)]
pub struct ServeArgs {
    /// TOML configuration file; flags given on the command line override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory holding the manifest, volume and hint files; repeat it for one per disk
    /// (new volumes go to the least utilized; the order does not matter) [default: ./larder-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Vec<PathBuf>,
    /// Refuse to start when a data directory that held volumes is missing, instead of starting
    /// without it (degraded, with a loud warning).
    #[arg(long)]
    pub strict_dirs: bool,
    /// Address to listen on [default: 127.0.0.1:1234].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Read-through mode: the HTTP listener becomes a shared HTTP cache (RFC 9111) in front of
    /// this origin, e.g. http://127.0.0.1:8080 (docs/HTTP-CACHING.md) [default: off].
    #[arg(long, value_name = "URL")]
    pub origin: Option<String>,
    /// Read-through mode: time allowed to connect to the origin [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub origin_connect_timeout: Option<Duration>,
    /// Read-through mode: the longest wait for the origin's response head, and between two
    /// pieces of its body [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub origin_read_timeout: Option<Duration>,
    /// Read-through mode: how long past its freshness a stored response may still be served
    /// when the origin cannot be reached (refused, timed out, broken off), for responses that
    /// do not say (RFC 5861's stale-if-error; never past must-revalidate, no-cache or
    /// s-maxage); 0 turns it off [default: 1h].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub stale_if_error: Option<Duration>,
    /// Read-through mode: how long a request waits for another request's origin fetch of the
    /// same URI before it fetches on its own [default: 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub cache_lock_timeout: Option<Duration>,
    /// Also speak memcached's protocol on this address, over the same store (off unless given;
    /// 127.0.0.1:11211 is memcached's own).
    #[arg(long, value_name = "ADDR")]
    pub memcache_listen: Option<SocketAddr>,
    /// Size of each volume file, e.g. 1GiB or 512MB [default: 1GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub volume_size: Option<u64>,
    /// Volume files in the ring; disk use is at most volume-count x volume-size [default: 16].
    #[arg(long, value_name = "N")]
    pub volume_count: Option<u32>,
    /// Largest value accepted; larger PUTs get 413. At most a quarter of the ring (larger
    /// settings are lowered, with a warning) [default: 1GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_value_size: Option<u64>,
    /// Values longer than this are stored, streamed and read in chunks of this size; shorter
    /// ones are one record [default: 1MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// Bytes of client input held in memory at once, across all connections and protocols
    /// (bodies, data blocks, long command lines), charged as it arrives; past it bodies wait
    /// for room (backpressure) [default: 512MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_body_memory: Option<u64>,
    /// Slowest a request body or memcached data block may arrive, on average, after a 5 s
    /// grace; a slower client is closed [default: 64KiB, per second].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_body_rate: Option<u64>,
    /// When writes become durable: never (the OS decides), always (fdatasync before the 200,
    /// shared by concurrent requests), or a DURATION such as 1s (background fdatasync; bounds
    /// what a power loss can take) [default: 1s].
    #[arg(long, value_name = "never|always|DURATION", value_parser = parse_fsync)]
    pub fsync: Option<FsyncPolicy>,
    /// Bytes of values the memory tier in front of the disk holds; 0 turns it off
    /// [default: 256MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_capacity: Option<u64>,
    /// Memory tier eviction policy: clock (quick_cache's CLOCK-Pro), or foyer's sieve, s3fifo,
    /// lfu (w-TinyLFU), lru or fifo [default: clock].
    #[arg(long, value_name = "POLICY")]
    pub memory_eviction: Option<Eviction>,
    /// A value read from disk enters memory on its Nth disk read within --promote-window;
    /// 1 promotes on the first read [default: 2].
    #[arg(long, value_name = "N")]
    pub promote_after: Option<u32>,
    /// The window in which --promote-after reads are counted, e.g. 500ms, 60s, 5m [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub promote_window: Option<Duration>,
    /// Also store each PUT's value in memory (by default a PUT only invalidates memory).
    #[arg(long)]
    pub memory_on_put: bool,
    /// The largest value the memory tier takes; larger ones are served from disk (never
    /// more than --chunk-size) [default: the chunk size].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory_max_value: Option<u64>,
    /// Before the ring overwrites its oldest volume, copy forward the entries read from disk
    /// at least N times since written (0 to 3; 0 = plain FIFO) [default: 1].
    #[arg(long, value_name = "N")]
    pub reinsert_min_hits: Option<u8>,
    /// Expiry of a PUT that sends neither X-TTL nor Cache-Control max-age, e.g. 1h or 7d;
    /// 0 = never [default: 0].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub default_ttl: Option<Duration>,
    /// Requests slower than this are logged as warnings; 0 turns the warning off [default: 100ms].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slow_request: Option<Duration>,
    /// Log every request (method, path, status, bytes, microseconds) at info level [default: off].
    #[arg(long)]
    pub access_log: bool,
    /// Log level or tracing filter directive, e.g. info or larder=debug; RUST_LOG overrides
    /// [default: warn,larder::lifecycle=info: warnings, and start-up and shutdown progress].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Largest request header block; larger gets 431 [default: 16KiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_header_size: Option<u64>,
    /// Longest request URI; longer gets 414 [default: 8KiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_uri_size: Option<u64>,
    /// Time allowed to send a request's headers [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub header_timeout: Option<Duration>,
    /// Keep-alive connections with no traffic for this long are closed [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// Who serves HTTP/1.1 connections: native (larder's own loop answers the key API's
    /// plain requests and hands a connection to hyper at the first other one) or hyper (every
    /// request; for comparisons) [default: native].
    #[arg(long, value_name = "native|hyper")]
    pub http_server: Option<HttpServer>,
    /// Open connections at most, on each listener; past it idle ones are closed to make room,
    /// never-used ones first [default: 10000 over HTTP, 1024 over memcached's protocol, as
    /// memcached's own -c].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u32>,
    /// File whose first line is the bearer token that PUT, DELETE, stats and metrics require
    /// (`Authorization: Bearer <token>`); the environment variable LARDER_AUTH_TOKEN may hold
    /// the token instead [default: no auth].
    #[arg(long, value_name = "FILE")]
    pub auth_token: Option<PathBuf>,
    /// With a token, require it for GET and HEAD too [default: reads are open].
    #[arg(long)]
    pub auth_reads: bool,
    /// Refuse PUT and DELETE with 403; serve reads only.
    #[arg(long)]
    pub read_only: bool,
    /// Store a value under `…/cas/<sha256>` (Bazel's content-addressed keys) only if it hashes
    /// to that digest, on every door; anything else is refused and nothing stored [default: off].
    #[arg(long)]
    pub verify_cas: bool,
    /// Compress values on their way to disk and memory: zstd, lz4 or none. Values that do
    /// not shrink by an eighth (JPEG, PNG, gzip…) stay as sent; a store reads what it holds
    /// under any setting [default: none].
    #[arg(long, value_name = "zstd|lz4|none")]
    pub compression: Option<String>,
    /// zstd's level: 1 (fastest) to 22 (smallest), negative ones faster still; lz4 has none
    /// [default: 3].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub compression_level: Option<i32>,
    /// Values shorter than this are stored as sent [default: 256B].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub compression_min_size: Option<u64>,
    /// With zstd: `auto` trains a dictionary per key prefix from its small values, which then
    /// code two to three times smaller; HTTP clients get them decoded [default: none].
    #[arg(long, value_name = "auto|none")]
    pub compression_dictionary: Option<String>,
    /// A key's prefix for its dictionary: its first N segments (split at `/`) [default: 1].
    #[arg(long, value_name = "N")]
    pub compression_dictionary_depth: Option<u32>,
    /// A prefix's dictionary is trained once this much of its values is sampled
    /// [default: 512KiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub compression_dictionary_sample: Option<u64>,
    /// WebDAV: the most keys a store may hold for a `PROPFIND` with `Depth: 1` to list a
    /// collection (a listing reads every volume's record headers); above it such a listing is
    /// refused with 507, never cut short. 0 refuses every listing [default: 10000].
    #[arg(long, value_name = "N")]
    pub dav_list_limit: Option<u64>,
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish before their
    /// connections are closed; the store is then synced and checkpointed [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_timeout: Option<Duration>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Which of --cluster-nodes this node is, as written there: writes of keys it does not own
    /// are kept at most --foreign-ttl [default: off].
    #[arg(long, value_name = "NODE")]
    pub cluster_self: Option<String>,
    /// With --cluster-self: the longest a value of a key this node does not own is kept
    /// [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub foreign_ttl: Option<Duration>,
    /// A node that was down longer than this starts empty, as if flush_all had been sent when
    /// it stopped (docs/CLUSTER.md says which routers need it) [default: off: a restart keeps
    /// its data, however long it was down].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_downtime: Option<Duration>,
}

/// The cluster a node belongs to, as its router sees it: for ring awareness in `serve`, and
/// for `larder owner` and `larder flush --cluster`.
#[derive(Args, Debug, Default, Clone)]
pub struct ClusterArgs {
    /// The cluster's nodes, comma-separated, each as the router's configuration writes it
    /// (e.g. 127.0.0.1:8001, an nginx `server` or twemproxy `servers` address), with an
    /// optional =WEIGHT [default: no cluster].
    #[arg(long, value_name = "LIST")]
    pub cluster_nodes: Option<String>,
    /// The router's placement: nginx (`hash $request_uri consistent`), ketama (twemproxy
    /// `hash: md5`, libmemcached) or ketama-fnv1a_64 (twemproxy `hash: fnv1a_64`)
    /// [default: nginx].
    #[arg(long, value_name = "HASH")]
    pub cluster_hash: Option<Placement>,
}

impl ClusterArgs {
    /// The ring the flags, else the file's keys, describe; `None` without a node list.
    fn ring(&self, file: &FileConfig) -> Result<Option<Ring>, String> {
        let nodes = match (&self.cluster_nodes, &file.cluster_nodes) {
            (Some(list), _) => cluster::parse_nodes(list)?,
            (None, Some(NodesValue::List(l))) => cluster::parse_nodes(&l.join(","))?,
            (None, Some(NodesValue::Text(t))) => cluster::parse_nodes(t)?,
            (None, None) => {
                if self.cluster_hash.is_some() || file.cluster_hash.is_some() {
                    return Err("--cluster-hash needs --cluster-nodes".into());
                }
                return Ok(None);
            }
        };
        let placement = match (self.cluster_hash, &file.cluster_hash) {
            (Some(p), _) => p,
            (None, Some(name)) => name.parse()?,
            (None, None) => Placement::Nginx,
        };
        Ok(Some(Ring::new(placement, nodes)))
    }

    /// The ring of the flags, or of the keys of the config file `config`.
    pub fn resolve(&self, config: Option<&PathBuf>) -> Result<Option<Ring>, String> {
        self.ring(&read_file_config(config)?)
    }
}

/// Ring awareness in force: the ring and which of its nodes this one is.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The ring.
    pub ring: std::sync::Arc<Ring>,
    /// This node's index in `ring.nodes()`.
    pub me: usize,
    /// The longest a foreign key's value is kept.
    pub foreign_ttl: Duration,
}

/// A size in the TOML file: an integer (bytes) or a string such as "1GiB".
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            SizeValue::Bytes(n) => Ok(*n),
            SizeValue::Text(s) => parse_size(s),
        }
    }
}

/// A duration in the TOML file: an integer (seconds) or a string such as "500ms".
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum DurationValue {
    Secs(u64),
    Text(String),
}

impl DurationValue {
    fn duration(&self) -> Result<Duration, String> {
        match self {
            DurationValue::Secs(n) => Ok(Duration::from_secs(*n)),
            DurationValue::Text(s) => parse_duration(s),
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum DirsValue {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<DirsValue>,
    listen: Option<SocketAddr>,
    memcache_listen: Option<SocketAddr>,
    origin: Option<String>,
    origin_connect_timeout: Option<DurationValue>,
    origin_read_timeout: Option<DurationValue>,
    stale_if_error: Option<DurationValue>,
    cache_lock_timeout: Option<DurationValue>,
    volume_size: Option<SizeValue>,
    volume_count: Option<u32>,
    max_value_size: Option<SizeValue>,
    chunk_size: Option<SizeValue>,
    max_body_memory: Option<SizeValue>,
    min_body_rate: Option<SizeValue>,
    fsync: Option<DurationOrWord>,
    memory_capacity: Option<SizeValue>,
    memory_eviction: Option<String>,
    promote_after: Option<u32>,
    promote_window: Option<DurationValue>,
    memory_on_put: Option<bool>,
    memory_max_value: Option<SizeValue>,
    reinsert_min_hits: Option<u8>,
    default_ttl: Option<DurationValue>,
    slow_request: Option<DurationValue>,
    access_log: Option<bool>,
    log_level: Option<String>,
    max_header_size: Option<SizeValue>,
    max_uri_size: Option<SizeValue>,
    header_timeout: Option<DurationValue>,
    idle_timeout: Option<DurationValue>,
    http_server: Option<String>,
    max_connections: Option<u32>,
    auth_token: Option<PathBuf>,
    auth_reads: Option<bool>,
    read_only: Option<bool>,
    verify_cas: Option<bool>,
    compression: Option<String>,
    compression_level: Option<i32>,
    compression_min_size: Option<SizeValue>,
    compression_dictionary: Option<String>,
    compression_dictionary_depth: Option<u32>,
    compression_dictionary_sample: Option<SizeValue>,
    dav_list_limit: Option<u64>,
    strict_dirs: Option<bool>,
    shutdown_timeout: Option<DurationValue>,
    cluster_nodes: Option<NodesValue>,
    cluster_self: Option<String>,
    cluster_hash: Option<String>,
    foreign_ttl: Option<DurationValue>,
    max_downtime: Option<DurationValue>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum NodesValue {
    Text(String),
    List(Vec<String>),
}

fn read_file_config(path: Option<&PathBuf>) -> Result<FileConfig, String> {
    match path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            toml::from_str(&text).map_err(|e| format!("in {}: {e}", path.display()))
        }
        None => Ok(FileConfig::default()),
    }
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum DurationOrWord {
    Secs(u64),
    Text(String),
}

/// The settings the server runs with, after defaults, file and flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Data directories (at least one).
    pub data_dir: Vec<PathBuf>,
    /// Refuse to start with a data directory missing.
    pub strict_dirs: bool,
    /// Listen address.
    pub listen: SocketAddr,
    /// The memcached protocol's listen address, if on.
    pub memcache_listen: Option<SocketAddr>,
    /// The origin of read-through mode, if on.
    pub origin: Option<String>,
    /// Origin connect timeout.
    pub origin_connect_timeout: Duration,
    /// Origin read timeout.
    pub origin_read_timeout: Duration,
    /// Default stale-if-error window.
    pub stale_if_error: Duration,
    /// Wait for another request's fetch of the same URI.
    pub cache_lock_timeout: Duration,
    /// Bytes per volume.
    pub volume_size: u64,
    /// Volumes in the ring.
    pub volume_count: u32,
    /// Largest value accepted.
    pub max_value_size: u64,
    /// Values longer than this are stored in chunks.
    pub chunk_size: u64,
    /// Bytes of client input held in memory at once.
    pub max_body_memory: u64,
    /// Slowest average rate of a body or data block, in bytes per second (0: no limit).
    pub min_body_rate: u64,
    /// Durability policy.
    pub fsync: FsyncPolicy,
    /// The memory tier.
    pub memory: MemoryConfig,
    /// Reads from disk that earn an entry reinsertion before the ring overwrites it; 0 = off.
    pub reinsert_min_hits: u8,
    /// Expiry of PUTs that do not give one; zero = never.
    pub default_ttl: Duration,
    /// Slow-request warning threshold.
    pub slow_request: Duration,
    /// Whether every request is logged.
    pub access_log: bool,
    /// Log filter.
    pub log_level: String,
    /// Header block limit.
    pub max_header_size: u64,
    /// URI length limit.
    pub max_uri_size: u64,
    /// Header read timeout.
    pub header_timeout: Duration,
    /// Idle connection timeout.
    pub idle_timeout: Duration,
    /// Who serves HTTP/1.1 connections.
    pub http_server: HttpServer,
    /// Open HTTP connections at most.
    pub max_connections: usize,
    /// Open memcached-protocol connections at most.
    pub memcache_max_connections: usize,
    /// The bearer token writes and admin endpoints require, if any.
    pub auth_token: Option<Token>,
    /// Whether reads require the token too.
    pub auth_reads: bool,
    /// Whether PUT and DELETE are refused.
    pub read_only: bool,
    /// Whether content-addressed keys take only the value they name.
    pub verify_cas: bool,
    /// Whether and how values are compressed.
    pub compression: Compression,
    /// The most keys a store holds for WebDAV to list a collection.
    pub dav_list_limit: u64,
    /// Time in-flight requests get to finish on SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// Ring awareness, if on.
    pub cluster: Option<Cluster>,
    /// Start empty when down longer than this.
    pub max_downtime: Option<Duration>,
}

impl ServeArgs {
    /// Merges defaults, the config file (if any) and the flags.
    pub fn settings(&self) -> Result<Settings, String> {
        let file = read_file_config(self.config.as_ref())?;
        let cluster = self.cluster(&file)?;
        let max_downtime = match (self.max_downtime, &file.max_downtime) {
            (Some(d), _) => Some(d),
            (None, Some(d)) => Some(d.duration()?),
            (None, None) => None,
        };
        let file_dirs = match file.data_dir {
            Some(DirsValue::One(d)) => vec![d],
            Some(DirsValue::Many(d)) => d,
            None => vec![],
        };
        let dirs = if self.data_dir.is_empty() { file_dirs } else { self.data_dir.clone() };
        let size = |flag: Option<u64>, key: &Option<SizeValue>, default: u64| -> Result<u64, String> {
            match (flag, key) {
                (Some(v), _) => Ok(v),
                (None, Some(v)) => v.bytes(),
                (None, None) => Ok(default),
            }
        };
        let opt_size = |flag: Option<u64>, key: &Option<SizeValue>| -> Result<Option<u64>, String> {
            flag.map(Ok).or(key.as_ref().map(SizeValue::bytes)).transpose()
        };
        let dur =
            |flag: Option<Duration>, key: &Option<DurationValue>, default: Duration| -> Result<Duration, String> {
                match (flag, key) {
                    (Some(v), _) => Ok(v),
                    (None, Some(v)) => v.duration(),
                    (None, None) => Ok(default),
                }
            };
        let fsync = match (self.fsync, &file.fsync) {
            (Some(f), _) => f,
            (None, Some(DurationOrWord::Secs(n))) => parse_fsync(&n.to_string())?,
            (None, Some(DurationOrWord::Text(s))) => parse_fsync(s)?,
            (None, None) => FsyncPolicy::Every(Duration::from_secs(1)),
        };
        let memory_eviction = match (self.memory_eviction, &file.memory_eviction) {
            (Some(e), _) => e,
            (None, Some(s)) => s.parse()?,
            (None, None) => Eviction::Clock,
        };
        let reinsert_min_hits = self.reinsert_min_hits.or(file.reinsert_min_hits).unwrap_or(1);
        if reinsert_min_hits > 3 {
            return Err(format!(
                "--reinsert-min-hits {reinsert_min_hits} is too high: the index counts up to 3 reads per entry"
            ));
        }
        let default_ttl = dur(self.default_ttl, &file.default_ttl, Duration::ZERO)?;
        if default_ttl.as_secs() > crate::headers::MAX_TTL_SECS {
            return Err(format!("--default-ttl is longer than {} seconds (100 years)", crate::headers::MAX_TTL_SECS));
        }
        let memory = MemoryConfig {
            capacity: size(self.memory_capacity, &file.memory_capacity, 256 << 20)?,
            eviction: memory_eviction,
            promote_after: self.promote_after.or(file.promote_after).unwrap_or(2),
            promote_window: dur(self.promote_window, &file.promote_window, Duration::from_secs(60))?,
            on_put: self.memory_on_put || file.memory_on_put.unwrap_or(false),
            max_value: size(self.memory_max_value, &file.memory_max_value, 0)?,
        };
        Ok(Settings {
            data_dir: if dirs.is_empty() { vec![PathBuf::from("./larder-data")] } else { dirs },
            strict_dirs: self.strict_dirs || file.strict_dirs.unwrap_or(false),
            listen: self.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:1234".parse().unwrap()),
            memcache_listen: self.memcache_listen.or(file.memcache_listen),
            origin: self.origin.clone().or(file.origin),
            origin_connect_timeout: dur(
                self.origin_connect_timeout,
                &file.origin_connect_timeout,
                Duration::from_secs(5),
            )?,
            origin_read_timeout: dur(self.origin_read_timeout, &file.origin_read_timeout, Duration::from_secs(60))?,
            stale_if_error: dur(self.stale_if_error, &file.stale_if_error, Duration::from_secs(3600))?,
            cache_lock_timeout: dur(self.cache_lock_timeout, &file.cache_lock_timeout, Duration::from_secs(5))?,
            volume_size: size(self.volume_size, &file.volume_size, 1 << 30)?,
            volume_count: self.volume_count.or(file.volume_count).unwrap_or(16),
            max_value_size: size(self.max_value_size, &file.max_value_size, 1 << 30)?,
            chunk_size: size(self.chunk_size, &file.chunk_size, 1 << 20)?,
            max_body_memory: size(self.max_body_memory, &file.max_body_memory, 512 << 20)?,
            min_body_rate: size(self.min_body_rate, &file.min_body_rate, 64 << 10)?,
            fsync,
            memory,
            reinsert_min_hits,
            default_ttl,
            slow_request: dur(self.slow_request, &file.slow_request, Duration::from_millis(100))?,
            access_log: self.access_log || file.access_log.unwrap_or(false),
            log_level: self.log_level.clone().or(file.log_level).unwrap_or_else(|| DEFAULT_LOG_LEVEL.into()),
            max_header_size: size(self.max_header_size, &file.max_header_size, 16 << 10)?,
            max_uri_size: size(self.max_uri_size, &file.max_uri_size, 8 << 10)?,
            header_timeout: dur(self.header_timeout, &file.header_timeout, Duration::from_secs(10))?,
            idle_timeout: dur(self.idle_timeout, &file.idle_timeout, Duration::from_secs(60))?,
            http_server: match (self.http_server, &file.http_server) {
                (Some(h), _) => h,
                (None, Some(s)) => s.parse()?,
                (None, None) => HttpServer::Native,
            },
            max_connections: self.max_connections.or(file.max_connections).unwrap_or(10_000).max(1) as usize,
            memcache_max_connections: self.max_connections.or(file.max_connections).unwrap_or(1024).max(1) as usize,
            auth_token: token::load_token(
                self.auth_token.as_ref().or(file.auth_token.as_ref()),
                std::env::var("LARDER_AUTH_TOKEN").ok(),
            )?,
            auth_reads: self.auth_reads || file.auth_reads.unwrap_or(false),
            read_only: self.read_only || file.read_only.unwrap_or(false),
            verify_cas: self.verify_cas || file.verify_cas.unwrap_or(false),
            compression: compression::resolve(&compression::Flags {
                codec: self.compression.as_deref().or(file.compression.as_deref()),
                level: self.compression_level.or(file.compression_level),
                min_size: opt_size(self.compression_min_size, &file.compression_min_size)?,
                dictionary: self.compression_dictionary.as_deref().or(file.compression_dictionary.as_deref()),
                depth: self.compression_dictionary_depth.or(file.compression_dictionary_depth),
                sample: opt_size(self.compression_dictionary_sample, &file.compression_dictionary_sample)?,
            })?,
            dav_list_limit: self.dav_list_limit.or(file.dav_list_limit).unwrap_or(10_000),
            shutdown_timeout: dur(self.shutdown_timeout, &file.shutdown_timeout, Duration::from_secs(30))?,
            cluster,
            max_downtime,
        })
    }

    /// Ring awareness: a ring and this node's place in it, or nothing; any of its flags
    /// without the others it needs is an error, never ignored.
    fn cluster(&self, file: &FileConfig) -> Result<Option<Cluster>, String> {
        let ring = self.cluster.ring(file)?;
        let me = self.cluster_self.clone().or(file.cluster_self.clone());
        let foreign_ttl = match (self.foreign_ttl, &file.foreign_ttl) {
            (Some(d), _) => Some(d),
            (None, Some(d)) => Some(d.duration()?),
            (None, None) => None,
        };
        let (ring, me) = match (ring, me) {
            (Some(ring), Some(me)) => (ring, me),
            (None, None) if foreign_ttl.is_none() => return Ok(None),
            (None, None) => return Err("--foreign-ttl needs --cluster-nodes and --cluster-self".into()),
            (Some(_), None) => {
                return Err("--cluster-nodes needs --cluster-self: which of the nodes is this one".into())
            }
            (None, Some(_)) => return Err("--cluster-self needs --cluster-nodes".into()),
        };
        let Some(at) = ring.nodes().iter().position(|n| n.name == me) else {
            return Err(format!(
                "--cluster-self {me:?} is not one of --cluster-nodes (write it exactly as listed there)"
            ));
        };
        let foreign_ttl = foreign_ttl.unwrap_or(Duration::from_secs(60));
        if foreign_ttl.is_zero() {
            return Err("--foreign-ttl must be more than 0 (a foreign write would expire at once)".into());
        }
        Ok(Some(Cluster { ring: std::sync::Arc::new(ring), me: at, foreign_ttl }))
    }
}

mod compression;
mod token;
pub use token::Token;
#[cfg(test)]
mod tests;
