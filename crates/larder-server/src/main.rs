//! The `larder` binary: a hybrid memory + disk key-value cache server over HTTP.
// The stats object is one `json!` literal with many fields.
#![recursion_limit = "256"]

mod config;
mod headers;
mod http;
mod key;
mod server;

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
    Serve(config::ServeArgs),
}

fn main() {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let settings = match args.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("larder: {e}");
            std::process::exit(2);
        }
    };
    let mut filter = std::env::var("RUST_LOG").unwrap_or_else(|_| settings.log_level.clone());
    if settings.access_log {
        filter.push_str(",larder::access=info");
    }
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    if let Err(e) = rt.block_on(server::run(settings)) {
        eprintln!("larder: {e}");
        std::process::exit(1);
    }
}
