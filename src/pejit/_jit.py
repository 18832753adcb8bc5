"""The ``jax.jit`` form of pejit: :class:`Pejitted`.

A thin object over its parsed options (:class:`~pejit._calls._info.PejitInfo`):
without constant arguments it is ``jax.jit(f)`` under another name; with
them it builds one dispatcher per argument layout (:mod:`pejit._calls._dispatch`),
keys calls, keeps specializations in its :class:`~pejit._calls._cache.Caches`, and
serves ``jax.jit``'s staged API. Folding is the specializer's
(:mod:`pejit._calls._specializer`); the TFC form wraps a ``Pejitted``
(:mod:`pejit._tfc`); :func:`~pejit.pejit` and :func:`~pejit.pe` make both
(:mod:`pejit._api`).
"""

from __future__ import annotations

import functools
import operator
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import _compat
from ._calls import _errors
from ._calls._cache import CacheInfo, Caches
from ._calls._dispatch import Layout, dispatcher, memo, straight_line
from ._fold._stats import FoldStats
from ._calls._info import fixed_positions, parse_pejit_arguments, split_call
from ._calls._keys import TracedConstant, constant_key, dynamic_key, is_array, watched
from ._calls._program import OtherSignature, Program, Specialization
from ._calls._specializer import jit_kwargs_for, make_runner, specialize
from ._calls._derivatives import jvp_of, traced_call
from ._fold._staging import ClosedOverTracer, StagingTrace, specializing
from ._calls._stages import Lowered, Traced

_tree_unflatten = jax.tree_util.tree_unflatten
_tree_leaves = jax.tree_util.tree_leaves


class _KW:
    """Tags the keyword part of a cache key."""


#: The named-axes part of a call's key outside ``vmap`` with an axis name.
_NO_AXES = ("no named axes",)

#: Misses after which most calls missing is worth a warning (see ``_check_respecializing``).
RESPECIALIZING_AFTER = 16


#: Options of ``Pejitted`` that are pejit's (its public keywords, and two the
#: API layer sets); the others are ``jax.jit``'s.
_PEJIT_OPTIONS = frozenset(_errors.PEJIT_KEYWORDS) | {"jit", "one_value"}

