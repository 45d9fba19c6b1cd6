//! The client and operator subcommands of the `larder` binary: `get`, `put`, `delete` and
//! `stats` against a running server, `check` of a data directory offline, and `bench`, which
//! hands over to the `larder-bench` tool.
//!
//! Exit codes: 0 success, 1 the server answered with an error (or `check` found damage),
//! 2 the command could not run (bad arguments, server unreachable, unreadable directory).

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use larder_engine::check::{self, CheckProgress, CheckReport};
use percent_encoding::utf8_percent_encode;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cluster::{Placement, KEY_ENCODE};
use crate::config::ClusterArgs;

/// Where the server is, and how to authenticate.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:1234", env = "LARDER_URL")]
    pub url: String,
    /// Bearer token for servers started with --auth-token (or LARDER_AUTH_TOKEN).
    #[arg(long, env = "LARDER_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the status line and response headers to stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// `larder get KEY`: the value to stdout (or a file).
#[derive(Args, Debug)]
pub struct GetArgs {
    /// The key (any bytes but NUL; it is percent-encoded for the URL).
    pub key: String,
    /// Write the value to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub target: Target,
}

/// `larder put KEY [FILE]`: store a file's bytes, or stdin's.
#[derive(Args, Debug)]
pub struct PutArgs {
    /// The key.
    pub key: String,
    /// File holding the value; stdin when absent or `-`.
    pub file: Option<PathBuf>,
    /// Expire the value after this many seconds (X-TTL).
    #[arg(long, value_name = "SECONDS")]
    pub ttl: Option<u64>,
    /// Content type stored with the value.
    #[arg(long, value_name = "TYPE")]
    pub content_type: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// `larder delete KEY`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The key.
    pub key: String,
    #[command(flatten)]
    pub target: Target,
}

/// `larder stats`: the server's figures as a table.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Print the JSON as the server sent it.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// `larder check DATA_DIR...`: verify a store's data directories offline.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The data directories, all of one store (the server must be stopped).
    #[arg(required = true)]
    pub data_dir: Vec<PathBuf>,
    /// No progress bar even on a terminal.
    #[arg(long)]
    pub quiet: bool,
}

