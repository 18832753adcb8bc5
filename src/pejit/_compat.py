"""Every use of JAX internals (``jax._src``) in pejit lives in this module.

A JAX upgrade should be a one-file change: when an internal moves, fix it
here. What we use, and why no public API does the job:

* ``core.Trace`` machinery (``trace_ctx``, ``set_current_trace``,
  ``eval_trace``, ``ensure_no_leaks``, ``Tracer``): pejit traces the user's
  function with its own subclass of ``DynamicJaxprTrace`` so that it can
  decide, equation by equation, whether to evaluate (fold) or to stage. The
  public ``jax.ensure_compile_time_eval`` folds *everything* whose inputs are
  concrete, including ``jax.debug.print`` and ``io_callback``, which must stay
  in the residual program.
* ``partial_eval.DynamicJaxprTrace`` and its frame: building the residual
  jaxpr, the same way ``jax.make_jaxpr`` does (``trace_to_jaxpr_dynamic``).
* ``partial_eval.convert_constvars_jaxpr`` and ``dce_jaxpr``: turning folded
  constants into explicit arguments (so they reach XLA as buffers, not HLO
  literals) and dropping dead equations.
* ``partial_eval.partial_eval_jaxpr_nounits_fwd`` and
  ``move_binders_to_back``: splitting a loop body into the part that depends
  only on known carries/inputs and the rest, as JAX's own scan
  partial-evaluation rule does (there is no public jaxpr-splitting API).
* ``config.eager_constant_folding``: the context-local switch behind
  ``jax.ensure_compile_time_eval``; we scope it, never set it globally. It is
  *off* while pejit traces: otherwise the ``DynamicJaxprTrace`` that JAX
  opens for a loop body or branch would evaluate every operation on
  closed-over constants itself, effects included, behind the policy's back.
  Known work inside bodies is folded by the loop and branch fold rules.
* ``core.eval_jaxpr``: the reference jaxpr interpreter, used to replay a
  jaxpr under the folding trace.
* ``api_util.debug_info`` / ``linear_util.wrap_init``: the debug metadata
  that ``DynamicJaxprTrace`` requires.
* ``dtypes.canonicalize_value``: outputs that are Python or NumPy values
  become JAX values, as ``jax.jit`` makes them; known Python scalars are
  staged the way ``Primitive.bind`` would.
* ``pjit.pjit_p`` (JAX < 0.7 only; public as ``jax.extend.core.primitives.jit_p``
  since): the primitive of a nested ``jax.jit`` call, which a fold rule
  specializes through; ``ad_checkpoint.remat_p`` (JAX < 0.8 only; public
  since), ``jax.checkpoint``'s primitive, which a fold rule and the FLOP
  counter look into.

Supported JAX versions: 0.7.0 and newer (CI tests 0.7.0 and the newest).
Version differences handled here, by feature detection:

* ``Primitive.bind_with_trace`` takes the input avals since JAX 0.10;
* ``DebugInfo.result_paths`` must be resolved before ``to_jaxpr`` in 0.7;
* ``DynamicJaxprTrace.new_const`` accepts non-canonical constants (Python
  scalars, NumPy arrays) before 0.10, and asserts on them since.

JAX 0.6 is out of reach without a second implementation: its
``DynamicJaxprTracer`` does not carry its ``Var`` (the frame maps tracer ids
to variables), and there is no ``var_to_tracer`` hook, while the folding
policy identifies lazy values by their ``Var``.
* ``array.ArrayImpl``: the concrete type of ``jax.Array``; the call hot path
  compares ``type(x) is ArrayImpl``, much cheaper than ``isinstance``.
* ``core.eval_trace``: evaluating known work (op by op, or by compiling it
  with ``jax.jit``) from inside the folding trace.
* ``mlir._lowerings``: whether a known sub-program can be compiled at all
  (primitives with only an ``impl`` must run op by op).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from jax._src import api_util
from jax._src import array as _array
from jax._src import config as _config
from jax._src import core
from jax._src import dtypes
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

try:  # the primitive of a nested jax.jit call (public since JAX 0.7)
    from jax.extend.core.primitives import jit_p
except ImportError:  # JAX 0.6: only internal, named pjit_p
    from jax._src.pjit import pjit_p as jit_p
try:  # jax.checkpoint's primitive (public since JAX 0.8)
    from jax.extend.core.primitives import remat_p
except ImportError:
    from jax._src.ad_checkpoint import remat_p

if TYPE_CHECKING:  # the contract StagingTrace asks of its policy
    from ._folding import FoldPolicy

# JAX >= 0.10 stages only canonical constants (jax.Arrays, not Python or NumPy
# scalars and arrays); before, DynamicJaxprTrace.new_const converted them.
_canonicalize_value = getattr(dtypes, "canonicalize_value", lambda x: x)


def _canonical_output(name: str, i: int, x: Any) -> Any:
    """Python and NumPy outputs become JAX values, as under ``jax.jit``."""
    if isinstance(x, core.Tracer):
        return x
    try:
        core.typeof(x)
    except TypeError:
        raise TypeError(
            f"{name} returned a value of type {type(x).__name__} as its output leaf {i}, "
            "which is not a valid JAX type"
        ) from None
    return _canonicalize_value(x)


ArrayImpl = _array.ArrayImpl
Tracer = core.Tracer
Literal = core.Literal
Var = core.Var
Jaxpr = core.Jaxpr
ClosedJaxpr = core.ClosedJaxpr
ShapedArray = core.ShapedArray
eval_jaxpr = core.eval_jaxpr
set_current_trace = core.set_current_trace
eval_trace = core.eval_trace
typeof = core.typeof
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr
dce_jaxpr = _pe.dce_jaxpr
convert_invars_to_constvars = _pe.convert_invars_to_constvars
partial_eval_jaxpr_nounits_fwd = _pe.partial_eval_jaxpr_nounits_fwd
move_binders_to_back = _pe.move_binders_to_back


def prune(jaxpr: Jaxpr, consts: Sequence[Any]) -> tuple[Jaxpr, list[Any]]:
    """Drop dead equations (e.g. unused lazy expansions) and unused constants.

    Effectful equations are kept; every input is kept, so the signature does
    not change.
    """
    open_jaxpr = convert_constvars_jaxpr(jaxpr)
    n = len(consts)
    keep = [False] * n + [True] * len(jaxpr.invars)
    dced, used = dce_jaxpr(open_jaxpr, [True] * len(jaxpr.outvars), instantiate=keep)
    consts = [c for c, u in zip(consts, used[:n]) if u]
    return convert_invars_to_constvars(dced, len(consts)), consts


def core_trace():
    """The trace currently in effect."""
    return core.trace_ctx.trace


if "avals" in inspect.signature(core.Primitive.bind_with_trace).parameters:  # JAX >= 0.10

    def _bind(prim, trace, args, params):
        return prim.bind_with_trace(trace, args, tuple(core.typeof(x) for x in args), params)

else:

    def _bind(prim, trace, args, params):
        return prim.bind_with_trace(trace, args, params)


def evaluate(prim, args: Sequence[Any], params: dict, trace=None) -> Any:
    """Bind ``prim`` on known ``args``: eagerly, or on ``trace``.

    ``trace`` is the outer trace of abstract constants (see
    :mod:`pejit._abstract`), which then stages ``prim`` into its program.

    Our trace may turn on ``eager_constant_folding``; it must not leak into
    the compilation of ``prim`` (lowering a ``scan`` binds ``empty``, which
    has no eager rule in JAX 0.7).
    """
    with _config.eager_constant_folding(False):
        return _bind(prim, core.eval_trace if trace is None else trace, tuple(args), params)


def trace_of(x: core.Tracer):
    """The trace ``x`` belongs to."""
    return x._trace


def policy_of(x: Any):
    """The folding policy of the :class:`StagingTrace` that made ``x``, else None."""
    return getattr(x._trace, "policy", None) if isinstance(x, core.Tracer) else None


def known_const(trace, x: Any):
    """The constant a tracer of ``trace`` merely holds, else None."""
    if isinstance(x, core.Tracer) and getattr(x, "_trace", None) is trace:
        return trace.get_const(x)
    return None


def unnamed_args(debug_info, n: int):
    """``debug_info`` (may be None) for a jaxpr with ``n`` unnamed binders
    (JAX 0.7 needs a tuple of names here, not None)."""
    return debug_info._replace(arg_names=("",) * n) if debug_info else None


def staged_const(trace, x: core.Tracer):
    """The constant the staged output ``x`` holds (JAX forwarded or folded it), else None."""
    return trace.get_const(x)


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
    stack.enter_context(_config.eager_constant_folding(False))
    return stack


def has_lowering(prim, platform: str) -> bool:
    """Whether ``prim`` can be compiled for ``platform`` (else: ``impl`` only)."""
    return prim in _mlir._lowerings or prim in _mlir._platform_specific_lowerings.get(platform, {})


def primitive_effects(prim, avals: Sequence[Any], params: dict):
    """The effects ``prim`` would carry on inputs of these avals."""
    _, effects = prim.abstract_eval(*avals, **params)
    return effects


class KnowableTracer(_pe.DynamicJaxprTracer):
    """A staged value whose concrete value the policy may still know.

    Python control flow (``bool``, ``int``, ``np.asarray``) asks
    ``to_concrete_value``; lazy known values answer by materializing.
    """

    __slots__ = ()

    def to_concrete_value(self):
        return self._trace.policy.concrete_value(self)

    def __array__(self, *args, **kwargs):
        # NumPy conversion (boolean-mask indexing uses it) asks here, not
        # to_concrete_value.
        value = self.to_concrete_value()
        if value is None:
            return super().__array__(*args, **kwargs)
        return np.asarray(value).__array__(*args, **kwargs)


class StagingTrace(_pe.DynamicJaxprTrace):
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

    def as_current(self):
        """Context in which JAX operations go through this trace (and its policy)."""
        return core.set_current_trace(self)

    def process_primitive(self, prim, tracers, params):
        out = self.policy(self, prim, tracers, params)
        if out is NotImplemented:
            return self.stage(prim, tracers, params)
        return out

    def var_to_tracer(self, var, source_info, parent=None):
        aval = var.aval
        if aval.has_qdd:
            aval = core.AvalQDD(aval, var.initial_qdd)
        return KnowableTracer(self, aval, var, source_info, parent)

    # A custom_jvp/custom_vjp call is folded whole (JAX's eager path) when its
    # inputs are all concrete; otherwise it is staged, with known work in its
    # primal function folded as JAX traces it. Its rules are never bypassed.
    def process_custom_jvp_call(self, prim, fun, jvp, tracers, /, **params):
        tracers = self.policy.call_inputs(self, tracers)
        with _config.eager_constant_folding(True):
            return super().process_custom_jvp_call(prim, fun, jvp, tracers, **params)

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, /, **params):
        tracers = self.policy.call_inputs(self, tracers)
        with _config.eager_constant_folding(True):
            return super().process_custom_vjp_call(prim, fun, fwd, bwd, tracers, **params)

    def stage(self, prim, tracers, params):
        """Record ``prim`` in the residual jaxpr, even on concrete inputs."""
        with _config.eager_constant_folding(False):
            return super().process_primitive(prim, _canonical(tracers), params)

    def stage_equation(self, prim, tracers, params):
        """Record exactly one ``prim`` equation with fresh output variables.

        Unlike :meth:`stage`, custom staging rules (which inline some calls,
        e.g. ``jit`` with ``inline=True``) are bypassed: the caller keys
        bookkeeping on the outputs of this one equation.
        """
        with _config.eager_constant_folding(False):
            source_info = source_info_util.current()
            tracers = [self.to_jaxpr_tracer(t, source_info=source_info) for t in _canonical(tracers)]
            return self.default_process_primitive(prim, tracers, params, source_info)


def _canonical(args):
    """Values as ``Primitive.bind`` passes them on (a known value unwrapped
    from a literal may be a Python scalar, which staging rejects)."""
    return [x if isinstance(x, core.Tracer) else _canonicalize_value(x) for x in args]


def trace_staging(
    fun: Callable[..., Sequence[Any]],
    in_avals: Sequence[Any],
    policy: FoldPolicy,
    name: str = "pejit",
    eager_bodies: bool = False,
) -> tuple[Jaxpr, list[Any]]:
    """Trace ``fun`` (flat arrays in, flat list out) into a jaxpr.

    Operations whose inputs are all concrete are evaluated on the spot when
    ``policy`` says so; the rest are staged. Returns the jaxpr (constvars hold
    the folded values) and the list of those values, as
    ``policy.finalize(jaxpr, consts)`` leaves them (it turns deferred known
    work into constants). Mirrors ``partial_eval.trace_to_jaxpr_dynamic``.

    ``eager_bodies`` lets JAX itself evaluate operations on concrete values
    while it traces loop bodies and branches (``eager_constant_folding``), so
    Python control flow on constants works there too, at the price of
    folding effects and expansions inside those bodies.
    """
    dbg = api_util.debug_info(name, fun, tuple(in_avals), {})
    wrapped = lu.wrap_init(fun, debug_info=dbg)
    trace = StagingTrace(dbg, core.trace_ctx.trace, policy)
    with core.ensure_no_leaks(trace), source_info_util.reset_name_stack():
        source_info = source_info_util.current()
        in_tracers = [trace.new_arg(a, source_info=source_info) for a in in_avals]
        with core.set_current_trace(trace), _config.eager_constant_folding(eager_bodies):
            ans = wrapped.call_wrapped(*in_tracers)
        ans = [_canonical_output(name, i, x) for i, x in enumerate(ans)]
        out_tracers = [trace.to_jaxpr_tracer(x, source_info=source_info) for x in ans]
        # Name the outputs now that we know how many there are (JAX 0.7
        # requires resolved result paths here).
        dbg = dbg._replace(result_paths=tuple(f"result[{i}]" for i in range(len(out_tracers))))
        jaxpr, consts = trace.frame.to_jaxpr(trace, out_tracers, dbg, source_info)
        del trace, in_tracers, out_tracers, ans
    return policy.finalize(jaxpr, list(consts))

