//! What a request is, whichever encoding brought it, and what it comes to.

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

/// A get's keys: a binary get's one (no allocation), or a text get's list.
#[derive(Debug, PartialEq, Eq)]
pub enum Keys<'a> {
    One(&'a [u8]),
    Many(Vec<&'a [u8]>),
}

impl<'a> Keys<'a> {
    #[inline]
    pub fn as_slice(&self) -> &[&'a [u8]] {
        match self {
            Keys::One(k) => std::slice::from_ref(k),
            Keys::Many(ks) => ks,
        }
    }
}

/// A request, whichever encoding brought it.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets` (`cas`), `gat`/`gats` (`touch`: the expiry to set); binary get, getk,
    /// gat and their quiet forms (one key).
    Get {
        keys: Keys<'a>,
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
    /// The key a request names first (a meta command's first word), for a slow request's trace.
    pub fn key(&self) -> &[u8] {
        match self {
            Request::Get { keys, .. } => keys.as_slice().first().copied().unwrap_or(b""),
            Request::Store { key, .. }
            | Request::Delete { key, .. }
            | Request::Arith { key, .. }
            | Request::Touch { key, .. } => key,
            Request::Meta { words, .. } => words.first().copied().unwrap_or(b""),
            _ => b"",
        }
    }

    /// The name the request is counted under (`counters::COMMANDS`).
    #[inline]
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
