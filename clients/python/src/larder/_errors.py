"""The exceptions every call raises: one per thing an application does differently."""

from __future__ import annotations


class LarderError(Exception):
    """Base of the client's exceptions."""


class NotFound(LarderError, KeyError):
    """The key has no value (404). A ``KeyError``, so ``c[key]`` behaves like a dict's."""


class Unavailable(LarderError):
    """The node cannot answer now: connection refused or reset, a timeout, or a 503 (the node
    is recovering or stopping, or nginx says the key's node is down). Worth retrying later;
    ``get_or_set`` and ``memoize`` treat it as a miss by default."""


class Refused(LarderError):
    """The server refused the request (a 4xx other than 404): a bad key, a value too large, a
    wrong token. Carries the status and the server's one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
