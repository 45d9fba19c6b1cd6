"""A 1 GiB value through `set(fileobj)` and `open(key)`, with the Python process's memory
bounded: neither direction holds the value."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import Node

GIB = 1 << 30


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
