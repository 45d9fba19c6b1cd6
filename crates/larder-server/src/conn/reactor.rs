//! Where every plain connection starts: the server's own event loops, one thread per core,
//! each owning its connections. A loop reads what arrived, parses each whole request
//! (`h1::parse`), answers it on the spot when its answer is ready at once (a memory-tier or
//! page-cache hit, a write that need not wait: most requests), and writes all the answers of
//! one read in one vectored write. It pays for no task, no waker and no cross-thread wake-up
//! per request, and watches a socket for writing only while a write is held up.
//!
//! The answers are the key API's own ([`handle_plain`], which asks the policy as every door
//! does), polled once here. One that must wait (for the disk, the body budget, a large value
//! streamed), and any request `h1::parse` does not take, hands the connection over to the
//! runtime ([`super::native`], which hands it to hyper in turn): with the unanswered bytes,
//! the unwritten answers and the answer under way. Timeouts, the room for newcomers and the
//! graceful stop are checked on a sweep of the loop's connections every [`SWEEP`].

use super::activity::{coarse_ms, Link, Watchdog, QUIET_BEFORE_CLOSE_MS};
use super::native::{Pending, READ_SIZE};
use super::out::{self, Out, MAX_SLICES};
use crate::app::Held;
use crate::guard::{Door, Unit};
use crate::h1::{self, Framing, Parsed};
use crate::reply::{Body, Resp};
use crate::routes::handle_plain;
use bytes::{Buf, Bytes, BytesMut};
use hyper::Method;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use std::future::Future;
use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How often a loop looks over its connections for timeouts, claims and a graceful stop.
const SWEEP: Duration = Duration::from_millis(50);
const WAKE: Token = Token(usize::MAX);

/// A connection the runtime takes over, and everything it needs to go on.
pub(super) struct Handover {
    pub(super) stream: std::net::TcpStream,
    pub(super) link: Link,
    pub(super) buf: BytesMut,
    pub(super) out: Out,
    pub(super) pending: Option<Pending>,
}

/// A newly accepted connection for a loop: `done` hears of a handover (or is dropped when the
/// loop closes the connection).
pub(super) struct Arrival {
    pub(super) stream: std::net::TcpStream,
    pub(super) link: Link,
    pub(super) done: oneshot::Sender<Handover>,
}

/// The loops, one thread each, given connections in turn.
pub(super) struct Reactors {
    lanes: Vec<(mpsc::Sender<Arrival>, Arc<Waker>)>,
    next: AtomicUsize,
}

impl Reactors {
    /// Starts `n` loops; each enters `runtime` (the answers' futures use its timers and its
    /// blocking pool).
    pub(super) fn start(n: usize, runtime: tokio::runtime::Handle) -> io::Result<Reactors> {
        let mut lanes = Vec::with_capacity(n);
        for i in 0..n.max(1) {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
            let (tx, rx) = mpsc::channel();
            let runtime = runtime.clone();
            std::thread::Builder::new().name(format!("larder-http-{i}")).spawn(move || {
                let _entered = runtime.enter();
                let l = Loop { poll, arrivals: rx, conns: slab::Slab::new() };
                // Answers' panics are caught; one that escapes is a fault of the loop itself,
                // whose connections would hang unseen: the process stops, loudly.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| l.run())).is_err() {
                    tracing::error!("an HTTP event loop failed; stopping");
                    std::process::abort();
                }
            })?;
            lanes.push((tx, waker));
        }
        Ok(Reactors { lanes, next: AtomicUsize::new(0) })
    }

    /// Gives a connection to the next loop.
    pub(super) fn take(&self, arrival: Arrival) {
        let (tx, waker) = &self.lanes[self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()];
        // A loop ends only with the process: a failed send drops the connection, closing it.
        if tx.send(arrival).is_ok() {
            let _ = waker.wake();
        }
    }
}

struct Loop {
    poll: Poll,
    arrivals: mpsc::Receiver<Arrival>,
    conns: slab::Slab<Conn>,
}

/// What a connection does after an event.
enum Next {
    Wait,
    /// Served its share of this turn and may have more: served again before the loop waits.
    Again,
    Close,
    Handover(Option<Pending>),
}

