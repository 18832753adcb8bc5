"""Seed 000, part 2: a custom primitive with an ``impl`` and a JVP rule, no lowering rule.

``jax.jit`` cannot compile ``f(x, xi) = x + dH(x) @ xi`` at all (``H`` has no
MLIR lowering). With ``x`` constant, pejit evaluates ``H`` and its derivative
once, with their ``impl``, and compiles only the product with ``xi``; the
result is differentiable in ``xi``. Run: ``python examples/custom_primitive.py``.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.extend.core import Primitive  # noqa: E402
from jax.interpreters import ad  # noqa: E402

from pejit import explain, pejit  # noqa: E402

H_p = Primitive("H")


def H(x, d=0):
    """The d-th derivative of the basis [x, x**2, x**3, x**4], one row per point."""
    return H_p.bind(x, d=d)


def H_impl(x, *, d):
    x = np.asarray(x)
    if d == 0:
        return np.stack((x, x**2, x**3, x**4), axis=-1)
    if d == 1:
        return np.stack((np.ones_like(x), 2 * x, 3 * x**2, 4 * x**3), axis=-1)
    raise ValueError("Derivatives beyond order 1 have not been implemented yet.")


def H_abstract_eval(x, *, d):
    return jax.core.ShapedArray((*x.shape, 4), x.dtype)


def H_jvp(primals, tangents, *, d):
    (x,), (dx,) = primals, tangents
    return H(x, d=d), H(x, d=d + 1) * jnp.expand_dims(dx, -1)


H_p.def_impl(H_impl)
H_p.def_abstract_eval(H_abstract_eval)
ad.primitive_jvps[H_p] = H_jvp  # no lowering rule: jax.jit cannot compile H


def egrad(g):
    """TFC's elementwise derivative: the JVP with a tangent of ones."""
    return lambda x: jax.jvp(g, (x,), (jnp.ones_like(x),))[1]


def f(x, xi):
    return x + egrad(H)(x) @ xi


def main():
    x = jnp.array([1.0, 2.0, 3.0])
    xi = jnp.array([1.0, 2.0, 3.0, 4.0])

    try:
        jax.jit(f)(x, xi)
    except NotImplementedError as e:
        print("jax.jit(f) fails:", str(e).splitlines()[0])

    f_pejit = pejit(x, xi, constant_arg_nums=[0])(f)

    @pejit(x, xi, constant_arg_nums=[0])  # the decorator form
    def f_pejit_2(x, xi):
        return x + egrad(H)(x) @ xi

    print("f_pejit(xi)   =", f_pejit(xi))
    print("f_pejit_2(xi) =", f_pejit_2(xi))
    np.testing.assert_array_equal(f_pejit(xi), [31.0, 175.0, 529.0])
    np.testing.assert_array_equal(f_pejit_2(xi), [31.0, 175.0, 529.0])

    # Differentiable in the dynamic argument: d f / d xi = dH(x).
    jac = jax.jacobian(f_pejit)(xi)
    print("jacobian w.r.t. xi:\n", jac)
    np.testing.assert_array_equal(jac, H_impl(np.asarray(x), d=1))

    print("\nexplain:")
    print(explain(f_pejit, xi))


if __name__ == "__main__":
    main()
