"""Folded values by content: uniform arrays, equal arrays, and keeping them small.

Derivative code folds to many copies of the same arrays, most of them zeros
or ones (TFC's basis tangents: ``zeros + H * ones``): of the values a
PDE's Jacobian keeps for later batches, many are uniform and most of the
others equal another, so the distinct contents are a small share of the
bytes. A
:class:`Compactor` keeps each value as it is produced: a uniform one as a
NumPy broadcast of its one element (no memory), an equal one as the array
seen first, so the fold holds what is distinct, not the sum.

:class:`~pejit._residual._partial_eval.SharePlan` reads the same facts to pass the residual
program fewer constants.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from typing import Any

import jax
import numpy as np

from .. import _compat


def in_host_memory(c) -> bool:
    """Whether reading ``c`` as a NumPy array copies nothing."""
    if isinstance(c, np.ndarray):
        return True
    return isinstance(c, jax.Array) and c.is_fully_addressable and all(d.platform == "cpu" for d in c.devices())


def content_key(c):
    """A key equal for arrays of equal type and bits; ``("id", id(c))`` where
    that is not worth finding out (values on an accelerator are not copied to
    the host to be compared)."""
    if isinstance(c, _compat.Tracer) or not in_host_memory(c):
        return ("id", id(c))
    a = np.asarray(c)
    if a.dtype == object:
        return ("id", id(c))
    one = uniform_value(a)  # stored or a broadcast of one element (see Compactor): equal
    if one is not None:
        return (a.shape, a.dtype, "uniform", np.asarray(one).tobytes())
    if not a.flags.c_contiguous:
        return ("id", id(c))
    return (a.shape, a.dtype, hashlib.sha1(byte_view(a)).digest())


def nbytes(aval) -> int:
    """Bytes of an array of abstract value ``aval`` (0 for non-arrays)."""
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # extended dtypes (PRNG keys) have no NumPy itemsize
        itemsize = getattr(dtype, "itemsize", 8)
    return math.prod(shape) * itemsize


def byte_view(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as a flat uint8 array (a view where ``a`` is contiguous).

    Hashable by ``hashlib`` for every dtype NumPy holds, ml_dtypes' too
    (bfloat16, float8, int4 have no buffer format), and zero-size arrays.
    """
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def bools_are_0_or_1(values) -> bool:
    """Whether each bool array among ``values`` holds bytes 0 and 1 alone.

    A view of other bits as bools (JAX's tests' ``rand_fullrange``) holds any
    byte, which ``jax.jit`` keeps where it is passed and a literal compiled in
    makes 0 or 1: such a value is not compiled in. Reading one on an accelerator
    copies it, as compiling it in would.

    Examples:
      >>> bools_are_0_or_1([np.array([True, False]), np.ones(2)])
      True
      >>> bools_are_0_or_1([np.array([2, 0], np.uint8).view(np.bool_)])
      False
    """
    return all(v.dtype != np.bool_ or byte_view(np.asarray(v)).max(initial=0) <= 1 for v in values)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def uniform_value(c):
    """The one value every element of ``c`` has, bit for bit, else ``None``.

    Bits, not ``==``: ``-0.0`` and ``0.0`` must stay apart, NaNs must not.
    """
    if isinstance(c, _compat.Tracer) or not isinstance(c, (jax.Array, np.ndarray)) or np.size(c) < 2:
        return None
    if jax.dtypes.issubdtype(c.dtype, jax.dtypes.extended) or c.dtype.itemsize not in _UINT:
        return None
    if isinstance(c, np.ndarray) and not any(c.strides):  # a broadcast of one element (see Compactor)
        return c[(0,) * c.ndim]
    if isinstance(c, jax.Array) and not c.is_fully_addressable:
        return None  # sharded over processes (jax.distributed): not worth a collective here
    if not in_host_memory(c):  # compared where it lives; only the verdict and the element are copied
        with _compat.at_top_level():
            same, one = _uniform_on_device(c)
        return np.asarray(one)[()] if bool(same) else None
    a = np.ascontiguousarray(c)
    bits = a.reshape(-1).view(_UINT[a.dtype.itemsize])
    if bits[-1] != bits[0] or not np.all(bits == bits[0]):
        return None
    return a.reshape(-1)[0]


@jax.jit
def _uniform_on_device(c):
    """Whether every element of ``c`` has the bits of its first, and that element.

    One program per type (not an eager dispatch, and a compile, per
    operation). Floats are compared as bits (``-0.0`` apart, NaNs equal to
    themselves), complex numbers part by part; integers and booleans by
    value, which is their bits (4-bit integers and booleans have no unsigned
    type of their size to be cast to).
    """
    flat = c.reshape(-1)
    parts = (flat.real, flat.imag) if jax.numpy.iscomplexobj(flat) else (flat,)
    same = jax.numpy.bool_(True)
    for part in parts:
        if jax.numpy.issubdtype(part.dtype, jax.numpy.floating):
            part = jax.lax.bitcast_convert_type(part, _UINT[part.dtype.itemsize])
        same = same & jax.numpy.all(part == part[0])
    return same, flat[0]


