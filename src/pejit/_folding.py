"""The folding trace: per primitive application, evaluate now or stage.

pejit runs the user's function (or replays a jaxpr) under a
:class:`~pejit._compat.StagingTrace` whose policy is a :class:`Folder`. The
constant arguments are ordinary concrete arrays, so Python control flow and
data-dependent shapes on them work; every primitive whose inputs are all
known is *folded* (evaluated once, now), every other one is *staged* into the
residual jaxpr. Folded values that the residual program needs become its
constants.

The decision is one loop with a table of rules (``fold_rules``) keyed by
primitive, in the style of JAX's autodidax: a rule handles primitives that
carry sub-jaxprs (``cond``, ``jit``, loops) by replaying them under the same
trace, so known work inside them folds too. New behaviour is a new rule.

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

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import primitives as P

from . import _compat

#: A fold rule: ``rule(folder, trace, prim, args, params)`` returns the
#: outputs of ``prim`` or ``NotImplemented`` to defer to the default policy.
FoldRule = Callable[..., Any]
fold_rules: dict[Any, FoldRule] = {}


def register_fold_rule(*prims) -> Callable[[FoldRule], FoldRule]:
    """Register ``rule`` for each primitive in ``prims``."""

    def register(rule: FoldRule) -> FoldRule:
        for prim in prims:
            fold_rules[prim] = rule
        return rule

    return register


@dataclasses.dataclass(frozen=True)
class FoldOptions:
    """Switches for pejit's passes, each on by default.

    Turn one off to debug a suspected miscompilation: the result must not
    change, only how much is folded. The passes are described together in
    :mod:`pejit._rules`.

    Attributes:
      branches: ``cond``/``switch`` with a known index keep only the taken
        branch; with an unknown index, known work in branches is hoisted.
      calls: nested ``jax.jit`` calls with some known inputs (or closed-over
        constants) are specialized through (inlined), so the known work
        inside them folds; ``jax.checkpoint`` bodies are folded in place.
      loops: loop-invariant known work in ``scan``/``while_loop`` bodies is
        hoisted out and folded, and so are carries that stay known.
      rematerialize: cheap expansions of known values stay in the residual
        program instead of becoming large constants.
      literals: folded scalars become literals of the residual jaxpr rather
        than inputs.
      expansion_ratio: an expansion is kept lazy when its output is more than
        this many times larger than its known inputs ...
      expansion_min_bytes: ... and larger than this many bytes.
      loop_residual_bytes: per loop, the most bytes of per-iteration known
        work (``length x size``) folded into stacked constants; a loop that
        would need more keeps that work in its body.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import FoldOptions, explain
      >>> def f(c, x):
      ...     return jnp.ones((100, 100)) * c + x
      >>> lazy = explain(f, 2.0, 1.0, constant_argnums=0)
      >>> stored = explain(f, 2.0, 1.0, constant_argnums=0, fold_options=FoldOptions(rematerialize=False))
      >>> lazy.folded_bytes < 100 < stored.folded_bytes  # the 100x100 expansion is not stored
      True
    """

    branches: bool = True
    calls: bool = True
    loops: bool = True
    rematerialize: bool = True
    literals: bool = True
    expansion_ratio: float = 2.0
    expansion_min_bytes: int = 1024
    loop_residual_bytes: int = 64 * 2**20


#: Primitives that only move, replicate or create data cheaply: folding them
#: can blow a small known value up into a large constant.
EXPANSIONS = frozenset(
    [
        P.broadcast_in_dim_p,
        P.iota_p,
        P.reshape_p,
        P.squeeze_p,
        P.transpose_p,
        P.convert_element_type_p,
        P.concatenate_p,
        P.pad_p,
        P.rev_p,
        P.select_n_p,
        P.copy_p,
    ]
)

#: Elementwise primitives: on a lazy input they stay lazy, since recomputing
#: them in the residual program costs about as much as reading a folded
#: constant of the same size.
ELEMENTWISE = frozenset(
    [
        P.abs_p, P.acos_p, P.acosh_p, P.add_p, P.and_p, P.asin_p, P.asinh_p,
        P.atan2_p, P.atan_p, P.atanh_p, P.cbrt_p, P.ceil_p, P.clamp_p,
        P.complex_p, P.conj_p, P.cos_p, P.cosh_p, P.div_p, P.eq_p, P.exp2_p,
        P.exp_p, P.expm1_p, P.floor_p, P.ge_p, P.gt_p, P.imag_p,
        P.integer_pow_p, P.is_finite_p, P.le_p, P.log1p_p, P.log_p,
        P.logistic_p, P.lt_p, P.max_p, P.min_p, P.mul_p, P.ne_p, P.neg_p,
        P.not_p, P.or_p, P.pow_p, P.real_p, P.rem_p, P.round_p, P.rsqrt_p,
        P.sign_p, P.sin_p, P.sinh_p, P.sqrt_p, P.square_p, P.sub_p, P.tan_p,
        P.tanh_p, P.xor_p,
    ]
)


def nbytes(aval) -> int:
    """Bytes of an array of abstract value ``aval`` (0 for non-arrays)."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # extended dtypes (PRNG keys) have no NumPy itemsize
        itemsize = getattr(dtype, "itemsize", 8)
    return math.prod(shape) * itemsize


@dataclasses.dataclass
class FoldStats:
    """What one specialization folded and kept, by primitive name."""

    folded: Counter = dataclasses.field(default_factory=Counter)
    staged: Counter = dataclasses.field(default_factory=Counter)
    rematerialized: Counter = dataclasses.field(default_factory=Counter)
    eliminated_branches: int = 0
    hoisted: Counter = dataclasses.field(default_factory=Counter)
    effects_kept: Counter = dataclasses.field(default_factory=Counter)


