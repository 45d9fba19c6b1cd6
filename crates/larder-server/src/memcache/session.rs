//! A connection's loop: its first byte picks the text protocol or the binary one; then each
//! request is framed (a command line; a binary header and body), admitted by the policy
//! before a byte of its data is held, run by the command table, and answered. Answers to
//! pipelined requests go out in one write once no complete request is left to run.

use super::access;
use super::conn::{Conn, End};
use super::counters::{command_index, counters, Outcome};
use super::exec;
use super::item;
use super::wire::binary::{self, Header, HEADER};
use super::wire::text::{self, Parsed, LINE_MAX};
use super::wire::{safe_strtol, Answer, Data, Reply, Request, KEY_MAX};
use crate::app::App;
use crate::guard::Refusal;
use larder_engine::Store;

/// Reads and runs requests until the connection ends.
pub async fn run(c: &mut Conn) -> Result<(), End> {
    let mut first = true;
    // How much of a long line was already searched for its end.
    let mut scanned = 0;
    loop {
        loop {
            if first && !c.input.is_empty() {
                first = false;
                if c.input[0] == binary::REQUEST {
                    // The binary protocol's request magic: this connection speaks it.
                    return run_binary(c).await;
                }
            }
            let Some(nl) = c.input[scanned..].iter().position(|&b| b == b'\n').map(|i| i + scanned) else {
                // A long line of keys is for authenticated connections only.
                if c.input.len() > LINE_MAX && !(long_get(&c.input) && access::may_hold(c)) {
                    return Err(End::Closed); // memcached closes a connection for a line this long
                }
                scanned = c.input.len();
                if !c.input.is_empty() {
                    c.line_pending();
                }
                break;
            };
            scanned = 0;
            c.unit_done();
            let line = c.input.split_to(nl + 1).freeze();
            let words = line[..nl].strip_suffix(b"\r").unwrap_or(&line[..nl]);
            match text::parse(words) {
                Parsed::Command(req, noreply) => {
                    // Admitted and the store ready: straight to the table, with no layer of
                    // state between (each one is moved on every request); else turned away.
                    let app = c.app.clone();
                    match (access::admit_text(c, &req), app.store.get()) {
                        (Ok(()), Some(store)) => exec::run_watched(c, store, req, Reply::Text { noreply }).await?,
                        (admitted, _) => Box::pin(turn_away_text(c, req, admitted.err())).await?,
                    }
                    c.command_done();
                }
                Parsed::Error { line, noreply } => {
                    let name = words.split(|&b| b == b' ').find(|w| !w.is_empty()).unwrap_or(b"");
                    let outcome =
                        if line.starts_with("CLIENT_ERROR") { Outcome::ClientError } else { Outcome::ServerError };
                    counters().count(command_index(name), outcome);
                    if !noreply {
                        c.out.extend_from_slice(line.as_bytes());
                        c.out.extend_from_slice(b"\r\n");
                    }
                }
                Parsed::Close => return Err(End::Closed),
            }
            c.maybe_flush().await?;
        }
        c.next_command().await?;
    }
}

/// Whether a line too long to end in the buffer may go on: only a get's list of keys does,
/// as in memcached, up to a bound of larder's own.
fn long_get(input: &[u8]) -> bool {
    let start = input.iter().take(101).position(|&b| b != b' ');
    let Some(s) = start else { return false };
    (input[s..].starts_with(b"get ") || input[s..].starts_with(b"gets ")) && input.len() <= 2 << 20
}

/// The length of the data block that follows a text request's line, if one does.
fn data_block(req: &Request<'_>) -> Option<u64> {
    match req {
        Request::Store { data: Data::Follows(len), .. } => Some(*len),
        Request::Meta { cmd: b's', words } => {
            words.get(2).and_then(|w| safe_strtol(w)).and_then(|l| u64::try_from(l).ok())
        }
        _ => None,
    }
}

