"""Fixtures: real `larder` servers (the binary cargo builds), and the same tests run against
the sync client and, through a thin adapter, the asyncio one."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

import larder

ROOT = Path(__file__).resolve().parents[3]


def larder_bin() -> str:
    b = os.environ.get("LARDER_BIN") or str(ROOT / "target" / "debug" / "larder")
    if not os.path.exists(b):
        raise RuntimeError(f"no larder binary at {b}: build it with `cargo build` (the test command does)")
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """A running `larder serve` on a loopback port of its own."""

    def __init__(self, data: Path, *args: str, port: int = 0) -> None:
        self.port = port or free_port()
        self.data = data
        self.args = args
        self.proc: "subprocess.Popen[bytes] | None" = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ring = [] if "--volume-size" in self.args else ["--volume-size", "64MiB", "--volume-count", "8"]
        cmd = [larder_bin(), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data),
               *ring, *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            raise RuntimeError(f"larder did not start: {line!r}")
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"GET /_larder/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if b" 200 " in s.recv(100):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("larder did not become healthy")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None

    def rss(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "data")
    yield n
    n.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[List[Node]]:
    ns = [Node(tmp_path / f"data{i}") for i in range(3)]
    yield ns
    for n in ns:
        n.stop()


class AsyncAdapter:
    """The AsyncClient behind the sync client's API, each call run to completion on a loop of
    its own, so that one test body checks both clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.c = larder.AsyncClient(*args, **kwargs)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.c, name)
        if name in ("memoize",):
            def deco_factory(*a: Any, **k: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
                deco = attr(*a, **k)

                def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
                    wrapped = deco(fn)  # once, as the decorator is: its key is taken at the first call
                    return lambda *x, **y: self.run(wrapped(*x, **y))

                return decorate
            return deco_factory
        if name == "open":
            return lambda key: _AsyncReadView(self, attr(key))
        if callable(attr):
            return lambda *a, **k: self.run(attr(*a, **k))
        return attr

    def __getitem__(self, key: Any) -> Any:
        return self.run(self.c.getitem(key))

    def __setitem__(self, key: Any, value: Any) -> None:
        self.run(self.c.set(key, value))

    def __delitem__(self, key: Any) -> None:
        self.run(self.c.delitem(key))

    def __contains__(self, key: Any) -> bool:
        return bool(self.run(self.c.contains(key)))

    def close(self) -> None:
        self.run(self.c.close())
        self.loop.close()


class _AsyncReadView:
    def __init__(self, a: AsyncAdapter, reader: Any) -> None:
        self.a, self.r = a, reader

    def __enter__(self) -> "_AsyncReadView":
        self.a.run(self.r.__aenter__())
        return self

    def read(self, n: int = -1) -> bytes:
        return bytes(self.a.run(self.r.read(n)))

    def __exit__(self, *exc: object) -> None:
        self.a.run(self.r.__aexit__(*exc))


@pytest.fixture(params=["sync", "async"])
def make(request: Any) -> Iterator[Callable[..., Any]]:
    made: List[Any] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        c = larder.Client(*args, **kwargs) if request.param == "sync" else AsyncAdapter(*args, **kwargs)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.close()
