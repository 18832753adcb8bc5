"""Partial evaluation of a Python function or a jaxpr, and its result.

:func:`fold` traces a flat function with the folding policy and returns a
:class:`Residual`; :func:`specialize_jaxpr` is the same thing for a jaxpr
built by anything, without re-tracing Python.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr

from .. import _compat
from . import _collapse, _cse
from .._fold._abstract import is_abstract
from .._fold._values import nbytes
from .._fold._folding import Folder, replay
from .._fold._offload import Kernels
from .._fold._options import FoldOptions
from .._fold._stats import FoldStats, noting
from .._fold._gc import pausing
from .._fold._host import remembering
from .._fold._primitives import FUSES_OPERANDS, prune
from .._fold._progress import Progress
from .._reports._report import FoldReport
from .._fold._staging import trace_staging
from .._fold._values import content_key, uniform_value


#: What Python raises when it needs the concrete value of a tracer.
_NEEDS_CONCRETE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)


@dataclasses.dataclass(frozen=True)
class Residual:
    """The residual program of one specialization.

    Attributes:
      jaxpr: takes the dynamic (flattened) inputs; its ``consts`` are the
        folded values the residual program still needs.
      report: what was folded, what stayed, and what it cost.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import specialize_jaxpr
      >>> cj = jax.make_jaxpr(lambda a, x: jnp.exp(a) * x)(1.0, 2.0)
      >>> res = specialize_jaxpr(cj, known={0: 0.0})
      >>> [e.primitive.name for e in res.jaxpr.eqns]
      ['mul']
      >>> float(jax.extend.core.jaxpr_as_fun(res.jaxpr)(3.0)[0])
      3.0
    """

    jaxpr: ClosedJaxpr
    report: FoldReport
    stats: FoldStats | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def consts(self) -> list[Any]:
        return list(self.jaxpr.consts)

    def open_jaxpr(self):
        """The jaxpr with the folded constants as leading inputs."""
        return _compat.open_jaxpr(self.jaxpr)[0]


@remembering()
def fold(
    fun: Callable[..., Sequence[Any]],
    in_avals: Sequence[Any],
    options: FoldOptions = FoldOptions(),
    *,
    name: str = "pejit",
    before: ClosedJaxpr | None = None,
    known_invars: tuple[int, ...] = (),
    fallbacks: tuple[str, ...] = (),
    abstract: bool = False,
    progress: Progress | None = None,
    kernels: Kernels | None = None,
) -> Residual:
    """Trace ``fun`` (flat arrays in, flat list out), folding known work.

    A trace that fails because Python needed a concrete value inside a loop
    body or branch is retried with JAX folding eagerly inside bodies, unless
    the constants are ``abstract`` (a folding program's trace, see
    :mod:`pejit._fold._abstract`): that would not help. Its batches are staged,
    not run, so no kernel starts while it is traced (see :mod:`pejit._fold._offload`),
    but for those on the first value that ``kernels`` were
    :meth:`~pejit._fold._offload.Kernels.given`, which go on after the fold.
    ``progress`` is told of the batches (see `pejit._fold._progress`).
    """
    start = time.perf_counter()
    try:
        folder = Folder(options, progress, early_kernels=not abstract, kernels=kernels)
        with noting(folder.stats.notes):
            jaxpr, consts = trace_staging(fun, in_avals, folder, name=name)
    except _NEEDS_CONCRETE:
        if abstract:
            raise
        # Python needed a concrete value inside a loop body or branch, which
        # pejit traces abstractly (so that effects there stay); let JAX fold
        # eagerly inside bodies instead. A genuinely dynamic value fails again.
        folder = Folder(options, progress)
        with noting(folder.stats.notes):
            jaxpr, consts = trace_staging(fun, in_avals, folder, name=name, eager_bodies=True)
    jaxpr, consts = prune(jaxpr, consts)
    jaxpr = _cse.eliminate(jaxpr)  # so that the collapse costs a shared primal once
    if options.affine:
        jaxpr, consts, collapsed = _collapse.collapse(jaxpr, consts, options.affine_max_bytes, options.backend)
        if collapsed:
            folder.stats.collapsed.extend(collapsed)
            jaxpr, consts = prune(jaxpr, consts)
    if options.literals:
        jaxpr, consts = _inline_scalars(jaxpr, consts)
        plan = share_constants(jaxpr, consts)
        if plan is not None:  # equal constants are one now, so are the products on them
            jaxpr, consts = _cse.eliminate(plan.jaxpr), plan.select(consts)
    consts = [to_device(c) for c in consts]
    # Folding is only done when its results are: wait for the concrete ones,
    # all at once. Abstract constants (tracers of a folding program being
    # traced) have nothing to wait for, and asking a tracer for
    # ``block_until_ready`` builds JAX's error message (tens of ms each).
    jax.block_until_ready([c for c in consts if not is_abstract(c)])
    seconds = time.perf_counter() - start
    closed = _compat.close_jaxpr(jaxpr, consts)
    report = FoldReport.build(
        folder.stats, closed, seconds, before=before, known_invars=known_invars, fallbacks=fallbacks
    )
    return Residual(closed, report, folder.stats)


@pausing
def specialize_jaxpr(
    closed_jaxpr: ClosedJaxpr,
    known: Mapping[int, Any],
    options: FoldOptions = FoldOptions(),
) -> Residual:
    """Partially evaluate ``closed_jaxpr`` with some inputs known.

    This is the entry point for compilers that build jaxprs directly: no
    Python function is re-traced. ``known`` maps input positions to values;
    the residual jaxpr takes the remaining inputs, in order.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import specialize_jaxpr
      >>> cj = jax.make_jaxpr(lambda a, x: jnp.linalg.inv(a) @ x)(jnp.eye(2), jnp.ones(2))
      >>> spec = specialize_jaxpr(cj, known={0: 2 * jnp.eye(2)})
      >>> [e.primitive.name for e in spec.jaxpr.eqns]
      ['dot_general']
      >>> jax.jit(jax.extend.core.jaxpr_as_fun(spec.jaxpr))(jnp.ones(2))
      [Array([0.5, 0.5], dtype=float32)]
    """
    if not isinstance(closed_jaxpr, ClosedJaxpr):
        raise TypeError(
            "specialize_jaxpr: closed_jaxpr must be a jax.extend.core.ClosedJaxpr "
            f"(e.g. from jax.make_jaxpr), got {type(closed_jaxpr).__name__}"
        )
    invars = closed_jaxpr.jaxpr.invars
    for i in known:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"specialize_jaxpr: known key {i!r} is not an integer input position")
        if not -len(invars) <= i < len(invars):
            raise ValueError(
                f"specialize_jaxpr: known key {i} is out of range for a jaxpr "
                f"with {len(invars)} inputs"
            )
    known = {int(i) % len(invars): v for i, v in known.items()}
    for i, value in known.items():
        try:
            got = _compat.typeof(value)
        except TypeError:
            raise TypeError(
                f"specialize_jaxpr: known[{i}] is a {type(value).__name__}, not an array or scalar"
            ) from None
        want = invars[i].aval
        if (want.shape, want.dtype) != (got.shape, got.dtype):
            raise TypeError(
                f"specialize_jaxpr: known[{i}] has type {got.str_short()}, "
                f"but input {i} of the jaxpr is {want.str_short()}"
            )
    unknown_avals = [v.aval for i, v in enumerate(invars) if i not in known]

    def interpret(*unknown):
        it = iter(unknown)
        args = [known[i] if i in known else next(it) for i in range(len(invars))]
        return replay(_compat.core_trace(), closed_jaxpr, args)

    return fold(
        interpret, unknown_avals, options, name="specialize_jaxpr", before=closed_jaxpr,
        known_invars=tuple(sorted(known)),
    )


def _inline_scalars(jaxpr, consts):
    """Turn folded scalars into literals; larger constants stay inputs.

    A literal is visible to XLA (e.g. ``x * 1.0`` simplifies) and costs no
    argument; an array constant is passed as a device buffer, so its size
    never reaches the HLO text or compile time. ``jaxpr`` is open, its
    leading inputs the constants.
    """
    outputs = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}  # stay arrays
    constvars = jaxpr.invars[: len(consts)]
    literals = {}
    for var, c in zip(constvars, consts):
        # (a token has no dtype: it stays an input, as jax.jit passes it)
        scalar = isinstance(var.aval, _compat.ShapedArray) and np.shape(c) == () and not jax.dtypes.issubdtype(
            var.aval.dtype, jax.dtypes.extended)
        # An abstract constant differs per specialization: it stays an input.
        if scalar and var not in outputs and not is_abstract(c):
            literals[var] = _compat.literal(np.asarray(c)[()], var.aval)
    if not literals:
        return jaxpr, consts

    def sub(atoms):
        return [literals.get(a, a) if isinstance(a, _compat.Var) else a for a in atoms]

    eqns = [e.replace(invars=sub(e.invars)) for e in jaxpr.eqns]
    kept = [(v, c) for v, c in zip(constvars, consts) if v not in literals]
    invars = [*(v for v, _ in kept), *jaxpr.invars[len(consts):]]
    return _compat.with_invars(jaxpr.replace(eqns=eqns), invars), [c for _, c in kept]


@dataclasses.dataclass(frozen=True)
class SharePlan:
    """Which folded constants are passed, which are equal, which uniform.

    Derivative code folds to many copies of the same arrays, most of them
    zeros or ones (TFC's basis tangents: ``zeros + H * ones``): most of a
    PDE program's folded constants are uniform, and few of the others
    distinct. Each constant passed is an argument of the compiled program
    (a cost per call), and XLA can neither share work on equal arguments
    nor simplify with a value it cannot see. So a uniform array that only
    fusing equations read (see ``FUSES_OPERANDS``) becomes
    ``broadcast_in_dim`` of a literal, and equal arrays one argument (equal
    equations on them become common subexpressions for XLA).

    ``jaxpr`` is the residual rewritten so; ``keep`` the positions of the
    constants it still takes. A value-independent folding program (see
    ``_specializer``) applies the plan of its first value to later values when
    :meth:`select` finds it holds for them.
    """

    jaxpr: Any
    keep: tuple[int, ...]
    splats: tuple[tuple[int, Any], ...]
    equal: tuple[tuple[int, int], ...]  # (position, position of the kept equal one)

    def select(self, consts: Sequence[Any]) -> list[Any] | None:
        """The constants to pass, or ``None`` if ``consts`` break the plan."""
        for i, value in self.splats:
            got = uniform_value(consts[i])
            if got is None or got.tobytes() != value.tobytes():
                return None
        for i, j in self.equal:
            if content_key(consts[i]) != content_key(consts[j]):
                return None
        return [consts[i] for i in self.keep]


def share_constants(jaxpr, consts: Sequence[Any]) -> SharePlan | None:
    """Plan how to pass ``consts`` (see :class:`SharePlan`); ``None``: as they are.

    Tracers (abstract constants of a folding program) are merged only when
    they are the same object.
    """
    outputs = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}
    rename: dict[Any, Any] = {}
    splats, eqns, keep, equal = [], [], [], []
    seen: dict[Any, int] = {}
    # only constants that have a twin in shape and dtype are hashed
    kinds = Counter((np.shape(c), str(getattr(c, "dtype", type(c)))) for c in consts)
    # XLA recomputes a broadcast inside a fusing consumer for free, but
    # materializes it for any other (a large splat feeding a dot_general
    # costs several times a stored one, zeros included)
    unfused = {v for e in jaxpr.eqns if e.primitive not in FUSES_OPERANDS for v in e.invars
               if isinstance(v, _compat.Var)}
    constvars = jaxpr.invars[: len(consts)]  # ``jaxpr`` is open
    for i, (var, c) in enumerate(zip(constvars, consts)):
        value = None if var in outputs or var in unfused else uniform_value(c)
        twin = kinds[np.shape(c), str(getattr(c, "dtype", type(c)))] > 1
        key = content_key(c) if twin else ("id", id(c))
        # equal contents of another weak type are another value (an output keeps its own)
        key = (key, getattr(var.aval, "weak_type", False))
        if value is not None:
            splats.append((i, value))
            eqns.append(_splat(var, value))
        elif key in seen:
            rename[var] = constvars[seen[key]]
            equal.append((i, seen[key]))
        else:
            seen[key] = i
            keep.append(i)
    if not rename and not splats:
        return None

    def sub(atoms):
        return [rename.get(a, a) if isinstance(a, _compat.Var) else a for a in atoms]

    eqns += [e.replace(invars=sub(e.invars)) for e in jaxpr.eqns]
    invars = [*(constvars[i] for i in keep), *jaxpr.invars[len(consts):]]
    jaxpr = _compat.with_invars(jaxpr.replace(eqns=eqns, outvars=sub(jaxpr.outvars)), invars)
    return SharePlan(jaxpr, tuple(keep), tuple(splats), tuple(equal))


def _splat(var, value):
    """The equation ``var = broadcast_in_dim(value)`` (a literal scalar)."""
    scalar = _compat.ShapedArray((), var.aval.dtype)
    template = jax.make_jaxpr(lambda s: jax.lax.broadcast_in_dim(s, var.aval.shape, ()))(
        np.zeros((), var.aval.dtype)
    ).eqns[0]
    literal = _compat.Literal(np.asarray(value, var.aval.dtype)[()], scalar)
    return _compat.new_jaxpr_eqn([literal], [var], template.primitive, template.params, set())


def to_device(c):
    """Folded constants live on device: NumPy results are copied once.

    A ``jax.Array`` already does, and a token is not data (jax.jit passes it as it is).
    """
    if isinstance(c, (jax.Array, _compat.Token)):
        return c
    return jax.device_put(np.asarray(c))


__all__ = ["Residual", "SharePlan", "fold", "share_constants", "specialize_jaxpr", "to_device", "nbytes", "FoldStats"]
