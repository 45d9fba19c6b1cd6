//! memcached's text protocol, read as memcached 1.6 reads it (its proto_text.c and
//! protocol.txt): a command line split on spaces, dispatched by its first word and its number
//! of words, numbers read with the C library's rules, quirks included, so that a client sees
//! the answers it would get from memcached. Pure: a line in, a command or an error line out.

/// Longest key, in bytes.
pub const KEY_MAX: usize = 250;
/// A command line not ended within this many bytes closes the connection, unless it is a
/// get of many keys.
pub const LINE_MAX: usize = 2048;
/// memcached splits at most this many words at once (the rest of a get's keys are read on).
const MAX_TOKENS: usize = 24;
/// Longest relative expiry, in seconds (30 days); larger values are Unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// The storage commands, which a data block follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// A parsed command.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`/`gets` (`cas`), and `gat`/`gats` (`touch`: the expiry to set).
    Get {
        keys: Vec<&'a [u8]>,
        cas: bool,
        touch: Option<i64>,
    },
    /// A storage command; `len` bytes of data and `\r\n` follow the line.
    Store {
        op: StoreOp,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        len: i64,
        cas: u64,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    /// `incr` (`incr: true`) or `decr`.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    /// `flush_all [delay]`: `delay` ≤ 0 flushes now.
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    /// `stats` and its argument words.
    Stats(Vec<&'a [u8]>),
    /// An operator command other than `stats` (`operator::NAMES`), by its words.
    Operator(Vec<&'a [u8]>),
    Quit,
    /// `mn`: the end of a batch of meta commands.
    MetaNoop,
    /// A meta command (`mg`, `ms`, `md`, `ma`, `me`: the letter after `m`) and its words.
    Meta {
        cmd: u8,
        words: Vec<&'a [u8]>,
    },
}

impl Command<'_> {
    /// The name the command is counted under (`exec::COMMANDS`).
    pub fn name(&self) -> &'static [u8] {
        match self {
            Command::Get { cas: false, touch: None, .. } => b"get",
            Command::Get { cas: true, touch: None, .. } => b"gets",
            Command::Get { cas: false, touch: Some(_), .. } => b"gat",
            Command::Get { cas: true, touch: Some(_), .. } => b"gats",
            Command::Store { op, .. } => match op {
                StoreOp::Set => b"set",
                StoreOp::Add => b"add",
                StoreOp::Replace => b"replace",
                StoreOp::Append => b"append",
                StoreOp::Prepend => b"prepend",
                StoreOp::Cas => b"cas",
            },
            Command::Delete { .. } => b"delete",
            Command::Arith { incr: true, .. } => b"incr",
            Command::Arith { incr: false, .. } => b"decr",
            Command::Touch { .. } => b"touch",
            Command::FlushAll { .. } => b"flush_all",
            Command::Version => b"version",
            Command::Verbosity { .. } => b"verbosity",
            Command::Stats(_) => b"stats",
            Command::Operator(_) => b"other",
            Command::Quit => b"quit",
            Command::MetaNoop => b"mn",
            Command::Meta { cmd, .. } => match cmd {
                b'g' => b"mg",
                b's' => b"ms",
                b'd' => b"md",
                b'a' => b"ma",
                _ => b"me",
            },
        }
    }
}

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<'a> {
    Command(Command<'a>),
    /// Answer this line (unless `noreply`), and nothing else: the command is not run.
    Error {
        line: &'static str,
        noreply: bool,
    },
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
            return parse_get(cmd, &words, more);
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
                    (false, Some(exptime)) => Parsed::Command(Command::Touch { key: words[1], exptime, noreply: nr }),
                }
            }
        },
        b"flush_all" => match want((2..=4).contains(&n) && more.is_none()) {
            Some(e) => e,
            None => {
                let nr = noreply(&words);
                let delay = if n == (if nr { 3 } else { 2 }) { Some(0) } else { safe_strtol(words[1]) };
                match delay {
                    Some(delay) => Parsed::Command(Command::FlushAll { delay, noreply: nr }),
                    None => Parsed::Error { line: "CLIENT_ERROR invalid exptime argument", noreply: nr },
                }
            }
        },
        b"version" => Parsed::Command(Command::Version),
        b"quit" => Parsed::Command(Command::Quit),
        b"verbosity" => match want((n == 3 || n == 4) && more.is_none()) {
            Some(e) => e,
            None => match safe_strtoul(words[1]) {
                Some(_) => Parsed::Command(Command::Verbosity { noreply: noreply(&words) }),
                None => Parsed::Error { line: BAD_FORMAT, noreply: noreply(&words) },
            },
        },
        b"stats" => Parsed::Command(Command::Stats(words[1..].to_vec())),
        name if super::operator::NAMES.iter().any(|n| n.as_bytes() == name) && more.is_none() => {
            Parsed::Command(Command::Operator(words.clone()))
        }
        b"mn" => Parsed::Command(Command::MetaNoop),
        [b'm', c @ (b'g' | b's' | b'd' | b'a' | b'e')] => {
            Parsed::Command(Command::Meta { cmd: *c, words: words.clone() })
        }
        [b'm', _] => err(ERROR),
        _ if words.last().is_some_and(|w| w.starts_with(b"HTTP/")) => Parsed::Close,
        _ => err(ERROR),
    };
    parsed
}