/// Why answering stopped.
enum Stop {
    /// The answers gathered are to be written before it goes on (or before the close).
    Write,
    /// No whole request is left at the front of the buffer; `body`: a head is, without all
    /// of its body.
    Short {
        body: bool,
    },
    Handover(Option<Pending>),
    /// An answer panicked: the connection closes, as its task's end would close it on the
    /// runtime.
    Close,
}

/// Rounds of writing, answering and reading one connection gets per turn: a client that
/// keeps sending does not hold up the others on its loop.
const MAX_ROUNDS: usize = 16;

impl Loop {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut swept = Instant::now();
        // Connections that may have more to do without a new event (see `Next::Again`).
        let mut ready: Vec<usize> = Vec::new();
        loop {
            let wait = if ready.is_empty() { SWEEP } else { Duration::ZERO };
            if let Err(e) = self.poll.poll(&mut events, Some(wait)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "the HTTP event loop's wait failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for key in std::mem::take(&mut ready) {
                self.serve(key, false, &mut ready);
            }
            for ev in events.iter() {
                if ev.token() == WAKE {
                    while let Ok(a) = self.arrivals.try_recv() {
                        self.arrive(a);
                    }
                    continue;
                }
                self.serve(ev.token().0, ev.is_read_closed() || ev.is_error(), &mut ready);
            }
            if swept.elapsed() >= SWEEP {
                swept = Instant::now();
                self.sweep();
            }
        }
    }

    fn serve(&mut self, key: usize, hup: bool, ready: &mut Vec<usize>) {
        let next = match self.conns.get_mut(key) {
            Some(c) => c.serve(self.poll.registry(), hup),
            None => return,
        };
        match next {
            // (A key in `ready` whose connection ended and was given to a newcomer only costs
            // the newcomer a read that finds nothing.)
            Next::Again => ready.push(key),
            next => self.then(key, next),
        }
    }

    fn arrive(&mut self, a: Arrival) {
        let mut stream = TcpStream::from_std(a.stream);
        let entry = self.conns.vacant_entry();
        // Registering reports what already arrived, so nothing is missed.
        if self.poll.registry().register(&mut stream, Token(entry.key()), Interest::READABLE).is_err() {
            return; // dropped: closed
        }
        let s = &a.link.app.settings;
        let watchdog = Watchdog::new(s.idle_timeout, s.header_timeout);
        let due = Instant::now() + watchdog.period();
        let key = entry.key();
        entry.insert(Conn {
            key,
            stream,
            link: a.link,
            done: a.done,
            buf: BytesMut::new(),
            out: Out::default(),
            scanned: 0,
            blocked: false,
            closing: false,
            eof: false,
            watchdog,
            due,
        });
    }

    fn then(&mut self, key: usize, next: Next) {
        match next {
            Next::Wait | Next::Again => {}
            Next::Close => {
                let mut c = self.conns.remove(key);
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
            Next::Handover(pending) => {
                let mut c = self.conns.remove(key);
                let _ = self.poll.registry().deregister(&mut c.stream);
                let h = Handover { stream: c.stream.into(), link: c.link, buf: c.buf, out: c.out, pending };
                // Refused only if the server gave up on its connections: then it closes.
                let _ = c.done.send(h);
            }
        }
    }

    /// Timeouts, newcomers' claims and the graceful stop, for every connection.
    fn sweep(&mut self) {
        let now = Instant::now();
        let mut ended = Vec::new();
        for (key, c) in self.conns.iter_mut() {
            let a = &c.link.activity;
            // Given up on by the server (past its drain), or claimed for a newcomer: a claim
            // is acted on between requests, with nothing left to write (as `native` hears it
            // only at its wait for a request); the flag stays set until then.
            let between = !c.blocked && c.out.is_empty();
            let mut end = c.done.is_closed() || (between && a.claimed.load(Ordering::Relaxed));
            if !end && c.link.app.stopping() {
                // Between requests and quiet for a while: close (a client still sending gets
                // its next request answered, with `Connection: close`).
                let quiet = coarse_ms().saturating_sub(a.moved_at.load(Ordering::Relaxed)) >= QUIET_BEFORE_CLOSE_MS;
                end = quiet && a.between_requests() && c.buf.is_empty() && between;
            }
            if !end && now >= c.due {
                c.due = now + c.watchdog.period();
                match c.watchdog.expired(a) {
                    // Answers the socket holds up are no slow head, whatever follows them in
                    // the buffer (the idle timeout still applies).
                    Some(true) if c.blocked => {}
                    Some(head) => {
                        if head {
                            c.link.app.policy.late(Door::Http, Unit::Head);
                        }
                        end = true;
                    }
                    None => {}
                }
            }
            if end {
                ended.push(key);
            }
        }
        for key in ended {
            self.then(key, Next::Close);
        }
    }
}

