"""Integer divisions whose divisor cannot be zero.

XLA's constant folding of an integer ``div`` or ``rem`` by zero stops the process
(SIGFPE, jaxlib 0.10.2: ``jax.jit`` closed over ``x % 0``), where its kernels give
``x // 0 = -1`` and ``x % 0 = x``. So known work that divides integers is compiled
in (:func:`pejit._fold._primitives.folds_alike`) only where each divisor is guarded,
as ``jnp.remainder`` guards its own: ``rem(x, where(y == 0, 1, y))``, and
``jax.random.randint`` its span: ``select_n(o <= n, o - n, 1)``, its ``+ 1`` chosen
only where ``maxval > INT32_MAX``, which never is.

One pass over the program, a rule per primitive, as JAX's jaxpr interpreters. What
is known of an integer value is that it is nonzero (every element); the range its
elements lie in (a literal's, the type's, or what work on those gives: ``clip``'s
bounds); and where a bool value that tests it selects it nonzero (``eq(y, 0)`` is
false where ``y`` is nonzero, ``le(o, n)`` false where ``o - n`` is), which a
``select_n`` of it and a nonzero value turns into a nonzero value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import dtypes
from jax.extend.core import Literal

from ._primitives import CALLS, CUSTOM_CALLS, DIVISIONS, call_body, subjaxprs

Range = tuple[int, int]


class Facts:
    """What a pass knows of a jaxpr's integer values: ``nonzero``, the values with no
    zero element; ``ranges``, value -> ``(lo, hi)`` its elements lie in, where narrower
    than its type's; ``where``, value -> ``{(p, i)}``: it is nonzero wherever the bool
    ``p`` is ``i`` (where ``select_n(p, ...)`` picks case ``i``); ``same``, value -> the
    value it is zero exactly where (it converts it); ``difference``, value -> ``(a, b)``
    where it is ``a - b``; ``differ``, ``(a, b)`` -> ``{(p, i)}``: ``a != b`` wherever
    ``p`` is ``i``."""

    def __init__(self):
        self.nonzero: set = set()
        self.ranges: dict[Any, Range] = {}
        self.where: dict[Any, set] = {}
        self.same: dict = {}
        self.difference: dict = {}
        self.differ: dict[tuple, set] = {}

    def range(self, a) -> Range | None:
        """The range of an integer or bool ``a``'s elements (``None`` for other types)."""
        if isinstance(a, Literal):
            if not _integer(a.aval.dtype):
                return None
            val = np.asarray(a.val)
            return (int(val.min()), int(val.max())) if val.size else None
        return self.ranges.get(a) or _type_range(a.aval.dtype)

    def is_nonzero(self, a) -> bool:
        if isinstance(a, Literal):
            return _integer(a.aval.dtype) and bool(np.all(np.asarray(a.val) != 0))
        r = self.range(a)
        return a in self.nonzero or (r is not None and (r[0] > 0 or r[1] < 0))

    def root(self, a):
        """The value ``a`` is zero exactly where (its own, or what it converts)."""
        return self.same.get(a, a)

    def nonzero_where(self, a, p, i: int) -> bool:
        """Whether ``a`` is nonzero wherever ``p`` is ``i``."""
        return self.is_nonzero(a) or (p, i) in self.selected(a)

    def selected(self, a) -> set:
        """The ``(p, i)`` such that ``a`` is nonzero wherever ``p`` is ``i``."""
        if isinstance(a, Literal):
            return set()
        a = self.root(a)
        return self.where.get(a, set()) | self.differ.get(self.difference.get(a), set())


def _integer(dtype) -> bool:
    return dtypes.issubdtype(dtype, np.integer) or dtypes.issubdtype(dtype, np.bool_)


@functools.cache  # asked of most values of a program: once per dtype
def _type_range(dtype) -> Range | None:
    if dtypes.issubdtype(dtype, np.bool_):
        return 0, 1
    if dtypes.issubdtype(dtype, np.integer):
        info = jnp.iinfo(dtype)
        return int(info.min), int(info.max)
    return None


