//! The client and operator subcommands of the `larder` binary, one concern per file:
//!
//! - `client.rs`: what they share: the server's address and token, HTTP calls, exit codes;
//! - `keys.rs`: `get`, `put`, `delete` of a key; `stats.rs`: the server's figures;
//!   `top.rs`: the live view of a node or a cluster;
//! - `fleet.rs`: `owner` and `flush` over a cluster's nodes;
//! - `check.rs`: a data directory verified offline; `bench.rs`: the hand-over to
//!   `larder-bench`.
//!
//! Exit codes: 0 success, 1 the server answered with an error (or `check` found damage),
//! 2 the command could not run (bad arguments, server unreachable, unreadable directory).

mod bench;
mod check;
mod client;
mod fleet;
mod keys;
mod stats;
mod top;

pub use bench::{bench, BenchArgs};
pub use check::{check, CheckArgs};
pub use fleet::{flush, owner, FlushArgs, OwnerArgs};
pub use keys::{delete, get, put, DeleteArgs, GetArgs, PutArgs};
pub use stats::{stats, StatsArgs};
pub use top::{top, TopArgs};
