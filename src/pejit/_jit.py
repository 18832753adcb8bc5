"""``pe`` and ``pejit``: the user-facing wrappers.

Two forms share one implementation, :class:`Pejitted`:

* the ``jax.jit`` form, ``pejit(f, constant_argnums=..., constant_argnames=...)``,
  specializes at call time and keeps one specialization per constant value;
* the TFC form, ``pejit(*example_args, constant_arg_nums=[...])(f)``, folds
  immediately for the example arguments and returns a function of the
  remaining arguments (:class:`BoundPejitted`).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _argnums, _compat
from ._cache import DEFAULT_CACHE_SIZE, CacheInfo, Caches
from ._dispatch import Layout, bound_dispatcher, dispatcher, straight_line
from ._folding import FoldOptions
from ._keys import TracedConstant, constant_key, dynamic_aval, dynamic_key, is_array, structure_key, watched
from ._program import FoldingProgram, PerValue, Program, Specialization, has_control_flow, runner
from ._specialize import Residual, fold
from ._stages import Lowered

_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten
_tree_leaves = jax.tree_util.tree_leaves


class PejitWarning(UserWarning):
    """Base class of the warnings pejit issues."""


class FoldingSkippedWarning(PejitWarning):
    """A constant argument was a tracer, so pejit could not fold it.

    This happens when an outer transformation (``jax.jit``, ``grad``,
    ``vmap``) is applied over a constant argument: the function then runs
    unfolded, with the right result.

    Examples:
      >>> import warnings, jax
      >>> from pejit import pejit
      >>> f = pejit(lambda a, x: a * x, constant_argnums=0)
      >>> with warnings.catch_warnings(record=True) as caught:
      ...     warnings.simplefilter("always")
      ...     jax.jit(f)(2.0, 3.0)
      Array(6., dtype=float32, weak_type=True)
      >>> caught[0].category.__name__
      'FoldingSkippedWarning'
    """


class _KW:
    """Tags the keyword part of a cache key."""


class Pejitted:
    """A function whose constant arguments are folded at specialization time.

    Created by :func:`pejit` or :func:`pe`. Calling it specializes on the
    constant values (once per value) and runs the residual program on the
    dynamic arguments. Specializations live in an LRU cache of ``cache_size``
    entries (:data:`DEFAULT_CACHE_SIZE` by default, ``None`` for unbounded);
    one keyed on a ``jax.Array`` constant is dropped when that array dies.
    ``lower``, ``trace`` and ``eval_shape`` work as on ``jax.jit``;
    ``report`` summarizes a specialization.

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

    def __init__(
        self,
        fun: Callable,
        *,
        constant_argnums: int | Sequence[int] | None = None,
        constant_argnames: str | Sequence[str] | None = None,
        jit: bool = True,
        fold_options: FoldOptions | None = None,
        cache_size: int | None = DEFAULT_CACHE_SIZE,
        constant_shardings: Any = None,
        **jit_kwargs: Any,
    ):
        if not callable(fun):
            raise TypeError(f"pejit: expected a callable to specialize, got {type(fun).__name__} {fun!r}")
        self._fun = fun
        self._name = getattr(fun, "__name__", type(fun).__name__)
        self._jit = jit
        self._options = fold_options or FoldOptions()
        if not isinstance(self._options, FoldOptions):
            raise TypeError(f"fold_options must be a pejit.FoldOptions, got {type(self._options).__name__}")
        if constant_shardings is not None and not (
            isinstance(constant_shardings, jax.sharding.Sharding) or callable(constant_shardings)
        ):
            raise TypeError(
                "constant_shardings must be a jax.sharding.Sharding or a callable "
                f"from a folded constant's jax.ShapeDtypeStruct to a Sharding (or None), "
                f"got {type(constant_shardings).__name__}"
            )
        self._constant_shardings = constant_shardings
        sig = _argnums.signature(fun)
        self._nargs = _argnums.positional_count(sig)
        const = self._resolve(sig, "constant_argnums", constant_argnums, "constant_argnames", constant_argnames)
        if not jit and jit_kwargs:
            raise TypeError(f"pe does not compile, so it takes no jax.jit keywords; got {sorted(jit_kwargs)}")
        static = self._resolve(
            sig, "static_argnums", jit_kwargs.pop("static_argnums", None),
            "static_argnames", jit_kwargs.pop("static_argnames", None),
        )
        donate = self._resolve(
            sig, "donate_argnums", jit_kwargs.pop("donate_argnums", None),
            "donate_argnames", jit_kwargs.pop("donate_argnames", None),
        )
        _argnums.check_disjoint("constant_argnums/constant_argnames", const, "static_argnums/static_argnames", static)
        _argnums.check_disjoint("constant_argnums/constant_argnames", const, "donate_argnums/donate_argnames", donate)
        _argnums.check_disjoint("static_argnums/static_argnames", static, "donate_argnums/donate_argnames", donate)
        # Static arguments are concrete while tracing and keyed by value, as
        # constants are; they only differ in name.
        self._fixed_nums = const[0] | static[0]
        self._fixed_names = const[1] | static[1]
        self._donate_nums, self._donate_names = donate
        self._jit_kwargs = jit_kwargs
        self._caches = Caches(cache_size)
        self._layouts: dict[int, Layout] = {}
        self._dispatch = lambda *args, **kwargs: self._route(args, kwargs)
        self._lock = threading.RLock()
        self._warned = False
        functools.update_wrapper(self, fun)

    def _resolve(self, sig, what_nums, nums, what_names, names):
        nums = _argnums.check_argnums(what_nums, nums, self._nargs)
        names = _argnums.check_argnames(what_names, names)
        return _argnums.resolve(f"{what_nums}/{what_names}", sig, nums, names)

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

    def _uncached(self, args: tuple, kwargs: dict):
        try:
            spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs)
        except TracedConstant as e:
            return self._fallback(e, args, kwargs)
        return spec.call(*dyn_args, **dyn_kwargs)

    def _fallback(self, e: TracedConstant, args, kwargs):
        what = _describe(e.args[0])
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            warnings.warn(
                f"pejit({self._name}): {what} is a tracer of an outer "
                "transformation (jit/grad/vmap over a constant argument), so it "
                "was treated as dynamic and nothing was folded",
                FoldingSkippedWarning,
                stacklevel=3,
            )
        return self._fun(*args, **kwargs)

    def _layout(self, n: int) -> Layout:
        layout = self._layouts.get(n)
        if layout is None:
            if self._nargs is not None and n > self._nargs:
                raise TypeError(f"{self._name}() takes {self._nargs} positional arguments but {n} were given")
            fixed = self._fixed_positions(n)
            const = tuple(i for i in range(n) if i in fixed)
            dyn = tuple(i for i in range(n) if i not in fixed)
            dispatch = dispatcher(n, const, dyn, self._caches.fast_path(), self._route, self._uncached)
            layout = Layout(const, dyn, straight_line([f"args[{i}]" for i in dyn]), dispatch)
            with self._lock:
                self._layouts[n] = layout
                if len(self._layouts) == 1:
                    self._dispatch = dispatch
        return layout

    def _fixed_positions(self, n: int) -> frozenset[int]:
        if self._nargs is None and any(i < 0 for i in self._fixed_nums):
            return frozenset(i % n for i in self._fixed_nums if -n <= i < n)
        return self._fixed_nums

    def _key(self, args: tuple, kwargs: dict, layout: Layout) -> tuple:
        """The cache key of a call: constants' values, then dynamic arguments' types.

        For positional ``jax.Array`` arguments, the layout's hot path
        (:func:`dispatcher`) computes the same key inline.
        """
        key = [constant_key(i, args[i]) for i in layout.const]
        key += [dynamic_key(args[i], i) for i in layout.dyn]
        if kwargs:
            fixed = self._fixed_names
            key.append((_KW, tuple(sorted(
                (k, constant_key(k, v) if k in fixed else dynamic_key(v, k)) for k, v in kwargs.items()
            ))))
        return tuple(key)

    def _split(self, args: tuple, kwargs: dict, layout: Layout):
        const_pos = tuple((i, args[i]) for i in layout.const)
        const_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._fixed_names))
        dyn_args = tuple(args[i] for i in layout.dyn)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._fixed_names}
        return const_pos, const_kw, dyn_args, dyn_kwargs

    def _specialization(self, args: tuple, kwargs: dict):
        layout = self._layout(len(args))
        key = self._key(args, kwargs, layout)

        def build():
            const_pos, const_kw, dyn_args, dyn_kwargs = self._split(args, kwargs, layout)
            with _compat.at_top_level():
                spec = self._specialize(len(args), const_pos, const_kw, dyn_args, dyn_kwargs)
            const_leaves = _tree_leaves(([v for _, v in const_pos], [v for _, v in const_kw]))
            return spec, watched(const_leaves)

        spec = self._caches.specialization(key, build)
        fixed = self._fixed_names
        return spec, layout.dynamic(args), {k: v for k, v in kwargs.items() if k not in fixed}

    def _specialize(self, nargs, const_pos, const_kw, dyn_args, dyn_kwargs) -> Specialization:
        """Fold for these constants: with a shared program if values don't matter."""
        dyn_leaves, in_tree = _tree_flatten((dyn_args, dyn_kwargs))
        avals = tuple(dynamic_aval(leaf) for leaf in dyn_leaves)
        const_leaves, const_tree = _tree_flatten(([v for _, v in const_pos], [v for _, v in const_kw]))
        where = (tuple(i for i, _ in const_pos), tuple(k for k, _ in const_kw))
        skey = (nargs, where, const_tree, structure_key(const_leaves), in_tree, avals)
        arrays = [leaf for leaf in const_leaves if is_array(leaf)]
        programs = self._caches.programs
        program = programs.get(skey)
        if program is None:
            start = time.perf_counter()
            program, consts = self._trace_program(nargs, where, const_leaves, const_tree, in_tree, avals)
            programs.put(skey, program)
            if not isinstance(program, PerValue):
                return Specialization(program, consts, time.perf_counter() - start)
        if isinstance(program, PerValue):
            return self._specialize_eagerly(nargs, const_pos, const_kw, in_tree, avals, program.reason)
        start = time.perf_counter()
        consts = program.fold(*arrays)
        return Specialization(program, consts, time.perf_counter() - start)

    def _flat_fun(self, where, const_vals, in_tree, out_trees: list) -> Callable:
        """The user's function of the flat dynamic leaves, constants bound."""
        const_pos = tuple(zip(where[0], const_vals[0]))
        const_kw = dict(zip(where[1], const_vals[1]))
        fun = self._fun

        def flat_fun(*leaves):
            dyn_args, dyn_kwargs = _tree_unflatten(in_tree, leaves)
            out = fun(*_merge(const_pos, dyn_args), **const_kw, **dyn_kwargs)
            out_leaves, out_tree = _tree_flatten(out)
            out_trees.append(out_tree)
            return out_leaves

        return flat_fun

    def _trace_program(self, nargs, where, const_leaves, const_tree, in_tree, avals):
        """Trace once with the constant arrays abstract: the folding program.

        If the trace needs a constant's value (Python control flow, shapes,
        a ``cond`` with a known index, ...) it fails, and the structure is
        marked value-dependent: each new value is traced again, concretely.
        Any failure counts, since JAX reports a missing value in many ways
        (``ConcretizationTypeError``, but also ``TypeError`` for shapes and
        ``IndexError`` for slices) and so may user code checking values; the
        concrete trace then raises the function's real errors. The reason is
        kept in the report.
        """
        is_arrays = [is_array(leaf) for leaf in const_leaves]
        arrays = [leaf for leaf, a in zip(const_leaves, is_arrays) if a]
        # Close over the static leaves only: array leaves must not be kept alive.
        statics = [None if a else leaf for leaf, a in zip(const_leaves, is_arrays)]
        traced: dict[str, Any] = {}
        out_trees: list = []

        def folding_program(*array_leaves):
            it = iter(array_leaves)
            leaves = [next(it) if a else leaf for leaf, a in zip(statics, is_arrays)]
            flat_fun = self._flat_fun(where, _tree_unflatten(const_tree, leaves), in_tree, out_trees)
            residual = fold(flat_fun, avals, self._options, name=self._name, retry_eager_bodies=False)
            traced["jaxpr"] = residual.jaxpr.jaxpr
            traced["report"] = dataclasses.replace(residual.report, after=None)
            return self._place(residual.consts, jax.lax.with_sharding_constraint)

        try:
            program = FoldingProgram(jax.jit(folding_program).trace(*arrays))
        except Exception as e:  # the trace needed a constant's value
            first_line = (str(e).splitlines() or [""])[0]
            return PerValue(f"the trace needs constant values ({type(e).__name__}: {first_line[:120]})"), None
        if has_control_flow(traced["jaxpr"]):
            # Loops, branches and checkpoints left in the residual are where
            # pejit's passes hoist known work, by evaluating it concretely:
            # with abstract constants they would hoist less. Fold each value.
            return PerValue("control flow left in the residual is specialized per value"), None
        consts = program.evaluate(*arrays)
        run = self._make_runner(traced["jaxpr"], out_trees[-1], nargs)
        return Program(traced["jaxpr"], out_trees[-1], traced["report"], run, program), consts

    def _specialize_eagerly(self, nargs, const_pos, const_kw, in_tree, avals, reason: str) -> Specialization:
        out_trees: list = []
        where = (tuple(i for i, _ in const_pos), tuple(k for k, _ in const_kw))
        vals = ([v for _, v in const_pos], [v for _, v in const_kw])
        residual = fold(self._flat_fun(where, vals, in_tree, out_trees), avals, self._options, name=self._name)
        note = f"each new constant value is traced and folded again: {reason}"
        residual = Residual(residual.jaxpr, dataclasses.replace(
            residual.report, fallbacks=(*residual.report.fallbacks, note)))
        folded = residual.consts
        consts = self._place(folded, jax.device_put)
        run = self._make_runner(residual.jaxpr.jaxpr, out_trees[-1], nargs)
        program = Program(residual.jaxpr.jaxpr, out_trees[-1], residual.report, run, None)
        return Specialization(program, consts, residual.report.fold_seconds, residual if consts is folded else None)

    def _place(self, consts: list, put: Callable) -> list:
        """Apply ``constant_shardings`` to the folded constants."""
        where = self._constant_shardings
        if where is None:
            return consts
        out = []
        for c in consts:
            s = where if isinstance(where, jax.sharding.Sharding) else where(jax.ShapeDtypeStruct(c.shape, c.dtype))
            out.append(c if s is None else put(c, s))
        return out

    def _make_runner(self, jaxpr, out_tree, nargs: int) -> Callable:
        run = runner(jaxpr, out_tree)
        if self._jit:
            run = jax.jit(run, **self._jit_kwargs_for(nargs, len(jaxpr.constvars)))
        return run

    def _jit_kwargs_for(self, nargs: int, nconsts: int) -> dict:
        """``jax.jit`` keywords for the runner ``run(*consts, *dyn_args, **dyn_kwargs)``."""
        layout = self._layout(nargs)
        dyn_index = {i: nconsts + j for j, i in enumerate(layout.dyn)}
        kwargs = dict(self._jit_kwargs)
        donate = [dyn_index[i % nargs] for i in self._donate_nums if -nargs <= i < nargs]
        if donate:
            kwargs["donate_argnums"] = tuple(donate)
        if self._donate_names:
            kwargs["donate_argnames"] = tuple(self._donate_names)
        in_shardings = kwargs.get("in_shardings")
        if isinstance(in_shardings, (tuple, list)):
            if len(in_shardings) != nargs:
                raise ValueError(
                    f"in_shardings has {len(in_shardings)} entries but {self._name} "
                    f"was called with {nargs} positional arguments"
                )
            kwargs["in_shardings"] = (*[None] * nconsts, *(in_shardings[i] for i in layout.dyn))
        elif isinstance(in_shardings, jax.sharding.Sharding):
            # One sharding for every argument the user passes; the folded
            # constants keep the placement folding gave them.
            kwargs["in_shardings"] = (*[None] * nconsts, *(in_shardings for _ in layout.dyn))
        return kwargs

    # -- jax.jit's staged API --------------------------------------------
    def lower(self, *args, **kwargs) -> Lowered:
        """Lower the residual program for these arguments, as ``jax.jit`` does."""
        spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs)
        self._require_jit("lower")
        return Lowered(spec.run.lower(*spec.consts, *dyn_args, **dyn_kwargs), spec, self._checker(args, kwargs))

    def trace(self, *args, **kwargs):
        """Trace the residual program for these arguments (``jax.stages.Traced``)."""
        spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs)
        self._require_jit("trace")
        return spec.run.trace(*spec.consts, *dyn_args, **dyn_kwargs)

    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        spec, _, _ = self._specialization(args, kwargs)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in spec.program.jaxpr.outvars]
        return _tree_unflatten(spec.out_tree, outs)

    def specialize(self, *args, **kwargs) -> Specialization:
        """The specialization these arguments select (folding if needed)."""
        return self._specialization(args, kwargs)[0]

    def report(self, *args, **kwargs):
        """The :class:`~pejit.FoldReport` of the specialization for these arguments."""
        return self.specialize(*args, **kwargs).report

    def _require_jit(self, what: str) -> None:
        if not self._jit:
            raise AttributeError(f"{what}() needs a compiled function: use pejit, not pe")

    def _checker(self, args, kwargs) -> Callable:
        """Split a call of a compiled object, checking its constants."""
        layout = self._layout(len(args))
        const_pos, const_kw, _, _ = self._split(args, kwargs, layout)
        expected = [constant_key(i, v) for i, v in const_pos] + [constant_key(k, v) for k, v in const_kw]

        def split(call_args, call_kwargs):
            c_pos, c_kw, dyn_args, dyn_kwargs = self._split(call_args, call_kwargs, self._layout(len(call_args)))
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
        return f"<{'pejit' if self._jit else 'pe'} function {self._name}>"


