//! larder-engine: the storage engine of the larder cache, usable on its own.
//!
//! Values are appended as checksummed records to a few large volume files that form a ring
//! (the oldest volume is reused first), and found through a compact in-memory index of key
//! hashes. No HTTP here: see `Store` for the API.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let store = larder_engine::Store::open(larder_engine::StoreConfig::new(dir.path())).unwrap();
//! store.put(b"greeting", b"hello world").unwrap();
//! assert_eq!(&store.get(b"greeting").unwrap().unwrap().data[..], b"hello world");
//! assert!(store.delete(b"greeting").unwrap());
//! assert!(store.get(b"greeting").unwrap().is_none());
//! ```

pub mod check;
pub mod dirs;
mod error;
pub mod faults;
mod flight;
pub mod hint;
pub mod index;
pub mod io;
pub mod manifest;
pub mod memory;
pub mod meta;
mod ops;
pub mod pause;
pub mod record;
pub mod recovery;
mod store;
pub mod volume;

pub use error::{Error, ErrorKind, Result};
pub use memory::{Eviction, MemoryConfig};
pub use ops::{unmet, ByteRange, Part, Precondition, PutOptions, Version};
pub use recovery::{RecoveryProgress, RecoveryReport};
pub use store::{
    now_ms, DirState, DirStats, FsyncPolicy, Position, Stats, Store, StoreConfig, Stored, Tier, Value, MIN_VOLUME_SIZE,
};
