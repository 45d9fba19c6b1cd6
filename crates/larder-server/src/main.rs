//! The `larder` binary: a hybrid memory + disk key-value cache server over HTTP.
// The stats object is one `json!` literal with many fields.
#![recursion_limit = "256"]

mod admin;
mod api;
mod app;
mod cli;
mod config;
mod conn;
mod headers;
mod key;
mod lifecycle;
mod memcache;
mod metrics;
mod reply;
mod routes;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

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
    /// Verify every record and hint file of a stopped server's data directory; exits 1 if
    /// any record fails its checksum (a torn tail of the active volume excepted).
    Check(cli::CheckArgs),
    /// Run the larder-bench load tool with these arguments.
    Bench(cli::BenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Get(a) => cli::get(a),
        Command::Put(a) => cli::put(a),
        Command::Delete(a) => cli::delete(a),
        Command::Stats(a) => cli::stats(a),
        Command::Check(a) => cli::check(a),
        Command::Bench(a) => cli::bench(a),
    };
    std::process::exit(code);
}

/// Request bodies and large values come and go in buffers of up to `--max-value-size`. glibc
/// serves such sizes with mmap at first, but raises that threshold each time one is freed,
/// after which they come from its per-thread heaps, which keep what they grew to: measured,
/// 1,000 concurrent 1 MiB uploads under a 64 MiB body budget peaked at 151 MiB resident. A
/// fixed threshold keeps buffers of 128 KiB and more out of the heaps, so what is freed goes
/// back to the system and resident memory follows the budget.
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

fn serve(args: config::ServeArgs) -> i32 {
    let settings = match args.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("larder: {e}");
            return 2;
        }
    };
    let mut filter = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_level.clone());
    if settings.access_log {
        filter.push_str(",larder::access=info");
    }
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    fixed_mmap_threshold();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(lifecycle::run(settings)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("larder: {e}");
            1
        }
    }
}
