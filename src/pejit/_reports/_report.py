"""What a specialization folded, what it kept, and what that cost.

A :class:`FoldReport` has three views: ``str(report)`` (a few lines),
``report._repr_html_()`` (both jaxprs side by side, for notebooks) and
``report.to_dot()`` (Graphviz DOT text of the original program, folded and
residual equations coloured).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import itertools
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jax.extend.core import Literal

from .._compat import drop_var
from .._fold._cost import jaxpr_flops
from .._fold._values import nbytes
from .._fold._stats import FoldStats
from .._fold._stats import label as eqn_label

#: How an equation of the original program fares, by :func:`classify`.
FOLDED, RESIDUAL, EFFECT = "folded", "residual", "effect"


@dataclasses.dataclass(frozen=True)
class FoldReport:
    """A summary of one specialization.

    Attributes:
      folded: equations evaluated at specialization time, by primitive.
      residual: equations left in the residual program, by primitive.
      rematerialized: equations of the residual program that depend on the
        folded constants alone (cheap expansions recomputed on every call
        rather than stored as large constants), by primitive; read off
        ``after``, so it says what the residual program really computes.
      effects_kept: effectful equations kept although their inputs were known.
      eliminated_branches: ``cond``/``switch`` equations resolved at fold time.
      folded_bytes: total size of the folded constants the residual program
        takes as inputs.
      fold_seconds: wall time of tracing and folding.
      after: the residual jaxpr; its ``consts`` are the folded constants,
        passed to the compiled program as device buffers.
      before: the original program, when known ([`explain`][pejit.explain] and
        [`specialize_jaxpr`][pejit.specialize_jaxpr] record it): for ``explain``, the
        jaxpr ``jax.jit`` would see with the constants closed over (they are
        its ``consts``) and Python control flow on them already decided.
      known_invars: positions of ``before``'s inputs that were known (its
        ``consts`` always are).
      batches: how the known work was evaluated, one record per batch
        segment (``pejit._fold._stats.BatchInfo``: number, back end, equations,
        bytes, primitives, seconds and of them compiling). The back end is
        ``"eager"`` (op by op), ``"compiled"`` (one ``jax.jit`` program),
        ``"loop"`` (an unrolled loop's steps, each feeding the next, as one
        compiled loop) or ``"program"`` (staged into the folding program of a value-independent
        structure, which is then run: op by op for a first value, compiled
        for later ones).
        ``backends`` counts them. Known results of at most 64 bytes are
        computed on the spot, outside batches.
      hoisted: equations folded inside loop bodies and branches (hoisted
        out of them), by primitive; also counted in ``folded``.
      fallbacks: notes from the folding back end about work it could not
        fold as planned and did another way.
      eager_evaluations: equations evaluated at once on their known inputs
        because their primitive's abstract evaluation failed (its ``impl``
        gave the output types), by primitive; also counted in ``folded``.
      flops_folded: estimated FLOPs of the folded equations (`pejit._fold._cost`),
        counted as they were folded.
      collapsed: regions of the residual program affine in the dynamic
        inputs that were replaced by one matrix and one offset per output
        (`pejit._residual._collapse.Collapse`: equations, FLOPs per call before and
        after, bytes stored).
      unfolded: known work left in the program because folding it would not
        pay (`pejit._fold._stats.Unfolded`, see ``FoldOptions.min_gain``): the
        program, or a loop body or branch in it, computes it as ``jax.jit``'s does.

    Equations are counted by primitive, nested `jax.jit` calls by function
    (`jit(cholesky)`).

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import explain
      >>> r = explain(lambda A, x: jnp.linalg.inv(A) @ x, jnp.eye(2), jnp.ones(2), constant_argnums=0)
      >>> print(str(r).splitlines()[1])
      residual 1 equation (dot_general x1)
      >>> r.buffers
      [ShapedArray(float32[2,2])]
      >>> r.marks
      ['folded', 'residual']
      >>> r.to_dot().splitlines()[0]
      'digraph "pejit" {'
      >>> "<table>" in r._repr_html_()
      True
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
    known_invars: tuple[int, ...] = ()
    batches: tuple = ()
    fallbacks: tuple[str, ...] = ()
    eager_evaluations: Counter = dataclasses.field(default_factory=Counter)
    flops_folded: float = 0.0
    collapsed: tuple = ()
    unfolded: tuple = ()

    @classmethod
    def build(
        cls, stats: FoldStats, closed_jaxpr, seconds: float, *, before=None,
        known_invars: tuple[int, ...] = (), fallbacks: tuple[str, ...] = (),
    ) -> FoldReport:
        """The report of a fold, field by field from its statistics: the one
        place a report is made."""
        eqns = closed_jaxpr.jaxpr.eqns
        residual = Counter(eqn_label(e.primitive, e.params) for e in eqns)
        recomputed = Counter(
            eqn_label(e.primitive, e.params) for e, m in zip(eqns, classify(closed_jaxpr)) if m == FOLDED
        )
        return cls(
            folded=stats.folded,
            residual=residual,
            rematerialized=recomputed,
            effects_kept=stats.effects_kept,
            eliminated_branches=stats.eliminated_branches,
            folded_bytes=sum(nbytes(getattr(c, "aval", None) or _aval(c)) for c in closed_jaxpr.consts),
            fold_seconds=seconds,
            after=closed_jaxpr,
            before=before,
            hoisted=stats.hoisted,
            eager_evaluations=stats.eager_evaluations,
            flops_folded=stats.flops,
            collapsed=tuple(stats.collapsed),
            unfolded=tuple(stats.unfolded),
            known_invars=known_invars,
            batches=tuple(stats.batches),
            fallbacks=(*fallbacks, *stats.notes),
        )

    @property
    def backends(self) -> Counter:
        """Batches of known work by the back end that evaluated them."""
        return Counter(b.backend for b in self.batches)

    @property
    def folded_eqns(self) -> int:
        return sum(self.folded.values())

    @property
    def residual_eqns(self) -> int:
        return sum(self.residual.values())

    # -- derived views ---------------------------------------------------
    @property
    def buffers(self) -> list[Any]:
        """Abstract values of the folded constants passed as device buffers."""
        return [_aval(c) for c in self.after.consts]

    @property
    def literals(self) -> list[Any]:
        """Scalar constants inlined into the residual program as literals."""
        return [v.val for e in self.after.jaxpr.eqns for v in e.invars if isinstance(v, Literal)]

    @functools.cached_property
    def marks(self) -> list[str] | None:
        """For each equation of ``before``: ``"folded"``, ``"residual"`` or ``"effect"``.

        See `classify` (in `pejit._reports._report`) for how (and how approximately) this is decided.
        """
        if self.before is None:
            return None
        return classify(self.before, self.known_invars)

    @property
    def flops_removed(self) -> float:
        """Estimated FLOPs per call of the folded equations (see `pejit._fold._cost`)."""
        return self.flops_folded

    @functools.cached_property
    def flops_residual(self) -> float:
        """Estimated FLOPs per call of the residual program."""
        return jaxpr_flops(self.after)

    @property
    def warnings(self) -> list[str]:
        """Things worth knowing: work not worth folding, effects kept, expansions recomputed, fallbacks."""
        out = [str(u) for u in self.unfolded]
        if self.effects_kept:
            out.append(
                f"effectful equations kept although their inputs were known: {_fmt(self.effects_kept)}"
            )
        if self.rematerialized:
            out.append(
                "cheap expansions recomputed by the residual program instead of stored: "
                f"{_fmt(self.rematerialized)}"
            )
        out.extend(self.fallbacks)
        return out

    def __str__(self) -> str:
        buffers = self.buffers
        lines = [
            f"folded {_count(self.folded_eqns, 'equation')} ({_fmt(self.folded)})",
            f"residual {_count(self.residual_eqns, 'equation')} ({_fmt(self.residual)})",
            f"folded constants: {_count(len(buffers), 'buffer')}, {self.folded_bytes:,} bytes; "
            f"{_count(len(self.literals), 'literal')}",
            f"fold time: {self.fold_seconds * 1e3:.1f} ms ({_batches(self.backends)})",
        ]
        lines.append(
            f"estimated FLOPs per call: {self.flops_removed:.3g} removed, {self.flops_residual:.3g} left"
        )
        if self.eliminated_branches:
            lines.append(f"branches eliminated: {self.eliminated_branches}")
        if self.hoisted:
            lines.append(f"hoisted out of loops and branches: {_fmt(self.hoisted)}")
        if self.eager_evaluations:
            lines.append(f"evaluated without abstract evaluation: {_fmt(self.eager_evaluations)}")
        lines.extend(f"affine region collapsed: {c}" for c in self.collapsed)
        lines.extend(f"note: {w}" for w in self.warnings)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Both jaxprs side by side, folded equations of the original marked."""
        style = {
            FOLDED: "color:#1e7b34;background:#e6f4ea", RESIDUAL: "", EFFECT: "background:#fce8e6",
            "recomputed": "background:#fff4e5",
        }

        def panel(title, closed, marks):
            header, lines, footer = format_jaxpr(closed)
            rows = [html.escape(header)]
            for line, mark in zip(lines, marks):
                tag = f"  # {mark}" if mark != RESIDUAL else ""
                rows.append(f'<span style="{style[mark]}">{html.escape(line + tag)}</span>')
            rows.append(html.escape(footer))
            return (
                f'<td style="vertical-align:top;text-align:left"><b>{html.escape(title)}</b>'
                f'<pre style="font-size:85%">{chr(10).join(rows)}</pre></td>'
            )

        # In the residual program, equations on folded constants alone are recomputed expansions.
        after_marks = [
            EFFECT if e.effects else "recomputed" if m == FOLDED else RESIDUAL
            for e, m in zip(self.after.jaxpr.eqns, classify(self.after))
        ]
        cells = []
        if self.before is not None:
            cells.append(panel("before (green: folded)", self.before, self.marks))
        cells.append(panel("after (residual program)", self.after, after_marks))
        return (
            f"<div><pre>{html.escape(str(self))}</pre>"
            f'<table><tr>{"".join(cells)}</tr></table></div>'
        )

    def to_dot(self, name: str = "pejit") -> str:
        """Graphviz DOT text of ``before`` (or ``after`` if unknown), equations coloured.

        Folded equations are green, residual ones orange, effectful ones kept
        although known red; dynamic inputs are blue, constants grey. Render
        with ``dot -Tpng`` (Graphviz is not needed to produce the text).
        """
        closed = self.before if self.before is not None else self.after
        marks = self.marks if self.before is not None else [RESIDUAL] * len(closed.jaxpr.eqns)
        return jaxpr_to_dot(closed, marks, self.known_invars if self.before is not None else (), name)


def classify(closed_jaxpr, known_invars: Sequence[int] = ()) -> list[str]:
    """Mark each equation ``"folded"``, ``"residual"`` or ``"effect"``.

    An equation counts as folded when every input is a literal, a constant
    (``consts`` or an input in ``known_invars``) or the output of a folded
    equation, and it has no effects; ``"effect"`` marks effectful equations
    on known inputs (pejit keeps them). This is an approximation of what the
    folding trace did, read off the original program: a ``cond`` whose
    predicate is known but whose operands are not is marked residual although
    pejit inlines its taken branch, and cheap expansions marked folded may in
    fact be recomputed by the residual program (``report.rematerialized``).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda a, x: jnp.sin(a) * x)(1.0, 2.0)
      >>> classify(cj, known_invars=[0])
      ['folded', 'residual']
    """
    jaxpr = closed_jaxpr.jaxpr
    known = set(jaxpr.constvars) | {jaxpr.invars[i] for i in known_invars}
    marks = []
    for eqn in jaxpr.eqns:
        if not all(isinstance(v, Literal) or v in known for v in eqn.invars):
            marks.append(RESIDUAL)
        elif eqn.effects:
            marks.append(EFFECT)
        else:
            marks.append(FOLDED)
            known.update(eqn.outvars)
    return marks


def _names():
    """a, b, ..., z, ba, bb, ... as JAX names jaxpr variables."""
    for n in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=n):
            if n == 1 or letters[0] != "a":
                yield "".join(letters)


def format_jaxpr(closed_jaxpr) -> tuple[str, list[str], str]:
    """A jaxpr as (header, one line per equation, footer).

    Sub-jaxprs in parameters are elided to ``{...}`` so that each top-level
    equation is one line; long parameters are elided too.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> format_jaxpr(jax.make_jaxpr(lambda x: jnp.sin(x) + 1.0)(2.0))
      ('{ lambda ; a:f32[]. let', ['b:f32[] = sin a', 'c:f32[] = add b 1.0:f32[]'], '  in (c,) }')
    """
    jaxpr = closed_jaxpr.jaxpr
    fresh = _names()
    names: dict[Any, str] = {}

    def bind(v):
        names[v] = "_" if isinstance(v, drop_var) else next(fresh)
        return f"{names[v]}:{_type(v.aval)}"

    def use(v):
        if isinstance(v, Literal):
            return f"{v.val}:{_type(v.aval)}"
        return names[v]

    header = (
        f"{{ lambda {' '.join(bind(v) for v in jaxpr.constvars)}; "
        f"{' '.join(bind(v) for v in jaxpr.invars)}. let"
    )
    lines = []
    for eqn in jaxpr.eqns:
        ins = " ".join(use(v) for v in eqn.invars)
        outs = " ".join(bind(v) for v in eqn.outvars)
        lines.append(f"{outs} = {eqn.primitive.name}{_params(eqn.params)} {ins}".rstrip())
    footer = f"  in ({', '.join(use(v) for v in jaxpr.outvars)},) }}"
    return header, lines, footer


def _params(params: dict) -> str:
    shown = []
    for k, v in params.items():
        if hasattr(v, "eqns") or hasattr(v, "jaxpr") or (
            isinstance(v, (tuple, list)) and v and hasattr(v[0], "jaxpr")
        ):
            shown.append(f"{k}={{...}}")
            continue
        text = str(v)
        if _default_looking(text):
            continue
        shown.append(f"{k}={text if len(text) <= 40 else text[:37] + '...'}")
    return f"[{' '.join(shown)}]" if shown else ""


def _default_looking(text: str) -> bool:
    """Parameters not worth a reader's attention (``None``, ``False``, unset shardings)."""
    parts = text.strip("(),").replace(" ", "").split(",")
    return all(p in ("", "None", "False", "UnspecifiedValue", "Mesh") for p in parts)


