//! RFC 9111's rules as pure functions of headers and times: whether a response may be stored,
//! its freshness lifetime and age, and what a request's directives allow (the directives
//! themselves are parsed in [`super::directives`]). No I/O: the handler asks, this answers;
//! the unit tests below and tests/proxy.rs check it against the standard's text
//! (docs/HTTP-CACHING.md maps them).

use super::directives::{parse_delta, Delta, Directives};
use hyper::header::{HeaderMap, HeaderName, AUTHORIZATION, CACHE_CONTROL, DATE, EXPIRES, LAST_MODIFIED, PRAGMA};
use hyper::StatusCode;

/// The one value of a field that must appear once: `None` when absent, `Err` when it appears
/// more than once with different values (a duplicated `Expires` or `Date` is treated as invalid).
pub fn single<'a>(h: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, ()> {
    let mut it = h.get_all(name).iter();
    let Some(first) = it.next() else { return Ok(None) };
    if it.any(|other| other != first) {
        return Err(());
    }
    first.to_str().map(|s| Some(s.trim())).map_err(|_| ())
}

/// An HTTP date as seconds of the Unix epoch (every format RFC 9110 §5.6.7 says to accept).
pub fn parse_date(s: &str) -> Option<u64> {
    let t = httpdate::parse_http_date(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

/// Status codes heuristically cacheable by default (RFC 9110 §15.1).
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501)
}

/// Status codes whose meaning larder understands (for `must-understand`, and for storing at all:
/// an unknown code is passed through, never stored).
fn understood(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 302 | 303 | 307 | 308 | 400 | 403 | 404 | 405 | 410 | 414 | 451 | 501
    )
}

/// Why a response is not stored, for the logs and `X-Cache`-adjacent metrics; `None` = storable.
pub fn not_storable(
    req: &HeaderMap,
    req_cc: &Directives,
    status: StatusCode,
    resp: &HeaderMap,
    cc: &Directives,
) -> Option<&'static str> {
    if status == StatusCode::PARTIAL_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Some("partial or not-modified response");
    }
    if !status.is_success() && !status.is_redirection() && !status.is_client_error() && !status.is_server_error() {
        return Some("not a final response");
    }
    // §5.2.2.3: with must-understand, store only what is understood, whatever no-store says.
    if cc.must_understand {
        if !understood(status) {
            return Some("must-understand and an unknown status");
        }
    } else if cc.no_store {
        return Some("no-store");
    }
    if req_cc.no_store {
        return Some("the request said no-store");
    }
    if cc.private {
        return Some("private");
    }
    if req.contains_key(AUTHORIZATION) && !(cc.public || cc.must_revalidate || cc.s_maxage.is_some()) {
        return Some("a response to a request with Authorization");
    }
    if resp.get_all(hyper::header::VARY).iter().any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|f| f.trim() == "*")))
    {
        return Some("Vary: *");
    }
    let explicit = cc.public
        || cc.s_maxage.is_some()
        || cc.max_age.is_some()
        || (!cc.targeted && resp.contains_key(EXPIRES))
        || heuristically_cacheable(status);
    if !explicit {
        return Some("no explicit freshness and not heuristically cacheable");
    }
    None
}

/// What the freshness and age of a stored response are computed from.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    /// When the request that brought it was sent, ms of the Unix epoch.
    pub request_ms: u64,
    /// When its response arrived, ms of the Unix epoch.
    pub response_ms: u64,
}

/// The freshness lifetime of a response in seconds (§4.2.1), for a shared cache. A malformed
/// or duplicated freshness field makes it 0 (stale).
pub fn freshness_lifetime(status: StatusCode, h: &HeaderMap, cc: &Directives, times: Times) -> u64 {
    match cc.s_maxage {
        Some(Delta::Secs(s)) => return s,
        Some(_) => return 0,
        None => {}
    }
    match cc.max_age {
        Some(Delta::Secs(s)) => return s,
        Some(_) => return 0,
        None => {}
    }
    let date = match single(h, &DATE) {
        Ok(Some(d)) => parse_date(d),
        Ok(None) => None,
        Err(()) => return 0,
    }
    .unwrap_or(times.response_ms / 1000);
    match single(h, &EXPIRES) {
        _ if cc.targeted => {}
        Ok(Some(e)) => return parse_date(e).map_or(0, |e| e.saturating_sub(date)),
        Err(()) => return 0,
        Ok(None) => {}
    }
    // Heuristic freshness (§4.2.2), only where allowed: 10% of the time since Last-Modified,
    // at most a day.
    if !(heuristically_cacheable(status) || cc.public) {
        return 0;
    }
    match single(h, &LAST_MODIFIED) {
        Ok(Some(lm)) => parse_date(lm).map_or(0, |lm| (date.saturating_sub(lm) / 10).min(86_400)),
        _ => 0,
    }
}

