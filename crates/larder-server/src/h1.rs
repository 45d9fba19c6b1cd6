//! HTTP/1.1 as larder's own connections speak it for the key API (`conn::native`): a request
//! head parsed in place with `httparse` (the parser under hyper, with hyper's settings), and a
//! response head written as hyper writes it. Pure: bytes in, a head out; a response's parts
//! in, bytes out.
//!
//! Only plain requests are taken: a head this module is not sure of is [`Parsed::Other`], and
//! the connection is handed to hyper, which answers it (and everything after it) as before.
//! So every rule hyper enforces (framing, smuggling defences, limits, `Expect`, upgrades,
//! HTTP/1.0) stays hyper's, and what is taken here is answered byte for byte alike
//! (`tests/http_diff.rs`).

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, DATE};
use hyper::{Method, StatusCode};
use std::cell::RefCell;

/// Headers a plain request may carry; more, and hyper takes it (its own limit is 100).
const MAX_HEADERS: usize = 32;

/// Longest request with a body taken here, head and body: hyper's first read. hyper closes a
/// connection after an answer that did not read its request's body (a PUT refused before its
/// body is read: 401, 412…) unless the body is already in its buffer; taking only what fits
/// in one such read keeps every close the same.
pub const MAX_WITH_BODY: usize = 8 * 1024;

/// Every header the key API's GET, HEAD, PUT and DELETE read (`routes::key_api`, `api`,
/// `headers`): the others (`Host`, `User-Agent`, `Accept`…) change no answer, and a plain
/// request's map holds only these, so that most requests build no map at all. A header read
/// there must be added here (`tests/http_diff.rs` sends each of them both ways).
const READ_BY_KEY_API: &[&str] = &[
    "accept-encoding",
    "authorization",
    "cache-control",
    "content-encoding",
    "content-length",
    "content-type",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "range",
    "x-ttl",
];

/// Longest target hyper takes (past it, its own 414).
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// A request head this module takes.
pub struct Head {
    pub method: Method,
    /// The path, without the query (what `Uri::path` gives).
    pub path: String,
    /// The length of the request target, query included.
    pub target_len: usize,
    pub headers: HeaderMap,
    /// Bytes of the head, up to and including its blank line.
    pub len: usize,
    /// The body's length (`Content-Length`, 0 without one).
    pub body: usize,
    /// The client asked to close after this answer.
    pub close: bool,
}

/// What the bytes at the front of a connection's buffer hold.
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A plain request of the key API.
    Request(Head),
    /// Anything else, to be answered by hyper: a method or target the key API does not take,
    /// HTTP/1.0, `Transfer-Encoding`, `Expect`, `Upgrade`, an unusual `Connection` or
    /// `Content-Length`, a malformed head.
    Other,
}

/// Whether a byte may appear in a target taken here: the unreserved and sub-delimiter
/// characters, `%`, `/`, `:`, `@` and `?`. `http::Uri` accepts all of them; anything else
/// (non-ASCII, `#`, quotes, brackets…) is left to it and hyper.
fn plain_target_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%/:@?".contains(&b)
}

/// Parses the head at the front of `buf`, of at most `max_len` bytes (past it, hyper answers).
pub fn parse(buf: &[u8], max_len: usize) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= max_len => n,
        Ok(httparse::Status::Partial) if buf.len() < max_len => return Parsed::Partial,
        _ => return Parsed::Other,
    };
    let method = match req.method {
        Some("GET") => Method::GET,
        Some("HEAD") => Method::HEAD,
        Some("PUT") => Method::PUT,
        Some("DELETE") => Method::DELETE,
        _ => return Parsed::Other,
    };
    let target = req.path.unwrap_or_default();
    let plain = target.starts_with('/') && target.len() <= MAX_TARGET && target.bytes().all(plain_target_byte);
    if req.version != Some(1) || !plain {
        return Parsed::Other;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p).to_owned();
    // Only the headers the key API reads are kept (the map allocates at its first).
    let mut map = HeaderMap::new();
    let (mut body, mut close, mut has_length) = (0usize, false, false);
    for h in req.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else { return Parsed::Other };
        match name.as_str() {
            "transfer-encoding" | "expect" | "upgrade" => return Parsed::Other,
            "content-length" => {
                // One, of plain digits, that fits: anything else is hyper's to judge.
                let v = h.value;
                if has_length || v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                    return Parsed::Other;
                }
                has_length = true;
                body = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()).unwrap_or(usize::MAX);
            }
            "connection" => {
                if h.value.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !h.value.eq_ignore_ascii_case(b"keep-alive") {
                    return Parsed::Other;
                }
            }
            _ => {}
        }
        if !READ_BY_KEY_API.contains(&name.as_str()) {
            // Held to the rule a map's value is (`http`'s), without copying it into one.
            if !h.value.iter().all(|&b| (b >= 32 && b != 127) || b == b'\t') {
                return Parsed::Other;
            }
            continue;
        }
        let Ok(value) = HeaderValue::from_bytes(h.value) else { return Parsed::Other };
        map.append(name, value);
    }
    let bodiless = matches!(method, Method::GET | Method::HEAD | Method::DELETE);
    if (bodiless && body != 0) || (body > 0 && len.saturating_add(body) > MAX_WITH_BODY) {
        return Parsed::Other;
    }
    Parsed::Request(Head { method, path, target_len: target.len(), headers: map, len, body, close })
}

