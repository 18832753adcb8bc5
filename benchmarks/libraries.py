"""Per-call time of pejit next to each library's own jit (docs/libraries.md).

One case per library, each measured side by side in this one process, in
alternation (fair on a loaded machine), on the same inputs:

* Equinox: a Gaussian-process predictor (``eqx.Module`` holding 1000
  training points) evaluated at 64 new points: ``eqx.filter_jit`` vs pejit
  with the module constant (the kernel matrix and its Cholesky factor fold);
* Flax NNX: an MLP whose square layers are orthogonal, ``W = expm(S - S^T)``,
  evaluated on a batch of 32: ``nnx.jit`` vs pejit with the module constant
  and vs pejit with its ``nnx.split`` state constant (the matrix
  exponentials fold);
* lineax: ``linear_solve`` with a 1000x1000 ``MatrixLinearOperator`` and
  ``LU``: ``jax.jit`` vs pejit with the operator's matrix constant (the LU
  factorization folds);
* optimistix: a generalized least-squares fit (Levenberg-Marquardt) of
  ``a exp(-k t) + c`` to 500 new data points per call, whitened by a
  constant 500x500 noise covariance: ``jax.jit`` vs pejit with the
  covariance constant (its whitening matrix folds);
* diffrax: ``y' = -M^-1 K y`` (mass matrix ``M``, stiffness ``K``, 400x400,
  constant) by Tsit5 in 20 steps: ``jax.jit`` vs pejit with ``M``, ``K``
  constant (``M^-1 K`` folds).

For optimistix and diffrax a second pair of rows writes the work on
constants inside the residual function / vector field, inside the library's
``custom_jvp``/``custom_vjp`` call, which also takes dynamic arguments.

``--custom`` runs the cases of issue 47 instead (constant work inside
``custom_vjp``/``custom_jvp`` calls that also take dynamic arguments), each
against ``jax.jit`` and the hand-folded program (the constant work done once
by hand, then ``jax.jit``), with median times of interleaved rounds:

* diffrax, as the issue writes it: ``-solve(M, K @ y)`` in the vector field,
  ``M``, ``K`` constant 200x200, Tsit5, 20 steps; hand-folded: ``solve(M, K)``
  once, ``-(a @ y)`` in the field;
* optimistix: a Newton root find whose residual function applies ``inv(B)``
  of a constant 200x200 ``B``; hand-folded: ``inv(B)`` passed in;
* Equinox: an ``eqx.filter_custom_vjp`` solve with a constant 500x500
  matrix on 16 right-hand sides; hand-folded: the LU factors passed in.

Every variant gets the constants as arguments (for the library's jit, as the
library's documentation passes them); pejit's are folded. Prints ms per call
and the ratio library jit / pejit (the gain).

Run: ``python benchmarks/libraries.py`` (or ``--custom``)
"""

import os

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="  # JAX issue #39103
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_YNN_OFF}".strip()

import timeit  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import NamedTuple  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pejit import pejit  # noqa: E402

rng = np.random.default_rng(0)


def best_ms(fn, number, repeat=3):
    """Best-of-``repeat`` mean time per call in milliseconds."""
    jax.block_until_ready(fn())
    return min(timeit.repeat(lambda: jax.block_until_ready(fn()), number=number, repeat=repeat)) / number * 1e3


