"""The asyncio client's own HTTP/1.1 for requests whose body is in memory, as ``_wire`` is the
sync client's: one write of the whole request and the answer read whole, over pooled
keep-alive streams (at most ``size`` open per node; more requests wait for one). aiohttp stays
for streams (``open``, files, async iterables).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Awaitable, Dict, List, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

from ._errors import Unavailable
from ._wire import Response, _field, checked_timeout

T = TypeVar("T")

if sys.version_info >= (3, 11):

    async def _within(seconds: Optional[float], aw: Awaitable[T]) -> T:
        async with asyncio.timeout(seconds):
            return await aw

else:  # pragma: no cover - older Pythons

    async def _within(seconds: Optional[float], aw: Awaitable[T]) -> T:
        return await asyncio.wait_for(aw, seconds)


_Stream = Tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Node:
    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise Unavailable(f"{url}: the lean transport speaks plain http only")
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 80
        self.netloc = parts.netloc.encode("ascii")
        self.idle: List[_Stream] = []
        self.room = asyncio.Semaphore(size)


class AWire:
    """Keep-alive streams to each node, for one event loop."""

    def __init__(self, timeout: Optional[float], size: int) -> None:
        self._timeout = checked_timeout(timeout)
        self._size = size
        self._nodes: Dict[str, _Node] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def request(self, node: str, method: bytes, path: bytes, head: bytes, body: bytes) -> Response:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Streams belong to the loop that opened them: another loop starts afresh.
            self._nodes, self._loop = {}, loop
        n = self._nodes.get(node)
        if n is None:
            n = self._nodes[node] = _Node(node, self._size)
        if body or method in (b"PUT", b"PATCH"):
            msg = b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n%s" % (
                method,
                path,
                n.netloc,
                head,
                len(body),
                body,
            )
        else:
            msg = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (method, path, n.netloc, head)
        async with n.room:
            # A stream the server closed while it was idle fails before a byte of the answer:
            # the request goes once more on another (every request sent here is idempotent).
            while n.idle:
                stream = n.idle.pop()
                try:
                    return await self._exchange(n, node, stream, msg, method, path, reused=True)
                except _Stale:
                    continue
            try:
                stream = await _within(self._timeout, asyncio.open_connection(n.host, n.port))
            except (OSError, asyncio.TimeoutError) as e:
                raise Unavailable(f"{node}: {e!r}") from e
            try:
                return await self._exchange(n, node, stream, msg, method, path, reused=False)
            except _Stale as e:
                raise Unavailable(f"{method.decode()} {node}{path.decode()}: {e}") from None

    async def _exchange(
        self, n: _Node, node: str, stream: _Stream, msg: bytes, method: bytes, path: bytes, reused: bool
    ) -> Response:
        reader, writer = stream
        got_any = False
        reusable = True
        try:
            writer.write(msg)
            head = await _within(self._timeout, reader.readuntil(b"\r\n\r\n"))
            got_any = True
            if head[:5] != b"HTTP/" or head[8:9] != b" ":
                raise ValueError(f"not an HTTP answer: {head[:40]!r}")
            status = int(head[9:12])
            lower = head.lower()
            te, cl = _field(lower, b"transfer-encoding"), _field(lower, b"content-length")
            if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
                data = b""
            elif te is not None and te.split(b",")[-1].strip() == b"chunked":
                data = await _within(self._timeout, _chunked(reader))
            elif te is None and cl is not None:
                data = await _within(self._timeout, reader.readexactly(int(cl)))
            else:
                # A body that ends with the connection: read to its end, never reused.
                data = await _within(self._timeout, reader.read())
                reusable = False
        except BaseException as e:
            writer.close()
            if isinstance(e, _EXPECTED):
                raise self._failed(e, reused and not got_any, method, node, path) from e
            raise  # cancelled: the stream, half used, is closed and not pooled
        if not reusable or b"\r\nconnection: close" in lower or reader.at_eof() or len(n.idle) >= self._size:
            writer.close()
        else:
            n.idle.append(stream)
        return Response(status, head[:-4], data, node, path)

    @staticmethod
    def _failed(e: BaseException, maybe_stale: bool, method: bytes, node: str, path: bytes) -> Exception:
        """The error a failed exchange raises: stale (sent again) for a reused stream the
        server had closed before any answer, else ``Unavailable``."""
        nothing = isinstance(e, asyncio.IncompleteReadError) and not e.partial
        if maybe_stale and (nothing or isinstance(e, ConnectionError)):
            return _Stale("the node had closed the connection")
        return Unavailable(f"{method.decode()} {node}{path.decode()}: {e!r}")

    async def close(self) -> None:
        for n in self._nodes.values():
            while n.idle:
                _, writer = n.idle.pop()
                writer.close()
        self._nodes.clear()


# What a broken exchange raises, as opposed to a cancellation.
_EXPECTED = (asyncio.IncompleteReadError, OSError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError)


class _Stale(Exception):
    """A reused stream that failed before any answer: the server had closed it."""


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    out: List[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return b"".join(out)
        out.append(await reader.readexactly(size))
        await reader.readexactly(2)