/// Whether `buf` may hold the end of a head (a blank line, `\r\n\r\n` or a bare `\n\n`) beyond
/// the first `scanned` bytes, which are known not to: so a head that arrives a byte at a time
/// is not parsed anew at each one (hyper does the same).
pub fn head_ends(buf: &[u8], scanned: usize) -> bool {
    let from = scanned.saturating_sub(3);
    buf.get(from..).is_some_and(|b| b.windows(2).any(|w| w == b"\n\n") || b.windows(3).any(|w| w == b"\n\r\n"))
}

/// How an answer's body follows its head.
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body bytes (HEAD, 204, 304), or exactly this many.
    Length(u64),
    /// Chunked: a body whose length is not known.
    Chunked,
}

/// Whether a status may carry a `Content-Length` (hyper: not 1xx, 204, 304).
fn may_have_length(status: StatusCode) -> bool {
    !status.is_informational() && !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
}

/// Appends the head of an answer to a request of `method` to `dst`, as hyper writes it: the
/// status line, the headers in the map's order, then the length hyper would add (the body's,
/// unless the map has one), then the date. `len` is the body's exact length, if known.
/// Returns how the body follows (nothing for HEAD, 204 and 304).
pub fn write_head(
    dst: &mut Vec<u8>,
    method: &Method,
    status: StatusCode,
    headers: &HeaderMap,
    len: Option<u64>,
) -> Framing {
    if status == StatusCode::OK {
        dst.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        dst.extend_from_slice(b"HTTP/1.1 ");
        dst.extend_from_slice(status.as_str().as_bytes());
        dst.push(b' ');
        dst.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    let mut wrote_len = false;
    let mut wrote_date = false;
    // hyper joins the values of a repeated `connection` into one line; every other name is a
    // line per value.
    let mut connection: Option<Vec<u8>> = None;
    for (name, value) in headers.iter() {
        if name == CONNECTION {
            let line = connection.get_or_insert_with(Vec::new);
            if !line.is_empty() {
                line.extend_from_slice(b", ");
            }
            line.extend_from_slice(value.as_bytes());
            continue;
        }
        wrote_len |= name == CONTENT_LENGTH;
        wrote_date |= name == DATE;
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    if let Some(line) = connection {
        dst.extend_from_slice(b"connection: ");
        dst.extend_from_slice(&line);
        dst.extend_from_slice(b"\r\n");
    }
    let mut framing = Framing::Length(len.unwrap_or(0));
    if !wrote_len {
        match len {
            None if method == Method::HEAD || !may_have_length(status) => {}
            None => {
                dst.extend_from_slice(b"transfer-encoding: chunked\r\n");
                framing = Framing::Chunked;
            }
            Some(0) if may_have_length(status) && method != Method::HEAD => {
                dst.extend_from_slice(b"content-length: 0\r\n");
            }
            Some(0) => {}
            Some(n) if may_have_length(status) => {
                dst.extend_from_slice(b"content-length: ");
                dst.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                dst.extend_from_slice(b"\r\n");
            }
            Some(_) => framing = Framing::Length(0),
        }
    }
    if method == Method::HEAD || !may_have_length(status) {
        framing = Framing::Length(0);
    }
    if !wrote_date {
        dst.extend_from_slice(b"date: ");
        dst.extend_from_slice(&now_date());
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
    framing
}

thread_local! {
    /// The date header's value, formatted once a second per thread (as hyper caches it).
    static DATE_CACHE: RefCell<(u64, Bytes)> = const { RefCell::new((0, Bytes::new())) };
}

/// Now, as an HTTP date.
fn now_date() -> Bytes {
    let now = std::time::SystemTime::now();
    let secs = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE_CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs || c.1.is_empty() {
            *c = (secs, Bytes::from(httpdate::fmt_http_date(now)));
        }
        c.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(raw: &[u8]) -> Head {
        match parse(raw, 8192) {
            Parsed::Request(h) => h,
            Parsed::Partial => panic!("partial: {raw:?}"),
            Parsed::Other => panic!("other: {raw:?}"),
        }
    }

    fn other(raw: &[u8]) -> bool {
        matches!(parse(raw, 8192), Parsed::Other)
    }

    #[test]
    fn plain_requests_are_taken() {
        let h = request(b"GET /a/b%20c?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\n\r\nGET /next");
        assert_eq!((h.method, h.path.as_str(), h.body, h.close), (Method::GET, "/a/b%20c", 0, false));
        assert_eq!(h.len, b"GET /a/b%20c?x=1 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\n\r\n".len());
        assert_eq!(h.headers.get("range").unwrap(), "bytes=0-1");
        assert!(h.headers.get("host").is_none(), "a header no answer reads is not kept");
        let h = request(b"PUT /k HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        assert_eq!((h.method, h.body, h.close), (Method::PUT, 5, true));
        assert!(matches!(parse(b"GET /k HTTP/1.1\r\nHost:", 8192), Parsed::Partial));
    }

    #[test]
    fn a_head_s_end_is_found_across_reads() {
        let raw = b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n";
        assert!(!head_ends(&raw[..raw.len() - 1], 0));
        assert!(head_ends(raw, raw.len() - 1), "the end straddles what was scanned");
        assert!(head_ends(b"GET /k HTTP/1.1\nHost: h\n\n", 20));
        assert!(!head_ends(b"GET /k HTTP/1.1\r\nHost: h\r\n", 0));
    }

    #[test]
    fn anything_unusual_is_left_to_hyper() {
        for raw in [
            &b"GET /k HTTP/1.0\r\n\r\n"[..],
            b"OPTIONS /k HTTP/1.1\r\n\r\n",
            b"PROPFIND /k HTTP/1.1\r\n\r\n",
            b"GET http://h/k HTTP/1.1\r\n\r\n",
            b"GET /k#f HTTP/1.1\r\n\r\n",
            b"PUT /k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"PUT /k HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            b"PUT /k HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
            b"PUT /k HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
            b"PUT /k HTTP/1.1\r\nContent-Length: 8192\r\n\r\n",
            b"GET /k HTTP/1.1\r\nContent-Length: 1\r\n\r\nx",
            b"GET /k HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
            b"GET /k HTTP/1.1\r\nHost: a\r\n b\r\n\r\n",
            b"GET /k HTTP/1.1\r\nBad Header: x\r\n\r\n",
        ] {
            assert!(other(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        // A head longer than the limit, whole or not.
        assert!(matches!(parse(b"GET /k HTTP/1.1\r\nHost: h\r\n\r\n", 10), Parsed::Other));
        assert!(matches!(parse(b"GET /k HTTP/1.1\r\nHost: h", 10), Parsed::Other));
    }

    #[test]
    fn heads_are_written_as_hyper_writes_them() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        let mut out = Vec::new();
        assert_eq!(write_head(&mut out, &Method::GET, StatusCode::NOT_FOUND, &h, Some(10)), Framing::Length(10));
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 10\r\ndate: "));
        assert!(text.ends_with(" GMT\r\n\r\n"));
        let mut out = Vec::new();
        assert_eq!(write_head(&mut out, &Method::HEAD, StatusCode::NOT_FOUND, &h, Some(10)), Framing::Length(0));
        assert!(String::from_utf8(out).unwrap().contains("content-length: 10\r\n"));
        let mut out = Vec::new();
        assert_eq!(write_head(&mut out, &Method::GET, StatusCode::NOT_MODIFIED, &h, Some(0)), Framing::Length(0));
        assert!(!String::from_utf8(out).unwrap().contains("content-length"));
        let mut out = Vec::new();
        assert_eq!(write_head(&mut out, &Method::GET, StatusCode::OK, &h, None), Framing::Chunked);
        assert!(String::from_utf8(out).unwrap().contains("transfer-encoding: chunked\r\n"));
    }
}