/// `larder bench ARGS…`: runs `larder-bench` with the same arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Arguments for larder-bench (e.g. `http --url http://127.0.0.1:1234/b/ --duration 10s`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// `larder owner KEY…`: which node of a cluster owns each key, as its router places it.
#[derive(Args, Debug)]
pub struct OwnerArgs {
    /// The keys (as `larder get` takes them: an HTTP key's path, or a memcached key).
    #[arg(required = true)]
    pub key: Vec<String>,
    /// A server's TOML file to read the cluster_nodes and cluster_hash keys from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `larder flush`: memcached's flush_all for one node (--url), or every node of a cluster.
#[derive(Args, Debug)]
pub struct FlushArgs {
    /// Flush every node of the cluster (--cluster-nodes, or the cluster_nodes key of
    /// --config): over HTTP for an nginx ring, over memcached's protocol for a ketama ring.
    #[arg(long)]
    pub cluster: bool,
    /// A server's TOML file to read the cluster from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub ring: ClusterArgs,
    /// Flush in this many seconds instead of now.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    pub delay: u64,
    #[command(flatten)]
    pub target: Target,
}

/// A failure of the command itself (exit 2), as opposed to an error answer (exit 1).
fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("larder: {msg}");
    2
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

fn key_url(t: &Target, key: &str) -> String {
    let key = key.strip_prefix('/').unwrap_or(key);
    format!("{}/{}", t.url.trim_end_matches('/'), utf8_percent_encode(key, KEY_ENCODE))
}

/// Sends a request, its body streamed from `body` if any; `Err` with the exit code when the
/// server could not be reached.
fn send(
    t: &Target,
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    body: Option<ureq::SendBody<'_>>,
) -> Result<ureq::http::Response<ureq::Body>, i32> {
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    if let Some(token) = &t.token {
        req = req.header("Authorization", format!("Bearer {token}"));
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let agent = agent();
    let sent = match body {
        Some(b) => agent.run(req.body(b).map_err(fail)?),
        None => agent.run(req.body(()).map_err(fail)?),
    };
    let resp = sent.map_err(|e| fail(format!("{method} {url}: {e}")))?;
    if t.verbose {
        eprintln!("{:?} {}", resp.version(), resp.status());
        for (k, v) in resp.headers() {
            eprintln!("{k}: {}", String::from_utf8_lossy(v.as_bytes()));
        }
    }
    Ok(resp)
}

/// Sends a request without a body and reads the whole answer; `Err` with the exit code when
/// the server could not be reached.
fn call(t: &Target, method: &str, url: &str) -> Result<(u16, Vec<u8>), i32> {
    let mut resp = send(t, method, url, &[], None)?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    Ok((status, body))
}

pub fn owner(a: OwnerArgs) -> i32 {
    let ring = match a.cluster.resolve(a.config.as_ref()) {
        Ok(Some(r)) => r,
        Ok(None) => return fail("no cluster: give --cluster-nodes (and --cluster-hash), or --config"),
        Err(e) => return fail(e),
    };
    for key in &a.key {
        // An HTTP key as `larder get` takes it: its leading `/` is not part of the key.
        let k = key.strip_prefix('/').filter(|_| ring.placement() == Placement::Nginx).unwrap_or(key);
        println!("{key}\t{}", ring.nodes()[ring.owner(k.as_bytes())].name);
    }
    0
}

pub fn flush(a: FlushArgs) -> i32 {
    if !a.cluster {
        let url = format!("{}/_larder/flush?delay={}", a.target.url.trim_end_matches('/'), a.delay);
        return match call(&a.target, "POST", &url) {
            Ok((status, body)) => answer(status, &body),
            Err(code) => code,
        };
    }
    if a.delay > 30 * 86_400 {
        return fail("--delay is at most 30 days (memcached reads more as a Unix time)");
    }
    let ring = match a.ring.resolve(a.config.as_ref()) {
        Ok(Some(r)) => r,
        Ok(None) => return fail("--cluster needs --cluster-nodes (and --cluster-hash), or --config"),
        Err(e) => return fail(e),
    };
    // A node is reached at its name: a router's server given by name (twemproxy) or by a
    // socket path has none to reach.
    if let Some(n) =
        ring.nodes().iter().find(|n| n.name.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()))
    {
        return fail(format!("node {:?} is not a host:port address to reach; list the nodes by address", n.name));
    }
    let mut failed = 0;
    for node in ring.nodes() {
        let done = match ring.placement() {
            Placement::Nginx => {
                let url = format!("http://{}/_larder/flush?delay={}", node.name, a.delay);
                match call(&a.target, "POST", &url) {
                    Ok((200, _)) => Ok(()),
                    Ok((status, body)) => Err(format!("{status} {}", String::from_utf8_lossy(&body).trim_end())),
                    Err(_) => Err("unreachable".to_string()),
                }
            }
            _ => memcache_flush(&node.name, a.target.token.as_deref(), a.delay),
        };
        match done {
            Ok(()) => println!("{}\tflushed", node.name),
            Err(e) => {
                println!("{}\tFAILED: {e}", node.name);
                failed += 1;
            }
        }
    }
    if failed > 0 {
        eprintln!("larder: {failed} of {} nodes were not flushed", ring.nodes().len());
        return 1;
    }
    0
}

/// `flush_all` over memcached's text protocol, after the text login when a token is given.
fn memcache_flush(addr: &str, token: Option<&str>, delay: u64) -> Result<(), String> {
    use std::io::{BufRead, BufReader, Write};
    use std::net::ToSocketAddrs;
    let to = addr.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let stream = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let mut out = stream.try_clone().map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(stream);
    let mut ask = |cmd: &[u8]| -> Result<String, String> {
        out.write_all(cmd).map_err(|e| e.to_string())?;
        let mut line = String::new();
        lines.read_line(&mut line).map_err(|e| e.to_string())?;
        Ok(line.trim_end().to_string())
    };
    if let Some(t) = token {
        let cred = format!("larder {t}");
        let login = ask(format!("set _ 0 0 {}\r\n{cred}\r\n", cred.len()).as_bytes())?;
        if login != "STORED" {
            return Err(format!("login refused: {login}"));
        }
    }
    match ask(format!("flush_all {delay}\r\n").as_bytes())? {
        ok if ok == "OK" => Ok(()),
        other => Err(other),
    }
}

/// Exit code for an answer: 0 for 2xx, else the server's one-line message and 1.
fn answer(status: u16, body: &[u8]) -> i32 {
    if (200..300).contains(&status) {
        return 0;
    }
    eprintln!("larder: {status} {}", String::from_utf8_lossy(body).trim_end());
    1
}

/// Counts the bytes read through it and, on a terminal, shows how far it has come on stderr
/// (at most ten times a second).
struct Progress<R> {
    inner: R,
    done: u64,
    total: Option<u64>,
    shown: std::time::Instant,
    on: bool,
}

impl<R> Progress<R> {
    fn new(inner: R, total: Option<u64>) -> Progress<R> {
        let on = std::io::stderr().is_terminal();
        Progress { inner, done: 0, total, shown: std::time::Instant::now(), on }
    }

