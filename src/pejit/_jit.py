"""``pe`` and ``pejit``: the user-facing wrappers.

Two forms share one implementation, :class:`Pejitted`:

* the ``jax.jit`` form, ``pejit(f, constant_argnums=..., constant_argnames=...)``,
  specializes at call time and keeps one specialization per constant value;
* the TFC form, ``pejit(*example_args, constant_arg_nums=[...])(f)``, folds
  immediately for the example arguments and returns a function of the
  remaining arguments (:class:`BoundPejitted`).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from . import _argnums
from ._folding import FoldOptions
from ._keys import TracedConstant, constant_key, references
from ._specialize import Residual, fold

_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten
_tree_leaves = jax.tree_util.tree_leaves


class PejitWarning(UserWarning):
    """Base class of the warnings pejit issues."""


class FoldingSkippedWarning(PejitWarning):
    """A constant argument was a tracer, so pejit could not fold it."""


class Specialization:
    """One residual program and the executable that runs it."""

    def __init__(self, residual: Residual, in_tree, out_tree, run: Callable, keepalive: list):
        self.residual = residual
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.run = run
        self.consts = residual.consts
        self._keepalive = keepalive  # leaves whose identity the cache key uses

    @property
    def report(self):
        return self.residual.report

    def __call__(self, dyn_args, dyn_kwargs):
        return self.run(self.consts, *dyn_args, **dyn_kwargs)


class Pejitted:
    """A function whose constant arguments are folded at specialization time.

    Created by :func:`pejit` or :func:`pe`. Calling it specializes on the
    constant values (once per value) and runs the residual program on the
    dynamic arguments.
    """

    def __init__(
        self,
        fun: Callable,
        *,
        constant_argnums: int | Sequence[int] | None = None,
        constant_argnames: str | Sequence[str] | None = None,
        jit: bool = True,
        fold_options: FoldOptions | None = None,
        **jit_kwargs: Any,
    ):
        if not callable(fun):
            raise TypeError(f"pejit: expected a callable to specialize, got {type(fun).__name__} {fun!r}")
        self._fun = fun
        self._jit = jit
        self._options = fold_options or FoldOptions()
        if not isinstance(self._options, FoldOptions):
            raise TypeError(f"fold_options must be a pejit.FoldOptions, got {type(self._options).__name__}")
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
        self._cache: dict[Any, Specialization] = {}
        self._lock = threading.RLock()
        self._warned = False
        functools.update_wrapper(self, fun)

    def _resolve(self, sig, what_nums, nums, what_names, names):
        nums = _argnums.check_argnums(what_nums, nums, self._nargs)
        names = _argnums.check_argnames(what_names, names)
        return _argnums.resolve(f"{what_nums}/{what_names}", sig, nums, names)

    # -- calling ----------------------------------------------------------
    def __call__(self, *args, **kwargs):
        try:
            spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs)
        except TracedConstant as e:
            return self._fallback(str(e), args, kwargs)
        return spec(dyn_args, dyn_kwargs)

    def _fallback(self, what: str, args, kwargs):
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"pejit({self.__name__}): {what} is a tracer of an outer "
                "transformation (jit/grad/vmap over a constant argument), so it "
                "was treated as dynamic and nothing was folded",
                FoldingSkippedWarning,
                stacklevel=3,
            )
        return self._fun(*args, **kwargs)

    def _split(self, args: tuple, kwargs: dict):
        fixed = self._fixed_positions(len(args))
        const_pos = tuple((i, args[i]) for i in sorted(fixed) if i < len(args))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in fixed)
        const_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._fixed_names))
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._fixed_names}
        return const_pos, const_kw, dyn_args, dyn_kwargs

    def _fixed_positions(self, n: int) -> frozenset[int]:
        if self._nargs is None and any(i < 0 for i in self._fixed_nums):
            return frozenset(i % n for i in self._fixed_nums if -n <= i < n)
        return self._fixed_nums

    def _specialization(self, args, kwargs, *, abstract_ok: bool = False):
        if self._nargs is not None and len(args) > self._nargs:
            raise TypeError(f"{self.__name__}() takes {self._nargs} positional arguments but {len(args)} were given")
        const_pos, const_kw, dyn_args, dyn_kwargs = self._split(args, kwargs)
        key_consts = (
            tuple((i, constant_key(f"argument {i}", v)) for i, v in const_pos),
            tuple((k, constant_key(f"argument {k!r}", v)) for k, v in const_kw),
        )
        leaves, in_tree = _tree_flatten((dyn_args, dyn_kwargs))
        try:
            avals = tuple(_dynamic_aval(leaf, abstract_ok) for leaf in leaves)
        except _NotAnArray:
            raise TypeError(_not_an_array_message(args, kwargs, self._fixed_positions(len(args)),
                                                  self._fixed_names, abstract_ok)) from None
        key = (key_consts, len(args), in_tree, avals)
        spec = self._cache.get(key)
        if spec is None:
            with self._lock:
                spec = self._cache.get(key)
                if spec is None:
                    spec = self._specialize(len(args), const_pos, const_kw, in_tree, avals)
                    self._cache[key] = spec
        return spec, dyn_args, dyn_kwargs

    def _specialize(self, nargs, const_pos, const_kw, in_tree, avals) -> Specialization:
        out_trees = []

        def flat_fun(*leaves):
            dyn_args, dyn_kwargs = _tree_unflatten(in_tree, leaves)
            args = _merge(const_pos, dyn_args)
            out = self._fun(*args, **dict(const_kw), **dyn_kwargs)
            out_leaves, out_tree = _tree_flatten(out)
            out_trees.append(out_tree)
            return out_leaves

        residual = fold(flat_fun, avals, self._options, name=getattr(self._fun, "__name__", "pejit"))
        run = _runner(residual, out_trees[-1])
        if self._jit:
            run = jax.jit(run, **self._jit_kwargs_for(nargs))
        keepalive = references([v for _, v in const_pos] + [v for _, v in const_kw])
        return Specialization(residual, in_tree, out_trees[-1], run, keepalive)

    def _jit_kwargs_for(self, nargs: int) -> dict:
        """``jax.jit`` keywords for the runner ``run(consts, *dyn_args, **dyn_kwargs)``."""
        fixed = self._fixed_positions(nargs)
        dyn_index = {}
        for i in range(nargs):
            if i not in fixed:
                dyn_index[i] = len(dyn_index) + 1  # 0 is the folded constants
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
                    f"in_shardings has {len(in_shardings)} entries but {self.__name__} "
                    f"was called with {nargs} positional arguments"
                )
            kwargs["in_shardings"] = (None, *(s for i, s in enumerate(in_shardings) if i not in fixed))
        return kwargs

    # -- jax.jit's staged API --------------------------------------------
    def lower(self, *args, **kwargs) -> Lowered:
        """Lower the residual program for these arguments, as ``jax.jit`` does."""
        spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs, abstract_ok=True)
        self._require_jit("lower")
        return Lowered(spec.run.lower(spec.consts, *dyn_args, **dyn_kwargs), spec, self._checker(args, kwargs))

    def trace(self, *args, **kwargs):
        """Trace the residual program for these arguments (``jax.stages.Traced``)."""
        spec, dyn_args, dyn_kwargs = self._specialization(args, kwargs, abstract_ok=True)
        self._require_jit("trace")
        return spec.run.trace(spec.consts, *dyn_args, **dyn_kwargs)

    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        spec, _, _ = self._specialization(args, kwargs, abstract_ok=True)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in spec.residual.jaxpr.jaxpr.outvars]
        return _tree_unflatten(spec.out_tree, outs)

    def specialize(self, *args, **kwargs) -> Specialization:
        """The specialization these arguments select (folding if needed)."""
        return self._specialization(args, kwargs, abstract_ok=True)[0]

    def report(self, *args, **kwargs):
        """The :class:`~pejit.FoldReport` of the specialization for these arguments."""
        return self.specialize(*args, **kwargs).report

    def _require_jit(self, what: str) -> None:
        if not self._jit:
            raise AttributeError(f"{what}() needs a compiled function: use pejit, not pe")

    def _checker(self, args, kwargs) -> Callable:
        """Split a call of a compiled object, checking its constants."""
        const_pos, const_kw, _, _ = self._split(args, kwargs)
        expected = [constant_key("", v) for _, v in const_pos] + [constant_key("", v) for _, v in const_kw]

        def split(call_args, call_kwargs):
            c_pos, c_kw, dyn_args, dyn_kwargs = self._split(call_args, call_kwargs)
            got = [constant_key("", v) for _, v in c_pos] + [constant_key("", v) for _, v in c_kw]
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
        return f"<{'pejit' if self._jit else 'pe'} function {self.__name__}>"


class BoundPejitted:
    """The TFC form: constants bound from example arguments, folded eagerly.

    Takes the non-constant arguments, in order. Calling it with arguments
    whose shapes or dtypes differ from the examples re-specializes (as
    ``jax.jit`` retraces); mutating a NumPy constant after creation is
    noticed, never used stale.
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

    def _full(self, args: tuple) -> tuple:
        want = len(self._dyn_positions)
        if len(args) != want:
            raise TypeError(
                f"{self.__name__} takes {want} positional argument{'s' if want != 1 else ''} "
                f"(the non-constant ones) but {len(args)} were given"
            )
        return _merge(tuple(self._const.items()), args)

    def __call__(self, *args):
        return self._core(*self._full(args))

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


