"""Cache keys: which specialization a call selects.

Two keys describe the constants of a call:

* the *value key* selects a specialization. ``jax.Array`` leaves are
  immutable, so they are keyed by identity (the cache watches them with weak
  references and drops the entry when they die, so an identity is never
  recycled into a stale hit). NumPy arrays are mutable, so they are keyed by
  content (a digest of their bytes): mutating one re-specializes and never
  returns a stale result. Read-only NumPy arrays whose memory nobody can
  write (every base read-only too) are keyed by identity, as ``jax.Array``
  leaves are: that is the cheap path for large NumPy constants
  (``a.flags.writeable = False``). Every other leaf (Python scalars,
  strings, callables, ...) is keyed by type and value and must be hashable.
* the *structure key* selects a value-independent template (shapes, dtypes
  and shardings of the array leaves, values of the others): a new value with
  the same structure re-specializes by running the template's compiled
  folding program.

A call computes the value key only when the call path's memo misses. A memo
entry holds the constants it was made for, and its guard (:func:`unchanged`)
checks that the writable NumPy arrays among them still hold the same bytes,
by comparing them with a copy, which costs less per call than hashing them.

A call's whole key is a :class:`CallKey`: the value key of its constants,
the types of its dynamic arguments, and the named axes it runs under.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import hashlib
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _compat
from .._fold import _libc
from .._fold._values import byte_view


class TracedConstant(Exception):
    """A constant argument is a tracer of an outer transformation."""


class OtherSignature(TypeError):
    """A residual program called with dynamic arguments of types it was not traced for.

    The call path hands a call straight to the residual of the last
    specialization of its constants, and lets ``jax.jit``'s dispatch check the
    dynamic arguments: on a type it has not compiled for, ``jax.jit`` traces
    the runner again, and the runner raises this instead of running a residual
    folded for other types. The call path then specializes anew; a user
    calling ``Specialization.call`` directly sees it as a ``TypeError``.
    """


_flatten = jax.tree_util.tree_flatten


class CallKey(NamedTuple):
    """The key of a call's specialization.

    ``constants``: the value keys of the constant (and static) arguments, by
    position, then ``(KEYWORDS, ((name, key), ...))`` if any was given by
    keyword (:func:`constants_key`). It is the part the generated dispatcher
    recognizes by identity, and the part the cache indexes: the call path
    first tries the specialization last used with these constants, whose
    ``jax.jit`` dispatch checks the rest.
    ``types``: the dynamic arguments' types, by position, then by keyword
    (:func:`types_key`).
    ``axes``: the named axes the call runs under (``_compat.axis_env_key()``;
    ``()`` outside a ``vmap`` with an axis name): a function may read them,
    and folding evaluates what it reads, so they select a specialization, as
    they select ``jax.jit``'s executable.
    """

    constants: tuple
    types: tuple
    axes: tuple


class KEYWORDS:
    """Tags the constant keywords' part of :attr:`CallKey.constants`."""


def constants_key(const: tuple[int, ...], fixed_names: frozenset[str], args: tuple, kwargs: dict) -> tuple:
    """:attr:`CallKey.constants` of a call: the values at the positions ``const``
    (a ``jax.Array`` by identity), in order, then the keywords in ``fixed_names``.

    Raises :class:`TracedConstant` for a constant that is a tracer.
    """
    key = [constant_key(i, args[i]) for i in const]
    if kwargs:
        named = sorted((k, constant_key(k, v)) for k, v in kwargs.items() if k in fixed_names)
        if named:
            key.append((KEYWORDS, tuple(named)))
    return tuple(key)


def types_key(dyn: tuple[int, ...], args: tuple, dyn_kwargs: dict) -> tuple:
    """:attr:`CallKey.types` of a call: the types of the arguments at the positions
    ``dyn``, then of the dynamic keywords ``dyn_kwargs``, by name."""
    key = [dynamic_key(args[i], i) for i in dyn]
    key += [(k, dynamic_key(v, k)) for k, v in sorted(dyn_kwargs.items())]
    return tuple(key)


def constant_key(what: int | str, value: Any) -> Any:
    """A hashable key for the value of the constant pytree ``value``.

    ``what`` (a position or a keyword) names the argument in error messages.

    A bare ``jax.Array`` is keyed by its identity alone (an int): the hot path
    computes that key inline, without calling this function.
    """
    if type(value) is _compat.ArrayImpl:
        return id(value)
    if type(value) is np.ndarray:
        return _leaf_key(what, value)
    leaves, treedef = _flatten(value)
    return (treedef, tuple([_leaf_key(what, leaf) for leaf in leaves]))


