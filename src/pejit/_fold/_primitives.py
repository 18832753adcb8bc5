"""Tables of primitives by kind, shared by the folding policy and its back end.

:class:`~pejit._fold._folding.Folder` keeps cheap expansions lazy;
:mod:`pejit._fold._batch` fuses them into compiled batches; :mod:`pejit._fold._cost`
counts elementwise work. Each reads its kinds here.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Container, Iterator, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import dtypes
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal
from jax.extend.core import primitives as P

from .. import _compat

#: Primitives that only move, replicate or create data cheaply: folding them
#: can blow a small known value up into a large constant.
EXPANSIONS = frozenset(
    [
        P.broadcast_in_dim_p,
        P.iota_p,
        P.reshape_p,
        P.squeeze_p,
        P.transpose_p,
        P.convert_element_type_p,
        P.concatenate_p,
        P.pad_p,
        P.rev_p,
        P.select_n_p,
        P.copy_p,
    ]
)

#: Elementwise primitives: on a lazy input they stay lazy, since recomputing
#: them in the residual program costs about as much as reading a folded
#: constant of the same size.
ELEMENTWISE = frozenset(
    [
        P.abs_p, P.acos_p, P.acosh_p, P.add_p, P.and_p, P.asin_p, P.asinh_p,
        P.atan2_p, P.atan_p, P.atanh_p, P.cbrt_p, P.ceil_p, P.clamp_p,
        P.complex_p, P.conj_p, P.cos_p, P.cosh_p, P.div_p, P.eq_p, P.exp2_p,
        P.exp_p, P.expm1_p, P.floor_p, P.ge_p, P.gt_p, P.imag_p,
        P.integer_pow_p, P.is_finite_p, P.le_p, P.log1p_p, P.log_p,
        P.logistic_p, P.lt_p, P.max_p, P.min_p, P.mul_p, P.ne_p, P.neg_p,
        P.not_p, P.or_p, P.pow_p, P.real_p, P.rem_p, P.round_p, P.rsqrt_p,
        P.sign_p, P.sin_p, P.sinh_p, P.sqrt_p, P.square_p, P.sub_p, P.tan_p,
        P.tanh_p, P.xor_p,
    ]
)

#: Primitives that XLA fuses with the producers of their operands: an
#: expansion read only by them is recomputed inside their loop, for free.
#: Any other consumer (``dot_general``, custom calls such as LAPACK's, loops,
#: calls) reads its operands from memory, so the expansion would be written
#: out and read back on every call, and is stored instead. (On a CPU, for an
#: expansion like TFC's basis tangents ``zeros + H * ones``: feeding a
#: ``dot_general``, recomputing costs several times reading a stored
#: constant; feeding an ``add``, a little less than reading it.)
FUSES_OPERANDS = ELEMENTWISE | EXPANSIONS | frozenset(
    [
        P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p,
        P.reduce_and_p, P.reduce_or_p, P.argmax_p, P.argmin_p,
        P.slice_p, P.dynamic_slice_p,
    ]
)

#: Fusible primitives that a fused run must start with, by name: XLA:CPU
#: evaluates these trigonometric functions a few times more slowly when
#: their input is computed in the same fused loop (a chain of ``sin(cos(c) *
#: a + b)`` steps as one program against one program per step), and at least
#: as fast as standalone kernels when the loop starts at them. See
#: :func:`pejit._fold._plan.plan_batch`.
FUSED_FIRST = frozenset(["sin", "cos", "tan"])

#: Primitives that run Python the program may never run: folded only where the
#: program surely runs them, not in a branch or a while loop's body, whose known
#: work is hoisted whether it runs or not (Equinox's error checks raise there).
CALLBACKS = frozenset(["pure_callback"])

#: JAX's custom-derivative calls, by name (their bodies close over Python functions).
CUSTOM_CALLS = frozenset(["custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"])

#: Call-like primitives, by name: fusible when everything they call is.
CALLS = frozenset(["jit", "pjit", "closed_call", "known_part", "folded_batch"])


#: Primitives whose result is the same bits however it is computed: data movement,
#: bit reinterpretation, shifts and counts of set bits, comparisons and selection,
#: the correctly rounded IEEE ``+ - *``, ``max`` and ``min`` (their reductions,
#: windows, cumulative forms and scatters too, and the index of a minimum or maximum:
#: no order of them changes the result but for the sign of a zero, below), rounding
#: to integers, a float's neighbour (``nextafter``), integer and bitwise arithmetic
#: (which wraps), and the counter-based PRNG (integer arithmetic). XLA's constant
#: folding, an interpreter, computes them as its compiled kernels do (see :func:`folds_alike`);
#: not so a sum or a product of floats (the order of their additions), or even
#: ``clz`` (the corpus's ``lax.clz`` folded to -32 where ``jax.jit``'s kernel
#: gives 0), nor an integer ``div`` or ``rem`` but where its divisor cannot be
#: zero: XLA's kernels divide by zero as XLA defines it (-1, and the dividend), its
#: constant folding stops the process (SIGFPE, jaxlib 0.10.2: ``jax.jit`` closed
#: over ``x % 0``; see :mod:`pejit._fold._nonzero`). As
#: :mod:`pejit._fold._host` says of its rules, a subnormal float, which a CPU's
#: kernels flush to zero, is one difference; the other is which zero an extremum of
#: ``0.0`` and ``-0.0`` keeps (equal under ``==``): the first it meets, in XLA's
#: order, which its constant folding and its kernels do not share (jaxlib 0.10.2,
#: ``jax.jit`` closed over against passed: 8-20 of 60 arrays holding both zeros
#: for ``reduce_max``, ``reduce_min``, ``cummax``; never for elementwise ``max``).
#: Smaller than :data:`FEW_ULPS`' differences, it is left to XLA as they are:
#: ``jax.jit`` closed over the constants gives the same.
EXACT = frozenset([
    "abs", "add", "add_any", "and", "argmax", "argmin", "bitcast_convert_type", "broadcast_in_dim", "ceil", "clamp",
    "concatenate", "convert_element_type", "copy", "copy_p", "cummax", "cummin", "device_put", "dynamic_slice",
    "dynamic_update_slice", "eq", "floor", "gather", "ge", "gt", "iota", "is_finite", "le", "lt", "max", "min",
    "mul", "ne", "neg", "nextafter", "not", "or", "pad", "population_count", "random_bits", "random_fold_in",
    "random_seed", "random_split", "random_unwrap", "random_wrap", "reduce_and", "reduce_max", "reduce_min",
    "reduce_or", "reduce_window_max", "reduce_window_min", "reshape", "rev", "round", "scatter-max", "scatter-min",
    "select_n", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "slice", "split", "squeeze",
    "stack", "stop_gradient", "sub", "threefry2x32", "tile", "transpose", "unstack", "xor",
])

#: Sums and products, exact on integers and booleans alone: addition that wraps is
#: associative, so no order of it changes the result. On floats the order is XLA's
#: own (a ``cumlogsumexp`` is a sum of exponentials; ``inf`` plus ``-inf`` against an
#: overflow), as :func:`folds_alike`'s ``rounding`` allows.
EXACT_ON_INTEGERS = frozenset([
    "cumlogsumexp", "cumprod", "cumsum", "dot_general", "reduce_prod", "reduce_sum", "reduce_window_sum",
    "reduce_xor", "scatter-add", "scatter-mul", "scatter-sub",
])

#: Divisions: of integers, exact where the divisor cannot be zero (see :data:`EXACT`).
DIVISIONS = frozenset(["div", "rem"])

#: Scatters that replace: where two updates write one element, which of them is
#: left is the implementation's (XLA's semantics), exact where the indices are
#: unique (``unique_indices``); with ``rounding``, left to XLA as a sum's order is.
REPLACES = frozenset(["scatter"])

#: Elementwise functions of real floats that XLA's constant folding (the C
#: library's, correctly rounded or within an ulp) and its compiled kernels
#: (vectorized approximations) compute to within a few ulps of each other, as
#: JAX's eager and jitted evaluations of them differ (docs/numerics.md): each
#: element is one function of its operands, so no order of operations is left
#: to differ, and compiled in, a constant's ``exp`` is what ``jax.jit`` gives an
#: array its function closes over.
FEW_ULPS = frozenset([
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "cos", "cosh", "div", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "integer_pow", "log", "log1p", "logistic", "pow", "rsqrt", "sin", "sinh", "sqrt",
    "square", "tan", "tanh",
])


def is_var(a) -> bool:
    """Whether ``a``, an equation's input or a recipe's, is a ``Var`` (not a literal, not a value)."""
    return isinstance(a, _compat.Var)


def custom_calls(jaxpr) -> int:
    """How many custom_jvp/custom_vjp calls ``jaxpr`` makes, its sub-jaxprs' included."""
    n = 0
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        n += eqn.primitive.name in CUSTOM_CALLS
        n += sum(map(custom_calls, subjaxprs(eqn.params)))
    return n


