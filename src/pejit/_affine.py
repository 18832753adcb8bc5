"""Residual algebra: collapse regions affine in the dynamic inputs into one matrix.

After folding, a residual equation whose inputs include a dynamic value stays,
even when everything it does with that value is linear: TFC's PDE step
``xi - lstsq(J, L(xi))`` leaves 1440 such equations (9.65e6 FLOPs per call)
where one 101x101 matrix-vector product would do. This pass finds the
*affine regions* of the residual program (equations that the rules in
:mod:`pejit.rules.affine` say are affine in their varying inputs, given which
inputs are known), groups them into connected components, and replaces a
component by ``M @ concat(sources) + c`` per output where a cost model says
that pays. ``M`` is the region's Jacobian, built at fold time by ``jax.jvp``
of the region over the unit basis of its inputs, and ``c`` the region at
zero; both are ordinary JAX computations on the folded constants, so they
fold concretely (the TFC form, ``specialize_jaxpr``) or are staged into a
folding program when the constants are abstract (the call-time form).

Collapsing covers reassociation too: ``C1 @ (C2 @ x)`` becomes ``(C1 @ C2)
@ x`` when the product is smaller to apply than the chain, and a sub-region
collapses on its own: in ``tanh(A @ (B @ x) + C @ x)`` the argument of
``tanh`` does.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from pejit import specialize_jaxpr
  >>> A, B = jnp.ones((8, 64)), jnp.ones((64, 8))
  >>> cj = jax.make_jaxpr(lambda A, B, x: jnp.tanh(A @ (B @ x) + 2 * x))(A, B, jnp.ones(8))
  >>> spec = specialize_jaxpr(cj, known={0: A, 1: B})
  >>> [e.primitive.name for e in spec.jaxpr.eqns]
  ['dot_general', 'tanh']
  >>> print(spec.report.collapsed[0])
  4 equations, 8 -> 8 elements: 2.06e+03 -> 128 FLOPs per call, 256 bytes stored
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.interpreters import mlir
from jax.extend.core import Primitive
from jax.extend.core import primitives as P

from . import _batch, _compat, _linear
from ._batch import nbytes
from ._flops import eqn_flops
from .rules.affine import ADDITIVE, affine_rules, register_affine_rule

#: Kinds of residual values: computed from folded constants alone, affine in
#: the dynamic inputs (the inputs themselves included), anything else.
CONST, AFFINE, OTHER = "const", "affine", "other"

#: A collapse must bring the per-call cost (FLOPs plus bytes read) of its
#: region down to this fraction at least: the estimate is rough, and the
#: fold-time work of building the matrix must be worth it.
PAYS = 0.75

#: The most FLOPs building one region's matrix may take (its inputs times
#: the region's FLOPs per call): about a second here, the order of folding
#: the ``inv`` and ``cholesky`` of a 1000x1000 matrix.
BUILD_FLOPS = 8e9

#: The same for a matrix the host builds (``pejit._linear``: NumPy's BLAS,
#: nothing compiled, concrete constants): TFC's full-size WaveEquation2D
#: region (651 inputs, 2.8e8 estimated FLOPs per call: 1.8e11 to build)
#: builds in about a second, and its residual then runs 60 times faster.
HOST_BUILD_FLOPS = 1e12

#: The fixed cost per call of one more kernel, in the cost model's units
#: (FLOPs, bytes read): on a CPU, XLA runs each product as a kernel of its
#: own, for a microsecond or two (measured on TFC's ODE: a 100x29 float64
#: matrix-vector product costs about as much again to launch as to compute).
KERNEL = 5000.0

#: Memory the fold-time Jacobian may use at once (the region is evaluated
#: on this many basis vectors together).
BUILD_BYTES = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class Collapse:
    """One affine region replaced by one matrix and one offset per output.

    Attributes:
      eqns: equations of the region.
      inputs: elements of the dynamic values the region reads.
      outputs: elements of the values it produces for the rest of the program.
      flops_before: estimated FLOPs per call of the region (`pejit._flops`).
      flops_after: FLOPs per call of its matrices and offsets.
      bytes_stored: bytes of the matrices and offsets.
    """

    eqns: int
    inputs: int
    outputs: int
    flops_before: float
    flops_after: float
    bytes_stored: int

    def __str__(self) -> str:
        return (
            f"{self.eqns} equations, {self.inputs} -> {self.outputs} elements: "
            f"{self.flops_before:.3g} -> {self.flops_after:.3g} FLOPs per call, "
            f"{self.bytes_stored:,} bytes stored"
        )


def _real(aval) -> bool:
    # jax.dtypes', not NumPy's: extended dtypes (PRNG keys) are no NumPy type;
    # a dtype with no zero (float8_e8m0fnu: 0 is NaN) has no matrix of the map
    return jax.dtypes.issubdtype(aval.dtype, np.floating) and _has_zero(aval.dtype)


@functools.cache
def _has_zero(dtype) -> bool:
    return bool(np.asarray(0, dtype) == 0)


def classify(jaxpr, known: Sequence[bool]) -> dict[Any, str]:
    """The kind of every variable of ``jaxpr`` (open), given which inputs are ``known``.

    One loop over the equations: an equation on known values alone is
    known (``CONST``), one whose rule says it is affine in its other inputs
    is ``AFFINE``, any other (effects, no rule, integers) is ``OTHER``.
    """
    kinds = {v: CONST for v in jaxpr.constvars}
    kinds.update((v, CONST if k else AFFINE) for v, k in zip(jaxpr.invars, known))

    def kind(a) -> str:
        return CONST if isinstance(a, _compat.Literal) else kinds[a]

    for eqn in jaxpr.eqns:
        ins = [kind(a) for a in eqn.invars]
        rule = affine_rules.get(eqn.primitive)
        if eqn.effects:
            out = OTHER
        elif all(k == CONST for k in ins):
            out = CONST
        elif (
            rule is not None
            and all(_real(v.aval) for v in eqn.outvars)
            and all(_real(a.aval) for a, k in zip(eqn.invars, ins) if k != CONST)
            and rule(eqn, [k == CONST for k in ins])
        ):
            out = AFFINE
        else:
            out = OTHER
        kinds.update((v, out) for v in eqn.outvars)
    return kinds


@register_affine_rule(_compat.jit_p, P.closed_call_p, P.custom_jvp_call_p)
def _call(eqn, known: Sequence[bool]) -> bool:
    """A call is affine when its body is (for ``custom_jvp``: the primal computation)."""
    return is_affine(eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr"), known)


def offsets(jaxpr, kinds: dict[Any, str], zero_inputs: Sequence[bool] = ()) -> set[Any]:
    """The affine values of ``jaxpr`` that may have an offset (a map with none is linear).

    Known from the structure, not from values, so that a folding program
    (abstract constants) decides as a concrete fold does: an offset enters
    where a known operand is added in (see ``ADDITIVE``), unless it is a
    zero literal, maybe converted or broadcast (``jnp.pad``'s padding), or
    from a call whose body has one. ``zero_inputs`` says which inputs are
    zeros.
    """
    zeros = {v for v, z in zip(jaxpr.invars, zero_inputs) if z}

    def zero(a) -> bool:
        return (not np.any(a.val)) if isinstance(a, _compat.Literal) else a in zeros

    out: set[Any] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive in _KEEPS_ZERO and all(map(zero, eqn.invars)):
            zeros.update(eqn.outvars)
        if not any(kinds.get(v) == AFFINE for v in eqn.outvars):
            continue
        known = [isinstance(a, _compat.Literal) or kinds[a] == CONST for a in eqn.invars]
        body = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        if body is not None:
            inner = getattr(body, "jaxpr", body)
            inner_kinds = classify(inner, known)
            shifted = offsets(inner, inner_kinds, [zero(a) for a in eqn.invars])
            # an output known inside the call is an offset too
            has = any(
                (isinstance(v, _compat.Var) and v in shifted)
                or ((isinstance(v, _compat.Literal) or inner_kinds[v] == CONST) and not zero(v))
                for v in inner.outvars
            )
        else:
            additive = ADDITIVE.get(eqn.primitive, lambda n: ())(len(eqn.invars))
            has = any(isinstance(a, _compat.Var) and a in out for a in eqn.invars) or any(
                known[i] and not zero(eqn.invars[i]) for i in additive
            )
        if has:
            out.update(eqn.outvars)
    return out


#: Known equations whose output is zero when their inputs are.
_KEEPS_ZERO = frozenset([P.convert_element_type_p, P.broadcast_in_dim_p, P.reshape_p, P.copy_p])


def is_affine(closed, known: Sequence[bool]) -> bool:
    """Whether every output of ``closed`` (a jaxpr) is affine in its inputs that are not ``known``.

    ``AFFINE`` values are affine in whatever varying values they read, some
    perhaps computed nonlinearly inside (``2 * sin(v)``); an output counts
    only if everything varying it reads goes back to the inputs through
    affine equations.
    """
    jaxpr = getattr(closed, "jaxpr", closed)
    kinds = classify(jaxpr, known)
    pure = {v for v, k in zip(jaxpr.invars, known) if not k}
    for eqn in jaxpr.eqns:
        varying = [a for a in eqn.invars if isinstance(a, _compat.Var) and kinds[a] != CONST]
        if kinds.get(eqn.outvars[0]) == AFFINE and all(a in pure for a in varying):
            pure.update(eqn.outvars)
    return all(isinstance(v, _compat.Literal) or kinds[v] == CONST or v in pure for v in jaxpr.outvars)


@dataclasses.dataclass
class _Region:
    """A connected component of affine equations, by position in the residual."""

    eqns: list[int]
    roots: list[Any]  # its values that the rest of the program reads
    sources: list[Any]  # the varying values it reads
    root_sources: dict[Any, list[Any]]  # per root, the sources it depends on
    deps: dict[Any, frozenset] = dataclasses.field(default_factory=dict)  # per value, its sources


def _regions(jaxpr, kinds: dict[Any, str]) -> list[_Region]:
    """The affine regions of ``jaxpr``, in program order."""
    eqns = jaxpr.eqns
    producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
    inside = [any(kinds.get(v) == AFFINE for v in e.outvars) for e in eqns]
    parent = list(range(len(eqns)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def internal(a) -> bool:
        return isinstance(a, _compat.Var) and a in producer and inside[producer[a]]

    deps: dict[Any, frozenset] = {}
    for i, e in enumerate(eqns):
        if not inside[i]:
            continue
        srcs: set = set()
        for a in e.invars:
            if internal(a):
                parent[find(i)] = find(producer[a])
                srcs |= deps[a]
            elif isinstance(a, _compat.Var) and kinds[a] != CONST:
                srcs.add(a)
        deps.update((v, frozenset(srcs)) for v in e.outvars)
    read_outside = [a for i, e in enumerate(eqns) if not inside[i] for a in e.invars if internal(a)]
    roots = list(dict.fromkeys([*read_outside, *(a for a in jaxpr.outvars if internal(a))]))
    regions: dict[int, _Region] = {}
    for i in range(len(eqns)):
        if inside[i]:
            regions.setdefault(find(i), _Region([], [], [], {})).eqns.append(i)
    for r in roots:
        regions[find(producer[r])].roots.append(r)
    order = {v: k for k, v in enumerate([*jaxpr.invars, *producer])}
    for region in regions.values():
        region.root_sources = {r: sorted(deps[r], key=order.__getitem__) for r in region.roots}
        region.sources = sorted(set().union(*region.root_sources.values()), key=order.__getitem__)
        region.deps = {v: deps[v] for i in region.eqns for v in eqns[i].outvars if v in deps}
    return [r for r in regions.values() if r.roots]


def _size(v) -> int:
    return math.prod(v.aval.shape)


def _matrix_cost(v, n_in: int, shifted: set[Any]) -> tuple[float, int]:
    """``(FLOPs per call, bytes stored)`` of computing ``v`` as ``M @ sources + c``."""
    n_out = _size(v)
    offset = n_out if v in shifted else 0
    return 2 * n_out * n_in + offset, (n_out * n_in + offset) * np.dtype(v.aval.dtype).itemsize


def _eqn_cost(eqn, kinds) -> float:
    """Per-call cost of an equation: FLOPs plus bytes of known operands read
    (a matrix-vector product is bound by reading its matrix), plus `KERNEL`
    for a product (XLA fuses elementwise equations and data movement into
    their consumers, but runs each product as a kernel of its own)."""
    read = sum(nbytes(a.aval) for a in eqn.invars if isinstance(a, _compat.Var) and kinds[a] == CONST)
    return eqn_flops(eqn) + read + (KERNEL if eqn.primitive is P.dot_general_p else 0.0)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Which values of a region to replace by matrices (``region.roots``), and at what cost per call."""

    region: _Region  # narrowed to what computes the chosen values
    removed: int  # equations no longer computed
    before: float  # their cost
    after: float  # the matrices' cost
    flops_before: float
    flops_after: float
    stored: int


def _plan(jaxpr, region: _Region, kinds, shifted: set[Any]) -> _Plan:
    """The cheapest values of ``region`` to compute as matrix products.

    Collapsing the values the rest of the program reads is not always the
    cheapest cut: TFC's nonlinear ODE reads ``y``, ``y'`` (100 values each)
    and the Jacobian ``J = A2 + diag(y') A0 + diag(y) A1`` (2900 values,
    affine in 29 unknowns too). A matrix for ``J`` costs 84,000 elements;
    matrices for ``y`` and ``y'`` (2,900 each), with the elementwise
    equations from them to ``J`` kept, cost far less. So each value is
    costed both ways, in program order: as a matrix product, or as its
    equation on its inputs' cheapest forms (a tree estimate, which counts a
    shared input once per use); the cut is then read off from the values
    the program reads, and costed exactly (an equation once), against
    collapsing those values alone.
    """
    producer = {v: i for i in region.eqns for v in jaxpr.eqns[i].outvars}
    n_in = {v: sum(map(_size, srcs)) for v, srcs in region.deps.items()}

    def as_matrix(v) -> float:
        flops, stored = _matrix_cost(v, n_in[v], shifted)
        return flops + stored + KERNEL

    cost = {i: _eqn_cost(jaxpr.eqns[i], kinds) for i in region.eqns}
    best: dict[Any, float] = {}
    matrix: set[Any] = set()
    for i in region.eqns:
        eqn = jaxpr.eqns[i]
        inputs = [a for a in eqn.invars if isinstance(a, _compat.Var) and a in producer]
        computed = cost[i] + sum(best[a] for a in inputs)
        for v in eqn.outvars:
            if v in n_in and as_matrix(v) < computed:
                matrix.add(v)
            best[v] = min(computed, as_matrix(v)) if v in n_in else computed
    cut, kept, stack, seen = [], set(), list(region.roots), set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in matrix:
            cut.append(v)
        elif producer[v] not in kept:
            kept.add(producer[v])
            stack.extend(a for a in jaxpr.eqns[producer[v]].invars if isinstance(a, _compat.Var) and a in producer)
    if not cut or sum(map(as_matrix, region.roots)) <= sum(map(as_matrix, cut)) + sum(cost[i] for i in kept):
        cut, kept = region.roots, set()
    removed = [i for i in region.eqns if i not in kept]
    if cut is not region.roots:
        cut = sorted(cut, key=lambda v: producer[v])
        inside, stack = set(), [producer[v] for v in cut]
        while stack:
            i = stack.pop()
            if i not in inside:
                inside.add(i)
                stack.extend(producer[a] for a in jaxpr.eqns[i].invars if isinstance(a, _compat.Var) and a in producer)
        rank = {v: k for k, v in enumerate([*jaxpr.invars, *(v for e in jaxpr.eqns for v in e.outvars)])}
        root_sources = {v: sorted(region.deps[v], key=rank.__getitem__) for v in cut}
        sources = sorted(set().union(*root_sources.values()), key=rank.__getitem__)
        region = _Region(sorted(inside), cut, sources, root_sources, region.deps)
    matrices = [_matrix_cost(v, n_in[v], shifted) for v in cut]
    return _Plan(
        region, len(removed),
        before=sum(cost[i] for i in removed),
        after=sum(map(as_matrix, cut)),
        flops_before=sum(eqn_flops(jaxpr.eqns[i]) for i in removed),
        flops_after=sum(f for f, _ in matrices),
        stored=sum(b for _, b in matrices),
    )


def _sub_jaxpr(jaxpr, n_consts: int, region: _Region, kinds):
    """The region as a jaxpr of (constants it reads, its sources) to its roots.

    Known values it reads that residual equations compute (a recomputed
    expansion) are computed inside, from the constants.
    """
    producer = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    keep, stack = set(region.eqns), list(region.eqns)
    while stack:
        for a in jaxpr.eqns[stack.pop()].invars:
            if isinstance(a, _compat.Var) and kinds[a] == CONST and a in producer and producer[a] not in keep:
                keep.add(producer[a])
                stack.append(producer[a])
    eqns = [jaxpr.eqns[i] for i in sorted(keep)]
    read = {a for e in eqns for a in e.invars if isinstance(a, _compat.Var)}
    constvars = [v for v in jaxpr.invars[:n_consts] if v in read]
    sub = _compat.with_outvars(jaxpr.replace(eqns=eqns), region.roots)
    return _compat.with_invars(sub, [*constvars, *region.sources]), constvars


@dataclasses.dataclass(frozen=True, eq=False)
class _Build:
    """How to build a region's matrices and offsets from the constants it reads.

    Hashed by identity: it is the parameter of an :data:`affine_matrices_p`
    equation.
    """

    sub: Any  # the region as a jaxpr: (constants it reads, its sources) -> its roots
    region: _Region
    batch: int  # unit vectors evaluated together

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.cumsum([0, *map(_size, self.region.sources)])

    def matrices(self, columns, offsets) -> list[Any]:
        """``[M, c]`` per root, from its columns (one row per unit vector) and its value at zero."""
        starts, sources, total = self.starts, self.region.sources, int(self.starts[-1])
        out = []
        for r, cols, c in zip(self.region.roots, columns, offsets):
            picked = np.concatenate([np.arange(starts[k], starts[k + 1])
                                     for k, s in enumerate(sources) if s in self.region.root_sources[r]])
            m = cols.T if len(picked) == total else cols[picked].T
            out.extend([m.astype(r.aval.dtype), c.astype(r.aval.dtype)])
        return out

    def out_avals(self) -> list[Any]:
        out = []
        for r in self.region.roots:
            n_in = sum(map(_size, self.region.root_sources[r]))
            out.extend([_compat.ShapedArray((_size(r), n_in), r.aval.dtype), _compat.ShapedArray(r.aval.shape, r.aval.dtype)])
        return out

    def on_host(self, consts) -> list[Any] | None:
        """By the host rules of :mod:`pejit._linear`: nothing traced or compiled (None where they do not cover the region)."""
        built = _linear.jacobian(self.sub, consts, self.region.sources, self.batch)
        return None if built is None else self.matrices(*zip(*built))

    def by_jvp(self, *consts, loop: bool = False) -> list[Any]:
        """With ``jax.jvp`` along each unit vector, ``batch`` at a time: by ``vmap``, or ``lax.map`` if ``loop``."""
        sources, starts = self.region.sources, self.starts
        total = int(starts[-1])

        def region_at(*xs):
            return _compat.eval_jaxpr(self.sub, [], *consts, *xs)

        zeros = [jax.numpy.zeros(s.aval.shape, s.aval.dtype) for s in sources]

        def column(j):
            unit = [(jax.numpy.arange(_size(s)) == j - start).astype(s.aval.dtype).reshape(s.aval.shape)
                    for s, start in zip(sources, starts)]
            return [t.reshape(-1) for t in jax.jvp(region_at, zeros, unit)[1]]

        if loop:
            columns = lax.map(column, jax.numpy.arange(total), batch_size=self.batch)
        else:
            chunks = [jax.vmap(column)(jax.numpy.arange(i, min(i + self.batch, total)))
                      for i in range(0, total, self.batch)]
            columns = [jax.numpy.concatenate(cs) if len(cs) > 1 else cs[0] for cs in zip(*chunks)]
        return self.matrices(columns, region_at(*zeros))


def _affine_matrices_impl(*consts, build: _Build):
    built = build.on_host(consts)
    return built if built is not None else jax.jit(functools.partial(build.by_jvp, loop=True))(*consts)


#: A region's matrices and offsets as one equation of a folding program
#: (abstract constants, the call-time form): evaluated on the host for the
#: first value, compiled (by ``jax.jvp`` in a loop) when values change.
affine_matrices_p = Primitive("affine_matrices")
#: The same for a region whose build is within `HOST_BUILD_FLOPS` but over
#: `BUILD_FLOPS`: compiled by ``jax.jvp`` it would cost more than folding
#: from scratch (TFC's full-size PDE: minutes), so it has no lowering. The
#: host builds it for every value, as for the TFC form's one value, and a
#: folding program that holds one is evaluated, never compiled: each new
#: value costs what its first did, less the trace, and gets the same
#: collapsed residual the TFC form gets.
host_affine_matrices_p = Primitive("host_affine_matrices")
for _p in (affine_matrices_p, host_affine_matrices_p):
    _p.multiple_results = True
    _p.def_impl(_affine_matrices_impl)
    _p.def_abstract_eval(lambda *avals, build: build.out_avals())
mlir.register_lowering(
    affine_matrices_p,
    mlir.lower_fun(lambda *consts, build: build.by_jvp(*consts, loop=True), multiple_results=True),
)


def _jacobian(
    sub, consts: Sequence[Any], region: _Region, batch: int, staged: Primitive | None, backend: str
) -> list[tuple[Any, Any]]:
    """``(M, c)`` per root: the root is ``M @ concat(its sources, flattened) + c``.

    ``c`` is the region at zero and the columns of ``M`` its derivative along
    each unit vector (exact for an affine map: no differencing), ``batch``
    columns at a time. Concrete constants go to the host rules of
    :mod:`pejit._linear` first; a region they do not cover is evaluated
    with ``jax.jvp``, op by op where that is cheaper than compiling (a
    region of a thousand equations under ``jvp`` takes seconds to compile;
    see :func:`_compile_pays`) or ``backend`` (``FoldOptions.backend``) says
    so. In a folding program (abstract constants) the build is one equation
    of the primitive ``staged`` (:data:`affine_matrices_p` or
    :data:`host_affine_matrices_p`).
    """
    build = _Build(sub, region, batch)
    if staged is not None:
        built = staged.bind(*consts, build=build)
    elif backend != "compiled" and (built := build.on_host(consts)) is not None:
        pass
    elif backend == "compiled" or backend == "auto" and _compile_pays(sub):
        built = jax.jit(build.by_jvp)(*consts)
    else:
        # Op by op, as a folding batch: the tangents and batches of the
        # region's equations are traced once, then evaluated by the folding
        # back end (where the host evaluates what it can: see pejit._host).
        closed = jax.make_jaxpr(build.by_jvp)(*consts)
        built = _batch.evaluate_jaxpr(closed, consts, backend)
    return list(zip(built[::2], built[1::2]))


def _compile_pays(sub) -> bool:
    """Whether one compiled program builds the matrix sooner than op by op.

    Op by op, each distinct primitive and shape is compiled once (for the
    tangents and the batch too: about three programs each), which pays
    where a large region repeats a few equations (a TFC operator) and not
    for a short one (a ridge loss's solve): there one program costs less.
    """
    distinct = {(e.primitive, tuple(getattr(a, "aval", None) for a in e.invars)) for e in sub.eqns}
    one_program = _batch.COMPILE_SECONDS + 3 * _batch.COMPILE_SECONDS_PER_EQN * len(sub.eqns)
    return one_program < 3 * _batch.COMPILE_SECONDS * len(distinct)


def _peak_bytes(jaxpr, kinds) -> int:
    """Bytes of varying values live at once while ``jaxpr`` is evaluated.

    Values are freed at their last use; known ones are left out, since
    they are shared by all the basis vectors evaluated together.
    """
    last = {a: i for i, e in enumerate(jaxpr.eqns) for a in e.invars if isinstance(a, _compat.Var)}
    live = sum(nbytes(v.aval) for v in jaxpr.invars if kinds[v] != CONST)
    peak = live
    for i, e in enumerate(jaxpr.eqns):
        live += sum(nbytes(v.aval) for v in e.outvars if kinds.get(v) != CONST)
        peak = max(peak, live)
        dead = {a for a in e.invars if isinstance(a, _compat.Var) and last[a] == i and kinds[a] != CONST}
        live -= sum(nbytes(a.aval) for a in dead)
    return peak


def _apply(shape, m, c, *xs):
    """What replaces a region's root: ``M @ concat(xs) + c`` (no ``c``: zero)."""
    flat = [lax.convert_element_type(lax.reshape(x, (math.prod(x.shape),)), m.dtype) for x in xs]
    vec = flat[0] if len(flat) == 1 else lax.concatenate(flat, 0)
    y = lax.reshape(lax.dot_general(m, vec, (((1,), (0,)), ((), ()))), shape)
    return y if c is None else lax.add(y, c)




def collapse(
    jaxpr, consts: Sequence[Any], max_bytes: int, backend: str = "auto"
) -> tuple[Any, list[Any], list[Collapse]]:
    """Collapse the affine regions of ``jaxpr`` (open: its leading inputs are ``consts``) where it pays.

    A region is collapsed when its matrices and offsets take at most
    ``max_bytes``, applying them costs at most `PAYS` of the region per
    call (so never when its dynamic inputs are large: the matrix grows with
    them), and building them at most `BUILD_FLOPS` (`HOST_BUILD_FLOPS` when
    the host builds them). Returns the new jaxpr (open, with its constants)
    and what was collapsed; dead equations and constants are left for
    ``_compat.prune``.
    """
    n = len(consts)
    kinds = classify(jaxpr, [True] * n + [False] * (len(jaxpr.invars) - n))
    shifted = offsets(jaxpr, kinds)
    staged = any(isinstance(c, _compat.Tracer) for c in consts)
    chosen = []
    for plan in (_plan(jaxpr, region, kinds, shifted) for region in _regions(jaxpr, kinds)):
        region = plan.region
        inputs = sum(map(_size, region.sources))
        build = inputs * sum(eqn_flops(jaxpr.eqns[i]) for i in region.eqns)
        # or the host builds it (nothing compiled), for every value: a folding
        # program then stages the build as host_affine_matrices (see there)
        on_host = (build > BUILD_FLOPS and build <= HOST_BUILD_FLOPS and backend != "compiled"
                   and _linear.covers(jaxpr.eqns[i] for i in region.eqns))
        affordable = build <= BUILD_FLOPS or on_host
        # zero-size sources or roots: nothing to collapse (and no columns to build)
        if inputs and all(map(_size, region.roots)) and plan.stored <= max_bytes and plan.after <= PAYS * plan.before and affordable:
            chosen.append((region, on_host, Collapse(
                plan.removed, inputs, sum(map(_size, region.roots)),
                plan.flops_before, plan.flops_after, plan.stored,
            )))
    if not chosen:
        return jaxpr, list(consts), []
    subs = [_sub_jaxpr(jaxpr, n, region, kinds) for region, _, _ in chosen]
    index = {v: i for i, v in enumerate(jaxpr.invars[:n])}
    batches = [max(1, min(c.inputs, BUILD_BYTES // max(1, _peak_bytes(sub, kinds))))
               for (sub, _), (_, _, c) in zip(subs, chosen)]
    built = [_jacobian(sub, [consts[index[v]] for v in constvars], region, batch,
                       (host_affine_matrices_p if on_host else affine_matrices_p) if staged else None, backend)
             for (sub, constvars), (region, on_host, _), batch in zip(subs, chosen, batches)]
    producer = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    inserts: dict[int, list] = {}
    rename: dict[Any, Any] = {}
    new_vars, new_consts = [], []
    for (region, _, _), pairs in zip(chosen, built):
        for r, (m, c) in zip(region.roots, pairs):
            srcs = region.root_sources[r]
            c = c if r in shifted else None
            avals = [jax.ShapeDtypeStruct(s.aval.shape, s.aval.dtype) for s in srcs]
            mini = jax.make_jaxpr(functools.partial(_apply, r.aval.shape))(m, c, *avals)
            mvar, *xvars = mini.jaxpr.invars
            if c is not None:
                cvar, *xvars = xvars
                new_vars.append(cvar)
                new_consts.append(c)
            to_source = dict(zip(xvars, srcs))
            eqns = [e.replace(invars=[to_source.get(a, a) if isinstance(a, _compat.Var) else a for a in e.invars])
                    for e in mini.jaxpr.eqns]
            inserts.setdefault(producer[r], []).extend(eqns)
            rename[r] = mini.jaxpr.outvars[0]
            new_vars.append(mvar)
            new_consts.append(m)

    def sub(atoms):
        return [rename.get(a, a) if isinstance(a, _compat.Var) else a for a in atoms]

    eqns = []
    for i, e in enumerate(jaxpr.eqns):
        eqns.append(e.replace(invars=sub(e.invars)))
        eqns.extend(inserts.get(i, ()))
    invars = [*jaxpr.invars[:n], *new_vars, *jaxpr.invars[n:]]
    out = _compat.with_invars(jaxpr.replace(eqns=eqns, outvars=sub(jaxpr.outvars)), invars)
    return out, [*consts, *new_consts], [c for _, _, c in chosen]


__all__ = ["Collapse", "classify", "collapse", "is_affine"]
