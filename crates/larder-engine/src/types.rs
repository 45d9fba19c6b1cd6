//! The types of the public API: what a read returns (a value, where it lives, which tier
//! answered) and what a read or a write asks for beyond the key (which part of a value, the
//! version a write is conditional on, a write's expiry and content type).

use bytes::Bytes;

/// Identifies one stored value: equal versions have equal bytes (length, CRC32C and store
/// time must all agree), so it can serve as a strong validator (an HTTP ETag). Storing the
/// same bytes again makes a new version; copying a record forward (reinsertion) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    /// Value length in bytes.
    pub len: u64,
    /// CRC32C of the value.
    pub crc: u32,
    /// Store time, ms since the Unix epoch.
    pub stored_ms: u64,
}

/// A condition a write checks against the key's current value, atomically with the write
/// (under the writer lock, so no other write comes between the check and the append).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// The key has no live value (HTTP `If-None-Match: *`).
    Absent,
    /// The key has a live value (`If-Match: *`).
    Present,
    /// The current value is one of these versions (`If-Match: "…"`).
    OneOf(Vec<Version>),
    /// The current value, if any, is none of these versions (`If-None-Match: "…"`).
    NoneOf(Vec<Version>),
    /// The current value, if any, was stored no later than this second of the Unix epoch
    /// (`If-Unmodified-Since`; HTTP dates have whole seconds).
    UnmodifiedSince(u64),
    /// The key has a value with exactly this store time (memcached's `cas`: store times are
    /// stamped under the writer lock and never repeat in a store, so one names one write).
    StoredAt(u64),
}

impl Precondition {
    /// Whether the condition holds when the key's current version is `current`.
    pub fn holds(&self, current: Option<Version>) -> bool {
        match self {
            Precondition::Absent => current.is_none(),
            Precondition::Present => current.is_some(),
            Precondition::OneOf(vs) => current.is_some_and(|c| vs.contains(&c)),
            Precondition::NoneOf(vs) => current.is_none_or(|c| !vs.contains(&c)),
            Precondition::UnmodifiedSince(secs) => current.is_none_or(|c| c.stored_ms / 1000 <= *secs),
            Precondition::StoredAt(ms) => current.is_some_and(|c| c.stored_ms == *ms),
        }
    }
}

/// The first of `preconditions` that does not hold when the key's current version is
/// `current`, as a one-line reason; `None` when they all hold.
pub fn unmet(preconditions: &[Precondition], current: Option<Version>) -> Option<&'static str> {
    let failed = preconditions.iter().find(|p| !p.holds(current))?;
    Some(match (failed, current) {
        (Precondition::Absent, _) => "the key already has a value",
        (Precondition::UnmodifiedSince(_), _) => "the key's value was stored after the given time",
        (_, None) => "the key has no value",
        (Precondition::StoredAt(_), Some(_)) => "the key was written since",
        (Precondition::NoneOf(_), Some(_)) => "the key's current version is one of those given",
        (_, Some(_)) => "the key's current version is not one of those given",
    })
}

/// How to read a value; `Default` reads the whole value and may block.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Which bytes to return. A part of a large value longer than one chunk is not gathered
    /// in memory: `get` fails with `ErrorKind::TooLarge`, and `Store::reader` reads it in
    /// pieces. Partial reads are not shared between threads and do not count
    /// towards promotion to memory (memory holds whole values); a range read counts towards
    /// reinsertion; `Part::Nothing` does not count as a hit or a miss.
    pub part: Part,
    /// Fail with `ErrorKind::WouldBlock` instead of waiting for the device (the record is not
    /// in the page cache) or for another thread's read of the same record. An async caller
    /// answers memory and page-cache hits inline and moves only the rest to a thread that
    /// may block.
    pub nonblocking: bool,
    /// The caller sends a value's Zstandard-coded bytes as they are (HTTP's
    /// `Content-Encoding: zstd`) when it is stored so: a whole value the memory tier holds
    /// coded comes back undecoded, its bytes in `Value::coded` and `data` empty. One read from
    /// disk is decoded and checked all the same, and carries its coded bytes too.
    pub coded: bool,
}

