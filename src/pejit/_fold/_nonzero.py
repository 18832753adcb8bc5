"""Integer divisions whose divisor cannot be zero.

XLA's constant folding of an integer ``div`` or ``rem`` by zero stops the process
(SIGFPE, jaxlib 0.10.2: ``jax.jit`` closed over ``x % 0``), where its kernels give
``x // 0 = -1`` and ``x % 0 = x``. So known work that divides integers is compiled
in (:func:`pejit._fold._primitives.folds_alike`) only where each divisor is guarded,
as ``jnp.remainder`` guards its own: ``rem(x, where(y == 0, 1, y))``.

One pass over the program, a rule per primitive, as JAX's jaxpr interpreters: what
is known of a value is that it is nonzero (every element), or, of a bool, that it
tests a value for zero (``eq(y, 0)``: where it is false, ``y`` is nonzero), which a
``select_n`` of ``y`` and a nonzero value turns into a nonzero value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax import dtypes
from jax.extend.core import Literal

from ._primitives import CALLS, CUSTOM_CALLS, DIVISIONS, call_body, subjaxprs


class Facts:
    """What a pass knows of a jaxpr's values: ``nonzero``, the values with no zero
    element; ``tests``, a bool value -> ``(y, zero_when)``: the value is
    ``zero_when`` exactly where ``y`` is zero; ``literals``, a body's inputs that
    its call binds to literals -> those."""

    def __init__(self):
        self.nonzero: set = set()
        self.tests: dict = {}
        self.literals: dict = {}

    def literal(self, a) -> Literal | None:
        return a if isinstance(a, Literal) else self.literals.get(a)

    def is_nonzero(self, a) -> bool:
        if (lit := self.literal(a)) is not None:
            return _integer(lit.aval.dtype) and bool(np.all(np.asarray(lit.val) != 0))
        return a in self.nonzero


def _integer(dtype) -> bool:
    return dtypes.issubdtype(dtype, np.integer) or dtypes.issubdtype(dtype, np.bool_)


def _same_nonzero(eqn, facts: Facts) -> None:  # its elements are its first operand's, moved or repeated
    if facts.is_nonzero(eqn.invars[0]):
        facts.nonzero.update(eqn.outvars)


def _all_nonzero(eqn, facts: Facts) -> None:  # its elements are its operands' (or their negations)
    if all(map(facts.is_nonzero, eqn.invars)):
        facts.nonzero.update(eqn.outvars)


def _convert(eqn, facts: Facts) -> None:
    """To integers: a literal as it converts (a weak-typed ``1``), any nonzero value
    to integers as wide or wider (narrower ones may wrap it to zero: 256 to ``uint8``)."""
    (x,), new = eqn.invars, eqn.outvars[0].aval.dtype
    if not _integer(new):
        return
    if (lit := facts.literal(x)) is not None:
        nonzero = _integer(lit.aval.dtype) and bool(np.all(np.asarray(lit.val).astype(new) != 0))
    else:
        nonzero = _integer(x.aval.dtype) and np.dtype(new).itemsize >= np.dtype(x.aval.dtype).itemsize
        nonzero = nonzero and facts.is_nonzero(x)
    if nonzero:
        facts.nonzero.update(eqn.outvars)


def _compare(eqn, facts: Facts) -> None:  # eq(y, 0), ne(y, 0): a test of y for zero
    a, b = eqn.invars
    if facts.literal(a) is not None:
        a, b = b, a
    zero = facts.literal(b)
    if zero is not None and facts.literal(a) is None and not np.any(np.asarray(zero.val)):
        facts.tests[eqn.outvars[0]] = (a, eqn.primitive.name == "eq")


def _select(eqn, facts: Facts) -> None:
    """``select_n(p, *cases)`` is nonzero where each case is, or where ``p`` tests
    a case for zero and picks another, nonzero, where it is zero."""
    which, *cases = eqn.invars
    test = facts.tests.get(which) if len(cases) == 2 and facts.literal(which) is None else None
    if test is None:
        guarded = all(map(facts.is_nonzero, cases))
    else:
        y, zero_when = test
        where_zero, where_not = cases[zero_when], cases[not zero_when]  # select_n picks cases[which]
        guarded = facts.is_nonzero(where_zero) and (where_not is y or facts.is_nonzero(where_not))
    if guarded:
        facts.nonzero.update(eqn.outvars)


rules: dict[str, Callable[[Any, Facts], None]] = {
    **dict.fromkeys(["broadcast_in_dim", "copy", "copy_p", "dynamic_slice", "reshape", "rev", "slice", "squeeze",
                     "transpose"], _same_nonzero),
    **dict.fromkeys(["abs", "concatenate", "neg", "sign"], _all_nonzero),
    "convert_element_type": _convert,
    "eq": _compare,
    "ne": _compare,
    "select_n": _select,
}


class GuardedDivisions:
    """The integer divisions of ``jaxpr`` (and of its sub-jaxprs) whose divisor cannot
    be zero, as a container of equations; found at the first question, since most
    programs divide no integers and the pass walks every call of a body.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax import lax
      >>> i32 = jnp.arange(1, 4)
      >>> jaxpr = jax.make_jaxpr(lambda x, y: (jnp.remainder(x, y), lax.rem(x, y)))(i32, i32).jaxpr
      >>> guarded = GuardedDivisions(jaxpr)
      >>> from pejit._fold._primitives import all_eqns
      >>> [e in guarded for e in all_eqns(jaxpr) if e.primitive.name == "rem"]  # lax.rem's, jnp's in its body
      [False, True]
    """

    def __init__(self, jaxpr):
        self._jaxpr = jaxpr
        self._safe: dict[int, bool] | None = None
        self._walked: dict = {}

    def __contains__(self, eqn) -> bool:
        if self._safe is None:
            self._safe = {}
            self._walk(self._jaxpr, Facts())
        return self._safe.get(id(eqn), False)

    def _walk(self, jaxpr, facts: Facts) -> Facts:
        # a body called again with what is known of its inputs unchanged, as ``jnp``'s
        # functions are, is walked once
        key = (id(jaxpr), frozenset(facts.nonzero), frozenset(facts.tests.items()),
               frozenset((v, id(lit)) for v, lit in facts.literals.items()))
        if key in self._walked:
            return self._walked[key]
        self._walked[key] = facts
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in DIVISIONS:  # safe only if safe wherever its body is called
                self._safe[id(eqn)] = self._safe.get(id(eqn), True) and facts.is_nonzero(eqn.invars[1])
            elif rule := rules.get(name):
                rule(eqn, facts)
            elif name in CALLS or name in CUSTOM_CALLS:
                body = call_body(eqn.params)[0]
                if body is not None and len(body.invars) == len(eqn.invars):
                    inner = self._walk(body, _inside(eqn.invars, body.invars, facts))
                    facts.nonzero.update(o for o, b in zip(eqn.outvars, body.outvars) if inner.is_nonzero(b))
                    continue
            for sub in subjaxprs(eqn.params):  # a loop's body, a branch: their own divisions
                self._walk(getattr(sub, "jaxpr", sub), Facts())
        return facts


def _inside(args, params, facts: Facts) -> Facts:
    """What ``facts`` know of a call's arguments ``args``, of its body's ``params``."""
    inner, param_of = Facts(), {}
    for a, p in zip(args, params):
        if (lit := facts.literal(a)) is not None:
            inner.literals[p] = lit
        else:
            param_of.setdefault(a, p)
            if facts.is_nonzero(a):
                inner.nonzero.add(p)
    for a, p in zip(args, params):
        test = facts.tests.get(a) if facts.literal(a) is None else None
        if test is not None and test[0] in param_of:
            inner.tests[p] = (param_of[test[0]], test[1])
    return inner
