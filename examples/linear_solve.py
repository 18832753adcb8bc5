"""Solving ``A y = b`` for many right-hand sides ``b`` with a constant matrix ``A``.

XLA cannot constant-fold the LU factorization (a LAPACK custom call), so
``jax.jit`` with ``A`` closed over factorizes ``A`` on every call. pejit
factorizes once: the compiled program does two triangular solves.
Run: ``python examples/linear_solve.py --n 1000``.
"""

import argparse
import os
import statistics
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type="

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import explain, pejit  # noqa: E402


def solve(A, b):
    return jax.scipy.linalg.lu_solve(jax.scipy.linalg.lu_factor(A), b)


def per_call(f, *args, repeat):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    n = args.n

    rng = np.random.default_rng(0)
    A = jnp.asarray(3 * np.eye(n) + rng.standard_normal((n, n)) / np.sqrt(n), jnp.float32)
    b = jnp.asarray(rng.standard_normal(n), jnp.float32)

    solve_pe = pejit(solve, constant_argnums=0)
    solve_jit = jax.jit(lambda b: solve(A, b))  # A closed over

    y = solve_pe(A, b)
    residual = float(jnp.linalg.norm(A @ y - b) / jnp.linalg.norm(b))
    print(f"relative residual |A y - b| / |b| = {residual:.1e}")
    assert residual < 1e-4
    np.testing.assert_allclose(y, solve_jit(b), rtol=1e-3, atol=1e-4)

    print(explain(solve_pe, A, b))
    t_jit = per_call(solve_jit, b, repeat=args.repeat)
    t_pe = per_call(solve_pe, A, b, repeat=args.repeat)
    print(f"per call: jax.jit {t_jit * 1e3:.3f} ms, pejit {t_pe * 1e3:.3f} ms ({t_jit / t_pe:.1f}x)")


if __name__ == "__main__":
    main()
