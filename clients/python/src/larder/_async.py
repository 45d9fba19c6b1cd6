"""``larder.AsyncClient``: the asyncio client, on its own HTTP/1.1 over pooled streams (``_awire``) and aiohttp for streams.
The same API as ``Client``, with ``await``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar, Union

import aiohttp
import yarl

from . import _memo
from ._errors import NotFound, Refused, Unavailable
from ._awire import AWire
from ._keys import Key, Routing, canonical
from ._serial import Codec, Serializer, for_memoize, resolve
from ._sync import _Failed, _remaining, _settle, _ttl
from ._wire import Response, header_lines

T = TypeVar("T")
_MISSING = object()


class AsyncClient(Routing):
    """The asyncio twin of ``larder.Client`` (same arguments, same methods, awaited). Use it as
    ``async with AsyncClient(url) as c`` or call ``await c.close()``."""

    def __init__(
        self,
        url_or_urls: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        timeout: Optional[float] = 5.0,
        serializer: Union[None, str, Serializer] = None,
        miss_on_unavailable: bool = True,
        pool_size: int = 64,
    ) -> None:
        super().__init__(url_or_urls)
        self._serializer = resolve(serializer)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._head = header_lines(self._headers)
        self._awire = AWire(timeout, pool_size)
        # sock_connect, not connect: waiting for a free pooled connection is not a timeout.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self._pool_size = pool_size
        self._session: Optional[aiohttp.ClientSession] = None
        self.miss_on_unavailable = miss_on_unavailable
        self._flights: Dict[str, "asyncio.Future[Any]"] = {}

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=self._pool_size)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False)
        return self._session

    async def _request(
        self,
        method: str,
        key: Key,
        *,
        data: Any = None,
        headers: Optional[Dict[str, str]] = None,
        stream: bool = False,
    ) -> Any:
        """A request: on the client's own transport when its body is in memory and its answer
        is read whole (``_awire``), else on aiohttp. The answer has aiohttp's ``status``,
        ``url``, ``read``, ``text`` and ``release``."""
        if not stream and (data is None or isinstance(data, bytes)):
            node, target = self.target(key)
            head = self._head
            if headers:
                head += header_lines(headers)
            answer = await self._awire.request(node, method.encode("ascii"), target, head, data or b"")
            whole = _Whole(answer)
            if whole.status == 503:
                raise Unavailable(f"{method} {whole.url}: 503 {(await whole.text()).strip()}")
            return whole
        h = dict(self._headers)
        if headers:
            h.update(headers)
        url = self.url(key)
        try:
            # encoded=True: the canonical path is sent as it is (yarl would otherwise decode
            # `%3A` and its kind, and nginx would hash another path than the client did).
            r = await self._s().request(
                method, yarl.URL(url, encoded=True), data=data, headers=h, allow_redirects=False
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise Unavailable(f"{method} {url}: {e!r}") from e
        if r.status == 503:
            msg = (await r.text(errors="replace")).strip()
            raise Unavailable(f"{method} {url}: 503 {msg}")
        return r

    async def _body(self, r: Any) -> bytes:
        try:
            data: bytes = await r.read()
            return data
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise Unavailable(f"the answer broke off: {e!r}") from e

    async def get(self, key: Key, default: Any = None) -> Any:
        r = await self._request("GET", key)
        if r.status == 404:
            r.release()
            return default
        await _check(r)
        return self._serializer.loads(await self._body(r))

    async def getitem(self, key: Key) -> Any:
        """``c[key]`` for the async client: the value, or ``NotFound``."""
        value = await self.get(key, _MISSING)
        if value is _MISSING:
            raise NotFound(key)
        return value

    async def contains(self, key: Key) -> bool:
        """``key in c`` for the async client."""
        return await _had_value(await self._request("HEAD", key), "HEAD")

    def open(self, key: Key) -> "AsyncReader":
        """``async with c.open(key) as r``: ``await r.read(n)`` or ``async for piece in r``;
        the value is never held whole in memory."""
        return AsyncReader(self, key)

    async def get_many(self, keys: Iterable[Key]) -> Dict[Key, Any]:
        """As ``Client.get_many``: a key whose node cannot answer is a miss, or (with
        ``miss_on_unavailable=False``) ``Unavailable`` with ``partial`` and ``failed``."""
        keys = list(keys)
        values = await asyncio.gather(*(_atry(self.get(k, _MISSING)) for k in keys))
        got = {k: v for k, v in zip(keys, values) if v is not _MISSING and not isinstance(v, _Failed)}
        _settle("get_many", keys, values, got, not self.miss_on_unavailable)
        return got

    async def set(self, key: Key, value: Any, *, ttl: Optional[float] = None, content_type: Optional[str] = None) -> None:
        headers = _ttl(ttl)
        if content_type:
            headers["Content-Type"] = content_type
        if hasattr(value, "__aiter__"):
            data: Any = _apieces(value, None)
        elif hasattr(value, "read"):
            length = _remaining(value)
            if length is not None:
                headers["Content-Length"] = str(length)
            data = _apieces(value, length)
        else:
            data = self._serializer.dumps(value)
        r = await self._request("PUT", key, data=data, headers=headers)
        try:
            await _check(r, "PUT")
        finally:
            r.release()

    async def delete(self, key: Key) -> bool:
        return await _had_value(await self._request("DELETE", key), "DELETE")

    async def touch(self, key: Key, ttl: float) -> bool:
        """As ``Client.touch``: a new expiry for ``key``; whether it had a value."""
        return await _had_value(await self._request("PATCH", key, data=b"", headers=_ttl(ttl)), "PATCH")

    async def delitem(self, key: Key) -> None:
        if not await self.delete(key):
            raise NotFound(key)

    async def set_many(self, mapping: Mapping[Key, Any], ttl: Optional[float] = None) -> List[Key]:
        """As ``Client.set_many``: the keys not stored because their node could not answer, or
        (with ``miss_on_unavailable=False``) ``Unavailable`` with ``partial`` and ``failed``."""
        items = list(mapping.items())
        outcomes = await asyncio.gather(*(_atry(self.set(k, v, ttl=ttl)) for k, v in items))
        stored = {k: v for (k, v), o in zip(items, outcomes) if not isinstance(o, _Failed)}
        return _settle("set_many", [k for k, _ in items], outcomes, stored, not self.miss_on_unavailable)

    async def get_or_set(
        self, key: Key, compute: Callable[[], Union[T, Awaitable[T]]], *, ttl: Optional[float] = None
    ) -> T:
        """As ``Client.get_or_set``; ``compute`` may be a plain or an async callable."""
        value = await self._get_or_miss(key, self._serializer)
        if value is not _MISSING:
            return value  # type: ignore[no-any-return]

        async def run() -> T:
            result: T = await _call(compute)
            await self._store_quietly(key, self._serializer.dumps(result), ttl)
            return result

        return await self._single_flight(canonical(key), run)

    def memoize(
        self, ttl: Optional[float] = None, key: Optional[Callable[..., Key]] = None, beta: float = 1.0
    ) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
        """As ``Client.memoize``, for sync and async functions; the wrapper is async."""
        serializer = for_memoize(self._serializer)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
            call_key = _memo.CallKey(fn)

            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                k = key(*args, **kwargs) if key else call_key(args, kwargs)
                stored = await self._get_or_miss(k, None)
                if stored is not _MISSING:
                    env = _memo.unwrap(stored)
                    if env and not _memo.recompute_early(env[1], env[2], beta):
                        return serializer.loads(env[0])

                async def run() -> Any:
                    started = time.monotonic()
                    result = await _call(lambda: fn(*args, **kwargs))
                    data = _memo.wrap(serializer.dumps(result), time.monotonic() - started, ttl)
                    await self._store_quietly(k, data, ttl)
                    return result

                return await self._single_flight(canonical(k), run)

            _memo.WRAPPERS.add(wrapper)
            return wrapper

        return decorate

    async def _get_or_miss(self, key: Key, serializer: Optional[Codec]) -> Any:
        try:
            r = await self._request("GET", key)
            if r.status == 404:
                r.release()
                return _MISSING
            await _check(r)
            data = await self._body(r)
        except Unavailable:
            if not self.miss_on_unavailable:
                raise
            return _MISSING
        return serializer.loads(data) if serializer else data

    async def _store_quietly(self, key: Key, data: bytes, ttl: Optional[float]) -> None:
        try:
            r = await self._request("PUT", key, data=data, headers=_ttl(ttl))
            try:
                await _check(r, "PUT")
            finally:
                r.release()
        except Unavailable:
            if not self.miss_on_unavailable:
                raise
        except Refused as e:
            if e.status != 413:  # too large to cache: the computed value is still returned
                raise

    async def _single_flight(self, name: str, run: Callable[[], Awaitable[T]]) -> T:
        # The computation is a task of its own that every caller (the first one too) awaits
        # through a shield: a caller that is cancelled leaves, and the others still get the
        # result, never its CancelledError.
        flight = self._flights.get(name)
        if flight is None:
            flight = asyncio.ensure_future(run())
            self._flights[name] = flight
            flight.add_done_callback(lambda f: self._flights.pop(name, None) if self._flights.get(name) is f else None)
        return await asyncio.shield(flight)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self._awire.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReader:
    """A value streamed from the server (see ``AsyncClient.open``)."""

    def __init__(self, client: AsyncClient, key: Key) -> None:
        self._client, self._key = client, key
        self._r: Optional[aiohttp.ClientResponse] = None
        self.length: Optional[int] = None
        self.content_type: Optional[str] = None

    async def __aenter__(self) -> "AsyncReader":
        r = await self._client._request("GET", self._key, stream=True)
        if r.status == 404:
            r.release()
            raise NotFound(self._key)
        await _check(r)
        self._r = r
        self.length = r.content_length
        self.content_type = r.headers.get("Content-Type")
        return self

    async def read(self, n: int = -1) -> bytes:
        assert self._r is not None, "use `async with client.open(key) as reader`"
        try:
            return await self._r.content.read(n)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise Unavailable(f"the value broke off: {e!r}") from e

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        while True:
            piece = await self.read(1 << 20)
            if not piece:
                return
            yield piece

    async def __aexit__(self, *exc: object) -> None:
        if self._r is not None:
            self._r.release()


class _Whole:
    """An answer read whole by ``_awire``, as the rest of the client reads aiohttp's."""

    __slots__ = ("_r",)

    def __init__(self, r: Response) -> None:
        self._r = r

    @property
    def status(self) -> int:
        return self._r.status

    @property
    def url(self) -> str:
        return self._r.geturl()

    async def read(self) -> bytes:
        return self._r.data

    async def text(self, errors: str = "replace") -> str:
        return self._r.data.decode("utf-8", errors)

    def release(self) -> None:
        pass


