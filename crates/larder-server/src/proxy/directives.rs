//! `Cache-Control` as a [`Directives`] value: RFC 9111 §5.2's parser (lenient: quoted
//! arguments, any case, unknown directives ignored; a directive given twice with different
//! arguments is malformed), and the targeted fields a CDN-like cache obeys instead:
//! `CDN-Cache-Control` (RFC 9213, a Structured Field dictionary, used only when valid) and
//! `Surrogate-Control`. Pure: header fields in, a value out ([`super::policy`] decides with it).

use hyper::header::{HeaderMap, CACHE_CONTROL};

/// The largest delta-seconds value kept: 2^31, as RFC 9111 §1.2.2 says for values that overflow.
pub const MAX_DELTA: u64 = 1 << 31;

/// A directive's argument: none, a valid delta-seconds, or one that did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta {
    /// Given without an argument.
    Bare,
    /// A valid number of seconds (capped at [`MAX_DELTA`]).
    Secs(u64),
    /// Given with an argument that is not delta-seconds: the directive is malformed.
    Invalid,
}

/// The `Cache-Control` directives larder acts on, from every field line of a message. A
/// directive given twice with different arguments counts as malformed ([`Delta::Invalid`]):
/// RFC 9111 §4.2.1 lets a cache treat such a response as stale.
#[derive(Debug, Default, Clone)]
pub struct Directives {
    pub max_age: Option<Delta>,
    pub s_maxage: Option<Delta>,
    pub max_stale: Option<Delta>,
    pub min_fresh: Option<Delta>,
    pub stale_while_revalidate: Option<Delta>,
    pub stale_if_error: Option<Delta>,
    pub no_store: bool,
    pub no_cache: bool,
    /// `no-cache="a, b"`: these fields are never reused without revalidation.
    pub no_cache_fields: Vec<String>,
    pub private: bool,
    /// `private="a, b"`: only these fields are private; the rest may be stored.
    pub private_fields: Vec<String>,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub must_understand: bool,
    pub only_if_cached: bool,
    /// Read from `CDN-Cache-Control` (RFC 9213) or `Surrogate-Control`: `Cache-Control` and
    /// `Expires` do not count.
    pub targeted: bool,
}

impl Directives {
    /// Parses every `Cache-Control` line of `h`. Unknown directives are ignored (§5.2.3).
    pub fn of(h: &HeaderMap) -> Directives {
        let mut d = Directives::default();
        for line in h.get_all(CACHE_CONTROL) {
            let Ok(line) = line.to_str() else { continue };
            for (name, arg) in split_directives(line) {
                d.add(&name, arg);
            }
        }
        d
    }

    /// A response's directives: from a valid `CDN-Cache-Control` (RFC 9213), which larder as a
    /// CDN-like cache obeys instead of `Cache-Control` and `Expires`, else from `Cache-Control`.
    pub fn of_response(h: &HeaderMap) -> Directives {
        cdn_directives(h).or_else(|| surrogate_directives(h)).unwrap_or_else(|| Directives::of(h))
    }

    fn add(&mut self, name: &str, arg: Option<String>) {
        let delta = |slot: &mut Option<Delta>, arg: Option<String>| {
            let new = match arg {
                None => Delta::Bare,
                Some(a) => parse_delta(&a).map_or(Delta::Invalid, Delta::Secs),
            };
            *slot = match *slot {
                Some(old) if old != new => Some(Delta::Invalid),
                _ => Some(new),
            };
        };
        let fields = |arg: Option<String>| -> Vec<String> {
            arg.map(|a| a.split(',').map(|f| f.trim().to_ascii_lowercase()).filter(|f| !f.is_empty()).collect())
                .unwrap_or_default()
        };
        match name {
            "max-age" => delta(&mut self.max_age, arg),
            "s-maxage" => delta(&mut self.s_maxage, arg),
            "max-stale" => delta(&mut self.max_stale, arg),
            "min-fresh" => delta(&mut self.min_fresh, arg),
            "stale-while-revalidate" => delta(&mut self.stale_while_revalidate, arg),
            "stale-if-error" => delta(&mut self.stale_if_error, arg),
            "no-store" => self.no_store = true,
            "no-cache" => match fields(arg) {
                f if f.is_empty() => self.no_cache = true,
                f => self.no_cache_fields.extend(f),
            },
            "private" => match fields(arg) {
                f if f.is_empty() => self.private = true,
                f => self.private_fields.extend(f),
            },
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "must-understand" => self.must_understand = true,
            "only-if-cached" => self.only_if_cached = true,
            _ => {}
        }
    }
}