/// A text (or meta) request the policy refused (`refusal`), or that came while the store
/// recovers: answered, its data block read past; or the `-Y` login it is.
async fn turn_away_text(c: &mut Conn, req: Request<'_>, refusal: Option<Refusal>) -> Result<(), End> {
    let Some(refusal) = refusal else {
        // Still recovering: a data block is read past, then the answer is an error.
        if let Some(len) = data_block(&req) {
            c.swallow(len + 2).await?;
        }
        exec::answer(c, req.name(), &Answer::NotReady, Reply::Text { noreply: false });
        return Ok(());
    };
    if access::is_login(c, &req, refusal) {
        let Some(len) = data_block(&req) else { unreachable!("a login is a set") };
        return access::login(c, len).await;
    }
    // Sent at once, `noreply` or not, as memcached sends errors.
    exec::answer(c, req.name(), &Answer::Refused(refusal), Reply::Text { noreply: false });
    if let Some(len) = data_block(&req) {
        c.flush_then_swallow(len + 2).await?;
    }
    Ok(())
}

/// Reads and answers binary requests until the connection ends.
async fn run_binary(c: &mut Conn) -> Result<(), End> {
    c.binary = true;
    loop {
        while c.input.len() >= HEADER {
            let Some(h) = Header::parse(&c.input[..HEADER]) else {
                return Err(End::Closed); // memcached closes a connection that stops making sense
            };
            let app = c.app.clone();
            let store = match frame_binary(c, &h, &app) {
                Ok(store) => store,
                Err(turn) => {
                    Box::pin(turn_away_binary(c, &h, turn)).await?;
                    continue;
                }
            };
            c.read_block(HEADER + h.body_len).await?;
            let packet = c.input.split_to(HEADER + h.body_len).freeze();
            let body = packet.slice(HEADER..);
            let Some(req) = binary::decode(&h, &body) else {
                // Parts that do not fit the command: memcached answers, then closes.
                exec::answer(c, binary::command_name(h.opcode), &Answer::Invalid, Reply::Binary(h));
                return Err(End::Closed);
            };
            exec::run_watched(c, store, req, Reply::Binary(h)).await?;
            c.command_done();
            c.maybe_flush().await?;
        }
        if !c.input.is_empty() {
            c.line_pending(); // a header begun
        }
        c.next_command().await?;
    }
}

/// Why a binary request is answered before its body is read.
enum Turn {
    Answer(Answer),
    /// A set whose value is too large: its key's old value is dropped first.
    TooLargeSet,
}

/// The store, if a binary request may be read and run; else why not: a refusal of the
/// policy, a body too large for a connection not yet authenticated, the store not ready, a
/// value larger than a chunk (for HTTP and the text protocol, which stream, as
/// docs/MEMCACHED.md says) or a key too long.
fn frame_binary<'a>(c: &Conn, h: &Header, app: &'a App) -> Result<&'a Store, Turn> {
    // The policy first, before a byte of the body is held.
    access::admit_binary(c, h.opcode).map_err(|r| Turn::Answer(Answer::Refused(r)))?;
    // Before a connection authenticates, what it may send is small (a credential).
    if !access::may_hold(c) && h.body_len as u64 > access::CREDENTIAL_MAX {
        return Err(Turn::Answer(Answer::Invalid));
    }
    let store = app.store.get().ok_or(Turn::Answer(Answer::NotReady))?;
    let most = store.config().chunk_size.min(store.config().max_value_size) as usize;
    let value_len = h.value_len();
    if value_len.is_some_and(|v| v <= most) && h.key_len <= KEY_MAX {
        return Ok(store);
    }
    let well_formed = h.extras_len == 8 && value_len.is_some() && h.key_len > 0 && h.key_len <= KEY_MAX;
    Err(match (h.is_set() && well_formed, value_len.is_none() || h.key_len > KEY_MAX) {
        (true, _) => Turn::TooLargeSet,
        (false, true) => Turn::Answer(Answer::Invalid),
        (false, false) => Turn::Answer(Answer::TooLarge),
    })
}

/// Answers a binary request [`frame_binary`] turned away, at once, then reads its body past
/// so the stream stays in step. A set refused as too large drops the key, as memcached's does
/// (its key comes before the value).
async fn turn_away_binary(c: &mut Conn, h: &Header, turn: Turn) -> Result<(), End> {
    let answer = match turn {
        Turn::Answer(a) => a,
        Turn::TooLargeSet => {
            c.read_block(HEADER + h.extras_len + h.key_len).await?;
            let key = c.input[HEADER + h.extras_len..HEADER + h.extras_len + h.key_len].to_vec();
            item::drop_refused(c, &key).await;
            Answer::TooLarge
        }
    };
    exec::answer(c, binary::command_name(h.opcode), &answer, Reply::Binary(*h));
    c.flush_then_swallow((HEADER + h.body_len) as u64).await
}
