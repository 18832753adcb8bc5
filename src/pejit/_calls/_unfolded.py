"""The unfolded program, and a specialization's report with it: what ``explain`` shows.

The report pairs the residual program (what pejit compiles) with the
original one (what ``jax.jit`` would compile with the constants closed
over). The original is traced with the same machinery as folding, but with
a policy that folds nothing (:class:`StageAll`): known values are staged
*lazily*, so Python control flow on constants still sees concrete values
(``if A.sum() > 0`` works, as it does under pejit) while every equation
lands in the jaxpr.

:func:`explained` reports on a specialization of one call path
(:mod:`pejit._calls._path`); the entry point :func:`pejit.explain`, which
accepts every form of function (:mod:`pejit._explain`), and
``AutoPejitted.explain`` both build on it.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.extend.core import ClosedJaxpr

from .. import _compat
from .._fold import _batch
from .._fold._folding import concrete_value, evaluate_now, numpy_value
from .._fold._memo import Memo
from .._fold._primitives import prune
from .._fold._staging import known_value, policy_of, trace_staging
from .._fold._stats import FoldStats
from .._fold._store import Store
from .._fold._progress import Progress
from .._reports._report import FoldReport
from ._argnums import interleave
from ._info import PejitInfo, split_call
from ._keys import dynamic_aval
from ._specializer import as_jax


class StageAll:
    """A folding policy (:class:`~pejit._fold._policy.FoldPolicy`) that folds nothing,
    but keeps known values materializable.

    Every equation on known values is staged lazily: recorded in a
    :class:`~pejit._fold._store.Store` (equal ones once, by a
    :class:`~pejit._fold._memo.Memo`), so that Python can still ask for a
    known value, and computed only then; each stays in the jaxpr.
    """

    def __init__(self):
        self.stats = FoldStats()  # the batches Python's questions ran; nothing reads them
        self._store = Store(self.stats, Progress("fold", False), "auto", _batch.run_batch)
        self._memo = Memo(self._store.var)

    def __call__(self, trace, prim, args, params):
        args = [known_value(trace, a) for a in args]
        if not all(self.is_known(a) for a in args):
            return NotImplemented
        try:
            effects = _compat.primitive_effects(prim, [_compat.typeof(a) for a in args], params)
        except Exception as e:  # no abstract evaluation: the value stands in
            return evaluate_now(self, prim, args, params, e)
        if effects:
            return NotImplemented
        key = self._memo.key(prim, args, params)
        outs = self._memo.get(key)
        if outs is None:
            outs, recipe = self._store.record(trace, prim, args, params, lazy=True,
                                              params_key=None if key is None else key.params)
            self._memo.remember(key, outs, args, recipe)
        return outs

    def is_known(self, x) -> bool:
        """Whether ``x`` is known: not staged by this policy, or staged lazily on known values."""
        return policy_of(x) is not self or self._store.var(x) is not None

    def materialize(self, x):
        """The value of a known ``x``, computed outside the staging trace: impls
        that re-enter JAX (``custom_jvp_call`` runs its function) must not stage again."""
        with _compat.set_current_trace(_compat.eval_trace):
            return self._store.value(x)

    def call_inputs(self, trace, args) -> list:
        known = [known_value(trace, a) for a in args]
        if all(self.is_known(a) for a in known):
            return [self.materialize(a) for a in known]
        return list(args)

    def concrete_value(self, tracer):
        return concrete_value(self, tracer)

    def numpy_value(self, tracer):
        return numpy_value(self, tracer)

    def finalize(self, jaxpr, consts: list) -> tuple[Any, list]:
        """The jaxpr as traced, its dead equations dropped (values Python asked for leave some)."""
        kept, _ = self._store.split(jaxpr, lambda recipe, unfused: False)
        self._memo.clear()
        if self._store.abstract():
            self._store.clear()
        return _compat.with_invars(jaxpr.replace(eqns=kept), jaxpr.invars), list(consts)


def explained(path: Any, args: tuple, kwargs: dict) -> FoldReport:
    """The report of the specialization of a call on ``path`` (a call path), with its ``before`` program."""
    residual = path.specialize(args, kwargs).residual
    report = residual.report
    return FoldReport.build(
        residual.stats, residual.jaxpr, report.fold_seconds, before=original(path.info, args, kwargs),
        fallbacks=report.fallbacks,
    )


def original(info: PejitInfo, args: tuple, kwargs: dict) -> ClosedJaxpr:
    """The unfolded program of a call of the function ``info`` describes, on its dynamic arguments,
    constants as ``consts``."""
    const_pos, const_kw, dyn_args, dyn_kwargs = as_jax(split_call(info, args, kwargs))
    leaves, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
    avals = [dynamic_aval(leaf) for leaf in leaves]

    def flat_fun(*leaves):
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        out = info.fun(*interleave(const_pos, dyn_args), **dict(const_kw), **dyn_kwargs)
        return jax.tree_util.tree_leaves(out)

    jaxpr, consts = trace_staging(flat_fun, avals, StageAll(), name="explain")
    # Values Python asked for (``if A.sum() > 0``) leave dead equations behind.
    return _compat.close_jaxpr(*prune(jaxpr, consts))


__all__ = ["StageAll", "explained", "original"]