/// The current age of a stored response in seconds (§4.2.3), at `now_ms`: what `Age` says.
pub fn current_age(h: &HeaderMap, times: Times, now_ms: u64) -> u64 {
    current_age_ms(h, times, now_ms) / 1000
}

/// [`current_age`] in milliseconds, which freshness is decided on: a response 300 ms old is
/// not "0 seconds" old for a request's `max-age=0`.
pub fn current_age_ms(h: &HeaderMap, times: Times, now_ms: u64) -> u64 {
    let date_ms = match single(h, &DATE) {
        Ok(Some(d)) => parse_date(d).map(|s| s * 1000),
        _ => None,
    }
    .unwrap_or(times.response_ms);
    // The first member of the first line (RFC 9111 §5.1: a list is invalid, its first value
    // counts; an invalid one is no Age at all), its parameters set aside: `7200;a=b` is 7200
    // seconds old, never taken for fresh.
    let age_value = h
        .get(hyper::header::AGE)
        .and_then(|a| a.to_str().ok())
        .and_then(|a| parse_delta(a.split(',').next().unwrap_or("").split(';').next().unwrap_or("").trim()))
        .unwrap_or(0);
    let apparent = times.response_ms.saturating_sub(date_ms);
    let delay = times.response_ms.saturating_sub(times.request_ms);
    let corrected_age = age_value * 1000 + delay;
    let initial = apparent.max(corrected_age);
    let resident = now_ms.saturating_sub(times.response_ms);
    initial + resident
}

/// Whether a stored response may be served stale at all (§4.2.4, §5.2.2.2, §5.2.2.8, §5.2.2.10).
pub fn may_serve_stale(cc: &Directives) -> bool {
    !(cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some() || cc.no_cache)
}

/// How a request may use a stored response of this age and lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Serve it as it is.
    Fresh,
    /// Serve it stale: the client allowed it (`max-stale`).
    StaleAllowed,
    /// Serve it stale and revalidate in the background (`stale-while-revalidate`).
    StaleWhileRevalidate,
    /// It must be validated with the origin first.
    Validate,
}

/// Decides how a request (with directives `req`) may use a stored response (directives `cc`)
/// that is `age_ms` milliseconds old with a lifetime of `lifetime` seconds.
pub fn usable(req: &Directives, pragma_no_cache: bool, cc: &Directives, age_ms: u64, lifetime: u64) -> Use {
    if req.no_cache || pragma_no_cache || cc.no_cache {
        return Use::Validate;
    }
    let (age, lifetime) = (age_ms, lifetime.saturating_mul(1000));
    let fresh = age < lifetime;
    // A request's max-age is a limit on age whatever the freshness (§5.2.1.1); malformed
    // request directives are ignored rather than trusted.
    if let Some(Delta::Secs(max)) = req.max_age {
        if age > max * 1000 {
            return Use::Validate;
        }
    }
    if let Some(Delta::Secs(min)) = req.min_fresh {
        if lifetime.saturating_sub(age) < min * 1000 || !fresh {
            return Use::Validate;
        }
    }
    if fresh {
        return Use::Fresh;
    }
    if !may_serve_stale(cc) {
        return Use::Validate;
    }
    let stale_for = age - lifetime;
    match req.max_stale {
        Some(Delta::Bare) => return Use::StaleAllowed,
        Some(Delta::Secs(s)) if stale_for <= s * 1000 => return Use::StaleAllowed,
        _ => {}
    }
    // stale-while-revalidate (RFC 5861 §3), unless the request asked for a bound on age.
    if let Some(Delta::Secs(swr)) = cc.stale_while_revalidate {
        if stale_for <= swr * 1000 && req.max_age.is_none() && req.min_fresh.is_none() {
            return Use::StaleWhileRevalidate;
        }
    }
    Use::Validate
}