#: Concrete fold inputs up to this many bytes are told apart by their bytes
#: (see :func:`value_key`); larger ones by identity, unless uniform.
SMALL_KEY_BYTES = 1 << 16


def value_key(c):
    """What identifies a concrete input of a fold (see :meth:`pejit._fold._memo.Memo.key`):
    equal for arrays of the same type, weak type and bits where finding that
    out costs at most one read, else ``("id", id(c))``.

    A uniform array (``jnp.zeros_like(c)``, ``np.ones_like(c)``,
    ``jnp.full(...)``, a ``jax.Array`` of zeros) is :func:`uniform_key` of its
    one element, as is a broadcast of a scalar that the fold records
    (the fold memo keys its output so): the same known work on any spelling of
    a zero is folded once. Small arrays are keyed by their bytes; other
    arrays by identity (hashing a large constant would cost a pass over it).
    """
    if isinstance(c, np.generic):  # a literal of a replayed jaxpr before JAX 0.10 (after, a 0-d array)
        c = np.asarray(c)
    if isinstance(c, _compat.Tracer) or not isinstance(c, (jax.Array, np.ndarray)) or not in_host_memory(c):
        return ("id", id(c))
    if jax.dtypes.issubdtype(c.dtype, jax.dtypes.extended) or c.dtype == object:
        return ("id", id(c))
    weak = bool(getattr(c, "weak_type", False))
    one = uniform_value(c)
    if one is not None:
        return uniform_key(c.shape, c.dtype, weak, one)
    if c.nbytes <= SMALL_KEY_BYTES:
        return ("bytes", c.shape, np.dtype(c.dtype), weak, byte_view(np.asarray(c)).tobytes())
    return ("id", id(c))


def uniform_key(shape, dtype, weak: bool, one) -> tuple:
    """The key of an array of ``shape`` and ``dtype`` whose every element is ``one`` (bit for bit)."""
    return ("uniform", tuple(shape), np.dtype(dtype), weak, byte_view(np.asarray(one, dtype)).tobytes())


def scalar_of(key) -> bytes | None:
    """The element's bytes where ``key`` (of :func:`value_key`) is that of one
    element or a uniform array, with its dtype and weak type; else None."""
    if not isinstance(key, tuple) or not key:
        return None
    if key[0] == "uniform":
        return key[2:]
    if key[0] == "bytes" and math.prod(key[1]) == 1:
        return key[2:]
    return None


class Compactor:
    """Keeps folded values small as they are produced (see the module docstring).

    Only arrays that one CPU device holds whole are rewritten, and only
    strongly typed ones (NumPy has no weak types): elsewhere reading the
    bits would copy, or the stand-in would change the value's type. Equal
    arrays are found by a sample of their elements, then compared whole, so
    that a value costs one pass over its bits at most (hashing every value
    would cost a second pass); values are remembered weakly.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit._fold._values import Compactor
      >>> keep = Compactor()
      >>> z = keep(jnp.zeros((1000, 1000)))
      >>> z.shape, z.strides, float(z[3, 4])
      ((1000, 1000), (0, 0), 0.0)
      >>> a = keep(jnp.arange(6.0)); keep(jnp.arange(6.0)) is a
      True
    """

    SAMPLES = 64

    def __init__(self):
        self._seen: dict[Any, list[weakref.ref]] = {}

    def __call__(self, value):
        if not self._compactable(value):
            return value
        one = uniform_value(value)
        if one is not None:
            return np.broadcast_to(one, value.shape)
        bits = _bits(value)
        if bits is None:
            return value
        step = max(1, bits.size // self.SAMPLES)
        key = (value.shape, value.dtype, bits[::step][: self.SAMPLES].tobytes())
        refs = self._seen.setdefault(key, [])
        for ref in refs:
            other = ref()
            if other is not None and np.array_equal(_bits(other), bits):
                return other
        refs[:] = [r for r in refs if r() is not None] + [weakref.ref(value)]
        return value

    @staticmethod
    def _compactable(value) -> bool:
        if type(value) is np.ndarray:  # a host rule's result (see pejit._fold._host)
            return value.size >= 2 and value.dtype != object
        return (
            isinstance(value, jax.Array)
            and not isinstance(value, _compat.Tracer)
            and np.size(value) >= 2
            and not jax.dtypes.issubdtype(value.dtype, jax.dtypes.extended)
            and not value.weak_type
            and len(value.devices()) == 1
            and in_host_memory(value)
        )


def _bits(value):
    """``value``'s elements as unsigned integers (a view), or None."""
    a = np.asarray(value)
    if a.dtype == object or a.dtype.itemsize not in _UINT or not a.flags.c_contiguous:
        return None
    return a.reshape(-1).view(_UINT[a.dtype.itemsize])
