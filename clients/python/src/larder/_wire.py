"""The sync client's own HTTP/1.1 for requests whose body is in memory (get, set of bytes,
delete, touch, head): one ``sendall`` of the whole request, and the answer parsed from the
bytes ``recv`` gives, over pooled keep-alive sockets. A general HTTP library spends most of a
small request's time in its own machinery (urllib3: about 3x the time of the round trip
itself, measured in BENCHMARKS.md); larder's answers need none of it. Streams (``open``, files,
chunked uploads) stay on urllib3.
"""

from __future__ import annotations

import os
import socket
import struct
import weakref
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

from ._errors import Unavailable

T = TypeVar("T")

# The first read of an answer: a small answer's head and body in one call. A larger buffer
# costs more than the read itself (CPython allocates it whole, then shrinks it: 256 KiB took
# 10 us a request); a larger body is read into a buffer of its own size.
_RECV = 16 << 10
# Reads of a body whose length is not known in advance.
_RECV_MORE = 64 << 10


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

    def __init__(self, timeout: Optional[float], size: int) -> None:
        self._timeout = checked_timeout(timeout)
        self._tv: Optional[bytes] = None
        if timeout is not None:
            # A timeval; at least 1 us, as 0 would mean no bound at all.
            self._tv = struct.pack("ll", *divmod(max(1, round(timeout * 1e6)), 1_000_000))
        self._size = size
        self._idle: Dict[str, Deque[_Conn]] = {}
        self._addr: Dict[str, Tuple[str, int]] = {}
        self._hosts: Dict[str, bytes] = {}
        # A child process must not share its parent's sockets (their answers would mix): a
        # fork empties the child's pool, without closing what the parent still uses.
        me = weakref.ref(self)

        def forget() -> None:
            w = me()
            if w is not None:
                w._idle = {}

        os.register_at_fork(after_in_child=forget)

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
        # The common case first, without the retry's closures: an idle socket that answers.
        idle = self._idle.get(node)
        if idle:
            try:
                c = idle.pop()
            except IndexError:
                pass
            else:
                try:
                    return self._exchange(node, c, msg, method, path, True)
                except _Stale:
                    pass
        return self._on_socket(
            node,
            lambda c, reused: self._exchange(node, c, msg, method, path, reused),
            lambda: f"{method.decode()} {node}{path.decode()}",
        )

    def _on_socket(self, node: str, attempt: Callable[[_Conn, bool], T], what: Callable[[], str]) -> T:
        """``attempt`` on an idle socket of ``node``, else on a new one. A socket the server
        closed while idle fails before a byte of the answer (an empty read or a reset): the
        attempt goes once more on another (``_Stale``)."""
        idle = self._idle.get(node)
        while idle:
            try:
                c = idle.pop()
            except IndexError:
                break
            try:
                return attempt(c, True)
            except _Stale:
                continue
        c = self._connect(node)
        try:
            return attempt(c, False)
        except _Stale as e:  # a new socket is never stale: the node went away mid-answer
            raise Unavailable(f"{what()}: {e}") from None

    def pipeline(self, node: str, requests: List[Tuple[bytes, bytes, bytes]]) -> List[Response]:
        """Bodiless requests (method, path, header lines) on one socket of ``node``: all sent in
        one ``sendall``, their answers read in order from the same reads (a server answers a
        pipelined batch in one write). As with ``request``, a reused socket that fails before a
        byte of the first answer is replaced once; every request sent here is idempotent."""
        host = self._hosts.get(node) or self._host(node)
        msg = b"".join(b"%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (m, p, host, h) for m, p, h in requests)
        return self._on_socket(
            node,
            lambda c, reused: self._batch(node, c, msg, requests, reused),
            lambda: f"{len(requests)} requests to {node}",
        )

    def _batch(
        self, node: str, c: _Conn, msg: bytes, requests: List[Tuple[bytes, bytes, bytes]], reused: bool
    ) -> List[Response]:
        s = c.sock
        out: List[Response] = []
        try:
            buf = _send(s, msg, reused)
            reusable = True
            for method, path, _ in requests:
                if not reusable:
                    raise ConnectionResetError("the node closed the connection before the batch was answered")
                if not buf:
                    buf = s.recv(_RECV)
                    if not buf:
                        raise ConnectionResetError("the node closed the connection mid-batch")
                head, body, reusable, buf = _read_one(s, buf, method)
                out.append(Response(int(head[9:12]), head, body, node, path))
        except _Stale:
            s.close()
            raise
        except (OSError, ValueError) as e:
            s.close()
            if isinstance(e, BlockingIOError):
                raise Unavailable(f"{len(requests)} requests to {node}: no answer within {self._timeout}s") from e
            raise Unavailable(f"{len(requests)} requests to {node}: {e}") from e
        self._keep(c, node, reusable and not buf)
        return out

    def _keep(self, c: _Conn, node: str, reusable: bool) -> None:
        """Pools a socket whose last answer left it clean, closes any other."""
        if reusable:
            idle = self._idle.get(node)
            if idle is None:
                idle = self._idle.setdefault(node, deque())  # one step: threads may race here
            if len(idle) < self._size:
                idle.append(c)
                return
        c.sock.close()

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
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # Sends and reads are bounded by the kernel (SO_SNDTIMEO / SO_RCVTIMEO) on a
            # blocking socket: Python's own timeout polls before every send and every read,
            # two more system calls a request. A bound that runs out fails the call with
            # EAGAIN. Where the kernel takes no such timeval, Python's timeout stays.
            if self._tv is not None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, self._tv)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._tv)
            s.settimeout(None)
        except OSError:
            s.settimeout(self._timeout)
        return _Conn(s)

    def _exchange(self, node: str, c: _Conn, msg: bytes, method: bytes, path: bytes, reused: bool) -> Response:
        s = c.sock
        try:
            head, body, reusable, rest = _read_one(s, _send(s, msg, reused), method)
        except _Stale:
            s.close()
            raise
        except (OSError, ValueError) as e:
            # A socket in any doubt is closed, never pooled: its late answer can never be
            # read as another request's.
            s.close()
            if isinstance(e, BlockingIOError):  # the kernel's bound ran out
                raise Unavailable(f"{method.decode()} {node}{path.decode()}: no answer within {self._timeout}s") from e
            raise Unavailable(f"{method.decode()} {node}{path.decode()}: {e}") from e
        # Bytes past the answer were never asked for: such a socket is not used again.
        self._keep(c, node, reusable and not rest)
        return Response(int(head[9:12]), head, body, node, path)

    def clear(self) -> None:
        for idle in self._idle.values():
            while idle:
                idle.pop().sock.close()


