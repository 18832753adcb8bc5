"""The JAX internals pejit uses, imported here and checked at import.

Every ``jax._src`` and ``jax.interpreters`` module pejit reads is imported in
this module, and :func:`_probe` checks that each name taken from them
exists, and that the ``DynamicJaxprTrace`` methods :mod:`pejit._fold._staging`
overrides or calls still take the parameters it passes. A JAX that moved
one then fails at ``import pejit`` with an ``ImportError`` that names it
and the supported versions, not deep inside a trace. When an internal
moves, its import is fixed here; what pejit does with it is in the module
of :mod:`pejit._compat` named for the job.

Public names are used where every supported version has them:
``jax.extend.core`` (``Jaxpr``, ``ClosedJaxpr``, ``Var``, ``Literal``, the
primitives), and from ``jax.interpreters`` what each of them exports in
all (``ad.Zero``, ``ad.primitive_jvps``, ``mlir.register_lowering``,
``mlir.lower_fun``, ``partial_eval.dce_jaxpr``,
``partial_eval.trace_to_jaxpr_dynamic``).
"""

from __future__ import annotations

import inspect

from jax import lax as _lax

from ._versions import missing

try:
    from jax.extend import core as xcore
    from jax.extend.core.primitives import jit_p
    from jax.interpreters import ad as public_ad
    from jax.interpreters import mlir as public_mlir
    from jax.interpreters import partial_eval as public_pe

    from jax._src import api_util
    from jax._src import array
    from jax._src import config
    from jax._src import core
    from jax._src import dtypes
    from jax._src import linear_util as lu
    from jax._src import source_info_util
    from jax._src import util
    from jax._src.interpreters import ad
    from jax._src.interpreters import mlir
    from jax._src.interpreters import partial_eval as pe
except ImportError as e:  # pragma: no cover - only on an unsupported JAX
    raise missing(f"module {e.name}", "import failed") from e

try:  # lax.split's primitive (not in jax.extend)
    from jax._src.lax.lax import split_p
except ImportError:  # pragma: no cover
    split_p = None

# jnp.stack's and lax.unstack's own primitives (JAX 0.10 and newer; before, a concatenate of reshapes)
stack_p = getattr(_lax, "stack_p", None)
unstack_p = getattr(_lax, "unstack_p", None)

try:  # a value's weak type, set without a change of dtype (public lax has no weak_type)
    from jax._src.lax.lax import _convert_element_type as convert_element_type
except ImportError:  # pragma: no cover
    convert_element_type = None

try:  # JAX >= 0.11: scan's parameters are flat trees
    from jax._src import flattree
except ImportError:
    flattree = None

try:  # traceback filtering, as jax.jit does it
    from jax._src.traceback_util import api_boundary
    from jax._src.traceback_util import register_exclusion as hide_from_tracebacks
except ImportError:  # pragma: no cover
    api_boundary = hide_from_tracebacks = None

try:  # jax.checkpoint's primitive: public from JAX 0.8.2
    from jax.extend.core.primitives import remat_p
except ImportError:
    from jax._src.ad_checkpoint import remat_p

#: Internals looked up by attribute: (owner, name, why pejit needs it).
_REQUIRED = [
    (core, "Tracer", "tracer type"),
    (core, "trace_ctx", "the current trace"),
    (core, "set_current_trace", "entering the folding trace"),
    (core, "eval_trace", "evaluating folded work"),
    (core, "ensure_no_leaks", "tracing like make_jaxpr"),
    (core, "eval_jaxpr", "replaying a jaxpr under the folding trace"),
    (core, "typeof", "abstract values"),
    (core, "Primitive", "binding primitives"),
    (core, "new_jaxpr_eqn", "building residual equations"),
    (core, "Var", "new variables"),
    (core, "DropVar", "outputs nobody reads"),
    (core, "ShapedArray", "array types"),
    (core, "Token", "effect tokens"),
    (core, "no_effects", "equations without effects"),
    (core, "is_concrete", "telling a conversion's question from a value's"),
    (core, "to_concrete_value", "telling a conversion's question from a value's"),
    (pe, "DynamicJaxprTrace", "the folding trace's base class"),
    (pe, "DynamicJaxprTracer", "the folding trace's tracers"),
    (pe, "JaxprTrace", "partial evaluation (linearization), which needs no derivative rule"),
    (pe, "convert_constvars_jaxpr", "opening a closed jaxpr"),
    (pe, "partial_eval_jaxpr_nounits_fwd", "splitting loop bodies"),
    (pe, "move_binders_to_back", "splitting loop bodies"),
    (pe, "custom_partial_eval_rules", "whether a loop's condition is unknown, without a trace"),
    (pe, "_cached_abstract_eval", "the fold's abstract evaluation, cached as staging caches it"),
    (config, "eager_constant_folding", "scoping JAX's own folding"),
    (config, "disable_jit", "jax.disable_jit()"),
    (api_util, "debug_info", "debug metadata of the traced function"),
    (api_util, "check_callable", "jax.jit's errors for what is not a function"),
    (util, "fun_name", "jax.jit's name for a function"),
    (core, "get_axis_env", "keying specializations on the named axes"),
    (core, "top_axis_env", "the call hot path's check for named axes"),
    (lu, "wrap_init", "wrapping the traced function"),
    (source_info_util, "current", "source information of staged equations"),
    (source_info_util, "reset_name_stack", "tracing like make_jaxpr"),
    (source_info_util, "register_exclusion", "the user's frames, not pejit's, as the program's source locations"),
    (array, "ArrayImpl", "the hot path's type check"),
    (mlir, "_lowerings", "which primitives can be compiled"),
    (mlir, "_platform_specific_lowerings", "which primitives can be compiled"),
    (ad, "custom_lin_p", "a custom_vjp call's backward rule, as differentiation leaves it"),
    (public_ad, "Zero", "symbolic zero tangents"),
    (public_ad, "primitive_jvps", "derivative rules of primitives"),
    (public_mlir, "register_lowering", "compiling pejit's own primitives"),
    (public_mlir, "lower_fun", "compiling pejit's own primitives"),
    (public_pe, "dce_jaxpr", "dead-code elimination"),
    (public_pe, "trace_to_jaxpr_dynamic", "tracing a custom call's function"),
    (xcore, "ClosedJaxpr", "closed jaxprs"),
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
    trace_class = trace_class or getattr(pe, "DynamicJaxprTrace", None)
    missing_ = [
        f"{getattr(owner, '__name__', owner)}.{name} ({why})"
        for owner, name, why in required
        if not hasattr(owner, name)
    ]
    for name, params in methods.items():
        method = getattr(trace_class, name, None)
        if method is None:
            missing_.append(f"DynamicJaxprTrace.{name}")
            continue
        got = list(inspect.signature(method).parameters)[1:]  # without self
        if got[: len(params)] != params:
            missing_.append(f"DynamicJaxprTrace.{name}({', '.join(params)}), found ({', '.join(got)})")
    if missing_:
        raise missing("; ".join(missing_), "internals moved or changed")


_probe()
