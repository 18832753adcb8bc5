"""Values of a batch that constants alone define, computed again at a far use rather than held.

Part of the folding back end (:func:`pejit._fold._batch.run_batch`): see :class:`Refolds`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import heapq
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

from . import _host
from ._primitives import is_var
from ._values import nbytes


#: A batch's value that constants alone define (through at most REMAT_DEPTH
#: equations), of at least REMAT_BYTES, whose next use is more than
#: REMAT_GAP equations away, is computed again there rather than held (see
#: Refolds).
REMAT_BYTES = 2**20
REMAT_GAP = 32
REMAT_DEPTH = 3
#: Bytes of such values a batch holds before it drops the one read farthest
#: ahead, unless it holds them all (HOLD_ALL): a budget held computes fewer
#: again than none held, and still bounds what they cost in memory.
REMAT_HELD = 128 * 2**20
#: Such values are all held (none computed again) when that is at most
#: this many bytes at once, and the batch trims the heap as it runs (see
#: pejit._fold._trim): a large PDE's such values fit, in either API form.
HOLD_ALL = 640 * 2**20
#: Or when that is at most this many times the bytes the batch holds at
#: once anyway: its outputs (to its end), or the values one of its
#: equations reads: the peak is then set by what the batch holds anyway
#: (a PDE's affine collapse alone reads more than all its such values).
HOLD_KEPT = 1.0
#: How many equations ahead of its read a dropped value is computed again on
#: the worker (see Refolds.prefetch).
REMAT_LEAD = 16


class Refolds:
    """Values of a batch that its constants alone define, dropped between far uses and computed again.

    The fold records the same known work once (:class:`pejit._fold._memo.Memo`), so
    TFC's basis at a zero coordinate, ``H(zeros_like(x), y, t)``, is one
    value that derivatives read from the start of the batch to its end:
    a PDE's fold holds dozens of such large arrays, and their transposes
    and products, at once, several times the memory of computing each at
    its read (fewer in the trace's order, ``Store.pending``, than target by
    target). Such a value
    (one output, defined by at most :data:`REMAT_DEPTH` equations from
    constants or small values from before the batch) is dropped, the one
    read farthest ahead first, while more than :data:`REMAT_HELD` bytes of
    them are held and its next read is far; its equations run again just
    before that read.

    Unless holding them all takes at most :data:`HOLD_ALL` bytes at once,
    or at most the bytes of the batch's ``outputs`` yet to compute or the
    bytes one of its equations reads (times :data:`HOLD_KEPT`; ``trims``):
    then none is dropped, and the batch trims the heap as it runs
    (:mod:`pejit._fold._trim`), which keeps the process's memory near what
    it holds (and what the heap keeps free for its next arrays): nothing is
    computed again, and the first value comes sooner.
    The outputs are
    held to the batch's end, and an equation's inputs all at once,
    whatever the batch drops; ``jax.jit``'s program holds these values
    from their first read to their last too (XLA does not compute them
    again): holding as many bytes again as the batch must hold anyway keeps
    the peak near ``jax.jit``'s.

    A value is computed again as the batch computed it: by its kernel
    (``kernels``, :mod:`pejit._fold._offload`), else by ``evaluate(prim, args,
    params)``, the batch's own evaluator (:func:`pejit._fold._batch.eagerly`).
    """

    def __init__(self, recipes: Sequence[Any], env: dict, uses: Counter,
                 evaluate: Callable[[Any, Sequence[Any], dict], Any], kernels: Any = None,
                 worker: concurrent.futures.Executor | None = None, outputs: Collection[Any] = ()):
        self._evaluate = evaluate
        self._kernels = kernels  # pejit._fold._offload.Kernels: a kernel runs again by its lowering
        self._worker = worker  # computes dropped values again ahead of their reads
        self._dropped: list[tuple[int, int, Any]] = []  # heap of (next read, tie, var) dropped here
        self._ahead: dict[Any, tuple[concurrent.futures.Future, Callable[[], Any]]] = {}  # var -> its job
        self._computed: dict[Any, Any] = {}  # var -> its value, a job taken back from the worker
        self._producer: dict[Any, tuple[Any, int]] = {}  # var -> (its recipe, depth)
        self._next: dict[Any, collections.deque] = collections.defaultdict(collections.deque)
        self._missing: set = set()  # dropped, or released at a last use that was not the last
        self._held: dict[Any, int] = {}  # large values of constants alone in env: their bytes
        pinned = set()
        widest = 0  # the most bytes one equation reads: all live at once, whatever is dropped
        for i, r in enumerate(recipes):
            inputs = [a for a in r.args if is_var(a)]
            widest = max(widest, sum(nbytes(a.aval) for a in set(inputs)))
            for a in inputs:
                self._next[a].append(i)
            if r.prim.multiple_results or r.outvars[0] is None:
                continue
            depth = 1
            for a in inputs:
                if a in self._producer:
                    depth = max(depth, self._producer[a][1] + 1)
                elif not (a in env and getattr(env[a], "nbytes", REMAT_BYTES) < REMAT_BYTES):
                    depth = REMAT_DEPTH + 1
            if depth <= REMAT_DEPTH:
                self._producer[r.outvars[0]] = (r, depth)
                pinned.update(a for a in inputs if a in env)
        for a in pinned:  # kept for the recomputations (small, defined before the batch)
            uses[a] += 1
        kept = sum(nbytes(v.aval) for v in outputs if is_var(v) and v not in env)
        # Holding them all spares computing them again; past REMAT_HELD the
        # heap grows with them, and the batch trims it (pejit._fold._trim)
        most = self._held_at_most()
        self.trims = REMAT_HELD < most <= max(HOLD_ALL, HOLD_KEPT * max(kept, widest))
        self._budget = most if self.trims else REMAT_HELD

    def _held_at_most(self) -> int:
        """The most bytes of values of constants alone held at once, were none
        dropped: each from its first read to its last."""
        change = Counter()
        for v in self._producer:
            reads, size = self._next.get(v), nbytes(v.aval)
            if reads and len(reads) > 1 and size >= REMAT_BYTES:
                change[reads[0]] += size
                change[reads[-1]] -= size
        held = most = 0
        for i in sorted(change):
            held += change[i]
            most = max(most, held)
        return most

    def restore(self, r, env: dict) -> None:
        """Compute again the inputs of ``r`` that were dropped (or take them from the worker)."""
        for a in r.args:
            if is_var(a) and a not in env and a in self._missing:
                self._missing.discard(a)
                value = self._computed.pop(a, None)
                ahead = self._ahead.pop(a, None)
                if ahead is not None:
                    value = self._result(*ahead)
                env[a] = self._value(a, env, {}) if value is None else value

    def _result(self, future: concurrent.futures.Future, job: Callable[[], Any]) -> Any:
        """What ``job`` the worker was given computes, here if it has not started it.
        While it runs, this thread computes what the worker has not started yet:
        its kernels, and the other values computed again (the two cores kept busy,
        where the worker has more to do than this thread: TFC's basis)."""
        try:
            if future.cancel():
                return job()
            for other, (later, other_job) in list(self._ahead.items()):
                if future.done():
                    break
                if later.cancel():  # computed here; one that fails is computed at its read
                    del self._ahead[other]
                    with contextlib.suppress(Exception):
                        self._computed[other] = other_job()
            if self._kernels is not None:
                self._kernels.help(future)
            return future.result()
        except Exception:  # noqa: BLE001 - computed at the read instead, where an error is the batch's
            return None

    def prefetch(self, position: int, env: dict) -> None:
        """Have the worker compute again the dropped values read within
        :data:`REMAT_LEAD` equations after ``position``: the folding thread
        then finds them computed, as it finds the kernels the worker ran
        (see :mod:`pejit._fold._offload`), instead of computing them at the
        read. A dropped value they read is computed with them: values
        computed again often read another dropped one, which would otherwise
        be computed at the read, on the folding thread.

        Only what runs the same on any thread goes: a kernel lowered here
        (under this thread's configuration: ``jax.enable_x64`` is per
        thread) on values held here, or a host rule's NumPy; JAX's eager
        dispatch stays here."""
        while self._dropped and self._dropped[0][0] - position <= REMAT_LEAD:
            _, _, a = heapq.heappop(self._dropped)
            if a in env or a not in self._missing or a in self._ahead or a in self._computed:
                continue
            job = self._job(a, env)
            if job is not None:
                self._ahead[a] = (self._worker.submit(job), job)

    def _job(self, a, env: dict) -> Callable[[], Any] | None:
        """Dropped ``a`` computed again by a function any thread can run, with what it
        reads that was dropped too; None where an equation must run here."""
        p = self._producer[a][0]
        args, later = [], []
        for b in p.args:
            if not is_var(b) or b in env:
                args.append(env[b] if is_var(b) else b)
                continue
            job = self._job(b, env) if b in self._producer else None
            if job is None:
                return None
            later.append((len(args), job))
            args.append(None)
        if not later:  # a kernel's inputs are made jax.Arrays here, under this thread's configuration
            kernel = None if self._kernels is None else self._kernels.prepare(p, args)
            if kernel is not None:
                return kernel
        if not _host.covers_equation(p.prim, p.params):
            return None
        return functools.partial(_on_host, p, args, later)

    def _compute(self, p, args: list):
        out = None if self._kernels is None else self._kernels.compute(p, args)
        return self._evaluate(p.prim, args, p.params) if out is None else out

    def _value(self, a, env: dict, scratch: dict):
        if a in env:
            return env[a]
        if a not in scratch:
            p = self._producer[a][0]
            scratch[a] = self._compute(p, [self._value(b, env, scratch) if is_var(b) else b for b in p.args])
        return scratch[a]

    def release(self, position: int, r, env: dict) -> None:
        """After ``r`` (at ``position``), drop large values of constants alone, those read
        farthest ahead first, until at most :data:`REMAT_HELD` bytes of them are held."""
        for a in r.args:
            if not is_var(a) or a not in self._producer:
                continue
            waiting = self._next[a]
            while waiting and waiting[0] <= position:
                waiting.popleft()
            if not waiting:
                self._held.pop(a, None)
            elif a not in env:  # released: an input of a recomputation only
                self._missing.add(a)
            elif getattr(env[a], "nbytes", 0) >= REMAT_BYTES:
                self._held[a] = env[a].nbytes
        while sum(self._held.values()) > self._budget:
            far = max(self._held, key=lambda v: self._next[v][0])
            if self._next[far][0] - position <= REMAT_GAP:
                break
            del env[far], self._held[far]
            self._missing.add(far)
            if self._worker is not None:
                heapq.heappush(self._dropped, (self._next[far][0], id(far), far))


def _on_host(p, args: list, later: list) -> Any:
    """``p`` by its host rule, on ``args`` with the values the jobs of ``later`` compute
    in their places; None where a rule declines (the batch computes it then)."""
    args = list(args)
    for i, job in later:
        args[i] = job()
        if args[i] is None:
            return None
    return _host.on_host(p.prim, args, p.params)
