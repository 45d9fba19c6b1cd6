//! memcached's binary protocol, for the clients that speak only it (Debian's Ruby Dalli 3.0,
//! libmemcached's tools with `--binary`). Deprecated upstream, but still what those clients
//! send. A connection is binary when its first byte is the request magic (0x80), as
//! memcached's auto-negotiation decides.
//!
//! Each request is a 24-byte header (magic, opcode, key length, extras length, data type,
//! vbucket, body length, opaque, cas; big-endian) and a body of extras, key and value. Every
//! answer echoes the opcode and opaque. Quiet variants answer only failures (and a quiet get
//! not even a miss); `noop` flushes the answers of a batch of them.

use super::request::{Answer, Data, Keys, Request, StoreOp, KEY_MAX};
use crate::guard::Refusal;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The request magic, the first byte of every binary request.
pub const REQUEST: u8 = 0x80;
const RESPONSE: u8 = 0x81;
pub const HEADER: usize = 24;

// Statuses.
const OK: u16 = 0x00;
const NOT_FOUND: u16 = 0x01;
const EXISTS: u16 = 0x02;
const TOO_LARGE: u16 = 0x03;
const INVALID: u16 = 0x04;
const NOT_STORED: u16 = 0x05;
const NON_NUMERIC: u16 = 0x06;
const AUTH_ERROR: u16 = 0x20;
const UNKNOWN: u16 = 0x81;
const SERVER: u16 = 0x84;

/// memcached's text for each status.
fn status_text(status: u16) -> &'static [u8] {
    match status {
        NOT_FOUND => b"Not found",
        EXISTS => b"Data exists for key.",
        TOO_LARGE => b"Too large.",
        INVALID => b"Invalid arguments",
        NOT_STORED => b"Not stored.",
        NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        UNKNOWN => b"Unknown command",
        _ => b"Internal error",
    }
}

/// A request's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u8,
    pub key_len: usize,
    pub extras_len: usize,
    pub body_len: usize,
    pub opaque: u32,
    pub cas: u64,
}

impl Header {
    /// The header at the start of `b` (at least [`HEADER`] bytes); `None` when it is not a
    /// request's (memcached closes a connection that stops making sense).
    pub fn parse(mut b: &[u8]) -> Option<Header> {
        if b.get_u8() != REQUEST {
            return None;
        }
        let opcode = b.get_u8();
        let key_len = b.get_u16() as usize;
        let extras_len = b.get_u8() as usize;
        let _data_type = b.get_u8();
        let _vbucket = b.get_u16();
        let body_len = b.get_u32() as usize;
        let opaque = b.get_u32();
        let cas = b.get_u64();
        Some(Header { opcode, key_len, extras_len, body_len, opaque, cas })
    }

    /// The value's length, if the body holds the extras and key it declares.
    pub fn value_len(&self) -> Option<usize> {
        self.body_len.checked_sub(self.key_len + self.extras_len)
    }

    /// A quiet form: answered only when it fails (a quiet get: only when it finds its key).
    pub fn quiet(&self) -> bool {
        matches!(self.opcode, 0x09 | 0x0d | 0x11..=0x1a | 0x1e | 0x24)
    }

    /// A get that names its key in the answer (getk, gatk and their quiet forms).
    pub fn with_key(&self) -> bool {
        matches!(self.opcode, 0x0c | 0x0d | 0x23 | 0x24)
    }

    /// A set (not add or replace), whose refusal as too large drops the key's old value.
    pub fn is_set(&self) -> bool {
        matches!(self.opcode, 0x01 | 0x11)
    }
}

