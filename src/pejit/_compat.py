"""Every use of JAX internals (``jax._src``) in pejit goes through this module.

Here are the imports of ``jax._src``, the version probing, the aliases and
helpers built on them (jaxpr construction, ``scan``'s parameters, tracers,
evaluation contexts). :mod:`pejit._fold._staging` builds pejit's staging trace on
the trace classes and contexts exported here, and imports no internal itself.

A JAX upgrade should be a one-file change: when an internal moves, fix it
here. Supported: JAX 0.7.0 to 0.12.x (CI runs 0.7.0, 0.10.2 and the newest
release). At import, :func:`_probe` checks that every internal below exists
(and, for the ``DynamicJaxprTrace`` methods pejit overrides, that their
parameters are the ones we override), so that a JAX without one fails with
an ``ImportError`` that names it, not deep inside a trace.

Internals used, why no public API does the job, and where versions differ:

* ``core`` trace machinery (``trace_ctx``, ``set_current_trace``,
  ``eval_trace``, ``ensure_no_leaks``, ``trace_state_strong_ref``) and
  ``partial_eval.DynamicJaxprTrace`` / ``DynamicJaxprTracer``: pejit traces
  the user's function with its own subclass of ``DynamicJaxprTrace`` so that
  it can decide, equation by equation, whether to evaluate (fold) or to
  stage, and builds the residual jaxpr as ``jax.make_jaxpr`` does (the
  subclass is :mod:`pejit._fold._staging`'s). The public
  ``jax.ensure_compile_time_eval`` folds *everything* whose inputs are
  concrete, including ``jax.debug.print`` and ``io_callback``, which must stay
  in the residual program. ``Primitive.bind_with_trace`` takes the input
  avals since 0.10; ``DynamicJaxprTrace.new_const`` accepts non-canonical
  constants before 0.10 and asserts on them since; avals carry a "QDD"
  (``has_qdd``, ``AvalQDD``) until 0.11.0, which ``var_to_tracer`` must keep.
* ``config.eager_constant_folding``: the context-local switch behind
  ``jax.ensure_compile_time_eval``; we scope it, never set it globally. It is
  *off* while pejit traces: otherwise the ``DynamicJaxprTrace`` that JAX
  opens for a loop body or branch would evaluate every operation on
  closed-over constants itself, effects included, behind the policy's back.
* Jaxpr construction. Folded constants are carried as an *open* jaxpr whose
  leading inputs are the constants, with the list of their values beside it
  (:func:`close_jaxpr` / :func:`open_jaxpr` convert). The closed form changed
  meaning: until 0.11.0 a ``ClosedJaxpr`` wraps a ``Jaxpr`` whose
  ``constvars`` pair with ``consts`` (built with
  ``pe.convert_invars_to_constvars``); 0.11.0 makes ``ClosedJaxpr`` an alias
  of ``Jaxpr``; from 0.11.1 ``constvars`` are just the leading inputs that
  have values attached (``Jaxpr.with_consts``), and ``frame.to_jaxpr``
  returns its constants as plain leading inputs. Never building
  ``Jaxpr(constvars, ...)`` without values keeps one code path right in all.
* ``partial_eval.partial_eval_jaxpr_nounits_fwd`` and
  ``move_binders_to_back``: splitting a loop body into the part that depends
  only on known carries/inputs and the rest, as JAX's own scan
  partial-evaluation rule does (there is no public jaxpr-splitting API).
* ``ad.custom_lin_p``: the equation forward-mode differentiation leaves for
  a ``custom_vjp`` call's backward rule, which pejit folds.
* ``scan``'s parameters: ``num_consts``/``num_carry`` (and ``linear`` before
  0.10) until 0.10.2; the flat trees ``ft_in``/``ft_out`` (``jax._src.flattree``)
  from 0.11.0. :class:`ScanParams` reads and rebuilds both, keeping JAX's own
  grouping of inputs and outputs.
* ``core.eval_jaxpr``: the reference jaxpr interpreter, used to replay a
  jaxpr under the folding trace.
* ``api_util.debug_info`` / ``linear_util.wrap_init``: the debug metadata
  that ``DynamicJaxprTrace`` requires, and that names the user's function
  and arguments in JAX's tracing errors; ``DebugInfo.result_paths`` must be
  resolved before ``to_jaxpr`` in 0.7.
* ``dtypes.canonicalize_value`` (0.10 and newer): outputs that are Python or
  NumPy values become JAX values, as ``jax.jit`` makes them.
* ``array.ArrayImpl``: the concrete type of ``jax.Array``; the call hot path
  compares ``type(x) is ArrayImpl``, much cheaper than ``isinstance``.
* ``mlir._lowerings``: whether a known sub-program can be compiled at all
  (primitives with only an ``impl`` must run op by op).
* ``api_util.check_callable`` and ``util.fun_name``: what ``jax.jit`` accepts
  as a function (its ``TypeError``s, word for word, in every version) and
  the name it gives one (``functools.partial`` unwrapped).
* ``config.disable_jit``: the state behind ``jax.disable_jit()``, read on
  every call as ``jax.jit``'s own dispatch reads it (``jax.config`` has no
  cheap public read).
* ``core.get_axis_env`` and the ``axis_env_state`` config: the named axes
  (``vmap``/``shard_map`` axis names and sizes) a call runs under, which
  ``jax.jit`` keys its caches on. The environment is an ``AxisEnv`` whose
  ``axis_sizes`` map names to sizes in every version; the state holds the
  (interned) ``AxisEnv`` itself in ``core`` on recent JAX, its hashable key
  (``()`` at top level) in ``config`` on 0.7.
* ``jax.stages.Traced``'s state and ``jax.export``'s lowering parameters:
  pejit's :class:`~pejit._calls._stages.Traced` is a subclass of JAX's, made from
  a trace ``jax.jit`` returns by copying its state (slots and, on 0.7,
  ``__dict__``: the layout changes between versions, :func:`as_traced`);
  ``jax.export`` (0.7 to 0.12) lowers ``fun.trace(...)`` with
  ``_private_parameters=LoweringParameters(for_export=True)``, which is how
  a trace knows it is being exported (:func:`lowering_for_export`).
* The code objects of ``core.is_concrete`` and ``lax._convert_element_type``:
  the staging tracer does not evaluate a value the conversion only asks about.
* ``traceback_util.api_boundary`` / ``register_exclusion``: an error raised
  in the user's function while pejit traces it shows the user's frames, not
  pejit's, exactly as ``jax.jit`` hides JAX's (and ``JAX_TRACEBACK_FILTERING=off``
  turns both off). Without them (a JAX that moved them), tracebacks are whole.

Public replacements are used where every supported version has them:
``jax.extend.core`` (``ClosedJaxpr``, ``Jaxpr``, ``Var``, ``Literal``,
``primitives.jit_p``/``remat_p`` where present) and
``jax.interpreters.partial_eval.dce_jaxpr``.

JAX 0.6 is out of reach: its ``DynamicJaxprTracer`` does not carry the
``Var`` by which the folding policy identifies lazy values.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as _xcore
from jax.interpreters import partial_eval as _public_pe

#: What pejit's CI has run (see .ci/run); the ImportError below quotes it.
SUPPORTED_JAX = "0.7.0 to 0.12.x"


def _missing(what: str, detail: str) -> ImportError:
    return ImportError(
        f"pejit supports JAX {SUPPORTED_JAX}, but JAX {jax.__version__} lacks what it needs: "
        f"{what} ({detail}). Install a supported JAX (pip install 'jax>=0.7,<0.13') or a pejit "
        "release that supports this one."
    )


try:
    from jax._src import api_util
    from jax._src import array as _array
    from jax._src import config as _config
    from jax._src import core
    from jax._src import dtypes
    from jax._src import linear_util as lu
    from jax._src import source_info_util
    from jax._src import util as _util
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import mlir as _mlir
    from jax._src.interpreters import partial_eval as _pe
except ImportError as e:  # pragma: no cover - only on an unsupported JAX
    raise _missing(f"module {e.name}", "import failed") from e

try:  # lax.split's primitive (not in jax.extend; JAX >= 0.4.36)
    from jax._src.lax.lax import split_p
except ImportError:  # pragma: no cover
    split_p = None

try:  # JAX >= 0.11: scan's parameters are flat trees
    from jax._src import flattree as _ft
except ImportError:
    _ft = None


def debug_info(traced_for: str, fun: Callable, args: Sequence[Any], kwargs: dict, *,
               static_argnums: Sequence[int] = (), static_argnames: Sequence[str] = ()):
    """JAX's debug info of a call (source line, argument names), as ``jax.jit`` builds it."""
    return api_util.debug_info(traced_for, fun, tuple(args), kwargs, static_argnums=tuple(static_argnums),
                               static_argnames=tuple(static_argnames))


