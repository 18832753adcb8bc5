"""``explain``: what pejit folds in a function, before running it.

The entry point above every form of function pejit makes: a plain function
with its constant arguments named, a ``Pejitted``, the TFC form's
``BoundPejitted`` and an ``AutoPejitted`` all lead to a call path
(:mod:`pejit._calls._path`), and to the report of its specialization with
the unfolded program (:mod:`pejit._calls._unfolded`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import _compat
from ._auto import AutoPejitted
from ._calls._path import make_path
from ._calls._unfolded import explained
from ._fold._options import FoldOptions
from ._jit import Pejitted, call_path
from ._reports._report import FoldReport
from ._tfc import BoundPejitted, core_call


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
    if isinstance(fun, AutoPejitted):  # its decisions, with the fold these arguments run
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        return fun.explain(*args, **kwargs)
    if isinstance(fun, BoundPejitted):
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        path, args = core_call(fun, args)
    elif isinstance(fun, Pejitted):
        _no_constants_given(constant_argnums, constant_argnames, fold_options)
        path = call_path(fun)
    else:
        options = {"constant_argnums": constant_argnums, "constant_argnames": constant_argnames, "jit": False,
                   "fold_options": fold_options}
        path = make_path(fun, options, quiet=("nothing", "writable"))  # the report says it: no warnings
    return explained(path, args, kwargs)


def _no_constants_given(constant_argnums, constant_argnames, fold_options) -> None:
    if constant_argnums is not None or constant_argnames is not None or fold_options is not None:
        raise TypeError(
            "explain: this function was made by pejit/pe and already knows its constant "
            "arguments and fold options; pass only the call's arguments"
        )


__all__ = ["explain"]
