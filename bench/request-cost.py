#!/usr/bin/env python3
"""What a request costs larder, against memcached and against the floor (issue 41), one run:

1. One request in flight, 1 KiB values: server CPU (user + system, from /proc) per request and
   the round trip, for memcached's text get and set, larder's memcached get and set, and
   larder's HTTP GET and PUT; each as a ratio to memcached's same operation (GET and get to
   get, PUT and set to set). The kinds take turns in slices, so that drift falls on all alike.
2. wrk, 64 connections, GET 4 KiB: the floor (bench/floor/responder.c, built here: one epoll
   thread that finds the end of each request head and writes a fixed answer), larder from its
   memory tier, and nginx serving the same values as files (bench/nginx.conf.in); server CPU
   per request as a ratio to the floor's, req/s as a ratio to nginx's. Rounds alternate, medians.

Every server runs on core 1 and every client on core 0.

usage: target/python/bin/python bench/request-cost.py [--ops 40000] [--duration 10] [--rounds 3]
       [--larder target/release/larder] [--larder-b OTHER_BUILD]

With --larder-b, a second larder build (say, the one before a change) is measured in the same
slices and rounds, its rows marked "B": a before-and-after in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Callable, Dict, List, Tuple

from benchlib import connect, cpu, free_port, http_done, take_turns, until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_larder(binary: str, data: str, http: int, memcache: int | None = None) -> subprocess.Popen:
    args = ["taskset", "-c", "1", binary, "serve", "--listen", f"127.0.0.1:{http}", "--data-dir", data,
            "--volume-size", "256MiB", "--volume-count", "8", "--memory-capacity", "1GiB", "--log-level", "error"]
    if memcache:
        args += ["--memcache-listen", f"127.0.0.1:{memcache}"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    deadline = time.time() + 60
    while True:  # the port accepts before the store is open: wait for its health
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/_larder/health", timeout=5) as r:
                if r.status == 200:
                    return p
        except OSError:
            pass
        if time.time() > deadline or p.poll() is not None:
            raise RuntimeError(f"{binary} did not become healthy")
        time.sleep(0.05)


def one_in_flight(a: argparse.Namespace, larders: List[Tuple[str, str]], tmp: str) -> None:
    value = os.urandom(1024)
    keys = 2000  # the same keys again and again: gets are hits in larder's memory tier
    procs: List[subprocess.Popen] = []
    kinds: Dict[str, Tuple[int, Callable[[int], None]]] = {}
    try:
        mc = free_port()
        memcached = subprocess.Popen(["taskset", "-c", "1", a.memcached, "-l", "127.0.0.1", "-p", str(mc), "-U", "0",
                                      "-t", "1", "-m", "1024", "-u", "nobody"], stdout=subprocess.DEVNULL)
        procs.append(memcached)
        peers = [("memcached", memcached.pid, connect(mc))]
        https = []
        for name, binary in larders:
            http, memcache = free_port(), free_port()
            p = start_larder(binary, f"{tmp}/{name}-1", http, memcache)
            procs.append(p)
            peers.append((f"{name} memcached", p.pid, connect(memcache)))
            https.append((name, p.pid, connect(http)))
        for name, pid, s in peers:
            for i in range(keys):
                s.sendall(b"set c%d 0 0 1024\r\n" % i + value + b"\r\n")
                until(s, lambda b: b.endswith(b"\r\n"))
            kinds[f"{name} get"] = (pid, lambda i, s=s: (s.sendall(b"get c%d\r\n" % i),
                                                         until(s, lambda b: b.endswith(b"END\r\n")))[1])
            kinds[f"{name} set"] = (pid, lambda i, s=s: (s.sendall(b"set w%d 0 0 1024\r\n" % i + value + b"\r\n"),
                                                         until(s, lambda b: b.endswith(b"\r\n")))[1])
        for name, pid, h in https:
            kinds[f"{name} HTTP GET"] = (pid, lambda i, h=h: (h.sendall(
                b"GET /c/%d HTTP/1.1\r\nHost: b\r\n\r\n" % i), until(h, http_done))[1])
            kinds[f"{name} HTTP PUT"] = (pid, lambda i, h=h: (h.sendall(
                b"PUT /w/%d HTTP/1.1\r\nHost: b\r\nContent-Length: 1024\r\n\r\n" % i + value), until(h, http_done))[1])
            # The gets' keys, stored once here: the writes above go to keys of their own, so
            # that no write replaces a value the gets read (a replaced value is read from
            # the disk tier until it is promoted again, which would measure that instead).
            for i in range(keys):
                h.sendall(b"PUT /c/%d HTTP/1.1\r\nHost: b\r\nContent-Length: 1024\r\n\r\n" % i + value)
                until(h, http_done)
        # Every key written, and every get's key read twice (larder promotes to memory on the
        # second read).
        for _ in range(2):
            for name, (_, f) in kinds.items():
                if name.endswith("set") or name.endswith("PUT"):
                    for i in range(keys):
                        f(i)
            for name, (_, f) in kinds.items():
                if name.endswith("get") or name.endswith("GET"):
                    for i in range(keys):
                        f(i)
        spent, n = take_turns(kinds, a.ops, a.slices, keys)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    print(f"| one request in flight, 1 KiB ({n} each) | server CPU per request (user + system) "
          "| ratio to memcached's same operation | round trip | ratio |")
    print("|---|---|---|---|---|")
    order = [("memcached", "get")] + [(f"{name} memcached", "get") for name, _ in larders] + \
            [(f"{name} HTTP", "GET") for name, _ in larders] + [("memcached", "set")] + \
            [(f"{name} memcached", "set") for name, _ in larders] + [(f"{name} HTTP", "PUT") for name, _ in larders]
    for who, op in order:
        u, sy, w = spent[f"{who} {op}"]
        bu, bs, base_w = spent["memcached " + ("get" if op in ("get", "GET") else "set")]
        c, base_c = u + sy, bu + bs
        label = f"memcached text `{op}`" if who == "memcached" else f"{who} `{op}`"
        print(f"| {label} | {c / n * 1e6:.1f} µs | {c / base_c:.2f} | {w / n * 1e6:.1f} µs | {w / base_w:.2f} |")


def wrk(port: int, keys: int, duration: int) -> Tuple[float, int, str]:
    """One wrk run of GETs on keys /g0../g<keys-1>: req/s, requests, and wrk's report."""
    env = dict(os.environ, N=str(keys), PREFIX="/g")
    out = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c64", f"-d{duration}s", "--latency", "-s",
                          f"{ROOT}/bench/wrk/get.lua", f"http://127.0.0.1:{port}"],
                         env=env, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"a GET run had errors, so it is invalid:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return rps, requests, out