def unnamed_debug_info(traced_for: str, n_in: int, n_out: int):
    """Debug info with unnamed arguments and results, for a jaxpr pejit builds itself
    (JAX 0.7 wants every result path; later versions take None for unknown)."""
    return _unnamed(debug_info(traced_for, unnamed_debug_info, (), {}), arg_names=n_in, result_paths=n_out)


try:  # traceback filtering, as jax.jit does it
    from jax._src.traceback_util import api_boundary, register_exclusion
except ImportError:
    def api_boundary(fun, **_):
        return fun

    def register_exclusion(path: str) -> None:
        pass

try:  # the primitive of a nested jax.jit call (public since JAX 0.7)
    from jax.extend.core.primitives import jit_p
except ImportError:  # JAX 0.6: only internal, named pjit_p
    from jax._src.pjit import pjit_p as jit_p
try:  # jax.checkpoint's primitive (public since JAX 0.8.2)
    from jax.extend.core.primitives import remat_p
except ImportError:
    from jax._src.ad_checkpoint import remat_p

#: Internals looked up by attribute: (owner, name, why pejit needs it).
_REQUIRED = [
    (core, "Tracer", "tracer type"),
    (core, "trace_ctx", "the current trace"),
    (core, "top_axis_env", "the axis environment, in cache keys"),
    (core, "set_current_trace", "entering the folding trace"),
    (core, "eval_trace", "evaluating folded work"),
    (core, "ensure_no_leaks", "tracing like make_jaxpr"),
    (core, "eval_jaxpr", "replaying a jaxpr under the folding trace"),
    (core, "typeof", "abstract values"),
    (core, "Primitive", "binding primitives"),
    (core, "new_jaxpr_eqn", "building residual equations"),
    (_pe, "DynamicJaxprTrace", "the folding trace's base class"),
    (_pe, "DynamicJaxprTracer", "the folding trace's tracers"),
    (_pe, "JaxprTrace", "partial evaluation (linearization), which needs no derivative rule"),
    (_pe, "convert_constvars_jaxpr", "opening a closed jaxpr"),
    (_pe, "partial_eval_jaxpr_nounits_fwd", "splitting loop bodies"),
    (_pe, "move_binders_to_back", "splitting loop bodies"),
    (_config, "eager_constant_folding", "scoping JAX's own folding"),
    (api_util, "debug_info", "debug metadata of the traced function"),
    (api_util, "check_callable", "jax.jit's errors for what is not a function"),
    (_util, "fun_name", "jax.jit's name for a function"),
    (_config, "disable_jit", "jax.disable_jit()"),
    (core, "get_axis_env", "keying specializations on the named axes"),
    (core, "top_axis_env", "the call hot path's check for named axes"),
    (lu, "wrap_init", "wrapping the traced function"),
    (source_info_util, "current", "source information of staged equations"),
    (source_info_util, "reset_name_stack", "tracing like make_jaxpr"),
    (_array, "ArrayImpl", "the hot path's type check"),
    (_mlir, "_lowerings", "which primitives can be compiled"),
    (_pe, "_cached_abstract_eval", "the fold's abstract evaluation, cached as staging caches it"),
    (_public_pe, "dce_jaxpr", "dead-code elimination"),
    (_ad, "custom_lin_p", "a custom_vjp call's backward rule, as differentiation leaves it"),
    (_xcore, "ClosedJaxpr", "closed jaxprs"),
]

