"""pejit with the libraries people combine with JAX: Equinox, Flax NNX, lineax,
optimistix, diffrax (the ``libs`` extra; each library's tests skip without it).

Every case runs in both API forms, the call-time form
``pejit(f, constant_argnums=...)`` and the TFC form
``pejit(*example_args, constant_arg_nums=[...])(f)``, and compares values
with ``jax.jit`` (or the library's own jit) and, where a closed form exists,
with NumPy in float64. Where the point of folding is a factorization, the
residual jaxpr (sub-jaxprs included) is checked for it. The recipes of
``docs/libraries.md`` run here too.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import pejit

from ._util import primitive_names, with_f32_products

ROOT = Path(__file__).resolve().parents[1]
rng = np.random.default_rng(0)


def both_forms(fun, consts: tuple, dynamic: tuple):
    """``[(value, residual ClosedJaxpr)]`` of the call-time form and of the TFC form."""
    n = len(consts)
    f = pejit(fun, constant_argnums=tuple(range(n)))
    g = pejit(*consts, *dynamic, constant_arg_nums=list(range(n)))(fun)
    return [
        (f(*consts, *dynamic), f.specialize(*consts, *dynamic).residual.jaxpr),
        (g(*dynamic), g.specialize(*dynamic).residual.jaxpr),
    ]


def close(got, want, rtol=1e-5, atol=1e-5):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol), got, want)


def spd(n, seed=0):
    r = np.random.default_rng(seed).standard_normal((n, n))
    return (r @ r.T / n + np.eye(n)).astype(np.float32)


def well_conditioned(n, seed=0):
    r = np.random.default_rng(seed).standard_normal((n, n))
    return (r / np.sqrt(n) + 3 * np.eye(n)).astype(np.float32)


# -- Equinox ---------------------------------------------------------------------
# An MLP has no work on its weights alone: pejit says so (NothingFoldedWarning) and runs it as jax.jit would.
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_equinox_mlp_as_constant_matches_filter_jit_and_numpy():
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(5, 3, 16, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))  # tanh: a callable leaf
    x = jnp.asarray(rng.standard_normal(5).astype(np.float32))
    h = np.asarray(x, np.float64)
    for i, layer in enumerate(mlp.layers):
        h = np.asarray(layer.weight, np.float64) @ h + np.asarray(layer.bias, np.float64)
        h = np.tanh(h) if i < len(mlp.layers) - 1 else h
    want = eqx.filter_jit(lambda m, x: m(x))(mlp, x)
    for got, _ in both_forms(lambda m, x: m(x), (mlp,), (x,)):
        close(got, want)
        close(got, h, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_equinox_partitioned_module_as_constants():
    # eqx.filter_jit's split: arrays in one pytree, the rest (callables, None) in another.
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(4, 2, 8, 1, key=jax.random.PRNGKey(1))
    params, static = eqx.partition(mlp, eqx.is_array)
    x = jnp.linspace(-1.0, 1.0, 4)

    def apply(params, static, x):
        return eqx.combine(params, static)(x)

    want = eqx.filter_jit(apply)(params, static, x)
    for got, _ in both_forms(apply, (params, static), (x,)):
        close(got, want)


class _GP:
    """A Gaussian-process predictor as an ``eqx.Module`` (built lazily: Equinox may be missing)."""

    @staticmethod
    def make():
        eqx = pytest.importorskip("equinox")

        class GP(eqx.Module):
            x: jax.Array
            y: jax.Array
            noise: float = 0.1

            def kernel(self, a, b):
                return jnp.exp(-0.5 * jnp.sum((a[:, None] - b[None]) ** 2, -1))

            def __call__(self, xq):
                k = self.kernel(self.x, self.x) + self.noise * jnp.eye(len(self.x))
                alpha = jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(k), True), self.y)
                return self.kernel(xq, self.x) @ alpha

        return eqx, GP


def test_equinox_module_with_a_factorization_folds_it():
    eqx, GP = _GP.make()
    x = rng.uniform(-2, 2, (40, 2)).astype(np.float32)
    gp = GP(jnp.asarray(x), jnp.asarray(np.sin(x).sum(1)))
    xq = jnp.asarray(rng.uniform(-2, 2, (7, 2)).astype(np.float32))
    kern = lambda a, b: np.exp(-0.5 * ((a[:, None].astype(np.float64) - b[None]) ** 2).sum(-1))  # noqa: E731
    want64 = kern(np.asarray(xq), x) @ np.linalg.solve(kern(x, x) + 0.1 * np.eye(40), np.sin(x).sum(1))
    want = eqx.filter_jit(lambda m, xq: m(xq))(gp, xq)
    for got, residual in both_forms(lambda m, xq: m(xq), (gp,), (xq,)):
        close(got, want, rtol=1e-4, atol=1e-4)
        close(got, want64, rtol=1e-3, atol=1e-3)
        names = primitive_names(residual)
        assert not {"cholesky", "triangular_solve"} & set(names), names


def test_equinox_gradient_in_the_dynamic_argument():
    eqx, GP = _GP.make()
    x = rng.uniform(-2, 2, (20, 2)).astype(np.float32)
    gp = GP(jnp.asarray(x), jnp.asarray(np.cos(x).sum(1)))
    xq = jnp.asarray(rng.uniform(-2, 2, (3, 2)).astype(np.float32))
    loss = lambda m, xq: jnp.sum(m(xq) ** 2)  # noqa: E731
    want = eqx.filter_jit(eqx.filter_grad(lambda xq, m: loss(m, xq)))(xq, gp)
    f = pejit(loss, constant_argnums=0)
    g = pejit(gp, xq, constant_arg_nums=[0])(loss)
    close(jax.grad(f, argnums=1)(gp, xq), want, rtol=1e-4, atol=1e-4)
    close(jax.grad(g)(xq), want, rtol=1e-4, atol=1e-4)


# -- Flax NNX -----------------------------------------------------------------------
def _flax_model():
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear1 = nnx.Linear(6, 16, rngs=rngs)
            self.norm = nnx.LayerNorm(16, rngs=rngs)
            self.bn = nnx.BatchNorm(16, use_running_average=True, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, deterministic=True)
            self.linear2 = nnx.Linear(16, 3, rngs=rngs)
            self.rngs = rngs  # key-typed state in the constant

        def __call__(self, x):
            x = self.dropout(nnx.relu(self.bn(self.norm(self.linear1(x)))))
            return self.linear2(x)

    return nnx, Net(nnx.Rngs(0))


def test_flax_nnx_module_as_constant_matches_nnx_jit():
    nnx, model = _flax_model()
    x = jnp.asarray(rng.standard_normal((4, 6)).astype(np.float32))
    want = nnx.jit(lambda m, x: m(x))(model, x)
    for got, _ in both_forms(lambda m, x: m(x), (model,), (x,)):
        close(got, want)


def test_flax_nnx_split_state_as_constant():
    nnx, model = _flax_model()
    graphdef, state = nnx.split(model)
    x = jnp.asarray(rng.standard_normal((4, 6)).astype(np.float32))
    apply = lambda graphdef, state, x: nnx.merge(graphdef, state)(x)  # noqa: E731
    want = jax.jit(apply, static_argnums=0)(graphdef, state, x)
    for got, _ in both_forms(apply, (graphdef, state), (x,)):
        close(got, want)
    # graphdef closed over, the state alone constant
    for got, _ in both_forms(lambda state, x: apply(graphdef, state, x), (state,), (x,)):
        close(got, want)


@with_f32_products  # the values against float64 NumPy
def test_flax_nnx_linear_matches_numpy_and_folds_a_parametrization():
    nnx = pytest.importorskip("flax.nnx")

    class Orthogonal(nnx.Module):  # W = expm(S - S^T), recomputed on every call under nnx.jit
        def __init__(self, n, rngs):
            self.s = nnx.Param(0.1 * jax.random.normal(rngs.params(), (n, n)))

        def __call__(self, x):
            return x @ jax.scipy.linalg.expm(self.s - self.s.T)

    layer = Orthogonal(8, nnx.Rngs(1))
    lin = nnx.Linear(8, 2, rngs=nnx.Rngs(2))
    x = jnp.asarray(rng.standard_normal((3, 8)).astype(np.float32))
    fun = lambda layer, lin, x: lin(layer(x))  # noqa: E731
    s = np.asarray(layer.s[...], np.float64)
    w, v = np.linalg.eigh(1j * (s - s.T))  # expm of a skew-symmetric matrix, via its spectrum
    q = ((v * np.exp(-1j * w)) @ v.conj().T).real
    want64 = np.asarray(x, np.float64) @ q @ np.asarray(lin.kernel[...], np.float64) + np.asarray(lin.bias[...])
    want = nnx.jit(fun)(layer, lin, x)
    for got, residual in both_forms(fun, (layer, lin), (x,)):
        close(got, want, rtol=1e-4, atol=1e-5)
        close(got, want64, rtol=1e-4, atol=1e-5)
        assert primitive_names(residual).count("dot_general") <= 2, primitive_names(residual)
        assert not {"lu", "triangular_solve", "while"} & set(primitive_names(residual))


# -- lineax --------------------------------------------------------------------------
def test_lineax_lu_with_a_constant_operator_folds_the_factorization():
    lx = pytest.importorskip("lineax")
    a, b = well_conditioned(12), rng.standard_normal(12).astype(np.float32)

    def solve(a, b):
        return lx.linear_solve(lx.MatrixLinearOperator(a), b, solver=lx.LU()).value

    want = jax.jit(solve)(a, b)
    want64 = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    for got, residual in both_forms(solve, (jnp.asarray(a),), (jnp.asarray(b),)):
        close(got, want, rtol=1e-5, atol=1e-5)
        close(got, want64, rtol=1e-4, atol=1e-5)
        assert "lu" not in primitive_names(residual), primitive_names(residual)


def test_lineax_cholesky_with_a_constant_operator_folds_the_factorization():
    lx = pytest.importorskip("lineax")
    a, b = spd(10, seed=3), rng.standard_normal(10).astype(np.float32)

    def solve(a, b):
        op = lx.MatrixLinearOperator(a, lx.positive_semidefinite_tag)
        return lx.linear_solve(op, b, solver=lx.Cholesky()).value

    want64 = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    for got, residual in both_forms(solve, (jnp.asarray(a),), (jnp.asarray(b),)):
        close(got, jax.jit(solve)(a, b))
        close(got, want64, rtol=1e-4, atol=1e-5)
        assert "cholesky" not in primitive_names(residual), primitive_names(residual)


def test_lineax_gradient_in_the_right_hand_side():
    lx = pytest.importorskip("lineax")
    a, b = well_conditioned(6, seed=4), jnp.asarray(rng.standard_normal(6).astype(np.float32))
    loss = lambda a, b: jnp.sum(lx.linear_solve(lx.MatrixLinearOperator(a), b).value ** 2)  # noqa: E731
    want = jax.jit(jax.grad(loss, argnums=1))(a, b)
    close(jax.grad(pejit(loss, constant_argnums=0), argnums=1)(a, b), want, rtol=1e-4, atol=1e-5)
    close(jax.grad(pejit(a, b, constant_arg_nums=[0])(loss))(b), want, rtol=1e-4, atol=1e-5)


# -- optimistix ------------------------------------------------------------------------
def test_optimistix_linear_least_squares_matches_numpy_lstsq():
    optx = pytest.importorskip("optimistix")
    t = np.linspace(0, 1, 30)
    basis = np.stack([np.ones_like(t), t, t**2, np.sin(3 * t)], 1).astype(np.float32)
    y = (basis @ np.array([1.0, -2.0, 0.5, 0.3]) + 0.01 * rng.standard_normal(30)).astype(np.float32)

    def fit(basis, y):
        solver = optx.GaussNewton(rtol=1e-5, atol=1e-5)
        return optx.least_squares(lambda c, args: args[0] @ c - args[1], solver, jnp.zeros(4), args=(basis, y)).value

    want64 = np.linalg.lstsq(basis.astype(np.float64), y.astype(np.float64), rcond=None)[0]
    for got, _ in both_forms(fit, (jnp.asarray(basis),), (jnp.asarray(y),)):
        close(got, jax.jit(fit)(basis, y), rtol=1e-4, atol=1e-4)
        close(got, want64, rtol=1e-3, atol=1e-3)


def _gls(optx, n=60):
    """Generalized least squares: whitening by a constant covariance, computed before the solve."""
    t = np.linspace(0, 3, n, dtype=np.float32)
    cov = (np.exp(-np.abs(t[:, None] - t[None]) / 0.3) + 0.1 * np.eye(n)).astype(np.float32)
    y = (2 * np.exp(-1.5 * t) + 0.5 + 0.02 * rng.standard_normal(n)).astype(np.float32)

    def residuals(theta, args):
        w, t, y = args
        return w @ (theta[0] * jnp.exp(-theta[1] * t) + theta[2] - y)

    def fit(cov, t, y):
        w = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(cov), jnp.eye(n), lower=True)
        solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
        return optx.least_squares(residuals, solver, jnp.ones(3), args=(w, t, y), max_steps=64).value

    return fit, (jnp.asarray(cov), jnp.asarray(t)), jnp.asarray(y)


def test_optimistix_least_squares_folds_work_on_constants_before_the_solve():
    optx = pytest.importorskip("optimistix")
    fit, consts, y = _gls(optx)
    want = jax.jit(fit)(*consts, y)
    for got, residual in both_forms(fit, consts, (y,)):
        close(got, want, rtol=1e-3, atol=1e-3)
        assert "cholesky" not in primitive_names(residual)


def test_optimistix_root_find_with_a_constant_matrix():
    optx = pytest.importorskip("optimistix")
    a, b = well_conditioned(8, seed=5), np.random.default_rng(5).standard_normal(8).astype(np.float32)

    def root(a, b):  # a float32 Newton step cannot always reach 1e-7 (nor can jax.jit's): max_steps raises
        fn = lambda y, args: args[0] @ y + 0.1 * jnp.tanh(y) - args[1]  # noqa: E731
        return optx.root_find(fn, optx.Newton(rtol=1e-5, atol=1e-5), jnp.zeros(8), args=(a, b)).value

    for got, _ in both_forms(root, (jnp.asarray(a),), (jnp.asarray(b),)):
        close(got, jax.jit(root)(a, b), rtol=1e-4, atol=1e-5)
        g = np.asarray(got, np.float64)
        np.testing.assert_allclose(a.astype(np.float64) @ g + 0.1 * np.tanh(g), b, atol=1e-4)


# -- diffrax ----------------------------------------------------------------------------
def _linear_ode(diffrax, a, y0):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, a: a @ y), diffrax.Tsit5(), 0.0, 1.0, 0.01, y0, args=a,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
    )
    return sol.ys[-1]


def test_diffrax_constant_matrix_in_the_vector_field_matches_the_matrix_exponential():
    diffrax = pytest.importorskip("diffrax")
    s = spd(6, seed=6)
    a = -s / 2  # y' = A y with A symmetric: y(1) = V exp(L) V^T y0
    y0 = rng.standard_normal(6).astype(np.float32)
    lam, v = np.linalg.eigh(a.astype(np.float64))
    want64 = v @ (np.exp(lam) * (v.T @ y0))
    solve = lambda a, y0: _linear_ode(diffrax, a, y0)  # noqa: E731
    for got, _ in both_forms(solve, (jnp.asarray(a),), (jnp.asarray(y0),)):
        close(got, jax.jit(solve)(a, y0), rtol=1e-5, atol=1e-6)
        close(got, want64, rtol=1e-4, atol=1e-5)


def _mass_stiffness(n=12):
    eye = lambda k: np.eye(n, k=k, dtype=np.float32)  # noqa: E731
    return jnp.asarray((4 * eye(0) + eye(1) + eye(-1)) / 6), jnp.asarray(2 * eye(0) - eye(1) - eye(-1))


def test_diffrax_matrix_computed_before_the_solve_folds():
    diffrax = pytest.importorskip("diffrax")
    m, k = _mass_stiffness()
    y0 = jnp.sin(jnp.linspace(0, jnp.pi, 12))

    def solve(m, k, y0):  # y' = -M^-1 K y; M^-1 K is folded
        return _linear_ode(diffrax, -jnp.linalg.solve(m, k), y0)

    lam, v = np.linalg.eig(-np.linalg.solve(np.asarray(m, np.float64), np.asarray(k, np.float64)))
    want64 = (v @ (np.exp(lam) * np.linalg.solve(v, np.asarray(y0, np.float64)))).real
    for got, residual in both_forms(solve, (m, k), (y0,)):
        close(got, jax.jit(solve)(m, k, y0), rtol=1e-5, atol=1e-6)
        close(got, want64, rtol=1e-4, atol=1e-5)
        assert "lu" not in primitive_names(residual)


@with_f32_products  # the values against jax.jit's: on GPUs, TF32 products round apart
def test_diffrax_factorization_in_the_vector_field_folds():
    # diffrax's loop is a custom_vjp call that also takes y0: the LU of m inside it is folded.
    diffrax = pytest.importorskip("diffrax")
    m, k = _mass_stiffness()
    y0 = jnp.sin(jnp.linspace(0, jnp.pi, 12))

    def solve(m, k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, mk: -jnp.linalg.solve(mk[0], mk[1] @ y)),
            diffrax.Tsit5(), 0.0, 1.0, 0.05, y0, args=(m, k),
        )
        return sol.ys[-1]

    for got, residual in both_forms(solve, (m, k), (y0,)):
        close(got, jax.jit(solve)(m, k, y0), rtol=1e-5, atol=1e-6)
        assert "lu" not in primitive_names(residual)


# -- the recipes of docs/libraries.md ------------------------------------------------------------
RECIPE = "<!-- fragment: needs "


def _recipes():
    """``(module, source)`` of each block of docs/libraries.md marked ``<!-- fragment: needs MODULE ...``."""
    lines = (ROOT / "docs" / "libraries.md").read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(RECIPE) and i + 1 < len(lines) and lines[i + 1].strip() == "```python":
            end = lines.index("```", i + 2)
            module = re.match(r"[\w.]+", line[len(RECIPE):]).group()
            found.append(pytest.param(module, "\n".join(lines[i + 2:end]) + "\n", id=f"docs/libraries.md:{i + 2}"))
    return found


def test_every_library_has_a_recipe():
    assert sorted(p.values[0] for p in _recipes()) == ["diffrax", "equinox", "flax.nnx", "lineax", "optimistix"]


@pytest.mark.parametrize("module, source", _recipes())
def test_recipe_runs_as_shown(module, source, monkeypatch):
    pytest.importorskip(module)
    # A module of its own: dataclasses (an eqx.Module) look their class's module up in sys.modules.
    namespace = types.ModuleType("__recipe__")
    monkeypatch.setitem(sys.modules, namespace.__name__, namespace)
    exec(compile(source, "<docs/libraries.md>", "exec"), namespace.__dict__)  # noqa: S102
