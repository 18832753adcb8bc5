"""Everything a pejit function caches, and its one owner (:class:`Caches`).

:class:`Caches` owns a function's specializations (by constant value), its
programs (by structure of the constants), the lock under which one of them
is built, the hit and miss counters, and ``clear``, which also empties the
folding back end's compiled batch programs: ``cache_clear()`` frees every
cached program. The generated dispatchers of ``_dispatch`` read the
specializations through one :class:`FastPath` view.

The specializations are a bounded, weakly keyed cache.

A specialization is keyed on the identity of its ``jax.Array`` constants (and
of read-only NumPy constants), so it is useless once such a constant is gone:
nobody can pass that object again. Entries therefore *watch* those leaves
with weak references and are dropped when one of them dies, instead of
keeping the constant (and the folded values derived from it) alive. The
least recently used entry goes when the cache is full.

Weak-reference callbacks run wherever the last reference happens to die,
possibly in the middle of another operation on this cache; they only record
the dead key (``list.append`` is atomic), and the next lookup evicts it.

``last`` memoizes the most recently used entry, for callers (the generated
dispatchers of ``_dispatch``) that can recognize their key without building it:
a function called again and again with the same constants skips the
dictionary. Every other lookup, insertion or eviction resets it, so the memo
is always the most recent entry: skipping ``move_to_end`` on a memo hit
keeps the order exact, and a memo never outlives its entry's watchers.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from . import _batch

#: Specializations a function keeps by default (``functools.lru_cache``'s
#: default size). Each holds folded constants on device, so the bound is
#: what keeps memory in check when constants keep changing.
DEFAULT_CACHE_SIZE = 128


#: The memo of an empty cache: a tuple no caller's memo check accepts.
NO_MEMO = (None,)


class CacheInfo(NamedTuple):
    """Statistics of a specialization cache, as ``functools.lru_cache`` gives them."""

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class Counts:
    """Hits and misses of a cache (a hit is counted without a lock)."""

    __slots__ = ("hits", "misses")

    def __init__(self):
        self.hits = self.misses = 0


class FastPath(NamedTuple):
    """What a generated dispatcher reads of a cache, to serve a hit in one frame.

    ``dead`` non-empty: ``purge()`` first. ``last[0]``: the memo of the most
    recent hit (see the module docstring). ``get(key)``: the entry, or None,
    without touching the LRU order; then ``touch(key, value, memo)`` does.
    ``counts.hits``: bumped by the dispatcher on every hit.
    """

    dead: list
    purge: Callable[[], None]
    get: Callable[[Any], Any]
    touch: Callable[[Any, Any, tuple], None]
    last: list
    counts: Counts


class SpecializationCache:
    """An LRU mapping whose entries die with the objects they watch.

    ``get`` and ``touch`` are lock-free; ``put``, eviction and ``clear`` take the lock.
    ``maxsize=None`` means unbounded. The hot path of ``Pejitted.__call__``
    inlines ``get`` through :meth:`fast_path`.
    """

    def __init__(self, maxsize: int | None = DEFAULT_CACHE_SIZE):
        if maxsize is not None and (isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0):
            raise ValueError(f"cache_size must be a non-negative int or None, got {maxsize!r}")
        self.maxsize = maxsize
        self.counts = Counts()
        self.entries: OrderedDict[Any, Any] = OrderedDict()
        self._watchers: dict[Any, list[weakref.ref]] = {}
        self.dead: list[Any] = []
        # A one-element list, so that generated code can hold it and still
        # see updates; the element (a tuple) is replaced whole, never mutated.
        self.last: list[tuple] = [NO_MEMO]
        self._lock = threading.RLock()

    def get(self, key: Any) -> Any:
        """The entry for ``key`` (now the most recently used), or None."""
        if self.dead:
            self.purge()
        try:
            self.entries.move_to_end(key)
            self.last[0] = NO_MEMO
            return self.entries[key]
        except KeyError:
            return None

    def touch(self, key: Any, value: Any, memo: tuple) -> None:
        """Make ``key`` (a hit on ``value``) the most recent entry, and ``memo`` its memo.

        Lock-free, as ``get``: an eviction resets the memo after removing its
        entry, and the check after setting the memo withdraws it if the entry
        went first. In between, the caller's arguments keep the constant
        alive, so its ``id`` cannot be reused and the memo is still right.
        """
        try:
            self.entries.move_to_end(key)
        except KeyError:  # evicted by another thread just now
            return
        self.last[0] = memo
        if self.entries.get(key) is not value:
            self.last[0] = NO_MEMO

    def put(self, key: Any, value: Any, watch: Iterable[Any] = ()) -> None:
        """Store ``value``; drop it when any object in ``watch`` dies."""
        if self.maxsize == 0:
            return
        dead = self.dead

        def forget(_ref, key=key):
            dead.append(key)

        with self._lock:
            self.last[0] = NO_MEMO
            self.entries[key] = value
            self.entries.move_to_end(key)
            self._watchers[key] = [weakref.ref(obj, forget) for obj in watch]
            while self.maxsize is not None and len(self.entries) > self.maxsize:
                old, _ = self.entries.popitem(last=False)
                self._watchers.pop(old, None)

    def purge(self) -> None:
        with self._lock:
            self.last[0] = NO_MEMO
            while self.dead:
                key = self.dead.pop()
                refs = self._watchers.get(key)
                # The key may have been re-used by a live entry since; only
                # evict an entry one of whose watched objects is really gone.
                if refs is not None and any(r() is None for r in refs):
                    del self._watchers[key]
                    self.entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self.last[0] = NO_MEMO
            self.entries.clear()
            self._watchers.clear()
            self.dead.clear()
            self.counts = Counts()

    def info(self) -> CacheInfo:
        if self.dead:
            self.purge()
        return CacheInfo(self.counts.hits, self.counts.misses, self.maxsize, len(self.entries))

    def __len__(self) -> int:
        return len(self.entries)

    def values(self) -> list[Any]:
        return list(self.entries.values())

    def fast_path(self) -> FastPath:
        return FastPath(self.dead, self.purge, self.entries.get, self.touch, self.last, self.counts)


class Caches:
    """What one pejit function caches, with the lock its entries are built under.

    ``specializations``: by constant values (and dynamic types), counted in
    :meth:`info`. ``programs``: by structure of the constants (shapes, dtypes,
    static values), what specializations of one structure share. Both hold at
    most ``maxsize`` entries.
    """

    def __init__(self, maxsize: int | None = DEFAULT_CACHE_SIZE):
        self.specializations = SpecializationCache(maxsize)
        self.programs = SpecializationCache(maxsize)
        # One trace and one fold per key, however many threads ask.
        self.lock = threading.RLock()

    def specialization(self, key: Any, build: Callable[..., tuple[Any, Iterable[Any]]], *args: Any) -> Any:
        """The specialization for ``key``; on a miss, ``build(*args)`` returns
        it and the objects whose death drops it."""
        cache = self.specializations
        value = cache.get(key)
        if value is None:
            with self.lock:
                value = cache.get(key)
                if value is None:
                    cache.counts.misses += 1
                    value, watch = build(*args)
                    cache.put(key, value, watch=watch)
                    return value
        cache.counts.hits += 1
        return value

    def fast_path(self) -> FastPath:
        return self.specializations.fast_path()

    def info(self) -> CacheInfo:
        return self.specializations.info()

    def clear(self) -> None:
        """Drop every specialization and program, this function's and the
        compiled batch programs of the folding back end (shared by all), and
        reset the counters."""
        with self.lock:
            self.specializations.clear()
            self.programs.clear()
            _batch.clear_programs()
