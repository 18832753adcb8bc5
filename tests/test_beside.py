"""Folding beside the first call (pejit._calls._beside): jax.jit's program serves while the fold runs."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pejit
from pejit._calls import _beside, _specializer
from pejit._fold import _offload
from pejit._jit import call_path

from ._util import Counter, in_room, primitive_names, requires_jax, x64

two_cores = pytest.mark.skipif(_offload._cores() < 2, reason="one core: nothing runs beside the call")

N = 64


def _spd(seed: int, n: int = N, dtype=np.float32) -> np.ndarray:
    r = np.random.default_rng(seed).standard_normal((n, n))
    return (r @ r.T + n * np.eye(n)).astype(dtype)


def predict(K, y, xq):
    """A GP-style program: a factorization of the constants, then products with the dynamic input."""
    L = jnp.linalg.cholesky(K)
    alpha = jax.scipy.linalg.cho_solve((L, True), y)
    return jnp.tanh(xq[:, None] * K[:8]) @ alpha


def shifted(a, x):
    """A program a fold would not pay for: the work on its constant is small, for XLA to fold."""
    return x - jnp.nanmin(a)


def _entry(f):
    """The specialization a call of ``f`` would run now (its only one)."""
    (spec,) = call_path(f).caches.specializations.values()
    return spec


def _held(monkeypatch, fold: str = "trace_program"):
    """Hold every fold beside a call (``_specializer``'s function ``fold``) until the returned
    event is set (the fold's thread noted)."""
    release, threads = threading.Event(), []
    folds = getattr(_specializer, fold)

    def held(*args, **kwargs):
        threads.append(threading.current_thread().name)
        assert release.wait(30)
        return folds(*args, **kwargs)

    monkeypatch.setattr(_specializer, fold, held)
    return release, threads


@two_cores
def test_the_first_call_runs_jax_jits_program_while_the_fold_runs_on_a_worker(monkeypatch):
    release, threads = _held(monkeypatch)
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = _spd(0), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = jax.jit(predict)(K, y, xq)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)  # the fold is held: jax.jit's program served it
    serving = _entry(f)
    assert serving.pending is not None and "cholesky" in primitive_names(serving.program.jaxpr)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)  # and serves until the fold is ready
    release.set()
    folded = f.specialize(K, y, xq)  # the staged API waits for the fold
    assert threads == ["pejit-beside_0"]
    assert folded.pending is None and "cholesky" not in primitive_names(folded.residual.jaxpr)
    assert _entry(f) is folded  # swapped in: the calls from now on run it
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)
    assert f.cache_info()[:2] == (3, 1)  # one specialization, whichever program serves it


@two_cores
def test_the_tfc_form_runs_jax_jits_program_while_its_value_folds_beside(monkeypatch):
    # made and first called as jax.jit's program is compiled and called: the fold of its
    # one value, a replay of that trace, runs on the worker (Equinox's GP predictor:
    # 2.4x jax.jit's first call, folded first; 1.0x beside)
    release, threads = _held(monkeypatch, "replayed_per_value")
    K, y, xq = _spd(5), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = jax.jit(predict)(K, y, xq)
    g = pejit(K, y, xq, constant_arg_nums=[0, 1])(predict)  # made without waiting for the fold
    (serving,) = g._core.caches.specializations.values()
    assert serving.pending is not None and "cholesky" in primitive_names(serving.program.jaxpr)
    np.testing.assert_allclose(g(xq), want, rtol=1e-5)  # the fold is held: jax.jit's program served it
    np.testing.assert_allclose(g(xq), want, rtol=1e-5)
    release.set()
    folded = g.specialize(xq)  # the staged API waits for the fold
    assert threads == ["pejit-beside_0"]
    assert "cholesky" not in primitive_names(folded.residual.jaxpr)
    assert g._core.caches.specializations.values() == [folded]  # swapped in: the calls from now on run it
    np.testing.assert_allclose(g(xq * 2), jax.jit(predict)(K, y, xq * 2), rtol=1e-5)


