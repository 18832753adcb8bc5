"""A known equation the folding trace recorded and has not evaluated yet: a :class:`Recipe`.

The trace stages a placeholder for each known equation and records how to
compute its outputs (:mod:`pejit._fold._store`); batches evaluate recipes
when their values are needed (:mod:`pejit._fold._plan`, :mod:`pejit._fold._batch`).
A recipe reads concrete values and the outputs of other recipes, by their
``Var`` (:func:`pejit._fold._primitives.is_var`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import _primitives
from ._values import nbytes


@dataclasses.dataclass(frozen=True, eq=False)
class Recipe:
    """One known equation whose outputs have not been computed yet.

    ``args`` holds concrete values and the ``Var`` of other recipes' outputs.
    ``outvars`` has ``None`` for outputs that JAX's staging forwarded or
    folded itself. ``lazy`` recipes are cheap expansions that also stay in
    the residual program; the others are folds, whose outputs become
    constants. ``serial`` is its place among the recipes of its trace: a
    batch runs them in that order (see :meth:`pejit._fold._store.Store.pending`). ``params_key``
    is ``params`` as part of a key (:func:`pejit._fold._primitives.params_key`),
    computed once: the fold, the worker's kernels and the batch's programs
    each key the recipe by it, and building it from a ``jnp`` call's many
    parameters is not free.
    """

    prim: Any
    args: tuple
    params: dict
    outvars: tuple
    lazy: bool = False
    serial: int = 0
    params_key: tuple = dataclasses.field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self):
        if self.params_key is None:
            object.__setattr__(self, "params_key", _primitives.params_key(self.params))

    def out_bytes(self) -> int:
        return sum(nbytes(v.aval) for v in self.outvars if v is not None)


__all__ = ["Recipe"]
