"""TFC's own kind of programs (issue 13), written in pure JAX.

``tfc`` is only a bench extra (importing it turns on x64 for the whole
process), so its constructions are rebuilt here: a basis primitive with an
``impl``, a JVP rule binding itself with ``d + 1``, a batching rule and an
abstract evaluation that raises (as TFC's Python basis backend's does), and
``egrad``, TFC's elementwise derivative through ``jax.jvp``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Literal, Primitive, Var
from jax.interpreters import ad, batching

from pejit import FoldOptions, pejit
from pejit._fold._primitives import FUSES_OPERANDS

from ._util import primitive_names

M = 4  # basis functions 1, x, x**2, x**3


def monomials(x, d: int = 0):
    """d-th derivative of the monomial basis at points ``x`` (NumPy)."""
    x = np.asarray(x, np.float64)
    cols = [
        math.perm(k, d) * x ** (k - d) if k >= d else np.zeros_like(x)
        for k in range(M)
    ]
    return np.stack(cols, axis=-1).astype(np.float32)


H_p = Primitive("H_test_basis")
H_p.def_impl(lambda x, d=0: monomials(x, d))


def _abstract_eval(x, d=0):
    raise AttributeError("'CP' object has no attribute 'm'")


H_p.def_abstract_eval(_abstract_eval)


def H(x, d=0):
    return H_p.bind(x, d=d)


def _jvp(primals, tangents, d=0):
    # as TFC's: the tangent accumulates on zeros, each term a product with
    # the next derivative, broadcast along the basis functions
    (x,), (dx,) = primals, tangents
    out = jnp.zeros((*x.shape, M))
    if type(dx) is not ad.Zero:
        out += H(x, d + 1) * jnp.expand_dims(dx, -1)
    return H(x, d), out


def _batch(args, dims, d=0):
    (x,), (bd,) = args, dims
    x = jnp.moveaxis(x, bd, 0)
    flat = H(x.reshape(-1), d)
    return flat.reshape(*x.shape, M), 0


ad.primitive_jvps[H_p] = _jvp
batching.primitive_batchers[H_p] = _batch


def egrad(g, j=0):
    """TFC's ``egrad``: the elementwise derivative of ``g`` in argument ``j``."""

    def wrapped(*args):
        tans = tuple(np.ones(np.shape(a), np.float32) if i == j else np.zeros(np.shape(a), np.float32)
                     for i, a in enumerate(args))
        return jax.jvp(g, args, tans)[1]

    return wrapped


X = jnp.array([1.0, 2.0, 3.0])


# -- item 1: primitives whose abstract evaluation fails -------------------------


def test_failing_abstract_eval_is_evaluated_on_known_inputs():
    f = lambda x, xi: jnp.dot(H(x), xi)  # noqa: E731
    xi = jnp.arange(1.0, M + 1)
    g = pejit(X, xi, constant_arg_nums=[0])(f)
    np.testing.assert_allclose(g(xi), monomials(X) @ np.asarray(xi), rtol=1e-6)
    report = g.report(xi)
    assert report.eager_evaluations == {"H_test_basis": 1}
    assert report.folded["H_test_basis"] == 1
    assert "evaluated without abstract evaluation: H_test_basis x1" in str(report)
    assert "H_test_basis" not in primitive_names(report.after)


def test_issue_reproduction_two_columns():
    P = Primitive("H_issue")
    P.def_impl(lambda x: np.vstack((x, x**2)).T)

    def abstract_eval(x):
        raise AttributeError("'CP' object has no attribute 'm'")

    P.def_abstract_eval(abstract_eval)
    f = lambda x, xi: jnp.dot(P.bind(x), xi)  # noqa: E731
    xi = jnp.ones(2)
    np.testing.assert_allclose(pejit(X, xi, constant_arg_nums=[0])(f)(xi), [2.0, 6.0, 12.0])


def test_failing_abstract_eval_on_an_unknown_input_still_raises():
    f = lambda x, xi: jnp.dot(H(x), xi)  # noqa: E731
    with pytest.raises(AttributeError, match="no attribute 'm'"):
        pejit(f)(X, jnp.ones(M))


def residual(x, xi):
    """A TFC-style differential residual: u'' + u through nested ``egrad``."""
    u = lambda x, xi: jnp.dot(H(x), xi)  # noqa: E731
    return egrad(egrad(u))(x, xi) + u(x, xi)


def residual_numpy(x, xi):
    x, xi = np.asarray(x, np.float64), np.asarray(xi, np.float64)
    return (monomials(x, 2) + monomials(x)).astype(np.float64) @ xi


def test_egrad_chain_binds_the_primitive_with_higher_derivatives():
    xi = jnp.array([0.5, -1.0, 2.0, 0.25])
    g = pejit(X, xi, constant_arg_nums=[0])(residual)
    np.testing.assert_allclose(g(xi), residual_numpy(X, xi), rtol=1e-5)
    report = g.report(xi)
    assert report.eager_evaluations["H_test_basis"] >= 3  # d = 0, 1, 2
    assert "H_test_basis" not in primitive_names(report.after)


