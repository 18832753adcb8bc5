"""The folding trace: per primitive application, evaluate now or stage.

pejit runs the user's function (or replays a jaxpr) under a
:class:`~pejit._fold._staging.StagingTrace` whose policy is a :class:`Folder`. The
constant arguments are ordinary concrete arrays, so Python control flow and
data-dependent shapes on them work; every primitive whose inputs are all
known is *folded* (evaluated once, now), every other one is *staged* into the
residual jaxpr. Folded values that the residual program needs become its
constants.

The decision is one loop with a table of rules (``fold_rules``, in
:mod:`pejit._fold._fold_rules`) keyed by primitive, in the style of JAX's
autodidax: a rule handles primitives that carry sub-jaxprs (``cond``,
``jit``, loops) by replaying them under the same trace, so known work inside
them folds too. New behaviour is a new rule.

Three kinds of known values exist while tracing:

* concrete arrays and Python scalars (folded values);
* *lazy* values: cheap expansions of known values (``broadcast_in_dim``,
  ``iota``, elementwise ops on expansions, ...) that would make the folded
  constants much larger than the inputs they come from. They are staged, so
  the residual program recomputes them, and remember how to materialize
  themselves if an expensive operation, or Python itself, asks for their
  value;
* tracers (unknown: they depend on dynamic arguments).
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.extend.core import primitives as P

from .. import _compat
from . import _abstract, _batch, _compiled, _cost, _host, _offload, _plan, _progress, _values
from ._fold_rules import deferred_ok, fold_rules
from ._multihost import check_fetchable
from ._options import FoldOptions
from ._primitives import CALLBACKS, ELEMENTWISE, EXPANSIONS, FUSES_OPERANDS, params_key
from ._staging import policy_of
from ._recipe import Recipe
from ._stats import FoldStats, Unfolded, label
from ._values import nbytes


class NeedsValue(Exception):
    """A fold rule needs the value of an abstract constant (see :meth:`Folder.is_known`).

    Raised only while a value-independent folding program is traced: the
    structure then depends on the constants' values, which are traced again
    for each value, concretely.
    """


class Folder:
    """The folding policy of one trace (a :class:`~pejit._fold._policy.FoldPolicy`), and its bookkeeping.

    Called by :class:`~pejit._fold._staging.StagingTrace` for every primitive
    application; returns the outputs, or ``NotImplemented`` to stage.

    Known work is *deferred*: each known equation is staged as a placeholder
    and recorded as a recipe; :mod:`pejit._fold._batch` evaluates recipes in
    batches when their values are needed (by Python, by a rule through
    :meth:`materialize`, or by the residual program in :meth:`finalize`),
    choosing per batch between op-by-op evaluation and one compiled program.
    Dead known work is never evaluated.
    """

    #: Whether :meth:`finalize` stores lazy expansions that a non-fusible
    #: equation reads (see :data:`FUSES_OPERANDS`).
    stores_unfused: bool = True

    def __init__(self, options: FoldOptions = FoldOptions(), progress: _progress.Progress | None = None,
                 early_kernels: bool = True, warm: bool = True, kernels: _offload.Kernels | None = None):
        self.options = options
        self.progress = progress or _progress.Progress("fold", False)
        self.stats = FoldStats()
        # what this folder (not its children) counted as folded into ``stats``,
        # taken back where the fold does not pay (see finalize)
        self._counted: Counter = Counter()
        self._counted_flops = 0.0
        # output Var of a staged known equation -> how to compute it
        self._recipes: dict[Any, Recipe] = {}
        self._materialized: dict[Any, Any] = {}
        # how often each recipe output was an input to something: values used
        # outside the batch that computes them are kept, not recomputed
        self._uses: Counter = Counter()
        # what the batches hold on to: uniform values as a broadcast of one
        # element, equal ones once (see pejit._fold._values)
        self._keep = _values.Compactor()
        # folds already recorded, by primitive, parameters and inputs: the
        # same known work met again (TFC's derivatives evaluate each basis
        # function's derivative several times) is folded once, as XLA's
        # common-subexpression elimination does under jax.jit
        self._folds: dict[Any, tuple[Any, tuple]] = {}
        # keys of fold inputs by content where that is cheap (see
        # _values.value_key): id -> (key, the value, kept alive for its id);
        # and recipe outputs known to be uniform (a broadcast of a scalar)
        self._value_keys: dict[int, tuple[Any, Any]] = {}
        self._puts: dict[tuple, Any] = {}  # tiny values computed on the spot (see _host.to_jax_once)
        self._uniform_vars: dict[Any, tuple] = {}
        # kernels on concrete inputs start on a worker as they are recorded
        # (see pejit._fold._offload), where eager batches take them; given
        # ``kernels`` (a folding program's, knowing its first value) go on
        # after the trace, and their owner closes them
        self._own_kernels = kernels is None
        self._kernels = _offload.Kernels() if kernels is None else kernels
        self._early = (early_kernels or kernels is not None) and options.backend in ("auto", "eager")
        self._warm = warm and options.backend in ("auto", "eager")
        # an unrolled loop's compiled loop, compiled as the trace records it
        ahead = early_kernels and self._early and self._kernels.enabled and options.backend == "auto"
        self._loops = (_compiled.LoopsAhead(_offload.compiled_ahead, _plan.compiled_alike, _offload.submit)
                       if ahead else None)

    #: Whether the work traced may never run (a branch, a while loop's body): its
    #: callbacks are not folded (see :data:`CALLBACKS`).
    speculative: bool = False
    #: Whether this folder traces a sub-program (see :meth:`child`), which the
    #: passes after the trace (the affine collapse) do not enter.
    nested: bool = False
    #: How often per call the traced program runs (a ``scan``'s body: its
    #: length), as :meth:`finalize` weighs what folding its work saves.
    trips: int = 1

    def child(self, speculative: bool = False, trips: int = 1) -> Folder:
        """A folder for a nested trace (a loop body, a branch): same options, same stats."""
        child = Folder(self.options, self.progress, early_kernels=False, warm=False)  # its batches may not run
        child.stats = self.stats
        child.speculative = self.speculative or speculative
        child.nested = True
        child.trips = trips
        return child

    # -- the policy -------------------------------------------------------
    def __call__(self, trace, prim, args, params):
        args = [self._known_value(trace, a) for a in args]
        for a in args:
            if self._var(a) is not None:
                self._uses[a.val] += 1
        rule = fold_rules.get(prim)
        if rule is not None:
            if prim not in deferred_ok:
                args = [a if self.is_lazy(a) else self.materialize(a) for a in args]
            out = rule(self, trace, prim, args, params)
            if out is not NotImplemented:
                return out
        return self.default(trace, prim, args, params)

    def default(self, trace, prim, args, params):
        """Fold ``prim`` if all inputs are known and it has no effects.

        Folding is deferred (see the class docstring): the outputs are
        known tracers whose values :meth:`materialize` computes.
        """
        if not all(self.is_known(a) for a in args):
            self.stats.staged[prim.name] += 1
            return NotImplemented
        avals = [_compat.typeof(a) for a in args]
        try:
            out_avals, effects = _compat.abstract_eval(prim, avals, params)
        except Exception as e:
            return self._evaluate_now(prim, args, params, e)
        out_avals = out_avals if prim.multiple_results else [out_avals]
        if effects or (self.speculative and prim.name in CALLBACKS):
            self.stats.effects_kept[label(prim, params)] += 1
            return NotImplemented
        if self.options.rematerialize and self._stays_lazy(prim, args, avals, out_avals):
            return self.stage_lazy(trace, prim, args, params)
        self._count([label(prim, params)], _cost.eqn_flops(_cost.eqn_of(prim, avals, out_avals, params)))
        if _cost.on_the_spot(sum(map(nbytes, out_avals))) and not any(self._var(a) is not None for a in args):
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
        self._count([label(e.primitive, e.params) for e in closed.jaxpr.eqns], _cost.jaxpr_flops(closed.jaxpr))
        return self._record(trace, _batch.known_part_p, args, {"jaxpr": closed}, lazy=False)

    def _count(self, labels: list[str], flops: float) -> None:
        """Count folds into the stats, and as this folder's (see :meth:`finalize`)."""
        for name in labels:
            self.stats.folded[name] += 1
            self._counted[name] += 1
        self.stats.flops += flops
        self._counted_flops += flops

    def _evaluate_now(self, prim, args, params, error: Exception):
        """Evaluate ``prim`` at once, its abstract evaluation having failed.

        Some primitives only work on concrete values (TFC's Python basis
        backend registers an abstract-eval rule that raises); like TFC's
        ``pe``, pejit then runs their ``impl`` on the known inputs and takes
        the output types from the result. Abstract constants (a folding
        program being traced) have no values: the error stands, and the
        caller falls back to folding each value concretely.
        """
        values = [self.materialize(a) for a in args]
        if any(isinstance(v, _compat.Tracer) for v in values):
            raise error
        self.stats.eager_evaluations[label(prim, params)] += 1
        self.stats.folded[label(prim, params)] += 1
        return _compat.bind_outside(prim, values, params)

    def call_inputs(self, trace, args) -> list:
        """Hook for custom_jvp/custom_vjp calls: concrete inputs when all are known.

        JAX then folds the whole call eagerly, as it would on constants.
        """
        known = [self._known_value(trace, a) for a in args]
        if all(self.is_known(a) for a in known):
            return [self.materialize(a) for a in known]
        return list(args)

    # -- known values -----------------------------------------------------
    def is_known(self, x) -> bool:
        """Whether ``x`` is known: a recipe of this folder, or not staged by it.

        What this folder did not stage is concrete, or an abstract constant
        (a tracer of an outer trace, see :mod:`pejit._fold._abstract`).
        """
        return not self.is_staged(x) or self._var(x) is not None

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
        var = self._var(x)
        return var is not None and self._recipes[var].lazy

    def expansion(self, x, prim: Primitive) -> tuple[list[Any], dict] | None:
        """``(inputs, params)`` of ``x`` if it is a lazy expansion by ``prim``, its inputs materialized; else None.

        For rules that use an expansion's source instead of the expansion
        (a contraction against ``broadcast(C)`` contracts against ``C``).
        """
        if not self.is_lazy(x) or self._recipes[self._var(x)].prim is not prim:
            return None
        recipe = self._recipes[self._var(x)]
        inputs = [self._materialize([a])[0] if isinstance(a, _compat.Var) else a for a in recipe.args]
        return inputs, recipe.params

    def materialize(self, x):
        """The concrete value of a known ``x``."""
        var = self._var(x)
        if var is None:
            return x
        return self._materialize([var])[0]

    def concrete_value(self, tracer):
        """Hook for :class:`~pejit._fold._staging.KnowableTracer`: Python asks."""
        if not self.is_known(tracer):
            return None
        value = self.materialize(tracer)
        # An abstract constant has no value yet.
        return None if _abstract.is_abstract(value) else value

    def numpy_value(self, tracer):
        """Hook for :class:`~pejit._fold._staging.KnowableTracer`: NumPy asks for the whole array."""
        value = self.concrete_value(tracer)
        check_fetchable(value)  # sharded across processes: name the user's line
        return value

    def finalize(self, jaxpr, consts: list) -> tuple[Any, list]:
        """Turn the known values the residual ``jaxpr`` uses into constants.

        ``jaxpr`` is open: its leading inputs are ``consts``. Equations
        recorded as folds are dropped; those of their outputs that live
        equations (or the outputs) use become new constant inputs (after
        ``consts``), materialized in one batch. Effectful equations stay,
        and so do lazy expansions whose residual consumers all fuse them
        (see :data:`FUSES_OPERANDS`); an expansion that a matrix product, a
        custom call or a loop reads is stored after all. Where that does not
        pay (:meth:`folding_pays`), the program keeps the work, as ``jax.jit``'s
        does, but for values Python asked for: those are computed.
        """
        kept, needed = self._split(jaxpr, self._stored)
        todo = self._batch([v for v in needed if v not in self._materialized])
        lowerable = all(_compat.has_lowering(r.prim, jax.default_backend()) for r in todo)  # else it must fold
        if todo and lowerable and not self.folding_pays(todo, kept):
            kept, needed = self._split(jaxpr, lambda recipe, _: any(v in self._materialized for v in recipe.outvars))
        self._folds.clear()  # the trace is over: nothing is folded again
        self._value_keys.clear()
        values = self._materialize(needed, final=True)
        self._loops = None
        if self._own_kernels:
            self._kernels.close()
        n = len(consts)
        invars = [*jaxpr.invars[:n], *needed, *jaxpr.invars[n:]]
        if self._abstract():
            # Abstract constants' work is staged in the folding program's
            # trace: useless once it ends, and it must not keep that trace
            # alive (rule thunks of custom calls keep this folder alive).
            self._recipes.clear()
            self._materialized.clear()
        return _compat.with_invars(jaxpr.replace(eqns=kept), invars), [*consts, *values]

    def _stored(self, recipe, unfused: bool) -> bool:
        """Whether ``finalize`` stores a recipe's live outputs (``unfused``: a consumer cannot fuse them)."""
        if recipe.lazy and unfused and self.stores_unfused:  # an expansion stored after all: see FUSES_OPERANDS
            self._count([label(recipe.prim, recipe.params)], 0.0)
        return not recipe.lazy or (unfused and self.stores_unfused)

    def _split(self, jaxpr, stored: Callable[[Any, bool], bool]) -> tuple[list, list]:
        """``(kept, needed)``: the equations the residual keeps, and the recipe outputs
        it reads as constants, those ``stored(recipe, unfused)`` says; in program
        order. Consumers come after producers, so walking the equations backwards
        knows every consumer of an equation first."""
        live = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
        unfused = set()  # live values read by an equation that cannot fuse its producer
        kept, needed = [], []
        for eqn in reversed(jaxpr.eqns):
            recipe = next((self._recipes[v] for v in eqn.outvars if v in self._recipes), None)
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
        self.stats.folded -= self._counted
        self.stats.flops -= self._counted_flops
        self.stats.unfolded.append(Unfolded(len(todo), saved.seconds(), (saved + rest).seconds(), self.nested))
        self._counted, self._counted_flops = Counter(), 0.0
        return False

    def _abstract(self) -> bool:
        """Whether this folder folded abstract constants (see :meth:`is_known`)."""
        values = [*self._materialized.values(), *(a for r in self._recipes.values() for a in r.args)]
        return any(isinstance(v, _compat.Tracer) for v in values)

    # -- cheap expansions -------------------------------------------------
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

    def stage_lazy(self, trace, prim, args, params):
        """Stage ``prim`` on known inputs, remembering how to materialize it."""
        return self._record(trace, prim, args, params, lazy=True)

    def _var(self, x):
        """The recipe variable of a known tracer, else ``None``."""
        if not isinstance(x, _compat.Tracer):
            return None
        var = getattr(x, "val", None)
        return var if isinstance(var, _compat.Var) and var in self._recipes else None

    def _known_value(self, trace, x):
        """Unwrap tracers of ``trace`` that merely hold a constant."""
        const = _compat.const_of(trace, x)
        return x if const is None else const

    # -- deferred evaluation ---------------------------------------------
    def _record(self, trace, prim, args, params, *, lazy: bool):
        concrete = args
        if not lazy:
            concrete = [self._uniform_value(a) for a in args]
            if not any(isinstance(a, _compat.Tracer) for a in concrete):
                args = concrete
        key = self._fold_key(prim, args, params)
        if key in self._folds:
            return self._folds[key][0]
        # A fold must be exactly one equation, which ``finalize`` drops by
        # its outputs; a lazy one stays in the residual program, staged as
        # JAX would stage it (custom rules inline some calls).
        stage = trace.stage if lazy else trace.stage_equation
        outs = stage(prim, args, params)
        out_list = outs if prim.multiple_results else [outs]
        # JAX's staging may forward an input or fold a literal instead of
        # emitting an equation; such outputs already know their value.
        outvars = tuple(
            o.val if _compat.const_of(trace, o) is None and self._var(o) is None else None
            for o in out_list
        )
        if any(v is not None for v in outvars):
            recipe_args = tuple(self._var(a) or a for a in args)
            recipe = Recipe(prim, recipe_args, params, outvars, lazy, serial=len(self._recipes),
                                   params_key=None if key is None else key[1])
            self._recipes.update((v, recipe) for v in outvars if v is not None)
            if self._early and not lazy:
                self._kernels.early(recipe, [self._var(a) or a for a in concrete])
            elif self._warm and not lazy:
                self._kernels.warm(recipe)
            if self._loops is not None and not lazy:
                self._loops.record(recipe)
        if key is not None:
            self._folds[key] = (outs, tuple(args))  # the inputs, kept alive: their ids are in the key
            if prim in _SPREADS and outvars[0] is not None:
                element = _values.scalar_of(key[2][0])
                if element is not None:  # a zero, a one, a fill value, however spelled
                    dtype, _, bits = element
                    aval = outvars[0].aval
                    self._uniform_vars[outvars[0]] = _values.uniform_key(
                        aval.shape, dtype, aval.weak_type, np.frombuffer(bits, dtype)[0])
        return outs

    def _uniform_value(self, x):
        """``x``, or the NumPy broadcast of one element it is known to be (a
        broadcast of a scalar, see :meth:`_record`): a fold whose other
        inputs are concrete then has concrete inputs, as on a NumPy array of
        zeros, and starts on the worker as the trace records it (see
        :meth:`pejit._fold._offload.Kernels.early`). Where other inputs are not
        concrete (a folding program's abstract constants), the recipe keeps
        reading the broadcast: a batch hands a kernel on constants alone to
        the worker at its start, ahead of its turn (measured: the full-size
        TFC PDE's call-time form peaked at 2.5 GB instead of 1.2 GB)."""
        var = self._var(x)
        key = None if var is None else self._uniform_vars.get(var)
        if key is None:
            return x
        dtype, weak, bits = _values.scalar_of(key)
        return x if weak else np.broadcast_to(np.frombuffer(bits, dtype)[0], var.aval.shape)  # NumPy has no weak types

    def _fold_key(self, prim, args, params):
        """What identifies a fold (or an expansion): its primitive, its
        parameters, and each input: a deferred one by its variable (or as
        the uniform array it is known to be), a Python scalar by type and
        value, an array by :func:`pejit._fold._values.value_key`. None if the
        parameters are unhashable.

        ``jnp.zeros_like(c)``, ``np.zeros_like(c)`` made in the function,
        ``jnp.zeros(n)`` and a ``jax.Array`` of zeros are then one input:
        the known work on them (TFC's basis on a zero coordinate, its
        derivatives) is recorded once, whichever spelling the program uses.
        """
        def arg_key(a):
            var = self._var(a)
            if var is not None:
                return self._uniform_vars.get(var, var)
            if isinstance(a, (bool, int, float, complex)):  # JAX's typed scalars carry a dtype
                return (type(a), a, getattr(a, "dtype", None))
            held = self._value_keys.get(id(a))
            if held is None or held[1] is not a:
                held = self._value_keys[id(a)] = (_values.value_key(a), a)
            return held[0]

        try:
            key = (prim, params_key(params), tuple(map(arg_key, args)))
            hash(key)
        except TypeError:
            return None
        return key

    def _materialize(self, targets: Sequence[Any], final: bool = False) -> list[Any]:
        """Values of recipe variables ``targets``, evaluating one batch.

        Besides ``targets``, the batch keeps the values that something
        outside it has used; other intermediates are dropped, and recomputed
        should a later equation ask for them. The ``final`` batch (the
        residual's constants) keeps only ``targets``, and lets go of every
        earlier value at its last use in the batch: nothing asks later.
        """
        batch = self._batch([v for v in targets if v not in self._materialized])
        if batch:
            produced = {v for r in batch for v in r.outvars if v is not None}
            inside = Counter(a for r in batch for a in r.args if isinstance(a, _compat.Var))
            outputs = list(dict.fromkeys(
                [v for v in targets if v in produced]
                + ([] if final else [v for v in produced if self._uses[v] > inside[v]])
            ))
            # Abstract constants: the batch is staged into the folding program.
            abstract = _plan.reads_abstract(batch, self._materialized)
            backend = "program" if abstract else self.options.backend
            plan = _plan.plan_batch(batch, backend, jax.default_backend(), outputs)
            start = time.perf_counter()
            tick, timings = self.progress.advance, []
            if final:
                # hand the earlier values over: run_batch frees each at its last use
                wanted = set(targets)
                env = {v: x for v, x in self._materialized.items() if v in inside or v in wanted}
                self._materialized = {v: x for v, x in env.items() if v in wanted}
                values = _batch.run_batch(plan, _handover(env), outputs, self._keep, tick, timings,
                                          kernels=self._kernels, loops=self._loops)
            else:
                values = _batch.run_batch(plan, self._materialized, outputs, self._keep, tick, timings,
                                          kernels=self._kernels, loops=self._loops)
            self._materialized.update(zip(outputs, values))
            number = self.stats.batches[-1].batch + 1 if self.stats.batches else 0
            self.stats.batches.extend(
                _batch.BatchInfo(
                    number, seg.backend, len(seg.recipes),
                    sum(r.out_bytes() for r in seg.recipes),
                    Counter(r.prim.name for r in seg.recipes), seconds, compiling,
                )
                for seg, (seconds, compiling) in zip(plan, timings)
            )
            self.progress.batch(
                Counter(seg.backend for seg in plan), len(batch), sum(r.out_bytes() for r in batch),
                sum(nbytes(v.aval) for v in outputs), time.perf_counter() - start,
            )
        return [self._materialized[v] for v in targets]

    def _batch(self, targets: Sequence[Any]) -> list[Recipe]:
        """Unevaluated recipes ``targets`` depend on, in the order the trace recorded them.

        That is the program's own order, which holds each value from where
        the program computes it to where it reads it. An order target by
        target (each one's dependencies, then the next's) holds what two
        targets share from the first to the last: TFC's WaveEquation2D at
        15^3 points, folded in the TFC form, peaked at 3235-3260 MB that
        way and at 2477-2478 MB in the trace's order (``jax.jit``: 2616 MB),
        in as much time.
        """
        found: dict[int, Recipe] = {}
        stack = [self._recipes[v] for v in targets]
        while stack:
            r = stack.pop()
            if id(r) not in found:
                found[id(r)] = r
                stack.extend(self._recipes[a] for a in r.args
                             if isinstance(a, _compat.Var) and a not in self._materialized)
        return sorted(found.values(), key=operator.attrgetter("serial"))


#: Primitives whose output is uniform where their one input is a scalar or uniform.
_SPREADS = frozenset({P.broadcast_in_dim_p, P.reshape_p})


def _var_of(x):
    """A recipe's input as an equation's: its ``Var``, or a variable of a value's type."""
    return x if isinstance(x, _compat.Var) else _cost.Typed(_compat.typeof(x))


def _handover(env: dict) -> dict:
    """``env``'s entries in a new dict, ``env`` emptied: the callee then holds the only references."""
    out = dict(env)
    env.clear()
    return out


def replay(trace, closed_jaxpr, args: Sequence[Any]) -> list[Any]:
    """Evaluate ``closed_jaxpr`` on ``args`` under ``trace`` (folding as we go)."""
    with _compat.set_current_trace(trace):
        return _compat.eval_jaxpr(closed_jaxpr.jaxpr, closed_jaxpr.consts, *args)

