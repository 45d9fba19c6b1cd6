//! `larder-bench http`: an HTTP/1.1 keep-alive load generator for any URL prefix.
//!
//! Built to cost the loader as little as a request can: each thread runs a single-threaded
//! runtime with its connections as tasks, requests are formatted into reused buffers, a PUT
//! body goes out with its header in one vectored write, and responses are parsed just enough
//! to find the status and the body length.

use crate::report::{Summary, Tally};
use crate::workload::{value_pool, Generator, Op, Workload};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::IoSlice;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Parses `500ms`, `10s`, `2m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s or m")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// `larder-bench http` flags.
#[derive(Args, Debug, Clone)]
pub struct HttpArgs {
    /// URL prefix; key numbers are appended to it, e.g. http://127.0.0.1:1234/g gives /g0, /g1, …
    pub url: String,
    /// Keep-alive connections, spread over the threads.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Loader threads (each a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead (e.g. to preload every key once).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Limit to this many requests per second in total.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Check that every GET body has the length the key was written with.
    #[arg(long)]
    pub check_length: bool,
    /// Values that name their key: a PUT's body starts with the key number (8 bytes, little
    /// endian, cut to the value size), and a GET checks that its body does (implies
    /// `--check-length`). Catches a value served for the wrong key.
    #[arg(long)]
    pub keyed_values: bool,
    /// Count a GET answered 404 as a cache miss, not an error (a ring that turns evicts).
    #[arg(long)]
    pub allow_misses: bool,
    /// Fail the run when more than this share of requests fail.
    #[arg(long, default_value_t = 0.001)]
    pub max_error_ratio: f64,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print nothing but errors (for scripted preloads).
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub workload: Workload,
}

struct Target {
    addr: SocketAddr,
    host: String,
    prefix: String,
}

fn parse_url(url: &str) -> Result<Target> {
    let rest = url.strip_prefix("http://").context("only http:// URLs are supported")?;
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let with_port = if host.contains(':') { host.to_string() } else { format!("{host}:80") };
    let addr =
        with_port.to_socket_addrs().with_context(|| format!("resolving {host}"))?.next().context("no address")?;
    Ok(Target { addr, host: host.to_string(), prefix: prefix.to_string() })
}

/// Shared by every connection of a run.
struct Ctx {
    target: Target,
    pool: Vec<u8>,
    args: HttpArgs,
    deadline: Instant,
    budget: Option<AtomicU64>,
    counter: Arc<AtomicU64>,
}

impl Ctx {
    /// Takes one request from the budget; false when the run is over.
    fn take(&self) -> bool {
        if Instant::now() >= self.deadline {
            return false;
        }
        match &self.budget {
            None => true,
            Some(b) => b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok(),
        }
    }
}

/// Runs the load and returns its summary; an error ratio above the limit is an error.
pub fn run(args: HttpArgs) -> Result<Summary> {
    let target = parse_url(&args.url)?;
    if args.connections == 0 || args.threads == 0 {
        bail!("--connections and --threads must be at least 1");
    }
    let threads = args.threads.min(args.connections);
    let ctx = Arc::new(Ctx {
        pool: value_pool(args.workload.value_size.max, args.workload.seed),
        deadline: Instant::now() + if args.requests.is_some() { Duration::from_secs(86_400) } else { args.duration },
        budget: args.requests.map(AtomicU64::new),
        counter: Arc::default(),
        target,
        args,
    });
    let started = Instant::now();
    let c = ctx.clone();
    let tally = drive(threads, ctx.args.connections, move |id| connection(c.clone(), id));
    let w = &ctx.args.workload;
    let label = format!(
        "http {:?} {:?} {} B..{} B on {} keys, {} connections",
        w.workload, w.distribution, w.value_size.min, w.value_size.max, w.keys, ctx.args.connections
    );
    let a = &ctx.args;
    report(tally.summary(&label, started.elapsed()), a.quiet, a.json.as_deref(), a.max_error_ratio)
}

/// Prints a run's summary (unless `quiet`), writes it as JSON if asked, and fails the run when
/// more than `max_error_ratio` of its requests failed.
pub fn report(summary: Summary, quiet: bool, json: Option<&std::path::Path>, max_error_ratio: f64) -> Result<Summary> {
    if !quiet {
        summary.print();
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&summary)?).with_context(|| format!("writing {path:?}"))?;
    }
    if summary.error_ratio > max_error_ratio {
        bail!(
            "{} of {} requests failed (more than {:.2}%): {:?}",
            summary.errors,
            summary.requests,
            max_error_ratio * 100.0,
            summary.failures
        );
    }
    Ok(summary)
}

/// Runs connections `0..connections` (`conn(id)` each) over `threads` loader threads, each a
/// single-threaded runtime, and merges what they counted.
pub fn drive<F, Fut>(threads: usize, connections: usize, conn: F) -> Tally
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Tally> + Send + 'static,
{
    let conn = Arc::new(conn);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let conn = conn.clone();
            std::thread::spawn(move || -> Tally {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                // Connections are runtime tasks, not LocalSet tasks: the scheduler then runs
                // every ready connection before it polls epoll again (one epoll_wait for many
                // responses, as wrk does), where a LocalSet polled it once per request.
                rt.block_on(async move {
                    let ids = (0..connections).filter(|c| c % threads == t);
                    let tasks: Vec<_> = ids.map(|c| tokio::spawn(conn(c as u64))).collect();
                    let mut tally = Tally::default();
                    for task in tasks {
                        tally.merge(&task.await.expect("connection task"));
                    }
                    tally
                })
            })
        })
        .collect();
    let mut tally = Tally::default();
    for h in handles {
        tally.merge(&h.join().expect("loader thread"));
    }
    tally
}

/// One keep-alive connection's request loop.
async fn connection(ctx: Arc<Ctx>, id: u64) -> Tally {
    let mut tally = Tally::default();
    let mut gen = Generator::new(&ctx.args.workload, id, ctx.counter.clone());
    let interval = ctx.args.rate.map(|r| Duration::from_secs_f64(ctx.args.connections as f64 / r.max(1e-9)));
    let mut next_at = tokio::time::Instant::now();
    let mut stream: Option<TcpStream> = None;
    let mut head = Vec::with_capacity(256);
    let mut rbuf = vec![0u8; 64 << 10];
    while ctx.take() {
        if let Some(iv) = interval {
            next_at += iv;
            tokio::time::sleep_until(next_at).await;
        } else {
            // As wrk does: send the next request only after every response that is ready
            // now has been read (tokio runs yielded tasks after its next poll of epoll).
            // The requests then reach the server in bursts, as they would from many
            // clients, instead of one per server wakeup.
            tokio::task::yield_now().await;
        }
        let op = gen.next_op();
        let mut keyed = Vec::new();
        let (key, body): (u64, &[u8]) = match op {
            Op::Get(k) => (k, &[]),
            Op::Put(k) if ctx.args.keyed_values => {
                keyed.extend_from_slice(&ctx.pool[..gen.size_of(k)]);
                let n = keyed.len().min(8);
                keyed[..n].copy_from_slice(&k.to_le_bytes()[..n]);
                (k, &keyed)
            }
            Op::Put(k) => (k, &ctx.pool[..gen.size_of(k)]),
        };
        head.clear();
        let method = if matches!(op, Op::Get(_)) { "GET" } else { "PUT" };
        let t = &ctx.target;
        use std::io::Write;
        let _ = write!(head, "{method} {}{key} HTTP/1.1\r\nHost: {}\r\n", t.prefix, t.host);
        if let Op::Put(_) = op {
            let _ = write!(head, "Content-Type: application/octet-stream\r\nContent-Length: {}\r\n", body.len());
        }
        head.extend_from_slice(b"\r\n");
        let started = Instant::now();
        if stream.is_none() {
            match TcpStream::connect(t.addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    stream = Some(s);
                }
                Err(e) => {
                    tally.record(started.elapsed(), false, 0);
                    tally.failure(format!("connect: {}", e.kind()));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let s = stream.as_mut().expect("connected");
        match exchange(s, &head, body, &mut rbuf).await {
            Ok(resp) => {
                let miss = matches!(op, Op::Get(_)) && resp.status == 404 && ctx.args.allow_misses;
                tally.misses += u64::from(miss);
                let status_ok = match op {
                    Op::Get(_) => resp.status == 200 || miss,
                    Op::Put(_) => matches!(resp.status, 200 | 201 | 204),
                };
                let check = ctx.args.check_length || ctx.args.keyed_values;
                let length_ok = match op {
                    Op::Get(k) => !check || !status_ok || miss || resp.body_len == gen.size_of(k),
                    Op::Put(_) => true,
                };
                let value_ok = match op {
                    Op::Get(k) if ctx.args.keyed_values && status_ok && !miss => {
                        let n = resp.body_len.min(8);
                        resp.prefix[..n] == k.to_le_bytes()[..n]
                    }
                    _ => true,
                };
                tally.record(started.elapsed(), status_ok && length_ok && value_ok, body.len() + resp.body_len);
                if !status_ok {
                    tally.failure(format!("{method} status {}", resp.status));
                } else if !length_ok {
                    tally.failure(format!("{method} wrong body length"));
                } else if !value_ok {
                    tally.failure(format!("{method} another key's value"));
                }
                if resp.close {
                    stream = None;
                }
            }
            Err(e) => {
                tally.record(started.elapsed(), false, 0);
                tally.failure(format!("{method} io: {}", e.kind()));
                stream = None;
            }
        }
    }
    tally
}

struct Response {
    status: u16,
    body_len: usize,
    close: bool,
    /// The body's first bytes (up to 8).
    prefix: [u8; 8],
}

async fn write_all_vectored(s: &mut TcpStream, mut parts: [&[u8]; 2]) -> std::io::Result<()> {
    while !parts[0].is_empty() || !parts[1].is_empty() {
        let n = s.write_vectored(&[IoSlice::new(parts[0]), IoSlice::new(parts[1])]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let first = n.min(parts[0].len());
        parts[0] = &parts[0][first..];
        parts[1] = &parts[1][n - first..];
    }
    Ok(())
}

fn find_header_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The value of header `name` (lower case) in a response head.
fn header<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|&c| c == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|&c| c == b':')?;
        line[..colon].eq_ignore_ascii_case(name).then(|| line[colon + 1..].trim_ascii())
    })
}

/// Sends one request and reads its whole response (the body is counted, not kept).
async fn exchange(s: &mut TcpStream, head: &[u8], body: &[u8], rbuf: &mut [u8]) -> std::io::Result<Response> {
    write_all_vectored(s, [head, body]).await?;
    let mut filled = 0;
    let end = loop {
        if filled == rbuf.len() {
            return Err(std::io::Error::other("response head too large"));
        }
        let n = s.read(&mut rbuf[filled..]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let from = filled.saturating_sub(3);
        filled += n;
        if let Some(e) = find_header_end(&rbuf[from..filled]) {
            break from + e;
        }
    };
    let h = &rbuf[..end];
    let status = std::str::from_utf8(h.get(9..12).unwrap_or(b"000")).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let body_len: usize =
        header(h, b"content-length").and_then(|v| std::str::from_utf8(v).ok()?.parse().ok()).unwrap_or(0);
    let close = header(h, b"connection").is_some_and(|v| v.eq_ignore_ascii_case(b"close"));
    let mut prefix = [0u8; 8];
    let mut have = (filled - end).min(body_len);
    let first = have.min(8);
    prefix[..first].copy_from_slice(&rbuf[end..end + first]);
    while have < body_len {
        let want = (body_len - have).min(rbuf.len());
        let n = s.read(&mut rbuf[..want]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if have < 8 {
            let m = (8 - have).min(n);
            prefix[have..have + m].copy_from_slice(&rbuf[..m]);
        }
        have += n;
    }
    Ok(Response { status, body_len, close, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_headers_and_durations() {
        let t = parse_url("http://127.0.0.1:8080/g").unwrap();
        assert_eq!((t.addr.port(), t.prefix.as_str()), (8080, "/g"));
        assert_eq!(parse_url("http://127.0.0.1:9").unwrap().prefix, "/");
        assert!(parse_url("https://x").is_err());
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\n";
        assert_eq!(header(head, b"content-length"), Some(&b"12"[..]));
        assert_eq!(header(head, b"connection"), Some(&b"close"[..]));
        assert_eq!(find_header_end(head), Some(head.len()));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
    }
}
