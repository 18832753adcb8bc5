"""Traces, tracers and evaluation: what pejit's staging trace is built on.

pejit traces the user's function with its own subclass of JAX's
``DynamicJaxprTrace`` (:mod:`pejit._fold._staging`), so that it can decide,
equation by equation, whether to evaluate (fold) or to stage, and builds
the residual jaxpr as ``jax.make_jaxpr`` does. No public API does that: the
public ``jax.ensure_compile_time_eval`` folds *everything* whose inputs are
concrete, including ``jax.debug.print`` and ``io_callback``, which must stay
in the residual program. So this module exports the trace and tracer
classes, the trace contexts (``trace_ctx``, ``set_current_trace``,
``eval_trace``, ``ensure_no_leaks``), and binding on a trace.

``config.eager_constant_folding`` is the context-local switch behind
``jax.ensure_compile_time_eval``: scoped, never set globally. It is *off*
while pejit traces: otherwise the ``DynamicJaxprTrace`` that JAX opens for
a loop body or branch would evaluate every operation on closed-over
constants itself, effects included, behind the policy's back.

Where versions differ: ``Primitive.bind_with_trace`` takes the input avals
from 0.10 (:func:`bind_outside`); ``DynamicJaxprTrace.new_const`` converts
non-canonical constants before 0.10 and asserts on them from 0.10
(``dtypes.canonicalize_value``, 0.10 on, makes them canonical); avals
carry a "QDD" (``has_qdd``, ``AvalQDD``) until 0.11.0, which
``var_to_tracer`` must keep (:func:`var_aval`); JAX 0.7 keeps the current
trace on ``trace_ctx`` only (:data:`TRACE`); and from 0.11.1 a frame's
``to_jaxpr`` returns its constants as plain leading inputs
(:func:`staged_jaxpr` gives one form in all).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any

from ._internals import config, convert_element_type, core, dtypes, lu, pe, source_info_util

Tracer = core.Tracer
set_current_trace = core.set_current_trace
eval_trace = core.eval_trace
typeof = core.typeof
#: The trace and tracer classes :class:`~pejit._fold._staging.StagingTrace` and
#: :class:`~pejit._fold._staging.KnowableTracer` extend (``_internals._METHODS``
#: lists the methods overridden or called, checked at import).
DynamicJaxprTrace = pe.DynamicJaxprTrace
DynamicJaxprTracer = pe.DynamicJaxprTracer
JaxprTrace = pe.JaxprTrace  # partial evaluation's (jax.linearize runs JVP rules under it)
#: ``eager_constant_folding(on)``: context scoping JAX's own folding of
#: operations on concrete values (never set globally).
eager_constant_folding = config.eager_constant_folding
wrap_init = lu.wrap_init
ensure_no_leaks = core.ensure_no_leaks
current_source_info = source_info_util.current
reset_name_stack = source_info_util.reset_name_stack

#: The current trace: ``TRACE.value is eval_trace`` outside every transformation
#: (a context-local state, cheap to read on the hot path; JAX 0.7 keeps it on ``trace_ctx``).
TRACE = getattr(core, "trace_state_strong_ref", None) or type(
    "Trace", (), {"value": property(lambda self: core.trace_ctx.trace)})()

# JAX >= 0.10 stages only canonical constants (jax.Arrays, not Python or NumPy
# scalars and arrays); before, DynamicJaxprTrace.new_const converted them.
canonicalize_value = getattr(dtypes, "canonicalize_value", lambda x: x)

#: The frames of JAX's ``is_concrete``, and of ``_convert_element_type``: the
#: staging tracer does not evaluate a value the conversion only asks about
#: (see ``_staging.KnowableTracer``).
IS_CONCRETE_CODE = (core.is_concrete.__code__, core.to_concrete_value.__code__)
CONVERT_CODE = getattr(convert_element_type, "__code__", None)


def trace_of(x: Any):
    """The trace a tracer belongs to (``None`` for a concrete value)."""
    return x._trace if isinstance(x, core.Tracer) else None


def const_of(trace, x: Any) -> Any:
    """The constant a tracer of ``trace`` merely holds, else ``None``."""
    if isinstance(x, core.Tracer) and x._trace is trace:
        return trace.get_const(x)
    return None


def core_trace():
    """The trace currently in effect."""
    return core.trace_ctx.trace


def var_aval(var: Any) -> Any:
    """The aval a tracer of ``var`` carries: with its QDD on JAX <= 0.11.0 (mutable arrays)."""
    aval = var.aval
    if getattr(aval, "has_qdd", False):
        aval = core.AvalQDD(aval, var.initial_qdd)
    return aval


def staged_jaxpr(trace, out_tracers: Sequence[Any], debug_info: Any, source_info: Any) -> tuple[Any, list[Any]]:
    """``(open jaxpr, consts)`` of what ``trace`` (a ``DynamicJaxprTrace``) staged, as
    ``trace_to_jaxpr_dynamic`` ends: the constants are the jaxpr's leading inputs.

    Until JAX 0.11.1 the frame pairs constvars with its constants; from
    0.11.1 it returns them as plain leading inputs already.
    """
    jaxpr, consts = trace.frame.to_jaxpr(trace, list(out_tracers), debug_info, source_info)
    return pe.convert_constvars_jaxpr(jaxpr), list(consts)


# -- binding and evaluating ---------------------------------------------------
def abstract_eval(prim, avals: Sequence[Any], params: dict) -> tuple[Any, Any]:
    """``prim.abstract_eval(*avals, **params)`` from the cache JAX's staging keeps.

    The fold asks before it stages: uncached, asking costs as much again as staging.
    """
    if getattr(prim, "ref_allocating", False) or prim.name in _UNCACHED_ABSTRACT_EVAL:
        return prim.abstract_eval(*avals, **params)
    try:
        return pe._cached_abstract_eval(prim, *avals, **params)
    except TypeError:  # unhashable parameters; a real error raises again
        return prim.abstract_eval(*avals, **params)


#: Primitives whose abstract evaluation has effects JAX's staging does not cache.
_UNCACHED_ABSTRACT_EVAL = frozenset(["custom_lin", "call_hi_primitive_linearized", "call_hi_primitive"])


def primitive_effects(prim, avals: Sequence[Any], params: dict):
    """The effects ``prim`` would carry on inputs of these avals."""
    _, effects = abstract_eval(prim, avals, params)
    return effects


if "avals" in inspect.signature(core.Primitive.bind_with_trace).parameters:  # JAX >= 0.10

    def _bind(prim, trace, args, params):
        return prim.bind_with_trace(trace, args, tuple(core.typeof(x) for x in args), params)

else:

    def _bind(prim, trace, args, params):
        return prim.bind_with_trace(trace, args, params)


def bind_outside(prim, args: Sequence[Any], params: dict, trace=None) -> Any:
    """Bind ``prim`` on known ``args`` outside the folding trace: at top level
    (evaluated now), or on ``trace``.

    ``trace`` is the outer trace of abstract constants (see
    :mod:`pejit._fold._abstract`), which then stages ``prim`` into its program.

    Our trace may turn on ``eager_constant_folding``; it must not leak into
    the compilation of ``prim`` (lowering a ``scan`` binds ``empty``, which
    has no eager rule in JAX 0.7).
    """
    with config.eager_constant_folding(False):
        return _bind(prim, core.eval_trace if trace is None else trace, tuple(args), params)


def at_top_level():
    """Context manager: no transformation is active (for folding, compiling)."""
    return core.set_current_trace(core.eval_trace)


def evaluating():
    """Context in which binds evaluate (or ``jax.jit`` compiles) for real.

    Known work is materialized from inside the folding trace; this steps out
    of it, and out of eager constant folding, which would otherwise turn the
    tracing done by ``jax.jit`` into evaluation.
    """
    stack = contextlib.ExitStack()
    stack.enter_context(core.set_current_trace(core.eval_trace))
    stack.enter_context(config.eager_constant_folding(False))
    return stack


def weakly_typed(x: Any) -> Any:
    """``x`` (a ``jax.Array``) weakly typed, as a Python scalar's value is:
    what a weak value stored as NumPy (which has no weak types) was."""
    if convert_element_type is None:  # pragma: no cover
        return x
    with at_top_level():
        return convert_element_type(x, weak_type=True)