    fn show(&mut self, last: bool) {
        if !self.on || (!last && self.shown.elapsed() < Duration::from_millis(100)) {
            return;
        }
        self.shown = std::time::Instant::now();
        let line = match self.total {
            Some(t) if t > 0 => format!("{} of {} ({}%)", human_bytes(self.done), human_bytes(t), self.done * 100 / t),
            _ => human_bytes(self.done),
        };
        eprint!("\r{line}  {}", if last { "\n" } else { "" });
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        self.show(n == 0);
        Ok(n)
    }
}

/// `larder get`: the value is written as it arrives, so a value of any size takes little memory.
pub fn get(a: GetArgs) -> i32 {
    let mut resp = match send(&a.target, "GET", &key_url(&a.target, &a.key), &[], None) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let status = resp.status().as_u16();
    let total = resp.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse().ok());
    let mut body = Progress::new(resp.body_mut().with_config().limit(u64::MAX).reader(), total);
    if status != 200 {
        let mut msg = Vec::new();
        let _ = body.inner.read_to_end(&mut msg);
        return answer(status, &msg);
    }
    let written = match &a.output {
        Some(path) => write_whole(path, &mut body),
        None => std::io::copy(&mut body, &mut std::io::stdout().lock()),
    };
    // A value cut short (the server found a chunk damaged mid-answer) is an error here too.
    written.map_or_else(|e| fail(format!("receiving the value: {e}")), |_| 0)
}

/// Writes what `body` yields to `path` through a temporary file beside it, renamed over `path`
/// only once the whole value is in: a value cut short never leaves a partial file behind. The
/// file gets the permissions of the one it replaces, or those of a new file. A path that is
/// not a regular file (`/dev/null`, a pipe) is written to directly.
fn write_whole(path: &std::path::Path, body: &mut impl Read) -> std::io::Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let permissions = match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return std::io::copy(body, &mut std::fs::File::create(path)?),
        Ok(m) => m.permissions(),
        // Masked by the umask, as any new file's.
        Err(_) => std::fs::Permissions::from_mode(0o666),
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::Builder::new().permissions(permissions).tempfile_in(dir)?;
    let n = std::io::copy(body, &mut tmp)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(n)
}

/// `larder put`: a file is sent as it is read, with its length; standard input as it comes
/// (chunked), so a value of any size takes little memory.
pub fn put(a: PutArgs) -> i32 {
    let (mut input, total): (Box<dyn Read>, Option<u64>) = match a.file.as_ref().filter(|p| p.as_os_str() != "-") {
        Some(path) => match std::fs::File::open(path).and_then(|f| Ok((f.metadata()?.len(), f))) {
            Ok((len, f)) => (Box::new(f), Some(len)),
            Err(e) => return fail(format!("reading the value: {e}")),
        },
        None => (Box::new(std::io::stdin().lock()), None),
    };
    let mut headers = Vec::new();
    if let Some(len) = total {
        headers.push(("Content-Length", len.to_string()));
    }
    if let Some(ttl) = a.ttl {
        headers.push(("X-TTL", ttl.to_string()));
    }
    if let Some(ct) = &a.content_type {
        headers.push(("Content-Type", ct.clone()));
    }
    let mut progress = Progress::new(&mut input, total);
    let sent =
        send(&a.target, "PUT", &key_url(&a.target, &a.key), &headers, Some(ureq::SendBody::from_reader(&mut progress)));
    let mut resp = match sent {
        Ok(r) => r,
        Err(code) => return code,
    };
    let mut msg = Vec::new();
    let _ = resp.body_mut().as_reader().read_to_end(&mut msg);
    answer(resp.status().as_u16(), &msg)
}

