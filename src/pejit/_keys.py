"""Cache keys for constant arguments.

A specialization is reused only when its constants are the same values:

* ``jax.Array`` leaves are immutable, so they are keyed by identity (the
  specialization keeps a reference, so the identity cannot be recycled);
* NumPy arrays are mutable, so they are keyed by content (a SHA-1 digest of
  their bytes, a few ms per 4 MB): mutating one re-specializes, never returns
  a stale result. Arrays that cannot change (read-only, with read-only bases)
  take the identity path and cost nothing;
* everything else (Python scalars, strings, callables, ...) is keyed by type
  and value and must be hashable.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np

from . import _compat


class TracedConstant(Exception):
    """A constant argument is a tracer of an outer transformation."""


def constant_key(what: str, value: Any) -> tuple:
    """A hashable key for the pytree ``value`` of the constant ``what``."""
    leaves, treedef = jax.tree_util.tree_flatten(value)
    return (treedef, tuple(_leaf_key(what, leaf) for leaf in leaves))


def _leaf_key(what: str, leaf: Any) -> Any:
    if isinstance(leaf, _compat.Tracer):
        raise TracedConstant(what)
    if isinstance(leaf, jax.Array):
        return ("array", id(leaf))
    if isinstance(leaf, np.ndarray):
        if _immutable(leaf):
            return ("frozen", id(leaf))
        data = np.ascontiguousarray(leaf)
        digest = hashlib.sha1(memoryview(data).cast("B")).digest()
        return ("numpy", leaf.shape, leaf.dtype.str, digest)
    try:
        hash(leaf)
    except TypeError:
        raise TypeError(
            f"pejit: {what} has a leaf of type {type(leaf).__name__} that is "
            "neither an array nor hashable; constant leaves that are not arrays "
            "act as static values and must be hashable"
        ) from None
    return (type(leaf), leaf)


def _immutable(a: np.ndarray) -> bool:
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None or isinstance(a, bytes)


def references(value: Any) -> list[Any]:
    """The leaves whose identity a key relies on: keep them alive."""
    return [leaf for leaf in jax.tree_util.tree_leaves(value) if isinstance(leaf, (jax.Array, np.ndarray))]
