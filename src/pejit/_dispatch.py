"""The hot path of a call: one generated function per argument layout.

A cached call has a budget of about 2 us over ``jax.jit``'s own dispatch
(which already checks the dynamic arguments' types and calls the
executable), so its Python is generated as straight-line code for each
number of positional arguments, as ``dataclasses`` generates ``__init__``:
no loops over positions, no method lookups. The source is built from
integer positions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import _compat
from ._cache import FastPath
from ._errors import GENERATED
from ._keys import unchanged


class Layout(NamedTuple):
    """Where the constants are in a call with a given number of positional arguments.

    ``dynamic(args)`` picks the dynamic arguments; ``dispatch(*args, **kwargs)``
    is the call itself, through the cache (see :func:`dispatcher`).
    """

    const: tuple[int, ...]
    dyn: tuple[int, ...]
    dynamic: Callable[[tuple], tuple]
    dispatch: Callable


_SOURCE = """
def dispatch(*args, **kwargs):
    if kwargs or len(args) != {n}:
        return route(args, kwargs)
    if {unusual}:
        return uncached(args, kwargs)
    if dead:
        purge()
    memo = last[0]
    try:
        if memo[0] == {n} and {memo_check} and (memo[-2] is None or memo[-2]()):
            counts.hits += 1
            return memo[-1]({dynamic})
        key = ({key})
    except AttributeError:  # a dynamic argument that is not an array
        return uncached(args, kwargs)
    spec = get(key)
    if spec is None:
        return uncached(args, kwargs)
    counts.hits += 1
    touch(key, spec, ({n}, *key, None, spec.call))
    return spec.call({dynamic})
"""


def dispatcher(n: int, const: tuple[int, ...], dyn: tuple[int, ...], cache: FastPath,
                route: Callable, uncached: Callable, disable_jit: Any = None) -> Callable:
    """The call with ``n`` positional arguments, through the ``cache`` view.

    A cache hit is served in one straight-line frame: the residual is called
    through a C-level ``functools.partial``, and a call with the same
    constants as the last hit skips the dictionary too (``cache.last``).
    Other numbers of arguments and keyword arguments go to ``route``,
    misses (and constants that are not bare arrays) to ``uncached``; so do
    all calls while ``disable_jit.value`` is true (``jax.disable_jit()``'s
    state, for a compiled function) or named axes are in effect (``vmap``
    with an axis name: the full key includes them).

    The key is the one ``Pejitted._key`` computes when every constant is a
    bare ``jax.Array`` and every dynamic argument an array: the identity of
    each constant, then the aval of each dynamic argument (interned: the memo
    compares them with ``is``). An int (an id) in a key only ever comes from
    a live, watched ``jax.Array`` (dead ones are purged first), so no type
    check is needed.

    The memo is that key, a guard (or None) and the call. A memo with NumPy
    constants (see :func:`numpy_memo`) holds them, so their identities stay
    theirs, and its guard checks that their contents did not change.
    """
    parts = [f"id(args[{i}])" for i in const] + [f"args[{i}].aval" for i in dyn]
    memo_check = " and ".join(
        f"{part} {'==' if part.startswith('id') else 'is'} memo[{j + 1}]" for j, part in enumerate(parts)
    )
    source = _SOURCE.format(
        n=n, key="".join(f"{part}, " for part in parts), memo_check=memo_check or "True",
        dynamic=", ".join(f"args[{i}]" for i in dyn),
        unusual="axes.value is not no_axes" + ("" if disable_jit is None else " or disable_jit.value"),
    )
    namespace = cache._asdict() | {
        "route": route, "uncached": uncached, "disable_jit": disable_jit,
        "axes": _compat.AXIS_ENV, "no_axes": _compat.NO_AXES,
    }
    exec(compile(source, GENERATED, "exec"), namespace)  # noqa: S102
    return namespace["dispatch"]


def numpy_memo(layout: Layout, args: tuple, key: tuple, call: Callable) -> tuple | None:
    """The memo of a call whose constants include NumPy arrays, or None.

    Their key is their content (``_keys.constant_key``), which the generated
    hot path cannot compute; its memo can still recognize the same arrays by
    identity, with :func:`~pejit._keys.unchanged` as its guard: the TFC form
    binds its constants once, as NumPy arrays in TFC's programs, and every
    call passes the same objects.
    """
    consts = [args[i] for i in layout.const]
    if len(key) != len(args) or not any(type(c) is np.ndarray for c in consts):
        return None  # keywords or named axes in the key, or nothing for this memo to add
    if not all(type(c) in (np.ndarray, _compat.ArrayImpl) for c in consts):
        return None
    if not all(type(args[i]) is _compat.ArrayImpl for i in layout.dyn):
        return None
    guard = unchanged([c for c in consts if type(c) is np.ndarray])
    return (len(args), *[id(c) for c in consts], *[args[i].aval for i in layout.dyn], guard, call)


_BOUND_SOURCE = """
def call(*args, **kwargs):
    if kwargs or len(args) != {k}:
        full(args, kwargs)  # raises the TypeError
    return dispatch({merged})
"""


def bound_dispatcher(n: int, constants: dict[int, Any], dispatch: Callable, full: Callable) -> Callable:
    """The call of the TFC form: its bound constants merged back in, then ``dispatch``.

    ``dispatch`` is the dispatcher of the ``n`` full arguments; ``full(args, kwargs)``
    raises the ``TypeError`` for keywords or a wrong number of arguments.
    """
    dyn = iter(range(n - len(constants)))
    merged = ", ".join(f"c{i}" if i in constants else f"args[{next(dyn)}]" for i in range(n))
    namespace = {f"c{i}": v for i, v in constants.items()} | {"dispatch": dispatch, "full": full}
    exec(compile(_BOUND_SOURCE.format(k=n - len(constants), merged=merged), GENERATED, "exec"), namespace)  # noqa: S102
    return namespace["call"]


def straight_line(elements: list[str]) -> Callable[[tuple], tuple]:
    """``lambda args: (elements...)``, generated; ``elements`` use integer positions only."""
    body = "".join(f"{e}, " for e in elements)
    return eval(f"lambda args: ({body})")  # noqa: S307
