"""The ``jax.jit`` form of pejit: :class:`Pejitted`, a call path and its options.

As ``jax.jit``'s ``make_jit`` is thin over its parsed options, a ``Pejitted``
is thin over its call path (:mod:`pejit._calls._path`), which
:func:`~pejit._calls._path.make_path` chooses once: the folding path with
constant arguments, ``jax.jit`` itself without. What this object adds is what
a user holds: the function's name and attributes, pickling, binding as a
method, and the public names of the staged API and the cache. The TFC form
(:mod:`pejit._tfc`) and ``constant_argnums="auto"`` (:mod:`pejit._auto`)
hold call paths of their own; :func:`call_path` hands this one to
``explain`` and ``export_folded``.
"""

from __future__ import annotations

import functools
import operator
import types
import weakref
from collections.abc import Callable
from typing import Any

from . import _compat
from ._calls._cache import CacheInfo
from ._calls._info import PejitInfo
from ._calls._passthrough import JitPath
from ._calls._path import CallPath, make_path
from ._calls._program import Specialization
from ._calls._stages import Lowered


class Pejitted:
    """A function whose constant arguments are folded at specialization time.

    Created by [`pejit`][pejit.pejit] or [`pe`][pejit.pe]. Calling it specializes on the
    constant values (once per value) and runs the residual program on the
    dynamic arguments. Specializations live in an LRU cache of ``cache_size``
    entries ([`DEFAULT_CACHE_SIZE`][pejit.DEFAULT_CACHE_SIZE] by default, ``None`` for unbounded);
    one keyed on a ``jax.Array`` constant is dropped when that array dies.
    ``lower``, ``trace`` and ``eval_shape`` work as on ``jax.jit``;
    ``report`` summarizes a specialization. ``info`` holds the options,
    parsed and checked once (``pejit._calls._info.PejitInfo``).

    Without constant arguments there is nothing to fold, and a ``pejit``
    function is ``jax.jit(f, **jit_kwargs)``: calls, ``lower``, ``trace``,
    ``eval_shape``, ``clear_cache``, ``_cache_size`` and ``repr`` are its own,
    so that values, errors, caching (shared with other ``jax.jit`` objects of
    ``f``), ``jax.disable_jit()`` and memory behave exactly as with
    ``jax.jit``. ``jax.jit`` is built in any case, first: its errors for the
    function and for its own options are the ones the user sees.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import pejit
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> A = 2 * jnp.eye(2)
      >>> f(A, jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
      >>> f.eval_shape(A, jax.ShapeDtypeStruct((2,), jnp.float32))
      ShapeDtypeStruct(shape=(2,), dtype=float32)
      >>> f.lower(A, jnp.ones(2)).compile()(A, jnp.zeros(2))
      Array([0., 0.], dtype=float32)
      >>> dict(f.report(A, jnp.ones(2)).residual)
      {'dot_general': 1}
    """

    # State lives in slots: ``functools.update_wrapper`` (below, and in JAX's
    # transformations wrapping a pejit function) copies a function's
    # ``__dict__`` onto its wrapper, which would hand this function's options
    # and caches to another (``pejit(jax.grad(h))`` would run ``h``). The
    # ``__dict__`` holds only the wrapped function's attributes, as jax.jit's.
    __slots__ = ("_path", "_dispatch", "_options", "__dict__", "__weakref__")

    def __init__(self, fun: Callable, **options: Any):
        # every option checked, once; the path publishes its dispatch when it changes
        self._path = make_path(fun, options, publish=functools.partial(_publish, weakref.ref(self)))
        self._dispatch = self._path.dispatch
        self._options = options  # what pickling keeps
        functools.update_wrapper(self, fun)

    @property
    def info(self) -> PejitInfo:
        """The options, parsed and checked once."""
        return self._path.info

    # A call is the path's dispatch: without constants ``jax.jit``'s object
    # itself, else the generated dispatcher of the first layout seen. Handing
    # it out through a (C-level) property saves the Python frame of a method.
    __call__ = property(operator.attrgetter("_dispatch"))

    # -- the cache ----------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        """Hits, misses, maximum and current size of the specialization cache.

        Example:
          >>> import jax.numpy as jnp
          >>> from pejit import pejit
          >>> f = pejit(lambda a, x: jnp.sin(a) * x, constant_argnums=0)
          >>> a = jnp.ones(3)
          >>> _ = f(a, jnp.ones(3)); _ = f(a, jnp.ones(3))
          >>> f.cache_info()
          CacheInfo(hits=1, misses=1, maxsize=128, currsize=1, maxbytes=2147483648, currbytes=12)
        """
        return self._path.cache_info()

    def clear_cache(self) -> None:
        """Drop every specialization and compiled program, and reset the statistics.

        As ``jax.jit(f).clear_cache()``, whose caches it clears too.
        """
        self._path.clear_cache()

    def cache_clear(self) -> None:
        """The same as ``clear_cache`` (the name ``functools.lru_cache`` gives it)."""
        self.clear_cache()

    def _cache_size(self) -> int:
        """Compiled entries: ``jax.jit``'s without constant arguments, else specializations."""
        return self._path.cache_size()

    # -- jax.jit's staged API --------------------------------------------
    @_compat.api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """Lower the residual program for these arguments, as ``jax.jit`` does.

        The folded constants are passed to the program as buffers. Without
        constant arguments, or with a constant given as a
        ``jax.ShapeDtypeStruct``, ``jax.jit``'s own ``jax.stages.Lowered``.
        """
        return self._path.lower(args, kwargs)

    @_compat.api_boundary
    def trace(self, *args, **kwargs):
        """Trace the function for these arguments: a [`Traced`][pejit.Traced].

        Its jaxpr keeps the function's signature (constant arguments unused)
        and carries the folded constants; it serves these constant values
        only, and ``jax.export`` of it raises, naming
        [`export_folded`][pejit.export_folded]. Without constant arguments,
        or with a constant given as a ``jax.ShapeDtypeStruct``, ``jax.jit``'s
        own ``jax.stages.Traced``, right for every value.
        """
        return self._path.trace(args, kwargs)

    @_compat.api_boundary
    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        return self._path.eval_shape(args, kwargs)

    @_compat.api_boundary
    def specialize(self, *args, **kwargs) -> Specialization:
        """The specialization these arguments select (folding if needed).

        Without constant arguments, ``jax.jit``'s program, nothing folded.
        """
        return self._path.specialize(args, kwargs)

    def report(self, *args, **kwargs):
        """The [`FoldReport`][pejit.FoldReport] of the specialization for these arguments."""
        return self.specialize(*args, **kwargs).report

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)  # a bound method, as jax.jit's

    def __getstate__(self) -> dict:
        """The function and its options; caches are not pickled. ``function_name``
        is ``jax.jit``'s key (``functools.partial`` unwrapped)."""
        return {"function_name": self.info.name, "fun": self.info.fun, "options": self._options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["fun"], **state["options"])

    def __repr__(self) -> str:
        return repr(self._path)


def _publish(ref: weakref.ref, dispatch: Callable) -> None:
    """The call of the ``Pejitted`` that ``ref`` refers to is now ``dispatch`` (see ``make_path``)."""
    pj = ref()
    if pj is not None:
        pj._dispatch = dispatch


def call_path(pj: Pejitted) -> CallPath | JitPath:
    """The call path of ``pj``: what ``explain`` and ``export_folded`` ask for its specializations."""
    return pj._path