def subjaxprs(params: dict):
    """The jaxprs among an equation's ``params`` (a loop's body, a cond's branches, a call's body)."""
    for v in params.values():
        for sub in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(sub, (Jaxpr, ClosedJaxpr)):
                yield sub


def all_eqns(jaxpr) -> Iterator[Any]:
    """Each equation of ``jaxpr`` (open or closed) and of its sub-jaxprs, each distinct
    sub-jaxpr once: ``jax.jit``'s trace gives every call of one function on the same
    types the same body (``jnp`` functions, a model's layers), which a walk call by call
    visits again for each.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> f = jax.jit(jnp.sin)
      >>> closed = jax.make_jaxpr(lambda x: f(f(x)))(1.0)
      >>> [e.primitive.name for e in all_eqns(closed)][2:]  # two calls, then their one body
      ['sin']
    """
    seen: set[int] = set()
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    while stack:
        j = stack.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        for eqn in j.eqns:
            yield eqn
            stack.extend(getattr(sub, "jaxpr", sub) for sub in subjaxprs(eqn.params))


def called_jaxpr(prim, params: dict):
    """The (open) jaxpr a call-like primitive of :data:`CALLS` runs; None for others."""
    return call_body(params)[0] if prim.name in CALLS else None


def call_body(params: dict) -> tuple:
    """``(jaxpr, consts)`` of the body a call's ``params`` hold (``jaxpr`` or ``call_jaxpr``)."""
    body = params.get("jaxpr") or params.get("call_jaxpr")
    return getattr(body, "jaxpr", body), getattr(body, "consts", ())