#: DynamicJaxprTrace methods pejit overrides or calls, with the parameters it passes.
_METHODS = {
    "process_primitive": ["primitive", "tracers", "params"],
    "var_to_tracer": ["var", "source_info", "parent"],
    "new_arg": ["aval", "source_info"],
    "to_jaxpr_tracer": ["x", "source_info"],
    "get_const": ["tracer"],
    "default_process_primitive": ["primitive", "tracers", "params", "source_info"],
    "process_custom_jvp_call": ["prim", "fun", "jvp", "tracers"],
    "process_custom_vjp_call": ["prim", "fun", "fwd", "bwd", "tracers"],
}


def _probe(required=_REQUIRED, methods=_METHODS, trace_class=None) -> None:
    """Raise ``ImportError`` naming every needed internal this JAX lacks."""
    trace_class = trace_class or getattr(_pe, "DynamicJaxprTrace", None)
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name} ({why})"
        for owner, name, why in required
        if not hasattr(owner, name)
    ]
    for name, params in methods.items():
        method = getattr(trace_class, name, None)
        if method is None:
            missing.append(f"DynamicJaxprTrace.{name}")
            continue
        got = list(inspect.signature(method).parameters)[1:]  # without self
        if got[: len(params)] != params:
            missing.append(f"DynamicJaxprTrace.{name}({', '.join(params)}), found ({', '.join(got)})")
    if missing:
        raise _missing("; ".join(missing), "internals moved or changed")


