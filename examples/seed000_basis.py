"""Seed 000, part 1: ``f(x, xi) = H(x) @ xi`` with a constant Chebyshev basis.

The example of TFC's ``pejit`` documentation: ``x`` (the collocation points)
is constant, so the basis matrix ``H(x)`` is computed once; the compiled
program is a single matrix-vector product. Run: ``python examples/seed000_basis.py``.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import explain, pe, pejit  # noqa: E402


def chebyshev_basis(x, deg, x0=0.0, xf=1.0):
    """T_0..T_deg at x mapped from [x0, xf] to [-1, 1] (TFC's utfc(...).H, nC=0)."""
    z = 2.0 * (x - x0) / (xf - x0) - 1.0
    cols = [jnp.ones_like(z), z]
    for _ in range(2, deg + 1):
        cols.append(2.0 * z * cols[-1] - cols[-2])
    return jnp.stack(cols[: deg + 1], axis=-1)


def f(x, xi):
    return chebyshev_basis(x, 2) @ xi


def main():
    x = jnp.array([0.0, 0.5, 1.0])  # utfc(3, 0, 2, x0=0, xf=1).x
    xi = jnp.ones(3)

    print("Original function")
    print(jax.make_jaxpr(f)(x, xi))
    print("\nFunction after pe")
    f_pe = pe(x, xi, constant_arg_nums=[0])(f)
    print(jax.make_jaxpr(f_pe)(xi))

    f_pejit = pejit(x, xi, constant_arg_nums=[0])(f)
    # the program pejit hands XLA (XLA:GPU may compile a small dot with multiplies of its own)
    stablehlo = f_pejit.lower(xi).as_text()
    assert "multiply" not in stablehlo, "the basis should not be computed by the compiled program"
    print("\nf_pejit(xi) =", f_pejit(xi))
    np.testing.assert_allclose(f_pejit(xi), [1.0, 0.0, 3.0])

    print("\nexplain:")
    print(explain(f, x, xi, constant_argnums=0))


if __name__ == "__main__":
    main()