def same_constant(what: int | str, value: Any, key: Any) -> bool:
    """Whether the constant ``value`` still has the key ``key`` (False for a tracer)."""
    try:
        return constant_key(what, value) == key
    except TracedConstant:
        return False


def _leaf_key(what: int | str, leaf: Any) -> Any:
    if type(leaf) is _compat.ArrayImpl:
        return id(leaf)
    if isinstance(leaf, _compat.Tracer):
        raise TracedConstant(what)
    if isinstance(leaf, jax.Array):
        return ("array", id(leaf))
    if isinstance(leaf, np.ndarray):
        if immutable(leaf):
            return ("frozen", id(leaf))
        return ("numpy", leaf.shape, leaf.dtype, _digest(leaf))
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(
            f"pejit: argument {what if isinstance(what, int) else repr(what)} has a "
            f"leaf of type {type(leaf).__name__} that is "
            "neither an array nor hashable; constant leaves that are not arrays "
            "act as static values and must be hashable"
        ) from None
    return (type(leaf), leaf)


#: NumPy constants up to this size are guarded by a copy of their bytes, which
#: compares several times faster than a digest hashes; larger ones by their
#: digest, so that the guard does not hold a second copy of a large array.
SNAPSHOT_BYTES = 16 << 20

#: From this size a contiguous one is compared with C's ``memcmp`` against the
#: held copy, which makes no bytes object per call (about half the time of
#: ``tobytes() ==``).
MEMCMP_BYTES = 64 << 10


_MEMCMP = _libc.function("memcmp", ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t])


def unchanged(arrays: list[np.ndarray]) -> Callable[[], bool] | None:
    """A check that these NumPy arrays still hold what they hold now (None: nothing to check).

    Read-only arrays nobody can write need no check; the others are compared
    with a copy of their bytes (by ``memcmp`` from :data:`MEMCMP_BYTES`), or a
    digest of them when large (:data:`SNAPSHOT_BYTES`). The check is
    one generated expression, since it runs on every call of a memo with
    NumPy constants. It holds the arrays, so whoever has it sees the same
    objects.
    """
    guarded = [a for a in arrays if not immutable(a)]
    if not guarded:
        return None
    namespace: dict[str, Any] = {"digest": lambda a: _digest(a), "memcmp": _MEMCMP}  # noqa: PLW0108
    terms = []
    for i, a in enumerate(guarded):
        namespace |= {f"a{i}": a, f"shape{i}": a.shape, f"dtype{i}": a.dtype}
        same = f"a{i}.shape == shape{i} and a{i}.dtype == dtype{i}"
        if _MEMCMP is not None and MEMCMP_BYTES <= a.nbytes <= SNAPSHOT_BYTES and a.flags.c_contiguous:
            namespace[f"copy{i}"] = copy = a.copy()  # held: its address stays valid
            terms.append(f"{same} and a{i}.flags.c_contiguous "
                         f"and not memcmp(a{i}.ctypes.data, {copy.ctypes.data}, {a.nbytes})")
            continue
        namespace[f"contents{i}"] = _contents(a)
        read = f"a{i}.tobytes()" if a.nbytes <= SNAPSHOT_BYTES else f"digest(a{i})"
        terms.append(f"{same} and {read} == contents{i}")
    check = eval(f"lambda: {' and '.join(terms)}", namespace)  # noqa: S307 -- names by position only
    check.arrays = arrays  # the identities the memo keys stay these arrays'
    return check


def _contents(a: np.ndarray) -> bytes:
    return a.tobytes() if a.nbytes <= SNAPSHOT_BYTES else _digest(a)


def _digest(a: np.ndarray) -> bytes:
    return hashlib.sha1(byte_view(a)).digest()


