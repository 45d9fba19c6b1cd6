//! The standard HTTP headers larder speaks, parsed and formatted in one place: expiry
//! (`X-TTL`, `Cache-Control: max-age`), validators (`ETag`, `Last-Modified`), ranges and the
//! conditional request headers (RFC 9110 §8.8, §13, §14; RFC 9111 §5.2).

use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, IF_MATCH, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE,
};
use larder_engine::{ByteRange, Precondition, Value, Version};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub static X_TTL: HeaderName = HeaderName::from_static("x-ttl");

/// Longest TTL accepted: 100 years, in seconds.
pub const MAX_TTL_SECS: u64 = 100 * 365 * 24 * 3600;

/// A header value built in a stack buffer: these are written for every GET, and `format!`
/// with its growing `String` cost a measurable share of a memory hit's CPU time.
pub struct Line {
    buf: [u8; 64],
    len: usize,
}

impl Line {
    pub fn new() -> Line {
        Line { buf: [0; 64], len: 0 }
    }

    pub fn push(&mut self, s: &[u8]) -> &mut Line {
        self.buf[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
        self
    }

    /// `v` in lowercase hex, at least `width` digits.
    pub fn hex(&mut self, v: u64, width: usize) -> &mut Line {
        let digits = (16 - v.leading_zeros() as usize / 4).max(width).max(1);
        for i in (0..digits).rev() {
            self.buf[self.len] = b"0123456789abcdef"[(v >> (4 * i)) as usize & 15];
            self.len += 1;
        }
        self
    }

    /// `v` in decimal, at least `width` digits.
    pub fn dec(&mut self, v: u64, width: usize) -> &mut Line {
        let mut digits = [0u8; 20];
        let (mut n, mut at) = (v, digits.len());
        while n > 0 || digits.len() - at < width.max(1) {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        self.push(&digits[at..])
    }

    pub fn value(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.buf[..self.len]).expect("built from ASCII")
    }
}

/// Which representation of a stored value an answer carries: the value itself, or (to a
/// client that accepts it) the Zstandard frame the value is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Zstd,
}

/// The strong entity tag of a stored value: its length, CRC32C and store time. Equal tags
/// mean equal bytes (and a re-stored value gets a new tag), which is what `If-Match` needs.
pub fn etag(v: Version) -> HeaderValue {
    etag_of(v, Coding::Identity)
}

/// [`etag`] of one representation: the coded one's ends in `-zstd`, so that the two differ
/// (RFC 9110 §8.8.3) and a cache in front never takes one for the other.
pub fn etag_of(v: Version, coding: Coding) -> HeaderValue {
    let end: &[u8] = if coding == Coding::Zstd { b"-zstd\"" } else { b"\"" };
    Line::new()
        .push(b"\"")
        .hex(v.len, 1)
        .push(b"-")
        .hex(v.crc as u64, 8)
        .push(b"-")
        .hex(v.stored_ms, 1)
        .push(end)
        .value()
}

/// The version and representation an entity tag made by [`etag_of`] names; `None` for any
/// other tag. Strict: the tag must be exactly what [`etag_of`] writes (strong comparison is
/// byte for byte).
fn parse_etag(opaque: &str) -> Option<(Version, Coding)> {
    let (opaque, coding) = match opaque.strip_suffix("-zstd") {
        Some(o) => (o, Coding::Zstd),
        None => (opaque, Coding::Identity),
    };
    let mut parts = opaque.split('-');
    let len = u64::from_str_radix(parts.next()?, 16).ok()?;
    let crc = u32::from_str_radix(parts.next()?, 16).ok()?;
    let stored_ms = u64::from_str_radix(parts.next()?, 16).ok()?;
    let v = Version { len, crc, stored_ms };
    let exact = etag(v).as_bytes()[1..].strip_suffix(b"\"") == Some(opaque.as_bytes());
    (parts.next().is_none() && exact).then_some((v, coding))
}

