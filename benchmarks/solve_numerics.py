"""A solve as a product with the folded inverse, against the LU solve and float64 (docs/numerics.md).

For operators of several kinds and sizes (float32): each method's largest
difference from the float64 solution, and the product's from the LU solve
``jax.jit`` runs; medians over 20 random operators and right-hand sides.
pejit makes the product only for ``cond_1 <= 100`` (``SOLVE_AS_PRODUCT_COND``).

Run: ``python benchmarks/solve_numerics.py``
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=")  # JAX issue #39103
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(0)
solve = jax.jit(jnp.linalg.solve)
prod = jax.jit(lambda Ainv, b: Ainv @ b)
families = {
  "diffrax mass matrix (tridiagonal 4/6, 1/6)": lambda n: ((4 * np.eye(n) + np.eye(n, k=1) + np.eye(n, k=-1)) / 6),
  "randn / sqrt(n) + 3 I": lambda n: rng.standard_normal((n, n)) / np.sqrt(n) + 3 * np.eye(n),
  "randn / sqrt(n) + I": lambda n: rng.standard_normal((n, n)) / np.sqrt(n) + np.eye(n),
  "randn (JAX's tests: rand_default)": lambda n: rng.standard_normal((n, n)),
}
print("| operator | n | cond_1, median | LU solve vs float64 | product vs float64 | product vs LU solve |")
print("|---|---|---|---|---|---|")
for name, make in families.items():
    for n in (20, 200):
        errs = []
        for trial in range(20):
            A = make(n).astype(np.float32); b = rng.standard_normal(n).astype(np.float32)
            cond = np.abs(A).sum(0).max() * np.abs(np.linalg.inv(A.astype(np.float64))).sum(0).max()
            x64 = np.linalg.solve(A.astype(np.float64), b.astype(np.float64))
            xlu = np.asarray(solve(A, b))
            Ainv = np.asarray(jax.vmap(lambda e: jnp.linalg.solve(A, e), out_axes=1)(jnp.eye(n)))
            xp = np.asarray(prod(Ainv, b))
            rel = lambda x, y: np.max(np.abs(x - y)) / np.max(np.abs(y))  # noqa: E731
            errs.append((cond, rel(xlu, x64), rel(xp, x64), rel(xp, xlu)))
        e = np.median(np.array(errs), axis=0)
        print(f"| {name} | {n} | {e[0]:.3g} | {e[1]:.1e} | {e[2]:.1e} | {e[3]:.1e} |")
