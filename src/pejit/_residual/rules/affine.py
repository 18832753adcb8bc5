"""Which residual equations are affine in their varying inputs, one rule per primitive.

A rule ``rule(eqn, known) -> bool`` is told which inputs of ``eqn`` are
known (folded constants, literals, or values computed from them alone) and
answers whether its outputs are an affine function of the other inputs,
jointly: ``add(x, y)`` is, ``mul(x, y)`` only when one side is known,
``gather`` only with known indices. :mod:`pejit._residual._affine` runs them in one
loop over the residual program to find the regions it may collapse into one
matrix; a primitive without a rule is never part of a region. Dtypes are
checked by that loop (real floating point only), not by the rules. Calls
(``jit``, ``custom_jvp``) are affine when their bodies are, which that
loop decides (``pejit._residual._affine.is_affine``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax.extend.core import primitives as P

from ... import _compat


#: ``rule(eqn, known) -> bool``: whether ``eqn``'s outputs are affine in its
#: inputs that are not ``known``.
AffineRule = Callable[[Any, Sequence[bool]], bool]
affine_rules: dict[Any, AffineRule] = {}


def register_affine_rule(*prims: Any) -> Callable[[AffineRule], AffineRule]:
    """Register ``rule`` for each primitive in ``prims`` (one rule per primitive)."""

    def register(rule: AffineRule) -> AffineRule:
        for prim in prims:
            affine_rules[prim] = rule
        return rule

    return register


#: Per primitive, the operands that add into its output (the others scale
#: it, index it or pick from it): a known one there gives an affine map an
#: offset. Call primitives are looked into instead.
ADDITIVE: dict[Any, Callable[[int], range]] = {
    P.add_p: range, P.sub_p: range, P.add_jaxvals_p: range, P.concatenate_p: range, P.pad_p: range,
    P.select_n_p: lambda n: range(1, n), P.dynamic_update_slice_p: lambda n: range(2),
    P.scatter_add_p: lambda n: (0, 2),
}


@register_affine_rule(
    P.add_p, P.sub_p, P.neg_p, P.add_jaxvals_p, P.broadcast_in_dim_p, P.reshape_p, P.squeeze_p,
    P.transpose_p, P.slice_p, P.rev_p, P.concatenate_p, P.pad_p, P.reduce_sum_p, P.copy_p,
    P.convert_element_type_p, P.cumsum_p, *([_compat.split_p] if _compat.split_p is not None else []),
)
def _linear(eqn, known: Sequence[bool]) -> bool:
    """Sums and data movement: affine in all inputs at once (``pad``'s padding value included)."""
    return True


@register_affine_rule(P.mul_p, P.dot_general_p)
def _bilinear(eqn, known: Sequence[bool]) -> bool:
    """A product is affine when at most one factor varies."""
    return sum(not k for k in known) <= 1


@register_affine_rule(P.div_p)
def _div(eqn, known: Sequence[bool]) -> bool:
    return known[1]


@register_affine_rule(P.select_n_p)
def _select(eqn, known: Sequence[bool]) -> bool:
    """With a known predicate each output element is one of the cases' elements."""
    return known[0]


@register_affine_rule(P.gather_p, P.dynamic_slice_p)
def _known_indices(eqn, known: Sequence[bool]) -> bool:
    """Picking elements at known positions (the operand comes first)."""
    return all(known[1:])


@register_affine_rule(P.dynamic_update_slice_p)
def _update_slice(eqn, known: Sequence[bool]) -> bool:
    return all(known[2:])


@register_affine_rule(P.scatter_add_p)
def _scatter_add(eqn, known: Sequence[bool]) -> bool:
    operand, indices, updates = known
    return indices
