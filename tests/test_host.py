"""The host rules of the folding back end (pejit._fold._host): JAX's bits, no compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core.primitives import add_jaxvals_p

from pejit import _compat
from pejit._fold import _batch, _host

from ._util import Compiles, cpu_only, x64

#: Every test here evaluates the host rules, which apply only where pejit's CPU
#: back end is on.
pytestmark = cpu_only

rng = np.random.default_rng(0)
F = rng.standard_normal((3, 4)).astype(np.float32)
G = rng.standard_normal((3, 4)).astype(np.float32)
D = rng.standard_normal((3, 4))
I = rng.integers(-5, 5, (3, 4)).astype(np.int32)
B = F > 0
#: integers at the edges of their types
W = np.array([[2**31 - 1, -2**31, 2**30, -1]] * 3, np.int32)
U = np.array([0, 1, 128, 255], np.uint8)

#: one program per rule: (function, arguments)
CASES = {
    "add": (lax.add, (F, G)), "sub": (lax.sub, (F, G)), "mul": (lax.mul, (F, G)),
    "max": (lax.max, (F, np.float32(np.nan) * G)), "min": (lax.min, (F, G)), "neg": (lax.neg, (F,)),
    "abs": (lax.abs, (G,)), "eq": (lax.eq, (I, I.T.reshape(3, 4))), "lt": (lax.lt, (F, G)),
    "ge": (lax.ge, (I, I * 0)), "and": (lax.bitwise_and, (B, G > 0)), "not": (lax.bitwise_not, (I,)),
    "xor": (lax.bitwise_xor, (I, I + 1)), "select_n": (lax.select_n, (B, F, G)),
    # integers wrap on overflow, in NumPy's array loops as in XLA
    "int add": (lax.add, (W, W)), "int sub": (lax.sub, (-W, W)), "int mul": (lax.mul, (W, I)),
    "int add_any": (add_jaxvals_p.bind, (W, I)),
    "int neg": (lax.neg, (W,)), "int abs": (lax.abs, (W,)), "int max": (lax.max, (W, I)),
    "int64 mul": (lax.mul, (W.astype(np.int64) << 32, W.astype(np.int64))),
    "uint8 sub": (lax.sub, (U, U[::-1])), "uint8 add scalar": (lax.add, (U, np.uint8(200))),
    "select_n int": (lambda w, a, b, c: lax.select_n(w, a, b, c), (np.abs(I) % 3, F, G, F * 2)),
    # C's remainder, the dividend's sign: of negative dividends and divisors, at the edges of int32
    "int rem": (lax.rem, (W, np.where(I == 0, 7, I) * np.int32(3))), "int rem scalar": (lax.rem, (I, np.int32(-3))),
    "uint8 rem": (lax.rem, (U, np.uint8(7))),
    "jnp.remainder": (lambda x: jnp.remainder(x, np.int32(5)), (I,)),  # Python's sign: rem, then moves
    "convert f64": (lambda x: lax.convert_element_type(x, np.float32), (D,)),
    "convert int": (lambda x: lax.convert_element_type(x, np.float32), (I,)),
    "broadcast_in_dim": (lambda x: lax.broadcast_in_dim(x, (2, 3, 5, 4), (1, 3)), (F,)),
    "reshape": (lambda x: lax.reshape(x.T, (2, 6)), (F,)), "transpose": (lambda x: lax.transpose(x, (1, 0)), (F,)),
    "squeeze": (lambda x: lax.squeeze(x[:, :1], (1,)), (F,)), "concatenate": (lambda a, b: lax.concatenate([a, b], 1), (F, G)),
    "slice": (lambda x: lax.slice(x, (0, 1), (3, 4), (2, 2)), (F,)), "rev": (lambda x: lax.rev(x, (0, 1)), (F,)),
    "iota": (lambda: lax.broadcasted_iota(np.int32, (3, 4), 1), ()),
    "dynamic_slice": (lambda x, i: lax.dynamic_slice(x, (i, np.int32(1)), (2, 3)), (F, np.int32(2))),  # clamped
    "split": (lambda x: jnp.split(x, [1, 3], axis=1), (F,)),
    "stack": (lambda a, b: jnp.stack([a, b], axis=1), (F, G)),  # jnp.stack's own primitive where JAX has one
    **({"unstack": (lambda x: lax.unstack(x, axis=1), (F,))} if hasattr(lax, "unstack") else {}),
    "add_any": (lambda x, y: jax.jvp(lambda a: a * y, (x,), (x,))[1], (F, G)),
    "dot_general identity": (lambda x, e: lax.dot_general(x, e, (((0,), (1,)), ((), ()))), (F, np.eye(3, dtype=F.dtype))),
    "dot_general identity first": (lambda e, x: lax.dot_general(e, x, (((1,), (1,)), ((), ()))),
                                   (np.eye(4, dtype=F.dtype), F)),
}

EYE_DOTS = {  # (x, eye) -> x @ eye.T, as jacfwd's basis pushforward writes it
    "signed zeros": np.array([[-0.0, 1.0, -2.0], [0.0, -0.0, 0.0]]),
    "no -0.0": np.array([[0.0, 1.0, -2.0], [3.0, 0.0, 5.0]]),
    "an infinity": np.array([[np.inf, 1.0, 2.0], [0.0, 1.0, 2.0]]),
    "a NaN": np.array([[np.nan, 1.0, 2.0], [0.0, 1.0, 2.0]]),
}


@pytest.mark.parametrize("name", EYE_DOTS)
def test_a_product_with_the_identity_is_xla_s_bit_for_bit_or_not_ruled(name):
    x = EYE_DOTS[name]
    with x64():
        eqn = jax.make_jaxpr(lambda a, e: a @ e.T)(x, np.eye(3)).jaxpr.eqns[-1]
        want = np.asarray(jax.jit(lambda a, e: a @ e.T)(x, np.eye(3)))
        got = _host.on_host(eqn.primitive, [x, np.eye(3)], eqn.params)
    if name in ("signed zeros", "no -0.0"):
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
        assert np.shares_memory(got, x) == (name == "no -0.0")  # x + 0 is x itself but for -0.0
    else:  # inf * 0 is NaN in the rows XLA sums: XLA computes them
        assert got is None


@pytest.mark.parametrize("unit, side", [(np.eye(5)[:, 1:4], "right"), (np.eye(5)[2:4], "left"),
                                        (np.eye(5)[:, 3:], "right")])
def test_a_product_with_unit_vectors_is_a_part_of_the_other_matrix(unit, side):
    """The affine collapse pushes its unit vectors a batch at a time: a
    product with some rows or columns of the identity picks those of the
    other matrix (no BLAS), with XLA's bits."""
    x = np.array([[-0.0, 1.5, -2.0, 0.0, 3.0], [4.0, -0.0, 5.0, -6.0, 0.0]])
    x = x if side == "right" else x.T
    fun = (lambda a, u: a @ u) if side == "right" else (lambda u, a: u @ a)
    args = (x, unit) if side == "right" else (unit, x)
    with x64():
        eqn = jax.make_jaxpr(fun)(*args).jaxpr.eqns[-1]
        want = np.asarray(jax.jit(fun)(*args))
        got = _host.on_host(eqn.primitive, list(args), eqn.params)
        assert _host.on_host(eqn.primitive, [np.where(a is x, np.inf, a) for a in args], eqn.params) is None
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def test_a_product_with_an_almost_identity_is_not_ruled():
    eqn = jax.make_jaxpr(lambda a, e: a @ e)(F, np.eye(4, dtype=F.dtype)).jaxpr.eqns[-1]
    for not_eye in (np.eye(4, dtype=F.dtype) * 2, np.eye(4, dtype=F.dtype)[::-1], np.ones((4, 4), F.dtype),
                    np.eye(4, k=1, dtype=F.dtype), np.eye(4, k=-1, dtype=F.dtype)):
        assert _host.on_host(eqn.primitive, [F, not_eye], eqn.params) is None


