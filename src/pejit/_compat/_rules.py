"""JAX's primitives that pejit names, and JAX's rule tables that pejit reads or extends.

Fold rules are keyed by primitive, so pejit names some that
``jax.extend.core.primitives`` does not export in every supported version
(``lax.split``'s, ``jax.checkpoint``'s before 0.8.2, and ``custom_lin``:
the equation forward-mode differentiation leaves for a ``custom_vjp``
call's backward rule, which pejit folds). Its own primitives (a folded
call, a batch staged as one equation, collapsed matrices) are lowered
through JAX's tables; whether a known sub-program can be compiled at all
is JAX's table of lowerings (``mlir._lowerings``: primitives with only an
``impl`` must run op by op).

Where versions differ: ``jit``'s ``inline`` parameter is a bool up to 0.10
and an ``Inline`` member from 0.11 (:func:`jit_inlines`); a ``custom_vjp``
backward rule returns ``(cotangents, logs)`` from 0.12
(:data:`BWD_RETURNS_LOGS`); avals name their cotangent type
``to_ct_aval`` in 0.10 and later, ``to_tangent_aval`` in 0.7
(:func:`cotangent_aval`); JAX 0.12 lowers a jaxpr it marks high (with
high-level types) to low-level JAX equation by equation, by each
primitive's ``to_lojax`` (:func:`lower_as`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._internals import ad, mlir, public_ad, public_mlir
from ._internals import jit_p as jit_p  # the primitive of a nested jax.jit call
from ._internals import remat_p as remat_p
from ._internals import split_p as split_p
from ._internals import stack_p as stack_p
from ._internals import unstack_p as unstack_p

#: What JAX's forward-mode differentiation of a ``custom_vjp`` call leaves for
#: the backward rule: a linear equation whose transpose runs the rule.
custom_lin_p = ad.custom_lin_p
#: A symbolic zero tangent or cotangent (``Zero(aval)``), as JAX's rules pass them.
Zero = public_ad.Zero
#: The forward-mode derivative rules, by primitive (``primitive_jvps[p] = rule``).
primitive_jvps = public_ad.primitive_jvps

#: Whether a ``custom_vjp`` call's backward rule, as JAX wraps it, returns
#: ``(cotangents, logs)`` (JAX 0.12's ``defvjp_with_logs``), not cotangents.
BWD_RETURNS_LOGS: bool = hasattr(jax.custom_vjp, "defvjp_with_logs")


def cotangent_aval(aval: Any) -> Any:
    """The type of ``aval``'s cotangents (``float0`` for integers)."""
    return aval.to_ct_aval() if hasattr(aval, "to_ct_aval") else aval.to_tangent_aval()


def jit_inlines(params: dict) -> bool:
    """Whether JAX inlines a ``jit`` equation of these ``params``: ``jit(inline=True)``,
    a bool up to JAX 0.10 and from 0.11 an ``Inline`` member (``jax.numpy``'s
    functions are ``JAX_EARLY``; ``True`` is ``JAX_LATE``, inlined when
    lowering; ``AUTO``, the default, is not inlined)."""
    inline = params.get("inline")
    return inline is True or getattr(inline, "name", None) in ("JAX_EARLY", "JAX_LATE")


def has_lowering(prim, platform: str) -> bool:
    """Whether ``prim`` can be compiled for ``platform`` (else: ``impl`` only)."""
    return prim in mlir._lowerings or prim in mlir._platform_specific_lowerings.get(platform, {})


def lower_as(prim, fun: Callable) -> None:
    """Lower ``prim`` as ``fun`` (JAX code taking its inputs and parameters):
    compiled as its body, and, where JAX 0.12 lowers a high-level jaxpr, inlined."""
    public_mlir.register_lowering(prim, public_mlir.lower_fun(fun, multiple_results=prim.multiple_results))
    prim.to_lojax = fun
