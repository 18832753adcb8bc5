"""Folding on the host: NumPy rules for primitives whose result it computes exactly.

Evaluated eagerly, each JAX primitive compiles an XLA program the first time
it meets a new shape, tens of milliseconds on a CPU. A fold of a TFC
program meets a hundred such pairs (broadcasts, transposes, products of a
basis with a coordinate, ...), whose compiles together would cost more than
compiling the whole function with ``jax.jit``. On a CPU
the arrays are NumPy's already, so the rules here evaluate those primitives
with NumPy instead: no compile, the same bits.

A rule exists only where NumPy's result is the one XLA gives, bit for bit:
data movement (broadcasts, reshapes, slices, concatenation, ...) on any
dtype; comparisons and selection; the correctly rounded IEEE operations
(``+ - *``, negation, ``max``, ``min``, conversions between floating types)
on floats, a sum with zeros being the other term itself; the same
operations on integers, which wrap on overflow in NumPy's array loops as
in XLA (``jnp.eye`` adds an offset to an ``iota``: otherwise a compile of
an ``add`` in ``jacfwd``), and their remainder but by 0 and -1; and a matrix
product with an identity matrix (``jacfwd``'s basis pushed through
``H @ xi``), which only moves the other operand, or with zeros. Not
division (XLA divides by a broadcast scalar through its reciprocal;
NumPy's integer division by zero is not XLA's), transcendental functions,
other contractions or reductions, whose XLA kernels round differently.
(XLA on a CPU flushes subnormal floats to zero; an operation that produces
one is the only difference left.)

:func:`on_host` returns ``None`` whenever a rule does not apply (another
backend, several devices, an unsupported dtype), and the caller binds the
primitive as it would without host rules. The table (:data:`HOST_RULES`) is
keyed by primitive, one rule each, as the fold rules are, and filled where they
are registered (:mod:`pejit._residual.rules.builtins`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat
from . import _device, _recycle
from ._primitives import CALLS, call_body
from ._values import bools_are_0_or_1

#: dtypes the rules take: NumPy's arithmetic on these is IEEE's (floats),
#: or they are only moved and compared
FLOATS = frozenset(map(np.dtype, ["float32", "float64"]))
DTYPES = FLOATS | frozenset(map(np.dtype, ["bool", "int8", "int16", "int32", "int64", "uint8", "uint32"]))

#: A primitive's host rule, ``rule(*arrays, **params)``: its result by NumPy, or
#: None where the rule declines these inputs. Registered with the primitive's
#: other facets (:func:`pejit._residual.rules.registry.register_primitive`); the
#: rules below are the built-in ones.
HOST_RULES: dict[Any, Callable[..., Any]] = {}


def elementwise(ufunc: Callable) -> Callable:
    """The rule of an elementwise primitive, where its parameters are trivial
    (``mul``'s ``out_dtype``, an ``accuracy``: None)."""

    def rule(*xs, **params):
        if any(v is not None for v in params.values()):
            return None
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        # the axes along which every operand is broadcast (a uniform array
        # along all of them): the work of one slice, broadcast
        spread = [d for d, n in enumerate(shape) if n > 1 and all(x.ndim == 0 or not x.strides[d] for x in xs)
                  ] if all(x.ndim in (0, len(shape)) for x in xs) else []
        if spread:
            one = tuple(slice(0, 1) if d in spread else slice(None) for d in range(len(shape)))
            return np.broadcast_to(ufunc(*(x if x.ndim == 0 else x[one] for x in xs)), shape)
        order = _layout(xs, shape) if _recycle.recycles(math.prod(shape) * max(x.itemsize for x in xs)) else None
        if order is None:
            return ufunc(*xs)
        return ufunc(*xs, out=_recycle.empty(shape, ufunc.resolve_dtypes((*(x.dtype for x in xs), None))[-1], order))

    return rule


def _layout(xs: Sequence[np.ndarray], shape: tuple[int, ...]) -> str | None:
    """The memory order NumPy gives an elementwise result of ``xs`` (its ``"K"``),
    where it is one of C's or Fortran's: Fortran's where each operand read
    whole is in Fortran's order alone (``jacfwd``'s tangents, transposed),
    C's where each is in C's; None otherwise."""
    whole = [x for x in xs if x.shape == shape and all(x.strides)]
    if whole and all(x.flags.f_contiguous and not x.flags.c_contiguous for x in whole):
        return "F"
    return "C" if all(x.flags.c_contiguous for x in whole) else None


def _uniform(x: np.ndarray) -> bool:
    """Whether ``x`` is one element broadcast (as a broadcast rule or the
    fold's compactor keeps a uniform array): derivative code computes on
    the zeros of its symbolic tangents, materialized; a PDE's fold adds,
    subtracts and transposes hundreds of large zero arrays, which XLA's
    simplifier removes from a compiled program."""
    return x.ndim > 0 and x.size > 0 and not any(x.strides)


def _element(x: np.ndarray) -> np.ndarray:
    return np.asarray(x[(0,) * x.ndim])


def _distinct(x: np.ndarray) -> np.ndarray:
    """``x`` without its broadcast axes (stride 0): each element once. A
    row of a constant broadcast along the unit vectors of ``jacfwd``, times
    another, is 3375 elements to read at 15^3 points, not 3.4 million."""
    if x.size == 0 or all(x.strides):
        return x
    return np.asarray(x[tuple(0 if stride == 0 else slice(None) for stride in x.strides)])


#: What the checks below found out about arrays, while a fold runs (see
#: :func:`remembering`); None outside one. A context variable, not a global:
#: folds on two threads must not end each other's (one that ended last would
#: leave the other's answers behind, for arrays the user may change).
_facts: contextvars.ContextVar[dict | None] = contextvars.ContextVar("_facts", default=None)
#: Arrays smaller than this are checked again: reading them costs less than remembering.
REMEMBER_BYTES = 2**16


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Within, each check of an array's values (finite, no ``-0.0``, rows of
    an identity) reads it once.

    Derivative code meets the same arrays again and again: ``jacfwd``'s identity
    matrix is checked by every product it feeds, and the same tangents for
    finiteness by every rule that reads them. A fold never writes into an array
    it holds, so what a check found stays true while the array lives; the user's
    arrays may change between folds, so nothing is kept past one.
    """
    token = _facts.set({}) if _facts.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _facts.reset(token)


def _remembered(check: Callable[[np.ndarray], Any]) -> Callable[[np.ndarray], Any]:
    """``check``, its answer for an array remembered while a fold runs, by the
    memory the array spans: a view taken again (``x.T``, a reshape) is found
    too. The answer is trusted only while the array that owns that memory
    is the one it was for (a weak reference: memory freed is reused)."""

    @functools.wraps(check)
    def remembered(x):
        facts = _facts.get()
        x = np.asarray(x)
        if facts is None or x.nbytes < REMEMBER_BYTES:
            return check(x)
        owner = root(x)
        key = (check, id(owner), x.__array_interface__["data"][0], x.shape, x.strides, x.dtype)
        known = facts.get(key)
        if known is not None and known[0]() is owner:
            return known[1]
        answer = check(x)
        facts[key] = (weakref.ref(owner), answer)
        return answer

    return remembered


def add_or_sub(ufunc: Callable) -> Callable:
    """The rule of ``add`` (``ufunc`` add) or ``sub`` (subtract): where a term
    (the subtrahend) holds only zeros, the other, not computed again.

    Derivative code adds the materialized zeros of symbolic tangents to its
    tangents, a PDE's fold hundreds of large sums with a zero term, each of
    which would otherwise write a copy. ``x + 0`` is ``x`` bit for bit but for
    ``-0.0 + +0.0``, which is ``+0.0``: so ``x`` is the sum where it holds no
    ``-0.0`` (one read, nothing written), or where the zero added is ``-0.0``
    (``x + -0.0`` is ``x``); ``+0.0`` added to only zeros is ``+0.0`` broadcast.
    (``x`` itself keeps a signaling NaN that the sum would make quiet.)
    """
    plain = elementwise(ufunc)
    subtract = ufunc is np.subtract

    def rule(a, b, **params):
        shape, dtype = np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b)
        for x, zero in ((a, b),) if subtract else ((a, b), (b, a)):
            if x.shape != shape or x.dtype != dtype or not only_zeros(zero, zero.size):
                continue
            # the sign of the zero added, where it is one element
            added = bool(np.signbit(_element(zero))) != subtract if zero.size == 1 or _uniform(zero) else None
            if added or x.dtype not in FLOATS or _no_negative_zero(x):  # an integer has one zero
                return x
            if added is False and only_zeros(x, x.size):
                return np.broadcast_to(dtype.type(0), shape)
        return plain(a, b, **params)

    return rule


@_remembered
def _no_negative_zero(x: np.ndarray) -> bool:
    """Whether ``x`` (floats) holds no ``-0.0``: its bits as integers are the
    smallest integer only there (one read, no array written)."""
    x = _distinct(x)
    if x.size == 0:
        return True
    ints = x.view(np.dtype(f"int{8 * x.itemsize}"))
    return int(ints.min()) != np.iinfo(ints.dtype).min


def rem(x, y, **params):
    """Integer ``rem``: C's remainder, the dividend's sign, in NumPy's ``fmod`` as
    in XLA. Not by zero or by -1 (``INT_MIN % -1`` overflows), whose results
    are the back end's own; not on floats, which XLA may compute otherwise.
    ``jnp.remainder`` (``jnp.take``'s wrapped indices, MJX's tree indexing)
    is ``rem`` and moves: covered, its call compiles nothing."""
    if x.dtype in FLOATS or y.dtype in FLOATS or np.any(y == 0) or (y.dtype.kind == "i" and np.any(y == -1)):
        return None
    return elementwise(np.fmod)(x, y, **params)


def select_n(which, *cases):
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0]) if len(cases) == 2 else None
    return np.choose(which, cases)


def convert_element_type(x, *, new_dtype, **_):
    new = np.dtype(new_dtype)
    if new not in DTYPES:
        return None
    if x.dtype in FLOATS and new not in FLOATS:
        return None  # float to int or bool: NumPy's rules for NaN and overflow are not XLA's
    if not bools_are_0_or_1([x]):
        return None  # a bool byte other than 0 or 1 (a view of other bits): NumPy makes it 1, XLA keeps it
    return x.astype(new)


def broadcast_in_dim(x, *, shape, broadcast_dimensions, **_):
    kept = [1] * len(shape)
    for d, n in zip(broadcast_dimensions, x.shape):
        kept[d] = n
    return np.broadcast_to(x.reshape(kept), shape)


def reshape(x, *, new_sizes, dimensions=None, **_):
    return None if dimensions is not None else x.reshape(new_sizes)


def transpose(x, *, permutation):
    return np.transpose(x, permutation)


def squeeze(x, *, dimensions):
    return np.squeeze(x, tuple(dimensions))


def concatenate(*xs, dimension):
    return np.concatenate(xs, dimension)


def rev(x, *, dimensions):
    return np.flip(x, tuple(dimensions)) if dimensions else x


def copy(x):
    return x


def slice_(x, *, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(a, b, s) for a, b, s in zip(start_indices, limit_indices, strides))]


def dynamic_slice(x, *starts, slice_sizes):
    index = []
    for start, size, n in zip(starts, x.shape, slice_sizes):
        start = min(max(int(start), 0), size - n)  # XLA clamps the slice into the operand
        index.append(slice(start, start + n))
    return x[tuple(index)]


def iota(*, dtype, shape, dimension, **_):
    if np.dtype(dtype) not in DTYPES:
        return None
    line = np.arange(shape[dimension], dtype=dtype).reshape([-1 if d == dimension else 1 for d in range(len(shape))])
    return np.broadcast_to(line, shape)


def dot_general(lhs, rhs, *, dimension_numbers, preferred_element_type=None, **_):
    """A product with an identity matrix (see :func:`times_identity`) or with zeros.

    ``jax.jacfwd`` pushes the identity through every ``H @ xi`` of a
    function linear in ``xi``: a PDE's fold computes hundreds of such large
    products, a large share of its time. Its derivative code also
    multiplies by the zeros of symbolic tangents, materialized: the product
    of finite values with zeros is zeros, ``+0.0`` as XLA's sums give it,
    and stays one zero broadcast (see :func:`_uniform`).
    """
    (lc, rc), (lb, rb) = dimension_numbers
    if lhs.dtype not in FLOATS or rhs.dtype not in FLOATS:
        return None  # the shortcuts below reason about IEEE floats
    if lhs.dtype != rhs.dtype or (preferred_element_type is not None
                                  and np.dtype(preferred_element_type) != lhs.dtype):
        return None
    for zero, other in ((lhs, rhs), (rhs, lhs)):
        if only_zeros(zero, other.size) and all_finite(other):
            free = [[x.shape[d] for d in range(x.ndim) if d not in c and d not in b]
                    for x, c, b in ((lhs, lc, lb), (rhs, rc, rb))]
            return np.broadcast_to(np.zeros((), lhs.dtype), [lhs.shape[d] for d in lb] + free[0] + free[1])
    if lb or rb or len(lc) != 1:
        return None
    left, right = np.moveaxis(lhs, lc[0], -1), np.moveaxis(rhs, rc[0], 0)
    out = times_identity(left.reshape(-1, left.shape[-1]), right.reshape(right.shape[0], -1))
    return None if out is None else out.reshape(left.shape[:-1] + right.shape[1:])


@_remembered
def all_finite(x: Any) -> bool:
    """Whether ``x`` holds only finite values: one read where its sum is
    finite (then so is every term), each element tested only where it is not."""
    x = _distinct(np.asarray(x))
    return bool(np.isfinite(x.sum()) or np.isfinite(x).all())


def only_zeros(x: np.ndarray, budget: int) -> bool:
    """Whether ``x`` holds only zeros (of either sign), read whole only if it
    is at most ``budget`` elements, and after a few elements say it might."""
    x = _distinct(x)
    if x.size > budget or x.size and (x.flat[0] or x.flat[-1] or x.flat[x.size // 2]):
        return False
    return not x.any()


def times_identity(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a @ b`` where one of the matrices is rows (``a``) or columns
    (``b``) of an identity matrix: the matching rows or columns of the
    other, else None.

    ``jax.jacfwd`` pushes the whole identity through a product; the affine
    collapse's Jacobian pushes its unit vectors a batch at a time (on a large
    PDE, such products would otherwise be most of the collapse's work).
    Each entry is ``x * 1`` plus zeros, exactly ``x``, unless
    the other matrix holds an infinity or a NaN (``inf * 0`` is NaN): then
    it is None too. ``+ 0`` gives the zero a sum
    gives, ``+0.0``: the other matrix's entries themselves where they hold
    no ``-0.0``.
    """
    for unit, other, right in ((b, a, True), (a, b, False)):
        lo = _identity_rows(unit.T if right else unit)
        if lo is not None and all_finite(other):
            k = unit.shape[1] if right else unit.shape[0]
            part = other[:, lo:lo + k] if right else other[lo:lo + k]
            if _uniform(other):
                return np.broadcast_to(_element(other) + other.dtype.type(0), part.shape)
            return part if _no_negative_zero(part) else np.add(part, other.dtype.type(0), order="C")
    return None


