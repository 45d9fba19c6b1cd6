//! larder-engine: the storage engine of the larder cache, usable on its own.
//!
//! Values are appended as checksummed records to a few large volume files that form a ring
//! (the oldest volume is reused first), and found through a compact in-memory index of key
//! hashes. No HTTP here: see [`Store`] for the API.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let store = larder_engine::Store::open(larder_engine::StoreConfig::new(dir.path())).unwrap();
//! use larder_engine::{DeleteOptions, PutOptions, ReadOptions};
//! store.put(b"greeting", b"hello world", &PutOptions::default()).unwrap();
//! let read = ReadOptions::default();
//! assert_eq!(&store.get(b"greeting", &read).unwrap().unwrap().data[..], b"hello world");
//! assert!(store.delete(b"greeting", &DeleteOptions::default()).unwrap());
//! assert!(store.get(b"greeting", &read).unwrap().is_none());
//! ```
//!
//! The modules form layers, each using only those listed before it (docs/ARCHITECTURE.md;
//! `tests/architecture.rs` keeps it so): `error`, `pause`; `types`; `config`, `clock`,
//! `stats`; `format`; `io`, `twins`; `index`; `disk`; `recovery`; `memory`; `maintenance`; `store`;
//! `check`.

mod clock;
mod config;
mod error;
pub mod pause;
mod stats;
pub mod trace;
mod types;

pub mod format;

mod io;

pub mod twins;

mod index;

mod disk;

mod recovery;

mod memory;

mod maintenance;

mod store;

pub mod check;

pub use clock::now_ms;
pub use config::{
    Compression, Dictionaries, Eviction, ExpiryCap, FsyncPolicy, MemoryConfig, StoreConfig,
    DEFAULT_COMPRESSION_MIN_SIZE, MIN_VOLUME_SIZE,
};
pub use error::{Error, ErrorKind, Result};
pub use format::meta::{MAX_ATTRS, MAX_CONTENT_TYPE};
pub use format::record::MAX_KEY_LEN;
pub use io::{faults, FileIo};
pub use stats::{
    DictionaryInfo, DictionaryStats, DirState, DirStats, HeldStats, RecoveryProgress, RecoveryReport, SlotStats, Stats,
    Tally,
};
pub use store::{KeyCursor, KeyInfo, Store, ValueReader, ValueWriter};
pub use types::{
    unmet, ByteRange, Codec, CodedBytes, DeleteOptions, Expiry, Part, Position, Precondition, PutOptions, ReadOptions,
    Stored, Tier, Touch, Value, Version,
};
