"""What ``memoize`` and ``get_or_set`` share between the sync and async clients: the key of a
call, the envelope a memoized result is stored in, and the early-recomputation rule.

Stampede protection is probabilistic early recomputation ("XFetch", Vattani et al., VLDB 2015,
as python-diskcache's ``memoize_stampede``): each stored result carries how long it took to
compute (``delta``) and when it expires; a reader recomputes early, before the expiry, with a
probability that grows as the expiry nears and with the cost of the computation
(``now - delta * beta * ln(random()) >= expiry``). One caller, usually, refreshes a hot entry
before it expires, while the others keep being served; together with the single flight inside
a process, a popular key never sends every process to the backend at once.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pickle
import random
import struct
import sys
import time
import types
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

_MAGIC = b"LMZ1"
_HEAD = struct.Struct(">4sdd")  # magic, delta seconds, expiry (Unix seconds, 0 = never)

# The wrappers memoize made: a nested function that calls one (itself, recursively) is keyed by
# what the wrapper runs, not by the wrapper's closure (which holds the client).
WRAPPERS: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()


class CallKey:
    """The default key of a memoized function's calls: the function's module and qualified
    name, and a hash of its arguments (pickled, so equal arguments give equal keys across
    processes).

    A name does not always identify a function, so the hash also covers:
    - a bound method's object (or a builtin's), as its first argument: ``memoize(obj.method)``
      keys like a method memoized in its class body, by the object's pickled state;
    - a callable object without a name of its own (``functools.partial``, an instance with
      ``__call__``): the object itself, pickled;
    - for a lambda or a nested function (``<lambda>`` or ``<locals>`` in its name, which one
      module can hold many of): its code, defaults and captured values (pickled), as they are
      at its first call. Taken once: a captured counter or log that grows does not make every
      call a miss, and a large captured object is not pickled again at each call.
    What does not pickle is a ``TypeError`` asking for ``key=``, never a key made from an
    object's address, which another object may reuse.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._digest: Optional[bytes] = None

    def __call__(self, args: Tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        name, fn, args, bound = _unbind(self._fn, args)
        try:
            blob = pickle.dumps((args, sorted(kwargs.items())), protocol=4)
        except Exception as e:
            what = "its object and arguments" if bound else "its arguments"
            raise TypeError(f"memoize cannot key a call of {name} by {what} ({e}); give it key=") from e
        h = hashlib.sha256(blob)
        if isinstance(fn, types.FunctionType) and ("<lambda>" in name or "<locals>" in name):
            digest = self._digest
            if digest is None:
                walk = _Walk()
                try:
                    digest = _function_digest(fn, walk)
                except Exception as e:
                    raise TypeError(
                        f"memoize cannot tell {name} from functions of the same name: a value it "
                        f"captures or defaults to does not pickle ({e}); give it key="
                    ) from e
                if walk.complete:  # a variable not yet assigned is taken again next time
                    self._digest = digest
            h.update(digest)
        return f"memo/{name}/{h.hexdigest()[:32]}"


def call_key(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """``CallKey(fn)(args, kwargs)``: the key of one call."""
    return CallKey(fn)(args, kwargs)


class _Walk:
    def __init__(self) -> None:
        self.seen: Dict[int, int] = {}
        self.complete = True


def _unbind(fn: Callable[..., Any], args: Tuple[Any, ...]) -> Tuple[str, Any, Tuple[Any, ...], bool]:
    """The name to key ``fn`` by, what it runs, and its arguments with its object first."""
    if isinstance(fn, types.MethodType):
        args, bound = (fn.__self__, *args), True
        fn = fn.__func__
    elif not hasattr(fn, "__qualname__"):
        # A partial or a callable instance: its type names it, its pickle says what it does.
        return f"{type(fn).__module__}.{type(fn).__qualname__}", fn, (fn, *args), True
    else:
        receiver = getattr(fn, "__self__", None)  # a builtin's bound method: [].append, d.get
        bound = receiver is not None and not isinstance(receiver, types.ModuleType)
        if bound:
            args = (receiver, *args)
    return f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}", fn, args, bound


def _feed(h: "hashlib._Hash", data: bytes) -> None:
    h.update(struct.pack(">Q", len(data)))  # length-prefixed: parts never run into each other
    h.update(data)


def _function_digest(fn: types.FunctionType, walk: _Walk) -> bytes:
    """Code, defaults and captured values. A function met again (recursion) is named by
    when it was first met, as pickle's memo does."""
    seen = walk.seen
    if id(fn) in seen:
        return b"seen:%d" % seen[id(fn)]
    seen[id(fn)] = len(seen)
    h = hashlib.sha256(_code_digest(fn.__code__))
    for v in fn.__defaults__ or ():
        _feed(h, _value(v, walk))
    _feed(h, b"kwdefaults")
    for k, v in sorted((fn.__kwdefaults__ or {}).items()):
        _feed(h, k.encode())
        _feed(h, _value(v, walk))
    _feed(h, b"closure")
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:  # a variable not yet assigned
            walk.complete = False
            _feed(h, b"empty")
            continue
        _feed(h, _value(v, walk))
    return h.digest()


def _value(v: Any, walk: _Walk) -> bytes:
    if isinstance(v, types.ModuleType):
        return b"module:" + v.__name__.encode()
    try:
        return b"pickle:" + pickle.dumps(v, protocol=4)
    except Exception:
        if v in WRAPPERS:
            v = v.__wrapped__
        if isinstance(v, types.FunctionType):  # a lambda or a nested function: by its code
            return b"function:" + _function_digest(v, walk)
        raise


@functools.lru_cache(maxsize=1024)
def _code_digest(code: types.CodeType) -> bytes:
    """What the code does, not where it is (a path differs between hosts, a line number after
    any edit above it): equal code with equal defaults and captures computes the same."""
    h = hashlib.sha256(str(sys.implementation.cache_tag).encode())  # bytecode differs by version
    _feed(h, code.co_code)
    _feed(h, b"%d %d %d %d" % (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags))
    for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
        _feed(h, " ".join(names).encode())
    _feed(h, _const(code.co_consts))
    return h.digest()


def _const(c: Any) -> bytes:
    if isinstance(c, types.CodeType):
        return b"c" + _code_digest(c)
    if isinstance(c, (tuple, frozenset)):
        parts = [_const(x) for x in c]
        if isinstance(c, frozenset):
            parts.sort()  # a set of strings iterates in an order that differs by process
        return (b"t" if isinstance(c, tuple) else b"f") + b"".join(struct.pack(">Q", len(p)) + p for p in parts)
    return f"{type(c).__name__}:{c!r}".encode("utf-8", "backslashreplace")  # str, bytes, numbers, None


def wrap(payload: bytes, delta: float, ttl: Optional[float]) -> bytes:
    expiry = time.time() + ttl if ttl else 0.0
    return _HEAD.pack(_MAGIC, delta, expiry) + payload


def unwrap(data: bytes) -> Optional[Tuple[bytes, float, float]]:
    """(payload, delta, expiry), or None for bytes that are not an envelope."""
    if len(data) < _HEAD.size or data[:4] != _MAGIC:
        return None
    _, delta, expiry = _HEAD.unpack_from(data)
    return data[_HEAD.size :], delta, expiry


def recompute_early(delta: float, expiry: float, beta: float = 1.0) -> bool:
    if expiry <= 0:
        return False
    return time.time() - delta * beta * math.log(1.0 - random.random()) >= expiry
