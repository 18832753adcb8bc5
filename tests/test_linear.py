"""The host rules that build an affine region's matrix (pejit._residual._linear), against ``jax.jacfwd``."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pejit import _compat, pejit
from pejit._fold import _host, _offload
from pejit._residual import _linear

from ._util import Compiles, cpu_only, x64

#: Every test here builds matrices by the host rules, which apply only where
#: pejit's CPU back end is on.
pytestmark = cpu_only

rng = np.random.default_rng(3)
A = rng.standard_normal((6, 5)).astype(np.float32)
B = rng.standard_normal((2, 3, 4)).astype(np.float32)
V = rng.standard_normal(6).astype(np.float32)
MASK = rng.standard_normal((2, 3, 4)) > 0


@jax.custom_jvp
def twice(x):
    return 2 * x


twice.defjvp(lambda p, t: (twice(p[0]), 2 * t[0]))

# Each is affine in x of shape (2, 3, 4), and together they use every rule.
AFFINE = {
    "arithmetic": lambda x: -(x + B) * 3.0 - x / 2.0 + (B - x),
    "dot_general": lambda x: jnp.einsum("ijk,ljk->il", x, B) + lax.dot_general(
        x, B, (((2,), (2,)), ((0,), (0,)))).sum(),
    "constant_left": lambda x: A.T @ x.reshape(4, 6).T,
    "moves": lambda x: jnp.broadcast_to(x[:, None], (2, 5, 3, 4)).transpose(3, 1, 0, 2).reshape(4, 30)[::-1],
    "slices": lambda x: lax.slice(x, (0, 1, 0), (2, 3, 4), (1, 1, 2)) + lax.squeeze(x[:1, :1, :2], (0, 1))[None, None],
    "sums": lambda x: jnp.sum(x, axis=(0, 2))[:, None] + jnp.cumsum(x, axis=1)[1] + lax.cumsum(x, axis=2, reverse=True)[0],
    "concatenate": lambda x: jnp.concatenate([x, B, x[::-1]], axis=1),
    "pad": lambda x: lax.pad(x, 1.5, ((1, -1, 0), (0, 2, 1), (-2, 1, 2))),
    "select": lambda x: jnp.where(MASK, x, B) + lax.select_n(jnp.asarray(MASK).astype(np.int32), B, x),
    "dynamic": lambda x: lax.dynamic_update_slice(x, 2 * lax.dynamic_slice(x, (0, 1, 5), (1, 2, 2)), (1, 1, 2)),
    "calls": lambda x: jax.jit(lambda y: twice(y) @ A[:4, :2])(x) - x[..., :2],
    "scalars": lambda x: x.ravel() @ B.ravel() + x[0, 0, :1].reshape(()) * 2.0,
    "split": lambda x: sum(jnp.split(x, [1, 3], axis=2)[i].sum(axis=2) for i in range(3)),
}


def _region(fun, x):
    """``fun``'s jaxpr as a region: known constants first, then ``x``."""
    closed = jax.make_jaxpr(fun)(x)
    jaxpr, consts = _compat.open_jaxpr(closed)
    return jaxpr, consts, jaxpr.invars[len(consts):]


@pytest.mark.parametrize("name", sorted(AFFINE))
def test_the_matrix_is_the_jacobian_and_nothing_compiles(name):
    fun, x = AFFINE[name], jnp.asarray(rng.standard_normal((2, 3, 4)), jnp.float32)
    jaxpr, consts, sources = _region(fun, x)
    with Compiles() as compiles:
        built = _linear.jacobian(jaxpr, consts, sources, batch=7)  # chunks of 7 of 24 unit vectors
    assert built is not None, f"{name}: a primitive has no rule"
    assert compiles.count == 0
    (cols, c), = built
    out = fun(x)
    np.testing.assert_allclose(c, fun(jnp.zeros_like(x)), rtol=1e-6, atol=1e-6)
    want = np.asarray(jax.jacfwd(fun)(x)).reshape(out.size, x.size)
    np.testing.assert_allclose(cols.T, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cols.T @ np.asarray(x).ravel() + np.ravel(c), np.ravel(out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fun", [
    lambda x: jnp.sin(x),  # not affine: no rule
    lambda x: x * x,  # a product of two varying values
    lambda x: lax.pad(x, x[0, 0, 0], ((0, 0, 0),) * 3),  # padded by a varying value
])
def test_anything_else_is_left_to_jvp(fun):
    x = jnp.ones((2, 3, 4))
    jaxpr, consts, sources = _region(fun, x)
    assert _linear.jacobian(jaxpr, consts, sources, batch=24) is None