class Lowered:
    """``jax.stages.Lowered`` of a residual program; folded constants bound."""

    def __init__(self, lowered, spec: Specialization, split: Callable):
        self._lowered = lowered
        self._spec = spec
        self._split = split

    def compile(self, *args, **kwargs) -> Compiled:
        return Compiled(self._lowered.compile(*args, **kwargs), self._spec, self._split)

    def __getattr__(self, name):
        return getattr(self._lowered, name)


class Compiled:
    """``jax.stages.Compiled`` of a residual program; call it like the function."""

    def __init__(self, compiled, spec: Specialization, split: Callable):
        self._compiled = compiled
        self._spec = spec
        self._split = split

    def __call__(self, *args, **kwargs):
        dyn_args, dyn_kwargs = self._split(args, kwargs)
        return self._compiled(self._spec.consts, *dyn_args, **dyn_kwargs)

    def __getattr__(self, name):
        return getattr(self._compiled, name)


def _runner(residual: Residual, out_tree) -> Callable:
    """``run(consts, *dyn_args, **dyn_kwargs)`` evaluating the residual jaxpr."""
    fun = jaxpr_as_fun(ClosedJaxpr(residual.open_jaxpr(), ()))

    def run(consts, *dyn_args, **dyn_kwargs):
        outs = fun(*consts, *_tree_leaves((dyn_args, dyn_kwargs)))
        return _tree_unflatten(out_tree, outs)

    return run


