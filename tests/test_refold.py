"""Values of a batch that constants alone define, dropped between far reads
and computed again (pejit._fold._refold), whichever back end reads them."""

from __future__ import annotations

import concurrent.futures
import platform
import threading
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

from pejit import _compat
from pejit._fold import _batch, _host, _offload, _refold, _trim
from pejit._fold._plan import Segment
from pejit._fold._recipe import Recipe

from ._util import cpu_only

C = jnp.asarray(np.random.default_rng(0).standard_normal((600, 600)).astype(np.float32))  # 1.4 MB
C2 = -C
SMALL = [jnp.full((8,), float(k), np.float32) for k in range(40)]


def _recipe(fun, args, like):
    """A recipe of ``fun``'s one equation on ``args`` (values, or variables of other recipes)."""
    (eqn,) = jax.make_jaxpr(fun)(*like).eqns
    out = _compat.new_var(eqn.outvars[0].aval)
    return Recipe(eqn.primitive, tuple(args), eqn.params, (out,)), out


#: Waits (10 s at most) until a value is being computed again: the folding
#: thread's work while the worker computes ahead.
recomputing = threading.Event()
wait_p = Primitive("test_refold_wait")
wait_p.def_impl(lambda x: recomputing.wait(10) and x)
wait_p.def_abstract_eval(lambda x: x)


def _batch_reading_h_far_apart(pair: bool = False):
    """``h = -C``, read at once, by a compiled segment 40 equations later, and after it.

    With ``pair``, ``g = -C2`` too, held across the same span and read by
    equations of its own (after h's outputs), so that twice the bytes any
    one equation reads are held at once."""
    r_h, h = _recipe(lax.neg, [C], [C])
    r_first, first = _recipe(lax.neg, [h], [C])
    fillers = [_recipe(lax.sin, [s], [s]) for s in SMALL[:-1]]
    fillers.append(_recipe(wait_p.bind, [SMALL[-1]], [SMALL[-1]]))
    r_mul, m = _recipe(lax.mul, [h, C], [C, C])
    r_add, y = _recipe(lax.add, [m, C], [C, C])
    r_last, last = _recipe(lax.neg, [h], [C])
    head, tail = [r_h, r_first], [r_last]
    if pair:
        r_g, g = _recipe(lax.neg, [C2], [C2])
        r_g_first, g_first = _recipe(lax.neg, [g], [C2])
        r_g_last, g_last = _recipe(lax.neg, [g], [C2])
        head, tail = [r_h, r_g, r_first, r_g_first], [r_last, r_g_last]
    segments = [
        Segment("eager", (*head, *(r for r, _ in fillers))),
        Segment("compiled", (r_mul, r_add)),
        Segment("eager", tuple(tail)),
    ]
    return segments, [first, *(v for _, v in fillers), y, last, *([g_first, g_last] if pair else [])]


def _recording(monkeypatch):
    """The threads that compute ``h`` (a host rule on ``C``), as they do."""
    threads = []
    on_host = _host.on_host
    recomputing.clear()

    def recorded(prim, args, params):
        if args and args[0] is C:
            threads.append(threading.current_thread())
            if len(threads) > 1:
                recomputing.set()
        return on_host(prim, args, params)

    monkeypatch.setattr(_host, "on_host", recorded)
    return threads


@pytest.fixture
def computed(monkeypatch):
    """Drop every large value of constants alone at once; record the threads that compute ``h``."""
    monkeypatch.setattr(_refold, "REMAT_HELD", 0)
    monkeypatch.setattr(_refold, "HOLD_ALL", 0)
    monkeypatch.setattr(_refold, "HOLD_KEPT", 0)
    monkeypatch.setattr(_refold, "REMAT_GAP", 8)
    return _recording(monkeypatch)


@pytest.mark.parametrize("fit", [True, False])
def test_values_that_fit_at_once_are_all_held_while_the_batch_trims_the_heap(monkeypatch, fit):
    # h (1.4 MB) is over REMAT_HELD; held whole where HOLD_ALL admits it, and
    # the batch then hands what it frees back to the system (every tick here)
    monkeypatch.setattr(_refold, "REMAT_HELD", 0)
    monkeypatch.setattr(_refold, "HOLD_ALL", C.nbytes if fit else C.nbytes - 1)
    monkeypatch.setattr(_refold, "HOLD_KEPT", 0)
    monkeypatch.setattr(_refold, "REMAT_GAP", 8)
    monkeypatch.setattr(_trim, "PERIOD", 0.0)
    monkeypatch.setattr(_trim, "KEEP_BYTES", -1)  # whatever is free
    trims = []
    monkeypatch.setattr(_trim, "trim", lambda: trims.append(1) or True)
    threads = _recording(monkeypatch)
    recomputing.set()  # nothing waits for a recomputation
    segments, outputs = _batch_reading_h_far_apart()
    first, *_, y, last = _batch.run_batch(segments, {}, outputs)
    np.testing.assert_array_equal(last, np.asarray(C))
    assert len(threads) == (1 if fit else 2)  # computed once, or again after it was dropped
    assert bool(trims) == fit


