"""The entry points, ``pejit`` and ``pe``: each form of call routed to its wrapper.

The jax.jit form builds a :class:`~pejit._jit.Pejitted`, the TFC form a
:class:`~pejit._tfc.BoundPejitted`, ``constant_argnums="auto"`` an
:class:`~pejit._auto.AutoPejitted`. This module sits above all three, so that
none of them imports another's entry point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from . import _compat
from ._calls import _errors
from ._auto import AutoPejitted
from ._auto import options as auto_options
from ._calls._cache import DEFAULT_CACHE_BYTES, DEFAULT_CACHE_SIZE
from ._fold._options import FoldOptions
from ._jit import Pejitted
from ._tfc import BoundPejitted


def pejit(
    *args: Any,
    constant_arg_nums: Sequence[int] | None = None,
    constant_argnums: int | Sequence[int] | str | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
    cache_size: int | None = DEFAULT_CACHE_SIZE,
    cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    constant_shardings: Any = None,
    auto_after: int | None = None,
    auto_demote_after: int | None = None,
    auto_min_flops: float | None = None,
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
    (an LRU; ``None``: unbounded), ``cache_bytes`` the bytes of their folded
    constants ([`DEFAULT_CACHE_BYTES`][pejit.DEFAULT_CACHE_BYTES], 2 GiB, by default; ``None``: unbounded); ``constant_shardings`` places the folded
    constants: a ``jax.sharding.Sharding`` for all of them, or a callable
    from a folded constant's ``jax.ShapeDtypeStruct`` to a sharding (``None``
    keeps the placement folding gave it). See
    [Caching and specializations](caching.md).

    ``constant_argnums="auto"`` folds the array arguments that repeat (the
    same object on ``auto_after`` calls) when that removes at least
    ``auto_min_flops`` per call, and otherwise runs ``jax.jit(f)``; see
    [`AutoPejitted`][pejit.AutoPejitted] and [Automatic constants](auto.md).

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
    jit_kwargs = dict(jit_kwargs, cache_size=cache_size, cache_bytes=cache_bytes, constant_shardings=constant_shardings)
    auto = _auto_options(constant_argnums, auto_after, auto_demote_after, auto_min_flops)
    return _front(
        "pejit", True, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, jit_kwargs, auto
    )


def pe(
    *args: Any,
    constant_arg_nums: Sequence[int] | None = None,
    constant_argnums: int | Sequence[int] | str | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    fold_options: FoldOptions | None = None,
    cache_size: int | None = DEFAULT_CACHE_SIZE,
    cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    auto_after: int | None = None,
    auto_demote_after: int | None = None,
    auto_min_flops: float | None = None,
    **kwargs: Any,
):
    """Partially evaluate a function with constant arguments, without jitting.

    The same forms as [`pejit`][pejit.pejit]; the result runs the residual program
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
        {"cache_size": cache_size, "cache_bytes": cache_bytes, **kwargs}, _auto_options(constant_argnums, auto_after, auto_demote_after, auto_min_flops),
    )


def _auto_options(constant_argnums, auto_after, auto_demote_after, auto_min_flops) -> dict | None:
    return auto_options(constant_argnums, auto_after=auto_after, auto_demote_after=auto_demote_after,
                   auto_min_flops=auto_min_flops)


def _front(name, jit, args, constant_arg_nums, constant_argnums, constant_argnames, fold_options, jit_kwargs,
           auto=None):
    _errors.check_decoration(name, args, constant_arg_nums, jit_kwargs)
    if auto is not None:
        if constant_arg_nums is not None or constant_argnames is not None:
            raise TypeError(
                f"{name}: constant_argnums='auto' watches every array argument; it takes no "
                "constant_arg_nums or constant_argnames"
            )
        make = functools.partial(AutoPejitted, jit=jit, fold_options=fold_options, **auto, **jit_kwargs)
        return _apply(name, make, args)
    if constant_arg_nums is not None:
        if constant_argnums is not None or constant_argnames is not None:
            raise TypeError(
                f"{name}: give either constant_arg_nums with example arguments (TFC form) "
                "or constant_argnums/constant_argnames (jax.jit form), not both"
            )

        @_compat.api_boundary
        def bind(fun):
            return BoundPejitted(
                fun, args, constant_arg_nums, jit=jit, fold_options=fold_options, jit_kwargs=jit_kwargs
            )

        return bind
    make = functools.partial(
        Pejitted, constant_argnums=constant_argnums, constant_argnames=constant_argnames,
        jit=jit, fold_options=fold_options, **jit_kwargs,
    )
    return _apply(name, make, args)


def _apply(name: str, make: Callable, args: tuple):
    if not args:
        return make
    if len(args) == 1 and callable(args[0]):
        return make(args[0])
    raise TypeError(
        f"{name}: got {len(args)} positional argument(s) but no constant_arg_nums. Use "
        f"{name}(f, constant_argnums=...) or {name}(*example_args, constant_arg_nums=[...])(f)"
    )
