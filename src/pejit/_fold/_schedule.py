"""When known work starts: kernels handed to the worker as the trace records them, loops compiled ahead.

The folding trace records known work long before a batch evaluates it
(:mod:`pejit._fold._store`), and the trace is Python that a second core
need not wait for. A :class:`Schedule` is told of each fold the trace
records: a kernel on concrete inputs starts on the worker at once
(:meth:`pejit._fold._offload.Kernels.early`), the program a batch would
compile for another is compiled (:meth:`~pejit._fold._offload.Kernels.warm`),
and an unrolled loop's compiled loop is compiled, and run, while the trace
records its steps (:class:`pejit._fold._compiled.LoopsAhead`). The batches
take what the worker did (:attr:`Schedule.kernels`, :attr:`Schedule.loops`).
"""

from __future__ import annotations

from typing import Any

from . import _compiled, _offload, _plan
from ._recipe import Recipe


class Schedule:
    """What the worker does for one folding trace while it records known work.

    ``backend`` is ``FoldOptions.backend``: only batches that may run eagerly
    take kernels. ``early_kernels``: kernels start as the trace records them
    (not in a nested trace, whose batches may not run); ``warm``: programs a
    batch would compile are compiled ahead. Given ``kernels`` (a folding
    program's, which knows its first value, see
    :meth:`pejit._fold._offload.Kernels.given`), its kernels start whatever
    ``early_kernels`` says and go on after the trace: their owner closes them.
    """

    def __init__(self, backend: str, early_kernels: bool = True, warm: bool = True,
                 kernels: _offload.Kernels | None = None):
        eager = backend in ("auto", "eager")
        self._own = kernels is None
        self.kernels = _offload.Kernels() if kernels is None else kernels
        self._early = (early_kernels or kernels is not None) and eager
        self._warm = warm and eager
        # an unrolled loop's compiled loop, compiled as the trace records it
        ahead = early_kernels and self._early and self.kernels.enabled and backend == "auto"
        self.loops = (_compiled.LoopsAhead(_offload.compiled_ahead, _plan.compiled_alike, _offload.submit)
                      if ahead else None)

    def recorded(self, recipe: Recipe, args: list[Any]) -> None:
        """The trace recorded the fold ``recipe``, whose inputs it knows as ``args``."""
        if self._early:
            self.kernels.early(recipe, args)
        elif self._warm:
            self.kernels.warm(recipe)
        if self.loops is not None:
            self.loops.record(recipe)

    def close(self) -> None:
        """The trace is over and its values computed: the loops are let go, and the kernels no batch took."""
        self.loops = None
        if self._own:
            self.kernels.close()


__all__ = ["Schedule"]
