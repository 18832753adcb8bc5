"""What a specialization is made of: residual program, folding program, constants.

Specializations of one *structure* of constants (shapes, dtypes, static
values; see :func:`pejit._specializer.specialize`) share a :class:`Program`: the residual
jaxpr, its runner and its executable, and, when tracing did not depend on
constant values, the :class:`FoldingProgram` that maps new constant values
to new folded constants. A :class:`Specialization` adds the folded
constants of one value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, jaxpr_as_fun

from . import _compat
from ._folding import FoldStats
from ._report import FoldReport
from ._residual import Residual

_tree_leaves = jax.tree_util.tree_leaves
_tree_unflatten = jax.tree_util.tree_unflatten


class Program:
    """What specializations of one structure share: residual program, executables.

    ``folding_program`` is the folding program (constant array leaves in, folded
    constants out) when tracing did not depend on constant values; then a
    new constant value costs one run of it. It is None for a value-dependent
    specialization, which owns its program alone.
    """

    __slots__ = ("jaxpr", "nconsts", "out_tree", "stats", "fallbacks", "run", "folding_program")

    def __init__(
        self, jaxpr, nconsts: int, out_tree, stats: FoldStats, fallbacks: tuple[str, ...], run: Callable,
        folding_program: FoldingProgram | None,
    ):
        self.jaxpr = jaxpr  # the open residual jaxpr; its first nconsts inputs are the folded constants
        self.nconsts = nconsts
        self.out_tree = out_tree
        self.stats = stats  # what the trace folded, for the reports of its specializations
        self.fallbacks = fallbacks
        self.run = run  # run(*consts, *dyn_args, **dyn_kwargs)
        self.folding_program = folding_program


class FoldingProgram:
    """Constant arrays in, folded constants out: a value-independent fold.

    The first value is folded by evaluating the program's jaxpr equation by
    equation, as folding while tracing would (no compilation, so a first
    call costs what eager folding costs). A second value means values do
    change: the program is then compiled once, and each new value costs one
    run of it. One that cannot be compiled (a primitive with only an
    ``impl``) keeps being evaluated equation by equation.
    """

    def __init__(self, traced: jax.stages.Traced):
        self.traced = traced
        self.compiled: Callable | None = None
        self._compilable = True

    def evaluate(self, *arrays) -> list:
        return jaxpr_as_fun(self.traced.jaxpr)(*arrays)

    def __call__(self, *arrays) -> list:
        if self.compiled is None and self._compilable:
            try:
                self.compiled = self.traced.lower().compile()
            except Exception:  # no lowering for some folded primitive
                self._compilable = False
        if self.compiled is None:
            return self.evaluate(*arrays)
        return self.compiled(*arrays)


class PerValue(NamedTuple):
    """Marks a structure whose trace depends on constant values, or whose
    residual keeps control flow (see :func:`pejit._specializer.trace_program`): each value is folded
    by tracing the function again, with concrete constants. ``reason`` goes
    into the report's ``fallbacks``, so that this is never silent."""

    reason: str


class Specialization:
    """One specialization: folded constants and the program that uses them.

    ``call(*dyn_args, **dyn_kwargs)`` runs the residual program with the
    folded constants bound. It is a ``functools.partial`` of the runner so
    that a cached call costs one C-level call on top of the runner's own
    ``jax.jit`` dispatch.
    """

    __slots__ = ("program", "consts", "call", "fold_seconds", "_residual")

    def __init__(self, program: Program, consts: list, fold_seconds: float, residual: Residual | None = None):
        self.program = program
        self.consts = consts
        self.call = functools.partial(program.run, *consts)
        self.fold_seconds = fold_seconds
        self._residual = residual

    @property
    def run(self) -> Callable:
        return self.program.run

    @property
    def out_tree(self):
        return self.program.out_tree

    @property
    def residual(self) -> Residual:
        if self._residual is None:
            program = self.program
            closed = _compat.close_jaxpr(program.jaxpr, self.consts)
            report = FoldReport.build(program.stats, closed, self.fold_seconds, fallbacks=program.fallbacks)
            self._residual = Residual(closed, report, program.stats)
        return self._residual

    @property
    def report(self) -> FoldReport:
        return self.residual.report


def has_control_flow(jaxpr) -> bool:
    """Whether ``jaxpr`` has an equation with a sub-jaxpr other than a plain call."""
    for eqn in jaxpr.eqns:
        subs = [
            sub for v in eqn.params.values() for sub in (v if isinstance(v, (tuple, list)) else (v,))
            if isinstance(sub, (Jaxpr, ClosedJaxpr))
        ]
        if subs and eqn.primitive is not _compat.jit_p:
            return True
        if any(has_control_flow(getattr(sub, "jaxpr", sub)) for sub in subs):
            return True
    return False


def runner(jaxpr, nconsts: int, out_tree) -> Callable:
    """``run(*consts, *dyn_args, **dyn_kwargs)`` evaluating an open residual jaxpr.

    ``jaxpr``'s first ``nconsts`` inputs (the folded constants) are leading
    arguments, so they reach XLA as buffers, not as HLO literals; flat rather
    than in one list, which ``jax.jit``'s dispatch would flatten on every call.
    """
    fun = jaxpr_as_fun(_compat.close_jaxpr(jaxpr, ()))
    # An output that is a literal (a folded Python scalar) comes back from the
    # interpreter as that scalar; jax.jit would return an array.
    literal_outs = {
        i: jax.device_put(v.val) for i, v in enumerate(jaxpr.outvars) if isinstance(v, _compat.Literal)
    }

    def run(*args, **dyn_kwargs):
        outs = fun(*args[:nconsts], *_tree_leaves((args[nconsts:], dyn_kwargs)))
        for i, value in literal_outs.items():
            outs[i] = value
        return _tree_unflatten(out_tree, outs)

    return run
