//! Key decoding: request path in, key bytes out. Pure, no IO (so it is trivially tested).

use std::borrow::Cow;

/// Longest key in bytes after decoding.
pub const MAX_KEY_LEN: usize = larder_engine::MAX_KEY_LEN;
/// Keys under this prefix are the server's own endpoints.
pub const RESERVED_PREFIX: &[u8] = b"_larder/";

/// Why a path is not a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// Nothing after the first `/`.
    Empty,
    /// More than `MAX_KEY_LEN` bytes after decoding.
    TooLong,
    /// A `%` not followed by two hex digits.
    BadEncoding,
}

impl KeyError {
    /// One-line explanation for the client.
    pub fn message(self) -> &'static str {
        match self {
            KeyError::Empty => "empty key\n",
            KeyError::TooLong => "key longer than 1024 bytes\n",
            KeyError::BadEncoding => "badly percent-encoded key\n",
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The key of a request path (the part after the first `/`, percent-decoded, strictly).
/// The query string must already be stripped (hyper's `Uri::path` does).
pub fn decode_key(path: &str) -> Result<Cow<'_, [u8]>, KeyError> {
    let raw = path.strip_prefix('/').unwrap_or(path).as_bytes();
    if raw.is_empty() {
        return Err(KeyError::Empty);
    }
    let key: Cow<'_, [u8]> = if raw.contains(&b'%') {
        let mut out = Vec::with_capacity(raw.len());
        let mut i = 0;
        while i < raw.len() {
            if raw[i] == b'%' {
                let hi = raw.get(i + 1).copied().and_then(hex);
                let lo = raw.get(i + 2).copied().and_then(hex);
                match (hi, lo) {
                    (Some(h), Some(l)) => out.push(h << 4 | l),
                    _ => return Err(KeyError::BadEncoding),
                }
                i += 3;
            } else {
                out.push(raw[i]);
                i += 1;
            }
        }
        Cow::Owned(out)
    } else {
        Cow::Borrowed(raw)
    };
    match key.len() {
        0 => Err(KeyError::Empty),
        n if n > MAX_KEY_LEN => Err(KeyError::TooLong),
        _ => Ok(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_paths() {
        assert_eq!(&*decode_key("/foo").unwrap(), b"foo");
        assert_eq!(&*decode_key("/a/b/c.jpg").unwrap(), b"a/b/c.jpg");
        assert_eq!(&*decode_key("/with%20space").unwrap(), b"with space");
        assert_eq!(&*decode_key("/%C3%A9t%c3%a9").unwrap(), "été".as_bytes());
        assert_eq!(&*decode_key("/%00").unwrap(), b"\0");
        assert_eq!(decode_key("/"), Err(KeyError::Empty));
        assert_eq!(decode_key(""), Err(KeyError::Empty));
        assert_eq!(decode_key("/%zz"), Err(KeyError::BadEncoding));
        assert_eq!(decode_key("/abc%4"), Err(KeyError::BadEncoding));
        assert_eq!(decode_key("/abc%"), Err(KeyError::BadEncoding));
        let long = format!("/{}", "k".repeat(1024));
        assert_eq!(decode_key(&long).unwrap().len(), 1024);
        assert_eq!(decode_key(&format!("{long}k")), Err(KeyError::TooLong));
        // Length counts decoded bytes: 1024 encoded bytes decode to 1024/3 or so.
        let enc = format!("/{}", "%41".repeat(1024));
        assert_eq!(decode_key(&enc).unwrap().len(), 1024);
    }
}
