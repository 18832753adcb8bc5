"""A pejit function's derivatives, folded as functions of their own.

``jax.grad`` of a ``jax.jit`` function differentiates the program inside it.
Differentiating the residual program the same way would be right, but the
rules of the ``custom_jvp``/``custom_vjp`` calls it keeps (diffrax's and
Equinox's loops, optimistix's implicit differentiation, ``jnp.logaddexp``)
would run on the constants at every call, redoing at each gradient step
the constant work the fold exists to remove. So a call under a
transformation (its dynamic arguments are tracers) hands JAX a
``custom_jvp`` call: its primal is the residual program, and its JVP rule
is pejit's own specialization, at the same constants, of ``jax.jvp`` of the
function (:func:`jvp_of`), which a child call path of the function keeps
(``CallPath._derivative`` in ``pejit._calls._path``). There JAX runs
the rules under the folding trace, where their constant work folds like
any other: a ``custom_jvp`` rule and a ``custom_vjp`` forward rule on the
known values, and the backward rule as the ``custom_lin`` equation that
forward-mode differentiation leaves (``pejit._residual.rules.custom``).
Reverse mode is JAX's linearization of that rule, so ``jax.grad``,
``jax.vjp``, ``jax.jacrev`` and ``jax.hessian`` all go through it. Higher
derivatives differentiate the child: forward mode through its own rule,
folded the same way; linearization (partial evaluation) through its
residual, since JAX 0.12 stages a ``custom_jvp`` call there whole, with no
output known (``CallPath._run``).

A few of JAX's JVP rules cannot take a symbolic zero tangent beside a
nonzero one (``lax.reduce`` of several operands reshapes every tangent;
JAX's own ``jax.jvp`` fails there too, with or without ``jax.jit``). Where
the derivative's fold fails with the constants' tangents symbolic zeros,
it is folded again with zero arrays as their tangents, as JAX's
``check_grads`` perturbs every argument; the report of that
specialization says so. Not by default: the tangents of all the constant
work would be folded, and products with zero tangents kept per call. An
error that the second fold raises too is the function's own: the first
one is raised, as the user's code raised it.

``FoldOptions(derivatives=False)`` lets JAX differentiate the residual
program instead.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .. import _compat
from .._fold._stats import note
from ._argnums import interleave

_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten


def traced_call(derivative: Callable, call: Callable, const_pos: tuple, const_kw: tuple, dyn_args: tuple,
                dyn_kwargs: dict):
    """``call(*dyn_args, **dyn_kwargs)`` under a transformation, with pejit's derivative rule.

    ``derivative`` is the child pejit function of :func:`jvp_of`; the call's
    constant (and static) arguments are ``const_pos`` (positions and
    values) and ``const_kw`` (names and values). A call whose dynamic
    arguments are all values runs as it is: nothing differentiates it; so
    does one that only partial evaluation will see (:func:`_partially_evaluated`).
    """
    leaves, tree = _tree_flatten((dyn_args, dyn_kwargs))
    if not any(isinstance(leaf, _compat.Tracer) for leaf in leaves) or _partially_evaluated():
        return call(*dyn_args, **dyn_kwargs)

    def primal(*leaves):
        args, kwargs = _tree_unflatten(tree, leaves)
        return call(*args, **kwargs)

    def rule(primals, tangents):
        perturbed = tuple(type(t) is not SymbolicZero and _compat.typeof(t).dtype != jax.dtypes.float0
                          for t in tangents)
        moving = [t for t, p in zip(tangents, perturbed) if p]
        return _derivative_of(derivative, (const_pos, const_kw), (tree, perturbed), list(primals), moving)

    fun = jax.custom_jvp(primal)
    fun.defjvp(rule, symbolic_zeros=True)
    return fun(*leaves)


def _partially_evaluated() -> bool:
    """Whether a call here reaches partial evaluation through ``jax.vmap``'s traces alone.

    ``jax.linearize`` runs a JVP rule under partial evaluation (a
    ``JaxprTrace``), which needs no derivative rule, only the known outputs
    split from the tangents; since JAX 0.12 it stages a ``custom_jvp`` call
    whole, with no output known, and the linearization fails. ``CallPath._run``
    calls the residual there; under ``vmap``'s traces (``jax.jacrev`` of
    ``jax.jacfwd``), which pass the call on batched, so does this.
    """
    trace = _compat.TRACE.value
    while getattr(trace, "axis_data", None) is not None:  # vmap's (a BatchTrace): it binds on its parent
        trace = trace.parent_trace
    return isinstance(trace, _compat.JaxprTrace)


def _derivative_of(derivative: Callable, consts: tuple, pattern: tuple, primals: list, tangents: list):
    """``derivative``'s outputs: with the constants' tangents symbolic zeros, or where
    that fold failed, with zero arrays (see the module docstring)."""
    known = _ZERO_TANGENTS.setdefault(derivative, {})
    why = known.get(pattern)
    if why is not None:
        return derivative((consts, pattern, why), primals, tangents)
    try:
        return derivative((consts, pattern, None), primals, tangents)
    except Exception as e:  # noqa: BLE001 - raised again below unless zero tangents mend it
        error = e
    why = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
    try:
        out = derivative((consts, pattern, why), primals, tangents)
    except Exception:  # noqa: BLE001 - the function's own error: raised as it raised it
        raise error from None
    known[pattern] = why
    return out


def jvp_of(fun: Callable) -> Callable:
    """``jax.jvp`` of ``fun``, as the child pejit function of a derivative folds it (its argument 0 constant).

    ``jvp(fixed, primals, tangents)``: ``fixed`` is the constant argument
    (the call's constants and statics, the structure of its dynamic
    arguments, which of their leaves are perturbed, and why the constants
    are perturbed too, or None), ``primals`` the dynamic leaves,
    ``tangents`` those of the perturbed ones. Returns
    ``(outputs, output tangents)`` (``float0`` for integer outputs, as
    ``jax.jvp`` gives them).
    """

    def jvp(fixed: Any, primals: list, tangents: list):
        (const_pos, const_kw), (tree, perturbed), why = fixed
        const_leaves, const_tree = _tree_flatten((const_pos, const_kw))
        zeros = [why is not None and _inexact_array(c) for c in const_leaves]  # the constants perturbed

        def moved(*values):
            it = iter(values)
            const_pos, const_kw = _tree_unflatten(const_tree, [next(it) if z else c
                                                               for c, z in zip(const_leaves, zeros)])
            args, kwargs = _tree_unflatten(tree, [next(it) if p else x for x, p in zip(primals, perturbed)])
            return fun(*interleave(const_pos, args), **dict(const_kw), **kwargs)

        consts = [c for c, z in zip(const_leaves, zeros) if z]
        if consts:
            note(f"the derivative is folded with the constants perturbed by zero tangents: with "
                           f"symbolic zeros, a JVP rule failed ({why})")
        return jax.jvp(moved, (*consts, *(x for x, p in zip(primals, perturbed) if p)),
                       (*map(jax.numpy.zeros_like, consts), *tangents))

    jvp.__name__ = jvp.__qualname__ = f"jvp_{_compat.fun_name(fun)}"
    return jvp


#: Per derivative (a child pejit function), the patterns of perturbed inputs
#: ``(tree, perturbed)`` whose fold needs the constants perturbed, and why:
#: the fold that fails is not tried again.
_ZERO_TANGENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _inexact_array(x: Any) -> bool:
    """Whether a constant leaf is an array that has tangents of its own (float or complex)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic)) and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)

