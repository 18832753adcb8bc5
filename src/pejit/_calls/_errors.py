"""Mistakes caught early, and pointed at the user's line.

Checks of a decoration (`pejit(...)`, `pe(...)`) that would otherwise fail
far from their cause, hints given once per function at its first
specialization, and the warnings pejit issues. A warning points at the
first frame outside pejit and JAX (the user's call), not at pejit's
internals or its generated dispatch code.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Var

from .. import _compat
from .._fold._primitives import CUSTOM_CALLS, all_eqns, subjaxprs


class PejitWarning(UserWarning):
    """Base class of the warnings pejit issues."""


class FoldingSkippedWarning(PejitWarning):
    """A constant argument was a tracer, so pejit could not fold it.

    This happens when an outer transformation (`jax.jit`, `grad`, `vmap`)
    is applied over a constant argument: the function then runs unfolded,
    with the right result. Close over the constant instead of passing it
    through the transformation, or apply pejit outside the transformation.

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


class NothingFoldedWarning(PejitWarning):
    """Constant arrays were given, but no equation depended on them alone.

    Usually the wrong argument is marked constant: the function then runs
    as under `jax.jit`, with nothing gained. Issued once per function.
    """


class RespecializingWarning(PejitWarning):
    """Most calls of a function fold again: its constants change from call to call.

    Each new constant value costs a fold (and the cache keeps the folded
    values of the latest ones), so an argument that is new on every call is
    better dynamic: under ``jax.jit`` it costs nothing to change. Issued once
    per function, after 16 folds that were three in four of its calls.
    """


class WritableConstantWarning(PejitWarning):
    """A large writable NumPy constant is read whole on every call.

    pejit must notice when a NumPy constant is mutated, so it compares the
    contents of a writable one on every call (with a copy it holds; above
    16 MiB, by their digest). A `jax.Array`
    (`jnp.asarray(arr)`) or a read-only array (`arr.setflags(write=False)`)
    is recognised by identity instead. Issued once per function.
    """


#: A writable NumPy constant at least this large gets a `WritableConstantWarning`.
HASH_WARNING_BYTES = 1 << 20

#: pejit's own keywords; every other keyword is one of `jax.jit`.
PEJIT_KEYWORDS = (
    "constant_argnums", "constant_argnames", "constant_arg_nums", "fold_options", "cache_size",
    "cache_bytes", "constant_shardings",
)

#: pejit's directory (this module is in its ``_calls`` subpackage).
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The file name of the code pejit generates (its dispatchers): inside the
#: package, so that traceback filtering and `warn` skip it.
GENERATED = os.path.join(_PACKAGE, "<generated>")
# pejit's frames are hidden from tracebacks as JAX hides its own (see
# _compat.api_boundary); JAX_TRACEBACK_FILTERING=off shows them.
_compat.register_exclusion(_PACKAGE)
_INTERNAL = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (sys.modules["jax"], sys.modules.get("jaxlib")) if m is not None and m.__file__
) + (_PACKAGE + os.sep,)


# -- decoration ---------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _jit_keywords() -> frozenset[str] | None:
    """The keywords `jax.jit` takes, or None if its signature does not say."""
    try:
        params = inspect.signature(jax.jit).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY)


