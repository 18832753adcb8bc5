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
        from pejit._calls._errors import WritableConstantWarning
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


# -- property: nestings against jax.jit --------------------------------------------
#: One example compiles a few dozen small programs; the suite-wide budget
#: (PEJIT_RANDOM_EXAMPLES, see test_random_programs) is shared.
EXAMPLES = max(1, int(os.environ.get("PEJIT_RANDOM_EXAMPLES", 500)) // 20)

N = 3
_C = jnp.array([[0.5, -0.2, 0.1], [0.3, 0.4, -0.6], [-0.1, 0.2, 0.3]])
_K = jnp.array([0.7, -0.3, 0.2])

BASES = {
    "poly": lambda x: x * x + jnp.sin(x),
    "closure": lambda x: jnp.tanh(_C @ x) + x,  # closes over a concrete array
    "reduce": lambda x: x * jnp.sum(jnp.cos(x)),
}


def _with_constant(c, x, g):
    """Work on the constant alone (folded by pejit), then ``g`` on the dynamic input."""
    return g(x) * (jnp.sum(jnp.exp(c)) / 4.0) + jnp.cos(c) * x


#: Each layer maps a function of x: f32[N] -> f32[N] to another; ``jit``
#: is what the layer's jit is (pejit, or jax.jit for the reference). A layer
#: that is a new function wraps the old one with ``functools.wraps``, as a
#: user's decorator would (and as JAX's transformations do).
LAYERS = {
    "jit": lambda g, jit: jax.jit(g),
    "pejit": lambda g, jit: jit(g),
    "pejit_const": lambda g, jit: _constant_layer(g, jit, {"constant_argnums": 0}, keyword=False),
    "pejit_const_name": lambda g, jit: _constant_layer(g, jit, {"constant_argnames": "c"}, keyword=True),
    "pejit_auto": lambda g, jit: _constant_layer(
        g, jit, {"constant_argnums": "auto", "auto_min_flops": 0}, keyword=False),
    "grad": lambda g, jit: _wraps(g, lambda x: jax.grad(_wraps(g, lambda x: jnp.sum(jnp.sin(g(x)))))(x)),
    "vjp": lambda g, jit: _wraps(g, lambda x: _vjp(g, x)),
    "jvp": lambda g, jit: _wraps(g, lambda x: (lambda p, t: p + 0.5 * t)(*jax.jvp(g, (x,), (jnp.cos(x),)))),
    "vmap": lambda g, jit: _wraps(g, lambda x: jax.vmap(g)(jnp.stack([x, 0.5 * x])).sum(0)),
    "checkpoint": lambda g, jit: jax.checkpoint(g),
    "has_aux": lambda g, jit: _wraps(g, lambda x: (lambda d, aux: d + aux)(
        *jax.grad(_wraps(g, lambda x: (jnp.sum(g(x) ** 2) / 2, g(x))), has_aux=True)(x))),
}


def _wraps(g, fun):
    return functools.wraps(g)(fun)


def _constant_layer(g, jit, options: dict, keyword: bool):
    h = functools.partial(_with_constant, g=g)
    if jit is jax.jit:
        options = {}
    f = jit(lambda c, x: h(c, x), **options)
    return (lambda x: f(x=x, c=_K)) if keyword else (lambda x: f(_K, x))


def _vjp(g, x):
    out, pullback = jax.vjp(g, x)
    return pullback(jnp.cos(out))[0] + out


def _is_pejit_layer(layer: str) -> bool:
    return layer.startswith("pejit")


def build(base: str, layers: list[str], jit, outer_jit: bool, base_jit: bool = False):
    """The nesting: ``layers`` applied to the base function (jitted if ``base_jit``), innermost first."""
    g = jit(BASES[base]) if base_jit else BASES[base]
    for layer in layers:
        g = LAYERS[layer](g, jit)
    return jax.jit(g) if outer_jit else g


def _close(got, want, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-5, err_msg=what)


@st.composite
def nestings(draw):
    # plain pejit twice as often: it wraps the layer below as it is (as jax.jit would)
    layers = draw(st.lists(st.sampled_from([*sorted(LAYERS), "pejit"]), min_size=1, max_size=4))
    if not any(map(_is_pejit_layer, layers)):
        layers.insert(draw(st.integers(0, len(layers))), draw(st.sampled_from(
            [k for k in sorted(LAYERS) if _is_pejit_layer(k)])))
    return {"base": draw(st.sampled_from(sorted(BASES))), "base_jit": draw(st.booleans()), "layers": layers,
            "outer_jit": draw(st.booleans())}


def check_nesting(nesting: dict) -> None:
    """Values on repeated and new inputs, and gradients, of a nesting under pejit and under jax.jit."""
    got_f = build(nesting["base"], nesting["layers"], pejit, nesting["outer_jit"], nesting["base_jit"])
    want_f = build(nesting["base"], nesting["layers"], jax.jit, nesting["outer_jit"], nesting["base_jit"])
    xs = [jnp.linspace(0.3, 1.2, N), jnp.linspace(-0.4, 0.5, N)]
    # the same inputs again: cache hits (and auto's promotion) must not change a value
    for i, x in enumerate([xs[0], xs[1], xs[0], xs[0]]):
        _close(got_f(x), want_f(x), f"value (call {i}) of {nesting}")
    grad = jax.grad(lambda f, x: jnp.sum(f(x)), argnums=1)
    for x in xs:
        _close(grad(got_f, x), grad(want_f, x), f"gradient of {nesting}")


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(nestings())
def test_nestings_match_jax_jit(nesting):
    check_nesting(nesting)


def test_caches_depend_on_the_axis_environment():
    """Named axes in scope are part of the key, as in jax.jit's (lax.axis_size is folded)."""
    g = pejit(lambda: jax.lax.axis_size("i"))
    for size in (2, 3, 2):
        assert jax.vmap(g, axis_name="i", axis_size=size, out_axes=None)() == size
    h = pejit(lambda a, x: x * jax.lax.axis_size("i") + jnp.sum(jnp.sin(a)), constant_argnums=0)
    a = jnp.ones(3)
    for n in (2, 3):
        got = jax.vmap(lambda x: h(a, x), axis_name="i")(jnp.ones(n))
        np.testing.assert_allclose(got, np.full(n, n + 3 * np.sin(1.0)), rtol=1e-6)


@pytest.mark.parametrize("case", ["scalar", "int", "constant", "folded"])
def test_weak_types_as_jax_jit(case):
    """Python scalars give weakly typed results, as under jax.jit (it decides later promotions)."""
    fun, args, kwargs = {
        "scalar": (lambda x: x * 2, (1.0,), {}),
        "int": (lambda x: x * 2 + 1, (1,), {}),
        "constant": (lambda c, x: x * jnp.sin(c), (1.0, 2.0), {"constant_argnums": 0}),
        "folded": (lambda c, x: x + jnp.sin(c) * 3, (1.0, 2.0), {"constant_argnums": 0}),
    }[case]
    f = pejit(fun, **kwargs)
    for _ in range(2):
        got, want = f(*args), jax.jit(fun)(*args)
        assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)
        assert (got + jnp.ones((), jnp.float16)).dtype == (want + jnp.ones((), jnp.float16)).dtype
    assert f.eval_shape(*args) == jax.eval_shape(fun, *args)


def test_traces_and_compiles_as_jax_jit():
    """With nothing to fold, a call traces and compiles as jax.jit's does: once per new argument type."""
    from ._util import Compiles

    args = [(jnp.ones(3), jnp.ones(3)), (jnp.ones(3), jnp.full(3, 2.0)), (jnp.ones(4), jnp.ones(4)),
            (1.0, 2.0), (1.0, 3.0), (jnp.ones(3), jnp.ones(3))]
    counts = []
    for jit in (jax.jit, pejit, functools.partial(pejit, constant_argnums="auto")):
        traces = []

        def f(x, y):
            traces.append(None)
            return jnp.sin(x) * y

        g = jit(f)
        with Compiles() as compiles:
            for a in args:
                g(*a)
        counts.append((len(traces), compiles.count))
    # one per distinct argument type (jax.jit's own count may be lower, from caches earlier tests filled)
    distinct = len({tuple(jax.typeof(x) for x in a) for a in args})
    assert counts[1] == counts[2] == (distinct, distinct) and max(counts[0]) <= distinct, counts
