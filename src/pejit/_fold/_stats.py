"""``FoldStats``: what one specialization folded and kept, counted as it folds.

The folding trace, the fold rules and the residual passes count into one
``FoldStats``; :class:`~pejit._reports._report.FoldReport` is built from it, and the
persistent cache stores it with the folded constants.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import NamedTuple

from .. import _compat


class Unfolded(NamedTuple):
    """A fold that did not pay for itself: ``equations`` known equations, estimated
    to cost ``saved`` seconds per call of the program's ``total``
    (:mod:`pejit._fold._cost`), stayed in the program (in a sub-program, ``nested``:
    a loop's body, a branch)."""

    equations: int
    saved: float
    total: float
    nested: bool

    def __str__(self) -> str:
        where = "a sub-program's " if self.nested else ""
        share = self.saved / self.total if self.total else 0.0
        return (f"{where}{self.equations} known equations stay in the program: folding them would save "
                f"{self.saved:.3g} s of {self.total:.3g} s estimated per call ({share:.1%}), "
                "under FoldOptions.min_gain")


@dataclasses.dataclass
class FoldStats:
    """What one specialization folded and kept, by primitive name."""

    folded: Counter = dataclasses.field(default_factory=Counter)
    staged: Counter = dataclasses.field(default_factory=Counter)
    eliminated_branches: int = 0
    hoisted: Counter = dataclasses.field(default_factory=Counter)
    effects_kept: Counter = dataclasses.field(default_factory=Counter)
    eager_evaluations: Counter = dataclasses.field(default_factory=Counter)
    flops: float = 0.0  # estimated FLOPs of the folded equations (pejit._fold._cost)
    batches: list = dataclasses.field(default_factory=list)  # of _batch.BatchInfo
    collapsed: list = dataclasses.field(default_factory=list)  # of _collapse.Collapse
    unfolded: list = dataclasses.field(default_factory=list)  # of Unfolded
    notes: list = dataclasses.field(default_factory=list)  # what else the report says (its fallbacks)


def label(prim, params: dict) -> str:
    """How reports count an equation: its primitive, and a nested call's function.

    `jit(cholesky)` rather than `jit`, as the DOT graph labels it.
    """
    name = params.get("name")
    return f"{prim.name}({name})" if isinstance(name, str) and prim is _compat.jit_p else prim.name


__all__ = ["FoldStats", "Unfolded", "label"]
