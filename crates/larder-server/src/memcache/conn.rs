//! A memcached connection's transport: its reads, each charged to the budget and bounded by
//! the deadline of the unit being read (a command line, a data block) or the idle timeout;
//! data blocks read whole, read past, or taken as they come; and answers gathered and written
//! with one vectored write.

use super::counters::counters;
use super::listener::{Entry, Listener};
use crate::app::App;
use crate::guard::budget::{Charge, FREE_INPUT};
use crate::guard::{BodyClock, Door, Identity, Unit};
use crate::lanes::LaneStream;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

/// Answers are written once this much has gathered, even with more commands waiting: a
/// pipelined batch of large gets holds no more than this.
const FLUSH_AT: usize = 256 << 10;

/// Why a connection's loop ended.
pub enum End {
    /// The client closed, quit, went quiet past the idle timeout, or sent what memcached
    /// closes a connection for.
    Closed,
}

/// A connection's state: its socket, what was read and not yet used, answers not yet written.
pub struct Conn {
    pub app: Arc<App>,
    stream: LaneStream,
    pub input: BytesMut,
    pub out: Out,
    entry: Arc<Entry>,
    pub listener: Arc<Listener>,
    /// Fires when the connection is asked to close between commands; `None` once it has.
    close: Option<oneshot::Receiver<()>>,
    /// Who the connection authenticated as (see `access.rs`).
    pub who: Identity,
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
    pub fn new(
        listener: Arc<Listener>,
        stream: LaneStream,
        close: oneshot::Receiver<()>,
        id: u64,
        entry: Arc<Entry>,
    ) -> Conn {
        let app = listener.app.clone();
        Conn {
            stream,
            input: BytesMut::with_capacity(16 << 10),
            out: Out::default(),
            entry,
            listener,
            close: Some(close),
            who: Identity::Anonymous,
            binary: false,
            id,
            reading: Reading::Between,
            head_room: app.body_budget.head(),
            body_room: app.body_budget.body(),
            app,
        }
    }

    /// The connection's end: what was answered goes out, then the socket is shut.
    pub async fn close(mut self) {
        let _ = self.flush().await;
        let _ = self.stream.shutdown().await;
    }

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

    /// Reads a data block of `n` bytes into the input buffer, at the minimum rate.
    pub async fn read_block(&mut self, n: usize) -> Result<(), End> {
        self.block_begins(n as u64);
        self.want(n).await?;
        self.unit_done();
        Ok(())
    }

    /// Reads past `n` bytes of a data block that will not be stored (at the minimum rate too).
    pub async fn swallow(&mut self, mut n: u64) -> Result<(), End> {
        self.block_begins(0);
        loop {
            let take = (self.input.len() as u64).min(n) as usize;
            let _ = self.input.split_to(take);
            n -= take as u64;
            if n == 0 {
                self.unit_done();
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Sends what was gathered (a refusal) at once, then reads past the `n` bytes of its data
    /// block: the client learns at once (memcached answers only once it has read them), and
    /// the stream stays in step.
    pub async fn flush_then_swallow(&mut self, n: u64) -> Result<(), End> {
        self.flush().await?;
        self.swallow(n).await
    }

    /// Waits for `event` while the client stays (bytes it sends meanwhile are read and
    /// ignored); `None` when it goes, or when the server asks the connection to close (a
    /// stop, the connection limit). For a connection that only listens (`watch`).
    pub async fn while_here<T>(&mut self, event: impl std::future::Future<Output = T>) -> Option<T> {
        let mut event = std::pin::pin!(event);
        let mut scratch = [0u8; 512];
        loop {
            let (stream, close) = (&mut self.stream, &mut self.close);
            let asked = async {
                match close.as_mut() {
                    Some(asked) => {
                        let _ = asked.await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                t = &mut event => return Some(t),
                _ = asked => return None,
                n = stream.read(&mut scratch) => if matches!(n, Ok(0) | Err(_)) { return None },
            }
        }
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
pub struct Out {
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
    async fn write_to(&mut self, stream: &mut LaneStream, idle: Duration) -> std::io::Result<()> {
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