def _equations(fun, args):
    closed = jax.make_jaxpr(fun)(*args)
    env = dict(zip(closed.jaxpr.invars, args))
    for e in closed.jaxpr.eqns:
        ins = [env[a] if isinstance(a, _compat.Var) else a.val for a in e.invars]
        want = e.primitive.bind(*[jnp.asarray(x) for x in ins], **e.params)
        got = _host.on_host(e.primitive, ins, e.params)
        env.update(zip(e.outvars, want if e.primitive.multiple_results else [want]))
        yield e, got, want


@pytest.mark.parametrize("name", CASES)
def test_a_host_rule_gives_jax_s_bits(name):
    fun, args = CASES[name]
    ruled = 0
    with x64():  # float64 operands stay float64
        results = list(_equations(fun, args))
    for e, got, want in results:
        if got is None:
            continue
        ruled += 1
        for g, w in zip(*((got, want) if e.primitive.multiple_results else ([got], [want]))):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape, e
            np.testing.assert_array_equal(g, np.asarray(w), strict=True)
    assert ruled, f"no host rule applied to {name}"


@pytest.mark.parametrize("fun, args", [
    (lambda x: lax.div(x, np.int32(0)), (I,)),  # integer division by zero: NumPy's is not XLA's
    (lambda x: lax.convert_element_type(x, np.int32), (F,)),  # float to int: NaN and overflow differ
    (jnp.sin, (F,)), (jnp.dot, (F, G.T)), (jnp.sum, (F,)),  # XLA's kernels round otherwise
    (lambda x: x / np.float32(3.0), (F,)),  # XLA multiplies by the reciprocal
    (lax.rem, (W, I)),  # by zero (I holds zeros): the back end's own
    (lambda x: lax.rem(x, np.int32(-1)), (W,)),  # INT_MIN % -1 overflows
    (lax.rem, (F, G)),  # floats: XLA's kernel, not NumPy's fmod
])
def test_no_rule_where_numpy_could_differ(fun, args):
    for e, got, _ in _equations(fun, args):
        if e.primitive.name in ("convert_element_type", "sin", "dot_general", "reduce_sum", "div", "rem"):
            assert got is None, e


