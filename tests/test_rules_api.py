"""Adding a fold rule from outside pejit: one file, this one.

A primitive of the user's own, ``solve(A, b)``, has an ``impl`` and an
abstract evaluation but no lowering. Its fold rule, registered here with the
public ``pejit.register_fold_rule``, folds the inverse of a known ``A`` and
leaves one product on the dynamic ``b``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive

import pejit
from pejit import pe, register_fold_rule

solve_p = Primitive("test_rules_api_solve")
solve_p.def_impl(jnp.linalg.solve)
solve_p.def_abstract_eval(lambda A, b: jax.core.ShapedArray(b.shape, b.dtype))

seen = []  # what the rule was called with: (A known, b known)


@register_fold_rule(solve_p)
def fold_solve(folder, trace, prim, args, params):
    A, b = args
    seen.append((folder.is_known(A), folder.is_known(b)))
    if not folder.is_known(A) or folder.is_known(b):
        return NotImplemented  # default policy: fold if all known, else stage
    with trace.as_current():  # known work folds, the rest is staged
        return jnp.linalg.inv(A) @ b


def solve(A, b):
    return solve_p.bind(A, b)


A = jnp.array([[2.0, 1.0], [0.0, 4.0]])
b = jnp.array([1.0, 3.0])


def expected(A, b):
    return np.linalg.solve(np.asarray(A, np.float64), np.asarray(b, np.float64))


def test_register_fold_rule_is_public():
    assert "register_fold_rule" in pejit.__all__


def test_rule_folds_the_known_part_of_a_user_primitive():
    seen.clear()
    f = pejit.pejit(solve, constant_argnums=0)
    np.testing.assert_allclose(f(A, b), expected(A, b), rtol=1e-5)
    assert (True, False) in seen
    residual = f.specialize(A, b).program.jaxpr
    # The primitive (which has no lowering) is gone; one product is left.
    assert [e.primitive.name for e in residual.eqns] == ["dot_general"]
    # A new constant value goes through the rule too, with the right result.
    A2 = A + 1.0
    np.testing.assert_allclose(f(A2, b), expected(A2, b), rtol=1e-5)
    np.testing.assert_allclose(f(A2, 2 * b), expected(A2, 2 * b), rtol=1e-5)


def test_rule_declines_when_nothing_is_known():
    seen.clear()
    g = pe(solve, constant_argnums=())
    np.testing.assert_allclose(g(A, b), expected(A, b), rtol=1e-5)
    assert seen == [(False, False)]
    names = [e.primitive.name for e in g.specialize(A, b).program.jaxpr.eqns]
    assert names == ["test_rules_api_solve"]  # staged as it is


def test_rule_applies_inside_a_loop_body():
    def f(A, bs):
        return jax.lax.scan(lambda c, b: (c, solve(A, b)), 0.0, bs)[1]

    bs = jnp.stack([b, 2 * b, 3 * b])
    g = pejit.pejit(f, constant_argnums=0)
    np.testing.assert_allclose(g(A, bs), np.stack([expected(A, x) for x in bs]), rtol=1e-5)
    inner = [
        e.primitive.name
        for eqn in g.specialize(A, bs).program.jaxpr.eqns if eqn.primitive.name == "scan"
        for e in eqn.params["jaxpr"].jaxpr.eqns
    ]
    assert "test_rules_api_solve" not in inner and "dot_general" in inner, inner


@pytest.mark.parametrize("known", [True, False])
def test_rule_agrees_with_the_primitive(known):
    # The rule must not change results: compare with the primitive's impl.
    f = pe(solve, constant_argnums=0 if known else ())
    np.testing.assert_allclose(f(A, b), solve_p.impl(A, b), rtol=1e-5)
