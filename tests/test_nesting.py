"""pejit nested in itself, in jax.jit and in JAX's transformations: jax.jit's values and errors.

The regressions of issue 26 first (each gave a wrong value or crashed), then
a property test that draws nestings of pejit (with and without constants,
``constant_argnums="auto"`` included), ``jax.jit``, ``grad``, ``vjp``,
``jvp``, ``vmap``, ``checkpoint`` and ``has_aux``, and compares values and
gradients with the same nesting under ``jax.jit``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pejit import pejit


# -- regressions ---------------------------------------------------------------
def test_grad_of_pejit_under_pejit():
    # jax.grad's wrapper copies the __dict__ of the function it wraps: the
    # outer pejit used to inherit the inner one's options and caches, and ran h.
    h = pejit(lambda x: x * x)
    assert float(pejit(jax.grad(h))(1.0)) == 2.0
    assert float(h(3.0)) == 9.0


def test_grad_has_aux_under_pejit():
    def f(x):
        _, aux = jax.grad(lambda x: (x**3, [x**3]), has_aux=True)(x)
        return aux[0]

    assert float(pejit(jax.grad(pejit(f)))(4.0)) == float(jax.jit(jax.grad(jax.jit(f)))(4.0)) == 48.0


@pytest.mark.parametrize("form", ["plain", "constant", "auto", "tfc"])
def test_state_is_not_shared_through_wrappers(form):
    """A pejit function's __dict__ holds the wrapped function's attributes only, as jax.jit's."""
    def f(x):
        return x + 1

    f.tag = "mine"
    if form == "tfc":
        p = pejit(2.0, 1.0, constant_arg_nums=[0])(lambda a, x: a * x)
    else:
        kwargs = {"plain": {}, "constant": {"constant_argnums": 0}, "auto": {"constant_argnums": "auto"}}[form]
        p = pejit(f, **kwargs)
        assert p.tag == "mine"
    wrapper_attributes = {"__wrapped__", *functools.WRAPPER_ASSIGNMENTS, "tag"}
    assert set(vars(p)) <= wrapper_attributes
    assert set(vars(jax.grad(p))) <= wrapper_attributes


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad", "jvp"])
def test_closing_over_an_outer_tracer(transform):
    """A pejit function that closes over a tracer of an outer transformation, called twice."""
    def run(jit):
        inner = jit(lambda x: x * 3.0)

        def outer(y):
            return jit(lambda x: jnp.sin(x) * y)(2.0) + inner(y)

        xs = jnp.arange(1.0, 4.0)
        if transform == "jvp":
            return [jax.jvp(outer, (x,), (2 * x,)) for x in xs]
        t = {"jit": jax.jit, "vmap": jax.vmap, "grad": jax.grad}[transform]
        if transform == "vmap":
            return [t(outer)(xs), t(outer)(2 * xs)]
        return [t(outer)(x) for x in xs]

    np.testing.assert_allclose(np.array(run(pejit)), np.array(run(jax.jit)), rtol=1e-6)


def test_closing_over_an_outer_tracer_with_constants():
    f_const = jnp.arange(3.0)

    def run(jit, **kwargs):
        def outer(y):
            return jit(lambda c, x: jnp.sum(jnp.cos(c) * x * y), **kwargs)(f_const, jnp.ones(3))

        return [jax.grad(outer)(y) for y in (1.0, 2.0)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = run(pejit, constant_argnums=0)
    np.testing.assert_allclose(got, run(jax.jit), rtol=1e-6)


def test_nested_pejit_closing_over_the_outer_trace():
    def run(jit):
        scale = jit(lambda x: jit(lambda z: z * x)(2.0) + x)
        return [scale(x) for x in (1.0, 5.0)]

    assert [float(v) for v in run(pejit)] == [float(v) for v in run(jax.jit)] == [3.0, 15.0]


def _leak(jit):
    leaked = []

    def f(x):
        leaked.append(x)
        return x

    jit(f)(1.0)
    return leaked[0]


def test_unexpected_tracer_error():
    for jit in (jax.jit, pejit):
        tracer = _leak(jit)
        with pytest.raises(jax.errors.UnexpectedTracerError):
            jit(lambda y: tracer + y)(1.0)


def test_tracer_bool_conversion_error():
    for jit in (jax.jit, pejit):
        with pytest.raises(jax.errors.TracerBoolConversionError):
            jit(lambda x: 1.0 if x > 0 else 2.0)(1.0)


@pytest.mark.parametrize("transform", ["plain", "checkpoint_inside", "checkpoint_outside"])
def test_jvp_called_again(transform):
    def fn(a, x):
        return jnp.sin(jnp.cos(a) @ x) * x

    a = jnp.arange(4.0).reshape(2, 2)
    f = pejit(jax.checkpoint(fn) if transform == "checkpoint_inside" else fn, constant_argnums=0)
    g = functools.partial(f, a)
    if transform == "checkpoint_outside":
        g = jax.checkpoint(g)
    want = jax.jvp(functools.partial(fn, a), (jnp.ones(2),), (jnp.arange(2.0),))
    for _ in range(3):
        got = jax.jvp(g, (jnp.ones(2),), (jnp.arange(2.0),))
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)


def test_warning_under_python_c():
    """A warning never fails a call, wherever the calling code runs (here ``python -c``)."""
    code = textwrap.dedent("""
        import warnings
        import numpy as np, jax.numpy as jnp
        from pejit import pejit
        from pejit._errors import WritableConstantWarning
        A = np.ones((1200, 1200), np.float32)
        x = jnp.ones(1200)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g = pejit(A, x, constant_arg_nums=[0])(lambda A, x: A @ x)
            exec("h = pejit(lambda A, x: A @ x, constant_argnums=0); y = h(A, x)", {"pejit": pejit, "A": A, "x": x})
        assert float(g(x)[0]) == 1200.0
        assert [w.category for w in caught] == [WritableConstantWarning] * 2, caught
        assert [w.filename for w in caught] == ["<string>"] * 2, caught
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("where", ["created", "closed_over", "argument"])
def test_effect_tokens(where):
    token = jax.lax.create_token()
    fun = {
        "created": lambda x: (jax.lax.create_token(), x * 2),
        "closed_over": lambda x: (token, x * 2),
        "argument": lambda t, x: (t, x * 2),
    }[where]
    args = (token, 1.0) if where == "argument" else (1.0,)
    for _ in range(2):
        got, want = pejit(fun)(*args), jax.jit(fun)(*args)
        assert type(got[0]) is type(want[0])
        assert float(got[1]) == float(want[1]) == 2.0
