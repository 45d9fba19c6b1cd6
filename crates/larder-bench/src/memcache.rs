//! `larder-bench memcache`: a load generator for memcached's text protocol, against larder's
//! `--memcache-listen` or memcached itself: `get` and `set` of keys `<prefix><n>` over
//! persistent connections, each keeping `--pipeline` requests in flight.
//!
//! Built as `http` is: each thread a single-threaded runtime with its connections as tasks,
//! requests formatted into reused buffers, answers parsed just enough to know each one's
//! outcome and length.

use crate::http::parse_duration;
use crate::report::{Summary, Tally};
use crate::workload::{value_pool, Generator, Op, Workload};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `larder-bench memcache` flags.
#[derive(Args, Debug, Clone)]
pub struct MemcacheArgs {
    /// Server address, e.g. 127.0.0.1:11211.
    pub addr: String,
    /// Key prefix; key numbers are appended to it.
    #[arg(long, default_value = "k")]
    pub prefix: String,
    /// Connections, spread over the threads.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Requests each connection keeps in flight (sent together, answered together).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// Loader threads (each a single-threaded runtime).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead (e.g. to set every key once).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Check that every value read has the length its key was set with.
    #[arg(long)]
    pub check_length: bool,
    /// Count a get that finds nothing as a miss, not an error.
    #[arg(long)]
    pub allow_misses: bool,
    /// Fail the run when more than this share of requests fail.
    #[arg(long, default_value_t = 0.001)]
    pub max_error_ratio: f64,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub workload: Workload,
}

struct Ctx {
    addr: SocketAddr,
    pool: Vec<u8>,
    args: MemcacheArgs,
    deadline: Instant,
    budget: Option<AtomicU64>,
    counter: Arc<AtomicU64>,
}

impl Ctx {
    /// Takes up to `n` requests from the budget: how many the run still has.
    fn take(&self, n: usize) -> usize {
        if Instant::now() >= self.deadline {
            return 0;
        }
        match &self.budget {
            None => n,
            Some(b) => {
                let mut got = 0;
                let _ = b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    got = left.min(n as u64) as usize;
                    Some(left - got as u64)
                });
                got
            }
        }
    }
}

/// Runs the load and returns its summary; an error ratio above the limit is an error.
pub fn run(args: MemcacheArgs) -> Result<Summary> {
    let addr = args
        .addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", args.addr))?
        .next()
        .context("no address")?;
    if args.connections == 0 || args.threads == 0 || args.pipeline == 0 {
        bail!("--connections, --threads and --pipeline must be at least 1");
    }
    let threads = args.threads.min(args.connections);
    let ctx = Arc::new(Ctx {
        addr,
        pool: value_pool(args.workload.value_size.max, args.workload.seed),
        deadline: Instant::now() + if args.requests.is_some() { Duration::from_secs(86_400) } else { args.duration },
        budget: args.requests.map(AtomicU64::new),
        counter: Arc::default(),
        args,
    });
    let started = Instant::now();
    let c = ctx.clone();
    let tally = crate::http::drive(threads, ctx.args.connections, move |id| connection(c.clone(), id));
    let a = &ctx.args;
    let w = &a.workload;
    let label = format!(
        "memcache {:?} {:?} {} B..{} B on {} keys, {} connections x {} in flight",
        w.workload, w.distribution, w.value_size.min, w.value_size.max, w.keys, a.connections, a.pipeline
    );
    crate::http::report(tally.summary(&label, started.elapsed()), a.quiet, a.json.as_deref(), a.max_error_ratio)
}

