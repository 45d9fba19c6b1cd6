//! larder-bench: measures larder, and its peers in the same run.
//!
//! - `http`: an HTTP/1.1 keep-alive load generator for any server.
//! - `engine`: larder's engine in-process, optionally side by side with foyer's HybridCache.
//! - `memory`: the in-memory cache crates considered for the memory tier, side by side.
//! - `hitratio`: larder's engine as a read-through cache under zipf: hit ratio per tier.
//! - `compare`: starts larder and nginx, runs the standard suite against both, alternating
//!   (with `--large`, also values of 64 MiB and 1 GiB, streamed).
//! - `crash-loop`: kill -9 cycles under a mixed load, every key checked against a model.

mod compare;
mod crash;
mod engine;
mod foyer_kv;
mod hitratio;
mod http;
mod large;
mod memcache;
mod memcompare;
mod memory;
mod proxycompare;
mod report;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "larder-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load an HTTP server: PUT/GET keys <url><n> over keep-alive connections.
    Http(http::HttpArgs),
    /// Drive larder's engine in-process (no HTTP), optionally next to foyer's HybridCache.
    Engine(engine::EngineArgs),
    /// Hit ratio and throughput of the in-memory cache crates larder could use.
    Memory(memory::MemoryArgs),
    /// Hit ratios of larder's tiers under a zipf stream, per memory policy and disk policy.
    Hitratio(hitratio::HitRatioArgs),
    /// Start larder and nginx and run the standard suite against both, alternating.
    Compare(compare::CompareArgs),
    /// Load a memcached-protocol server (larder's --memcache-listen, or memcached).
    Memcache(memcache::MemcacheArgs),
    /// Kill -9 a larder server again and again under a mixed load, checking every key against
    /// a model of what was acknowledged.
    CrashLoop(crash::CrashArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Http(args) => http::run(args).map(|_| ()),
        Command::Compare(args) => compare::run(args),
        Command::Engine(args) => engine::run(args),
        Command::Memory(args) => memory::run(args),
        Command::Hitratio(args) => hitratio::run(args),
        Command::Memcache(args) => memcache::run(args).map(|_| ()),
        Command::CrashLoop(args) => crash::run(args),
    };
    if let Err(e) = result {
        eprintln!("larder-bench: {e:#}");
        std::process::exit(1);
    }
}
