"""Residual algebra: affine regions collapse into one matrix, checked against NumPy.

(pejit._residual._affine finds the regions, pejit._residual._collapse replaces them.)
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import FoldOptions, pe, pejit, specialize_jaxpr
from pejit._fold import _device

from ._util import cpu_only, f32_products, x64


@pytest.fixture(autouse=True)
def _f32_products():
    """The values are checked against float64 NumPy within float32's tolerances."""
    with f32_products():
        yield

rng = np.random.default_rng(0)
C1, C2, C3 = (rng.standard_normal((32, 32)).astype(np.float32) / 6 for _ in range(3))
X = rng.standard_normal(32).astype(np.float32)
A32 = (np.eye(32) + np.random.default_rng(32).standard_normal((32, 32)) / 16).astype(np.float32)


def prims(closed) -> list[str]:
    return [e.primitive.name for e in closed.jaxpr.eqns]


def both_forms(fun, consts, x, **options):
    """``(residual, value)`` of the call-time form and of the TFC form."""
    opts = FoldOptions(**options)
    n = len(consts)
    f = pejit(fun, constant_argnums=tuple(range(n)), fold_options=opts)
    g = pejit(*consts, x, constant_arg_nums=list(range(n)), fold_options=opts)(fun)
    return [(f.specialize(*consts, x).residual, f(*consts, x)), (g.specialize(x).residual, g(x))]


def chain(a, b, c, x):
    return a @ (b @ (c @ x))


@pytest.mark.parametrize("form", [0, 1])
def test_chain_of_constant_matrices_is_one_product(form):
    residual, got = both_forms(chain, (C1, C2, C3), X)[form]
    assert prims(residual.jaxpr) == ["dot_general"]
    assert [c.shape for c in residual.consts] == [(32, 32)]
    (c,) = residual.report.collapsed
    assert (c.eqns, c.flops_before, c.flops_after) == (3, 3 * 2 * 32 * 32, 2 * 32 * 32)
    want = np.float64(C1) @ (np.float64(C2) @ (np.float64(C3) @ np.float64(X)))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_switched_off_the_residual_is_unchanged():
    for residual, got in both_forms(chain, (C1, C2, C3), X, affine=False):
        assert prims(residual.jaxpr) == ["dot_general"] * 3 and residual.report.collapsed == ()
        np.testing.assert_allclose(got, C1 @ (C2 @ (C3 @ X)), rtol=1e-5, atol=1e-6)


def test_a_sub_region_collapses_and_the_nonlinear_rest_stays():
    def f(a, b, c, x):
        return jnp.sum(jnp.tanh(a @ (b @ x) + c @ x - 1.0) ** 2)

    for residual, got in both_forms(f, (C1, C2, C3), X):
        # one product; the literal's subtraction stays (an offset array would be read
        # per call instead of a literal), then tanh, square, sum
        assert prims(residual.jaxpr) == ["dot_general", "sub", "tanh", "integer_pow", "reduce_sum"]
        inner = np.float64(C1) @ np.float64(C2) + np.float64(C3)
        np.testing.assert_allclose(got, np.sum(np.tanh(inner @ X - 1.0) ** 2), rtol=1e-5)