def folds_alike(eqns: Sequence[Any], rounding: bool = False, guarded: Container = ()) -> bool:
    """Whether XLA's constant folding computes ``eqns`` (of a call or a custom rule's
    call: its body's) as its kernels do: each equation is of an :data:`EXACT`
    primitive, or of an :data:`EXACT_ON_INTEGERS` one on no floats (with
    ``rounding``, on floats too: the same sum, rounded in another order), or a
    scatter that replaces (:data:`REPLACES`) at unique indices (with ``rounding``,
    at any), or an integer division among those ``guarded`` (whose divisor cannot
    be zero: :class:`pejit._fold._nonzero.GuardedDivisions`), or of a
    :data:`FEW_ULPS` one on real floats alone, or a sort of one operand (equal
    elements are equal, whatever their order) or a stable sort (equal keys keep
    their order: ``argsort``, ``random.permutation``); but a conversion of floats to
    integers (out of range, each implementation's own), and none of types narrower
    than a byte, which XLA's constant folding packs its own way (a ``float32``
    bitcast to ``uint4`` folds to other nibbles than its kernel gives: JAX's
    ``testBitcastConvertType``; so does ``jax.jit`` closed over the value).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> folds_alike(jax.make_jaxpr(jnp.nanmin)(jnp.ones(3)).eqns)
      True
      >>> folds_alike(jax.make_jaxpr(jax.nn.relu)(jnp.ones(3)).eqns)  # a custom_jvp_call of a max
      True
      >>> folds_alike(jax.make_jaxpr(jnp.exp)(jnp.ones(3)).eqns)  # within a few ulps
      True
      >>> folds_alike(jax.make_jaxpr(jnp.sum)(jnp.ones(3)).eqns)  # in its own order of additions
      False
      >>> folds_alike(jax.make_jaxpr(jnp.sum)(jnp.ones(3)).eqns, rounding=True)
      True
      >>> folds_alike(jax.make_jaxpr(jnp.sum)(jnp.ones(3, int)).eqns)
      True
      >>> twice = jax.make_jaxpr(lambda x: x.at[jnp.array([0, 0])].set(2.0))(jnp.ones(3))  # which write is left: XLA's
      >>> folds_alike(twice.eqns), folds_alike(twice.eqns, rounding=True)
      (False, True)
    """
    for e in eqns:
        name = e.primitive.name
        if sub_byte(e):
            return False
        if name in CALLS or name in CUSTOM_CALLS:
            body = call_body(e.params)[0]
            if body is None or not folds_alike(body.eqns, rounding, guarded):
                return False
        elif name in EXACT_ON_INTEGERS:
            if not rounding and any(_inexact(v) for v in (*e.invars, *e.outvars)):
                return False
        elif name in REPLACES:
            if not rounding and not e.params.get("unique_indices"):
                return False
        elif name in DIVISIONS and not _inexact(e.outvars[0]):
            if e not in guarded:
                return False
        elif name == "sort":
            if len(e.invars) != 1 and not e.params["is_stable"]:
                return False
        elif name in FEW_ULPS:
            if not all(dtypes.issubdtype(v.aval.dtype, np.floating) for v in (*e.invars, *e.outvars)):
                return False
        elif name not in EXACT or name == "convert_element_type" and _inexact(e.invars[0]) and not _inexact(
                e.outvars[0]):
            return False
    return True


