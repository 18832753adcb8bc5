"""The hot path of a call: one generated function per argument layout.

A cached call has a budget of a few microseconds over ``jax.jit``'s own
call, so pejit does not check what ``jax.jit`` checks anyway. The residual
of a specialization is a ``jax.jit`` function of the dynamic arguments
(:func:`pejit._calls._program.runner`): its C++ dispatch flattens their pytrees
and checks their types, shapes, weak types, shardings, keys and NumPy or
Python scalars, and compiles again for a new one. All pejit adds is the
constants' identity: the memo of the last call (its constants' ``id``, and
a check of NumPy constants' contents) selects the residual, and the call's
dynamic arguments, positional and keyword, go to it as they are. A
residual traced again for types it was not folded for raises
:class:`~pejit._calls._keys.OtherSignature`, and the call specializes anew.

The dispatcher is generated as straight-line code for each number of
positional arguments, as ``dataclasses`` generates ``__init__``: no loops
over positions, no method lookups. The source is built from integer
positions only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _compat
from ._cache import FastPath
from ._errors import GENERATED
from ._keys import IMMUTABLE_SCALARS, OtherSignature, fixed_array, frozen_parts, same_constant, unchanged


class Layout(NamedTuple):
    """Where the constants are in a call with a given number of positional arguments.

    ``dispatch(*args, **kwargs)`` is the call itself, through the cache (see
    :func:`dispatcher`), once generated.
    """

    const: tuple[int, ...]
    dyn: tuple[int, ...]
    dispatch: Callable | None = None

    def dynamic(self, args: tuple) -> tuple:
        """The dynamic arguments among a call's ``args``."""
        return tuple(args[i] for i in self.dyn)


_SOURCE = """
def dispatch(*args, **kwargs):
    if {wrong_arity}:
        return route(args, kwargs)
    if {unusual}:
        return uncached({full_args}, kwargs)
    if dead:
        purge()
    memo = last[0]
    if memo[0] == {n} and {memo_check}:
        guard = memo[-2]
        if guard is None:
            counts.hits += 1
            try:
                return {call}
            except OtherSignature:
                counts.hits -= 1
        elif memo[-3]:  # the guard checks while the program runs
            try:
                out = {call}
            except OtherSignature:
                pass
            else:
                if guard():
                    counts.hits += 1
                    return out
        elif guard():
            counts.hits += 1
            try:
                return {call}
            except OtherSignature:
                counts.hits -= 1
    return uncached({full_args}, kwargs)
"""


