#!/usr/bin/env python3
"""What compression costs a request (issue 42, acceptance 3), side by side in one run.

Two larders, one with --compression none and one with --compression zstd (its default
level), both with a memory tier that holds every value (--promote-after 1), each in turn on
core 1, one client on core 0 with one request in flight. Server CPU (user + system, from
/proc) per request, the kinds taking turns in slices so that drift falls on all alike:

- GET of a 4 KiB HTML value from the memory tier: stored raw (asked for by a client that
  accepts zstd); stored coded and sent coded to that client; stored coded and sent decoded to
  a client that does not accept zstd.
- PUT of a 4 KiB HTML value, and of 4 KiB of random bytes (incompressible), to each server.
- A third larder, --compression zstd --compression-dictionary auto, whose prefix `h` has a
  dictionary trained from the values PUT while setting up: the GET of a value coded with it
  (always sent decoded: clients hold no dictionary), and the PUT of an HTML value under `h`.

The HTML values are the first 4 KiB of pages of Debian's package documentation (the corpus of
bench/compression.py). Ratios are to the same request against the server storing raw.

usage: target/python/bin/python bench/compression-cost.py [--ops 30000] [--slices 10]
       [--larder target/release/larder] [--out bench/results/issue42-cost.md]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

from benchlib import connect, free_port, http_done, take_turns, until

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
compression = __import__("compression")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = 1000
SIZE = 4096


def start(binary: str, data: str, args: List[str]) -> Tuple[subprocess.Popen, int]:
    port = free_port()
    p = subprocess.Popen(["taskset", "-c", "1", binary, "serve", "--listen", f"127.0.0.1:{port}",
                          "--data-dir", data, "--volume-size", "256MiB", "--volume-count", "8",
                          "--memory-capacity", "1GiB", "--promote-after", "1", "--log-level", "error"] + args,
                         stdout=subprocess.DEVNULL)
    s = connect(port)
    while True:  # the port accepts before the store is open
        s.sendall(b"GET /_larder/health HTTP/1.1\r\nHost: b\r\n\r\n")
        buf = s.recv(4096)
        if buf.startswith(b"HTTP/1.1 200"):
            break
        time.sleep(0.05)
    s.close()
    return p, port


def http_get(port: int, path: str) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        return c.getresponse().read()
    finally:
        c.close()


def exchange(s: socket.socket, req: bytes) -> None:
    s.sendall(req)
    until(s, http_done)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--larder", default=os.path.join(ROOT, "target/release/larder"))
    ap.add_argument("--ops", type=int, default=30000)
    ap.add_argument("--slices", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/issue42-cost.md"))
    a = ap.parse_args()
    if os.sched_getaffinity(0) != {0}:
        os.sched_setaffinity(0, {0})
    pages = [body[:SIZE] for _, body in compression.corpus("html", 400) if len(body) >= SIZE]
    html = [pages[i % len(pages)] for i in range(KEYS)]
    noise = [os.urandom(SIZE) for _ in range(KEYS)]
    tmp = tempfile.mkdtemp(prefix="larder-compression-cost-")
    procs = []
    try:
        raw, rport = start(a.larder, os.path.join(tmp, "none"), [])
        coded, cport = start(a.larder, os.path.join(tmp, "zstd"), ["--compression", "zstd"])
        dicted, dport = start(a.larder, os.path.join(tmp, "dict"),
                              ["--compression", "zstd", "--compression-dictionary", "auto"])
        procs = [raw, coded, dicted]
        conns = {}
        for name, port in (("none", rport), ("zstd", cport), ("dict", dport)):
            s = connect(port)
            for i in range(KEYS):
                exchange(s, b"PUT /h/%d HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n" % (i, SIZE) + html[i])
            if name == "dict":
                # The dictionary trains from the first values; then every value is PUT again,
                # coded with it.
                deadline = time.time() + 60
                while json.loads(http_get(port, "/_larder/stats"))["compression"]["dictionaries"]["trained"] < 1:
                    if time.time() > deadline:
                        sys.exit("no dictionary was trained")
                    time.sleep(0.05)
                for i in range(KEYS):
                    exchange(s, b"PUT /h/%d HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n" % (i, SIZE) + html[i])
                d = json.loads(http_get(port, "/_larder/stats"))["compression"]["dictionaries"]["each"][0]
                if d["values"] < KEYS:
                    sys.exit(f"values not coded with the dictionary: {d}")
            for _ in range(2):  # promoted on the first read: the second is a memory hit
                for i in range(KEYS):
                    exchange(s, b"GET /h/%d HTTP/1.1\r\nHost: b\r\n\r\n" % i)
            conns[name] = s
        check = connect(cport)
        check.sendall(b"GET /h/0 HTTP/1.1\r\nHost: b\r\nAccept-Encoding: zstd\r\n\r\n")
        head = check.recv(65536)
        if b"content-encoding: zstd" not in head.lower() or b"x-cache: memc" not in head.lower():
            sys.exit(f"the coded server did not answer zstd from memory: {head[:400]!r}")
        check.close()

        def get(s: socket.socket, extra: bytes = b"") -> Callable[[int], None]:
            return lambda i: exchange(s, b"GET /h/%d HTTP/1.1\r\nHost: b\r\n%s\r\n" % (i, extra))

        def put(s: socket.socket, prefix: bytes, values: List[bytes]) -> Callable[[int], None]:
            return lambda i: exchange(s, b"PUT /%s/%d HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n"
                                      % (prefix, i, SIZE) + values[i])

        extra = {k: connect(p) for k, p in (("none", rport), ("zstd", cport), ("dict", dport))}
        kinds: Dict[str, Tuple[int, Callable[[int], None]]] = {
            # The same request to both: a client that accepts zstd, as browsers and curl
            # --compressed do.
            "GET, stored raw": (raw.pid, get(conns["none"], b"Accept-Encoding: gzip, zstd\r\n")),
            "GET, stored zstd, sent coded": (coded.pid, get(conns["zstd"], b"Accept-Encoding: gzip, zstd\r\n")),
            "GET, stored zstd, sent decoded": (coded.pid, get(extra["zstd"])),
            "PUT HTML, none": (raw.pid, put(extra["none"], b"w", html)),
            "PUT HTML, zstd": (coded.pid, put(extra["zstd"], b"w", html)),
            "PUT random, none": (raw.pid, put(conns["none"], b"r", noise)),
            "PUT random, zstd": (coded.pid, put(conns["zstd"], b"r", noise)),
            "GET, stored with a dictionary": (dicted.pid, get(conns["dict"], b"Accept-Encoding: gzip, zstd\r\n")),
            "PUT HTML, zstd with a dictionary": (dicted.pid, put(extra["dict"], b"h", html)),
        }
        spent, n = take_turns(kinds, a.ops, a.slices, KEYS)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    us = {k: (v[0] + v[1]) / n * 1e6 for k, v in spent.items()}
    rt = {k: v[2] / n * 1e6 for k, v in spent.items()}
    pairs = [("GET, stored zstd, sent coded", "GET, stored raw", 1.0),
             ("GET, stored zstd, sent decoded", "GET, stored raw", 1.3),
             ("PUT HTML, zstd", "PUT HTML, none", 1.5),
             ("PUT random, zstd", "PUT random, none", 1.05),
             ("GET, stored with a dictionary", "GET, stored raw", 1.3),
             ("PUT HTML, zstd with a dictionary", "PUT HTML, none", 1.5)]
    md = [f"{time.strftime('%Y-%m-%d %H:%M')}; {n} requests of each kind, one in flight, in {a.slices} slices taking turns; "
          f"servers on core 1, client on core 0; values of {SIZE} bytes ({len(pages)} pages of Debian's package documentation, "
          f"cut to 4 KiB, over {KEYS} keys; random bytes from os.urandom).", "",
          "| request | server CPU µs | round trip µs |", "|---|---|---|"]
    md += [f"| {k} | {us[k]:.1f} | {rt[k]:.1f} |" for k in kinds]
    md += ["", "| ratio | server CPU | target |", "|---|---|---|"]
    md += [f"| {a_} / {b} | {us[a_] / us[b]:.2f}x | ≤ {t}x |" for a_, b, t in pairs]
    text = "\n".join(md) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
