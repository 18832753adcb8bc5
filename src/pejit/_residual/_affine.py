"""Affine analysis of the residual program: which values are affine, and where to cut.

After folding, a residual equation whose inputs include a dynamic value stays,
even when everything it does with that value is linear. This module reads
the residual: :func:`classify` says which values are computed from folded
constants alone (``CONST``), which are affine in the dynamic inputs
(``AFFINE``, by the rules of :mod:`pejit._residual.rules.affine`) and which are neither;
:func:`offsets` which affine values may have an offset; :func:`regions`
groups affine equations into connected components; and :func:`plan_cut` picks,
with a cost model of FLOPs and bytes read per call, which values of a region
to compute as matrix products (the cut). :mod:`pejit._residual._collapse` builds and
applies the matrices.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import primitives as P

from .. import _compat
from .._fold import _cost
from .._fold._cost import eqn_flops
from .rules.affine import ADDITIVE, affine_rules

#: Kinds of residual values: computed from folded constants alone, affine in
#: the dynamic inputs (the inputs themselves included), anything else.
CONST, AFFINE, OTHER = "const", "affine", "other"

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


def call(eqn, known: Sequence[bool]) -> bool:
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
class Region:
    """A connected component of affine equations, by position in the residual."""

    eqns: list[int]
    roots: list[Any]  # its values that the rest of the program reads
    sources: list[Any]  # the varying values it reads
    root_sources: dict[Any, list[Any]]  # per root, the sources it depends on
    deps: dict[Any, frozenset] = dataclasses.field(default_factory=dict)  # per value, its sources


def regions(jaxpr, kinds: dict[Any, str]) -> list[Region]:
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
    regions: dict[int, Region] = {}
    for i in range(len(eqns)):
        if inside[i]:
            regions.setdefault(find(i), Region([], [], [], {})).eqns.append(i)
    for r in roots:
        regions[find(producer[r])].roots.append(r)
    order = {v: k for k, v in enumerate([*jaxpr.invars, *producer])}
    for region in regions.values():
        region.root_sources = {r: sorted(deps[r], key=order.__getitem__) for r in region.roots}
        region.sources = sorted(set().union(*region.root_sources.values()), key=order.__getitem__)
        region.deps = {v: deps[v] for i in region.eqns for v in eqns[i].outvars if v in deps}
    return [r for r in regions.values() if r.roots]


def size(v) -> int:
    return math.prod(v.aval.shape)


def _matrix_cost(v, n_in: int, shifted: set[Any]) -> tuple[_cost.Cost, int]:
    """``(per-call cost, bytes stored)`` of computing ``v`` as ``M @ sources + c``."""
    return _cost.matrix_cost(size(v), n_in, v in shifted, np.dtype(v.aval.dtype).itemsize)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which values of a region to replace by matrices (``region.roots``), and at what cost per call."""

    region: Region  # narrowed to what computes the chosen values
    removed: int  # equations no longer computed
    before: _cost.Cost  # their cost per call
    after: _cost.Cost  # the matrices' cost per call
    flops_before: float
    flops_after: float
    stored: int


def plan_cut(jaxpr, region: Region, kinds, shifted: set[Any], eqn_costs: Sequence[_cost.Cost]) -> Plan:
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
    collapsing those values alone. ``eqn_costs`` are the program's equations'
    (:func:`pejit._fold._cost.costs`), compared in seconds.
    """
    producer = {v: i for i in region.eqns for v in jaxpr.eqns[i].outvars}
    n_in = {v: sum(map(size, srcs)) for v, srcs in region.deps.items()}

    def as_matrix(v) -> float:
        return _matrix_cost(v, n_in[v], shifted)[0].seconds()

    cost = {i: eqn_costs[i].seconds() for i in region.eqns}
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
        region = Region(sorted(inside), cut, sources, root_sources, region.deps)
    matrices = [_matrix_cost(v, n_in[v], shifted) for v in cut]
    after = sum((c for c, _ in matrices), _cost.ZERO)
    return Plan(
        region, len(removed),
        before=sum((eqn_costs[i] for i in removed), _cost.ZERO),
        after=after,
        flops_before=sum(eqn_flops(jaxpr.eqns[i]) for i in removed),
        flops_after=after.flops,
        stored=sum(b for _, b in matrices),
    )


__all__ = ["AFFINE", "CONST", "OTHER", "Plan", "Region", "classify", "is_affine", "offsets", "plan_cut", "regions", "size"]
