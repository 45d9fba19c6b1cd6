//! The answers every handler builds alike: the response type, short text bodies, and 405 with
//! its `Allow` header.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Frame, SizeHint};
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use larder_engine::ErrorKind;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Every answer.
pub type Resp = Response<Body>;

/// An answer's body: in memory when the handler returns, or a large value's verified pieces
/// as a reader hands them over. A piece that fails (a chunk lost or damaged) ends the body
/// with an error, and hyper closes the connection before the body is complete: the client
/// sees a truncated answer, never wrong bytes.
pub enum Body {
    Full(Full<Bytes>),
    Pieces {
        rx: tokio::sync::mpsc::Receiver<Result<Bytes, larder_engine::Error>>,
        left: u64,
    },
    /// Pieces of a body whose length is not known (an origin's chunked answer, passed on). An
    /// empty piece marks its end: a channel that closes without one was cut short, and the
    /// body ends with an error, so the client never takes a truncated answer for a whole one.
    Stream {
        rx: tokio::sync::mpsc::Receiver<Result<Bytes, larder_engine::Error>>,
    },
    /// A streamed body followed to its end (a traced request's, whose time runs until its
    /// last piece is handed to the connection): see [`Ended`].
    Watched(Box<Body>, Ended),
}

/// What runs when a watched body ends: once, with the bytes it passed on, when it is done,
/// fails, or is dropped unfinished (the client gone).
pub struct Ended {
    then: Option<Box<dyn FnOnce(u64) + Send>>,
    sent: u64,
}

impl Ended {
    pub fn new(then: impl FnOnce(u64) + Send + 'static) -> Ended {
        Ended { then: Some(Box::new(then)), sent: 0 }
    }

    fn end(&mut self) {
        if let Some(then) = self.then.take() {
            then(self.sent);
        }
    }
}

impl Drop for Ended {
    fn drop(&mut self) {
        self.end();
    }
}

