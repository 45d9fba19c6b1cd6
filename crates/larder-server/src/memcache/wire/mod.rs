//! memcached's three encodings, pure: bytes in, a [`Request`] out; an [`Answer`] in, bytes
//! out. No socket, no store. Text, meta and binary decode into one request type where they
//! mean the same command (a binary `getk` and a text `get` are both a [`Request::Get`]), so
//! that the command table above runs each command once, whichever encoding brought it.
//!
//! - `text.rs`: the text protocol's command lines, read as memcached 1.6 reads them, and its
//!   answer lines.
//! - `meta.rs`: the meta commands' flags, and the flags their answers echo.
//! - `binary.rs`: the binary protocol's packets, and its answers.

pub mod binary;
pub mod meta;
pub mod text;

use crate::guard::Refusal;
use bytes::Bytes;

/// Longest key, in bytes.
pub const KEY_MAX: usize = 250;
/// Longest relative expiry, in seconds (30 days); larger values are Unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;
/// What memcached's metadump and log stream leave unencoded in a key: RFC 3986's unreserved
/// characters.
pub const URI_ENCODE: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The storage commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// A storage command's data: a text data block that follows the line (`len` bytes and
/// `\r\n`), or a binary request's value, read with its packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Data {
    Follows(u64),
    Here(Bytes),
}

/// A request, whichever encoding brought it.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets` (`cas`), `gat`/`gats` (`touch`: the expiry to set); binary get, getk,
    /// gat and their quiet forms (one key).
    Get {
        keys: Vec<&'a [u8]>,
        cas: bool,
        touch: Option<i64>,
    },
    /// A storage command. `cas`: the value must be that version (text `cas`; a binary
    /// request's cas field when not 0).
    Store {
        op: StoreOp,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        cas: Option<u64>,
        data: Data,
    },
    Delete {
        key: &'a [u8],
        cas: Option<u64>,
    },
    /// `incr` (`incr: true`) or `decr`; `create`: the initial value and expiry a missing key
    /// is made with (binary).
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        cas: Option<u64>,
        create: Option<(u64, i64)>,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
    },
    /// `flush_all [delay]`: `delay` ≤ 0 flushes now; beyond 30 days, a Unix time.
    FlushAll {
        delay: i64,
    },
    Version,
    Verbosity,
    /// `stats` and its argument words (binary: the group, if any).
    Stats(Vec<&'a [u8]>),
    /// An operator command other than `stats` (`text::OPERATOR`), by its words.
    Operator(Vec<&'a [u8]>),
    Quit,
    /// `mn`: the end of a batch of meta commands.
    MetaNoop,
    /// Binary `noop`: the end of a batch of quiet requests.
    Noop,
    /// A meta command (`mg`, `ms`, `md`, `ma`, `me`: the letter after `m`) and its words.
    Meta {
        cmd: u8,
        words: Vec<&'a [u8]>,
    },
    /// SASL (binary): `list` the mechanisms, or a `start` or `step` of one.
    Sasl {
        opcode: u8,
        mechanism: &'a [u8],
        data: &'a [u8],
    },
    /// A binary opcode larder does not answer.
    Unknown,
}

impl Request<'_> {
    /// The name the request is counted under (`counters::COMMANDS`).
    pub fn name(&self) -> &'static [u8] {
        match self {
            Request::Get { cas: false, touch: None, .. } => b"get",
            Request::Get { cas: true, touch: None, .. } => b"gets",
            Request::Get { cas: false, touch: Some(_), .. } => b"gat",
            Request::Get { cas: true, touch: Some(_), .. } => b"gats",
            Request::Store { op, .. } => match op {
                StoreOp::Set => b"set",
                StoreOp::Add => b"add",
                StoreOp::Replace => b"replace",
                StoreOp::Append => b"append",
                StoreOp::Prepend => b"prepend",
                StoreOp::Cas => b"cas",
            },
            Request::Delete { .. } => b"delete",
            Request::Arith { incr: true, .. } => b"incr",
            Request::Arith { incr: false, .. } => b"decr",
            Request::Touch { .. } => b"touch",
            Request::FlushAll { .. } => b"flush_all",
            Request::Version => b"version",
            Request::Verbosity => b"verbosity",
            Request::Stats(_) => b"stats",
            Request::Operator(_) | Request::Unknown => b"other",
            Request::Quit => b"quit",
            Request::MetaNoop => b"mn",
            Request::Noop => b"noop",
            Request::Meta { cmd, .. } => match cmd {
                b'g' => b"mg",
                b's' => b"ms",
                b'd' => b"md",
                b'a' => b"ma",
                _ => b"me",
            },
            Request::Sasl { .. } => b"auth",
        }
    }
}

/// How a request is answered: in text (silent with `noreply`), or in binary (the header's
/// opcode and opaque echoed; quiet forms silent on success).
#[derive(Clone, Copy)]
pub enum Reply {
    Text { noreply: bool },
    Binary(binary::Header),
}