fn parse_get<'a>(cmd: &[u8], words: &[&'a [u8]], mut more: Option<&'a [u8]>) -> Parsed<'a> {
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
    let mut keys: Vec<&[u8]> = words[first..].to_vec();
    // The rest of a long line, split on as memcached reads it on.
    while let Some(rest) = more {
        let (w, m) = tokenize(rest);
        keys.extend(w);
        more = m;
    }
    if keys.iter().any(|k| k.len() > KEY_MAX) {
        return Parsed::Error { line: BAD_FORMAT, noreply: false };
    }
    Parsed::Command(Command::Get { keys, cas, touch })
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
    Parsed::Command(Command::Store { op, key: words[1], flags, exptime, len, cas, noreply: nr })
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
    Parsed::Command(Command::Delete { key: words[1], noreply: nr })
}

fn parse_arith<'a>(incr: bool, words: &[&'a [u8]]) -> Parsed<'a> {
    let nr = noreply(words);
    if words[1].len() > KEY_MAX {
        return Parsed::Error { line: BAD_FORMAT, noreply: nr };
    }
    match safe_strtoull(words[2]) {
        Some(delta) => Parsed::Command(Command::Arith { incr, key: words[1], delta, noreply: nr }),
        None => Parsed::Error { line: "CLIENT_ERROR invalid numeric delta argument", noreply: nr },
    }
}

/// The answer to `incr`/`decr` on a stored `value`: the new number, and the bytes to store (as
/// memcached, which rewrites a number in place when it is no longer, padded with spaces to the
/// old length); `None` when the value is not a number.
pub fn apply_delta(value: &[u8], incr: bool, delta: u64) -> Option<(u64, Vec<u8>)> {
    if value.is_empty() {
        return None;
    }
    // memcached reads the number from the item's data, which its `\r\n` ends.
    let mut data = value.to_vec();
    data.extend_from_slice(b"\r\n");
    let n = safe_strtoull(&data)?;
    let n = if incr { n.wrapping_add(delta) } else { n.saturating_sub(delta) };
    let mut out = n.to_string().into_bytes();
    if out.len() <= value.len() {
        out.resize(value.len(), b' ');
    }
    Some((n, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(line: &str) -> Command<'_> {
        match parse(line.as_bytes()) {
            Parsed::Command(c) => c,
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

    #[test]
    fn commands_and_their_errors() {
        assert_eq!(cmd("get a b"), Command::Get { keys: vec![b"a", b"b"], cas: false, touch: None });
        assert_eq!(cmd("gats 10 a"), Command::Get { keys: vec![b"a"], cas: true, touch: Some(10) });
        assert_eq!(
            cmd("set k 5 -1 3 noreply"),
            Command::Store { op: StoreOp::Set, key: b"k", flags: 5, exptime: -1, len: 3, cas: 0, noreply: true }
        );
        assert_eq!(error("set k 0 0"), "ERROR");
        assert_eq!(error("set k x 0 1"), BAD_FORMAT);
        assert_eq!(error("set k 0 0 -1"), BAD_FORMAT);
        assert_eq!(error("incr k x"), "CLIENT_ERROR invalid numeric delta argument");
        assert_eq!(error("delete k 5"), "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]");
        assert_eq!(cmd("delete k 0 noreply"), Command::Delete { key: b"k", noreply: true });
        assert_eq!(error("x"), "ERROR");
        assert_eq!(parse(b"verbosity noreply"), Parsed::Error { line: BAD_FORMAT, noreply: true });
        assert_eq!(error("flush_all x"), "CLIENT_ERROR invalid exptime argument");
        assert_eq!(parse(b"GET / HTTP/1.1"), Parsed::Close);
        let long = format!("get {}", "k".repeat(251));
        assert_eq!(error(&long), BAD_FORMAT);
        let many: String = (0..100).map(|i| format!(" k{i}")).collect();
        match cmd(&format!("get{many}")) {
            Command::Get { keys, .. } => assert_eq!(keys.len(), 100),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn incr_and_decr_as_memcached_store_them() {
        assert_eq!(apply_delta(b"10", false, 1), Some((9, b"9 ".to_vec())));
        assert_eq!(apply_delta(b"99", true, 1), Some((100, b"100".to_vec())));
        assert_eq!(apply_delta(b"5", false, 9), Some((0, b"0".to_vec())));
        assert_eq!(apply_delta(b"18446744073709551615", true, 2), Some((1, b"1                   ".to_vec())));
        assert_eq!(apply_delta(b"12 34", true, 1), Some((13, b"13   ".to_vec())));
        assert_eq!(apply_delta(b"x", true, 1), None);
        assert_eq!(apply_delta(b"", true, 1), None);
    }
}