def _describe(what: int | str) -> str:
    return f"argument {what}" if isinstance(what, int) else f"argument {what!r}"


class BoundPejitted:
    """The TFC form: constants bound from example arguments, folded eagerly.

    Takes the non-constant arguments, in order. Calling it with arguments
    whose shapes or dtypes differ from the examples re-specializes (as
    ``jax.jit`` retraces); mutating a NumPy constant after creation is
    noticed, never used stale.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import pejit
      >>> A = 2 * jnp.eye(2)
      >>> g = pejit(A, jnp.ones(2), constant_arg_nums=[0])(lambda A, x: jnp.linalg.inv(A) @ x)
      >>> g(jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
      >>> g.lower(jnp.ones(2)).compile()(jnp.full(2, 4.0))
      Array([2., 2.], dtype=float32)
    """

    def __init__(self, fun: Callable, example_args: tuple, constant_arg_nums, *, jit: bool, fold_options, jit_kwargs):
        n = len(example_args)
        const = _argnums.check_argnums("constant_arg_nums", constant_arg_nums, n)
        self._n = n
        self._const = {i: example_args[i] for i in sorted(const)}
        self._dyn_positions = [i for i in range(n) if i not in self._const]
        jit_kwargs = _to_full_signature(jit_kwargs, self._dyn_positions)
        self._core = Pejitted(
            _positional_only(fun, n), constant_argnums=tuple(self._const), jit=jit,
            fold_options=fold_options, **jit_kwargs,
        )
        functools.update_wrapper(self, fun)
        self._core.specialize(*example_args)
        self._call = bound_dispatcher(n, self._const, self._core._layout(n).dispatch, self._full)

    # Like ``Pejitted``'s: the call is one generated function (C-level property).
    __call__ = property(operator.attrgetter("_call"))

    def _full(self, args: tuple) -> tuple:
        want = len(self._dyn_positions)
        if len(args) != want:
            raise TypeError(
                f"{self.__name__} takes {want} positional argument{'s' if want != 1 else ''} "
                f"(the non-constant ones) but {len(args)} were given"
            )
        return _merge(tuple(self._const.items()), args)

    def lower(self, *args) -> Lowered:
        lowered = self._core.lower(*self._full(args))
        lowered._split = lambda a, k: (a, k)
        return lowered

    def trace(self, *args):
        return self._core.trace(*self._full(args))

    def eval_shape(self, *args):
        return self._core.eval_shape(*self._full(args))

    def specialize(self, *args) -> Specialization:
        return self._core.specialize(*self._full(args))

    def report(self, *args):
        return self.specialize(*args).report

    def __repr__(self) -> str:
        return f"<{self._core!r} with constants at {list(self._const)}>"


