//! One origin fetch per cache key: the first request for a key leads a flight, a task of its
//! own that fetches from the origin, writes the response to the store and streams it to every
//! request that joined before the body began (each with its own byte window for a `Range`).
//! The task runs on when its first client goes away, so the store is filled all the same.
//! This file holds the flight table, a flight's members and how a piece of body reaches
//! them; the leader itself is in `lead.rs`.

use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::StatusCode;
use larder_engine::ByteRange;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The response head a flight's members receive.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// End-to-end fields, as they go to the leader's client (before `Age`, `X-Cache`).
    pub headers: HeaderMap,
    /// Fields only the leader's client receives: those `no-cache="…"` and `private="…"` name,
    /// which the cache may not reuse for anyone else.
    pub withheld: Vec<hyper::header::HeaderName>,
    /// Body length, when the origin said it.
    pub len: Option<u64>,
    /// The leader's request fields the response varies on, with their values, for members to
    /// compare with their own.
    pub selecting: Vec<(hyper::header::HeaderName, Option<hyper::header::HeaderValue>)>,
    /// Age to send, in seconds.
    pub age: u64,
    /// Whether the response is being stored.
    pub storing: bool,
    /// Whether requests that joined the fetch may take it (stored, or an origin error that is
    /// nobody's own).
    pub shareable: bool,
}

/// How a flight ended for its members.
#[derive(Debug)]
pub enum Outcome {
    /// A response: its body follows on the member's data channel, cut to `window` if given.
    Response(Arc<Head>, Option<(u64, u64)>),
    /// The origin answered 304 and the stored response under this key was refreshed.
    Refreshed(Vec<u8>),
    /// No response from the origin (the message says why); `timeout` for a timeout.
    Failed { message: String, timeout: bool },
}

/// A request waiting on a flight.
pub struct Member {
    /// Taken when the outcome is sent.
    pub outcome: Option<oneshot::Sender<Outcome>>,
    pub data: mpsc::Sender<Result<Bytes, larder_engine::Error>>,
    /// The byte range it asked for, and its `If-Range`.
    pub range: Option<(ByteRange, Option<hyper::header::HeaderValue>)>,
    /// Still to skip, and to send, of the body (set when the head is known).
    pub skip: u64,
    pub take: u64,
}

/// One fetch in progress.
pub struct Flight {
    /// Members; `None` once the body began (later requests cannot join).
    pub members: Mutex<Option<Vec<Member>>>,
}

impl Flight {
    /// A flight open to members.
    pub fn new() -> Flight {
        Flight { members: Mutex::new(Some(Vec::new())) }
    }

    /// Adds a member, unless the body has begun.
    pub fn join(&self, m: Member) -> Result<(), Member> {
        match self.members.lock().as_mut() {
            Some(list) => {
                list.push(m);
                Ok(())
            }
            None => Err(m),
        }
    }

    /// Closes the flight to newcomers and hands over its members.
    pub fn close(&self) -> Vec<Member> {
        self.members.lock().take().unwrap_or_default()
    }
}

/// The flights in progress, by cache key, and when keys were last invalidated.
pub struct Flights {
    table: Mutex<HashMap<Vec<u8>, Arc<Flight>>>,
    /// Invalidations so far (a counter, not a clock: each takes the next number).
    epoch: std::sync::atomic::AtomicU64,
    /// The epoch of each key's last invalidation, for the keys invalidated recently (bounded:
    /// a key pushed out is one whose invalidation is long past any fetch still running).
    invalidated: quick_cache::sync::Cache<Vec<u8>, u64>,
}

impl Default for Flights {
    fn default() -> Flights {
        Flights {
            table: Mutex::default(),
            epoch: Default::default(),
            invalidated: quick_cache::sync::Cache::new(65_536),
        }
    }
}

impl Flights {
    /// The flight of `key` and whether the caller leads it (it did not exist).
    pub fn lead_or_join(&self, key: &[u8]) -> (Arc<Flight>, bool) {
        let mut map = self.table.lock();
        if let Some(f) = map.get(key) {
            return (f.clone(), false);
        }
        let f = Arc::new(Flight::new());
        map.insert(key.to_vec(), f.clone());
        (f, true)
    }

    /// Whether a flight of `key` is in progress.
    pub fn busy(&self, key: &[u8]) -> bool {
        self.table.lock().contains_key(key)
    }

