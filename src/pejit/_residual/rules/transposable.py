"""Fold rules that restage a linear primitive whose JAX transpose rule cannot take
some of its inputs known and the others linear.

Folding makes inputs known that JAX's own tracing would leave linear: the
derivative of a pejit function (``pejit._calls._derivatives``) closes over
the constants, so a linear primitive meets a folded value beside a tangent
that reverse mode transposes. Most transpose rules take any mix; ``pad``'s
assumes that where the padding value is linear, the operand is too (its
cotangent is the total less the operand's, which it computes only for a
linear operand), and fails with a ``NoneType`` error. ``jax.grad`` of
``lax.pad(C, v, config)`` w.r.t. ``v`` fails in plain JAX for the same
reason; JAX's own gradient test passes because it perturbs both.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from ... import _compat
from ..._fold._folding import Folder


def pad_needs_fold(eqn, known: set) -> bool:
    """Whether a ``pad`` must be restaged (:func:`fold_pad`): a known operand, an unknown
    padding value (a program that differentiates it could not be transposed)."""
    operand, padding_value = eqn.invars
    if isinstance(padding_value, _compat.Literal):
        return False
    return (isinstance(operand, _compat.Literal) or operand in known) and padding_value not in known


def fold_pad(folder: Folder, trace, prim, args, params):
    """``pad(C, v)`` with ``C`` known and ``v`` not: ``select_n(mask, pad(C, 0), broadcast(v))``.

    ``mask`` (known) marks where the output is padding. The same values,
    exactly (no arithmetic: infinities, NaNs and signed zeros pass as they
    are), as one select that JAX transposes, linear in ``v`` alone. The
    known cases stay lazy, so the residual stores what it stored before
    (``C``, not its padded copy) and XLA fuses the rest into the select.
    """
    operand, padding_value = args
    if not folder.is_known(operand) or folder.is_known(padding_value):
        return NotImplemented
    aval = _compat.typeof(operand)
    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended):
        return NotImplemented  # keys: nothing differentiates them
    zero = np.zeros((), aval.dtype)
    if aval.weak_type:  # as ``pad`` keeps it: weak where both inputs are
        zero = _compat.weakly_typed(zero)
    with trace.as_current():
        falses = lax.full(aval.shape, False)  # lazy where large, as any broadcast
    inner = folder.stage_lazy(trace, prim, [operand, zero], params)
    mask = folder.stage_lazy(trace, prim, [falses, np.True_], params)
    folder.stats.staged["pad (as a select)"] += 1
    with trace.as_current():
        fill = lax.broadcast_in_dim(padding_value, _compat.typeof(inner).shape, ())
        return lax.select_n(mask, inner, fill)

