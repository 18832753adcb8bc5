"""A jaxpr-level estimate of floating-point work, one rule per primitive, and of the
per-call cost that the fold's decisions weigh (:func:`jaxpr_cost`).

XLA's own cost analysis needs a program it can lower (a primitive without a
lowering rule has none) and counts LAPACK custom calls (``cholesky``, ``lu``,
``eigh``) as free, which is exactly the work pejit folds. So the report
estimates FLOPs from the jaxpr instead, with textbook counts for dense
linear algebra and one operation per output element for elementwise work.
Primitives without a rule (data movement, user primitives) count zero: the
estimate is a lower bound, good for comparing before and after.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jax.extend.core import primitives as P

from .. import _compat
from ._primitives import ELEMENTWISE, subjaxprs

#: ``rule(eqn) -> float``: estimated FLOPs of one equation.
FlopRule = Callable[[Any], float]
flop_rules: dict[Any, FlopRule] = {}


def register_flop_rule(*prims) -> Callable[[FlopRule], FlopRule]:
    """Register ``rule`` for each primitive in ``prims``."""

    def register(rule: FlopRule) -> FlopRule:
        for prim in prims:
            flop_rules[prim] = rule
        return rule

    return register


def eqn_flops(eqn) -> float:
    """Estimated FLOPs of one jaxpr equation (0 when no rule knows it)."""
    rule = flop_rules.get(eqn.primitive)
    return float(rule(eqn)) if rule is not None else 0.0


class _Var(NamedTuple):
    aval: Any


class _Eqn(NamedTuple):
    primitive: Any
    invars: list
    outvars: list
    params: dict


def flops_of(prim, in_avals: Sequence[Any], out_avals: Sequence[Any], params: dict) -> float:
    """`eqn_flops` of an equation not built yet: the folder counts what it folds."""
    if prim not in flop_rules:
        return 0.0
    return eqn_flops(_Eqn(prim, [_Var(a) for a in in_avals], [_Var(a) for a in out_avals], params))


def jaxpr_flops(jaxpr) -> float:
    """Estimated FLOPs of one evaluation of ``jaxpr`` (open or closed).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 3)), jnp.ones((3, 4)))
      >>> jaxpr_flops(cj)
      48.0
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    flops = _jaxpr_flops.get(jaxpr)
    if flops is None:
        flops = _jaxpr_flops[jaxpr] = sum(eqn_flops(e) for e in jaxpr.eqns)
    return flops


#: FLOPs by jaxpr (immutable; held weakly): each call of a ``jnp`` function on
#: the same types binds the same body, which the folder counts each time.
_jaxpr_flops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _size(v) -> int:
    return math.prod(getattr(v.aval, "shape", ()))


def _matrix(v) -> tuple[int, int, int]:
    """(batch, rows, cols) of a batch of matrices."""
    *batch, m, n = v.aval.shape
    return math.prod(batch), m, n


@register_flop_rule(*ELEMENTWISE)
def _elementwise(eqn):
    return sum(_size(v) for v in eqn.outvars)


@register_flop_rule(
    P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p, P.argmax_p, P.argmin_p,
    P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p, P.cumlogsumexp_p,
)
def _reduction(eqn):
    return _size(eqn.invars[0])


@register_flop_rule(P.dot_general_p)
def _dot_general(eqn):
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    k = math.prod(lhs_shape[d] for d in contract)
    return 2 * _size(eqn.outvars[0]) * k


@register_flop_rule(P.cholesky_p)
def _cholesky(eqn):
    b, n, _ = _matrix(eqn.invars[0])
    return b * n**3 / 3


@register_flop_rule(P.lu_p)
def _lu(eqn):
    b, m, n = _matrix(eqn.invars[0])
    k = min(m, n)
    return b * (m * n * k - (m + n) * k**2 / 2 + k**3 / 3) * 2


@register_flop_rule(P.triangular_solve_p)
def _triangular_solve(eqn):
    _, n, _ = _matrix(eqn.invars[0])
    return n * _size(eqn.invars[1])  # n^2 per right-hand side


@register_flop_rule(P.qr_p, P.householder_product_p)
def _qr(eqn):
    b, m, n = _matrix(eqn.invars[0])
    return b * 2 * n * n * (m - n / 3)


