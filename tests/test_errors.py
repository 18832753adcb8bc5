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
  value of a *dynamic* argument, exactly as under ``jax.jit``;
* ``jax.jit``'s own errors, word for word, for what ``jax.jit`` checks: the
  function, static and donated argument numbers and names (pejit builds
  ``jax.jit`` first), and every call of a function without constant
  arguments (which *is* ``jax.jit``; see tests/test_dropin.py).

Where pejit can do the right thing instead of failing, it does, and the
tests check the values: the TFC form called with shapes or dtypes other than
its example's re-specializes (as ``jax.jit`` retraces); a NumPy constant
mutated after specialization is re-folded.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import (
    FoldingSkippedWarning, FoldOptions, NothingFoldedWarning, WritableConstantWarning, pe, pejit, specialize_jaxpr,
)


def f(x, y):
    return x * y + 1.0


def g(x, y, *, scale=2.0):
    return x * scale + y


ROOT = Path(__file__).resolve().parents[1]
X = jnp.arange(3.0)
Y = jnp.ones(3)


def jax_says(thunk) -> str:
    """A regex of the first line of the error ``jax.jit`` raises in ``thunk``
    (its words differ between JAX versions)."""
    try:
        thunk()
    except Exception as e:  # noqa: BLE001
        return re.escape(str(e).splitlines()[0])
    raise AssertionError("jax.jit raised nothing")


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
     jax_says(lambda: jax.jit(f, static_argnames="w"))),
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
     jax_says(lambda: jax.jit(f, static_argnums=5))),
    ("constant and static overlap", lambda: pejit(f, constant_argnums=0, static_argnums=0), ValueError,
     r"argument 0 is both in constant_argnums/constant_argnames and in static_argnums"),
    ("constant and static overlap by name", lambda: pejit(f, constant_argnums=0, static_argnames="x"),
     ValueError, r"argument 0 is both in constant_argnums"),
    ("constant and donated overlap", lambda: pejit(f, constant_argnums=1, donate_argnums=1), ValueError,
     r"argument 1 is both in constant_argnums/constant_argnames and in donate_argnums"),
    ("constant and donated overlap by name", lambda: pejit(g, constant_argnames="scale", donate_argnames="scale"),
     ValueError, r"argument 'scale' is both in constant_argnums/constant_argnames and in donate"),
    ("static and donated overlap", lambda: pejit(f, static_argnums=0, donate_argnums=0), ValueError,
     jax_says(lambda: jax.jit(f, static_argnums=0, donate_argnums=0))),
    ("static and donated overlap, constants", lambda: pejit(f, constant_argnums=1, static_argnums=0,
                                                            donate_argnums=0, donate_argnames=()), ValueError,
     # JAX 0.7's jax.jit rejects this itself, first; later ones only at the call
     r"argument 0 is both in static_argnums/static_argnames and in donate|`donate_argnums` \[0\] cannot intersect"),
    ("unhashable constant leaf", lambda: pejit(f, constant_argnums=0)({1, 2}, Y), TypeError,
     r"argument 0 has a leaf of type set that is neither an array nor hashable"),
    ("unhashable leaf in constant pytree",
     lambda: pejit(lambda a, y: y, constant_argnums=0)([np.ones(2), {"k": bytearray(b"x")}], Y), TypeError,
     r"argument 0 has a leaf of type bytearray"),
    ("unhashable static argument", lambda: pejit(f, static_argnums=0)(bytearray(b"x"), Y), ValueError,
     jax_says(lambda: jax.jit(f, static_argnums=0)(bytearray(b"x"), Y))),
    ("unhashable static leaf, constants", lambda: pejit(f, constant_argnums=1, static_argnums=0)(bytearray(b"x"), Y),
     TypeError, r"argument 0 has a leaf of type bytearray"),
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
    ("not a function", lambda: pejit(X, constant_argnums=0), TypeError,
     r"the first argument must be the function to specialize, but an array of shape \(3,\) is not callable"),
    ("fold_options of the wrong type", lambda: pejit(f, fold_options={"loops": False}), TypeError,
     r"fold_options must be a pejit.FoldOptions, got dict"),
    ("pe takes no jit keywords", lambda: pe(f, constant_argnums=0, donate_argnums=1), TypeError,
     r"donate_argnums"),
    ("pe cannot lower", lambda: pe(f, constant_argnums=0).lower(X, Y), AttributeError,
     r"lower\(\) needs a compiled function"),
    ("TFC wrong arity", lambda: pejit(X, Y, constant_arg_nums=[0])(f)(Y, Y), TypeError,
     r"f takes 1 positional argument \(the non-constant ones\) but 2 were given"),
    ("TFC wrong arity, a partial", lambda: pejit(X, Y, constant_arg_nums=[0])(functools.partial(g, scale=2.0))(),
     TypeError, r"g takes 1 positional argument \(the non-constant ones\) but 0 were given"),
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


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # f folds nothing: the point is the error
@pytest.mark.parametrize("thunk, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(thunk, exc, match):
    with pytest.raises(exc, match=match):
        thunk()


def test_enough_cases():
    assert len(CASES) >= 20


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # f folds nothing: the point is the check
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


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
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


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
def test_tfc_form_shape_error_comes_from_the_function():
    bound = pejit(jnp.ones((2, 2)), jnp.ones(2), constant_arg_nums=[0])(lambda a, y: a @ y)
    with pytest.raises(TypeError, match="dot_general requires contracting dimensions"):
        bound(jnp.ones(3))


@pytest.mark.parametrize("staged", [False, True], ids=["called", "inside jax.jit"])
def test_mutated_numpy_constant_is_refolded(staged):
    # float64, so that JAX converts it: it keeps the converted copy of an array that a
    # trace closes over by the array's identity, so pejit compiles a copy in, not the array
    a = np.arange(3.0)
    p = pejit(lambda a, y: jnp.cumsum(a) * y, constant_argnums=0)
    call = jax.jit(lambda y: p(a, y)) if staged else functools.partial(p, a)
    np.testing.assert_allclose(call(Y), np.cumsum(a))
    a[0] = 10.0
    np.testing.assert_array_equal(jnp.asarray(a), a.astype(np.float32))  # no stale copy left in JAX
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


# -- mistakes caught at decoration, with the exact message -------------------------
def solve(A, x):
    return jnp.linalg.inv(A) @ x


A2, X2 = 2 * jnp.eye(2), jnp.ones(2)
_KEYWORDS = ("constant_argnums, constant_argnames, constant_arg_nums, fold_options, cache_size, "
             "cache_bytes, constant_shardings and the keywords of jax.jit")

# (id, thunk, exception type, the whole message)
EXACT = [
    ("TFC spelling in the call-time form", lambda: pejit(solve, constant_arg_nums=[0]), TypeError,
     "pejit(solve, constant_arg_nums=[0]): constant_arg_nums belongs to the TFC form, which takes example "
     "arguments first and the function after: pejit(*example_args, constant_arg_nums=[...])(solve). To pass "
     "the function first, as with jax.jit, write constant_argnums: pejit(solve, constant_argnums=[0])"),
    ("TFC spelling in pe", lambda: pe(solve, constant_arg_nums=[1]), TypeError,
     "pe(solve, constant_arg_nums=[1]): constant_arg_nums belongs to the TFC form, which takes example "
     "arguments first and the function after: pe(*example_args, constant_arg_nums=[...])(solve). To pass "
     "the function first, as with jax.jit, write constant_argnums: pe(solve, constant_argnums=[1])"),
    ("misspelled keyword", lambda: pejit(solve, constant_argnum=0), TypeError,
     f"pejit: unknown keyword argument 'constant_argnum'; did you mean constant_argnums? pejit takes {_KEYWORDS}"),
    ("misspelled keyword as decorator", lambda: pejit(constant_argname="A"), TypeError,
     f"pejit: unknown keyword argument 'constant_argname'; did you mean constant_argnames? pejit takes {_KEYWORDS}"),
    ("misspelled jax.jit keyword", lambda: pejit(solve, constant_argnums=0, donate_argnum=1), TypeError,
     f"pejit: unknown keyword argument 'donate_argnum'; did you mean donate_argnums? pejit takes {_KEYWORDS}"),
    ("unknown keyword, nothing close", lambda: pejit(solve, constant_argnums=0, zzz=1), TypeError,
     f"pejit: unknown keyword argument 'zzz'. pejit takes {_KEYWORDS}"),
    ("misspelled keyword in pe", lambda: pe(solve, constant_argnmus=0), TypeError,
     f"pe: unknown keyword argument 'constant_argnmus'; did you mean constant_argnums? pe takes {_KEYWORDS}"),
    ("TFC form called with a keyword", lambda: pejit(A2, X2, constant_arg_nums=[0])(solve)(x=X2), TypeError,
     "solve (the TFC form of pejit) takes its non-constant arguments by position: solve(x); "
     "got keyword argument 'x'"),
    ("TFC form called with its constant", lambda: pejit(A2, X2, constant_arg_nums=[0])(solve)(X2, A=A2), TypeError,
     "solve (the TFC form of pejit) takes its non-constant arguments by position: solve(x); "
     "got keyword argument 'A' ('A' is constant and already bound)"),
]


@pytest.mark.parametrize("thunk, exc, message", [c[1:] for c in EXACT], ids=[c[0] for c in EXACT])
def test_mistake_caught_early(thunk, exc, message):
    with pytest.raises(exc) as info:
        thunk()
    assert str(info.value) == message


def test_first_argument_not_callable_is_jax_jits_error_with_a_note():
    with pytest.raises(TypeError) as info:
        pejit(3, constant_argnums=0)
    assert re.fullmatch(jax_says(lambda: jax.jit(3)), str(info.value))
    assert info.value.__notes__ == [
        "pejit: the first argument must be the function to specialize, but int 3 is not callable. Write "
        "pejit(f, constant_argnums=...), or pejit(*example_args, constant_arg_nums=[...])(f) for the TFC form, "
        "which takes example arguments"
    ]


def _line_after() -> int:
    return inspect.currentframe().f_back.f_lineno + 1


def test_nothing_folded_warns_once_at_the_users_line():
    p = pejit(solve, constant_argnums=1)  # the wrong argument: nothing depends on x alone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_after()
        np.testing.assert_allclose(p(A2, X2), jax.jit(solve)(A2, X2))
        p(A2, 2 * X2)  # another specialization: no second warning
    assert [w.category for w in caught] == [NothingFoldedWarning]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert str(caught[0].message) == (
        "pejit(solve): no equation depends on the constant arguments alone, so nothing was folded and "
        "the function runs as under jax.jit. Mark the arguments that stay fixed between calls "
        "(constant_argnums/constant_argnames), or use jax.jit"
    )


@pytest.mark.parametrize("fun, const", [
    (solve, A2),  # inv(A) folds
    (lambda mode, x: x * 2 if mode == "double" else x, "double"),  # a static constant: nothing to fold
    (lambda a, x: (a, x), A2),  # no work at all
], ids=["folds", "static", "no work"])
def test_nothing_folded_is_quiet_when_there_is_nothing_to_say(fun, const):
    p = pejit(fun, constant_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p(const, X2)


def test_large_writable_numpy_constant_warns_once():
    big = np.eye(512)  # 2 MiB of float64: read on every call
    p = pejit(lambda a, x: a[:2, :2] @ x, constant_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_after()
        p(big, X2)
        p(big + 1, X2)
    assert [w.category for w in caught] == [WritableConstantWarning]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert str(caught[0].message) == (
        "pejit(<lambda>): a constant is a writable NumPy array of 2,097,152 bytes, so its contents are "
        "read on every call (to notice mutation). Pass jnp.asarray(arr) instead, or make it read-only "
        "with arr.setflags(write=False): both are recognised by identity"
    )


def test_read_only_or_jax_or_small_constants_do_not_warn():
    frozen = np.eye(512)
    frozen.setflags(write=False)
    p = pejit(lambda a, x: a[:2, :2] @ x, constant_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p(frozen, X2)
        p(jnp.asarray(np.eye(512)), X2)
        p(np.eye(4), X2)


def test_folding_skipped_points_at_the_users_line_and_says_what_to_do():
    p = pejit(solve, constant_argnums=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_after()
        np.testing.assert_allclose(jax.jit(p)(A2, X2), jax.jit(solve)(A2, X2))
    assert [w.category for w in caught] == [FoldingSkippedWarning]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    assert str(caught[0].message) == (
        "pejit(solve): argument 0 is a tracer of an outer transformation (jit/grad/vmap over a constant "
        "argument), so it was treated as dynamic and nothing was folded. To fold it, close over the "
        "constant instead of passing it through the transformation (jax.jit(lambda x: f(A, x))), or apply "
        "pejit outside the transformation"
    )


# -- tracebacks and names --------------------------------------------------------------
def _fails_inside(A, x):
    B = jnp.linalg.inv(A)
    return B.reshape(7) @ x  # the user's bug


def _frames(call) -> tuple[list, str]:
    """The traceback frames of the exception ``call()`` raises, and its text."""
    with pytest.raises(TypeError, match="cannot reshape") as info:
        call()
    return traceback.extract_tb(info.value.__traceback__), "".join(traceback.format_exception(info.value))


def _count(frames, package) -> int:
    root = str(Path(package.__file__).parent)
    return sum(f.filename.startswith(root) for f in frames)


@pytest.mark.parametrize("call", [
    lambda: pejit(_fails_inside, constant_argnums=0)(A2, X2),  # folds, then fails
    lambda: pejit(_fails_inside, constant_argnums=1)(A2, X2),  # fails on a dynamic argument
    lambda: pejit(A2, X2, constant_arg_nums=[0])(_fails_inside),  # the TFC form folds at decoration
    lambda: pe(_fails_inside, constant_argnums=0)(A2, X2),
], ids=["folding", "dynamic", "TFC form", "pe"])
def test_traceback_has_no_more_pejit_frames_than_jax_jit_has_jax_frames(call):
    import pejit as package

    jit_frames, _ = _frames(lambda: jax.jit(_fails_inside)(A2, X2))
    frames, text = _frames(call)
    # Measured with JAX 0.10.2: jax.jit keeps 3 JAX frames (jax.numpy's
    # reshape), pejit keeps 0 of its own (9 with JAX_TRACEBACK_FILTERING=off).
    assert _count(frames, package) == 0 <= _count(jit_frames, jax), text
    assert "B.reshape(7) @ x" in text and "_fails_inside" in text


def test_traceback_filtering_off_shows_pejit_frames():
    code = (
        "import jax.numpy as jnp\n"
        "from pejit import pejit\n"
        "def f(A, x):\n"
        "    return jnp.linalg.inv(A).reshape(7) @ x\n"
        "pejit(f, constant_argnums=0)(jnp.eye(2), jnp.ones(2))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    counts = {}
    for mode in ("off", "quiet_remove_frames"):
        proc = subprocess.run([sys.executable, "-c", code], env=dict(env, JAX_TRACEBACK_FILTERING=mode),
                              capture_output=True, text=True, timeout=120)
        assert "cannot reshape" in proc.stderr
        counts[mode] = proc.stderr.count(str(ROOT / "src" / "pejit"))
    assert counts["off"] > 0 and counts["quiet_remove_frames"] == 0, counts


def my_solver(A, x):
    return jnp.linalg.inv(A) @ x


@pytest.mark.parametrize("make", [
    lambda: pejit(my_solver, constant_argnums=0).lower(A2, X2),
    lambda: pejit(A2, X2, constant_arg_nums=[0])(my_solver).lower(X2),
], ids=["jit form", "TFC form"])
def test_lowered_module_is_named_after_the_users_function(make):
    text = make().as_text()
    assert "module @jit_my_solver" in text and "@jit_run" not in text


@pytest.mark.parametrize("make", [
    lambda: pejit(my_solver, constant_argnums=0).lower(A2, X2),  # folds
    lambda: pejit(my_solver, constant_argnums=1).lower(A2, X2),  # nothing to fold: jax.jit's program
    lambda: pejit(A2, X2, constant_arg_nums=[0])(my_solver).lower(X2),
], ids=["jit form", "nothing folded", "TFC form"])
@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # the second folds nothing, on purpose
def test_source_locations_are_the_users_frames_as_under_jax_jit(make):
    # What XLA's op metadata and profiles show: the user's lines, not pejit's.
    import pejit as package

    text = make().as_text(debug_info=True)
    assert f'"{__file__}":' in text, text
    assert str(Path(package.__file__).parent) not in text, text


def test_jax_errors_while_tracing_name_the_users_function_and_argument():
    def uses_y_in_python(a, y):
        return a if y.sum() > 0 else y

    with pytest.raises(jax.errors.TracerBoolConversionError) as info:
        pejit(uses_y_in_python, constant_argnums=0)(X, Y)
    message = str(info.value)
    assert f"while tracing the function uses_y_in_python at {__file__}:" in message
    assert "depends on the value of the argument y." in message
    assert "flat_fun" not in message and "leaves[" not in message
