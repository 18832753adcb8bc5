"""The options of a pejit function, parsed once into an immutable :class:`PejitInfo`.

As ``jax._src.pjit`` parses ``jax.jit``'s arguments once (``_parse_jit_arguments``
-> ``PjitInfo``) and keeps ``make_jit`` thin: every check of the decoration
happens in :func:`parse_pejit_arguments`, and the specializer
(:mod:`pejit._calls._specializer`) reads the options from the info it is given.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from .. import _compat
from .._fold._options import FoldOptions
from . import _argnums
from ._cache import DEFAULT_CACHE_BYTES, DEFAULT_CACHE_SIZE
from ._errors import PEJIT_KEYWORDS

#: Options of a pejit function that are pejit's (its public keywords, and two
#: the API sets: ``jit``, false for ``pe``, and ``one_value``, for the TFC
#: form); the others are ``jax.jit``'s.
PEJIT_OPTIONS = frozenset(PEJIT_KEYWORDS) | {"jit", "one_value"}


@dataclasses.dataclass(frozen=True)
class PejitInfo:
    """The parsed options of one pejit (or pe) function.

    ``fixed_nums``/``fixed_names``: the constant and static arguments, which
    are concrete while tracing and keyed by value (they only differ in name).
    ``constants``: some argument is constant; without one, a pejit function
    is ``jax.jit`` itself (see :func:`~pejit._calls._path.make_path`).
    ``jit_kwargs``: the remaining ``jax.jit`` keywords, for the runner;
    ``jit_options``: ``jax.jit``'s keywords as given, for a ``jax.jit`` of a
    function of the same signature (the trace of a residual).
    ``one_value``: the constants never change (the TFC form binds them), so
    each specialization folds concretely, with no folding program: ``jax.jit``'s
    trace replayed on the values, where it has one (see
    :func:`~pejit._calls._specializer.replayed_per_value`), unless its look finds
    nothing that pays or that XLA would fold anyway.
    """

    fun: Callable
    name: str
    jit: bool
    fold_options: FoldOptions
    cache_size: int | None
    cache_bytes: int | None
    constant_shardings: Any
    nargs: int | None  # positional arguments ``fun`` takes; None: any number
    signature: inspect.Signature | None  # ``fun``'s, None if it has none
    fixed_nums: frozenset[int]
    fixed_names: frozenset[str]
    donate_nums: frozenset[int]
    donate_names: frozenset[str]
    jit_kwargs: Mapping[str, Any]
    jit_options: Mapping[str, Any]
    constants: bool = True
    one_value: bool = False


def parse_pejit_arguments(
    fun: Callable,
    *,
    constant_argnums: int | Sequence[int] | None = None,
    constant_argnames: str | Sequence[str] | None = None,
    jit: bool = True,
    fold_options: FoldOptions | None = None,
    cache_size: int | None = DEFAULT_CACHE_SIZE,
    cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    constant_shardings: Any = None,
    one_value: bool = False,
    **jit_kwargs: Any,
) -> PejitInfo:
    """Check the options of ``pejit(fun, ...)`` and resolve argument numbers and names.

    ``jax.jit``'s own options (static and donated arguments among them) are
    checked by ``jax.jit`` first, for ``pejit``; here they are only read.
    """
    _compat.check_callable(fun)  # jax.jit's errors: not callable, staticmethod, generator
    options = fold_options or FoldOptions()
    if not isinstance(options, FoldOptions):
        raise TypeError(f"fold_options must be a pejit.FoldOptions, got {type(options).__name__}")
    if constant_shardings is not None and not (
        isinstance(constant_shardings, jax.sharding.Sharding) or callable(constant_shardings)
    ):
        raise TypeError(
            "constant_shardings must be a jax.sharding.Sharding or a callable "
            f"from a folded constant's jax.ShapeDtypeStruct to a Sharding (or None), "
            f"got {type(constant_shardings).__name__}"
        )
    sig = _argnums.signature(fun)
    nargs = _argnums.positional_count(sig)

    def resolve(what_nums, nums, what_names, names):
        nums = _argnums.check_argnums(what_nums, nums, nargs)
        names = _argnums.check_argnames(what_names, names)
        return _argnums.resolve(f"{what_nums}/{what_names}", sig, nums, names)

    const = resolve("constant_argnums", constant_argnums, "constant_argnames", constant_argnames)
    if not jit and jit_kwargs:
        raise TypeError(f"pe does not compile, so it takes no jax.jit keywords; got {sorted(jit_kwargs)}")
    given = types.MappingProxyType(dict(jit_kwargs))
    static = _argnums.jit_argnums(
        sig, nargs, jit_kwargs.pop("static_argnums", None), jit_kwargs.pop("static_argnames", None)
    )
    donate = _argnums.jit_argnums(
        sig, nargs, jit_kwargs.pop("donate_argnums", None), jit_kwargs.pop("donate_argnames", None)
    )
    constants = bool(const[0] or const[1])
    _argnums.check_disjoint("constant_argnums/constant_argnames", const, "static_argnums/static_argnames", static)
    _argnums.check_disjoint("constant_argnums/constant_argnames", const, "donate_argnums/donate_argnames", donate)
    if constants:  # without constants, jax.jit itself runs the call, and raises for this at the call
        _argnums.check_disjoint("static_argnums/static_argnames", static, "donate_argnums/donate_argnames", donate)
    return PejitInfo(
        fun=fun,
        name=_compat.fun_name(fun),
        jit=jit,
        fold_options=options,
        cache_size=cache_size,
        cache_bytes=cache_bytes,
        constant_shardings=constant_shardings,
        nargs=nargs,
        signature=sig,
        fixed_nums=const[0] | static[0],
        fixed_names=const[1] | static[1],
        donate_nums=donate[0],
        donate_names=donate[1],
        jit_kwargs=types.MappingProxyType(jit_kwargs),
        jit_options=given,
        constants=constants,
        one_value=one_value,
    )


def jit_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``jax.jit`` options among a pejit function's ``options``."""
    return {k: v for k, v in options.items() if k not in PEJIT_OPTIONS}


def fixed_positions(info: PejitInfo, n: int) -> frozenset[int]:
    """The constant and static positions of a call with ``n`` positional arguments."""
    if info.nargs is None and any(i < 0 for i in info.fixed_nums):
        return frozenset(i % n for i in info.fixed_nums if -n <= i < n)
    return info.fixed_nums


def positions(info: PejitInfo, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The constant (and static) positions of a call with ``n`` positional
    arguments, and the dynamic ones, in order."""
    fixed = fixed_positions(info, n)
    return tuple(i for i in range(n) if i in fixed), tuple(i for i in range(n) if i not in fixed)


def split_call(info: PejitInfo, args: tuple, kwargs: dict, layout=None):
    """``(const_pos, const_kw, dyn_args, dyn_kwargs)`` of a call.

    ``const_pos`` pairs positions with constant values, ``const_kw`` names
    with constant keyword values (sorted). ``layout`` (with ``const`` and
    ``dyn`` positions) saves recomputing the positions.
    """
    const, dyn = positions(info, len(args)) if layout is None else (layout.const, layout.dyn)
    names = info.fixed_names
    const_pos = tuple((i, args[i]) for i in const)
    const_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in names))
    dyn_args = tuple(args[i] for i in dyn)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
    return const_pos, const_kw, dyn_args, dyn_kwargs
