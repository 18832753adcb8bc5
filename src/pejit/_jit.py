"""The ``jax.jit`` form of pejit: :class:`Pejitted`.

A thin object over its parsed options (:class:`~pejit._info.PejitInfo`):
it builds one dispatcher per argument layout (:mod:`pejit._dispatch`),
keys calls, keeps specializations in its :class:`~pejit._cache.Caches`, and
serves ``jax.jit``'s staged API. Folding is the specializer's
(:mod:`pejit._specializer`); the TFC form wraps a ``Pejitted``
(:mod:`pejit._tfc`); :func:`~pejit.pejit` and :func:`~pejit.pe` make both
(:mod:`pejit._api`).
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable
from typing import Any

import jax

from . import _compat, _errors
from ._cache import CacheInfo, Caches
from ._dispatch import Layout, dispatcher, straight_line
from ._info import fixed_positions, parse_pejit_arguments, split_call
from ._keys import TracedConstant, constant_key, dynamic_key, watched
from ._program import Specialization
from ._specializer import specialize
from ._stages import Lowered

_tree_unflatten = jax.tree_util.tree_unflatten
_tree_leaves = jax.tree_util.tree_leaves


class _KW:
    """Tags the keyword part of a cache key."""


class Pejitted:
    """A function whose constant arguments are folded at specialization time.

    Created by [`pejit`][pejit.pejit] or [`pe`][pejit.pe]. Calling it specializes on the
    constant values (once per value) and runs the residual program on the
    dynamic arguments. Specializations live in an LRU cache of ``cache_size``
    entries ([`DEFAULT_CACHE_SIZE`][pejit.DEFAULT_CACHE_SIZE] by default, ``None`` for unbounded);
    one keyed on a ``jax.Array`` constant is dropped when that array dies.
    ``lower``, ``trace`` and ``eval_shape`` work as on ``jax.jit``;
    ``report`` summarizes a specialization. ``info`` holds the options,
    parsed and checked once (``pejit._info.PejitInfo``).

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
    # and caches to another (``pejit(jax.grad(h))`` ran ``h``). The
    # ``__dict__`` holds only the wrapped function's attributes, as jax.jit's.
    __slots__ = ("info", "_caches", "_layouts", "_dispatch", "_lock", "_warned", "_hints_given",
                 "__dict__", "__weakref__")

    def __init__(self, fun: Callable, **options: Any):
        # Every option is checked here, once (see :func:`parse_pejit_arguments`).
        self.info = parse_pejit_arguments(fun, **options)
        self._caches = Caches(self.info.cache_size)
        self._layouts: dict[int, Layout] = {}
        self._dispatch = _compat.api_boundary(lambda *args, **kwargs: self._route(args, kwargs))
        self._lock = threading.RLock()  # layouts, the warning
        self._warned = False
        self._hints_given: set[str] = set()  # see _errors.check_constants/check_folded
        functools.update_wrapper(self, fun)

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
          CacheInfo(hits=1, misses=1, maxsize=128, currsize=1)
        """
        return self._caches.info()

    def cache_clear(self) -> None:
        """Drop every specialization and compiled program, and reset the statistics."""
        self._caches.clear()

    # -- calling ----------------------------------------------------------
    # A call is one generated function, the dispatcher of the first layout
    # seen (the only one, unless the function is called with varying numbers
    # of positional arguments; ``_route`` before the first call). Handing it
    # out through a (C-level) property saves the Python frame of a method.
    __call__ = property(operator.attrgetter("_dispatch"))

    def _route(self, args: tuple, kwargs: dict):
        layout = None if kwargs else self._layouts.get(len(args))
        if layout is not None:
            return layout.dispatch(*args)
        return self._uncached(args, kwargs)

    @_compat.api_boundary  # an error in the user's function shows no pejit frames
    def _uncached(self, args: tuple, kwargs: dict):
        try:
            spec, dyn_args, dyn_kwargs = self._specialized_call(args, kwargs)
        except TracedConstant as e:
            return self._fallback(e, args, kwargs)
        except _compat.ClosedOverTracer:
            # As jax.jit traces again inside each outer trace: the function,
            # run under the caller's trace, sees the tracer it closes over
            # (or fails on a leaked one, as jax.jit's call does).
            return self.info.fun(*args, **kwargs)
        return spec.call(*dyn_args, **dyn_kwargs)

    def _fallback(self, e: TracedConstant, args, kwargs):
        what = _argument_name(e.args[0])
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            _errors.skipped_folding(self.info.name, what)
        return self.info.fun(*args, **kwargs)

    def _layout(self, n: int) -> Layout:
        layout = self._layouts.get(n)
        if layout is None:
            nargs = self.info.nargs
            if nargs is not None and n > nargs:
                raise TypeError(f"{self.info.name}() takes {nargs} positional arguments but {n} were given")
            fixed = fixed_positions(self.info, n)
            const = tuple(i for i in range(n) if i in fixed)
            dyn = tuple(i for i in range(n) if i not in fixed)
            dispatch = dispatcher(n, const, dyn, self._caches.fast_path(), self._route, self._uncached)
            layout = Layout(const, dyn, straight_line([f"args[{i}]" for i in dyn]), dispatch)
            with self._lock:
                self._layouts[n] = layout
                if len(self._layouts) == 1:
                    self._dispatch = dispatch
        return layout

    def _key(self, args: tuple, kwargs: dict, layout: Layout) -> tuple:
        """The cache key of a call: constants' values, dynamic arguments' types, named axes.

        For positional ``jax.Array`` arguments, the layout's hot path
        (:func:`dispatcher`) computes the same key inline.
        """
        key = [constant_key(i, args[i]) for i in layout.const]
        key += [dynamic_key(args[i], i) for i in layout.dyn]
        key.append(_compat.axis_env_key())
        if kwargs:
            fixed = self.info.fixed_names
            key.append((_KW, tuple(sorted(
                (k, constant_key(k, v) if k in fixed else dynamic_key(v, k)) for k, v in kwargs.items()
            ))))
        return tuple(key)

    def _specialized_call(self, args: tuple, kwargs: dict):
        layout = self._layout(len(args))
        key = self._key(args, kwargs, layout)
        spec = self._caches.specialization(key, self._build, args, kwargs, layout)
        fixed = self.info.fixed_names
        return spec, layout.dynamic(args), {k: v for k, v in kwargs.items() if k not in fixed}

    def _build(self, args: tuple, kwargs: dict, layout: Layout):
        """A new specialization for this call, and the constants it dies with."""
        const_pos, const_kw, dyn_args, dyn_kwargs = split_call(self.info, args, kwargs, layout)
        with _compat.specializing():
            spec = specialize(self.info, layout, self._caches.programs, const_pos, const_kw, dyn_args, dyn_kwargs)
        const_leaves = _tree_leaves(([v for _, v in const_pos], [v for _, v in const_kw]))
        _errors.check_constants(self.info.name, const_leaves, self._hints_given)
        _errors.check_folded(self.info.name, spec, const_leaves, self._hints_given)
        return spec, watched(const_leaves)

    # -- jax.jit's staged API --------------------------------------------
    @_compat.api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """Lower the residual program for these arguments, as ``jax.jit`` does."""
        spec, dyn_args, dyn_kwargs = self._specialized_call(args, kwargs)
        self._require_jit("lower")
        return Lowered(spec.run.lower(*spec.consts, *dyn_args, **dyn_kwargs), spec, self._checker(args, kwargs))

    @_compat.api_boundary
    def trace(self, *args, **kwargs):
        """Trace the residual program for these arguments (``jax.stages.Traced``)."""
        spec, dyn_args, dyn_kwargs = self._specialized_call(args, kwargs)
        self._require_jit("trace")
        return spec.run.trace(*spec.consts, *dyn_args, **dyn_kwargs)

    @_compat.api_boundary
    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        spec, _, _ = self._specialized_call(args, kwargs)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                for v in spec.program.jaxpr.outvars]
        return _tree_unflatten(spec.out_tree, outs)

    @_compat.api_boundary
    def specialize(self, *args, **kwargs) -> Specialization:
        """The specialization these arguments select (folding if needed)."""
        return self._specialized_call(args, kwargs)[0]

    def report(self, *args, **kwargs):
        """The [`FoldReport`][pejit.FoldReport] of the specialization for these arguments."""
        return self.specialize(*args, **kwargs).report

    def _require_jit(self, what: str) -> None:
        if not self.info.jit:
            raise AttributeError(f"{what}() needs a compiled function: use pejit, not pe")

    def _checker(self, args, kwargs) -> Callable:
        """Split a call of a compiled object, checking its constants."""
        layout = self._layout(len(args))
        const_pos, const_kw, _, _ = split_call(self.info, args, kwargs, layout)
        expected = [constant_key(i, v) for i, v in const_pos] + [constant_key(k, v) for k, v in const_kw]

        def split(call_args, call_kwargs):
            layout = self._layout(len(call_args))
            c_pos, c_kw, dyn_args, dyn_kwargs = split_call(self.info, call_args, call_kwargs, layout)
            got = [constant_key(i, v) for i, v in c_pos] + [constant_key(k, v) for k, v in c_kw]
            if got != expected:
                raise ValueError(
                    "this compiled function was specialized for other constant "
                    "values; lower and compile again for the new ones"
                )
            return dyn_args, dyn_kwargs

        return split

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __repr__(self) -> str:
        return f"<{'pejit' if self.info.jit else 'pe'} function {self.info.name}>"


def _argument_name(what: int | str) -> str:
    return f"argument {what}" if isinstance(what, int) else f"argument {what!r}"


def layout_dispatch(pj: Pejitted, n: int) -> Callable:
    """The generated call of ``pj`` with ``n`` positional arguments."""
    return pj._layout(n).dispatch
