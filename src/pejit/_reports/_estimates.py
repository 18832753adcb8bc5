"""What folding some inputs of a jaxpr would remove, and how to fold them.

``constant_argnums="auto"`` (:mod:`pejit._auto`) promotes an argument only
when folding it removes enough work per call: :func:`removed_flops` estimates
that work on the function's jaxpr, with :mod:`pejit._fold._flops`'s counts, and
:func:`fold_plan` says whether the fold runs as one compiled program.
"""

from __future__ import annotations

from jax.extend.core import Literal

from .._fold import _batch
from .._fold._flops import eqn_flops
from .._fold._primitives import called_jaxpr


def removed_flops(closed_jaxpr, known_invars) -> float:
    """Estimated FLOPs per call that folding the inputs ``known_invars`` removes.

    An equation folds when all its inputs are known and it has no effects;
    a call (``jax.jit`` inside the function, as ``jnp.linalg`` functions are)
    with some known inputs is looked into, as folding inlines it. The count
    is :mod:`pejit._fold._flops`'s.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda X, w: (X.T @ X) @ w)(jnp.ones((10, 4)), jnp.ones(4))
      >>> removed_flops(cj, [0])  # X.T @ X: 2 * 4 * 4 * 10
      320.0
    """
    jaxpr = closed_jaxpr.jaxpr
    return _removed(jaxpr, set(jaxpr.constvars) | {jaxpr.invars[i] for i in known_invars})


def _removed(jaxpr, known: set) -> float:
    return sum(eqn_flops(eqn) for eqn in _folded_eqns(jaxpr, known))


def _folded_eqns(jaxpr, known: set):
    """The equations of ``jaxpr`` that folding the ``known`` variables evaluates.

    A call with all inputs known is one equation (evaluated as one program);
    a call with some known inputs is looked into, as folding inlines it.
    """
    for eqn in jaxpr.eqns:
        ins = [isinstance(v, Literal) or v in known for v in eqn.invars]
        if all(ins) and not eqn.effects:
            yield eqn
            known.update(eqn.outvars)
        elif any(ins) and (sub_jaxpr := called_jaxpr(eqn.primitive, eqn.params)) is not None:
            yield from _folded_eqns(
                sub_jaxpr, set(sub_jaxpr.constvars) | {v for v, k in zip(sub_jaxpr.invars, ins) if k})


def fold_plan(closed_jaxpr, known_invars) -> str:
    """How a promotion folds: ``"compiled"`` (one program) or ``"auto"`` (pejit's default).

    A promotion folds one value, usually in a process that has not
    evaluated these primitives on these shapes before: the fold runs as one
    program when that costs less than compiling each distinct primitive
    (:func:`pejit._fold._batch.one_program_pays`), as for
    ``cholesky(X.T @ X + lam * I)`` (9 equations, 9 programs against one).
    Large folds of few distinct operations (an unrolled loop) keep the
    default, op by op with a shared folding program.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> f = lambda X, w: jnp.linalg.cholesky(X.T @ X + jnp.eye(4)) @ w
      >>> fold_plan(jax.make_jaxpr(f)(jnp.ones((10, 4)), jnp.ones(4)), [0])
      'compiled'
    """
    jaxpr = closed_jaxpr.jaxpr
    eqns = _folded_eqns(jaxpr, set(jaxpr.constvars) | {jaxpr.invars[i] for i in known_invars})
    return "compiled" if _batch.one_program_pays(eqns) else "auto"


__all__ = ["fold_plan", "removed_flops"]
