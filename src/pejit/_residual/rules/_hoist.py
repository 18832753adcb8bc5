"""Hoisting: folding the known work inside a sub-jaxpr (loop body, branch,
checkpointed function) by replaying it under a nested folding trace.

Every rule family builds on it: ``cond`` with an unknown index
(:mod:`.branches`), ``checkpoint`` (:mod:`.calls`), loops (:mod:`.loops`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from jax.extend.core import ClosedJaxpr

from ... import _compat
from ..._fold._folding import Folder, replay
from ..._fold._primitives import prune
from ..._fold._staging import trace_staging


#: Stands for an input of a body that is never known (a carry, a scanned input).
DYNAMIC = object()


def hoist(folder: Folder, body: ClosedJaxpr, args: Sequence[Any], *, force: bool = False,
          speculative: bool = False, trips: int = 1):
    """Fold the work of ``body`` that depends only on its concrete ``args``.

    ``args`` are ``body``'s inputs: values (concrete, or abstract constants
    of a folding program), tracers of ``folder``'s trace or ``DYNAMIC``;
    its literals and closed-over constants are known too. Returns the new
    body and its arguments: the folded values it still needs, then the
    non-concrete ``args`` in order. Returns ``None`` when nothing could be
    folded (unless ``force``). ``speculative``: the body may never run (see
    :attr:`Folder.speculative`); ``trips``: it runs that many times a call (see
    :attr:`Folder.trips`).
    """
    stats = folder.stats
    before = (Counter(stats.folded), stats.eliminated_branches)
    new_body, new_args = hoist_call(folder, lambda *xs: replay(_compat.core_trace(), body, xs), args, body.in_avals,
                                    speculative=speculative, trips=trips)
    concrete = any(a is not DYNAMIC and not folder.is_staged(a) for a in args)
    if not force and not concrete and before == (stats.folded, stats.eliminated_branches):
        return None  # nothing known inside: keep the body as it was
    new_out = [v.aval for v in new_body.jaxpr.outvars]
    if [(a.shape, a.dtype) for a in new_out] != [(a.shape, a.dtype) for a in body.out_avals]:
        return None  # defensive: replaying must not change the body's type
    stats.hoisted.update(stats.folded - before[0])
    return new_body, new_args


def hoist_call(folder: Folder, fun, args: Sequence[Any], avals: Sequence[Any], *, speculative: bool = False,
               trips: int = 1):
    """Trace ``fun`` on ``args`` (of types ``avals``), its work on the concrete ones folded.

    ``args`` are as for :func:`hoist`; the concrete ones reach ``fun`` as
    they are, so Python sees their values, the others as tracers. Returns
    the traced body and its arguments: the folded values it needs, then the
    non-concrete ``args`` in order.
    """
    concrete = [a is not DYNAMIC and not folder.is_staged(a) for a in args]
    unknown_avals = [aval for aval, k in zip(avals, concrete) if not k]

    def interpret(*unknown):
        it = iter(unknown)
        return fun(*[a if k else next(it) for a, k in zip(args, concrete)])

    jaxpr, hoisted = trace_staging(interpret, unknown_avals, folder.child(speculative, trips), name="body")
    jaxpr, hoisted = prune(jaxpr, hoisted)
    return _compat.close_jaxpr(jaxpr, ()), [*hoisted, *(a for a, k in zip(args, concrete) if not k)]


def hoist_consts(folder: Folder, body: ClosedJaxpr, consts: Sequence[Any], *, force: bool = False,
                 speculative: bool = False, trips: int = 1):
    """:func:`hoist` for a body whose leading inputs are ``consts``, the rest dynamic.

    Returns the new body and its new leading constants, or ``None``.
    """
    n_rest = len(body.in_avals) - len(consts)
    hoisted = hoist(folder, body, [*consts, *[DYNAMIC] * n_rest], force=force, speculative=speculative, trips=trips)
    if hoisted is None:
        return None
    new_body, new_args = hoisted
    return new_body, new_args[: len(new_args) - n_rest]