@functools.cache
def _bits(dtype) -> int:
    return 1 if dtypes.issubdtype(dtype, np.bool_) else jnp.iinfo(dtype).bits


def _set_range(facts: Facts, out, r: Range | None) -> None:
    whole = _type_range(out.aval.dtype)
    if r is not None and whole is not None and whole[0] <= r[0] <= r[1] <= whole[1] and r != whole:
        facts.ranges[out] = r


def _same_nonzero(eqn, facts: Facts) -> None:  # its elements are its first operand's, moved or repeated
    if facts.is_nonzero(eqn.invars[0]):
        facts.nonzero.update(eqn.outvars)
    _set_range(facts, eqn.outvars[0], facts.range(eqn.invars[0]))


def _all_nonzero(eqn, facts: Facts) -> None:  # its elements are its operands' (or their negations)
    if all(map(facts.is_nonzero, eqn.invars)):
        facts.nonzero.update(eqn.outvars)


def _convert(eqn, facts: Facts) -> None:
    """To integers: values that fit keep their range; a value is zero where its
    conversion is, to integers as wide or wider (narrower ones may wrap it to
    zero: 256 to ``uint8``, 16 to ``int4``) or where it fits."""
    (x,), out = eqn.invars, eqn.outvars[0]
    new, r = out.aval.dtype, facts.range(x)
    whole = _type_range(new)
    if whole is None or r is None:
        return
    fits = whole[0] <= r[0] and r[1] <= whole[1]
    if fits:
        _set_range(facts, out, r)
    if fits or _bits(new) >= _bits(x.aval.dtype):
        if facts.is_nonzero(x):
            facts.nonzero.add(out)
        if not isinstance(x, Literal):
            facts.same[out] = facts.root(x)


def _extremum(pick: Callable[[int, int], int]) -> Callable[[Any, Facts], None]:
    def rule(eqn, facts: Facts) -> None:  # max, min: of the bounds
        ra, rb = map(facts.range, eqn.invars)
        if ra is not None and rb is not None:
            _set_range(facts, eqn.outvars[0], (pick(ra[0], rb[0]), pick(ra[1], rb[1])))
    return rule


def _add_sub(eqn, facts: Facts) -> None:
    """The range of a sum or difference where it cannot wrap; a difference's operands
    are remembered, for what a comparison of them says (see :func:`_compare`)."""
    a, b = eqn.invars
    ra, rb = facts.range(a), facts.range(b)
    if eqn.primitive.name == "sub":
        if not isinstance(a, Literal) and not isinstance(b, Literal):
            facts.difference[eqn.outvars[0]] = (a, b)
        if ra is not None and rb is not None:
            _set_range(facts, eqn.outvars[0], (ra[0] - rb[1], ra[1] - rb[0]))
    elif ra is not None and rb is not None:
        _set_range(facts, eqn.outvars[0], (ra[0] + rb[0], ra[1] + rb[1]))


#: where a comparison is this, its operands differ
_DIFFER_WHERE = {"eq": 0, "ne": 1, "lt": 1, "gt": 1, "le": 0, "ge": 0}


def _decided(name: str, ra: Range, rb: Range) -> bool | None:
    """A comparison's value where the ranges decide it (``c > INT32_MAX``: never)."""
    if name in ("gt", "ge"):
        name, ra, rb = {"gt": "lt", "ge": "le"}[name], rb, ra
    if name == "lt":
        return True if ra[1] < rb[0] else False if ra[0] >= rb[1] else None
    if name == "le":
        return True if ra[1] <= rb[0] else False if ra[0] > rb[1] else None
    disjoint, one = ra[1] < rb[0] or rb[1] < ra[0], ra[0] == ra[1] == rb[0] == rb[1]
    equal = True if one else False if disjoint else None
    return equal if name == "eq" or equal is None else not equal


