//! The `larder` binary: a hybrid memory + disk key-value cache server over HTTP.
// The stats object is one `json!` literal with many fields.
#![recursion_limit = "256"]

mod admin;
mod api;
mod app;
mod body;
mod cli;
mod cluster;
mod config;
mod conn;
mod dav;
mod guard;
mod h1;
mod headers;
mod key;
mod lanes;
mod lifecycle;
mod memcache;
mod metrics;
mod proxy;
mod reply;
mod routes;
mod storeio;
mod watch;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than glibc's allocator, measured build against build with the settings
/// below (`bench/builds-ab.sh`, BENCHMARKS.md "The allocator"): 4 KiB GETs from the memory
/// tier 1.07x the requests at 0.93x the CPU, 1 MiB PUTs 1.15x at 0.83x, the rest within 3%;
/// in-RAM gets over the memcached protocol moved from 0.88-0.94x memcached's to parity. A
/// 4 KiB value in the memory tier is page-aligned in jemalloc's 4 KiB size class, where
/// glibc's chunk header shifts it across two pages: the send's copy of it fell from 1.7 to
/// 1.1 µs per get in the profiles.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Freed pages given back once unused for about 100 ms rather than jemalloc's 10 s (checked
/// as each arena is next used; there is no background thread): request bodies and large
/// values come and go in buffers on many threads, and the body budget promises that they
/// bound resident memory. Measured with the thousand slow uploads of `tests/body_memory.rs`
/// (64 MiB budget): peaks of 76 to 86 MiB in five runs with this, 101 and 111 MiB with
/// jemalloc's defaults, 58 and 77 MiB with glibc. Giving pages back at once costs GETs of
/// 64 KiB half again their CPU (each buffer is faulted in anew). The figures above are with
/// this. `_RJEM_MALLOC_CONF` in the environment overrides it.
#[export_name = "_rjem_malloc_conf"]
static JEMALLOC_CONF: &[u8; 19] = b"dirty_decay_ms:100\0";

/// larder: a key-value cache server for huge numbers of small files and blobs.
#[derive(Parser, Debug)]
#[command(name = "larder", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP API (PUT/GET/HEAD/DELETE /<key>) from a data directory.
    Serve(Box<config::ServeArgs>),
    /// Print a key's value (to stdout, or --output FILE).
    Get(cli::GetArgs),
    /// Store a value read from FILE or stdin under a key.
    Put(cli::PutArgs),
    /// Delete a key.
    Delete(cli::DeleteArgs),
    /// Show a running server's figures as a table.
    Stats(cli::StatsArgs),
    /// Watch a running server, or every node of a cluster, live: rates, hit ratios,
    /// latencies, hot keys (--once prints one frame).
    Top(cli::TopArgs),
    /// Verify every record and hint file of a stopped server's data directory; exits 1 if
    /// any record fails its checksum (a torn tail of the active volume excepted).
    Check(cli::CheckArgs),
    /// Run the larder-bench load tool with these arguments.
    Bench(cli::BenchArgs),
    /// Print which node of a cluster owns each key, as its router (nginx, twemproxy) places it.
    Owner(cli::OwnerArgs),
    /// Flush a server (memcached's flush_all), or with --cluster every node of a cluster.
    Flush(cli::FlushArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Get(a) => cli::get(a),
        Command::Put(a) => cli::put(a),
        Command::Delete(a) => cli::delete(a),
        Command::Stats(a) => cli::stats(a),
        Command::Top(a) => cli::top(a),
        Command::Check(a) => cli::check(a),
        Command::Bench(a) => cli::bench(a),
        Command::Owner(a) => cli::owner(a),
        Command::Flush(a) => cli::flush(a),
    };
    std::process::exit(code);
}

fn serve(args: config::ServeArgs) -> i32 {
    let settings = match args.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("larder: {e}");
            return 2;
        }
    };
    if let Err(e) = guard::check_flags(&settings) {
        eprintln!("larder: {e}");
        return 2;
    }
    let mut filter = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_level.clone());
    if settings.access_log {
        filter.push_str(",larder::access=info");
    }
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(lifecycle::run(settings)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("larder: {e}");
            1
        }
    }
}
