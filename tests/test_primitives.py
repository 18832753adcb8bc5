"""The jaxpr walks of ``pejit._fold._primitives``."""

import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from pejit._fold._nonzero import _DIFFER_WHERE, GuardedDivisions, _decided
from pejit._fold._primitives import all_eqns, folds_alike


def test_all_eqns_visits_each_body_once_and_every_level():
    inner = jax.jit(jnp.cos)

    def branch(x):
        return inner(inner(x))  # one body, two calls

    def f(x, i):
        y = lax.cond(i > 0, branch, jnp.tanh, x)
        return jax.jit(lambda z: jnp.sin(inner(z)))(y) + inner(y)

    closed = jax.make_jaxpr(f)(1.0, 1)
    names = sorted(e.primitive.name for e in all_eqns(closed))
    # (cos once, for five calls in three programs; every level's own equations)
    assert names.count("cos") == 1 and names.count("tanh") == 1 and names.count("sin") == 1
    assert names.count("cond") == 1 and names.count("add") == 1
    calls = [e for e in all_eqns(closed) if "jaxpr" in e.params and e.primitive.name != "cond"]
    assert len(calls) == 5  # two in the branch, one outer call, one inside it, one at the top


def _eqns(fun, *args):
    return jax.make_jaxpr(fun)(*args).eqns


def test_scatters_fold_alike_as_the_reductions_they_are():
    i32, f32 = jnp.ones(8, jnp.int32), jnp.ones(8)
    twice = jnp.array([1, 1, 3])  # an index written twice
    # adding and multiplying: exact on integers, in XLA's order of the additions on floats
    for op in ("add", "multiply"):
        assert folds_alike(_eqns(lambda a: getattr(a.at[twice], op)(a[:3]), i32))
        assert not folds_alike(_eqns(lambda a: getattr(a.at[twice], op)(a[:3]), f32))
        assert folds_alike(_eqns(lambda a: getattr(a.at[twice], op)(a[:3]), f32), rounding=True)
    # max and min: no order changes them
    assert folds_alike(_eqns(lambda a: a.at[twice].max(a[:3]), f32))
    # replacing: which write is left at an index written twice is XLA's
    assert not folds_alike(_eqns(lambda a: a.at[twice].set(a[:3]), f32))
    assert folds_alike(_eqns(lambda a: a.at[twice].set(a[:3]), f32), rounding=True)
    assert folds_alike(_eqns(lambda a: a.at[jnp.array([1, 3])].set(a[:2], unique_indices=True), f32))
    # data movement (JAX 0.7 puts an index array of NumPy's on the device inside the program)
    assert folds_alike(_eqns(lambda a: jnp.tile(jax.device_put(a), 3), f32))


def test_sorts_fold_alike_where_equal_keys_keep_an_order():
    f32 = jnp.asarray([2.0, -0.0, 2.0, 0.0, 1.0])
    assert folds_alike(_eqns(jnp.sort, f32))  # one operand: equal elements are interchangeable
    # argsort sorts the keys with their indices, stably: equal keys keep theirs, in both
    assert folds_alike(_eqns(jnp.argsort, f32))
    assert folds_alike(_eqns(lambda a: lax.sort((a, -a), num_keys=2, is_stable=True), f32))
    # unstable, which of two equal keys' companions comes first is the implementation's
    assert not folds_alike(_eqns(lambda a: lax.sort((a, -a), num_keys=1, is_stable=False), f32))


def test_window_reductions_fold_alike_as_the_reductions_they_are():
    i32, f32 = jnp.arange(8, dtype=jnp.int32), jnp.ones(8)
    lowest, highest = jnp.iinfo(jnp.int32).min, jnp.iinfo(jnp.int32).max
    for op, identity, name in ((lax.add, (0, 0.0), "sum"), (lax.max, (lowest, -jnp.inf), "max"),
                               (lax.min, (highest, jnp.inf), "min")):
        integers = _eqns(lambda a: lax.reduce_window(a, identity[0], op, (3,), (1,), "VALID"), i32)
        assert [e.primitive.name for e in integers] == [f"reduce_window_{name}"]
        assert folds_alike(integers)
        window = _eqns(lambda a: lax.reduce_window(a, identity[1], op, (3,), (1,), "VALID"), f32)
        # on floats, a sum in XLA's order of the additions; an extremum as a reduction's
        assert folds_alike(window) is (name != "sum") and folds_alike(window, rounding=True)
    logsumexp = _eqns(lambda a: lax.cumlogsumexp(a), f32)
    assert not folds_alike(logsumexp) and folds_alike(logsumexp, rounding=True)


