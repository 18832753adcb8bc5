"""Python's cyclic garbage collector, paused while a specialization folds.

A fold allocates hundreds of thousands of small objects (tracers, equations,
recipes) that live until it ends, while JAX's own modules keep the heap
large; each full collection walks all of it, a noticeable share of a
first value's time, for nothing: what a fold frees it frees by reference
counting (its arrays included), so peak memory does not grow with the
collector off.

The collector is restored as it was when the fold ends, however it ends,
and collects as usual from the next allocation on; a fold inside a fold
leaves it to the outer one.

Examples:
  >>> import gc
  >>> from pejit._fold._gc import paused
  >>> with paused():
  ...     gc.isenabled()
  False
  >>> gc.isenabled()
  True
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Context manager: no cyclic garbage collection inside (see the module docstring)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def collections() -> int:
    """How many collections the collector has run, in all generations: a mark that
    :func:`young_since` reads."""
    return sum(s["collections"] for s in gc.get_stats())


def young_since(mark: int) -> bool:
    """Whether every object made since ``mark`` (:func:`collections`) is still in the
    collector's youngest generation: it is paused and has not run since (no object
    made then has moved to an older one), so a search for them need not walk the heap.

    Examples:
      >>> with paused():
      ...     mark = collections()
      ...     young_since(mark), gc.collect(0) >= 0, young_since(mark)
      (True, True, False)
    """
    return not gc.isenabled() and collections() == mark


def pausing(fun: F) -> F:
    """``fun`` run with the collector :func:`paused`."""

    @functools.wraps(fun)
    def wrapper(*args, **kwargs):
        with paused():
            return fun(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