#: Why a function without constant arguments folds nothing (its report says it).
NO_CONSTANTS = "no constant arguments: every call is jax.jit's, nothing is folded"


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
    # and caches to another (``pejit(jax.grad(h))`` ran ``h``). The
    # ``__dict__`` holds only the wrapped function's attributes, as jax.jit's.
    __slots__ = ("info", "_jitted", "_options", "_caches", "_layouts", "_dispatch", "_lock", "_warned",
                 "_hints_given", "_jvp", "_of_derivative", "__dict__", "__weakref__")

    def __init__(self, fun: Callable, **options: Any):
        jit = options.get("jit", True)
        self._jitted = _jax_jit(fun, options) if jit else None
        # Every option is checked here, once (see :func:`parse_pejit_arguments`).
        self.info = parse_pejit_arguments(fun, **options)
        self._options = options  # what pickling keeps
        self._caches = Caches(self.info.cache_size, self.info.cache_bytes)
        self._layouts: dict[int, Layout] = {}
        if self._is_jax_jit:
            # jax.jit's object itself: no Python frame of pejit's, and no
            # reference cycle, so nothing outlives this object
            self._dispatch = self._jitted
        else:
            self._dispatch = _compat.api_boundary(lambda *args, **kwargs: self._route(args, kwargs))
        self._lock = threading.RLock()  # layouts, the warning
        self._warned = False
        self._hints_given: set[str] = set()  # see _errors.check_constants/check_folded
        self._jvp: Pejitted | None = None  # its derivative's pejit function (see _run)
        self._of_derivative = False  # whether it is another one's _jvp
        functools.update_wrapper(self, fun)

    @property
    def _is_jax_jit(self) -> bool:
        """Calls are ``jax.jit``'s: compiled, without constant arguments."""
        return self._jitted is not None and not self.info.constants

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
          CacheInfo(hits=1, misses=1, maxsize=128, currsize=1, maxbytes=2147483648, currbytes=0)
        """
        return self._caches.info()

    def clear_cache(self) -> None:
        """Drop every specialization and compiled program, and reset the statistics.

        As ``jax.jit(f).clear_cache()``, whose caches it clears too.
        """
        self._caches.clear()
        if self._jitted is not None:
            self._jitted.clear_cache()

    def cache_clear(self) -> None:
        """The same as ``clear_cache`` (the name ``functools.lru_cache`` gives it)."""
        self.clear_cache()

    def _cache_size(self) -> int:
        """Compiled entries: ``jax.jit``'s without constant arguments, else specializations."""
        if self._is_jax_jit:
            return self._jitted._cache_size()
        return self._caches.info().currsize

    # -- calling ----------------------------------------------------------
    # A call is one generated function, the dispatcher of the first layout
    # seen (the only one, unless the function is called with varying numbers
    # of positional arguments; ``_route`` before the first call). Handing it
    # out through a (C-level) property saves the Python frame of a method.
    __call__ = property(operator.attrgetter("_dispatch"))

    def _route(self, args: tuple, kwargs: dict):
        layout = self._layouts.get(len(args))
        if layout is not None:
            return layout.dispatch(*args, **kwargs)
        return self._uncached(args, kwargs)

    @_compat.api_boundary  # an error in the user's function shows no pejit frames
    def _uncached(self, args: tuple, kwargs: dict):
        """A call the memo did not serve: find (or fold) its specialization, and memoize it."""
        if self._jitted is not None and _compat.DISABLE_JIT.value:
            return self.info.fun(*args, **kwargs)  # as jax.jit does: no trace, no fold
        layout = self._layout(len(args))
        try:
            constants = self._constant_key(args, kwargs, layout)
        except TracedConstant as e:
            return self._fallback(e, args, kwargs)
        dyn_args, dyn_kwargs = self._dynamic(args, kwargs, layout)
        cache = self._caches.specializations
        axes = _compat.axis_env_key()
        key, spec = (None, None) if axes else cache.latest(constants)
        if spec is not None:
            # The last specialization of these constants; jax.jit's dispatch
            # checks the dynamic arguments' types.
            try:
                out = self._run(spec, args, kwargs, layout, dyn_args, dyn_kwargs)
            except OtherSignature:
                cache.several(constants)
            else:
                cache.counts.hits += 1
                self._memoize(args, kwargs, layout, key, spec)
                return out
        key = (constants, self._types(args, dyn_kwargs, layout, axes))
        try:
            spec = self._caches.specialization(key, self._build, args, kwargs, layout)
        except ClosedOverTracer:
            # As jax.jit traces again inside each outer trace: the function,
            # run under the caller's trace, sees the tracer it closes over
            # (or fails on a leaked one, as jax.jit's call does).
            return self.info.fun(*args, **kwargs)
        self._memoize(args, kwargs, layout, key, spec)
        return self._run(spec, args, kwargs, layout, dyn_args, dyn_kwargs)

    def _run(self, spec: Specialization, args: tuple, kwargs: dict, layout: Layout, dyn_args: tuple,
             dyn_kwargs: dict):
        """Run ``spec``'s residual for a call; under a transformation, with pejit's derivative
        rule (see :mod:`pejit._calls._derivatives`). Not inside a fold (the folding trace
        differentiates nothing; the enclosing function's derivative is folded whole), nor
        under partial evaluation (the linearization of a derivative rule only splits its
        known outputs from its tangents), nor for a derivative staged into a jaxpr (the JVP of
        a ``jax.checkpoint`` or a loop body, which JAX partially evaluates as a whole: a
        ``custom_jvp`` call there would keep its outputs unknown), nor for ``pe`` staged into
        a jaxpr: ``jax.make_jaxpr`` of it shows its residual program, as of TFC's ``pe``
        (its derivatives under ``jax.grad`` or ``jax.jacfwd`` still fold)."""
        trace = _compat.TRACE.value
        staged = type(trace) is _compat.DynamicJaxprTrace
        if (trace is _compat.eval_trace or isinstance(trace, (StagingTrace, _compat.JaxprTrace))
                or not self.info.fold_options.derivatives or (staged and (self._of_derivative or not self.info.jit))):
            return spec.call(*dyn_args, **dyn_kwargs)
        const_pos, const_kw, _, _ = split_call(self.info, args, kwargs, layout)
        return traced_call(self._derivative(), spec.call, const_pos, const_kw, dyn_args, dyn_kwargs)

    def _derivative(self) -> Pejitted:
        """The pejit function of ``jax.jvp`` of this one, its argument 0 (this one's
        constants and statics) constant: this function's derivatives, folded."""
        with self._lock:
            if self._jvp is None:
                self._jvp = Pejitted(jvp_of(self.info.fun), constant_argnums=0, jit=self.info.jit,
                                     fold_options=self.info.fold_options)
                # the hints are about the user's function (given there), not its derivative
                self._jvp._hints_given.update(("writable", "nothing", "respecializing"))
                self._jvp._of_derivative = True
            return self._jvp

    def _memoize(self, args: tuple, kwargs: dict, layout: Layout, key: tuple, spec: Specialization) -> None:
        """Make this call's specialization the memo, if the dispatcher can recognize its constants
        and they select it alone."""
        if key[1][-1] is not _NO_AXES or (kwargs and not self.info.fixed_names.isdisjoint(kwargs)):
            return
        cache = self._caches.specializations
        if cache.index.get(key[0]) is not key:
            return  # several specializations of these constants: the full key decides
        cache.touch(key, spec, memo(layout, args, key[0], spec.call))

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
            dispatch = dispatcher(n, const, dyn, self._caches.fast_path(), self._route, self._uncached,
                                  None if self._jitted is None else _compat.DISABLE_JIT, self.info.fixed_names)
            layout = Layout(const, dyn, straight_line([f"args[{i}]" for i in dyn]), dispatch)
            with self._lock:
                self._layouts[n] = layout
                if len(self._layouts) == 1:
                    self._dispatch = dispatch
        return layout

    def _constant_key(self, args: tuple, kwargs: dict, layout: Layout) -> tuple:
        """The constants' part of a call's key: their values (a ``jax.Array`` by
        identity), in order, then the constant keywords' if any."""
        key = [constant_key(i, args[i]) for i in layout.const]
        if kwargs:
            fixed = self.info.fixed_names
            named = sorted((k, constant_key(k, v)) for k, v in kwargs.items() if k in fixed)
            if named:
                key.append((_KW, tuple(named)))
        return tuple(key)

    @staticmethod
    def _types(args: tuple, dyn_kwargs: dict, layout: Layout, axes: tuple) -> tuple:
        """The dynamic arguments' part of a call's key: their types, then the
        named axes the call runs under (see ``_compat.axis_env_key``)."""
        types = [dynamic_key(args[i], i) for i in layout.dyn]
        types += [(k, dynamic_key(v, k)) for k, v in sorted(dyn_kwargs.items())]
        return (*types, axes or _NO_AXES)

    def _key(self, args: tuple, kwargs: dict, layout: Layout) -> tuple:
        """The cache key of a call: ``(constants, types)``."""
        _, dyn_kwargs = self._dynamic(args, kwargs, layout)
        return self._constant_key(args, kwargs, layout), self._types(args, dyn_kwargs, layout, _compat.axis_env_key())

    def _lookup(self, args: tuple, kwargs: dict):
        """The specialization of a call (folding on a miss), its key and layout."""
        layout = self._layout(len(args))
        key = self._key(args, kwargs, layout)
        return self._caches.specialization(key, self._build, args, kwargs, layout), key, layout

    def _specialized_call(self, args: tuple, kwargs: dict):
        spec, _, layout = self._lookup(args, kwargs)
        return (spec, *self._dynamic(args, kwargs, layout))

    def _dynamic(self, args: tuple, kwargs: dict, layout: Layout) -> tuple[tuple, dict]:
        """The arguments of a call that its specialization takes."""
        fixed = self.info.fixed_names
        if not kwargs or not fixed:
            return layout.dynamic(args), kwargs
        return layout.dynamic(args), {k: v for k, v in kwargs.items() if k not in fixed}

    def _build(self, args: tuple, kwargs: dict, layout: Layout):
        """A new specialization for this call, the constants it dies with, and its bytes."""
        const_pos, const_kw, dyn_args, dyn_kwargs = split_call(self.info, args, kwargs, layout)
        with specializing():
            spec = specialize(self.info, layout, self._caches.programs, const_pos, const_kw, dyn_args, dyn_kwargs)
        if self.info.jit and self.info.fold_options.literals:
            spec.compile_in(jit_kwargs_for(self.info, layout, 0))
        const_leaves = _tree_leaves(([v for _, v in const_pos], [v for _, v in const_kw]))
        _errors.check_constants(self.info.name, const_leaves, self._hints_given)
        _errors.check_folded(self.info.name, spec, const_leaves, self._hints_given)
        self._check_respecializing()
        return spec, watched(const_leaves), sum(getattr(c, "nbytes", 0) for c in spec.consts)

    def _check_respecializing(self) -> None:
        """Warn, once, when most calls fold (three in four, after 16 folds): a
        constant argument probably changes on each call."""
        counts = self._caches.specializations.counts
        misses = counts.misses
        most = misses >= RESPECIALIZING_AFTER and 4 * misses >= 3 * (misses + counts.hits)
        if most and "respecializing" not in self._hints_given:
            self._hints_given.add("respecializing")
            _errors.respecializing(self.info.name, misses, misses + counts.hits)

    # -- jax.jit's staged API --------------------------------------------
    # A constant given as a type alone (a ``jax.ShapeDtypeStruct``, as
    # ``jax.export`` is usually called, or a tracer) has no value to fold:
    # staging is then ``jax.jit``'s, whose program is right for every value.
    @_compat.api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """Lower the residual program for these arguments, as ``jax.jit`` does.

        The folded constants are passed to the program as buffers. Without
        constant arguments, or with a constant given as a
        ``jax.ShapeDtypeStruct``, ``jax.jit``'s own ``jax.stages.Lowered``.
        """
        if self._is_jax_jit:
            return self._jitted.lower(*args, **kwargs)
        self._require_jit("lower")
        if self._abstract(args, kwargs):
            return self._jitted.lower(*args, **kwargs)
        spec, dyn_args, dyn_kwargs = self._specialized_call(args, kwargs)
        lowered = spec.run.lower(*spec.consts, *dyn_args, **dyn_kwargs)
        return Lowered(lowered, self._checker(args, kwargs), spec.consts)

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
        if self._is_jax_jit:
            return self._jitted.trace(*args, **kwargs)
        self._require_jit("trace")
        if self._abstract(args, kwargs):
            return self._jitted.trace(*args, **kwargs)
        spec, _, _ = self._specialized_call(args, kwargs)
        layout = self._layout(len(args))
        targs, tkwargs = self._unused(args, kwargs, layout)
        traced = self._residual_jit(spec, layout).trace(*targs, **tkwargs)
        return Traced.of(traced, self._checker(args, kwargs, traced=True), _export_error(self.info.name))

    def _residual_jit(self, spec: Specialization, layout: Layout) -> Callable:
        """``jax.jit`` of the function with the residual of ``spec`` as its body:
        the constant (and static) arguments unused, the folded constants closed over.

        Static arguments are unused inputs too (not ``jax.jit``'s static
        ones): the specialization already depends on their values.
        """
        dynamic = self._dynamic

        @functools.wraps(self.info.fun)  # its name (the module is jit_<name>) and argument names
        def residual(*args, **kwargs):
            dyn_args, dyn_kwargs = dynamic(args, kwargs, layout)
            return spec.call(*dyn_args, **dyn_kwargs)

        skip = _PEJIT_OPTIONS | {"static_argnums", "static_argnames"}
        return jax.jit(residual, **{k: v for k, v in self._options.items() if k not in skip})

    def _unused(self, args: tuple, kwargs: dict, layout: Layout) -> tuple[tuple, dict]:
        """A call's arguments as its trace takes them: the constant and static
        ones keep their array leaves (unused inputs); other leaves become None."""

        def arrays(value):
            return jax.tree_util.tree_map(lambda leaf: leaf if is_array(leaf) else None, value)

        fixed, names = set(layout.const), self.info.fixed_names
        return (tuple(arrays(a) if i in fixed else a for i, a in enumerate(args)),
                {k: arrays(v) if k in names else v for k, v in kwargs.items()})

    def _abstract(self, args: tuple, kwargs: dict) -> bool:
        """Whether a constant (or static) argument is a type without a value."""
        layout = self._layout(len(args))
        fixed = [args[i] for i in layout.const] + [v for k, v in kwargs.items() if k in self.info.fixed_names]
        return any(isinstance(leaf, (jax.ShapeDtypeStruct, _compat.Tracer)) for leaf in _tree_leaves(fixed))

    @_compat.api_boundary
    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        if self._is_jax_jit or (self._jitted is not None and self._abstract(args, kwargs)):
            return self._jitted.eval_shape(*args, **kwargs)
        spec, _, _ = self._specialized_call(args, kwargs)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                for v in spec.program.jaxpr.outvars]
        return _tree_unflatten(spec.out_tree, outs)

    @_compat.api_boundary
    def specialize(self, *args, **kwargs) -> Specialization:
        """The specialization these arguments select (folding if needed).

        Without constant arguments, ``jax.jit``'s program, nothing folded.
        """
        if self._is_jax_jit:
            return self._jax_specialization(args, kwargs)
        return self._specialized_call(args, kwargs)[0]

    def _jax_specialization(self, args: tuple, kwargs: dict) -> Specialization:
        """What a call without constant arguments runs: ``jax.jit``'s jaxpr, its
        closed-over values as the constants."""
        traced = self._jitted.trace(*args, **kwargs)
        jaxpr, consts = _compat.open_jaxpr(traced.jaxpr)
        out_tree = jax.tree_util.tree_structure(traced.out_info)
        run = make_runner(self.info, self._layout(len(args)), jaxpr, len(consts), out_tree, traced.in_tree)
        program = Program(jaxpr, len(consts), out_tree, FoldStats(), (NO_CONSTANTS,), run, None)
        return Specialization(program, consts, 0.0)

    def report(self, *args, **kwargs):
        """The [`FoldReport`][pejit.FoldReport] of the specialization for these arguments."""
        return self.specialize(*args, **kwargs).report

    def _require_jit(self, what: str) -> None:
        if not self.info.jit:
            raise AttributeError(f"{what}() needs a compiled function: use pejit, not pe")

    def _checker(self, args, kwargs, traced: bool = False) -> Callable:
        """Split a call of a staged object, checking its constants: into its
        dynamic arguments, or (``traced``) the arguments of its trace."""
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
            if traced:
                return self._unused(call_args, call_kwargs, layout)
            return dyn_args, dyn_kwargs

        return split

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
        if self._is_jax_jit:
            return repr(self._jitted)
        kind = "pejit" if self.info.jit else "pe"
        try:
            return f"<{kind} function of {self.info.fun!r}>"
        except Exception:  # noqa: BLE001 -- as jax.jit's: a repr that fails is left out
            return f"<{kind} function>"


