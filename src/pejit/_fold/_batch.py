"""The folding back end: evaluating known work in batches.

The folding trace does not evaluate known equations when it meets them: it
records each one as a :class:`Recipe` and stages a placeholder (see
``Folder.default``). Values are *materialized* in batches, when something
needs them: Python (``bool(x)``, ``np.asarray(x)``), a fold rule (a
``cond`` index), or, at the end of the trace, the residual program, whose
constants they become. A batch is the set of recipes the requested values
depend on that have not run yet, in the order the trace recorded them.

Each batch runs on one of two back ends:

* **eager**: equation by equation with JAX's per-primitive dispatch. Every
  primitive/shape pair is compiled once and cached, so the cost per equation
  is a dispatch (tens of microseconds) plus the equation's own memory
  traffic; nothing to compile for the batch as a whole.
* **compiled**: the batch becomes one ``jax.jit`` program. XLA fuses the
  elementwise work, so intermediates are never written to memory, but the
  program must be compiled: a fixed cost plus a cost per equation. The
  steps of an unrolled loop, each feeding the next, become one compiled
  loop (:mod:`pejit._fold._compiled`).

:func:`plan_batch` splits a batch into segments and picks a back end for
each with a cost model: fusing saves, per equation, one dispatch and the
memory traffic of its intermediates (written, then read back); it costs a
compilation. Many small equations (a long chain on a small array) favour
eager evaluation; runs of cheap elementwise equations on large arrays
favour one compiled program. Primitives without a lowering always run
eagerly.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive, jaxpr_as_fun

from .. import _compat
from . import _abstract, _compiled, _cost, _device, _host, _offload, _primitives, _refold, _trim
from ._values import nbytes

@dataclasses.dataclass(frozen=True, eq=False)
class Recipe:
    """One known equation whose outputs have not been computed yet.

    ``args`` holds concrete values and the ``Var`` of other recipes' outputs.
    ``outvars`` has ``None`` for outputs that JAX's staging forwarded or
    folded itself. ``lazy`` recipes are cheap expansions that also stay in
    the residual program; the others are folds, whose outputs become
    constants. ``serial`` is its place among the recipes of its trace: a
    batch runs them in that order (see ``Folder._batch``). ``params_key``
    is ``params`` as part of a key (:func:`pejit._fold._primitives.params_key`),
    computed once: the fold, the worker's kernels and the batch's programs
    each key the recipe by it (9 us apiece for a ``jnp`` call's eleven
    parameters).
    """

    prim: Any
    args: tuple
    params: dict
    outvars: tuple
    lazy: bool = False
    serial: int = 0
    params_key: tuple = dataclasses.field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self):
        if self.params_key is None:
            object.__setattr__(self, "params_key", _primitives.params_key(self.params))

    def out_bytes(self) -> int:
        return sum(nbytes(v.aval) for v in self.outvars if v is not None)


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """How one segment of a batch of known equations was evaluated.

    ``batch`` numbers the batches of one specialization, in order.
    """

    batch: int
    backend: str
    equations: int
    out_bytes: int
    primitives: Counter
    seconds: float = 0.0  #: evaluating the segment, compiling included
    compile_seconds: float = 0.0


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
    full-size WaveEquation2D, 400 MB more). Runs of the same structure (the
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
    reads = Counter(a for r in recipes for a in r.args if _is_var(a))
    segments: list[Segment] = []
    on_host: set = set()  # values the batch computes as NumPy arrays, which a program copies in
    made: dict[int, set] = {}  # by structure: the values runs of it compute
    for (_, run), key, n in zip(runs, keys, structure):
        if key is not None:
            inside = Counter(a for r in run for a in r.args if _is_var(a))
            alike_made = made.setdefault(n, set())  # compiled with this run, if it is: not on the host
            traffic = sum(nbytes(v.aval) for r in run for v in r.outvars  # the intermediates: read in the run alone
                          if v is not None and 0 < reads[v] == inside[v] and nbytes(v.aval) > cached)
            copied = sum(_bytes(a) for a in _inputs(run) if _bytes(a) > cached and (
                (a in on_host and a not in alike_made) if _is_var(a) else type(a) is np.ndarray))
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
            if (_is_var(a) and a not in inside) or isinstance(a, (np.ndarray, jax.Array)):
                seen.setdefault(a if _is_var(a) else id(a), a)
    return list(seen.values())


def _bytes(a) -> int:
    return nbytes(a.aval) if _is_var(a) else a.nbytes


def run_batch(
    segments: Sequence[Segment], env: dict, outputs: Sequence[Any], keep: Callable[[Any], Any] | None = None,
    tick: Callable[[int], None] | None = None, timings: list[tuple[float, float]] | None = None,
    compact: Collection[Any] = (), kernels: _offload.Kernels | None = None,
    loops: _compiled.LoopsAhead | None = None,
) -> list[Any]:
    """Evaluate the planned batch and return the values of ``outputs``.

    ``env`` maps the ``Var`` of already materialized values to them.
    Intermediates are dropped after their last use, so a long chain keeps a
    few arrays alive, not all of them. An output is handed to ``keep`` as
    soon as it is produced, and what ``keep`` returns is what the batch
    holds on to (see :class:`pejit._fold._values.Compactor`); the value itself
    stays only until its last use in the batch. The values of ``compact``
    are handed to ``keep`` too, and their later uses read what it returns.
    ``tick(n)`` is told of every ``n`` equations evaluated (a progress
    bar). ``timings`` gets each segment's ``(seconds, of which compiling)``.
    ``kernels`` holds those of the fold handed out before the batch (see
    :mod:`pejit._fold._offload`); ``loops``, the chains the worker ran
    ahead (see :class:`pejit._fold._compiled.LoopsAhead`).
    """
    env = dict(env)
    uses = Counter(a for seg in segments for r in seg.recipes for a in r.args if _is_var(a))
    wanted = set(outputs)
    results = {v: env[v] for v in outputs if v in env}
    keep = keep or (lambda x: x)
    tick = tick or (lambda n: None)

    def define(pairs):
        for v, x in pairs:
            kept = keep(x) if v in wanted or v in compact else x
            if v in wanted:
                results[v] = kept
            if uses[v]:
                env[v] = kept if v in compact else x

    # kernels run on a worker beside the host arithmetic (see pejit._fold._offload)
    if kernels is None:
        kernels = _offload.Kernels()
    eager = [r for seg in segments if seg.backend == "eager" for r in seg.recipes]
    ahead = _offload.Ahead(kernels, eager, env) if kernels.enabled else None
    refolds = _refold.Refolds([r for seg in segments for r in seg.recipes], env, uses, kernels,
                              _offload.spare() if kernels.enabled else None, outputs=wanted)
    position = -1  # in eager, for the kernels handed out ahead
    step = -1  # in the batch, for the values computed again
    trimmer = _trim.Trimmer() if refolds.trims else None  # what it frees goes back as it runs
    with _compat.evaluating():
        for seg in segments:
            start, compiling = time.perf_counter(), [0.0]
            whole = {"compiled": functools.partial(_compiled.run, compiling=compiling), "program": _stage,
                     "loop": functools.partial(_compiled.run_chain, chain=seg.chain, compiling=compiling,
                                               ahead=loops)}.get(seg.backend)
            if whole is not None:  # the segment at once: compiled (a loop too), or staged as one equation
                for r in seg.recipes:
                    refolds.restore(r, env)
                produced = [v for r in seg.recipes for v in r.outvars if v is not None]
                inside = Counter(a for r in seg.recipes for a in r.args if _is_var(a))
                out = [v for v in produced if v in wanted or uses[v] > inside[v]]
                define(zip(out, whole(seg.recipes, env, out)))
                _release(env, uses, [a for r in seg.recipes for a in r.args])
                for r in seg.recipes:
                    step += 1
                    refolds.release(step, r, env)
                refolds.prefetch(step, env)
                tick(len(seg.recipes))
                if trimmer is not None:
                    trimmer.tick()
            else:
                for r in seg.recipes:
                    position += 1
                    step += 1
                    if ahead is not None:
                        ahead.submit(position)
                    refolds.restore(r, env)
                    args = [env[a] if _is_var(a) else a for a in r.args]
                    outs = kernels.take(r, args)
                    if outs is None:
                        outs = _refold.evaluate(r, args)
                    del args
                    define(_defined(r.outvars, outs if r.prim.multiple_results else [outs]))
                    del outs
                    _release(env, uses, r.args)
                    refolds.release(step, r, env)
                    refolds.prefetch(step, env)
                    tick(1)
                    if trimmer is not None:
                        trimmer.tick()
            if timings is not None:
                timings.append((time.perf_counter() - start, compiling[0]))
    return [results[v] for v in outputs]


@_host.remembering()
def evaluate_jaxpr(
    closed_jaxpr, args: Sequence[Any], backend: str = "auto", keep: Callable[[Any], Any] | None = None,
    tick: Callable[[int], None] | None = None, segments: list[BatchInfo] | None = None,
    kernels: _offload.Kernels | None = None,
) -> list[Any]:
    """Evaluate ``closed_jaxpr`` on ``args`` as one batch (see :func:`run_batch`).

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
    keep = keep or (lambda x: x)
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
    outputs = [v for v in jaxpr.outvars if _is_var(v)]
    # what the trace's batches kept, held as the folding trace holds it
    # (uniform values as broadcasts, equal ones once): the program's later
    # equations (an affine collapse's matrices) read them
    kept = {v for e in jaxpr.eqns if e.primitive is batch_p for v in e.outvars} if keep is not None else ()
    plan = plan_batch(recipes, backend, jax.default_backend(), outputs)
    timings: list[tuple[float, float]] = []
    values = iter(run_batch(plan, env, outputs, keep, tick, timings, compact=kept, kernels=kernels))
    if segments is not None:
        segments.extend(BatchInfo(0, seg.backend, len(seg.recipes), sum(r.out_bytes() for r in seg.recipes),
                                  Counter(r.prim.name for r in seg.recipes), seconds, compiling)
                        for seg, (seconds, compiling) in zip(plan, timings))
    return [next(values) if _is_var(v) else v.val for v in jaxpr.outvars]


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
        args = (rename.get(a, a) if _is_var(a) else a for a in e.invars)
        return Recipe(e.primitive, tuple(a if _is_var(a) else a.val for a in args), e.params,
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
    evaluated by :func:`evaluate_jaxpr` with ``backend``, compiled as its body."""
    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_impl(lambda *args, jaxpr: evaluate_jaxpr(jaxpr, args, backend))
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
_cost.register_cost_rule(known_part_p, batch_p)(_cost.call_cost)


def _stage(recipes, env, outputs) -> list[Any]:
    """Stage ``recipes`` into the program of abstract constants they read, as one equation.

    The equation is a ``folded_batch`` whose body is built from the recipes
    directly: their outputs' avals are known, so nothing is abstractly
    evaluated again, where binding each recipe on the outer trace would (a
    tenth of a millisecond each: TFC's PDE stages thousands). Other values
    become the equation's inputs, scalars literals; as in :func:`run_batch`,
    a recipe reads what an earlier recipe of the batch defined, else what
    ``env`` holds (a recipe may compute again a value an earlier batch kept).
    """
    local: set[Any] = set()
    inputs: list[Any] = []
    invars: dict[Any, Any] = {}  # Var, or id of a value, -> the body's input

    def atom(a):
        if _is_var(a) and a in local:
            return a
        value = env[a] if _is_var(a) else a
        if not _is_var(a) and np.ndim(value) == 0 and not isinstance(value, (jax.Array, _compat.Tracer)):
            return _compat.literal(value, _compat.typeof(value))
        key = a if _is_var(a) else id(value)
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
    return _abstract.evaluate(batch_p, inputs, {"jaxpr": body}, outer)


def reads_abstract(recipes: Sequence[Recipe], env: dict) -> bool:
    """Whether the batch reads abstract constants (see :mod:`pejit._fold._abstract`).

    Then the batch is staged into the outer program, which is compiled as a
    whole (the ``"program"`` back end of :func:`plan_batch`).
    """
    return _abstract.any_abstract(env.get(a) if _is_var(a) else a for r in recipes for a in r.args)


def _release(env, uses, args):
    for a in args:
        if _is_var(a):
            uses[a] -= 1
            if uses[a] == 0:
                env.pop(a, None)


def clear_programs() -> None:
    """Forget the compiled batch programs and kernels (``cache_clear()`` calls this)."""
    _offload.clear_programs()
    _compiled.clear_programs()


def _defined(outvars, values):
    return [(v, x) for v, x in zip(outvars, values) if v is not None]


def _is_var(a) -> bool:
    return isinstance(a, _compat.Var)
