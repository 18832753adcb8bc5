"""The folding interpreter: per primitive application, evaluate now or stage.

pejit runs the user's function (or replays a jaxpr) under a
:class:`~pejit._fold._staging.StagingTrace` whose policy is a :class:`Folder`. The
constant arguments are ordinary concrete arrays, so Python control flow and
data-dependent shapes on them work; every primitive whose inputs are all
known is *folded* (evaluated once), every other one is *staged* into the
residual jaxpr. Folded values that the residual program needs become its
constants.

The interpreter is one loop with a table of rules, as in JAX's autodidax:
the trace hands each primitive application to :meth:`Folder.__call__`,
which looks the primitive up in ``fold_rules`` (:mod:`pejit._fold._fold_rules`,
registered by :mod:`pejit._residual.rules`) and otherwise applies the
default rule, :meth:`Folder.default`. A rule handles primitives that carry
sub-jaxprs (``cond``, ``jit``, loops) by replaying them under the same trace,
so known work inside them folds too. New behaviour is a new rule.

Three kinds of known values exist while tracing:

* concrete arrays and Python scalars (folded values);
* *deferred* values: known work recorded but not evaluated yet, computed in
  batches when something asks (:mod:`pejit._fold._store`), among them *lazy*
  ones: cheap expansions of known values (``broadcast_in_dim``, ``iota``,
  elementwise ops on expansions, ...) that would make the folded constants
  much larger than the inputs they come from. They are staged, so the
  residual program recomputes them;
* tracers (unknown: they depend on dynamic arguments).

What the folder composes: the :class:`~pejit._fold._store.Store` of deferred
values, the :class:`~pejit._fold._memo.Memo` of equal folds, the
:class:`~pejit._fold._schedule.Schedule` of the worker's kernels, and a
:class:`~pejit._fold._stats.Tally` of what it counted as folded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Primitive

from .. import _compat
from . import _abstract, _batch, _cost, _host, _offload, _progress
from ._fold_rules import deferred_ok, fold_rules
from ._memo import Memo
from ._multihost import check_fetchable
from ._options import FoldOptions
from ._primitives import CALLBACKS, ELEMENTWISE, EXPANSIONS
from ._recipe import Recipe
from ._schedule import Schedule
from ._staging import known_value, policy_of
from ._stats import FoldStats, Tally, Unfolded, label
from ._store import Store
from ._values import nbytes


class NeedsValue(Exception):
    """A fold rule needs the value of an abstract constant (see :meth:`Folder.is_known`).

    Raised only while a value-independent folding program is traced: the
    structure then depends on the constants' values, which are traced again
    for each value, concretely.
    """


class Folder:
    """The folding policy of one trace (a :class:`~pejit._fold._policy.FoldPolicy`).

    Called by :class:`~pejit._fold._staging.StagingTrace` for every primitive
    application; returns the outputs, or ``NotImplemented`` to stage. Fold
    rules ask it what is known (:meth:`is_known`, :meth:`is_staged`,
    :meth:`is_lazy`), for values (:meth:`materialize`), for a folder of a
    nested trace (:meth:`child`), and read :attr:`options` and count in
    :attr:`stats`.

    ``kernels``: a folding program's, which knows its first value (see
    :class:`~pejit._fold._schedule.Schedule`); ``early_kernels`` and ``warm``
    too. ``stats``: shared with the folder of the trace this one is nested in.
    """

    #: Whether the work traced may never run (a branch, a while loop's body): its
    #: callbacks are not folded (see :data:`CALLBACKS`).
    speculative: bool = False
    #: Whether this folder traces a sub-program (see :meth:`child`), which the
    #: passes after the trace (the affine collapse) do not enter.
    nested: bool = False
    #: How often per call the traced program runs (a ``scan``'s body: its
    #: length), as :meth:`finalize` weighs what folding its work saves.
    trips: int = 1

    def __init__(self, options: FoldOptions = FoldOptions(), progress: _progress.Progress | None = None,
                 early_kernels: bool = True, warm: bool = True, kernels: _offload.Kernels | None = None,
                 stats: FoldStats | None = None):
        self.options = options
        self.progress = progress or _progress.Progress("fold", False)
        self.stats = FoldStats() if stats is None else stats
        self.tally = Tally(self.stats)
        self.schedule = Schedule(options.backend, early_kernels, warm, kernels)
        self.store = Store(self.stats, self.progress, options.backend, _batch.run_batch, self.schedule)
        self.memo = Memo(self.store.var)
        self._puts: dict[tuple, Any] = {}  # tiny values computed on the spot (see _host.to_jax_once)

    def child(self, speculative: bool = False, trips: int = 1) -> Folder:
        """A folder for a nested trace (a loop body, a branch): same options, same stats."""
        # its batches may not run: no kernel starts early
        child = Folder(self.options, self.progress, early_kernels=False, warm=False, stats=self.stats)
        child.speculative = self.speculative or speculative
        child.nested = True
        child.trips = trips
        return child

    # -- the interpreter ----------------------------------------------------------
    def __call__(self, trace, prim, args, params):
        args = [known_value(trace, a) for a in args]
        self.store.read(args)
        rule = fold_rules.get(prim)
        if rule is not None:
            if prim not in deferred_ok:
                args = [a if self.is_lazy(a) else self.materialize(a) for a in args]
            out = rule(self, trace, prim, args, params)
            if out is not NotImplemented:
                return out
        return self.default(trace, prim, args, params)

    def default(self, trace, prim, args, params):
        """The default rule: fold ``prim`` if all inputs are known and it has no effects.

        Folding is deferred: the outputs are known tracers whose values
        :meth:`materialize` computes. Scalars are computed on the spot.
        """
        if not all(self.is_known(a) for a in args):
            self.stats.staged[prim.name] += 1
            return NotImplemented
        avals = [_compat.typeof(a) for a in args]
        try:
            out_avals, effects = _compat.abstract_eval(prim, avals, params)
        except Exception as e:
            return evaluate_now(self, prim, args, params, e)
        out_avals = out_avals if prim.multiple_results else [out_avals]
        if effects or (self.speculative and prim.name in CALLBACKS):
            self.stats.effects_kept[label(prim, params)] += 1
            return NotImplemented
        if self.options.rematerialize and self._stays_lazy(prim, args, avals, out_avals):
            return self.stage_lazy(trace, prim, args, params)
        self.tally.count([label(prim, params)], _cost.eqn_flops(_cost.eqn_of(prim, avals, out_avals, params)))
        if _cost.on_the_spot(sum(map(nbytes, out_avals))) and not any(self.store.var(a) is not None for a in args):
            # Scalars are evaluated on the spot: Python often asks for them,
            # and a batch of one costs more than the dispatch. The user's
            # code holds them, so they are JAX's arrays, whoever computes them
            # (and weakly typed ones stay JAX's: NumPy has no weak types).
            host = not _abstract.any_abstract(args) and not any(getattr(a, "weak_type", False) for a in out_avals)
            out = _host.on_host(prim, args, params) if host else None
            if out is None:
                return _abstract.bind_known(prim, args, params)
            if prim.multiple_results:
                return [_host.to_jax_once(o, self._puts) for o in out]
            return _host.to_jax_once(out, self._puts)
        return self._record(trace, prim, args, params, lazy=False)

    def fold_part(self, trace, closed, args) -> list:
        """Fold ``closed``, equations of a call on known ``args`` alone, as one recipe.

        What :meth:`default` would do for each of them, at the cost of one
        staged equation (see ``pejit._residual.rules.calls.fold_jit``).
        """
        self.tally.count([label(e.primitive, e.params) for e in closed.jaxpr.eqns], _cost.jaxpr_flops(closed.jaxpr))
        return self._record(trace, _batch.known_part_p, args, {"jaxpr": closed}, lazy=False)

    def stage_lazy(self, trace, prim, args, params):
        """Stage ``prim`` on known inputs, remembering how to materialize it."""
        return self._record(trace, prim, args, params, lazy=True)

    def _record(self, trace, prim, args, params, *, lazy: bool):
        """Defer ``prim`` on known ``args``: the outputs of an equal fold recorded
        before, else new deferred values (see :mod:`pejit._fold._store`)."""
        concrete = args
        if not lazy:
            concrete = [self.memo.uniform(a) for a in args]
            if not any(isinstance(a, _compat.Tracer) for a in concrete):
                args = concrete
        key = self.memo.key(prim, args, params)
        outs = self.memo.get(key)
        if outs is not None:
            return outs
        outs, recipe = self.store.record(trace, prim, args, params, lazy=lazy,
                                         params_key=None if key is None else key.params)
        if recipe is not None and not lazy:
            self.schedule.recorded(recipe, [self.store.var(a) or a for a in concrete])
        self.memo.remember(key, outs, args, recipe)
        return outs

    def call_inputs(self, trace, args) -> list:
        """Hook for custom_jvp/custom_vjp calls: concrete inputs when all are known.

        JAX then folds the whole call eagerly, as it would on constants.
        """
        known = [known_value(trace, a) for a in args]
        if all(self.is_known(a) for a in known):
            return [self.materialize(a) for a in known]
        return list(args)

    # -- known values ---------------------------------------------------------------
    def is_known(self, x) -> bool:
        """Whether ``x`` is known: deferred by this folder, or not staged by it.

        What this folder did not stage is concrete, or an abstract constant
        (a tracer of an outer trace, see :mod:`pejit._fold._abstract`).
        """
        return not self.is_staged(x) or self.store.var(x) is not None

    def is_staged(self, x) -> bool:
        """Whether ``x`` is a tracer of this folder's trace (unknown, or known but deferred).

        Everything else is a value: concrete, or an abstract constant (a
        tracer of an outer trace, see :meth:`is_known`). Rules decide what is
        known by this, never by ``isinstance(x, Tracer)``, so that a folding
        program's trace takes the decisions the concrete trace would take.
        """
        return policy_of(x) is self

    def is_abstract(self, x) -> bool:
        """Whether ``x`` is an abstract constant: known, but without a value yet."""
        return isinstance(x, _compat.Tracer) and not self.is_staged(x)

    def is_lazy(self, x) -> bool:
        """Whether ``x`` is a cheap expansion that stays in the residual program."""
        return self.store.is_lazy(x)

    def expansion(self, x, prim: Primitive) -> tuple[list[Any], dict] | None:
        """``(inputs, params)`` of ``x`` if it is a lazy expansion by ``prim``, its inputs materialized; else None.

        For rules that use an expansion's source instead of the expansion
        (a contraction against ``broadcast(C)`` contracts against ``C``).
        """
        return self.store.expansion(x, prim)

    def materialize(self, x):
        """The concrete value of a known ``x``."""
        return self.store.value(x)

    def concrete_value(self, tracer):
        """Hook for :class:`~pejit._fold._staging.KnowableTracer`: Python asks."""
        return concrete_value(self, tracer)

    def numpy_value(self, tracer):
        """Hook for :class:`~pejit._fold._staging.KnowableTracer`: NumPy asks for the whole array."""
        return numpy_value(self, tracer)

    # -- cheap expansions -----------------------------------------------------------
    def _stays_lazy(self, prim, args, avals, out_avals) -> bool:
        if prim in ELEMENTWISE:
            return any(self.is_lazy(a) for a in args)
        if prim not in EXPANSIONS:
            return False
        return any(self.is_lazy(a) for a in args) or self.expands(prim, avals, out_avals)

    def expands(self, prim, avals, out_avals) -> bool:
        """Whether ``prim`` on known values that are not lazy is an expansion that stays lazy."""
        if not self.options.rematerialize or prim not in EXPANSIONS:
            return False
        opts = self.options
        return _cost.stays_lazy(sum(map(nbytes, avals)), sum(map(nbytes, out_avals)), opts.expansion_ratio,
                                opts.expansion_min_bytes)

    # -- the end of the trace ---------------------------------------------------------
    def finalize(self, jaxpr, consts: list) -> tuple[Any, list]:
        """Turn the known values the residual ``jaxpr`` uses into constants.

        ``jaxpr`` is open: its leading inputs are ``consts``. Equations
        recorded as folds are dropped; those of their outputs that live
        equations (or the outputs) use become new constant inputs (after
        ``consts``), materialized in one batch. Effectful equations stay,
        and so do lazy expansions whose residual consumers all fuse them
        (see ``FUSES_OPERANDS``); an expansion that a matrix product, a
        custom call or a loop reads is stored after all. Where that does not
        pay (:meth:`folding_pays`), the program keeps the work, as ``jax.jit``'s
        does, but for values Python asked for: those are computed.
        """
        store = self.store
        kept, needed = store.split(jaxpr, self._stored)
        todo = store.pending(needed)
        lowerable = all(_compat.has_lowering(r.prim, jax.default_backend()) for r in todo)  # else it must fold
        if todo and lowerable and not self.folding_pays(todo, kept):
            kept, needed = store.split(jaxpr, lambda recipe, _: store.was_computed(recipe))
        self.memo.clear()  # the trace is over: nothing is folded again
        values = store.values(needed, final=True)
        self.schedule.close()
        n = len(consts)
        invars = [*jaxpr.invars[:n], *needed, *jaxpr.invars[n:]]
        if store.abstract():
            # Abstract constants' work is staged in the folding program's
            # trace: useless once it ends, and it must not keep that trace
            # alive (rule thunks of custom calls keep this folder alive).
            store.clear()
        return _compat.with_invars(jaxpr.replace(eqns=kept), invars), [*consts, *values]

    def _stored(self, recipe: Recipe, unfused: bool) -> bool:
        """Whether ``finalize`` stores a recipe's live outputs (``unfused``: a consumer cannot fuse them)."""
        if recipe.lazy and unfused:  # an expansion stored after all: see FUSES_OPERANDS
            self.tally.count([label(recipe.prim, recipe.params)], 0.0)
        return not recipe.lazy or unfused

    def folding_pays(self, todo: Sequence[Recipe], kept: Sequence[Any]) -> bool:
        """Whether evaluating the recipes ``todo`` pays (:func:`pejit._fold._cost.fold_pays`)
        in the program of ``todo`` and the ``kept`` equations. In a loop's body
        (:attr:`trips`) folding saves what XLA would not move out of the loop itself
        (library calls) on every trip, the rest once. If not, the stats take the
        fold's count back and record why (``FoldStats.unfolded``)."""
        saved = _cost.program_cost(
            _cost.Eqn(r.prim, [_var_of(a) for a in r.args], [v for v in r.outvars if v is not None], r.params)
            for r in todo).invariant(self.trips)
        rest = _cost.program_cost(kept) * self.trips
        if _cost.fold_pays(saved, saved + rest, self.options.min_gain):
            return True
        self.tally.take_back(Unfolded(len(todo), saved.seconds(), (saved + rest).seconds(), self.nested))
        return False