_probe()

check_callable = api_util.check_callable
fun_name = _util.fun_name
#: ``jax.disable_jit()``'s state: ``DISABLE_JIT.value`` is true under it (read
#: per call, so the hot path reads the attribute itself).
DISABLE_JIT = _config.disable_jit
#: The named axes in effect: ``AXIS_ENV.value is NO_AXES`` at top level (a
#: cheap check for the hot path; see :func:`axis_env_key` for the key).
if hasattr(core, "axis_env_state"):
    AXIS_ENV, NO_AXES = core.axis_env_state, core.top_axis_env
elif hasattr(_config, "axis_env_state"):  # JAX 0.7: the environment's hashable key
    AXIS_ENV, NO_AXES = _config.axis_env_state, ()
else:  # pragma: no cover - only on an unsupported JAX
    raise _missing("core.axis_env_state", "the named axes in effect")


#: The current trace: ``TRACE.value is eval_trace`` outside every transformation
#: (a context-local state, cheap to read on the hot path; JAX 0.7 keeps it on ``trace_ctx``).
TRACE = getattr(core, "trace_state_strong_ref", None) or type(
    "Trace", (), {"value": property(lambda self: core.trace_ctx.trace)})()


def axis_env_key() -> tuple:
    """The named axes a call runs under (names and sizes), ``()`` at top level.

    Part of a specialization's key, as of ``jax.jit``'s: a function may read
    them (``lax.axis_size``), and folding evaluates what it reads.
    """
    env = core.get_axis_env()
    spmd = getattr(env, "spmd_axis_names", ())
    if not env.axis_sizes and not spmd:
        return ()
    return tuple(env.axis_sizes.items()), frozenset(spmd)

# JAX >= 0.10 stages only canonical constants (jax.Arrays, not Python or NumPy
# scalars and arrays); before, DynamicJaxprTrace.new_const converted them.
canonicalize_value = getattr(dtypes, "canonicalize_value", lambda x: x)


try:  # a value's weak type, set without a change of dtype (public lax has no weak_type)
    from jax._src.lax.lax import _convert_element_type
except ImportError:  # pragma: no cover
    _convert_element_type = None
#: The frames of JAX's ``is_concrete``, and of ``_convert_element_type`` (see ``_staging.KnowableTracer``)
IS_CONCRETE_CODE = (core.is_concrete.__code__, core.to_concrete_value.__code__)
CONVERT_CODE = getattr(_convert_element_type, "__code__", None)


