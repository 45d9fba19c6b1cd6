//! A stored response's description, kept as the record's attributes (docs/FORMAT.md, "Stored
//! responses"): its status, the times its age is computed from, its header fields, the URI it
//! answers, and, for a response that varies, the request's values of the fields it varies on.
//!
//! ```text
//! u8 version (1) · u8 kind (0 response, 1 vary marker) · u16 status
//! u64 request time ms · u64 response time ms
//! u16 URI length · URI
//! u16 header count · per header: u16 name length · name · u16 value length · value
//! u16 selecting count · per field: the same name/value layout (absent field: value 0xFFFF)
//! ```
//!
//! All integers little-endian. Anything that does not decode is a miss, never a response.

use bytes::{Buf, BufMut};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::StatusCode;

const VERSION: u8 = 1;
/// The selecting value of a field the request did not send.
const ABSENT: u16 = 0xFFFF;

/// What a stored entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A response, with its body as the value.
    Response,
    /// The entry of a URI whose responses vary: its `Vary` fields are in `headers`, each
    /// variant is stored under its own key.
    VaryMarker,
}

/// A decoded stored response (or marker).
#[derive(Debug, Clone)]
pub struct Stored {
    pub kind: Kind,
    pub status: StatusCode,
    pub times: super::policy::Times,
    pub uri: Vec<u8>,
    pub headers: HeaderMap,
    /// The request's value of each field the response varies on (`None`: not sent).
    pub selecting: Vec<(HeaderName, Option<HeaderValue>)>,
}

impl Stored {
    /// The attributes bytes, or `None` when they would pass the engine's limit.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        out.put_u8(VERSION);
        out.put_u8(match self.kind {
            Kind::Response => 0,
            Kind::VaryMarker => 1,
        });
        out.put_u16_le(self.status.as_u16());
        out.put_u64_le(self.times.request_ms);
        out.put_u64_le(self.times.response_ms);
        put_bytes(&mut out, &self.uri)?;
        let count = u16::try_from(self.headers.len()).ok()?;
        out.put_u16_le(count);
        for (name, value) in &self.headers {
            put_bytes(&mut out, name.as_str().as_bytes())?;
            put_bytes(&mut out, value.as_bytes())?;
        }
        out.put_u16_le(u16::try_from(self.selecting.len()).ok()?);
        for (name, value) in &self.selecting {
            put_bytes(&mut out, name.as_str().as_bytes())?;
            match value {
                Some(v) => put_bytes(&mut out, v.as_bytes())?,
                None => out.put_u16_le(ABSENT),
            }
        }
        (out.len() <= larder_engine::MAX_ATTRS).then_some(out)
    }

    /// Decodes attributes written by [`Stored::encode`].
    pub fn decode(mut b: &[u8]) -> Option<Stored> {
        if b.remaining() < 22 || b.get_u8() != VERSION {
            return None;
        }
        let kind = match b.get_u8() {
            0 => Kind::Response,
            1 => Kind::VaryMarker,
            _ => return None,
        };
        let status = StatusCode::from_u16(b.get_u16_le()).ok()?;
        let times = super::policy::Times { request_ms: b.get_u64_le(), response_ms: b.get_u64_le() };
        let uri = get_bytes(&mut b)?.to_vec();
        let count = get_u16(&mut b)?;
        let mut headers = HeaderMap::with_capacity(count as usize);
        for _ in 0..count {
            let name = HeaderName::from_bytes(get_bytes(&mut b)?).ok()?;
            let value = HeaderValue::from_bytes(get_bytes(&mut b)?).ok()?;
            headers.append(name, value);
        }
        let count = get_u16(&mut b)?;
        let mut selecting = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let name = HeaderName::from_bytes(get_bytes(&mut b)?).ok()?;
            let value = match b.get(..2).map(|l| u16::from_le_bytes([l[0], l[1]])) {
                Some(ABSENT) => {
                    b.advance(2);
                    None
                }
                _ => Some(HeaderValue::from_bytes(get_bytes(&mut b)?).ok()?),
            };
            selecting.push((name, value));
        }
        Some(Stored { kind, status, times, uri, headers, selecting })
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) -> Option<()> {
    // 0xFFFF is the "absent" mark; nothing this long fits the attributes anyway.
    let len = u16::try_from(b.len()).ok().filter(|&l| l != ABSENT)?;
    out.put_u16_le(len);
    out.put_slice(b);
    Some(())
}

fn get_u16(b: &mut &[u8]) -> Option<u16> {
    (b.remaining() >= 2).then(|| b.get_u16_le())
}

fn get_bytes<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = get_u16(b)? as usize;
    let out = b.get(..len)?;
    b.advance(len);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let mut headers = HeaderMap::new();
        headers.append("cache-control", HeaderValue::from_static("max-age=60"));
        headers.append("x-two", HeaderValue::from_static("a"));
        headers.append("x-two", HeaderValue::from_static("b"));
        let s = Stored {
            kind: Kind::Response,
            status: StatusCode::NOT_FOUND,
            times: super::super::policy::Times { request_ms: 5, response_ms: 7 },
            uri: b"example.com/a?b".to_vec(),
            headers,
            selecting: vec![
                (HeaderName::from_static("accept"), Some(HeaderValue::from_static("text/html"))),
                (HeaderName::from_static("accept-language"), None),
            ],
        };
        let d = Stored::decode(&s.encode().unwrap()).unwrap();
        assert_eq!((d.kind, d.status, d.times.request_ms, d.times.response_ms), (Kind::Response, s.status, 5, 7));
        assert_eq!((&d.uri, &d.headers, &d.selecting), (&s.uri, &s.headers, &s.selecting));
        let mut big = s.headers.clone();
        big.insert("x-big", HeaderValue::from_str(&"a".repeat(5000)).unwrap());
        assert!(Stored { headers: big, ..s.clone() }.encode().is_none(), "past the limit: not stored");
        let bytes = s.encode().unwrap();
        for cut in 0..bytes.len() {
            assert!(Stored::decode(&bytes[..cut]).is_none() || cut == bytes.len(), "a cut block never decodes");
        }
    }
}
