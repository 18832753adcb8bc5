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
least recently used entries go when the cache holds more than its entries
(``cache_size``) or more than its bytes of folded constants (``cache_bytes``).

Weak-reference callbacks run wherever the last reference happens to die,
possibly in the middle of another operation on this cache; they only record
the dead key (``list.append`` is atomic), and the next lookup evicts it.

``last`` memoizes the most recently used entry, for callers (the generated
dispatchers of ``_dispatch``) that can recognize its constants without
building a key: a function called again and again with the same constants
skips the dictionary, and ``jax.jit``'s dispatch of the entry's residual
checks the dynamic arguments. Every other lookup, insertion or eviction resets it, so the memo
is always the most recent entry: skipping ``move_to_end`` on a memo hit
keeps the order exact, and a memo never outlives its entry's watchers.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from .._fold import _batch
from . import _beside
from ._keys import CallKey

#: Specializations a function keeps by default (``functools.lru_cache``'s
#: default size). Each holds folded constants on device, so the bound is
#: what keeps memory in check when constants keep changing.
DEFAULT_CACHE_SIZE = 128

#: Bytes of folded constants a function keeps by default, whatever the
#: number of entries: 128 folds of 100 MB would otherwise hold 12.8 GB.
DEFAULT_CACHE_BYTES = 2 << 30


#: The memo of an empty cache: a tuple no caller's memo check accepts.
NO_MEMO = (None,)

#: An index entry: several specializations share these constants (their
#: dynamic arguments' types differ), so the full key decides.
SEVERAL = "several"


class _Counts(NamedTuple):
    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class CacheInfo(_Counts):
    """Statistics of a specialization cache, as ``functools.lru_cache`` gives them.

    Unpacks (and compares) as those four fields; ``maxbytes`` and
    ``currbytes``, the bytes of folded constants it may hold and holds, are
    attributes.
    """

    maxbytes: int | None
    currbytes: int

    def __new__(cls, hits: int, misses: int, maxsize: int | None, currsize: int,
                maxbytes: int | None = None, currbytes: int = 0):
        self = super().__new__(cls, hits, misses, maxsize, currsize)
        self.maxbytes, self.currbytes = maxbytes, currbytes
        return self

    def __repr__(self) -> str:
        return (f"CacheInfo(hits={self.hits}, misses={self.misses}, maxsize={self.maxsize}, "
                f"currsize={self.currsize}, maxbytes={self.maxbytes}, currbytes={self.currbytes})")


class Counts:
    """Hits and misses of a cache (a hit is counted without a lock)."""

    __slots__ = ("hits", "misses")

    def __init__(self):
        self.hits = self.misses = 0


class FastPath(NamedTuple):
    """What a generated dispatcher reads of a cache, to serve a hit in one frame.

    ``dead`` non-empty: ``purge()`` first. ``last[0]``: the memo of the most
    recent hit (see the module docstring). ``counts.hits``: bumped by the
    dispatcher on every hit.
    """

    dead: list
    purge: Callable[[], None]
    last: list
    counts: Counts