def test_a_wide_affine_value_is_computed_from_narrow_collapsed_ones():
    # TFC's nonlinear ODE: the Jacobian J = A2 + y' A0 + y A1 (rows scaled by
    # y = A0 x, y' = A1 x) is affine in x too, but a matrix for J would hold
    # 100 * 29 rows; y, y' and the residual's A2 x + y y' take 100 rows each
    H, Hd, Hdd, H0, H1 = (rng.standard_normal((100, 29)).astype(np.float32) for _ in range(5))
    t = np.linspace(0.0, 1.0, 100, dtype=np.float32)
    x = rng.standard_normal(29).astype(np.float32)

    def step(h, hd, hdd, h0, h1, t, x):
        y = h @ x - (1 - t) * (h0 @ x) - t * (h1 @ x)  # TFC's constrained expression
        yd = hd @ x + (h0 @ x) - (h1 @ x)
        J = hdd + yd[:, None] * h + y[:, None] * hd
        return jnp.tanh(J), hdd @ x + y * yd

    h, hd, hdd, h0, h1, t64, x64 = map(np.float64, (H, Hd, Hdd, H0, H1, t, x))
    y = h @ x64 - (1 - t64) * (h0 @ x64) - t64 * (h1 @ x64)
    yd = hd @ x64 + h0 @ x64 - h1 @ x64
    for residual, (got_J, got_L) in both_forms(step, (H, Hd, Hdd, H0, H1, t), x):
        (c,) = residual.report.collapsed
        assert (c.inputs, c.outputs) == (29, 200)  # y and y'
        assert max(k.size for k in residual.consts) == 100 * 29  # no 2900 x 29 matrix
        assert prims(residual).count("dot_general") == 3  # y, y' and hdd @ x
        np.testing.assert_allclose(got_J, np.tanh(hdd + yd[:, None] * h + y[:, None] * hd), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got_L, hdd @ x64 + y * yd, rtol=1e-4, atol=1e-4)


def test_a_repeated_primal_is_computed_once():
    # jacfwd(L) and L both compute A @ x; with the copies merged, the
    # collapse sees one product read twice, and adds none. Alone, nothing here
    # is worth folding (XLA merges the copies of jax.jit's program itself):
    # min_gain=0 folds it, to check pejit's own merge
    def f(a, x):
        return jnp.tanh(a @ x) * (a @ x)

    for residual, got in both_forms(f, (C1,), X, min_gain=0.0):
        assert prims(residual) == ["dot_general", "tanh", "mul"]
        y = np.float64(C1) @ np.float64(X)
        np.testing.assert_allclose(got, np.tanh(y) * y, rtol=1e-5, atol=1e-6)


def test_data_movement_and_known_indices_are_affine():
    idx = np.array([3, 1, 4, 1, 5])
    mask = rng.standard_normal(10) > 0

    def f(a, b, idx, mask, x):
        y = a @ (b @ x)
        z = jnp.concatenate([y[idx], jnp.where(mask, y[:10], 2.0 * y[10:20]), jnp.pad(y[::4], 2)])
        return jnp.tanh(2.0 * (z.reshape(-1, 1) * a[: z.size, :3]).sum(1) / 3.0 + x[: z.size])

    for residual, got in both_forms(f, (C1, C2, idx, mask), X):
        # x[:27] is folded into the matrix; the padding value (a folded
        # scalar, not yet a literal) counts as an offset, a uniform zero
        kept = [p for p in prims(residual.jaxpr) if p != "broadcast_in_dim"]
        assert kept in (["dot_general", "tanh"], ["dot_general", "add", "tanh"])
        assert len(residual.report.collapsed) == 1
        a, x = np.float64(C1), np.float64(X)
        y = a @ (np.float64(C2) @ x)
        z = np.concatenate([y[idx], np.where(mask, y[:10], 2 * y[10:20]), np.pad(y[::4], 2)])
        want = np.tanh(2 * (z[:, None] * a[: z.size, :3]).sum(1) / 3 + x[: z.size])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nonlinear_programs_are_left_alone():
    def f(a, x):
        y = a @ x
        return jnp.sin(y) * y + x * x

    for residual, got in both_forms(f, (C1,), X):
        assert residual.report.collapsed == ()
        assert prims(residual.jaxpr).count("dot_general") == 1
        y = np.float64(C1) @ X
        np.testing.assert_allclose(got, np.sin(y) * y + np.float64(X) ** 2, rtol=1e-5, atol=1e-6)


def test_one_product_is_not_collapsed():
    # a matrix-vector product is its own matrix: nothing to gain
    for residual, _ in both_forms(lambda a, x: a @ x, (C1,), X):
        assert residual.report.collapsed == () and prims(residual.jaxpr) == ["dot_general"]