def interleaved(fns: dict, number: int, rounds=5) -> dict:
    """Best time of each function, measured in alternation."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], best_ms(fn, number))
    return best


class Program(NamedTuple):
    """One program of a case: ``fun(*args)`` with the arguments ``constant_argnums``
    constant, and the jit its library documents (``None``: ``jax.jit``)."""

    fun: Callable
    args: tuple
    constant_argnums: tuple
    library_jit: Callable | None = None


def check(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=rtol)


# -- the cases: each returns {variant: zero-argument call}, the baseline first -----
def equinox_programs() -> dict[str, Program]:
    import equinox as eqx

    class GP(eqx.Module):
        x: jax.Array
        y: jax.Array
        noise: float = 1e-2

        def kernel(self, a, b):
            return jnp.exp(-0.5 * jnp.sum((a[:, None] - b[None]) ** 2, -1))

        def __call__(self, xq):
            k = self.kernel(self.x, self.x) + self.noise * jnp.eye(len(self.x))
            alpha = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(k), True), self.y)
            return self.kernel(xq, self.x) @ alpha

    x = rng.uniform(-2, 2, (1000, 3)).astype(np.float32)
    gp = GP(jnp.asarray(x), jnp.asarray(np.sin(x).sum(1)))
    xq = jnp.asarray(rng.uniform(-2, 2, (64, 3)).astype(np.float32))
    predict = lambda model, xq: model(xq)  # noqa: E731
    return {"Equinox GP predictor, n=1000": Program(predict, (gp, xq), (0,), eqx.filter_jit)}


def equinox_case():
    (name, (predict, (gp, xq), _, filter_jit)), = equinox_programs().items()
    fj, pj = filter_jit(predict), pejit(predict, constant_argnums=0)
    check(pj(gp, xq), fj(gp, xq), 1e-2)
    return name, {"eqx.filter_jit": lambda: fj(gp, xq), "pejit": lambda: pj(gp, xq)}


def flax_programs() -> dict[str, Program]:
    from flax import nnx

    class Orthogonal(nnx.Module):
        def __init__(self, n, rngs):
            self.s = nnx.Param(0.1 * jax.random.normal(rngs.params(), (n, n)))
            self.b = nnx.Param(jnp.zeros(n))

        def __call__(self, x):
            return x @ jax.scipy.linalg.expm(self.s - self.s.T) + self.b

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([Orthogonal(256, rngs) for _ in range(3)])

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return x

    model = Net(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x = jnp.asarray(rng.standard_normal((32, 256)).astype(np.float32))
    apply = lambda m, x: m(x)  # noqa: E731
    merged = lambda state, x: nnx.merge(graphdef, state)(x)  # noqa: E731
    return {"Flax NNX orthogonal MLP, 3x256 (module)": Program(apply, (model, x), (0,), nnx.jit),
            "Flax NNX orthogonal MLP, 3x256 (state)": Program(merged, (state, x), (0,), None)}


def flax_case():
    from flax import nnx

    module, split = flax_programs().values()
    (apply, (model, x), _, _), (merged, (state, _), _, _) = module, split
    nj = nnx.jit(apply)
    pm, ps = pejit(apply, constant_argnums=0), pejit(merged, constant_argnums=0)
    check(pm(model, x), nj(model, x), 1e-4)
    check(ps(state, x), nj(model, x), 1e-4)
    return "Flax NNX orthogonal MLP, 3x256", {
        "nnx.jit": lambda: nj(model, x),
        "pejit (module)": lambda: pm(model, x),
        "pejit (state)": lambda: ps(state, x),
    }


def lineax_programs() -> dict[str, Program]:
    import lineax as lx

    n = 1000
    a = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n) + 2 * np.eye(n, dtype=np.float32))
    b = jnp.asarray(rng.standard_normal(n).astype(np.float32))

    def solve(a, b):
        return lx.linear_solve(lx.MatrixLinearOperator(a), b, solver=lx.LU()).value

    return {"lineax LU solve, n=1000": Program(solve, (a, b), (0,))}


def lineax_case():
    (name, (solve, (a, b), _, _)), = lineax_programs().items()
    jj, pj = jax.jit(solve), pejit(solve, constant_argnums=0)
    check(pj(a, b), jj(a, b), 1e-3)
    return name, {"jax.jit": lambda: jj(a, b), "pejit": lambda: pj(a, b)}


def optimistix_programs() -> dict[str, Program]:
    import optimistix as optx

    # Generalized least squares: fit a * exp(-k t) + c to new data y on every
    # call; the noise covariance (correlated, 500x500) is constant, so is its
    # whitening matrix inv(cholesky(cov)).
    n = 500
    t = np.linspace(0, 5, n, dtype=np.float32)
    cov = jnp.asarray(np.exp(-np.abs(t[:, None] - t[None]) / 0.3) + 0.1 * np.eye(n, dtype=np.float32))
    t = jnp.asarray(t)
    y = jnp.asarray((2 * np.exp(-1.5 * np.asarray(t)) + 0.5 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    def residuals(theta, args):
        w, t, y = args
        a, k, c = theta
        return w @ (a * jnp.exp(-k * t) + c - y)

    def fit(consts, y):  # the whitening matrix computed before the solve: pejit folds it
        cov, t = consts
        w = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(cov), jnp.eye(n), lower=True)
        solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
        return optx.least_squares(residuals, solver, jnp.ones(3), args=(w, t, y), max_steps=64).value

    def fit_inside(consts, y):  # computed in the residual function: inside optimistix's custom_jvp
        cov, t = consts

        def fn(theta, y):
            w = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(cov), jnp.eye(n), lower=True)
            return residuals(theta, (w, t, y))

        solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
        return optx.least_squares(fn, solver, jnp.ones(3), args=y, max_steps=64).value

    return {"optimistix GLS fit, n=500": Program(fit, ((cov, t), y), (0,)),
            "optimistix GLS fit, n=500, whitening inside": Program(fit_inside, ((cov, t), y), (0,))}


def optimistix_case():
    outside, inside = optimistix_programs().values()
    (fit, ((cov, t), y), _, _), fit_inside = outside, inside.fun
    jj, pj = jax.jit(fit), pejit(fit, constant_argnums=0)
    ji, pi = jax.jit(fit_inside), pejit(fit_inside, constant_argnums=0)
    check(pj((cov, t), y), jj((cov, t), y), 1e-3)
    check(pi((cov, t), y), jj((cov, t), y), 1e-3)
    return [
        ("optimistix GLS fit, n=500", {"jax.jit": lambda: jj((cov, t), y), "pejit": lambda: pj((cov, t), y)}),
        ("  whitening inside", {"jax.jit": lambda: ji((cov, t), y), "pejit": lambda: pi((cov, t), y)}),
    ]


def diffrax_programs() -> dict[str, Program]:
    import diffrax

    # y' = -M^-1 K y (mass matrix M, stiffness K of a 1-D mesh, 400 nodes):
    # the constant matrix M^-1 K of the vector field is computed before the
    # solve, where pejit folds it.
    n = 400
    eye = lambda k: np.eye(n, k=k, dtype=np.float32)  # noqa: E731
    m = jnp.asarray((4 * eye(0) + eye(1) + eye(-1)) / 6)
    k = jnp.asarray((2 * eye(0) - eye(1) - eye(-1)) * 0.1)
    y0 = jnp.asarray(np.sin(np.linspace(0, np.pi, n)).astype(np.float32))

    def field(t, y, a):
        return -(a @ y)

    def solve(mk, y0):
        a = jnp.linalg.solve(mk[0], mk[1])
        sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, 1.0, 0.05, y0, args=a)
        return sol.ys[-1]

    def solve_inside(mk, y0):  # M^-1 K y solved in the vector field: inside diffrax's custom_vjp loop
        def field(t, y, mk):
            return -jnp.linalg.solve(mk[0], mk[1] @ y)

        sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), 0.0, 1.0, 0.05, y0, args=mk)
        return sol.ys[-1]

    return {"diffrax y' = -M^-1 K y, n=400": Program(solve, ((m, k), y0), (0,)),
            "diffrax y' = -M^-1 K y, n=400, solve inside the field": Program(solve_inside, ((m, k), y0), (0,))}


def diffrax_case():
    outside, inside = diffrax_programs().values()
    (solve, ((m, k), y0), _, _), solve_inside = outside, inside.fun
    jj, pj = jax.jit(solve), pejit(solve, constant_argnums=0)
    ji, pi = jax.jit(solve_inside), pejit(solve_inside, constant_argnums=0)
    check(pj((m, k), y0), jj((m, k), y0), 1e-3)
    check(pi((m, k), y0), jj((m, k), y0), 1e-3)
    return [
        ("diffrax y' = -M^-1 K y, n=400", {"jax.jit": lambda: jj((m, k), y0), "pejit": lambda: pj((m, k), y0)}),
        ("  solve inside the field", {"jax.jit": lambda: ji((m, k), y0), "pejit": lambda: pi((m, k), y0)}),
    ]


def median_ms(fns: dict, number: int, rounds=7) -> dict:
    """Median over interleaved rounds of each function's mean time per call (ms)."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        jax.block_until_ready(fn())
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timeit.timeit(lambda: jax.block_until_ready(fn()), number=number) / number * 1e3)
    return {name: float(np.median(t)) for name, t in times.items()}


