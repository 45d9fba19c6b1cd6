#!/usr/bin/env python3
"""Server CPU per request, larder against memcached (BENCHMARKS.md, issue 33, "Second pass"):
one connection, one request at a time, 1 KiB values, the servers on core 1 and this process on
core 0. For each server and kind of request, the user and system CPU time the server's
threads spent (from /proc), divided by the requests made, and the round trip. The kinds take
turns in slices, so that drift falls on all alike.

usage: target/python/bin/python bench/server-cpu.py [--ops 40000] [--larder target/release/larder]
       [--larder-b OTHER_BUILD]

With --larder-b, a second larder build (say, the one before a change) serves the same
requests in the same slices, its rows marked "B": a before-and-after measured in one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, Tuple

from benchlib import binary, binary_done, connect, free_port, http_done, take_turns, until

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=40000)
    ap.add_argument("--slices", type=int, default=20)
    ap.add_argument("--larder", default="target/release/larder")
    ap.add_argument("--larder-b", help="a second larder build, measured alongside (rows marked B)")
    ap.add_argument("--memcached", default="/usr/bin/memcached")
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    tmp = tempfile.mkdtemp(prefix="larder-cpu-")
    mc = free_port()

    def start_larder(binary: str, name: str) -> Tuple[subprocess.Popen, int, int]:
        http, memcache = free_port(), free_port()
        p = subprocess.Popen(["taskset", "-c", "1", binary, "serve", "--listen", f"127.0.0.1:{http}",
                              "--memcache-listen", f"127.0.0.1:{memcache}", "--data-dir", f"{tmp}/{name}",
                              "--volume-size", "256MiB", "--volume-count", "8", "--log-level", "error"],
                             stdout=subprocess.DEVNULL)
        return p, http, memcache

    larders = [("larder", *start_larder(a.larder, "larder"))]
    if a.larder_b:
        larders.append(("larder B", *start_larder(a.larder_b, "larder-b")))
    memcached = subprocess.Popen(["taskset", "-c", "1", a.memcached, "-l", "127.0.0.1", "-p", str(mc), "-U", "0",
                                  "-t", "1", "-m", "1024", "-u", "nobody"], stdout=subprocess.DEVNULL)
    value = os.urandom(1024)
    keys = 2000  # the same keys again and again: gets are hits in larder's memory tier
    try:
        kinds: Dict[str, Tuple[int, Callable[[int], None]]] = {}
        peers = []
        for lname, larder, http, mc_larder in larders:
            h = connect(http)
            kinds[f"{lname} HTTP PUT"] = (larder.pid, lambda i, h=h: (h.sendall(
                b"PUT /c/%d HTTP/1.1\r\nHost: b\r\nContent-Length: 1024\r\n\r\n" % i + value), until(h, http_done))[1])
            kinds[f"{lname} HTTP GET"] = (larder.pid, lambda i, h=h: (h.sendall(
                b"GET /c/%d HTTP/1.1\r\nHost: b\r\n\r\n" % i), until(h, http_done))[1])
            # The binary protocol on a connection of its own (the first byte decides).
            peers.append((f"{lname} memcached", larder.pid, connect(mc_larder), connect(mc_larder)))
        peers.append(("memcached", memcached.pid, connect(mc), connect(mc)))
        for name, pid, s, bs in peers:
            kinds[f"{name} set"] = (pid, lambda i, s=s: (s.sendall(b"set c%d 0 0 1024\r\n" % i + value + b"\r\n"),
                                                         until(s, lambda b: b.endswith(b"\r\n")))[1])
            kinds[f"{name} get"] = (pid, lambda i, s=s: (s.sendall(b"get c%d\r\n" % i),
                                                         until(s, lambda b: b.endswith(b"END\r\n")))[1])
            kinds[f"{name} meta ms"] = (pid, lambda i, s=s: (s.sendall(b"ms c%d 1024\r\n" % i + value + b"\r\n"),
                                                             until(s, lambda b: b.endswith(b"\r\n")))[1])
            kinds[f"{name} meta mg"] = (pid, lambda i, s=s: (s.sendall(b"mg c%d v\r\n" % i),
                                                             until(s, lambda b: len(b) >= 1035))[1])
            kinds[f"{name} binary set"] = (pid, lambda i, s=bs: (s.sendall(
                binary(0x01, b"c%d" % i, bytes(8), value)), until(s, binary_done))[1])
            kinds[f"{name} binary get"] = (pid, lambda i, s=bs: (s.sendall(binary(0x00, b"c%d" % i)),
                                                                 until(s, binary_done))[1])
        for _, f in kinds.values():  # every key stored, and read once, before anything is timed
            for i in range(keys):
                f(i)
        spent, n = take_turns(kinds, a.ops, a.slices, keys)
    finally:
        for p in [lr[1] for lr in larders] + [memcached]:
            p.terminate()
            p.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print("| request (1 KiB) | server user µs | server system µs | round trip µs |")
    print("|---|---|---|---|")
    for name, (u, s, w) in spent.items():
        print(f"| {name} | {u / n * 1e6:.1f} | {s / n * 1e6:.1f} | {w / n * 1e6:.1f} |")


if __name__ == "__main__":
    main()