def test_a_batch_of_moves_and_ieee_arithmetic_compiles_nothing():
    def fold(a, b):
        c = jnp.broadcast_to(a, (5, 3, 4)) * 2.0 + b
        both = jnp.concatenate([c.transpose(0, 2, 1), -c.transpose(0, 2, 1)], axis=2)
        return lax.slice(both, (0, 1, 0), (5, 4, 6), (1, 1, 2)) * 0.5

    a, b = jnp.asarray(F), jnp.asarray(G)
    closed = jax.make_jaxpr(fold)(a, b)
    with Compiles() as compiles:
        (out,) = _batch.run_jaxpr(closed, [a, b], backend="eager")
    assert compiles.count == 0
    with jax.disable_jit():  # JAX op by op: each primitive compiled alone, no fusion
        np.testing.assert_array_equal(out, fold(a, b))


def test_a_nested_call_is_evaluated_op_by_op_when_rules_cover_its_body():
    """``jnp.multiply`` and other ``jit``-wrapped functions: no compile of their own."""
    covered = jax.jit(lambda a, b: jnp.where(a > 0, a * b - 1.0, -b))  # 1.0: a literal in the body
    closed = jax.make_jaxpr(lambda a, b: covered(a, b))(F, G)
    (call,) = closed.jaxpr.eqns
    with Compiles() as compiles:
        (got,) = _host.on_host(call.primitive, [F, G], call.params)
    assert compiles.count == 0
    with jax.disable_jit():  # JAX's bits op by op (compiled whole, XLA contracts a * b - 1 into an FMA)
        np.testing.assert_array_equal(got, covered(F, G))

    uncovered = jax.make_jaxpr(lambda a: jax.jit(lambda y: jnp.sin(y) * 2.0)(a))(F)
    (call,) = uncovered.jaxpr.eqns
    assert _host.on_host(call.primitive, [F], call.params) is None  # sin: JAX compiles the call