async def _had_value(r: Any, method: str) -> bool:
    """As the sync client's: whether the key had a value (404: no); the answer released."""
    try:
        if r.status == 404:
            return False
        await _check(r, method)
        return True
    finally:
        r.release()


async def _check(r: Any, method: str = "GET") -> None:
    if r.status < 300:
        return
    msg = "" if method == "HEAD" else (await r.text(errors="replace")).strip()
    if r.status == 404 and method in ("GET", "HEAD"):
        raise NotFound(str(r.url))
    if r.status >= 500:
        raise Unavailable(f"{r.status} {msg}")
    raise Refused(r.status, msg)


async def _atry(aw: Awaitable[T]) -> Union[T, _Failed]:
    try:
        return await aw
    except Unavailable as e:
        return _Failed(e)


async def _call(f: Callable[[], Any]) -> Any:
    result = f()
    if inspect.isawaitable(result):
        result = await result
    return result


async def _apieces(value: Any, length: Optional[int], size: int = 1 << 20) -> AsyncIterator[bytes]:
    """The pieces of an upload: an async iterable's, or a file's read on a thread (exactly
    ``length`` bytes when it is known)."""
    if hasattr(value, "__aiter__"):
        async for piece in value:
            yield bytes(piece)
        return
    left = length
    while left is None or left > 0:
        piece = await asyncio.to_thread(value.read, size if left is None else min(size, left))
        if not piece:
            if left:
                raise OSError(f"the file ended {left} bytes short of its size")
            return
        if left is not None:
            left -= len(piece)
        yield piece
