//! Lanes: one thread per core, each running the connection tasks given to it, on its own
//! `mio` loop. A connection's task is an ordinary future (the memcached door's session, for
//! one) over a [`LaneStream`]; it is polled on its lane, and only there, when its socket
//! becomes ready or something it waits for (a timer, the blocking pool, a lock) wakes it.
//!
//! What this saves against a task on the runtime, per request: no scheduler queue, no
//! cross-thread wake-up for the socket's readiness (the loop that hears it polls the task),
//! no wake-up for a write the socket takes at once (a socket is watched for writing only while
//! a write waits), and no read that only says the socket is empty. The runtime stays entered
//! on every lane, so a task uses its timers, its blocking pool and its synchronisation as it
//! would anywhere.

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll as Ready, Wake, Waker};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const WAKE: Token = Token(usize::MAX);
/// Readiness bits a loop sets for a task's socket, and the stream consumes.
const READ: u8 = 1;
const WRITE: u8 = 2;
/// The peer closed its side (perhaps behind data, in the same event): read to the end.
const HUP: u8 = 4;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Reads and writes a task makes in one poll before it yields to the others on its lane (as
/// tokio's task budget does): a client that pipelines without end does not hold its lane.
const BUDGET: u32 = 128;

thread_local! {
    static LEFT: std::cell::Cell<u32> = const { std::cell::Cell::new(BUDGET) };
}

/// Whether the polled task may do one more read or write now; if not, it is woken to go on
/// after the others.
fn spend(cx: &Context<'_>) -> bool {
    LEFT.with(|left| match left.get() {
        0 => {
            cx.waker().wake_by_ref();
            false
        }
        n => {
            left.set(n - 1);
            true
        }
    })
}
type Start = Box<dyn FnOnce(LaneStream) -> Task + Send>;

/// The lanes, given connections in turn.
pub struct Lanes {
    lanes: Vec<Arc<Shared>>,
    next: AtomicUsize,
}

/// What other threads share with a lane: its inbox, and the waker of its loop.
struct Shared {
    waker: mio::Waker,
    inbox: parking_lot::Mutex<Inbox>,
    /// A wake-up of the loop is on its way (so that a burst of wakes costs one).
    poked: AtomicBool,
}

#[derive(Default)]
struct Inbox {
    arrivals: Vec<(std::net::TcpStream, Start)>,
    woken: Vec<usize>,
}

impl Shared {
    fn poke(&self) {
        if !self.poked.swap(true, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }
}

impl Lanes {
    /// Starts `n` lanes (at least one); each enters `runtime`.
    pub fn start(n: usize, name: &str, runtime: tokio::runtime::Handle) -> io::Result<Lanes> {
        let mut lanes = Vec::new();
        for i in 0..n.max(1) {
            let poll = Poll::new()?;
            let registry = Arc::new(poll.registry().try_clone()?);
            let shared = Arc::new(Shared {
                waker: mio::Waker::new(poll.registry(), WAKE)?,
                inbox: Default::default(),
                poked: AtomicBool::new(false),
            });
            let (runtime, mine) = (runtime.clone(), shared.clone());
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                let _entered = runtime.enter();
                let lane = Loop { poll, registry, shared: mine, tasks: slab::Slab::new() };
                // Tasks' panics are caught; one that escapes is a fault of the lane itself, whose
                // connections would hang unseen: the process stops, loudly.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lane.run())).is_err() {
                    tracing::error!("a lane failed; stopping");
                    std::process::abort();
                }
            })?;
            lanes.push(shared);
        }
        Ok(Lanes { lanes, next: AtomicUsize::new(0) })
    }

    /// Runs the task `start` makes of `stream` on the next lane. The returned future ends when
    /// the task does; dropping it ends the task at its next poll (as aborting a runtime task
    /// would).
    pub fn run<F, Fut>(&self, stream: std::net::TcpStream, start: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnOnce(LaneStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (mut done, ended) = tokio::sync::oneshot::channel::<()>();
        let start: Start = Box::new(move |s| {
            Box::pin(async move {
                // The handle dropped (an abort) ends the task before it runs another step.
                tokio::select! {
                    biased;
                    _ = done.closed() => {}
                    _ = start(s) => {}
                }
            })
        });
        let lane = &self.lanes[self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()];
        lane.inbox.lock().arrivals.push((stream, start));
        lane.poke();
        async move {
            let _ = ended.await;
        }
    }
}

struct Loop {
    poll: Poll,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
    tasks: slab::Slab<Entry>,
}

struct Entry {
    task: Task,
    waker: Waker,
    ready: Arc<AtomicU8>,
}

