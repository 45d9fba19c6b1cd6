//! How a request finds the stored response it may select, and whether it may use it now
//! ([`judge`]). A URI's responses are stored under
//! its cache key; a URI whose responses vary (`Vary`) has instead a marker there naming the
//! fields, and each variant under a key of its own: the URI, the marker's store time (a new
//! marker orphans the old variants) and the request's selecting values. Selecting values are
//! taken from the fields as they go to the origin, compared as bytes.

use super::directives::Directives;
use super::origin;
use super::policy::{self, Times, Use};
use super::stored::{Kind, Stored};
use crate::app::App;
use crate::storeio::{self, Read};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, VARY};
use hyper::{Method, Request, StatusCode};
use larder_engine::{now_ms, Part, PutOptions, Store, MAX_KEY_LEN};
use std::sync::Arc;

/// Keys of stored responses start with a byte no HTTP or memcached key of larder's own can.
pub(super) const KEY_PREFIX: &[u8] = b"\x00r ";

/// The store key of a URI: the URI itself when it fits, else its 128-bit hash (the stored URI
/// is compared on every read, so a collision is a miss, never another URI's response).
pub(super) fn cache_key(uri: &[u8]) -> Vec<u8> {
    let mut k = KEY_PREFIX.to_vec();
    if KEY_PREFIX.len() + uri.len() <= MAX_KEY_LEN {
        k.extend_from_slice(uri);
    } else {
        k.extend_from_slice(format!("#{:032x}", xxhash_rust::xxh3::xxh3_128(uri)).as_bytes());
    }
    k
}

/// The key of one variant of a URI whose responses vary: the URI, the marker's store time (so a
/// new marker orphans the old variants) and the selecting values.
pub(super) fn variant_key(uri: &[u8], marker_ms: u64, selecting: &[(HeaderName, Option<HeaderValue>)]) -> Vec<u8> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(uri);
    h.update(&marker_ms.to_le_bytes());
    for (name, value) in selecting {
        h.update(name.as_str().as_bytes());
        match value {
            Some(v) => {
                h.update(b"=");
                h.update(v.as_bytes());
            }
            None => h.update(b"!"),
        }
        h.update(b"\n");
    }
    let mut k = b"\x00v ".to_vec();
    k.extend_from_slice(format!("{:032x}", h.digest128()).as_bytes());
    k
}

/// The field names of a response's `Vary`, lower-cased, in order.
pub(super) fn vary_names(h: &HeaderMap) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = Vec::new();
    for v in h.get_all(VARY).iter().filter_map(|v| v.to_str().ok()) {
        for n in v.split(',').map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if let Ok(n) = HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    names
}

/// A request's values of `names` as the origin receives them ([`origin::fetch_headers`]),
/// normalised (field lines joined, spaces around commas dropped) so that equivalent requests
/// select the same variant (RFC 9111 §4.1). Not the client's own fields: a field its
/// `Connection` names is not forwarded, and the response the origin sends without it must be
/// stored as the variant of its absence, not of the value the client had. Bytes throughout:
/// values that are not UTF-8 are compared as sent, never made alike by a lossy conversion.
pub(super) fn selecting(client: &HeaderMap, names: &[HeaderName]) -> Vec<(HeaderName, Option<HeaderValue>)> {
    if names.is_empty() {
        return Vec::new();
    }
    let sent = origin::fetch_headers(client);
    names.iter().map(|n| (n.clone(), normalised(sent.get_all(n).iter()))).collect()
}

/// A field's lines as one value: joined with commas, with the spaces and tabs around each
/// comma dropped; `None` for no line at all.
fn normalised<'a>(lines: impl Iterator<Item = &'a HeaderValue>) -> Option<HeaderValue> {
    let mut joined: Option<Vec<u8>> = None;
    for line in lines {
        let out = match &mut joined {
            Some(out) => {
                out.push(b',');
                out
            }
            None => joined.insert(Vec::new()),
        };
        for (i, member) in line.as_bytes().split(|&b| b == b',').enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(member.trim_ascii());
        }
    }
    // Bytes of field values less some whitespace are a field value: hyper's parser let none
    // through that `from_bytes` refuses (controls, DEL).
    joined.map(|v| HeaderValue::from_bytes(&v).expect("a field value's bytes"))
}

/// A stored response found for a request.
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    pub(super) stored: Stored,
    pub(super) read: Read,
}

impl Entry {
    pub(super) fn value(&self) -> &larder_engine::Value {
        self.read.value()
    }
}

