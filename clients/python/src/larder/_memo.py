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

import hashlib
import math
import pickle
import random
import struct
import time
from typing import Any, Callable, Optional, Tuple

_MAGIC = b"LMZ1"
_HEAD = struct.Struct(">4sdd")  # magic, delta seconds, expiry (Unix seconds, 0 = never)


def call_key(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A key for ``fn(*args, **kwargs)``: the function's module and qualified name, and a hash
    of its arguments (pickled, so equal arguments give equal keys across processes)."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    # Captured variables are not part of the key (they are often clients, loggers, counters):
    # closures of one function that compute different things need a key= of their own.
    try:
        blob = pickle.dumps((args, sorted(kwargs.items())), protocol=4)
    except Exception as e:
        # repr() would name objects by address, which another object may reuse: never that.
        raise TypeError(f"memoize cannot key a call of {name} by its arguments ({e}); give it key=") from e
    return f"memo/{name}/{hashlib.sha256(blob).hexdigest()[:32]}"


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