def weakly_typed(x: Any) -> Any:
    """``x`` (a ``jax.Array``) weakly typed, as a Python scalar's value is:
    what a weak value stored as NumPy (which has no weak types) was."""
    if _convert_element_type is None:  # pragma: no cover
        return x
    with at_top_level():
        return _convert_element_type(x, weak_type=True)


def literal(value: Any, aval: Any) -> Literal:
    """A literal of ``aval`` holding the scalar ``value``, as JAX's staging makes one.

    Weak-typed literals keep their weak type when the jaxpr is evaluated
    again (``jaxpr_as_fun``): a Python scalar, canonicalized as ``bind``
    does, where a NumPy scalar would bind as a strongly typed value.
    """
    if getattr(aval, "weak_type", False):
        value = canonicalize_value(np.asarray(value).item())
    return Literal(value, aval)


ArrayImpl = _array.ArrayImpl
Tracer = core.Tracer
Literal = _xcore.Literal
Var = _xcore.Var
Jaxpr = _xcore.Jaxpr
ClosedJaxpr = _xcore.ClosedJaxpr
ShapedArray = core.ShapedArray
Token = core.Token  # the value of an effect token (jax.lax.create_token)
eval_jaxpr = core.eval_jaxpr
set_current_trace = core.set_current_trace
eval_trace = core.eval_trace
typeof = core.typeof
dce_jaxpr = _public_pe.dce_jaxpr
partial_eval_jaxpr_nounits_fwd = _pe.partial_eval_jaxpr_nounits_fwd
move_binders_to_back = _pe.move_binders_to_back
# public as jax.extend.core.new_jaxpr_eqn from JAX 0.8 only
new_jaxpr_eqn = core.new_jaxpr_eqn
new_var = core.Var  # Var(aval) and DropVar(aval) on every version we support
drop_var = core.DropVar  # an output binder nobody reads (``_`` in printed jaxprs)
no_effects = core.no_effects

# JAX < 0.11.1 pairs constvars with consts explicitly; later, attached values
# make leading inputs constants (``Jaxpr.with_consts``).
_convert_invars_to_constvars = getattr(_pe, "convert_invars_to_constvars", None)


# -- jaxprs with folded constants ---------------------------------------------
# pejit carries a jaxpr with folded constants *open*: its first len(consts)
# inputs are the constants, whose values travel beside it.
def open_jaxpr(closed: ClosedJaxpr) -> tuple[Jaxpr, list[Any]]:
    """``(open jaxpr, consts)``: the constants become its leading inputs."""
    return _pe.convert_constvars_jaxpr(closed.jaxpr), list(closed.consts)


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


def _unnamed(dbg: Any, **counts: int) -> Any:
    return None if dbg is None else dbg._replace(**{k: ("",) * n for k, n in counts.items()})