def evaluate_now(policy, prim, args, params, error: Exception):
    """``prim`` evaluated at once on known ``args``, its abstract evaluation having failed.

    Some primitives only work on concrete values (TFC's Python basis
    backend registers an abstract-eval rule that raises); like TFC's
    ``pe``, pejit then runs their ``impl`` on the known inputs and takes
    the output types from the result. Abstract constants (a folding
    program being traced) have no values: the error stands, and the
    caller falls back to folding each value concretely. ``policy`` gives
    the values (``materialize``) and counts in its ``stats``.
    """
    values = [policy.materialize(a) for a in args]
    if any(isinstance(v, _compat.Tracer) for v in values):
        raise error
    policy.stats.eager_evaluations[label(prim, params)] += 1
    policy.stats.folded[label(prim, params)] += 1
    return _compat.bind_outside(prim, values, params)


def concrete_value(policy, tracer):
    """The value Python asks of ``tracer`` from ``policy`` (``is_known``, ``materialize``):
    None where it is unknown, or an abstract constant, which has no value yet."""
    if not policy.is_known(tracer):
        return None
    value = policy.materialize(tracer)
    return None if _abstract.is_abstract(value) else value


def numpy_value(policy, tracer):
    """The whole array NumPy asks of ``tracer`` from ``policy`` (see :func:`concrete_value`)."""
    value = concrete_value(policy, tracer)
    check_fetchable(value)  # sharded across processes: name the user's line
    return value


def _var_of(x):
    """A recipe's input as an equation's: its ``Var``, or a variable of a value's type."""
    return x if isinstance(x, _compat.Var) else _cost.Typed(_compat.typeof(x))


def replay(trace, closed_jaxpr, args: Sequence[Any]) -> list[Any]:
    """Evaluate ``closed_jaxpr`` on ``args`` under ``trace`` (folding as we go)."""
    with _compat.set_current_trace(trace):
        return _compat.eval_jaxpr(closed_jaxpr.jaxpr, closed_jaxpr.consts, *args)