@pytest.mark.parametrize("held_by", ["outputs", "one equation's reads", None])
def test_values_that_take_at_most_the_bytes_the_batch_holds_anyway_are_all_held(monkeypatch, held_by):
    # HOLD_ALL admits nothing. h and g (1.4 MB each) are held whole where
    # the batch's outputs, which it holds to its end, take at least as many
    # bytes; h alone is where one equation reads as many (all at once,
    # whatever is dropped); h and g are not, where each equation reads one
    monkeypatch.setattr(_refold, "REMAT_HELD", 0)
    monkeypatch.setattr(_refold, "HOLD_ALL", 0)
    monkeypatch.setattr(_refold, "REMAT_GAP", 8)
    threads = _recording(monkeypatch)
    recomputing.set()
    segments, outputs = _batch_reading_h_far_apart(pair=held_by != "one equation's reads")
    if held_by != "outputs":
        outputs = outputs[1 : 1 + len(SMALL)]  # the fillers' 32-byte values alone
    values = _batch.run_batch(segments, {}, outputs)
    np.testing.assert_array_equal(values[-1], np.asarray(C2 if held_by == "outputs" else SMALL[-1]))
    assert len(threads) == (2 if held_by is None else 1)  # computed again after it was dropped, or once


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_a_trimmer_trims_the_heap_each_period():
    assert _trim.trim()
    trimmer = _trim.Trimmer(period=0.0, keep=-1)
    trimmer.tick()
    trimmer.tick()
    assert trimmer.trims == 2
    trimmer = _trim.Trimmer(period=3600.0, keep=-1)
    trimmer.tick()
    assert trimmer.trims == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallinfo2 is glibc's")
def test_a_trimmer_leaves_the_heap_what_it_keeps_free(monkeypatch):
    # pages handed back are faulted in again by the next arrays: a heap holding
    # less than it keeps free is left as it is
    assert _trim.free_bytes() >= 0
    trimmer = _trim.Trimmer(period=0.0, keep=2**40)
    trimmer.tick()
    assert trimmer.trims == 0
    trimmer = _trim.Trimmer(period=0.0, keep=-1)  # whatever is free, none included
    trimmer.tick()
    assert trimmer.trims == 1
    monkeypatch.setattr(_trim, "_mallinfo2", lambda: None)  # a C library that cannot tell: every period
    assert _trim.free_bytes() is None
    trimmer = _trim.Trimmer(period=0.0, keep=2**40)
    trimmer.tick()
    assert trimmer.trims == 1


def test_without_malloc_trim_a_trimmer_does_nothing(monkeypatch):
    monkeypatch.setattr(_trim, "_malloc_trim", lambda: None)  # not glibc
    assert not _trim.trim()
    trimmer = _trim.Trimmer(period=0.0)
    trimmer.tick()
    assert trimmer.trims == 0


def test_a_dropped_value_read_by_a_compiled_segment_is_computed_again(computed):
    segments, outputs = _batch_reading_h_far_apart()
    first, *_, y, last = _batch.run_batch(segments, {}, outputs)
    c = np.asarray(C)
    np.testing.assert_array_equal(first, c)
    np.testing.assert_allclose(y, -c * c + c, rtol=1e-6, atol=1e-5)  # XLA may fuse a multiply-add
    np.testing.assert_array_equal(last, c)
    assert len(computed) >= 2  # dropped after its first read, not held across the fillers


@cpu_only
@pytest.mark.skipif(_offload._cores() < 2, reason="one core: no worker to compute ahead")
def test_the_worker_computes_a_dropped_value_ahead_of_its_read(computed):
    segments, outputs = _batch_reading_h_far_apart()
    _batch.run_batch(segments, {}, outputs)
    assert computed[0] is threading.main_thread()
    assert any(t is not threading.main_thread() for t in computed[1:])


@cpu_only
@pytest.mark.skipif(_offload._cores() < 2, reason="one core: no worker to compute ahead")
def test_the_worker_computes_a_dropped_value_with_the_dropped_value_it_reads(computed):
    # m = h * C reads h = -C, which nothing else reads: both are dropped, and
    # the worker computes m ahead of its second read by computing h first
    r_h, h = _recipe(lax.neg, [C], [C])
    r_m, m = _recipe(lax.mul, [h, C], [C, C])
    r_first, first = _recipe(lax.neg, [m], [C])
    fillers = [_recipe(lax.sin, [s], [s]) for s in SMALL[:-1]]
    fillers.append(_recipe(wait_p.bind, [SMALL[-1]], [SMALL[-1]]))
    r_last, last = _recipe(lax.neg, [m], [C])
    segments = [Segment("eager", (r_h, r_m, r_first, *(r for r, _ in fillers))), Segment("eager", (r_last,))]
    out = _batch.run_batch(segments, {}, [first, *(v for _, v in fillers), last])
    c = np.asarray(C)
    np.testing.assert_array_equal(out[0], c * c)
    np.testing.assert_array_equal(out[-1], c * c)
    assert computed[0] is threading.main_thread()
    assert any(t is not threading.main_thread() for t in computed[1:])


def _taken_back(queued):
    """A ``Refolds`` whose wait for the worker's running job met ``queued`` not started yet."""
    worker = concurrent.futures.ThreadPoolExecutor(1)
    started, done = threading.Event(), threading.Event()

    def running():
        started.set()
        done.wait(10)
        return "running"

    def job():
        done.set()
        return queued()

    refolds = _refold.Refolds([], {}, Counter(), _batch.eagerly, None, worker)
    future = worker.submit(running)
    assert started.wait(10)
    refolds._ahead["other"] = (worker.submit(job), job)
    assert refolds._result(future, running) == "running"
    worker.shutdown()
    return refolds


def test_while_the_worker_computes_a_value_the_folding_thread_computes_those_it_has_not_started():
    refolds = _taken_back(threading.current_thread)
    assert refolds._computed["other"] is threading.main_thread()


def test_a_value_that_fails_where_it_was_taken_back_is_left_to_its_read():
    def failing():
        raise FloatingPointError("computed again at the read, where an error is the batch's")

    refolds = _taken_back(failing)
    assert "other" not in refolds._computed and "other" not in refolds._ahead