def _mesh(n):
    eye = lambda k: np.eye(n, k=k, dtype=np.float32)  # noqa: E731
    return jnp.asarray((4 * eye(0) + eye(1) + eye(-1)) / 6), jnp.asarray((2 * eye(0) - eye(1) - eye(-1)) * 0.1)


class Custom(NamedTuple):
    """A case of issue 47: ``f(*constants, arg)``, and ``by_hand(fold(), arg)``, the
    constant work done once by hand (``fold`` is called when measuring, not before:
    a first call must find nothing compiled)."""

    name: str
    f: Callable
    constants: tuple
    by_hand: Callable
    fold: Callable
    arg: object
    rtol: float

    def program(self) -> Program:
        return Program(self.f, (*self.constants, self.arg), tuple(range(len(self.constants))))


def _against(case: Custom) -> tuple[str, dict]:
    """A case's name and its three variants: ``f`` under ``jax.jit`` and pejit
    (``constants`` folded), and ``by_hand`` on the folded values, checked against ``jax.jit``."""
    name, f, constants, by_hand, fold, arg, rtol = case
    nums = tuple(range(len(constants)))
    jj, pj, hj = jax.jit(f), pejit(f, constant_argnums=nums), jax.jit(by_hand)
    folded = fold()
    want = jj(*constants, arg)
    check(pj(*constants, arg), want, rtol)
    check(hj(folded, arg), want, rtol)
    return name, {"jax.jit": lambda: jj(*constants, arg), "pejit": lambda: pj(*constants, arg),
                  "hand-folded": lambda: hj(folded, arg)}


