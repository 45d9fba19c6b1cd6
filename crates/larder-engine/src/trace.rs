//! Spans of one request's time, cheap enough to take on every request and kept only for the
//! slow ones (foyer's tail-based tracing): the server gives a request a [`Trace`] and polls
//! it [`Traced`]; while it is polled the trace is this thread's current one, and every
//! [`span`] opened anywhere below (the policy, a budget wait, the index probe, the memory
//! tier, a disk read, a coalesced wait, a write) notes its step, start and length in it. A
//! call that moves to another thread takes a [`Handoff`] and brings its spans back.
//!
//! With no current trace a span is one thread-local check: no clock is read. With one, the
//! clock is quanta's source read raw (the TSC where it is steady: a few instructions, no
//! system call) and scaled only when a kept trace's spans are read, and a finished trace's
//! memory is kept by its thread for the next request.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

/// A reading of the trace clock. A request's start is one too, so that its trace and its
/// elapsed time share one reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(u64);

/// quanta's clock, calibrated once; `raw` skips the thread-local override check and the
/// scaling its `Instant::now` pays on every reading.
static CLOCK: OnceLock<quanta::Clock> = OnceLock::new();

fn clock() -> &'static quanta::Clock {
    CLOCK.get_or_init(quanta::Clock::new)
}

impl Instant {
    /// Now.
    #[inline]
    pub fn now() -> Instant {
        Instant(clock().raw())
    }

    /// The time from `earlier` to this (zero if `earlier` is later).
    #[inline]
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(clock().delta_as_nanos(earlier.0, self.0))
    }

    /// The time since this.
    #[inline]
    pub fn elapsed(self) -> Duration {
        Instant::now().saturating_duration_since(self)
    }

    /// The clock's ticks since this (unscaled: to be added up and scaled once).
    #[inline]
    pub fn ticks_since(self, earlier: Instant) -> Ticks {
        Ticks(self.0.saturating_sub(earlier.0))
    }
}

/// A length of time in the clock's own unit (see [`Instant::ticks_since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticks(u64);

impl std::ops::AddAssign for Ticks {
    fn add_assign(&mut self, other: Ticks) {
        self.0 += other.0;
    }
}

impl std::ops::Add<Ticks> for Instant {
    type Output = Instant;

    fn add(self, t: Ticks) -> Instant {
        Instant(self.0 + t.0)
    }
}

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

/// A span as it is noted: the clock's readings, scaled into a [`Span`] only when a trace is
/// read (a kept one), not on every request.
#[derive(Clone, Copy, Debug)]
struct Noted {
    step: Step,
    depth: u8,
    start: Instant,
    end: Instant,
    bytes: u64,
}

/// One request's spans.
#[derive(Debug)]
pub struct Trace {
    id: u64,
    origin: Instant,
    depth: u8,
    spans: Vec<Noted>,
    dropped: u32,
}

/// Blocks of trace ids handed to threads: a thread takes one block once and numbers its
/// traces from it, so starting a trace touches no line another core writes.
static ID_BLOCKS: AtomicU64 = AtomicU64::new(1);

/// A thread's tracing state, in one thread-local (one lookup where three were).
struct Local {
    /// The trace of the request being polled here.
    current: Option<Box<Trace>>,
    /// A finished trace's memory, for this thread's next one.
    spare: Option<Box<Trace>>,
    /// This thread's next trace id (low half 0: it needs a block).
    next_id: u64,
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local { current: None, spare: None, next_id: 0 }) };
}

impl Local {
    fn next_id(&mut self) -> u64 {
        // No block yet, or this one used up: the next block (a block's first id is skipped,
        // so no id is 0).
        if self.next_id & 0xffff_ffff == 0 {
            self.next_id = (ID_BLOCKS.fetch_add(1, Ordering::Relaxed) << 32) + 1;
        }
        self.next_id += 1;
        self.next_id - 1
    }

