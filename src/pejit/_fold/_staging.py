"""The staging trace: JAX's tracing to a jaxpr, with a policy asked before each equation.

:func:`trace_staging` traces a function as ``jax.make_jaxpr`` does, under a
:class:`StagingTrace` (a subclass of JAX's ``DynamicJaxprTrace``) that hands
every primitive application to a :class:`~pejit._fold._policy.FoldPolicy`: the
policy evaluates it (folds) or returns ``NotImplemented`` to stage it.
Staged values are tracers (:class:`KnowableTracer`) whose concrete value Python
(``bool``, ``int``, ``float``) and NumPy may still ask the policy for.

:func:`specializing` fences a specialization being built: a tracer of a
trace it did not open (an outer transformation the function closes over)
raises :class:`ClosedOverTracer` instead of being captured.

The JAX internals all this stands on come from :mod:`pejit._compat`, which
checks at import that the ``DynamicJaxprTrace`` methods overridden here
still take the parameters they take here.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.errors import UnexpectedTracerError

from .. import _compat
from .._compat import Tracer, canonicalize_value, eager_constant_folding, trace_of
from ._policy import FoldPolicy


def policy_of(x: Any):
    """The folding policy of the :class:`StagingTrace` that made ``x``, else None."""
    return getattr(trace_of(x), "policy", None)


def known_value(trace, x: Any) -> Any:
    """``x``, or the constant it holds where it is a tracer of ``trace`` that merely holds one."""
    const = _compat.const_of(trace, x)
    return x if const is None else const


class ClosedOverTracer(Exception):
    """A function being specialized reached a tracer of a trace its specialization did not open.

    Such a tracer belongs to an outer transformation the function closes over
    (``jax.grad(lambda y: pejit(lambda x: x * y)(2.0))``), or leaked from an
    earlier trace. A specialization built at top level, and cached, must not
    capture it: the caller runs the function without one.
    """


#: The traces a specialization being built may meet, or None outside of
#: :func:`specializing` (nothing is checked).
_admitted: contextvars.ContextVar[weakref.WeakSet | None] = contextvars.ContextVar("pejit_admitted", default=None)


@contextlib.contextmanager
def specializing():
    """Context for building a specialization: at top level, meeting only its own traces.

    A folding trace opened inside admits itself and its parent (the trace of
    a folding program's abstract constants); a tracer of any other trace
    that reaches one raises :class:`ClosedOverTracer`.
    """
    token = _admitted.set(weakref.WeakSet())
    try:
        with _compat.at_top_level():
            yield
    finally:
        _admitted.reset(token)


def _asked_only_to_skip_a_conversion() -> bool:
    """Whether ``to_concrete_value``'s caller is ``lax._convert_element_type``
    asking ``core.is_concrete``.

    It asks only to choose between returning a value whose type already
    matches and binding a no-op conversion, which give the same value.
    ``jax.jacfwd`` converts its whole Jacobian so; answering by evaluating
    it materialized the fold mid-trace (a PDE's whole Jacobian evaluated and
    held, then its equations computed again for the residual).
    """
    frame, asked = sys._getframe(2), None
    while frame is not None and frame.f_code in _compat.IS_CONCRETE_CODE:
        frame, asked = frame.f_back, frame.f_code
    return asked is _compat.IS_CONCRETE_CODE[0] and frame is not None and frame.f_code is _compat.CONVERT_CODE


class KnowableTracer(_compat.DynamicJaxprTracer):
    """A staged value whose concrete value the policy may still know.

    Python conversions (``bool``, ``int``, ``float``) ask ``to_concrete_value``,
    NumPy conversion ``policy.numpy_value``; lazy known values answer by materializing.
    """

    __slots__ = ()

    def to_concrete_value(self):
        if _asked_only_to_skip_a_conversion():
            return None
        return trace_of(self).policy.concrete_value(self)

    def __array__(self, *args, **kwargs):
        # NumPy conversion (boolean-mask indexing uses it) asks here, not
        # to_concrete_value.
        value = trace_of(self).policy.numpy_value(self)
        if value is None:
            return super().__array__(*args, **kwargs)
        return np.asarray(value).__array__(*args, **kwargs)

    # JAX's Tracer.__float__ and __complex__, unlike __bool__ and __int__,
    # never ask to_concrete_value.
    def __float__(self):
        value = self.to_concrete_value()
        return super().__float__() if value is None else float(value)

    def __complex__(self):
        value = self.to_concrete_value()
        return super().__complex__() if value is None else complex(value)


class StagingTrace(_compat.DynamicJaxprTrace):
    """A ``DynamicJaxprTrace`` that asks a policy before folding.

    ``process_primitive`` hands every primitive application to ``policy``
    (``policy(trace, prim, args, params)``), which either returns outputs or
    returns ``NotImplemented`` to fall back to ordinary staging.
    ``custom_jvp``/``custom_vjp`` calls do not go through
    ``process_primitive``: ``policy.call_inputs(trace, args)`` gives their
    inputs concrete values when all are known (materializing deferred ones).
    """

    def __init__(self, debug_info, parent_trace, policy: FoldPolicy):
        super().__init__(debug_info, parent_trace=parent_trace)
        self.policy = policy
        admitted = _admitted.get()
        if admitted is not None:
            admitted.add(self)
            if parent_trace is not None:
                admitted.add(parent_trace)

    def to_jaxpr_tracer(self, x, source_info):
        # Every value that enters the residual program passes here: a tracer
        # of a trace the specialization did not open must not (see specializing).
        owner = trace_of(x)
        if owner is not None and owner is not self:
            admitted = _admitted.get()
            if admitted is not None and owner not in admitted:
                raise ClosedOverTracer(
                    f"pejit: the function closes over a {x.aval.str_short()} tracer of a trace it was not "
                    f"called in ({type(owner).__name__}), which a cached specialization cannot hold"
                )
        return super().to_jaxpr_tracer(x, source_info)

    def as_current(self):
        """Context in which JAX operations go through this trace (and its policy)."""
        return _compat.set_current_trace(self)

    def process_primitive(self, prim, tracers, params):
        out = self.policy(self, prim, tracers, params)
        if out is NotImplemented:
            return self.stage(prim, tracers, params)
        return out

    def var_to_tracer(self, var, source_info, parent=None):
        return KnowableTracer(self, _compat.var_aval(var), var, source_info, parent)

    # A custom_jvp/custom_vjp call is folded whole (JAX's eager path) when its
    # inputs are all concrete; otherwise the policy gets it as a primitive
    # application whose params are the bind's (``subfuns`` with its functions):
    # a fold rule (pejit._residual.rules.custom) folds the known work inside, or it is
    # staged as JAX stages it. Its rules are never bypassed.
    # Known inputs that are abstract constants (tracers of the outer trace of
    # a folding program being built) fold the call whole into that program.
    # A function whose inputs are all known may still close over values of
    # this trace (a custom_jvp's nondiff_argnums: jax.scipy.special.expn's
    # order): evaluating it then meets them, and it is staged, as jax.jit does.
    def process_custom_jvp_call(self, prim, fun, jvp, tracers, /, **params):
        tracers = self.policy.call_inputs(self, tracers)
        if not self._all_known(tracers):
            out = self.policy(self, prim, tracers, dict(params, subfuns=(fun, jvp)))
            if out is not NotImplemented:
                return out
        try:
            with eager_constant_folding(True):
                return self._folding_trace(tracers).process_custom_jvp_call(prim, fun, jvp, tracers, **params)
        except UnexpectedTracerError:
            if not self._all_known(tracers):
                raise
        with eager_constant_folding(False):
            return super().process_custom_jvp_call(prim, fun, jvp, tracers, **params)

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, **params):
        tracers = self.policy.call_inputs(self, tracers)
        if not self._all_known(tracers):
            out = self.policy(self, prim, tracers, dict(params, subfuns=(fun, fwd, bwd)))
            if out is not NotImplemented:
                return out
        try:
            with eager_constant_folding(True):
                return self._folding_trace(tracers).process_custom_vjp_call(prim, fun, fwd, bwd, tracers, **params)
        except UnexpectedTracerError:
            if not self._all_known(tracers):
                raise
        with eager_constant_folding(False):
            return super().process_custom_vjp_call(prim, fun, fwd, bwd, tracers, **params)

    @staticmethod
    def _all_known(args) -> bool:
        return not any(isinstance(trace_of(x), StagingTrace) for x in args)

    def _folding_trace(self, args):
        """The outer trace of ``args`` if they are all values and some are its tracers, else ``super()``."""
        if any(isinstance(trace_of(x), StagingTrace) for x in args):
            return super()
        return next((trace_of(x) for x in args if isinstance(x, Tracer)), super())

    def stage(self, prim, tracers, params):
        """Record ``prim`` in the residual jaxpr, even on concrete inputs."""
        with eager_constant_folding(False):
            return super().process_primitive(prim, _canonical(tracers), params)

    def stage_equation(self, prim, tracers, params):
        """Record exactly one ``prim`` equation with fresh output variables.

        Unlike :meth:`stage`, custom staging rules (which inline some calls,
        e.g. ``jit`` with ``inline=True``) are bypassed: the caller keys
        bookkeeping on the outputs of this one equation.
        """
        with eager_constant_folding(False):
            source_info = _compat.current_source_info()
            tracers = [self.to_jaxpr_tracer(t, source_info=source_info) for t in _canonical(tracers)]
            return self.default_process_primitive(prim, tracers, params, source_info)


def _canonical(args):
    """Values as ``Primitive.bind`` passes them on (a known value unwrapped
    from a literal may be a Python scalar, which staging rejects)."""
    return [x if isinstance(x, Tracer) else canonicalize_value(x) for x in args]


def _canonical_output(name: str, i: int, x: Any) -> Any:
    """Python and NumPy outputs become JAX values, as under ``jax.jit``."""
    if isinstance(x, Tracer):
        return x
    try:
        _compat.typeof(x)
    except TypeError:
        raise TypeError(
            f"{name} returned a value of type {type(x).__name__} as its output leaf {i}, "
            "which is not a valid JAX type"
        ) from None
    return canonicalize_value(x)


def trace_staging(
    fun: Callable[..., Sequence[Any]],
    in_avals: Sequence[Any],
    policy: FoldPolicy,
    name: str = "pejit",
    eager_bodies: bool = False,
) -> tuple[_compat.Jaxpr, list[Any]]:
    """Trace ``fun`` (flat arrays in, flat list out) into a jaxpr.

    Operations whose inputs are all concrete are evaluated on the spot when
    ``policy`` says so; the rest are staged. Returns an open jaxpr whose
    leading inputs are the folded values, and the list of those values, as
    ``policy.finalize(jaxpr, consts)`` leaves them (it turns deferred known
    work into constants). Mirrors ``partial_eval.trace_to_jaxpr_dynamic``.

    ``eager_bodies`` lets JAX itself evaluate operations on concrete values
    while it traces loop bodies and branches (``eager_constant_folding``), so
    Python control flow on constants works there too, at the price of
    folding effects and expansions inside those bodies.
    """
    dbg = _compat.debug_info(name, fun, in_avals, {})
    wrapped = _compat.wrap_init(fun, debug_info=dbg)
    trace = StagingTrace(dbg, _compat.core_trace(), policy)
    with _compat.ensure_no_leaks(trace), _compat.reset_name_stack():
        source_info = _compat.current_source_info()
        in_tracers = [trace.new_arg(a, source_info=source_info) for a in in_avals]
        with _compat.set_current_trace(trace), eager_constant_folding(eager_bodies):
            ans = wrapped.call_wrapped(*in_tracers)
        ans = [_canonical_output(name, i, x) for i, x in enumerate(ans)]
        out_tracers = [trace.to_jaxpr_tracer(x, source_info=source_info) for x in ans]
        # Name the outputs now that we know how many there are (JAX 0.7
        # requires resolved result paths here).
        dbg = _compat.with_result_paths(dbg, tuple(f"result[{i}]" for i in range(len(out_tracers))))
        jaxpr, consts = _compat.staged_jaxpr(trace, out_tracers, dbg, source_info)
        # Rule thunks of custom_jvp/custom_vjp calls in the jaxpr keep this
        # trace alive; they must not keep the parent alive too (for a folding
        # program, the trace of its abstract constants: see ``_program``).
        trace.parent_trace = None
        del trace, in_tracers, out_tracers, ans
    return policy.finalize(jaxpr, list(consts))


__all__ = ["ClosedOverTracer", "KnowableTracer", "StagingTrace", "known_value", "policy_of", "specializing",
           "trace_staging"]
