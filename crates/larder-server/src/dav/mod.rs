//! The WebDAV door: the subset of RFC 4918 that key-value clients use (sccache and other
//! OpenDAL users, rclone), on the key API's paths.
//!
//! - `OPTIONS` answers `DAV: 1` and the methods a path takes.
//! - `PROPFIND` describes a key (its length, entity tag, date and type) or a collection.
//!   Collections are implicit: the root and every path ending in `/`. `Depth: 1` lists a
//!   collection's members from a scan of the volumes' record headers (the index keeps hashes,
//!   not keys), and only while the store holds at most `--dav-list-limit` keys: above it the
//!   listing is refused with 507, never cut short. `Depth: infinity` on a collection is
//!   refused (403, `propfind-finite-depth`), as RFC 4918 §9.1 allows.
//! - `MKCOL` of a path ending in `/` succeeds (201) where no value is stored: there is
//!   nothing to create. Of any other path it is refused (403): that would be no collection.
//! - `COPY`, `MOVE`, `PROPPATCH`, `LOCK` and the rest are refused with 405 and `Allow`.
//!
//! The request was admitted by the policy before it gets here (routes.rs, [`permission`]:
//! `PROPFIND` and `OPTIONS` read, a listing is admin as memcached's key dumps are, `MKCOL`
//! writes); a PROPFIND body is read as a PUT's is, charged to the
//! body budget and within the body's deadline, and at most [`MAX_BODY`] long.

pub mod xml;

use crate::app::{App, Held};
use crate::body::{read_body, too_slow, BodyError};
use crate::guard::Permission;
use crate::headers;
use crate::reply::{engine_error, method_not_allowed, text, text_owned, Body, Op, Resp};
use crate::storeio::{blocking, read};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::{Method, Request, Response, StatusCode};
use larder_engine::{Part, Store};
use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use xml::Resource;

/// The methods the key API's paths take, WebDAV's among them, for `Allow`.
pub const ALLOWED: &str = "OPTIONS, GET, HEAD, PUT, PATCH, DELETE, PROPFIND, MKCOL";

/// The longest PROPFIND body taken (a real one is a few hundred bytes).
pub const MAX_BODY: u64 = 64 << 10;

/// Whether a method is one of WebDAV's that larder takes.
pub fn is_dav(m: &Method) -> bool {
    matches!(m.as_str(), "OPTIONS" | "PROPFIND" | "MKCOL")
}

/// What a WebDAV request asks of the policy (`key`: its decoded path); `None` for a method no
/// path takes. A listing (`Depth: 1` on a collection) enumerates keys, as memcached's key
/// dumps do: it needs what they need (admin), not merely read rights.
pub fn permission(req: &Request<Incoming>, key: &[u8]) -> Option<Permission> {
    match req.method().as_str() {
        "PROPFIND" if is_collection(key) && depth(req) == Ok(Depth::One) => Some(Permission::Admin),
        "OPTIONS" | "PROPFIND" => Some(Permission::Read),
        "MKCOL" => Some(Permission::Write),
        _ => None,
    }
}

/// Whether a path names a collection: the root (an empty key) or one ending in `/`.
pub fn is_collection(key: &[u8]) -> bool {
    key.is_empty() || key.ends_with(b"/")
}

/// A WebDAV request admitted by the policy: `key` is the decoded path (empty for the root).
pub async fn handle(app: &Arc<App>, store: &Store, key: &[u8], req: Request<Incoming>, held: Option<Held>) -> Resp {
    match req.method().as_str() {
        "OPTIONS" => options(),
        "MKCOL" => mkcol(app, store, key, &req).await,
        _ => propfind(app, store, key, req, held).await,
    }
}

fn options() -> Resp {
    let mut r = text(StatusCode::OK, "");
    let h = r.headers_mut();
    h.insert("dav", HeaderValue::from_static("1"));
    h.insert(ALLOW, HeaderValue::from_static(ALLOWED));
    h.insert("ms-author-via", HeaderValue::from_static("DAV"));
    r
}

