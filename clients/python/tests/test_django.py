"""Django's cache framework on larder: ``larder.django.LarderCache`` over the HTTP API, and
Django's own ``PyMemcacheCache`` on larder's memcached port, against the real binary. The
settings are Django's (``settings.configure``, then ``CACHES`` per test, naming the servers
the test started)."""

from __future__ import annotations

import asyncio
import io
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

pytest.importorskip("django")

import django  # noqa: E402
import urllib3  # noqa: E402
from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}, USE_TZ=True
    )
    django.setup()

from django.core.cache import caches  # noqa: E402
from django.core.cache.backends.base import CacheKeyWarning, InvalidCacheKey  # noqa: E402
from django.test import override_settings  # noqa: E402

import larder  # noqa: E402
from larder.django import LarderCache  # noqa: E402
from conftest import Node, free_port  # noqa: E402


def custom_key(key: str, key_prefix: str, version: int) -> str:
    return f"custom/{key_prefix or '-'}/v{version}/{key}"


def between(seconds: Optional[int], low: int, high: int) -> bool:
    return seconds is not None and low <= seconds <= high


def larder_cache(location: Any, **params: Any) -> Dict[str, Any]:
    return {"BACKEND": "larder.django.LarderCache", "LOCATION": location, **params}


class Server:
    """One larder node, with its memcached port open too."""

    def __init__(self, data: Path, *args: str) -> None:
        self.memcache_port = free_port()
        self.node = Node(data, "--memcache-listen", f"127.0.0.1:{self.memcache_port}", *args)
        self.url = self.node.url
        self.raw = larder.Client(self.url)  # bytes: what the server holds under a key

    def max_age(self, key: str) -> Optional[int]:
        """The seconds a key has left (None: no expiry), from its Cache-Control."""
        r = urllib3.request("HEAD", f"{self.url}/{larder.canonical(key)}", retries=False)
        assert r.status == 200, (key, r.status)
        cc = r.headers["Cache-Control"]
        return None if cc == "no-cache" else int(cc.split("=")[1])

    def etag(self, key: str) -> str:
        r = urllib3.request("HEAD", f"{self.url}/{larder.canonical(key)}", retries=False)
        return str(r.headers["ETag"])

    def stop(self) -> None:
        self.raw.close()
        self.node.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "data")
    yield s
    s.stop()


@pytest.fixture
def cache_settings(server: Server) -> Iterator[Any]:
    """``django.core.cache.caches`` with every configuration under test on ``server``."""
    url = server.url
    conf = {
        "default": larder_cache(url),
        "prefixed": larder_cache(url, KEY_PREFIX="site2"),
        "keyfunc": larder_cache(url, KEY_PREFIX="kp", KEY_FUNCTION=f"{__name__}.custom_key"),
        "keyfunc_callable": larder_cache(url, KEY_FUNCTION=custom_key),
        "v2": larder_cache(url, VERSION=2),
        "forever": larder_cache(url, TIMEOUT=None),
        "uncached": larder_cache(url, TIMEOUT=0),
        "short": larder_cache(url, TIMEOUT=1),
        "json": larder_cache(url, OPTIONS={"serializer": "json", "timeout": 2.0}),
        "memcached": {
            "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
            "LOCATION": f"127.0.0.1:{server.memcache_port}",
        },
    }
    with override_settings(CACHES=conf):
        yield caches
        for alias in conf:
            caches[alias].close()


# -- LarderCache ------------------------------------------------------------------------------


def test_get_set_add_delete_has_key(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    assert isinstance(c, LarderCache)
    assert c.get("k") is None and c.get("k", "dflt") == "dflt"
    c.set("k", {"a": [1, 2.5], "b": ("t",)})
    assert c.get("k") == {"a": [1, 2.5], "b": ("t",)}
    assert server.raw.get(":1:k") is not None, "Django's key: prefix:version:key"
    c.set("none", None)
    assert c.get("none", "dflt") is None and c.has_key("none"), "a stored None is not a miss"
    c.set("file", io.BytesIO(b"pickled, not streamed"))  # a value with read() is still a value
    assert c.get("file").getvalue() == b"pickled, not streamed"
    c.set("caf\u00e9/\u00fc?&#", "unicode")
    assert c.get("caf\u00e9/\u00fc?&#") == "unicode"
    assert c.add("k", "other") is False and c.get("k") == {"a": [1, 2.5], "b": ("t",)}
    assert c.add("new", 1) is True and c.get("new") == 1
    assert c.has_key("new") and "new" in c and not c.has_key("absent") and "absent" not in c
    assert c.delete("new") is True and c.delete("new") is False and c.get("new") is None
    c.close()  # Django closes caches after each request; the backend stays usable
    assert c.get("k") is not None


def test_add_is_atomic_across_threads(cache_settings: Any) -> None:
    won: List[bool] = []

    def add(i: int) -> None:
        won.append(cache_settings["default"].add("once", i))  # each thread its own backend

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) == 1 and len(won) == 16