_COLORS = {FOLDED: "#b7e1cd", RESIDUAL: "#f9cb9c", EFFECT: "#ea9999"}


def jaxpr_to_dot(closed_jaxpr, marks: Sequence[str], known_invars: Sequence[int] = (), name: str = "jaxpr") -> str:
    """Graphviz DOT text of a jaxpr: one node per input and equation, edges for data flow.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda a, x: jnp.sin(a) * x)(1.0, 2.0)
      >>> print(jaxpr_to_dot(cj, classify(cj, [0]), [0]))  # doctest: +ELLIPSIS
      digraph "jaxpr" {
      ...
        e0 [label="sin\\nf32[]", shape=box, style="rounded,filled", fillcolor="#b7e1cd"];
      ...
    """
    jaxpr = closed_jaxpr.jaxpr

    def q(text: str) -> str:
        return '"' + text.replace('"', '\\"') + '"'

    lines = [
        f"digraph {q(name)} {{",
        '  rankdir=TB; node [fontname="Helvetica", fontsize=10]; edge [color="#666666"];',
    ]
    producer: dict[Any, str] = {}
    for i, v in enumerate(jaxpr.constvars):
        producer[v] = f"c{i}"
        lines.append(
            f'  c{i} [label={q("constant " + _type(v.aval))}, shape=box, style=filled, fillcolor="#dddddd"];'
        )
    for i, v in enumerate(jaxpr.invars):
        producer[v] = f"in{i}"
        known = i in set(known_invars)
        label = f"{'constant' if known else 'input'} {i}: {_type(v.aval)}"
        color = "#dddddd" if known else "#cfe2ff"
        lines.append(f'  in{i} [label={q(label)}, shape=box, style=filled, fillcolor="{color}"];')
    for j, (eqn, mark) in enumerate(zip(jaxpr.eqns, marks)):
        node = f"e{j}"
        outs = ", ".join(_type(v.aval) for v in eqn.outvars)
        text = f"{eqn_label(eqn.primitive, eqn.params)}\\n{outs}"  # DOT's line break
        lines.append(
            f'  {node} [label={q(text)}, shape=box, style="rounded,filled", fillcolor="{_COLORS[mark]}"];'
        )
        for v in dict.fromkeys(v for v in eqn.invars if not isinstance(v, Literal)):
            lines.append(f"  {producer[v]} -> {node};")
        for v in eqn.outvars:
            producer[v] = node
    for k, v in enumerate(jaxpr.outvars):
        lines.append(f'  out{k} [label="output {k}", shape=plaintext];')
        if not isinstance(v, Literal):
            lines.append(f"  {producer[v]} -> out{k};")
    lines.extend(_legend(q))
    lines.append("}")
    return "\n".join(lines)


