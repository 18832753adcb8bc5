"""``python -m pejit demo``: pejit on the examples that motivate it.

Two programs, each folded and compared with ``jax.jit``:

* the example of TFC's ``pejit`` documentation (seed 000): ``H(x) @ xi`` with
  a Chebyshev basis ``H``, and ``x + dH(x) @ xi`` where ``H`` is a custom
  primitive with an ``impl`` and a JVP rule but no lowering rule, which
  ``jax.jit`` cannot compile at all;
* ``inv(A) @ x + cholesky(A @ A.T) @ x`` with a constant 1000x1000 ``A``:
  XLA cannot constant-fold the LAPACK custom calls, so ``jax.jit`` redoes
  them on every call; pejit does them once.

The building blocks (:func:`chebyshev_basis`, :data:`H_p`) are importable so
the examples and tests use the same definitions.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive

from . import _compat
from ._explain import explain
from ._api import pejit
from ._fold._options import FoldOptions
from ._calls._persist import cache_dir


# -- seed 000, part 1: a Chebyshev basis in pure JAX --------------------------
def chebyshev_basis(x: jax.Array, deg: int, x0: float = 0.0, xf: float = 1.0) -> jax.Array:
    """Chebyshev polynomials ``T_0..T_deg`` at ``x`` mapped from ``[x0, xf]`` to ``[-1, 1]``.

    Returns the ``(len(x), deg + 1)`` matrix TFC's ``utfc(...).H`` gives for
    ``nC=0``.

    Examples:
      >>> import jax.numpy as jnp
      >>> chebyshev_basis(jnp.array([0.0, 0.5, 1.0]), 2)
      Array([[ 1., -1.,  1.],
             [ 1.,  0., -1.],
             [ 1.,  1.,  1.]], dtype=float32)
    """
    z = 2.0 * (x - x0) / (xf - x0) - 1.0
    cols = [jnp.ones_like(z), z]
    for _ in range(2, deg + 1):  # T_{k+1} = 2 z T_k - T_{k-1}
        cols.append(2.0 * z * cols[-1] - cols[-2])
    return jnp.stack(cols[: deg + 1], axis=-1)


def chebyshev_points(n: int, x0: float = 0.0, xf: float = 1.0) -> jax.Array:
    """The ``n`` Chebyshev-Gauss-Lobatto points of ``[x0, xf]`` (TFC's ``utfc(...).x``).

    Examples:
      >>> chebyshev_points(3)
      Array([0. , 0.5, 1. ], dtype=float32)
    """
    z = -jnp.cos(jnp.pi * jnp.arange(n) / (n - 1))
    return jnp.asarray(x0 + (z + 1.0) * (xf - x0) / 2.0, dtype=float)


# -- seed 000, part 2: a primitive with an impl and a JVP rule, no lowering ---
H_p = Primitive("H")
"""Seed 000's custom primitive: ``H(x, d)`` is the ``d``-th derivative of the
basis ``[x, x**2, x**3, x**4]``. It has an ``impl`` (NumPy), an abstract
evaluation rule and a JVP rule, but no lowering rule: ``jax.jit`` cannot
compile it; pejit folds it when ``x`` is constant."""


def H(x, d: int = 0):
    """Bind :data:`H_p`: the ``d``-th derivative of ``[x, x**2, x**3, x**4]``, one row per point.

    Examples:
      >>> import numpy as np
      >>> np.asarray(H(np.array([2.0]))).tolist()
      [[2.0, 4.0, 8.0, 16.0]]
    """
    return H_p.bind(x, d=d)


def _H_impl(x, *, d):
    x = np.asarray(x)
    if d == 0:
        cols = (x, x**2, x**3, x**4)
    elif d == 1:
        cols = (np.ones_like(x), 2 * x, 3 * x**2, 4 * x**3)
    elif d == 2:
        cols = (np.zeros_like(x), 2 * np.ones_like(x), 6 * x, 12 * x**2)
    else:
        raise ValueError(f"H: derivative order d={d} is not implemented (d <= 2)")
    return np.stack(cols, axis=-1)


def _H_abstract_eval(x, *, d):
    return jax.core.ShapedArray((*x.shape, 4), x.dtype)


def _H_jvp(primals, tangents, *, d):
    (x,), (dx,) = primals, tangents
    out = H(x, d=d)
    if type(dx) is _compat.Zero:
        return out, _compat.Zero.from_primal_value(out)
    return out, H(x, d=d + 1) * jnp.expand_dims(dx, -1)


H_p.def_impl(_H_impl)
H_p.def_abstract_eval(_H_abstract_eval)
_compat.primitive_jvps[H_p] = _H_jvp


def egrad(g: Callable) -> Callable:
    """Elementwise derivative, as TFC's ``egrad``: the JVP of ``g`` with a tangent of ones.

    Examples:
      >>> import jax.numpy as jnp
      >>> egrad(jnp.sin)(jnp.zeros(2))
      Array([1., 1.], dtype=float32)
    """

    def wrapped(x):
        return jax.jvp(g, (x,), (jnp.ones_like(x),))[1]

    return wrapped


def seed_f(x, xi):
    """Seed 000's ``f(x, xi) = x + dH(x) @ xi`` on the custom primitive :func:`H`."""
    return x + egrad(H)(x) @ xi


# -- inv + cholesky -----------------------------------------------------------
def inv_chol(A, x):
    """``inv(A) @ x + cholesky(A @ A.T) @ x``: LAPACK work on ``A`` only."""
    return jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ x


def well_conditioned(n: int, seed: int = 0) -> np.ndarray:
    """``3 I + R / sqrt(n)`` with standard normal ``R``: eigenvalues within 1 of 3."""
    r = np.random.default_rng(seed).standard_normal((n, n))
    return (3.0 * np.eye(n) + r / np.sqrt(n)).astype(np.float32)


def time_per_call(f: Callable, *args, repeat: int, budget: float = 5.0) -> float:
    """Median seconds of ``repeat`` calls of ``f(*args)`` after one warm-up call.

    Stops early (after at least 3 calls) once ``budget`` seconds are spent,
    so that a slow baseline on a busy machine cannot stretch the demo.
    """
    jax.block_until_ready(f(*args))
    times: list[float] = []
    while len(times) < repeat and (len(times) < 3 or sum(times) < budget):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _section(title: str) -> None:
    print(f"\n== {title} ==")


def _indent(text: str, by: str = "   ") -> str:
    return "\n".join(by + line for line in str(text).splitlines())


def demo(n: int = 1000, repeat: int = 10) -> None:
    """Run the demo, printing reports and the speedup of pejit over ``jax.jit``."""
    np.set_printoptions(precision=4, suppress=True)
    print(f"pejit demo: JAX {_compat.JAX_VERSION}, backend {jax.default_backend()}")

    _section("1. A basis computed once: f(x, xi) = H(x) @ xi, H(x) a polynomial basis, x constant")
    print("   x (the points) is marked constant, so H(x) is computed now; the compiled")
    print("   program is one matrix-vector product with the folded basis `a`:")
    x = chebyshev_points(3)
    xi = jnp.ones(3)
    f1 = pejit(lambda x, xi: chebyshev_basis(x, 2) @ xi, constant_argnums=0)
    print(_indent(f1.report(x, xi).after))
    print(f"   f(x, xi) = {np.asarray(f1(x, xi))}")

    _section("2. An operation jax.jit cannot compile: f(x, xi) = x + H'(x) @ xi")
    print("   H is a JAX primitive written in NumPy, with a derivative rule but no")
    print("   XLA implementation (a 'lowering'), like a wrapped external library.")
    x = jnp.array([1.0, 2.0, 3.0])
    xi = jnp.array([1.0, 2.0, 3.0, 4.0])
    try:
        jax.jit(seed_f)(x, xi)
        print("   jax.jit(f): compiled (unexpected)")
    except NotImplementedError as e:
        print(f"   jax.jit(f) fails, as expected: NotImplementedError: {str(e).splitlines()[0]}")
        print("   That is the point: jax.jit must compile H; with x constant, pejit runs")
        print("   H once on the concrete x and compiles only what depends on xi.")
    f2 = pejit(x, xi, constant_arg_nums=[0])(seed_f)
    print(f"   pejit(x, xi, constant_arg_nums=[0])(f)(xi) = {np.asarray(f2(xi))}")
    print(f"   jax.jacobian of it w.r.t. xi:\n{_indent(np.asarray(jax.jacobian(f2)(xi)), '     ')}")
    print(_indent(explain(f2, xi)))

    _section(f"3. inv(A) @ x + cholesky(A @ A.T) @ x, constant {n}x{n} A")
    A = jnp.asarray(well_conditioned(n))
    v = jnp.asarray(np.random.default_rng(1).standard_normal(n).astype(np.float32))
    f3 = pejit(inv_chol, constant_argnums=0)
    f3_jit = jax.jit(lambda v: inv_chol(A, v))  # A closed over
    start = time.perf_counter()
    jax.block_until_ready(f3(A, v))
    first = time.perf_counter() - start
    print(_indent(explain(f3, A, v)))
    print(f"   first call (fold + compile): {first:.2f} s")
    err = float(jnp.max(jnp.abs(f3(A, v) - f3_jit(v))) / jnp.max(jnp.abs(f3_jit(v))))
    print(f"   max relative difference from jax.jit: {err:.1e}")
    t_jit = time_per_call(f3_jit, v, repeat=repeat)
    t_pe = time_per_call(f3, A, v, repeat=20 * repeat)
    print(f"   per call (median): jax.jit {t_jit * 1e3:.3f} ms, pejit {t_pe * 1e3:.3f} ms")
    print(f"   speedup: {t_jit / t_pe:.0f}x")

    _section("4. Fold once per machine, not once per process")
    print("   With PEJIT_CACHE_DIR set (or JAX's jax_compilation_cache_dir), folded constants")
    print("   are kept on disk, and a new process running the same function on the same")
    print("   constants reads them instead of folding again (see docs/caching.md, 'Caching")
    print("   across runs'). `python -m pejit cache list` shows them, `... cache clear` removes them.")
    where = cache_dir(FoldOptions())
    print(f"   This process: {f'cached in {where}' if where else 'off (nothing set)'}")


_DESCRIPTION = "pejit: partial-evaluation JIT compilation for JAX."
_EPILOG = """\
The benchmark suite is a separate command:
  python -m pejit.bench [--quick] [--out DIR] [--tfc-python PATH]
(it needs the bench extra: pip install "pejit[bench]"; see python -m pejit.bench --help)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: `python -m pejit demo [--n N]`, `python -m pejit --version`."""
    import argparse

    from . import __version__

    parser = argparse.ArgumentParser(
        prog="python -m pejit", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pejit {__version__} (JAX {_compat.JAX_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="fold the built-in examples and time them against jax.jit")
    d.add_argument("--n", type=int, default=1000, help="size of the constant matrix A (default 1000)")
    d.add_argument("--repeat", type=int, default=10, help="timed jax.jit calls (pejit: 20x as many)")
    c = sub.add_parser("cache", help="list or clear the persistent cache of folded constants")
    c.add_argument("action", choices=("list", "clear"))
    c.add_argument("--dir", help="the cache directory (default: PEJIT_CACHE_DIR, else JAX's cache dir)")
    args = parser.parse_args(argv)
    if args.command == "cache":
        from ._calls._persist import main as cache_main

        return cache_main(args.action, args.dir)
    demo(n=args.n, repeat=args.repeat)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
