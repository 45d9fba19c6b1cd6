//! The status page at `/_larder/`: its HTML, script and styles compiled into the binary, sent
//! with a content security policy that lets it reach nothing but this server (no request
//! leaves for another host, and no script runs but its own).

use crate::reply::{text, Body, Resp};
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use hyper::{Response, StatusCode};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/ui.js");
const STYLE: &str = include_str!("page/ui.css");

/// Where the page may reach: this server, for its own files and figures; nothing else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One of the page's files by its name under `/_larder/` (`""` is the page).
pub fn asset(what: &[u8]) -> Resp {
    let (body, kind) = match what {
        b"" => (INDEX, "text/html; charset=utf-8"),
        b"ui.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        b"ui.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return text(StatusCode::NOT_FOUND, "no such admin endpoint\n"),
    };
    let mut r = Response::new(Body::full(Bytes::from_static(body.as_bytes())));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    h.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    r
}