/// One connection of a loop.
struct Conn {
    /// Its place in the loop's table, and its token.
    key: usize,
    stream: TcpStream,
    link: Link,
    done: oneshot::Sender<Handover>,
    buf: BytesMut,
    out: Out,
    /// How much of `buf` was parsed and found no whole head (see `native`).
    scanned: usize,
    /// Answers wait for the socket to take them: watched for writing, and no request is
    /// answered meanwhile.
    blocked: bool,
    /// Closes once `out` is written.
    closing: bool,
    /// The client closed its side.
    eof: bool,
    watchdog: Watchdog,
    /// When the watchdog is next asked.
    due: Instant,
}

impl Conn {
    /// Serves what an event says is ready: writes what was held up, answers every whole
    /// request buffered, and reads only once none is left (as `native` does: the buffer stays
    /// bounded, and a client that sends faster than it reads meets TCP's backpressure).
    /// `hup`: the event said the client closed its side, perhaps behind the data it sent.
    fn serve(&mut self, registry: &Registry, hup: bool) -> Next {
        let mut drained = false;
        for _ in 0..MAX_ROUNDS {
            if self.blocked || !self.out.is_empty() {
                match self.flush(registry) {
                    Ok(true) => {}
                    Ok(false) => return Next::Wait,
                    Err(_) => return Next::Close,
                }
            }
            if self.closing {
                let _ = self.stream.shutdown(std::net::Shutdown::Write);
                return Next::Close;
            }
            if self.done.is_closed() {
                return Next::Close; // the server gave up on its connections
            }
            match self.answer() {
                Stop::Write => continue,
                Stop::Handover(pending) => return Next::Handover(pending),
                Stop::Close => return Next::Close,
                // A body not all here once the socket is read to its end goes to hyper,
                // which keeps the body's minimum rate (as `native` does).
                Stop::Short { body: true } if drained || self.eof => return Next::Handover(None),
                Stop::Short { .. } => {}
            }
            if !self.out.is_empty() {
                continue; // written before the next read
            }
            if self.eof {
                return Next::Close; // every whole request before the close was answered
            }
            if drained {
                return Next::Wait;
            }
            drained = match self.read(hup) {
                Ok(drained) => drained,
                Err(_) => return Next::Close,
            };
        }
        Next::Again
    }