@dataclasses.dataclass(frozen=True)
class _Recipe:
    prim: Any
    args: tuple
    params: dict
    outvars: list


class Folder:
    """The folding policy of one trace, and its bookkeeping.

    Called by :class:`~pejit._compat.StagingTrace` for every primitive
    application; returns the outputs, or ``NotImplemented`` to stage.
    """

    def __init__(self, options: FoldOptions = FoldOptions()):
        self.options = options
        self.stats = FoldStats()
        # staged Var -> _Recipe: how to materialize a lazy value
        self._recipes: dict[Any, _Recipe] = {}
        self._materialized: dict[Any, Any] = {}

    def child(self) -> Folder:
        """A folder for a nested trace (a loop body): same options, same stats."""
        child = Folder(self.options)
        child.stats = self.stats
        return child

    # -- the policy -------------------------------------------------------
    def __call__(self, trace, prim, args, params):
        args = [self._known_value(trace, a) for a in args]
        rule = fold_rules.get(prim)
        if rule is not None:
            out = rule(self, trace, prim, args, params)
            if out is not NotImplemented:
                return out
        return self.default(trace, prim, args, params)

    def default(self, trace, prim, args, params):
        """Fold ``prim`` if all inputs are known and it has no effects."""
        if not all(self.is_known(a) for a in args):
            self.stats.staged[prim.name] += 1
            return NotImplemented
        avals = [_compat.typeof(a) for a in args]
        if _compat.primitive_effects(prim, avals, params):
            self.stats.effects_kept[prim.name] += 1
            return NotImplemented
        if self.options.rematerialize and self._stays_lazy(prim, args, params):
            return self.stage_lazy(trace, prim, args, params)
        self.stats.folded[prim.name] += 1
        return _compat.evaluate(prim, [self.materialize(a) for a in args], params)

    # -- known values -----------------------------------------------------
    def is_known(self, x) -> bool:
        """Whether ``x`` is known: not a value this folder stages, or lazy.

        Tracers of an *outer* trace count as known: they are the abstract
        constants of a folding program being compiled (see ``_jit``), and
        folding an equation on them stages it into that program.
        """
        staged = isinstance(x, _compat.Tracer) and getattr(x._trace, "policy", None) is self
        return not staged or self.is_lazy(x)

    def is_lazy(self, x) -> bool:
        return isinstance(x, _compat.Tracer) and getattr(x, "val", None) in self._recipes

    def materialize(self, x):
        """The concrete value of a known ``x``."""
        if not self.is_lazy(x):
            return x
        # Evaluate the recipes ``x`` depends on in dependency order, with an
        # explicit stack: chains of lazy values can be longer than Python's
        # recursion limit.
        stack = [x.val]
        while stack:
            var = stack[-1]
            if var in self._materialized:
                stack.pop()
                continue
            r = self._recipes[var]
            pending = [a.val for a in r.args if self.is_lazy(a) and a.val not in self._materialized]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            args = [self._materialized[a.val] if self.is_lazy(a) else a for a in r.args]
            outs = _compat.evaluate(r.prim, args, r.params)
            vals = outs if r.prim.multiple_results else [outs]
            self._materialized.update((v, val) for v, val in zip(r.outvars, vals) if isinstance(v, _compat.Var))
        return self._materialized[x.val]

    def _known_value(self, trace, x):
        """Unwrap tracers of ``trace`` that merely hold a constant."""
        if isinstance(x, _compat.Tracer) and getattr(x, "_trace", None) is trace:
            const = trace.get_const(x)
            if const is not None:
                return const
        return x

    # -- cheap expansions -------------------------------------------------
    def _stays_lazy(self, prim, args, params) -> bool:
        if prim in ELEMENTWISE:
            return any(self.is_lazy(a) for a in args)
        if prim not in EXPANSIONS:
            return False
        if any(self.is_lazy(a) for a in args):
            return True
        in_bytes = sum(nbytes(_compat.typeof(a)) for a in args)
        out_avals, _ = prim.abstract_eval(*[_compat.typeof(a) for a in args], **params)
        out_avals = out_avals if prim.multiple_results else [out_avals]
        out_bytes = sum(nbytes(a) for a in out_avals)
        opts = self.options
        return out_bytes > opts.expansion_min_bytes and out_bytes > opts.expansion_ratio * in_bytes

    def stage_lazy(self, trace, prim, args, params):
        """Stage ``prim`` on known inputs, remembering how to materialize it."""
        self.stats.rematerialized[prim.name] += 1
        outs = trace.stage(prim, args, params)
        outvars = [o.val for o in (outs if prim.multiple_results else [outs])]
        recipe = _Recipe(prim, tuple(args), params, outvars)
        # Outputs JAX already made literals (scalar conversions) are concrete,
        # and an output that is a forwarded input (``jit`` does that) keeps
        # the recipe it has: overwriting it would make a cycle.
        for v in outvars:
            if isinstance(v, _compat.Var) and v not in self._recipes:
                self._recipes[v] = recipe
        return outs

    def concrete_value(self, tracer):
        """Hook for :class:`~pejit._compat.KnowableTracer`: Python asks."""
        return self.materialize(tracer) if self.is_lazy(tracer) else None


def replay(trace, closed_jaxpr, args: Sequence[Any]) -> list[Any]:
    """Evaluate ``closed_jaxpr`` on ``args`` under ``trace`` (folding as we go)."""
    with _compat.set_current_trace(trace):
        return _compat.eval_jaxpr(closed_jaxpr.jaxpr, closed_jaxpr.consts, *args)