async fn mkcol(app: &Arc<App>, store: &Store, key: &[u8], req: &Request<Incoming>) -> Resp {
    let declared = req.headers().get(CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0");
    if declared || req.headers().contains_key(TRANSFER_ENCODING) {
        return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, "MKCOL takes no body\n");
    }
    if !is_collection(key) {
        // A collection made here would not be one to PROPFIND (its path holds no value and
        // ends in no `/`): refused as RFC 4918 §9.3.1 allows, rather than a 201 that lies.
        return text(StatusCode::FORBIDDEN, "collections are paths ending in /: MKCOL <path>/\n");
    }
    if !key.is_empty() {
        match read(app, store, key, Part::Nothing, false).await {
            Ok(Some(_)) => return method_not_allowed(ALLOWED),
            Ok(None) => {}
            Err(e) => return engine_error(&e, Op::Read),
        }
    }
    // Collections are implicit: every path ending in `/` is one, with nothing to create.
    text(StatusCode::CREATED, "created\n")
}

/// `Depth`: 0, 1 or infinity (the default, RFC 4918 §10.2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Depth {
    Zero,
    One,
    Infinity,
}

fn depth(req: &Request<Incoming>) -> Result<Depth, ()> {
    match req.headers().get("depth").map(|v| v.as_bytes().trim_ascii()) {
        None => Ok(Depth::Infinity),
        Some(b"0") => Ok(Depth::Zero),
        Some(b"1") => Ok(Depth::One),
        Some(v) if v.eq_ignore_ascii_case(b"infinity") => Ok(Depth::Infinity),
        Some(_) => Err(()),
    }
}