# -- scan parameters ----------------------------------------------------------
class ScanParams:
    """Reads and rebuilds ``scan``'s parameters, in either of their forms.

    Inputs are ``[*consts, *carry, *xs]`` and outputs ``[*carry, *ys]``;
    JAX <= 0.10 records the counts (``num_consts``, ``num_carry``, and
    ``linear`` per input), JAX >= 0.11 flat trees (``ft_in``, ``ft_out``)
    whose groups we keep, so that JAX's output grouping is unchanged.
    """

    def __init__(self, params: dict):
        self.params = params
        if "ft_in" in params:
            consts, carry, xs = params["ft_in"].unpack()
            self.num_consts, self.num_carry, self.num_xs = len(consts), len(carry), len(xs)
        else:
            self.num_consts, self.num_carry = params["num_consts"], params["num_carry"]
            self.num_xs = len(params["jaxpr"].in_avals) - self.num_consts - self.num_carry

    def with_consts(self, jaxpr, num_consts: int) -> dict:
        """Parameters for ``jaxpr`` taking ``num_consts`` constants, the same carries and xs."""
        if "ft_in" in self.params:
            _, carry, xs = self.params["ft_in"].unpack()
            return dict(self.params, jaxpr=jaxpr, ft_in=_ft.pack((_ft.nones(num_consts), carry, xs)))
        return dict(self.params, jaxpr=jaxpr, num_consts=num_consts, **_linear(self.params, num_consts, self.num_consts))

    def split(self, jaxpr, *, consts: int, carry: Sequence[bool], xs: Sequence[bool], ys: Sequence[bool],
              extra_xs: int = 0, extra_ys: int = 0) -> dict:
        """Parameters of a scan keeping some of this scan's carries, xs and ys.

        ``carry``/``xs``/``ys`` mask which are kept. The new scan takes
        ``consts`` constants first, and ``extra_xs`` scanned inputs after the
        kept ones; it returns ``extra_ys`` stacked outputs after the kept ys.
        As in ``jax._src.lax.control_flow.loops._scan_partial_eval``.
        """
        n_carry = sum(carry)
        if "ft_in" in self.params:
            _, carry_g, xs_g = self.params["ft_in"].unpack()
            _, ys_g = self.params["ft_out"].unpack()
            carry_g = carry_g.filter_with_mask(list(carry))
            xs_g = xs_g.filter_with_mask(list(xs))
            ys_g = ys_g.filter_with_mask(list(ys))
            if extra_xs:
                xs_g = _ft.pack((xs_g, _ft.nones(extra_xs)))
            if extra_ys:
                ys_g = _ft.pack((ys_g, _ft.nones(extra_ys)))
            return dict(
                self.params, jaxpr=jaxpr,
                ft_in=_ft.pack((_ft.nones(consts), carry_g, xs_g)), ft_out=_ft.pack((carry_g, ys_g)),
            )
        return dict(self.params, jaxpr=jaxpr, num_consts=consts, num_carry=n_carry,
                    **_linear(self.params, consts, self.num_consts, [*carry, *xs], extra_xs))


def _linear(params: dict, consts: int, old_consts: int, kept: Sequence[bool] | None = None, extra: int = 0) -> dict:
    """``scan``'s ``linear`` (JAX < 0.10) for ``consts`` new constants, the carries and xs ``kept``
    masks (all: None; as they were: JAX 0.7 transposes a scan by them) and ``extra`` new xs."""
    if "linear" not in params:
        return {}
    old = [lin for i, lin in enumerate(params["linear"][old_consts:]) if kept is None or kept[i]]
    return {"linear": (False,) * consts + tuple(old) + (False,) * extra}


# -- tracers and traces -------------------------------------------------------
def trace_of(x: Any):
    """The trace a tracer belongs to (``None`` for a concrete value)."""
    return x._trace if isinstance(x, core.Tracer) else None


def const_of(trace, x: Any) -> Any:
    """The constant a tracer of ``trace`` merely holds, else ``None``."""
    if isinstance(x, core.Tracer) and x._trace is trace:
        return trace.get_const(x)
    return None


def abstract_eval(prim, avals: Sequence[Any], params: dict) -> tuple[Any, Any]:
    """``prim.abstract_eval(*avals, **params)`` from the cache JAX's staging keeps.

    The fold asks before it stages: uncached, asking cost as much again as
    staging (a fifth of a TFC program's trace).
    """
    if getattr(prim, "ref_allocating", False) or prim.name in _UNCACHED_ABSTRACT_EVAL:
        return prim.abstract_eval(*avals, **params)
    try:
        return _pe._cached_abstract_eval(prim, *avals, **params)
    except TypeError:  # unhashable parameters; a real error raises again
        return prim.abstract_eval(*avals, **params)


