"""``larder.django.LarderCache``: a Django cache backend on larder's HTTP API.

    CACHES = {
        "default": {
            "BACKEND": "larder.django.LarderCache",
            "LOCATION": "http://127.0.0.1:1234",      # or a list of node URLs (or "url1,url2")
            "TIMEOUT": 300,                           # None: never expire; 0: do not cache
            "OPTIONS": {"token": "...", "timeout": 5.0, "serializer": "pickle"},
        }
    }

Every ``BaseCache`` method works as in Django's own backends. How each maps onto requests:

- ``get``: ``GET /<key>`` (404: the default); ``has_key``: ``HEAD``; ``delete``: ``DELETE``.
- ``set``: ``PUT`` with ``X-TTL`` (``0`` for a timeout of ``None``: no expiry, whatever the
  server's ``--default-ttl``). A timeout of 0 or less stores nothing and deletes the key, as
  Django's memcached backends do. A value the server refuses as too large (``413``) is not
  cached and the key's old value is deleted (as memcached's backends do).
- ``add``: ``PUT`` with ``If-None-Match: *`` (``412``: the key has a value, ``False``); with a
  timeout of 0, ``Cache-Control: max-age=0`` stores a value that is already expired, so
  ``add`` still answers whether the key was absent, as Django's other backends do.
- ``incr``/``decr``: ``GET`` (value and ``ETag``), then ``PUT`` with ``If-Match`` of that
  ETag and ``X-TTL: keep``, retried on ``412``: no increment is lost to a concurrent one, and
  the value keeps its expiry (to the millisecond; a touch at the same moment may be undone).
- ``touch``: ``PATCH /<key>`` with ``X-TTL``; a timeout of 0 deletes the key.
- ``get_many``/``set_many``: the client's concurrent batch calls; ``delete_many``: a
  ``DELETE`` per key.
- ``clear``: ``POST /_larder/flush`` on every node: the whole node is flushed, not just this
  cache's ``KEY_PREFIX`` (as memcached's ``flush_all`` does for Django's memcached backends).

The async methods (``aget``, ``aset``, ``aincr``, ...) run the sync ones in a thread, as
``BaseCache``'s do (``aincr`` and the batch calls are overridden so that they do too: Django's
own ``aincr`` is a get and a set, which could lose a concurrent increment).

``OPTIONS`` are ``larder.Client``'s keyword arguments (``token``, ``timeout``,
``miss_on_unavailable``, ``pool_size``) and ``serializer``: ``"pickle"`` (the default, as
Django's own backends), ``"json"``, ``None`` (bytes and str only), an object with
``dumps``/``loads``, or the dotted path of one. Backends with the same ``LOCATION`` and
``OPTIONS`` share one client (one pool of keep-alive connections) per process, so Django's
per-thread (and, under ASGI, per-request) backend instances cost no new connections, and
``close()``, which Django calls after every request, keeps them open.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

import urllib3

from . import JSON, PICKLE, Client, Refused, Unavailable, canonical

if TYPE_CHECKING:
    # Django ships no type information: the part of BaseCache this module uses, typed here so
    # that the subclass below is checked (mypy --strict forbids subclassing an untyped class).
    class BaseCache:
        default_timeout: Optional[float]
        key_prefix: str
        version: int

        def __init__(self, params: Dict[str, Any]) -> None: ...

        def make_and_validate_key(self, key: Any, version: Optional[int] = None) -> str: ...

        def validate_key(self, key: str) -> None: ...

    DEFAULT_TIMEOUT: Any = object()

    class InvalidCacheKey(ValueError): ...

    class ImproperlyConfigured(Exception): ...

    import_string: Callable[[str], Any]
    sync_to_async: Callable[..., Any]

else:
    from asgiref.sync import sync_to_async
    from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache, InvalidCacheKey
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

__all__ = ["LarderCache"]

# The longest TTL larder accepts (100 years of 365 days): longer timeouts are capped to it.
MAX_TTL = 100 * 365 * 24 * 3600
# Compare-and-swap rounds of an incr before it gives up (each lost round is another writer's
# won one, so the cache as a whole always progresses).
_CAS_ATTEMPTS = 64
_MISSING = object()


class LarderCache(BaseCache):
    """A Django cache on one larder node or several (each key goes to its owner, as
    ``larder.Client`` routes it). See the module's docstring for the settings."""

    def __init__(self, server: Union[str, Sequence[str]], params: Dict[str, Any]) -> None:
        super().__init__(params)
        urls = [u.strip() for u in re.split("[;,]", server)] if isinstance(server, str) else list(server)
        urls = [u for u in urls if u]
        if not urls:
            raise ImproperlyConfigured("larder.django.LarderCache: LOCATION names no node URL")
        options = dict(params.get("OPTIONS") or {})
        for django_only in ("MAX_ENTRIES", "CULL_FREQUENCY"):  # BaseCache's, for culling backends
            options.pop(django_only, None)
        self._codec = _codec(options.pop("serializer", "pickle"))
        self._conn = _shared(urls, options)

    # -- keys and timeouts ------------------------------------------------------------------

    def validate_key(self, key: str) -> None:
        """``CacheKeyWarning`` for keys memcached could not take (as Django's own backends:
        larder takes them), and ``InvalidCacheKey`` for keys larder cannot name (over 1024
        bytes, a ``.`` or ``..`` path segment, under ``_larder/``)."""
        super().validate_key(key)
        try:
            canonical(key)
        except ValueError as e:
            raise InvalidCacheKey(f"larder cannot store this cache key: {e}") from None

    def _ttl(self, timeout: Any) -> Optional[int]:
        """``X-TTL`` seconds for a Django timeout: 0 = no expiry (Django's ``None``); ``None``
        when nothing is to be stored (Django's 0 or a negative timeout). Whole seconds, rounded
        up, as larder takes them."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return 0
        if timeout <= 0:
            return None
        return min(MAX_TTL, math.ceil(float(timeout)))

    # -- reading ----------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: Optional[int] = None) -> Any:
        k = self.make_and_validate_key(key, version=version)
        data = self._conn.client.get(k, _MISSING)
        return default if data is _MISSING else self._codec.loads(data)

    def has_key(self, key: Any, version: Optional[int] = None) -> bool:
        k = self.make_and_validate_key(key, version=version)
        return k in self._conn.client

    def get_many(self, keys: Iterable[Any], version: Optional[int] = None) -> Dict[Any, Any]:
        made = {self.make_and_validate_key(key, version=version): key for key in keys}
        got = self._conn.client.get_many(list(made))
        return {key: self._codec.loads(got[k]) for k, key in made.items() if k in got}

    # -- writing ----------------------------------------------------------------------------

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Optional[int] = None) -> None:
        k = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is None:
            self._conn.client.delete(k)
            return
        try:
            # Bytes, serialized here: the client would stream a value that has a ``read``.
            self._conn.client.set(k, self._codec.dumps(value), ttl=ttl)
        except Refused as e:
            if e.status != 413:
                raise
            self._conn.client.delete(k)  # too large: not cached, and not left at its old value

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: Optional[int] = None) -> bool:
        k = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        headers = {"If-None-Match": "*"}
        if ttl is None:
            headers["Cache-Control"] = "max-age=0"  # stored already expired: nothing is cached
        else:
            headers["X-TTL"] = str(ttl)
        r = self._conn.request("PUT", self._conn.client.url(k), body=self._codec.dumps(value), headers=headers)
        if r.status == 412:
            return False
        if r.status == 413:
            return False  # too large to cache: not stored
        _check(r)
        return True

    def set_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Optional[int] = None
    ) -> List[Any]:
        """Stores every item concurrently; answers the keys that were not stored (their node
        could not answer, or the value was too large), as Django's contract says."""
        made: Dict[Any, Tuple[Any, Any]] = {
            self.make_and_validate_key(key, version=version): (key, value) for key, value in data.items()
        }
        ttl = self._ttl(timeout)
        if ttl is None:
            for k in made:
                self._conn.client.delete(k)
            return []
        mapping: Dict[Any, bytes] = {k: self._codec.dumps(value) for k, (_, value) in made.items()}
        try:
            failed = self._conn.client.set_many(mapping, ttl=ttl)
        except Refused as e:
            if e.status != 413:
                raise
            # A value too large: the batch stopped at it; store one by one to tell which.
            failed = []
            for k, body in mapping.items():
                try:
                    self._conn.client.set(k, body, ttl=ttl)
                except Unavailable:
                    failed.append(k)
                except Refused as e2:
                    if e2.status != 413:
                        raise
                    self._conn.client.delete(k)
                    failed.append(k)
        return [made[k][0] for k in failed]

    def delete(self, key: Any, version: Optional[int] = None) -> bool:
        k = self.make_and_validate_key(key, version=version)
        return self._conn.client.delete(k)

    def delete_many(self, keys: Iterable[Any], version: Optional[int] = None) -> None:
        # larder has no batch delete (nor the client a delete_many): one DELETE per key.
        for k in [self.make_and_validate_key(key, version=version) for key in keys]:
            self._conn.client.delete(k)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: Optional[int] = None) -> bool:
        k = self.make_and_validate_key(key, version=version)
        ttl = self._ttl(timeout)
        if ttl is None:
            return self._conn.client.delete(k)  # expire now: whether it had a value
        touch = getattr(self._conn.client, "touch", None)
        if touch is not None:
            return bool(touch(k, ttl))
        # A client from before ``Client.touch``: the same PATCH, sent here.
        r = self._conn.request("PATCH", self._conn.client.url(k), body=b"", headers={"X-TTL": str(ttl)})
        if r.status == 404:
            return False
        _check(r)
        return True

    def incr(self, key: Any, delta: int = 1, version: Optional[int] = None) -> Any:
        """Adds ``delta`` by compare-and-swap: read the value and its ETag, ``PUT`` the sum with
        ``If-Match``, again on ``412`` (another writer came first). ``ValueError`` when the key
        has no value, as Django requires. ``X-TTL: keep`` keeps the expiry of the value replaced
        (the one the ETag names), as memcached's ``incr`` does: a fixed window stays fixed."""
        k = self.make_and_validate_key(key, version=version)
        url = self._conn.client.url(k)
        for attempt in range(_CAS_ATTEMPTS):
            r = self._conn.request("GET", url)
            if r.status == 404:
                raise ValueError(f"Key '{key}' not found")
            _check(r)
            etag = r.headers.get("ETag")
            if not etag:
                raise Unavailable(f"GET {url}: no ETag to compare-and-swap with")
            value = self._codec.loads(r.data) + delta
            headers = {"If-Match": etag, "X-TTL": "keep"}
            w = self._conn.request("PUT", url, body=self._codec.dumps(value), headers=headers)
            if w.status != 412:
                _check(w)
                return value
            if attempt >= 2:
                time.sleep(random.uniform(0, 0.001 * attempt))
        raise Unavailable(f"incr of {k!r}: the value changed under {_CAS_ATTEMPTS} attempts in a row")

    # -- async ------------------------------------------------------------------------------
    # BaseCache's aincr is an aget and an aset (a concurrent increment could be lost), and its
    # batch calls go one key at a time (aset_many answers no failed keys); these run the sync
    # methods in a thread, as BaseCache does for the others.

    async def aincr(self, key: Any, delta: int = 1, version: Optional[int] = None) -> Any:
        return await sync_to_async(self.incr, thread_sensitive=True)(key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: Optional[int] = None) -> Any:
        return await sync_to_async(self.incr, thread_sensitive=True)(key, -delta, version)

    async def ahas_key(self, key: Any, version: Optional[int] = None) -> bool:
        return bool(await sync_to_async(self.has_key, thread_sensitive=True)(key, version))

    async def aget_many(self, keys: Iterable[Any], version: Optional[int] = None) -> Dict[Any, Any]:
        got: Dict[Any, Any] = await sync_to_async(self.get_many, thread_sensitive=True)(list(keys), version)
        return got

    async def aset_many(
        self, data: Mapping[Any, Any], timeout: Any = DEFAULT_TIMEOUT, version: Optional[int] = None
    ) -> List[Any]:
        failed: List[Any] = await sync_to_async(self.set_many, thread_sensitive=True)(data, timeout, version)
        return failed

    async def adelete_many(self, keys: Iterable[Any], version: Optional[int] = None) -> None:
        await sync_to_async(self.delete_many, thread_sensitive=True)(list(keys), version)

    # -- the whole cache --------------------------------------------------------------------

    def clear(self) -> None:
        """Flushes every node (``POST /_larder/flush``, with the token when one is set)."""
        for node in self._conn.nodes:
            _check(self._conn.request("POST", f"{node}/_larder/flush"))

    def close(self, **kwargs: Any) -> None:
        """Keeps the shared keep-alive connections open: Django calls this after every request."""