def _jax_jit(fun: Callable, options: dict) -> Callable:
    """``jax.jit`` of ``fun`` with its own options in ``options``.

    With constant arguments it only checks the options; then a function that
    cannot be weakly referenced is wrapped in a ``functools.partial``, as
    jaxlib (0.10 to 0.12 at least) may crash when a ``jax.jit`` object of
    such a function is freed. Without constants it is the call, ``jax.jit``'s
    own (which rejects such a function when called).
    """
    jax_options = {k: v for k, v in options.items() if k not in _PEJIT_OPTIONS}
    if callable(fun) and (options.get("constant_argnums") or options.get("constant_argnames")):
        try:
            weakref.ref(fun)
        except TypeError:
            fun = functools.partial(fun)
    return jax.jit(fun, **jax_options)


def _argument_name(what: int | str) -> str:
    return f"argument {what}" if isinstance(what, int) else f"argument {what!r}"


def _export_error(name: str) -> str:
    return (
        f"jax.export of {name}: its trace folds the values of its constant arguments, so the exported "
        "program would be right for those values only. Export the folded program, specialized to these "
        "constants and taking the dynamic arguments alone, with pejit.export_folded(f)(*args); or give "
        "the constant arguments as jax.ShapeDtypeStruct to export the unfolded function, right for "
        "every value, as jax.jit's"
    )