/// The directives of `CDN-Cache-Control`, if present and a valid Structured Field dictionary
/// (RFC 8941); a member whose value has the wrong type is ignored (RFC 9213 §2.1).
fn cdn_directives(h: &HeaderMap) -> Option<Directives> {
    let lines: Vec<&str> = h.get_all("cdn-cache-control").iter().map(|v| v.to_str().ok()).collect::<Option<_>>()?;
    if lines.is_empty() {
        return None;
    }
    let mut members = sf_dictionary(&lines.join(", "))?;
    // A key given twice: the last one counts (RFC 8941 §4.2.2).
    let mut seen = std::collections::HashSet::new();
    members.reverse();
    members.retain(|(k, _)| seen.insert(k.clone()));
    members.reverse();
    let mut d = Directives { targeted: true, ..Directives::default() };
    for (key, value) in members {
        match (key.as_str(), value) {
            ("max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error", SfValue::Int(n)) if n >= 0 => {
                d.add(&key, Some(n.min(MAX_DELTA as i64).to_string()))
            }
            (
                "no-store" | "no-cache" | "private" | "public" | "must-revalidate" | "proxy-revalidate",
                SfValue::True,
            ) => d.add(&key, None),
            _ => {}
        }
    }
    Some(d)
}

/// The device token larder names itself by to an origin (`Surrogate-Capability`), and which a
/// `Surrogate-Control` directive may target (`max-age=60;larder`).
pub const SURROGATE_TOKEN: &str = "larder";

/// The directives of `Surrogate-Control` (the W3C Edge Architecture's header for caches in
/// front of an origin, which CDN-Cache-Control succeeds) addressed to larder, if it has any
/// larder knows in a valid form: `max-age=N` (its `+M` extension ignored) and `no-store`,
/// each for every surrogate or targeted at [`SURROGATE_TOKEN`] (`;larder`); a directive
/// targeted at another device is not for larder. Strict where Cache-Control's parser is
/// lenient: a space around `=` makes the directive invalid.
fn surrogate_directives(h: &HeaderMap) -> Option<Directives> {
    let mut d = Directives { targeted: true, ..Directives::default() };
    let mut any = false;
    for line in h.get_all("surrogate-control") {
        for member in line.to_str().ok()?.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let member = match member.split_once(';') {
                Some((m, target)) if target.trim() == SURROGATE_TOKEN => m.trim_end(),
                Some(_) => continue,
                None => member,
            };
            let (name, arg) = match member.split_once('=') {
                Some((n, a)) => (n, Some(a)),
                None => (member, None),
            };
            if name.ends_with([' ', '\t']) || arg.is_some_and(|a| a.starts_with([' ', '\t'])) {
                continue;
            }
            match (name.to_ascii_lowercase().as_str(), arg) {
                ("max-age", Some(a)) => {
                    if let Some(secs) = parse_delta(a.split('+').next().unwrap_or("")) {
                        d.add("max-age", Some(secs.to_string()));
                        any = true;
                    }
                }
                ("no-store", None) => {
                    d.no_store = true;
                    any = true;
                }
                _ => {}
            }
        }
    }
    any.then_some(d)
}

/// A Structured Field dictionary member's value, as far as cache directives need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SfValue {
    True,
    Int(i64),
    Other,
}

