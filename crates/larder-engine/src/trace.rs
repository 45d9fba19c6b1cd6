//! Spans of one request's time, cheap enough to take on every request and kept only for the
//! slow ones (foyer's tail-based tracing): the server gives a request a [`Trace`] and polls
//! it [`Traced`]; while it is polled the trace is this thread's current one, and every
//! [`span`] opened anywhere below (the policy, a budget wait, the index probe, the memory
//! tier, a disk read, a coalesced wait, a write) notes its step, start and length in it. A
//! call that moves to another thread takes a [`Handoff`] and brings its spans back.
//!
//! With no current trace a span is one thread-local check: no clock is read. With one, the
//! clock is the TSC through quanta (a few nanoseconds, not a system call's path), and a
//! finished trace's memory is kept by its thread for the next request.

pub use quanta::Instant;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

/// Where a request spent a span of its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Waiting for room in the body budget.
    Budget,
    /// Receiving a request body.
    Body,
    /// Waiting for a thread of the blocking pool.
    Queue,
    /// From a blocking call's end until its request ran again (the runtime's delay).
    Wake,
    /// Looking the key up in the index.
    Index,
    /// Looking the key up in the memory tier.
    Memory,
    /// Reading a record from a volume (its bytes counted).
    Disk,
    /// Waiting for another request's read of the same record.
    Coalesced,
    /// Fetching from the origin (read-through mode).
    Origin,
    /// A write: the writer's lock and the append.
    Write,
    /// Waiting for the group commit's fdatasync.
    Sync,
    /// Sending the answer.
    Send,
}

impl Step {
    /// The step's name in JSON and logs.
    pub fn name(self) -> &'static str {
        match self {
            Step::Budget => "budget_wait",
            Step::Body => "body",
            Step::Queue => "blocking_queue",
            Step::Wake => "wake",
            Step::Index => "index",
            Step::Memory => "memory",
            Step::Disk => "disk_read",
            Step::Coalesced => "coalesced_wait",
            Step::Origin => "origin",
            Step::Write => "write",
            Step::Sync => "sync",
            Step::Send => "send",
        }
    }
}

/// One span: a step, how deep it was opened (0: not inside another span), when it started
/// (from the trace's start) and how long it took, and the bytes it moved.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Where the time went.
    pub step: Step,
    /// Spans open around it.
    pub depth: u8,
    /// Its start, from the trace's.
    pub start_ns: u64,
    /// How long it took.
    pub dur_ns: u64,
    /// Bytes it read or wrote.
    pub bytes: u64,
}

/// Spans a trace keeps; later ones are counted as dropped (a request of many parts).
pub const MAX_SPANS: usize = 32;

/// One request's spans.
#[derive(Debug)]
pub struct Trace {
    id: u64,
    origin: Instant,
    depth: u8,
    spans: Vec<Span>,
    dropped: u32,
}

/// Blocks of trace ids handed to threads: a thread takes one block once and numbers its
/// traces from it, so starting a trace touches no line another core writes.
static ID_BLOCKS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT: RefCell<Option<Box<Trace>>> = const { RefCell::new(None) };
    /// A finished trace's memory, for this thread's next one.
    static SPARE: RefCell<Option<Box<Trace>>> = const { RefCell::new(None) };
    /// This thread's next trace id (low half 0: it needs a block).
    static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn next_id() -> u64 {
    NEXT_ID.with(|n| {
        let mut id = n.get();
        // No block yet, or this one used up: the next block (a block's first id is skipped,
        // so no id is 0).
        if id & 0xffff_ffff == 0 {
            id = (ID_BLOCKS.fetch_add(1, Ordering::Relaxed) << 32) + 1;
        }
        n.set(id + 1);
        id
    })
}

impl Trace {
    /// A trace starting now.
    pub fn new() -> Box<Trace> {
        Trace::starting(Instant::now())
    }

    /// A trace whose time runs from `origin` (in the memory of this thread's last finished
    /// one, if it gave it back: see [`Trace::recycle`]).
    pub fn starting(origin: Instant) -> Box<Trace> {
        let id = next_id();
        match SPARE.with(|s| s.borrow_mut().take()) {
            Some(mut t) => {
                (t.id, t.origin, t.depth, t.dropped) = (id, origin, 0, 0);
                t.spans.clear();
                t
            }
            None => Box::new(Trace { id, origin, depth: 0, spans: Vec::with_capacity(MAX_SPANS), dropped: 0 }),
        }
    }

    /// Gives a finished trace's memory back to this thread, for its next request.
    pub fn recycle(self: Box<Trace>) {
        SPARE.with(|s| *s.borrow_mut() = Some(self));
    }

    /// When the trace's time starts.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The spans, in the order they ended.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Spans not kept (past [`MAX_SPANS`]).
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    fn push(&mut self, s: Span) {
        if self.spans.len() < MAX_SPANS {
            self.spans.push(s);
        } else {
            self.dropped += 1;
        }
    }

    fn since(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }
}

/// Runs `f` with `trace` as this thread's current trace (if any), then takes it back.
pub fn within<R>(trace: &mut Option<Box<Trace>>, f: impl FnOnce() -> R) -> R {
    if trace.is_none() {
        return f();
    }
    struct Back<'a>(&'a mut Option<Box<Trace>>, Option<Box<Trace>>);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            *self.0 = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), self.1.take()));
        }
    }
    let before = CURRENT.with(|c| std::mem::replace(&mut *c.borrow_mut(), trace.take()));
    let _back = Back(trace, before);
    f()
}

