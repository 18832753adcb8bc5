"""The folding back end: batches of known work, op by op or compiled.

Values must not depend on the back end; the tests of choices check the
structure of the plan (which segments, which back end), never times.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive

from pejit import FoldOptions, pe, pejit
from pejit._fold import _batch, _compiled, _cost, _plan, _recipe
from pejit._fold._folding import Folder
from pejit._fold._staging import trace_staging
from ._util import cpu_devices, cpu_only, requires_jax, with_f32_products

BACKENDS = ["auto", "eager", "compiled"]


def plan(fun, *dyn_avals, backend="auto"):
    """Fold ``fun`` (of the dynamic arguments only); return its batch log and residual."""
    folder = Folder(FoldOptions(backend=backend))
    jaxpr, consts = trace_staging(lambda *d: [fun(*d)], list(dyn_avals), folder)
    jaxpr, consts = folder.finalize(jaxpr, consts)
    return folder.stats.batches, jaxpr


def scalar():
    return jax.core.ShapedArray((), jnp.float32)


def chain(a, k, ops):
    for i in range(k):
        a = ops[i % len(ops)](a)
    return a


ARITH = (lambda a: a * 1.5, lambda a: a + 0.5, lambda a: jnp.maximum(a, 0.1), lambda a: -a)
TRIG = (jnp.sin, lambda a: a * 1.0001, lambda a: a + 0.5, jnp.cos)


@pytest.mark.parametrize("backend", BACKENDS)
@with_f32_products  # else, on GPUs, TF32 products: jax.jit's and the fold's round apart
def test_values_do_not_depend_on_backend(backend):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((40, 40)).astype(np.float32) + 40 * np.eye(40, dtype=np.float32)
    x = rng.standard_normal(40).astype(np.float32)

    def f(A, x):
        B = chain(A, 12, TRIG + ARITH)
        L = jnp.linalg.cholesky(A @ A.T)
        w, v = jnp.linalg.eigh(A + A.T)  # multiple results
        return jnp.linalg.inv(A) @ x + L @ x + B @ x + (v * w) @ x

    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend=backend))
    np.testing.assert_allclose(g(A, x), jax.jit(f)(A, x), rtol=2e-4, atol=2e-4)
    assert set(g.report(A, x).residual) <= {"dot_general", "add"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_control_flow_materializes_mid_trace(backend):
    A = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)

    def f(A, x):
        B = chain(A, 6, ARITH)
        if B.sum() > 0:  # Python asks: the batch so far is evaluated
            B = B * 2
        C = jnp.sin(B)[B > 0.2]  # data-dependent shape on a known value
        return C.sum() + chain(B, 4, ARITH).sum() * x

    x = np.float32(0.5)
    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend=backend))
    want = f(jnp.asarray(A), x)
    np.testing.assert_allclose(g(A, x), want, rtol=1e-5)
    batches, _ = plan(lambda x: f(A, x), scalar(), backend=backend)
    assert len({b.batch for b in batches}) >= 3  # the sum, the mask, the residual's constants


def test_many_small_ops_run_eagerly():
    A = np.ones((32, 32), np.float32)
    batches, _ = plan(lambda x: chain(jnp.asarray(A), 200, TRIG) + x, scalar())
    assert [b.backend for b in batches] == ["eager"]
    assert batches[0].equations >= 200


@cpu_devices("the cost model's figures for XLA:CPU (elsewhere fusing saves less than compiling costs)")
def test_cheap_ops_on_large_arrays_are_compiled():
    A = jnp.ones((2048, 2048), np.float32)
    batches, _ = plan(lambda x: chain(A, 40, ARITH) + x, scalar())
    assert [b.backend for b in batches] == ["compiled"]
    assert batches[0].equations == 40


@cpu_devices("the cost model's figures for XLA:CPU")
def test_transcendentals_start_compiled_runs():
    # XLA:CPU's sin/cos are slow on an input computed in the same fused
    # loop, so each starts a run: (sin, *, +) runs are compiled, and cos,
    # alone between them, runs eagerly. The ten runs of one structure share
    # one program, whose compilation pays for all of them together.
    A = jnp.ones((2048, 2048), np.float32)
    _batch.clear_programs()
    batches, _ = plan(lambda x: chain(A, 40, TRIG) + x, scalar())
    assert [(b.backend, b.equations) for b in batches] == [("compiled", 3), ("eager", 1)] * 10
    assert len(_compiled.programs) == 1


@cpu_devices("the cost model's figures for XLA:CPU")
def test_a_run_whose_intermediates_stay_in_cache_runs_eagerly():
    # fusing saves writing and reading back the intermediates; at 256x256
    # float32 they stay in a core's cache, and the (sin, *, +) runs do not
    # pay for a compilation, however many of them there are
    A = jnp.ones((256, 256), np.float32)
    batches, _ = plan(lambda x: chain(A, 400, TRIG) + x, scalar())
    assert [b.backend for b in batches] == ["eager"]


@cpu_only  # the host rules run on one CPU device
@pytest.mark.parametrize("kind", ["host", "jax"])
def test_a_run_on_numpy_arrays_pays_for_copying_them_in(kind):
    # a compiled program copies each NumPy array it reads: a (sin, *) run
    # saves writing and reading back one intermediate, and copying a host
    # rule's result (the outer product D) costs as much; a jax.Array is
    # read in place
    u = np.linspace(0.5, 1.0, 2048, dtype=np.float32)[:, None]
    D0 = jnp.asarray(u @ u.T)

    def f(x):
        D = jnp.dot(u, u.T) if kind == "host" else D0
        t = D
        for _ in range(12):
            t = jnp.sin(t) * D
        return t + x

    batches, _ = plan(f, scalar())
    assert bool({"compiled", "loop"} & {b.backend for b in batches}) == (kind == "jax")


def test_forced_backends():
    A = jnp.ones((8, 8), np.float32)
    f = lambda x: chain(A, 10, TRIG) + x  # noqa: E731
    assert [b.backend for b in plan(f, scalar(), backend="compiled")[0]] == ["compiled"]
    assert [b.backend for b in plan(f, scalar(), backend="eager")[0]] == ["eager"]


def test_a_batch_records_its_seconds_and_those_spent_compiling():
    """The fold's breakdown (issue 35): each segment's time, compiling apart."""
    f = lambda x: chain(jnp.full((8, 8), 2.0, np.float32), 10, TRIG) + x  # noqa: E731
    _batch.clear_programs()
    (compiled,) = plan(f, scalar(), backend="compiled")[0]
    (eager,) = plan(f, scalar(), backend="eager")[0]
    assert compiled.seconds >= compiled.compile_seconds > 0
    assert eager.seconds > 0 and eager.compile_seconds == 0


# A primitive with an impl and no lowering, which counts its evaluations.
calls = []
counted_p = Primitive("counted_double")
counted_p.def_impl(lambda x: calls.append(1) or np.asarray(x) * 2)
counted_p.def_abstract_eval(lambda x: x)


def test_unlowerable_primitives_run_eagerly_even_when_compiling_is_forced():
    A = jnp.arange(256.0).reshape(16, 16)
    calls.clear()
    f = lambda A, x: counted_p.bind(jnp.sin(A) + 1) @ x  # noqa: E731
    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend="compiled"))
    x = jnp.ones(16)
    np.testing.assert_allclose(g(A, x), (2 * (np.sin(np.asarray(A)) + 1)) @ np.ones(16), rtol=1e-5)
    assert calls == [1]
    batches, _ = plan(lambda x: f(A, x), jax.core.ShapedArray((16,), jnp.float32), backend="compiled")
    assert [b.backend for b in batches] == ["eager"]


def test_dead_known_work_is_never_evaluated():
    A = jnp.arange(256.0).reshape(16, 16)
    calls.clear()

    def f(A, x):
        counted_p.bind(A)  # result unused
        return A @ x

    pe(A, jnp.ones(16), constant_arg_nums=[0])(f)
    assert calls == []


def test_a_batch_runs_its_equations_in_the_programs_order(monkeypatch):
    # The residual reads q before p, so an order target by target computes
    # q first; the program's order, which holds shared values no longer
    # than the program does, computes p first (see Store.pending).
    ran = []
    run_batch = _batch.run_batch

    def recording(segments, *args, **kwargs):
        ran.extend(r.prim.name for seg in segments for r in seg.recipes)
        return run_batch(segments, *args, **kwargs)

    monkeypatch.setattr(_batch, "run_batch", recording)
    A = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)

    def f(A, x):
        p = jax.lax.sin(A)
        q = jax.lax.cos(A)
        r = jax.lax.exp(jax.lax.mul(p, q))
        return x @ q + p @ x + r @ x

    x = jnp.ones(64)
    plan(lambda x: f(A, x), jax.core.ShapedArray((64,), jnp.float32), backend="eager")
    assert ran == ["sin", "cos", "mul", "exp"]
    g = pejit(f, constant_argnums=0)
    np.testing.assert_allclose(g(A, x), jax.jit(f)(A, x), rtol=1e-5)


@requires_jax((0, 9), "custom_jvp/custom_vjp calls on known inputs are staged, not folded whole (same results)")
def test_custom_jvp_functions_on_constants_fold():
    A = jnp.linspace(-1, 1, 64).reshape(8, 8)
    f = lambda A, x: jax.nn.relu(jax.nn.softplus(A) - 0.7) @ x  # noqa: E731
    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0))  # (8x8: else compiled in)
    x = jnp.ones(8)
    np.testing.assert_allclose(g(A, x), f(A, x), rtol=1e-6)
    assert dict(g.report(A, x).residual) == {"dot_general": 1}
    # gradients with respect to the dynamic argument still work
    np.testing.assert_allclose(jax.grad(lambda x: g(A, x).sum())(x), jax.grad(lambda x: f(A, x).sum())(x), rtol=1e-6)


def test_compiled_programs_are_reused_across_specializations():
    f = lambda A, x: chain(A, 30, ARITH) + x  # noqa: E731
    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend="compiled"))
    x = jnp.float32(1.0)
    g(jnp.ones((16, 16)), x)
    programs = dict(_compiled.programs)
    np.testing.assert_allclose(g(jnp.zeros((16, 16)), x), f(jnp.zeros((16, 16)), x), rtol=1e-6)
    assert _compiled.programs == programs  # same structure, same program


def test_lazy_expansions_still_stay_in_the_residual():
    c = jnp.float32(3.0)
    g = pe(c, jnp.ones((512, 512)), constant_arg_nums=[0])(lambda c, x: jnp.ones((512, 512)) * c + x)
    report = g.specialize(jnp.ones((512, 512))).report
    assert report.folded_bytes < 1024
    np.testing.assert_allclose(g(jnp.ones((512, 512))), 4.0)


def test_bad_backend_names_the_option():
    with pytest.raises(ValueError, match="backend"):
        FoldOptions(backend="fast")


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_on_abstract_constants(backend):
    # The cache folds through a value-independent program traced with the
    # constants abstract: batches then read tracers of that outer trace and
    # are staged into it, whatever the back end.
    def f(A, x):
        B = chain(A, 6, TRIG + ARITH)
        return jnp.linalg.inv(B + 40 * jnp.eye(40)) @ x + jnp.broadcast_to(A.sum(), (40, 40)) @ x

    traces = []
    g = pejit(lambda A, x: traces.append(1) or f(A, x), constant_argnums=0, fold_options=FoldOptions(backend=backend))
    x = np.ones(40, np.float32)
    for seed in range(3):  # the second value compiles the folding program
        A = np.random.default_rng(seed).standard_normal((40, 40)).astype(np.float32)
        np.testing.assert_allclose(g(A, x), jax.jit(f)(A, x), rtol=2e-4, atol=2e-4)
    assert len(traces) == 1  # one abstract trace, no per-value fallback


# -- the first value of a folding program: one program or op by op -----------------


def _ridge(X, w):
    L = jnp.linalg.cholesky(X.T @ X + 0.1 * jnp.eye(X.shape[1], dtype=X.dtype))
    return L @ w


def _chain(a, w):
    for _ in range(60):
        a = a * 1.01 + 0.5
    return a @ w


def test_one_program_pays_for_many_distinct_operations_only():
    X, w = jnp.ones((20, 4)), jnp.ones(4)
    ridge = jax.make_jaxpr(lambda X: _ridge(X, w))(X).jaxpr
    chain = jax.make_jaxpr(lambda a: _chain(a, w))(X[:4]).jaxpr
    assert _cost.one_program_pays(ridge.eqns)  # transpose, dot, iota, ..., cholesky: a compile each
    assert not _cost.one_program_pays(chain.eqns)  # 120 equations of two kinds
    assert not _cost.one_program_pays(ridge.eqns[:1])


@pytest.mark.parametrize("fun, compiled", [(_ridge, True), (_chain, False)], ids=["ridge", "chain"])
def test_first_value_of_a_folding_program(fun, compiled):
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((20, 4)).astype(np.float32))
    w = jnp.arange(4.0)
    # (min_gain=0: a folding program, where XLA would fold the chain with X compiled in)
    f = pejit(fun, constant_argnums=0, fold_options=FoldOptions(min_gain=0.0))
    np.testing.assert_allclose(f(X, w), jax.jit(fun)(X, w), rtol=1e-5)
    folding = f.specialize(X, w).program.folding_program
    assert (folding.compiled is not None) is compiled
    X2 = X + 1.0  # a second value runs the compiled program either way
    np.testing.assert_allclose(f(X2, w), jax.jit(fun)(X2, w), rtol=1e-5)
    assert folding.compiled is not None


def test_values_to_compact_are_read_as_kept_by_later_equations():
    """A folding program's first value holds what its staged batches kept as
    the folding trace would (a uniform value as a broadcast): its later
    equations, an affine collapse's, read that, not the value computed."""
    from jax.extend.core import primitives as P

    from pejit import _compat

    x = np.arange(4.0, dtype=np.float32)
    v1, v2 = (_compat.new_var(jax.core.ShapedArray((4,), np.float32)) for _ in range(2))
    segments = [_plan.Segment("eager", (_recipe.Recipe(P.mul_p, (x, np.float32(2)), {}, (v1,)),
                                         _recipe.Recipe(P.add_p, (v1, x), {}, (v2,))))]
    marked = lambda a: np.asarray(a) + 100  # noqa: E731
    (plain,) = _batch.run_batch(segments, {}, [v2], keep=marked)
    (compacted,) = _batch.run_batch(segments, {}, [v2], keep=marked, compact={v1})
    np.testing.assert_array_equal(plain, 3 * x + 100)  # the output kept, its input as computed
    np.testing.assert_array_equal(compacted, 3 * x + 200)  # its input as kept too


def test_a_folding_programs_first_value_keeps_what_its_batches_kept():
    body = jax.make_jaxpr(lambda a: [a * 2.0])(jnp.zeros(4))
    program = jax.make_jaxpr(lambda a: [_batch.batch_p.bind(a, jaxpr=body)[0] + a])(jnp.zeros(4))
    marked = lambda a: np.asarray(a) + 100  # noqa: E731
    x = np.arange(4.0, dtype=np.float32)
    (out,) = _batch.run_jaxpr(program, [x], "eager", keep=marked)
    np.testing.assert_array_equal(out, 3 * x + 200)  # the batch's output as kept, then the output kept
