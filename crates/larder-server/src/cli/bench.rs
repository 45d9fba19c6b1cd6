//! `larder bench`: hands over to the `larder-bench` tool.

use super::client::fail;
use clap::Args;
use std::path::PathBuf;

/// `larder bench ARGS…`: runs `larder-bench` with the same arguments.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Arguments for larder-bench (e.g. `http --url http://127.0.0.1:1234/b/ --duration 10s`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// `larder bench`: runs `larder-bench` from beside this binary, else from PATH.
pub fn bench(a: BenchArgs) -> i32 {
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("larder-bench")));
    let program = beside.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from("larder-bench"));
    match std::process::Command::new(&program).args(&a.args).status() {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => fail(format!(
            "cannot run {}: {e} (build it with `cargo build --release -p larder-bench`)",
            program.display()
        )),
    }
}