def dynamic_function(pj: Pejitted, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
    """``jax.jit`` of the residual of a call's specialization, a function of its
    dynamic arguments alone, the folded constants closed over; and those arguments.

    Without constant arguments, ``jax.jit`` of the function and the call's arguments.
    """
    if not pj.info.constants:
        return pj._jitted or jax.jit(pj.info.fun), args, kwargs
    if pj._abstract(args, kwargs):
        raise ValueError(
            f"{pj.info.name}: a folded program needs the values of the constant arguments, "
            "not a jax.ShapeDtypeStruct"
        )
    spec, dyn_args, dyn_kwargs = pj._specialized_call(args, kwargs)
    return jax.jit(spec.call, **jit_kwargs_for(pj.info, pj._layout(len(args)), 0)), dyn_args, dyn_kwargs


def bound_dispatch(pj: Pejitted, n: int, constants: dict[int, Any], full: Callable) -> Callable:
    """The generated call of the TFC form of ``pj``: its ``n`` arguments but
    the bound ``constants`` (``full(args, kwargs)`` raises for other calls)."""
    layout = pj._layout(n)
    return dispatcher(n, layout.const, layout.dyn, pj._caches.fast_path(), full, pj._uncached,
                      None if pj._jitted is None else _compat.DISABLE_JIT, bound=constants)