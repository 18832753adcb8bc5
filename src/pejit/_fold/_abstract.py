"""Abstract constants: known values that are tracers of an outer trace.

A known value is normally concrete (an array, a Python scalar). When pejit
builds a value-independent *folding program* (see ``pejit._calls._specializer``),
it runs the folding trace inside a ``jax.jit`` trace whose inputs are the
constant arrays: the known values are then tracers of that outer trace,
*abstract constants*. Folding an equation on them stages it into the outer
program instead of evaluating it; Python cannot ask for their values; and a
folded value that is abstract differs per specialization, so it can never
become a literal. This module is the one place that knows the trick; the
folding layer asks it, and binds known work by :func:`bind_known`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from .. import _compat


def is_abstract(x: Any) -> bool:
    """Whether the known value ``x`` is an abstract constant (not concrete).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit._fold._abstract import is_abstract
      >>> is_abstract(jnp.ones(2))
      False
      >>> jax.jit(lambda a: jnp.asarray(is_abstract(a)))(1.0)
      Array(True, dtype=bool)
    """
    return isinstance(x, _compat.Tracer)


def any_abstract(values: Iterable[Any]) -> bool:
    """Whether any of the known ``values`` is an abstract constant."""
    return any(is_abstract(x) for x in values)


def outer_trace(values: Iterable[Any]):
    """The trace of the first abstract constant among ``values``, else None."""
    return next((_compat.trace_of(x) for x in values if is_abstract(x)), None)


def bind_known(prim, args: Sequence[Any], params: dict, outer=None) -> Any:
    """``prim`` on known ``args`` by JAX: evaluated now, or staged into the outer
    program of abstract constants (``outer``, or that of ``args``)."""
    outer = outer or outer_trace(args)
    if outer is None and prim.name in COMPILED_WHOLE:
        with _compat.at_top_level():  # evaluated, not staged into the trace that folds
            return _compiled_whole(prim, *args, **params)
    return _compat.bind_outside(prim, args, params, outer)


#: Primitives whose eager evaluation runs their lowering op by op, each
#: operation compiled alone: JAX 0.12's "hijax" primitives, ``jnp.nonzero(...,
#: size=n)`` among them (a dozen or more compiles the first time). Evaluated
#: as one compiled program instead.
COMPILED_WHOLE = frozenset(["call_hi_primitive"])


@functools.partial(jax.jit, static_argnums=0, static_argnames="_prim")
def _compiled_whole(prim, *args, _prim):
    # its parameter (a ``HiPrim``) hashes and compares by value: one compile per kind and types
    return prim.bind(*args, _prim=_prim)