def test_float_extrema_fold_alike_but_for_the_sign_of_a_zero():
    # which zero an extremum of 0.0 and -0.0 keeps is XLA's order's, which its folding and
    # its kernels do not share (jaxlib 0.10.2), as within a few ulps is left to XLA: what
    # jax.jit closed over the constants gives
    f32, at = jnp.array([0.0, -0.0, 1.0]), jnp.array([0, 0, 1])
    for fun in (jnp.max, jnp.nanmin, lambda a: lax.cummax(a), lambda a: jnp.zeros(2).at[at].max(a)):
        assert folds_alike(_eqns(fun, f32))
    zeros = jnp.array([0.0, -0.0, -0.0, 0.0])
    assert jax.jit(lambda: jnp.max(zeros))() == jax.jit(jnp.max)(zeros) == 0.0  # whichever zero each gives


def test_bit_counts_and_neighbours_fold_alike():
    assert folds_alike(_eqns(lax.population_count, jnp.arange(8, dtype=jnp.int32)))
    assert folds_alike(_eqns(lambda a: lax.nextafter(a, jnp.zeros_like(a)), jnp.ones(8)))
    # but clz, which XLA's constant folding gives as -32 where its kernel gives 0
    assert not folds_alike(_eqns(lax.clz, jnp.arange(-4, 4, dtype=jnp.int32)))


def _alike(fun, *args):
    jaxpr = jax.make_jaxpr(fun)(*args).jaxpr
    return folds_alike(jaxpr.eqns, True, GuardedDivisions(jaxpr))


def test_an_integer_division_folds_alike_where_its_divisor_cannot_be_zero():
    # XLA's kernels give x // 0 = -1 and x % 0 = x; its constant folding of either stops
    # the process (SIGFPE: jax.jit closed over x % 0, jaxlib 0.10.2), so it is left to it
    # only where the divisor is guarded from zero, as jnp.remainder guards its own
    i32 = jnp.arange(1, 5, dtype=jnp.int32)
    assert not _alike(lax.rem, i32, i32)
    assert not _alike(lax.div, i32, i32)
    assert not _alike(jnp.floor_divide, i32, i32)  # x // y divides by y as it is
    assert _alike(jnp.remainder, i32, i32)  # rem(x, where(y == 0, 1, y)), through _where's call
    assert _alike(lambda x, y: lax.div(x, jnp.where(y != 0, y, -1)), i32, i32)
    assert _alike(lambda x, y: lax.rem(x.reshape(2, 2), jnp.where(y == 0, 2, y).astype(jnp.int32).reshape(2, 2)),
                 i32, i32.astype(jnp.int8))
    assert _alike(lambda x: lax.div(x, 3) + lax.rem(x, jnp.full(4, 7)), i32)
    # the guard's test must be of the value it keeps, and its other case nonzero
    assert not _alike(lambda x, y: lax.rem(x, jnp.where(x == 0, 1, y)), i32, i32)
    assert not _alike(lambda x, y: lax.rem(x, jnp.where(y == 0, 0, y)), i32, i32)
    assert not _alike(lambda x, y: lax.rem(x, jnp.where(y == 1, 1, y)), i32, i32)
    assert not _alike(lambda x, y: lax.rem(x.astype(jnp.uint8), jnp.where(y == 0, 1, y).astype(jnp.uint8)),
                     i32, i32)  # 256 -> 0
    i8 = i32.astype(jnp.int8)
    assert not _alike(lambda x, y: lax.rem(x.astype(jnp.int4), jnp.where(y == 0, 1, y).astype(jnp.int4)),
                     i8, i8)  # 16 -> 0, in a type as many bytes wide
    # one body, called with a guarded divisor and with one that is not: not safe
    divide = jax.jit(lax.rem)
    assert not _alike(lambda x, y: divide(x, jnp.where(y == 0, 1, y)) + divide(x, y), i32, i32)
    assert _alike(lambda x, y: divide(x, jnp.where(y == 0, 1, y)) + divide(y, jnp.where(x == 0, 1, x)), i32, i32)
    # floats divide as XLA defines it either way: within a few ulps
    assert _alike(lax.div, i32 * 1.0, i32 * 1.0)


