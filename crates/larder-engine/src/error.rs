//! One error type for real failures; misses and refusals are ordinary return values.

use rustix::io::Errno;
use std::fmt;

/// What kind of failure happened; callers (the HTTP layer) map kinds to statuses in one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The device is full (ENOSPC, EDQUOT).
    NoSpace,
    /// Any other I/O failure.
    Io,
    /// The value cannot be stored: larger than the limit or than a volume.
    TooLarge,
    /// The key is empty or longer than 1024 bytes.
    InvalidKey,
    /// Another argument is out of bounds (a content type longer than the limit).
    Invalid,
    /// A write's precondition did not hold; nothing was stored.
    PreconditionFailed,
    /// On-disk data is not what larder wrote (bad manifest or header) and cannot be used.
    Corrupt,
    /// Another process holds the data directory.
    Locked,
    /// A call made with `nonblocking: true` would have waited (for the device, the writer
    /// lock, a ring rotation or an fdatasync); nothing was done. Retry where blocking is fine.
    WouldBlock,
}

/// A failure from the engine.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: std::borrow::Cow<'static, str>,
    source: Option<std::io::Error>,
}

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with a one-line message.
    pub fn new(kind: ErrorKind, message: impl Into<std::borrow::Cow<'static, str>>) -> Error {
        Error { kind, message: message.into(), source: None }
    }

    /// The answer of a non-blocking call that would have waited (no allocation).
    pub(crate) fn would_block() -> Error {
        Error::new(ErrorKind::WouldBlock, "the call would block")
    }

    /// Wraps an I/O error with what was being done; ENOSPC and EDQUOT become `NoSpace`.
    pub fn io(what: impl Into<std::borrow::Cow<'static, str>>, e: std::io::Error) -> Error {
        let kind = match e.raw_os_error() {
            Some(n) if n == Errno::NOSPC.raw_os_error() || n == Errno::DQUOT.raw_os_error() => ErrorKind::NoSpace,
            _ => ErrorKind::Io,
        };
        Error { kind, message: what.into(), source: Some(e) }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(e) => write!(f, "{}: {}", self.message, e),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}
