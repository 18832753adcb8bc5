"""The specializer: from a call's constants to a :class:`~pejit._calls._program.Specialization`.

Plain functions of what they need, given explicitly: the parsed options
(:class:`~pejit._calls._info.PejitInfo`), the call's argument layout, and the
constants. The first specialization of a structure of the constants looks
before it folds (:mod:`pejit._calls._look`): it traces the function as
``jax.jit`` does and, where folding cannot pay, runs that program with the
constants as arguments (:func:`unfolded_program`). Otherwise :func:`specialize`
folds once per structure when it can (a *folding program*, the traced
program replayed with the constant arrays abstract, maps each new value to
new folded constants: :func:`trace_program`), and per value where the trace
needs constant values (:func:`specialize_per_value`).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from .._fold import _cost, _gc, _offload, _progress
from .._fold._folding import replay
from .._fold._primitives import folds_alike
from .._fold._stats import FoldStats, Unfolded, label
from . import _beside, _errors, _look, _persist
from ._argnums import interleave, runner_signature
from ._cache import SpecializationCache
from ._dispatch import Layout
from ._info import PejitInfo
from ._keys import dynamic_aval, is_array, structure_key
from ._program import (AsGiven, FoldingProgram, PerValue, Program, Specialization, as_traced, inlinable,
                       jit_kwargs_for, make_runner, why_per_value)
from .._residual._partial_eval import fold, share_constants, to_device
from .._fold._room import with_room
from .._fold._staging import ClosedOverTracer, specializing
from .._fold._values import Compactor, nbytes

_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten


@_gc.pausing
def specialize(
    info: PejitInfo, layout: Layout, programs: SpecializationCache, const_pos, const_kw, dyn_args, dyn_kwargs,
    persist: bool = True, beside: bool = False, rules_run: bool = True,
    retrace: Callable[[tuple, dict], Any] | None = None,
) -> Specialization:
    """Fold for these constants: with a shared program if values don't matter.

    With a persistent cache directory (see :mod:`pejit._calls._persist`), folded
    constants stored by an earlier process are read instead. With ``beside``
    (the caller can run a fold on a worker thread), a structure's first fold that
    the look runs beside the call (``Look.beside``) is not run here: the
    specialization is ``jax.jit``'s program, and ``pending`` the fold.

    ``rules_run``: JAX may run the custom rules of the programs here (it
    differentiates them itself: ``FoldOptions(derivatives=False)``, ``pe``, a
    derivative's own program). Where it never does, ``jax.jit``'s program of a
    structure folded per value because its rules close over constants
    (:attr:`~pejit._calls._program.PerValue.serves`) serves where the fold does not
    pay, and serves the first calls where the fold runs beside them.

    ``retrace``: the owner's call, for a trace of jax.jit's program for other dynamic
    types, where the constants never change and nobody can write them (the TFC form's:
    see :func:`pejit._calls._look.trace`), so that its trace is that of ``jax.jit``
    closed over them, which then serves where they are compiled in."""
    dyn_leaves, in_tree = _tree_flatten((dyn_args, dyn_kwargs))
    avals = tuple(dynamic_aval(leaf) for leaf in dyn_leaves)
    const_leaves, const_tree = _tree_flatten(([v for _, v in const_pos], [v for _, v in const_kw]))
    where = (tuple(i for i, _ in const_pos), tuple(k for k, _ in const_kw))
    root = _persist.cache_dir(info.fold_options) if persist else None
    bind = functools.partial(bind_constants, info, where, named=False)  # what the look's trace calls
    if root is not None:
        return _persist.specialize(
            root, info, where, const_leaves, const_tree, in_tree, avals,
            traces=(programs, ("persist", where, const_tree, structure_key(const_leaves), in_tree, avals,
                              _compat.axis_env_key())),
            bind=bind,
            fold=functools.partial(specialize, info, layout, programs, const_pos, const_kw, dyn_args, dyn_kwargs,
                                   persist=False, rules_run=rules_run),
            runner=functools.partial(make_runner, info, layout, in_tree=in_tree), place=functools.partial(place, info),
        )

    def per_value(reason: str | None) -> Specialization:  # a fold for these values alone
        out_trees: list = []
        vals = ([v for _, v in const_pos], [v for _, v in const_kw])
        return specialize_per_value(info, layout, bind_constants(info, where, vals, in_tree, out_trees), out_trees,
                                    in_tree, avals, reason)

    nargs = len(layout.const) + len(layout.dyn)
    arrays = [leaf for leaf in const_leaves if is_array(leaf)]

    def trace(retrace=None) -> _look.Traced | PerValue:  # as jax.jit traces it, the constant arrays abstract
        if retrace is not None and not _look.closable(arrays):  # (or closed over, where they can be)
            retrace = None
        passed = 0 if retrace is not None else len(arrays)
        return _look.trace(bind, const_leaves, const_tree, in_tree, avals,
                           jit_kwargs_for(info, layout, passed), (dyn_args, dyn_kwargs), info.name,
                           runner_signature(info.signature, passed, nargs, layout.dyn, info.fixed_names), retrace)

    # The TFC form and auto's promotions: their constants never change, so they fold
    # concretely, no folding program, where the look says the fold pays (beside the
    # first calls where it says so). Where it says XLA folds the work as it compiles
    # (compile_in: TFC's basis on a few points), jax.jit's program serves with the
    # constants compiled in, as for the call-time form, and the fold asked for is
    # what lower() and trace() show (``Specialization.shown``), folded when first
    # asked: folded first, it delayed the first call by work XLA does anyway (the
    # corpus' programs, 0.04-0.2 s). Else jax.jit's program serves too: folding work
    # that does not pay costs the first call kernels compiled for nothing (an eig a
    # Sylvester solve barely uses).
    if info.one_value:
        start = time.perf_counter()
        with _progress.Progress(info.name, False).stage("look"):
            traced = trace(retrace)
            per_values = isinstance(traced, PerValue)
            served = (traced.serves if not rules_run else None) if per_values else traced
            seen = None if served is None else _look.look(served, arrays, info.fold_options, info.jit)

        def fold_value() -> Specialization:
            if per_values:
                return per_value(None)
            return replayed_per_value(info, layout, traced, arrays, in_tree, avals)

        beside = seen is not None and seen.beside and beside
        compiled_in = seen is not None and seen.compile_in
        if not beside and not compiled_in and (seen is None or seen.pays):
            return fold_value()
        program, consts = unfolded_program(info, layout, seen, arrays, in_tree)
        program.rules_close_over_constants = per_values
        if beside:
            const_pos, const_kw, arrays = held(const_pos), held(const_kw), held(arrays)
        spec = Specialization(program, consts, time.perf_counter() - start, pending=fold_value if beside else None)
        if compiled_in:
            if not spec.compilable_in:  # passed, XLA would not fold them: fold as asked
                return fold_value()
            spec.shown = _once_asked(fold_value)
        return spec
    # the named axes too: the trace may read them (lax.axis_size), as jax.jit's keys know
    skey = (nargs, where, const_tree, structure_key(const_leaves), in_tree, avals, _compat.axis_env_key())
    program = programs.get(skey)
    if isinstance(program, _beside.Beside):
        program.wait()
        program = programs.get(skey)
        if isinstance(program, _beside.Beside):  # the fold failed: again here, where it raises
            program = None
    if program is None:
        start = time.perf_counter()
        with _progress.Progress(info.name, False).stage("look"):
            traced = trace()
            per_values = isinstance(traced, PerValue)
            # jax.jit's program of one folded per value, where it can serve: the look
            # decides whether the fold pays, and whether it runs beside the call
            if not per_values:
                served = traced
            elif rules_run:  # JAX may run the rules, closed over the first value's constants
                served = None
            else:
                served = traced.serves
            seen = None if served is None else _look.look(served, arrays, info.fold_options, info.jit)
        if seen is not None and seen.beside and beside:
            program, consts = unfolded_program(info, layout, seen, arrays, in_tree)
            const_pos, const_kw, arrays = held(const_pos), held(const_kw), held(arrays)

            def fold_beside() -> Specialization:
                if per_values:
                    return per_value(traced.reason)
                start = time.perf_counter()
                program, consts = trace_program(info, layout, seen, arrays, in_tree, avals)
                programs.put(skey, program)
                if isinstance(program, PerValue):
                    return per_value(program.reason)
                return Specialization(program, consts, time.perf_counter() - start)

            serving = Specialization(program, consts, time.perf_counter() - start, pending=fold_beside)
            # other values wait for the structure's fold, or fold their own
            programs.put(skey, PerValue(traced.reason) if per_values else _beside.Beside(serving))
            return serving
        if per_values and (seen is None or seen.pays and not seen.compile_in):
            program = PerValue(traced.reason)
        elif not seen.pays or seen.compile_in:
            program, consts = unfolded_program(info, layout, seen, arrays, in_tree,
                                               traced.reason if per_values else None)
        else:
            program, consts = trace_program(info, layout, seen, arrays, in_tree, avals)
        programs.put(skey, program)
        if not isinstance(program, PerValue):
            return Specialization(program, consts, time.perf_counter() - start)
    if isinstance(program, PerValue):
        return per_value(program.reason)
    start = time.perf_counter()
    with _progress.Progress(info.name, False).stage("fold (folding program)"):
        consts = program.folding_program(*arrays)
    share = program.folding_program.share
    if share is not None:
        shared = share.select(consts)
        if shared is None:  # other constants are equal or uniform: a residual of its own
            program, shared = shared_program(info, layout, in_tree, program, consts)
        consts = shared
    # an evaluated (not compiled) folding program gives host results: copied once, not per call
    consts = [to_device(c) for c in consts]
    return Specialization(program, consts, time.perf_counter() - start)


def _once_asked(fold: Callable[[], Specialization]) -> Callable[[], Specialization]:
    """``fold``, run once, when first asked (see ``Specialization.shown``): at top level
    and with room, as a specialization is built, whatever asks."""

    @functools.cache
    @_gc.pausing
    def folded() -> Specialization:
        with specializing():
            return with_room(fold)

    return folded


def held(constants: Any) -> Any:
    """``constants`` with their writable NumPy arrays copied: what a fold beside the calls
    reads, whatever the caller writes into them meanwhile (the fold serves the values
    of the call that started it: a call with other values selects another)."""
    leaves, tree = _tree_flatten(constants)
    if not any(isinstance(leaf, np.ndarray) and leaf.flags.writeable for leaf in leaves):
        return constants
    return _tree_unflatten(tree, [np.array(leaf) if isinstance(leaf, np.ndarray) and leaf.flags.writeable else leaf
                                  for leaf in leaves])


def bind_constants(info: PejitInfo, where, const_vals, in_tree, out_trees: list, named: bool = True) -> Callable:
    """The user's function of the flat dynamic leaves, constants bound.

    Each call appends the output's tree structure to ``out_trees``. With ``named``,
    JAX's errors while tracing it name the user's function and arguments; the look's
    trace needs no names for it, since it calls it inside a ``jax.jit`` function named
    and signed as the user's (:func:`pejit._calls._look.trace`).
    """
    values = as_jax(const_vals)
    const_pos = tuple(zip(where[0], values[0]))
    const_kw = dict(zip(where[1], values[1]))
    fun = info.fun

    def flat_fun(*leaves):
        dyn_args, dyn_kwargs = _tree_unflatten(in_tree, leaves)
        out = fun(*interleave(const_pos, dyn_args), **const_kw, **dyn_kwargs)
        out_leaves, out_tree = _tree_flatten(out)
        out_trees.append(out_tree)
        return out_leaves

    if named:  # (JAX's debug info: some 60 us of a small program's first call)
        _errors.name_after(flat_fun, fun, where, const_vals, in_tree)
    return flat_fun


def as_jax(constants: Any) -> Any:
    """``constants`` with their NumPy array leaves made ``jax.Array``s.

    ``jax.jit`` hands the function a JAX value for every array argument, so
    arithmetic among constants follows JAX's rules (bfloat16 stays
    bfloat16, the user's x64 setting holds); a NumPy array would compute
    with NumPy's. Concrete values still serve Python control flow and
    boolean masks. The cache keys are taken from the arrays as given.

    Examples:
      >>> import numpy as np
      >>> as_jax([np.ones(2, np.float64), "static"])[0].dtype  # x64 off, as in jax.jit
      dtype('float32')
    """
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v) if isinstance(v, (np.ndarray, np.generic)) else v, constants)


def trace_program(info: PejitInfo, layout: Layout, seen: _look.Look, arrays: list, in_tree, avals):
    """The folding program of a traced function (``seen.traced``): its jaxpr replayed
    under the folding trace with the constant arrays abstract, and the folded
    constants of ``arrays``.

    The first value is evaluated as one compiled program where the look's known
    work says that costs less than compiling its primitives one by one
    (:func:`pejit._fold._cost.one_program_pays`) and none of it is a kernel that
    would start on the worker as the replay records it, compiled beside the
    replay (:func:`pejit._fold._offload.worth_a_kernel`); decided before the
    replay, so that no kernel starts for a program that will not use it.

    If the replay needs a constant's value (a fold rule decides by it: a
    ``cond`` with a known index, a solve by its operator's conditioning) it
    fails, and the structure is marked value-dependent: each new value is
    traced again, concretely. So is a residual that
    :func:`~pejit._calls._program.why_per_value` rejects. The reason is kept in
    the report.
    """
    traced = seen.traced
    backend = info.fold_options.backend
    known = seen.work.folded
    compilable = all(_compat.has_lowering(e.primitive, jax.default_backend()) for e in known)
    # kernels (TFC's basis on its grid) that start on the worker while the replay
    # records them are compiled beside it: op by op then costs the trace nothing more
    kernels_early = any(_offload.worth_a_kernel(e.primitive, e.params, sum(nbytes(v.aval) for v in e.outvars))
                        for e in known)
    one_program = compilable and (backend == "compiled" or (
        backend == "auto" and not kernels_early and _cost.one_program_pays(known)))
    state: dict[str, Any] = {}
    # kernels on the constants alone (TFC's basis on its grid) start on the
    # first value while the trace records them, as in a concrete trace
    kernels = _offload.Kernels(enabled=not one_program)

    def folding_program(*array_leaves):
        def traced_fun(*dyn_leaves):
            state["traces"].append(weakref.ref(_compat.core_trace()))
            return replay(_compat.core_trace(), traced.jaxpr, [*array_leaves, *dyn_leaves])

        state["traces"] = [weakref.ref(_compat.trace_of(a)) for a in array_leaves[:1]]
        with kernels.given(array_leaves, arrays):
            residual = fold(traced_fun, avals, info.fold_options, name=info.name, abstract=True, progress=progress,
                            kernels=kernels)
        state["jaxpr"] = residual.open_jaxpr()
        state["nconsts"] = len(residual.consts)
        state["stats"] = residual.stats
        residual.stats.notes.extend(n for n in traced.notes if n not in residual.stats.notes)
        return place(info, residual.consts, jax.lax.with_sharding_constraint)

    progress = _progress.Progress(info.name, _progress.wanted(info.fold_options.progress))
    try:
        try:
            mark = _gc.collections()
            with progress.stage("trace"):
                program = FoldingProgram(jax.jit(folding_program).trace(*arrays), backend)
        except ClosedOverTracer:  # no value would help
            raise
        except Exception as e:  # a rule needed a constant's value
            first_line = (str(e).splitlines() or [""])[0]
            return PerValue(f"the trace needs constant values ({type(e).__name__}: {first_line[:120]})"), None
        reason = why_per_value(state["jaxpr"], state["traces"], mark)
        if reason is not None:
            return PerValue(reason), None
        # Uniform and equal constants are kept small as they are produced (see
        # pejit._fold._values), unless they must keep the placement asked for.
        keep = Compactor() if info.constant_shardings is None else None
        run = runner_ahead(info, layout, state["jaxpr"], state["nconsts"], traced.out_tree, in_tree, avals)
        progress.expect(len(program.traced.jaxpr.eqns))
        with progress.stage("fold"):
            consts = program.first_value(*arrays, one_program=one_program, keep=keep, tick=progress.advance,
                                         kernels=kernels)
    finally:
        progress.close()
        kernels.close()  # what the first value did not take (see Kernels.given)
    program.residual = state["jaxpr"]
    unshared = Program(state["jaxpr"], state["nconsts"], traced.out_tree, state["stats"], (), None, program)
    return shared_program(info, layout, in_tree, unshared, consts, run)


def unfolded_program(info: PejitInfo, layout: Layout, seen: _look.Look, arrays: list, in_tree,
                     per_value: str | None = None):
    """The program of a structure whose fold cannot pay (``seen``), or whose first value
    XLA folds with its constants compiled in (``seen.compile_in``): ``jax.jit``'s own,
    the constants its leading arguments, run by the ``jax.jit`` function that traced it
    (compiled at the first call, with no second trace); each value's constants are passed
    as they are (:class:`~pejit._calls._program.AsGiven`), but for a first value that is
    compiled in (:meth:`~pejit._calls._program.Specialization.compile_in`).
    ``per_value``: why each value would be traced again to fold (a
    :class:`~pejit._calls._program.PerValue` reason), which the report gives."""
    traced = seen.traced
    jaxpr, consts = _compat.open_jaxpr(traced.jaxpr)
    as_given = AsGiven(consts, seen.compile_in, folds_alike(seen.work.folded, True, seen.guarded))
    stats = FoldStats(notes=list(traced.notes))
    if per_value is not None:
        stats.notes.append(f"each new constant value would be traced and folded again ({per_value}), for too "
                           f"little: jax.jit's program serves every value")
    work = seen.work
    if seen.beside:
        stats.notes.append("the fold runs beside the first calls, which run jax.jit's program, the constants "
                           "passed, until it is ready (FoldOptions.beside)")
    elif work.folded:  # else nothing depends on the constants alone (see _errors.check_folded)
        why = ("under FoldOptions.min_gain" if _cost.fold_repays(work.saved) else
               f"too little to win back a folding program's compile within {_cost.REPAY_CALLS:,} calls")
        stats.unfolded.append(Unfolded(len(work.folded), work.saved.seconds(), work.total.seconds(), False,
                                       seen.compile_in, why))
    if work.effects:  # (a Counter's update of a generator: an ABC check, first in a process)
        stats.effects_kept.update(label(e.primitive, e.params) for e in work.effects)
    nconsts = len(consts) + len(arrays)
    if info.jit and (seen.compile_in or not traced.closed):
        run, closes_over = traced.run, (nconsts if traced.closed else len(consts))  # the look's jax.jit
    else:  # pe (the traced program, equation by equation), or the constants passed to the look's trace
        run, closes_over = make_runner(info, layout, jaxpr, nconsts, traced.out_tree, in_tree), 0
    program = Program(jaxpr, nconsts, traced.out_tree, stats, (), run, as_given, closes_over)
    program.rules_close_over_constants = per_value is not None
    return program, place(info, as_given(*arrays), jax.device_put)


def runner_ahead(info: PejitInfo, layout: Layout, jaxpr, nconsts: int, out_tree, in_tree, avals) -> Callable | None:
    """The runner of the residual as traced, its compile started on the worker.

    The residual is known once the folding program is traced, and its compile
    (tens of milliseconds even for a single ``add``) need not wait for the first
    value, whose evaluation leaves the second core idle. The runner serves if
    the first value's constants are passed as they are (no equal or uniform
    ones, see :func:`shared_program`); else it was a compile on the spare core.
    Not where the constants will be compiled into the first value's program
    (:meth:`~pejit._calls._program.Specialization.compile_in`): that program
    serves, and a compile of this one would only compete with it for the cores.
    """
    spare = _offload.spare()
    if spare is None or not info.jit or info.jit_kwargs or info.constant_shardings is not None:
        return None
    if info.fold_options.literals and inlinable([v.aval for v in jaxpr.invars[:nconsts]]):
        return None
    run = make_runner(info, layout, jaxpr, nconsts, out_tree, in_tree)
    try:
        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars[:nconsts]]
        dyn_args, dyn_kwargs = _tree_unflatten(
            in_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals])
    except Exception:  # noqa: BLE001 - a constant JAX cannot describe so (a token): compiled when called
        return run
    spare.submit(_compile_quietly, run, specs, dyn_args, dyn_kwargs)  # lowered there too: both beside the fold
    return run


def _compile_quietly(run, specs, dyn_args, dyn_kwargs) -> None:
    """Lower and compile ``run`` for these arguments (JAX caches the executable); a failure is
    left to the call, which compiles it again and raises there."""
    try:
        run.lower(*specs, *dyn_args, **dyn_kwargs).compile()
    except Exception:  # noqa: BLE001
        pass


def shared_program(
    info: PejitInfo, layout: Layout, in_tree, program: Program, consts: list, run: Callable | None = None,
) -> tuple[Program, list]:
    """The program for folded ``consts``, equal and uniform ones not passed.

    Which constants are equal or uniform depends on their values; the plan
    made for the first value is kept, and a value it does not hold for gets
    a residual program of its own (see :class:`~pejit._residual._partial_eval.SharePlan`).
    ``run``, a runner of the residual taking every constant (see
    :func:`runner_ahead`), serves if none is equal or uniform, or where
    passing them once would not pay for compiling the residual again
    (:func:`pejit._fold._cost.share_pays`).
    """
    folding = program.folding_program
    jaxpr = folding.residual
    plan = share_constants(jaxpr, consts) if info.fold_options.literals else None
    if plan is not None and run is not None and not _cost.share_pays(
            sum(nbytes(_compat.typeof(c)) for i, c in enumerate(consts) if i not in plan.keep),
            _cost.jaxpr_cost(jaxpr), info.fold_options.min_gain):
        plan = None
    if plan is not None:
        jaxpr, consts = plan.jaxpr, plan.select(consts)
    consts = [to_device(c) for c in consts]  # a uniform one may be a NumPy broadcast
    if folding.share is None:
        folding.share = plan
    if run is None or plan is not None:
        run = make_runner(info, layout, jaxpr, len(consts), program.out_tree, in_tree)
    return Program(jaxpr, len(consts), program.out_tree, program.stats, program.fallbacks, run, folding), consts


def replayed_per_value(info: PejitInfo, layout: Layout, traced: _look.Traced, arrays: list, in_tree,
                       avals) -> Specialization:
    """Fold the constant ``arrays`` of ``traced`` concretely, replaying its jaxpr rather than
    tracing the function's Python again under the folding trace.

    The fold sees the values, as a trace of the Python with them would (a product
    with an identity, equal zeros), and evaluates the work ``jax.jit``'s trace holds.
    A trace of the Python with the values binds each ``jnp`` function on them as a
    call of its own (``jit(multiply)``), which derivatives then transform whole:
    TFC's WaveEquation2D evaluates 1072 known equations from ``jax.jit``'s trace,
    against 1464 and 77 such calls from its Python."""
    consts = as_traced(arrays, traced.jaxpr.in_avals)
    spec = specialize_per_value(
        info, layout, lambda *leaves: replay(_compat.core_trace(), traced.jaxpr, [*consts, *leaves]),
        traced.out_tree, in_tree, avals, None)
    notes = spec.program.stats.notes
    notes.extend(n for n in traced.notes if n not in notes)
    return spec


def specialize_per_value(
    info: PejitInfo, layout: Layout, flat_fun: Callable, out_tree, in_tree, avals, reason: str | None
) -> Specialization:
    """Fold for these constant values, concretely: ``flat_fun`` is the function of the
    dynamic leaves with the constants bound (their trace, or its jaxpr replayed), and
    ``out_tree`` its output's structure (or the list the trace appends it to).

    ``reason`` says why a folding program cannot serve this structure, for
    the report; None when there is no folding program to try (the TFC form,
    whose constants never change: one concrete pass costs less than an
    abstract one plus its evaluation, see :func:`replayed_per_value`)."""
    notes = () if reason is None else (f"each new constant value is traced and folded again: {reason}",)
    progress = _progress.Progress(info.name, _progress.wanted(info.fold_options.progress))
    try:
        with progress.stage("trace and fold"):
            residual = fold(flat_fun, avals, info.fold_options, name=info.name, fallbacks=notes, progress=progress)
    finally:
        progress.close()
    out_tree = out_tree[-1] if isinstance(out_tree, list) else out_tree
    folded = residual.consts
    consts = place(info, folded, jax.device_put)
    jaxpr, nconsts = residual.open_jaxpr(), len(folded)
    run = make_runner(info, layout, jaxpr, nconsts, out_tree, in_tree)
    program = Program(jaxpr, nconsts, out_tree, residual.stats, notes, run, None)
    return Specialization(program, consts, residual.report.fold_seconds, residual if consts is folded else None)


def place(info: PejitInfo, consts: list, put: Callable) -> list:
    """Apply ``constant_shardings`` to the folded constants."""
    where = info.constant_shardings
    if where is None:
        return consts
    out = []
    for c in consts:
        s = where if isinstance(where, jax.sharding.Sharding) else where(jax.ShapeDtypeStruct(c.shape, c.dtype))
        out.append(c if s is None else put(c, s))
    return out
