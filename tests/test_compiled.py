"""The compiled back end: unrolled loops of the fold rolled into one compiled loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pejit
from pejit._fold import _batch, _compiled, _offload

from ._util import cpu_only
from .test_batch import plan, scalar

N = 2048  # float32 arrays of 16 MiB: compiled runs pay on a CPU (their intermediates outgrow the cache)


def constant():
    return jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (N, N)), jnp.float32)


def oracle_chain(a, k, keep=()):
    """The chain ``c = sin(c) * 1.001 + 0.5`` in float64 NumPy; also the steps in ``keep``."""
    c, kept = np.asarray(a, np.float64), {}
    for i in range(k):
        c = np.sin(c) * 1.001 + 0.5
        if i in keep:
            kept[i] = c
    return c, kept


def close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-5, atol=2e-5)


@cpu_only  # the cost model's CPU figures decide that the runs are compiled
@pytest.mark.parametrize("ahead", [True, False])
def test_an_unrolled_chain_runs_as_one_loop(ahead, monkeypatch):
    # twelve (sin, *, +) runs, each reading the one before: one compiled
    # fori_loop over the run's equations, one program, and the chain's values.
    # The program does not depend on the chain's length: where a worker runs,
    # the trace has it compiled once it has recorded as many linked runs as the
    # batch's cost model compiles, and the batch compiles nothing (without
    # that: it does)
    if not ahead:
        monkeypatch.setattr(_compiled.LoopsAhead, "record", lambda self, recipe: None)
    A = constant()
    _batch.clear_programs()

    f = _sin_chain(A, 12)
    batches, _ = plan(f, scalar())
    assert [(b.backend, b.equations) for b in batches] == [("loop", 36)]
    assert (batches[0].compile_seconds == 0) is (ahead and _offload.Kernels().enabled)
    assert [key[0] for key in _compiled.programs] == ["loop"]
    g = pejit(lambda a, x: f(x), constant_argnums=0)
    close(g(A, 1.0), oracle_chain(A, 12)[0] + 1.0)


@cpu_only  # the cost model's CPU figures
@pytest.mark.skipif(not _offload.Kernels().enabled, reason="one core: nothing runs beside the fold")
def test_the_worker_runs_a_chain_ahead_and_the_batch_the_steps_after(monkeypatch):
    # the chain starts from a constant, so the worker runs its steps (three at
    # a time here) while the trace records the next, and the batch runs only
    # those after the last it ran: to the very values of one loop from the start
    monkeypatch.setattr(_compiled, "AHEAD_STEPS", 3)
    taken = []
    take = _compiled.LoopsAhead.take
    monkeypatch.setattr(_compiled.LoopsAhead, "take", lambda self, *a: taken.append(take(self, *a)) or taken[-1])
    A = constant()
    _batch.clear_programs()

    def fold(f):
        return np.asarray(pejit(A, 1.0, constant_arg_nums=[0])(lambda a, x: f(x))(1.0))

    batches, _ = plan(_sin_chain(A, 12), scalar())
    assert [(b.backend, b.equations) for b in batches] == [("loop", 36)]
    steps, _ = taken.pop()
    assert 4 <= steps < 12  # the worker ran from the step the loop compiled at, to the last step it was handed
    ahead = fold(_sin_chain(A, 12))
    assert taken.pop()[0] >= 4
    monkeypatch.setattr(_offload, "submit", None)  # nothing runs ahead
    alone = fold(_sin_chain(A, 12))
    assert taken.pop() == (0, None)
    np.testing.assert_array_equal(ahead, alone)
    close(ahead, oracle_chain(A, 12)[0] + 1.0)


@cpu_only
def test_a_step_read_elsewhere_ends_a_loop():
    # the value after step 5 is also read at the end: steps 0-5 are one loop
    # (its last value is asked for), steps 6-11 another, and the value of
    # step 5 is what it was
    A = constant()

    def f(x):
        c = A
        for i in range(12):
            c = jnp.sin(c) * 1.001 + 0.5
            if i == 5:
                middle = c
        return c + middle * x

    batches, _ = plan(f, scalar())
    assert [(b.backend, b.equations) for b in batches] == [("loop", 18), ("loop", 18)]
    g = pejit(lambda a, x: f(x), constant_argnums=0)
    last, kept = oracle_chain(A, 12, keep={5})
    close(g(A, 2.0), last + kept[5] * 2.0)


@cpu_only
def test_a_loop_gives_the_last_steps_other_values():
    # the last step's sine, which no step passes on, is asked for too: the
    # loop carries it beside c
    A = constant()

    def f(x):
        c = A
        for _ in range(8):
            t = jnp.sin(c)
            c = t * 1.001 + 0.5
        return c + t * x

    batches, _ = plan(f, scalar())
    assert [(b.backend, b.equations) for b in batches] == [("loop", 24)]
    before, _ = oracle_chain(A, 7)
    g = pejit(lambda a, x: f(x), constant_argnums=0)
    close(g(A, 3.0), np.sin(before) * 1.001 + 0.5 + np.sin(before) * 3.0)


@pytest.mark.parametrize("backend", ["auto", "compiled", "eager"])
def test_a_loop_agrees_with_the_other_back_ends(backend):
    A = constant()

    def f(a, x):
        c = a
        for _ in range(10):
            c = jnp.sin(c) * 1.001 + 0.5
        return c[:3, :3] * x

    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend=backend))
    close(g(A, 2.0), oracle_chain(A, 10)[0][:3, :3] * 2.0)
    np.testing.assert_allclose(g(A, 2.0), jax.jit(f)(A, 2.0), rtol=1e-5, atol=1e-5)


def test_short_chains_and_non_chains_are_not_rolled():
    # runs that do not feed each other, and chains under MIN_STEPS steps
    A = constant()

    def f(x):
        outs = [jnp.sin(A * (1.0 + i)) * 1.001 + 0.5 for i in range(6)]
        c = A
        for _ in range(_compiled.MIN_STEPS - 1):
            c = jnp.sin(c) * 1.001 + 0.5
        return sum(outs) + c + x

    batches, _ = plan(f, scalar())
    assert "loop" not in {b.backend for b in batches}


@cpu_only  # the cost model's CPU figures
def test_a_chain_the_batch_runs_eagerly_is_not_compiled_ahead():
    # twenty steps on a 256x256 constant: the intermediates stay in the cache
    # and the steps are too few to pay a compilation, so the batch runs them
    # eagerly, and the trace compiles no loop for them either
    A = constant()[:256, :256]
    _batch.clear_programs()

    batches, _ = plan(_sin_chain(A, 20), scalar())
    assert {b.backend for b in batches} == {"eager"}
    assert not _compiled.programs


def _sin_chain(A, steps: int):
    """``x`` plus ``steps`` steps of ``sin(c) * 1.001 + 0.5`` from ``c = A``."""

    def f(x):
        c = A
        for _ in range(steps):
            c = jnp.sin(c) * 1.001 + 0.5
        return c + x

    return f
