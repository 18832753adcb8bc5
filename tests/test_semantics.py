"""Effects stay, transformations compose, nothing global changes."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

from pejit import pe, pejit

from ._util import primitive_names, requires_jax

A = jnp.array([[3.0, 1.0, 0.0], [1.0, 4.0, 1.0], [0.0, 1.0, 5.0]])


# -- effects ------------------------------------------------------------------


@requires_jax((0, 8), "jax.debug.print stages a debug_callback equation, not debug_print")
def test_debug_print_on_constants_runs_every_call(capfd):
    def f(c, x):
        jax.debug.print("c sum = {}", c.sum())
        return x * c

    g = pejit(f, constant_argnums=0)
    c = jnp.arange(3.0)
    capfd.readouterr()
    for _ in range(3):
        jax.block_until_ready(g(c, 1.0))
    jax.effects_barrier()
    assert capfd.readouterr().out.count("c sum = 3.0") == 3
    assert "debug_print" in primitive_names(jax.make_jaxpr(lambda x: g(c, x))(1.0))


@pytest.mark.parametrize("wrap", [pe, pejit])
def test_io_callback_on_constants_runs_every_call(wrap):
    calls = []

    def record(v):
        calls.append(float(v))
        return np.float32(v * 2)

    def f(c, x):
        y = io_callback(record, jax.ShapeDtypeStruct((), jnp.float32), c.sum())
        return x + y

    g = wrap(f, constant_argnums=0)
    c = jnp.ones(4)
    assert g(c, 1.0) == 9.0
    assert g(c, 2.0) == 10.0
    assert calls == [4.0, 4.0]


# -- transformations ----------------------------------------------------------


def f_mixed(A, x):
    y = jnp.linalg.inv(A) @ x + jnp.linalg.cholesky(A @ A.T) @ jnp.sin(x)
    return jnp.tanh(y) * jnp.sum(A) + jax.nn.relu(x - 0.5)


@pytest.fixture(params=["pejit", "pe", "tfc"])
def folded(request):
    """f_mixed with A folded, in each form, and the reference with A closed over."""
    x0 = jnp.ones(3)
    if request.param == "pejit":
        g = pejit(f_mixed, constant_argnums=0)
        return lambda x: g(A, x)
    if request.param == "pe":
        g = pe(f_mixed, constant_argnums=0)
        return lambda x: g(A, x)
    return pejit(A, x0, constant_arg_nums=[0])(f_mixed)


def reference(x):
    return f_mixed(A, x)


X = jnp.array([0.3, -1.2, 2.0])
TOL = dict(rtol=2e-5, atol=2e-6)


def test_values(folded):
    np.testing.assert_allclose(folded(X), jax.jit(reference)(X), **TOL)


def test_grad_vjp_jvp(folded):
    def loss(h):
        return lambda x: jnp.sum(h(x) ** 2)

    np.testing.assert_allclose(jax.grad(loss(folded))(X), jax.grad(loss(reference))(X), **TOL)
    out, vjp = jax.vjp(folded, X)
    ref_out, ref_vjp = jax.vjp(reference, X)
    ct = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(vjp(ct)[0], ref_vjp(ct)[0], **TOL)
    np.testing.assert_allclose(out, ref_out, **TOL)
    t = jnp.array([0.1, 0.2, -0.3])
    np.testing.assert_allclose(jax.jvp(folded, (X,), (t,))[1], jax.jvp(reference, (X,), (t,))[1], **TOL)
    np.testing.assert_allclose(jax.hessian(loss(folded))(X), jax.hessian(loss(reference))(X), rtol=1e-4, atol=1e-5)


def test_vmap_jit_scan(folded):
    xs = jnp.stack([X, X * 2, -X])
    np.testing.assert_allclose(jax.vmap(folded)(xs), jax.vmap(reference)(xs), **TOL)
    np.testing.assert_allclose(jax.jit(folded)(X), reference(X), **TOL)

    def body(c, x):
        return c + folded(x), folded(x * c)

    def ref_body(c, x):
        return c + reference(x), reference(x * c)

    out = lax.scan(body, jnp.zeros(3), xs)
    ref = lax.scan(ref_body, jnp.zeros(3), xs)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), out, ref)


def test_folded_lapack_is_gone(folded):
    names = primitive_names(jax.make_jaxpr(folded)(X))
    assert not {"lu", "cholesky", "triangular_solve"} & set(names)


# -- custom derivative rules still govern the dynamic arguments ---------------


def test_relu_grad_at_zero_uses_custom_rule():
    def f(s, x):
        return jax.nn.relu(s * x)

    g = pejit(f, constant_argnums=0)
    s = jnp.float32(2.0)
    # relu's custom_jvp defines the derivative at 0 as 0 (TFC loses the rule
    # and returns 1 here).
    assert jax.grad(lambda x: g(s, x))(0.0) == jax.grad(lambda x: f(s, x))(0.0) == 0.0
    assert jax.grad(lambda x: g(s, x))(1.0) == 2.0


def test_logsumexp_and_user_custom_vjp():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))

    def f(w, x):
        return jax.nn.logsumexp(w * x) + jnp.sum(clip_grad(w * x) * 10.0)

    w = jnp.array([1.0, 2.0, 3.0])
    g = pejit(f, constant_argnums=0)
    x = jnp.array([0.5, -0.25, 1.0])
    expected = jax.grad(lambda x: f(w, x))(x)
    np.testing.assert_allclose(jax.grad(lambda x: g(w, x))(x), expected, rtol=1e-6)
    # the clipped cotangent (10 -> 1) times w shows the rule is applied
    autodiff = jax.grad(lambda x: jax.nn.logsumexp(w * x) + jnp.sum(w * x * 10.0))(x)
    assert not np.allclose(expected, autodiff)


# -- nothing global changes ---------------------------------------------------


def test_no_config_change():
    before = jax.config.jax_enable_x64
    g = pejit(lambda a, x: a * x, constant_argnums=0)
    g(np.float64(2.0), 1.0)
    assert jax.config.jax_enable_x64 == before


def _run(code: str, **env):
    env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize("x64", ["0", "1"])
def test_under_both_x64_settings(x64):
    proc = _run(
        """
        import jax, jax.numpy as jnp, numpy as np, pejit
        A = np.arange(4.0).reshape(2, 2) + 3 * np.eye(2)
        f = pejit.pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
        out = f(A, jnp.ones(2))
        ref = jax.jit(lambda x: jnp.linalg.inv(A) @ x)(jnp.ones(2))
        assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
        np.testing.assert_allclose(out, ref, rtol=1e-6)
        print(out.dtype, jax.config.jax_enable_x64)
        """,
        JAX_ENABLE_X64=x64,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == (["float64", "True"] if x64 == "1" else ["float32", "False"])


def test_import_changes_no_config():
    proc = _run(
        """
        import jax
        before = {k: getattr(jax.config, k) for k in ("jax_enable_x64", "jax_default_matmul_precision", "jax_disable_jit")}
        import pejit
        after = {k: getattr(jax.config, k) for k in before}
        assert before == after, (before, after)
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