/// Wakes a lane's task from anywhere: it is polled on its lane.
struct TaskWaker {
    shared: Arc<Shared>,
    key: usize,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.inbox.lock().woken.push(self.key);
        self.shared.poke();
    }
}

impl Loop {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut woken = Vec::new();
        loop {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "a lane's wait failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
            for ev in events.iter() {
                if ev.token() == WAKE {
                    continue; // the inbox is read below, after every event
                }
                let key = ev.token().0;
                if let Some(e) = self.tasks.get(key) {
                    let mut bits = 0;
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        bits |= READ;
                    }
                    if ev.is_read_closed() || ev.is_error() {
                        bits |= HUP;
                    }
                    if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                        bits |= WRITE;
                    }
                    e.ready.fetch_or(bits, Ordering::Relaxed);
                    self.poll_task(key);
                }
            }
            if self.shared.poked.swap(false, Ordering::AcqRel) {
                let arrivals = {
                    let mut inbox = self.shared.inbox.lock();
                    std::mem::swap(&mut woken, &mut inbox.woken);
                    std::mem::take(&mut inbox.arrivals)
                };
                for (stream, start) in arrivals {
                    self.arrive(stream, start);
                }
                // (A key whose task ended and was given to a newcomer only costs the newcomer
                // a poll that finds nothing to do.)
                for key in woken.drain(..) {
                    self.poll_task(key);
                }
            }
        }
    }

    fn arrive(&mut self, stream: std::net::TcpStream, start: Start) {
        let entry = self.tasks.vacant_entry();
        let key = entry.key();
        let mut io = TcpStream::from_std(stream);
        // Registering reports what already arrived, so nothing is missed.
        if self.registry.register(&mut io, Token(key), Interest::READABLE).is_err() {
            return; // dropped: closed
        }
        let ready = Arc::new(AtomicU8::new(READ));
        let stream =
            LaneStream { io, token: Token(key), registry: self.registry.clone(), ready: ready.clone(), writing: false };
        let waker = Waker::from(Arc::new(TaskWaker { shared: self.shared.clone(), key }));
        entry.insert(Entry { task: start(stream), waker, ready });
        self.poll_task(key);
    }

    fn poll_task(&mut self, key: usize) {
        let Some(e) = self.tasks.get_mut(key) else { return };
        let mut cx = Context::from_waker(&e.waker);
        LEFT.with(|left| left.set(BUDGET));
        // A panic ends its task (as on the runtime), not the lane with every other task on it.
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.task.as_mut().poll(&mut cx)));
        if !matches!(polled, Ok(Ready::Pending)) {
            let tasks = &mut self.tasks;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(tasks.remove(key))));
        }
    }
}

/// A connection's socket on its lane, for its task: reads and writes go straight to the
/// socket, and a task whose read or write must wait is polled again when the lane hears the
/// socket is ready.
pub struct LaneStream {
    io: TcpStream,
    token: Token,
    registry: Arc<Registry>,
    ready: Arc<AtomicU8>,
    /// Watched for writing (a write waits).
    writing: bool,
}

impl LaneStream {
    /// Writes what the socket takes now, or `WouldBlock`.
    pub fn try_write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        use std::io::Write;
        self.io.write_vectored(bufs)
    }

    fn watch_writes(&mut self, on: bool) -> io::Result<()> {
        if self.writing != on {
            let interest = if on { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            self.registry.reregister(&mut self.io, self.token, interest)?;
            self.writing = on;
        }
        Ok(())
    }

    fn written(&mut self, r: io::Result<usize>) -> Ready<io::Result<usize>> {
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.ready.fetch_and(!WRITE, Ordering::Relaxed);
                match self.watch_writes(true) {
                    Ok(()) => Ready::Pending,
                    Err(e) => Ready::Ready(Err(e)),
                }
            }
            r => {
                if self.writing {
                    // (Left watched, a socket only costs a wake-up more; the write is done.)
                    if let Err(e) = self.watch_writes(false) {
                        tracing::debug!(error = %e, "a socket could not stop being watched for writes");
                    }
                }
                Ready::Ready(r)
            }
        }
    }
}