def _merge(const_pos: tuple, dyn_args: Sequence) -> list:
    """Interleave ``(position, value)`` constants with the other arguments."""
    out = list(dyn_args)
    for i, v in const_pos:
        out.insert(i, v)
    return out


def _positional_only(fun: Callable, n: int) -> Callable:
    """``fun`` seen as taking exactly ``n`` positional arguments."""

    @functools.wraps(fun)
    def wrapper(*args):
        return fun(*args)

    del wrapper.__wrapped__  # its signature is positional, whatever fun's is
    return wrapper


def _to_full_signature(jit_kwargs: dict, dyn_positions: list[int]) -> dict:
    """TFC form: map argument numbers of the reduced signature to the full one."""
    kwargs = dict(jit_kwargs)
    k = len(dyn_positions)
    for name in ("static_argnums", "donate_argnums"):
        if kwargs.get(name) is not None:
            nums = _argnums.check_argnums(name, kwargs[name], k)
            kwargs[name] = tuple(dyn_positions[i] for i in nums)
    for name in ("static_argnames", "donate_argnames"):
        if kwargs.get(name):
            raise TypeError(f"{name} needs the jax.jit form of pejit; in the TFC form, give argument numbers")
    in_shardings = kwargs.get("in_shardings")
    if isinstance(in_shardings, (tuple, list)):
        if len(in_shardings) != k:
            raise ValueError(f"in_shardings has {len(in_shardings)} entries for {k} non-constant arguments")
        full = [None] * (max(dyn_positions, default=-1) + 1)
        for pos, s in zip(dyn_positions, in_shardings):
            full[pos] = s
        kwargs["in_shardings"] = tuple(full)
    return kwargs


