//! memcached's text protocol, read as memcached 1.6 reads it (its proto_text.c and
//! protocol.txt): a command line split on spaces, dispatched by its first word and its number
//! of words, numbers read with the C library's rules, quirks included, so that a client sees
//! the answers it would get from memcached. Pure: a line in, a command or an error line out.

use super::number::{safe_strtol, safe_strtoul, safe_strtoull};
use super::request::{Answer, Data, Keys, Request, StoreOp, KEY_MAX};
use crate::guard::Refusal;
use bytes::BytesMut;

/// A command line not ended within this many bytes closes the connection, unless it is a
/// get of many keys.
pub const LINE_MAX: usize = 2048;
/// memcached splits at most this many words at once (the rest of a get's keys are read on).
const MAX_TOKENS: usize = 24;
/// The operator commands other than `stats` (answered by `operator.rs`).
pub const OPERATOR: [&str; 9] =
    ["watch", "slabs", "lru_crawler", "lru", "shutdown", "cache_memlimit", "misbehave", "debugtime", "extstore"];

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// A request, and whether it ends in `noreply`.
    Command(Request<'a>, bool),
    /// Answer this line (unless `noreply`), and nothing else: the command is not run.
    Error { line: &'static str, noreply: bool },
    /// Close the connection without an answer (an HTTP request on the memcached port).
    Close,
}

const ERROR: &str = "ERROR";
const BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";

/// The words of `line` as memcached splits them: on spaces only (runs of them count as one),
/// at most [`MAX_TOKENS`] - 1 words, and whether more followed.
fn tokenize(line: &[u8]) -> (Vec<&[u8]>, Option<&[u8]>) {
    let mut words = Vec::new();
    let mut rest = line;
    loop {
        while let [b' ', tail @ ..] = rest {
            rest = tail;
        }
        if rest.is_empty() {
            return (words, None);
        }
        if words.len() == MAX_TOKENS - 1 {
            return (words, Some(rest));
        }
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        words.push(&rest[..end]);
        rest = &rest[end..];
    }
}

/// Whether the last word is `noreply` (memcached's `set_noreply_maybe`).
fn noreply(words: &[&[u8]]) -> bool {
    words.last() == Some(&&b"noreply"[..])
}

/// Parses a command line (without its `\r\n` or `\n`).
pub fn parse(line: &[u8]) -> Parsed<'_> {
    let (words, more) = tokenize(line);
    // memcached counts a final empty token: `ntokens` is words + 1.
    let n = words.len() + 1;
    let err = |line| Parsed::Error { line, noreply: false };
    if words.is_empty() || words[0].len() < 2 {
        return err(ERROR);
    }
    let cmd = words[0];
    let want = |ok: bool| if ok { None } else { Some(err(ERROR)) };
    let store = |op| -> Parsed<'_> {
        let cas = op == StoreOp::Cas;
        let ok = if cas { n == 7 || n == 8 } else { n == 6 || n == 7 };
        if let Some(e) = want(ok && more.is_none()) {
            return e;
        }
        parse_store(op, &words, noreply(&words))
    };
    let parsed = match cmd {
        b"get" | b"gets" | b"bget" | b"gat" | b"gats" => {
            if n < 3 {
                return err(ERROR);
            }
            return parse_get(cmd, words, more);
        }
        b"set" => store(StoreOp::Set),
        b"add" => store(StoreOp::Add),
        b"replace" => store(StoreOp::Replace),
        b"append" => store(StoreOp::Append),
        b"prepend" => store(StoreOp::Prepend),
        b"cas" => store(StoreOp::Cas),
        b"delete" => match want((3..=5).contains(&n) && more.is_none()) {
            Some(e) => e,
            None => parse_delete(&words),
        },
        b"incr" | b"decr" => match want((n == 4 || n == 5) && more.is_none()) {
            Some(e) => e,
            None => parse_arith(cmd == b"incr", &words),
        },
        b"touch" => match want((n == 4 || n == 5) && more.is_none()) {
            Some(e) => e,
            None => {
                let nr = noreply(&words);
                match (words[1].len() > KEY_MAX, safe_strtol(words[2])) {
                    (true, _) => Parsed::Error { line: BAD_FORMAT, noreply: nr },
                    (false, None) => Parsed::Error { line: "CLIENT_ERROR invalid exptime argument", noreply: nr },
                    (false, Some(exptime)) => Parsed::Command(Request::Touch { key: words[1], exptime }, nr),
                }
            }
        },
        b"flush_all" => match want((2..=4).contains(&n) && more.is_none()) {
            Some(e) => e,
            None => {
                let nr = noreply(&words);
                let delay = if n == (if nr { 3 } else { 2 }) { Some(0) } else { safe_strtol(words[1]) };
                match delay {
                    Some(delay) => Parsed::Command(Request::FlushAll { delay }, nr),
                    None => Parsed::Error { line: "CLIENT_ERROR invalid exptime argument", noreply: nr },
                }
            }
        },
        b"version" => Parsed::Command(Request::Version, false),
        b"quit" => Parsed::Command(Request::Quit, false),
        b"verbosity" => match want((n == 3 || n == 4) && more.is_none()) {
            Some(e) => e,
            None => match safe_strtoul(words[1]) {
                Some(_) => Parsed::Command(Request::Verbosity, noreply(&words)),
                None => Parsed::Error { line: BAD_FORMAT, noreply: noreply(&words) },
            },
        },
        b"stats" => Parsed::Command(Request::Stats(words[1..].to_vec()), false),
        name if OPERATOR.iter().any(|n| n.as_bytes() == name) && more.is_none() => {
            Parsed::Command(Request::Operator(words.clone()), false)
        }
        b"mn" => Parsed::Command(Request::MetaNoop, false),
        [b'm', c @ (b'g' | b's' | b'd' | b'a' | b'e')] => {
            Parsed::Command(Request::Meta { cmd: *c, words: words.clone() }, false)
        }
        [b'm', _] => err(ERROR),
        _ if words.last().is_some_and(|w| w.starts_with(b"HTTP/")) => Parsed::Close,
        _ => err(ERROR),
    };
    parsed
}

