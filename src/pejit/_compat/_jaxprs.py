"""Building jaxprs: variables, equations, literals, debug info, and folded constants.

pejit writes jaxprs itself (the residual program, folding programs, loop
bodies split in two), so it needs the constructors JAX's own passes use,
some of which ``jax.extend.core`` does not export in every supported
version (``new_jaxpr_eqn`` from 0.8 only), and JAX's jaxpr-to-jaxpr passes
that have no public form: ``partial_eval_jaxpr_nounits_fwd`` and
``move_binders_to_back`` split a loop body into the part that depends
only on known carries and inputs and the rest, as JAX's own scan
partial-evaluation rule does.

Folded constants are carried as an *open* jaxpr whose leading inputs are
the constants, with the list of their values beside it (:func:`close_jaxpr`
and :func:`open_jaxpr` convert). The closed form changed meaning: until
0.11.0 a ``ClosedJaxpr`` wraps a ``Jaxpr`` whose ``constvars`` pair with
``consts`` (built with ``pe.convert_invars_to_constvars``); 0.11.0 makes
``ClosedJaxpr`` an alias of ``Jaxpr``; from 0.11.1 ``constvars`` are just
the leading inputs that have values attached (``Jaxpr.with_consts``).
Never building ``Jaxpr(constvars, ...)`` without values keeps one code
path right in all.

Debug info (``api_util.debug_info``) names the user's function and
arguments in JAX's tracing errors, and ``DynamicJaxprTrace`` requires it.
JAX checks that its names match the jaxpr's arity, and JAX 0.7 wants every
result path resolved (later versions take None for unknown), hence the
helpers that rename.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._internals import api_util, core, pe, public_pe, xcore
from ._tracing import canonicalize_value

Literal = xcore.Literal
Var = xcore.Var
Jaxpr = xcore.Jaxpr
ClosedJaxpr = xcore.ClosedJaxpr
ShapedArray = core.ShapedArray
Token = core.Token  # the value of an effect token (jax.lax.create_token)
eval_jaxpr = core.eval_jaxpr
# public as jax.extend.core.new_jaxpr_eqn from JAX 0.8 only
new_jaxpr_eqn = core.new_jaxpr_eqn
new_var = core.Var  # Var(aval) and DropVar(aval) on every version we support
drop_var = core.DropVar  # an output binder nobody reads (``_`` in printed jaxprs)
no_effects = core.no_effects
dce_jaxpr = public_pe.dce_jaxpr
trace_to_jaxpr_dynamic = public_pe.trace_to_jaxpr_dynamic
partial_eval_jaxpr_nounits_fwd = pe.partial_eval_jaxpr_nounits_fwd
move_binders_to_back = pe.move_binders_to_back
convert_constvars_jaxpr = pe.convert_constvars_jaxpr


def stages_whole(prim) -> bool:
    """Whether JAX's partial evaluation stages an equation of ``prim`` whole once one of
    its inputs is unknown: no rule of its own splits it (as ``jit``'s and the loops' do)."""
    return prim not in pe.custom_partial_eval_rules


def literal(value: Any, aval: Any) -> Literal:
    """A literal of ``aval`` holding the scalar ``value``, as JAX's staging makes one.

    Weak-typed literals keep their weak type when the jaxpr is evaluated
    again (``jaxpr_as_fun``): a Python scalar, canonicalized as ``bind``
    does, where a NumPy scalar would bind as a strongly typed value.
    """
    if getattr(aval, "weak_type", False):
        value = canonicalize_value(np.asarray(value).item())
    return Literal(value, aval)


# -- jaxprs with folded constants ---------------------------------------------
# JAX < 0.11.1 pairs constvars with consts explicitly; later, attached values
# make leading inputs constants (``Jaxpr.with_consts``).
_convert_invars_to_constvars = getattr(pe, "convert_invars_to_constvars", None)


def open_jaxpr(closed: ClosedJaxpr) -> tuple[Jaxpr, list[Any]]:
    """``(open jaxpr, consts)``: the constants become its leading inputs."""
    return pe.convert_constvars_jaxpr(closed.jaxpr), list(closed.consts)


def close_jaxpr(jaxpr: Jaxpr, consts: Sequence[Any]) -> ClosedJaxpr:
    """The closed jaxpr whose leading ``len(consts)`` inputs are bound to ``consts``."""
    consts = list(consts)
    if _convert_invars_to_constvars is not None:  # JAX <= 0.11.0
        return ClosedJaxpr(_convert_invars_to_constvars(jaxpr, len(consts)), consts)
    return jaxpr.with_consts(consts)


def with_invars(jaxpr: Jaxpr, invars: Sequence[Any]) -> Jaxpr:
    """``jaxpr`` with new input binders, unnamed (JAX 0.7 needs a tuple of names)."""
    return jaxpr.replace(invars=list(invars), debug_info=_unnamed(jaxpr.debug_info, arg_names=len(invars)))


def with_outvars(jaxpr: Jaxpr, outvars: Sequence[Any]) -> Jaxpr:
    """``jaxpr`` with new outputs, unnamed (JAX 0.7 needs a tuple of result paths)."""
    return jaxpr.replace(outvars=list(outvars), debug_info=_unnamed(jaxpr.debug_info, result_paths=len(outvars)))


# -- debug info ----------------------------------------------------------------
def debug_info(traced_for: str, fun: Callable, args: Sequence[Any], kwargs: dict, *,
               static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = ()):
    """JAX's debug info of a call (source line, argument names), as ``jax.jit`` builds it."""
    return api_util.debug_info(traced_for, fun, tuple(args), kwargs, static_argnums=tuple(static_argnums),
                               static_argnames=tuple(static_argnames))


def unnamed_debug_info(traced_for: str, n_in: int, n_out: int):
    """Debug info with unnamed arguments and results, for a jaxpr pejit builds itself
    (JAX 0.7 wants every result path; later versions take None for unknown)."""
    return _unnamed(debug_info(traced_for, unnamed_debug_info, (), {}), arg_names=n_in, result_paths=n_out)


def with_result_paths(dbg: Any, paths: tuple[str, ...]) -> Any:
    """Debug info ``dbg`` with its result paths resolved (JAX 0.7 requires them in ``to_jaxpr``)."""
    return dbg._replace(result_paths=paths)


def with_arity(dbg: Any, n_in: int, n_out: int | None = None) -> Any:
    """Debug info ``dbg`` for a function of ``n_in`` arguments (names kept where they
    fit: JAX checks their count) and, given ``n_out``, as many unnamed results."""
    if dbg.arg_names is None or len(dbg.arg_names) != n_in:
        dbg = _unnamed(dbg, arg_names=n_in)
    return dbg if n_out is None else _unnamed(dbg, result_paths=n_out)


def _unnamed(dbg: Any, **counts: int) -> Any:
    return None if dbg is None else dbg._replace(**{k: ("",) * n for k, n in counts.items()})
