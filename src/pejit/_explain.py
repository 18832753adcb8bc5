"""``explain``: what pejit folds in a function, before running it.

The report pairs the residual program (what pejit compiles) with the
original one (what ``jax.jit`` would compile with the constants closed
over). The original is traced with the same machinery as folding, but with
a policy that folds nothing: known values are staged *lazily*, so Python
control flow on constants still sees concrete values (``if A.sum() > 0``
works, as it does under pejit) while every equation lands in the jaxpr.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr

from . import _compat
from ._folding import Folder
from ._options import FoldOptions
from ._argnums import interleave
from ._info import split_call
from ._jit import Pejitted
from ._keys import dynamic_aval
from ._tfc import BoundPejitted, core_call
from ._report import FoldReport
from ._specializer import as_jax
from ._staging import trace_staging


class _StageAll(Folder):
    """A policy that folds nothing, but keeps known values materializable."""

    stores_unfused = False

    def __call__(self, trace, prim, args, params):
        args = [self._known_value(trace, a) for a in args]
        if not all(self.is_known(a) for a in args):
            return NotImplemented
        try:
            effects = _compat.primitive_effects(prim, [_compat.typeof(a) for a in args], params)
        except Exception as e:  # no abstract evaluation: the value stands in
            return self._evaluate_now(prim, args, params, e)
        if effects:
            return NotImplemented
        return self.stage_lazy(trace, prim, args, params)

    def materialize(self, x):
        # Evaluate outside the staging trace: impls that re-enter JAX
        # (``custom_jvp_call`` runs its function) must not stage again.
        with _compat.set_current_trace(_compat.eval_trace):
            return super().materialize(x)


@_compat.api_boundary
def explain(
    fun: Callable,
    *args: Any,
    constant_argnums: int | Sequence[int] | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
    **kwargs: Any,
) -> FoldReport:
    """Specialize ``fun`` on these arguments and report what was folded.

    Arguments are those of a call: positions in ``constant_argnums`` and
    keywords in ``constant_argnames`` are constants, the rest may be arrays
    or ``jax.ShapeDtypeStruct``. ``fun`` may also be a function made by
    [`pejit`][pejit.pejit] or [`pe`][pejit.pe] (then its own constant arguments are used,
    and its cached specialization), including the TFC form, which takes only
    the non-constant arguments.

    The [`FoldReport`][pejit.FoldReport] has ``before`` (the program ``jax.jit`` would
    compile with the constants closed over) and ``after`` (the residual
    program); print it for a summary, display it in Jupyter for both jaxprs
    side by side, or call ``to_dot()`` for a Graphviz picture.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import explain
      >>> def f(A, x):
      ...     return jnp.linalg.inv(A) @ x
      >>> r = explain(f, jnp.eye(3), jnp.ones(3), constant_argnums=0)
      >>> dict(r.residual)
      {'dot_general': 1}
      >>> r.marks
      ['folded', 'residual']
      >>> r.flops_removed > r.flops_residual
      True
    """
    explains_itself = getattr(type(fun), "__pejit_explain__", None)  # AutoPejitted
    if explains_itself is not None:
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        return explains_itself(fun, *args, **kwargs)
    if isinstance(fun, BoundPejitted):
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        core, full_args = core_call(fun, args)
        return explain(core, *full_args, **kwargs)
    if isinstance(fun, Pejitted):
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        pj = fun
    else:
        pj = Pejitted(
            fun, constant_argnums=constant_argnums, constant_argnames=constant_argnames,
            jit=False, fold_options=fold_options,
        )
        pj._hints_given.update(("nothing", "writable"))  # the report says it: no warnings
    residual = pj.specialize(*args, **kwargs).residual
    report = residual.report
    return FoldReport.build(
        residual.stats, residual.jaxpr, report.fold_seconds, before=_original(pj, args, kwargs),
        fallbacks=report.fallbacks,
    )


def _no_constants_given(constant_argnums, constant_argnames, fold_options) -> None:
    if constant_argnums is not None or constant_argnames is not None or fold_options is not None:
        raise TypeError(
            "explain: this function was made by pejit/pe and already knows its constant "
            "arguments and fold options; pass only the call's arguments"
        )


def _original(pj: Pejitted, args: tuple, kwargs: dict) -> ClosedJaxpr:
    """The unfolded program on the dynamic arguments, constants as ``consts``."""
    const_pos, const_kw, dyn_args, dyn_kwargs = as_jax(split_call(pj.info, args, kwargs))
    leaves, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
    avals = [dynamic_aval(leaf) for leaf in leaves]

    def flat_fun(*leaves):
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        out = pj.info.fun(*interleave(const_pos, dyn_args), **dict(const_kw), **dyn_kwargs)
        return jax.tree_util.tree_leaves(out)

    jaxpr, consts = trace_staging(flat_fun, avals, _StageAll(), name="explain")
    # Values Python asked for (``if A.sum() > 0``) leave dead equations behind.
    return _compat.close_jaxpr(*_compat.prune(jaxpr, consts))


__all__ = ["explain"]
