//! The connection to the origin: hyper's pooled client (keep-alive connections reused across
//! requests), the connect and read timeouts, and which header fields cross the proxy.

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Empty};
use hyper::body::Incoming;
use hyper::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, HOST, IF_MODIFIED_SINCE, IF_NONE_MATCH, IF_RANGE,
    RANGE, TRANSFER_ENCODING, UPGRADE, VIA,
};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use std::time::Duration;

/// A request body to the origin: the client's, streamed as it arrives, or none.
pub type OutBody = Either<crate::body::Paced, Empty<Bytes>>;

/// Why the origin did not answer.
#[derive(Debug)]
pub enum OriginError {
    /// No connection within the connect timeout, or refused.
    Connect(String),
    /// No response head within the read timeout.
    Timeout,
    /// The connection failed mid-exchange.
    Broken(String),
}

impl std::fmt::Display for OriginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OriginError::Connect(e) => write!(f, "cannot connect to the origin: {e}"),
            OriginError::Timeout => f.write_str("the origin did not answer in time"),
            OriginError::Broken(e) => write!(f, "the origin's answer broke off: {e}"),
        }
    }
}

/// The origin and the pooled client that talks to it.
pub struct Origin {
    /// `host:port` of the origin, the authority of the URIs sent to it.
    pub authority: String,
    client: Client<HttpConnector, OutBody>,
    /// The longest wait for a response head, and between two pieces of a body.
    pub read_timeout: Duration,
}

/// The `Via` value larder adds (RFC 9110 §7.6.3).
pub const VIA_VALUE: &str = "1.1 larder";

impl Origin {
    /// A client for `url` (`http://host:port`, no path).
    pub fn new(url: &str, connect_timeout: Duration, read_timeout: Duration) -> Result<Origin, String> {
        let uri: Uri = url.parse().map_err(|e| format!("--origin {url}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("--origin {url}: only http:// origins are supported"));
        }
        let authority = uri.authority().ok_or_else(|| format!("--origin {url}: no host"))?.to_string();
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(format!("--origin {url}: give the origin without a path"));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build(connector);
        Ok(Origin { authority, client, read_timeout })
    }

    /// Sends `method path` with `headers` (already filtered) and `body`; waits at most the read
    /// timeout for the response head. Never retried.
    pub async fn send(
        &self,
        method: hyper::Method,
        path_and_query: &str,
        headers: HeaderMap,
        body: OutBody,
    ) -> Result<Response<Incoming>, OriginError> {
        let uri = format!("http://{}{}", self.authority, path_and_query);
        let mut req = Request::builder().method(method).uri(uri);
        *req.headers_mut().expect("a fresh builder") = headers;
        let req = req.body(body).map_err(|e| OriginError::Broken(e.to_string()))?;
        match tokio::time::timeout(self.read_timeout, self.client.request(req)).await {
            Err(_) => Err(OriginError::Timeout),
            Ok(Err(e)) if e.is_connect() => Err(OriginError::Connect(source_chain(&e))),
            Ok(Err(e)) => Err(OriginError::Broken(source_chain(&e))),
            Ok(Ok(r)) => Ok(r),
        }
    }

    /// The next piece of a response body, within the read timeout: `Ok(None)` at its end.
    pub async fn next(&self, body: &mut Incoming) -> Result<Option<Bytes>, OriginError> {
        loop {
            match tokio::time::timeout(self.read_timeout, body.frame()).await {
                Err(_) => return Err(OriginError::Timeout),
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(OriginError::Broken(e.to_string())),
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        return Ok(Some(d));
                    }
                }
            }
        }
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Hop-by-hop fields (RFC 9110 §7.6.1), never forwarded or stored.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "trailer",
    "proxy-authorization",
];

/// Whether `name` is hop-by-hop, by the fixed list or by the message's `Connection` field
/// (which cannot make `Host` one: the cache key and the origin must see the same host).
pub fn hop_by_hop(name: &HeaderName, connection: &[String]) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
        || name == "proxy-authenticate"
        || (name != HOST && connection.iter().any(|c| c == name.as_str()))
}

/// The field names a message's `Connection` header lists.
pub fn connection_names(h: &HeaderMap) -> Vec<String> {
    h.get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The end-to-end fields of `h`.
pub fn end_to_end(h: &HeaderMap) -> HeaderMap {
    let connection = connection_names(h);
    let mut out = HeaderMap::with_capacity(h.len());
    for (name, value) in h {
        if !hop_by_hop(name, &connection) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The header fields a request goes to the origin with: the client's end-to-end fields, its
/// `Host` kept, and larder's `Via` added.
pub fn request_headers(client: &HeaderMap) -> HeaderMap {
    let mut h = end_to_end(client);
    h.remove(TRANSFER_ENCODING);
    h.remove(UPGRADE);
    // Without a Host (an HTTP/1.0 client), hyper's client sends the origin's.
    h.append(VIA, HeaderValue::from_static(VIA_VALUE));
    // larder is a surrogate (the W3C Edge Architecture): an origin may address
    // Surrogate-Control to it by this token.
    h.append(SURROGATE_CAPABILITY.clone(), HeaderValue::from_static(SURROGATE_CAPABILITY_VALUE));
    h
}

/// The request field by which a surrogate tells the origin its device token and abilities.
pub static SURROGATE_CAPABILITY: HeaderName = HeaderName::from_static("surrogate-capability");
/// larder's: its token ([`super::directives::SURROGATE_TOKEN`]) and the Edge Architecture's
/// version.
const SURROGATE_CAPABILITY_VALUE: &str = "larder=\"Surrogate/1.0\"";
/// The response field addressed to surrogates, which none passes on (the Edge Architecture):
/// larder obeys it and removes it before a response goes to the client.
pub static SURROGATE_CONTROL: HeaderName = HeaderName::from_static("surrogate-control");

/// The header fields the cache fetches a client's GET or HEAD with (before the validators of a
/// revalidation): the request's fields as [`request_headers`] forwards them, less its
/// conditionals and range (the cache fetches the whole response, stores it, and answers
/// those from it) and the fields of a body (a GET's body is not sent). These are what the
/// origin sees, so these are what its `Vary` speaks of.
pub fn fetch_headers(client: &HeaderMap) -> HeaderMap {
    let mut h = request_headers(client);
    for n in [IF_NONE_MATCH, IF_MODIFIED_SINCE, IF_RANGE, RANGE, CONTENT_LENGTH, TRANSFER_ENCODING] {
        h.remove(n);
    }
    h
}