/// `larder delete`.
pub fn delete(a: DeleteArgs) -> i32 {
    match call(&a.target, "DELETE", &key_url(&a.target, &a.key)) {
        Ok((status, body)) => answer(status, &body),
        Err(code) => code,
    }
}

/// `larder stats`.
pub fn stats(a: StatsArgs) -> i32 {
    let url = format!("{}/_larder/stats", a.target.url.trim_end_matches('/'));
    let (status, body) = match call(&a.target, "GET", &url) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if status != 200 {
        return answer(status, &body);
    }
    if a.json {
        println!("{}", String::from_utf8_lossy(&body));
        return 0;
    }
    match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => {
            print!("{}", stats_table(&v));
            0
        }
        Err(e) => fail(format!("the server's stats are not JSON: {e}")),
    }
}

/// Bytes in binary units, e.g. `1.5 GiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The stats as a table of sections, figures right-aligned.
fn stats_table(v: &serde_json::Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let pct = |k: &str| format!("{:.1}%", v[k].as_f64().unwrap_or(0.0) * 100.0);
    let of = |used: u64, cap: u64| {
        let share = if cap == 0 { 0.0 } else { used as f64 * 100.0 / cap as f64 };
        format!("{} of {} ({share:.0}%)", human_bytes(used), human_bytes(cap))
    };
    let r = &v["recovery"];
    let rn = |k: &str| r[k].as_u64().unwrap_or(0);
    let sections: Vec<(&str, Vec<(&str, String)>)> = vec![
        (
            "store",
            vec![
                ("keys", n("keys").to_string()),
                ("disk", of(n("bytes_used"), n("capacity_bytes"))),
                ("volumes", format!("{} of {} (active: {})", n("volumes"), n("volume_count"), n("active_volume"))),
                ("memory tier", of(n("memory_bytes"), n("memory_capacity"))),
                ("memory entries", n("memory_entries").to_string()),
            ],
        ),
        (
            "traffic",
            vec![
                ("hits", format!("{} ({} memory, {} disk)", n("hits"), n("memory_hits"), n("disk_hits"))),
                ("misses", n("misses").to_string()),
                ("hit ratio", format!("{} ({} memory)", pct("hit_ratio"), pct("memory_hit_ratio"))),
                ("puts / deletes", format!("{} / {}", n("puts"), n("deletes"))),
                ("bytes in / out", format!("{} / {}", human_bytes(n("bytes_in")), human_bytes(n("bytes_out")))),
                ("coalesced reads", n("coalesced_reads").to_string()),
            ],
        ),
        (
            "ring",
            vec![
                ("volumes sealed", n("rotations").to_string()),
                ("volumes evicted", n("volumes_evicted").to_string()),
                ("entries evicted", n("evicted_entries").to_string()),
                ("reinserted", format!("{} ({})", n("reinserted"), human_bytes(n("reinserted_bytes")))),
            ],
        ),
        (
            "health",
            vec![
                ("checksum failures", n("corrupt_reads").to_string()),
                (
                    "data directories",
                    v["dirs"]
                        .as_array()
                        .map(|ds| {
                            let state = |d: &serde_json::Value| d["state"].as_str().unwrap_or("?").to_string();
                            let line = |d: &serde_json::Value| {
                                let path = d["path"].as_str().unwrap_or("?");
                                format!("{path} {} ({})", state(d), human_bytes(d["bytes_used"].as_u64().unwrap_or(0)))
                            };
                            ds.iter().map(line).collect::<Vec<_>>().join(", ")
                        })
                        .unwrap_or_default(),
                ),
                (
                    "failures (write/sync/read)",
                    format!("{} / {} / {}", n("write_failures"), n("sync_failures"), n("read_failures")),
                ),
                (
                    "last recovery",
                    format!(
                        "{} ms: {} volumes, {} from hints, {} from the checkpoint, {} scanned",
                        rn("millis"),
                        rn("volumes"),
                        rn("hint_loads"),
                        rn("checkpoint_loads"),
                        rn("scans")
                    ),
                ),
            ],
        ),
    ];
    let width = sections.iter().flat_map(|(_, rows)| rows.iter().map(|(k, _)| k.len())).max().unwrap_or(0);
    let mut out = String::new();
    for (title, rows) in sections {
        out.push_str(title);
        out.push('\n');
        for (k, val) in rows {
            out.push_str(&format!("  {k:<width$}  {val}\n"));
        }
    }
    out
}

