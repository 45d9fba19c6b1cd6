#!/usr/bin/env python3
"""The Python client next to its peers, in one run on one machine (BENCHMARKS.md, "The Python
client"):

- larder's `Client` (one thread) and `AsyncClient` (64 tasks) over HTTP;
- pymemcache against Debian's memcached, and against larder's memcached protocol;
- python-diskcache, a local library (no server, no network);
- a minimal socket loop (no client library: what any client's speed is bounded by) against
  larder's HTTP, larder's memcached protocol and memcached, 1 KiB only;
- Django's cache API (`cache.set`, `cache.get`, 1 KiB) through larder's `LarderCache`, Django's
  `PyMemcacheCache` against larder's memcached port and against memcached, and diskcache's
  `DjangoCache`.

For 1 KiB and 64 KiB values: sets, then gets of the keys set, each timed; ops/s, p50 and p99
per operation. The one-thread clients take turns (``interleaved``), so that their ratios hold
on a machine whose speed drifts; the asyncio client runs on its own. Servers on core 1 (`taskset`), this process on core 0.

usage: target/python/bin/python bench/python-client.py [--ops 20000] [--slices 20] [--larder target/release/larder]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import diskcache
from pymemcache.client.base import Client as Memcache

import larder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def stats(name: str, size: int, op: str, lat: List[float], wall: float) -> Dict[str, Any]:
    lat.sort()
    pct = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6  # noqa: E731
    return {"client": name, "size": size, "op": op, "ops": len(lat) / wall, "p50_us": pct(0.5), "p99_us": pct(0.99)}


def timed_sync(n: int, f: Callable[[int], Any]) -> tuple[List[float], float]:
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        f(i)
        lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - start


def interleaved(clients: Dict[str, Dict[str, Callable[[int], Any]]], size: int, n: int, slices: int) -> List[Dict[str, Any]]:
    """Each client's sets, then each client's gets, ``n`` of each, taken in turns of ``n /
    slices`` operations: a client's figures come from the same minutes as the others', so
    the machine's drift (large here: a row run a minute later can be 30% slower) falls on
    all of them alike."""
    rows = []
    for op in ("set", "get"):
        lat: Dict[str, List[float]] = {name: [] for name in clients}
        spent = dict.fromkeys(clients, 0.0)
        step = max(1, n // slices)
        for lo in range(0, n, step):
            for name, ops in clients.items():
                got, wall = timed_sync(min(step, n - lo), lambda i: ops[op](lo + i))
                lat[name] += got
                spent[name] += wall
        rows += [stats(name, size, op, lat[name], spent[name]) for name in clients]
    return rows


async def timed_async(n: int, tasks: int, f: Callable[[int], Any]) -> tuple[List[float], float]:
    lat: List[float] = []

    async def worker(w: int) -> None:
        for i in range(w, n, tasks):
            t = time.perf_counter()
            await f(i)
            lat.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(tasks)))
    return lat, time.perf_counter() - start


def minimal(value: bytes, http: int, mc_larder: int, mc: int) -> Dict[str, Dict[str, Callable[[int], Any]]]:
    """What a client without any code of its own would get: a socket, the request prebuilt
    but for the key, one ``sendall``, ``recv`` until the answer is whole. The bound that no
    client library can pass against each server."""

    def connect(port: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def http_answer(s: socket.socket) -> None:
        buf = s.recv(16384)
        while b"\r\n\r\n" not in buf:
            buf += s.recv(16384)
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += s.recv(65536)

    def until(s: socket.socket, end: bytes) -> None:
        buf = s.recv(16384)
        while not buf.endswith(end):
            buf += s.recv(65536)

    h, ml, m = connect(http), connect(mc_larder), connect(mc)
    size = len(value)
    ops: Dict[str, Dict[str, Callable[[int], Any]]] = {
        "minimal socket loop → larder (HTTP) (1 thread)": {
            "set": lambda i: (h.sendall(b"PUT /n/%d HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n" % (i, size) + value), http_answer(h)),
            "get": lambda i: (h.sendall(b"GET /n/%d HTTP/1.1\r\nHost: b\r\n\r\n" % i), http_answer(h)),
        },
    }
    for name, s in (("minimal socket loop → larder (memcached protocol) (1 thread)", ml), ("minimal socket loop → memcached 1.6 (1 thread)", m)):
        ops[name] = {
            "set": lambda i, s=s: (s.sendall(b"set n%d 0 0 %d\r\n" % (i, size) + value + b"\r\n"), until(s, b"\r\n")),
            "get": lambda i, s=s: (s.sendall(b"get n%d\r\n" % i), until(s, b"END\r\n")),
        }
    return ops


def django(value: bytes, http: int, mc_larder: int, mc: int, tmp: str) -> Dict[str, Dict[str, Callable[[int], Any]]]:
    import django
    from django.conf import settings

    backends = {
        "Django: larder.django.LarderCache": {"BACKEND": "larder.django.LarderCache", "LOCATION": f"http://127.0.0.1:{http}"},
        "Django: PyMemcacheCache → larder": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache", "LOCATION": f"127.0.0.1:{mc_larder}"},
        "Django: PyMemcacheCache → memcached 1.6": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache", "LOCATION": f"127.0.0.1:{mc}"},
        "Django: diskcache.DjangoCache (local)": {"BACKEND": "diskcache.DjangoCache", "LOCATION": f"{tmp}/django-diskcache"},
    }
    # A namespace each: two backends share larder's store, and their turns interleave.
    for i, cfg in enumerate(backends.values()):
        cfg["KEY_PREFIX"] = f"b{i}"
    if not settings.configured:
        settings.configure(CACHES={**{name: cfg for name, cfg in backends.items()}, "default": backends[next(iter(backends))]})
        django.setup()
    from django.core.cache import caches

    ops: Dict[str, Dict[str, Callable[[int], Any]]] = {}
    for name in backends:
        cache = caches[name]
        ops[name + " (1 thread)"] = {
            "set": lambda i, cache=cache: cache.set(f"dj{i}", value, 600),
            "get": lambda i, cache=cache: cache.get(f"dj{i}"),
        }
    return ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--larder", default="target/release/larder")
    ap.add_argument("--memcached", default="/usr/bin/memcached")
    ap.add_argument("--slices", type=int, default=20, help="turns each comparison is taken in")
    a = ap.parse_args()
    os.sched_setaffinity(0, {0})
    tmp = tempfile.mkdtemp(prefix="larder-pybench-")
    http, mc_larder, mc = free_port(), free_port(), free_port()
    procs = [
        subprocess.Popen(["taskset", "-c", "1", a.larder, "serve", "--listen", f"127.0.0.1:{http}",
                          "--memcache-listen", f"127.0.0.1:{mc_larder}", "--data-dir", f"{tmp}/larder",
                          "--volume-size", "256MiB", "--volume-count", "8", "--log-level", "error"],
                         stdout=subprocess.DEVNULL),
        subprocess.Popen(["taskset", "-c", "1", a.memcached, "-l", "127.0.0.1", "-p", str(mc), "-U", "0",
                          "-t", "1", "-m", "1024", "-u", "nobody"], stdout=subprocess.DEVNULL),
    ]
    rows: List[Dict[str, Any]] = []
    try:
        for p in (http, mc_larder, mc):
            wait_port(p)
        for size in (1 << 10, 64 << 10):
            value = os.urandom(size)
            n = a.ops if size <= 1024 else a.ops // 4
            c = larder.Client(f"http://127.0.0.1:{http}")
            d = diskcache.Cache(f"{tmp}/diskcache")
            sync: Dict[str, Dict[str, Callable[[int], Any]]] = {
                "larder Client (1 thread)": {"set": lambda i: c.set(f"s{size}/{i}", value), "get": lambda i: c.get(f"s{size}/{i}")},
            }
            for name, port in (("pymemcache → memcached 1.6", mc), ("pymemcache → larder (memcached protocol)", mc_larder)):
                m = Memcache(("127.0.0.1", port), default_noreply=False)
                sync[name + " (1 thread)"] = {
                    "set": lambda i, m=m: m.set(f"m{size}-{i}", value),
                    "get": lambda i, m=m: m.get(f"m{size}-{i}"),
                }
            sync["python-diskcache (local, 1 thread)"] = {
                "set": lambda i: d.set(f"d{size}/{i}", value),
                "get": lambda i: d.get(f"d{size}/{i}"),
            }
            if size <= 1024:
                sync.update(minimal(value, http, mc_larder, mc))
            rows.extend(interleaved(sync, size, n, a.slices))
            d.close()

            async def run_async() -> None:
                async with larder.AsyncClient(f"http://127.0.0.1:{http}") as ac:
                    for op, f in (("set", lambda i: ac.set(f"a{size}/{i}", value)), ("get", lambda i: ac.get(f"a{size}/{i}"))):
                        rows.append(stats("larder AsyncClient (64 tasks)", size, op, *(await timed_async(n, 64, f))))

            asyncio.run(run_async())
            # Django's cache API (1 KiB only) through each backend: the same calls an
            # application makes, with Django's key making and pickling on top.
            if size <= 1024:
                rows.extend(interleaved(django(value, http, mc_larder, mc, tmp), size, n, a.slices))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    peer = {(r["size"], r["op"]): r["ops"] for r in rows if r["client"] == "pymemcache → memcached 1.6 (1 thread)"}
    print("| client | value | op | ops/s | ÷ pymemcache → memcached | p50 µs | p99 µs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["ops"] / peer[(r["size"], r["op"])]
        print(f"| {r['client']} | {r['size'] >> 10} KiB | {r['op']} | {r['ops']:.0f} | {ratio:.2f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