INT32 = np.iinfo(np.int32)
EDGES = [INT32.min, INT32.min + 1, -2, -1, 0, 1, 2, 5, INT32.max - 1, INT32.max]

#: a divisor of x and y (int32), and whether the pass may call it nonzero: by the range
#: of its elements, or by the comparison that selects it
DIVISORS = {
    "x - y where not x <= y": (lambda x, y: jnp.where(x <= y, 1, x - y), True),
    "x - y where x <= y": (lambda x, y: jnp.where(x <= y, x - y, 1), False),
    "x - y where not x < y": (lambda x, y: jnp.where(x < y, 1, x - y), False),
    "y - x where x < y": (lambda x, y: jnp.where(x < y, y - x, 1), True),
    "x - y where x > 2": (lambda x, y: jnp.where(x > 2, x - y, 1), False),
    "x - y as uint32 where x != y": (lambda x, y: jnp.where(x == y, 1, (x - y).astype(jnp.uint32)), True),
    "x - y as int8 where not x <= y": (lambda x, y: jnp.where(x <= y, 1, (x - y).astype(jnp.int8)), False),
    "clip(y, 1, 5)": (lambda x, y: jnp.clip(y, 1, 5), True),
    "clip(y, 0, 5)": (lambda x, y: jnp.clip(y, 0, 5), False),
    "clip(y, 0, 5) + 1": (lambda x, y: jnp.clip(y, 0, 5) + 1, True),
    "clip(y, 0, 5) - 10": (lambda x, y: jnp.clip(y, 0, 5) - 10, True),
    "y + 1": (lambda x, y: y + 1, False),  # INT32_MAX + 1 wraps to INT32_MIN, and -1 + 1 is 0
    "maximum(y, 1)": (lambda x, y: jnp.maximum(y, 1), True),
    "minimum(y, -1)": (lambda x, y: jnp.minimum(y, -1), True),
    "minimum(y, 0)": (lambda x, y: jnp.minimum(y, 0), False),
    "0 where y > INT32_MAX": (lambda x, y: jnp.where(y > INT32.max, 0, jnp.maximum(y, 1)), True),
    "0 where y >= INT32_MAX": (lambda x, y: jnp.where(y >= INT32.max, 0, jnp.maximum(y, 1)), False),
    "0 where y > INT32_MAX and x > 0": (lambda x, y: jnp.where((y > INT32.max) & (x > 0), 0, 3), True),
    "0 where y > INT32_MAX or x > 0": (lambda x, y: jnp.where((y > INT32.max) | (x > 0), 0, 3), False),
    "abs(y)": (lambda x, y: jnp.abs(y), False),
}


@pytest.mark.parametrize("name", DIVISORS)
def test_a_divisor_is_nonzero_by_its_range_or_by_the_comparison_that_selects_it(name):
    divisor, nonzero = DIVISORS[name]
    i32 = jnp.arange(1, 5, dtype=jnp.int32)
    assert _alike(lambda x, y: lax.rem(x, divisor(x, y).astype(jnp.int32)), i32, i32) == nonzero
    if nonzero:  # and it is, at the edges of int32 too
        x, y = (a.ravel() for a in np.meshgrid(np.array(EDGES, np.int32), np.array(EDGES, np.int32)))
        assert np.all(np.asarray(divisor(x, y)) != 0)


_COMPARE = {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal, "gt": jnp.greater,
            "ge": jnp.greater_equal}


def _divisors():
    """Integer expressions of ``x`` and ``y`` (int32), as JAX's programs guard and bound them:
    a ``where`` picks among its comparison's operands, their differences and other values,
    and bounds come from a few small values, so that ranges meet."""
    small = st.sampled_from([-2, -1, 0, 1, 2])
    leaves = st.sampled_from(["x", "y"]) | (small | st.sampled_from(EDGES)).map(lambda k: ("literal", k))

    def where(e):
        def cases(test):
            _, a, b = test
            related = st.sampled_from([("sub", a, b), ("sub", b, a), a, b, ("cast", ("sub", a, b), "uint32")])
            return st.tuples(st.just("where"), *map(st.just, test), related | e, related | e)
        return st.tuples(st.sampled_from(sorted(_COMPARE)), e, e).flatmap(cases)

    return st.recursive(leaves, lambda e: st.one_of(
        st.tuples(st.just("clip"), e, small | st.sampled_from(EDGES), small | st.sampled_from(EDGES)),
        st.tuples(st.sampled_from(["max", "min", "add", "sub"]), e, e),
        where(e),
        st.tuples(st.just("cast"), e, st.sampled_from(["int8", "int16", "uint8", "uint32"])),
        st.tuples(st.sampled_from(["abs", "neg"]), e),
    ), max_leaves=8)


