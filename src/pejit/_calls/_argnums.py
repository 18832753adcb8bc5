"""Validation and normalization of argument numbers and names.

Argument numbers in every keyword (``constant_argnums``, ``static_argnums``,
``donate_argnums``, ...) refer to the signature the user calls; this module
checks them and resolves numbers to names and back, as ``jax.jit`` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np


def signature(fun: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def positional_count(sig: inspect.Signature | None) -> int | None:
    """How many positional arguments ``sig`` takes, or None if unbounded."""
    if sig is None:
        return None
    kinds = [p.kind for p in sig.parameters.values()]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(k in positional for k in kinds)


def check_argnums(what: str, nums: Any, n: int | None = None) -> tuple[int, ...]:
    """Validate ``nums`` (an int or ints) for ``n`` positional arguments.

    Negative entries are normalized when ``n`` is known. Raises TypeError for
    non-integers and ValueError for out-of-range entries and duplicates; the
    message names the offending entry.
    """
    if nums is None:
        return ()
    if _is_int(nums):
        nums = (nums,)
    elif isinstance(nums, (str, bytes)) or not isinstance(nums, Iterable):
        raise TypeError(f"{what} must be an int or a sequence of ints, got {type(nums).__name__} {nums!r}")
    out: list[int] = []
    seen: dict[int, int] = {}
    for entry in nums:
        if not _is_int(entry):
            raise TypeError(f"{what}: entry {entry!r} of type {type(entry).__name__} is not an integer")
        entry = int(entry)
        norm = entry
        if n is not None:
            if not -n <= entry < n:
                raise ValueError(
                    f"{what}: entry {entry} is out of range for {n} positional "
                    f"argument{'s' if n != 1 else ''} (valid: {-n} to {n - 1})"
                )
            norm = entry % n
        if norm in seen:
            raise ValueError(
                f"{what}: entry {entry} names argument {norm}, which entry "
                f"{seen[norm]} already names"
            )
        seen[norm] = entry
        out.append(norm)
    return tuple(out)


def check_argnames(what: str, names: Any) -> tuple[str, ...]:
    if names is None:
        return ()
    if isinstance(names, str):
        names = (names,)
    elif not isinstance(names, Iterable):
        raise TypeError(f"{what} must be a str or a sequence of str, got {type(names).__name__} {names!r}")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{what}: entry {name!r} of type {type(name).__name__} is not a str")
        if name in out:
            raise ValueError(f"{what}: entry {name!r} is given twice")
        out.append(name)
    return tuple(out)


def resolve(
    what: str, sig: inspect.Signature | None, nums: tuple[int, ...], names: tuple[str, ...]
) -> tuple[frozenset[int], frozenset[str]]:
    """Complete ``nums`` with ``names`` and back, through the signature.

    A parameter given by number may be passed by keyword and vice versa.
    Unknown names raise ValueError unless the function takes ``**kwargs``.
    """
    nums_out, names_out = set(nums), set(names)
    if sig is None:
        return frozenset(nums_out), frozenset(names_out)
    params = list(sig.parameters.values())
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    by_name = {p.name: p for p in params}
    positional = [
        p for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    for i in nums:
        if 0 <= i < len(positional) and positional[i].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            names_out.add(positional[i].name)
    for name in names:
        p = by_name.get(name)
        if p is None or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            if takes_kwargs and p is None:
                continue
            raise ValueError(f"{what}: {name!r} is not a parameter of {_describe(sig)}")
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(f"{what}: {name!r} is a positional-only parameter; give its number instead")
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            nums_out.add(positional.index(p))
    return frozenset(nums_out), frozenset(names_out)


def jit_argnums(
    sig: inspect.Signature | None, nargs: int | None, nums: Any, names: Any
) -> tuple[frozenset[int], frozenset[str]]:
    """``static_argnums``/``static_argnames`` (or the ``donate_`` pair) as ``jax.jit`` reads them.

    ``jax.jit`` has validated them already (pejit builds it first, so that its
    errors are jax.jit's own). As there, the names are inferred from the numbers,
    or the numbers from the names, only when one of the two is missing: given
    both, they may disagree, and each is kept as given. Entries may repeat.
    Negative numbers are normalized when ``nargs`` (the positional arguments
    ``fun`` takes) is known.
    """
    nums_in = () if nums is None else (nums,) if _is_int(nums) else tuple(nums)
    names_in = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    if sig is not None and (nums is None) != (names is None):
        by_position = [
            (i, k) for i, (k, p) in enumerate(sig.parameters.items())
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        if nums is None:
            nums_in = tuple(i for i, k in by_position if k in names_in)
        else:
            names_in = tuple(k for i, k in by_position if i in nums_in)
    out = frozenset(int(i) % nargs if nargs else int(i) for i in nums_in)
    return out, frozenset(names_in)


def positional_names(sig: inspect.Signature | None, n: int) -> frozenset[str]:
    """The names of the first ``n`` positional parameters of ``sig``."""
    if sig is None:
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset([p.name for p in sig.parameters.values() if p.kind in kinds][:n])


def runner_signature(
    sig: inspect.Signature | None, nconsts: int, n: int, dyn: Sequence[int], fixed_names: frozenset[str]
) -> inspect.Signature | None:
    """The signature of a residual program's runner, ``run(*folded, *dyn_args, **dyn_kwargs)``.

    The folded constants first, then the function's own parameters at the
    dynamic positions ``dyn`` of a call with ``n`` positional arguments, and
    its keyword parameters that are not fixed:
    ``jax.jit`` names the runner's arguments from it, so that its messages
    about a dynamic argument (a compiled program called with other types)
    name the parameter, as for the function itself. ``None`` if the function
    has no signature (then ``jax.jit`` numbers them).
    """
    if sig is None:
        return None
    P = inspect.Parameter
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    var_positional = [p for p in params if p.kind is P.VAR_POSITIONAL]
    out = [P(f"_folded_constant_{i}", P.POSITIONAL_ONLY) for i in range(nconsts)]
    out += [positional[i].replace(kind=P.POSITIONAL_ONLY, default=P.empty) for i in dyn if i < len(positional)]
    if any(i >= len(positional) for i in dyn):
        out += var_positional
    out += [
        p.replace(kind=P.KEYWORD_ONLY) for p in params
        if p.name not in fixed_names and (
            p.kind is P.KEYWORD_ONLY or (p.kind is P.POSITIONAL_OR_KEYWORD and positional.index(p) >= n)
        )
    ]
    out += [p for p in params if p.kind is P.VAR_KEYWORD]
    try:
        return inspect.Signature(out)
    except ValueError:  # names are a nicety: jax.jit numbers the arguments then
        return None


def check_disjoint(what_a: str, a: tuple[frozenset, frozenset], what_b: str, b: tuple[frozenset, frozenset]) -> None:
    """Raise ValueError if an argument is in both ``a`` and ``b``."""
    for i in sorted(a[0] & b[0]):
        raise ValueError(f"argument {i} is both in {what_a} and in {what_b}; an argument can be only one of them")
    for name in sorted(a[1] & b[1]):
        raise ValueError(f"argument {name!r} is both in {what_a} and in {what_b}; an argument can be only one of them")


def interleave(const_pos: tuple, dyn_args: Sequence) -> list:
    """The full positional arguments: ``(position, value)`` constants put
    back among the other arguments."""
    out = list(dyn_args)
    for i, v in const_pos:
        out.insert(i, v)
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _describe(sig: inspect.Signature) -> str:
    return f"the function, whose signature is {sig}"