def diffrax_custom_case():
    import diffrax

    M, K = _mesh(200)
    y0 = jnp.asarray(np.sin(np.linspace(0, np.pi, 200)).astype(np.float32))

    def ode(M, K, y0):  # M, K constant 200 x 200; the vector field solves with M (issue 47, as written)
        term = diffrax.ODETerm(lambda t, y, a: -jnp.linalg.solve(a[0], a[1] @ y))
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=(M, K)).ys

    def by_hand(a, y0):
        term = diffrax.ODETerm(lambda t, y, a: -(a @ y))
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0., 1., 0.05, y0, args=a).ys

    return Custom("diffrax, solve(M, K @ y) in the field", ode, (M, K), by_hand, lambda: jnp.linalg.solve(M, K), y0,
                  1e-4)


def optimistix_custom_case():
    import optimistix as optx

    n = 200
    B = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n) + 3 * np.eye(n, dtype=np.float32))
    b = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    solver = optx.Newton(rtol=1e-5, atol=1e-5)

    def root(B, b):  # the residual function applies inv(B), B constant
        fn = lambda y, b: jnp.linalg.inv(B) @ (y + 0.1 * y ** 3) - b  # noqa: E731
        return optx.root_find(fn, solver, jnp.zeros(n), args=b, max_steps=32).value

    def by_hand(Binv, b):
        fn = lambda y, b: Binv @ (y + 0.1 * y ** 3) - b  # noqa: E731
        return optx.root_find(fn, solver, jnp.zeros(n), args=b, max_steps=32).value

    return Custom("optimistix Newton, inv(B) in fn", root, (B,), by_hand, lambda: jnp.linalg.inv(B), b, 1e-3)


