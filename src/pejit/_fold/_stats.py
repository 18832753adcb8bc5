"""``FoldStats``: what one specialization folded and kept, counted as it folds.

The folding trace, the fold rules and the residual passes count into one
``FoldStats``; :class:`~pejit._reports._report.FoldReport` is built from it, and the
persistent cache stores it with the folded constants.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import NamedTuple

from .. import _compat


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """How one segment of a batch of known equations was evaluated.

    ``batch`` numbers the batches of one specialization, in order.
    """

    batch: int
    backend: str
    equations: int
    out_bytes: int
    primitives: Counter
    seconds: float = 0.0  #: evaluating the segment, compiling included
    compile_seconds: float = 0.0


class Unfolded(NamedTuple):
    """A fold that did not pay for itself: ``equations`` known equations, estimated
    to cost ``saved`` seconds per call of the program's ``total``
    (:mod:`pejit._fold._cost`), stayed in the program
    (in a sub-program, ``nested``: a loop's body, a branch); or, ``compiled_in``,
    were left to XLA, which folds them as it compiles the constants in."""

    equations: int
    saved: float
    total: float
    nested: bool
    compiled_in: bool = False
    why: str = "under FoldOptions.min_gain"

    def __str__(self) -> str:
        where = "a sub-program's " if self.nested else ""
        share = self.saved / self.total if self.total else 0.0
        if self.compiled_in:
            return (f"{where}{self.equations} known equations stay in the program, the constants compiled in: "
                    f"XLA folds them as it compiles, for less than a fold ({self.saved:.3g} s a call)")
        return (f"{where}{self.equations} known equations stay in the program: folding them would save "
                f"{self.saved:.3g} s of {self.total:.3g} s estimated per call ({share:.1%}), "
                f"{self.why}")


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
    batches: list = dataclasses.field(default_factory=list)  # of BatchInfo
    collapsed: list = dataclasses.field(default_factory=list)  # of _collapse.Collapse
    unfolded: list = dataclasses.field(default_factory=list)  # of Unfolded
    notes: list = dataclasses.field(default_factory=list)  # what else the report says (its fallbacks)


#: The notes of the trace in progress: its report's (see :func:`note`).
_NOTES: contextvars.ContextVar[list | None] = contextvars.ContextVar("pejit_notes", default=None)


@contextlib.contextmanager
def noting(notes: list) -> Iterator[list]:
    """Collect into ``notes`` what the code traced inside notes (:func:`note`)."""
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note(text: str) -> None:
    """Add ``text`` to the report of the specialization being traced, once; a trace
    that is no specialization's (outside :func:`noting`) drops it."""
    notes = _NOTES.get()
    if notes is not None and text not in notes:
        notes.append(text)


class Tally:
    """What one folding trace counted as folded into ``stats`` (shared with the
    traces nested in it), taken back where its fold does not pay."""

    def __init__(self, stats: FoldStats):
        self.stats = stats
        self._folded: Counter = Counter()
        self._flops = 0.0

    def count(self, labels: list[str], flops: float) -> None:
        """Count folds of these labels (:func:`label`), of ``flops`` estimated FLOPs in all."""
        for name in labels:
            self.stats.folded[name] += 1
            self._folded[name] += 1
        self.stats.flops += flops
        self._flops += flops

    def take_back(self, unfolded: Unfolded) -> None:
        """The fold did not pay: take its count back, and say why."""
        self.stats.folded -= self._folded
        self.stats.flops -= self._flops
        self.stats.unfolded.append(unfolded)
        self._folded, self._flops = Counter(), 0.0


def label(prim, params: dict) -> str:
    """How reports count an equation: its primitive, and a nested call's function.

    `jit(cholesky)` rather than `jit`, as the DOT graph labels it.
    """
    name = params.get("name")
    return f"{prim.name}({name})" if isinstance(name, str) and prim is _compat.jit_p else prim.name


__all__ = ["BatchInfo", "FoldStats", "Tally", "Unfolded", "label"]
