"""Equal folds, recorded once: the fold memo of a folding trace.

The same known work met again (TFC's derivatives evaluate each basis
function's derivative several times) is folded once, as XLA's
common-subexpression elimination merges it under ``jax.jit``. A fold is
identified by its primitive, its parameters and its inputs (:meth:`Memo.key`):
a deferred input by its recipe's variable, or as the uniform array it is
known to be; a Python scalar by type and value; an array by
:func:`pejit._fold._values.value_key`, its content where that is cheap to
read. ``jnp.zeros_like(c)``, ``np.zeros_like(c)`` made in the function,
``jnp.zeros(n)`` and a ``jax.Array`` of zeros are then one input, and the
known work on them is recorded once, whichever spelling the program uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from jax.extend.core import primitives as P

from . import _values
from ._primitives import params_key

#: Primitives whose output is uniform where their one input is a scalar or uniform.
_SPREADS = frozenset({P.broadcast_in_dim_p, P.reshape_p})


def _bits(a):
    """A Python scalar as a key: a float by its bits, not ``==`` (``c * -0.0`` is not ``c * 0.0``)."""
    if isinstance(a, complex):
        return a.real.hex(), a.imag.hex()
    return a.hex() if isinstance(a, float) else a


class FoldKey(NamedTuple):
    """What identifies a fold: its primitive, its parameters (as a key) and its inputs (as keys)."""

    prim: Any
    params: tuple
    inputs: tuple


class Memo:
    """The folds one trace recorded, by :class:`FoldKey`: the same fold met again
    gives the outputs recorded the first time.

    ``var(x)`` is the store's (:meth:`pejit._fold._store.Store.var`): the recipe
    variable of a deferred value, else None.
    """

    def __init__(self, var: Callable[[Any], Any]):
        self._var = var
        # fold key -> (its outputs, its inputs, kept alive: their ids are in the key)
        self._folds: dict[FoldKey, tuple[Any, tuple]] = {}
        # keys of fold inputs by content where that is cheap (see
        # _values.value_key): id -> (key, the value, kept alive for its id)
        self._value_keys: dict[int, tuple[Any, Any]] = {}
        # recipe outputs known to be uniform (a broadcast of a scalar) -> their key
        self._uniform: dict[Any, tuple] = {}

    def key(self, prim, args: Sequence[Any], params: dict) -> FoldKey | None:
        """The :class:`FoldKey` of ``prim`` on ``args``; None if the parameters are unhashable."""
        def arg_key(a):
            var = self._var(a)
            if var is not None:
                return self._uniform.get(var, var)
            if isinstance(a, (bool, int, float, complex)):  # JAX's typed scalars carry a dtype
                return (type(a), _bits(a), getattr(a, "dtype", None))
            held = self._value_keys.get(id(a))
            if held is None or held[1] is not a:
                held = self._value_keys[id(a)] = (_values.value_key(a), a)
            return held[0]

        try:
            key = FoldKey(prim, params_key(params), tuple(map(arg_key, args)))
            hash(key)
        except TypeError:
            return None
        return key

    def get(self, key: FoldKey | None) -> Any:
        """The outputs of the fold ``key`` recorded before, else None."""
        folded = self._folds.get(key) if key is not None else None
        return None if folded is None else folded[0]

    def remember(self, key: FoldKey | None, outs: Any, args: Sequence[Any], recipe: Any) -> None:
        """Remember the fold ``key``: its outputs ``outs`` on ``args``, recorded as ``recipe``
        (None where JAX's staging computed the outputs itself). A broadcast of one element
        is uniform: folds that read it are keyed as on any uniform array of that element."""
        if key is None:
            return
        self._folds[key] = (outs, tuple(args))
        out = None if recipe is None else recipe.outvars[0]
        if key.prim in _SPREADS and out is not None:
            element = _values.scalar_of(key.inputs[0])
            if element is not None:  # a zero, a one, a fill value, however spelled
                dtype, _, bits = element
                self._uniform[out] = _values.uniform_key(
                    out.aval.shape, dtype, out.aval.weak_type, np.frombuffer(bits, dtype)[0])

    def uniform(self, x):
        """``x``, or the NumPy broadcast of one element it is known to be (a
        broadcast of a scalar, see :meth:`remember`): a fold whose other
        inputs are concrete then has concrete inputs, as on a NumPy array of
        zeros, and starts on the worker as the trace records it (see
        :meth:`pejit._fold._offload.Kernels.early`). Where other inputs are not
        concrete (a folding program's abstract constants), the recipe keeps
        reading the broadcast: a batch hands a kernel on constants alone to
        the worker at its start, ahead of its turn (a large PDE's call-time
        form would otherwise peak far higher in memory)."""
        var = self._var(x)
        key = None if var is None else self._uniform.get(var)
        if key is None:
            return x
        dtype, weak, bits = _values.scalar_of(key)
        return x if weak else np.broadcast_to(np.frombuffer(bits, dtype)[0], var.aval.shape)  # NumPy has no weak types

    def clear(self) -> None:
        """Forget every fold (the trace is over: nothing is folded again)."""
        self._folds.clear()
        self._value_keys.clear()
        self._uniform.clear()


__all__ = ["FoldKey", "Memo"]