/// The content coding of a request body (`Content-Encoding`, RFC 9110 §8.4): `Ok(false)` for
/// none (or `identity`), `Ok(true)` for `zstd`, which larder stores as sent; any other (or
/// more than one) is the coding it cannot take.
pub fn content_coding(headers: &HeaderMap) -> Result<bool, String> {
    let mut codings = Vec::new();
    for line in headers.get_all(CONTENT_ENCODING) {
        let text = line.to_str().map_err(|_| "?".to_string())?;
        codings.extend(text.split(',').map(str::trim).filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity")));
    }
    match codings[..] {
        [] => Ok(false),
        [c] if c.eq_ignore_ascii_case("zstd") => Ok(true),
        _ => Err(codings.join(", ")),
    }
}

/// Whether the client takes a Zstandard-coded answer (`Accept-Encoding` names `zstd`, or `*`
/// without refusing `zstd`, with a non-zero `q`; RFC 9110 §12.5.3).
pub fn accepts_zstd(headers: &HeaderMap) -> bool {
    let (mut zstd, mut any) = (None, None);
    for line in headers.get_all(ACCEPT_ENCODING) {
        let Ok(line) = line.to_str() else { continue };
        for member in line.split(',') {
            let mut params = member.split(';');
            let coding = params.next().unwrap_or("").trim();
            let q = params.filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q="))).next();
            // Any q of zero (0, 0.0, 0.000) refuses; anything else that parses accepts.
            let wanted = q.is_none_or(|q| q.trim().parse::<f32>().is_ok_and(|q| q > 0.0));
            if coding.eq_ignore_ascii_case("zstd") {
                zstd = Some(wanted);
            } else if coding == "*" {
                any = Some(wanted);
            }
        }
    }
    zstd.or(any).unwrap_or(false)
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
    pub fn matches_weakly(&self, v: Version, coding: Coding) -> bool {
        match self {
            Tags::Any => true,
            Tags::List(l) => l.iter().any(|(_, o)| parse_etag(o) == Some((v, coding))),
        }
    }

    /// The representations named by strong tags (weak tags never match strongly), or by all.
    fn representations(&self, include_weak: bool) -> Vec<(Version, Coding)> {
        match self {
            Tags::Any => Vec::new(),
            Tags::List(l) => l.iter().filter(|(w, _)| include_weak || !w).filter_map(|(_, o)| parse_etag(o)).collect(),
        }
    }

    /// The versions the tags name, whichever representation: a write replaces the value, and
    /// either tag of it names what it replaces.
    fn versions(&self, include_weak: bool) -> Vec<Version> {
        self.representations(include_weak).into_iter().map(|(v, _)| v).collect()
    }
}

/// Preconditions of a write from `If-Match` (strong comparison), else `If-Unmodified-Since`,
/// and `If-None-Match` (weak), checked by the engine atomically with the write.
pub fn write_preconditions(headers: &HeaderMap) -> Vec<Precondition> {
    let mut p = Vec::new();
    match Tags::of(headers, &IF_MATCH) {
        Some(Tags::Any) => p.push(Precondition::Present),
        Some(t) => p.push(Precondition::OneOf(t.versions(false))),
        None => {
            if let Some(since) = date(headers, &IF_UNMODIFIED_SINCE) {
                p.push(Precondition::UnmodifiedSince(since));
            }
        }
    }
    match Tags::of(headers, &IF_NONE_MATCH) {
        Some(Tags::Any) => p.push(Precondition::Absent),
        Some(t) => p.push(Precondition::NoneOf(t.versions(true))),
        None => {}
    }
    p
}

/// A date header, in seconds since the epoch; `None` when absent or not an HTTP date (which
/// RFC 9110 says to ignore).
fn date(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let h = headers.get(name)?.to_str().ok()?;
    httpdate::parse_http_date(h).ok().map(secs)
}

/// Whether a GET or HEAD of an existing value fails `If-Match` (strong comparison) or, without
/// it, `If-Unmodified-Since` (RFC 9110 §13.2.2 steps 1–2): answered 412, so that a client
/// downloading a value in parts never gets parts of two versions.
pub fn read_precondition_failed(headers: &HeaderMap, v: &Value, coding: Coding) -> bool {
    match Tags::of(headers, &IF_MATCH) {
        Some(Tags::Any) => false,
        Some(t) => !t.representations(false).contains(&(v.version(), coding)),
        None => date(headers, &IF_UNMODIFIED_SINCE).is_some_and(|since| modified_secs(v) > since),
    }
}

/// Whether a GET or HEAD should answer 304 (RFC 9110 §13.2.2 steps 3–4: `If-None-Match`
/// decides when present, else `If-Modified-Since`).
pub fn not_modified(headers: &HeaderMap, v: &Value, coding: Coding) -> bool {
    if let Some(tags) = Tags::of(headers, &IF_NONE_MATCH) {
        return tags.matches_weakly(v.version(), coding);
    }
    date(headers, &IF_MODIFIED_SINCE).is_some_and(|since| modified_secs(v) <= since)
}

/// Whether `If-Range` (if any) lets a range be served: only a strong tag naming the current
/// value does. A date never does: Last-Modified has whole seconds, and two versions stored in
/// the same second would let a client join parts of both (RFC 9110 §13.1.5).
pub fn if_range_holds(headers: &HeaderMap, v: &Value) -> bool {
    let Some(h) = headers.get(IF_RANGE) else { return true };
    let opaque = h.to_str().ok().map(str::trim).and_then(|h| h.strip_prefix('"')).and_then(|q| q.strip_suffix('"'));
    // Ranges are of the value itself, never of its coded bytes.
    opaque.is_some_and(|o| parse_etag(o) == Some((v.version(), Coding::Identity)))
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn modified_secs(v: &Value) -> u64 {
    v.stored_ms / 1000
}

pub fn last_modified(v: &Value) -> HeaderValue {
    // Values written in the same second share one (formatting a date is most of the cost of
    // describing a value).
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> = const { std::cell::RefCell::new(None) };
    }
    let secs = modified_secs(v);
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((s, value)) if *s == secs => value.clone(),
            _ => last.insert((secs, http_date(secs))).1.clone(),
        }
    })
}

