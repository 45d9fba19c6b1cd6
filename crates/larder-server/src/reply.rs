//! The answers every handler builds alike: the response type, short text bodies, and 405 with
//! its `Allow` header.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// Every answer: the whole body is in memory when the handler returns.
pub type Resp = Response<Full<Bytes>>;

/// A plain-text answer of a fixed message.
pub fn text(status: StatusCode, msg: &'static str) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from_static(msg.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// A plain-text answer of a message built for the request.
pub fn text_owned(status: StatusCode, msg: String) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(msg)));
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
