"""A batch of known work and its plan: which back end evaluates each segment.

The folding trace does not evaluate known equations when it meets them: it
records each one as a :class:`Recipe` and stages a placeholder (see
:mod:`pejit._fold._store`). Values are computed in batches, when something
needs them: Python (``bool(x)``, ``np.asarray(x)``), a fold rule (a
``cond`` index), or, at the end of the trace, the residual program, whose
constants they become. A batch is the set of recipes the requested values
depend on that have not run yet, in the order the trace recorded them.

:func:`plan_batch` splits a batch into segments (:class:`Segment`), each run by
one back end (:mod:`pejit._fold._batch` holds their table):

* **eager**: equation by equation with JAX's per-primitive dispatch. Every
  primitive/shape pair is compiled once and cached, so the cost per equation
  is a dispatch (tens of microseconds) plus the equation's own memory
  traffic; nothing to compile for the batch as a whole.
* **compiled**: the batch becomes one ``jax.jit`` program. XLA fuses the
  elementwise work, so intermediates are never written to memory, but the
  program must be compiled: a fixed cost plus a cost per equation. The
  steps of an unrolled loop, each feeding the next, become one compiled
  loop (**loop**, :mod:`pejit._fold._compiled`).
* **program**: a batch that reads abstract constants is staged into the
  folding program they belong to (:mod:`pejit._fold._abstract`).

The choice is the cost model's: fusing saves, per equation, one dispatch and
the memory traffic of its intermediates (written, then read back); it costs
a compilation. Many small equations (a long chain on a small array) favour
eager evaluation; runs of cheap elementwise equations on large arrays
favour one compiled program. Primitives without a lowering always run
eagerly.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat
from . import _abstract, _compiled, _cost, _device, _host
from ._primitives import is_var
from ._recipe import Recipe
from ._values import nbytes


@dataclasses.dataclass(frozen=True)
class Segment:
    """Consecutive recipes of a batch that run on the same back end.

    A ``"compiled"`` run has the ``key`` of its program's structure; a
    ``"loop"`` is a :class:`~pejit._fold._compiled.Chain` of such runs.
    """

    backend: str
    recipes: tuple
    key: Any = dataclasses.field(default=None, compare=False)
    chain: Any = None


def plan_batch(recipes: Sequence[Recipe], forced: str = "auto", platform: str = "cpu",
               outputs: Collection[Any] | None = None) -> list[Segment]:
    """Split a batch into segments and pick a back end for each.

    ``forced`` (``FoldOptions.backend``) overrides the cost model: ``"eager"``
    runs everything op by op, ``"compiled"`` compiles the whole batch as one
    program (unless a primitive cannot be compiled). ``"program"`` stages the
    batch into the folding program of abstract constants it reads, its
    concrete-only equations too (as an ``eye`` added to ``X.T @ X``): that
    program is compiled as a whole, where evaluating them now would compile
    each on its own.

    The cost model: a run of consecutive *fusible* equations (cheap
    elementwise arithmetic and data movement, which XLA fuses into one loop)
    is compiled when fusing saves more than compiling costs
    (:func:`pejit._fold._cost.run_compiles`). Fusing saves,
    per equation, one dispatch, and the memory traffic of the intermediates
    (written by one kernel, read back by the next) where they outgrow a
    core's cache; it costs the copy a program makes of each NumPy array it
    reads (a host rule's result), which also leaves memory resident (the
    copies). Runs of the same structure (the
    steps of an unrolled loop) share one program, and so its compilation.
    Every other equation runs on its own, eagerly: fusing a matrix product,
    a LAPACK call or a reduction with its neighbours saves little. A run
    starts at each ``sin``/``cos``/``tan`` (``pejit._fold._primitives.FUSED_FIRST``):
    XLA:CPU evaluates them slowly on an input computed in the same loop. A
    program already compiled for the same structure costs nothing.

    Given the batch's ``outputs`` (what is read after it), compiled runs
    that each feed the next run as one loop (:mod:`pejit._fold._compiled`).
    """
    if forced in ("eager", "program") or len(recipes) < 2:
        return [Segment("program" if forced == "program" else "eager", tuple(recipes))]
    if forced == "compiled":
        lowerable = all(_compat.has_lowering(r.prim, platform) for r in recipes)
        return [Segment("compiled" if lowerable else "eager", tuple(recipes))]
    cached, host = _device.current().cached_bytes, _device.host_computes()
    runs: list[tuple[bool, list[Recipe]]] = []  # (fusible, equations): runs, and the others alone
    kinds: dict[tuple, tuple[bool, bool]] = {}  # (primitive, body) -> (fuses, starts a run)
    for r in recipes:
        fuses, first = _compiled.fusion_kind(kinds, r.prim, r.params, platform)
        if not fuses:
            runs.append((False, [r]))
        elif runs and runs[-1][0] and not first:
            runs[-1][1].append(r)
        else:
            runs.append((True, [r]))
    keys = [_compiled.run_key(run) if fuses and len(run) > 1 else None for fuses, run in runs]
    # a structure by its number (the steps of an unrolled loop: one key, hashed once)
    numbers: dict[Any, int] = {}
    structure = [None if k is None else numbers.setdefault(k, len(numbers)) for k in keys]
    alike = Counter(structure)
    compiled = [_compiled.known(k) for k in numbers]
    reads = Counter(a for r in recipes for a in r.args if is_var(a))
    segments: list[Segment] = []
    on_host: set = set()  # values the batch computes as NumPy arrays, which a program copies in
    made: dict[int, set] = {}  # by structure: the values runs of it compute
    for (_, run), key, n in zip(runs, keys, structure):
        if key is not None:
            inside = Counter(a for r in run for a in r.args if is_var(a))
            alike_made = made.setdefault(n, set())  # compiled with this run, if it is: not on the host
            traffic = sum(nbytes(v.aval) for r in run for v in r.outvars  # the intermediates: read in the run alone
                          if v is not None and 0 < reads[v] == inside[v] and nbytes(v.aval) > cached)
            copied = sum(_bytes(a) for a in _inputs(run) if _bytes(a) > cached and (
                (a in on_host and a not in alike_made) if is_var(a) else type(a) is np.ndarray))
            alike_made.update(v for r in run for v in r.outvars)
            if compiled[n] or _cost.run_compiles(len(run), traffic - copied, alike[n]):
                segments.append(Segment("compiled", tuple(run), key))
                continue
        if segments and segments[-1].backend == "eager":
            segments[-1] = Segment("eager", segments[-1].recipes + tuple(run))
        else:
            segments.append(Segment("eager", tuple(run)))
        if host:
            on_host.update(v for r in run if _host.covers_equation(r.prim, r.params) for v in r.outvars if v is not None)
    return segments if outputs is None else _roll(segments, reads, set(outputs))


def compiled_alike(run: Sequence[Recipe], alike: int) -> bool:
    """Whether :func:`plan_batch` would compile ``alike`` runs like ``run``, as
    far as the run alone tells: its intermediates read in it alone, no NumPy
    array among its inputs (what :class:`pejit._fold._compiled.LoopsAhead` asks
    while the trace records an unrolled loop)."""
    cached = _device.current().cached_bytes
    traffic = sum(nbytes(v.aval) for r in run[:-1] for v in r.outvars if v is not None and nbytes(v.aval) > cached)
    return _cost.run_compiles(len(run), traffic, alike)


def _roll(segments: list[Segment], reads: Counter, needed: set) -> list[Segment]:
    """``segments`` with each chain of compiled runs (see :func:`pejit._fold._compiled.chain`) one loop."""
    rolled: list[Segment] = []
    alike = itertools.groupby(segments, lambda s: (0, id(s)) if s.key is None else (1, s.key))
    for _, same in alike:
        group = list(same)
        runs = [s.recipes for s in group]
        start = 0
        while start < len(runs):
            chain = _compiled.chain(runs, start, reads, needed)
            if chain is None:
                rolled.append(group[start])
                start += 1
            else:
                steps = runs[start:start + chain.steps]
                rolled.append(Segment("loop", tuple(r for run in steps for r in run), None, chain))
                start += chain.steps
    return rolled


def _inputs(run: Sequence[Recipe]) -> list[Any]:
    """The distinct array inputs of ``run`` that it does not compute itself."""
    inside = {v for r in run for v in r.outvars}
    seen: dict[Any, Any] = {}
    for r in run:
        for a in r.args:
            if (is_var(a) and a not in inside) or isinstance(a, (np.ndarray, jax.Array)):
                seen.setdefault(a if is_var(a) else id(a), a)
    return list(seen.values())


def _bytes(a) -> int:
    return nbytes(a.aval) if is_var(a) else a.nbytes



def reads_abstract(recipes: Sequence[Recipe], env: dict) -> bool:
    """Whether the batch reads abstract constants (see :mod:`pejit._fold._abstract`).

    Then the batch is staged into the outer program, which is compiled as a
    whole (the ``"program"`` back end of :func:`plan_batch`).
    """
    return _abstract.any_abstract(env.get(a) if is_var(a) else a for r in recipes for a in r.args)

