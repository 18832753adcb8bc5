"""The fold-rule protocol (``FoldRule``) and its registry (``register_fold_rule``).

A fold rule decides, for the primitives it is registered for, what the
folding trace does with an application: the :class:`~pejit._fold._folding.Folder`
looks the primitive up in :data:`fold_rules` before its default (fold when
every input is known, else stage). The built-in rules are in
:mod:`pejit._residual.rules`; users register their own with :func:`register_fold_rule`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jax.extend.core import Primitive

from ._staging import StagingTrace


class FoldRule(Protocol):
    """A fold rule (as JAX types its ``ConstFoldRule``).

    Called for every application of the primitives it is registered for,
    with the known arguments materialized (concrete values) unless it was
    registered with ``deferred=True``. Returns the outputs of ``prim``
    (values, tracers staged on ``trace``, or a mix), or ``NotImplemented``
    to leave the equation to :meth:`Folder.default <pejit._fold._folding.Folder.default>`.
    ``folder`` is the :class:`~pejit._fold._folding.Folder` calling (its module
    imports this one, so it is not named in the annotation).
    """

    def __call__(
        self, folder: Any, trace: StagingTrace, prim: Primitive, args: Sequence[Any], params: dict
    ) -> Any: ...


fold_rules: dict[Primitive, FoldRule] = {}


#: Primitives whose rule takes deferred known values as they come (tracers);
#: every other rule sees them materialized, as concrete values.
deferred_ok: set[Primitive] = set()


def register_fold_rule(*prims: Primitive, deferred: bool = False) -> Callable[[FoldRule], FoldRule]:
    """Register a fold rule (a `FoldRule`) for each primitive in ``prims``.

    The folding trace calls the rule for every application of those
    primitives; the rule returns the outputs, or ``NotImplemented`` to leave
    the equation to the default policy (fold it if all inputs are known,
    else stage it). Inside ``with trace.as_current():`` the rule's JAX code
    goes through the folding trace: what depends only on known values is
    folded, the rest is staged into the residual program. ``folder`` answers
    `Folder.is_known`, counts in ``folder.stats`` and reads
    ``folder.options``.

    Known values whose folding is deferred (see `Folder`) are
    materialized before the rule runs, unless ``deferred`` says the rule
    handles them itself, through `Folder.is_known`. A primitive has
    one rule: registering again replaces it.

    Examples:
      A primitive of your own, ``solve(A, b)``, has no lowering; with ``A``
      constant, its rule folds the inverse and leaves one product:

      >>> import jax, jax.numpy as jnp
      >>> from jax.extend.core import Primitive
      >>> from pejit import pejit, register_fold_rule
      >>> solve_p = Primitive("doc_solve")
      >>> _ = solve_p.def_impl(jnp.linalg.solve)
      >>> _ = solve_p.def_abstract_eval(lambda A, b: jax.core.ShapedArray(b.shape, b.dtype))
      >>> @register_fold_rule(solve_p)
      ... def fold_solve(folder, trace, prim, args, params):
      ...     A, b = args
      ...     if not folder.is_known(A) or folder.is_known(b):
      ...         return NotImplemented
      ...     with trace.as_current():
      ...         return jnp.linalg.inv(A) @ b
      >>> f = pejit(solve_p.bind, constant_argnums=0)
      >>> f(2 * jnp.eye(2), jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
      >>> dict(f.report(2 * jnp.eye(2), jnp.ones(2)).residual)
      {'dot_general': 1}
    """

    def register(rule: FoldRule) -> FoldRule:
        for prim in prims:
            fold_rules[prim] = rule
            if deferred:
                deferred_ok.add(prim)
        return rule

    return register


__all__ = ["FoldRule", "deferred_ok", "fold_rules", "register_fold_rule"]