/// Looks up the stored response for `uri` that `req` may select; `None` is a miss.
pub(super) async fn lookup(
    app: &Arc<App>,
    store: &Store,
    uri: &[u8],
    key: &[u8],
    req: &HeaderMap,
    part: Part,
) -> Option<Entry> {
    let mut key = key.to_vec();
    for _ in 0..2 {
        let read = match storeio::read_body_of(app, store, &key, part, false).await {
            Ok(Some(r)) => r,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "a stored response could not be read; fetching it again");
                return None;
            }
        };
        let stored = Stored::decode(read.value().attrs.as_deref()?)?;
        if stored.uri != uri {
            return None; // another URI's hash, or a record of another use
        }
        match stored.kind {
            Kind::Response => {
                let names: Vec<HeaderName> = stored.selecting.iter().map(|(n, _)| n.clone()).collect();
                if selecting(req, &names) != stored.selecting {
                    return None;
                }
                return Some(Entry { key, stored, read });
            }
            Kind::VaryMarker => {
                key = variant_key(uri, read.value().stored_ms, &selecting(req, &vary_names(&stored.headers)));
            }
        }
    }
    None
}

/// A stored response a request selects, and what RFC 9111 says of its use now.
pub(super) struct Found {
    pub(super) e: Entry,
    /// The response's `Cache-Control`.
    pub(super) cc: Directives,
    /// Its current age, in milliseconds (§4.2.3).
    pub(super) age_ms: u64,
    /// Whether the request may use it as it is, stale, or after a validation (§4.2, §4.3).
    pub(super) usable: Use,
}

/// Looks up the stored response `req` selects, for the part it asks for (nothing for a HEAD,
/// its range), and judges its freshness against the request's `Cache-Control` (`req_cc`) and,
/// when `pragma`, its `Pragma: no-cache`.
pub(super) async fn judge(
    app: &Arc<App>,
    store: &Store,
    req: &Request<Incoming>,
    uri: &[u8],
    key: &[u8],
    req_cc: &Directives,
    pragma: bool,
) -> Option<Found> {
    let h = req.headers();
    let part = match req.method() == Method::HEAD {
        true => Part::Nothing,
        false => crate::headers::range(h).map_or(Part::Whole, Part::Range),
    };
    let e = lookup(app, store, uri, key, h, part).await?;
    let cc = Directives::of_response(&e.stored.headers);
    let lifetime = policy::freshness_lifetime(e.stored.status, &e.stored.headers, &cc, e.stored.times);
    let age_ms = policy::current_age_ms(&e.stored.headers, e.stored.times, now_ms());
    let usable = policy::usable(req_cc, pragma, &cc, age_ms, lifetime);
    Some(Found { e, cc, age_ms, usable })
}

/// The store time of the vary marker naming `names` at `key`, the cache key of `uri`, writing
/// one if there is none.
pub(super) async fn marker(app: &Arc<App>, key: &[u8], uri: &[u8], names: &[HeaderName]) -> Option<u64> {
    let store = app.store.get().expect("store is ready");
    if let Ok(Some(r)) = storeio::read_body_of(app, store, key, Part::Nothing, false).await {
        let v = r.value();
        if let Some(s) = v.attrs.as_deref().and_then(Stored::decode) {
            if s.kind == Kind::VaryMarker && s.uri == uri && vary_names(&s.headers) == names {
                return Some(v.stored_ms);
            }
        }
    }
    let mut headers = HeaderMap::new();
    let list = names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ");
    headers.insert(VARY, HeaderValue::from_str(&list).ok()?);
    let m = Stored {
        kind: Kind::VaryMarker,
        status: StatusCode::OK,
        times: Times { request_ms: 0, response_ms: 0 },
        uri: uri.to_vec(),
        headers,
        selecting: Vec::new(),
    };
    let attrs = m.encode()?;
    let key = key.to_vec();
    let put =
        storeio::blocking(app, move |s| s.put(&key, b"", &PutOptions { attrs: Some(&attrs), ..PutOptions::default() }));
    put.await.ok().map(|st| st.version.stored_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selecting_values_are_normalised_as_bytes() {
        let v = |lines: &[&[u8]]| {
            normalised(lines.iter().map(|l| HeaderValue::from_bytes(l).unwrap()).collect::<Vec<_>>().iter())
        };
        assert_eq!(v(&[]), None);
        assert_eq!(v(&[b""]), Some(HeaderValue::from_static("")));
        assert_eq!(v(&[b"en , fr\t,de", b" x"]), Some(HeaderValue::from_static("en,fr,de,x")));
        let e9 = v(&[b"x\xe9"]).unwrap();
        assert_eq!(e9.as_bytes(), b"x\xe9");
        assert_ne!(Some(e9), v(&[b"x\xe8"]), "no lossy conversion makes them one");
    }
}