def test_get_many_set_many_delete_many(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    assert c.set_many({"a": 1, "b": [2], "c": None}) == []
    assert c.get_many(["a", "b", "c", "missing"]) == {"a": 1, "b": [2], "c": None}
    assert c.get_many([]) == {}
    c.delete_many(["a", "b", "missing"])
    assert c.get_many(["a", "b", "c"]) == {"c": None}
    assert c.set_many({"t1": 1, "t2": 2}, timeout=1) == []
    assert between(server.max_age(":1:t1"), 0, 1)
    time.sleep(1.2)
    assert c.get_many(["t1", "t2"]) == {}
    server.node.stop()
    assert sorted(c.set_many({"x": 1, "y": 2})) == ["x", "y"], "keys not stored are answered"
    with pytest.raises(larder.Unavailable):
        c.get("x")


def test_incr_decr(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    with pytest.raises(ValueError):
        c.incr("missing")
    with pytest.raises(ValueError):
        c.decr("missing")
    c.set("n", 1)
    assert c.incr("n") == 2 and c.incr("n", 10) == 12 and c.decr("n") == 11 and c.decr("n", 5) == 6
    assert c.get("n") == 6 and type(c.get("n")) is int
    assert c.incr("n", -10) == -4 and c.get("n") == -4
    assert c.get_many(["n"]) == {"n": -4}
    c.set("s", "text")
    with pytest.raises(TypeError):
        c.incr("s")
    # The expiry stays, exactly: none stays none; a fixed window stays fixed however often
    # the counter is increased.
    c.set("forever", 1, timeout=None)
    c.incr("forever")
    assert server.max_age(":1:forever") is None
    set_at = time.monotonic()
    c.set("windowed", 1, timeout=2)
    for _ in range(3):
        time.sleep(0.45)
        c.incr("windowed")
    assert c.get("windowed") == 4
    assert between(server.max_age(":1:windowed"), 0, 1), "not pushed back by the increments"
    time.sleep(max(0.0, 2.1 - (time.monotonic() - set_at)))
    assert c.get("windowed") is None, "gone when the window set first ends"
    j = cache_settings["json"]
    j.set("jn", 41)
    assert j.incr("jn") == 42 and j.get("jn") == 42


def test_incr_loses_no_update_to_concurrent_ones(cache_settings: Any) -> None:
    cache_settings["default"].set("ctr", 0)

    def bump() -> None:
        for _ in range(25):
            cache_settings["default"].incr("ctr")

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache_settings["default"].get("ctr") == 200


def test_touch(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    assert c.touch("missing", 10) is False
    c.set("t", "v", timeout=1)
    etag = server.etag(":1:t")
    assert c.touch("t", 10) is True
    assert server.etag(":1:t") == etag, "the value is not rewritten"
    time.sleep(1.2)
    assert c.get("t") == "v" and between(server.max_age(":1:t"), 8, 10)
    assert c.touch("t", None) is True and server.max_age(":1:t") is None
    assert c.touch("t", 0) is True and c.get("t") is None, "0: expire now"
    assert c.touch("t", 0) is False
    short = cache_settings["short"]  # TIMEOUT 1: touch without a timeout uses it
    short.set("x", 1, timeout=None)
    assert short.touch("x") is True
    time.sleep(1.2)
    assert short.get("x") is None


def test_timeouts(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    c.set("dflt", 1)
    assert between(server.max_age(":1:dflt"), 298, 300), "TIMEOUT's default, 300 s"
    c.set("none", 1, timeout=None)
    assert server.max_age(":1:none") is None
    c.set("one", 1, timeout=1)
    c.set("half", 1, timeout=0.5)  # whole seconds, rounded up
    assert c.get("one") == 1 and c.get("half") == 1
    time.sleep(1.2)
    assert c.get("one") is None and c.get("half") is None and c.get("none") == 1
    c.set("huge", 1, timeout=10**12)  # past larder's 100 years: capped, not refused
    assert c.get("huge") == 1
    # 0 (or less): nothing is cached, and what was is gone.
    c.set("z", 1)
    c.set("z", 2, timeout=0)
    assert c.get("z") is None and not c.has_key("z")
    c.set("neg", 1)
    c.set("neg", 1, timeout=-5)
    assert c.get("neg") is None
    assert c.add("z0", 1, timeout=0) is True and c.get("z0") is None
    c.set("present", 1)
    assert c.add("present", 2, timeout=0) is False and c.get("present") == 1
    c.set_many({"m1": 1, "m2": 2})
    assert c.set_many({"m1": 3, "m2": 4}, timeout=0) == [] and c.get_many(["m1", "m2"]) == {}
    assert c.get_or_set("gos0", "computed", timeout=0) == "computed" and c.get("gos0") is None
    uncached = cache_settings["uncached"]  # TIMEOUT 0
    uncached.set("u", 1)
    assert uncached.get("u") is None and uncached.add("u", 1) is True and uncached.get("u") is None
    forever = cache_settings["forever"]  # TIMEOUT None
    forever.set("f", 1)
    forever.add("fa", 1)
    assert server.max_age(":1:f") is None and server.max_age(":1:fa") is None
    short = cache_settings["short"]  # TIMEOUT 1
    short.set("s", 1)
    short.add("sa", 1)
    short.set_many({"sm": 1})
    time.sleep(1.2)
    assert short.get_many(["s", "sa", "sm"]) == {}


def test_timeout_none_overrides_the_servers_default_ttl(tmp_path: Path) -> None:
    s = Server(tmp_path / "d", "--default-ttl", "1s")
    try:
        with override_settings(CACHES={"default": larder_cache(s.url, TIMEOUT=None)}):
            c = caches["default"]
            c.set("k", 1)
            c.add("a", 1)
            c.set_many({"m": 1})
            c.set("t", 0)
            c.incr("t")
            time.sleep(1.2)
            assert c.get_many(["k", "a", "m", "t"]) == {"k": 1, "a": 1, "m": 1, "t": 1}
    finally:
        s.stop()


def test_versioning(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]
    c.set("v", "one")
    c.set("v", "two", version=2)
    assert c.get("v") == "one" and c.get("v", version=2) == "two"
    assert server.raw.get(":1:v") is not None and server.raw.get(":2:v") is not None
    assert cache_settings["v2"].get("v") == "two", "VERSION sets the default version"
    assert c.incr_version("v") == 2
    assert c.get("v", version=2) == "one" and c.get("v") is None
    assert c.decr_version("v", version=2) == 1
    assert c.get("v") == "one" and c.get("v", version=2) is None
    with pytest.raises(ValueError):
        c.incr_version("absent")
    assert c.add("w", 1, version=3) is True and c.add("w", 2, version=3) is False
    assert c.get("w") is None and c.has_key("w", version=3)
    assert c.incr("w", version=3) == 2 and c.decr("w", version=3) == 1
    assert c.touch("w", 100, version=3) is True and c.touch("w", 100) is False
    c.set_many({"x": 1, "y": 2}, version=3)
    assert c.get_many(["x", "y"], version=3) == {"x": 1, "y": 2} and c.get_many(["x", "y"]) == {}
    c.delete_many(["x", "y"], version=3)
    assert c.get_many(["x", "y"], version=3) == {}
    assert c.delete("w", version=3) is True
    assert c.get_or_set("g", "three", version=3) == "three" and c.get("g", version=3) == "three"


def test_key_prefix_and_key_function(cache_settings: Any, server: Server) -> None:
    c, p = cache_settings["default"], cache_settings["prefixed"]
    p.set("k", "prefixed")
    assert server.raw.get("site2:1:k") is not None
    assert c.get("k") is None and p.get("k") == "prefixed"
    c.set("k", "plain")
    assert p.get("k") == "prefixed" and c.get("k") == "plain"
    assert p.incr_version("k") == 2 and server.raw.get("site2:2:k") is not None
    kf = cache_settings["keyfunc"]  # KEY_FUNCTION as a dotted path
    kf.set("k", 1)
    kf.set_many({"m": 2})
    assert server.raw.get("custom/kp/v1/k") is not None and server.raw.get("custom/kp/v1/m") is not None
    assert kf.get("k") == 1 and kf.incr("k") == 2 and kf.get_many(["k", "m"]) == {"k": 2, "m": 2}
    assert kf.touch("k", 10) and kf.has_key("k") and kf.delete("k")
    kc = cache_settings["keyfunc_callable"]  # KEY_FUNCTION as a callable
    kc.set("k", 1, version=7)
    assert server.raw.get("custom/-/v7/k") is not None and kc.get("k", version=7) == 1


def test_clear_flushes_the_node(cache_settings: Any, server: Server) -> None:
    c, p = cache_settings["default"], cache_settings["prefixed"]
    c.set("a", 1)
    p.set("b", 2)
    server.raw.set("raw/key", b"x")
    c.clear()
    assert c.get("a") is None and p.get("b") is None and "raw/key" not in server.raw
    assert not c.has_key("a")
    c.set("after", 1)
    assert c.get("after") == 1, "a flush is of what was stored before it"


def test_get_or_set(cache_settings: Any) -> None:
    c = cache_settings["default"]
    calls: List[int] = []

    def compute() -> Dict[str, int]:
        calls.append(1)
        return {"n": len(calls)}

    assert c.get_or_set("g", compute) == {"n": 1}
    assert c.get_or_set("g", compute) == {"n": 1} and len(calls) == 1
    assert c.get_or_set("plain", "value") == "value" and c.get("plain") == "value"
    c.set("existing", "kept")
    assert c.get_or_set("existing", "other") == "kept"
    assert c.get_or_set("nonecb", lambda: None) is None
    assert c.get_or_set("short", compute, timeout=1) == {"n": 2}
    time.sleep(1.2)
    assert c.get_or_set("short", compute, timeout=1) == {"n": 3}


def test_async_methods(cache_settings: Any, server: Server) -> None:
    c = cache_settings["default"]

    async def main() -> None:
        assert await c.aget("a") is None and await c.aget("a", "d") == "d"
        await c.aset("a", [1])
        assert await c.aget("a") == [1]
        assert await c.aadd("a", 2) is False and await c.aadd("b", 2) is True
        assert await c.ahas_key("b") and not await c.ahas_key("zz")
        assert await c.aset_many({"m1": 1, "m2": 2}) == []
        assert await c.aget_many(["m1", "m2", "zz"]) == {"m1": 1, "m2": 2}
        await c.adelete_many(["m1", "m2"])
        assert await c.aget_many(["m1", "m2"]) == {}
        await c.aset("n", 10)
        assert await c.aincr("n") == 11 and await c.adecr("n", 5) == 6
        with pytest.raises(ValueError):
            await c.aincr("zz")
        assert await c.atouch("n", 100) is True and await c.atouch("zz", 100) is False
        assert await c.aget_or_set("g", lambda: "computed") == "computed"
        assert await c.aget("g") == "computed"
        assert await c.aincr_version("g") == 2 and await c.aget("g", version=2) == "computed"
        assert await c.adecr_version("g", version=2) == 1 and await c.aget("g") == "computed"
        assert await c.adelete("a") is True and await c.adelete("a") is False
        await c.aset("t", 1, timeout=1)
        await c.aset("z", 1)
        await c.aset("z", 1, timeout=0)
        assert await c.aget("z") is None
        await asyncio.sleep(1.2)
        assert await c.aget("t") is None
        results = await asyncio.gather(*(c.aincr("n") for _ in range(10)))
        assert sorted(results) == list(range(7, 17))
        await c.aclear()
        assert await c.aget("n") is None
        await c.aclose()

    asyncio.run(main())


def test_key_validation(cache_settings: Any) -> None:
    c = cache_settings["default"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.set("plain:key/with-slash", 1)  # no warning for a portable key
    for key in ["with space", "k" * 300, "ctl\x01char", "tab\tkey"]:
        with pytest.warns(CacheKeyWarning):
            c.set(key, key)
        with pytest.warns(CacheKeyWarning):
            assert c.get(key) == key, "larder stores what memcached could not"
    for bad in ["x" * 1100, "a/../b", "a/./b"]:
        with pytest.raises(InvalidCacheKey), warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheKeyWarning)
            c.set(bad, 1)
        with pytest.raises(ValueError), warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheKeyWarning)
            c.get(bad)


def test_value_too_large_is_not_cached(tmp_path: Path) -> None:
    s = Server(tmp_path / "d", "--max-value-size", "1KiB")
    try:
        with override_settings(CACHES={"default": larder_cache(s.url)}):
            c = caches["default"]
            big = b"x" * 4096
            c.set("k", "small")
            c.set("k", big)  # memcached's backends: not cached, and the old value dropped
            assert c.get("k") is None
            assert c.set_many({"ok": 1, "big": big}) == ["big"] and c.get("ok") == 1
            assert c.add("big2", big) is False and c.get("big2") is None
    finally:
        s.stop()


def test_several_nodes_with_a_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    servers = [Server(tmp_path / f"d{i}", "--auth-token", str(token)) for i in range(2)]
    urls = [s.url for s in servers]
    try:
        conf = {
            "list": larder_cache(urls, OPTIONS={"token": "s3cret", "timeout": 2.0}),
            "string": larder_cache(",".join(urls), OPTIONS={"token": "s3cret"}),
            "no_token": larder_cache(urls),
        }
        with override_settings(CACHES=conf):
            c = caches["list"]
            keys = [f"k{i}" for i in range(40)]
            assert c.set_many({k: k for k in keys}) == []
            held = [[k for k in keys if s.raw.get(f":1:{k}") is not None] for s in servers]
            assert all(held) and sorted(held[0] + held[1]) == sorted(keys), "each key on one node"
            assert caches["string"].get_many(keys) == {k: k for k in keys}
            assert c.add("k0", "x") is False and c.add("new", 1) is True
            assert c.incr("new") == 2 and c.touch("new", 5) is True
            anon = caches["no_token"]
            assert anon.get("k1") == "k1", "reads are open"
            for write in (lambda: anon.set("k1", 1), lambda: anon.add("zz", 1), lambda: anon.incr("new"),
                          lambda: anon.touch("new", 5), lambda: anon.delete("k1"), anon.clear):
                with pytest.raises(larder.Refused) as e:
                    write()
                assert e.value.status == 401
            c.clear()
            assert c.get_many(keys) == {} and all(not s.raw.get(f":1:{k}") for s in servers for k in keys)
    finally:
        for s in servers:
            s.stop()


def test_backends_share_one_client_per_configuration(cache_settings: Any) -> None:
    here = cache_settings["default"]
    there: List[Any] = []
    t = threading.Thread(target=lambda: there.append(cache_settings["default"]))
    t.start()
    t.join()
    assert there[0] is not here, "Django makes a backend per thread"
    assert there[0]._conn is here._conn and cache_settings["prefixed"]._conn is here._conn
    assert cache_settings["json"]._conn is not here._conn


# -- Django's PyMemcacheCache on larder's memcached port ---------------------------------------


def test_django_pymemcache_backend_on_larders_memcached_port(cache_settings: Any, server: Server) -> None:
    m = cache_settings["memcached"]
    assert type(m).__name__ == "PyMemcacheCache"
    assert m.get("k") is None and m.get("k", "d") == "d"
    m.set("k", {"a": 1})
    assert m.get("k") == {"a": 1} and m.has_key("k") and "k" in m
    assert server.raw.get(":1:k") is not None, "the memcached key is the HTTP key"
    assert m.add("k", 2) is False and m.add("new", 2) is True and m.get("new") == 2
    assert m.delete("new") is True and m.delete("new") is False
    assert m.set_many({"a": 1, "b": "two", "c": None}) == []
    assert m.get_many(["a", "b", "c", "zz"]) == {"a": 1, "b": "two", "c": None}
    m.delete_many(["a", "b"])
    assert m.get_many(["a", "b", "c"]) == {"c": None}
    m.set("n", 1)
    assert m.incr("n") == 2 and m.incr("n", 10) == 12 and m.decr("n", 2) == 10 and m.get("n") == 10
    with pytest.raises(ValueError):
        m.incr("zz")
    with pytest.raises(ValueError):
        m.decr("zz")
    assert m.touch("n", 100) is True and m.touch("zz", 100) is False
    assert between(server.max_age(":1:n"), 98, 100)
    assert m.get_or_set("g", lambda: "computed") == "computed" and m.get_or_set("g", "other") == "computed"
    m.set("v", "one")
    assert m.incr_version("v") == 2 and m.get("v", version=2) == "one" and m.get("v") is None
    # Timeouts: the default, None, 0, short, over 30 days (memcached's absolute time).
    m.set("dflt", 1)
    assert between(server.max_age(":1:dflt"), 298, 300)
    m.set("forever", 1, timeout=None)
    assert server.max_age(":1:forever") is None
    m.set("z", 1)
    m.set("z", 2, timeout=0)
    assert m.get("z") is None
    assert m.add("z0", 1, timeout=0) is True and m.get("z0") is None
    m.set_many({"m1": 1}, timeout=0)
    assert m.get("m1") is None
    m.set("t0", 1)
    assert m.touch("t0", 0) is True and m.get("t0") is None
    m.set("long", 1, timeout=40 * 86400)
    assert between(server.max_age(":1:long"), 40 * 86400 - 5, 40 * 86400)
    m.set("one", 1, timeout=1)
    m.set("tn", 1, timeout=1)
    assert m.touch("tn", None) is True
    time.sleep(1.2)
    assert m.get("one") is None and m.get("tn") == 1
    with pytest.raises(InvalidCacheKey):
        m.set("with space", 1)  # Django's memcached backends refuse what LarderCache warns about
    m.clear()
    assert m.get("k") is None and m.get("forever") is None and not m.has_key("c")