async fn propfind(app: &Arc<App>, store: &Store, key: &[u8], req: Request<Incoming>, held: Option<Held>) -> Resp {
    let Ok(depth) = depth(&req) else {
        return text(StatusCode::BAD_REQUEST, "Depth must be 0, 1 or infinity\n");
    };
    let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return too_large();
    }
    let href = req.uri().path().to_string();
    let mut room = app.body_budget.body();
    let want =
        match read_body(app, req.into_body(), MAX_BODY, declared.unwrap_or(MAX_BODY), &mut room, held.as_ref()).await {
            Ok(parts) => xml::parse_propfind(&parts.concat()),
            Err(BodyError::TooLarge) => return too_large(),
            Err(BodyError::TooSlow) => return too_slow(),
            Err(BodyError::Broken(e)) => return text_owned(StatusCode::BAD_REQUEST, format!("request body: {e}\n")),
        };
    drop(room);
    let want = match want {
        Ok(w) => w,
        Err(why) => return text_owned(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let mut out = xml::open_multistatus();
    if !is_collection(key) {
        // A key: the same whatever the depth (a resource that is not a collection has no members).
        let v = match read(app, store, key, Part::Nothing, false).await {
            Ok(Some(v)) => v,
            Ok(None) => return text(StatusCode::NOT_FOUND, "not found\n"),
            Err(e) => return engine_error(&e, Op::Read),
        };
        let content_type = v.content_type.as_ref().map(|t| String::from_utf8_lossy(t).into_owned());
        let r = Resource {
            href,
            collection: false,
            len: Some(v.len),
            etag: Some(header_text(&headers::etag(v.version()))),
            modified: Some(header_text(&headers::last_modified(&v))),
            content_type: Some(content_type.unwrap_or_else(|| "application/octet-stream".into())),
        };
        xml::response(&mut out, &r, &want);
        return multistatus(out);
    }
    let modified = Some(header_text(&headers::http_date(*SINCE.get_or_init(|| larder_engine::now_ms() / 1000))));
    let this = Resource { href: href.clone(), collection: true, len: None, etag: None, modified, content_type: None };
    match depth {
        Depth::Infinity => {
            let mut r = Response::new(Body::full(Bytes::from_static(xml::FINITE_DEPTH.as_bytes())));
            *r.status_mut() = StatusCode::FORBIDDEN;
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/xml; charset=utf-8"));
            return r;
        }
        Depth::Zero => xml::response(&mut out, &this, &want),
        Depth::One => {
            // One listing at a time, its answer built within its turn.
            let _turn = LISTING.acquire().await.expect("the listing semaphore is never closed");
            let members = match list(app, store, key).await {
                Ok(m) => m,
                Err(r) => return *r,
            };
            xml::response(&mut out, &this, &want);
            let base = if href.ends_with('/') { href.clone() } else { format!("{href}/") };
            for (name, m) in members {
                let href = format!("{base}{}", percent_encode(&name, SEGMENT));
                let r = match m {
                    Member::Collection => Resource { href, collection: true, ..this_like(&this) },
                    Member::Key { len, stored_ms } => Resource {
                        href,
                        collection: false,
                        len: Some(len),
                        etag: None,
                        modified: Some(header_text(&headers::http_date(stored_ms / 1000))),
                        content_type: None,
                    },
                };
                xml::response(&mut out, &r, &want);
                if out.len() > MAX_LISTING {
                    let why =
                        format!("this listing is larger than {} MiB: ask for fewer properties\n", MAX_LISTING >> 20);
                    return text_owned(StatusCode::INSUFFICIENT_STORAGE, why);
                }
            }
        }
    }
    multistatus(out)
}

/// When this process began answering for collections: their `getlastmodified` (they are
/// implicit, so no write dates them; clients such as OpenDAL need a date all the same).
static SINCE: OnceLock<u64> = OnceLock::new();

/// A sub-collection's properties, taken from its parent's.
fn this_like(c: &Resource) -> Resource {
    Resource {
        href: String::new(),
        collection: true,
        len: None,
        etag: None,
        modified: c.modified.clone(),
        content_type: None,
    }
}

/// What a name in a listing is: a key, or the first segment of longer keys.
enum Member {
    Key { len: u64, stored_ms: u64 },
    Collection,
}

/// Bytes of a path segment written as they are in an `href`; every other byte is
/// percent-encoded (and a sub-collection's trailing `/` kept).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');

/// The largest listing answer built (at most `--dav-list-limit` members with every property
/// is about 3 MB at the default limit; a client naming many foreign properties gets 507).
const MAX_LISTING: usize = 16 << 20;

/// One listing scans at a time: each reads every volume's record headers.
static LISTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The members of the collection `prefix` (its direct children: keys, and the first segment
/// of longer keys as sub-collections), in name order; or the answer refusing the listing.
async fn list(app: &Arc<App>, store: &Store, prefix: &[u8]) -> Result<BTreeMap<Vec<u8>, Member>, Box<Resp>> {
    let limit = app.settings.dav_list_limit;
    let refused = |held: u64| {
        Box::new(text_owned(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("this collection is not listed: the store holds {held} keys, more than --dav-list-limit {limit} (members are read with PROPFIND Depth 0)\n"),
        ))
    };
    let held = store.stats().keys;
    if limit == 0 || held > limit {
        return Err(refused(held));
    }
    let prefix = prefix.to_vec();
    let scanned = blocking(app, move |store| {
        let (mut members, mut seen) = (BTreeMap::new(), 0u64);
        store.keys(|k| {
            seen += 1;
            if let Some(rest) = k.key.strip_prefix(&prefix[..]).filter(|r| !r.is_empty()) {
                match rest.iter().position(|&b| b == b'/') {
                    Some(at) => members.insert(rest[..=at].to_vec(), Member::Collection),
                    None => members.insert(rest.to_vec(), Member::Key { len: k.len, stored_ms: k.stored_ms }),
                };
            }
            seen <= limit // keys written while it scans: past the limit, refused rather than cut
        })?;
        Ok((members, seen))
    })
    .await;
    match scanned {
        Ok((_, seen)) if seen > limit => Err(refused(seen)),
        Ok((members, _)) => Ok(members),
        Err(e) => Err(Box::new(engine_error(&e, Op::Read))),
    }
}

fn multistatus(mut out: String) -> Resp {
    xml::close_multistatus(&mut out);
    let mut r = Response::new(Body::full(Bytes::from(out)));
    *r.status_mut() = StatusCode::MULTI_STATUS;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/xml; charset=utf-8"));
    r
}

fn header_text(v: &HeaderValue) -> String {
    String::from_utf8_lossy(v.as_bytes()).into_owned()
}

fn too_large() -> Resp {
    text_owned(StatusCode::PAYLOAD_TOO_LARGE, format!("a PROPFIND body may be at most {MAX_BODY} bytes\n"))
}
