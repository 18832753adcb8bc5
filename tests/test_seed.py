"""The examples of the seed documents, reproduced with pejit.

Seed 000 is TFC's pe/pejit notebook; seed 001 is JAX's jit tutorial, whose
value-dependent functions fail under jax.jit but work with constants folded.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import ad

from pejit import pe, pejit

from ._util import primitive_names

# -- seed 000, part 1: f(x, xi) = H(x) @ xi with a Chebyshev basis ----------


def chebyshev_H(x, deg=2, x0=0.0, xf=1.0):
    """Chebyshev polynomials T_0..T_deg at x mapped from [x0, xf] to [-1, 1]."""
    z = 2.0 * (x - x0) / (xf - x0) - 1.0
    cols = [jnp.ones_like(z), z]
    for _ in range(deg - 1):
        cols.append(2 * z * cols[-1] - cols[-2])
    return jnp.stack(cols[: deg + 1], axis=1)


X = jnp.array([0.0, 0.5, 1.0])  # utfc(3, 0, 2, x0=0, xf=1).x
XI = jnp.ones(3)


def f_basis(x, xi):
    return jnp.dot(chebyshev_H(x), xi)


def test_pe_jaxpr_shows_folded_basis_as_constant():
    f_pe = pe(X, XI, constant_arg_nums=[0])(f_basis)
    closed = jax.make_jaxpr(f_pe)(XI)
    # As printed in the seed: one dot_general on a 3x3 constant.
    assert [e.primitive.name for e in closed.eqns] == ["dot_general"]
    (const,) = closed.consts
    np.testing.assert_array_equal(const, [[1, -1, 1], [1, 0, -1], [1, 1, 1]])
    np.testing.assert_allclose(f_pe(XI), f_basis(X, XI))


def test_pejit_hlo_has_no_basis_computation():
    f_pj = pejit(X, XI, constant_arg_nums=[0])(f_basis)
    # The programs as lowered, before XLA's passes (XLA:GPU may compile a
    # small dot as multiplies and a reduction).
    hlo_original = jax.jit(f_basis).lower(X, XI).as_text()
    hlo = f_pj.lower(XI).as_text()
    # The basis costs multiplies/subtracts on x in the original program; the
    # residual program only has the dot with the folded basis.
    assert "stablehlo.multiply" in hlo_original and "stablehlo.subtract" in hlo_original
    assert "stablehlo.multiply" not in hlo and "stablehlo.subtract" not in hlo
    assert "stablehlo.dot_general" in hlo
    np.testing.assert_allclose(f_pj.lower(XI).compile()(XI), [1.0, 0.0, 3.0])


# -- seed 000, part 2: a primitive with impl and JVP but no lowering rule ---

H_p = Primitive("H_seed000")


def H(x, d=0):
    return H_p.bind(x, d=d)


def _H_impl(x, d=0):
    x = np.asarray(x)
    if d == 0:
        return np.vstack((x, x**2, x**3, x**4)).T
    if d == 1:
        return np.vstack((np.ones_like(x), 2 * x, 3 * x**2, 4 * x**3)).T
    raise ValueError("Derivatives beyond order 2 have not been implemented yet.")


H_p.def_impl(_H_impl)
H_p.def_abstract_eval(lambda x, d=0: jax.core.ShapedArray((x.shape[0], 4), x.dtype))


def _H_jvp(primals, tangents, d=0):
    (x,), (dx,) = primals, tangents
    return H(x, d=d), H(x, d=d + 1) * jnp.expand_dims(dx, 1)


ad.primitive_jvps[H_p] = _H_jvp


def egrad(g):
    """TFC's elementwise derivative."""
    return lambda x: jax.jvp(g, (x,), (jnp.ones_like(x),))[1]


dH = egrad(H)


def f_custom(x, xi):
    return x + jnp.dot(dH(x), xi)


X2 = jnp.array([1.0, 2.0, 3.0])
XI2 = jnp.array([1.0, 2.0, 3.0, 4.0])


def test_custom_primitive_has_no_lowering():
    with pytest.raises(NotImplementedError, match="H_seed000"):
        jax.jit(f_custom)(X2, XI2)


@pytest.mark.parametrize("make", ["functional", "decorator", "call_time"])
def test_custom_primitive_folds(make):
    if make == "functional":
        g = pejit(X2, XI2, constant_arg_nums=[0])(f_custom)
        out = g(XI2)
    elif make == "decorator":

        @pejit(X2, XI2, constant_arg_nums=[0])
        def g(x, xi):
            return x + jnp.dot(dH(x), xi)

        out = g(XI2)
    else:
        out = pejit(f_custom, constant_argnums=0)(X2, XI2)
    np.testing.assert_array_equal(out, [31.0, 175.0, 529.0])


def test_custom_primitive_differentiated_wrt_dynamic_argument():
    g = pejit(X2, XI2, constant_arg_nums=[0])(f_custom)
    grad = jax.grad(lambda xi: g(xi).sum())(XI2)
    # d/dxi sum(x + dH(x) @ xi) = column sums of dH(x)
    np.testing.assert_allclose(grad, _H_impl(np.asarray(X2), d=1).sum(0))
    assert "H_seed000" not in primitive_names(jax.make_jaxpr(g)(XI2))


# -- seed 001: value-dependent Python control flow --------------------------


def f_if(x):
    if x > 0:
        return x
    else:
        return 2 * x


def g_while(x, n):
    i = 0
    while i < n:
        i += 1
    return x + i


def test_seed001_if_on_constant():
    with pytest.raises(jax.errors.TracerBoolConversionError):
        jax.jit(f_if)(10)
    f_c = pejit(lambda c, y: f_if(c) + y, constant_argnums=0)
    assert f_c(10, 0.0) == 10.0
    assert f_c(-3, 0.0) == -6.0


def test_seed001_while_on_constant():
    g_c = pejit(g_while, constant_argnums=1)
    assert g_c(10, 20) == 30
    assert g_c(jnp.float32(1.5), 3) == 4.5
    g_tfc = pejit(10, 20, constant_arg_nums=[1])(g_while)
    assert g_tfc(5) == 25