class SpecializationCache:
    """An LRU mapping whose entries die with the objects they watch.

    ``get`` and ``touch`` are lock-free; ``put``, eviction and ``clear`` take the lock.
    ``maxsize=None`` means unbounded; so does ``maxbytes=None`` (the bytes of
    an entry are what ``put`` is told; the newest entry stays, however large).

    A specialization's key is a :class:`~pejit._calls._keys.CallKey`: the
    index maps its ``constants`` to the key last used with them (or
    :data:`SEVERAL`), so that a call which only recognizes its constants
    finds its entry, and ``jax.jit``'s dispatch checks the rest.
    """

    def __init__(self, maxsize: int | None = DEFAULT_CACHE_SIZE, maxbytes: int | None = None):
        for name, value in (("cache_size", maxsize), ("cache_bytes", maxbytes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.counts = Counts()
        self.entries: OrderedDict[Any, Any] = OrderedDict()
        self.index: dict[Any, Any] = {}
        self._watchers: dict[Any, list[weakref.ref]] = {}
        self._sizes: dict[Any, int] = {}
        self.nbytes = 0
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

    def learn(self, key: CallKey) -> None:
        """Index ``key`` as the one last used with its constants."""
        if self.index.get(key.constants) is not SEVERAL:
            self.index[key.constants] = key

    def latest(self, constants: Any) -> tuple[Any, Any]:
        """The key and entry last used with ``constants`` (now the most recent),
        ``(SEVERAL, None)`` when several are, or ``(None, None)``."""
        if self.dead:
            self.purge()
        key = self.index.get(constants)
        if key is None or key is SEVERAL:
            return key, None
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
            self.last[0] = NO_MEMO
        return key, value

    def several(self, constants: Any) -> None:
        """Mark ``constants`` as selecting several entries: lookups need the full key."""
        with self._lock:
            if constants in self.index:
                self.index[constants] = SEVERAL

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

    def put(self, key: Any, value: Any, watch: Iterable[Any] = (), nbytes: int = 0, indexed: bool = False) -> None:
        """Store ``value`` (``nbytes`` large); drop it when any object in ``watch`` dies.

        ``indexed``: ``key`` is a :class:`~pejit._calls._keys.CallKey`, and the index learns it.
        """
        if self.maxsize == 0:
            return
        dead = self.dead

        def forget(_ref, key=key):
            dead.append(key)

        with self._lock:
            self.last[0] = NO_MEMO
            if key in self.entries:
                self._drop(key)
            self.entries[key] = value
            self._watchers[key] = [weakref.ref(obj, forget) for obj in watch]
            self._sizes[key] = nbytes
            self.nbytes += nbytes
            if indexed:
                self.index[key.constants] = SEVERAL if key.constants in self.index else key
            self._shrink()

    def _shrink(self) -> None:
        """Drop the least recently used entries over the bounds, but the newest (under the lock)."""
        while len(self.entries) > 1 and (
            (self.maxsize is not None and len(self.entries) > self.maxsize)
            or (self.maxbytes is not None and self.nbytes > self.maxbytes)
        ):
            self._drop(next(iter(self.entries)))

    def discard(self, key: Any, value: Any) -> None:
        """Remove ``key``'s entry if it is still ``value``."""
        with self._lock:
            if self.entries.get(key) is value:
                self.last[0] = NO_MEMO
                self._drop(key)

    def replace(self, key: Any, old: Any, new: Any, nbytes: int) -> None:
        """Make ``new`` (``nbytes`` large) ``key``'s entry, watching what ``old`` watched,
        if it is still ``old`` (not evicted or replaced since)."""
        with self._lock:
            if self.entries.get(key) is not old:
                return
            self.last[0] = NO_MEMO
            self.entries[key] = new
            self.nbytes += nbytes - self._sizes.get(key, 0)
            self._sizes[key] = nbytes
            self._shrink()

    def _drop(self, key: Any) -> None:
        """Remove ``key``'s entry and what refers to it (under the lock)."""
        self.entries.pop(key, None)
        self._watchers.pop(key, None)
        self.nbytes -= self._sizes.pop(key, 0)
        if isinstance(key, CallKey) and self.index.get(key.constants) in (key, SEVERAL):
            del self.index[key.constants]

    def purge(self) -> None:
        with self._lock:
            self.last[0] = NO_MEMO
            while self.dead:
                key = self.dead.pop()
                refs = self._watchers.get(key)
                # The key may have been re-used by a live entry since; only
                # evict an entry one of whose watched objects is really gone.
                if refs is not None and any(r() is None for r in refs):
                    self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self.last[0] = NO_MEMO
            self.entries.clear()
            self.index.clear()
            self._watchers.clear()
            self._sizes.clear()
            self.nbytes = 0
            self.dead.clear()
            self.counts = Counts()

    def info(self) -> CacheInfo:
        if self.dead:
            self.purge()
        return CacheInfo(self.counts.hits, self.counts.misses, self.maxsize, len(self.entries),
                         self.maxbytes, self.nbytes)

    def __contains__(self, key: Any) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def values(self) -> list[Any]:
        return list(self.entries.values())

    def fast_path(self) -> FastPath:
        return FastPath(self.dead, self.purge, self.last, self.counts)


class Caches:
    """What one pejit function caches, with the lock its entries are built under.

    ``specializations``: by constant values (and dynamic types), counted in
    :meth:`info`. ``programs``: by structure of the constants (shapes, dtypes,
    static values), what specializations of one structure share. Both hold at
    most ``maxsize`` entries.
    """

    def __init__(self, maxsize: int | None = DEFAULT_CACHE_SIZE, maxbytes: int | None = DEFAULT_CACHE_BYTES):
        self.specializations = SpecializationCache(maxsize, maxbytes)
        self.programs = SpecializationCache(maxsize)
        # One trace and one fold per key, however many threads ask.
        self.lock = threading.RLock()

    def specialization(self, key: CallKey, build: Callable[..., tuple[Any, Iterable[Any], int]], *args: Any) -> Any:
        """The specialization for ``key``; on a miss,
        ``build(*args)`` returns it, the objects whose death drops it and its bytes."""
        cache = self.specializations
        value = cache.get(key)
        if value is None:
            with self.lock:
                value = cache.get(key)
                if value is None:
                    cache.counts.misses += 1
                    value, watch, nbytes = build(*args)
                    cache.put(key, value, watch=watch, nbytes=nbytes, indexed=True)
                    if value.pending is not None:  # folding beside (see pejit._calls._beside)
                        # (weakly: the job would keep the entry, and its constants, alive)
                        _beside.when_ready(value.pending, functools.partial(self._swap, key, weakref.ref(value)))
                    return value
        cache.counts.hits += 1
        cache.learn(key)
        return value

    def _swap(self, key: CallKey, serving: weakref.ref, folded: Any) -> None:
        """The fold beside ``serving()`` is ready: its specialization serves ``key`` from now on."""
        if serving() is not None:  # (else the entry is gone)
            self.specializations.replace(key, serving(), folded, sum(getattr(c, "nbytes", 0) for c in folded.consts))

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
