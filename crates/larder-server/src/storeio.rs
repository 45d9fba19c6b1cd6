//! The store as the doors call it: inline when a call need not wait, else on the blocking
//! pool, so that a cold disk or a writer lock never stalls the async workers; values read
//! whole, or a large value's pieces streamed within the body budget.

use crate::app::{App, Held, Holding};
use crate::reply::Body;
use larder_engine::{ErrorKind, Part, ReadOptions, Store, Value, ValueReader};
use std::sync::Arc;

/// Reads `part` of a value. Memory and page-cache hits are answered inline; a read that
/// would wait for the device (or for another request's read of the same key, which it then
/// shares) runs on the blocking pool, so a cold disk never stalls the async workers.
pub(crate) async fn read(
    app: &Arc<App>,
    store: &Store,
    key: &[u8],
    part: Part,
    coded: bool,
) -> larder_engine::Result<Option<Value>> {
    match store.get(key, &ReadOptions { part, nonblocking: true, coded }) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            let key = key.to_vec();
            blocking(app, move |store| store.get(&key, &ReadOptions { part, nonblocking: false, coded })).await
        }
        found => found,
    }
}

/// What a GET read: the bytes, in memory; or a large value's part longer than a chunk, to be
/// streamed piece by piece, so that no more than about a chunk of it is ever in memory.
pub(crate) enum Read {
    Value(Value),
    Pieces(ValueReader),
}

impl Read {
    pub(crate) fn value(&self) -> &Value {
        match self {
            Read::Value(v) => v,
            Read::Pieces(r) => r.value(),
        }
    }
}

/// [`read`] for a GET's body: memory and page-cache hits inline; on the blocking pool, a large
/// value (longer than a chunk) comes back as a reader. `coded`: as `ReadOptions::coded`.
pub(crate) async fn read_body_of(
    app: &Arc<App>,
    store: &Store,
    key: &[u8],
    part: Part,
    coded: bool,
) -> larder_engine::Result<Option<Read>> {
    let pieces = |key: Vec<u8>| blocking(app, move |store| Ok(store.reader(&key, part)?.map(Read::Pieces)));
    match store.get(key, &ReadOptions { part, nonblocking: true, coded }) {
        Err(e) if e.kind() == ErrorKind::TooLarge => pieces(key.to_vec()).await,
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            let k = key.to_vec();
            match blocking(app, move |store| store.get(&k, &ReadOptions { part, nonblocking: false, coded })).await {
                Err(e) if e.kind() == ErrorKind::TooLarge => pieces(key.to_vec()).await,
                found => found.map(|v| v.map(Read::Value)),
            }
        }
        found => found.map(|v| v.map(Read::Value)),
    }
}

/// The body of an answer carrying `len` bytes of what was read. A large value's pieces are
/// read on the blocking pool, one task per piece, as the client takes them (one more waits in
/// between): a slow client holds no thread. They are held within the body budget (two
/// pieces), whose room is waited for before the answer starts, as a held request (`held`):
/// the connection's idle timeout does not run meanwhile. A piece that fails ends the body with
/// an error, which closes the connection.
pub(crate) async fn body_of(app: &Arc<App>, held: Option<&Held>, read: Read, len: u64) -> Body {
    match read {
        Read::Value(v) => Body::full(v.data),
        Read::Pieces(mut r) => {
            let chunk = app.store.get().expect("store is ready before reads are routed").config().chunk_size;
            let holding = Holding::new(held);
            let room = app.body_budget.reserve_exact(len.min(2 * chunk)).await;
            drop(holding);
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                let _room = room;
                loop {
                    // Room for the piece first, so no piece is read for a client gone away.
                    let Ok(permit) = tx.reserve().await else { break };
                    let Ok((back, piece)) = tokio::task::spawn_blocking(move || {
                        let piece = r.next_piece();
                        (r, piece)
                    })
                    .await
                    else {
                        break;
                    };
                    r = back;
                    match piece {
                        Ok(Some(p)) => permit.send(Ok(p)),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::error!(error = %e, "a large value failed while it was sent; the answer is cut short");
                            permit.send(Err(e));
                            break;
                        }
                    }
                }
            });
            Body::Pieces { rx, left: len }
        }
    }
}

/// A store call made inline when it need not wait, else on the blocking pool. `f` is told
/// whether it may wait: called first with `false`, it either finishes or fails with
/// `WouldBlock` having changed nothing (each store call it makes `nonblocking`, none after a
/// write that took effect), and is then called again on the blocking pool with `true`. A
/// small write's hand-off to the pool and back costs more than the write itself.
pub(crate) async fn quick<T: Send + 'static>(
    app: &Arc<App>,
    f: impl Fn(&Store, bool) -> larder_engine::Result<T> + Send + 'static,
) -> larder_engine::Result<T> {
    match f(app.store.get().expect("store is ready before writes are routed"), false) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => blocking(app, move |s| f(s, true)).await,
        done => done,
    }
}

/// Runs a write that has to wait (for the writer lock, a ring rotation truncating a volume,
/// or a group-commit fdatasync) on the blocking pool, so that it never stalls the async
/// workers serving GETs. The common case runs inline, as a `nonblocking` put or delete.
pub(crate) async fn blocking<T: Send + 'static>(
    app: &Arc<App>,
    f: impl FnOnce(&Store) -> larder_engine::Result<T> + Send + 'static,
) -> larder_engine::Result<T> {
    let app = app.clone();
    let store = move || f(app.store.get().expect("store is ready before writes are routed"));
    // A traced request's spans follow it onto the pool and back (its wait for a thread too).
    match larder_engine::trace::handoff() {
        None => tokio::task::spawn_blocking(store).await.expect("store call panicked"),
        Some(h) => {
            let (r, brought) = tokio::task::spawn_blocking(move || h.run(store)).await.expect("store call panicked");
            brought.bring();
            r
        }
    }
}
