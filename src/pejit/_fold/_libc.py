"""The process's C library, for the two jobs NumPy has no function for.

The guard of writable NumPy constants compares each with its held copy by
``memcmp``, which makes no bytes object per call
(:mod:`pejit._calls._keys`); the batch's trimmer hands free heap back to
the system by ``malloc_trim`` and reads how much is free by ``mallinfo2``
(:mod:`pejit._fold._trim`). Where the process has no such function (a C
library other than glibc; Windows, which refuses ``CDLL(None)``), each
caller does without.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def function(name: str, restype: type | None = ctypes.c_int, argtypes: list | None = None) -> Callable | None:
    """The C library's function ``name``, returning ``restype`` from ``argtypes``, or None
    where it has none. ``ctypes`` releases the GIL around each call.

    Examples:
      >>> memcmp = function("memcmp", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t])
      >>> memcmp is None or memcmp(b"ab", b"ab", 2) == 0
      True
    """
    try:
        fun = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):  # no such function; no CDLL(None) on Windows
        return None
    fun.restype = restype
    if argtypes is not None:
        fun.argtypes = argtypes
    return fun


__all__ = ["function"]
