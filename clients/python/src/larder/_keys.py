"""Keys on the wire, and which node owns a key.

A key is sent as its canonical path (docs/CLUSTER.md): the UTF-8 bytes of the key with every
byte outside RFC 3986's unreserved set and ``/`` percent-encoded in upper-case hex. With several
nodes, the owner is the node nginx's ``hash $request_uri consistent`` picks for ``/`` + that
path (nginx's ketama ring: 160 points per server, CRC32), so client-routed and nginx-routed
deployments agree on every key.
"""

from __future__ import annotations

import bisect
import functools
import re
import struct
import zlib
from typing import List, Sequence, Tuple, Union
from urllib.parse import urlsplit

Key = Union[str, bytes]

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


# A key of these characters only is its own path: checked in C, it skips the byte loop below
# (most keys are such; this is on every request's path).
_PLAIN = re.compile(r"[A-Za-z0-9._~/-]{1,1024}")


def canonical(key: Key) -> str:
    """The request path of ``key`` (without the leading ``/``). A key that HTTP libraries
    would rewrite (a ``.`` or ``..`` segment: ``a/../b`` is sent as ``b``), or that names
    larder's admin namespace (``_larder/``), is a ``ValueError``: it could never be itself."""
    if isinstance(key, str) and _PLAIN.fullmatch(key) and "/." not in "/" + key and not key.startswith("_larder/"):
        return key
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not 1 <= len(raw) <= 1024:
        raise ValueError(f"a key is 1 to 1024 bytes, not {len(raw)}")
    if any(seg in (b".", b"..") for seg in raw.split(b"/")):
        raise ValueError(f"a key has no . or .. segment (URLs resolve them away): {key!r}")
    if raw.startswith(b"_larder/"):
        raise ValueError(f"keys under _larder/ are larder's own: {key!r}")
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in raw)


def request_path(key: Key) -> Tuple[str, bytes]:
    """``canonical(key)``, and the request target it makes (``/`` and the path, as bytes):
    remembered for the 4096 keys used last, as a key is used again and again."""
    if type(key) is str or type(key) is bytes:
        return _remembered(key)
    return _request_path(key)  # a bytearray, say: not hashable


def _request_path(key: Key) -> Tuple[str, bytes]:
    path = canonical(key)
    return path, b"/" + path.encode("ascii")


_remembered = functools.lru_cache(maxsize=4096)(_request_path)


def _split_server(server: bytes) -> Tuple[bytes, bytes]:
    if server[:5].lower() == b"unix:":
        return server[5:], b""
    m = re.fullmatch(rb"(.*):([0-9]*)", server, re.S)
    return (m.group(1), m.group(2)) if m else (server, b"")


class Ring:
    """nginx's consistent-hash ring over the nodes' ``host:port`` strings."""

    def __init__(self, servers: Sequence[str]) -> None:
        points: List[Tuple[int, int]] = []
        for index, name in enumerate(servers):
            host, port = _split_server(name.encode())
            base = host + b"\0" + port
            prev = 0
            for _ in range(160):
                prev = zlib.crc32(base + struct.pack("<I", prev))
                points.append((prev, index))
        points.sort(key=lambda p: p[0])
        self._hashes: List[int] = []
        self._owners: List[int] = []
        for h, index in points:
            if self._hashes and self._hashes[-1] == h:
                continue
            self._hashes.append(h)
            self._owners.append(index)

    def owner(self, path: str) -> int:
        """The index of the node that owns ``/path``."""
        i = bisect.bisect_left(self._hashes, zlib.crc32(("/" + path).encode("ascii")))
        return self._owners[i % len(self._hashes)]


def nodes(url_or_urls: Union[str, Sequence[str]]) -> List[str]:
    """Node base URLs, without a trailing slash."""
    urls = [url_or_urls] if isinstance(url_or_urls, str) else list(url_or_urls)
    if not urls:
        raise ValueError("give at least one node URL")
    out = []
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not a node URL: {u!r} (expected http://host:port)")
        out.append(f"{parts.scheme}://{parts.netloc}")
    return out


class Routing:
    """What both clients share: the nodes, the ring over them, and a key's URL."""

    def __init__(self, url_or_urls: Union[str, Sequence[str]]) -> None:
        self._nodes = nodes(url_or_urls)
        self._ring = Ring([server_string(n) for n in self._nodes]) if len(self._nodes) > 1 else None

    def url(self, key: Key) -> str:
        """The URL of ``key`` on the node that owns it."""
        node, path = self.route(key)
        return f"{node}/{path}"

    def route(self, key: Key) -> Tuple[str, str]:
        """The node (base URL) that owns ``key``, and the key's canonical path on it."""
        path = request_path(key)[0]
        return (self._nodes[self._ring.owner(path)] if self._ring else self._nodes[0]), path

    def target(self, key: Key) -> Tuple[str, bytes]:
        """The node that owns ``key``, and the request target naming it there."""
        path, target = request_path(key)
        return (self._nodes[self._ring.owner(path)] if self._ring else self._nodes[0]), target


def server_string(url: str) -> str:
    """The ``host:port`` an nginx upstream block would name this node by."""
    return urlsplit(url).netloc
