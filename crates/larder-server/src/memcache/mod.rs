//! memcached's protocol on the same store (`--memcache-listen`): every memcached client is a
//! larder client. A key set here is the HTTP key of the same bytes.
//!
//! - `text.rs`: the text protocol's command lines, read as memcached 1.6 reads them.
//! - `exec.rs`: each command against the store, and the answers memcached gives.
//! - this file: the listener, each connection's loop (pipelined commands answered in one
//!   write, data blocks read or streamed, idle timeout, the stop) and the connection limit.

mod access;
mod binary;
mod exec;
mod logs;
mod mdma;
mod meta;
mod operator;
mod stats;
pub mod text;

use crate::app::App;
use crate::guard::budget::{Charge, FREE_INPUT};
use crate::guard::{BodyClock, Door, Unit};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use meta::Items;
pub use stats::Counters;

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

/// The memcached listener's counters, process-wide: `/_larder/stats`, `/_larder/metrics` and
/// memcached's own `stats` read them.
pub fn counters() -> &'static Counters {
    static COUNTERS: std::sync::LazyLock<Counters> = std::sync::LazyLock::new(Counters::default);
    &COUNTERS
}

/// Answers are written once this much has gathered, even with more commands waiting: a
/// pipelined batch of large gets holds no more than this.
const FLUSH_AT: usize = 256 << 10;
/// A connection must have been quiet this long to be closed for a newcomer.
const QUIET_BEFORE_CLOSE: Duration = Duration::from_secs(1);

/// The open memcached connections, so that past `--max-connections` a quiet one makes room.
#[derive(Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, Arc<Entry>>,
}

struct Entry {
    /// The client's address, for `stats conns`.
    peer: std::net::SocketAddr,
    /// Milliseconds since `epoch` when the connection last finished a command or read a byte.
    active_ms: AtomicU64,
    /// Inside a command (a data block being read, an answer being written).
    busy: AtomicBool,
    /// Asks the connection to close once it is between commands (a stop, a newcomer past the
    /// limit, the idle timeout). A one-shot channel: the connection polls it on every wait
    /// for the client, and a poll that finds it unchanged is a few atomic reads, where a
    /// `Notify` takes a lock to register and another to leave.
    close: Mutex<Option<oneshot::Sender<()>>>,
}

impl Entry {
    fn close(&self) {
        if let Some(tx) = self.close.lock().take() {
            let _ = tx.send(());
        }
    }
}

/// One memcached listener and its connections.
pub struct Listener {
    app: Arc<App>,
    /// The listening address, for `stats conns`.
    local: Option<std::net::SocketAddr>,
    /// The meta protocol's per-item state.
    items: Items,
    registry: Mutex<Registry>,
    epoch: Instant,
    /// Milliseconds since `epoch`, kept by the accept loop every [`CLOCK_TICK`]: connections
    /// note their activity several times per command, for timeouts that are checked every
    /// 100 ms at the finest, so they read this rather than the clock.
    clock_ms: AtomicU64,
    /// The key dump running, if any (`operator::dump`): one at a time, as memcached runs one
    /// crawler; another is answered `BUSY`.
    dumps: tokio::sync::Semaphore,
    /// The log stream `watch` reads.
    log: logs::Log,
}

const CLOCK_TICK: Duration = Duration::from_millis(20);

impl Listener {
    fn now_ms(&self) -> u64 {
        self.clock_ms.load(Ordering::Relaxed)
    }