def _legend(q) -> list[str]:
    """A DOT cluster explaining the colours, in the graph's own node styles."""
    keys = [
        ("input (dynamic)", "box", "filled", "#cfe2ff"),
        ("constant", "box", "filled", "#dddddd"),
        ("folded (computed once)", "box", "rounded,filled", _COLORS[FOLDED]),
        ("residual (runs every call)", "box", "rounded,filled", _COLORS[RESIDUAL]),
        ("effect kept (inputs known)", "box", "rounded,filled", _COLORS[EFFECT]),
    ]
    lines = ['  subgraph cluster_legend {', '    label="legend"; fontname="Helvetica"; fontsize=10; color="#999999";']
    for i, (text, shape, style, color) in enumerate(keys):
        lines.append(f'    legend{i} [label={q(text)}, shape={shape}, style="{style}", fillcolor="{color}"];')
    lines.append("    " + " -> ".join(f"legend{i}" for i in range(len(keys))) + " [style=invis];")
    lines.append("  }")
    return lines


def _type(aval) -> str:
    """``f32[3,3]``, as jaxprs print types."""
    try:
        return aval.str_short(short_dtypes=True)
    except TypeError:  # abstract values without the option (tokens, ...)
        return aval.str_short()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _fmt(counter: Counter) -> str:
    return ", ".join(f"{k} x{v}" for k, v in counter.most_common()) or "none"


def _aval(x):
    import jax

    return jax.typeof(x)


def _batches(backends: Counter) -> str:
    if not backends:
        return "no batches"
    n = sum(backends.values())
    return f"{n} batch{'' if n == 1 else 'es'}: " + ", ".join(f"{n} {b}" for b, n in sorted(backends.items()))
