"""Rounding of the affine collapse (docs/numerics.md): pejit with and without it, vs a float64 reference.

Run once per dtype, each in a fresh process (needs the bench extra, TFC):
``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python benchmarks/affine_numerics.py float32``
"""

import sys

import jax
import tfc  # noqa: F401  (turns x64 on: the dtype under test is set after it)

DTYPE = sys.argv[1]
jax.config.update("jax_enable_x64", DTYPE == "float64")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import FoldOptions, pejit  # noqa: E402
from pejit.bench._tfc import ode_problem, pde_problem  # noqa: E402


def rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def both(fun, argnums, args, want) -> dict[str, float]:
    return {f"affine={a}": rel(pejit(fun, constant_argnums=argnums, fold_options=FoldOptions(affine=a))(*args), want)
            for a in (True, False)}


def chain_case() -> dict[str, float]:
    """Bench case 11: three constant 512x512 matrices on a vector."""
    rng = np.random.default_rng(10)
    C = [jnp.asarray(rng.standard_normal((512, 512)) / np.sqrt(512), DTYPE) for _ in range(3)]
    x = jnp.asarray(rng.standard_normal(512), DTYPE)
    c64, x64 = [np.asarray(c, np.float64) for c in C], np.asarray(x, np.float64)
    want = c64[0] @ (c64[1] @ (c64[2] @ x64))

    def chain(a, b, c, x):
        return a @ (b @ (c @ x))

    return both(chain, (0, 1, 2), (*C, x), want) | {"jax.jit": rel(jax.jit(chain)(*C, x), want)}


def pde_case() -> dict[str, float]:
    """Bench case 9: the TFC PDE step, against NumPy's lstsq in float64."""
    step, xi, xs, L = pde_problem(6, 100)
    xs = tuple(jnp.asarray(c, DTYPE) for c in xs)
    xi = jnp.asarray(np.random.default_rng(9).standard_normal(xi.shape) / 10, DTYPE)
    with (jax.enable_x64 if hasattr(jax, "enable_x64") else jax.experimental.enable_x64)(True):
        x64 = tuple(jnp.asarray(np.asarray(c), jnp.float64) for c in xs)
        xi64 = jnp.asarray(np.asarray(xi), jnp.float64)
        A = np.asarray(jax.jacfwd(L, 0)(xi64, *x64))
        b = np.asarray(L(jnp.zeros_like(xi64), *x64))
    xi_np = np.asarray(xi, np.float64)
    want = xi_np - np.linalg.lstsq(A, A @ xi_np + b, rcond=None)[0]
    return both(step, (1, 2, 3), (xi, *xs), want)


def ode_case() -> dict[str, float]:
    """Bench case 12: the nonlinear ODE step, against the same step under jax.jit in float64."""
    step, xi, xo, _ = ode_problem(100, 30)
    xi = np.zeros_like(xi) + 0.01
    want = np.asarray(jax.jit(step)(jnp.asarray(xi, jnp.float64), jnp.asarray(xo, jnp.float64)))
    return both(step, 1, (jnp.asarray(xi, DTYPE), jnp.asarray(xo, DTYPE)), want)


if __name__ == "__main__":
    # TFC's utfc basis crashes the process in 32-bit mode, with or without pejit
    cases = {"case11": chain_case, "case9": pde_case} | ({"case12": ode_case} if DTYPE == "float64" else {})
    for name, case in cases.items():
        for variant, err in case().items():
            print(f"{DTYPE} {name} {variant}: max relative difference from float64 {err:.2e}")