/// The text command a binary opcode is counted as, so both protocols reach the same counters
/// (a request refused before its body is read is counted under it).
pub fn command_name(opcode: u8) -> &'static [u8] {
    match opcode {
        0x00 | 0x09 | 0x0c | 0x0d => b"get",
        0x1d | 0x1e | 0x23 | 0x24 => b"gat",
        0x01 | 0x11 => b"set",
        0x02 | 0x12 => b"add",
        0x03 | 0x13 => b"replace",
        0x04 | 0x14 => b"delete",
        0x05 | 0x15 => b"incr",
        0x06 | 0x16 => b"decr",
        0x07 | 0x17 => b"quit",
        0x08 | 0x18 => b"flush_all",
        0x0a => b"noop",
        0x0b => b"version",
        0x0e | 0x19 => b"append",
        0x0f | 0x1a => b"prepend",
        0x10 => b"stats",
        0x1c => b"touch",
        0x20..=0x22 => b"auth",
        _ => b"other",
    }
}

/// A request's body (extras, key, value) read as its opcode's command; `None` when its parts
/// do not fit the command (memcached answers "Invalid arguments").
pub fn decode<'a>(h: &Header, body: &'a Bytes) -> Option<Request<'a>> {
    let extras = &body[..h.extras_len];
    let key = &body[h.extras_len..h.extras_len + h.key_len];
    let value = body.slice(h.extras_len + h.key_len..);
    let cas = (h.cas != 0).then_some(h.cas);
    let (e, k, v) = (extras.len(), !key.is_empty(), !value.is_empty());
    if key.len() > KEY_MAX {
        return None;
    }
    let mut x = extras;
    // A get is counted as `get` (not `gets`), though its answer always carries the cas.
    Some(match h.opcode {
        // get, getq, getk, getkq
        0x00 | 0x09 | 0x0c | 0x0d if e == 0 && k && !v => {
            Request::Get { keys: Keys::One(key), cas: false, touch: None }
        }
        // gat, gatq, gatk, gatkq
        0x1d | 0x1e | 0x23 | 0x24 if e == 4 && k && !v => {
            Request::Get { keys: Keys::One(key), cas: false, touch: Some(x.get_u32() as i64) }
        }
        // set, add, replace and their quiet forms
        0x01..=0x03 | 0x11..=0x13 if e == 8 && k => {
            let op = match h.opcode & 0x0f {
                0x01 => StoreOp::Set,
                0x02 => StoreOp::Add,
                _ => StoreOp::Replace,
            };
            let (flags, exptime) = (x.get_u32(), x.get_u32() as i64);
            Request::Store { op, key, flags, exptime, cas, data: Data::Here(value) }
        }
        // append, prepend and their quiet forms
        0x0e | 0x0f | 0x19 | 0x1a if e == 0 && k => {
            let op = if matches!(h.opcode, 0x0e | 0x19) { StoreOp::Append } else { StoreOp::Prepend };
            Request::Store { op, key, flags: 0, exptime: 0, cas, data: Data::Here(value) }
        }
        0x04 | 0x14 if e == 0 && k && !v => Request::Delete { key, cas },
        // increment, decrement and their quiet forms: a missing key is made with the initial
        // value, unless the expiration is all ones.
        0x05 | 0x06 | 0x15 | 0x16 if e == 20 && k && !v => {
            let (delta, initial, exp) = (x.get_u64(), x.get_u64(), x.get_u32());
            let create = (exp != u32::MAX).then_some((initial, exp as i64));
            Request::Arith { incr: h.opcode & 0x0f == 0x05, key, delta, cas, create }
        }
        0x07 | 0x17 => Request::Quit,
        0x08 | 0x18 if (e == 0 || e == 4) && !k && !v => {
            Request::FlushAll { delay: if e == 4 { x.get_u32() as i64 } else { 0 } }
        }
        0x0a => Request::Noop,
        0x0b => Request::Version,
        0x10 => Request::Stats(if k { vec![key] } else { vec![] }),
        0x1c if e == 4 && k && !v => Request::Touch { key, exptime: x.get_u32() as i64 },
        0x20..=0x22 => Request::Sasl { opcode: h.opcode, mechanism: key, data: &body[h.extras_len + h.key_len..] },
        // A command larder answers, whose parts do not fit it.
        0x00..=0x06 | 0x08 | 0x09 | 0x0c..=0x0f | 0x11..=0x16 | 0x18..=0x1a | 0x1c..=0x1e | 0x23 | 0x24 => return None,
        _ => Request::Unknown,
    })
}

