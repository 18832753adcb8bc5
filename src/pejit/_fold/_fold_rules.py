"""The fold-rule table the folding interpreter reads (``fold_rules``), and the ``FoldRule`` protocol.

A fold rule decides, for the primitives it is registered for, what the
folding trace does with an application: the :class:`~pejit._fold._folding.Folder`
looks the primitive up in :data:`fold_rules` before its default rule (fold
when every input is known, else stage). The tables are plain data, filled
from above: the built-in rules, and a user's, are registered by
:func:`pejit._residual.rules.registry.register_primitive` (and
``pejit.register_fold_rule``), beside the rules themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
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


#: A primitive's fold rule (one a primitive).
fold_rules: dict[Primitive, FoldRule] = {}

#: Primitives whose rule takes deferred known values as they come (tracers);
#: every other rule sees them materialized, as concrete values.
deferred_ok: set[Primitive] = set()

#: Primitives whose rule leaves an equation whose inputs are all known (and not
#: lazy) to the default rule: such equations may be folded with a call's known
#: part (``pejit._residual.rules.calls.known_part``).
known_by_default: set[Primitive] = set()


__all__ = ["FoldRule", "deferred_ok", "fold_rules", "known_by_default"]