/// How to delete a value; `Default` is a plain delete that may block.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteOptions<'a> {
    /// All must hold for the current value (checked atomically with the delete), or the
    /// delete fails with `ErrorKind::PreconditionFailed`.
    pub preconditions: &'a [Precondition],
    /// Fail with `ErrorKind::WouldBlock`, having done nothing, where the delete would wait
    /// (see [`PutOptions::nonblocking`]), a read of the key's record from the device included.
    pub nonblocking: bool,
}

/// When a stored value expires. An expired key reads as absent and is dropped when next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Expiry {
    /// Lives until evicted.
    #[default]
    Never,
    /// This long after the write, by the clock. Zero stores a value that is expired at once
    /// (it still replaces the previous one).
    After(std::time::Duration),
    /// At this time, ms since the Unix epoch; a time already past (or 0) stores a value that is
    /// expired at once.
    At(u64),
    /// A put's: the expiry of the live value it replaces, as it stands under the writer lock
    /// (so that a touch just before is kept, never undone); with none, `otherwise` after the
    /// write (`None`: never). Anywhere else it means its `otherwise`.
    Keep {
        /// The expiry of a write that replaces no live value: this long after it, or never.
        otherwise: Option<std::time::Duration>,
    },
}

impl Expiry {
    /// The expiry time written in a record stamped at clock time `now` (0 = never).
    pub fn at_ms(self, now: u64) -> u64 {
        match self {
            Expiry::Never => 0,
            Expiry::After(t) if t.is_zero() => 1,
            Expiry::After(t) => now.max(1).saturating_add(t.as_millis() as u64),
            Expiry::At(ms) => ms.max(1),
            Expiry::Keep { otherwise } => otherwise.map_or(Expiry::Never, Expiry::After).at_ms(now),
        }
    }

    /// The expiry of a stored value whose expiry time is `expiry_ms` (0 = never), to keep it
    /// when the value is rewritten.
    pub fn of(expiry_ms: u64) -> Expiry {
        match expiry_ms {
            0 => Expiry::Never,
            ms => Expiry::At(ms),
        }
    }
}

/// How to store a value; `Default` is a plain put that may block.
#[derive(Debug, Clone, Copy, Default)]
pub struct PutOptions<'a> {
    /// When the value expires.
    pub expiry: Expiry,
    /// Client flags stored with the value and returned with it (memcached's item flags).
    pub flags: u32,
    /// memcached's stale mark (meta `I`): the value was invalidated and is served as stale
    /// until it is replaced.
    pub stale: bool,
    /// Media type stored with the value (at most `MAX_CONTENT_TYPE` bytes).
    pub content_type: Option<&'a [u8]>,
    /// Application attributes stored with the value and returned with it, opaque to the
    /// engine (at most `MAX_ATTRS` bytes): read-through mode keeps a response's headers here.
    pub attrs: Option<&'a [u8]>,
    /// All must hold, or the put fails with `ErrorKind::PreconditionFailed` and stores nothing.
    pub preconditions: &'a [Precondition],
    /// Fail with `ErrorKind::WouldBlock`, having written nothing, where the put would wait:
    /// for the writer lock, for a ring rotation (which truncates a volume) or for an
    /// fdatasync (`FsyncPolicy::Always`); a put with preconditions also where the current
    /// record is not in the page cache. An async caller runs the quick common case inline
    /// and moves only the rest to a blocking thread.
    pub nonblocking: bool,
}

/// What `Store::update` changes in a stored value; its bytes and version stay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Touch<'a> {
    /// The new expiry.
    pub expiry: Expiry,
    /// New attributes: `Some(None)` removes them, `None` keeps them.
    pub attrs: Option<Option<&'a [u8]>>,
    /// Change only the value stored at this time (ms), if given; any other reads as absent.
    pub stored_at: Option<u64>,
}

