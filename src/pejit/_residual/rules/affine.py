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




#: ``rule(eqn, known) -> bool``: whether ``eqn``'s outputs are affine in its
#: inputs that are not ``known``.
AffineRule = Callable[[Any, Sequence[bool]], bool]
#: A primitive's affine rule, registered with its other facets
#: (:func:`pejit._residual.rules.registry.register_primitive`); the rules below
#: are the built-in ones.
affine_rules: dict[Any, AffineRule] = {}

#: Per primitive, ``additive(n)``: of its ``n`` operands, those that add into its
#: output (the others scale it, index it or pick from it): a known one there
#: gives an affine map an offset. Registered with the affine rule; call
#: primitives are looked into instead.
ADDITIVE: dict[Any, Callable[[int], Sequence[int]]] = {}


def linear(eqn, known: Sequence[bool]) -> bool:
    """Sums and data movement: affine in all inputs at once (``pad``'s padding value included)."""
    return True


def bilinear(eqn, known: Sequence[bool]) -> bool:
    """A product is affine when at most one factor varies."""
    return sum(not k for k in known) <= 1


def div(eqn, known: Sequence[bool]) -> bool:
    return known[1]


def select(eqn, known: Sequence[bool]) -> bool:
    """With a known predicate each output element is one of the cases' elements."""
    return known[0]


def known_indices(eqn, known: Sequence[bool]) -> bool:
    """Picking elements at known positions (the operand comes first)."""
    return all(known[1:])


def update_slice(eqn, known: Sequence[bool]) -> bool:
    return all(known[2:])


def scatter_add(eqn, known: Sequence[bool]) -> bool:
    operand, indices, updates = known
    return indices
