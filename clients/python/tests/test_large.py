"""A 1 GiB value through `set(fileobj)` and `open(key)`, with the Python process's memory
bounded: neither direction holds the value. File-like values held in memory (a BytesIO, a
reader with only `read`) are streamed too, never copied whole."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import Node

GIB = 1 << 30
MIB = 1 << 20


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def big_node(tmp_path: Path) -> Iterator[Node]:
    # A ring of 9 x 512 MiB: a quarter of it holds 1 GiB.
    n = Node(tmp_path / "data", "--volume-size", "512MiB", "--volume-count", "9", "--memory-capacity", "0")
    yield n
    n.stop()


def test_a_gibibyte_round_trips_in_bounded_memory(big_node: Node, make: Callable[..., Any], tmp_path: Path) -> None:
    src = tmp_path / "gib"
    digest = hashlib.sha256()
    block = bytes(range(256)) * 4096  # 1 MiB
    with open(src, "wb") as f:
        for i in range(GIB // len(block)):
            piece = block[i % 256 :] + block[: i % 256]
            digest.update(piece)
            f.write(piece)
    c = make(big_node.url, timeout=60)
    before = rss()
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    try:
        with open(src, "rb") as f:
            c.set("gib", f)
        back = hashlib.sha256()
        n = 0
        with c.open("gib") as r:
            while True:
                piece = r.read(1 << 20)
                if not piece:
                    break
                back.update(piece)
                n += len(piece)
    finally:
        done.set()
        t.join()
    growth = peak[0] - before
    print(f"client RSS growth for a 1 GiB round trip: {growth >> 20} MiB")
    assert n == GIB and back.hexdigest() == digest.hexdigest()
    assert growth < 64 << 20, f"the client's memory grew by {growth >> 20} MiB"


def peak_growth(run: Callable[[], None]) -> int:
    """The most Python held at once while ``run`` ran, beyond what it held before: a copy of a
    value shows here whole, where RSS sampling could miss a short-lived one."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_bytesio_value_is_streamed_not_copied(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url, timeout=60)
    data = bytes(range(256)) * (64 * MIB // 256)
    # A BytesIO made from bytes shares them until something copies them: nothing should.
    f = io.BytesIO(data)
    growth = peak_growth(lambda: c.set("bytesio", f))
    print(f"client memory growth for set(BytesIO of 64 MiB): {growth / MIB:.1f} MiB")
    assert growth < 16 * MIB, f"set copied the BytesIO: {growth >> 20} MiB held at once"
    f.truncate(0)  # a BufferError if the call left an export of its buffer held
    assert c.get("bytesio") == data
    tail = io.BytesIO(b"head|tail")
    tail.seek(5)
    c.set("bytesio-tail", tail)  # from where it stands
    assert c.get("bytesio-tail") == b"tail" and tail.read() == b""


class OnlyRead:
    """A file-like value with ``read`` and nothing else: no fileno, seek or tell."""

    def __init__(self, data: bytes) -> None:
        self._view, self._pos = memoryview(data), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n < 0 else min(len(self._view), self._pos + n)
        piece = bytes(self._view[self._pos : end])
        self._pos = end
        return piece


def test_a_reader_with_only_read_is_streamed_in_pieces(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url, timeout=60)
    data = bytes(range(256)) * (64 * MIB // 256)
    r = OnlyRead(data)
    growth = peak_growth(lambda: c.set("only-read", r))
    print(f"client memory growth for set(a 64 MiB reader with only read): {growth / MIB:.1f} MiB")
    assert growth < 16 * MIB, f"set read the reader whole: {growth >> 20} MiB held at once"
    assert c.get("only-read") == data
