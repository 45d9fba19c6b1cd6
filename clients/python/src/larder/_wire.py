"""The sync client's own HTTP/1.1 for requests whose body is in memory (get, set of bytes,
delete, touch, head): one ``sendall`` of the whole request, and the answer parsed from the
bytes ``recv`` gives, over pooled keep-alive sockets. A general HTTP library spends most of a
small request's time in its own machinery (urllib3: about 3x the time of the round trip
itself, measured in BENCHMARKS.md); larder's answers need none of it. Streams (``open``, files,
chunked uploads) stay on urllib3.
"""

from __future__ import annotations

import socket
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ._errors import Unavailable

_RECV = 1 << 18


class Response:
    """An answer read whole: its status, head (parsed on demand) and body."""

    __slots__ = ("status", "data", "_head", "_node", "_path")

    def __init__(self, status: int, head: bytes, data: bytes, node: str, path: bytes) -> None:
        self.status = status
        self.data = data
        self._head = head
        self._node = node
        self._path = path

    def geturl(self) -> str:
        return self._node + self._path.decode("ascii")

    def header(self, name: str) -> Optional[str]:
        """The value of header ``name`` (case-insensitive), if present."""
        want = name.lower().encode("ascii") + b":"
        for line in self._head.split(b"\r\n")[1:]:
            if line[: len(want)].lower() == want:
                return line[len(want) :].strip().decode("latin-1")
        return None


class _Conn:
    __slots__ = ("sock", "buf")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""


class Wire:
    """Keep-alive sockets to each node, at most ``size`` idle per node, shared by threads."""

    def __init__(self, timeout: float, size: int) -> None:
        self._timeout = timeout
        self._size = size
        self._idle: Dict[str, Deque[_Conn]] = {}
        self._addr: Dict[str, Tuple[str, int]] = {}
        self._hosts: Dict[str, bytes] = {}

    def request(self, node: str, method: bytes, path: bytes, head: bytes, body: bytes) -> Response:
        """``method`` ``path`` on ``node`` (a base URL) with the header lines ``head`` (each
        ending in CRLF) and ``body``. A socket the server closed while it was idle fails
        before a byte of the answer: the request is then sent once more on a new one (every
        request sent here is idempotent)."""
        host = self._hosts.get(node) or self._host(node)
        if body or method in (b"PUT", b"PATCH"):
            msg = b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n%s" % (
                method,
                path,
                host,
                head,
                len(body),
                body,
            )
        else:
            msg = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (method, path, host, head)
        idle = self._idle.get(node)
        # A socket the server closed while idle fails before a byte of the answer (an empty
        # read or a reset): the request goes once more on another (``_Stale``).
        while idle:
            try:
                c = idle.pop()
            except IndexError:
                break
            try:
                return self._exchange(node, c, msg, method, path, reused=True)
            except _Stale:
                continue
        c = self._connect(node)
        try:
            return self._exchange(node, c, msg, method, path, reused=False)
        except _Stale as e:  # a new socket is never stale: the node went away mid-answer
            raise Unavailable(f"{method.decode()} {node}{path.decode()}: {e}") from None

    def _host(self, node: str) -> bytes:
        host = urlsplit(node).netloc.encode("ascii")
        self._hosts[node] = host
        return host

    def _connect(self, node: str) -> _Conn:
        addr = self._addr.get(node)
        if addr is None:
            parts = urlsplit(node)
            if parts.scheme != "http":
                raise Unavailable(f"{node}: the lean transport speaks plain http only")
            addr = (parts.hostname or "localhost", parts.port or 80)
            self._addr[node] = addr
        try:
            s = socket.create_connection(addr, timeout=self._timeout)
        except OSError as e:
            raise Unavailable(f"{node}: {e}") from e
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(s)

    def _exchange(self, node: str, c: _Conn, msg: bytes, method: bytes, path: bytes, reused: bool) -> Response:
        s = c.sock
        got_any = False
        try:
            s.sendall(msg)
            buf = c.buf
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    break
                more = s.recv(_RECV)
                if not more:
                    raise ConnectionResetError("the node closed the connection")
                got_any = True
                buf += more
            head = buf[:end]
            status = int(head[9:12])
            lower = head.lower()
            length = 0
            at = lower.find(b"\r\ncontent-length:")
            if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
                length = 0
            elif at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else len(lower)])
            elif b"\r\ntransfer-encoding: chunked" in lower:
                data, rest = _chunked(s, buf[end + 4 :])
                self._keep(node, c, rest, lower)
                return Response(status, head, data, node, path)
            total = end + 4 + length
            while len(buf) < total:
                more = s.recv(max(_RECV, total - len(buf)))
                if not more:
                    raise ConnectionResetError("the node closed the connection mid-answer")
                buf += more
        except (OSError, ValueError) as e:
            s.close()
            if reused and not got_any and not isinstance(e, socket.timeout):
                raise _Stale(str(e)) from e
            raise Unavailable(f"{method.decode()} {node}{path.decode()}: {e}") from e
        self._keep(node, c, buf[total:], lower)
        return Response(status, head, buf[end + 4 : total], node, path)

    def _keep(self, node: str, c: _Conn, rest: bytes, lower_head: bytes) -> None:
        if b"\r\nconnection: close" in lower_head or rest:
            c.sock.close()  # closing, or bytes nobody asked for: never reused
            return
        c.buf = b""
        idle = self._idle.setdefault(node, deque())
        if len(idle) < self._size:
            idle.append(c)
        else:
            c.sock.close()

    def clear(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().sock.close()


class _Stale(Exception):
    """A reused socket that failed before any answer: the server had closed it."""


def _chunked(s: socket.socket, buf: bytes) -> Tuple[bytes, bytes]:
    """A chunked body read whole: (the body, bytes after it)."""
    out: List[bytes] = []
    while True:
        while b"\r\n" not in buf:
            buf += _recv(s)
        line, buf = buf.split(b"\r\n", 1)
        size = int(line.split(b";", 1)[0], 16)
        while len(buf) < size + 2:
            buf += _recv(s)
        if size == 0:
            # Trailers, if any, end with an empty line.
            while not buf.startswith(b"\r\n") and b"\r\n\r\n" not in buf:
                buf += _recv(s)
            rest = buf[2:] if buf.startswith(b"\r\n") else buf.split(b"\r\n\r\n", 1)[1]
            return b"".join(out), rest
        out.append(buf[:size])
        buf = buf[size + 2 :]


def _recv(s: socket.socket) -> bytes:
    more = s.recv(_RECV)
    if not more:
        raise ConnectionResetError("the node closed the connection mid-answer")
    return more
