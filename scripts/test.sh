#!/usr/bin/env bash
# The project's one test command: formatting, lints, then every test of the workspace.
# CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# The benchmark smoke tests need nginx (Debian package); install what is missing.
scripts/install-bench-deps.sh
# The Python client's tests need their packages, in a virtual environment of the project's.
scripts/install-python-deps.sh
# The status page's tests drive Debian's Chromium through Selenium.
scripts/install-browser-deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --workspace
# The Python client: its types checked, then its tests against the binary just built.
(cd clients/python && ../../target/python/bin/mypy)
LARDER_BIN=target/debug/larder target/python/bin/pytest -q clients/python/tests
# The status page in a real browser, against the binary just built.
LARDER_BIN=target/debug/larder target/python/bin/pytest -q crates/larder-server/tests/browser