def under_load(a: argparse.Namespace, larders: List[Tuple[str, str]], tmp: str) -> None:
    subprocess.run([f"{ROOT}/scripts/install-bench-deps.sh"], check=True, stdout=subprocess.DEVNULL)
    floor_bin = f"{tmp}/responder"
    subprocess.run(["cc", "-O2", "-o", floor_bin, f"{ROOT}/bench/floor/responder.c"], check=True)
    procs: List[subprocess.Popen] = []
    servers: List[Tuple[str, int, int]] = []  # name, pid, port
    try:
        port = free_port()
        p = subprocess.Popen(["taskset", "-c", "1", floor_bin, str(port), "4096"])
        procs.append(p)
        connect(port).close()
        servers.append(("bare C epoll responder (no parsing, fixed answer)", p.pid, port))
        for name, binary in larders:
            port = free_port()
            p = start_larder(binary, f"{tmp}/{name}-2", port)
            procs.append(p)
            servers.append((f"{name} (memory tier)", p.pid, port))
        ngx = f"{tmp}/ngx"
        for d in ("logs", "tmp", "root"):
            os.makedirs(f"{ngx}/{d}", exist_ok=True)
        port = free_port()
        with open(f"{ROOT}/bench/nginx.conf.in") as f:
            conf = f.read().replace("@DIR@", ngx).replace("@PORT@", str(port))
        with open(f"{ngx}/nginx.conf", "w") as f:
            f.write(conf)
        p = subprocess.Popen(["taskset", "-c", "1", a.nginx, "-c", f"{ngx}/nginx.conf"])
        procs.append(p)
        connect(port).close()
        servers.append(("nginx (static files)", p.pid, port))
        for name, _, port in servers[1:]:
            # PUT every key, and (larders) read each twice, so that it is in the memory tier.
            loader = f"{ROOT}/target/release/larder-bench"
            base = ["taskset", "-c", "0", loader, "http", f"http://127.0.0.1:{port}/g", "--distribution", "sequential",
                    "--keys", str(a.keys), "--requests", str(a.keys), "--value-size", "4096", "--connections", "16",
                    "--quiet"]
            subprocess.run(base + ["--workload", "put"], check=True)
            if name.startswith("nginx"):
                continue
            for _ in range(2):
                subprocess.run(base + ["--workload", "get"], check=True)
        def stats(port: int) -> Dict[str, int]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_larder/stats") as resp:
                return json.load(resp)

        before = {name: stats(port) for name, _, port in servers[1:-1]}
        runs: Dict[str, List[Tuple[float, float]]] = {name: [] for name, _, _ in servers}
        for r in range(a.rounds):
            for name, pid, port in servers:
                u0, s0 = cpu(pid, children=True)
                rps, requests, _ = wrk(port, a.keys, a.duration)
                u1, s1 = cpu(pid, children=True)
                us = ((u1 - u0) + (s1 - s0)) / requests * 1e6
                runs[name].append((rps, us))
                print(f"round {r + 1}: {name}: {rps:,.0f} req/s, {us:.1f} µs of server CPU per request",
                      file=sys.stderr)
        memory = {}  # the share of the timed GETs answered from the memory tier
        for name, _, port in servers[1:-1]:
            after = stats(port)
            hits = after["hits"] - before[name]["hits"]
            memory[name] = (after["memory_hits"] - before[name]["memory_hits"]) / max(1, hits)
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    med = {name: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for name, v in runs.items()}
    floor = med[servers[0][0]][1]
    nginx = med[servers[-1][0]][0]
    print()
    print(f"| GET 4 KiB, wrk 64 connections ({a.rounds} rounds of {a.duration} s, medians) | req/s "
          "| server CPU per request | CPU ratio to the floor | req/s ratio to nginx |")
    print("|---|---|---|---|---|")
    for name, _, _ in servers:
        rps, us = med[name]
        note = f" ({memory[name]:.1%} of hits from memory)" if name in memory else ""
        print(f"| {name}{note} | {rps:,.0f} | {us:.1f} µs | {us / floor:.2f} | {rps / nginx:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=40000, help="requests of each kind, one in flight")
    ap.add_argument("--slices", type=int, default=20)
    ap.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keys", type=int, default=20000, help="4 KiB keys under wrk")
    ap.add_argument("--larder", default=f"{ROOT}/target/release/larder")
    ap.add_argument("--larder-b", help="a second larder build, measured alongside (rows marked B)")
    ap.add_argument("--memcached", default="/usr/bin/memcached")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--only", choices=["one", "load"], help="run one of the two parts")
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    larders = [("larder", a.larder)] + ([("larder B", a.larder_b)] if a.larder_b else [])
    tmp = tempfile.mkdtemp(prefix="larder-cost-")
    try:
        if a.only != "load":
            one_in_flight(a, larders, tmp)
        if a.only != "one":
            under_load(a, larders, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