    /// The epoch a fetch starts at, to ask [`Flights::invalidated_since`] when it ends.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Notes that what `key` names changed (an unsafe method, RFC 9111 §4.4) or must be fetched
    /// anew (a purge): any fetch of it running now, shared or not, may have fetched what came
    /// before, and is not stored.
    pub fn invalidate(&self, key: &[u8]) {
        let e = self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        self.invalidated.insert(key.to_vec(), e);
    }

    /// Whether `key` was invalidated after `epoch`.
    pub fn invalidated_since(&self, key: &[u8], epoch: u64) -> bool {
        self.invalidated.get(key).is_some_and(|e| e > epoch)
    }

    /// Removes the flight of `key` if it is `f`.
    pub fn end(&self, key: &[u8], f: &Arc<Flight>) {
        let mut map = self.table.lock();
        if map.get(key).is_some_and(|g| Arc::ptr_eq(g, f)) {
            map.remove(key);
        }
    }
}

/// A member's new channels: what it gives the flight, and what it keeps.
pub fn member(
    range: Option<(ByteRange, Option<hyper::header::HeaderValue>)>,
) -> (Member, oneshot::Receiver<Outcome>, mpsc::Receiver<Result<Bytes, larder_engine::Error>>) {
    let (otx, orx) = oneshot::channel();
    // A few slices in flight per member: memory stays bounded by members × this × 64 KiB.
    let (dtx, drx) = mpsc::channel(4);
    (Member { outcome: Some(otx), data: dtx, range, skip: 0, take: u64::MAX }, orx, drx)
}

/// How long a flight waits on a member that takes nothing before it detaches it: its answer
/// is cut (its connection pays), the others and the store go on. A flight moves at the pace
/// of its slowest member, which keeps its memory bounded, so this is what a client that stops
/// reading costs everyone else, once: before, each such member cost the origin read timeout
/// (60 s by default). A member has four slices and its socket's buffers queued ahead of its
/// client; one that takes no 64 KiB slice in 2 s is stalled, or slower than a flight can wait
/// for (32 KiB/s), and can ask again to be answered from the store. Never longer than the
/// read timeout: a client is not waited on longer than the origin is.
pub const MEMBER_STALL: Duration = Duration::from_secs(2);

/// The most a member is handed at once: an origin's pieces can be hundreds of KiB, and
/// whether a member keeps up is judged, and its memory bounded, in these.
const SLICE: usize = 64 << 10;

/// Sends a piece of body to each member, cut to its window, in slices; a member that is gone,
/// or takes no slice within `patience`, is detached.
pub async fn send_to_members(live: &mut Vec<Member>, d: Bytes, patience: Duration) {
    let mut at = 0;
    while at < d.len() {
        let end = (at + SLICE).min(d.len());
        send_slice(live, d.slice(at..end), patience).await;
        at = end;
    }
}

async fn send_slice(live: &mut Vec<Member>, d: Bytes, patience: Duration) {
    // One deadline for the slice, shared: nothing is sent to a member while the ones before it
    // are waited on, so one whose channel is still full at its turn has taken nothing for the
    // whole wait. However many members stall, a slice costs the others `patience` at most.
    let deadline = tokio::time::Instant::now() + patience;
    let mut i = 0;
    while i < live.len() {
        let m = &mut live[i];
        let n = d.len() as u64;
        let start = m.skip.min(n);
        m.skip -= start;
        let end = (start + m.take.min(n - start)).min(n);
        if m.take != u64::MAX {
            m.take -= end - start;
        }
        let ok = if end > start {
            let piece = d.slice(start as usize..end as usize);
            matches!(tokio::time::timeout_at(deadline, m.data.send(Ok(piece))).await, Ok(Ok(())))
        } else {
            !m.data.is_closed()
        };
        if ok {
            i += 1;
        } else {
            // Told, where its channel has room, so a body of unknown length does not look whole;
            // the channel's end cuts a body of known length short all the same.
            let gone = live.swap_remove(i);
            let _ = gone.data.try_send(Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, "fell behind")));
            tracing::debug!(?patience, "a flight member took nothing in time: detached");
        }
    }
}

/// Ends each member's body with the end mark (an empty piece), waiting `patience` at most in
/// all: a body of unknown length that just stops was cut short.
pub async fn end_members(live: &[Member], patience: Duration) {
    let deadline = tokio::time::Instant::now() + patience;
    for m in live {
        let _ = tokio::time::timeout_at(deadline, m.data.send(Ok(Bytes::new()))).await;
    }
}
