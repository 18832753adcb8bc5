"""Common-subexpression elimination of a residual jaxpr's top-level equations.

XLA merges equal equations of a compiled program anyway, so this changes no
result and no run time by itself. It is for the passes that cost the
residual before XLA sees it: derivative code computes the same primal
twice (``jacfwd(L)`` and ``L`` each evaluate ``H @ xi``), and the affine
collapse, counting both copies, would replace one by a new matrix-vector
product that XLA could not merge with the other.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from pejit._residual._cse import eliminate
  >>> cj = jax.make_jaxpr(lambda A, x: (A @ x) * (A @ x))(jnp.ones((2, 2)), jnp.ones(2))
  >>> [e.primitive.name for e in eliminate(cj.jaxpr).eqns]
  ['dot_general', 'mul']
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from .._fold._primitives import literal_key, params_key


def _atom_key(a, rename: dict) -> Any:
    return literal_key(a) if isinstance(a, _compat.Literal) else rename.get(a, a)


def eliminate(jaxpr):
    """``jaxpr`` with each equation that repeats an earlier one (same primitive,
    parameters and inputs) dropped and its outputs renamed to the earlier one's.

    Effectful equations are never merged, nor one with an unread output (it
    could not stand for a later one whose output is read); nested bodies are
    left as they are.
    """
    seen: dict[Any, list] = {}
    rename: dict = {}
    eqns = []
    for eqn in jaxpr.eqns:
        invars = [rename.get(a, a) if isinstance(a, _compat.Var) else a for a in eqn.invars]
        eqn = eqn.replace(invars=invars)
        key = None
        if not eqn.effects and not any(isinstance(v, _compat.drop_var) for v in eqn.outvars):
            key = (eqn.primitive, params_key(eqn.params), tuple(_atom_key(a, rename) for a in invars))
            try:
                earlier = seen.get(key)
            except TypeError:  # an unhashable parameter: compare nothing
                key = earlier = None
            if earlier is not None:
                rename.update(zip(eqn.outvars, earlier))
                continue
        if key is not None:
            seen[key] = eqn.outvars
        eqns.append(eqn)
    if not rename:
        return jaxpr
    outvars = [rename.get(a, a) if isinstance(a, _compat.Var) else a for a in jaxpr.outvars]
    return jaxpr.replace(eqns=eqns, outvars=outvars)
