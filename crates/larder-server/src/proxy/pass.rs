//! Requests the cache does not answer itself go to the origin as they are (their method,
//! range, conditionals and body), and the origin's answer streams back unstored, marked
//! `X-Cache: PASS`: other methods than GET and HEAD, a URI in hit-for-pass, preconditions only
//! the origin can judge, and everything while the store recovers.

use super::mode::{Proxy, X_CACHE};
use super::origin::{self, OriginError};
use crate::app::App;
use crate::body::Paced;
use crate::guard::Door;
use crate::reply::{text, text_owned, Body, Resp};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, VIA};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Forwards a request to the origin as it is and passes its answer back (`X-Cache: PASS`).
/// Its body goes on as it arrives, held to the minimum rate as every body is (a client that
/// trickles one gets `408`, and the origin's connection is given up).
pub(super) async fn pass(app: &Arc<App>, p: &Proxy, req: Request<Incoming>) -> Resp {
    p.counters.passes.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |q| q.as_str()).to_string();
    let headers = origin::request_headers(&parts.headers);
    let body = Paced::new(app.clone(), body, Door::Proxy);
    let slow = body.late();
    match p.origin.send(parts.method.clone(), &target, headers, http_body_util::Either::Left(body)).await {
        Ok(r) => relay(p, r, parts.method == Method::HEAD),
        Err(_) if slow.load(Ordering::Relaxed) => {
            let mut r = text(StatusCode::REQUEST_TIMEOUT, "the request body arrived too slowly\n");
            r.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
            r
        }
        Err(e) => {
            p.counters.origin_errors.fetch_add(1, Ordering::Relaxed);
            let status =
                if matches!(e, OriginError::Timeout) { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
            text_owned(status, format!("{e}\n"))
        }
    }
}

/// An origin's response passed on as it streams.
pub(super) fn relay(p: &Proxy, r: Response<Incoming>, head: bool) -> Resp {
    let (parts, mut body) = r.into_parts();
    let len = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    let no_body = head || parts.status == StatusCode::NO_CONTENT || parts.status == StatusCode::NOT_MODIFIED;
    let out = if no_body {
        Body::full(Bytes::new())
    } else {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let timeout = p.origin.read_timeout;
        tokio::spawn(async move {
            loop {
                let piece = match tokio::time::timeout(timeout, http_body_util::BodyExt::frame(&mut body)).await {
                    Err(_) => Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, "the origin timed out")),
                    Ok(None) => {
                        let _ = tx.send(Ok(Bytes::new())).await; // the end mark
                        break;
                    }
                    Ok(Some(Err(e))) => Err(larder_engine::Error::new(larder_engine::ErrorKind::Io, e.to_string())),
                    Ok(Some(Ok(f))) => match f.into_data() {
                        // An empty piece is the end mark of `Body::Stream`: never pass one on.
                        Ok(d) if d.is_empty() => continue,
                        Ok(d) => Ok(d),
                        Err(_) => continue,
                    },
                };
                let failed = piece.is_err();
                if tx.send(piece).await.is_err() || failed {
                    break;
                }
            }
        });
        match len {
            Some(left) => Body::Pieces { rx, left },
            None => Body::Stream { rx },
        }
    };
    let mut resp = Response::new(out);
    *resp.status_mut() = parts.status;
    let mut h = origin::end_to_end(&parts.headers);
    h.remove(&origin::SURROGATE_CONTROL);
    if no_body && !head {
        h.remove(CONTENT_LENGTH);
    }
    *resp.headers_mut() = h;
    resp.headers_mut().insert(X_CACHE.clone(), HeaderValue::from_static("PASS"));
    resp.headers_mut().append(VIA, HeaderValue::from_static(origin::VIA_VALUE));
    resp
}