/// A byte range of a value, as an HTTP `Range: bytes=` specifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// From the first byte offset to the last (inclusive), or to the end when `None`.
    Span(u64, Option<u64>),
    /// The last `n` bytes.
    Suffix(u64),
}

impl ByteRange {
    /// The half-open byte range `[start, end)` this selects from a value of `len` bytes, or
    /// `None` when it selects nothing (unsatisfiable).
    pub fn resolve(self, len: u64) -> Option<(u64, u64)> {
        match self {
            ByteRange::Span(first, last) => {
                let end = last.map_or(len, |l| l.saturating_add(1).min(len));
                (first < len && first < end).then_some((first, end))
            }
            ByteRange::Suffix(n) => (n > 0 && len > 0).then(|| (len - n.min(len), len)),
        }
    }
}

/// Which bytes of a value a read returns. Every part comes with the value's length,
/// version and content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Part {
    /// The whole value.
    #[default]
    Whole,
    /// A range of it: only the blocks that hold the range are read from disk (and verified).
    /// An unsatisfiable range returns no bytes.
    Range(ByteRange),
    /// No bytes: length, version and content type only (HEAD, revalidation). Reads just the
    /// front of a large record.
    Nothing,
}

/// Which tier answered a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier.
    Memory,
    /// A volume file.
    Disk,
}

/// Where a record lives on disk, as reported in `X-Position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Volume slot (0-based).
    pub volume: u32,
    /// Byte offset of the record's start in the volume file.
    pub offset: u64,
    /// Length of the record on disk in bytes (header, key, metadata and value).
    pub size: u64,
}

/// What a put stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Where the record was written.
    pub position: Position,
    /// The new value's version.
    pub version: Version,
}

/// A value read from the store.
#[derive(Debug, Clone)]
pub struct Value {
    /// The bytes asked for: the whole value, a range of it (starting at `start`), or none.
    pub data: Bytes,
    /// Offset of `data` in the value.
    pub start: u64,
    /// Length of the whole value in bytes.
    pub len: u64,
    /// CRC32C of the whole value.
    pub crc: u32,
    /// The content type stored with the value, if any.
    pub content_type: Option<Bytes>,
    /// Where its record lives.
    pub position: Position,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
    /// When it expires, ms since the Unix epoch; 0 = never.
    pub expiry_ms: u64,
    /// The client flags stored with it (0 when none were).
    pub flags: u32,
    /// Whether it carries memcached's stale mark.
    pub stale: bool,
    /// The application attributes stored with it, if any.
    pub attrs: Option<Bytes>,
    /// Which tier answered. For a memory hit, `position` is where the value was read from
    /// when it was promoted (reinsertion may have moved the record since).
    pub tier: Tier,
    /// How the value is stored, when it is stored coded (`StoreConfig::compression`), with
    /// its coded bytes when they were read (a description, `Part::Nothing`, may leave them
    /// empty). `data` is the value itself, unless `ReadOptions::coded` said otherwise.
    pub coded: Option<CodedBytes>,
}

/// A value's coded bytes as stored, and the codec they decode with.
#[derive(Debug, Clone)]
pub struct CodedBytes {
    /// The codec that decodes them.
    pub codec: Codec,
    /// The store's dictionary they were coded with (0: none; a client cannot decode them).
    pub dictionary: u32,
    /// The bytes as stored.
    pub data: Bytes,
}

impl Value {
    /// The stored value's version, a strong validator.
    pub fn version(&self) -> Version {
        Version { len: self.len, crc: self.crc, stored_ms: self.stored_ms }
    }