def dispatcher(n: int, const: tuple[int, ...], dyn: tuple[int, ...], cache: FastPath, route: Callable,
               uncached: Callable, disable_jit: Any = None, fixed_names: frozenset[str] = frozenset(),
               bound: dict[int, Any] | None = None) -> Callable:
    """The call with ``n`` positional arguments, through the ``cache`` view.

    A call whose constants are the memo's (see :func:`memo`) is served in one
    straight-line frame: the residual is called through a C-level
    ``functools.partial``, with the call's dynamic arguments, keywords
    included. Other numbers of arguments go to ``route``; everything else
    (another constant, a constant keyword among ``fixed_names``, dynamic
    arguments of another type) to ``uncached``; so do all calls while
    ``disable_jit.value`` is true (``jax.disable_jit()``'s state, for a
    compiled function), named axes are in effect (``vmap`` with an axis
    name: the full key includes them) or a transformation traces the call
    (``jax.grad``, ``jax.jit``, ...: it gets pejit's derivative rule, see
    :mod:`pejit._calls._derivatives`).

    With ``bound`` (the TFC form: the constants by position, bound once),
    the call takes the dynamic arguments only, positionally, and compares
    the memo with the bound constants' identities, written into the code;
    ``route`` gets calls with keywords or another number of arguments.

    An id in the memo only ever comes from a live constant: a ``jax.Array``
    is watched (dead ones are purged first), anything else is held by the memo.
    """
    unusual = ["axes.value is not no_axes", "trace.value is not eval_trace"]
    if disable_jit is not None:
        unusual.append("disable_jit.value")
    if fixed_names:
        unusual.append("(kwargs and not fixed_names.isdisjoint(kwargs))")
    fixed = bound or {}
    given = iter(range(n - len(fixed)))  # the call's own arguments, in order
    position = {i: f"c{i}" if i in fixed else f"args[{next(given)}]" for i in range(n)}
    constants = {f"c{i}": c for i, c in fixed.items()}  # held here: their ids stay theirs
    memo_check = " and ".join(
        f"memo[{j + 1}] == {id(fixed[i])}" if i in fixed else f"id({position[i]}) == memo[{j + 1}]"
        for j, i in enumerate(const))
    if bound is None:
        wrong_arity, full_args = f"len(args) != {n}", "args"
    else:
        wrong_arity = f"kwargs or len(args) != {n - len(bound)}"
        full_args = "({})".format("".join(f"{position[i]}, " for i in range(n)))
    dynamic = "".join(f"{position[i]}, " for i in dyn)
    # Forwarding an empty **kwargs is a measurable share of a cached call,
    # which is otherwise little more than the program's dispatch: only a call
    # with keywords forwards them, and the bound form takes none.
    call = f"memo[-1]({dynamic})"
    if bound is None:
        call = f"memo[-1]({dynamic}**kwargs) if kwargs else {call}"
    source = _SOURCE.format(
        n=n, wrong_arity=wrong_arity, full_args=full_args, memo_check=memo_check or "True",
        call=call, unusual=" or ".join(unusual),
    )
    namespace = cache._asdict() | constants | {
        "route": route, "uncached": uncached, "disable_jit": disable_jit, "fixed_names": fixed_names,
        "axes": _compat.AXIS_ENV, "no_axes": _compat.NO_AXES, "OtherSignature": OtherSignature,
        "trace": _compat.TRACE, "eval_trace": _compat.eval_trace,
    }
    exec(compile(source, GENERATED, "exec"), namespace)  # noqa: S102
    return namespace["dispatch"]


def memo(layout: Layout, args: tuple, constants: tuple, call: Callable, after: bool = False) -> tuple:
    """The memo of a call: its constants' identities, what it holds, its guard, and ``call``.

    ``constants`` is the call's constants' key (``CallKey.constants``).
    A ``jax.Array`` is recognized by identity (the cache watches it, and its
    death purges the memo), and so is an immutable scalar or string (held).
    A writable NumPy array is held, and the guard checks its bytes
    (:func:`~pejit._calls._keys.unchanged`: the TFC form binds its constants once,
    as NumPy arrays in TFC's programs, and every call passes the same
    objects); a read-only one is watched. A pytree constant is held: a
    frozen one (an Equinox module, an MJX model: see
    :func:`~pejit._calls._keys.frozen_parts`) keeps its value with its
    identity but for its NumPy arrays' bytes, which the guard checks; for
    any other (a dict, a list: its contents can change under the same
    identity) the guard computes its key again: a flatten, not the whole
    call's key.

    With ``after``, the guard runs once the program is dispatched, while it
    runs (XLA computes asynchronously, and the check reads the host's
    memory): a call whose guard fails drops that result and specializes
    anew. Only for a program that can run in vain: no effects (a print would
    show twice), no donated arguments (the second run would find them gone).
    """
    consts = [args[i] for i in layout.const]
    held, arrays, trees = [], [], []
    for i, c, k in zip(layout.const, consts, constants):
        if fixed_array(c):
            continue  # watched by the entry
        held.append(c)
        parts = None if isinstance(c, IMMUTABLE_SCALARS) else frozen_parts(c)
        if parts is not None:
            arrays.extend(parts)  # a bare NumPy array is its own part
        elif not isinstance(c, IMMUTABLE_SCALARS):
            trees.append((i, c, k))
    guard = unchanged(arrays)
    if trees:
        guard = functools.partial(_trees_unchanged, guard, trees)
    return (len(args), *[id(c) for c in consts], held, after, guard, call)


def _trees_unchanged(arrays: Callable[[], bool] | None, trees: list[tuple]) -> bool:
    """The guard of a memo with pytree constants: its NumPy ones unchanged, and
    each tree's key what it was."""
    return (arrays is None or arrays()) and all(same_constant(i, c, k) for i, c, k in trees)

