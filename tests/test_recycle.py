"""The memory of a batch's large host results, used again (pejit._fold._recycle)."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import FoldOptions, pejit
from pejit._fold import _host, _recycle

from ._util import cpu_only

rng = np.random.default_rng(0)
SHAPE = (2048, 1024)  # 16 MiB of float64: MIN_BYTES
F64 = np.dtype("float64")


def test_a_dead_result_s_memory_holds_the_next_result_of_its_size():
    with _recycle.recycling():
        a = _recycle.empty(SHAPE, F64, "C")
        address = a.ctypes.data
        del a
        b = _recycle.empty(SHAPE[::-1], F64, "F")  # same bytes, another shape and order
        assert b.ctypes.data == address and b.flags.f_contiguous
        c = _recycle.empty(SHAPE, F64, "C")  # b lives: fresh memory
        assert not np.shares_memory(b, c)
        small = _recycle.empty((8, 8), F64, "C")
        assert _recycle.owns(small) and type(small.base) is not _recycle.Memory  # small: as NumPy allocates


def test_a_view_keeps_the_memory_of_its_result():
    with _recycle.recycling():
        a = _recycle.empty(SHAPE, F64, "C")
        t = a.T[::2].T  # a view of a view: NumPy points it at a
        assert t.base is a
        del a
        b = _recycle.empty(SHAPE, F64, "C")
        assert not np.shares_memory(b, t)
        address = t.base.ctypes.data
        del t
        assert _recycle.empty(SHAPE, F64, "C").ctypes.data == address


def test_nothing_is_recycled_outside_a_batch_nor_after_it():
    a = _recycle.empty(SHAPE, F64, "C")
    assert a.base is None
    with _recycle.recycling():
        pool = _recycle._pool.get()
        b = _recycle.empty(SHAPE, F64, "C")
    del b  # dies after its batch: its memory goes back to malloc, not to the batch's pool
    assert _recycle._pool.get() is None and not pool._free
    with _recycle.recycling():
        with _recycle.recycling():  # a batch inside another shares its pool
            c = _recycle.empty(SHAPE, F64, "C")
            del c
        assert _recycle._pool.get()._free  # c's memory, waiting for the outer batch's next result


def test_a_jax_array_made_of_a_result_keeps_its_values():
    """``jax.device_put`` may alias a NumPy array on a CPU (zero copy): it then
    holds the array, so its memory does not come back while the ``jax.Array`` lives."""
    with _recycle.recycling():
        a = _recycle.empty(SHAPE, F64, "C")
        a[...] = 1.5
        put, t = jax.device_put(a), jnp.asarray(a.T)
        del a
        b = _recycle.empty(SHAPE, F64, "C")
        b[...] = -7.0
        assert float(jnp.min(put)) == float(jnp.max(put)) == float(jnp.max(t)) == 1.5


@pytest.mark.parametrize("ufunc, layouts", [
    (np.add, ("F", "F")), (np.subtract, ("C", "C")), (np.add, ("C", "F")), (np.multiply, ("row", "F")),
    (np.multiply, ("F", "col")), (np.maximum, ("F", "F")), (np.add, ("F", "slice")),
])
def test_an_elementwise_result_is_numpy_s_in_bits_and_layout(ufunc, layouts):
    base = {"C": rng.standard_normal(SHAPE), "F": rng.standard_normal(SHAPE[::-1]).T,
            "row": rng.standard_normal((1, SHAPE[1])), "col": rng.standard_normal((SHAPE[0], 1)),
            "slice": rng.standard_normal((SHAPE[0], 2 * SHAPE[1]))[:, ::2]}
    xs = [base[k] for k in layouts]
    rule = _host.elementwise(ufunc)
    with _recycle.recycling():
        got, want = rule(*xs), ufunc(*xs)
        np.testing.assert_array_equal(got, want, strict=True)
        assert (got.flags.c_contiguous, got.flags.f_contiguous) == (want.flags.c_contiguous, want.flags.f_contiguous)
        assert _recycle.owns(got)


def test_what_is_remembered_of_a_result_dies_with_it():
    """A check remembered by the memory's address must not answer for the next
    result written there (``x + 0`` is ``x`` only where ``x`` holds no ``-0.0``)."""
    zeros = np.zeros(SHAPE)
    with _host.remembering(), _recycle.recycling():
        a = _recycle.empty(SHAPE, F64, "C")
        a[...] = 1.0
        assert _host._no_negative_zero(a)
        address = a.ctypes.data
        del a
        b = np.negative(zeros, out=_recycle.empty(SHAPE, F64, "C"))  # -0.0 where a held 1.0
        assert b.ctypes.data == address
        assert not _host._no_negative_zero(b)
        add = _host.on_host(lax.add_p, [b, zeros], {})
        assert add is not b and not np.signbit(add).any()  # -0.0 + 0.0 is +0.0, as XLA gives it


def test_a_transpose_of_a_result_is_kept_as_a_view():
    a = rng.standard_normal(SHAPE)
    with _recycle.recycling():
        s = _host.on_host(lax.add_p, [a, a], {})
        t = _host.on_host(lax.transpose_p, [s], {"permutation": (1, 0)})
        assert t.base is s  # no copy: it keeps nothing alive but its own bytes
        np.testing.assert_array_equal(t, (a + a).T)


@cpu_only
def test_a_fold_of_large_host_sums_reuses_their_memory(monkeypatch):
    taken = []
    take = _recycle._Pool.take
    monkeypatch.setattr(_recycle._Pool, "take", lambda self, n: taken.append(id(r := take(self, n))) or r)

    def f(A, x):
        y = A
        for k in range(1, 9):
            y = (y - A) * A + k * A  # each step: host results of 16 MiB, the last step's dead
        return y @ x

    A = jnp.asarray(rng.standard_normal((SHAPE[0], 2 * SHAPE[1]), np.float32) / 4)  # 16 MiB
    x = rng.standard_normal(A.shape[1]).astype(np.float32)
    g = pejit(f, constant_argnums=0, fold_options=FoldOptions(backend="eager"))
    got = g(A, x)
    np.testing.assert_allclose(got, jax.jit(f)(A, x), rtol=1e-5, atol=1e-3)
    assert len(taken) >= 16 and len(set(taken)) <= len(taken) // 2  # most written into dead ones' memory


def test_a_result_that_dies_while_its_pool_is_busy_on_the_same_thread_goes_back():
    """A collection that an allocation inside the pool starts can end a result's
    life there (a result in a reference cycle): its memory comes back, no deadlock."""
    pool = _recycle._Pool()
    raw = np.empty(_recycle.MIN_BYTES, np.uint8)

    def nested():
        with pool._lock:
            pool.give_back(raw)

    thread = threading.Thread(target=nested, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and pool.take(raw.nbytes) is raw
