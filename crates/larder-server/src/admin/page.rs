//! The status page at `/_larder/`: its HTML, script and styles compiled into the binary, sent
//! with a content security policy that lets it reach nothing but this server (no request
//! leaves for another host, and no script runs but its own).

use crate::reply::{text, Body, Resp};
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use hyper::{Response, StatusCode};

/// The page's files by their names under `/_larder/` (`""` is the page), and their types.
const ASSETS: [(&[u8], &str, &str); 6] = [
    (b"", include_str!("page/index.html"), "text/html; charset=utf-8"),
    (b"ui.css", include_str!("page/ui.css"), "text/css; charset=utf-8"),
    (b"ui.js", include_str!("page/ui.js"), "text/javascript; charset=utf-8"),
    (b"fmt.js", include_str!("page/fmt.js"), "text/javascript; charset=utf-8"),
    (b"charts.js", include_str!("page/charts.js"), "text/javascript; charset=utf-8"),
    (b"panels.js", include_str!("page/panels.js"), "text/javascript; charset=utf-8"),
];

/// Whether `what` names one of the page's files (open to all: they hold no figures).
pub fn is_asset(what: &[u8]) -> bool {
    ASSETS.iter().any(|(name, ..)| *name == what)
}

/// Where the page may reach: this server, for its own files and figures; nothing else.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One of the page's files by its name under `/_larder/` (`""` is the page).
pub fn asset(what: &[u8]) -> Resp {
    let Some(&(_, body, kind)) = ASSETS.iter().find(|(name, ..)| *name == what) else {
        return text(StatusCode::NOT_FOUND, "no such admin endpoint\n");
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
