"""Memory of the host rules' large results, used again within a batch.

A batch evaluated on the host writes a new array for each elementwise
result and drops each after its last read (:mod:`pejit._fold._batch`).
glibc hands large freed blocks back to the system (the top of its heap, a
trim: see :mod:`pejit._fold._trim`), and the next array placed there is
faulted in and zeroed again, page by page. At 15^3 points and 1000
functions, TFC's WaveEquation2D's fold writes 22 GB of such results, and
its folding thread spent about two fifths of its time in the kernel
zeroing pages (``perf``: ``clear_page_erms`` under NumPy's ``add``,
``multiply`` and ``subtract``); there a new 27 MB array took 2.5 ms to
write or, by chance, up to 200. Here a result's memory returns to the
batch when no array views it any more, and the next result of the same
size is written into it: memory already in the process, no page faulted
again.

Only while a batch runs on this thread (:func:`recycling`), only results of
:data:`MIN_BYTES` or more, and at most :data:`KEEP_BYTES` waiting free at
once; the rest goes back to ``malloc`` as before, all of it when the batch
ends. Results that outlive the batch (folded constants) keep their memory.

Examples:
  >>> import numpy as np
  >>> with recycling():
  ...     a = np.add(np.ones((2048, 1024)), 1.0, out=empty((2048, 1024), np.dtype("float64"), "C"))
  ...     address = a.ctypes.data
  ...     del a  # its memory waits for the next result of its size
  ...     b = empty((2048, 1024), np.dtype("float64"), "F")
  ...     b.ctypes.data == address
  True
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from collections.abc import Iterator

import numpy as np

#: Results smaller than this are allocated as usual: ``malloc``'s heap reuses
#: such blocks well enough, and memory held here is memory it cannot reuse
#: for other arrays (at 11^3 points, WaveEquation2D's 7 MB results were a
#: little slower recycled; at 15^3 its 27 MB ones made the fold 0.7-1.5 s faster).
MIN_BYTES = 16 * 2**20
#: Free bytes a batch keeps for its next results: what is freed beyond that
#: goes back to ``malloc`` (a large PDE's fold frees and writes tens of MiB
#: at a time, as :data:`pejit._fold._trim.KEEP_BYTES` keeps for it).
KEEP_BYTES = 256 * 2**20


class Memory(np.ndarray):
    """Recycled bytes, as the base of the one array that holds a result.

    NumPy points a view of a view at the first array down the chain whose
    base has another type: so every view of a result (a transpose, a
    reshape) keeps that array alive, and its death tells that nothing
    reads the memory any more.
    """


class _Pool:
    """A batch's free memory, by size in bytes."""

    def __init__(self):
        self._free: dict[int, list[np.ndarray]] = {}
        self._bytes = 0
        # a result may die on the worker's thread, or in a collection that
        # an allocation here starts: reentrant
        self._lock = threading.RLock()
        self.open = True

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._bytes -= nbytes
                return free.pop()
        return np.empty(nbytes, np.uint8)

    def give_back(self, raw: np.ndarray) -> None:
        with self._lock:
            if self.open and self._bytes + raw.nbytes <= KEEP_BYTES:
                self._free.setdefault(raw.nbytes, []).append(raw)
                self._bytes += raw.nbytes

    def close(self) -> None:
        with self._lock:
            self.open = False
            self._free.clear()
            self._bytes = 0


_pool: contextvars.ContextVar[_Pool | None] = contextvars.ContextVar("_pool", default=None)


@contextlib.contextmanager
def recycling() -> Iterator[None]:
    """Within: :func:`empty` reuses the memory of this thread's dead results (a
    batch inside another shares its pool)."""
    if _pool.get() is not None:
        yield
        return
    pool = _Pool()
    token = _pool.set(pool)
    try:
        yield
    finally:
        _pool.reset(token)
        pool.close()


def recycles(nbytes: int) -> bool:
    """Whether a result of ``nbytes`` would be written in recycled memory here."""
    return nbytes >= MIN_BYTES and _pool.get() is not None


def empty(shape: tuple[int, ...], dtype: np.dtype, order: str) -> np.ndarray:
    """An uninitialized array for a result, in recycled memory where it can be."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not recycles(nbytes):
        return np.empty(shape, dtype, order=order)
    pool = _pool.get()
    raw = pool.take(nbytes)
    out = raw.view(Memory).view(dtype).reshape(shape, order=order).view(np.ndarray)
    weakref.finalize(out, pool.give_back, raw).atexit = False
    return out


def owns(x: np.ndarray) -> bool:
    """Whether ``x`` views no other array: it owns its memory, or holds recycled memory."""
    return x.base is None or type(x.base) is Memory