def test_the_call_time_form_stages_one_equation_and_compiles_it_for_new_values():
    """The folding program holds the build as one equation: the host runs it for
    the first value, the compiled program (``jax.jvp`` in a loop) for later ones."""
    def chain(a, b, x):
        return jnp.tanh(a @ (b @ x))

    a, b = (rng.standard_normal((16, 16)) / 4 for _ in range(2))
    x = jnp.asarray(rng.standard_normal(16), jnp.float32)
    f = pejit(chain, constant_argnums=(0, 1))
    for k in range(3):  # the second and third values run the compiled folding program
        ak, bk = jnp.asarray(a + k, jnp.float32), jnp.asarray(b * (k + 1), jnp.float32)
        want = np.tanh(np.float64(ak) @ (np.float64(bk) @ np.float64(x)))
        np.testing.assert_allclose(f(ak, bk, x), want, rtol=2e-5, atol=2e-6)
        spec = f.specialize(ak, bk, x)
        assert [e.primitive.name for e in spec.residual.jaxpr.eqns] == ["dot_general", "tanh"]
    folding = spec.program.folding_program
    assert "affine_matrices" in [e.primitive.name for e in folding.traced.jaxpr.eqns]
    assert folding.compiled is not None


def test_broadcast_zeros_skip_the_work_and_infinities_do_not():
    from jax.extend.core import primitives as P

    t = rng.standard_normal((3, 6)).astype(np.float32)  # tangents along 3 unit vectors
    zero = np.broadcast_to(np.float32(0), (6,))  # a compacted known zero
    add, sub, mul = (_linear.LINEAR_RULES[p] for p in (P.add_p, P.sub_p, P.mul_p))
    assert np.shares_memory(add([t, zero], [True, False]), t)  # the operand itself, not a copy
    np.testing.assert_array_equal(sub([zero, t], [False, True]), -t)
    product = mul([t, zero], [True, False])
    assert product.shape == (3, 6) and not any(product.strides) and not product.any()
    empty = np.broadcast_to(np.float32(0), (3, 0))  # holds no element to read
    assert add([empty, np.zeros(0, np.float32)], [True, False]).shape == (3, 0)
    t[1, 2] = np.inf  # inf * 0 is NaN: computed, not skipped
    with np.errstate(invalid="ignore"):
        assert np.isnan(mul([t, zero], [True, False])[1, 2])


@pytest.mark.parametrize("entry", [1.5, np.inf])
def test_a_constant_times_unit_vectors_is_read_once_and_inf_still_spreads(entry, monkeypatch):
    """The build pushes its unit vectors a batch at a time through ``H @ x``:
    each batch is some columns of ``H`` (no BLAS), whose finiteness is read
    once per build, not per batch (``H`` is large enough to be remembered:
    see ``_host.remembering``); an infinity in ``H`` gives the NaN rows
    that multiplying by the identity's zeros gives."""
    H = rng.standard_normal((700, 12))
    assert H.nbytes >= _host.REMEMBER_BYTES
    H[2, 7] = entry
    with x64():
        jaxpr, consts, sources = _region(lambda x: H @ x, jnp.zeros(12))  # H a constant of the region
        reads, check = [], _host.all_finite.__wrapped__  # the check itself, as remembered
        monkeypatch.setattr(_host, "all_finite", _host._remembered(lambda x: (reads.append(x.shape), check(x))[1]))
        with np.errstate(invalid="ignore"):
            (cols, _), = _linear.jacobian(jaxpr, consts, sources, batch=4)  # 3 batches of 4 unit vectors
    monkeypatch.undo()
    with np.errstate(invalid="ignore"):
        want = H @ np.eye(12)  # BLAS: inf * 0 is NaN across row 2
    np.testing.assert_array_equal(cols.T, want)
    assert reads.count(H.shape) == 1


def test_a_small_constant_of_zeros_is_read_and_its_products_skip_the_work():
    """A constant of zeros as the fold computed it (not a compacted broadcast)
    is read where it is small beside the product: the product is one zero
    broadcast, so the sums after it skip their work too; an infinity still
    gives the NaN that multiplying computes."""
    from jax.extend.core import primitives as P

    t = rng.standard_normal((16, 64)).astype(np.float32)  # the zeros: at most an eighth of the product
    zeros = np.zeros(64, np.float32)
    mul, dot = _linear.LINEAR_RULES[P.mul_p], _linear.LINEAR_RULES[P.dot_general_p]
    for product in (mul([zeros, t], [False, True]),
                    dot([np.zeros((), np.float32), t], [False, True], dimension_numbers=(((), ()), ((), ())))):
        assert product.shape == (16, 64) and not any(product.strides) and not product.any()
    t[1, 2] = np.inf
    with np.errstate(invalid="ignore"):
        assert np.isnan(mul([zeros, t], [False, True])[1, 2])

    def fun(x):  # the zeros, one scalar of them, and then a sum reading the products
        return zeros * x + jnp.float32(0) * x[::-1] + 2.0 * x

    x = jnp.asarray(rng.standard_normal(64), jnp.float32)
    jaxpr, consts, sources = _region(fun, x)
    (cols, _), = _linear.jacobian(jaxpr, consts, sources, batch=16)
    np.testing.assert_array_equal(cols.T, jax.jacfwd(fun)(x))