#: Primitives whose abstract evaluation has effects JAX's staging does not cache.
_UNCACHED_ABSTRACT_EVAL = frozenset(["custom_lin", "call_hi_primitive_linearized", "call_hi_primitive"])


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
    :mod:`pejit._fold._abstract`), which then stages ``prim`` into its program.

    Our trace may turn on ``eager_constant_folding``; it must not leak into
    the compilation of ``prim`` (lowering a ``scan`` binds ``empty``, which
    has no eager rule in JAX 0.7).
    """
    with _config.eager_constant_folding(False):
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
    stack.enter_context(_config.eager_constant_folding(False))
    return stack


def has_lowering(prim, platform: str) -> bool:
    """Whether ``prim`` can be compiled for ``platform`` (else: ``impl`` only)."""
    return prim in _mlir._lowerings or prim in _mlir._platform_specific_lowerings.get(platform, {})


def primitive_effects(prim, avals: Sequence[Any], params: dict):
    """The effects ``prim`` would carry on inputs of these avals."""
    _, effects = abstract_eval(prim, avals, params)
    return effects


# -- what the staging trace (pejit._fold._staging) is made of -----------------
#: The trace and tracer classes :class:`~pejit._fold._staging.StagingTrace` and
#: :class:`~pejit._fold._staging.KnowableTracer` extend (``_METHODS`` above lists the
#: methods overridden or called, checked at import).
DynamicJaxprTrace = _pe.DynamicJaxprTrace
DynamicJaxprTracer = _pe.DynamicJaxprTracer
JaxprTrace = _pe.JaxprTrace  # partial evaluation's (jax.linearize runs JVP rules under it)
#: What JAX's forward-mode differentiation of a ``custom_vjp`` call leaves for
#: the backward rule: a linear equation whose transpose runs the rule.
custom_lin_p = _ad.custom_lin_p
#: ``eager_constant_folding(on)``: context scoping JAX's own folding of
#: operations on concrete values (never set globally).
eager_constant_folding = _config.eager_constant_folding
wrap_init = lu.wrap_init
ensure_no_leaks = core.ensure_no_leaks
current_source_info = source_info_util.current
reset_name_stack = source_info_util.reset_name_stack
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr


def var_aval(var: Any) -> Any:
    """The aval a tracer of ``var`` carries: with its QDD on JAX <= 0.11.0 (mutable arrays)."""
    aval = var.aval
    if getattr(aval, "has_qdd", False):
        aval = core.AvalQDD(aval, var.initial_qdd)
    return aval


def with_result_paths(dbg: Any, paths: tuple[str, ...]) -> Any:
    """Debug info ``dbg`` with its result paths resolved (JAX 0.7 requires them in ``to_jaxpr``)."""
    return dbg._replace(result_paths=paths)


def with_arity(dbg: Any, n_in: int, n_out: int | None = None) -> Any:
    """Debug info ``dbg`` for a function of ``n_in`` arguments (names kept where they
    fit: JAX checks their count) and, given ``n_out``, as many unnamed results."""
    if dbg.arg_names is None or len(dbg.arg_names) != n_in:
        dbg = _unnamed(dbg, arg_names=n_in)
    return dbg if n_out is None else _unnamed(dbg, result_paths=n_out)


def as_traced(traced: jax.stages.Traced, cls: type) -> jax.stages.Traced:
    """``traced`` as an instance of ``cls``, a subclass of ``jax.stages.Traced``.

    ``jax.stages.Traced`` has no public constructor, and its fields differ
    between versions; a copy of every slot (and of ``__dict__``, where the
    class has one) carries whatever this JAX keeps.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> class Mine(jax.stages.Traced):
      ...     __slots__ = ()
      >>> t = as_traced(jax.jit(jnp.sin).trace(1.0), Mine)
      >>> type(t).__name__, t.lower().compile()(0.0)
      ('Mine', Array(0., dtype=float32, weak_type=True))
    """
    new = object.__new__(cls)
    for klass in type(traced).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(traced, name):
                setattr(new, name, getattr(traced, name))
    if hasattr(traced, "__dict__"):
        new.__dict__.update(traced.__dict__)
    return new


def lowering_for_export(lower_kwargs: dict) -> bool:
    """Whether ``Traced.lower(**lower_kwargs)`` is ``jax.export`` lowering the trace."""
    return bool(getattr(lower_kwargs.get("_private_parameters"), "for_export", False))
