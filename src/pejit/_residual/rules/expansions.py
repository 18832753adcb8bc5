"""Fold rule: a contraction against a broadcast contracts against its source.

``jnp.broadcast_to(inv(A), (64, 3, 3)) @ x`` with ``A`` constant would store
the 64-fold expansion of ``inv(A)`` (a lazy expansion that a ``dot_general``
reads is stored, see ``FUSES_OPERANDS``), where ``inv(A)`` is all the
product needs: along a dimension the broadcast adds, the result is the same
(a free dimension: broadcast the result), or ``x``'s own (a batch dimension:
it becomes a free dimension of ``x``), or ``x`` summed (a contracting one).
One ``einsum`` over the broadcast's source says all three.
"""

from __future__ import annotations

import string

import jax.numpy as jnp
from jax import lax
from jax.extend.core import primitives as P

from ..._fold._folding import Folder


def fold_dot_general(folder: Folder, trace, prim, args, params):
    """``dot_general(broadcast_in_dim(C), x)`` with ``x`` dynamic: contract against ``C``."""
    if not folder.options.affine or all(map(folder.is_known, args)):
        return NotImplemented
    for side in (0, 1):
        if folder.is_known(args[1 - side]):
            continue
        source = folder.expansion(args[side], P.broadcast_in_dim_p)
        if source is not None:
            with trace.as_current():
                return _contract_source(side, source[0][0], source[1], args, params)
    return NotImplemented


def _contract_source(side: int, source, bcast: dict, args, params):
    """``dot_general(*args, **params)`` where ``args[side]`` is ``broadcast_in_dim(source, **bcast)``."""
    shape, dims = bcast["shape"], bcast["broadcast_dimensions"]
    (contract_l, contract_r), (batch_l, batch_r) = params["dimension_numbers"]
    ranks = [len(jnp.shape(a)) for a in args]
    letters = iter(string.ascii_letters)
    names = [[None] * r for r in ranks]
    for dl, dr in [*zip(batch_l, batch_r), *zip(contract_l, contract_r)]:
        names[0][dl] = names[1][dr] = next(letters)
    for side_names in names:
        for d, n in enumerate(side_names):
            side_names[d] = n or next(letters)
    out = [names[0][d] for d in batch_l]
    out += [names[0][d] for d in range(ranks[0]) if d not in (*contract_l, *batch_l)]
    out += [names[1][d] for d in range(ranks[1]) if d not in (*contract_r, *batch_r)]
    # the dimensions of the expanded operand that ``source`` really has (a
    # size-1 dimension stretched by the broadcast is one it does not)
    real = [d for i, d in enumerate(dims) if jnp.shape(source)[i] == shape[d]]
    source = jnp.reshape(source, [shape[d] for d in real])
    expanded_names = [names[side][d] for d in real]
    operands = [source, args[1 - side]] if side == 0 else [args[0], source]
    subscripts = [expanded_names, names[1 - side]] if side == 0 else [names[0], expanded_names]
    kept = [n for n in out if any(n in s for s in subscripts)]
    spec = f"{''.join(subscripts[0])},{''.join(subscripts[1])}->{''.join(kept)}"
    y = jnp.einsum(spec, *operands, precision=params.get("precision"),
                   preferred_element_type=params.get("preferred_element_type"))
    out_shape = [jnp.shape(args[s])[d] for s, d in _origins(out, names)]
    return lax.broadcast_in_dim(y, out_shape, [out.index(n) for n in kept])


def _origins(out: list[str], names: list[list[str]]) -> list[tuple[int, int]]:
    """For each output dimension (by name), an operand dimension it comes from."""
    where = {n: (s, d) for s in (1, 0) for d, n in enumerate(names[s])}
    return [where[n] for n in out]
