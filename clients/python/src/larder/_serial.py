"""Serializers: how values become bytes. Bytes by default; ``pickle`` and ``json`` built in;
any object with ``dumps`` and ``loads`` works (the ``json`` module too: a ``dumps`` answering
``str`` is sent as UTF-8; ``loads`` is always given bytes)."""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol, Union


class Serializer(Protocol):
    # Positional-only, so that modules such as json and pickle match whatever they name them.
    def dumps(self, value: Any, /) -> Union[bytes, str]: ...

    def loads(self, data: bytes, /) -> Any: ...


class Codec(Protocol):
    """What the clients use: a serializer whose ``dumps`` is always bytes."""

    def dumps(self, value: Any, /) -> bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


class _Pickle:
    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class _Json:
    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class _Bytes:
    """Bytes as they are; ``str`` as UTF-8; anything else is a ``TypeError``."""

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            return value.encode("utf-8")
        raise TypeError(f"a value is bytes without a serializer, not {type(value).__name__}")

    def loads(self, data: bytes) -> Any:
        return data


class _Given:
    """A serializer the caller gave: its ``dumps`` may answer ``str`` (``json``, ``ujson``),
    which is encoded as UTF-8, or any bytes-like object."""

    def __init__(self, s: Serializer) -> None:
        self._s = s

    def dumps(self, value: Any) -> bytes:
        data = self._s.dumps(value)
        if isinstance(data, bytes):
            return data
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, (bytearray, memoryview)):
            return bytes(data)
        raise TypeError(f"a serializer's dumps answers bytes or str, not {type(data).__name__}")

    def loads(self, data: bytes) -> Any:
        return self._s.loads(data)


def resolve(s: Union[None, str, Serializer]) -> Codec:
    if s is None:
        return _Bytes()
    if s == "pickle":
        return _Pickle()
    if s == "json":
        return _Json()
    if isinstance(s, str):
        raise ValueError(f"unknown serializer {s!r}: 'pickle', 'json' or an object with dumps/loads")
    if not (callable(getattr(s, "dumps", None)) and callable(getattr(s, "loads", None))):
        raise TypeError("a serializer has dumps(value) -> bytes or str and loads(bytes) -> value")
    if isinstance(s, (_Pickle, _Json, _Bytes)):
        return s
    return _Given(s)


def for_memoize(s: Codec) -> Codec:
    """What memoize stores results with: the client's serializer, or pickle for a bytes client
    (a function's result is rarely bytes)."""
    return _Pickle() if isinstance(s, _Bytes) else s


PICKLE: Serializer = _Pickle()
JSON: Serializer = _Json()
