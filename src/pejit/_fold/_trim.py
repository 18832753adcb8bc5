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

A trim costs more than its own milliseconds: the pages it hands back are
the ones the next arrays would have reused, and each is faulted in and
zeroed again when written. At 15^3 points and 1000 functions, TFC's
WaveEquation2D writes 22 GB in its fold; trimming whatever was free every
50 ms cost it 1-2 s of page faults. So a trim waits until the heap
holds :data:`KEEP_BYTES` free (glibc's ``mallinfo2`` tells): what the
batch frees and allocates again stays in the process.

Nothing is configured: the allocator keeps its settings, and where the C
library has no ``malloc_trim`` (not glibc), nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable

from . import _libc

#: Seconds of a batch between two trims: often enough that the arenas do not
#: climb far between them, rarely enough that the trims (milliseconds each)
#: stay a small share of the batch; trimming more often lowers the peak no
#: further.
PERIOD = 0.05
#: Free bytes the heap keeps for the batch's next arrays: less is not handed back
#: (a large PDE's fold frees and allocates tens of MiB at a time; see above).
KEEP_BYTES = 256 * 2**20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    return _libc.function("malloc_trim", ctypes.c_int, [ctypes.c_size_t])


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2() -> Callable[[], _Mallinfo2] | None:
    return _libc.function("mallinfo2", _Mallinfo2)  # glibc 2.33 and later


def free_bytes() -> int | None:
    """The bytes the C heap holds free, in all its arenas; None where the C library cannot tell."""
    mallinfo2 = _mallinfo2()
    return None if mallinfo2 is None else mallinfo2().fordblks


def trim() -> bool:
    """Hand the C heap's free pages back to the system; False where that cannot be done."""
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        return False
    malloc_trim(0)
    return True


class Trimmer:
    """Calls :func:`trim` when :meth:`tick` finds :data:`PERIOD` seconds passed
    since it last checked (or since it was made) and more than ``keep`` bytes
    (:data:`KEEP_BYTES`) free in the heap (:func:`free_bytes`; where it cannot
    tell, every period)."""

    def __init__(self, period: float | None = None, keep: int | None = None):
        self._period = PERIOD if period is None else period
        self._keep = KEEP_BYTES if keep is None else keep
        self._last = time.perf_counter()
        self.trims = 0

    def tick(self) -> None:
        if time.perf_counter() - self._last >= self._period:
            free = free_bytes()
            if free is None or free > self._keep:
                self.trims += trim()
            self._last = time.perf_counter()  # the trim's own time is not the batch's