@_remembered
def _identity_rows(m: np.ndarray) -> int | None:
    """``lo`` where ``m`` is the rows ``lo:lo + len(m)`` of an identity matrix, else None."""
    if m.ndim != 2 or not m.size or m.shape[0] > m.shape[1]:
        return None
    k, lo = m.shape[0], int(np.argmax(m[0] != 0))
    if lo + k > m.shape[1] or np.count_nonzero(m) != k or not (np.diagonal(m, lo) == 1).all():
        return None
    return lo


def split(x, *, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def stack(*xs, axis):
    return np.stack(xs, axis)


def unstack(x, *, axis):
    return list(np.moveaxis(x, axis, 0))


def on_host(prim, args: Sequence[Any], params: dict) -> Any:
    """``prim`` on concrete ``args`` by its host rule, or None where none applies.

    A nested ``jax.jit`` call (``jnp.multiply`` is one) is evaluated
    equation by equation when rules cover its whole body, as JAX's eager
    mode would run it without the ``jit``: compiling it would cost more
    than everything it computes.
    """
    if prim.name in CALLS:
        return _call(*call_body(params), args)
    rule = HOST_RULES.get(prim)
    if rule is None or not _device.host_computes():
        return None
    host = []
    for a in args:
        if type(a) is bool:  # a Python bool is JAX's bool, never weakly typed
            host.append(np.bool_(a))
            continue
        dtype = getattr(a, "dtype", None)  # a Python number: its dtype is the aval's, not NumPy's
        if dtype is None or dtype not in DTYPES or isinstance(a, _compat.Tracer):
            return None
        host.append(np.asarray(a))
    out = rule(*host, **params)
    if out is None:
        return None
    return [_owned(o) for o in out] if prim.multiple_results else _owned(out)


def covers_equation(prim, params: dict) -> bool:
    """Whether rules cover an equation of ``prim`` (a call: its whole body)."""
    return covers(call_body(params)[0]) if prim.name in CALLS else prim in HOST_RULES


def covers(jaxpr) -> bool:
    """Whether rules cover every equation of ``jaxpr``, calls' bodies too
    (a rule may still decline some inputs: a dtype it does not know)."""
    return jaxpr is not None and all(covers_equation(e.primitive, e.params) for e in jaxpr.eqns)


def _call(jaxpr, consts, args) -> list[Any] | None:
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(a):
        return np.asarray(a.val, a.aval.dtype) if isinstance(a, _compat.Literal) else env[a]

    last = {a: i for i, e in enumerate(jaxpr.eqns) for a in e.invars if isinstance(a, _compat.Var)}
    outputs = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}  # not literals: unhashable
    for i, eqn in enumerate(jaxpr.eqns):
        outs = on_host(eqn.primitive, [read(a) for a in eqn.invars], eqn.params)
        if outs is None:
            return None
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
        for a in eqn.invars:  # the body's intermediates are freed as the fold's are
            if isinstance(a, _compat.Var) and last[a] == i and a not in outputs:
                env.pop(a, None)
    return [read(v) for v in jaxpr.outvars]