class _Connection:
    """What the backends of one LOCATION and OPTIONS share in a process: a ``larder.Client``
    (bytes in, bytes out: the backend serializes) and, for the requests the client has no
    call for (conditional PUTs, the ETag of a GET, the flush), a pool of its own."""

    def __init__(self, urls: List[str], options: Dict[str, Any]) -> None:
        try:
            self.client = Client(urls, serializer=None, **options)
        except TypeError as e:
            raise ImproperlyConfigured(f"larder.django.LarderCache OPTIONS: {e}") from e
        token = options.get("token")
        timeout = float(options.get("timeout", 5.0))
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = urllib3.Timeout(connect=timeout, read=timeout)
        self.pool = urllib3.PoolManager(
            num_pools=max(4, len(urls)), maxsize=int(options.get("pool_size", 32)), block=False
        )
        self.nodes = [f"{p.scheme}://{p.netloc}" for p in map(urlsplit, urls)]

    def request(
        self, method: str, url: str, *, body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None
    ) -> urllib3.BaseHTTPResponse:
        h = dict(self.headers)
        if headers:
            h.update(headers)
        try:
            return self.pool.request(
                method, url, body=body, headers=h, timeout=self.timeout, retries=False, redirect=False
            )
        except urllib3.exceptions.HTTPError as e:
            raise Unavailable(f"{method} {url}: {e}") from e


