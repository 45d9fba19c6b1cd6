"""Every API point against the real binary, for the sync client and the asyncio one."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from typing import Any, Callable, Dict, List

import pytest

import larder
from larder import _memo
from conftest import Node


GREETED: List[str] = []  # module-level: what a memoized function captures is part of its key


class Person:
    """Module-level, so that its instances pickle (a bound method's object keys its calls)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def greet(self) -> str:
        GREETED.append(self.name)
        return f"hello {self.name}"


def test_get_set_delete_and_dict_access(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    assert c.get("a/b") is None and c.get("a/b", b"dflt") == b"dflt"
    c.set("a/b", b"value")
    assert c.get("a/b") == b"value" and c["a/b"] == b"value" and "a/b" in c
    c["caf\u00e9 & co?"] = "text is UTF-8"
    assert c["caf\u00e9 & co?"] == b"text is UTF-8"
    with pytest.raises(larder.NotFound):
        c["missing"]
    with pytest.raises(KeyError):
        c["missing"]
    assert "missing" not in c
    assert c.delete("a/b") is True and c.delete("a/b") is False
    del c["caf\u00e9 & co?"]
    with pytest.raises(larder.NotFound):
        del c["caf\u00e9 & co?"]
    with pytest.raises(TypeError):
        c.set("k", {"not": "bytes"})


def test_ttl_content_type_and_serializers(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    c.set("short", b"lived", ttl=1)
    assert c.get("short") == b"lived"
    time.sleep(1.2)
    assert c.get("short") is None
    c.set("typed", b"<p>", content_type="text/html")
    for ser, value in [("pickle", {"a": [1, 2.5, None]}), ("json", {"a": [1, 2.5, None]}), (larder.PICKLE, (1, "x"))]:
        s = make(node.url, serializer=ser)
        s.set("obj", value)
        assert s.get("obj") == value and s["obj"] == value
    with pytest.raises(ValueError):
        make(node.url, serializer="yaml")


def test_errors_say_what_happened(node: Node, make: Callable[..., Any], tmp_path: Any) -> None:
    ro = Node(tmp_path / "ro", "--read-only")
    try:
        with pytest.raises(larder.Refused) as e:
            make(ro.url).set("k", b"v")
        assert e.value.status == 403 and "read-only" in e.value.message
    finally:
        ro.stop()
    down = make(f"http://127.0.0.1:{node.port}", timeout=1)
    node.stop()
    with pytest.raises(larder.Unavailable):
        down.get("a")
    with pytest.raises(larder.Unavailable):
        down.set("a", b"v")


def test_a_node_that_never_answers_fails_the_call_within_the_timeout(make: Callable[..., Any]) -> None:
    # The kernel queues connections to a socket that listens but never accepts: the request
    # is sent and no answer ever comes.
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        c = make(f"http://127.0.0.1:{mute.getsockname()[1]}", timeout=0.5)
        for call in (lambda: c.get("a"), lambda: c.set("a", b"v")):
            start = time.monotonic()
            with pytest.raises(larder.Unavailable):
                call()
            assert 0.4 < time.monotonic() - start < 5
    with pytest.raises(ValueError):
        make("http://127.0.0.1:1", timeout=0)


def test_no_timeout_and_keys_of_any_bytes_type(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url, timeout=None)  # no bound
    c.set(bytearray(b"ba/1"), b"v")  # not hashable: not remembered, still a key
    assert c.get(b"ba/1") == b"v" and c.get(bytearray(b"ba/1")) == b"v" and c.get("ba/1") == b"v"


def test_get_or_set_computes_once_per_key_and_survives_a_node_down(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url, serializer="pickle")
    calls: List[int] = []

    def compute() -> Any:
        calls.append(1)
        return {"n": len(calls)}

    assert c.get_or_set("g", compute, ttl=60) == {"n": 1}
    assert c.get_or_set("g", compute) == {"n": 1} and len(calls) == 1
    node.stop()
    assert c.get_or_set("h", compute) == {"n": 2}, "an unavailable node is a miss"
    strict = make(node.url, miss_on_unavailable=False)
    with pytest.raises(larder.Unavailable):
        strict.get_or_set("h", lambda: b"x")


def test_single_flight_in_one_process(node: Node) -> None:
    c = larder.Client(node.url)
    calls: List[int] = []
    gate = threading.Event()

    def slow() -> bytes:
        calls.append(1)
        gate.wait(5)
        return b"computed"

    out: List[Any] = []
    threads = [threading.Thread(target=lambda: out.append(c.get_or_set("sf", slow))) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    gate.set()
    for t in threads:
        t.join()
    assert out == [b"computed"] * 8 and len(calls) == 1


def test_async_get_or_set_takes_async_callables_and_single_flights(node: Node) -> None:
    import asyncio

    async def main() -> None:
        async with larder.AsyncClient(node.url) as c:
            calls: List[int] = []

            async def compute() -> bytes:
                calls.append(1)
                await asyncio.sleep(0.2)
                return b"from a coroutine"

            got = await asyncio.gather(*(c.get_or_set("ak", compute) for _ in range(10)))
            assert got == [b"from a coroutine"] * 10 and len(calls) == 1
            assert await c.get("ak") == b"from a coroutine"

            @c.memoize(ttl=60)
            async def square(x: int) -> int:
                calls.append(1)
                return x * x

            assert await square(7) == 49 and await square(7) == 49 and len(calls) == 2

    asyncio.run(main())


def test_memoize_caches_per_arguments_and_recomputes_early_near_expiry(
    node: Node, make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = make(node.url)
    # XFetch draws a random number per read; the draw is fixed here so that each assertion
    # below holds every time (a real draw recomputes a fresh entry early a few times in 100).
    draw = [0.0]
    monkeypatch.setattr(_memo.random, "random", lambda: draw[0])
    calls: List[Any] = []

    @c.memoize(ttl=60)
    def add(a: int, b: int = 0) -> int:
        calls.append((a, b))
        return a + b

    assert add(1, b=2) == 3 and add(1, b=2) == 3 and add(2) == 2
    assert calls == [(1, 2), (2, 0)]

    @c.memoize(ttl=2, key=lambda x: f"slow/{x}")
    def slow(x: int) -> int:
        calls.append(x)
        time.sleep(0.5)
        return x

    slow(5)
    n = len(calls)
    assert slow(5) == 5 and len(calls) == n, "fresh and far from expiry: served"
    # Within about its computing time of the expiry, an unlucky draw recomputes early (XFetch):
    # 0.5 s of work, 0.6 s before the expiry, a draw of 0.9 gives 0.5 * ln(10) = 1.15 s > 0.6 s.
    time.sleep(1.4)
    draw[0] = 0.9
    assert slow(5) == 5 and len(calls) == n + 1, "recomputed before the expiry"
    # The same draw far from the expiry of the fresh result serves it.
    assert slow(5) == 5 and len(calls) == n + 1, "fresh again after the recomputation"


def test_get_many_and_set_many(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    c.set_many({f"m/{i}": str(i).encode() for i in range(50)}, ttl=60)
    got = c.get_many([f"m/{i}" for i in range(55)])
    assert got == {f"m/{i}": str(i).encode() for i in range(50)}


def test_get_many_sends_each_batch_pipelined_on_one_connection(node: Node) -> None:
    c = larder.Client(node.url)
    c.set_many({f"p/{i}": str(i).encode() for i in range(200)})
    c.close()
    c = larder.Client(node.url)
    opened: List[Any] = []
    connect = c._wire._connect

    def counting(n: str) -> Any:
        opened.append(n)
        return connect(n)

    c._wire._connect = counting  # type: ignore[method-assign]
    keys = [f"p/{i}" for i in range(250)]  # 50 without a value
    assert c.get_many(keys) == {f"p/{i}": str(i).encode() for i in range(200)}
    # 250 keys are three batches (100, 100, 50), each on a connection of its own at most;
    # one request per connection would have opened as many as the pool holds.
    assert 1 <= len(opened) <= 3, opened
    # Again on the pooled sockets; then after a restart, on sockets the node closed while
    # they were idle, which are replaced.
    assert c.get_many(keys[:150]) == {f"p/{i}": str(i).encode() for i in range(150)}
    node.stop()
    node.start()
    assert c.get_many(keys) == {f"p/{i}": str(i).encode() for i in range(200)}
    assert c.get_many([]) == {}


def test_streaming_a_file_in_and_out(node: Node, make: Callable[..., Any], tmp_path: Any) -> None:
    c = make(node.url)
    data = bytes(range(256)) * 20_000  # 5 MB: chunked on the server too
    p = tmp_path / "blob"
    p.write_bytes(data)
    with open(p, "rb") as f:
        c.set("blob", f)
    c.set("from-bytesio", io.BytesIO(data[:1000]))
    out = bytearray()
    with c.open("blob") as r:
        while True:
            piece = r.read(1 << 16)
            if not piece:
                break
            out += piece
    assert bytes(out) == data
    assert c.get("from-bytesio") == data[:1000]
    with pytest.raises(larder.NotFound):
        with c.open("nothing"):
            pass


def test_several_nodes_each_key_on_its_owner(nodes: List[Node], make: Callable[..., Any]) -> None:
    urls = [n.url for n in nodes]
    c = make(urls)
    for i in range(300):
        c.set(f"k/{i}", str(i).encode())
    ring = larder.Ring([u.split("//")[1] for u in urls])
    for i in range(300):
        owner = nodes[ring.owner(larder.canonical(f"k/{i}"))]
        assert larder.Client(owner.url).get(f"k/{i}") == str(i).encode()
        others = [n for n in nodes if n is not owner]
        assert all(larder.Client(o.url).get(f"k/{i}") is None for o in others)
    assert c.get_many([f"k/{i}" for i in range(300)]) == {f"k/{i}": str(i).encode() for i in range(300)}


def test_keys_that_could_not_be_themselves_are_refused(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    for bad in ["a/../b", "./x", "a/.", "_larder/stats", "", "k" * 1025]:
        with pytest.raises(ValueError):
            c.set(bad, b"v")
    assert larder.canonical("a:b!(x),&=@ é") == "a%3Ab%21%28x%29%2C%26%3D%40%20%C3%A9"


def test_a_stream_closed_early_leaves_the_connection_usable(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    c.set("big", bytes(3 << 20))
    for _ in range(3):
        with c.open("big") as r:
            assert r.read(10) == bytes(10)
        c.set("after", b"ok")
        assert c.get("after") == b"ok" and c.delete("after")


def test_ttl_zero_means_no_expiry_over_the_servers_default(tmp_path: Any, make: Callable[..., Any]) -> None:
    n = Node(tmp_path / "d", "--default-ttl", "1s")
    try:
        c = make(n.url)
        c.set("default", b"v")
        c.set("forever", b"v", ttl=0)
        time.sleep(1.3)
        assert c.get("default") is None and c.get("forever") == b"v"
    finally:
        n.stop()


def test_a_value_too_large_to_cache_is_still_computed_and_returned(tmp_path: Any, make: Callable[..., Any]) -> None:
    n = Node(tmp_path / "d", "--max-value-size", "1KiB")
    try:
        c = make(n.url)
        assert c.get_or_set("huge", lambda: bytes(4096)) == bytes(4096)
        with pytest.raises(larder.Refused) as e:
            c.set("huge", bytes(4096))
        assert e.value.status == 413
    finally:
        n.stop()


def test_memoize_refuses_arguments_it_cannot_key(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)

    @c.memoize()
    def f(x: Any) -> int:
        return 1

    with pytest.raises(TypeError):
        f(threading.Lock())

    def make_adder(n: int) -> Callable[[int], int]:
        @c.memoize(key=lambda x: f"add/{n}/{x}")
        def add(x: int) -> int:
            return x + n

        return add

    assert make_adder(1)(1) == 2 and make_adder(5)(1) == 6, "closures named apart by key="


def test_async_single_flight_survives_its_first_caller_being_cancelled(node: Node) -> None:
    import asyncio

    async def main() -> None:
        async with larder.AsyncClient(node.url) as c:

            async def compute() -> bytes:
                await asyncio.sleep(0.3)
                return b"done"

            first = asyncio.ensure_future(c.get_or_set("cx", compute))
            await asyncio.sleep(0.05)
            others = [asyncio.ensure_future(c.get_or_set("cx", compute)) for _ in range(4)]
            await asyncio.sleep(0.05)
            first.cancel()
            assert await asyncio.gather(*others) == [b"done"] * 4
            with pytest.raises(asyncio.CancelledError):
                await first

    asyncio.run(main())


def test_memoize_keys_tell_functions_of_one_name_apart(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    # Two lambdas of one module: both are `<lambda>`; their code tells them apart.
    double = c.memoize(ttl=60)(lambda x: x + x)
    square = c.memoize(ttl=60)(lambda x: x * x)
    assert double(7) == 14 and square(7) == 49 and double(7) == 14

    # Nested functions of one factory: one name, one code; the captured value tells them apart.
    def make_adder(n: int) -> Callable[[int], int]:
        @c.memoize(ttl=60)
        def add(x: int) -> int:
            return x + n

        return add

    assert make_adder(1)(1) == 2 and make_adder(5)(1) == 6 and make_adder(1)(1) == 2

    # Bound methods of different objects: one qualified name; the object is keyed by value.
    alice, bob = Person("alice"), Person("bob")
    GREETED.clear()
    assert c.memoize(ttl=60)(alice.greet)() == "hello alice"
    assert c.memoize(ttl=60)(bob.greet)() == "hello bob"
    assert c.memoize(ttl=60)(Person("alice").greet)() == "hello alice", "an equal object: its result"
    assert GREETED == ["alice", "bob"]

    # What cannot be keyed by value is refused, pointing at key=.
    lock = threading.Lock()

    def make_locked() -> Callable[[], int]:
        @c.memoize()
        def locked() -> int:
            return 1 if lock else 0

        return locked

    with pytest.raises(TypeError, match="key="):
        make_locked()()
    holder = Person("x")
    holder.lock = lock  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="key="):
        c.memoize()(holder.greet)()


def test_memoize_a_recursive_nested_function(node: Node) -> None:
    # The function captures its own memoized wrapper (which holds the client): keyed by what
    # the wrapper runs.
    c = larder.Client(node.url)
    GREETED.clear()

    def make_fib() -> Callable[[int], int]:
        @c.memoize(ttl=60)
        def fib(n: int) -> int:
            GREETED.append(str(n))
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        return fib

    assert make_fib()(15) == 610 and len(GREETED) == 16
    assert make_fib()(15) == 610 and len(GREETED) == 16, "another closure of the same code and captures"
    c.close()


def test_a_serializer_whose_dumps_answers_str(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url, serializer=json)  # the module: json.dumps answers str
    c.set("j", {"a": [1, None]})
    assert c.get("j") == {"a": [1, None]} and make(node.url).get("j") == b'{"a": [1, null]}'
    assert c.get_or_set("g", lambda: {"n": 1}, ttl=60) == {"n": 1}
    assert c.get_or_set("g", lambda: {"n": 2}, ttl=60) == {"n": 1}
    calls: List[int] = []

    @c.memoize(ttl=60)
    def doubled(x: int) -> Dict[str, int]:
        calls.append(x)
        return {"x": 2 * x}

    assert doubled(2) == {"x": 4} and doubled(2) == {"x": 4} and calls == [2]


def test_batch_calls_with_a_node_down_keep_what_they_could_do(nodes: List[Node], make: Callable[..., Any]) -> None:
    urls = [n.url for n in nodes]
    c = make(urls, timeout=1)
    strict = make(urls, timeout=1, miss_on_unavailable=False)
    items = {f"b/{i}": str(i).encode() for i in range(60)}
    assert c.set_many(items, ttl=60) == []
    ring = larder.Ring([u.split("//")[1] for u in urls])
    down = nodes[0]
    lost = [k for k in items if nodes[ring.owner(larder.canonical(k))] is down]
    kept = {k: v for k, v in items.items() if k not in lost}
    assert lost and kept
    down.stop()

    assert c.get_many(items) == kept, "the down node's keys are misses"
    assert c.set_many(items, ttl=60) == lost, "set_many answers the keys it could not store"
    with pytest.raises(larder.Unavailable) as e:
        strict.get_many(items)
    assert e.value.partial == kept and e.value.failed == lost
    with pytest.raises(larder.Unavailable) as e:
        strict.set_many(items, ttl=60)
    assert e.value.partial == kept and e.value.failed == lost


def test_touch_gives_a_key_a_new_expiry(node: Node, make: Callable[..., Any], tmp_path: Any) -> None:
    # Needs a larder that answers PATCH (a binary without it answers 405, a Refused).
    c = make(node.url)
    c.set("t", b"v", ttl=1)
    assert c.touch("t", 60) is True
    time.sleep(1.5)
    assert c.get("t") == b"v"
    assert c.touch("missing", 60) is False
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    guarded = Node(tmp_path / "guarded", "--auth-token", str(token))
    try:
        make(guarded.url, token="s3cret").set("t", b"v")
        with pytest.raises(larder.Refused) as e:
            make(guarded.url).touch("t", 60)
        assert e.value.status == 401
    finally:
        guarded.stop()


# -- the client's own HTTP/1.1 ------------------------------------------------------------------


def test_pooled_connections_the_server_closed_are_replaced(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    for i in range(4):
        c.set(f"pool/{i}", b"before")
    node.stop()
    node.start()  # every pooled connection is now closed at the server's end
    for i in range(4):
        assert c.get(f"pool/{i}") == b"before", "sent again on a new connection"
    c.set("pool/after", b"after")
    assert c.get("pool/after") == b"after"


def test_a_header_that_would_end_its_line_is_refused(node: Node, make: Callable[..., Any]) -> None:
    c = make(node.url)
    with pytest.raises(ValueError):
        c.set("smuggle", b"v", content_type="text/plain\r\nX-TTL: 1\r\n\r\nGET /other HTTP/1.1")
    assert c.get("smuggle") is None
    c.set("after", b"in step")
    assert c.get("after") == b"in step", "the pooled connection is in step"


def test_a_refusal_before_the_body_is_read_is_refused_not_unavailable(tmp_path: Any, make: Callable[..., Any]) -> None:
    n = Node(tmp_path / "small", "--max-value-size", "64KiB")
    try:
        c = make(n.url)
        c.set("big", b"old")
        for _ in range(3):  # on a new connection, and on pooled ones
            with pytest.raises(larder.Refused) as e:
                c.set("big", bytes(8 << 20))
            assert e.value.status == 413
        assert c.get("big") == b"old"
    finally:
        n.stop()


def test_threads_sharing_the_pool_each_get_their_own_answers(node: Node) -> None:
    c = larder.Client(node.url, pool_size=4)
    wrong: List[str] = []

    def work(t: int) -> None:
        for i in range(150):
            value = f"{t}/{i}".encode() * (1 + i % 50)
            c.set(f"mine/{t}/{i}", value)
            if c.get(f"mine/{t}/{i}") != value:
                wrong.append(f"{t}/{i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
