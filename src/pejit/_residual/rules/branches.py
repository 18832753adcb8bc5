"""Fold rules for branches: ``cond``/``switch``, and hoisting out of them.

A known index selects one branch, replayed inline; with an unknown index,
the known work in each branch is hoisted out and folded.
"""

from __future__ import annotations

import numpy as np
from jax.extend.core import Literal

from ... import _compat
from ..._fold import _cost
from ..._fold._folding import Folder, NeedsValue, replay
from ._hoist import hoist_consts


def known_index_saving(eqn, known: set, producers: dict, nested: bool) -> _cost.Cost:
    """What :func:`fold_cond` saves a call where the index is known: the ``cond`` itself
    (the branch runs inline, where XLA runs a conditional as a kernel of its own)."""
    index = eqn.invars[0]
    return _cost.Cost(kernels=1.0) if isinstance(index, Literal) or index in known else _cost.ZERO


def fold_cond(folder: Folder, trace, prim, args, params):
    """A known index selects one branch: inline it, drop the ``cond``.

    With an unknown index, known work inside the branches is hoisted out.
    """
    index, *operands = args
    if not folder.options.branches:
        return NotImplemented
    if not folder.is_known(index):
        return hoist_branches(folder, trace, prim, index, operands, params)
    branches = params["branches"]
    index = folder.materialize(index)
    if folder.is_abstract(index):
        if all(map(folder.is_known, operands)):
            return NotImplemented  # folded whole, into the folding program
        raise NeedsValue("a cond's branch is chosen by constants")
    i = int(np.clip(np.asarray(index), 0, len(branches) - 1))
    folder.stats.eliminated_branches += 1
    return replay(trace, branches[i], operands)


def hoist_branches(folder: Folder, trace, prim, index, operands, params):
    """Hoist known work out of the branches of a ``cond`` with unknown index.

    Each branch is replayed with the concrete operands known; what each one
    folds becomes extra operands, which the other branches ignore.
    """
    if all(map(folder.is_staged, operands)):
        return NotImplemented
    hoisted = [hoist_consts(folder, b, operands, force=True, speculative=True) for b in params["branches"]]
    if any(h is None for h in hoisted):
        return NotImplemented
    dynamic = [o for o in operands if folder.is_staged(o)]
    n_dyn = len(dynamic)
    consts = [new[: len(new) - n_dyn] for _, new in hoisted]
    branches = []
    for i, (body, _) in enumerate(hoisted):
        jaxpr = body.jaxpr
        own, rest = jaxpr.invars[: len(consts[i])], jaxpr.invars[len(consts[i]) :]
        invars = []
        for j, cs in enumerate(consts):  # unused binders for the other branches' values
            invars += own if j == i else [_compat.Var(_compat.typeof(c)) for c in cs]
        branches.append(_compat.close_jaxpr(_compat.with_invars(jaxpr, [*invars, *rest]), ()))
    args = [index, *(c for cs in consts for c in cs), *dynamic]
    folder.stats.staged[prim.name] += 1
    return trace.stage(prim, args, dict(params, branches=tuple(branches)))
