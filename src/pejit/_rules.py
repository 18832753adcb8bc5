"""Fold rules for primitives that carry sub-jaxprs.

Each rule replays the relevant sub-jaxpr under the folding trace, so the
known work inside it folds like any other, and returns ``NotImplemented``
when it has nothing to add over the default policy (fold if all inputs are
known, else stage).
"""

from __future__ import annotations

import numpy as np
from jax.extend.core import primitives as P

from . import _compat
from ._folding import Folder, register_fold_rule, replay


@register_fold_rule(P.cond_p)
def _cond(folder: Folder, trace, prim, args, params):
    """A known index selects one branch: inline it, drop the ``cond``."""
    index, *operands = args
    if not folder.options.branches or not folder.is_known(index):
        return NotImplemented
    branches = params["branches"]
    i = int(np.clip(np.asarray(folder.materialize(index)), 0, len(branches) - 1))
    folder.stats.eliminated_branches += 1
    return replay(trace, branches[i], operands)


@register_fold_rule(_compat.jit_p)
def _jit(folder: Folder, trace, prim, args, params):
    """Specialize through a nested ``jax.jit`` that has some known inputs.

    A call with only concrete inputs is left to the default policy, which
    runs it as one compiled program; a call with only unknown inputs has
    nothing to fold and stays a call. ``jax.numpy`` functions are such calls,
    so a lazy expansion entering one is replayed too, to stay lazy.
    """
    known = [folder.is_known(a) for a in args]
    concrete = all(k and not folder.is_lazy(a) for k, a in zip(known, args))
    if not folder.options.calls or concrete or not any(known):
        return NotImplemented
    return replay(trace, params["jaxpr"], args)