@two_cores
def test_a_transformation_staging_the_tfc_form_while_it_folds_waits_for_the_fold():
    # what an outer trace stages, its program keeps: not jax.jit's program, served
    # while the fold runs (TFC's jit(jacfwd(residual)) of a function folded a moment before)
    K, y, xq = _spd(6), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    g = pejit(K, y, xq, constant_arg_nums=[0, 1])(predict)
    (serving,) = g._core.caches.specializations.values()
    assert serving.pending is not None
    assert "cholesky" not in primitive_names(jax.make_jaxpr(g)(xq).jaxpr)
    np.testing.assert_allclose(jax.jit(g)(xq), jax.jit(predict)(K, y, xq), rtol=1e-5)


@two_cores
@pytest.mark.filterwarnings("ignore::pejit.WritableConstantWarning")
def test_a_fold_beside_reads_the_writable_constants_of_the_call_that_started_it(monkeypatch):
    # the caller may write into its NumPy array while the fold runs: the fold serves the
    # values it was started for (a call with the new ones selects another specialization)
    release, threads = _held(monkeypatch)
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = _spd(7), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    K0 = K.copy()
    f(K, y, xq), f(K, y, xq)  # the second starts the fold, held
    K *= 2.0
    release.set()
    folded = f.specialize(K0, y, xq)  # waits for the fold
    assert threads == ["pejit-beside_0"] and "cholesky" not in primitive_names(folded.residual.jaxpr)
    np.testing.assert_allclose(f(K0, y, xq), jax.jit(predict)(K0, y, xq), rtol=1e-5)  # the folded program
    np.testing.assert_allclose(f(K, y, xq), jax.jit(predict)(K, y, xq), rtol=1e-5)


def test_the_work_beside_starts_after_the_second_calls_result():
    # a function called once pays nothing beside its call; the trace of a fold or a
    # compile holds Python's lock: it waits for the result the user waits for
    handed, started = threading.Event(), []
    out = jnp.arange(3.0)

    def fold():
        started.append(handed.is_set())
        return "folded"

    pending = _beside.start(fold, lambda spec: None, "f")
    assert not _beside.served(pending, out)  # the first call: nothing starts
    handed.wait(0.2)  # (time for a worker that did not wait to start)
    assert not pending.done() and started == []
    handed.set()
    assert _beside.served(pending, out)  # the second
    assert pending.result(30) == "folded" and started == [True]
    assert _beside.served(pending, out)  # (once: a later hand-over is no-op)
    _beside.start_after(pending, out)


@two_cores
def test_a_function_called_once_starts_no_work_beside_its_call():
    # its fold would slow the programs that the script runs next
    f = pejit(predict, constant_argnums=(0, 1))
    path = call_path(f)
    missed = Counter(path.uncached)
    path.uncached = missed
    K, y, xq = _spd(4), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = jax.jit(predict)(K, y, xq)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)
    serving = _entry(f)
    job = _beside._jobs[serving.pending]
    assert job.run is not None and not serving.pending.done()  # not handed to the worker
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)  # the second call (not memoized: it came back) starts it
    assert missed.calls == 2 and job.run is None
    folded = serving.pending.result(30)
    assert "cholesky" not in primitive_names(folded.residual.jaxpr) and _entry(f) is folded


def test_a_staged_call_waiting_for_the_work_beside_starts_it():
    pending = _beside.start(lambda: "folded", lambda spec: None, "f")

    class Serving:  # (a specialization serving while it folds)
        pass

    serving = Serving()
    serving.pending = pending
    assert _beside.settled(serving) == "folded"


def test_small_constants_compile_in_with_the_first_call_and_nothing_beside():
    # jax.jit's program, which a fold would not pay for: the first call compiles it with the
    # constants in (XLA folds the nanmin), its one compile, and starts nothing beside
    a, x = jnp.asarray(np.random.default_rng(7).standard_normal(200), jnp.float32), jnp.ones(8)
    f = pejit(shifted, constant_argnums=0)
    want = jax.jit(shifted)(a, x)
    np.testing.assert_array_equal(f(a, x), want)
    compiled_in = _entry(f)
    assert compiled_in.pending is None and compiled_in.program.compiled_in
    assert "reduce(" not in compiled_in.call.lower(x).compile().as_text()  # XLA folded the nanmin
    np.testing.assert_array_equal(f(a, x), want)


