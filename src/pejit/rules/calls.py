"""Fold rules for calls: nested ``jax.jit`` and ``jax.checkpoint``.

``custom_jvp``/``custom_vjp`` calls need no rule: the folding trace folds
them whole when all their inputs are known (``Folder.call_inputs``).
"""

from __future__ import annotations

from .. import _compat
from .._folding import Folder, replay
from ._hoist import hoist


def fold_jit(folder: Folder, trace, prim, args, params):
    """Specialize through a nested ``jax.jit`` that has some known inputs.

    A call with only concrete inputs is left to the default policy, which
    runs it as one compiled program; a call with only unknown inputs and no
    closed-over constants has nothing to fold and stays a call. ``jax.numpy``
    functions are such calls, so a lazy expansion entering one is replayed
    too, to stay lazy.
    """
    known = [folder.is_known(a) for a in args]
    concrete = all(k and not folder.is_lazy(a) for k, a in zip(known, args))
    closes_over_constants = bool(params["jaxpr"].consts)
    if not folder.options.calls or concrete or not (any(known) or closes_over_constants):
        return NotImplemented
    return replay(trace, params["jaxpr"], args)


def fold_checkpoint(folder: Folder, trace, prim, args, params):
    """Fold the known work inside ``jax.checkpoint``; keep the checkpoint.

    The known inputs are constants, so no derivative flows through the
    folded part, and the checkpoint still governs the dynamic rest.
    """
    if not folder.options.calls or all(folder.is_known(a) for a in args):
        return NotImplemented
    hoisted = hoist(folder, _compat.close_jaxpr(params["jaxpr"], ()), args)
    if hoisted is None:
        return NotImplemented
    body, args = hoisted
    folder.stats.staged[prim.name] += 1
    return trace.stage(prim, args, dict(params, jaxpr=body.jaxpr))
