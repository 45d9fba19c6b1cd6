//! Content-addressed keys (`StoreConfig::verify_cas`): a key whose last segment is a SHA-256
//! in hex, right after a segment `cas` (`cas/<sha256>`, `<prefix>/cas/<sha256>`: Bazel's and
//! bazel-remote's layout), takes only a value whose SHA-256 it is. Checked in the engine, on
//! every write of a value (a put, a streamed value, memcached's append and incr), so that no
//! door can store bytes a build would trust for the wrong content.

use crate::{Error, ErrorKind, Result};
use sha2::{Digest, Sha256};

/// The digest a content-addressed key names; `None` for any other key.
pub(crate) fn named_digest(key: &[u8]) -> Option<[u8; 32]> {
    let mut segments = key.rsplit(|&b| b == b'/');
    let last = segments.next()?;
    if segments.next()? != b"cas" || last.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    for (o, pair) in out.iter_mut().zip(last.chunks_exact(2)) {
        *o = (hex(pair[0])? << 4) | hex(pair[1])?;
    }
    Some(out)
}

/// The hash of a value as it is written, against the digest its key names.
pub(crate) struct Check {
    want: [u8; 32],
    hasher: Sha256,
}

impl Check {
    /// A check for a write of `key`, when `verify` is on and the key is content-addressed.
    pub(crate) fn of(verify: bool, key: &[u8]) -> Option<Check> {
        let want = named_digest(key).filter(|_| verify)?;
        Some(Check { want, hasher: Sha256::new() })
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    /// Whether the value hashed to its key: the refusal (a client error) if not.
    pub(crate) fn verdict(self) -> Result<()> {
        let got: [u8; 32] = self.hasher.finalize().into();
        if got == self.want {
            return Ok(());
        }
        let hexed: String = got.iter().map(|b| format!("{b:02x}")).collect();
        Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "the value's SHA-256 is {hexed}, not the digest its key names (content-addressed keys are verified)"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn names_a_digest_only_after_a_cas_segment() {
        assert!(named_digest(format!("cas/{EMPTY}").as_bytes()).is_some());
        assert!(named_digest(format!("bazel/cas/{EMPTY}").as_bytes()).is_some());
        assert!(named_digest(format!("cas/{}", EMPTY.to_uppercase()).as_bytes()).is_some());
        assert!(named_digest(format!("ac/{EMPTY}").as_bytes()).is_none(), "action results are not content");
        assert!(named_digest(format!("xcas/{EMPTY}").as_bytes()).is_none());
        assert!(named_digest(EMPTY.as_bytes()).is_none());
        assert!(named_digest(format!("cas/{}", &EMPTY[1..]).as_bytes()).is_none());
        assert!(named_digest(format!("cas/{}g", &EMPTY[1..]).as_bytes()).is_none());
        assert!(named_digest(format!("cas/{EMPTY}/x").as_bytes()).is_none());
    }

    #[test]
    fn the_verdict_compares_the_whole_value() {
        let key = format!("cas/{EMPTY}");
        assert!(Check::of(false, key.as_bytes()).is_none(), "off unless asked for");
        Check::of(true, key.as_bytes()).unwrap().verdict().unwrap();
        let mut c = Check::of(true, key.as_bytes()).unwrap();
        c.update(b"x");
        assert_eq!(c.verdict().unwrap_err().kind(), ErrorKind::Invalid);
    }
}
