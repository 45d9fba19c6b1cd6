"""``larder.Client``: the synchronous client, on its own HTTP/1.1 over pooled sockets (``_wire``) and urllib3 for streams."""

from __future__ import annotations

import functools
import io
import math
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypeVar, Union

import urllib3

from . import _memo
from ._errors import NotFound, Refused, Unavailable
from ._keys import Key, Routing, canonical
from ._wire import Wire, header_lines
from ._serial import Codec, Serializer, for_memoize, resolve

T = TypeVar("T")
_MISSING = object()
# Requests of one pipelined batch of ``get_many``: small enough that the requests sit in the
# socket's buffers while the server answers them (it answers a batch in one write).
_BATCH = 100
_METHODS = {m: m.encode("ascii") for m in ("GET", "HEAD", "PUT", "DELETE", "PATCH", "POST")}


class Client(Routing):
    """A client of one larder node, or of several (each key goes to the node nginx's consistent
    hash would pick: docs/CLUSTER.md).

    ``timeout`` bounds connecting and each send and read, in seconds (None: no bound).
    ``token`` is sent as ``Authorization: Bearer``. ``serializer``: ``None`` (bytes),
    ``"pickle"``, ``"json"``, or any object with ``dumps``/``loads``. ``miss_on_unavailable``: whether ``get_or_set`` and
    ``memoize`` treat a node that cannot answer as a miss (compute, try to store, return), and
    ``get_many``/``set_many`` its keys as misses / keys not stored, rather than raise
    ``Unavailable``: a cache outage must not become an application outage.
    """

    def __init__(
        self,
        url_or_urls: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        timeout: Optional[float] = 5.0,
        serializer: Union[None, str, Serializer] = None,
        miss_on_unavailable: bool = True,
        pool_size: int = 32,
    ) -> None:
        super().__init__(url_or_urls)
        self._serializer = resolve(serializer)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._head = header_lines(self._headers)
        self._wire = Wire(timeout, pool_size)
        self._timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self._pool = urllib3.PoolManager(num_pools=max(4, len(self._nodes)), maxsize=pool_size, block=False)
        self.miss_on_unavailable = miss_on_unavailable
        self._flights: Dict[str, "_Flight"] = {}
        self._flights_lock = threading.Lock()
        self._executor: Optional[ThreadPoolExecutor] = None
        self._pool_size = pool_size

    # -- plumbing ---------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        key: Key,
        *,
        body: Any = None,
        headers: Optional[Dict[str, str]] = None,
        stream: bool = False,
        chunked: bool = False,
    ) -> Any:
        """A request: on the client's own transport when its body is in memory and its answer
        is read whole, else on urllib3 (``_stream``). An answer has ``status`` and ``data``."""
        if not stream and not chunked and (body is None or isinstance(body, bytes)):
            head = self._head + header_lines(headers) if headers else self._head
            return self._small(_METHODS[method], key, head, body or b"")
        r = self._stream(method, key, body, headers, stream, chunked)
        if r.status == 503:
            raise Unavailable(f"{method} {self.url(key)}: 503 {_message(r)}")
        return r

    def _small(self, method: bytes, key: Key, head: bytes, body: bytes) -> Any:
        """A request whose body is in memory and whose answer is read whole, on the client's
        own transport: the path of every small get and set, kept short."""
        node, target = self.target(key)
        r = self._wire.request(node, method, target, head, body)
        if r.status == 503:
            raise Unavailable(f"{method.decode()} {r.geturl()}: 503 {_message(r)}")
        return r

    def _stream(
        self, method: str, key: Key, body: Any, headers: Optional[Dict[str, str]], stream: bool, chunked: bool
    ) -> urllib3.BaseHTTPResponse:
        """A request whose body or answer streams: on urllib3."""
        h = dict(self._headers)
        if headers:
            h.update(headers)
        try:
            r = self._pool.request(
                method,
                self.url(key),
                body=body,
                headers=h,
                timeout=self._timeout,
                retries=False,  # a cache is not worth a second try: the caller decides
                preload_content=not stream,
                chunked=chunked,
                redirect=False,
            )
        except urllib3.exceptions.HTTPError as e:
            raise Unavailable(f"{method} {self.url(key)}: {e}") from e
        return r

    # -- reading ----------------------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """The value of ``key`` (deserialized), or ``default`` when it has none."""
        r = self._small(b"GET", key, self._head, b"")
        if r.status == 404:
            return default
        _check(r)
        return self._serializer.loads(r.data)

    def __getitem__(self, key: Key) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise NotFound(key)
        return value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (str, bytes)):
            return False
        return _had_value(self._request("HEAD", key), "HEAD")

    def open(self, key: Key) -> "Reader":
        """A readable file-like object streaming the value as it arrives (bytes, whatever the
        serializer): the value is never held whole in memory."""
        r = self._request("GET", key, stream=True)
        if r.status == 404:
            r.release_conn()
            raise NotFound(key)
        if r.status >= 300:
            try:
                _check(r)
            finally:
                r.release_conn()
        return Reader(r)

    def get_many(self, keys: Iterable[Key]) -> Dict[Key, Any]:
        """The values of ``keys`` that have one: each node's keys sent as pipelined batches on
        one of its connections (one write of up to ``_BATCH`` requests, the answers read back
        in order), the nodes concurrently. A key whose node cannot answer is a miss (absent, as
        a key without a value), so one node down costs its keys only; with
        ``miss_on_unavailable=False`` the call raises ``Unavailable`` with ``partial`` (the
        values read) and ``failed`` (those keys)."""
        keys = list(keys)
        batches: Dict[str, List[int]] = {}
        targets: List[bytes] = []
        for i, k in enumerate(keys):
            node, target = self.target(k)
            batches.setdefault(node, []).append(i)
            targets.append(target)
        work = [(node, idx[at : at + _BATCH]) for node, idx in batches.items() for at in range(0, len(idx), _BATCH)]
        values: List[Any] = [_MISSING] * len(keys)

        def fetch(batch: "tuple[str, List[int]]") -> None:
            node, idx = batch
            try:
                answers = self._wire.pipeline(node, [(b"GET", targets[i], self._head) for i in idx])
            except Unavailable as e:
                for i in idx:
                    values[i] = _Failed(e)
                return
            for i, r in zip(idx, answers):
                values[i] = self._value_of(r)

        self._map(fetch, work)
        got = {k: v for k, v in zip(keys, values) if v is not _MISSING and not isinstance(v, _Failed)}
        _settle("get_many", keys, values, got, not self.miss_on_unavailable)
        return got

    def _value_of(self, r: Any) -> Any:
        """A GET's answer as ``get`` reads it: the value, ``_MISSING``, or ``_Failed`` for a
        node that cannot answer; a refusal raises."""
        if r.status == 404:
            return _MISSING
        if r.status >= 500:
            return _Failed(Unavailable(f"GET {r.geturl()}: {r.status} {_message(r)}"))
        _check(r)
        return self._serializer.loads(r.data)

    # -- writing ----------------------------------------------------------------------------

    def set(self, key: Key, value: Any, *, ttl: Optional[float] = None, content_type: Optional[str] = None) -> None:
        """Stores ``value`` under ``key``. A file object (anything with ``read``) is streamed
        from where it stands, never read whole; other values go through the serializer.
        ``ttl`` in seconds (whole seconds on the wire, rounded up)."""
        if content_type is None and not hasattr(value, "read"):
            head = self._head if ttl is None else self._head + _ttl_line(ttl)
            _check(self._small(b"PUT", key, head, self._serializer.dumps(value)), "PUT")
            return
        headers = _ttl(ttl)
        if content_type:
            headers["Content-Type"] = content_type
        chunked = False
        if hasattr(value, "read"):
            length = _remaining(value)
            if length is None:
                body: Any = _pieces(value)
                chunked = True
            else:
                body = _capped(value, length)
                headers["Content-Length"] = str(length)
        else:
            body = self._serializer.dumps(value)
        _check(self._request("PUT", key, body=body, headers=headers, chunked=chunked), "PUT")

    def __setitem__(self, key: Key, value: Any) -> None:
        self.set(key, value)

    def delete(self, key: Key) -> bool:
        """Deletes ``key``; whether it had a value."""
        return _had_value(self._request("DELETE", key), "DELETE")

    def touch(self, key: Key, ttl: float) -> bool:
        """Makes ``key`` expire ``ttl`` seconds from now (whole seconds, rounded up; 0 = never)
        without sending its value again (the value and its ETag stay); whether it had one."""
        return _had_value(self._request("PATCH", key, body=b"", headers=_ttl(ttl)), "PATCH")

    def __delitem__(self, key: Key) -> None:
        if not self.delete(key):
            raise NotFound(key)

    def set_many(self, mapping: Mapping[Key, Any], ttl: Optional[float] = None) -> List[Key]:
        """Stores every item concurrently over pooled connections. Answers the keys that were
        not stored because their node could not answer, in ``mapping``'s order (empty when
        all were stored); with ``miss_on_unavailable=False`` the call raises ``Unavailable``
        with ``partial`` (the items stored) and ``failed`` (those keys) instead."""
        items = list(mapping.items())
        outcomes = self._map(lambda kv: _try(lambda: self.set(kv[0], kv[1], ttl=ttl)), items)
        stored = {k: v for (k, v), o in zip(items, outcomes) if not isinstance(o, _Failed)}
        return _settle("set_many", [k for k, _ in items], outcomes, stored, not self.miss_on_unavailable)

    # -- computing --------------------------------------------------------------------------

    def get_or_set(self, key: Key, compute: Callable[[], T], *, ttl: Optional[float] = None) -> T:
        """The value of ``key``; on a miss, ``compute()``'s result, stored with ``ttl`` and
        returned. Concurrent callers of one key in this process compute it once."""
        value = self._get_or_miss(key, self._serializer)
        if value is not _MISSING:
            return value  # type: ignore[no-any-return]
        return self._single_flight(canonical(key), lambda: self._compute_and_store(key, compute, ttl))

    def memoize(
        self, ttl: Optional[float] = None, key: Optional[Callable[..., Key]] = None, beta: float = 1.0
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """A decorator caching a function's results in larder, with stampede protection (see
        ``_memo``). ``key(*args, **kwargs)`` names a call's key; by default the function's name
        and a hash of its arguments, and of what else tells it apart (``_memo.CallKey``: a bound
        method's object; a lambda's or nested function's code, defaults and captured values)."""
        serializer = for_memoize(self._serializer)

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            call_key = _memo.CallKey(fn)

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                k = key(*args, **kwargs) if key else call_key(args, kwargs)
                stored = self._get_or_miss(k, None)
                if stored is not _MISSING:
                    env = _memo.unwrap(stored)
                    if env and not _memo.recompute_early(env[1], env[2], beta):
                        return serializer.loads(env[0])  # type: ignore[no-any-return]

                def run() -> T:
                    started = time.monotonic()
                    result = fn(*args, **kwargs)
                    data = _memo.wrap(serializer.dumps(result), time.monotonic() - started, ttl)
                    self._store_quietly(k, data, ttl)
                    return result

                return self._single_flight(canonical(k), run)

            _memo.WRAPPERS.add(wrapper)
            return wrapper

        return decorate

    def _get_or_miss(self, key: Key, serializer: Optional[Codec]) -> Any:
        try:
            r = self._request("GET", key)
            if r.status == 404:
                return _MISSING
            _check(r)
        except Unavailable:
            if not self.miss_on_unavailable:
                raise
            return _MISSING
        return serializer.loads(r.data) if serializer else r.data

    def _compute_and_store(self, key: Key, compute: Callable[[], T], ttl: Optional[float]) -> T:
        value = compute()
        self._store_quietly(key, self._serializer.dumps(value), ttl)
        return value

    def _store_quietly(self, key: Key, data: bytes, ttl: Optional[float]) -> None:
        try:
            _check(self._request("PUT", key, body=data, headers=_ttl(ttl)), "PUT")
        except Unavailable:
            if not self.miss_on_unavailable:
                raise
        except Refused as e:
            if e.status != 413:  # too large to cache: the computed value is still returned
                raise

    def _single_flight(self, name: str, run: Callable[[], T]) -> T:
        with self._flights_lock:
            flight = self._flights.get(name)
            leader = flight is None
            if flight is None:
                flight = self._flights[name] = _Flight()
        if not leader:
            return flight.wait()  # type: ignore[no-any-return]
        try:
            result = run()
            flight.done(result, None)
            return result
        except BaseException as e:
            flight.done(None, e)
            raise
        finally:
            with self._flights_lock:
                self._flights.pop(name, None)

    def _map(self, f: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if len(items) <= 1:
            return [f(i) for i in items]
        with self._flights_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="larder")
        return list(self._executor.map(f, items))

    def close(self) -> None:
        if self._executor:
            self._executor.shutdown(wait=False)
        self._pool.clear()
        self._wire.clear()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Flight:
    """One computation that concurrent callers of a key wait for."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None

    def done(self, result: Any, error: Optional[BaseException]) -> None:
        self._result, self._error = result, error
        self._event.set()

    def wait(self) -> Any:
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._result


class Reader(io.RawIOBase):
    """A value streamed from the server; close it (or use ``with``) to free the connection."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        super().__init__()
        self._r = response
        self._eof = False
        length = response.headers.get("Content-Length")
        self.length: Optional[int] = int(length) if length is not None else None
        self.content_type: Optional[str] = response.headers.get("Content-Type")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._r.read(len(buffer))
        except urllib3.exceptions.HTTPError as e:
            raise Unavailable(f"the value broke off: {e}") from e
        n = len(data)
        buffer[:n] = data
        if n == 0 and len(buffer) > 0:
            self._eof = True
        return n

    def close(self) -> None:
        if not self.closed:
            # A body not read to its end would be the next request's answer on a reused
            # connection: such a connection is closed, not given back.
            if not self._eof:
                self._r.close()
            self._r.release_conn()
        super().close()


class _Failed:
    """A batch call's key whose node could not answer (never a value: any value may be stored)."""

    def __init__(self, error: Unavailable) -> None:
        self.error = error


def _try(f: Callable[[], T]) -> Union[T, _Failed]:
    try:
        return f()
    except Unavailable as e:
        return _Failed(e)


def _settle(what: str, keys: List[Key], outcomes: Sequence[Any], done: Dict[Key, Any], strict: bool) -> List[Key]:
    """The keys of a batch call whose node could not answer; ``Unavailable`` carrying what was
    done instead when ``strict``."""
    errors = [o.error for o in outcomes if isinstance(o, _Failed)]
    failed = [k for k, o in zip(keys, outcomes) if isinstance(o, _Failed)]
    if errors and strict:
        raise Unavailable(
            f"{what}: {len(failed)} of {len(keys)} keys on nodes that cannot answer ({errors[0]})",
            partial=done,
            failed=failed,
        ) from errors[0]
    return failed


def _message(r: Any) -> str:
    try:
        return str(r.data.decode("utf-8", "replace")).strip()
    except Exception:
        return ""


def _ttl_secs(ttl: float) -> int:
    """Whole seconds, rounded up; 0 (or less) is no expiry, larder's meaning, which overrides
    its --default-ttl."""
    return 0 if ttl <= 0 else math.ceil(ttl)


def _ttl_line(ttl: float) -> bytes:
    """``_ttl``'s header as a request line."""
    return b"X-TTL: %d\r\n" % _ttl_secs(ttl)


def _ttl(ttl: Optional[float]) -> Dict[str, str]:
    """The expiry header: whole seconds, rounded up; 0 is no expiry (larder's meaning, which
    overrides its --default-ttl); none when ``ttl`` is None (the server's default applies)."""
    if ttl is None:
        return {}
    return {"X-TTL": str(_ttl_secs(ttl))}


def _had_value(r: Any, method: str) -> bool:
    """The answer to a request about a key's value (HEAD, DELETE, PATCH): whether it had one
    (404: no); any other failure raised as ``_check`` says."""
    if r.status == 404:
        return False
    _check(r, method)
    return True


def _check(r: urllib3.BaseHTTPResponse, method: str = "GET") -> None:
    if r.status < 300:
        return
    if r.status == 404 and method in ("GET", "HEAD"):
        raise NotFound(r.geturl() or "")
    if r.status >= 500:
        raise Unavailable(f"{r.status} {_message(r)}")
    raise Refused(r.status, _message(r))


def _remaining(f: Any) -> Optional[int]:
    """Bytes left in a binary regular file, or in a BytesIO; None for anything else (a pipe, a
    socket, a /proc file whose size says nothing), which is sent chunked."""
    if isinstance(f, io.TextIOBase):
        raise TypeError("open the file in binary mode ('rb'): a value is bytes")
    if isinstance(f, io.BytesIO):
        # Not getbuffer(): on a BytesIO that shares the bytes it was made from, that copies
        # them all (and its export would block resizing while held). Seeking copies nothing.
        pos = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return max(0, end - pos)
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None
        return max(0, st.st_size - int(f.tell()))
    except (AttributeError, OSError, io.UnsupportedOperation, TypeError):
        return None


def _capped(f: Any, length: int, size: int = 1 << 20) -> Iterable[bytes]:
    """Exactly ``length`` bytes of ``f`` (a file that grows while it is sent adds nothing to
    the request; one that shrinks fails it rather than leave the connection waiting)."""
    left = length
    while left > 0:
        piece = f.read(min(size, left))
        if not piece:
            raise OSError(f"the file ended {left} bytes short of its size")
        left -= len(piece)
        yield piece


def _pieces(f: Any, size: int = 1 << 20) -> Iterable[bytes]:
    while True:
        piece = f.read(size)
        if not piece:
            return
        yield piece