def _owned(x) -> np.ndarray:
    """``x`` as an array of its own, as XLA's result would be: a view (a
    transpose, a slice) would keep its whole source alive past the source's
    last use and defeat the fold's liveness; a broadcast stays one (it holds
    only its small source)."""
    x = np.asarray(x)
    if _holds_its_memory(x) or 0 in x.strides or _whole(x):
        return x
    return np.array(x, order="C")


def _whole(x: np.ndarray) -> bool:
    """Whether the view ``x`` spans all of the NumPy array it views (a
    transpose, a reshape): it keeps nothing alive but itself."""
    owner = root(x)
    return owner is not x and _holds_its_memory(owner) and owner.nbytes == x.nbytes


def _holds_its_memory(x: np.ndarray) -> bool:
    """Whether ``x`` keeps alive no memory but its own: it views no other NumPy array
    (its own memory, recycled memory), or all of another object's buffer
    (``np.asarray`` of a ``jax.Array``, which XLA computed on the host)."""
    base = x.base
    return _recycle.owns(x) or (isinstance(base, memoryview) and base.nbytes == x.nbytes)


def root(x: np.ndarray) -> np.ndarray:
    """The NumPy array that ``x`` views, through views of views (``x`` if it views
    none): an array in recycled memory (see :mod:`pejit._fold._recycle`) is its own,
    so what is remembered of it dies with it."""
    while isinstance(x.base, np.ndarray) and not _recycle.owns(x):
        x = x.base
    return x


def to_jax(x: Any) -> Any:
    """``x``, a host rule's NumPy result made a ``jax.Array`` (for a trace
    that stages it: JAX takes no NumPy constants there)."""
    return jax.device_put(x) if isinstance(x, (np.ndarray, np.generic)) else x


#: NumPy values up to this size are put on the device once per fold (see :func:`to_jax_once`).
PUT_ONCE_BYTES = 2**16


def to_jax_once(x: Any, puts: dict) -> Any:
    """:func:`to_jax` of ``x``, the same ``jax.Array`` for equal small NumPy
    values: ``puts`` (one per fold) holds them by content. A fold meets the
    same few again and again (the zeros and ones its trace makes, the grid
    its kernels read, handed to each of them), and each ``device_put`` costs
    about as much as a small kernel."""
    if not isinstance(x, (np.ndarray, np.generic)) or x.nbytes > PUT_ONCE_BYTES:
        return to_jax(x)
    key = (x.dtype, x.shape, x.tobytes())
    put = puts.get(key)
    if put is None:
        put = puts[key] = to_jax(x)
    return put