    /// Registers a new connection, closing the longest-quiet idle one if the limit is reached;
    /// `None` when every connection is busy.
    fn admit(&self, peer: std::net::SocketAddr) -> Option<(u64, Arc<Entry>, oneshot::Receiver<()>)> {
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
    fn conns(&self) -> String {
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
    fn close_idle(&self, idle: Duration) {
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

/// Binds the memcached listener (before recovery, so a bad address fails the start at once).
pub async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }
        .map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(addr).map_err(|e| format!("cannot listen for memcached clients on {addr}: {e}"))?;
    socket.listen(4096).map_err(|e| format!("cannot listen for memcached clients on {addr}: {e}"))
}

/// Accepts memcached connections until `shutdown`; then lets each finish the commands it has
/// read and closes it, waiting for them up to `--shutdown-timeout`.
pub async fn run(app: Arc<App>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let l = Arc::new(Listener {
        local: listener.local_addr().ok(),
        app: app.clone(),
        items: Items::default(),
        registry: Mutex::new(Registry::default()),
        epoch: Instant::now(),
        clock_ms: AtomicU64::new(0),
        dumps: tokio::sync::Semaphore::new(1),
        log: logs::Log::default(),
    });
    let mut conns = JoinSet::new();
    let mut clock = tokio::time::interval(CLOCK_TICK);
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The idle timeout between commands is enforced from here, a few times per timeout, so
    // that a connection arms no timer for each wait. Inside a command, the connection's own
    // read times out (see `Conn::fill`).
    let idle = app.settings.idle_timeout;
    let period = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut scan = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = clock.tick() => l.clock_ms.store(l.epoch.elapsed().as_millis() as u64, Ordering::Relaxed),
            _ = scan.tick(), if !idle.is_zero() => l.close_idle(idle),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    counters().total_connections.fetch_add(1, Ordering::Relaxed);
                    match l.admit(peer) {
                        Some((id, entry, close)) => {
                            conns.spawn(serve(l.clone(), stream, close, id, entry));
                        }
                        None => {
                            counters().rejected_connections.fetch_add(1, Ordering::Relaxed);
                            conns.spawn(refuse(stream));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "memcached accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    // Each connection finishes the commands it has read, then closes.
    for e in l.registry.lock().open.values() {
        e.close();
    }
    let limit = app.settings.shutdown_timeout;
    if tokio::time::timeout(limit, async { while conns.join_next().await.is_some() {} }).await.is_err() {
        tracing::warn!(left = conns.len(), "memcached connections still busy after {limit:?}; closing them");
        conns.abort_all();
    }
}

/// Past the connection limit with every connection busy: memcached's answer, then close.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(b"ERROR Too many open connections\r\n").await?;
        stream.shutdown().await
    })
    .await;
}

/// Why a connection's loop ended.
pub(crate) enum End {
    /// The client closed, quit, went quiet past the idle timeout, or sent what memcached
    /// closes a connection for.
    Closed,
}

/// A connection's state: its socket, what was read and not yet used, answers not yet written.
pub(crate) struct Conn {
    pub app: Arc<App>,
    stream: TcpStream,
    pub input: BytesMut,
    pub out: Out,
    entry: Arc<Entry>,
    listener: Arc<Listener>,
    /// Fires when the connection is asked to close between commands; `None` once it has.
    close: Option<oneshot::Receiver<()>>,
    /// Who the connection authenticated as (see `access.rs`).
    pub who: crate::guard::Identity,
    /// The status of the binary protocol's last answer, for counting.
    pub status: u16,
    /// Whether the connection speaks the binary protocol (for counting by door).
    pub binary: bool,
    /// Its id, as `stats conns` and the log stream (`cfd`) name it.
    pub id: u64,
    /// The unit of input being read, and so when it must be in.
    reading: Reading,
    /// The input buffer's room in the budget beyond [`FREE_INPUT`]: in the heads' pool for
    /// command lines, in the bodies' pool for data blocks.
    head_room: Charge,
    body_room: Charge,
}

/// What a connection is reading, for its deadline.
#[derive(Clone, Copy)]
enum Reading {
    /// Between commands: only the idle timeout applies.
    Between,
    /// A command line (or binary header): in by `until`, however it trickles.
    Line { until: Instant },
    /// A data block: at the minimum rate since `start` (see `Policy::body_deadline`); room
    /// for `whole` bytes of it once it has proven itself (`budget::PROVEN`).
    Block { clock: BodyClock, whole: u64 },
}

impl Conn {
    /// Waits for the next command: what was answered goes out, the connection is idle from
    /// now (its idle timeout counts from here, not from the last byte read), and a stop or a
    /// newcomer past the connection limit may close it.
    pub async fn next_command(&mut self) -> Result<(), End> {
        self.flush().await?;
        self.entry.active_ms.store(self.listener.now_ms(), Ordering::Relaxed);
        // Part of a command line already read counts as being inside a command: the stop, the
        // connection limit and the idle scan leave it alone, and the read's own idle timeout
        // applies.
        let between = self.input.is_empty();
        if between {
            self.entry.busy.store(false, Ordering::Release);
        }
        // A buffer grown for a large data block or a long line is not kept by an idle
        // connection, nor its room in the budget.
        if between {
            if self.input.capacity() as u64 > FREE_INPUT {
                self.input = BytesMut::with_capacity(16 << 10);
            }
            self.head_room.shrink_to(0);
            self.body_room.shrink_to(0);
        }
        let r = self.read(between).await;
        self.entry.busy.store(true, Ordering::Relaxed);
        r
    }

