//! Request bodies as the HTTP doors read them (a PUT's value, a PROPFIND's XML): each frame
//! charged to the body budget as it arrives and awaited within the body's deadline, so that
//! every door that takes a body holds the same limits.

use crate::app::{App, Held, Holding};
use crate::guard::budget::{Budget, Charge};
use crate::guard::{BodyClock, Door, Unit};
use crate::reply::{text, Resp};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::StatusCode;
use larder_engine::trace::{self, Instant, Step, Ticks};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Why a request body was not taken.
pub enum BodyError {
    TooLarge,
    /// Slower than the minimum rate.
    TooSlow,
    Broken(hyper::Error),
}

/// Reads the body as the frames it came in (the store writes them with one vectored write:
/// joining them cost a `memmove` and a fresh buffer's page faults per request), refusing as
/// soon as it passes `limit` (nothing is buffered past it). Each frame is charged to `room`
/// as it arrives (`expected`: the length it declared, if any, else `limit`; see [`charge`]),
/// and the body must keep the minimum rate ([`next_frame`]).
pub async fn read_body(
    app: &App,
    mut body: Incoming,
    limit: u64,
    expected: u64,
    room: &mut Charge,
    held: Option<&Held>,
) -> Result<Vec<Bytes>, BodyError> {
    let mut parts = Vec::new();
    let mut have = 0u64;
    let mut clock = BodyClock::new();
    // A traced request's waits for the client's bytes, as one span (the budget's waits
    // between them are spans of their own), noted however the body ends.
    let mut waits = Waits { traced: trace::active(), first: None, waited: Ticks::default(), bytes: 0 };
    loop {
        let asked = waits.traced.then(Instant::now);
        let frame = next_frame(app, &mut body, &mut clock).await;
        if let Some(t) = asked {
            waits.first.get_or_insert(t);
            waits.waited += Instant::now().ticks_since(t);
        }
        let Some(frame) = frame? else { break };
        let Ok(data) = frame.map_err(BodyError::Broken)?.into_data() else { continue };
        have += data.len() as u64;
        waits.bytes = have;
        if have > limit {
            return Err(BodyError::TooLarge);
        }
        charge(room, have, expected, held).await;
        if !data.is_empty() {
            parts.push(data);
        }
    }
    Ok(parts)
}

/// A body's waits for the client, noted in the request's trace when it is dropped.
struct Waits {
    traced: bool,
    first: Option<Instant>,
    waited: Ticks,
    bytes: u64,
}

impl Drop for Waits {
    fn drop(&mut self) {
        if let Some(f) = self.first {
            trace::record(Step::Body, f, f + self.waited, self.bytes);
        }
    }
}

/// The body's next frame, if it comes before the body's deadline: what arrived must have kept
/// the minimum rate (`Policy::body_deadline`), however it trickles; the time the server took
/// between two frames (room in the budget, the writer) does not count (`BodyClock`).
pub async fn next_frame(
    app: &App,
    body: &mut Incoming,
    clock: &mut BodyClock,
) -> Result<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>, BodyError> {
    clock.resume();
    let frame = match clock.deadline(&app.policy) {
        None => body.frame().await,
        Some(d) => tokio::time::timeout_at(d, body.frame()).await.map_err(|_| {
            app.policy.late(Door::Http, Unit::Body);
            BodyError::TooSlow
        })?,
    };
    if let Some(Ok(f)) = &frame {
        clock.arrived(f.data_ref().map_or(0, |d| d.len() as u64));
    }
    Ok(frame)
}

/// Charges a body that has `have` bytes in and is expected to need room for `expected` in
/// all (with its read buffer): what arrived, without waiting, until it has proven itself (`budget::PROVEN`); then the
/// whole, waited for as a held request (the connection's idle timeout does not run while the
/// server makes it wait).
pub async fn charge(room: &mut Charge, have: u64, expected: u64, held: Option<&Held>) {
    let now = Budget::with_read_buffer(have);
    if room.try_arrived(have, now) {
        return;
    }
    let _holding = Holding::new(held);
    room.grow_to(now.max(Budget::with_read_buffer(expected))).await;
}

/// A body that came too slowly: 408, and the connection closes.
pub fn too_slow() -> Resp {
    let mut r = text(StatusCode::REQUEST_TIMEOUT, "the request body arrived too slowly\n");
    r.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A client's request body passed on as it arrives (to an origin), which must keep the
/// minimum rate (`Policy::body_deadline`) however it trickles: past its deadline it ends
/// with an error, which aborts the request it feeds.
pub struct Paced {
    inner: Incoming,
    app: Arc<App>,
    door: Door,
    clock: BodyClock,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Set when the deadline passed, so that the answer can say why.
    late: Arc<AtomicBool>,
}

impl Paced {
    /// The body `inner` of a request through `door`.
    pub fn new(app: Arc<App>, inner: Incoming, door: Door) -> Paced {
        let timer = Box::pin(tokio::time::sleep(FAR));
        Paced { inner, app, door, clock: BodyClock::new(), timer, late: Arc::default() }
    }

    /// Set once the body missed its deadline.
    pub fn late(&self) -> Arc<AtomicBool> {
        self.late.clone()
    }
}

/// No deadline (the minimum rate turned off): a timer that never fires in practice.
const FAR: std::time::Duration = std::time::Duration::from_secs(86_400 * 365);

impl hyper::body::Body for Paced {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        // Asked for more: the time since the last piece went to the origin was the origin's.
        if this.clock.resume_at_poll() {
            let d = this.clock.deadline(&this.app.policy).unwrap_or_else(|| tokio::time::Instant::now() + FAR);
            this.timer.as_mut().reset(d);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                this.clock.arrived(f.data_ref().map_or(0, |d| d.len() as u64));
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(other) => Poll::Ready(other.map(|r| r.map_err(Into::into))),
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.late.store(true, Ordering::Relaxed);
                    this.app.policy.late(this.door, Unit::Body);
                    Poll::Ready(Some(Err("the request body arrived too slowly".into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
