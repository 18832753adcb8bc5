"""Fold rules for primitives that carry sub-jaxprs, and the passes pejit runs.

pejit's passes are not separate sweeps over a jaxpr: they are decisions the
folding trace (:mod:`pejit._folding`) makes equation by equation, either in
its default policy or in a rule keyed by primitive (``register_fold_rule``).
A rule replays the relevant sub-jaxpr under the folding trace, so the known
work inside it folds like any other, and returns ``NotImplemented`` when it
has nothing to add over the default policy. Every pass is on by default and
has a :class:`~pejit.FoldOptions` switch, for debugging: turning one off
never changes results, only how much is folded::

    pejit(f, constant_argnums=0, fold_options=pejit.FoldOptions(loops=False))

The passes, in one place:

``branches`` (:func:`_cond`, here)
  ``lax.cond``/``lax.switch`` with a known index are replaced by the taken
  branch, replayed inline: no ``cond`` equation is left, wherever the cond
  sits (loop bodies and nested ``jax.jit`` are replayed too). With an
  unknown index, the work each branch does on known operands is hoisted out
  and folded; the ``cond`` stays.
``calls`` (:func:`_jit`, :func:`_checkpoint`, here)
  A nested ``jax.jit`` call with some known inputs or closed-over constants
  is specialized through (inlined), so the known work inside it folds. A
  ``jax.checkpoint`` keeps its place (and its rematerialization policy for
  the dynamic inputs) with the known work inside it folded.
  ``custom_jvp``/``custom_vjp`` calls are folded when all their inputs are
  known and otherwise kept whole, so their custom rule keeps governing
  derivatives of the dynamic inputs (not switchable: nothing to turn off).
``loops`` (:mod:`pejit._loops`)
  Loop-invariant work in ``scan``/``while_loop``/``fori_loop`` bodies and
  while conditions is hoisted out and folded once; carries that stay known
  (e.g. ``fori_loop`` counters) and known scanned-over inputs are folded
  too, through per-iteration stacked residuals limited to
  ``FoldOptions.loop_residual_bytes`` (default 64 MiB) in all per loop. A
  loop whose inputs are all known is folded entirely (default policy).
``rematerialize`` (:class:`~pejit._folding.Folder`)
  Cost-aware folding: a cheap expansion of known values (``broadcast_in_dim``,
  ``iota``, reshapes, converts, ... and elementwise work on them) whose
  output is more than ``expansion_ratio`` times larger than its known inputs
  and above ``expansion_min_bytes`` is not materialized; it stays in the
  residual program where XLA fuses it into its consumers, and is stored
  where a non-fusing one (``dot_general``, custom calls, loops) reads it.
  Expensive known work feeding it is still folded.
``literals`` (:mod:`pejit._specialize`)
  Folded scalars become literals of the residual jaxpr. Every other folded
  constant is an input of the residual program, so it reaches XLA as a
  device buffer (an argument), never as an HLO literal: lowering and
  compile time do not grow with it. Equal constants are passed once;
  uniform ones that only fusing equations read become broadcasts of a
  literal (:class:`~pejit._specialize.SharePlan`).

Dead-code elimination of the residual jaxpr always runs.
"""

from __future__ import annotations

import numpy as np
from jax.extend.core import primitives as P

from . import _compat
from ._folding import Folder, NeedsValue, register_fold_rule, replay
from ._loops import hoist, hoist_branches


@register_fold_rule(P.cond_p)
def _cond(folder: Folder, trace, prim, args, params):
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


@register_fold_rule(_compat.jit_p, deferred=True)
def _jit(folder: Folder, trace, prim, args, params):
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


@register_fold_rule(_compat.remat_p)
def _checkpoint(folder: Folder, trace, prim, args, params):
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
