"""Fold rules for primitives that carry sub-jaxprs, and the passes pejit runs.

pejit's passes are not separate sweeps over a jaxpr: they are decisions the
folding trace (:mod:`pejit._fold._folding`) makes equation by equation, either in
its default policy or in a rule keyed by primitive, grouped here by primitive
family; ``_hoist`` is what the families share. Every facet of a primitive's
support (its fold rule, cost, host rule, affine and linear rules) is one
registration (:func:`.registry.register_primitive`, whose docstring is the
checklist for adding a primitive); :mod:`.builtins` registers JAX's
primitives, family by family, as a user registers a rule of their own
(``pejit.register_fold_rule``).
A rule replays the relevant sub-jaxpr under the folding trace, so the known
work inside it folds like any other, and returns ``NotImplemented`` when it
has nothing to add over the default policy. Every pass is on by default and
has a :class:`~pejit.FoldOptions` switch, for debugging: turning one off
never changes results, only how much is folded::

    pejit(f, constant_argnums=0, fold_options=pejit.FoldOptions(loops=False))

The passes, in one place:

``branches`` (:mod:`.branches`)
  ``lax.cond``/``lax.switch`` with a known index are replaced by the taken
  branch, replayed inline: no ``cond`` equation is left, wherever the cond
  sits (loop bodies and nested ``jax.jit`` are replayed too). With an
  unknown index, the work each branch does on known operands is hoisted out
  and folded; the ``cond`` stays.
``calls`` (:mod:`.calls`)
  A nested ``jax.jit`` call with some known inputs or closed-over constants
  is specialized through (inlined), so the known work inside it folds: the
  equations on known inputs alone as one recipe (``calls.known_part``), the
  rest replayed equation by equation. A
  ``jax.checkpoint`` keeps its place (and its rematerialization policy for
  the dynamic inputs) with the known work inside it folded.
  ``custom_jvp``/``custom_vjp`` calls are folded when all their inputs are
  known; otherwise (:mod:`.custom`) the call is kept, with the known work
  of its function (and of a ``custom_vjp``'s forward and backward rules)
  folded, so its custom rule keeps governing derivatives of the dynamic
  inputs. ``lax.custom_root`` is such a call.
``loops`` (:mod:`.loops`)
  Loop-invariant work in ``scan``/``while_loop``/``fori_loop`` bodies and
  while conditions is hoisted out and folded once; carries that stay known
  (e.g. ``fori_loop`` counters) and known scanned-over inputs are folded
  too, through per-iteration stacked residuals limited to
  ``FoldOptions.loop_residual_bytes`` (default 64 MiB) in all per loop. A
  loop whose inputs are all known is folded entirely (default policy).
``rematerialize`` (:class:`~pejit._fold._folding.Folder`)
  Cost-aware folding: a cheap expansion of known values (``broadcast_in_dim``,
  ``iota``, reshapes, converts, ... and elementwise work on them) whose
  output is more than ``expansion_ratio`` times larger than its known inputs
  and above ``expansion_min_bytes`` is not materialized; it stays in the
  residual program where XLA fuses it into its consumers, and is stored
  where a non-fusing one (``dot_general``, custom calls, loops) reads it.
  Expensive known work feeding it is still folded.
``literals`` (:mod:`pejit._residual._partial_eval`)
  Folded scalars become literals of the residual jaxpr. Every other folded
  constant is an input of the residual program, so it reaches XLA as a
  device buffer (an argument), never as an HLO literal: lowering and
  compile time do not grow with it. Equal constants are passed once;
  uniform ones that only fusing equations read become broadcasts of a
  literal (:class:`~pejit._residual._partial_eval.SharePlan`).

``transposable`` (:mod:`.transposable`)
  A linear primitive whose JAX transpose rule rejects a known input beside
  a linear one (``pad`` of a known operand by an unknown padding value) is
  staged as the same values in a form JAX transposes. Not a switch: it
  changes no value, and without it such a derivative fails.

``affine`` (:mod:`pejit._residual._affine`, :mod:`pejit._residual._collapse`, :mod:`.products`, :mod:`.custom`)
  Residual algebra. ``lax.custom_linear_solve`` with a known operator and
  an unknown vector becomes a product with the folded inverse. After folding, each connected region of the residual
  program that is affine in the dynamic inputs (by the rules of
  :mod:`.affine`, one per primitive) is replaced by one matrix and one
  offset per output, where that is cheaper per call and the matrix fits
  ``FoldOptions.affine_max_bytes``: chains of constant products become one
  product. While folding, a ``dot_general`` against a broadcast of a known
  value contracts against that value, so the expansion is never stored, and
  ``C @ (D @ z)`` with known matrices becomes ``(C @ D) @ z`` (loop bodies too).

Dead-code elimination of the residual jaxpr always runs.
"""

from __future__ import annotations

from . import builtins  # noqa: F401  (registers pejit's support for JAX's primitives)
from .registry import register_fold_rule as register_fold_rule
from .registry import register_primitive as register_primitive