impl Body {
    pub fn full(b: Bytes) -> Body {
        Body::Full(Full::new(b))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Body::Full(f) => Pin::new(f).poll_frame(cx).map_err(|e| match e {}),
            Body::Pieces { rx, left } => match rx.poll_recv(cx) {
                // An end mark (see `Stream`) adds nothing to a body of known length.
                Poll::Ready(Some(Ok(b))) if b.is_empty() => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                // More than the answer's length is a fault of ours: end the body with an error
                // rather than let hyper cut it and call the answer complete.
                Poll::Ready(Some(Ok(b))) if b.len() as u64 > *left => {
                    Poll::Ready(Some(Err("the value ran past its length".into())))
                }
                Poll::Ready(Some(Ok(b))) => {
                    *left -= b.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) if *left > 0 => Poll::Ready(Some(Err("the value ended short".into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            Body::Watched(body, ended) => {
                let frame = Pin::new(&mut **body).poll_frame(cx);
                match &frame {
                    Poll::Ready(Some(Ok(f))) => ended.sent += f.data_ref().map_or(0, |d| d.len() as u64),
                    Poll::Ready(_) => ended.end(),
                    Poll::Pending => {}
                }
                frame
            }
            Body::Stream { rx } => match rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(b))) if b.is_empty() => {
                    rx.close();
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Ok(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => Poll::Ready(Some(Err("the body was cut short".into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(f) => f.is_end_stream(),
            Body::Pieces { left, .. } => *left == 0,
            Body::Stream { .. } => false,
            Body::Watched(body, _) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(f) => f.size_hint(),
            Body::Pieces { left, .. } => SizeHint::with_exact(*left),
            Body::Stream { .. } => SizeHint::default(),
            Body::Watched(body, _) => body.size_hint(),
        }
    }
}

/// A plain-text answer of a fixed message.
pub fn text(status: StatusCode, msg: &'static str) -> Resp {
    let mut r = Response::new(Body::full(Bytes::from_static(msg.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// A plain-text answer of a message built for the request.
pub fn text_owned(status: StatusCode, msg: String) -> Resp {
    let mut r = Response::new(Body::full(Bytes::from(msg)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// 405, naming the methods the resource takes.
pub fn method_not_allowed(allowed: &'static str) -> Resp {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    r.headers_mut().insert(ALLOW, HeaderValue::from_static(allowed));
    r
}

/// Whether a request reads or writes: an I/O failure on a read means the data is
/// unavailable (503, DESIGN §2), on a write that the write failed (500).
#[derive(Clone, Copy)]
pub enum Op {
    Read,
    Write,
}

/// The one table from engine errors to HTTP statuses.
pub fn engine_error(e: &larder_engine::Error, op: Op) -> Resp {
    let status = match (e.kind(), op) {
        (ErrorKind::NoSpace, _) => StatusCode::INSUFFICIENT_STORAGE,
        (ErrorKind::TooLarge, _) => StatusCode::PAYLOAD_TOO_LARGE,
        (ErrorKind::InvalidKey | ErrorKind::Invalid, _) => StatusCode::BAD_REQUEST,
        (ErrorKind::PreconditionFailed, _) => {
            return text_owned(StatusCode::PRECONDITION_FAILED, format!("precondition failed: {e}\n"));
        }
        (ErrorKind::Io | ErrorKind::Corrupt, Op::Read) => StatusCode::SERVICE_UNAVAILABLE,
        (ErrorKind::Io | ErrorKind::Corrupt | ErrorKind::Locked, _) => StatusCode::INTERNAL_SERVER_ERROR,
        // The handlers retry a would-block call on the blocking pool; it never reaches here.
        (ErrorKind::WouldBlock, _) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %e, "request failed");
    }
    text_owned(status, format!("{e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};

    type Pieces = tokio::sync::mpsc::Sender<Result<Bytes, larder_engine::Error>>;

    /// A watched body of `len` bytes in pieces, its sender, and what its `Ended` was told,
    /// each time.
    fn watched(len: u64) -> (Body, Pieces, Arc<Mutex<Vec<u64>>>) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let told = Arc::new(Mutex::new(Vec::new()));
        let t = told.clone();
        let body =
            Body::Watched(Box::new(Body::Pieces { rx, left: len }), Ended::new(move |n| t.lock().unwrap().push(n)));
        (body, tx, told)
    }

    #[tokio::test]
    async fn a_watched_body_ends_once_however_it_ends() {
        // Read to its end: told once, with every byte, though dropped afterwards too.
        let (mut body, tx, told) = watched(6);
        tx.send(Ok(Bytes::from_static(b"abc"))).await.unwrap();
        tx.send(Ok(Bytes::from_static(b"def"))).await.unwrap();
        drop(tx);
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "abc");
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "def");
        assert!(hyper::body::Body::is_end_stream(&body), "its length is its head's");
        assert!(body.frame().await.is_none());
        drop(body);
        assert_eq!(*told.lock().unwrap(), [6]);

        // Its last piece taken and then dropped (hyper stops at `is_end_stream`): told on drop.
        let (mut body, tx, told) = watched(3);
        tx.send(Ok(Bytes::from_static(b"abc"))).await.unwrap();
        body.frame().await.unwrap().unwrap();
        assert!(told.lock().unwrap().is_empty());
        drop(body);
        assert_eq!(*told.lock().unwrap(), [3]);

        // The client gone halfway: told on drop, with what was passed on.
        let (mut body, tx, told) = watched(6);
        tx.send(Ok(Bytes::from_static(b"abc"))).await.unwrap();
        body.frame().await.unwrap().unwrap();
        drop(body);
        assert_eq!(*told.lock().unwrap(), [3]);

        // A piece that failed: told when the error is passed on, and not again on drop.
        let (mut body, tx, told) = watched(6);
        tx.send(Err(larder_engine::Error::new(ErrorKind::Corrupt, "a chunk lost"))).await.unwrap();
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(*told.lock().unwrap(), [0]);
        drop(body);
        assert_eq!(*told.lock().unwrap(), [0]);
    }
}