fn parse_get<'a>(cmd: &[u8], words: Vec<&'a [u8]>, mut more: Option<&'a [u8]>) -> Parsed<'a> {
    let cas = cmd == b"gets" || cmd == b"gats";
    let mut first = 1;
    let touch = if cmd.starts_with(b"gat") {
        match safe_strtol(words[1]) {
            Some(t) => {
                first = 2;
                Some(t)
            }
            None => return Parsed::Error { line: "CLIENT_ERROR invalid exptime argument", noreply: false },
        }
    } else {
        None
    };
    // The words' own list, the command (and expiry) taken off: no second allocation.
    let mut keys = words;
    keys.drain(..first);
    // The rest of a long line, split on as memcached reads it on.
    while let Some(rest) = more {
        let (w, m) = tokenize(rest);
        keys.extend(w);
        more = m;
    }
    if keys.iter().any(|k| k.len() > KEY_MAX) {
        return Parsed::Error { line: BAD_FORMAT, noreply: false };
    }
    Parsed::Command(Request::Get { keys: Keys::Many(keys), cas, touch }, false)
}

fn parse_store<'a>(op: StoreOp, words: &[&'a [u8]], nr: bool) -> Parsed<'a> {
    let bad = Parsed::Error { line: BAD_FORMAT, noreply: nr };
    if words[1].len() > KEY_MAX {
        return bad;
    }
    let (Some(flags), Some(exptime), Some(len)) =
        (safe_strtoul(words[2]), safe_strtol(words[3]), safe_strtol(words[4]))
    else {
        return bad;
    };
    let cas = match op {
        StoreOp::Cas => match safe_strtoull(words[5]) {
            Some(c) => c,
            None => return bad,
        },
        _ => 0,
    };
    // memcached's bound (its length plus the data's `\r\n` must stay below INT_MAX): a
    // longer one is a bad line, answered at once and never read.
    if !(0..=i32::MAX as i64 - 3).contains(&len) {
        return bad;
    }
    let cas = (op == StoreOp::Cas).then_some(cas);
    let data = Data::Follows(len as u64);
    Parsed::Command(Request::Store { op, key: words[1], flags, exptime, cas, data }, nr)
}

fn parse_delete<'a>(words: &[&'a [u8]]) -> Parsed<'a> {
    let n = words.len() + 1;
    let nr = noreply(words);
    if words[1].len() > KEY_MAX {
        return Parsed::Error { line: BAD_FORMAT, noreply: nr };
    }
    if n > 3 {
        let zero = words[2] == b"0";
        if !((n == 4 && (zero || nr)) || (n == 5 && zero && nr)) {
            return Parsed::Error {
                line: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
                noreply: nr,
            };
        }
    }
    Parsed::Command(Request::Delete { key: words[1], cas: None }, nr)
}

fn parse_arith<'a>(incr: bool, words: &[&'a [u8]]) -> Parsed<'a> {
    let nr = noreply(words);
    if words[1].len() > KEY_MAX {
        return Parsed::Error { line: BAD_FORMAT, noreply: nr };
    }
    match safe_strtoull(words[2]) {
        Some(delta) => Parsed::Command(Request::Arith { incr, key: words[1], delta, cas: None, create: None }, nr),
        None => Parsed::Error { line: "CLIENT_ERROR invalid numeric delta argument", noreply: nr },
    }
}