@two_cores
def test_after_the_swap_the_memo_serves_the_folded_program():
    f = pejit(predict, constant_argnums=(0, 1))
    path = call_path(f)
    missed = Counter(path.uncached)
    path.uncached = missed
    K, y, xq = _spd(1), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    f(K, y, xq)
    folded = f.specialize(K, y, xq)
    for _ in range(3):
        f(K, y, xq)
    assert missed.calls == 2  # the first call, and the first after the swap (which memoizes it)
    assert _entry(f) is folded


def test_the_decision_is_the_looks():
    from pejit._calls import _look

    def look(fun, *args):
        closed = jax.make_jaxpr(fun)(*args)
        traced = _look.Traced(closed, None, 1, None)
        return _look.look(traced, args[:1], FoldOptions())

    K = jnp.asarray(_spd(2))
    x = jnp.ones(N)
    # a factorization and the products around it: the fold compiles programs XLA would compile once
    assert look(lambda K, x: jnp.linalg.solve(K, x), K, x).beside
    # a long chain of arithmetic on the constants: NumPy folds it for less than XLA compiles it
    chain = look(lambda K, x: sum(jnp.cos(K * k) for k in range(40)) @ x, K, x)
    assert chain.pays and not chain.beside
    # the host multiplies by an identity (jax.jacfwd's basis, a constant of the program) or zeros alone:
    # a product of the constants with themselves is XLA's kernel, a compile of the fold's
    assert look(lambda K, x: jnp.linalg.matrix_power(K * 0.5, 3) @ x, K, x).beside
    pushed = look(lambda K, x: jax.jacfwd(lambda x: sum((K * k) @ x for k in range(1, 5)))(x), K, x)
    assert pushed.pays and not pushed.beside
    # a program with effects runs once, in order: folded first
    assert not look(lambda K, x: (jax.debug.print("{}", x[0]), jnp.linalg.solve(K, x))[1], K, x).beside
    # asked not to
    closed = jax.make_jaxpr(lambda K, x: jnp.linalg.solve(K, x))(K, x)
    assert not _look.look(_look.Traced(closed, None, 1, None), [K], FoldOptions(beside=False)).beside


@two_cores
def test_beside_off_the_first_call_folds():
    f = pejit(predict, constant_argnums=(0, 1), fold_options=FoldOptions(beside=False))
    K, y, xq = _spd(3), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    f(K, y, xq)
    spec = _entry(f)
    assert spec.pending is None and "cholesky" not in primitive_names(spec.residual.jaxpr)


@two_cores
def test_under_a_transformation_the_call_folds_on_its_own_thread(monkeypatch):
    release, threads = _held(monkeypatch)
    release.set()
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = _spd(4), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    g = jax.grad(lambda xq: f(K, y, xq).sum())(xq)
    np.testing.assert_allclose(g, jax.grad(lambda xq: predict(K, y, xq).sum())(xq), rtol=1e-4)
    assert threads and set(threads) == {"MainThread"}


@two_cores
def test_another_value_waits_for_the_structures_fold_and_uses_its_folding_program(monkeypatch):
    release, _ = _held(monkeypatch)
    f = pejit(predict, constant_argnums=(0, 1))
    y, xq = np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    f(_spd(5), y, xq)  # served by jax.jit's program, its fold held
    threading.Timer(0.2, release.set).start()
    K2 = _spd(6)
    np.testing.assert_allclose(f(K2, y, xq), jax.jit(predict)(K2, y, xq), rtol=1e-5)
    spec = f.specialize(K2, y, xq)
    assert spec.pending is None and "cholesky" not in primitive_names(spec.residual.jaxpr)


@two_cores
def test_a_trace_that_needs_values_folds_each_value_on_the_worker():
    f = pejit(lambda A, x: jnp.linalg.solve(A, x), constant_argnums=0)  # the rewrite reads A's conditioning
    A, x = _spd(7), jnp.ones(N)
    np.testing.assert_allclose(f(A, x), np.linalg.solve(A.astype(np.float64), np.ones(N)), rtol=1e-4)
    report = f.report(A, x)
    assert "traced and folded again" in str(report)
    assert "lu" not in primitive_names(report.after)