/// Whether a stale response may be served because the origin failed (RFC 5861 §4): within the
/// response's or the request's `stale-if-error`, or the server's default.
pub fn stale_if_error(req: &Directives, cc: &Directives, stale_for: u64, default: u64) -> bool {
    if !may_serve_stale(cc) {
        return false;
    }
    let window = |d: Option<Delta>| match d {
        Some(Delta::Secs(s)) => Some(s),
        _ => None,
    };
    let allowed = window(req.stale_if_error).or(window(cc.stale_if_error)).unwrap_or(default);
    stale_for <= allowed
}

/// `Pragma: no-cache` counts only in a request without `Cache-Control` (§5.4).
pub fn pragma_no_cache(req: &HeaderMap) -> bool {
    !req.contains_key(CACHE_CONTROL)
        && req.get_all(PRAGMA).iter().any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|p| p.trim() == "no-cache")))
}

#[cfg(test)]
mod tests {
    use super::super::directives::tests::headers;
    use super::super::directives::MAX_DELTA;
    use super::*;

    #[test]
    fn freshness_from_each_source_in_order() {
        let t = Times { request_ms: 1_000_000_000, response_ms: 1_000_000_000 };
        let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000));
        let exp = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_100));
        let lm = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(990_000));
        let ok = StatusCode::OK;
        let life = |pairs: &[(&str, &str)]| {
            let h = headers(pairs);
            freshness_lifetime(ok, &h, &Directives::of(&h), t)
        };
        assert_eq!(life(&[("cache-control", "max-age=10, s-maxage=20"), ("expires", &exp), ("date", &date)]), 20);
        assert_eq!(life(&[("cache-control", "max-age=10"), ("expires", &exp), ("date", &date)]), 10);
        assert_eq!(life(&[("expires", &exp), ("date", &date)]), 100);
        assert_eq!(life(&[("expires", "0"), ("date", &date)]), 0, "an invalid Expires is in the past");
        assert_eq!(life(&[("expires", &exp), ("expires", &date), ("date", &date)]), 0, "two Expires: stale");
        assert_eq!(life(&[("last-modified", &lm), ("date", &date)]), 1000, "10% of 10,000 s");
        assert_eq!(life(&[("date", &date)]), 0);
        let h = headers(&[("last-modified", &lm), ("date", &date)]);
        assert_eq!(freshness_lifetime(StatusCode::FOUND, &h, &Directives::of(&h), t), 0, "302 gets no heuristic");
    }

    #[test]
    fn age_follows_the_standard() {
        let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000));
        let t = Times { request_ms: 1_000_001_000, response_ms: 1_000_003_000 };
        // apparent 3 s; corrected age 10 + 2 = 12 s; resident 5 s.
        assert_eq!(current_age(&headers(&[("date", &date), ("age", "10")]), t, 1_000_008_000), 17);
        assert_eq!(current_age(&headers(&[("date", &date)]), t, 1_000_008_000), 8);
        assert_eq!(current_age(&headers(&[]), t, 1_000_003_500), 2);
        // A list, or two lines: the first value counts.
        assert_eq!(current_age(&headers(&[("age", "7200, 0")]), t, 1_000_003_000), 7202);
        assert_eq!(current_age(&headers(&[("age", "7200"), ("age", "0")]), t, 1_000_003_000), 7202);
        assert_eq!(current_age(&headers(&[("age", "x")]), t, 1_000_003_000), 2);
        // Parameters are set aside; a float, a sign or a prefix makes it no Age at all.
        assert_eq!(current_age(&headers(&[("age", "7200;foo=bar")]), t, 1_000_003_000), 7202);
        assert_eq!(current_age(&headers(&[("age", "7200;foo=111")]), t, 1_000_003_000), 7202);
        for invalid in ["7200.0", "-7200", "a7200", "7200a", "+7200", ""] {
            assert_eq!(current_age(&headers(&[("age", invalid)]), t, 1_000_003_000), 2, "{invalid}");
        }
    }

    #[test]
    fn requests_directives_bound_what_is_used() {
        let plain = Directives::default();
        let r = |s: &str| Directives::of(&headers(&[("cache-control", s)]));
        assert_eq!(usable(&plain, false, &plain, 5000, 10), Use::Fresh);
        assert_eq!(usable(&plain, true, &plain, 5000, 10), Use::Validate);
        assert_eq!(usable(&r("max-age=3"), false, &plain, 5000, 10), Use::Validate);
        assert_eq!(usable(&r("max-age=0"), false, &plain, 300, 10), Use::Validate, "300 ms is older than 0 s");
        assert_eq!(usable(&r("min-fresh=6"), false, &plain, 5000, 10), Use::Validate);
        assert_eq!(usable(&r("min-fresh=5"), false, &plain, 5000, 10), Use::Fresh);
        assert_eq!(usable(&plain, false, &plain, 12_000, 10), Use::Validate);
        assert_eq!(usable(&r("max-stale=5"), false, &plain, 12_000, 10), Use::StaleAllowed);
        assert_eq!(usable(&r("max-stale=1"), false, &plain, 12_000, 10), Use::Validate);
        assert_eq!(usable(&r("max-stale"), false, &r("must-revalidate"), 12_000, 10), Use::Validate);
        assert_eq!(usable(&plain, false, &r("stale-while-revalidate=5"), 12_000, 10), Use::StaleWhileRevalidate);
        assert_eq!(usable(&plain, false, &r("stale-while-revalidate=1"), 12_000, 10), Use::Validate);
        assert_eq!(usable(&plain, false, &r("no-cache"), 1000, 10), Use::Validate);
    }

    #[test]
    fn what_may_be_stored() {
        let no = |req: &[(&str, &str)], status: u16, resp: &[(&str, &str)]| {
            let (rq, rs) = (headers(req), headers(resp));
            not_storable(&rq, &Directives::of(&rq), StatusCode::from_u16(status).unwrap(), &rs, &Directives::of(&rs))
        };
        assert_eq!(no(&[], 200, &[("cache-control", "max-age=10")]), None);
        assert!(no(&[], 200, &[("cache-control", "no-store")]).is_some());
        assert_eq!(no(&[], 200, &[("cache-control", "no-store, must-understand, max-age=5")]), None);
        assert!(no(&[], 200, &[("cache-control", "private, max-age=5")]).is_some());
        assert_eq!(no(&[], 200, &[("cache-control", "private=\"x-a\", max-age=5")]), None);
        assert!(no(&[("authorization", "x")], 200, &[("cache-control", "max-age=5")]).is_some());
        assert_eq!(no(&[("authorization", "x")], 200, &[("cache-control", "s-maxage=5")]), None);
        assert!(no(&[("cache-control", "no-store")], 200, &[("cache-control", "max-age=5")]).is_some());
        assert!(no(&[], 302, &[]).is_some(), "302 needs explicit freshness");
        assert_eq!(no(&[], 302, &[("cache-control", "max-age=5")]), None);
        assert_eq!(no(&[], 404, &[]), None);
        assert!(no(&[], 206, &[("cache-control", "max-age=5")]).is_some());
        assert_eq!(no(&[], 599, &[("cache-control", "max-age=5")]), None);
        assert!(no(&[], 599, &[("cache-control", "max-age=5, no-store, must-understand")]).is_some());
        assert!(no(&[], 200, &[("cache-control", "max-age=5"), ("vary", "accept, *")]).is_some());
        assert_eq!(no(&[], 500, &[("cache-control", "max-age=5")]), None, "any final status with freshness");
        assert_eq!(no(&[], 200, &[("cache-control", "max-age=5"), ("set-cookie", "a=b")]), None);
    }

    #[test]
    fn cdn_cache_control_is_obeyed_when_it_is_a_valid_structured_field() {
        let t = Times { request_ms: 1_000_000_000, response_ms: 1_000_000_000 };
        let life = |pairs: &[(&str, &str)]| {
            let h = headers(pairs);
            freshness_lifetime(StatusCode::OK, &h, &Directives::of_response(&h), t)
        };
        assert_eq!(life(&[("cdn-cache-control", "max-age=3600")]), 3600);
        assert_eq!(life(&[("cdn-cache-control", "max-age=1"), ("cache-control", "max-age=3600")]), 1);
        assert_eq!(life(&[("cdn-cache-control", "foobar, max-age=3600"), ("expires", "0")]), 3600);
        assert_eq!(life(&[("cdn-cache-control", "max-age=99999999999")]), MAX_DELTA);
        for invalid in ["max-age =100", "max-age= 100", "max-age=10000, &&&&&", "max-age=1,"] {
            assert_eq!(life(&[("cdn-cache-control", invalid), ("cache-control", "max-age=7")]), 7, "{invalid}");
        }
        assert_eq!(life(&[("cdn-cache-control", "max-age=\"10000\""), ("cache-control", "max-age=7")]), 0);
        let h = headers(&[("cdn-cache-control", "private"), ("cache-control", "max-age=100")]);
        let d = Directives::of_response(&h);
        assert!(not_storable(&HeaderMap::new(), &Directives::default(), StatusCode::OK, &h, &d).is_some());
        let h = headers(&[("cdn-cache-control", "max-age=100"), ("cache-control", "no-store")]);
        let d = Directives::of_response(&h);
        assert_eq!(not_storable(&HeaderMap::new(), &Directives::default(), StatusCode::OK, &h, &d), None);
        let d = Directives::of_response(&headers(&[("cdn-cache-control", "no-cache;a=1, s-maxage=5")]));
        assert!(d.no_cache && d.s_maxage == Some(Delta::Secs(5)));
        assert_eq!(life(&[("cdn-cache-control", "max-age=5, max-age=9")]), 9, "the last of a key counts");
        // Surrogate-Control addressed to larder, or to every surrogate; not another device's.
        assert_eq!(life(&[("surrogate-control", "max-age=3600;larder"), ("cache-control", "max-age=1")]), 3600);
        assert_eq!(life(&[("surrogate-control", "max-age=3600;other"), ("cache-control", "max-age=7")]), 7);
        let h = headers(&[("surrogate-control", "max-age=100;larder"), ("cache-control", "no-store")]);
        assert!(!Directives::of_response(&h).no_store, "it takes precedence: storable here");
        // Surrogate-Control, below CDN-Cache-Control and above Cache-Control and Expires.
        assert_eq!(life(&[("surrogate-control", "foobar, MaX-aGe=3600"), ("cache-control", "max-age=1")]), 3600);
        assert_eq!(life(&[("surrogate-control", "max-age=0"), ("expires", "Thu, 01 Jan 2099 00:00:00 GMT")]), 0);
        assert_eq!(life(&[("surrogate-control", "max-age=60+30")]), 60);
        for invalid in ["max-age =100", "max-age= 100", "foobar"] {
            assert_eq!(life(&[("surrogate-control", invalid), ("cache-control", "max-age=7")]), 7, "{invalid}");
        }
        assert_eq!(life(&[("cdn-cache-control", "max-age=2"), ("surrogate-control", "max-age=9")]), 2);
        let h = headers(&[("surrogate-control", "no-store"), ("cache-control", "max-age=100")]);
        let d = Directives::of_response(&h);
        assert!(not_storable(&HeaderMap::new(), &Directives::default(), StatusCode::OK, &h, &d).is_some());
        assert_eq!(life(&[("cdn-cache-control", "x=(a \"b)\" c), max-age=9")]), 9, "an inner list is skipped");
    }

    #[test]
    fn stale_on_error() {
        let plain = Directives::default();
        let cc = |s: &str| Directives::of(&headers(&[("cache-control", s)]));
        assert!(stale_if_error(&plain, &cc("stale-if-error=60"), 30, 0));
        assert!(!stale_if_error(&plain, &cc("stale-if-error=10"), 30, 0));
        assert!(stale_if_error(&plain, &plain, 30, 60), "the server's default");
        assert!(stale_if_error(&cc("stale-if-error=40"), &plain, 30, 0), "the request's");
        assert!(!stale_if_error(&plain, &cc("must-revalidate, stale-if-error=60"), 30, 0));
        assert!(pragma_no_cache(&headers(&[("pragma", "no-cache")])));
        assert!(!pragma_no_cache(&headers(&[("pragma", "no-cache"), ("cache-control", "max-age=5")])));
    }
}