def immutable(a: np.ndarray) -> bool:
    """Whether nobody can write ``a``: it and every array it views are read-only
    (a read-only view of a writable array can still change under it), down
    to memory nobody writes: its own, ``bytes``, or a ``jax.Array``'s
    (``np.asarray`` of one, as TFC's grids are, views it read-only)."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    if isinstance(a, memoryview):
        return a.readonly and isinstance(a.obj, (bytes, jax.Array))
    return a is None or isinstance(a, (bytes, jax.Array))


#: Constants whose value nobody can change once made, recognized by identity
#: wherever something holds them (so that their ids stay theirs).
IMMUTABLE_SCALARS = (int, float, complex, bool, str, bytes, type(None), np.generic)


def fixed_array(c: Any) -> bool:
    """Whether ``c`` is an array nobody can change: a ``jax.Array``, or a
    NumPy array that is :func:`immutable` (the cache can watch either)."""
    return type(c) is _compat.ArrayImpl or (type(c) is np.ndarray and immutable(c))


def unchangeable(c: Any) -> bool:
    """Whether nobody can change constant ``c``: a :func:`fixed_array`, a typed PRNG
    key (:func:`is_key`: JAX gives no way to change one), or one of
    :data:`IMMUTABLE_SCALARS`."""
    return fixed_array(c) or isinstance(c, IMMUTABLE_SCALARS) or (is_key(c) and not isinstance(c, _compat.Tracer))


def is_key(c: Any) -> bool:
    """Whether ``c`` is an array of typed PRNG keys (``jax.random.key``)."""
    return isinstance(c, jax.Array) and jax.dtypes.issubdtype(c.dtype, jax.dtypes.prng_key)


#: Leaves of static values that JAX keys by identity or hash, and nobody changes in place.
_STATIC = (enum.Enum, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, jax.custom_jvp,
           jax.custom_vjp)


def frozen_parts(value: Any) -> list[np.ndarray] | None:
    """The NumPy arrays whose contents can still change in a pytree constant that keeps
    its value while it keeps its identity otherwise; None for any other constant.

    That is a tree of frozen containers (tuples, named tuples, frozen
    dataclasses: Equinox modules, Flax structs, MJX models) over unchangeable
    leaves and static values. The call's memo then checks those arrays' bytes
    rather than the whole tree's key: flattening such a tree can rebuild its
    static metadata on every call (an MJX model does), which costs far more
    than comparing a few arrays.
    """
    arrays, stack = [], [value]
    while stack:
        x = stack.pop()
        if unchangeable(x) or isinstance(x, _STATIC):
            continue
        if type(x) is np.ndarray:
            arrays.append(x)
        elif type(x) is tuple or (isinstance(x, tuple) and hasattr(type(x), "_fields")):
            stack.extend(x)
        elif _frozen_dataclass(type(x)):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
        else:
            return None
    return arrays


def _frozen_dataclass(cls: type) -> bool:
    """A dataclass whose instances cannot be assigned to: ``frozen=True``, or an
    Equinox ``Module`` (frozen by its own ``__setattr__``)."""
    return dataclasses.is_dataclass(cls) and (cls.__dataclass_params__.frozen or any(
        c.__name__ == "Module" and c.__module__.split(".")[0] == "equinox" for c in cls.__mro__))


def watched(leaves: list[Any]) -> list[Any]:
    """The leaves a value key holds by identity: the cache watches them."""
    return [
        leaf for leaf in leaves
        if isinstance(leaf, jax.Array) or (isinstance(leaf, np.ndarray) and immutable(leaf))
    ]


def is_array(leaf: Any) -> bool:
    """Whether a constant leaf is an array (abstract in a template)."""
    return isinstance(leaf, (jax.Array, np.ndarray))


def structure_key(leaves: list[Any]) -> tuple:
    """What a value-independent template depends on: the leaves' types."""
    return tuple([_leaf_structure(leaf) for leaf in leaves])


def _leaf_structure(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        # PRNG key arrays have no weak_type
        return ("array", leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False), leaf.sharding)
    if isinstance(leaf, np.ndarray):
        return ("numpy", leaf.shape, leaf.dtype)
    return (type(leaf), leaf)


def dynamic_key(value: Any, what: int | str | None = None) -> Any:
    """The part of a call's key that a dynamic argument contributes: its type.

    ``what`` (a position or a keyword) names the argument in error messages.
    """
    if type(value) is _compat.ArrayImpl or isinstance(value, _compat.Tracer):
        return value.aval
    if isinstance(value, (np.ndarray, np.generic)):  # the key of a jax.Array of its type, as jax.jit's has it
        return jax.typeof(value)
    leaves, treedef = _flatten(value)
    try:
        return (treedef, tuple([dynamic_aval(leaf) for leaf in leaves]))
    except NotAnArray:
        if what is None:
            raise
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            try:
                dynamic_aval(leaf)
            except NotAnArray as e:
                name = what if isinstance(what, int) else repr(what)
                e.where = f"argument {name}{jax.tree_util.keystr(path)} is dynamic but has a leaf"
                raise e from None
        raise


class NotAnArray(TypeError):
    """A dynamic argument's leaf is not an array: it should be constant."""

    def __init__(self, leaf: Any, where: str = "a dynamic argument has a leaf"):
        super().__init__()
        self.leaf_type = type(leaf).__name__
        self.where = where

    def __str__(self) -> str:
        return (
            f"pejit: {self.where} of type {self.leaf_type}, which is not a JAX array "
            "type; mark the argument constant (or static) to pass non-array values"
        )


def dynamic_aval(leaf: Any) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return _compat.ShapedArray(leaf.shape, leaf.dtype, weak_type=getattr(leaf, "weak_type", False))
    try:
        return jax.typeof(leaf)
    except TypeError:
        raise NotAnArray(leaf) from None