def equinox_custom_case():
    import equinox as eqx

    n = 500
    A = jnp.asarray(rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n) + 3 * np.eye(n, dtype=np.float32))
    x = jnp.asarray(rng.standard_normal((n, 16)).astype(np.float32))

    def make(factor):
        @eqx.filter_custom_vjp
        def solve(vjp_arg, a):
            return jax.scipy.linalg.lu_solve(factor(a), vjp_arg)

        @solve.def_fwd
        def fwd(perturbed, vjp_arg, a):
            lu = factor(a)
            return jax.scipy.linalg.lu_solve(lu, vjp_arg), lu

        @solve.def_bwd
        def bwd(lu, g, perturbed, vjp_arg, a):
            return jax.scipy.linalg.lu_solve(lu, g, trans=1)

        return solve

    solve, solve_by_hand = make(jax.scipy.linalg.lu_factor), make(lambda lu: lu)
    f = lambda A, x: solve(x, A)  # noqa: E731
    by_hand = lambda lu, x: solve_by_hand(x, lu)  # noqa: E731
    return Custom("Equinox filter_custom_vjp solve", f, (A,), by_hand, lambda: jax.scipy.linalg.lu_factor(A), x, 1e-3)


def custom_main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; ms per call, median of 7 interleaved rounds")
    print(f"{'case':<40}{'variant':<14}{'ms':>9}{'jit/this':>10}{'this/hand':>11}")
    for case in CUSTOM:
        name, fns = _against(case())
        t = median_ms(fns, number=max(3, int(0.2 / max(1e-4, best_ms(fns["jax.jit"], 1) / 1e3))))
        for variant, ms in t.items():
            print(f"{name:<40}{variant:<14}{ms:9.3f}{t['jax.jit'] / ms:9.2f}x{ms / t['hand-folded']:10.2f}x",
                  flush=True)


CUSTOM = (diffrax_custom_case, optimistix_custom_case, equinox_custom_case)
CASES = (equinox_case, flax_case, lineax_case, optimistix_case, diffrax_case)


def custom_programs() -> dict[str, Program]:
    """The programs of the cases of issue 47 (``--custom``), by name."""
    return {case.name: case.program() for case in (make() for make in CUSTOM)}


#: What builds every program of this file, by library: ``benchmarks/first_call.py`` runs them one by one.
PROGRAMS = (equinox_programs, flax_programs, lineax_programs, optimistix_programs, diffrax_programs, custom_programs)


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; ms per call, best of interleaved runs")
    print(f"{'case':<36}{'variant':<24}{'ms':>9}{'ratio':>9}")
    for case in CASES:
        try:
            groups = case()
        except Exception as e:  # noqa: BLE001 - report and go on to the next library
            print(f"{case.__name__:<36}failed: {type(e).__name__}: {str(e)[:100]}")
            traceback.print_exc(limit=-3)
            continue
        for name, fns in [groups] if isinstance(groups, tuple) else groups:
            first = next(iter(fns))
            t = interleaved(fns, number=max(3, int(0.2 / max(1e-4, best_ms(fns[first], 1) / 1e3))))
            for variant, ms in t.items():
                ratio = "" if variant == first else f"{t[first] / ms:8.1f}x"
                print(f"{name:<36}{variant:<24}{ms:9.3f}{ratio:>9}", flush=True)



if __name__ == "__main__":
    import sys

    custom_main() if "--custom" in sys.argv else main()
