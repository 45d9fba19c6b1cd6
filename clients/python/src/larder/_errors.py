"""The exceptions every call raises: one per thing an application does differently."""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class LarderError(Exception):
    """Base of the client's exceptions."""


class NotFound(LarderError, KeyError):
    """The key has no value (404). A ``KeyError``, so ``c[key]`` behaves like a dict's."""


class Unavailable(LarderError):
    """The node cannot answer now: connection refused or reset, a timeout, or a 503 (the node
    is recovering or stopping, or nginx says the key's node is down). Worth retrying later;
    ``get_or_set``, ``memoize``, ``get_many`` and ``set_many`` treat it as a miss by default.

    Raised by ``get_many`` or ``set_many`` (with ``miss_on_unavailable=False``), it carries what
    the call did do: ``partial``, the values read (``get_many``) or the items stored
    (``set_many``), and ``failed``, the keys whose node could not answer. Both are empty
    otherwise."""

    def __init__(
        self, message: str = "", *, partial: Optional[Dict[Any, Any]] = None, failed: Optional[List[Any]] = None
    ) -> None:
        super().__init__(message)
        self.partial: Dict[Any, Any] = partial if partial is not None else {}
        self.failed: List[Any] = failed if failed is not None else []


class Refused(LarderError):
    """The server refused the request (a 4xx other than 404): a bad key, a value too large, a
    wrong token. Carries the status and the server's one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
