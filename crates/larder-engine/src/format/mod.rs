//! The on-disk formats, as pure encoders and decoders (no I/O): one module per table of
//! docs/FORMAT.md. Public for `larder check`, the fuzz tests and tools that read volumes.

pub mod dir_id;
pub mod hint;
pub mod manifest;
pub mod meta;
pub mod record;
pub mod volume;
