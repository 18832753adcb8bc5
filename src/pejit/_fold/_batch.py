"""Running a planned batch of known work: one table of back ends, and the loop over segments.

:func:`pejit._fold._plan.plan_batch` splits a batch into segments and names
the back end of each; :data:`BACKENDS` maps that name to the function that
runs it, ``run(segment, batch)``: ``"eager"`` (equation by equation, by a
kernel the worker ran, a host rule or JAX's dispatch), ``"compiled"`` (one
program), ``"loop"`` (a chain of compiled runs, one loop) and ``"program"``
(staged into a folding program). :func:`run_batch` is the loop over the
segments. What the back ends share is a :class:`BatchRun`: the values
computed so far, each freed after its last read; the kernels handed to the
worker (:mod:`pejit._fold._offload`); the values of constants alone that are
dropped and computed again at a far read (:mod:`pejit._fold._refold`), with
the heap trimmed while they are held (:mod:`pejit._fold._trim`); the memory
of large host results, used again (:mod:`pejit._fold._recycle`); and the
progress bar.

:func:`run_jaxpr` runs a whole jaxpr as one batch (a folding program's
first value); :data:`known_part_p` and :data:`batch_p` are the call
primitives that carry known work into a folding program.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive, jaxpr_as_fun

from .. import _compat
from . import _abstract, _compiled, _host, _offload, _recycle, _refold, _trim
from ._plan import Segment, plan_batch
from ._primitives import is_var
from ._recipe import Recipe
from ._stats import BatchInfo


class BatchRun:
    """A planned batch as it runs: what its back ends share.

    ``env`` maps the ``Var`` of each value computed so far to it, until its
    last read in the batch (:meth:`done` frees it). An output is handed to
    ``keep`` as soon as it is produced, and what ``keep`` returns is what the
    batch holds on to for it (see :class:`pejit._fold._values.Compactor`); the
    value itself stays only until its last read. The values of ``compact``
    are handed to ``keep`` too, and their later reads read what it returns.
    """

    def __init__(self, segments: Sequence[Segment], env: dict, outputs: Sequence[Any],
                 keep: Callable[[Any], Any] | None, tick: Callable[[int], None] | None, compact: Collection[Any],
                 kernels: _offload.Kernels | None, loops: _compiled.LoopsAhead | None):
        self.env = dict(env)
        self.uses = Counter(a for seg in segments for r in seg.recipes for a in r.args if is_var(a))
        self.wanted = set(outputs)
        self.results = {v: self.env[v] for v in outputs if v in self.env}
        self.loops = loops
        self._keep = keep or _unchanged
        self._tick = tick or _ignored
        self._compact = compact
        # kernels run on a worker beside the host arithmetic (see pejit._fold._offload)
        self.kernels = _offload.Kernels() if kernels is None else kernels
        eager = [r for seg in segments if seg.backend == "eager" for r in seg.recipes]
        self._ahead = _offload.Ahead(self.kernels, eager, self.env) if self.kernels.enabled else None
        self._refolds = _refold.Refolds([r for seg in segments for r in seg.recipes], self.env, self.uses,
                                        eagerly, self.kernels, _offload.spare() if self.kernels.enabled else None,
                                        outputs=self.wanted)
        self._position = -1  # among the eager recipes, for the kernels handed out ahead
        self._step = -1  # in the batch, for the values computed again
        self._trimmer = _trim.Trimmer() if self._refolds.trims else None  # what it frees goes back as it runs

    def hand_out(self) -> None:
        """Before the next eager equation: hand the worker the kernels whose inputs are known now."""
        self._position += 1
        if self._ahead is not None:
            self._ahead.submit(self._position)

    def restore(self, recipes: Sequence[Recipe]) -> None:
        """Compute again the inputs of ``recipes`` that were dropped (see :class:`pejit._fold._refold.Refolds`)."""
        for r in recipes:
            self._refolds.restore(r, self.env)

    def define(self, pairs) -> None:
        """Hold each ``(Var, value)`` of ``pairs`` for its reads, and as a result where it is one."""
        for v, x in pairs:
            kept = self._keep(x) if v in self.wanted or v in self._compact else x
            if v in self.wanted:
                self.results[v] = kept
            if self.uses[v]:
                self.env[v] = kept if v in self._compact else x

    def at_once(self, recipes: Sequence[Recipe], evaluate: Callable[[dict, list], Sequence[Any]]) -> None:
        """Evaluate ``recipes`` together: ``evaluate(env, outputs)`` gives the values of
        ``outputs``, those of their outputs that are read after them."""
        self.restore(recipes)
        produced = [v for r in recipes for v in r.outvars if v is not None]
        inside = Counter(a for r in recipes for a in r.args if is_var(a))
        outputs = [v for v in produced if v in self.wanted or self.uses[v] > inside[v]]
        self.define(zip(outputs, evaluate(self.env, outputs)))
        self.done(recipes)

    def done(self, recipes: Sequence[Recipe]) -> None:
        """After ``recipes``: free what they read for the last time, drop values of constants
        alone read far ahead (and start computing those read soon), tell the progress bar,
        trim the heap."""
        for r in recipes:
            for a in r.args:
                if is_var(a):
                    self.uses[a] -= 1
                    if self.uses[a] == 0:
                        self.env.pop(a, None)
        for r in recipes:
            self._step += 1
            self._refolds.release(self._step, r, self.env)
        self._refolds.prefetch(self._step, self.env)
        self._tick(len(recipes))
        if self._trimmer is not None:
            self._trimmer.tick()


def eagerly(prim, args: Sequence[Any], params: dict) -> Any:
    """``prim`` on known ``args`` as the eager back end evaluates it: on the host where a
    rule gives XLA's bits (:func:`pejit._fold._host.on_host`: no compile), else by JAX
    (:func:`pejit._fold._abstract.bind_known`)."""
    outs = _host.on_host(prim, args, params)
    return _abstract.bind_known(prim, args, params) if outs is None else outs


def run_eager(seg: Segment, batch: BatchRun) -> float:
    """Equation by equation: by the kernel the worker ran (or runs now), else on
    the host where a rule gives XLA's bits, else by JAX's dispatch."""
    for r in seg.recipes:
        batch.hand_out()
        batch.restore((r,))
        args = [batch.env[a] if is_var(a) else a for a in r.args]
        outs = batch.kernels.take(r, args)
        if outs is None:
            outs = eagerly(r.prim, args, r.params)
        del args  # nothing here holds a value past its last read
        batch.define((v, x) for v, x in zip(r.outvars, outs if r.prim.multiple_results else [outs])
                     if v is not None)
        del outs
        batch.done((r,))
    return 0.0


def run_compiled(seg: Segment, batch: BatchRun) -> float:
    """The segment as one compiled program, cached by its structure (:func:`pejit._fold._compiled.run`)."""
    compiling = [0.0]
    batch.at_once(seg.recipes, lambda env, outputs: _compiled.run(seg.recipes, env, outputs, compiling))
    return compiling[0]


def run_loop(seg: Segment, batch: BatchRun) -> float:
    """A chain of compiled runs as one loop (:func:`pejit._fold._compiled.run_chain`), from
    the steps the worker ran ahead, if it did."""
    compiling = [0.0]
    batch.at_once(seg.recipes, lambda env, outputs: _compiled.run_chain(
        seg.recipes, env, outputs, seg.chain, compiling, batch.loops))
    return compiling[0]


def run_program(seg: Segment, batch: BatchRun) -> float:
    """The segment staged as one equation into the folding program of the abstract constants it reads."""
    batch.at_once(seg.recipes, lambda env, outputs: _stage(seg.recipes, env, outputs))
    return 0.0


#: The back ends, by the name :func:`pejit._fold._plan.plan_batch` gives a segment:
#: ``run(segment, batch)`` evaluates the segment's recipes into the :class:`BatchRun`
#: and returns the seconds it spent compiling.
BACKENDS: dict[str, Callable[[Segment, BatchRun], float]] = {
    "eager": run_eager,
    "compiled": run_compiled,
    "loop": run_loop,
    "program": run_program,
}


def run_batch(
    segments: Sequence[Segment], env: dict, outputs: Sequence[Any], keep: Callable[[Any], Any] | None = None,
    tick: Callable[[int], None] | None = None, timings: list[tuple[float, float]] | None = None,
    compact: Collection[Any] = (), kernels: _offload.Kernels | None = None,
    loops: _compiled.LoopsAhead | None = None,
) -> list[Any]:
    """Run the planned batch (``segments``) and return the values of ``outputs``.

    ``env`` maps the ``Var`` of values computed before to them; ``keep`` and
    ``compact`` are as for :class:`BatchRun`. Intermediates are dropped after
    their last read, so a long chain keeps a few arrays alive, not all of them.
    ``tick(n)`` is told of every ``n`` equations evaluated (a progress bar).
    ``timings`` gets each segment's ``(seconds, of which compiling)``.
    ``kernels`` holds those of the fold handed out before the batch (see
    :mod:`pejit._fold._offload`); ``loops``, the chains the worker ran
    ahead (see :class:`pejit._fold._compiled.LoopsAhead`).
    """
    batch = BatchRun(segments, env, outputs, keep, tick, compact, kernels, loops)
    del env  # values handed over (see pejit._fold._store) are held by the batch alone, each to its last read
    with _compat.evaluating(), _recycle.recycling():
        for seg in segments:
            start = time.perf_counter()
            compiling = BACKENDS[seg.backend](seg, batch)
            if timings is not None:
                timings.append((time.perf_counter() - start, compiling))
    return [batch.results[v] for v in outputs]


@_host.remembering()
def run_jaxpr(
    closed_jaxpr, args: Sequence[Any], backend: str = "auto", keep: Callable[[Any], Any] | None = None,
    tick: Callable[[int], None] | None = None, segments: list[BatchInfo] | None = None,
    kernels: _offload.Kernels | None = None,
) -> list[Any]:
    """``closed_jaxpr`` on ``args``, run as one batch (see :func:`run_batch`).

    The folding program's first value goes this way: each equation is a
    recipe, so the back end is chosen per segment by the cost model (or by
    ``backend``), each intermediate is freed after its last consumer, and
    ``keep`` sees each output as soon as it is produced. A program with a
    call that binds Python functions (a ``custom_jvp``/``custom_vjp`` call)
    is evaluated by JAX's interpreter instead, op by op. ``segments`` gets
    how each segment was evaluated (where the first value's time goes);
    ``kernels``, those handed out before (see :mod:`pejit._fold._offload`).
    """
    jaxpr = closed_jaxpr.jaxpr
    keep = keep or _unchanged
    if any(type(e.primitive).get_bind_params is not Primitive.get_bind_params for e in jaxpr.eqns):
        # a call whose bind takes Python functions rebuilt from its params
        # (custom_jvp/custom_vjp calls folded whole): JAX's interpreter knows how
        with _compat.evaluating():
            outs = jaxpr_as_fun(closed_jaxpr)(*args)
        if tick is not None:
            tick(len(jaxpr.eqns))
        return [keep(x) for x in outs]
    env = dict(zip(jaxpr.constvars, closed_jaxpr.consts))
    env.update(zip(jaxpr.invars, args))
    recipes = flat_recipes(jaxpr.eqns)
    outputs = [v for v in jaxpr.outvars if is_var(v)]
    # what the trace's batches kept, held as the folding trace holds it
    # (uniform values as broadcasts, equal ones once): the program's later
    # equations (an affine collapse's matrices) read them
    kept = {v for e in jaxpr.eqns if e.primitive is batch_p for v in e.outvars}
    plan = plan_batch(recipes, backend, jax.default_backend(), outputs)
    timings: list[tuple[float, float]] = []
    values = iter(run_batch(plan, env, outputs, keep, tick, timings, compact=kept, kernels=kernels))
    if segments is not None:
        segments.extend(BatchInfo(0, seg.backend, len(seg.recipes), sum(r.out_bytes() for r in seg.recipes),
                                  Counter(r.prim.name for r in seg.recipes), seconds, compiling)
                        for seg, (seconds, compiling) in zip(plan, timings))
    return [next(values) if is_var(v) else v.val for v in jaxpr.outvars]


def flat_eqns(eqns: Sequence[Any]) -> list[Any]:
    """``eqns`` with each ``folded_batch`` replaced by the equations of its body (not renamed)."""
    return [b for e in eqns for b in (e.params["jaxpr"].jaxpr.eqns if e.primitive is batch_p else (e,))]


def flat_recipes(eqns: Sequence[Any]) -> list[Recipe]:
    """The recipes of ``eqns``, each ``folded_batch`` replaced by the equations it staged.

    The body's variables are renamed: its inputs and outputs to the
    equation's, the others to fresh ones (a recipe recomputed by a later
    batch is in two bodies).
    """
    def recipe(e, rename):
        args = (rename.get(a, a) if is_var(a) else a for a in e.invars)
        return Recipe(e.primitive, tuple(a if is_var(a) else a.val for a in args), e.params,
                      tuple(None if isinstance(v, _compat.drop_var) else rename.get(v, v) for v in e.outvars))

    out = []
    for e in eqns:
        if e.primitive is not batch_p:
            out.append(recipe(e, {}))
            continue
        body = e.params["jaxpr"].jaxpr
        rename = dict(zip(body.invars, e.invars))
        rename.update((b, v) for b, v in zip(body.outvars, e.outvars) if not isinstance(v, _compat.drop_var))
        for b in body.eqns:
            rename.update((v, _compat.new_var(v.aval)) for v in b.outvars if v not in rename)
            out.append(recipe(b, rename))
    return out


def _call_primitive(name: str, backend: str) -> Primitive:
    """A primitive that calls the closed jaxpr in its ``jaxpr`` parameter:
    evaluated by :func:`run_jaxpr` with ``backend``, compiled as its body."""
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(lambda *args, jaxpr: run_jaxpr(jaxpr, args, backend))
    prim.def_abstract_eval(lambda *avals, jaxpr: jaxpr.out_avals)
    inline = lambda *args, jaxpr: jaxpr_as_fun(jaxpr)(*args)  # noqa: E731
    _compat.lower_as(prim, inline)
    return prim


#: Known equations of a nested call folded as one recipe (see
#: ``pejit._residual.rules.calls.fold_jit``): evaluated equation by equation, as
#: folding them one by one would (the host rules where they apply, JAX's
#: per-primitive dispatch elsewhere), staged as one equation into a folding
#: program, and compiled as its body where a program is compiled.
known_part_p = _call_primitive("known_part", "eager")

#: A batch staged into a folding program as one equation (see :func:`_stage`);
#: evaluating the program evaluates its equations as the batch's own
#: (:func:`flat_recipes`), compiling it compiles its body.
batch_p = _call_primitive("folded_batch", "auto")


def _stage(recipes, env, outputs) -> list[Any]:
    """Stage ``recipes`` into the program of abstract constants they read, as one equation.

    The equation is a ``folded_batch`` whose body is built from the recipes
    directly: their outputs' avals are known, so nothing is abstractly evaluated
    again, where binding each recipe on the outer trace would (a fraction of a
    millisecond each, and a PDE's fold stages thousands). Other values become
    the equation's inputs, scalars literals; as in :func:`run_batch`, a recipe
    reads what an earlier recipe of the batch defined, else what ``env`` holds
    (a recipe may compute again a value an earlier batch kept).
    """
    local: set[Any] = set()
    inputs: list[Any] = []
    invars: dict[Any, Any] = {}  # Var, or id of a value, -> the body's input

    def atom(a):
        if is_var(a) and a in local:
            return a
        value = env[a] if is_var(a) else a
        if not is_var(a) and np.ndim(value) == 0 and not isinstance(value, (jax.Array, _compat.Tracer)):
            return _compat.literal(value, _compat.typeof(value))
        key = a if is_var(a) else id(value)
        if key not in invars:
            invars[key] = _compat.new_var(_compat.typeof(value))
            inputs.append(_host.to_jax(value))
        return invars[key]

    def eqn(r):
        args = [atom(a) for a in r.args]
        if None in r.outvars:  # outputs JAX's staging forwarded: bound to nothing here
            avals, _ = _compat.abstract_eval(r.prim, [a.aval for a in args], r.params)
            avals = avals if r.prim.multiple_results else [avals]
            outvars = [_compat.drop_var(aval) if v is None else v for v, aval in zip(r.outvars, avals)]
        else:
            outvars = list(r.outvars)
        local.update(r.outvars)
        return _compat.new_jaxpr_eqn(args, outvars, r.prim, r.params, _compat.no_effects)

    eqns = [eqn(r) for r in recipes]
    debug = _compat.unnamed_debug_info("folded_batch", len(invars), len(outputs))
    body = _compat.ClosedJaxpr(_compat.Jaxpr([], list(invars.values()), list(outputs), eqns, debug_info=debug), [])
    outer = _abstract.outer_trace(inputs)
    return _abstract.bind_known(batch_p, inputs, {"jaxpr": body}, outer)


def clear_programs() -> None:
    """Forget the compiled batch programs and the kernels lowered for the worker (``cache_clear()`` calls this)."""
    _compiled.programs.clear()
    _offload.lowered_kernels.clear()


def _unchanged(x):
    return x


def _ignored(n: int) -> None:
    pass