/// `larder check`.
pub fn check(a: CheckArgs) -> i32 {
    let progress = CheckProgress::default();
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} checking [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        b
    });
    let report = std::thread::scope(|s| {
        let worker = s.spawn(|| check::check_dirs(&a.data_dir, &progress));
        while !worker.is_finished() {
            if let Some(b) = &bar {
                b.set_length(progress.bytes_total.load(Ordering::Relaxed));
                b.set_position(progress.bytes_done.load(Ordering::Relaxed));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        worker.join().expect("the check panicked")
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match report {
        Ok(r) => {
            print!("{}", check_summary(&r));
            if r.clean() {
                0
            } else {
                1
            }
        }
        Err(e) => fail(e),
    }
}

fn check_summary(r: &CheckReport) -> String {
    let mut out = format!(
        "{} volumes, {} records, {} checked; {} hint files compared, {} sealed volumes without one\n",
        r.volumes,
        r.records,
        human_bytes(r.bytes),
        r.hints_checked,
        r.unhinted
    );
    let line = |kind: &str, f: &check::Finding| match f.offset {
        Some(o) => format!("{kind}: {} at offset {o}: {}\n", f.file.display(), f.what),
        None => format!("{kind}: {}: {}\n", f.file.display(), f.what),
    };
    for f in &r.corrupt {
        out.push_str(&line("CORRUPT", f));
    }
    for f in &r.hint_mismatches {
        out.push_str(&line("hint mismatch", f));
    }
    if let Some(t) = &r.torn_tail {
        out.push_str(&line("torn tail (a write cut short; the next start truncates it)", t));
    }
    for f in &r.notes {
        out.push_str(&line("note", f));
    }
    out.push_str(if r.clean() {
        "clean: every record verified\n"
    } else {
        "DAMAGED: recovery skips these records; their keys read as misses\n"
    });
    out
}

/// `larder bench`: runs `larder-bench` from beside this binary, else from PATH.
pub fn bench(a: BenchArgs) -> i32 {
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("larder-bench")));
    let program = beside.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from("larder-bench"));
    match std::process::Command::new(&program).args(&a.args).status() {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => fail(format!(
            "cannot run {}: {e} (build it with `cargo build --release -p larder-bench`)",
            program.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sent_in_canonical_form() {
        let t = Target { url: "http://h:1/".into(), token: None, verbose: false };
        assert_eq!(key_url(&t, "img/a b%.jpg"), "http://h:1/img/a%20b%25.jpg");
        assert_eq!(key_url(&t, "/x~y_z-1"), "http://h:1/x~y_z-1");
        assert_eq!(key_url(&t, "ü"), "http://h:1/%C3%BC");
    }

    #[test]
    fn stats_table_reads_the_json() {
        let v = serde_json::json!({"keys": 3, "bytes_used": 2048, "capacity_bytes": 4096, "hits": 5,
            "memory_hits": 2, "disk_hits": 3, "hit_ratio": 0.5, "recovery": {"millis": 7, "checkpoint_loads": 1}});
        let t = stats_table(&v);
        assert!(t.contains("keys") && t.contains("  3\n"), "{t}");
        assert!(t.contains("2.0 KiB of 4.0 KiB (50%)"), "{t}");
        assert!(t.contains("5 (2 memory, 3 disk)"), "{t}");
        assert!(t.contains("50.0%"), "{t}");
        assert!(t.contains("7 ms: 0 volumes, 0 from hints, 1 from the checkpoint"), "{t}");
    }
}