def _compare(eqn, facts: Facts) -> None:
    """Integers compared: the value where the ranges decide it; else where it says
    its operands differ, their differences are nonzero (``a - b`` is zero only where
    ``a == b``, wrapping or not), and so is an operand compared with zero."""
    a, b = eqn.invars
    p, name = eqn.outvars[0], eqn.primitive.name
    ra, rb = facts.range(a), facts.range(b)
    if ra is None or rb is None:
        return
    known = _decided(name, ra, rb)
    if known is not None:
        facts.ranges[p] = (int(known), int(known))
        return
    differ = (p, _DIFFER_WHERE[name])
    for x, y, ry in ((a, b, rb), (b, a, ra)):
        if isinstance(x, Literal):
            continue
        if not isinstance(y, Literal):
            facts.differ.setdefault((x, y), set()).add(differ)
        if ry == (0, 0):
            facts.where.setdefault(facts.root(x), set()).add(differ)


def _logical(eqn, facts: Facts) -> None:  # and, or, not of bools: of the bounds
    if not dtypes.issubdtype(eqn.outvars[0].aval.dtype, np.bool_):
        return
    rs = [facts.range(x) for x in eqn.invars]
    name = eqn.primitive.name
    if name == "not":
        (lo, hi), = rs
        r = (1 - hi, 1 - lo)
    else:
        pick = min if name == "and" else max
        r = (pick(lo for lo, _ in rs), pick(hi for _, hi in rs))
    _set_range(facts, eqn.outvars[0], r)


def _select(eqn, facts: Facts) -> None:
    """``select_n(p, *cases)`` is the case ``p`` picks where the ranges decide it;
    else nonzero where each case is nonzero wherever ``p`` picks it."""
    which, *cases = eqn.invars
    out = eqn.outvars[0]
    r = facts.range(which)
    if r is not None and 0 <= r[0] == r[1] < len(cases):
        chosen = cases[r[0]]
        if facts.is_nonzero(chosen):
            facts.nonzero.add(out)
        _set_range(facts, out, facts.range(chosen))
        if not isinstance(chosen, Literal) and chosen.aval.shape == out.aval.shape:
            facts.same[out] = facts.root(chosen)
        return
    if all(facts.nonzero_where(c, which, i) for i, c in enumerate(cases)):
        facts.nonzero.add(out)
    ranges = [facts.range(c) for c in cases]
    if None not in ranges:
        _set_range(facts, out, (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)))


rules: dict[str, Callable[[Any, Facts], None]] = {
    **dict.fromkeys(["broadcast_in_dim", "copy", "copy_p", "dynamic_slice", "reshape", "rev", "slice", "squeeze",
                     "transpose"], _same_nonzero),
    **dict.fromkeys(["abs", "concatenate", "neg", "sign"], _all_nonzero),
    **dict.fromkeys(_DIFFER_WHERE, _compare),
    **dict.fromkeys(["and", "or", "not"], _logical),
    "add": _add_sub,
    "sub": _add_sub,
    "max": _extremum(max),
    "min": _extremum(min),
    "convert_element_type": _convert,
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
        key = (id(jaxpr), frozenset(facts.nonzero), frozenset(facts.ranges.items()),
               frozenset((v, frozenset(w)) for v, w in facts.where.items()))
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
                    for o, b in zip(eqn.outvars, body.outvars):
                        if inner.is_nonzero(b):
                            facts.nonzero.add(o)
                        _set_range(facts, o, inner.range(b))
                    continue
            for sub in subjaxprs(eqn.params):  # a loop's body, a branch: their own divisions
                self._walk(getattr(sub, "jaxpr", sub), Facts())
        return facts


def _inside(args, params, facts: Facts) -> Facts:
    """What ``facts`` know of a call's arguments ``args``, of its body's ``params``."""
    inner, param_of = Facts(), {}
    for a, p in zip(args, params):
        if not isinstance(a, Literal):
            param_of.setdefault(a, p)
        if facts.is_nonzero(a):
            inner.nonzero.add(p)
        _set_range(inner, p, facts.range(a))
    for a, p in zip(args, params):
        picked = {(param_of[q], i) for q, i in facts.selected(a) if q in param_of}
        if picked:
            inner.where[p] = picked
    return inner