def test_a_python_bool_operand_is_jax_s_bool():
    """A known Python ``bool`` (never weakly typed) meets a host rule as ``np.bool_``."""
    got = _host.on_host(lax.or_p, [True, B], {})
    np.testing.assert_array_equal(got, np.asarray(lax.bitwise_or(True, jnp.asarray(B))), strict=True)
    assert _host.on_host(lax.add_p, [1, I], {}) is None  # a Python int is weakly typed: JAX's


def test_jnp_remainder_compiles_nothing():
    """``jnp.take``'s wrapped indices and MJX's tree indexing: ``jnp.remainder`` of small
    int32 arrays, one compile per shape before ``rem`` had a rule (1 s of the MJX
    humanoid's first call)."""
    (call,) = jax.make_jaxpr(jnp.remainder)(I, np.int32(-5)).jaxpr.eqns
    with Compiles() as compiles:
        (got,) = _host.on_host(call.primitive, [I, np.int32(-5)], call.params)
    assert compiles.count == 0
    np.testing.assert_array_equal(got, np.remainder(I, -5), strict=True)


def test_a_view_of_a_whole_array_is_not_copied_a_part_is():
    """A transpose keeps nothing alive but its own bytes (TFC's PDE transposes
    532 1331x651 tangents: copying them was 0.9 s); a slice would keep its
    source, so it is copied, as XLA's result would be an array of its own."""
    a = np.arange(12.0).reshape(3, 4)
    (t, s) = (_host.on_host(p, [a], params) for p, params in (
        (lax.transpose_p, {"permutation": (1, 0)}),
        (lax.slice_p, {"start_indices": (0, 0), "limit_indices": (2, 4), "strides": None})))
    assert np.shares_memory(t, a) and not np.shares_memory(s, a)
    np.testing.assert_array_equal(t, a.T)


@pytest.mark.parametrize("zeros", ["broadcast", "array"])
def test_a_product_with_zeros_is_xla_s_zeros_bit_for_bit(zeros):
    """Derivative code multiplies by materialized symbolic zeros: a product with
    finite values is XLA's +0.0 everywhere, kept as one element broadcast."""
    a = np.array([[-1.5, 2.0, -0.0], [3.0, -4.0, 5.0]])
    z = np.broadcast_to(0.0, (3, 4)) if zeros == "broadcast" else np.zeros((3, 2))  # read if no larger
    with x64():
        eqn = jax.make_jaxpr(lambda a, z: a @ z)(a, z).jaxpr.eqns[-1]
        want = np.asarray(jax.jit(lambda a, z: a @ z)(a, z))
        got = _host.on_host(eqn.primitive, [a, z], eqn.params)
        assert _host.on_host(eqn.primitive, [np.array([[np.inf, 0, 0], [0, 0, 0]]), z], eqn.params) is None
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    assert got.strides == (0, 0)