def _merge(const_pos: tuple, dyn_args: Sequence) -> list:
    """Interleave ``(position, value)`` constants with the other arguments."""
    out = list(dyn_args)
    for i, v in const_pos:
        out.insert(i, v)
    return out


class _NotAnArray(TypeError):
    """A dynamic leaf that JAX cannot trace; reported with its argument's name."""


def _dynamic_aval(leaf, abstract_ok: bool):
    if abstract_ok and isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.core.ShapedArray(leaf.shape, leaf.dtype, weak_type=getattr(leaf, "weak_type", False))
    try:
        return jax.typeof(leaf)
    except TypeError:
        raise _NotAnArray from None


def _not_an_array_message(args, kwargs, fixed_nums, fixed_names, abstract_ok: bool) -> str:
    """Name the dynamic argument (and the leaf in it) that is not an array."""
    named = [(f"argument {i}", a) for i, a in enumerate(args) if i not in fixed_nums]
    named += [(f"argument {k!r}", v) for k, v in kwargs.items() if k not in fixed_names]
    for what, value in named:
        for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            try:
                _dynamic_aval(leaf, abstract_ok)
            except _NotAnArray:
                where = f"{what}{jax.tree_util.keystr(path)}"
                return (
                    f"pejit: {where} is dynamic but has a leaf of type {type(leaf).__name__}, "
                    "which is not a JAX array type; mark the argument constant (or static) "
                    "to pass non-array values"
                )
    return "pejit: a dynamic argument has a leaf that is not a JAX array type"


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
    the signature you call.

    Example:
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
    return _front("pejit", True, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, jit_kwargs)


def pe(
    *args: Any,
    constant_arg_nums: Sequence[int] | None = None,
    constant_argnums: int | Sequence[int] | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
):
    """Partially evaluate a function with constant arguments, without jitting.

    The same forms as :func:`pejit`; the result runs the residual program
    equation by equation (it can be jitted, vmapped, differentiated).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from pejit import pe
      >>> f = pe(jnp.arange(3.0), jnp.ones(3), constant_arg_nums=[0])(lambda x, y: jnp.sin(x) * y)
      >>> [e.primitive.name for e in jax.make_jaxpr(f)(jnp.ones(3)).eqns]
      ['mul']
    """
    return _front("pe", False, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, {})


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
