"""Regressions found by running JAX's own numerical test suites with pejit (issue 33).

JAX's tests check a compiled function against its op-by-op result. The suite run
replaces ``jax.jit`` there by pejit with argument 0 constant and with every other
argument constant, in the call-time form (then called again on new values) and in
the TFC form. ``check`` does the same here, against ``jax.jit``, on small programs
written like the failing tests' (none of JAX's test code is copied): NumPy
constants of ml_dtypes' types, zero-size operands of linear algebra and
reductions, literal outputs of nested calls, PRNG keys next to an affine region.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pejit import pejit

# a zero-size or integer program may have nothing to fold with some split: that is fine here
pytestmark = pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")


def check(fun, args_maker, rtol=1e-6, atol=1e-6):
    """``fun`` under pejit, both splits and both forms, agrees with ``jax.jit``."""
    args = args_maker()
    n = len(args)
    for split in [(0,)] + ([tuple(range(1, n))] if n >= 2 else []):
        f = pejit(fun, constant_argnums=split)
        _close(f(*args), jax.jit(fun)(*args), rtol, atol)
        again = args_maker()
        _close(f(*again), jax.jit(fun)(*again), rtol, atol)
        dyn = [a for i, a in enumerate(args) if i not in split]
        g = pejit(*args, constant_arg_nums=list(split))(fun)
        _close(g(*dyn), jax.jit(fun)(*args), rtol, atol)


def _close(got, want, rtol, atol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.extended):
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol)


def _maker(*specs, kind=np.ndarray):
    """Fresh random arguments of these (shape, dtype) on every call, NumPy arrays or jax.Arrays."""
    rng = np.random.RandomState(0)

    def make():
        out = [rng.uniform(-3, 3, shape).astype(dtype) for shape, dtype in specs]
        return out if kind is np.ndarray else [jnp.asarray(a) for a in out]

    return make


f32 = np.float32

ZERO_SIZE = {
    "solve": (jnp.linalg.solve, [((0, 0), f32), ((0,), f32)]),
    "batched_solve": (jnp.linalg.solve, [((2, 0, 0), f32), ((2, 0, 3), f32)]),
    "lstsq": (lambda a, b: jnp.linalg.lstsq(a, b)[0], [((0, 3), f32), ((0,), f32)]),
    "matmul": (jnp.matmul, [((3, 0), f32), ((0, 4), f32)]),
    "pinv": (lambda a, b: jnp.linalg.pinv(a) @ b, [((0, 0), f32), ((0,), f32)]),
    "multi_dot": (lambda a, b: jnp.linalg.multi_dot([a, b, a.T]), [((3, 0), f32), ((0, 0), f32)]),
    "cholesky": (lambda a, b: jnp.linalg.cholesky(a @ jnp.swapaxes(a, -1, -2) + b), [((2, 0, 0), f32), ((2, 0, 0), f32)]),
    "mean": (lambda a, b: jnp.mean(a, axis=0) + b, [((0, 4), f32), ((4,), f32)]),
    "cumsum": (lambda a, b: jnp.cumsum(a, axis=0) * b, [((0, 4), f32), ((4,), f32)]),
    "max_initial": (lambda a, b: jnp.max(a, axis=0, initial=0.0) + b, [((0, 4), f32), ((4,), f32)]),
}


@pytest.mark.parametrize("kind", [np.ndarray, jax.Array], ids=["numpy", "jax"])
@pytest.mark.parametrize("name", sorted(ZERO_SIZE))
def test_zero_size_operands(name, kind):
    fun, specs = ZERO_SIZE[name]
    check(fun, _maker(*specs, kind=kind))


SMALL = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4, np.float16]


@pytest.mark.parametrize("dtype", SMALL, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["add", "max", "sum", "convert", "dot"])
def test_numpy_constants_of_small_dtypes(op, dtype):
    if op == "sum" and dtype is ml_dtypes.int4:
        pytest.skip("jax.jit rejects jnp.sum of int4 (no iinfo)")
    fun = {
        "add": jax.lax.add,
        "max": jnp.maximum,
        "sum": lambda a, b: jnp.sum(a, axis=0) + b[0],
        "convert": lambda a, b: a.astype(np.float32) * b.astype(np.float32),
        "dot": lambda a, b: (a.astype(np.float32) @ b.astype(np.float32).T),
    }[op]
    rng = np.random.RandomState(1)
    tol = 0.1 if np.dtype(dtype).itemsize < 4 else 1e-6  # jax.jit's own rounding of the low-precision sums
    check(fun, lambda: [rng.randint(-3, 4, (3, 4)).astype(dtype) for _ in range(2)], rtol=tol, atol=tol)


@pytest.mark.parametrize("fun", [
    lambda x, y: jnp.imag(x) + y,   # the imaginary part of a real scalar: a literal output of a nested call
    lambda x, y: x + jnp.imag(y),
    lambda x, y: jnp.real(x) * jnp.imag(y) + jnp.conj(y),
], ids=["imag_first", "imag_second", "real_imag_conj"])
def test_literal_outputs_of_nested_calls(fun):
    check(fun, _maker(((), f32), ((), f32)))


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_prng_keys_next_to_an_affine_region(impl):
    C = jnp.arange(9.0).reshape(3, 3) / 9

    def fun(k, x):
        return jax.random.normal(k, (3, 3)) @ (C @ (C @ x)) + jax.random.uniform(k, (3,))

    seeds = iter(range(100))
    check(fun, lambda: [jax.random.key(next(seeds), impl=impl), jnp.arange(3.0) + next(seeds)], rtol=1e-5)


def test_custom_jvp_closing_over_a_dynamic_nondiff_argument():
    # expn's order n is a custom_jvp nondiff argument: with x constant, the call's
    # inputs are all known, yet its function closes over the dynamic n
    rng = np.random.RandomState(2)

    def make():
        return [rng.randint(1, 4, (3, 1)).astype(np.int32), rng.uniform(0.1, 3, (2, 1, 4)).astype(np.float32)]

    check(jax.scipy.special.expn, make, rtol=1e-5)

    scale = jax.custom_jvp(lambda k, x: x * jnp.sin(k), nondiff_argnums=(0,))
    scale.defjvp(lambda k, primals, tangents: (scale(k, *primals), tangents[0] * jnp.sin(k)))
    check(lambda x, k: scale(k, x * 2.0), _maker(((3,), f32), ((3,), f32)))


def test_view_of_bool_bytes_other_than_0_and_1():
    # a bool array viewed from other bits (jtu.rand_fullrange does this): XLA's
    # convert keeps the byte, NumPy's astype would make it 1
    bits = np.array([0xD8, 1, 0, 0x7F], np.uint8)
    x = jnp.asarray(bits.view(np.bool_))
    for dtype in (jnp.int8, jnp.uint8):
        check(lambda x: jnp.asarray(x).view(dtype), lambda: [x])


def test_bitcast_to_a_type_narrower_than_a_byte():
    # lax_test's testBitcastConvertType (float32 -> uint4, shape ()): XLA's constant
    # folding packs the nibbles its own way (jax.jit closed over the value gives other
    # nibbles than its kernel), so the value is compiled in by neither form
    from pejit import FoldOptions
    from pejit._fold._primitives import folds_alike

    to_uint4 = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint4)  # noqa: E731
    x = np.array(-1.2345, np.float32)
    assert not folds_alike(jax.make_jaxpr(to_uint4)(x).eqns)
    check(to_uint4, lambda: [x], rtol=0, atol=0)
    at_once = pejit(to_uint4, constant_argnums=0, fold_options=FoldOptions(beside=False))  # compiled in, if at all
    _close(at_once(x), jax.jit(to_uint4)(x), 0, 0)


def test_bitcast_of_a_numpy_scalar_constant_to_a_type_narrower_than_a_byte():
    # a NumPy scalar constant is a literal of the program (keyed by value, as a Python
    # scalar), and XLA's constant folding of its bitcast to uint4 gives other nibbles
    # than jax.jit given it as an argument: pejit folds that work itself
    from pejit._fold._known import known_work

    to_uint4 = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint4)  # noqa: E731
    x = np.float32(-1.2345)
    literal = jax.make_jaxpr(lambda: to_uint4(x))()
    assert [e.primitive.name for e in known_work(literal, []).needed] == ["bitcast_convert_type"]
    want = jax.jit(to_uint4)(x)
    f = pejit(to_uint4, constant_argnums=0)
    for _ in range(4):  # the first calls, and once any compile beside them is in
        _close(f(x), want, 0, 0)
    _close(pejit(x, constant_arg_nums=[0])(to_uint4)(), want, 0, 0)
    assert known_work(jax.make_jaxpr(lambda: jnp.eye(3) + x)(), []).needed == ()  # XLA's to fold