def test_large_dynamic_inputs_are_not_collapsed():
    # elementwise affine work on 4096 elements: a matrix would be 4096^2
    c = rng.standard_normal(4096).astype(np.float32)
    for residual, got in both_forms(lambda c, x: 2.0 * (c * x) + c, (c,), np.ones(4096, np.float32)):
        assert residual.report.collapsed == ()
        np.testing.assert_allclose(got, 3.0 * c, rtol=1e-6)


def test_the_memory_cap_holds():
    for residual, _ in both_forms(chain, (C1, C2, C3), X, affine_max_bytes=32 * 32 * 4 - 1):
        assert residual.report.collapsed == () and len(residual.jaxpr.jaxpr.eqns) == 3


def test_integers_are_not_collapsed():
    a = np.arange(16, dtype=np.int32).reshape(4, 4)
    for residual, got in both_forms(lambda a, x: a @ (a @ x), (a,), np.arange(4, dtype=np.int32)):
        assert residual.report.collapsed == ()
        np.testing.assert_array_equal(got, a @ (a @ np.arange(4)))


def test_several_dynamic_inputs_and_outputs():
    def f(a, b, x, y):
        u = a @ (b @ (a @ x)) + b @ (a @ (b @ y))
        return u, jnp.tanh(u[:4] - a[:4] @ y)

    a, b = np.float64(C1), np.float64(C2)
    x, y = np.float64(X), np.float64(X[::-1])
    spec = specialize_jaxpr(jax.make_jaxpr(f)(C1, C2, X, X), known={0: C1, 1: C2})
    assert prims(spec.jaxpr).count("dot_general") == 2 and len(spec.report.collapsed) == 1
    got = jax.jit(jax.extend.core.jaxpr_as_fun(spec.jaxpr))(X, X[::-1])
    u = a @ (b @ (a @ x)) + b @ (a @ (b @ y))
    np.testing.assert_allclose(got[0], u, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], np.tanh(u[:4] - a[:4] @ y), rtol=1e-5, atol=1e-5)


def test_calls_and_custom_jvp_are_looked_into():
    @jax.custom_jvp
    def scale(v):
        return 3.0 * v

    scale.defjvp(lambda p, t: (scale(p[0]), 3.0 * t[0]))

    def f(a, b, x):
        return jnp.tanh(jax.jit(lambda v: a @ scale(v))(b @ x))

    residual, got = both_forms(f, (C1, C2), X)[1]
    assert prims(residual.jaxpr) == ["dot_general", "tanh"]
    np.testing.assert_allclose(got, np.tanh(3 * np.float64(C1) @ (np.float64(C2) @ X)), rtol=1e-5, atol=1e-6)
    # derivatives still go through the collapsed program
    g = pe(C1, C2, X, constant_arg_nums=[0, 1])(f)
    np.testing.assert_allclose(
        jax.jacfwd(g)(X), jax.jacfwd(lambda x: f(C1, C2, x))(X), rtol=1e-4, atol=1e-5
    )


def test_a_call_affine_only_after_nonlinear_work_is_not_affine():
    # the body's output is affine in sin(v), not in v
    def f(a, b, x):
        return a @ jax.jit(lambda v: 2.0 * jnp.sin(v))(b @ x)

    for residual, got in both_forms(f, (C1, C2), X):
        assert "sin" in prims(residual.jaxpr) or any(
            "sin" in str(e.params.get("jaxpr", "")) for e in residual.jaxpr.jaxpr.eqns
        )
        want = np.float64(C1) @ (2 * np.sin(np.float64(C2) @ X))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_effects_stay():
    def f(a, b, x):
        y = b @ x
        jax.debug.callback(lambda v: None, y)
        return a @ y

    for residual, got in both_forms(f, (C1, C2), X):
        assert len([e for e in residual.jaxpr.jaxpr.eqns if e.effects]) == 1
        np.testing.assert_allclose(got, np.float64(C1) @ (np.float64(C2) @ X), rtol=1e-5, atol=1e-6)


def test_float64_chain_matches_numpy_closely():
    with x64():
        a, b, c, x = (np.float64(v) for v in (C1, C2, C3, X))
        for residual, got in both_forms(chain, (a, b, c), x):
            assert residual.report.collapsed
            np.testing.assert_allclose(got, a @ (b @ (c @ x)), rtol=1e-13, atol=1e-15)


