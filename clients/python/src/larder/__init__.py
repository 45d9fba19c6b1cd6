"""larder's Python client: ``Client`` (sync) and ``AsyncClient`` (asyncio) with the same API:
``get``/``set``/``delete``/``touch``, dict-style access, ``get_or_set``, ``memoize``,
``get_many``/``set_many``, streaming with ``open`` and file objects, and cluster routing that
agrees with nginx's consistent hash."""

from ._async import AsyncClient, AsyncReader
from ._errors import LarderError, NotFound, Refused, Unavailable
from ._keys import Ring, canonical
from ._serial import JSON, PICKLE, Serializer
from ._sync import Client, Reader

__all__ = [
    "AsyncClient",
    "AsyncReader",
    "Client",
    "JSON",
    "LarderError",
    "NotFound",
    "PICKLE",
    "Reader",
    "Refused",
    "Ring",
    "Serializer",
    "Unavailable",
    "canonical",
]
