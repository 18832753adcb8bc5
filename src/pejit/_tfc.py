"""The TFC form of pejit: :class:`BoundPejitted`.

``pejit(*example_args, constant_arg_nums=[...])(f)`` folds for the example
arguments (at once, or beside its first calls where the look says so, as the
call-time form does; small work that XLA folds as it compiles is compiled
in, and folded for ``lower`` and ``trace`` alone) and returns a function of
the remaining arguments. It
holds the call path (:mod:`pejit._calls._path`) of ``f`` whose constants are
the bound positions, and calls it through a dispatcher of that path with
the constants bound; argument numbers in ``jax.jit`` keywords, given for the
reduced signature, are mapped to the full one.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import jax

from . import _compat
from ._calls import _argnums, _beside, _errors
from ._calls._argnums import interleave
from ._calls._keys import unchangeable
from ._calls._passthrough import JitPath
from ._calls._path import CallPath, make_path
from ._calls._program import Specialization
from ._calls._stages import Lowered, Traced


class BoundPejitted:
    """The TFC form: constants bound from example arguments, folded for them.

    Takes the non-constant arguments, in order. Calling it with arguments
    whose shapes or dtypes differ from the examples re-specializes (as
    ``jax.jit`` retraces); mutating a NumPy constant after creation is
    noticed, never used stale.

    Its constants never change, so when nobody can write them (``jax.Array``,
    read-only NumPy arrays as TFC's grids are, scalars, strings, None) and
    the folded ones are small (``pejit._fold._cost.INLINE_BYTES``, 1 MiB), the call
    is one ``jax.jit`` function of the non-constant arguments, the residual
    inside with its constants compiled in: ``jax.jit``'s C++ dispatch alone,
    no Python on the way, so that a small step (TFC's PDE step, a
    hand-folded ``M @ xi + c``) costs per call what it costs by hand, where
    the generated dispatch, ``CallPath.dispatcher`` with the constants
    bound, would add a Python call to each (bench case 15 checks it). A new
    type traces it again, and that trace specializes. Where the fold runs
    beside the first calls, they go through the dispatch until it is in.

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

    # State in slots, as in Pejitted (which says why).
    __slots__ = ("_n", "_const", "_dyn_positions", "_core", "_call", "__dict__", "__weakref__")

    def __init__(self, fun: Callable, example_args: tuple, constant_arg_nums, *, jit: bool, fold_options, jit_kwargs):
        n = len(example_args)
        const = _argnums.check_argnums("constant_arg_nums", constant_arg_nums, n)
        self._n = n
        self._const = {i: example_args[i] for i in sorted(const)}
        self._dyn_positions = [i for i in range(n) if i not in self._const]
        jit_kwargs = _to_full_signature(jit_kwargs, self._dyn_positions)
        self._core = make_path(_positional_only(fun, n), dict(
            constant_argnums=tuple(self._const), jit=jit, fold_options=fold_options, one_value=True, **jit_kwargs,
        ))
        functools.update_wrapper(self, fun)
        if jit and _plain(self._core.info, self._const):  # its look traces jax.jit closed over them
            self._core.retrace = self._retrace
        # folded now, or beside the first calls (FoldOptions.beside), which run jax.jit's program
        spec = self._core.specialize(example_args, {}, settle=False)
        self._call = self._inlined(spec) if jit and spec.pending is None else None
        if self._call is None:
            self._call = self._core.dispatcher(n, self._full, bound=self._const)
        if jit and spec.pending is not None:  # once folded (the cache has swapped the folded program in)
            _beside.when_ready(spec.pending, self._inline)

    def _inline(self, spec: Specialization) -> None:
        call = self._inlined(spec)
        if call is not None:
            self._call = call

    def _inlined(self, spec: Specialization) -> Callable | None:
        """The call as one ``jax.jit`` function, the residual compiled into it, where it can be.

        ``jax.jit`` traces it once per type of the arguments, and a trace is a call the
        memo never serves: it goes to the path's ``uncached`` with no dispatcher
        generated (half a millisecond of code generation a first call need not pay).
        Where the look traced ``jax.jit`` of the function closed over the constants
        (``jax.Array``s: see :func:`pejit._calls._look.trace`) and they are compiled
        in as they are, the call is that function: its first call traces nothing more,
        and a call of other types specializes for them (:meth:`_retrace`)."""
        if not (_plain(self._core.info, self._const) and spec.compilable_in):
            return None
        if spec.jax_jit_closed:  # a call of other types specializes (see _retrace)
            return spec.call
        core, full = self._core, self._full

        def call(*args, **kwargs):
            return core.uncached(full(args, kwargs), {})

        call.__name__ = call.__qualname__ = core.info.name  # as jax.jit's messages name it
        return jax.jit(call)

    def _retrace(self, args: tuple, kwargs: dict):
        """A call of other types (or an error) that ``jax.jit``'s program traced closed over the
        constants stages: specialized for them, as the call that ``_inlined`` builds stages it."""
        return self._core.uncached(self._full(args, kwargs), {}, latest=False)

    # Like ``Pejitted``'s: the call is one generated (or jax.jit) function (C-level property).
    __call__ = property(operator.attrgetter("_call"))

    def _full(self, args: tuple, kwargs: dict | None = None) -> tuple:
        if kwargs:
            raise _errors.tfc_keywords_error(self.__wrapped__, self._n, self._const, kwargs)
        want = len(self._dyn_positions)
        if len(args) != want:
            raise TypeError(
                f"{self._core.info.name} takes {want} positional argument{'s' if want != 1 else ''} "
                f"(the non-constant ones) but {len(args)} were given"
            )
        return interleave(tuple(self._const.items()), args)

    @_compat.api_boundary  # as Pejitted's: an error in the user's function shows no pejit frames
    def lower(self, *args) -> Lowered:
        # Its compiled form is called with the non-constant arguments only.
        return self._core.lower(self._full(args), {}, split=_as_called)

    @_compat.api_boundary
    def trace(self, *args) -> Traced:
        """Trace the folded program: a function of the non-constant arguments,
        the folded constants inside (so ``jax.export`` of this function exports it)."""
        self._core.require_jit("trace")
        fun, dyn_args, _ = self._core.folded(self._full(args), {})
        return Traced.of(fun.trace(*dyn_args), _as_called, None)

    @_compat.api_boundary
    def eval_shape(self, *args):
        return self._core.eval_shape(self._full(args), {})

    @_compat.api_boundary
    def specialize(self, *args) -> Specialization:
        return self._core.specialize(self._full(args), {})

    def report(self, *args):
        return self.specialize(*args).report

    def __repr__(self) -> str:
        return f"<{self._core!r} with constants at {list(self._const)}>"


def _plain(info, constants: dict) -> bool:
    """Whether the TFC form's call can be one ``jax.jit`` function (see
    :class:`BoundPejitted`) where the folded constants can be compiled in
    (``Specialization.compilable_in``): its options are a plain ``jax.jit``'s (no
    static, donated or placed arguments), and nobody can change its ``constants``."""
    plain = (info.fixed_nums == frozenset(constants) and not (info.fixed_names or info.donate_nums or info.donate_names)
             and not info.jit_kwargs and info.constant_shardings is None)
    return plain and all(map(unchangeable, constants.values()))


def core_call(bound: BoundPejitted, args: tuple, kwargs: dict | None = None) -> tuple[CallPath | JitPath, list]:
    """The call path behind the TFC form, and the full arguments of a call."""
    return bound._core, bound._full(args, kwargs)


def _as_called(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A staged object's call: the non-constant arguments, as the program takes them."""
    return args, kwargs


def _positional_only(fun: Callable, n: int) -> Callable:
    """``fun`` seen as taking exactly ``n`` positional arguments."""

    @functools.wraps(fun)
    def wrapper(*args):
        return fun(*args)

    del wrapper.__wrapped__  # its signature is positional, whatever fun's is
    if not hasattr(fun, "__name__"):  # named in messages as the function a partial holds, or an object's class
        name = _compat.fun_name(fun) if isinstance(fun, functools.partial) else type(fun).__name__
        wrapper.__name__ = wrapper.__qualname__ = name
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