@pytest.mark.parametrize("room", [_linear.KNOWN_BYTES, 0])
def test_values_at_zero_are_computed_once_for_all_batches(room, monkeypatch):
    """The values do not depend on the unit vectors: the first batch computes
    them, the others read them (unless they do not fit in ``KNOWN_BYTES``)."""
    C = rng.standard_normal(12).astype(np.float32)

    def fun(x):
        return jax.jit(lambda y: jnp.sin(C) * y)(x) + jnp.cos(C) * x

    x = jnp.asarray(rng.standard_normal(12), jnp.float32)
    jaxpr, consts, sources = _region(fun, x)
    evaluated, evaluate = [], _linear._evaluate
    monkeypatch.setattr(_linear, "_evaluate", lambda eqn, vals: (evaluated.append(eqn), evaluate(eqn, vals))[1])
    monkeypatch.setattr(_linear, "KNOWN_BYTES", room)
    monkeypatch.setattr(_offload, "_cores", lambda: 1)  # every batch on this thread
    (cols, c), = _linear.jacobian(jaxpr, consts, sources, batch=4)  # 3 batches
    np.testing.assert_allclose(cols.T, jax.jacfwd(fun)(x), rtol=1e-6)
    np.testing.assert_array_equal(c, np.zeros(12, np.float32))
    names = sorted(e.primitive.name for e in evaluated)
    assert names == sorted(["sin", "cos"] * (1 if room else 3))


@pytest.mark.parametrize("room", [_linear.KNOWN_BYTES, 0])
def test_the_worker_takes_batches_and_leaves_jax_s_dispatch_to_the_folding_thread(room, monkeypatch):
    """With a second core, the worker thread computes half of the batches
    after the first from the values that batch kept; where one was not kept, the
    batch is computed again on the folding thread, whose configuration JAX's
    dispatch reads (64-bit here)."""
    C = rng.standard_normal(12)

    def fun(x):
        return jnp.sin(C) * x[::-1] + 2.0 * x

    monkeypatch.setattr(_offload, "_cores", lambda: 2)
    monkeypatch.setattr(_linear, "SHARED_ELEMENTS", 0)  # this small build is shared too
    monkeypatch.setattr(_linear, "KNOWN_BYTES", room)
    threads = {"evaluate": set(), "linear": set()}
    evaluate, linear, run, collect = _linear._evaluate, _linear._linear, _linear._run, _linear._collect
    started = threading.Event()  # the worker has started a batch: the folding thread does not take it back
    monkeypatch.setattr(_linear, "_run", lambda *a: (a[5] or started.set(), run(*a))[1])
    monkeypatch.setattr(_linear, "_collect", lambda *a: (started.wait(10), collect(*a))[1])
    monkeypatch.setattr(_linear, "_evaluate", lambda *a: (threads["evaluate"].add(threading.current_thread()),
                                                          evaluate(*a))[1])
    monkeypatch.setattr(_linear, "_linear", lambda *a: (threads["linear"].add(threading.current_thread()),
                                                        linear(*a))[1])
    with x64():
        x = jnp.asarray(rng.standard_normal(12))
        jaxpr, consts, sources = _region(fun, x)
        (cols, _), = _linear.jacobian(jaxpr, consts, sources, batch=4)  # 1 unit vector, then 11 in 6 batches
        want = jax.jacfwd(fun)(x)
    np.testing.assert_array_equal(cols.T, want)
    assert threads["evaluate"] == {threading.main_thread()}
    assert (len(threads["linear"]) == 2) == bool(room)


def test_a_small_build_stays_on_the_folding_thread(monkeypatch):
    """Below `SHARED_ELEMENTS` the passes a shared build adds over the region
    cost more than the second core wins back: one pass per batch, here."""
    monkeypatch.setattr(_offload, "_cores", lambda: 2)
    runs, run = [], _linear._run
    monkeypatch.setattr(_linear, "_run", lambda *a: (runs.append(threading.current_thread()), run(*a))[1])
    jaxpr, consts, sources = _region(lambda x: A @ x, jnp.ones(5, jnp.float32))
    (cols, _), = _linear.jacobian(jaxpr, consts, sources, batch=5)
    np.testing.assert_array_equal(cols.T, A)
    assert runs == [threading.main_thread()]