def _send(s: socket.socket, msg: bytes, reused: bool) -> bytes:
    """Sends ``msg`` and returns the first bytes of the answer. The server may have answered
    early and closed without reading the rest (a refusal: 401, 413, 503): that answer is
    returned. With nothing to read, a reused socket had been closed while idle (``_Stale``)."""
    try:
        s.sendall(msg)
    except (BrokenPipeError, ConnectionResetError) as e:
        first = _recv_some(s)
        if not first:
            raise (_Stale(str(e)) if reused else e) from e
        return first
    first = s.recv(_RECV)
    if not first:
        if reused:
            raise _Stale("the node had closed the connection")
        raise ConnectionResetError("the node closed the connection")
    return first


def _recv_some(s: socket.socket) -> bytes:
    """What the server sent before it closed, if anything."""
    try:
        return s.recv(_RECV)
    except OSError:
        return b""


def _read_one(s: socket.socket, buf: bytes, method: bytes) -> Tuple[bytes, bytes, bool, bytes]:
    """The answer whose first bytes are ``buf``: its head, its body, whether the socket may be
    used again (not when the body's end is the connection's, or the server closes), and the
    bytes read past the answer's end (the next answer's, when requests were pipelined)."""
    end = buf.find(b"\r\n\r\n")
    while end < 0:
        if len(buf) > 1 << 20:
            raise ValueError("an answer head longer than 1 MiB")
        more = s.recv(_RECV)
        if not more:
            raise ConnectionResetError("the node closed the connection mid-answer")
        buf += more
        end = buf.find(b"\r\n\r\n")
    head = buf[:end]
    if head[:5] != b"HTTP/" or head[8:9] != b" ":
        raise ValueError(f"not an HTTP answer: {head[:40]!r}")
    status = int(head[9:12])
    lower = head.lower()
    reusable = b"\r\nconnection: close" not in lower
    rest = buf[end + 4 :]
    if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
        length = 0
    else:
        te = _field(lower, b"transfer-encoding")
        if te is not None:
            if te.split(b",")[-1].strip() != b"chunked":
                return head, _to_eof(s, rest), False, b""  # its end is the connection's
            data, rest = _chunked(s, rest)
            return head, data, reusable, rest
        cl = _field(lower, b"content-length")
        if cl is None:
            return head, _to_eof(s, rest), False, b""
        length = int(cl)
    if len(rest) >= length:
        return head, rest[:length], reusable, rest[length:]
    # The body into a buffer of its size (no copy of what came before per read).
    body = bytearray(length)
    body[: len(rest)] = rest
    view = memoryview(body)
    have = len(rest)
    while have < length:
        n = s.recv_into(view[have:])
        if n == 0:
            raise ConnectionResetError("the node closed the connection mid-answer")
        have += n
    return head, bytes(body), reusable, b""


def _field(lower_head: bytes, name: bytes) -> Optional[bytes]:
    """The value of header ``name`` in a lower-cased head, if present."""
    at = lower_head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    stop = lower_head.find(b"\r\n", start)
    return lower_head[start : stop if stop >= 0 else len(lower_head)].strip()


def _to_eof(s: socket.socket, buf: bytes) -> bytes:
    parts = [buf]
    while True:
        more = s.recv(_RECV_MORE)
        if not more:
            return b"".join(parts)
        parts.append(more)


def checked_timeout(timeout: Optional[float]) -> Optional[float]:
    """A client's ``timeout``: seconds above 0, or None for no bound."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout is a number of seconds above 0 (or None: no bound), not {timeout!r}")
    return timeout


def header_lines(headers: Dict[str, str]) -> bytes:
    """Header lines for a request; a name or value that would end its line (CR, LF, NUL) is a
    ``ValueError``: it could smuggle a second request onto a pooled socket."""
    lines = []
    for k, v in headers.items():
        line = f"{k}: {v}"
        if "\r" in line or "\n" in line or "\0" in line:
            raise ValueError(f"a header name or value holds CR, LF or NUL: {line!r}")
        lines.append(line + "\r\n")
    return "".join(lines).encode("latin-1")


class _Stale(Exception):
    """A reused socket that failed before any answer: the server had closed it."""


def _chunked(s: socket.socket, data: bytes) -> Tuple[bytes, bytes]:
    """A chunked body read whole: (the body, bytes after it)."""
    out: List[bytes] = []
    buf = bytearray(data)
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
            return b"".join(out), bytes(rest)
        out.append(bytes(buf[:size]))
        del buf[: size + 2]


def _recv(s: socket.socket) -> bytes:
    more = s.recv(_RECV_MORE)
    if not more:
        raise ConnectionResetError("the node closed the connection mid-answer")
    return more
