"""Every JAX internal pejit uses, and every difference between the JAX versions it supports.

The rest of pejit reads JAX through the public API and the names exported
here (``from .. import _compat``; ``_compat.X``), never ``jax._src`` or
``jax.interpreters``, and never tells versions apart itself:
tests/test_architecture.py checks both. A JAX upgrade is then a change of
this package: when an internal moves, its import is fixed in
``_internals``; when a behaviour changes, the module for the job absorbs it.
Supported: JAX 0.7.0 to 0.12.x (CI runs 0.7.0, 0.10.2 and the newest
release). JAX 0.6 is out of reach: its ``DynamicJaxprTracer`` does not
carry the ``Var`` by which the folding policy identifies lazy values.

The modules, each saying which internals it uses, why no public API does
the job, and where versions differ:

* ``_versions``: which JAX and jaxlib this is, and the ``ImportError`` for
  a JAX pejit cannot run on.
* ``_internals``: the imports of JAX's internal modules, and the check at
  import that every internal pejit needs is there (``_probe``).
* ``_tracing``: traces, tracers and evaluation contexts, what the staging
  trace (:mod:`pejit._fold._staging`) is built on.
* ``_jaxprs``: building jaxprs (variables, equations, literals, debug
  info), and jaxprs with folded constants.
* ``_loops``: ``scan``'s parameters, read and rebuilt.
* ``_rules``: JAX's primitives pejit names, and the rule tables it reads
  or extends (lowering, differentiation).
* ``_jit``: what the call path takes from ``jax.jit``'s: checks, dispatch
  state, staged objects, traceback filtering.

Imports: no other stage of pejit; JAX only.
"""

from ._versions import JAX_VERSION as JAX_VERSION
from ._versions import JAXLIB_HAS_YNN_FUSION as JAXLIB_HAS_YNN_FUSION
from ._versions import JAXLIB_VERSION as JAXLIB_VERSION
from ._versions import SUPPORTED_JAX as SUPPORTED_JAX
from ._internals import _probe as _probe
from ._tracing import CONVERT_CODE as CONVERT_CODE
from ._tracing import IS_CONCRETE_CODE as IS_CONCRETE_CODE
from ._tracing import TRACE as TRACE
from ._tracing import DynamicJaxprTrace as DynamicJaxprTrace
from ._tracing import DynamicJaxprTracer as DynamicJaxprTracer
from ._tracing import JaxprTrace as JaxprTrace
from ._tracing import Tracer as Tracer
from ._tracing import abstract_eval as abstract_eval
from ._tracing import at_top_level as at_top_level
from ._tracing import bind_outside as bind_outside
from ._tracing import canonicalize_value as canonicalize_value
from ._tracing import const_of as const_of
from ._tracing import core_trace as core_trace
from ._tracing import current_source_info as current_source_info
from ._tracing import eager_constant_folding as eager_constant_folding
from ._tracing import ensure_no_leaks as ensure_no_leaks
from ._tracing import eval_trace as eval_trace
from ._tracing import evaluating as evaluating
from ._tracing import primitive_effects as primitive_effects
from ._tracing import reset_name_stack as reset_name_stack
from ._tracing import set_current_trace as set_current_trace
from ._tracing import staged_jaxpr as staged_jaxpr
from ._tracing import trace_of as trace_of
from ._tracing import typeof as typeof
from ._tracing import var_aval as var_aval
from ._tracing import weakly_typed as weakly_typed
from ._tracing import wrap_init as wrap_init
from ._jaxprs import ClosedJaxpr as ClosedJaxpr
from ._jaxprs import Jaxpr as Jaxpr
from ._jaxprs import Literal as Literal
from ._jaxprs import ShapedArray as ShapedArray
from ._jaxprs import Token as Token
from ._jaxprs import Var as Var
from ._jaxprs import close_jaxpr as close_jaxpr
from ._jaxprs import convert_constvars_jaxpr as convert_constvars_jaxpr
from ._jaxprs import dce_jaxpr as dce_jaxpr
from ._jaxprs import debug_info as debug_info
from ._jaxprs import drop_var as drop_var
from ._jaxprs import eval_jaxpr as eval_jaxpr
from ._jaxprs import literal as literal
from ._jaxprs import move_binders_to_back as move_binders_to_back
from ._jaxprs import new_jaxpr_eqn as new_jaxpr_eqn
from ._jaxprs import new_var as new_var
from ._jaxprs import no_effects as no_effects
from ._jaxprs import open_jaxpr as open_jaxpr
from ._jaxprs import partial_eval_jaxpr_nounits_fwd as partial_eval_jaxpr_nounits_fwd
from ._jaxprs import stages_whole as stages_whole
from ._jaxprs import trace_to_jaxpr_dynamic as trace_to_jaxpr_dynamic
from ._jaxprs import unnamed_debug_info as unnamed_debug_info
from ._jaxprs import with_arity as with_arity
from ._jaxprs import with_invars as with_invars
from ._jaxprs import with_outvars as with_outvars
from ._jaxprs import with_result_paths as with_result_paths
from ._loops import ScanParams as ScanParams
from ._rules import BWD_RETURNS_LOGS as BWD_RETURNS_LOGS
from ._rules import Zero as Zero
from ._rules import cotangent_aval as cotangent_aval
from ._rules import custom_lin_p as custom_lin_p
from ._rules import has_lowering as has_lowering
from ._rules import jit_inlines as jit_inlines
from ._rules import jit_p as jit_p
from ._rules import lower_as as lower_as
from ._rules import primitive_jvps as primitive_jvps
from ._rules import remat_p as remat_p
from ._rules import split_p as split_p
from ._rules import stack_p as stack_p
from ._rules import unstack_p as unstack_p
from ._jit import AXIS_ENV as AXIS_ENV
from ._jit import carry_config as carry_config
from ._jit import DISABLE_JIT as DISABLE_JIT
from ._jit import NO_AXES as NO_AXES
from ._jit import TRACED_IS_CALLABLE as TRACED_IS_CALLABLE
from ._jit import ArrayImpl as ArrayImpl
from ._jit import api_boundary as api_boundary
from ._jit import as_traced as as_traced
from ._jit import axis_env_key as axis_env_key
from ._jit import check_callable as check_callable
from ._jit import fun_name as fun_name
from ._jit import lowering_for_export as lowering_for_export
from ._jit import register_exclusion as register_exclusion