    /// Reads more of the command being run (a data block, the rest of a line): the stop and
    /// the connection limit leave it alone; the idle timeout still applies.
    pub async fn fill(&mut self) -> Result<(), End> {
        self.flush().await?;
        self.read(false).await
    }

    async fn read(&mut self, between: bool) -> Result<(), End> {
        // Between commands, a close (a stop, a newcomer, the idle timeout) ends the connection;
        // inside one, the command finishes first.
        if between && self.close.is_none() {
            return Err(End::Closed);
        }
        self.input.reserve(16 << 10);
        // The buffer's growth is charged before it is filled: a line's without waiting (past
        // the heads' pool the client is refused, as memcached refuses one it cannot hold), a
        // data block's waiting for room, which is the server's time, not the block's.
        let over = (self.input.capacity() as u64).saturating_sub(FREE_INPUT);
        match &mut self.reading {
            _ if over == 0 => {}
            Reading::Block { clock, whole } => {
                if !self.body_room.try_arrived(clock.received(), over) {
                    clock.arrived(0); // the wait is the server's
                    self.body_room.grow_to(over.max(*whole)).await;
                }
            }
            _ => {
                // A line is charged for its bytes (a buffer left large by a data block is not
                // the line's doing).
                let line = (self.input.len() as u64 + (16 << 10)).saturating_sub(FREE_INPUT);
                if !self.head_room.try_grow_to(line) {
                    self.out.extend_from_slice(b"SERVER_ERROR out of memory reading request\r\n");
                    let _ = self.flush().await;
                    return Err(End::Closed);
                }
            }
        }
        if let Reading::Block { clock, .. } = &mut self.reading {
            clock.resume(); // what the server did since the last read was its own time
        }
        let deadline = self.deadline();
        let (stream, input, close) = (&mut self.stream, &mut self.input, &mut self.close);
        let got = if between {
            let asked = close.as_mut().expect("checked above");
            tokio::select! {
                biased;
                _ = asked => {
                    *close = None;
                    None
                }
                r = stream.read_buf(input) => r.ok().filter(|&n| n > 0),
            }
        } else {
            // Waiting for the rest of a command: the idle timeout counts from the last byte
            // read, and a close asked meanwhile is kept for the next wait between commands.
            let idle = self.app.settings.idle_timeout;
            let read = async {
                if let Some(asked) = close.as_mut() {
                    tokio::select! {
                        r = stream.read_buf(input) => return r,
                        _ = asked => {}
                    }
                    *close = None;
                }
                stream.read_buf(input).await
            };
            let got = match (deadline, idle.is_zero()) {
                // A unit of input under way: its own deadline, however the bytes trickle.
                (Some(d), _) => match tokio::time::timeout_at(d, read).await {
                    Ok(r) => r.ok(),
                    Err(_) => return Err(self.late()),
                },
                (None, true) => read.await.ok(),
                (None, false) => tokio::time::timeout(idle, read).await.ok().and_then(|r| r.ok()),
            };
            got.filter(|&n| n > 0)
        };
        match got {
            Some(n) => {
                if let Reading::Block { clock, .. } = &mut self.reading {
                    clock.arrived(n as u64);
                }
                counters().bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                self.entry.active_ms.store(self.listener.now_ms(), Ordering::Relaxed);
                Ok(())
            }
            None => Err(End::Closed),
        }
    }