@two_cores
def test_a_fold_that_fails_beside_the_call_raises_where_the_staged_api_asks(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the fold broke")

    monkeypatch.setattr(_specializer, "trace_program", broken)
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = _spd(8), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = jax.jit(predict)(K, y, xq)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)
    with pytest.raises(RuntimeError, match="the fold broke"):
        f.specialize(K, y, xq)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)  # jax.jit's program still serves the calls


@two_cores
def test_the_fold_beside_runs_under_the_callers_configuration():
    f = pejit(predict, constant_argnums=(0, 1))
    with x64():
        K, y, xq = _spd(9, dtype=np.float64), np.ones(N), jnp.linspace(0, 1, 8, dtype=jnp.float64)
        out = f(K, y, xq)
        spec = f.specialize(K, y, xq)
    assert out.dtype == jnp.float64
    assert {c.dtype for c in spec.consts} == {np.dtype(np.float64)}


@two_cores
@requires_jax((0, 9), "jax.stages.Traced keeps its arguments (to resolve their shardings when lowered), "
                      "so a structure's folding program keeps its first constant alive")
def test_an_entry_folded_beside_dies_with_its_constant():
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = jnp.asarray(_spd(10)), jnp.ones(N), jnp.linspace(0, 1, 8)
    f(K, y, xq)
    f.specialize(K, y, xq)
    assert f.cache_info().currsize == 1
    del K
    assert f.cache_info().currsize == 0


def with_rule(K, y, xq):
    """``predict`` through a custom_jvp function that closes over the constant: folded per value."""

    @jax.custom_jvp
    def scale(v):
        return v * K[0, 0]

    scale.defjvp(lambda primals, tangents: (scale(primals[0]), tangents[0] * K[0, 0]))
    return scale(predict(K, y, xq))


@two_cores
def test_a_rule_closing_over_a_constant_folds_its_value_beside_jax_jits_program(monkeypatch):
    release, threads = _held(monkeypatch, "specialize_per_value")
    f = pejit(with_rule, constant_argnums=(0, 1))
    K, y, xq = _spd(11), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = jax.jit(with_rule)(K, y, xq)
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)  # jax.jit's program: its evaluation runs no rule
    serving = _entry(f)
    assert serving.pending is not None and "cholesky" in primitive_names(serving.program.jaxpr)
    release.set()
    folded = f.specialize(K, y, xq)
    assert threads == ["pejit-beside_0"]
    assert "traced and folded again" in str(folded.report)  # the rule sees the value, as without beside
    assert "cholesky" not in primitive_names(folded.residual.jaxpr)
    grad = jax.grad(lambda xq: f(K, y, xq).sum())(xq)
    np.testing.assert_allclose(grad, jax.grad(lambda xq: with_rule(K, y, xq).sum())(xq), rtol=1e-4)


@two_cores
def test_a_callback_closing_over_a_constant_is_never_run_by_jax_jits_program():
    def called_back(K, y, xq):  # the callback reads the constant's value when the program runs
        host = jax.pure_callback(lambda v: (np.asarray(K)[0, 0] * v).astype(v.dtype),
                                 jax.ShapeDtypeStruct(xq.shape, xq.dtype), xq)
        return with_rule(K, y, xq) + host

    f = pejit(called_back, constant_argnums=(0, 1))
    K, y, xq = _spd(12), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    want = with_rule(K, y, xq) + K[0, 0] * xq
    np.testing.assert_allclose(f(K, y, xq), want, rtol=1e-5)
    assert _entry(f).pending is None  # folded on the first call, the callback given the value


@two_cores
def test_the_fold_beside_traces_with_room_on_the_worker_frame_stack(monkeypatch):
    # as a first call's trace is (see pejit._fold._room)
    seen = []
    trace_program = _specializer.trace_program

    def noted(*args, **kwargs):
        seen.append((threading.current_thread().name, in_room()))
        return trace_program(*args, **kwargs)

    monkeypatch.setattr(_specializer, "trace_program", noted)
    f = pejit(predict, constant_argnums=(0, 1))
    K, y, xq = _spd(1), np.ones(N, np.float32), jnp.linspace(0, 1, 8)
    f(K, y, xq)
    f(K, y, xq)  # the second call's result starts the fold beside
    f.specialize(K, y, xq)  # and the staged API waits for it
    assert seen == [("pejit-beside_0", True)]