def _inexact(v) -> bool:
    return dtypes.issubdtype(v.aval.dtype, np.inexact)  # (JAX's: it knows a key's dtype)


def sub_byte(eqn) -> bool:
    """Whether ``eqn`` reads or writes a type narrower than a byte (``int4``,
    ``float4_e2m1fn``): XLA's constant folding packs those its own way, even from
    literals alone (see :func:`folds_alike`)."""
    return any(map(_sub_byte, (*eqn.invars, *eqn.outvars)))


def _sub_byte(v) -> bool:
    return _narrower_than_a_byte(v.aval.dtype)


@functools.cache
def _narrower_than_a_byte(dtype) -> bool:
    if getattr(dtype, "itemsize", 1) > 1:  # (no finfo to build: a first one is tens of microseconds)
        return False
    if dtypes.issubdtype(dtype, np.integer):
        return jnp.iinfo(dtype).bits < 8
    return dtypes.issubdtype(dtype, np.floating) and jnp.finfo(dtype).bits < 8


def fusible(prim, params: dict) -> bool:
    """Whether XLA fuses ``prim`` with its neighbours at a profit (a call: all it calls)."""
    if prim.name in CALLS:
        inner = called_jaxpr(prim, params)
        return inner is not None and all(fusible(e.primitive, e.params) for e in inner.eqns)
    return prim in ELEMENTWISE or prim in EXPANSIONS


def fused_first(prim, params: dict) -> bool:
    """Whether a fused run starts at this equation: it binds one of :data:`FUSED_FIRST`, a call in its body."""
    body = called_jaxpr(prim, params)
    if body is None:
        return prim.name in FUSED_FIRST
    return any(fused_first(e.primitive, e.params) for e in body.eqns)