def _evaluate(e, x, y, values=None):
    """``e`` of ``x`` and ``y``, each subexpression once (a program computes a value once
    and reads it where it needs it: a comparison's operands and their difference)."""
    values = {} if values is None else values
    if e in ("x", "y"):
        return x if e == "x" else y
    if e not in values:
        op, *args = e
        of = lambda a: _evaluate(a, x, y, values)
        if op == "literal":
            values[e] = np.int32(args[0])  # a literal of the program
        elif op == "clip":
            values[e] = jnp.clip(of(args[0]), np.int32(args[1]), np.int32(args[2]))
        elif op == "where":
            compare, a, b, then, other = args
            values[e] = jnp.where(_COMPARE[compare](of(a), of(b)), of(then), of(other))
        elif op == "cast":
            values[e] = jnp.asarray(of(args[0])).astype(args[1]).astype(jnp.int32)
        else:
            fun = {"max": jnp.maximum, "min": jnp.minimum, "add": jnp.add, "sub": jnp.subtract, "abs": jnp.abs,
                   "neg": jnp.negative}[op]
            values[e] = fun(*map(of, args))
    return values[e]


_OPERATOR = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
             "ge": operator.ge}


@pytest.mark.parametrize("name", sorted(_OPERATOR))
def test_what_a_comparison_says_holds_of_every_value(name):
    # a comparison decided by its operands' ranges has that value for all of theirs, and
    # where it is _DIFFER_WHERE's value, its operands differ
    compare, small = _OPERATOR[name], range(-3, 4)
    ranges = [(lo, hi) for lo in small for hi in small if lo <= hi]
    for ra, rb in itertools.product(ranges, ranges):
        values = {compare(a, b) for a in range(ra[0], ra[1] + 1) for b in range(rb[0], rb[1] + 1)}
        decided = _decided(name, ra, rb)
        assert decided is None or values == {decided}, (ra, rb)
        assert decided is not None or len(values) == 2, (ra, rb)  # as precise as ranges allow
    assert all(a != b for a in small for b in small if compare(a, b) == bool(_DIFFER_WHERE[name]))


@settings(max_examples=500, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(_divisors())
def test_a_divisor_said_nonzero_is_nonzero(divisor):
    # a division on constants that the pass lets XLA fold would stop the process on a zero
    # divisor (SIGFPE): whatever it says is nonzero must be, at the edges of int32 too
    def divide(x, y):
        return lax.rem(x, jnp.broadcast_to(_evaluate(divisor, x, y), x.shape).astype(jnp.int32))

    i32 = jnp.arange(1, 5, dtype=jnp.int32)
    if _alike(divide, i32, i32):
        grid = np.array([*EDGES, -129, 128, 255, 256, 65536], np.int32)  # and what narrower types wrap to 0
        x, y = (a.ravel() for a in np.meshgrid(grid, grid))
        values = np.asarray(jnp.broadcast_to(_evaluate(divisor, jnp.asarray(x), jnp.asarray(y)), x.shape))
        assert np.all(values != 0), (divisor, x[values == 0], y[values == 0])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.int16])
def test_randint_divides_by_a_span_that_cannot_be_zero(dtype):
    # select_n(o <= n, o - n, 1), plus one only where maxval is over the largest value of
    # the type the span is computed in: never for literal bounds within the type, nor for
    # int32's of any value. (JAX 0.7 computes a uint8's span in uint8, where maxval = 256
    # wraps it to zero: with such bounds as arguments, the division stays passed there.)
    key = jax.random.key(0)
    assert _alike(lambda k: jax.random.randint(k, (3,), -4, 9, dtype), key)
    if dtype == jnp.int32:
        for lo, hi in [(np.int32(-4), np.int32(9)), (np.zeros(3, np.int32), np.full(3, INT32.max, np.int32))]:
            assert _alike(lambda k, lo, hi: jax.random.randint(k, (3,), lo, hi), key, lo, hi)