def test_jvp_and_vmap_of_the_egrad_chain():
    xs = jnp.stack([X, X + 1.0])  # two point sets, constant
    xi = jnp.array([0.5, -1.0, 2.0, 0.25])
    batched = lambda xs, xi: jax.vmap(residual, in_axes=(0, None))(xs, xi)  # noqa: E731
    g = pejit(batched, constant_argnums=0)
    want = np.stack([residual_numpy(x, xi) for x in np.asarray(xs)])
    np.testing.assert_allclose(g(xs, xi), want, rtol=1e-5)
    # the derivative in xi (jvp through the folded basis) is the residual's own matrix
    dxi = jnp.array([1.0, 0.0, 0.0, 0.0])
    _, tangent = jax.jvp(lambda xi: g(xs, xi), (xi,), (dxi,))
    np.testing.assert_allclose(tangent, np.stack([residual_numpy(x, dxi) for x in np.asarray(xs)]), rtol=1e-5)
    # and the jvp in x inside the function, folded: egrad of the batched residual
    h = pejit(lambda xs, xi: egrad(batched)(xs, xi), constant_argnums=0)
    eps = 1e-3
    fd = (np.stack([residual_numpy(x + eps, xi) for x in np.asarray(xs, np.float64)])
          - np.stack([residual_numpy(x - eps, xi) for x in np.asarray(xs, np.float64)])) / (2 * eps)
    np.testing.assert_allclose(h(xs, xi), fd, rtol=1e-3, atol=1e-3)
    assert h.report(xs, xi).eager_evaluations["H_test_basis"] >= 1


def test_abstract_constants_fall_back_per_value_with_the_reason():
    f = pejit(residual, constant_argnums=0)
    xi = jnp.array([0.5, -1.0, 2.0, 0.25])
    for x in (X, X + 1.0, X + 2.0):  # the second value tries the value-independent program
        np.testing.assert_allclose(f(x, xi), residual_numpy(x, xi), rtol=1e-5)
    (note,) = f.report(X + 2.0, xi).fallbacks
    assert "each new constant value is traced and folded again" in note
    assert "AttributeError" in note


# -- item 2: per-call cost of the cheap-expansion pass -----------------------------


def _known_outputs(jaxpr):
    """Variables of the residual ``jaxpr`` computed from constants only (recomputed every call)."""
    known = set(jaxpr.constvars)
    for e in jaxpr.eqns:
        if all(isinstance(v, Literal) or v in known for v in e.invars):
            known.update(e.outvars)
    return known - set(jaxpr.constvars)


def test_least_squares_residual_recomputes_nothing_a_matrix_product_reads():
    # TFC's basis tangents are zeros + H' * broadcast(ones): lazy expansions
    # (a 512 x 4 array from a 512-vector); they feed matrix products
    x, xi = jnp.linspace(0.0, 1.0, 512), jnp.array([0.5, -1.0, 2.0, 0.25])

    def solve(x, xi):
        return jnp.linalg.lstsq(jax.jacfwd(residual, 1)(x, xi), residual(x, xi))[0]

    lazy = pejit(solve, constant_argnums=0)
    stored = pejit(solve, constant_argnums=0, fold_options=FoldOptions(rematerialize=False))
    K = monomials(x, 2).astype(np.float64) + monomials(x)
    want = np.linalg.lstsq(K, K @ np.asarray(xi, np.float64), rcond=None)[0]
    np.testing.assert_allclose(lazy(x, xi), want, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(lazy(x, xi), stored(x, xi), rtol=1e-6)
    jaxpr = lazy.report(x, xi).after.jaxpr
    # as many residual equations as when nothing is recomputed ...
    assert len(jaxpr.eqns) == len(stored.report(x, xi).after.jaxpr.eqns)
    # ... and no equation that XLA cannot fuse reads known work recomputed per call
    recomputed = _known_outputs(jaxpr)
    unfused = [e for e in jaxpr.eqns if e.primitive not in FUSES_OPERANDS]
    assert unfused and not any(v in recomputed for e in unfused for v in e.invars if isinstance(v, Var))


def test_expansion_feeding_only_elementwise_work_is_still_recomputed():
    def f(x, xi):
        t = egrad(lambda x: H(x) * 1.0)(x)  # zeros + H' * broadcast(ones), never stored
        return t + xi

    x = jnp.linspace(0.0, 1.0, 512)
    g = pejit(f, constant_argnums=0)
    xi = jnp.ones((512, M))
    np.testing.assert_allclose(g(x, xi), monomials(x, 1) + 1.0, rtol=1e-6)
    report = g.report(x, xi)
    assert report.rematerialized["broadcast_in_dim"] >= 1
    assert report.folded_bytes <= 2 * 512 * M * 4  # H' itself, not its expansions
