//! memcached's three encodings, pure: bytes in, a [`Request`] out; an [`Answer`] in, bytes
//! out. No socket, no store. Text, meta and binary decode into one request type where they
//! mean the same command (a binary `getk` and a text `get` are both a [`Request::Get`]), so
//! that the command table above runs each command once, whichever encoding brought it.
//!
//! - `request.rs`: the request, and the answer, every encoding shares; `number.rs`:
//!   numbers read with the C library's rules.
//! - `text.rs`: the text protocol's command lines, read as memcached 1.6 reads them, and its
//!   answer lines.
//! - `meta.rs`: the meta commands' flags, and the flags their answers echo.
//! - `binary.rs`: the binary protocol's packets, and its answers.

pub mod binary;
pub mod meta;
mod number;
mod request;
pub mod text;

pub use number::{safe_strtol, safe_strtoull};
pub use request::{Answer, Data, Request, StoreOp, KEY_MAX, REALTIME_MAXDELTA, URI_ENCODE};

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
