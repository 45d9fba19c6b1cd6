//! The standard HTTP headers larder speaks, parsed and formatted in one place: expiry
//! (`X-TTL`, `Cache-Control: max-age`), validators (`ETag`, `Last-Modified`), ranges and the
//! conditional request headers (RFC 9110 §8.8, §13, §14; RFC 9111 §5.2).

use hyper::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, IF_MATCH, IF_NONE_MATCH};
use larder_engine::{ByteRange, Precondition, Value, Version};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub static X_TTL: HeaderName = HeaderName::from_static("x-ttl");

/// Longest TTL accepted: 100 years, in seconds.
pub const MAX_TTL_SECS: u64 = 100 * 365 * 24 * 3600;

/// The strong entity tag of a stored value: its length, CRC32C and store time. Equal tags
/// mean equal bytes (and a re-stored value gets a new tag), which is what `If-Match` needs.
pub fn etag(v: Version) -> HeaderValue {
    let tag = format!("\"{:x}-{:08x}-{:x}\"", v.len, v.crc, v.stored_ms);
    HeaderValue::try_from(tag).expect("hex digits, dashes and quotes are valid header bytes")
}

/// The version an entity tag made by [`etag`] names; `None` for any other tag.
fn parse_etag(opaque: &str) -> Option<Version> {
    let mut parts = opaque.split('-');
    let len = u64::from_str_radix(parts.next()?, 16).ok()?;
    let crc = parts.next().filter(|c| c.len() == 8).and_then(|c| u32::from_str_radix(c, 16).ok())?;
    let stored_ms = u64::from_str_radix(parts.next()?, 16).ok()?;
    parts.next().is_none().then_some(Version { len, crc, stored_ms })
}

/// An `If-Match` / `If-None-Match` header: `*` or a list of entity tags.
#[derive(Debug, PartialEq, Eq)]
pub enum Tags {
    Any,
    /// (weak, opaque tag without quotes)
    List(Vec<(bool, String)>),
}

impl Tags {
    /// Reads every line of header `name`; `None` when absent. Malformed members are skipped:
    /// they can match nothing.
    pub fn of(headers: &HeaderMap, name: &HeaderName) -> Option<Tags> {
        let mut list = Vec::new();
        let mut any = false;
        let mut present = false;
        for line in headers.get_all(name) {
            present = true;
            let Ok(line) = line.to_str() else { continue };
            for member in line.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                if member == "*" {
                    any = true;
                    continue;
                }
                let (weak, quoted) = match member.strip_prefix("W/") {
                    Some(rest) => (true, rest),
                    None => (false, member),
                };
                if let Some(opaque) = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
                    list.push((weak, opaque.to_string()));
                }
            }
        }
        present.then_some(if any { Tags::Any } else { Tags::List(list) })
    }

    /// Weak comparison (RFC 9110 §8.8.3.2), as `If-None-Match` uses: `W/` is ignored.
    pub fn matches_weakly(&self, v: Version) -> bool {
        match self {
            Tags::Any => true,
            Tags::List(l) => l.iter().any(|(_, o)| parse_etag(o) == Some(v)),
        }
    }

    /// The versions named by strong tags (weak tags never match strongly), or by all tags.
    fn versions(&self, include_weak: bool) -> Vec<Version> {
        match self {
            Tags::Any => Vec::new(),
            Tags::List(l) => l.iter().filter(|(w, _)| include_weak || !w).filter_map(|(_, o)| parse_etag(o)).collect(),
        }
    }
}

/// Preconditions of a write from `If-Match` (strong comparison) and `If-None-Match` (weak),
/// checked by the engine atomically with the write.
pub fn write_preconditions(headers: &HeaderMap) -> Vec<Precondition> {
    let mut p = Vec::new();
    match Tags::of(headers, &IF_MATCH) {
        Some(Tags::Any) => p.push(Precondition::Present),
        Some(t) => p.push(Precondition::OneOf(t.versions(false))),
        None => {}
    }
    match Tags::of(headers, &IF_NONE_MATCH) {
        Some(Tags::Any) => p.push(Precondition::Absent),
        Some(t) => p.push(Precondition::NoneOf(t.versions(true))),
        None => {}
    }
    p
}