def test_arithmetic_on_broadcasts_computes_one_element():
    """Sums of materialized symbolic zeros (broadcasts, as the broadcast rule
    makes them) stay one element broadcast; the bits are XLA's."""
    z, c = np.broadcast_to(np.float32(-0.0), (300, 200)), np.broadcast_to(np.float32(0.1), (300, 200))
    for fun, args in ((lax.add, (z, z)), (lax.sub, (c, z)), (lax.mul, (c, c))):
        eqn = jax.make_jaxpr(fun)(*args).jaxpr.eqns[-1]
        got = _host.on_host(eqn.primitive, list(args), eqn.params)
        assert got.strides == (0, 0)
        want = np.asarray(fun(*map(jnp.asarray, args)))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_arithmetic_on_row_broadcasts_computes_one_row():
    """A tangent's zeros or a coordinate broadcast along the batch axis of
    ``jacfwd`` (a column of 1331 values as 651x1331): one row of work."""
    rows = np.broadcast_to(np.linspace(-1, 1, 200, dtype=np.float32), (300, 200))
    zero_rows = np.broadcast_to(-np.zeros(200, np.float32), (300, 200))
    cols = np.broadcast_to(np.linspace(0, 1, 300, dtype=np.float32)[:, None], (300, 200))
    for fun, args, strides in ((lax.mul, (rows, zero_rows), (0, 4)), (lax.max, (rows, np.float32(0.5)), (0, 4)),
                               (lax.add, (rows, cols), None)):
        eqn = jax.make_jaxpr(fun)(*args).jaxpr.eqns[-1]
        got = _host.on_host(eqn.primitive, list(args), eqn.params)
        assert strides is None or got.strides == strides
        want = np.asarray(fun(*map(jnp.asarray, args)))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_broadcast_is_read_once_per_distinct_element():
    """What a row broadcast along ``jacfwd``'s unit vectors holds is one row
    to read: at 15^3 points, 3375 elements instead of 3.4 million."""
    rows = np.broadcast_to(np.zeros(200), (300, 200))
    assert _host.only_zeros(rows, 200) and not _host.only_zeros(np.zeros((300, 200)), 200)
    assert _host.all_finite(rows) and not _host.all_finite(np.broadcast_to(np.array([1.0, np.inf]), (5, 2)))
    assert _host.all_finite(np.zeros((0, 3))) and not _host.all_finite(np.broadcast_to(np.nan, (2, 2)))
    with np.errstate(over="ignore"):
        assert _host.all_finite(np.full(4, 3e38, np.float32))  # a sum that overflows: the elements decide


SIGNED = np.array([[-1.5, 0.0, -0.0], [2.0, np.inf, np.nan]])
SUMS = {  # name: (primitive, a, b, what the rule returns: "a", "b", "broadcast" or "computed")
    "+0 broadcast to no -0": (lax.add, np.broadcast_to(0.0, (2, 3)), np.abs(SIGNED), "b"),
    "+0 broadcast to a -0": (lax.add, SIGNED, np.broadcast_to(0.0, (2, 3)), "computed"),
    "-0 broadcast to a -0": (lax.add, np.broadcast_to(-0.0, (2, 3)), SIGNED, "b"),
    "signed zeros to no -0": (lax.add, np.abs(SIGNED), -np.zeros((2, 3)) * SIGNED[:1], "a"),
    "+0 broadcast to signed zeros": (lax.add, np.array([[0.0, -0.0, -0.0]] * 2), np.broadcast_to(0.0, (2, 3)),
                                     "broadcast"),
    "signed zeros to signed zeros": (lax.add, np.array([[0.0, -0.0, -0.0]] * 2), np.array([[-0.0, -0.0, 0.0]] * 2),
                                     "computed"),
    "less +0 from a -0": (lax.sub, SIGNED, np.broadcast_to(0.0, (2, 3)), "a"),
    "less -0 from a -0": (lax.sub, SIGNED, np.broadcast_to(-0.0, (2, 3)), "computed"),
    "less -0 from no -0": (lax.sub, np.abs(SIGNED), np.broadcast_to(-0.0, (2, 3)), "a"),
    "zeros less a value": (lax.sub, np.zeros((2, 3)), np.abs(SIGNED), "computed"),
    "a scalar +0 to no -0": (lax.add, np.abs(SIGNED), np.float64(0.0), "a"),
    "+0 to rows of no -0": (lax.add, np.broadcast_to(np.abs(SIGNED[0]), (2, 3)), np.zeros((2, 3)), "a"),
    "+0 to rows of a -0": (lax.add, np.broadcast_to(SIGNED[0], (2, 3)), np.zeros((2, 3)), "computed"),
}


@pytest.mark.parametrize("name", SUMS)
def test_a_sum_with_zeros_is_the_other_term_where_its_bits_are_xla_s(name):
    """Derivative code adds materialized symbolic zeros to its tangents:
    ``x + 0`` is ``x`` (not computed again) unless ``x`` holds a ``-0.0``
    and the zero is ``+0.0`` somewhere (``-0.0 + +0.0`` is ``+0.0``)."""
    fun, a, b, kind = SUMS[name]
    with x64():
        eqn = jax.make_jaxpr(fun)(a, b).jaxpr.eqns[-1]
        want = np.asarray(jax.jit(fun)(a, b))
        got = _host.on_host(eqn.primitive, [a, b], eqn.params)
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))
    returned = {"a": got is a, "b": got is b, "broadcast": got.strides == (0, 0)}
    assert [k for k, hit in returned.items() if hit] == ([] if kind == "computed" else [kind])