_SHARED: Dict[Tuple[Any, ...], _Connection] = {}
_SHARED_LOCK = threading.Lock()


def _shared(urls: List[str], options: Dict[str, Any]) -> _Connection:
    name = (tuple(urls), tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _SHARED_LOCK:
        conn = _SHARED.get(name)
        if conn is None:
            conn = _SHARED[name] = _Connection(urls, options)
        return conn


def _check(r: urllib3.BaseHTTPResponse) -> None:
    if r.status < 300:
        return
    message = r.data.decode("utf-8", "replace").strip()
    if r.status >= 500:
        raise Unavailable(f"{r.status} {message}")
    raise Refused(r.status, message)


class _Codec:
    """The backend's serializer: ``dumps`` always bytes."""

    def __init__(self, dumps: Any, loads: Any) -> None:
        self._dumps, self._loads = dumps, loads

    def dumps(self, value: Any) -> bytes:
        data = self._dumps(value)
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        raise TypeError(f"a serializer's dumps answers bytes or str, not {type(data).__name__}")

    def loads(self, data: bytes) -> Any:
        return self._loads(data)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"a value is bytes or str with serializer None, not {type(value).__name__}")


def _codec(spec: Any) -> _Codec:
    if spec is None:
        return _Codec(_as_bytes, bytes)
    if spec == "pickle":
        spec = PICKLE
    elif spec == "json":
        spec = JSON
    elif isinstance(spec, str):
        if "." not in spec:
            raise ImproperlyConfigured(f"unknown serializer {spec!r}: 'pickle', 'json', None, or a dotted path")
        spec = import_string(spec)
        if isinstance(spec, type):
            spec = spec()
    if not (callable(getattr(spec, "dumps", None)) and callable(getattr(spec, "loads", None))):
        raise ImproperlyConfigured("a serializer has dumps(value) -> bytes or str and loads(bytes) -> value")
    return _Codec(spec.dumps, spec.loads)
