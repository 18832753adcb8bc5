"""Fold rules for calls: nested ``jax.jit`` and ``jax.checkpoint``.

``custom_jvp``/``custom_vjp`` calls are folded whole when all their inputs
are known (``Folder.call_inputs``); with some unknown inputs, their rules
are in :mod:`.custom`.
"""

from __future__ import annotations

import weakref

from jax.extend.core import ClosedJaxpr

from ... import _compat
from ..._fold._fold_rules import fold_rules, known_by_default
from ..._fold._folding import Folder, replay
from ..._fold._primitives import CUSTOM_CALLS
from ._hoist import hoist


def fold_jit(folder: Folder, trace, prim, args, params):
    """Specialize through a nested ``jax.jit`` that has some known inputs.

    A call with only concrete inputs is left to the default policy, which
    runs it as one compiled program (or op by op, see ``pejit._fold._host``); a
    call with only unknown inputs and no closed-over constants has nothing
    to fold and stays a call. ``jax.numpy`` functions are such calls, so a
    lazy expansion entering one is replayed too, to stay lazy.

    Otherwise a call marked ``inline=True`` (every ``jax.numpy`` function)
    is replayed whole, as JAX inlines it: each of its known
    equations is then one fold, and equal folds are found across calls
    (derivative code recomputes the same known work in many calls, and a
    known part per call would hide many of those equal folds from each
    other). Any other
    call's equations on known inputs alone fold as one recipe
    (:func:`known_part`), which spares the trace of each, and the rest is
    replayed.
    """
    known = [folder.is_known(a) for a in args]
    concrete = all(k and not folder.is_lazy(a) for k, a in zip(known, args))
    closes_over_constants = bool(params["jaxpr"].consts)
    if not folder.options.calls or concrete or not (any(known) or closes_over_constants):
        return NotImplemented
    split = None if _compat.jit_inlines(params) else known_part(
        params["jaxpr"], tuple(k and not folder.is_lazy(a) for k, a in zip(known, args)), folder)
    if split is None:
        return replay(trace, params["jaxpr"], args)
    part, rest, inputs = split
    outs = folder.fold_part(trace, part, [args[i] for i in inputs])
    return replay(trace, rest, [*args, *outs])


#: known_part's results, per call body (JAX keeps one object per traced
#: function and types) and pattern of known inputs
_splits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: A known part shorter than this is replayed with the rest: one recipe
#: for it would not pay for the split.
MIN_PART = 3


def known_part(closed, known: tuple[bool, ...], folder: Folder):
    """Split a call's body: ``(part, rest, inputs)``, or None.

    ``part`` is the equations the folding trace would fold one by one on
    the known inputs (``inputs``, their positions), as one closed jaxpr;
    ``rest`` takes the call's inputs and ``part``'s outputs. Replaying the
    rest alone skips, per equation of ``part``, what the trace costs (TFC's
    basis calls mix known grids with unknown coefficients, and their known
    equations are a large share of a PDE's fold).

    An equation is in ``part`` when its inputs are, it has no effects, and
    the trace would fold it by the default policy anyway: an expansion that
    would stay lazy (``folder.expands``), ``cond`` (whose known branch is
    inlined) and primitives with fold rules that act on known inputs stay
    in ``rest``, where the trace decides equation by equation. Lazy inputs count as
    unknown here.
    """
    per_body = _splits.setdefault(closed, {})
    key = (known, folder.options)  # the expansions that stay lazy depend on the options
    if key not in per_body:
        per_body[key] = _split(closed, known, folder.expands)
    return per_body[key]


def _split(closed, known, expands):
    jaxpr = closed.jaxpr
    if jaxpr.effects:
        return None
    have = {v for v, k in zip(jaxpr.invars, known) if k} | set(jaxpr.constvars)
    part, rest = [], []
    for eqn in jaxpr.eqns:
        inside = (not eqn.effects and _folded_whole(eqn.primitive)
                  and all(isinstance(a, _compat.Literal) or a in have for a in eqn.invars)
                  and not expands(eqn.primitive, [a.aval for a in eqn.invars], [v.aval for v in eqn.outvars]))
        (part if inside else rest).append(eqn)
        if inside:
            have.update(eqn.outvars)
    if len(part) < MIN_PART:
        return None
    read = {a for atoms in [*(e.invars for e in rest), jaxpr.outvars]
            for a in atoms if isinstance(a, _compat.Var)}  # outputs may be literals (unhashable)
    produced = [v for e in part for v in e.outvars if v in read and not isinstance(v, _compat.drop_var)]
    inputs = [i for i, k in enumerate(known) if k]
    part_jaxpr = _compat.with_outvars(
        _compat.with_invars(jaxpr.replace(eqns=part), [jaxpr.invars[i] for i in inputs]), produced)
    rest_jaxpr = _compat.with_invars(jaxpr.replace(eqns=rest), [*jaxpr.invars, *produced])
    return ClosedJaxpr(part_jaxpr, closed.consts), ClosedJaxpr(rest_jaxpr, closed.consts), tuple(inputs)


def _folded_whole(prim) -> bool:
    """Whether the folding trace folds ``prim`` on known inputs by its default policy."""
    if prim.name in CUSTOM_CALLS:
        return False
    return prim not in fold_rules or prim in known_by_default


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