    /// A command is done: the room its data block took goes back, and a buffer grown for it
    /// is replaced by one sized for what is left (pipelined input), so that no command starts
    /// out holding the budget for the one before it.
    pub fn command_done(&mut self) {
        if self.input.capacity() as u64 > FREE_INPUT && (self.input.len() as u64) < FREE_INPUT / 2 {
            let rest = std::mem::replace(&mut self.input, BytesMut::with_capacity(16 << 10));
            self.input.extend_from_slice(&rest);
        }
        self.body_room.shrink_to(0);
        self.head_room.shrink_to((self.input.len() as u64).saturating_sub(FREE_INPUT));
    }

    /// When the unit being read must be in, if one is under way.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let p = &self.app.policy;
        match self.reading {
            Reading::Between => None,
            Reading::Line { until } => Some(until.into()),
            Reading::Block { clock, .. } => clock.deadline(p),
        }
    }

    /// A deadline missed: counted, and the connection closes (its budget goes back with it).
    fn late(&self) -> End {
        let door = if self.binary { Door::MemcacheBinary } else { Door::MemcacheText };
        let unit = if matches!(self.reading, Reading::Block { .. }) { Unit::Body } else { Unit::Head };
        self.app.policy.late(door, unit);
        End::Closed
    }

    /// A command line (or binary header) has begun and is not complete: its deadline runs
    /// from now, once.
    pub fn line_pending(&mut self) {
        if !matches!(self.reading, Reading::Line { .. }) {
            if let Some(d) = self.app.policy.head_deadline() {
                self.reading = Reading::Line { until: Instant::now() + d };
            }
        }
    }

    /// A data block (or binary body) of `whole` bytes held in the input buffer is read from
    /// now (0: its bytes leave the buffer as they come).
    pub fn block_begins(&mut self, whole: u64) {
        self.reading = Reading::Block { clock: BodyClock::new(), whole };
    }

    /// The line or block is in.
    pub fn unit_done(&mut self) {
        self.reading = Reading::Between;
    }

    /// Writes the answers gathered so far. A client that takes none of them for the idle
    /// timeout loses the connection (a close asked meanwhile waits for the next command).
    pub async fn flush(&mut self) -> Result<(), End> {
        if self.out.is_empty() {
            return Ok(());
        }
        let n = self.out.len();
        let idle = self.app.settings.idle_timeout;
        let ok = self.out.write_to(&mut self.stream, idle).await.is_ok();
        counters().bytes_written.fetch_add(n as u64, Ordering::Relaxed);
        if ok {
            self.entry.active_ms.store(self.listener.now_ms(), Ordering::Relaxed);
            Ok(())
        } else {
            Err(End::Closed)
        }
    }

    /// Writes `bytes` to the client, after what was gathered (a large value's piece).
    pub async fn send(&mut self, bytes: Bytes) -> Result<(), End> {
        self.out.value(bytes);
        self.flush().await
    }

    /// Flushes once enough has gathered.
    pub async fn maybe_flush(&mut self) -> Result<(), End> {
        if self.out.len() >= FLUSH_AT {
            self.flush().await?;
        }
        Ok(())
    }

    /// Ensures `n` bytes are read (for a data block). The buffer grows as bytes arrive, not
    /// to the declared length at once: a length only declared holds no memory.
    pub async fn want(&mut self, n: usize) -> Result<(), End> {
        while self.input.len() < n {
            // The buffer doubles as it fills (each read reserves a little more room): charged
            // by its capacity, it is never charged more than twice what arrived.
            self.fill().await?;
        }
        Ok(())
    }
}

