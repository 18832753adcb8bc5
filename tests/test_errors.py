"""Bad input fails loudly, with an exception naming the argument; never a wrong result.

The documented exception types:

* ``TypeError``: wrong arity, a value of the wrong type (non-integer argument
  numbers, a non-array dynamic leaf, an unhashable constant leaf, a keyword
  the form does not take);
* ``ValueError``: a value of the right type that is invalid (argument numbers
  out of range or duplicated, unknown argument names, an argument both
  constant and static/donated, constants other than the compiled ones);
* errors raised by the user's function while it is folded propagate
  unchanged (same type, same message), and the traceback shows the user's
  source line;
* JAX's own errors (``TracerBoolConversionError``, ...) when Python needs the
  value of a *dynamic* argument, exactly as under ``jax.jit``.

Where pejit can do the right thing instead of failing, it does, and the
tests check the values: the TFC form called with shapes or dtypes other than
its example's re-specializes (as ``jax.jit`` retraces); a NumPy constant
mutated after specialization is re-folded.
"""

from __future__ import annotations

import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pe, pejit, specialize_jaxpr


def f(x, y):
    return x * y + 1.0


def g(x, y, *, scale=2.0):
    return x * scale + y


X = jnp.arange(3.0)
Y = jnp.ones(3)


# (id, thunk, exception type, regex the message must match)
CASES = [
    ("too many positional", lambda: pejit(f, constant_argnums=0)(X, Y, Y), TypeError,
     r"f\(\) takes 2 positional arguments but 3 were given"),
    ("missing argument", lambda: pejit(f, constant_argnums=0)(X), TypeError, r"missing 1 required.*'y'"),
    ("unexpected keyword", lambda: pejit(f, constant_argnums=0)(X, Y, z=Y), TypeError, r"'z'"),
    ("argument given twice", lambda: pejit(f, constant_argnums=1)(X, Y, x=X), TypeError,
     r"multiple values for argument 'x'"),
    ("unknown argname", lambda: pejit(f, constant_argnames="z"), ValueError,
     r"constant_argnames: 'z' is not a parameter"),
    ("unknown static argname", lambda: pejit(f, constant_argnums=0, static_argnames="w"), ValueError,
     r"static_argnames: 'w' is not a parameter"),
    ("positional-only argname", lambda: pejit(lambda a, /, b: a, constant_argnames="a"), ValueError,
     r"'a' is a positional-only parameter"),
    ("duplicate argnums", lambda: pejit(f, constant_argnums=(0, 0)), ValueError,
     r"constant_argnums: entry 0 names argument 0, which entry 0 already names"),
    ("duplicate argnums via negative", lambda: pejit(f, constant_argnums=(1, -1)), ValueError,
     r"entry -1 names argument 1"),
    ("duplicate argnames", lambda: pejit(f, constant_argnames=("x", "x")), ValueError, r"'x' is given twice"),
    ("argnums out of range", lambda: pejit(f, constant_argnums=2), ValueError,
     r"constant_argnums: entry 2 is out of range for 2 positional arguments"),
    ("negative argnums out of range", lambda: pejit(f, constant_argnums=-3), ValueError,
     r"entry -3 is out of range"),
    ("float argnums", lambda: pejit(f, constant_argnums=1.0), TypeError,
     r"constant_argnums must be an int or a sequence of ints, got float"),
    ("float argnums entry", lambda: pejit(f, constant_argnums=[0, 1.0]), TypeError,
     r"constant_argnums: entry 1.0 of type float is not an integer"),
    ("bool argnums entry", lambda: pejit(f, constant_argnums=[True]), TypeError,
     r"entry True of type bool is not an integer"),
    ("str argnums", lambda: pejit(f, constant_argnums="x"), TypeError, r"constant_argnums .* got str 'x'"),
    ("int argnames", lambda: pejit(f, constant_argnames=0), TypeError,
     r"constant_argnames must be a str or a sequence of str, got int"),
    ("static argnums out of range", lambda: pejit(f, static_argnums=5), ValueError,
     r"static_argnums: entry 5 is out of range"),
    ("constant and static overlap", lambda: pejit(f, constant_argnums=0, static_argnums=0), ValueError,
     r"argument 0 is both in constant_argnums/constant_argnames and in static_argnums"),
    ("constant and static overlap by name", lambda: pejit(f, constant_argnums=0, static_argnames="x"),
     ValueError, r"argument 0 is both in constant_argnums"),
    ("constant and donated overlap", lambda: pejit(f, constant_argnums=1, donate_argnums=1), ValueError,
     r"argument 1 is both in constant_argnums/constant_argnames and in donate_argnums"),
    ("constant and donated overlap by name", lambda: pejit(g, constant_argnames="scale", donate_argnames="scale"),
     ValueError, r"argument 'scale' is both in constant_argnums/constant_argnames and in donate"),
    ("static and donated overlap", lambda: pejit(f, static_argnums=0, donate_argnums=0), ValueError,
     r"argument 0 is both in static_argnums/static_argnames and in donate"),
    ("unhashable constant leaf", lambda: pejit(f, constant_argnums=0)({1, 2}, Y), TypeError,
     r"argument 0 has a leaf of type set that is neither an array nor hashable"),
    ("unhashable leaf in constant pytree",
     lambda: pejit(lambda a, y: y, constant_argnums=0)([np.ones(2), {"k": bytearray(b"x")}], Y), TypeError,
     r"argument 0 has a leaf of type bytearray"),
    ("unhashable static leaf", lambda: pejit(f, static_argnums=0)(bytearray(b"x"), Y), TypeError,
     r"argument 0 has a leaf of type bytearray"),
    ("unhashable constant keyword", lambda: pejit(g, constant_argnames="scale")(X, Y, scale={3}), TypeError,
     r"argument 'scale' has a leaf of type set"),
    ("non-array dynamic leaf", lambda: pejit(f, constant_argnums=0)(X, "a"), TypeError,
     r"argument 1 is dynamic but has a leaf of type str"),
    ("non-array dynamic leaf in pytree", lambda: pejit(lambda a, t: t["b"][0], constant_argnums=0)(X, {"b": [object()]}),
     TypeError, r"argument 1\['b'\]\[0\] is dynamic but has a leaf of type object"),
    ("non-array dynamic keyword", lambda: pejit(g, constant_argnums=0)(X, Y, scale="s"), TypeError,
     r"argument 'scale' is dynamic but has a leaf of type str"),
    ("both TFC and jit form", lambda: pejit(X, constant_arg_nums=[0], constant_argnums=0), TypeError,
     r"either constant_arg_nums .* or constant_argnums/constant_argnames"),
    ("examples without constant_arg_nums", lambda: pejit(X, Y), TypeError, r"no constant_arg_nums"),
    ("not a function", lambda: pejit(X, constant_argnums=0), TypeError, r"no constant_arg_nums"),
    ("fold_options of the wrong type", lambda: pejit(f, fold_options={"loops": False}), TypeError,
     r"fold_options must be a pejit.FoldOptions, got dict"),
    ("pe takes no jit keywords", lambda: pe(f, constant_argnums=0, donate_argnums=1), TypeError,
     r"donate_argnums"),
    ("pe cannot lower", lambda: pe(f, constant_argnums=0).lower(X, Y), AttributeError,
     r"lower\(\) needs a compiled function"),
    ("TFC wrong arity", lambda: pejit(X, Y, constant_arg_nums=[0])(f)(Y, Y), TypeError,
     r"f takes 1 positional argument \(the non-constant ones\) but 2 were given"),
    ("TFC constant_arg_nums out of range", lambda: pejit(X, Y, constant_arg_nums=[2])(f), ValueError,
     r"constant_arg_nums: entry 2 is out of range"),
    ("TFC duplicate constant_arg_nums", lambda: pejit(X, Y, constant_arg_nums=[1, 1])(f), ValueError,
     r"constant_arg_nums: entry 1 names argument 1"),
    ("TFC static_argnames", lambda: pejit(X, Y, constant_arg_nums=[0], static_argnames="y")(f), TypeError,
     r"static_argnames needs the jax.jit form"),
    ("TFC too many examples", lambda: pejit(X, Y, Y, constant_arg_nums=[0])(f), TypeError,
     r"takes 2 positional arguments but 3 were given"),
    ("in_shardings of the wrong length", lambda: pejit(f, constant_argnums=0, in_shardings=(None,) * 3)(X, Y),
     ValueError, r"in_shardings has 3 entries"),
    ("Python control flow on a dynamic argument",
     lambda: pejit(lambda a, y: a if y.sum() > 0 else y, constant_argnums=0)(X, Y),
     jax.errors.TracerBoolConversionError, r"boolean conversion"),
    ("data-dependent shape on a dynamic argument",
     lambda: pejit(lambda a, y: y[y > 0], constant_argnums=0)(X, Y),
     jax.errors.NonConcreteBooleanIndexError, r"boolean indices must be concrete"),
    ("specialize_jaxpr on a function", lambda: specialize_jaxpr(f, {}), TypeError,
     r"closed_jaxpr must be a jax.extend.core.ClosedJaxpr"),
    ("specialize_jaxpr key out of range", lambda: specialize_jaxpr(jax.make_jaxpr(f)(X, Y), {2: X}), ValueError,
     r"known key 2 is out of range for a jaxpr with 2 inputs"),
    ("specialize_jaxpr non-integer key", lambda: specialize_jaxpr(jax.make_jaxpr(f)(X, Y), {"x": X}), TypeError,
     r"known key 'x' is not an integer"),
    ("specialize_jaxpr wrong shape", lambda: specialize_jaxpr(jax.make_jaxpr(f)(X, Y), {0: jnp.ones(4)}),
     TypeError, r"known\[0\] has type float32\[4\], but input 0 of the jaxpr is float32\[3\]"),
    ("specialize_jaxpr wrong dtype", lambda: specialize_jaxpr(jax.make_jaxpr(f)(X, Y), {1: jnp.ones(3, jnp.int32)}),
     TypeError, r"known\[1\] has type int32\[3\]"),
    ("specialize_jaxpr non-array value", lambda: specialize_jaxpr(jax.make_jaxpr(f)(X, Y), {0: [1.0, 2.0, 3.0]}),
     TypeError, r"known\[0\] is a list"),
]


