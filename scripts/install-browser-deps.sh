#!/usr/bin/env bash
# Installs what the status page's browser tests (crates/larder-server/tests/browser) need:
# Debian's Chromium and its chromedriver (/usr/bin/chromium, /usr/bin/chromedriver; the tests
# name both, so Selenium never downloads a browser or a driver of its own), and Selenium into
# the project's virtual environment, target/python, which scripts/install-python-deps.sh
# makes (run it first). Reuses whatever is there already.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python
selenium_version=4.50.0

if [ ! -x "$venv/bin/python" ]; then
  echo "install-browser-deps: no virtual environment at $venv; run scripts/install-python-deps.sh first" >&2
  exit 1
fi

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver fonts-dejavu-core
  for bin in /usr/bin/chromium /usr/bin/chromedriver; do
    if [ ! -x "$bin" ]; then
      echo "install-browser-deps: $bin is still missing after apt-get install" >&2
      exit 1
    fi
  done
fi

if ! "$venv/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '$selenium_version')" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check "selenium==$selenium_version"
fi
