"""pymemcache (Debian's python3-pymemcache) against larder's memcached protocol.

Usage: pymemcache_client.py HOST:PORT HTTP_HOST:HTTP_PORT
Exits non-zero, with the failing check, if any answer is not what memcached would give.
"""
import sys
import urllib.request

from pymemcache.client.base import Client

host, port = sys.argv[1].rsplit(":", 1)
http = "http://" + sys.argv[2]
# Answers are waited for (pymemcache's default is noreply for storage commands).
c = Client((host, int(port)), connect_timeout=5, timeout=10, default_noreply=False)


def check(cond, what):
    if not cond:
        raise SystemExit("failed: " + what)


c.flush_all()
check(c.set("a", b"1") is True, "set")
check(c.get("a") == b"1", "get")
check(c.get("missing") is None, "get of a missing key")
check(c.add("a", b"2") is False, "add of a present key")
check(c.add("b", b"2") is True, "add of an absent key")
check(c.replace("c", b"3") is False, "replace of an absent key")
check(c.replace("b", b"22") is True, "replace")
check(c.get_many(["a", "b", "nope"]) == {"a": b"1", "b": b"22"}, "get_many")
check(c.append("a", b"x") is True and c.prepend("a", b"y") is True, "append, prepend")
check(c.get("a") == b"y1x", "after append and prepend")

value, cas = c.gets("b")
check(value == b"22" and cas is not None, "gets")
check(c.cas("b", b"33", cas) is True, "cas with the current unique")
check(c.cas("b", b"44", cas) is False, "cas with a stale unique")
check(c.cas("nope", b"1", cas) is None, "cas of an absent key")
check(c.get("b") == b"33", "value after cas")

c.set("n", b"10")
check(c.incr("n", 5) == 15, "incr")
check(c.decr("n", 20) == 0, "decr floors at zero")
check(c.incr("missing", 1) is None, "incr of an absent key")
check(c.touch("n", 100) is True and c.touch("missing", 100) is False, "touch")
check(c.delete("n") is True, "delete")
check(c.get("n") is None, "deleted")

# A str is stored as its encoded bytes.
c.set("text", "hello")
check(c.get("text") == b"hello", "a str stored as bytes")

# Get-or-compute, the pattern a cache-aside application runs.
calls = []


def compute():
    calls.append(1)
    return b"computed"


def fetch(key):
    v = c.get(key)
    if v is None:
        v = compute()
        c.add(key, v)
    return v


check(fetch("g") == b"computed" and fetch("g") == b"computed" and len(calls) == 1, "get-or-compute computes once")

# One namespace: set over memcached, read over HTTP, and the reverse.
blob = bytes(range(256)) * 40
c.set("shared/blob", blob)
check(urllib.request.urlopen(http + "/shared/blob").read() == blob, "memcached set read over HTTP")
req = urllib.request.Request(http + "/from-http", data=b"via http", method="PUT")
urllib.request.urlopen(req).read()
check(c.get("from-http") == b"via http", "HTTP PUT read over memcached")

# A value larger than memcached's 1 MiB items, streamed through the chunked store.
big = bytes((i * 7) % 251 for i in range(5 << 20))
check(c.set("big", big) is True, "set of 5 MiB")
check(c.get("big") == big, "get of 5 MiB")

c.set("expiring", b"x", expire=1)
check(c.get("expiring") == b"x", "before expiry")
c.flush_all()
check(c.get("a") is None and c.get("big") is None, "flush_all")
stats = c.stats()
check(b"curr_connections" in stats or "curr_connections" in stats, "stats")
print("pymemcache: all checks passed")