/// Whether a GET or HEAD should answer 304 (RFC 9110 §13.2.2: `If-None-Match` decides when
/// present, else `If-Modified-Since`; an unparsable date is ignored).
pub fn not_modified(headers: &HeaderMap, v: &Value) -> bool {
    if let Some(tags) = Tags::of(headers, &IF_NONE_MATCH) {
        return tags.matches_weakly(v.version());
    }
    let since = headers.get(hyper::header::IF_MODIFIED_SINCE).and_then(|h| h.to_str().ok());
    since.and_then(|s| httpdate::parse_http_date(s).ok()).is_some_and(|since| modified_secs(v) <= secs(since))
}

/// Whether `If-Range` (if any) lets a range be served: its validator must name the current
/// value (a strong tag, or exactly the Last-Modified date).
pub fn if_range_holds(headers: &HeaderMap, v: &Value) -> bool {
    let Some(h) = headers.get(hyper::header::IF_RANGE) else { return true };
    let Ok(h) = h.to_str() else { return false };
    let h = h.trim();
    if let Some(opaque) = h.strip_prefix('"').and_then(|q| q.strip_suffix('"')) {
        return parse_etag(opaque) == Some(v.version());
    }
    httpdate::parse_http_date(h).is_ok_and(|d| secs(d) == modified_secs(v))
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn modified_secs(v: &Value) -> u64 {
    v.stored_ms / 1000
}

pub fn last_modified(v: &Value) -> HeaderValue {
    let t = UNIX_EPOCH + Duration::from_secs(modified_secs(v));
    HeaderValue::try_from(httpdate::fmt_http_date(t)).expect("an HTTP date is a valid header value")
}

/// `Cache-Control` for a value with an expiry: the whole seconds it has left, rounded down
/// so that no downstream cache keeps it past its expiry.
pub fn cache_control(v: &Value, now_ms: u64) -> Option<HeaderValue> {
    let left = v.expiry_ms.saturating_sub(now_ms) / 1000;
    (v.expiry_ms != 0).then(|| HeaderValue::try_from(format!("max-age={left}")).expect("ASCII"))
}

/// A value with no surrounding whitespace that is all ASCII digits, as a number of seconds.
fn seconds(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_prefix('"').and_then(|q| q.strip_suffix('"')).unwrap_or(s);
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
        .filter(|&n| n <= MAX_TTL_SECS)
}

/// The expiry of a PUT, in ms since the epoch (0 = never): `X-TTL` seconds, else
/// `Cache-Control: max-age`, else `default_ttl`. A TTL of 0 means no expiry.
pub fn expiry(headers: &HeaderMap, default_ttl: Duration, now_ms: u64) -> Result<u64, String> {
    let ttl = if let Some(v) = headers.get(&X_TTL) {
        let bad = || format!("X-TTL must be a whole number of seconds from 0 to {MAX_TTL_SECS}\n");
        seconds(v.to_str().map_err(|_| bad())?).ok_or_else(bad)?
    } else if let Some(age) = max_age(headers)? {
        age
    } else {
        return Ok(if default_ttl.is_zero() { 0 } else { now_ms + default_ttl.as_millis() as u64 });
    };
    Ok(if ttl == 0 { 0 } else { now_ms + ttl * 1000 })
}

/// The `max-age` directive of the request's `Cache-Control` lines, if there is one.
fn max_age(headers: &HeaderMap) -> Result<Option<u64>, String> {
    for line in headers.get_all(CACHE_CONTROL) {
        let Ok(line) = line.to_str() else { continue };
        for directive in line.split(',') {
            let (name, value) = directive.split_once('=').unwrap_or((directive, ""));
            if name.trim().eq_ignore_ascii_case("max-age") {
                return seconds(value).map(Some).ok_or_else(|| {
                    format!("Cache-Control max-age must be a whole number of seconds from 0 to {MAX_TTL_SECS}\n")
                });
            }
        }
    }
    Ok(None)
}

/// A `Range` header with a single byte range; `None` for anything else (another unit, several
/// ranges, bad syntax), which is answered with the whole value, as RFC 9110 §14.2 allows.
pub fn range(headers: &HeaderMap) -> Option<ByteRange> {
    let h = headers.get(hyper::header::RANGE)?.to_str().ok()?.trim();
    let (unit, spec) = h.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return None;
    }
    let (first, last) = spec.trim().split_once('-')?;
    let num =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
    match (first.trim(), last.trim()) {
        ("", n) => num(n).map(ByteRange::Suffix),
        (a, "") => num(a).map(|a| ByteRange::Span(a, None)),
        (a, b) => {
            let (a, b) = (num(a)?, num(b)?);
            (a <= b).then_some(ByteRange::Span(a, Some(b)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn etags_round_trip_and_compare() {
        let v = Version { len: 1234, crc: 0xdead_beef, stored_ms: 1_700_000_000_123 };
        let tag = etag(v);
        let s = tag.to_str().unwrap();
        assert_eq!(parse_etag(&s[1..s.len() - 1]), Some(v));
        let h = headers(&[("if-none-match", &format!("\"x\", W/{s}"))]);
        assert!(Tags::of(&h, &IF_NONE_MATCH).unwrap().matches_weakly(v));
        let h = headers(&[("if-match", &format!("W/{s}"))]);
        assert_eq!(write_preconditions(&h), vec![Precondition::OneOf(vec![])], "weak tags never match strongly");
        let h = headers(&[("if-match", s), ("if-none-match", "*")]);
        assert_eq!(write_preconditions(&h), vec![Precondition::OneOf(vec![v]), Precondition::Absent]);
        assert_eq!(parse_etag("1-2-3"), None, "the CRC has 8 hex digits");
    }

    #[test]
    fn ttl_headers() {
        let d0 = Duration::ZERO;
        assert_eq!(expiry(&headers(&[("x-ttl", "60")]), d0, 1000), Ok(61_000));
        assert_eq!(expiry(&headers(&[("x-ttl", "0")]), Duration::from_secs(5), 1000), Ok(0));
        for bad in ["-1", "1.5", "abc", "", "1e3", "99999999999999999999"] {
            assert!(expiry(&headers(&[("x-ttl", bad)]), d0, 0).is_err(), "{bad:?}");
        }
        let both = headers(&[("x-ttl", "5"), ("cache-control", "max-age=100")]);
        assert_eq!(expiry(&both, d0, 0), Ok(5_000), "X-TTL wins");
        let cc = headers(&[("cache-control", "public"), ("cache-control", "no-transform, MAX-AGE=30")]);
        assert_eq!(expiry(&cc, d0, 0), Ok(30_000));
        assert!(expiry(&headers(&[("cache-control", "max-age=soon")]), d0, 0).is_err());
        assert_eq!(expiry(&headers(&[]), Duration::from_millis(1500), 10), Ok(1510));
        assert_eq!(expiry(&headers(&[("cache-control", "no-cache")]), d0, 10), Ok(0));
    }

    #[test]
    fn range_headers() {
        let r = |v: &str| range(&headers(&[("range", v)]));
        assert_eq!(r("bytes=0-99"), Some(ByteRange::Span(0, Some(99))));
        assert_eq!(r("bytes=100-"), Some(ByteRange::Span(100, None)));
        assert_eq!(r("bytes=-500"), Some(ByteRange::Suffix(500)));
        assert_eq!(r("Bytes = 5 - 9"), Some(ByteRange::Span(5, Some(9))));
        for ignored in ["bytes=0-1,5-6", "items=0-1", "bytes=9-5", "bytes=-", "bytes=a-b", "bytes=+1-2", "0-99"] {
            assert_eq!(r(ignored), None, "{ignored:?}");
        }
    }
}
