"""What a specialization folded, what it kept, and what that cost."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ._folding import FoldStats, nbytes


@dataclasses.dataclass(frozen=True)
class FoldReport:
    """A summary of one specialization.

    Attributes:
      folded: equations evaluated at specialization time, by primitive.
      residual: equations left in the residual program, by primitive.
      rematerialized: cheap expansions kept in the residual program rather
        than stored as large constants, by primitive.
      effects_kept: effectful equations kept although their inputs were known.
      eliminated_branches: ``cond``/``switch`` equations resolved at fold time.
      folded_bytes: total size of the folded constants the residual program
        takes as inputs.
      fold_seconds: wall time of tracing and folding.
      after: the residual jaxpr.
      before: the jaxpr that was specialized, when there was one.
      hoisted: equations folded inside loop bodies and branches (hoisted
        out of them), by primitive; also counted in ``folded``.
    """

    folded: Counter
    residual: Counter
    rematerialized: Counter
    effects_kept: Counter
    eliminated_branches: int
    folded_bytes: int
    fold_seconds: float
    after: Any
    before: Any = None
    hoisted: Counter = dataclasses.field(default_factory=Counter)

    @classmethod
    def build(cls, stats: FoldStats, closed_jaxpr, seconds: float, before=None) -> FoldReport:
        residual = Counter(e.primitive.name for e in closed_jaxpr.jaxpr.eqns)
        return cls(
            folded=stats.folded,
            residual=residual,
            rematerialized=stats.rematerialized,
            effects_kept=stats.effects_kept,
            eliminated_branches=stats.eliminated_branches,
            folded_bytes=sum(nbytes(getattr(c, "aval", None) or _aval(c)) for c in closed_jaxpr.consts),
            fold_seconds=seconds,
            after=closed_jaxpr,
            before=before,
            hoisted=stats.hoisted,
        )

    @property
    def folded_eqns(self) -> int:
        return sum(self.folded.values())

    @property
    def residual_eqns(self) -> int:
        return sum(self.residual.values())

    def __str__(self) -> str:
        def fmt(counter):
            return ", ".join(f"{k} x{v}" for k, v in counter.most_common()) or "none"

        lines = [
            f"folded {self.folded_eqns} equations ({fmt(self.folded)})",
            f"residual {self.residual_eqns} equations ({fmt(self.residual)})",
            f"folded constants: {len(self.after.consts)}, {self.folded_bytes:,} bytes",
            f"fold time: {self.fold_seconds * 1e3:.1f} ms",
        ]
        if self.eliminated_branches:
            lines.append(f"branches eliminated: {self.eliminated_branches}")
        if self.hoisted:
            lines.append(f"hoisted out of loops and branches: {fmt(self.hoisted)}")
        if self.rematerialized:
            lines.append(f"expansions kept in the residual: {fmt(self.rematerialized)}")
        if self.effects_kept:
            lines.append(f"effects kept: {fmt(self.effects_kept)}")
        return "\n".join(lines)


def _aval(x):
    import jax

    return jax.typeof(x)