/// One connection: batches of `--pipeline` requests, each batch's answers read in order.
async fn connection(ctx: Arc<Ctx>, id: u64) -> Tally {
    use std::io::Write;
    let mut tally = Tally::default();
    let mut gen = Generator::new(&ctx.args.workload, id, ctx.counter.clone());
    let mut stream: Option<TcpStream> = None;
    let mut out = Vec::with_capacity(64 << 10);
    let mut input = Vec::with_capacity(256 << 10);
    let mut batch: Vec<Op> = Vec::with_capacity(ctx.args.pipeline);
    loop {
        let n = ctx.take(ctx.args.pipeline);
        if n == 0 {
            break;
        }
        // As wrk does: the next batch goes out after every answer ready now was read.
        tokio::task::yield_now().await;
        out.clear();
        batch.clear();
        for _ in 0..n {
            let op = gen.next_op();
            match op {
                Op::Get(k) => {
                    let _ = write!(out, "get {}{k}\r\n", ctx.args.prefix);
                }
                Op::Put(k) => {
                    let len = gen.size_of(k);
                    let _ = write!(out, "set {}{k} 0 0 {len}\r\n", ctx.args.prefix);
                    out.extend_from_slice(&ctx.pool[..len]);
                    out.extend_from_slice(b"\r\n");
                }
            }
            batch.push(op);
        }
        let started = Instant::now();
        if stream.is_none() {
            match TcpStream::connect(ctx.addr).await {
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
        if let Err(e) = s.write_all(&out).await {
            tally.record(started.elapsed(), false, 0);
            tally.failure(format!("write: {}", e.kind()));
            stream = None;
            continue;
        }
        for op in batch.iter().copied() {
            match read_answer(s, &mut input, op).await {
                Ok(Answer::Value(len)) => {
                    let ok = match op {
                        Op::Get(k) => !ctx.args.check_length || len == gen.size_of(k),
                        Op::Put(_) => false,
                    };
                    tally.record(started.elapsed(), ok, len);
                    if !ok {
                        tally.failure("get: wrong length".into());
                    }
                }
                Ok(Answer::Miss) => {
                    tally.misses += 1;
                    tally.record(started.elapsed(), ctx.args.allow_misses, 0);
                    if !ctx.args.allow_misses {
                        tally.failure("get: miss".into());
                    }
                }
                Ok(Answer::Stored) => {
                    let len = if let Op::Put(k) = op { gen.size_of(k) } else { 0 };
                    tally.record(started.elapsed(), true, len);
                }
                Ok(Answer::Other(line)) => {
                    tally.record(started.elapsed(), false, 0);
                    tally.failure(format!("answer {line:?}"));
                }
                Err(e) => {
                    tally.record(started.elapsed(), false, 0);
                    tally.failure(format!("read: {}", e.kind()));
                    stream = None;
                    break;
                }
            }
        }
    }
    tally
}

enum Answer {
    /// A get found a value of this many bytes.
    Value(usize),
    Miss,
    Stored,
    Other(String),
}

/// Reads one answer from `s`, with what was read ahead kept in `input`.
async fn read_answer(s: &mut TcpStream, input: &mut Vec<u8>, op: Op) -> std::io::Result<Answer> {
    let line = read_line(s, input).await?;
    match op {
        Op::Put(_) => {
            Ok(if line == b"STORED" { Answer::Stored } else { Answer::Other(String::from_utf8_lossy(&line).into()) })
        }
        Op::Get(_) if line == b"END" => Ok(Answer::Miss),
        Op::Get(_) => {
            // VALUE <key> <flags> <bytes>
            let len = line
                .strip_prefix(b"VALUE ")
                .and_then(|rest| rest.rsplit(|&b| b == b' ').next())
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok());
            let Some(len) = len else { return Ok(Answer::Other(String::from_utf8_lossy(&line).into())) };
            // The data, its \r\n and END\r\n.
            let want = len + 2 + 5;
            while input.len() < want {
                fill(s, input).await?;
            }
            let ok = &input[len..want] == b"\r\nEND\r\n";
            input.drain(..want);
            Ok(if ok { Answer::Value(len) } else { Answer::Other("bad value framing".into()) })
        }
    }
}

async fn read_line(s: &mut TcpStream, input: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut from = 0;
    loop {
        if let Some(i) = input[from..].windows(2).position(|w| w == b"\r\n") {
            let end = from + i;
            let line = input[..end].to_vec();
            input.drain(..end + 2);
            return Ok(line);
        }
        from = input.len().saturating_sub(1);
        fill(s, input).await?;
    }
}

async fn fill(s: &mut TcpStream, input: &mut Vec<u8>) -> std::io::Result<()> {
    input.reserve(64 << 10);
    let n = s.read_buf(input).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