def pejit(
    *args: Any,
    constant_arg_nums: Sequence[int] | None = None,
    constant_argnums: int | Sequence[int] | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
    cache_size: int | None = DEFAULT_CACHE_SIZE,
    constant_shardings: Any = None,
    **jit_kwargs: Any,
):
    """Partially evaluate, then ``jax.jit``, a function with constant arguments.

    Everything that depends only on the constant arguments is computed once,
    at specialization time; the compiled program does only the work that
    depends on the other (dynamic) arguments. Constants are concrete while
    the function is traced, so Python control flow on them works.

    Two forms:

    * ``pejit(f, constant_argnums=..., constant_argnames=..., **jit_kwargs)``
      (or ``@pejit(constant_argnums=...)``): like ``jax.jit``; specializes at
      call time, one specialization per constant value.
    * ``pejit(*example_args, constant_arg_nums=[...], **jit_kwargs)(f)``: the
      TFC form; folds now, returns a function of the remaining arguments.

    Any keyword of ``jax.jit`` is accepted; argument numbers in it refer to
    the signature you call. ``cache_size`` bounds the specializations kept
    (an LRU; ``None``: unbounded); ``constant_shardings`` places the folded
    constants: a ``jax.sharding.Sharding`` for all of them, or a callable
    from a folded constant's ``jax.ShapeDtypeStruct`` to a sharding (``None``
    keeps the placement folding gave it). See ``docs/caching.md``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import pejit
      >>> A = jnp.array([[2.0, 0.0], [0.0, 4.0]])
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> f(A, jnp.ones(2))
      Array([0.5 , 0.25], dtype=float32)
      >>> g = pejit(A, jnp.ones(2), constant_arg_nums=[0])(lambda A, x: jnp.linalg.inv(A) @ x)
      >>> g(jnp.ones(2))
      Array([0.5 , 0.25], dtype=float32)
    """
    jit_kwargs = dict(jit_kwargs, cache_size=cache_size, constant_shardings=constant_shardings)
    return _front("pejit", True, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, jit_kwargs)