def test_while_a_fold_runs_each_array_is_checked_once():
    calls = []
    finite = _host._remembered(lambda x: calls.append(x.shape) or bool(np.isfinite(x).all()))
    a = rng.standard_normal((64, 300))  # 150 KiB: worth remembering
    assert finite(a) and finite(a) and len(calls) == 2  # outside a fold: read each time
    with _host.remembering():
        assert finite(a) and finite(a) and finite(a.T.T) and len(calls) == 3  # a view of the same memory too
        assert finite(a.T) and finite(a[:32]) and len(calls) == 5  # other views: other answers
        with _host.remembering():  # a fold inside keeps what the outer one found
            assert finite(a) and len(calls) == 5
        del a
        b = np.full((64, 300), np.nan)  # perhaps where a was: checked afresh
        assert not finite(b) and len(calls) == 6
        small = np.ones(8)
        assert finite(small) and finite(small) and len(calls) == 8  # cheaper read again than remembered
    assert not finite(b) and len(calls) == 9  # the fold is over: nothing is kept


def test_a_fold_on_another_thread_neither_ends_this_one_nor_outlives_it():
    import threading

    calls = []
    finite = _host._remembered(lambda x: calls.append(1) or bool(np.isfinite(x).all()))
    a = rng.standard_normal((64, 300))
    entered, leave = threading.Event(), threading.Event()

    def other_fold():
        with _host.remembering():
            entered.set()
            leave.wait()

    other = threading.Thread(target=other_fold)
    with _host.remembering():
        other.start()
        entered.wait()
        assert finite(a) and finite(a) and len(calls) == 1
    leave.set()  # the other fold ends after this one
    other.join()
    assert finite(a) and finite(a) and len(calls) == 3  # nothing left behind


def test_the_checks_are_remembered_in_a_fold():
    from pejit import FoldOptions, pejit

    def g(A, x):  # jacfwd pushes one identity through four products with it
        return jax.jacfwd(lambda x: sum((A * k) @ x for k in range(1, 5)))(x)

    A = rng.standard_normal((300, 200)).astype(np.float32)
    x = np.ones(200, np.float32)  # the identity: 160 KB
    seen = []
    rows = _host._identity_rows.__wrapped__
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_host, "_identity_rows", _host._remembered(lambda u: seen.append(u.shape) or rows(u)))
        out = pejit(g, constant_argnums=0, fold_options=FoldOptions(backend="eager"))(A, x)
    np.testing.assert_allclose(out, sum(A * k for k in range(1, 5)), rtol=1e-6)
    assert seen == [(200, 200)]


def test_a_jax_array_a_rule_returns_whole_is_not_copied_a_part_is():
    """A rule that returns an operand (a sum with zeros) returns a ``jax.Array``'s
    bytes as NumPy views them, all of them: nothing more is kept alive, so nothing
    is copied (at 15^3 points, TFC's PDE copied nine 27 MB tangents so)."""
    x = jnp.asarray(rng.standard_normal((64, 300)).astype(np.float32))
    zeros = np.zeros((64, 300), np.float32)
    same = _host.on_host(add_jaxvals_p, [x, zeros], {})
    np.testing.assert_array_equal(same, x)
    assert np.shares_memory(same, np.asarray(x))
    t = _host.on_host(lax.transpose_p, [x], {"permutation": (1, 0)})
    part = _host.on_host(lax.slice_p, [x], {"start_indices": (0, 0), "limit_indices": (32, 300), "strides": None})
    assert np.shares_memory(t, np.asarray(x)) and not np.shares_memory(part, np.asarray(x))
