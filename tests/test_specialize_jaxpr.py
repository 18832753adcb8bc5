"""``specialize_jaxpr``: partial evaluation of a jaxpr built by anything."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import jaxpr_as_fun

from pejit import FoldOptions, specialize_jaxpr

from ._util import primitive_names

A = jnp.array([[2.0, 0.5, 0.0], [0.1, 3.0, 0.2], [0.0, 0.3, 1.5]])
X = jnp.array([1.0, -2.0, 0.5])


def f(s, A, x, flag):
    y = lax.cond(flag, lambda x: jnp.linalg.inv(A) @ x, lambda x: x, x)
    y = lax.scan(lambda c, _: (jnp.tanh(jnp.linalg.inv(A) @ c) * s, None), y, length=5)[0]
    return jnp.sum(y**2)


ARGS = (0.5, A, X, True)
CLOSED = jax.make_jaxpr(f)(*ARGS)
SPEC = specialize_jaxpr(CLOSED, known={1: A, 3: True})


def reference(s, x):
    return f(s, A, x, True)


def test_residual_takes_the_unknown_inputs_in_order_and_folds():
    assert [v.aval.shape for v in SPEC.jaxpr.jaxpr.invars] == [(), (3,)]
    names = primitive_names(SPEC.jaxpr)
    assert "cond" not in names and "lu" not in names and "scan" in names
    assert SPEC.report.folded_eqns > 0 and SPEC.report.before is CLOSED
    np.testing.assert_allclose(jaxpr_as_fun(SPEC.jaxpr)(0.5, X)[0], reference(0.5, X), rtol=1e-6)


def test_runs_under_jit_vmap_and_grad():
    fun = jaxpr_as_fun(SPEC.jaxpr)
    np.testing.assert_allclose(jax.jit(fun)(0.5, X)[0], reference(0.5, X), rtol=1e-6)
    xs = jnp.stack([X, 2 * X, -X])
    got = jax.vmap(lambda x: fun(0.5, x)[0])(xs)
    np.testing.assert_allclose(got, jax.vmap(lambda x: reference(0.5, x))(xs), rtol=1e-6)
    grad = jax.grad(lambda s, x: fun(s, x)[0], argnums=(0, 1))(0.5, X)
    want = jax.grad(reference, argnums=(0, 1))(0.5, X)
    for g, w in zip(grad, want):
        np.testing.assert_allclose(g, w, rtol=1e-5)


def test_options_apply():
    spec = specialize_jaxpr(CLOSED, known={1: A, 3: True}, options=FoldOptions(branches=False))
    assert "cond" in primitive_names(spec.jaxpr)
    np.testing.assert_allclose(jaxpr_as_fun(spec.jaxpr)(0.5, X)[0], reference(0.5, X), rtol=1e-6)


@pytest.mark.parametrize(
    "known, error, match",
    [
        ({"A": A}, TypeError, "known key 'A'"),
        ({1.0: A}, TypeError, "known key 1.0"),
        ({7: A}, ValueError, "known key 7"),
        ({1: X}, TypeError, r"known\[1\]"),
    ],
)
def test_bad_known_keys_name_the_key(known, error, match):
    with pytest.raises(error, match=match):
        specialize_jaxpr(CLOSED, known=known)


def test_rejects_what_is_not_a_jaxpr():
    with pytest.raises(TypeError, match="closed_jaxpr must be a jax.extend.core.ClosedJaxpr.*got function"):
        specialize_jaxpr(lambda a, x: a * x, known={})


@pytest.mark.skipif(
    jax.extend.core.ClosedJaxpr is jax.extend.core.Jaxpr,
    reason="JAX >= 0.11: every Jaxpr is closed (ClosedJaxpr is an alias), so there is no open one to reject",
)
def test_rejects_non_closed_jaxpr():
    with pytest.raises(TypeError, match="closed_jaxpr"):
        specialize_jaxpr(CLOSED.jaxpr, known={})