def params_key(params: dict) -> tuple:
    """An equation's parameters as part of a key (they are hashable where JAX caches by them).

    A called jaxpr counts by its structure (:func:`jaxpr_key`), not by
    identity: JAX's transformations give each call a body of its own, so
    that ``jnp.multiply`` of TFC's basis by the same weights, once in a
    derivative and once in the function itself, reads as two calls of two
    bodies, and the fold would compute it twice and hold the basis in between.
    """
    return tuple(sorted([(k, _by_structure(v)) for k, v in params.items()]))


_JAXPRS = (Jaxpr, ClosedJaxpr)


def _by_structure(v):
    # plain loops: a fold keys every equation by its parameters (a ``jnp``
    # call's are eleven), and generators doubled the cost
    if isinstance(v, _JAXPRS):
        return jaxpr_key(v)
    if type(v) is tuple:
        for x in v:
            if isinstance(x, _JAXPRS):  # cond's branches
                return tuple(map(_by_structure, v))
    return v


class _Structure:
    """A jaxpr's structure as a key: equal for equal programs, its hash computed once."""

    __slots__ = ("key", "hash")

    def __init__(self, key: tuple):
        self.key, self.hash = key, hash(key)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Structure) and self.hash == other.hash and self.key == other.key


_STRUCTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def literal_key(literal: Literal) -> tuple:
    """A jaxpr literal as a key: its type and its bits (``0.0`` and ``-0.0`` differ, a NaN equals itself)."""
    return ("literal", literal.aval, np.asarray(literal.val).tobytes())


def jaxpr_key(jaxpr):
    """``jaxpr`` (open or closed) as a key equal for any jaxpr that computes the same
    the same way: its equations (primitives, parameters, which values they read,
    literals by their bits) and types, up to the names of its variables, and
    not its source information. A closed jaxpr with constants, and one whose
    parameters cannot be hashed, is its own key (identity).

    Examples:
      >>> import jax
      >>> from pejit._fold._primitives import jaxpr_key
      >>> a, b = (jax.make_jaxpr(lambda x: x * 2.0)(1.0) for _ in range(2))
      >>> a is b, jaxpr_key(a) == jaxpr_key(b), jaxpr_key(a) == jaxpr_key(jax.make_jaxpr(lambda x: x * 3.0)(1.0))
      (False, True, False)
    """
    key = _STRUCTURES.get(jaxpr)
    if key is None:
        if getattr(jaxpr, "consts", ()):
            return jaxpr
        try:
            key = _Structure(_structure(getattr(jaxpr, "jaxpr", jaxpr)))
        except TypeError:  # an unhashable parameter inside
            return jaxpr
        _STRUCTURES[jaxpr] = key  # not the jaxpr itself: a value holding its key would keep it alive
    return key


def _structure(jaxpr) -> tuple:
    names: dict = {}

    def define(vs) -> tuple:
        for v in vs:
            names[v] = len(names)
        return tuple(v.aval for v in vs)

    def atom(a):
        return literal_key(a) if isinstance(a, Literal) else names[a]

    head = (define(jaxpr.constvars), define(jaxpr.invars))
    eqns = tuple(
        (e.primitive, params_key(e.params), tuple(map(atom, e.invars)), define(e.outvars), frozenset(e.effects))
        for e in jaxpr.eqns
    )
    return head, eqns, tuple(map(atom, jaxpr.outvars)), frozenset(jaxpr.effects)


def prune(jaxpr: Jaxpr, consts: Sequence[Any]) -> tuple[Jaxpr, list[Any]]:
    """Drop dead equations (e.g. unused lazy expansions) and unused constants.

    ``jaxpr`` is open (its leading inputs are ``consts``). Effectful
    equations are kept; every other input is kept, so the signature does
    not change.
    """
    n = len(consts)
    keep = [False] * n + [True] * (len(jaxpr.invars) - n)
    dced, used = _compat.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=keep)
    return dced, [c for c, u in zip(consts, used[:n]) if u]
