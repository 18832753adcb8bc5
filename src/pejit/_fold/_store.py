"""The deferred-value store of a folding trace: known work recorded, and computed in batches when asked.

The folding trace does not evaluate a known equation where it meets it: it
stages a placeholder and records a :class:`~pejit._fold._recipe.Recipe` in a
:class:`Store` (:meth:`Store.record`). A value is computed when something
needs it: Python (``bool(x)``, ``np.asarray(x)``), a fold rule (a ``cond``
index), or, at the end of the trace, the residual program, whose constants
the folded values become (:meth:`Store.values`). Then the store evaluates
one batch: the recipes those values depend on that have not run, in the
order the trace recorded them (:meth:`Store.pending`), planned by
:mod:`pejit._fold._plan` and run by the back ends of :mod:`pejit._fold._batch`.
Dead known work is never evaluated.

A *lazy* recipe is a cheap expansion of known values that the residual
program computes again (``FoldOptions.rematerialize``): it stays in the
residual, and is computed here only where something asks for its value.
:meth:`Store.split` says which recipes the residual reads as constants.
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _compat
from . import _plan, _progress, _values
from ._primitives import FUSES_OPERANDS, is_var
from ._recipe import Recipe
from ._stats import BatchInfo, FoldStats
from ._values import nbytes


class Store:
    """The known work one folding trace recorded: its recipes, and the values computed so far.

    ``stats`` gets a :class:`~pejit._fold._stats.BatchInfo` per segment of each
    batch, ``progress`` is told of them; ``backend`` is ``FoldOptions.backend``;
    ``run`` runs a planned batch (:func:`pejit._fold._batch.run_batch`);
    ``schedule`` (a :class:`~pejit._fold._schedule.Schedule`) holds the kernels
    and loops the worker started while the trace recorded them, which the
    batches take.
    """

    def __init__(self, stats: FoldStats, progress: _progress.Progress, backend: str, run: Callable[..., list],
                 schedule: Any = None):
        self._stats = stats
        self._progress = progress
        self._backend = backend
        self._run = run
        self._schedule = schedule
        #: output ``Var`` of a staged known equation -> how to compute it
        self.recipes: dict[Any, Recipe] = {}
        #: the values computed so far that later reads may ask for
        self.computed: dict[Any, Any] = {}
        # how often each recipe output was an input to something: values read
        # outside the batch that computes them are kept, not computed again
        self._uses: Counter = Counter()
        # what the batches hold on to: uniform values as a broadcast of one
        # element, equal ones once (see pejit._fold._values)
        self._keep = _values.Compactor()

    # -- recording ------------------------------------------------------------
    def var(self, x):
        """The recipe ``Var`` of ``x``, a tracer this store holds the recipe of; else None."""
        if not isinstance(x, _compat.Tracer):
            return None
        var = getattr(x, "val", None)
        return var if isinstance(var, _compat.Var) and var in self.recipes else None

    def read(self, args: Sequence[Any]) -> None:
        """Count that an equation reads ``args`` (see :meth:`values`)."""
        for a in args:
            var = self.var(a)
            if var is not None:
                self._uses[var] += 1

    def record(self, trace, prim, args: Sequence[Any], params: dict, *, lazy: bool,
               params_key: tuple | None = None) -> tuple[Any, Recipe | None]:
        """Stage ``prim`` on known ``args`` and record how to compute it: ``(outputs, recipe)``.

        A fold is staged as exactly one equation, which the residual drops by
        its outputs; a lazy one stays in the residual program, staged as JAX
        would stage it (custom rules inline some calls). JAX's staging may
        forward an input or fold a literal instead of emitting an equation:
        such outputs know their value already, and where all do, nothing is
        recorded (``recipe`` is None). ``params_key`` is ``params`` as part
        of a key, where the caller has it (see :class:`~pejit._fold._recipe.Recipe`).
        """
        stage = trace.stage if lazy else trace.stage_equation
        outs = stage(prim, args, params)
        outvars = tuple(o.val if _compat.const_of(trace, o) is None and self.var(o) is None else None
                        for o in (outs if prim.multiple_results else [outs]))
        if all(v is None for v in outvars):
            return outs, None
        recipe = Recipe(prim, tuple(self.var(a) or a for a in args), params, outvars, lazy,
                        serial=len(self.recipes), params_key=params_key)
        self.recipes.update((v, recipe) for v in outvars if v is not None)
        return outs, recipe

    # -- what the store knows ---------------------------------------------------
    def is_lazy(self, x) -> bool:
        """Whether ``x`` is a cheap expansion that stays in the residual program."""
        var = self.var(x)
        return var is not None and self.recipes[var].lazy

    def expansion(self, x, prim) -> tuple[list[Any], dict] | None:
        """``(inputs, params)`` of ``x`` if it is a lazy expansion by ``prim``, its inputs computed; else None."""
        if not self.is_lazy(x) or self.recipes[self.var(x)].prim is not prim:
            return None
        recipe = self.recipes[self.var(x)]
        inputs = [self.values([a])[0] if is_var(a) else a for a in recipe.args]
        return inputs, recipe.params

    def value(self, x):
        """The value of ``x``: computed, where it is a recipe's output."""
        var = self.var(x)
        if var is None:
            return x
        return self.values([var])[0]

    def abstract(self) -> bool:
        """Whether this store holds abstract constants (tracers of a folding program being traced)."""
        values = [*self.computed.values(), *(a for r in self.recipes.values() for a in r.args)]
        return any(isinstance(v, _compat.Tracer) for v in values)

    def clear(self) -> None:
        """Forget every recipe and value."""
        self.recipes.clear()
        self.computed.clear()

    # -- batches ------------------------------------------------------------------
    def values(self, targets: Sequence[Any], final: bool = False) -> list[Any]:
        """Values of recipe variables ``targets``, evaluating one batch.

        Besides ``targets``, the batch keeps the values that something
        outside it has read; other intermediates are dropped, and computed
        again should a later equation ask for them. The ``final`` batch (the
        residual's constants) keeps only ``targets``, and lets go of every
        earlier value at its last read in the batch: nothing asks later.
        """
        batch = self.pending(targets)
        if batch:
            produced = {v for r in batch for v in r.outvars if v is not None}
            inside = Counter(a for r in batch for a in r.args if is_var(a))
            outputs = list(dict.fromkeys(
                [v for v in targets if v in produced]
                + ([] if final else [v for v in produced if self._uses[v] > inside[v]])
            ))
            # Abstract constants: the batch is staged into the folding program.
            backend = "program" if _plan.reads_abstract(batch, self.computed) else self._backend
            plan = _plan.plan_batch(batch, backend, jax.default_backend(), outputs)
            start, timings = time.perf_counter(), []
            if final:
                # hand the earlier values over: the batch frees each at its last read
                wanted = set(targets)
                held = {v: x for v, x in self.computed.items() if v in inside or v in wanted}
                self.computed = {v: x for v, x in held.items() if v in wanted}
            schedule = self._schedule
            values = self._run(plan, _handover(held) if final else self.computed, outputs, self._keep,
                               self._progress.advance, timings,
                               kernels=None if schedule is None else schedule.kernels,
                               loops=None if schedule is None else schedule.loops)
            self.computed.update(zip(outputs, values))
            self._log(plan, timings, batch, outputs, time.perf_counter() - start)
        return [self.computed[v] for v in targets]

    def pending(self, targets: Sequence[Any]) -> list[Recipe]:
        """The recipes not evaluated yet that the values of ``targets`` depend on, in the order the trace recorded them.

        That is the program's own order, which holds each value from where
        the program computes it to where it reads it. An order target by
        target (each one's dependencies, then the next's) holds what two
        targets share from the first to the last, and peaks higher where
        they share much (as a PDE's do).
        """
        found: dict[int, Recipe] = {}
        stack = [self.recipes[v] for v in targets if v not in self.computed]
        while stack:
            r = stack.pop()
            if id(r) not in found:
                found[id(r)] = r
                stack.extend(self.recipes[a] for a in r.args if is_var(a) and a not in self.computed)
        return sorted(found.values(), key=operator.attrgetter("serial"))

    def _log(self, plan, timings, batch, outputs, seconds: float) -> None:
        number = self._stats.batches[-1].batch + 1 if self._stats.batches else 0
        self._stats.batches.extend(
            BatchInfo(number, seg.backend, len(seg.recipes), sum(r.out_bytes() for r in seg.recipes),
                      Counter(r.prim.name for r in seg.recipes), seg_seconds, compiling)
            for seg, (seg_seconds, compiling) in zip(plan, timings)
        )
        self._progress.batch(Counter(seg.backend for seg in plan), len(batch), sum(r.out_bytes() for r in batch),
                             sum(nbytes(v.aval) for v in outputs), seconds)

    # -- the residual ---------------------------------------------------------------
    def split(self, jaxpr, stored: Callable[[Recipe, bool], bool]) -> tuple[list, list]:
        """``(kept, needed)``: the equations the residual ``jaxpr`` keeps, and the recipe
        outputs it reads as constants, those ``stored(recipe, unfused)`` says (``unfused``:
        an equation that cannot fuse its producer reads it, see :data:`FUSES_OPERANDS`);
        in program order. Consumers come after producers, so walking the equations
        backwards knows every consumer of an equation first."""
        live = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
        unfused = set()  # live values read by an equation that cannot fuse its producer
        kept, needed = [], []
        for eqn in reversed(jaxpr.eqns):
            recipe = next((self.recipes[v] for v in eqn.outvars if v in self.recipes), None)
            if recipe is not None and stored(recipe, any(v in unfused for v in eqn.outvars)):
                needed.extend(v for v in eqn.outvars if v in live)
                continue
            if eqn.effects or any(v in live for v in eqn.outvars):
                kept.append(eqn)
                invars = [v for v in eqn.invars if isinstance(v, _compat.Var)]
                live.update(invars)
                if eqn.primitive not in FUSES_OPERANDS:
                    unfused.update(invars)
        return kept[::-1], needed[::-1]

    def was_computed(self, recipe: Recipe) -> bool:
        """Whether some output of ``recipe`` has been computed (Python asked for it, say)."""
        return any(v in self.computed for v in recipe.outvars)


def _handover(env: dict) -> dict:
    """``env``'s entries in a new dict, ``env`` emptied: the callee then holds the only references."""
    out = dict(env)
    env.clear()
    return out


__all__ = ["Store"]