def test_scan_bodies_are_not_entered():
    def f(a, x):
        return lax.scan(lambda c, _: (a @ c, None), x, None, length=3)[0]

    for residual, got in both_forms(f, (C1,), X):
        assert "scan" in prims(residual.jaxpr)
        np.testing.assert_allclose(got, np.linalg.matrix_power(np.float64(C1), 3) @ X, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("orient", ["C @ v", "v @ C"])
def test_products_of_known_matrices_in_a_loop_body_are_one_product(orient):
    # the collapse does not enter loop bodies; the fold rule reassociates there
    # (diffrax's backward pass applies K^T (M^-T ct) at every stage)
    prod = (lambda c, v: c @ v) if orient == "C @ v" else (lambda c, v: v @ c.T)  # noqa: E731

    def f(c1, c2, x):
        return lax.fori_loop(0, 3, lambda i, v: jnp.tanh(prod(c1, prod(c2, v))), x)

    want = X.astype(np.float64)
    for _ in range(3):
        want = np.tanh(np.float64(C1) @ (np.float64(C2) @ want))
    for residual, got in both_forms(f, (C1, C2), X):
        body = [e for e in residual.jaxpr.eqns if e.primitive.name in ("scan", "while")][0].params
        body = body.get("jaxpr") or body["body_jaxpr"]
        assert [e.primitive.name for e in body.jaxpr.eqns].count("dot_general") == 1
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for residual, _ in both_forms(f, (C1, C2), X, affine=False):
        body = [e for e in residual.jaxpr.eqns if e.primitive.name in ("scan", "while")][0].params
        body = body.get("jaxpr") or body["body_jaxpr"]
        assert [e.primitive.name for e in body.jaxpr.eqns].count("dot_general") == 2


# -- a contraction against a broadcast contracts against its source ------------

A3 = (2 * np.eye(3) + rng.standard_normal((3, 3)) / 4).astype(np.float32)


def expanded_product(a, x):
    return jnp.broadcast_to(jnp.linalg.inv(a), (64, 3, 3)) @ x


@pytest.mark.parametrize("shape", [(3,), (64, 3, 1), (64, 3, 5)])
def test_no_dot_general_against_an_expansion(shape):
    x = rng.standard_normal(shape).astype(np.float32)
    for residual, got in both_forms(expanded_product, (A3,), x):
        assert [c.shape for c in residual.consts] == [(3, 3)]  # 36 bytes, not 64 x 36
        dots = [e for e in residual.jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
        assert len(dots) == 1 and all(v.aval.shape != (64, 3, 3) for v in dots[0].invars)
        want = np.broadcast_to(np.linalg.inv(np.float64(A3)), (64, 3, 3)) @ np.float64(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_expansion_along_batch_and_contracting_dimensions():
    def f(c, x, y):
        b = jnp.broadcast_to(c[:, None, :], (3, 64, 3))  # a new middle dimension
        return jnp.einsum("ibj,bj->i", b, x), jnp.einsum("ibj,bj->bi", b, y)

    x, y = rng.standard_normal((2, 64, 3)).astype(np.float32)
    g = pejit(f, constant_argnums=0)
    # each product reads c, not its expansion; on CPU devices the two folded
    # copies of c are also found equal (by their bytes) and passed once
    shapes = [c.shape for c in g.specialize(A3, x, y).residual.consts]
    if jax.default_backend() == "cpu":
        assert shapes == [(3, 3)]
    else:
        assert shapes and set(shapes) == {(3, 3)}
    got = g(A3, x, y)
    a = np.float64(A3)
    np.testing.assert_allclose(got[0], a @ np.float64(x).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], np.float64(y) @ a.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("orient", ["C.T @ v", "v @ C.T"])
def test_a_product_with_a_known_transpose_reads_its_source(orient):
    # a backward rule's inv(A).T @ g: the transpose is read through the product's
    # dimension numbers (as XLA reads it under jax.jit), not stored beside inv(A)
    back = (lambda c, v: c.T @ v) if orient == "C.T @ v" else (lambda c, v: v @ c.T)  # noqa: E731

    def f(a, x):
        inv = jnp.linalg.inv(a)
        return back(inv, jnp.tanh(inv @ x))

    inv = np.linalg.inv(np.float64(A32))
    want = back(inv, np.tanh(inv @ np.float64(X)))
    for residual, got in both_forms(f, (A32,), X):
        assert [c.shape for c in residual.consts] == [(32, 32)]  # inv(A), once
        assert "transpose" not in prims(residual.jaxpr)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_large_expansion_is_not_stored():
    a = (np.eye(256) + rng.standard_normal((256, 256)) / 64).astype(np.float32)
    f = pejit(lambda a, x: jnp.broadcast_to(jnp.linalg.inv(a), (64, 256, 256)) @ x, constant_argnums=0)
    x = np.ones(256, np.float32)
    assert f.specialize(a, x).residual.report.folded_bytes == 256 * 256 * 4  # 256 KiB, not 16 MiB
    np.testing.assert_allclose(f(a, x)[17], np.linalg.inv(np.float64(a)) @ x, rtol=1e-4, atol=1e-5)


@cpu_only  # the host rules build the matrix
def test_the_host_builds_larger_matrices_than_jvp_would(monkeypatch):
    """A region over the device's ``build_flops`` still collapses where the host builds
    its matrix (concrete constants, rules for every equation), not where ``jvp`` would."""
    monkeypatch.setitem(_device.PROFILES, "cpu", dataclasses.replace(_device.CPU, build_flops=0.0))
    closed = jax.make_jaxpr(chain)(C1, C2, C3, X)
    known = {0: C1, 1: C2, 2: C3}
    host = specialize_jaxpr(closed, known)
    assert prims(host.jaxpr) == ["dot_general"] and host.report.collapsed
    compiled = specialize_jaxpr(closed, known, FoldOptions(backend="compiled"))
    assert prims(compiled.jaxpr) == ["dot_general"] * 3 and not compiled.report.collapsed
    want = np.float64(C1) @ (np.float64(C2) @ (np.float64(C3) @ np.float64(X)))
    for spec in (host, compiled):
        (got,) = jax.extend.core.jaxpr_as_fun(spec.jaxpr)(X)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@cpu_only  # the host rules build the matrix
def test_both_forms_collapse_what_the_host_builds_for_every_value(monkeypatch):
    """The call-time form collapses a region over the device's ``build_flops`` as the TFC
    form does, on its first value and on later ones: the host builds each
    value's matrix (``host_affine_matrices``, which has no lowering), so the
    folding program is evaluated, never compiled (by ``jvp`` it would cost
    more than folding the value from scratch)."""
    monkeypatch.setitem(_device.PROFILES, "cpu", dataclasses.replace(_device.CPU, build_flops=0.0))
    tfc = pejit(C1, C2, C3, X, constant_arg_nums=[0, 1, 2])(chain)
    assert prims(tfc.specialize(X).residual.jaxpr) == ["dot_general"]
    f = pejit(chain, constant_argnums=(0, 1, 2))
    for scale in (1.0, 0.5, 2.0):
        consts = [jnp.asarray(c * scale) for c in (C1, C2, C3)]
        spec = f.specialize(*consts, X)
        assert prims(spec.residual.jaxpr) == ["dot_general"] and spec.residual.report.collapsed
        # host-built, then placed once: not copied to the device on every call
        assert all(isinstance(c, jax.Array) for c in spec.consts)
        c1, c2, c3 = (np.float64(c) for c in consts)
        np.testing.assert_allclose(f(*consts, X), c1 @ (c2 @ (c3 @ np.float64(X))), rtol=2e-5, atol=2e-6)
    folding = spec.program.folding_program
    assert "host_affine_matrices" in {e.primitive.name for e in folding.traced.jaxpr.eqns}
    assert folding.compiled is None
    assert f.cache_info().misses == 3
