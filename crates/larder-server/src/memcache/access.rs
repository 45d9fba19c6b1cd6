//! The memcached door's side of the policy ([`crate::guard`]): each command classified into a
//! permission, the connection's identity taken from memcached's own credential exchanges, and
//! refusals rendered as memcached renders them.
//!
//! - Text (and meta) commands: as memcached with `-Y`, a connection's first `set` carries the
//!   credential as its data, `<user> <secret>`; `STORED` when the secret is larder's token,
//!   `CLIENT_ERROR authentication failure` when not (`… bad authentication token format`
//!   when there is no second word), compared with memcached's answers in
//!   `tests/memcache_diff.rs`. Any user name is taken: larder has one
//!   secret, not an account table.
//! - Binary: SASL `PLAIN` (what Dalli's `username:`/`password:` and libmemcached send), the
//!   password being larder's token.
//!
//! A connection's identity lives on the connection; the policy decides each command with it.

use super::conn::{Conn, End};
use super::wire::{Answer, Request, StoreOp};
use crate::guard::{Door, Identity, Permission, Refusal, Session};

/// The longest credential block a `set` may carry before the connection is authenticated:
/// an anonymous client is not read for long.
pub const CREDENTIAL_MAX: u64 = 1024;

/// Whether the connection may make the server hold more than a credential's worth of input
/// (a long line of keys, a binary body): authenticated, or no token configured.
#[inline]
pub fn may_hold(c: &Conn) -> bool {
    c.who == Identity::Token || !c.app.policy.needs_credentials()
}

/// What a text or meta request asks for.
#[inline]
pub fn text_permission(req: &Request<'_>) -> Permission {
    match req {
        Request::Get { touch: None, .. } => Permission::Read,
        Request::Get { touch: Some(_), .. } => Permission::Write,
        Request::Store { .. } | Request::Arith { .. } | Request::Touch { .. } => Permission::Write,
        Request::Delete { .. } => Permission::Delete,
        Request::FlushAll { .. } => Permission::Flush,
        Request::Stats(_) | Request::Operator(_) => Permission::Admin,
        Request::Version
        | Request::Verbosity
        | Request::Quit
        | Request::MetaNoop
        | Request::Noop
        | Request::Sasl { .. }
        | Request::Unknown => Permission::Health,
        Request::Meta { cmd, words } => match cmd {
            // mg touches with T, and creates the item on a miss with N.
            b'g' if words.iter().skip(2).any(|w| matches!(w.first(), Some(b'T' | b'N'))) => Permission::Write,
            b'g' | b'e' => Permission::Read,
            b'd' => Permission::Delete,
            _ => Permission::Write, // ms, ma
        },
    }
}

/// Asks the policy about a text command on this connection.
#[inline]
pub fn admit_text(c: &Conn, req: &Request<'_>) -> Result<(), Refusal> {
    c.app.policy.admit(Door::MemcacheText, Session::PerConnection, c.who, text_permission(req))
}

/// Whether a refused command is a credential instead: an unauthenticated connection's `set`.
pub fn is_login(c: &Conn, req: &Request<'_>, refusal: Refusal) -> bool {
    c.who != Identity::Token && refusal != Refusal::ReadOnly && matches!(req, Request::Store { op: StoreOp::Set, .. })
}

/// Reads a `set`'s data block as `<user> <secret>` and authenticates the connection with it.
/// A block too long to be a credential gets the failure line and closes the connection (an
/// anonymous client is not read for long).
pub async fn login(c: &mut Conn, len: u64) -> Result<(), End> {
    if len > CREDENTIAL_MAX {
        c.out.extend_from_slice(b"CLIENT_ERROR authentication failure\r\n");
        return Err(End::Closed);
    }
    let len = len as usize;
    c.read_block(len + 2).await?;
    let block = c.input.split_to(len + 2);
    // As memcached reads it: words split on spaces, the second the secret, any more ignored.
    let mut words = block[..len].split(|&b| b == b' ').filter(|w| !w.is_empty());
    let secret = words.nth(1).filter(|_| &block[len..] == b"\r\n");
    if secret.is_none() && &block[len..] == b"\r\n" {
        c.app.policy.count(Door::MemcacheText, Refusal::BadCredential);
        c.out.extend_from_slice(b"CLIENT_ERROR bad authentication token format\r\n");
        return Ok(());
    }
    match c.app.policy.identify(secret) {
        Identity::Token if secret.is_some() => {
            c.who = Identity::Token;
            c.out.extend_from_slice(b"STORED\r\n");
        }
        _ => {
            c.app.policy.count(Door::MemcacheText, Refusal::BadCredential);
            c.out.extend_from_slice(b"CLIENT_ERROR authentication failure\r\n");
        }
    }
    Ok(())
}

/// What a binary request asks for, by opcode (SASL's own opcodes are the exchange itself).
#[inline]
pub fn binary_permission(opcode: u8) -> Permission {
    match opcode {
        0x00 | 0x09 | 0x0c | 0x0d => Permission::Read,
        0x04 | 0x14 => Permission::Delete,
        0x08 | 0x18 => Permission::Flush,
        0x10 => Permission::Admin,
        // set, add, replace, incr, decr, append, prepend, touch, gat and their quiet forms
        0x01..=0x03
        | 0x05
        | 0x06
        | 0x0e
        | 0x0f
        | 0x11..=0x13
        | 0x15
        | 0x16
        | 0x19
        | 0x1a
        | 0x1c..=0x1e
        | 0x23
        | 0x24 => Permission::Write,
        // quit, noop, version, SASL, and opcodes answered "unknown command"
        _ => Permission::Health,
    }
}

/// Asks the policy about a binary request on this connection.
#[inline]
pub fn admit_binary(c: &Conn, opcode: u8) -> Result<(), Refusal> {
    c.app.policy.admit(Door::MemcacheBinary, Session::PerConnection, c.who, binary_permission(opcode))
}

/// SASL's mechanisms, its `PLAIN` exchange and its step: `Authenticated` when the exchange
/// succeeded, `AuthFailed` when it did not.
pub fn sasl(c: &mut Conn, opcode: u8, mechanism: &[u8], data: &[u8]) -> Answer {
    match opcode {
        0x20 => Answer::Authenticated(b"PLAIN"),
        0x21 if mechanism == b"PLAIN" => {
            // authzid NUL authcid NUL password (RFC 4616)
            let mut parts = data.splitn(3, |&b| b == 0);
            let password = parts.nth(2);
            match c.app.policy.identify(password) {
                Identity::Token if password.is_some() => {
                    c.who = Identity::Token;
                    Answer::Authenticated(b"Authenticated")
                }
                _ => {
                    c.app.policy.count(Door::MemcacheBinary, Refusal::BadCredential);
                    Answer::AuthFailed
                }
            }
        }
        _ => Answer::AuthFailed, // another mechanism, or a step PLAIN never needs
    }
}