    /// A trace for `id`, in the spare's memory if there is one.
    fn trace(&mut self, id: u64, origin: Instant, depth: u8) -> Box<Trace> {
        match self.spare.take() {
            Some(mut t) => {
                (t.id, t.origin, t.depth, t.dropped) = (id, origin, depth, 0);
                t.spans.clear();
                t
            }
            None => Box::new(Trace { id, origin, depth, spans: Vec::with_capacity(MAX_SPANS), dropped: 0 }),
        }
    }
}

impl Trace {
    /// A trace starting now.
    pub fn new() -> Box<Trace> {
        Trace::starting(Instant::now())
    }

    /// A trace whose time runs from `origin` (in the memory of this thread's last finished
    /// one, if it gave it back: see [`Trace::recycle`]).
    pub fn starting(origin: Instant) -> Box<Trace> {
        LOCAL.with(|l| {
            let l = &mut *l.borrow_mut();
            let id = l.next_id();
            l.trace(id, origin, 0)
        })
    }

    /// Gives a finished trace's memory back to this thread, for its next request.
    /// (A thread already holding one keeps it; a thread ending, whose locals are gone, drops
    /// this one: a streamed answer's trace is given back from its body's drop, wherever that
    /// runs.)
    pub fn recycle(self: Box<Trace>) {
        let _ = LOCAL.try_with(|l| {
            let spare = &mut l.borrow_mut().spare;
            if spare.is_none() {
                *spare = Some(self);
            }
        });
    }

    /// When the trace's time starts.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The spans, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
        let span = |n: &Noted| Span {
            step: n.step,
            depth: n.depth,
            start_ns: ns(self.origin, n.start),
            dur_ns: ns(n.start, n.end),
            bytes: n.bytes,
        };
        self.spans.iter().map(span).collect()
    }

    /// Spans not kept (past [`MAX_SPANS`]).
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// Notes a span of `step` from `start` to `end` outside any other (a request's last: its
    /// answer's sending, after its future is done).
    pub fn add(&mut self, step: Step, start: Instant, end: Instant, bytes: u64) {
        self.note(step, 0, start, end, bytes);
    }

    fn push(&mut self, s: Noted) {
        if self.spans.len() < MAX_SPANS {
            self.spans.push(s);
        } else {
            self.dropped += 1;
        }
    }

    /// Notes a span from `start` to `end`.
    fn note(&mut self, step: Step, depth: u8, start: Instant, end: Instant, bytes: u64) {
        self.push(Noted { step, depth, start, end, bytes });
    }
}

/// Swaps `trace` with this thread's current one.
fn swap_current(trace: Option<Box<Trace>>) -> Option<Box<Trace>> {
    LOCAL.with(|l| std::mem::replace(&mut l.borrow_mut().current, trace))
}

/// Runs `f` with `trace` as this thread's current trace (if any), then takes it back.
pub fn within<R>(trace: &mut Option<Box<Trace>>, f: impl FnOnce() -> R) -> R {
    if trace.is_none() {
        return f();
    }
    struct Back<'a>(&'a mut Option<Box<Trace>>, Option<Box<Trace>>);
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            *self.0 = swap_current(self.1.take());
        }
    }
    let before = swap_current(trace.take());
    let _back = Back(trace, before);
    f()
}

/// Whether this thread has a current trace.
pub fn active() -> bool {
    LOCAL.with(|l| l.borrow().current.is_some())
}

/// Opens a span of `step` in the current trace; it ends when the guard is dropped.
#[inline]
pub fn span(step: Step) -> Open {
    Open(LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let t = l.current.as_mut()?;
        let depth = t.depth;
        t.depth = t.depth.saturating_add(1);
        Some(Opened { id: t.id, step, depth, start: Instant::now(), bytes: 0 })
    }))
}