@pytest.mark.parametrize("thunk, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_enough_cases():
    assert len(CASES) >= 20


def test_compiled_rejects_other_constants():
    c = pejit(f, constant_argnums=0).lower(X, Y).compile()
    np.testing.assert_array_equal(c(X, Y), jax.jit(f)(X, Y))
    with pytest.raises(ValueError, match="specialized for other constant values"):
        c(X + 1, Y)


def _folds_then_fails(a, y):
    b = jnp.linalg.inv(a)
    return b.reshape(7) @ y  # the user's bug: a (2, 2) array has no 7 elements


def test_error_while_folding_shows_the_users_line():
    with pytest.raises(TypeError, match=r"cannot reshape array of shape \(2, 2\)") as info:
        pejit(_folds_then_fails, constant_argnums=0)(jnp.eye(2), jnp.ones(2))
    text = "".join(traceback.format_exception(info.value))
    assert "b.reshape(7) @ y" in text
    assert "_folds_then_fails" in text


class UserError(Exception):
    pass


def test_user_exception_propagates_unchanged():
    def check(a, y):
        if (a < 0).any():  # Python control flow on a constant: allowed
            raise UserError("a must be non-negative")
        return a * y

    p = pejit(check, constant_argnums=0)
    np.testing.assert_array_equal(p(X, Y), X * Y)
    with pytest.raises(UserError, match="a must be non-negative"):
        p(-X - 1, Y)


def test_failed_specialization_is_not_cached():
    broken = [True]

    def h(a, y):
        if broken[0]:
            raise UserError("broken")
        return a + y

    p = pejit(h, constant_argnums=0)
    with pytest.raises(UserError):
        p(X, Y)
    broken[0] = False
    np.testing.assert_array_equal(p(X, Y), X + Y)


@pytest.mark.parametrize("example, other", [
    (jnp.ones(2), jnp.arange(6.0).reshape(3, 2)),  # other shape
    (jnp.ones(2), jnp.arange(2)),  # other dtype
    (jnp.ones(2), jnp.float32(3.0)),  # scalar
])
def test_tfc_form_respecializes_for_other_shapes(example, other):
    """Documented behaviour: like jax.jit retracing, never a stale program."""
    a = jnp.array([2.0, 3.0])
    fun = lambda a, y: jnp.sin(a) * y  # noqa: E731
    bound = pejit(a, example, constant_arg_nums=[0])(fun)
    np.testing.assert_allclose(bound(example), jax.jit(fun)(a, example), rtol=1e-6)
    got, want = bound(other), jax.jit(fun)(a, other)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_tfc_form_shape_error_comes_from_the_function():
    bound = pejit(jnp.ones((2, 2)), jnp.ones(2), constant_arg_nums=[0])(lambda a, y: a @ y)
    with pytest.raises(TypeError, match="dot_general requires contracting dimensions"):
        bound(jnp.ones(3))


def test_mutated_numpy_constant_is_refolded():
    a = np.arange(3.0)
    p = pejit(lambda a, y: jnp.cumsum(a) * y, constant_argnums=0)
    np.testing.assert_allclose(p(a, Y), np.cumsum(a))
    a[0] = 10.0
    np.testing.assert_allclose(p(a, Y), np.cumsum(a))


@pytest.mark.parametrize("const", [1, 1.0, True, np.float32(1.0)])
def test_equal_scalars_of_other_types_are_not_confused(const):
    p = pejit(lambda c, y: (c + y, jnp.asarray(c).dtype == jnp.bool_), constant_argnums=0)
    for c in [1, 1.0, True, np.float32(1.0), const]:
        got, want = p(c, jnp.int32(2)), jax.jit(lambda y: (c + y, jnp.asarray(c).dtype == jnp.bool_))(jnp.int32(2))
        assert got[0].dtype == want[0].dtype, c
        assert bool(got[1]) == bool(want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_fold_options_off_does_not_change_results():
    def fun(a, y):
        b = jnp.broadcast_to(a, (64, 3)) * 2.0
        z = jax.lax.cond(a.sum() > 0, lambda v: v + b, lambda v: v - b, y)
        return jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + jnp.cos(a), z)

    y = jnp.ones((64, 3))
    want = jax.jit(fun)(X, y)
    for opts in [FoldOptions(), FoldOptions(branches=False, calls=False, loops=False, rematerialize=False)]:
        np.testing.assert_allclose(pejit(fun, constant_argnums=0, fold_options=opts)(X, y), want, rtol=1e-6)


@pytest.mark.parametrize("out", [
    lambda s, a: (s * 2.0, a),  # Python float computed from a constant
    lambda s, a: (s, a),  # a constant returned unchanged
    lambda s, a: (np.ones(2) * s, a),  # NumPy array
    lambda s, a: (np.float32(s), a),  # NumPy scalar
])
def test_python_and_numpy_outputs_match_jit(out):
    """Regression: these outputs used to fail with 'non-canonical constant'."""
    got = pejit(out, constant_argnums=0)(3.0, X)
    want = jax.jit(out, static_argnums=0)(3.0, X)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype, g.weak_type) == (w.shape, w.dtype, w.weak_type)
        np.testing.assert_array_equal(g, w)


def test_non_jax_output_names_the_output():
    with pytest.raises(TypeError, match=r"returned a value of type str as its output leaf 1"):
        pejit(lambda s, a: (a, "done"), constant_argnums=0)(1.0, X)
