"""The jaxpr walks of ``pejit._fold._primitives``."""

import jax
import jax.numpy as jnp
from jax import lax

from pejit._fold._primitives import all_eqns


def test_all_eqns_visits_each_body_once_and_every_level():
    inner = jax.jit(jnp.cos)

    def branch(x):
        return inner(inner(x))  # one body, two calls

    def f(x, i):
        y = lax.cond(i > 0, branch, jnp.tanh, x)
        return jax.jit(lambda z: jnp.sin(inner(z)))(y) + inner(y)

    closed = jax.make_jaxpr(f)(1.0, 1)
    names = sorted(e.primitive.name for e in all_eqns(closed))
    # (cos once, for five calls in three programs; every level's own equations)
    assert names.count("cos") == 1 and names.count("tanh") == 1 and names.count("sin") == 1
    assert names.count("cond") == 1 and names.count("add") == 1
    calls = [e for e in all_eqns(closed) if "jaxpr" in e.params and e.primitive.name != "cond"]
    assert len(calls) == 5  # two in the branch, one outer call, one inside it, one at the top