/// Whether this thread has a current trace.
pub fn active() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// Opens a span of `step` in the current trace; it ends when the guard is dropped.
#[inline]
pub fn span(step: Step) -> Open {
    Open(CURRENT.with(|c| {
        let mut c = c.borrow_mut();
        let t = c.as_mut()?;
        let depth = t.depth;
        t.depth = t.depth.saturating_add(1);
        Some(Opened { id: t.id, step, depth, start: Instant::now(), bytes: 0 })
    }))
}

/// Notes a span of `step` that ran from `start` to `end`, at the current depth.
pub fn record(step: Step, start: Instant, end: Instant, bytes: u64) {
    CURRENT.with(|c| {
        if let Some(t) = c.borrow_mut().as_mut() {
            let (start_ns, end_ns) = (t.since(start), t.since(end));
            let depth = t.depth;
            t.push(Span { step, depth, start_ns, dur_ns: end_ns.saturating_sub(start_ns), bytes });
        }
    })
}

/// An open span (or nothing, with no current trace).
#[must_use = "a span ends when it is dropped"]
pub struct Open(Option<Opened>);

struct Opened {
    id: u64,
    step: Step,
    depth: u8,
    start: Instant,
    bytes: u64,
}

impl Open {
    /// Counts `n` bytes the span moved.
    pub fn bytes(&mut self, n: u64) {
        if let Some(o) = &mut self.0 {
            o.bytes += n;
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let Some(o) = self.0.take() else { return };
        let end = Instant::now();
        CURRENT.with(|c| {
            // Ended in its own trace only: a span dropped with a cancelled request, outside
            // its polls, is lost rather than noted in another request's trace.
            if let Some(t) = c.borrow_mut().as_mut().filter(|t| t.id == o.id) {
                t.depth = o.depth;
                let start_ns = t.since(o.start);
                t.push(Span {
                    step: o.step,
                    depth: o.depth,
                    start_ns,
                    dur_ns: t.since(end).saturating_sub(start_ns),
                    bytes: o.bytes,
                });
            }
        })
    }
}

/// The current trace, for a call that runs on another thread: [`Handoff::run`] there, and
/// [`Handoff::bring`] its spans back here.
pub struct Handoff {
    id: u64,
    origin: Instant,
    depth: u8,
    sent: Instant,
}

/// What a handed-off call noted, and when it ended.
pub struct Brought {
    spans: Vec<Span>,
    dropped: u32,
    ended: Instant,
}

/// A handoff of the current trace, if there is one (the blocking pool's queue is timed from now).
pub fn handoff() -> Option<Handoff> {
    CURRENT.with(|c| {
        c.borrow().as_ref().map(|t| Handoff { id: t.id, origin: t.origin, depth: t.depth, sent: Instant::now() })
    })
}

impl Handoff {
    /// Runs `f` on this thread in a trace of its own that shares the request's clock; the
    /// wait since the handoff is a [`Step::Queue`] span.
    pub fn run<R>(self, f: impl FnOnce() -> R) -> (R, Brought) {
        let mut t = Some(Box::new(Trace {
            id: self.id,
            origin: self.origin,
            depth: self.depth,
            spans: Vec::with_capacity(4),
            dropped: 0,
        }));
        let r = within(&mut t, || {
            record(Step::Queue, self.sent, Instant::now(), 0);
            f()
        });
        let t = t.expect("within gives the trace back");
        (r, Brought { spans: t.spans, dropped: t.dropped, ended: Instant::now() })
    }
}

impl Brought {
    /// Adds the spans to the current trace, and the wait since the call ended as a
    /// [`Step::Wake`] span.
    pub fn bring(self) {
        CURRENT.with(|c| {
            if let Some(t) = c.borrow_mut().as_mut() {
                t.dropped += self.dropped;
                self.spans.into_iter().for_each(|s| t.push(s));
            }
        });
        record(Step::Wake, self.ended, Instant::now(), 0);
    }
}

pin_project_lite::pin_project! {
    /// A future polled with its trace current (see [`within`]).
    pub struct Traced<'a, F> {
        #[pin]
        fut: F,
        trace: &'a mut Option<Box<Trace>>,
    }
}

impl<'a, F> Traced<'a, F> {
    /// `fut`, polled with `trace` current (a `None` trace: polled as it is).
    pub fn new(fut: F, trace: &'a mut Option<Box<Trace>>) -> Self {
        Traced { fut, trace }
    }
}

impl<F: Future> Future for Traced<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let fut = this.fut;
        within(this.trace, || fut.poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn spans_nest_and_are_kept_only_in_their_trace() {
        let outside = span(Step::Disk);
        drop(outside);
        let mut t = Some(Trace::new());
        within(&mut t, || {
            let _w = span(Step::Write);
            {
                let mut d = span(Step::Disk);
                d.bytes(4096);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let t = t.unwrap();
        let s = t.spans();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].step, s[0].depth, s[0].bytes), (Step::Disk, 1, 4096));
        assert!(s[0].dur_ns >= 2_000_000);
        assert_eq!((s[1].step, s[1].depth), (Step::Write, 0));
        assert!(s[1].dur_ns >= s[0].dur_ns);
        assert!(!active(), "the trace is taken back");
    }

    #[test]
    fn a_handoff_brings_the_other_threads_spans_back() {
        let mut t = Some(Trace::new());
        let h = within(&mut t, handoff).unwrap();
        let (n, brought) = std::thread::spawn(move || {
            h.run(|| {
                let _d = span(Step::Disk);
                7
            })
        })
        .join()
        .unwrap();
        assert_eq!(n, 7);
        within(&mut t, || brought.bring());
        let steps: Vec<_> = t.unwrap().spans().iter().map(|s| s.step).collect();
        assert_eq!(steps, [Step::Queue, Step::Disk, Step::Wake]);
    }
}
