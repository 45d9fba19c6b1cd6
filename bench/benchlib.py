"""What the benchmark scripts share: a free loopback port, a connection that waits for its
server to start, reading until an answer is whole, and binary-protocol requests."""

from __future__ import annotations

import socket
import struct
import time
from typing import Callable


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