/// Appends an answer: header, extras, key, value.
pub fn answer(out: &mut BytesMut, h: &Header, status: u16, cas: u64, extras: &[u8], key: &[u8], value: &[u8]) {
    head(out, h, status, cas, extras.len(), key.len(), value.len());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// An answer's header, for a body of `extras`, `key` and `value` bytes.
fn head(out: &mut BytesMut, h: &Header, status: u16, cas: u64, extras: usize, key: usize, value: usize) {
    out.put_u8(RESPONSE);
    out.put_u8(h.opcode);
    out.put_u16(key as u16);
    out.put_u8(extras as u8);
    out.put_u8(0);
    out.put_u16(status);
    out.put_u32((extras + key + value) as u32);
    out.put_u32(h.opaque);
    out.put_u64(cas);
}

fn error(out: &mut BytesMut, h: &Header, status: u16) {
    answer(out, h, status, 0, &[], &[], status_text(status));
}

/// A get's hit: the header, the flags and (for getk) the key, which the value's `len` bytes
/// follow.
pub fn value_head(out: &mut BytesMut, h: &Header, key: &[u8], flags: u32, len: u64, cas: u64) {
    let key: &[u8] = if h.with_key() { key } else { &[] };
    head(out, h, OK, cas, 4, key.len(), len as usize);
    out.put_u32(flags);
    out.extend_from_slice(key);
}

/// A get's miss: nothing for a quiet get; the key when it was asked for, else "Not found".
pub fn miss(out: &mut BytesMut, h: &Header, key: &[u8]) {
    match (h.quiet(), h.with_key()) {
        (true, _) => {}
        (false, true) => answer(out, h, NOT_FOUND, 0, &[], key, &[]),
        (false, false) => error(out, h, NOT_FOUND),
    }
}

/// `stat`: one packet per `STAT <name> <value>` line of the text answer, then an empty one.
pub fn stats(out: &mut BytesMut, h: &Header, text: &str) {
    for line in text.split("\r\n") {
        let Some(rest) = line.strip_prefix("STAT ") else { continue };
        let (name, val) = rest.split_once(' ').unwrap_or((rest, ""));
        answer(out, h, OK, 0, &[], name.as_bytes(), val.as_bytes());
    }
    answer(out, h, OK, 0, &[], &[], &[]);
}

/// An answer as the binary protocol writes it; a quiet form's success writes nothing.
pub fn render(out: &mut BytesMut, h: &Header, a: &Answer) {
    let ok = |out: &mut BytesMut, cas: u64, extras: &[u8], value: &[u8]| {
        if !h.quiet() {
            answer(out, h, OK, cas, extras, &[], value);
        }
    };
    match a {
        Answer::Stored { cas } => ok(out, *cas, &[], &[]),
        Answer::Deleted | Answer::Ok | Answer::Noop | Answer::Bye => ok(out, 0, &[], &[]),
        // As memcached, a touch answers the item's flags (but not its value).
        Answer::Touched { cas, flags } => ok(out, *cas, &flags.to_be_bytes(), &[]),
        Answer::Number { n, cas } => ok(out, *cas, &[], &n.to_be_bytes()),
        Answer::Version(v) => ok(out, 0, &[], v.as_bytes()),
        Answer::Authenticated(said) => answer(out, h, OK, 0, &[], &[], said),
        Answer::AuthFailed | Answer::Refused(Refusal::Unauthenticated | Refusal::BadCredential) => {
            answer(out, h, AUTH_ERROR, 0, &[], &[], b"Auth failure.")
        }
        Answer::Refused(Refusal::ReadOnly) => answer(out, h, SERVER, 0, &[], &[], b"this server is read-only"),
        Answer::NotStored => error(out, h, NOT_STORED),
        Answer::Exists => error(out, h, EXISTS),
        Answer::NotFound => error(out, h, NOT_FOUND),
        Answer::NonNumeric => error(out, h, NON_NUMERIC),
        Answer::TooLarge => error(out, h, TOO_LARGE),
        Answer::Invalid | Answer::BadChunk | Answer::Failed { client: true, .. } => error(out, h, INVALID),
        Answer::Unknown => error(out, h, UNKNOWN),
        Answer::NotReady | Answer::Failed { client: false, .. } => error(out, h, SERVER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> (Header, Bytes) {
        let body = Bytes::from([extras, key, value].concat());
        let h =
            Header { opcode, key_len: key.len(), extras_len: extras.len(), body_len: body.len(), opaque: 7, cas: 0 };
        (h, body)
    }

    #[test]
    fn requests_decode_into_the_text_protocols_commands() {
        let (h, body) = header(0x0c, b"k", &[], &[]);
        assert_eq!(decode(&h, &body), Some(Request::Get { keys: Keys::One(b"k"), cas: false, touch: None }));
        assert!(h.with_key() && !h.quiet());
        let (h, body) = header(0x11, b"k", &[0, 0, 0, 5, 0, 0, 0, 9], b"v");
        let want = Request::Store {
            op: StoreOp::Set,
            key: b"k",
            flags: 5,
            exptime: 9,
            cas: None,
            data: Data::Here(Bytes::from_static(b"v")),
        };
        assert_eq!(decode(&h, &body), Some(want));
        assert!(h.quiet() && h.is_set());
        let mut extras = [0u8; 20];
        extras[7] = 3;
        extras[15] = 10;
        extras[16..].copy_from_slice(&u32::MAX.to_be_bytes());
        let (h, body) = header(0x05, b"n", &extras, &[]);
        assert_eq!(
            decode(&h, &body),
            Some(Request::Arith { incr: true, key: b"n", delta: 3, cas: None, create: None })
        );
        // A get with extras, a delete with a value: the parts do not fit the command.
        let (h, body) = header(0x00, b"k", &[0; 4], &[]);
        assert_eq!(decode(&h, &body), None);
        let (h, body) = header(0x04, b"k", &[], b"v");
        assert_eq!(decode(&h, &body), None);
        // Opcodes larder does not answer, within the range it does and past it: answered
        // "Unknown command", the connection kept.
        for opcode in [0x1b, 0x1f, 0x25, 0x40] {
            let (h, body) = header(opcode, b"", &[], &[]);
            assert_eq!(decode(&h, &body), Some(Request::Unknown), "{opcode:#x}");
        }
    }

    #[test]
    fn answers_echo_the_opcode_and_opaque_and_quiet_ones_say_nothing_of_success() {
        let (h, _) = header(0x01, b"k", &[0; 8], b"v");
        let mut out = BytesMut::new();
        render(&mut out, &h, &Answer::Stored { cas: 42 });
        assert_eq!(out.len(), HEADER);
        assert_eq!((out[0], out[1]), (RESPONSE, 0x01));
        assert_eq!(&out[12..16], &7u32.to_be_bytes());
        assert_eq!(&out[16..24], &42u64.to_be_bytes());
        let (q, _) = header(0x11, b"k", &[0; 8], b"v");
        let mut out = BytesMut::new();
        render(&mut out, &q, &Answer::Stored { cas: 42 });
        assert!(out.is_empty());
        render(&mut out, &q, &Answer::Exists);
        assert_eq!(&out[6..8], &EXISTS.to_be_bytes());
        assert_eq!(&out[HEADER..], status_text(EXISTS));
    }
}
