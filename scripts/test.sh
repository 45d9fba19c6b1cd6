#!/usr/bin/env bash
# The project's one test command: formatting, lints, then every test of the workspace.
# CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --workspace
