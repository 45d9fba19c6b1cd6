"""What the benchmark scripts share: a free loopback port, a connection that waits for its
server to start, reading until an answer is whole, binary-protocol requests, and a process's
CPU time."""

from __future__ import annotations

import os
import socket
import struct
import time
from typing import Callable, Dict, List, Tuple

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def connect(port: int, wait: float = 30) -> socket.socket:
    """A connection to a loopback port, retried for ``wait`` seconds while the server starts."""
    deadline = time.time() + wait
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def until(s: socket.socket, done: Callable[[bytes], bool]) -> None:
    buf = s.recv(65536)
    while not done(buf):
        more = s.recv(65536)
        if not more:
            raise ConnectionError("the server closed the connection")
        buf += more


def binary_done(buf: bytes) -> bool:
    return len(buf) >= 24 and len(buf) >= 24 + struct.unpack(">I", buf[8:12])[0]


def binary(opcode: int, key: bytes, extras: bytes = b"", value: bytes = b"") -> bytes:
    """A binary protocol request: magic, opcode, key length, extras length, body length."""
    body = len(extras) + len(key) + len(value)
    return struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, 0, body, 0, 0) + extras + key + value


def cpu(pid: int, children: bool = False) -> Tuple[float, float]:
    """User and system seconds of all of ``pid``'s threads (and, with ``children``, of its
    child processes': nginx's master does none of the work, its workers do)."""
    user = system = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
        if children:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                for child in f.read().split():
                    u, s = cpu(int(child), True)
                    user, system = user + u * TICK, system + s * TICK
    return user / TICK, system / TICK


def http_done(buf: bytes) -> bool:
    """Whether ``buf`` holds a whole HTTP response with a Content-Length."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    return bool(sep) and len(body) >= int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])


def take_turns(kinds: Dict[str, Tuple[int, Callable[[int], None]]], ops: int, slices: int,
               keys: int) -> Tuple[Dict[str, List[float]], int]:
    """Runs ``ops`` requests of each kind (a server's pid, and a function making request i),
    the kinds taking turns in ``slices`` slices so that drift falls on all alike. Returns each
    kind's server user and system seconds and wall seconds, and the requests made of each."""
    spent: Dict[str, List[float]] = {k: [0.0, 0.0, 0.0] for k in kinds}
    step = ops // slices
    for lo in range(0, ops, step):
        for name, (pid, f) in kinds.items():
            u0, s0 = cpu(pid)
            t0 = time.perf_counter()
            for i in range(lo, lo + step):
                f(i % keys)
            t1 = time.perf_counter()
            u1, s1 = cpu(pid)
            spent[name][0] += u1 - u0
            spent[name][1] += s1 - s0
            spent[name][2] += t1 - t0
    return spent, step * slices