/// Answers not yet written: text gathered in place, and values by reference (a value is not
/// copied into the buffer: the answers go out with one vectored write).
#[derive(Default)]
pub(crate) struct Out {
    cur: BytesMut,
    segs: Vec<Bytes>,
    queued: usize,
}

/// Values shorter than this are copied: a separate piece costs more than the copy.
const COPY_BELOW: usize = 1024;

impl std::ops::Deref for Out {
    type Target = BytesMut;
    fn deref(&self) -> &BytesMut {
        &self.cur
    }
}

impl std::ops::DerefMut for Out {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.cur
    }
}

impl Out {
    /// Appends a value's bytes.
    pub fn value(&mut self, b: Bytes) {
        if b.len() < COPY_BELOW {
            self.cur.extend_from_slice(&b);
            return;
        }
        self.seal();
        self.queued += b.len();
        self.segs.push(b);
    }

    fn seal(&mut self) {
        if !self.cur.is_empty() {
            let s = self.cur.split().freeze();
            self.queued += s.len();
            self.segs.push(s);
        }
    }

    pub fn len(&self) -> usize {
        self.queued + self.cur.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes everything, vectored, and empties the buffer. Fails when a write makes no
    /// progress for `idle` (unless zero).
    async fn write_to(&mut self, stream: &mut TcpStream, idle: Duration) -> std::io::Result<()> {
        self.seal();
        let (mut i, mut at) = (0, 0);
        let result = loop {
            if i == self.segs.len() {
                break Ok(());
            }
            let mut slices = [std::io::IoSlice::new(&[]); 16];
            let parts = std::iter::once(&self.segs[i][at..]).chain(self.segs[i + 1..].iter().map(|s| &s[..]));
            let mut k = 0;
            for (slot, part) in slices.iter_mut().zip(parts) {
                *slot = std::io::IoSlice::new(part);
                k += 1;
            }
            let slices = &slices[..k];
            // Most answers fit in the socket's buffer: try the write at once, and arm the
            // timer only when it would wait.
            let written = match stream.try_write_vectored(slices) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let write = stream.write_vectored(slices);
                    match idle.is_zero() {
                        true => write.await,
                        false => {
                            tokio::time::timeout(idle, write).await.unwrap_or(Err(std::io::ErrorKind::TimedOut.into()))
                        }
                    }
                }
                r => r,
            };
            match written {
                Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    while n > 0 {
                        let left = self.segs[i].len() - at;
                        if n >= left {
                            n -= left;
                            (i, at) = (i + 1, 0);
                        } else {
                            at += n;
                            n = 0;
                        }
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.segs.clear();
        self.queued = 0;
        if self.cur.capacity() > 4 * FLUSH_AT {
            self.cur = BytesMut::with_capacity(16 << 10);
        }
        result
    }
}

/// Serves one connection: commands are read, run in order and answered; answers to
/// pipelined commands go out in one write once no complete command is left to run.
async fn serve(l: Arc<Listener>, stream: TcpStream, close: oneshot::Receiver<()>, id: u64, entry: Arc<Entry>) {
    let _ = stream.set_nodelay(true);
    let app = l.app.clone();
    counters().curr_connections.fetch_add(1, Ordering::Relaxed);
    let mut c = Conn {
        app: app.clone(),
        stream,
        input: BytesMut::with_capacity(16 << 10),
        out: Out::default(),
        entry,
        listener: l.clone(),
        close: Some(close),
        who: crate::guard::Identity::Anonymous,
        status: 0,
        binary: false,
        id,
        reading: Reading::Between,
        head_room: app.body_budget.head(),
        body_room: app.body_budget.body(),
    };
    let _ = exec::session(&mut c).await;
    let _ = c.flush().await;
    let _ = c.stream.shutdown().await;
    counters().curr_connections.fetch_sub(1, Ordering::Relaxed);
    l.registry.lock().open.remove(&id);
}