/// Notes a span of `step` that ran from `start` to `end`, at the current depth.
pub fn record(step: Step, start: Instant, end: Instant, bytes: u64) {
    LOCAL.with(|l| {
        if let Some(t) = l.borrow_mut().current.as_mut() {
            let depth = t.depth;
            t.note(step, depth, start, end, bytes);
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
        LOCAL.with(|l| {
            // Ended in its own trace only: a span dropped with a cancelled request, outside
            // its polls, is lost rather than noted in another request's trace.
            if let Some(t) = l.borrow_mut().current.as_mut().filter(|t| t.id == o.id) {
                t.depth = o.depth;
                t.note(o.step, o.depth, o.start, end, o.bytes);
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

/// Spans a handed-off call brings back (a read: its queue, index, disk and a coalesced wait);
/// more are counted as dropped.
const BROUGHT: usize = 8;

/// What a handed-off call noted, and when it ended: held inline, so that a call on the pool
/// allocates nothing for its trace.
pub struct Brought {
    spans: [Noted; BROUGHT],
    len: u8,
    dropped: u32,
    ended: Instant,
}

/// A handoff of the current trace, if there is one (the blocking pool's queue is timed from now).
pub fn handoff() -> Option<Handoff> {
    LOCAL.with(|l| {
        l.borrow().current.as_ref().map(|t| Handoff {
            id: t.id,
            origin: t.origin,
            depth: t.depth,
            sent: Instant::now(),
        })
    })
}

impl Handoff {
    /// Runs `f` on this thread in a trace of its own (in this thread's spare memory) that
    /// shares the request's clock; the wait since the handoff is a [`Step::Queue`] span.
    pub fn run<R>(self, f: impl FnOnce() -> R) -> (R, Brought) {
        let mut t = Some(LOCAL.with(|l| l.borrow_mut().trace(self.id, self.origin, self.depth)));
        let r = within(&mut t, || {
            record(Step::Queue, self.sent, Instant::now(), 0);
            f()
        });
        let t = t.expect("within gives the trace back");
        let ended = Instant::now();
        let empty = Noted { step: Step::Send, depth: 0, start: ended, end: ended, bytes: 0 };
        let mut brought = Brought { spans: [empty; BROUGHT], len: 0, dropped: t.dropped, ended };
        for s in &t.spans {
            if usize::from(brought.len) < BROUGHT {
                brought.spans[usize::from(brought.len)] = *s;
                brought.len += 1;
            } else {
                brought.dropped += 1;
            }
        }
        t.recycle();
        (r, brought)
    }
}

impl Brought {
    /// Adds the spans to the current trace, and the wait since the call ended as a
    /// [`Step::Wake`] span.
    pub fn bring(self) {
        let now = Instant::now();
        LOCAL.with(|l| {
            if let Some(t) = l.borrow_mut().current.as_mut() {
                t.dropped += self.dropped;
                self.spans[..usize::from(self.len)].iter().for_each(|s| t.push(*s));
                let depth = t.depth;
                t.note(Step::Wake, depth, self.ended, now, 0);
            }
        });
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

    #[test]
    fn a_handoff_brings_at_most_its_inline_spans_and_counts_the_rest() {
        let mut t = Some(Trace::new());
        let h = within(&mut t, handoff).unwrap();
        let ((), brought) = std::thread::spawn(move || {
            h.run(|| {
                for _ in 0..BROUGHT + 3 {
                    let _d = span(Step::Disk);
                }
            })
        })
        .join()
        .unwrap();
        within(&mut t, || brought.bring());
        let t = t.unwrap();
        // The queue span and BROUGHT - 1 reads came back, four reads were counted, and the
        // wake was noted here.
        assert_eq!(t.spans().len(), BROUGHT + 1);
        assert_eq!(t.spans()[0].step, Step::Queue);
        assert_eq!(t.spans()[BROUGHT].step, Step::Wake);
        assert_eq!(t.dropped(), 4);
    }

    #[test]
    fn the_clock_measures_real_time() {
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(19) && took < Duration::from_secs(2), "{took:?}");
        assert_eq!(start.saturating_duration_since(Instant::now()), Duration::ZERO);
    }
}