    /// One read into the buffer: `true` if it took all the socket held (a later arrival is a
    /// new event), `false` if there may be more. After a `hup`, only the end says so.
    fn read(&mut self, hup: bool) -> io::Result<bool> {
        if self.eof {
            return Ok(true);
        }
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        let room = self.buf.capacity() - self.buf.len();
        loop {
            match rustix::net::recv(&self.stream, self.buf.spare_capacity_mut(), rustix::net::RecvFlags::empty()) {
                Ok((_, 0)) => {
                    self.eof = true;
                    return Ok(true);
                }
                Ok((_, n)) => {
                    // SAFETY: `recv` initialised the first `n` bytes of the spare capacity.
                    unsafe { self.buf.set_len(self.buf.len() + n) };
                    let a = &self.link.activity;
                    a.read.fetch_add(n as u64, Ordering::Relaxed);
                    a.moved_at.store(coarse_ms(), Ordering::Relaxed);
                    return Ok(n < room && !hup);
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(true),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Answers every whole request at the front of the buffer whose answer is ready at once,
    /// in order.
    fn answer(&mut self) -> Stop {
        let app = &self.link.app;
        let activity = &self.link.activity;
        let max_head = (app.settings.max_header_size as usize).max(64);
        loop {
            if self.out.full() {
                return Stop::Write; // written before more is answered
            }
            let buf = &self.buf;
            if self.scanned > 0 && buf.len() < max_head && !h1::head_ends(buf, self.scanned) {
                self.scanned = buf.len();
                return Stop::Short { body: false };
            }
            let head = match h1::parse(buf, max_head) {
                Parsed::Partial => {
                    self.scanned = buf.len();
                    return Stop::Short { body: false };
                }
                Parsed::Other => return Stop::Handover(None),
                Parsed::Request(head) => head,
            };
            // As `native` takes them: a body whole and no longer than a chunk (a longer one is
            // streamed, by hyper).
            let max_body = app.store.get().map_or(0, |st| st.config().chunk_size as usize);
            if head.body > max_body {
                return Stop::Handover(None);
            }
            let whole = head.len + head.body;
            if buf.len() < whole {
                return Stop::Short { body: true };
            }
            activity.started.fetch_add(1, Ordering::Relaxed);
            let body = Bytes::copy_from_slice(&buf[head.len..whole]);
            let held = matches!(head.method, Method::GET | Method::PUT).then(|| Held(activity.held.clone()));
            let (method, close) = (head.method.clone(), head.close);
            let app2 = app.clone();
            let mut answer: Pin<Box<dyn Future<Output = Option<Resp>> + Send>> =
                Box::pin(async move { handle_plain(&app2, &head, body, held).await });
            // A panic in an answer ends this connection, as it would end its task on the
            // runtime, and not the loop with every other connection on it.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                answer.as_mut().poll(&mut Context::from_waker(std::task::Waker::noop()))
            }));
            let resp = match polled {
                Err(_) => return Stop::Close,
                Ok(std::task::Poll::Pending) => return Stop::Handover(Some(Pending { method, close, whole, answer })),
                Ok(std::task::Poll::Ready(None)) => {
                    // Not the key API's after all: hyper answers it, from its first byte.
                    activity.answered.fetch_add(1, Ordering::Release);
                    return Stop::Handover(None);
                }
                Ok(std::task::Poll::Ready(Some(resp))) => resp,
            };
            let (mut parts, body) = resp.into_parts();
            let data = match body {
                Body::Full(f) => full_bytes(f),
                body => {
                    // A large value, streamed: the runtime sends it.
                    let answer = Box::pin(std::future::ready(Some(Resp::from_parts(parts, body))));
                    return Stop::Handover(Some(Pending { method, close, whole, answer }));
                }
            };
            self.buf.advance(whole);
            self.scanned = 0;
            let (framing, last) = out::head(&mut self.out, app, &method, close, &mut parts, Some(data.len() as u64));
            if framing != Framing::Length(0) {
                self.out.push(data);
            }
            let a = activity;
            a.read_at_answer.store(a.read.load(Ordering::Relaxed) - self.buf.len() as u64, Ordering::Relaxed);
            a.answered.fetch_add(1, Ordering::Release);
            if last {
                self.closing = true;
                return Stop::Write;
            }
        }
    }

    /// Writes what is gathered: `Ok(true)` once all of it is written, `Ok(false)` if the
    /// socket took less (it is then watched for writing).
    fn flush(&mut self, registry: &Registry) -> io::Result<bool> {
        while !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_SLICES];
            let n = self.out.slices(&mut iov);
            match self.stream.write_vectored(&iov[..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    let a = &self.link.activity;
                    a.written.fetch_add(n as u64, Ordering::Relaxed);
                    a.moved_at.store(coarse_ms(), Ordering::Relaxed);
                    self.out.advance(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.blocked {
                        let both = Interest::READABLE | Interest::WRITABLE;
                        registry.reregister(&mut self.stream, Token(self.key), both)?;
                        self.blocked = true;
                    }
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.blocked {
            registry.reregister(&mut self.stream, Token(self.key), Interest::READABLE)?;
            self.blocked = false;
        }
        Ok(true)
    }
}

/// The bytes of a body in memory: one frame, ready at once.
fn full_bytes(f: http_body_util::Full<Bytes>) -> Bytes {
    let mut f = std::pin::pin!(f);
    match hyper::body::Body::poll_frame(f.as_mut(), &mut Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(), // an empty body has no frame
    }
}