def check_decoration(name: str, args: tuple, constant_arg_nums: Any, keywords: Iterable[str]) -> None:
    """Reject at decoration what would fail, or silently misbehave, at the call."""
    unknown = [k for k in keywords if k not in PEJIT_KEYWORDS]
    valid = _jit_keywords() if unknown else None  # (reading jax.jit's signature is a share of a first call)
    if valid is not None:
        for k in unknown:
            if k not in valid:
                close = difflib.get_close_matches(k, [*PEJIT_KEYWORDS, *sorted(valid)], n=1)
                hint = f"; did you mean {close[0]}?" if close else "."
                raise TypeError(
                    f"{name}: unknown keyword argument {k!r}{hint} {name} takes "
                    f"{', '.join(PEJIT_KEYWORDS)} and the keywords of jax.jit"
                )
    if constant_arg_nums is not None and len(args) == 1 and _is_function(args[0]):
        fname = getattr(args[0], "__name__", "f")
        raise TypeError(
            f"{name}({fname}, constant_arg_nums={constant_arg_nums!r}): constant_arg_nums belongs to the "
            f"TFC form, which takes example arguments first and the function after: "
            f"{name}(*example_args, constant_arg_nums=[...])({fname}). To pass the function first, as "
            f"with jax.jit, write constant_argnums: {name}({fname}, constant_argnums={constant_arg_nums!r})"
        )
    if constant_arg_nums is None and len(args) == 1 and not callable(args[0]):
        try:
            _compat.check_callable(args[0])  # jax.jit's TypeError, in this JAX's words
        except TypeError as e:
            e.add_note(
                f"{name}: the first argument must be the function to specialize, but {_short(args[0])} "
                f"is not callable. Write {name}(f, constant_argnums=...), or {name}(*example_args, "
                f"constant_arg_nums=[...])(f) for the TFC form, which takes example arguments"
            )
            raise


def _is_function(x: Any) -> bool:
    return callable(x) and not isinstance(x, (jax.Array, np.ndarray))


def _short(x: Any) -> str:
    if isinstance(x, (jax.Array, np.ndarray)):
        return f"an array of shape {tuple(x.shape)}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