/// An IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`, for `secs` since
/// the epoch (clamped to the year 9999). The civil date comes from days since the epoch by
/// H. Hinnant's `civil_from_days`.
pub fn http_date(secs: u64) -> HeaderValue {
    let secs = secs.min(253_402_300_799);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    const WEEKDAYS: [&[u8]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8]; 12] =
        [b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec"];
    let mut l = Line::new();
    l.push(WEEKDAYS[(days % 7) as usize]).push(b", ").dec(day, 2).push(b" ");
    l.push(MONTHS[month as usize - 1]).push(b" ").dec(year, 4).push(b" ");
    l.dec(rem / 3600, 2).push(b":").dec(rem / 60 % 60, 2).push(b":").dec(rem % 60, 2).push(b" GMT");
    l.value()
}

/// `Cache-Control` of a value: with an expiry, the whole seconds it has left, rounded down so
/// that no downstream cache keeps it past its expiry. Without one, `no-cache`: a value can be
/// replaced at any moment, and without a directive browsers would keep it for a guessed
/// share of its age (RFC 9111 §4.2.2); with `no-cache` they revalidate, which costs a 304.
pub fn cache_control(v: &Value, now_ms: u64) -> HeaderValue {
    if v.expiry_ms == 0 {
        return HeaderValue::from_static("no-cache");
    }
    Line::new().push(b"max-age=").dec(v.expiry_ms.saturating_sub(now_ms) / 1000, 1).value()
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

/// The TTL of a PUT (`None` = no expiry): `X-TTL` seconds (`0` = no expiry, overriding the
/// default), else `Cache-Control: max-age` (`0` = stale at once, as HTTP means it: the value
/// replaces the old one and is already expired), else `default_ttl` (zero = none).
pub fn ttl(headers: &HeaderMap, default_ttl: Duration) -> Result<Option<Duration>, String> {
    if let Some(v) = headers.get(&X_TTL) {
        let bad = || format!("X-TTL must be a whole number of seconds from 0 to {MAX_TTL_SECS} (or keep, on a PUT)\n");
        let secs = seconds(v.to_str().map_err(|_| bad())?).ok_or_else(bad)?;
        return Ok((secs > 0).then(|| Duration::from_secs(secs)));
    }
    if let Some(age) = max_age(headers)? {
        return Ok(Some(Duration::from_secs(age)));
    }
    Ok((!default_ttl.is_zero()).then_some(default_ttl))
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
        assert_eq!(parse_etag(&s[1..s.len() - 1]), Some((v, Coding::Identity)));
        let h = headers(&[("if-none-match", &format!("\"x\", W/{s}"))]);
        assert!(Tags::of(&h, &IF_NONE_MATCH).unwrap().matches_weakly(v, Coding::Identity));
        assert!(!Tags::of(&h, &IF_NONE_MATCH).unwrap().matches_weakly(v, Coding::Zstd));
        let z = etag_of(v, Coding::Zstd);
        let zs = z.to_str().unwrap();
        assert_eq!(zs, format!("{}-zstd\"", &s[..s.len() - 1]));
        assert_eq!(parse_etag(&zs[1..zs.len() - 1]), Some((v, Coding::Zstd)));
        let h = headers(&[("if-match", zs)]);
        assert_eq!(write_preconditions(&h), vec![Precondition::OneOf(vec![v])], "either tag names the version written");
        let h = headers(&[("if-match", &format!("W/{s}"))]);
        assert_eq!(write_preconditions(&h), vec![Precondition::OneOf(vec![])], "weak tags never match strongly");
        let h = headers(&[("if-match", s), ("if-none-match", "*")]);
        assert_eq!(write_preconditions(&h), vec![Precondition::OneOf(vec![v]), Precondition::Absent]);
        assert_eq!(parse_etag("1-2-3"), None, "the CRC has 8 hex digits");
        let loose = s[1..s.len() - 1].to_uppercase();
        assert_eq!(parse_etag(&loose), None, "strong comparison is byte for byte");
        assert_eq!(parse_etag(&format!("0{}", &s[1..s.len() - 1])), None);
    }

    #[test]
    fn a_body_coded_with_zstd_or_nothing_is_taken() {
        assert_eq!(content_coding(&HeaderMap::new()), Ok(false));
        assert_eq!(content_coding(&headers(&[("content-encoding", "identity")])), Ok(false));
        assert_eq!(content_coding(&headers(&[("content-encoding", "ZSTD")])), Ok(true));
        assert_eq!(content_coding(&headers(&[("content-encoding", "gzip")])), Err("gzip".into()));
        assert_eq!(content_coding(&headers(&[("content-encoding", "zstd, gzip")])), Err("zstd, gzip".into()));
        let twice = headers(&[("content-encoding", "zstd"), ("content-encoding", "zstd")]);
        assert!(content_coding(&twice).is_err(), "coded twice is not a zstd frame of the value");
    }

    #[test]
    fn accept_encoding_takes_zstd_by_name_or_by_star_unless_refused() {
        for (value, takes) in [
            ("zstd", true),
            ("gzip, deflate, br, zstd", true),
            ("gzip;q=1.0, ZSTD;q=0.5", true),
            ("zstd;q=0", false),
            ("zstd;q=0.000, *", false),
            ("*", true),
            ("*;q=0", false),
            ("gzip, br", false),
            ("identity", false),
            ("zstdx", false),
        ] {
            assert_eq!(accepts_zstd(&headers(&[("accept-encoding", value)])), takes, "{value}");
        }
        assert!(!accepts_zstd(&HeaderMap::new()));
        assert!(
            accepts_zstd(&headers(&[("accept-encoding", "gzip"), ("accept-encoding", "zstd")])),
            "every line counts"
        );
    }

    #[test]
    fn dates_and_numbers_are_formatted_as_httpdate_and_format_do() {
        for secs in [0, 59, 86_399, 951_782_400, 1_700_000_000, 4_107_542_400, 253_402_300_799] {
            let ours = http_date(secs);
            let theirs = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
            assert_eq!(ours.to_str().unwrap(), theirs, "{secs}");
        }
        for s in (0..200_000_000u64).step_by(86_399 * 7 + 3_601) {
            let theirs = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(s * 13));
            assert_eq!(http_date(s * 13).to_str().unwrap(), theirs);
        }
        for v in [0u64, 1, 9, 10, 255, 4096, u32::MAX as u64, u64::MAX] {
            assert_eq!(Line::new().dec(v, 1).value().to_str().unwrap(), v.to_string());
            assert_eq!(Line::new().hex(v, 8).value().to_str().unwrap(), format!("{v:08x}"));
        }
    }

    #[test]
    fn ttl_headers() {
        let (d0, s) = (Duration::ZERO, Duration::from_secs);
        assert_eq!(ttl(&headers(&[("x-ttl", "60")]), d0), Ok(Some(s(60))));
        assert_eq!(ttl(&headers(&[("x-ttl", "0")]), s(5)), Ok(None), "0 overrides the default");
        for bad in ["-1", "1.5", "abc", "", "1e3", "99999999999999999999"] {
            assert!(ttl(&headers(&[("x-ttl", bad)]), d0).is_err(), "{bad:?}");
        }
        let both = headers(&[("x-ttl", "5"), ("cache-control", "max-age=100")]);
        assert_eq!(ttl(&both, d0), Ok(Some(s(5))), "X-TTL wins");
        let cc = headers(&[("cache-control", "public"), ("cache-control", "no-transform, MAX-AGE=30")]);
        assert_eq!(ttl(&cc, d0), Ok(Some(s(30))));
        assert_eq!(ttl(&headers(&[("cache-control", "max-age=0")]), s(5)), Ok(Some(d0)), "stale at once");
        assert!(ttl(&headers(&[("cache-control", "max-age=soon")]), d0).is_err());
        assert_eq!(ttl(&headers(&[]), Duration::from_millis(1500)), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(ttl(&headers(&[("cache-control", "no-cache")]), d0), Ok(None));
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
