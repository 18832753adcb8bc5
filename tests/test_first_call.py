"""The first call (issue 72): pejit decides whether folding can pay before it pays for a fold,
and a cached call's guard of writable NumPy constants runs beside the program.

Decisions are asserted on what was compiled, the specialization and its report, never
on wall-clock times (``benchmarks/first_call.py`` measures those).
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pe, pejit
from pejit._calls import _look, _path
from pejit._calls._cache import NO_MEMO
from pejit._calls._program import AsGiven, FoldingProgram, Specialization, _holds_python
from pejit._jit import call_path
from pejit._residual import _collapse

from ._util import Compiles, Counter, Traces, f32_products, in_room, primitive_names

rng = np.random.default_rng(0)
BIG = jnp.asarray(rng.standard_normal((256, 256)), jnp.float32)


def little(a, x):  # a 256x256 product on x; the known work is a 16x16 constant's sum
    return jnp.tanh(BIG @ x) + jnp.sum(a * a)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_a_fold_that_cannot_pay_compiles_jax_jits_program_and_nothing_else():
    a, x = jnp.asarray(rng.standard_normal((16, 16)), jnp.float32), jnp.ones(256)
    f = pejit(little, constant_argnums=0)
    traces = []
    counted = pejit(lambda a, x: traces.append(1) or little(a, x), constant_argnums=0)
    with Compiles() as compiles:
        out = f(a, x)
        counted(a, x)
    # each program once, traced once: no folding program, no eager evaluation, and jax.jit
    # runs the trace it was looked at with (the constant compiled in: see
    # test_small_work_on_small_constants_is_left_to_xla_with_them_compiled_in)
    assert [where for _, where in compiles.where] == [threading.current_thread().name] * 2 and len(traces) == 1
    spec = f.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven)
    assert primitive_names(spec.program.jaxpr) == primitive_names(jax.make_jaxpr(little)(a, x).jaxpr)
    assert spec.consts[-1] is a  # the constant itself, as jax.jit's argument (after BIG, which little closes over)
    report = f.report(a, x)
    assert report.unfolded and "stay in the program" in str(report)
    with pytest.raises(TypeError, match="Argument 'x'"):  # named as the function's parameter, as by jax.jit
        f.lower(a, x).compile()(a, x.astype(jnp.int32))
    with f32_products():
        np.testing.assert_allclose(out, jax.jit(little)(a, x), rtol=1e-6, atol=1e-6)
    b = a + 1.0  # another value of the structure: passed as it is to the same program
    want = jax.jit(little)(b, x)
    with Compiles() as compiles:
        np.testing.assert_allclose(f(b, x), want, rtol=1e-5, atol=1e-5)
    assert compiles.count == 0 and f.specialize(b, x).consts[-1] is b  # nothing traced or compiled


def test_a_library_call_on_small_constants_is_folded():
    # a 4x4 inverse is microseconds, a share of a call: pejit folds it
    def solved(a, x):
        return jnp.linalg.inv(a) @ x

    a = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32) + 4 * jnp.eye(4)
    spec = pejit(solved, constant_argnums=0).specialize(a, jnp.ones(4))
    assert isinstance(spec.program.folding_program, FoldingProgram)
    assert primitive_names(spec.program.jaxpr) == ["dot_general"]


def test_small_work_on_small_constants_is_left_to_xla_with_them_compiled_in():
    # a nanmin of 200 constants saves a share of a call: XLA folds it as it compiles them in,
    # as jax.jit does for the arrays a function closes over, with no folding program; the
    # first call's one compile (jax.jit's program with them passed compiled slower:
    # benchmarks/first_call.py)
    def shifted(a, x):
        return x - jnp.nanmin(a)

    a, x = jnp.asarray(rng.standard_normal(200), jnp.float32), jnp.ones(8)
    counted = Counter(shifted)
    f = pejit(counted, constant_argnums=0)
    with Compiles() as compiles:
        out = f(a, x)
        spec = f.specialize(a, x)
    assert counted.calls == 1  # jax.jit's trace serves the program its constants are compiled into
    assert [thread for _, thread in compiles.where] == [threading.current_thread().name]  # one program, nothing beside
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    np.testing.assert_array_equal(out, jax.jit(shifted)(a, x))
    assert "XLA folds them" in str(f.report(a, x))
    # jax.jit's program spliced in, not called: the functions of jax.jit's, closed over them
    lowered = spec.call.lower(x)
    assert _functions(lowered) == _functions(jax.jit(functools.partial(shifted, a)).lower(x))
    hlo = lowered.compile().as_text()  # XLA folded the reduction: no reduce is left
    assert "reduce(" not in hlo and "minimum" not in hlo
    b = a + 1.0  # another value of the structure: jax.jit's program, the constants passed
    with Compiles() as compiles:
        np.testing.assert_array_equal(f(b, x), jax.jit(shifted)(b, x))
        f(b + 1.0, x)
    assert compiles.count == 1 and f.specialize(b, x).consts[-1] is b  # compiled once, for every later value
    assert counted.calls == 1


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_constants_only_read_by_the_dynamic_work_are_compiled_in():
    # nothing depends on the constants alone: jax.jit's program, compiled once with them in,
    # as jax.jit compiles what a function closes over (a call passes no constants)
    def product(a, x):
        return a @ x

    a, x = jnp.asarray(rng.standard_normal((8, 8)), jnp.float32), jnp.ones(8)
    f = pejit(product, constant_argnums=0)
    with Compiles() as compiles:
        out = f(a, x)
    assert compiles.count == 1 and "product" in compiles.where[0][0]
    spec = f.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    entry = spec.call.lower(x).compile().as_text().split("ENTRY")[1]
    assert entry.count("parameter(") == 1  # x alone
    np.testing.assert_array_equal(out, jax.jit(product)(a, x))


@pytest.mark.parametrize("known, a", [
    (jnp.signbit, rng.standard_normal(8).astype(np.float32)),  # a bitcast and a shift
    (jnp.argmin, rng.standard_normal(8).astype(np.float32)),
    (jax.lax.cummax, rng.standard_normal(8).astype(np.float32)),
    (jnp.sum, np.arange(-4, 4, dtype=np.int32)),  # a sum of integers, in any order
    (lambda a: jnp.tile(a[:4], 2), rng.standard_normal(8).astype(np.float32)),
    (lambda a: a.at[np.array([1, 1, 3])].add(a[:3]), np.arange(-4, 4, dtype=np.int32)),  # an index added twice
    (lambda a: a.at[np.array([1, 3])].set(-a[:2], unique_indices=True), rng.standard_normal(8).astype(np.float32)),
    (lambda a: jnp.remainder(a, a - 1), np.arange(-4, 4, dtype=np.int32)),  # a divisor guarded from zero
    (jnp.argsort, np.asarray([2.0, -0.0, 2.0, 0.0, 1.0, 2.0, np.nan, 1.0], np.float32)),  # equal keys, stable
    (jax.lax.population_count, np.arange(-4, 4, dtype=np.int32)),
    (lambda a: jnp.nextafter(a, 0.0), rng.standard_normal(8).astype(np.float32)),
], ids=["signbit", "argmin", "cummax", "integer sum", "tile", "integer scatter-add", "scatter", "remainder", "argsort",
        "population_count", "nextafter"])
def test_exact_known_work_is_compiled_in(known, a):
    def f(a, x):
        return x * known(a)

    a, x = jnp.asarray(a), jnp.ones(8)
    g = pejit(f, constant_argnums=0)
    np.testing.assert_array_equal(g(a, x), jax.jit(f)(a, x))
    spec = g.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in


@pytest.mark.parametrize("bounds", [(-4, 9), (jnp.int32(-4), jnp.int32(9))], ids=["literals", "constants"])
def test_random_integers_of_a_constant_key_are_compiled_in(bounds):
    # randint divides by its span, which cannot be zero (pejit._fold._nonzero): XLA folds it
    def f(key, x):
        k, lo, hi = key
        return x + jax.random.randint(k, (8,), lo, hi)

    key, x = (jax.random.key(1), *bounds), jnp.ones(8, jnp.int32)
    g = pejit(f, constant_argnums=0)
    np.testing.assert_array_equal(g(key, x), jax.jit(f)(key, x))
    spec = g.specialize(key, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    entry = spec.call.lower(x).compile().as_text().split("ENTRY")[1]
    assert entry.count("parameter(") == 1  # x alone


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_an_integer_division_that_may_divide_by_zero_is_not_compiled_in():
    # XLA's kernels give x % 0 = x, x // 0 = -1; its constant folding of either stops the
    # process (SIGFPE, jaxlib 0.10.2): such a division's constants stay passed
    def f(a, x):
        return x * (jax.lax.rem(a, a - 1) + jax.lax.div(a, a - 1))

    a, x = np.arange(-4, 4, dtype=np.int32), jnp.ones(8)
    g = pejit(f, constant_argnums=0)
    np.testing.assert_array_equal(g(a, x), jax.jit(f)(a, x))
    spec = g.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and not spec.program.compiled_in
    np.testing.assert_array_equal(g(a, x), jax.jit(f)(a, x))


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_a_loop_on_constants_whose_fold_cannot_pay_is_compiled_in():
    # polyval's loop over its coefficients: folding would split it, and that cannot pay;
    # the constants are compiled into jax.jit's program instead of passed on every call
    c, x = jnp.asarray([1.0, -2.0, 0.5, 3.0]), jnp.linspace(0.0, 1.0, 8)
    f = pejit(jnp.polyval, constant_argnums=0)
    spec = f.specialize(c, x)
    assert isinstance(spec.program.folding_program, AsGiven)
    np.testing.assert_allclose(f(c, x), jnp.polyval(c, x), rtol=1e-6)
    assert f.specialize(c, x).program.compiled_in


@pytest.mark.parametrize("known", [jnp.exp, jnp.tanh, lambda a: jnp.sqrt(a * a) / 3.0], ids=["exp", "tanh", "div"])
def test_small_elementwise_float_work_is_compiled_in(known):
    # XLA's constant folding computes exp with the C library's, its kernels with a vectorized
    # approximation: a few ulps apart, as jax.jit with the array closed over gives
    def f(a, x):
        return x * known(a)

    a, x = jnp.asarray(rng.standard_normal(8), jnp.float32), jnp.ones(8)
    g, expected = pejit(f, constant_argnums=0), jax.jit(f)(a, x)
    with Compiles() as compiles:
        np.testing.assert_allclose(g(a, x), expected, rtol=4 * np.finfo(np.float32).eps)
    assert compiles.count == 1
    spec = g.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in


@pytest.mark.parametrize("known, a", [(jnp.sum, rng.standard_normal(1 << 16).astype(np.float32)),
                                      (jnp.exp, rng.standard_normal(1 << 13).astype(np.complex64)),
                                      (jax.lax.clz, np.arange(-(1 << 15), 1 << 15, dtype=np.int32))],
                         ids=["sum", "complex exp", "clz"])
def test_small_inexact_work_is_folded_not_left_to_xla(known, a):
    # XLA's constant folding is an interpreter: its sums' order, its complex functions, even
    # its clz are not its kernels', so pejit folds these (with the kernels jax.jit's program
    # runs), where the fold wins back its compile
    def f(a, x):
        return x * known(a)

    a = jnp.asarray(a)
    x = jnp.ones(a.shape, np.float32)
    spec = pejit(f, constant_argnums=0).specialize(a, x)
    assert isinstance(spec.program.folding_program, FoldingProgram)
    np.testing.assert_allclose(spec.call(x), jax.jit(f)(a, x), rtol=1e-6)


def test_a_fold_too_small_to_win_back_its_compile_is_jax_jits_program():
    # a complex exp of 12 constants saves a microsecond a call: a folding program's compile
    # would take 10,000 calls to win back, so the first call is jax.jit's, the constants passed
    # (XLA's constant folding is not trusted with complex functions)
    def rotated(a, x):
        return x * jnp.exp(a).real

    a = jnp.asarray(rng.standard_normal(12) + 1j * rng.standard_normal(12), jnp.complex64)
    x = jnp.ones(12)
    f = pejit(rotated, constant_argnums=0)
    with Compiles() as compiles:
        out = f(a, x)
    assert compiles.count == 1 and "rotated" in compiles.where[0][0]
    spec = f.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and not spec.program.compiled_in
    np.testing.assert_array_equal(out, jax.jit(rotated)(a, x))
    assert "too little to win back a folding program's compile within 10,000 calls" in str(f.report(a, x))
    # FoldOptions(min_gain=0) folds whatever saves something
    g = pejit(rotated, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0))
    assert isinstance(g.specialize(a, x).program.folding_program, FoldingProgram)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_numpy_constants_of_jax_jits_program_are_put_on_the_device_by_a_second_call(monkeypatch):
    # the first call passes them as jax.jit's first call passes its arguments (jax.device_put's
    # first call in a process costs about a millisecond); a function called again puts them
    # on the device once, not transferred by every call
    a = np.asarray(rng.standard_normal((16, 16)), np.float32)
    a.setflags(write=False)
    x = jnp.ones(256)
    f = pejit(little, constant_argnums=0, fold_options=FoldOptions(literals=False))
    puts = []
    put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda *args, **kwargs: puts.append(args[0]) or put(*args, **kwargs))
    first = f(a, x)
    assert _memo(f) is NO_MEMO  # no memo yet: the next call comes back to put them
    spec = f.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.consts[-1] is a and not puts
    second = f(a, x)
    assert _memo(f)[-1] is spec.call  # the memo now, passing them from the device
    assert isinstance(spec.consts[-1], jax.Array) and puts == [a]
    with f32_products():
        want = jax.jit(little)(a, x)
        for out in (first, second, f(a, x)):
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(spec.consts[-1], a)
    assert len(puts) == 1  # the third call ran from the memo


def test_a_small_sum_that_does_not_pay_is_compiled_in():
    # a variance of 12 constants does not pay a fold either; passed, its constants would
    # make jax.jit's program slower than with them closed over: compiled in, XLA folds the
    # sums in an order of its own, as jax.jit does for the arrays a function closes over
    def centred(a, x):
        return x - jnp.nanvar(a)

    a, x = jnp.asarray(rng.standard_normal(12), jnp.float32), jnp.ones(8)
    f, closed_over = pejit(centred, constant_argnums=0), jax.jit(lambda x: centred(a, x))(x)
    with Compiles() as compiles:
        got = f(a, x)
    assert compiles.count == 1
    np.testing.assert_array_equal(got, closed_over)
    np.testing.assert_allclose(got, jax.jit(centred)(a, x), rtol=1e-5)  # passed: sums in another order
    spec = f.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    assert "XLA folds them" in str(f.report(a, x))


def test_a_programs_own_numpy_constants_are_compiled_in_with_the_arguments():
    # jax.jit's trace makes an array the function closes over a constant of the program,
    # a NumPy one JAX's own ndarray type (TypedNdArray, JAX 0.10): host arrays, as any
    w = np.linspace(0.0, 1.0, 8, dtype=np.float32)

    def f(a, x):
        return x * (a + w)

    a, x = jnp.asarray(rng.standard_normal(8), jnp.float32), jnp.ones(8)
    g, expected = pejit(f, constant_argnums=0), jax.jit(f)(a, x)
    np.testing.assert_array_equal(g(a, x), expected)
    spec = g.specialize(a, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    assert len(spec.consts) == 2  # w and a, both in the program
    np.testing.assert_array_equal(g(a, x), expected)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_a_bool_constant_is_compiled_in_unless_it_holds_other_bytes():
    # a view of other bits as bools holds any byte, which jax.jit keeps where it is
    # passed (a bitcast reads it back) and a literal compiled in would make 1
    def f(mask, x):
        return x + jnp.where(mask, 1, 0).astype(x.dtype) + mask.view(jnp.uint8).astype(x.dtype)

    x = jnp.ones(4)
    for bits, compiled_in in ([1, 0, 1, 1], True), ([0xD8, 1, 0, 0x7F], False):
        mask = jnp.asarray(np.array(bits, np.uint8).view(np.bool_))
        g, expected = pejit(f, constant_argnums=0), jax.jit(f)(mask, x)
        np.testing.assert_array_equal(g(mask, x), expected)
        spec = g.specialize(mask, x)
        assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in == compiled_in
        np.testing.assert_array_equal(g(mask, x), expected)  # the program that serves from now on


def test_a_small_draw_from_a_constant_key_is_compiled_in():
    # a typed key is compiled in as its key data, as jax.jit compiles a closed-over key
    def noisy(key, x):
        return x + jax.random.normal(key, x.shape)

    key, x = jax.random.key(3), jnp.ones(8)
    f = pejit(noisy, constant_argnums=0)
    np.testing.assert_allclose(f(key, x), jax.jit(noisy)(key, x), rtol=1e-6)  # (erf_inv: a few ulps)
    spec = f.specialize(key, x)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in


def test_a_fold_that_pays_folds():
    def inverse(A, x):
        return jnp.linalg.inv(A) @ x

    A = BIG + 40 * jnp.eye(256)
    f = pejit(inverse, constant_argnums=0)
    with f32_products():
        np.testing.assert_allclose(f(A, jnp.ones(256)), inverse(A, jnp.ones(256)), rtol=1e-5, atol=1e-6)
    spec = f.specialize(A, jnp.ones(256))
    assert isinstance(spec.program.folding_program, FoldingProgram)
    assert primitive_names(spec.program.jaxpr) == ["dot_general"]


def test_min_gain_zero_folds_whatever_is_known():
    a, x = jnp.ones((16, 16)), jnp.ones(256)
    spec = pejit(little, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0)).specialize(a, x)
    assert isinstance(spec.program.folding_program, FoldingProgram)
    assert "reduce_sum" not in primitive_names(spec.program.jaxpr)


def test_a_trace_that_needs_values_folds_each_value():
    def branchy(a, x):
        return x * 2.0 if float(a.sum()) > 0 else x

    f = pejit(branchy, constant_argnums=0)
    np.testing.assert_allclose(f(jnp.ones(3), jnp.ones(3)), 2 * jnp.ones(3))
    (note,) = f.report(jnp.ones(3), jnp.ones(3)).fallbacks
    assert "needs constant values" in note
    np.testing.assert_allclose(f(-jnp.ones(3), jnp.ones(3)), jnp.ones(3))


def least_squares_step(xi, X):  # TFC's shape: a basis on constant points, one Gauss-Newton step
    H = jnp.stack([jnp.cos(k * X) for k in range(6)], axis=1)

    def residual(xi):
        return H @ xi - jnp.sin(X) + (H * X[:, None]) @ xi

    return xi - jnp.linalg.lstsq(jax.jacfwd(residual)(xi), residual(xi))[0]


@pytest.mark.parametrize("form", [pejit, pe])
def test_the_tfc_form_folds_its_value_by_replaying_jax_jits_trace(form):
    # the known work a call-time fold evaluates, concretely: no jnp function evaluated as
    # a call of its own (jit(multiply), jit(cos)), as a trace of the Python with the
    # values binds them (TFC's WaveEquation2D: 1464 recipes and 77 calls, against 1072)
    X, xi = np.linspace(0.0, 1.0, 40, dtype=np.float32), jnp.zeros(6)
    call = pejit(least_squares_step, constant_argnums=1).report(xi, X)
    tfc_form = form(xi, X, constant_arg_nums=[1])(least_squares_step)
    tfc = tfc_form.specialize(xi).residual.report
    assert tfc.folded == call.folded and "jit(multiply)" not in tfc.folded
    assert tfc.residual == call.residual == {"dot_general": 1, "add": 1}
    assert tfc.backends == {"eager": 1}  # its values, not a folding program (call.backends: "program")
    np.testing.assert_allclose(tfc_form(xi), jax.jit(least_squares_step)(xi, X), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_the_tfc_form_leaves_known_work_that_cannot_pay_to_jax_jits_program():
    # JAX's linalg suite: a Sylvester solve by eigenvectors, B and C constant. The eig of
    # the 7x7 B saves 2% of a call; evaluating it compiled kernels (0.6 s) and the
    # residual, inlined, ran XLA's work in another order (complex64, 7e-5 apart)
    if not hasattr(jax.scipy.linalg, "solve_sylvester"):
        pytest.skip("jax.scipy.linalg.solve_sylvester is not in this JAX (0.7.0)")
    solve = functools.partial(jax.scipy.linalg.solve_sylvester, method="eigen")
    A = rng.standard_normal((50, 50)).astype(np.float32)
    B = rng.standard_normal((7, 7)).astype(np.float32)
    C = rng.standard_normal((50, 7)).astype(np.float32)
    bound = pejit(A, B, C, constant_arg_nums=[1, 2])(solve)
    with Compiles() as compiles:
        out = bound(A)
    assert len(compiles.where) == 1  # jax.jit's program alone: no kernel evaluated eig(B)
    spec = bound.specialize(A)
    assert isinstance(spec.program.folding_program, AsGiven)
    assert primitive_names(spec.program.jaxpr) == primitive_names(jax.make_jaxpr(solve)(A, B, C).jaxpr)
    assert "stay in the program" in str(bound.report(A))
    np.testing.assert_array_equal(out, jax.jit(solve)(A, B, C))


def _basis(x, xi):  # seed 000's Chebyshev basis on a few points
    z = 2.0 * x - 1.0
    return jnp.stack([jnp.ones_like(z), z, 2 * z * z - 1], axis=1) @ xi


def test_the_tfc_form_compiles_in_what_xla_folds_and_lowers_the_fold_asked_for():
    # XLA folds the basis as it compiles jax.jit's program with x in; a fold before the
    # first call evaluated it for nothing (the corpus' jss.logit: 4x jax.jit's first call)
    x, xi = np.linspace(0.1, 0.9, 16, dtype=np.float32), jnp.ones(3)
    bound = pejit(x, xi, constant_arg_nums=[0])(_basis)
    with Compiles() as compiles:
        out = bound(xi)
    assert len(compiles.where) == 1  # jax.jit's program, the constants in: no kernel folded them
    spec = bound.specialize(xi)
    assert isinstance(spec.program.folding_program, AsGiven) and spec.program.compiled_in
    assert "stay in the program, the constants compiled in" in str(bound.report(xi))
    assert spec.shown.cache_info().currsize == 0  # nothing was folded for the call
    np.testing.assert_allclose(out, jax.jit(_basis)(x, xi), rtol=1e-6)
    # what lower() and trace() show is the fold asked for, folded once: the basis a constant
    lowered = bound.lower(xi)
    assert "stablehlo.multiply" not in lowered.as_text() and "stablehlo.subtract" not in lowered.as_text()
    assert "mul" not in primitive_names(bound.trace(xi).jaxpr.jaxpr)
    np.testing.assert_allclose(lowered.compile()(xi), out, rtol=1e-6)
    assert spec.shown.cache_info().currsize == 1
    assert bound.specialize(xi) is spec  # the call still runs jax.jit's program


def _functions(lowered) -> int:
    """How many functions a lowered program has: one per nested program JAX did not inline."""
    return lowered.as_text().count("func.func")


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_the_tfc_forms_inlined_call_is_jax_jits_program_closed_over_the_constants(monkeypatch):
    # jax.jit's trace of the call stages jax.jit's program closed over the constants, as
    # jax.jit of the function closed over them stages it: no jax.jit of their own between,
    # jax.jit's program spliced in, not nested (a nested program is one more to trace,
    # lower and compile), no derivative rule (JAX differentiates it, and XLA folds the
    # constants' work of its derivatives as it compiles them), and no dispatcher generated
    # for that trace, which the memo never serves
    generated = []
    real = _path.CallPath._generate
    monkeypatch.setattr(_path.CallPath, "_generate", lambda self, *a, **k: generated.append(a) or real(self, *a, **k))
    x, xi = np.linspace(0.1, 0.9, 16, dtype=np.float32), jnp.ones(3)
    x.flags.writeable = False  # as TFC's grids: nobody can change it, so the call is one jax.jit function
    bound = pejit(x, xi, constant_arg_nums=[0])(_basis)
    assert bound.specialize(xi).program.compiled_in and isinstance(bound.__call__, type(jax.jit(_basis)))
    closed = jax.jit(functools.partial(_basis, x))
    assert "custom_jvp_call" not in primitive_names(jax.make_jaxpr(bound)(xi).jaxpr)
    # jax.jit's program, the work, spliced into the call's (from JAX 0.11, a jit equation
    # that JAX inlines as it lowers): the functions of jax.jit's, closed over the constants
    assert _functions(bound.__call__.lower(xi)) == _functions(closed.lower(xi))
    np.testing.assert_allclose(bound(xi), jax.jit(_basis)(x, xi), rtol=1e-6)
    assert not generated
    for derivative in (jax.jacfwd, jax.jacrev):
        assert "custom_jvp_call" not in primitive_names(jax.make_jaxpr(derivative(bound))(xi).jaxpr)
        np.testing.assert_allclose(derivative(bound)(xi), derivative(jax.jit(_basis), argnums=1)(x, xi), rtol=1e-6)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_the_tfc_forms_first_call_traces_the_function_once_as_jax_jit_closed_over():
    # where its constants are compiled in, the TFC form's call is the jax.jit function its
    # look traced, closed over them: made and called, it traces once, as jax.jit's first
    # call does; a call of other types specializes for them, as jax.jit traces again
    x, xi = jnp.linspace(0.1, 0.9, 16), jnp.ones(3)
    with Traces() as traces:
        bound = pejit(x, xi, constant_arg_nums=[0])(lambda x, xi: _basis(x, xi))
        got = bound(xi)
    with Traces() as jit_traces:
        want = jax.jit(lambda xi: _basis(x, xi))(xi)
    assert traces.count == jit_traces.count == 1
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert bound.specialize(xi).program.compiled_in and bound.specialize(xi).jax_jit_in
    closed = jax.jit(lambda xi: _basis(x, xi))
    for derivative in (jax.jacfwd, jax.jacrev):  # JAX's, of jax.jit closed over the constants
        np.testing.assert_allclose(derivative(bound)(xi), derivative(closed)(xi), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(bound)(jnp.ones((2, 3))), jax.vmap(closed)(jnp.ones((2, 3))), rtol=1e-6)
    with jax.disable_jit():
        np.testing.assert_allclose(bound(xi), want, rtol=1e-6)
    xis = jnp.ones((3, 2))
    np.testing.assert_allclose(bound(xis), jax.jit(_basis)(x, xis), rtol=1e-6)
    assert bound.specialize(xis).program is not bound.specialize(xi).program
    with pytest.raises(TypeError, match="takes 1 positional argument"):
        bound(xi, xi)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_jax_jits_program_compiled_in_stages_as_jax_jit_closed_over():
    # the call-time form staged into a user's jax.jit, where jax.jit's own program serves
    # with the constants compiled in: the enclosing program is jax.jit's of the function
    # closed over them, and its derivatives are JAX's, equal to jax.jit's
    x, xi = jnp.linspace(0.1, 0.9, 16), jnp.ones(3)
    f = pejit(_basis, constant_argnums=0)
    outer = jax.jit(lambda xi: f(x, xi))
    assert f.specialize(x, xi).jax_jit_in
    assert "custom_jvp_call" not in primitive_names(jax.make_jaxpr(outer)(xi).jaxpr)
    closed = jax.jit(functools.partial(_basis, x))
    assert _functions(outer.lower(xi)) == _functions(closed.lower(xi))
    loss = lambda g: lambda xi: jnp.sum(jnp.sin(g(xi)))
    np.testing.assert_allclose(jax.grad(loss(outer))(xi), jax.grad(loss(closed))(xi), rtol=1e-6)


def test_the_tfc_form_folds_what_it_cannot_compile_in(monkeypatch):
    # constants that cannot be compiled in (on several devices) would be passed, and XLA
    # would not fold their work: the TFC form folds it, as asked
    monkeypatch.setattr(Specialization, "compilable_in", property(lambda self: False))
    x, xi = np.linspace(0.1, 0.9, 16, dtype=np.float32), jnp.ones(3)
    bound = pejit(x, xi, constant_arg_nums=[0])(_basis)
    spec = bound.specialize(xi)
    assert not isinstance(spec.program.folding_program, AsGiven) and spec.shown is None
    assert "mul" not in primitive_names(spec.program.jaxpr)
    np.testing.assert_allclose(bound(xi), jax.jit(_basis)(x, xi), rtol=1e-6)


# -- the guard of writable NumPy constants, beside the run ------------------------------
def _memo(f):
    return call_path(f).caches.fast_path().last[0]


@pytest.mark.filterwarnings("ignore::pejit.WritableConstantWarning")
def test_a_mutated_constant_seen_after_dispatch_gives_the_new_value():
    A = np.asarray(rng.standard_normal((64, 64)), np.float32)  # writable: guarded by its bytes
    f = pejit(lambda A, x: jnp.linalg.inv(A + 10 * np.eye(64, dtype=np.float32)) @ x, constant_argnums=0)
    x = jnp.ones(64)
    first = np.asarray(f(A, x))  # computed before A changes: on CPU a call may read A's memory as it runs
    f(A, x)
    *_, after, guard, _ = _memo(f)
    assert after and guard is not None  # no effects, no donation: the guard runs while the program does
    A[0, 0] += 1.0  # the program now running would use the old value
    with f32_products():
        want = jnp.linalg.inv(jnp.asarray(A) + 10 * jnp.eye(64)) @ x
        np.testing.assert_allclose(f(A, x), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(f(A, x), first)


@pytest.mark.filterwarnings("ignore::pejit.WritableConstantWarning")
def test_the_guard_runs_first_where_the_program_has_effects_or_donates():
    A = np.asarray(rng.standard_normal((64, 64)), np.float32)
    seen = []

    def printing(A, x):
        jax.debug.callback(lambda v: seen.append(float(v)), x[0])
        return jnp.linalg.inv(A + 10 * np.eye(64, dtype=np.float32)) @ x

    f = pejit(printing, constant_argnums=0)
    x = jnp.ones(64)
    f(A, x)
    f(A, x)
    assert not _memo(f)[-3]
    A[0, 0] += 1.0
    seen.clear()
    f(A, x)
    jax.effects_barrier()
    assert seen == [1.0]  # the effect ran once: the stale program was never dispatched
    g = pejit(lambda A, x: jnp.linalg.inv(A + 10 * np.eye(64, dtype=np.float32)) @ x, constant_argnums=0,
              donate_argnums=1)
    g(A, jnp.ones(64))
    g(A, jnp.ones(64))
    assert not _memo(g)[-3]


def test_only_rules_and_callbacks_count_as_python_that_may_reach_a_tracer():
    # Each program that holds one makes the look search the young heap for live
    # tracers; a nested jax.jit records its mesh, callable only as a decorator.
    nested = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x) * 2)(1.0)
    rule = jax.make_jaxpr(jax.nn.relu)(1.0)  # a custom_jvp
    shape = jax.ShapeDtypeStruct((), jnp.float32)
    callback = jax.make_jaxpr(lambda x: jax.pure_callback(np.sin, shape, x))(1.0)
    assert not _holds_python(nested.jaxpr)
    assert _holds_python(rule.jaxpr) and _holds_python(callback.jaxpr)


@pytest.mark.parametrize("stage", ["call", "lower", "tfc form"])
def test_a_new_specialization_is_traced_with_room_on_the_frame_stack(stage):
    # CPython 3.11 and 3.12 free a chunk of the frame stack as soon as the frame at its base
    # returns: a trace calling functions at a chunk's edge pays an mmap and an munmap on each
    # (tinygp's GP regression: traced in 49 ms from a script's top level, 66 ms 20 frames deeper)
    seen = []

    def f(a, x):
        seen.append(in_room())
        return jnp.sin(a) * x

    a, x = jnp.ones(3), jnp.ones(3)
    if stage == "call":
        pejit(f, constant_argnums=0)(a, x)
    elif stage == "lower":
        pejit(f, constant_argnums=0).lower(a, x)
    else:
        pejit(a, x, constant_arg_nums=[0])(f)(x)
    assert seen == [True]


def test_a_call_that_finds_its_specialization_makes_no_room(monkeypatch):
    # (making room maps and unmaps a chunk: ten microseconds, paid by new specializations only)
    made = []
    monkeypatch.setattr(_path, "with_room", lambda fun, *args: made.append(fun) or fun(*args))
    f = pejit(lambda x, a: jnp.sin(a) * x, constant_argnames="a")
    a, x = jnp.ones(3), jnp.ones(3)
    for _ in range(3):  # the constant by keyword: no memo, each call looks its key up
        np.testing.assert_allclose(f(x, a=a), jnp.sin(a) * x)
    assert len(made) == 1


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_a_first_call_builds_no_jax_jit_of_the_function_and_no_report(monkeypatch):
    # jax.jit of the user's function only stages constants given without values, and a
    # report is built when asked for: a first call pays for neither (a tenth of a millisecond each)
    from pejit._reports._report import FoldReport

    jitted, reports = [], []
    real_jit, real_build = jax.jit, FoldReport.build.__func__
    # (wrapped: pejit reads jax.jit's signature once, for its keywords)
    counting_jit = functools.wraps(real_jit)(lambda fun, **kw: jitted.append(fun) or real_jit(fun, **kw))
    monkeypatch.setattr(jax, "jit", counting_jit)
    monkeypatch.setattr(FoldReport, "build", classmethod(lambda cls, *a, **k: reports.append(1) or real_build(cls, *a, **k)))
    f = pejit(little, constant_argnums=0, fold_options=FoldOptions(beside=False))
    a, x = jnp.asarray(rng.standard_normal((16, 16)), jnp.float32), jnp.ones(256)
    with f32_products():
        np.testing.assert_allclose(f(a, x), real_jit(little)(a, x), rtol=1e-6, atol=1e-6)
    assert little not in jitted and not reports
    assert f.report(a, x).unfolded and reports  # built when asked
    shapes = f.eval_shape(jax.ShapeDtypeStruct(a.shape, a.dtype), x)  # constants without values: jax.jit's staging
    assert jitted.count(little) == 1 and shapes.shape == (256,)
    with pytest.raises(ValueError, match="donate_argnums"):  # jax.jit's own options are still checked at once
        pejit(little, constant_argnums=0, donate_argnums=-5)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")
def test_the_look_searches_for_affine_regions_only_where_one_could_collapse(monkeypatch):
    # the search is most of the look at a few elementwise equations (a tenth of a
    # millisecond or more of a small program's first call), where no matrix could pay
    asked, searched = [], []
    real_collapsible, real_classify = _look.collapsible, _collapse.classify
    monkeypatch.setattr(_look, "collapsible", lambda *args: asked.append(real_collapsible(*args)) or asked[-1])
    monkeypatch.setattr(_collapse, "classify", lambda *args: searched.append(1) or real_classify(*args))
    a, x = jnp.asarray(rng.standard_normal((3, 5)), jnp.float32), jnp.ones((3, 5))
    outer = pejit(lambda a, x: jnp.outer(a[0], x[1]), constant_argnums=0, fold_options=FoldOptions(beside=False))
    np.testing.assert_array_equal(outer(a, x), jnp.outer(a[0], x[1]))
    assert asked == [False] and not searched
    assert isinstance(outer.specialize(a, x).program.folding_program, AsGiven)
    m = jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)
    chain = pejit(lambda a, b, x: a @ (b @ x), constant_argnums=(0, 1), fold_options=FoldOptions(beside=False))
    with f32_products():
        # (collapsed, the products are reassociated: (m @ m) @ x)
        np.testing.assert_allclose(chain(m, m, x[0, :4]), m @ (m @ x[0, :4]), rtol=1e-6, atol=1e-6)
    assert asked == [False, True] and searched  # two products: a region that collapses, and does
    assert chain.report(m, m, x[0, :4]).collapsed