@register_flop_rule(P.eigh_p, P.eig_p, P.svd_p, P.schur_p)
def _eigen(eqn):
    b, m, n = _matrix(eqn.invars[0])
    return b * 9 * max(m, n) * min(m, n) ** 2  # Golub & Van Loan orders of magnitude


@register_flop_rule(P.fft_p)
def _fft(eqn):
    n = math.prod(eqn.params["fft_lengths"])
    return 5 * _size(eqn.invars[0]) * math.log2(max(n, 2))


@register_flop_rule(_compat.jit_p, P.closed_call_p, _compat.remat_p)
def call_flops(eqn):
    """A call's FLOPs: its body's (pejit's own call primitives register it too)."""
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    return jaxpr_flops(sub)


@register_flop_rule(P.custom_jvp_call_p, P.custom_vjp_call_p)
def _custom(eqn):
    return jaxpr_flops(eqn.params["call_jaxpr"])


@register_flop_rule(P.cond_p)
def _cond(eqn):
    return max(jaxpr_flops(b) for b in eqn.params["branches"])


@register_flop_rule(P.scan_p)
def _scan(eqn):
    return eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"])


@register_flop_rule(P.while_p)
def _while(eqn):
    # The trip count is unknown here: count one iteration (a lower bound).
    return jaxpr_flops(eqn.params["cond_jaxpr"]) + jaxpr_flops(eqn.params["body_jaxpr"])


@register_flop_rule(P.linear_solve_p)
def _linear_solve(eqn):
    return jaxpr_flops(eqn.params["jaxprs"].solve)


#: Primitives XLA runs as a call into a library (LAPACK, an FFT): a kernel of
#: their own whatever their size, never fused with their neighbours, and not
#: folded by XLA when their inputs are constants.
LIBRARY_CALLS = frozenset([P.lu_p, P.cholesky_p, P.triangular_solve_p, P.qr_p, P.householder_product_p,
                           P.eigh_p, P.eig_p, P.svd_p, P.schur_p, P.fft_p])

#: What a library call costs per call beyond its FLOPs, counted in FLOPs: the
#: collapse's ``KERNEL``, a few microseconds on a CPU.
LIBRARY_CALL = 5000.0


def eqn_cost(eqn, trips: int = 1) -> float:
    """Estimated per-call cost of one equation: its FLOPs, plus :data:`LIBRARY_CALL`
    per library call it makes, ``trips`` times each (its sub-programs' included:
    a ``scan``'s body ``length`` times, a ``while``'s once, a ``cond``'s dearest
    branch).

    ``trips`` weighs the library calls of work that runs in a loop's body:
    XLA computes loop-invariant arithmetic once per call, but each library
    call runs on every trip.
    """
    return eqn_flops(eqn) + LIBRARY_CALL * trips * _library_calls(eqn)


def jaxpr_cost(jaxpr) -> float:
    """Estimated per-call cost of ``jaxpr`` (open or closed): its equations' :func:`eqn_cost`."""
    return sum(eqn_cost(e) for e in getattr(jaxpr, "jaxpr", jaxpr).eqns)


def cost_of(prim, in_avals: Sequence[Any], out_avals: Sequence[Any], params: dict, trips: int = 1) -> float:
    """:func:`eqn_cost` of an equation not built yet (the fold's recorded work)."""
    return eqn_cost(_Eqn(prim, [_Var(a) for a in in_avals], [_Var(a) for a in out_avals], params), trips)


def _library_calls(eqn) -> float:
    if eqn.primitive in LIBRARY_CALLS:
        return 1.0
    if eqn.primitive is P.scan_p:
        return eqn.params["length"] * _jaxpr_library_calls(eqn.params["jaxpr"])
    if eqn.primitive is P.cond_p:
        return max(_jaxpr_library_calls(b) for b in eqn.params["branches"])
    return sum(_jaxpr_library_calls(sub) for sub in subjaxprs(eqn.params))


def _jaxpr_library_calls(jaxpr) -> float:
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    n = _library_counts.get(jaxpr)
    if n is None:
        n = _library_counts[jaxpr] = sum(map(_library_calls, jaxpr.eqns))
    return n


#: Library calls by jaxpr (as ``_jaxpr_flops``).
_library_counts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