def pe(
    *args: Any,
    constant_arg_nums: Sequence[int] | None = None,
    constant_argnums: int | Sequence[int] | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
    cache_size: int | None = DEFAULT_CACHE_SIZE,
):
    """Partially evaluate a function with constant arguments, without jitting.

    The same forms as :func:`pejit`; the result runs the residual program
    equation by equation (it can be jitted, vmapped, differentiated).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import pe
      >>> f = pe(jnp.arange(3.0), jnp.ones(3), constant_arg_nums=[0])(lambda x, y: jnp.sin(x) * y)
      >>> [e.primitive.name for e in jax.make_jaxpr(f)(jnp.ones(3)).eqns]
      ['mul']
    """
    return _front(
        "pe", False, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options,
        {"cache_size": cache_size},
    )


def _front(name, jit, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, jit_kwargs):
    if constant_arg_nums is not None:
        if constant_argnums is not None or constant_argnames is not None:
            raise TypeError(
                f"{name}: give either constant_arg_nums with example arguments (TFC form) "
                "or constant_argnums/constant_argnames (jax.jit form), not both"
            )

        def bind(fun):
            return BoundPejitted(
                fun, args, constant_arg_nums, jit=jit, fold_options=fold_options, jit_kwargs=jit_kwargs
            )

        return bind
    make = functools.partial(
        Pejitted, constant_argnums=constant_argnums, constant_argnames=constant_argnames,
        jit=jit, fold_options=fold_options, **jit_kwargs,
    )
    if not args:
        return make
    if len(args) == 1 and callable(args[0]):
        return make(args[0])
    raise TypeError(
        f"{name}: got {len(args)} positional argument(s) but no constant_arg_nums. Use "
        f"{name}(f, constant_argnums=...) or {name}(*example_args, constant_arg_nums=[...])(f)"
    )