# -- the TFC form's call --------------------------------------------------------
def reduced_signature(fun: Callable, n: int, constants: Iterable[int]) -> str:
    """`f(xi)`: the call of the TFC form, the constant positions removed."""
    constants = set(constants)
    try:
        params = [p.name for p in inspect.signature(fun).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [params[i] if i < len(params) else f"arg{i}" for i in range(n) if i not in constants]
    return f"{getattr(fun, '__name__', 'f')}({', '.join(names)})"


def tfc_keywords_error(fun: Callable, n: int, constants: dict, kwargs: dict) -> TypeError:
    """A call of the TFC form with keywords: it takes its arguments by position."""
    try:
        params = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        params = []
    bound = [k for k in kwargs if k in params and params.index(k) in constants]
    note = f" ({', '.join(map(repr, bound))} {'is' if len(bound) == 1 else 'are'} constant and already bound)" \
        if bound else ""
    return TypeError(
        f"{getattr(fun, '__name__', 'f')} (the TFC form of pejit) takes its non-constant arguments by "
        f"position: {reduced_signature(fun, n, constants)}; got keyword argument"
        f"{'s' if len(kwargs) != 1 else ''} {', '.join(map(repr, kwargs))}{note}"
    )


# -- names in JAX's messages ---------------------------------------------------
def name_after(flat_fun: Callable, fun: Callable, where: tuple, const_vals: tuple, in_tree: Any) -> None:
    """Make JAX's tracing errors about ``flat_fun`` name ``fun`` and its arguments.

    ``flat_fun`` takes the dynamic leaves of a call of ``fun`` whose constants
    (positions ``where[0]``, keywords ``where[1]``) are bound. JAX reads a
    function's debug info (source line, argument names) from
    ``__fun_debug_info__`` when it has one; without it, an error would say
    "while tracing the function flat_fun ... the argument leaves[0]".
    """
    try:
        placeholders = [0] * in_tree.num_leaves  # one per dynamic leaf
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(in_tree, placeholders)
        args = list(dyn_args)
        for i, v in zip(where[0], const_vals[0]):
            args.insert(i, v)
        kwargs = dict(zip(where[1], const_vals[1]), **dyn_kwargs)
        dbg = _compat.debug_info("pejit", fun, args, kwargs, static_argnums=where[0], static_argnames=where[1])
    except Exception:  # noqa: BLE001  (names are a nicety; never fail a call for them)
        return
    if dbg.arg_names is not None and len(dbg.arg_names) == in_tree.num_leaves:
        flat_fun.__fun_debug_info__ = dbg


# -- hints at the first specialization -------------------------------------------
def check_constants(name: str, leaves: list, warned: set) -> None:
    """Warn (once per function) about a large writable NumPy constant."""
    if "writable" in warned:
        return
    for leaf in leaves:
        if type(leaf) is np.ndarray and leaf.nbytes >= HASH_WARNING_BYTES and leaf.flags.writeable:
            warned.add("writable")
            warn(
                f"pejit({name}): a constant is a writable NumPy array of {leaf.nbytes:,} bytes, "
                f"so its contents are read on every call (to notice mutation). Pass "
                f"jnp.asarray(arr) instead, or make it read-only with arr.setflags(write=False): "
                f"both are recognised by identity",
                WritableConstantWarning,
            )
            return


def check_folded(name: str, spec: Any, const_leaves: list, warned: set) -> None:
    """Warn (once per function) when constant arrays were given and nothing folded.

    Nothing folded when the residual program takes the constant arrays
    themselves, unchanged, no loop body or branch in it closes over a
    constant (JAX folds some work there itself), and no work on the
    constants was folded, recomputed, kept for effects or resolved, and no
    custom derivative rule (which a derivative folds) reads it, even unseen in
    a thunk (jax.jit's program serving a per-value structure).
    """
    if "nothing" in warned:
        return
    arrays = {id(leaf) for leaf in const_leaves if isinstance(leaf, jax.Array)}
    if not arrays or not spec.consts or any(id(c) not in arrays for c in spec.consts):
        return
    program = spec.program
    stats = program.stats  # read before the report, which a first call need not build
    if stats.folded or stats.effects_kept or stats.eliminated_branches or stats.unfolded:
        return  # work on the constants, kept where folding it does not pay: the report says so
    if _holds_constants(program.jaxpr):  # folded into a loop body or branch
        return
    if program.rules_close_over_constants or _rules_read_constants(program.jaxpr, program.nconsts):
        return  # a derivative may fold their work
    if not program.jaxpr.eqns or spec.report.rematerialized:
        return
    warned.add("nothing")
    warn(
        f"pejit({name}): no equation depends on the constant arguments alone, so nothing was "
        f"folded and the function runs as under jax.jit. Mark the arguments that stay fixed "
        f"between calls (constant_argnums/constant_argnames), or use jax.jit",
        NothingFoldedWarning,
    )


def _rules_read_constants(jaxpr, nconsts: int) -> bool:
    """Whether a custom derivative rule of ``jaxpr`` (open, its first ``nconsts`` inputs the
    constants) reads a value computed from the constants."""
    reads = set(jaxpr.invars[:nconsts])
    for eqn in jaxpr.eqns:
        if any(isinstance(v, Var) and v in reads for v in eqn.invars):
            if eqn.primitive.name in CUSTOM_CALLS:
                return True
            reads.update(eqn.outvars)
    return False


def _holds_constants(jaxpr) -> bool:
    """Whether a sub-jaxpr of ``jaxpr`` (a loop body, a branch, a call) closes over constants."""
    return any(isinstance(sub, ClosedJaxpr) and sub.consts for eqn in all_eqns(jaxpr) for sub in subjaxprs(eqn.params))


def skipped_folding(name: str, what: str) -> None:
    warn(
        f"pejit({name}): {what} is a tracer of an outer transformation (jit/grad/vmap over a "
        f"constant argument), so it was treated as dynamic and nothing was folded. To fold it, "
        f"close over the constant instead of passing it through the transformation "
        f"(jax.jit(lambda x: f(A, x))), or apply pejit outside the transformation",
        FoldingSkippedWarning,
    )


def respecializing(name: str, folds: int, calls: int) -> None:
    warn(
        f"pejit({name}): {folds} of its {calls} calls folded new constant values; an argument marked "
        f"constant probably changes on every call. Make it dynamic (leave it out of "
        f"constant_argnums/constant_argnames), or use constant_argnums='auto', which folds only "
        f"the arguments that repeat",
        RespecializingWarning,
    )


# -- where a warning points -------------------------------------------------------
def warn(message: str, category: type[Warning]) -> None:
    """`warnings.warn` at the user's line: the innermost frame outside pejit and JAX.

    Through ``stacklevel``, so that Python attributes the warning as if the
    user's code had issued it, wherever that code runs: ``warn_explicit``
    with the frame's globals asks the module's loader for its source, which
    raises for ``__main__`` under ``python -c`` (a warning must never fail a call).
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