impl Reply {
    pub fn binary(&self) -> bool {
        matches!(self, Reply::Binary(_))
    }
}

/// What a command came to, before it is rendered in the request's encoding. A get's values
/// are rendered apart (`text::value_line`, `binary::value_head`): they may be streamed.
#[derive(Debug)]
pub enum Answer {
    /// Stored, under this cas unique.
    Stored {
        cas: u64,
    },
    /// A condition of the write did not hold (add of a present key, replace or append of an
    /// absent one).
    NotStored,
    /// The key's value is another version than the one named.
    Exists,
    NotFound,
    Deleted,
    /// Touched: the value's cas unique and client flags.
    Touched {
        cas: u64,
        flags: u32,
    },
    /// incr or decr: the new number and cas unique.
    Number {
        n: u64,
        cas: u64,
    },
    NonNumeric,
    TooLarge,
    /// A data block that does not end with `\r\n`.
    BadChunk,
    Ok,
    /// `mn` or binary `noop` answered.
    Noop,
    Version(String),
    /// `quit`: the connection closes (binary `quit` is answered first).
    Bye,
    /// SASL succeeded, with this answer; or failed.
    Authenticated(&'static [u8]),
    AuthFailed,
    /// Refused by the policy.
    Refused(Refusal),
    /// The store is still recovering.
    NotReady,
    /// A binary request whose parts do not fit its command.
    Invalid,
    /// A binary opcode larder does not answer.
    Unknown,
    /// The store failed; the client's error (a value `--verify-cas` refuses) or the server's.
    Failed {
        client: bool,
        message: String,
    },
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// C's `strtoull(s, &end, 10)`: the value (negated modulo 2^64 after a `-`), the index of
/// `end`, and whether it overflowed (`ERANGE`).
fn strtoull(s: &[u8]) -> (u64, usize, bool) {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits = i;
    let (mut v, mut over) = (0u64, false);
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        match v.checked_mul(10).and_then(|v| v.checked_add((d - b'0') as u64)) {
            Some(n) => v = n,
            None => over = true,
        }
        i += 1;
    }
    if i == digits {
        return (0, 0, false); // no digits: nothing consumed
    }
    if over {
        return (u64::MAX, i, true);
    }
    (if neg { v.wrapping_neg() } else { v }, i, false)
}

/// C's `strtoll(s, &end, 10)`, as [`strtoull`].
fn strtoll(s: &[u8]) -> (i64, usize, bool) {
    let (mut i, mut neg) = (0, false);
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    if let Some(&c @ (b'-' | b'+')) = s.get(i) {
        neg = c == b'-';
        i += 1;
    }
    let digits = i;
    let (mut v, mut over) = (0i128, false);
    while let Some(d) = s.get(i).filter(|b| b.is_ascii_digit()) {
        v = v * 10 + (d - b'0') as i128;
        over |= v > i64::MAX as i128 + 1;
        i += 1;
    }
    if i == digits {
        return (0, 0, false);
    }
    let v = if neg { -v } else { v };
    match i64::try_from(v) {
        Ok(n) if !over => (n, i, false),
        _ => (if neg { i64::MIN } else { i64::MAX }, i, true),
    }
}

/// The end test of memcached's `safe_strto*`: something was read, and what follows is a space
/// or the end.
fn ends_well(s: &[u8], end: usize) -> bool {
    end != 0 && s.get(end).is_none_or(|&b| is_c_space(b))
}

/// memcached's `safe_strtoull`: a 64-bit unsigned number; a `-` anywhere in the word is
/// refused only when the value reads as negative signed.
pub fn safe_strtoull(s: &[u8]) -> Option<u64> {
    let (v, end, over) = strtoull(s);
    if over || !ends_well(s, end) || ((v as i64) < 0 && s.contains(&b'-')) {
        return None;
    }
    Some(v)
}

/// memcached's `safe_strtoul`: as [`safe_strtoull`], kept to its low 32 bits.
pub fn safe_strtoul(s: &[u8]) -> Option<u32> {
    safe_strtoull(s).map(|v| v as u32)
}

/// memcached's `safe_strtol`: a signed number, kept to its low 32 bits (sign-extended).
pub fn safe_strtol(s: &[u8]) -> Option<i64> {
    let (v, end, over) = strtoll(s);
    (!over && ends_well(s, end)).then_some(v as i32 as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_the_c_library_reads_them() {
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        assert_eq!(safe_strtoull(b"-1"), None);
        assert_eq!(safe_strtoull(b"-0"), Some(0));
        assert_eq!(safe_strtoull(b"+7"), Some(7));
        assert_eq!(safe_strtoull(b"7x"), None);
        assert_eq!(safe_strtoull(b""), None);
        assert_eq!(safe_strtoull(b"12\r\n"), Some(12));
        assert_eq!(safe_strtoul(b"4294967296"), Some(0));
        assert_eq!(safe_strtol(b"-5"), Some(-5));
        assert_eq!(safe_strtol(b"4294967297"), Some(1));
        assert_eq!(safe_strtol(b"99999999999999999999"), None);
    }
}