impl AsyncRead for LaneStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Ready<io::Result<()>> {
        let this = self.get_mut();
        // Empty since the last read, and no event since: the lane polls again when one comes.
        let bits = this.ready.load(Ordering::Relaxed);
        if bits & (READ | HUP) == 0 || !spend(cx) {
            return Ready::Pending;
        }
        loop {
            // SAFETY: `recv` writes at most `unfilled.len()` bytes and reports how many; only
            // those are marked initialised.
            let unfilled = unsafe { buf.unfilled_mut() };
            let room = unfilled.len();
            match rustix::net::recv(&this.io, unfilled, rustix::net::RecvFlags::empty()) {
                Ok((_, n)) => {
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    // A short read emptied the socket: the next data is a new event. After a
                    // hang-up, only the end (0) says so.
                    if n < room && n > 0 && bits & HUP == 0 {
                        this.ready.fetch_and(!READ, Ordering::Relaxed);
                    }
                    return Ready::Ready(Ok(()));
                }
                Err(rustix::io::Errno::AGAIN) => {
                    this.ready.fetch_and(!(READ | HUP), Ordering::Relaxed);
                    return Ready::Pending;
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Ready::Ready(Err(e.into())),
            }
        }
    }
}

impl AsyncWrite for LaneStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Ready<io::Result<usize>> {
        use std::io::Write;
        if !spend(cx) {
            return Ready::Pending;
        }
        let this = self.get_mut();
        let r = this.io.write(buf);
        this.written(r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Ready<io::Result<usize>> {
        if !spend(cx) {
            return Ready::Pending;
        }
        let this = self.get_mut();
        let r = this.try_write_vectored(bufs);
        this.written(r)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Ready<io::Result<()>> {
        Ready::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Ready<io::Result<()>> {
        Ready::Ready(self.io.shutdown(std::net::Shutdown::Write))
    }
}

impl Drop for LaneStream {
    fn drop(&mut self) {
        let _ = self.registry.deregister(&mut self.io);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connected pair: the client's end, and the server's end for a lane.
    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (client, server)
    }

    /// Echoes what it reads until the client closes, with a timer between reads (a wake from
    /// the runtime's timer thread, not from the socket).
    async fn echo(mut s: LaneStream) {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            s.write_all(&buf[..n]).await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_read_write_sleep_and_end_on_their_lane() {
        let lanes = Lanes::start(1, "test-lane", tokio::runtime::Handle::current()).unwrap();
        let (mut a, sa) = pair();
        let (mut b, sb) = pair();
        let ended_a = lanes.run(sa, echo);
        let ended_b = lanes.run(sb, echo);
        // Each more than the socket holds at once, so writes wait for the reader too.
        let ra: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let ta = std::thread::spawn(move || {
            let mut back = vec![0u8; ra.len()];
            let reader = std::thread::scope(|sc| {
                let mut r = a.try_clone().unwrap();
                let h = sc.spawn(move || r.read_exact(&mut back).map(|_| back));
                a.write_all(&ra).unwrap();
                h.join().unwrap()
            });
            a.shutdown(std::net::Shutdown::Write).unwrap();
            reader.unwrap() == ra
        });
        b.write_all(b"hello").unwrap();
        let mut five = [0u8; 5];
        b.read_exact(&mut five).unwrap();
        assert_eq!(&five, b"hello");
        drop(b);
        assert!(tokio::task::spawn_blocking(move || ta.join().unwrap()).await.unwrap(), "the echo differed");
        tokio::time::timeout(Duration::from_secs(10), async {
            ended_a.await;
            ended_b.await;
        })
        .await
        .expect("the tasks ended with their clients");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_handle_ends_the_task_and_a_panic_ends_only_its_own() {
        let lanes = Lanes::start(1, "test-lane", tokio::runtime::Handle::current()).unwrap();
        let (mut a, sa) = pair();
        drop(lanes.run(sa, echo)); // as an aborted task's handle
        let mut rest = Vec::new();
        let closed = tokio::task::spawn_blocking(move || a.read_to_end(&mut rest).map(|_| rest)).await.unwrap();
        assert_eq!(closed.unwrap(), b"", "the dropped task's socket closes");

        let (mut p, sp) = pair();
        let panicked = lanes.run(sp, |_s| async { panic!("a task's own failure") });
        tokio::time::timeout(Duration::from_secs(10), panicked).await.expect("a panicked task ends");
        let mut rest = Vec::new();
        let closed = tokio::task::spawn_blocking(move || p.read_to_end(&mut rest).map(|_| rest)).await.unwrap();
        assert_eq!(closed.unwrap(), b"");
        // The lane goes on with its other tasks.
        let (mut c, sc) = pair();
        let _alive = lanes.run(sc, echo);
        c.write_all(b"still here").unwrap();
        let mut got = [0u8; 10];
        let got = tokio::task::spawn_blocking(move || c.read_exact(&mut got).map(|_| got)).await.unwrap();
        assert_eq!(&got.unwrap(), b"still here");
    }
}