    /// Narrows `data`, the whole value, to `part`.
    pub(crate) fn narrow(mut self, part: Part) -> Value {
        let (start, end) = match part {
            Part::Whole => (0, self.len),
            Part::Nothing => (0, 0),
            Part::Range(r) => r.resolve(self.len).unwrap_or((0, 0)),
        };
        self.data = self.data.slice(start as usize..end as usize);
        self.start = start;
        self
    }
}

/// A value coding. Its number is what records store: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Zstandard (RFC 8878), one frame.
    Zstd,
    /// LZ4's block format, no header (the value's length is in the metadata).
    Lz4,
}

impl Codec {
    /// Every codec, with the name the command line and the stats use.
    pub const ALL: [(Codec, &'static str); 2] = [(Codec::Zstd, "zstd"), (Codec::Lz4, "lz4")];

    /// The number records store.
    pub fn id(self) -> u8 {
        match self {
            Codec::Zstd => 1,
            Codec::Lz4 => 2,
        }
    }

    /// The codec a record names; `None` for one this build does not know.
    pub fn from_id(id: u8) -> Option<Codec> {
        match id {
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Lz4),
            _ => None,
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(c, _)| *c == self).map_or("?", |(_, n)| n)
    }

    /// The level used when none is given.
    pub fn default_level(self) -> i32 {
        match self {
            Codec::Zstd => zstd::DEFAULT_COMPRESSION_LEVEL,
            Codec::Lz4 => 0,
        }
    }

    /// The levels the codec accepts, if it has levels.
    pub fn levels(self) -> Option<std::ops::RangeInclusive<i32>> {
        match self {
            Codec::Zstd => Some(zstd::compression_level_range()),
            Codec::Lz4 => None,
        }
    }
}

impl std::str::FromStr for Codec {
    type Err = String;
    fn from_str(s: &str) -> Result<Codec, String> {
        let t = s.trim().to_ascii_lowercase();
        Self::ALL.iter().find(|(_, n)| *n == t).map(|(c, _)| *c).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|(_, n)| *n).collect();
            format!("unknown codec {s:?}: use one of {}, or none", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_as_http_says() {
        use ByteRange::*;
        assert_eq!(Span(0, Some(99)).resolve(1000), Some((0, 100)));
        assert_eq!(Span(990, Some(2000)).resolve(1000), Some((990, 1000)));
        assert_eq!(Span(10, None).resolve(1000), Some((10, 1000)));
        assert_eq!(Span(1000, None).resolve(1000), None);
        assert_eq!(Span(0, Some(0)).resolve(0), None);
        assert_eq!(Suffix(100).resolve(1000), Some((900, 1000)));
        assert_eq!(Suffix(5000).resolve(1000), Some((0, 1000)));
        assert_eq!(Suffix(0).resolve(1000), None);
        assert_eq!(Suffix(3).resolve(0), None);
        assert_eq!(Span(5, Some(u64::MAX)).resolve(10), Some((5, 10)));
    }

    #[test]
    fn preconditions() {
        let v = Version { len: 3, crc: 7, stored_ms: 9 };
        let w = Version { stored_ms: 10, ..v };
        assert!(Precondition::Absent.holds(None) && !Precondition::Absent.holds(Some(v)));
        assert!(Precondition::Present.holds(Some(v)) && !Precondition::Present.holds(None));
        assert!(Precondition::OneOf(vec![w, v]).holds(Some(v)));
        assert!(!Precondition::OneOf(vec![w]).holds(Some(v)) && !Precondition::OneOf(vec![v]).holds(None));
        assert!(Precondition::NoneOf(vec![w]).holds(Some(v)) && Precondition::NoneOf(vec![v]).holds(None));
        assert!(!Precondition::NoneOf(vec![v]).holds(Some(v)));
        assert!(Precondition::UnmodifiedSince(0).holds(None));
        assert!(Precondition::UnmodifiedSince(0).holds(Some(Version { stored_ms: 999, ..v })));
        assert!(!Precondition::UnmodifiedSince(0).holds(Some(Version { stored_ms: 1000, ..v })));
    }
}
