#!/usr/bin/env python3
"""What a change costs the memcached door, in instructions, which (unlike CPU time) do not
depend on what else the machine is doing: two larder builds, A and B, each under valgrind's
callgrind, serve the same requests of each kind (text set and get, meta ms and mg, binary set
and get; 1 KiB values, one request in flight), and the server's instructions per request are
printed for each, with B / A. Every instruction of the server process counts (all threads).

usage: target/python/bin/python bench/memcache-instructions-ab.py BUILD_A [BUILD_B] [--ops 2000]
(BUILD_B defaults to target/release/larder). Needs valgrind (Debian's package).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, List

from benchlib import binary, binary_done, connect, free_port, until


def total(out: str) -> int:
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"no totals in {out}")


def measure(build: str, name: str, ops: int, tmp: str) -> Dict[str, float]:
    port = free_port()
    out = f"{tmp}/{name}.out"
    server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                               f"--log-file={tmp}/{name}.vg", build, "serve",
                               "--listen", f"127.0.0.1:{free_port()}", "--memcache-listen", f"127.0.0.1:{port}",
                               "--data-dir", f"{tmp}/{name}", "--volume-size", "64MiB", "--volume-count", "4",
                               "--log-level", "error"], stdout=subprocess.DEVNULL)
    value = b"v" * 1024
    keys = 200
    try:
        t, b = connect(port, wait=120), connect(port, wait=120)  # valgrind starts slowly
        kinds: Dict[str, Callable[[int], None]] = {
            "text set": lambda i: (t.sendall(b"set c%d 0 0 1024\r\n" % i + value + b"\r\n"),
                                   until(t, lambda x: x.endswith(b"\r\n")))[1],
            "text get": lambda i: (t.sendall(b"get c%d\r\n" % i), until(t, lambda x: x.endswith(b"END\r\n")))[1],
            "meta ms": lambda i: (t.sendall(b"ms c%d 1024\r\n" % i + value + b"\r\n"),
                                  until(t, lambda x: x.endswith(b"\r\n")))[1],
            "meta mg": lambda i: (t.sendall(b"mg c%d v\r\n" % i), until(t, lambda x: len(x) >= 1035))[1],
            "binary set": lambda i: (b.sendall(binary(0x01, b"c%d" % i, bytes(8), value)), until(b, binary_done))[1],
            "binary get": lambda i: (b.sendall(binary(0x00, b"c%d" % i)), until(b, binary_done))[1],
        }
        for f in kinds.values():  # every key stored and read before anything is counted
            for i in range(keys):
                f(i)
        per: Dict[str, float] = {}
        for kind, f in kinds.items():
            subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(ops):
                f(i % keys)
            before = set(glob.glob(f"{out}.*"))
            subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dump = sorted(set(glob.glob(f"{out}.*")) - before, key=os.path.getmtime)[-1]
            per[kind] = total(dump) / ops
        return per
    finally:
        server.terminate()
        server.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b", nargs="?", default="target/release/larder")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--keep", help="keep callgrind's dumps here (one per build and kind), for callgrind_annotate")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed: apt-get install valgrind")
    tmp = a.keep or tempfile.mkdtemp(prefix="larder-ir-")
    os.makedirs(tmp, exist_ok=True)
    try:
        results: List[Dict[str, float]] = [measure(a.a, "a", a.ops, tmp), measure(a.b, "b", a.ops, tmp)]
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("| request (1 KiB) | A instructions | B instructions | B / A |")
    print("|---|---|---|---|")
    for kind in results[0]:
        x, y = results[0][kind], results[1][kind]
        print(f"| {kind} | {x:,.0f} | {y:,.0f} | {y / x:.3f} |")


if __name__ == "__main__":
    main()
