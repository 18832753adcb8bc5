"""Freed memory handed back to the system while a batch runs.

A batch allocates and frees large arrays by the thousand, on two threads:
the folding thread (NumPy's host rules) and the worker (kernels, values
computed again; see :mod:`pejit._fold._offload`). glibc's ``malloc`` keeps
what is freed for later allocations from the same arena, one per thread, and
a value the worker allocated returns to the worker's arena when the folding
thread drops it. The process's resident memory then grows to the sum of the
arenas' high-water marks, not to what the batch holds at once, and a fold
that holds the values it would otherwise compute again can peak above
``jax.jit``'s whole program. ``malloc_trim`` hands the free pages back (each
call a few milliseconds), so the batch can hold those values within its
memory budget instead of computing them again (:mod:`pejit._fold._refold`).

Nothing is configured: the allocator keeps its settings, and where the C
library has no ``malloc_trim`` (not glibc), nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable

#: Seconds of a batch between two trims: often enough that the arenas do not
#: climb far between them, rarely enough that the trims (milliseconds each)
#: stay a small share of the batch; trimming more often lowers the peak no
#: further.
PERIOD = 0.05


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's C library
    except (OSError, AttributeError, TypeError):  # no such function; no CDLL(None) on Windows
        return None


def trim() -> bool:
    """Hand the C heap's free pages back to the system; False where that cannot be done."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


class Trimmer:
    """Calls :func:`trim` when :meth:`tick` finds :data:`PERIOD` seconds passed
    since the last trim (or since it was made)."""

    def __init__(self, period: float | None = None):
        self._period = PERIOD if period is None else period
        self._last = time.perf_counter()
        self.trims = 0

    def tick(self) -> None:
        if time.perf_counter() - self._last >= self._period:
            self.trims += trim()
            self._last = time.perf_counter()  # the trim's own time is not the batch's
