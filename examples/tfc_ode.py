"""A TFC-style ODE solve: least squares on a constant Chebyshev basis.

Solve ``y'' + y = 0`` on ``[0, T]`` with ``y(0) = y0``, ``y'(0) = v0`` the
way the Theory of Functional Connections does: the constrained expression

    y(x) = (H(x) - H(0) - x H'(0)) @ xi + y0 + x v0

meets the initial conditions for every ``xi``, and ``xi`` is the least-squares
solution of the residual ``y'' + y = 0`` at the collocation points ``x``.

Everything on ``x`` -- the basis, its derivatives (by ``jax.jacfwd`` of a
scalar basis function) and the pseudo-inverse (an SVD, which XLA cannot
fold) -- is constant: pejit computes it once, and a solve for new initial
conditions is two small matrix-vector products.
Run: ``python examples/tfc_ode.py --points 50 --degree 12``.
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


def chebyshev_points(n, x0, xf):
    z = -jnp.cos(jnp.pi * jnp.arange(n) / (n - 1))
    return x0 + (z + 1.0) * (xf - x0) / 2.0


def make_basis(degree, x0, xf):
    """H(t) for a scalar t: Chebyshev T_2..T_degree (T_0, T_1 are spent on the constraints)."""

    def H(t):
        z = 2.0 * (t - x0) / (xf - x0) - 1.0
        cols = [jnp.ones_like(z), z]
        for _ in range(2, degree + 1):
            cols.append(2.0 * z * cols[-1] - cols[-2])
        return jnp.stack(cols[2:])

    return H


def solve(x, y0, v0, *, degree):
    """Values of y at the collocation points ``x`` for initial conditions ``y0``, ``v0``."""
    H = make_basis(degree, x[0], x[-1])
    H0, dH0 = H(x[0]), jax.jacfwd(H)(x[0])
    Hx = jax.vmap(H)(x)
    d2Hx = jax.vmap(jax.jacfwd(jax.jacfwd(H)))(x)
    phi = Hx - H0 - (x - x[0])[:, None] * dH0  # the constrained basis
    # Residual y'' + y = (d2Hx + phi) @ xi + (y0 + (x - x0) v0), linear in xi.
    A = d2Hx + phi
    b = y0 + (x - x[0]) * v0
    xi = -jnp.linalg.pinv(A) @ b
    return phi @ xi + b


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
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--degree", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)

    x = chebyshev_points(args.points, 0.0, 2.0)
    ode = pejit(solve, constant_argnums=0, static_argnames="degree")

    for y0, v0 in [(1.0, 0.0), (0.5, -2.0), (-1.0, 3.0)]:
        y = ode(x, jnp.float32(y0), jnp.float32(v0), degree=args.degree)
        exact = y0 * jnp.cos(x) + v0 * jnp.sin(x)
        err = float(jnp.max(jnp.abs(y - exact)))
        print(f"y(0)={y0:+.1f}, y'(0)={v0:+.1f}: max error vs y0 cos x + v0 sin x = {err:.1e}")
        assert err < 1e-3, err

    y0, v0 = jnp.float32(1.0), jnp.float32(0.0)
    print(explain(ode, x, y0, v0, degree=args.degree))
    jitted = jax.jit(lambda y0, v0: solve(x, y0, v0, degree=args.degree))  # x closed over
    t_jit = per_call(jitted, y0, v0, repeat=args.repeat)
    t_pe = per_call(lambda y0, v0: ode(x, y0, v0, degree=args.degree), y0, v0, repeat=args.repeat)
    print(f"per solve: jax.jit {t_jit * 1e3:.3f} ms, pejit {t_pe * 1e3:.3f} ms ({t_jit / t_pe:.1f}x)")


if __name__ == "__main__":
    main()