/// An answer as memcached's text protocol writes it.
pub fn render(out: &mut BytesMut, a: &Answer) {
    let line = match a {
        Answer::Stored { .. } => "STORED\r\n",
        Answer::NotStored => "NOT_STORED\r\n",
        Answer::Exists => "EXISTS\r\n",
        Answer::NotFound => "NOT_FOUND\r\n",
        Answer::Deleted => "DELETED\r\n",
        Answer::Touched { .. } => "TOUCHED\r\n",
        Answer::Number { n, .. } => {
            out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes());
            "\r\n"
        }
        Answer::NonNumeric => "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        Answer::TooLarge => "SERVER_ERROR object too large for cache\r\n",
        Answer::BadChunk => "CLIENT_ERROR bad data chunk\r\n",
        Answer::Ok => "OK\r\n",
        Answer::Noop => "MN\r\n",
        Answer::Version(v) => {
            out.extend_from_slice(b"VERSION ");
            out.extend_from_slice(v.as_bytes());
            "\r\n"
        }
        Answer::Bye => "",
        // The `-Y` login: a `set` whose data is the credential.
        Answer::Authenticated(_) => "STORED\r\n",
        Answer::AuthFailed => "CLIENT_ERROR authentication failure\r\n",
        Answer::Refused(Refusal::Unauthenticated | Refusal::BadCredential) => "CLIENT_ERROR unauthenticated\r\n",
        Answer::Refused(Refusal::ReadOnly) => "SERVER_ERROR this server is read-only\r\n",
        Answer::NotReady => "SERVER_ERROR recovering the store; try again shortly\r\n",
        Answer::Invalid => "CLIENT_ERROR bad command line format\r\n",
        Answer::Unknown => "ERROR\r\n",
        Answer::Failed { client, message } => {
            out.extend_from_slice(if *client { b"CLIENT_ERROR " } else { b"SERVER_ERROR " });
            out.extend_from_slice(message.as_bytes());
            "\r\n"
        }
    };
    out.extend_from_slice(line.as_bytes());
}

/// What follows a value's bytes in a get's answer.
pub const VALUE_END: &[u8] = b"\r\n";
/// What ends a get's answer, after its values.
pub const GET_END: &[u8] = b"END\r\n";

/// A get's `VALUE <key> <flags> <bytes> [<cas>]` line, which the value's bytes and `\r\n`
/// follow.
pub fn value_line(out: &mut BytesMut, key: &[u8], flags: u32, len: u64, cas: Option<u64>) {
    // itoa rather than `write!`: this line is built for every value a get answers.
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.extend_from_slice(b" ");
    out.extend_from_slice(n.format(flags).as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(n.format(len).as_bytes());
    if let Some(cas) = cas {
        out.extend_from_slice(b" ");
        out.extend_from_slice(n.format(cas).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(line: &str) -> (Request<'_>, bool) {
        match parse(line.as_bytes()) {
            Parsed::Command(c, noreply) => (c, noreply),
            other => panic!("{line}: {other:?}"),
        }
    }

    fn error(line: &str) -> &'static str {
        match parse(line.as_bytes()) {
            Parsed::Error { line, .. } => line,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn commands_and_their_errors() {
        assert_eq!(
            cmd("get a b"),
            (Request::Get { keys: Keys::Many(vec![b"a", b"b"]), cas: false, touch: None }, false)
        );
        assert_eq!(
            cmd("gats 10 a"),
            (Request::Get { keys: Keys::Many(vec![b"a"]), cas: true, touch: Some(10) }, false)
        );
        assert_eq!(
            cmd("set k 5 -1 3 noreply"),
            (
                Request::Store {
                    op: StoreOp::Set,
                    key: b"k",
                    flags: 5,
                    exptime: -1,
                    cas: None,
                    data: Data::Follows(3)
                },
                true
            )
        );
        assert_eq!(error("set k 0 0"), "ERROR");
        assert_eq!(error("set k x 0 1"), BAD_FORMAT);
        assert_eq!(error("set k 0 0 -1"), BAD_FORMAT);
        assert_eq!(error("incr k x"), "CLIENT_ERROR invalid numeric delta argument");
        assert_eq!(error("delete k 5"), "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]");
        assert_eq!(cmd("delete k 0 noreply"), (Request::Delete { key: b"k", cas: None }, true));
        assert_eq!(cmd("cas k 0 0 1 7").0.name(), b"cas");
        assert!(matches!(cmd("cas k 0 0 1 7").0, Request::Store { cas: Some(7), .. }));
        assert_eq!(error("x"), "ERROR");
        assert_eq!(parse(b"verbosity noreply"), Parsed::Error { line: BAD_FORMAT, noreply: true });
        assert_eq!(error("flush_all x"), "CLIENT_ERROR invalid exptime argument");
        assert_eq!(parse(b"GET / HTTP/1.1"), Parsed::Close);
        let long = format!("get {}", "k".repeat(251));
        assert_eq!(error(&long), BAD_FORMAT);
        let many: String = (0..100).map(|i| format!(" k{i}")).collect();
        match cmd(&format!("get{many}")) {
            (Request::Get { keys, .. }, _) => assert_eq!(keys.as_slice().len(), 100),
            other => panic!("{other:?}"),
        }
    }
}
