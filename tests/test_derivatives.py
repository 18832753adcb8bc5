"""Derivatives of pejit functions as JAX's own suites check them (issue 71): ``check_grads``
at orders 1 and 2, forward and reverse, w.r.t. the dynamic arguments, the others folded.

Folding makes values known that JAX's own tracing would leave linear, and gives the
constants symbolic zero tangents. Two kinds of JAX rule cannot take that: a transpose
rule that assumes a known input beside a linear one is impossible (``pad``'s, with its
operand folded and its padding value differentiated), and a JVP rule that cannot take
a symbolic zero tangent beside a nonzero one (``lax.reduce`` of several operands).
Plain JAX fails on both where the same argument is a constant (closed over, or not
differentiated); JAX's tests pass because they perturb every argument, as the
references here do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from pejit import pejit
from pejit._jit import call_path

pytestmark = pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")

RNG = np.random.default_rng(0)
C = RNG.standard_normal((2, 3)).astype(np.float32)
PADS = {"edges and interior": [(1, 2, 1), (0, 1, 0)], "negative": [(-1, 0, 0), (-1, 0, 2)]}


def padded(c, v, pads):
    return jnp.sin(lax.pad(c, v, pads))  # nonlinear, so that second derivatives are not zero


@pytest.mark.parametrize("pads", PADS.values(), ids=PADS)
def test_a_padding_value_differentiated_beside_a_folded_operand(pads):
    # JAX's pad transposes its padding value only with its operand linear too; here the
    # operand is a constant, and so is its zero tangent in the derivative's fold
    pf = pejit(lambda c, v: padded(c, v, pads), constant_argnums=0)
    v = np.float32(0.3)
    check_grads(lambda v: pf(C, v), (v,), 2, ["fwd", "rev"], eps=1e-2)
    # against JAX's own derivatives with both arguments perturbed (all it can take)
    loss = lambda c, v: padded(c, v, pads).sum()  # noqa: E731
    np.testing.assert_allclose(jax.grad(lambda v: pf(C, v).sum())(v), jax.grad(loss, (0, 1))(C, v)[1], rtol=1e-6)
    want = jax.hessian(loss, (0, 1))(C, v)[1][1]
    for hessian in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f)), lambda f: jax.jacrev(jax.jacfwd(f))):
        np.testing.assert_allclose(hessian(lambda v: pf(C, v).sum())(v), want, rtol=1e-5)
    # the TFC form folds the same way
    tfc = pejit(C, v, constant_arg_nums=[0])(lambda c, v: padded(c, v, pads))
    check_grads(tfc, (v,), 2, ["fwd", "rev"], eps=1e-2)


SECOND_ORDER = {
    "jacfwd(jacrev)": lambda f: jax.jacfwd(jax.jacrev(f)),
    "jacrev(jacfwd)": lambda f: jax.jacrev(jax.jacfwd(f)),
    "jacrev(jacrev)": lambda f: jax.jacrev(jax.jacrev(f)),
    "jacfwd(jacfwd)": lambda f: jax.jacfwd(jax.jacfwd(f)),
}


@pytest.mark.parametrize("order", SECOND_ORDER.values(), ids=SECOND_ORDER)
def test_second_derivatives_through_a_folded_constant(order):
    # jax.jacrev of jax.jacfwd linearizes the derivative's rule under vmap: on JAX 0.12,
    # which stages a custom_jvp call under partial evaluation with no output known, the
    # rule's own pejit call must not hand JAX another one there
    f = lambda c, v: jnp.sin(jnp.linalg.inv(c) @ v)  # noqa: E731
    c = jnp.asarray(RNG.standard_normal((3, 3)), jnp.float32) + 3 * jnp.eye(3)
    v = jnp.asarray(RNG.standard_normal(3), jnp.float32)
    pf = pejit(f, constant_argnums=0)
    want = jax.jit(order(lambda v: f(c, v)))(v)
    np.testing.assert_allclose(order(lambda v: pf(c, v))(v), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(order(lambda v: pf(c, v)))(v), want, rtol=1e-5, atol=1e-6)


def test_a_pad_of_a_folded_operand_is_the_same_values_and_stores_the_operand():
    # it is staged as a select between the padded operand and the padding value:
    # exact for every value, and the residual still stores the operand alone
    c = np.arange(12, dtype=np.float32).reshape(3, 4)
    c[0, :3] = -0.0, np.inf, np.nan
    f = lambda c, v: lax.pad(c, v, [(1, 2, 1), (-1, 1, 0)])  # noqa: E731
    pf = pejit(f, constant_argnums=0)
    for v in map(np.float32, (1.5, -0.0, np.nan, -np.inf)):
        assert np.asarray(pf(c, v)).tobytes() == np.asarray(jax.jit(f)(c, v)).tobytes()
    spec = pf.specialize(c, np.float32(0))
    assert [np.shape(k) for k in spec.consts] == [c.shape]
    assert "pad" not in [e.primitive.name for e in jax.make_jaxpr(jax.grad(lambda v: pf(c, v).sum()))(1.0).eqns]


XS = RNG.standard_normal((4, 5)).astype(np.float32)
YS = RNG.standard_normal((4, 5)).astype(np.float32)
INITS = (np.float32(0), np.float32(1))


def reduce_pair(xs, ys):
    """A sum of ``xs`` and a product of ``ys`` in one ``lax.reduce``."""
    return lax.reduce((xs, ys), INITS, lambda a, b: (a[0] + b[0], a[1] * b[1]), (0,))


def test_a_reduce_of_a_folded_operand_and_a_differentiated_one():
    # JAX's JVP rule of a reduce of several operands reshapes each tangent, a symbolic
    # zero too: jax.jvp fails where an operand is a constant. The derivative is folded
    # again with zero arrays as the constants' tangents, once, and its report says so.
    traced = []

    def fun(xs, ys):
        traced.append(1)
        return reduce_pair(xs, ys)

    pf = pejit(fun, constant_argnums=0)
    check_grads(lambda ys: pf(XS, ys), (YS,), 2, ["fwd", "rev"], rtol=1e-2, atol=1e-2)
    loss = lambda xs, ys: sum(o.sum() for o in reduce_pair(xs, ys))  # noqa: E731
    grad = jax.grad(lambda ys: sum(o.sum() for o in pf(XS, ys)))
    np.testing.assert_allclose(grad(YS), jax.grad(loss, (0, 1))(XS, YS)[1], rtol=1e-6)
    before = len(traced)
    grad(2 * YS)
    assert len(traced) == before  # the fold that failed is not tried again
    notes = [n for spec in call_path(pf)._derivative().caches.specializations.values() for n in spec.report.fallbacks]
    assert notes and all("perturbed by zero tangents" in n and "Zero" in n for n in notes)  # the symbolic zero


def test_an_error_of_the_function_in_its_derivative_is_raised_as_it_is():
    @jax.custom_jvp
    def scaled(c, y):
        return c * y

    @scaled.defjvp
    def _(primals, tangents):
        raise ValueError("the rule's own error")

    pf = pejit(scaled, constant_argnums=0)
    for derivative in (jax.grad(lambda y: pf(XS, y).sum()), lambda y: jax.jvp(lambda y: pf(XS, y), (y,), (y,))):
        with pytest.raises(ValueError, match="the rule's own error"):
            derivative(YS)


def test_derivatives_of_the_constants_alone_are_not_folded_by_default():
    # the constants' tangents are symbolic zeros: their work has no tangent to fold
    pf = pejit(lambda a, y: jnp.linalg.inv(a) @ y, constant_argnums=0)
    a = jnp.asarray(RNG.standard_normal((6, 6)), jnp.float32) + 6 * jnp.eye(6)
    jax.grad(lambda y: pf(a, y).sum())(jnp.ones(6))
    (spec,) = call_path(pf)._derivative().caches.specializations.values()
    assert not spec.report.fallbacks
    assert [e.primitive.name for e in spec.residual.jaxpr.eqns].count("dot_general") == 2  # value and tangent
