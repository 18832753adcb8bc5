"""The call path of a function without constant arguments: :class:`JitPath`, ``jax.jit`` itself.

With nothing to fold, a ``pejit`` function is ``jax.jit(f, **jit_kwargs)``:
calls, ``lower``, ``trace``, ``eval_shape``, clearing the cache, its size
and ``repr`` are ``jax.jit``'s own, so that values, errors, caching (shared
with other ``jax.jit`` objects of ``f``), ``jax.disable_jit()`` and memory
behave exactly as with ``jax.jit``, and a call costs what ``jax.jit``'s
costs: the call is ``jax.jit``'s object, no Python frame of pejit's.

:class:`JitPath` has the interface of the folding path
(:class:`~pejit._calls._path.CallPath`), and
:func:`~pejit._calls._path.make_path` chooses between them once, when the
function is made: no method of the API asks again. ``specialize`` (and so
``report`` and ``explain``) shows ``jax.jit``'s program, nothing folded.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from .. import _compat
from .._fold._stats import FoldStats
from ._cache import CacheInfo, Caches
from ._dispatch import Layout
from ._info import PejitInfo, positions
from ._program import Program, Specialization, make_runner

#: Why a function without constant arguments folds nothing (its report says it).
NO_CONSTANTS = "no constant arguments: every call is jax.jit's, nothing is folded"


class JitPath:
    """The call path of a ``pejit`` function without constant arguments: ``jax.jit``'s.

    ``info``: the parsed options; ``jitted``: ``jax.jit`` of the function,
    which is also ``dispatch``, the call.
    """

    def __init__(self, info: PejitInfo, jitted: Callable):
        self.info = info
        self.caches = Caches(info.cache_size, info.cache_bytes)  # empty, but checks the sizes as pejit's do
        self.jitted = self.dispatch = jitted

    def dispatcher(self, n: int, route: Callable, uncached: Callable | None = None,
                   bound: dict | None = None) -> Callable:
        """The TFC form's call, which binds no constant: ``route(args, kwargs)``
        checks the call and gives its arguments, and ``jax.jit`` runs it."""
        jitted = self.dispatch

        def call(*args, **kwargs):
            return jitted(*route(args, kwargs))

        return call

    def uncached(self, args: tuple, kwargs: dict):
        """A call of the full arguments, as a folding path's that its memo did not serve: ``jax.jit``'s."""
        return self.dispatch(*args, **kwargs)

    # -- the staged API: jax.jit's -----------------------------------------
    def specialize(self, args: tuple, kwargs: dict, settle: bool = True) -> Specialization:
        """What a call runs: ``jax.jit``'s jaxpr, its closed-over values as the constants
        (nothing folds, so nothing is left to ``settle``)."""
        traced = self.jitted.trace(*args, **kwargs)
        jaxpr, consts = _compat.open_jaxpr(traced.jaxpr)
        out_tree = jax.tree_util.tree_structure(traced.out_info)
        layout = Layout(*positions(self.info, len(args)))
        run = make_runner(self.info, layout, jaxpr, len(consts), out_tree, traced.in_tree)
        program = Program(jaxpr, len(consts), out_tree, FoldStats(), (NO_CONSTANTS,), run, None)
        return Specialization(program, consts, 0.0)

    def lower(self, args: tuple, kwargs: dict, split: Callable | None = None):
        """``jax.jit``'s ``Lowered`` (no constants to check or to drop: ``split`` is not needed)."""
        return self.jitted.lower(*args, **kwargs)

    def trace(self, args: tuple, kwargs: dict):
        return self.jitted.trace(*args, **kwargs)

    def eval_shape(self, args: tuple, kwargs: dict):
        return self.jitted.eval_shape(*args, **kwargs)

    def folded(self, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
        """The program to export: ``jax.jit``'s, of the call's arguments."""
        return self.jitted, args, kwargs

    def require_jit(self, what: str) -> None:
        """Staging needs a compiled function: this one is."""

    # -- the cache: jax.jit's ----------------------------------------------
    def cache_info(self) -> CacheInfo:
        return self.caches.info()

    def clear_cache(self) -> None:
        self.caches.clear()
        self.jitted.clear_cache()

    def cache_size(self) -> int:
        """``jax.jit``'s compiled entries."""
        return self.jitted._cache_size()

    def __repr__(self) -> str:
        return repr(self.jitted)
