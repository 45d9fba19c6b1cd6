#!/usr/bin/env bash
# The project's one test command: formatting, lints, then every test of the workspace.
# CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# The benchmark smoke tests need nginx (Debian package); install what is missing.
scripts/install-bench-deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --workspace