/// Parses a Structured Field dictionary (RFC 8941 §4.2.2); `None` when the field is invalid.
fn sf_dictionary(s: &str) -> Option<Vec<(String, SfValue)>> {
    let b = s.trim_matches(' ').as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let key = |i: &mut usize| -> Option<String> {
        let start = *i;
        if !matches!(b.get(*i), Some(c) if c.is_ascii_lowercase() || *c == b'*') {
            return None;
        }
        while matches!(b.get(*i), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(c)) {
            *i += 1;
        }
        Some(String::from_utf8_lossy(&b[start..*i]).into_owned())
    };
    // A bare item: its kind, and where it ends.
    let item = |i: &mut usize| -> Option<SfValue> {
        match *b.get(*i)? {
            b'?' => {
                let v = *b.get(*i + 1)?;
                *i += 2;
                match v {
                    b'1' => Some(SfValue::True),
                    b'0' => Some(SfValue::Other),
                    _ => None,
                }
            }
            b'"' => {
                *i += 1;
                loop {
                    match *b.get(*i)? {
                        b'\\' => *i += 2,
                        b'"' => {
                            *i += 1;
                            return Some(SfValue::Other);
                        }
                        c if (0x20..0x7f).contains(&c) => *i += 1,
                        _ => return None,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = *i;
                *i += 1;
                while matches!(b.get(*i), Some(c) if c.is_ascii_digit() || *c == b'.') {
                    *i += 1;
                }
                let text = std::str::from_utf8(&b[start..*i]).ok()?;
                if text.contains('.') {
                    text.parse::<f64>().ok().map(|_| SfValue::Other)
                } else if text.trim_start_matches('-').len() <= 15 {
                    text.parse::<i64>().ok().map(SfValue::Int)
                } else {
                    None
                }
            }
            b':' => {
                let end = b[*i + 1..].iter().position(|&c| c == b':')?;
                *i += end + 2;
                Some(SfValue::Other)
            }
            // An inner list: no cache directive takes one; skipped to its closing parenthesis
            // (quoted strings inside may hold one).
            b'(' => {
                *i += 1;
                let mut quoted = false;
                loop {
                    match *b.get(*i)? {
                        b'\\' if quoted => *i += 1,
                        b'"' => quoted = !quoted,
                        b')' if !quoted => {
                            *i += 1;
                            return Some(SfValue::Other);
                        }
                        _ => {}
                    }
                    *i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'*' => {
                while matches!(b.get(*i), Some(c) if c.is_ascii_graphic() && !b"\",;()<>=@[]{}?/".contains(c) || *c == b':' || *c == b'/')
                {
                    *i += 1;
                }
                Some(SfValue::Other)
            }
            _ => None,
        }
    };
    while i < b.len() {
        let k = key(&mut i)?;
        let v = if b.get(i) == Some(&b'=') {
            i += 1;
            item(&mut i)?
        } else {
            SfValue::True
        };
        // Parameters: `;key[=item]`, which change nothing here.
        while b.get(i) == Some(&b';') {
            i += 1;
            while b.get(i) == Some(&b' ') {
                i += 1;
            }
            key(&mut i)?;
            if b.get(i) == Some(&b'=') {
                i += 1;
                item(&mut i)?;
            }
        }
        out.push((k, v));
        while matches!(b.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        if i == b.len() {
            break;
        }
        if b[i] != b',' {
            return None;
        }
        i += 1;
        while matches!(b.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        if i == b.len() {
            return None; // a trailing comma
        }
    }
    Some(out)
}

/// Splits a `Cache-Control` value into lower-cased directive names and their arguments
/// (quoted strings unquoted), honouring commas inside quotes.
fn split_directives(line: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i] == b',' || b[i] == b' ' || b[i] == b'\t') {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i] != b',' && b[i] != b'=' {
            i += 1;
        }
        let name = line[start..i].trim().to_ascii_lowercase();
        let mut arg = None;
        if i < b.len() && b[i] == b'=' {
            i += 1;
            if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = String::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    v.push(b[i] as char);
                    i += 1;
                }
                i += 1; // the closing quote
                while i < b.len() && b[i] != b',' {
                    i += 1;
                }
                arg = Some(v);
            } else {
                let s = i;
                while i < b.len() && b[i] != b',' {
                    i += 1;
                }
                arg = Some(line[s..i].trim().to_string());
            }
        }
        if !name.is_empty() {
            out.push((name, arg));
        }
    }
    out
}

/// delta-seconds (§1.2.2): digits only; values past 2^31 become 2^31.
pub fn parse_delta(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<u64>().map_or(MAX_DELTA, |n| n.min(MAX_DELTA)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use hyper::header::{HeaderName, HeaderValue};

    /// Header fields from name/value pairs, in order (the policy's tests use it too).
    pub(in crate::proxy) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn directives_parse_with_quotes_case_and_duplicates() {
        let d = Directives::of(&headers(&[
            ("cache-control", "Max-Age=\"60\", no-cache=\"Set-Cookie, X-A\", private"),
            ("cache-control", "s-maxage=5, s-maxage=7, stale-while-revalidate=30, public"),
        ]));
        assert_eq!(d.max_age, Some(Delta::Secs(60)));
        assert_eq!(d.s_maxage, Some(Delta::Invalid), "two different values are malformed");
        assert_eq!(d.no_cache_fields, vec!["set-cookie", "x-a"]);
        assert!(!d.no_cache && d.private && d.public);
        assert_eq!(d.stale_while_revalidate, Some(Delta::Secs(30)));
        let bad = Directives::of(&headers(&[("cache-control", "max-age=-1, min-fresh=1.5, max-stale")]));
        assert_eq!(
            (bad.max_age, bad.min_fresh, bad.max_stale),
            (Some(Delta::Invalid), Some(Delta::Invalid), Some(Delta::Bare))
        );
        let huge = Directives::of(&headers(&[("cache-control", "max-age=99999999999999999999999")]));
        assert_eq!(huge.max_age, Some(Delta::Secs(MAX_DELTA)));
    }
}
