#!/usr/bin/env python3
"""The Python client's `get_many` of 100 keys of 1 KiB against one larder, timed; with
`--other SRC`, a second copy of the client (its `src` folder: say, the commit before a change,
from `git archive`) is timed the same way, in turns. larder on core 1, this process on core 0
(the client's threads, if it uses any, share it).

usage: target/python/bin/python bench/python-get-many.py [--other SRC] [--rounds 5] [--calls 100]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(src: str):  # type: ignore[no-untyped-def]
    """The `larder` package found under `src`, imported afresh."""
    for name in [m for m in sys.modules if m == "larder" or m.startswith("larder.")]:
        del sys.modules[name]
    sys.path.insert(0, src)
    try:
        return importlib.import_module("larder")
    finally:
        sys.path.remove(src)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--larder", default=f"{ROOT}/target/release/larder")
    ap.add_argument("--other", help="the src folder of another copy of the client")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100)
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.Popen(["taskset", "-c", "1", a.larder, "serve", "--listen", f"127.0.0.1:{port}",
                              "--data-dir", tmp, "--volume-size", "256MiB", "--volume-count", "8",
                              "--log-level", "error"], stdout=subprocess.DEVNULL)
        try:
            clients = {"this client": load(f"{ROOT}/clients/python/src")}
            if a.other:
                clients["other"] = load(a.other)
            url = f"http://127.0.0.1:{port}"
            keys = [f"gm/{i}" for i in range(100)]
            deadline = time.time() + 60
            while True:
                try:
                    clients["this client"].Client(url).set_many({k: os.urandom(1024) for k in keys})
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.1)
            made = {name: m.Client(url) for name, m in clients.items()}
            times: dict[str, list[float]] = {name: [] for name in made}
            for _ in range(a.rounds):
                for name, c in made.items():
                    t = time.perf_counter()
                    for _ in range(a.calls):
                        if len(c.get_many(keys)) != len(keys):
                            raise RuntimeError(f"{name}: a key was missing")
                    times[name].append((time.perf_counter() - t) / a.calls)
        finally:
            p.terminate()
            p.wait(30)
    print("| client | get_many of 100 keys of 1 KiB (median of rounds) |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e6:,.0f} µs |")


if __name__ == "__main__":
    main()
