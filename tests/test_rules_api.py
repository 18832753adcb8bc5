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


# -- one registration for every facet of a primitive (pejit._residual.rules.registry) ----------
def _facets():
    return dict(
        fold=lambda folder, trace, prim, args, params: NotImplemented,
        saving=lambda eqn, known, producers, nested: None,
        cost=lambda eqn: None,
        host=lambda x: x,
        affine=lambda eqn, known: True,
        additive=range,
        linear=lambda args, batched: args[0],
        fixed=lambda n: (),
    )


def test_register_primitive_writes_each_facet_into_the_table_its_layer_reads():
    from pejit._fold import _cost, _fold_rules, _host, _known
    from pejit._residual import _linear
    from pejit._residual.rules import affine, register_primitive

    p = Primitive("test_rules_api_facets")
    facets = _facets()
    register_primitive(p, deferred=True, known_by_default=True, **facets)
    tables = {"fold": _fold_rules.fold_rules, "saving": _known.saving_rules, "cost": _cost.cost_rules,
              "host": _host.HOST_RULES, "affine": affine.affine_rules, "additive": affine.ADDITIVE,
              "linear": _linear.LINEAR_RULES, "fixed": _linear.FIXED}
    assert {name: table[p] for name, table in tables.items()} == facets
    assert p in _fold_rules.deferred_ok and p in _fold_rules.known_by_default
    # a fold rule registered again comes with its own flags; the other facets stay
    again = _facets()["fold"]
    register_fold_rule(p)(again)
    assert _fold_rules.fold_rules[p] is again and _cost.cost_rules[p] is facets["cost"]
    assert p not in _fold_rules.deferred_ok and p not in _fold_rules.known_by_default


def test_register_primitive_names_what_is_wrong():
    from pejit._residual.rules import register_primitive

    p = Primitive("test_rules_api_wrong")
    with pytest.raises(TypeError, match="prims must be jax.extend.core.Primitive"):
        register_primitive("add", cost=lambda eqn: None)
    with pytest.raises(TypeError, match="host must be callable"):
        register_primitive(p, host=2.0)
    with pytest.raises(ValueError, match="deferred describes a fold rule"):
        register_primitive(p, cost=lambda eqn: None, deferred=True)
    with pytest.raises(ValueError, match="fixed describes a linear rule"):
        register_primitive(p, affine=lambda eqn, known: True, fixed=lambda n: ())
    with pytest.raises(ValueError, match="no facet given"):
        register_primitive(p)


def test_the_built_in_rules_say_which_leave_known_applications_to_the_default_rule():
    from jax.extend.core import primitives as P

    from pejit import _compat
    from pejit._fold._fold_rules import fold_rules, known_by_default

    assert {_compat.jit_p, _compat.remat_p, P.scan_p, P.while_p, P.dot_general_p} <= known_by_default
    assert P.cond_p in fold_rules and P.cond_p not in known_by_default  # it inlines the known branch instead
