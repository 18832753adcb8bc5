"""What a specialization is made of: residual program, folding program, constants.

Specializations of one *structure* of constants (shapes, dtypes, static
values; see :func:`pejit._calls._specializer.specialize`) share a :class:`Program`: the residual
jaxpr, its runner and its executable, and, when tracing did not depend on
constant values, the :class:`FoldingProgram` that maps new constant values
to new folded constants. A :class:`Specialization` adds the folded
constants of one value.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.extend.core import Jaxpr, jaxpr_as_fun

from .. import _compat
from .._fold import _batch, _cost, _gc, _host, _offload
from . import _argnums
from ._dispatch import Layout
from ._info import PejitInfo
from ._keys import OtherSignature, is_key
from .._fold._stats import BatchInfo, FoldStats
from .._fold._primitives import CUSTOM_CALLS, all_eqns, subjaxprs
from .._fold._values import bools_are_0_or_1
from .._reports._report import FoldReport
from .._residual._partial_eval import Residual, SharePlan

_logger = logging.getLogger("pejit")

_tree_flatten = jax.tree_util.tree_flatten
_tree_unflatten = jax.tree_util.tree_unflatten


class Program:
    """What specializations of one structure share: residual program, executables.

    ``folding_program`` is the folding program (constant array leaves in, folded
    constants out) when tracing did not depend on constant values; then a
    new constant value costs one run of it. It is None for a value-dependent
    specialization, which owns its program alone.
    """

    __slots__ = ("jaxpr", "nconsts", "out_tree", "stats", "fallbacks", "run", "folding_program", "compiled_in",
                 "closes_over", "rules_close_over_constants")

    def __init__(
        self, jaxpr, nconsts: int, out_tree, stats: FoldStats, fallbacks: tuple[str, ...], run: Callable,
        folding_program: FoldingProgram | AsGiven | None, closes_over: int = 0,
    ):
        self.jaxpr = jaxpr  # the open residual jaxpr; its first nconsts inputs are the folded constants
        self.nconsts = nconsts
        self.out_tree = out_tree
        self.stats = stats  # what the trace folded, for the reports of its specializations
        self.fallbacks = fallbacks
        # run(*consts[closes_over:], *dyn_args, **dyn_kwargs): the leading ``closes_over``
        # constants are the runner's own (jax.jit's program closes over them: see AsGiven)
        self.run = run
        self.closes_over = closes_over
        self.folding_program = folding_program
        self.compiled_in = False  # a specialization compiled its constants in (see Specialization.compile_in)
        # jax.jit's program of a per-value structure: its custom rules close over
        # constants, inside thunks the jaxpr does not show (see _errors.check_folded)
        self.rules_close_over_constants = False


class FoldingProgram:
    """Constant arrays in, folded constants out: a value-independent fold.

    The first value is folded by evaluating the program's jaxpr equation by
    equation, as folding while tracing would, unless compiling the program
    costs less than compiling its primitives one by one
    (:func:`pejit._fold._cost.one_program_pays`; ``backend``, the fold options'
    back end, may force either). A second value means values do
    change: the program is then compiled once, and each new value costs one
    run of it. One that cannot be compiled (a primitive with only an
    ``impl``) keeps being evaluated equation by equation.

    It is compiled as ``jax.jit`` compiles, whatever its size: XLA's
    optimization level changes rounding (at level 0 XLA:CPU sums a
    transposed array in another order, and contracts ``a * b + c`` and
    ``rsqrt`` differently), so an unoptimized program would fold other
    values than the first value's evaluation and ``jax.jit`` give.
    """

    def __init__(self, traced: jax.stages.Traced, backend: str = "auto"):
        self.traced = traced
        self.backend = backend
        self.compiled: Callable | None = None
        # one without a lowering (a host-built affine matrix) is evaluated
        # for every value, not lowered to find that out
        platform = jax.default_backend()
        self._compilable = all(_compat.has_lowering(e.primitive, platform) for e in traced.jaxpr.eqns)
        # the residual jaxpr taking every folded constant, and which of them
        # it is given (equal and uniform ones are not passed), as planned on
        # the first value; see SharePlan
        self.residual: Jaxpr | None = None
        self.share: SharePlan | None = None

    def run_as_batch(self, *arrays, keep: Callable | None = None, tick: Callable | None = None,
                     kernels: _offload.Kernels | None = None) -> list:
        """Evaluate the program's jaxpr on ``arrays`` without compiling it whole.

        One batch of the folding back end (:func:`pejit._fold._batch.run_jaxpr`):
        op by op or by compiled segments, each intermediate freed after its
        last use; ``keep`` sees each folded constant as it is produced,
        ``tick`` the equations evaluated; ``kernels``, those handed out
        while the program was traced (see :meth:`pejit._fold._offload.Kernels.given`).
        """
        backend = "eager" if self.backend == "compiled" else self.backend
        arrays = as_traced(arrays, self.traced.jaxpr.in_avals)
        segments: list[BatchInfo] = []
        out = _batch.run_jaxpr(self.traced.jaxpr, arrays, backend, keep, tick, segments, kernels)
        for seg in segments:  # where the first value's time goes (the bench's fold breakdown reads these)
            _logger.debug("folding program: first value, %d equations (%s), %.1f MiB written, %.3g s"
                          " (%.3g s compiling)", seg.equations, seg.backend, seg.out_bytes / 2**20, seg.seconds,
                          seg.compile_seconds)
        return out

    def first_value(self, *arrays, one_program: bool, keep: Callable | None = None, tick: Callable | None = None,
                    kernels: _offload.Kernels | None = None) -> list:
        """The folded constants of the first value: by one compiled program (``one_program``,
        as decided before the trace, see ``pejit._calls._specializer.trace_program``), else
        equation by equation (see the class docstring)."""
        if self._compilable and one_program:
            consts = self(*arrays)
            if tick is not None:
                tick(len(self.traced.jaxpr.eqns))
            return consts
        return self.run_as_batch(*arrays, keep=keep, tick=tick, kernels=kernels)

    def __call__(self, *arrays) -> list:
        if self.compiled is None and self._compilable:
            try:
                self.compiled = self.traced.lower().compile()
            except Exception:  # no lowering for some folded primitive
                self._compilable = False
        if self.compiled is None:
            return self.run_as_batch(*arrays)
        return self.compiled(*arrays)


class AsGiven:
    """The folding program of a structure that folds nothing (see
    :func:`pejit._calls._specializer.unfolded_program`): a value's constants are
    passed as they are, after the values the traced program closes over (host
    arrays stay on the host until a specialization is called again, see
    :meth:`Specialization.served`)."""

    share = None  # nothing equal or uniform is left out (see SharePlan)

    def __init__(self, closed_over: Sequence, compile_in: bool = False, folds_alike: bool = True):
        self.closed_over = list(closed_over)
        self.compile_in = compile_in  # the first value's constants are compiled in (XLA folds their work)
        # XLA's constant folding computes the known work as the program's kernels do
        # (pejit._fold._primitives.folds_alike, rounding aside): else the constants may
        # not be compiled in at all (the TFC form's call inlined), which would fold it
        self.folds_alike = folds_alike

    def __call__(self, *arrays) -> list:
        return [*self.closed_over, *arrays]


class PerValue(NamedTuple):
    """Marks a structure whose trace depends on constant values, or whose
    residual cannot serve every value (see :func:`why_per_value`): each value
    is folded by tracing the function again, with concrete constants.
    ``reason`` goes into the report's ``fallbacks``, so that this is never
    silent. ``serves``, where the trace with abstract constants ran: ``jax.jit``'s
    program (a :class:`~pejit._calls._look.Traced`), which can serve first calls
    while the value folds beside them (see :func:`evaluates_no_tracer`)."""

    reason: str
    serves: Any = None


def as_traced(arrays: Sequence, avals: Sequence) -> list:
    """``arrays`` as a program traced for ``avals`` takes them: a float64 NumPy
    constant is float32 when 64-bit mode is off, rounded before anything reads it
    (the host's NumPy computes in an array's own type, and JAX before 0.10 binds
    a replayed jaxpr's inputs as they come)."""
    return [np.asarray(a, aval.dtype) if isinstance(a, (np.ndarray, np.generic)) and a.dtype != aval.dtype else a
            for a, aval in zip(arrays, avals)]


def inlinable(consts: Sequence) -> bool:
    """Whether folded constants (arrays, or their types) are small enough to compile in
    (:func:`pejit._fold._cost.compiled_in`)."""
    return _cost.compiled_in(sum(c.size * c.dtype.itemsize for c in consts))


class Specialization:
    """One specialization: folded constants and the program that uses them.

    What ``Pejitted.specialize`` returns (and what a call runs): ``consts``
    are the folded constants of this value, ``program`` is shared by every
    value of the same structure. ``call(*dyn_args, **dyn_kwargs)`` runs the
    residual program with the folded constants bound; it is a
    ``functools.partial`` of the runner, so that a cached call costs one
    C-level call on top of the runner's own ``jax.jit`` dispatch.
    ``staged_call`` is what a call staged into an enclosing program runs (see
    ``compile_in``). ``residual`` and ``report`` describe it (built on first use).

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import pejit
      >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
      >>> spec = f.specialize(2 * jnp.eye(2), jnp.ones(2))
      >>> spec.call(jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
      >>> [e.primitive.name for e in spec.residual.jaxpr.eqns]
      ['dot_general']
    """

    __slots__ = ("program", "consts", "call", "staged_call", "fold_seconds", "_residual", "pending", "on_host",
                 "shown", "jax_jit_in", "__weakref__")

    def __init__(self, program: Program, consts: list, fold_seconds: float, residual: Residual | None = None,
                 pending: Any = None):
        self.program = program
        self.consts = consts
        self.call = self.staged_call = functools.partial(program.run, *self.passed)
        # the calls served with NumPy constants passed, None where none are (see served)
        self.on_host = 0 if any(isinstance(c, (np.ndarray, np.generic)) for c in self.passed) else None
        self.fold_seconds = fold_seconds
        self._residual = residual
        # jax.jit's program, serving while the fold runs beside it (FoldOptions.beside):
        # before it starts, the fold to run (a function); then its future, whose result is
        # the folded specialization, or None where it was given up (see pejit._calls._beside)
        self.pending = pending
        # the TFC form's jax.jit program with its constants compiled in (XLA folds their
        # work): the fold that lower() and trace() show, as asked, folded when first
        # called (see pejit._calls._specializer.specialize); else None
        self.shown: Callable[[], Specialization] | None = None
        # staged_call is jax.jit's own program, its constants compiled in, that JAX may
        # differentiate (see _constants_in)
        self.jax_jit_in = False

    def served(self) -> bool:
        """A call of this specialization has its result: whether it may serve the next
        ones from the dispatchers' memo (see ``pejit._calls._path.CallPath._served``).

        Not yet where it passes NumPy constants (a structure's first value where the
        fold does not pay: ``jax.jit``'s program with the constants as given): its
        first call passes them as ``jax.jit``'s first call passes its arguments, its
        dispatch transferring them, and its second puts them on the device once, so
        that later calls do not transfer them again. A function called once never
        pays ``jax.device_put``, whose first call in a process costs about a
        millisecond (setting up what ``jax.jit``'s dispatch does not use), a few
        percent of a small program's first call.
        """
        if self.on_host is None:
            return True
        if self.on_host == 0:
            self.on_host = 1
            return False
        self.consts = [_host.to_jax(c) for c in self.consts]
        self.call = self.staged_call = functools.partial(self.program.run, *self.passed)
        self.on_host = None
        return True

    @property
    def passed(self) -> list:
        """The constants the runner is given (not those it closes over itself)."""
        return self.consts[self.program.closes_over:]

    @property
    def jax_jit_closed(self) -> bool:
        """Whether the call is the look's ``jax.jit`` function closed over the constants
        (``_constants_in``), which JAX may stage and differentiate as it is."""
        return self.jax_jit_in and not self.passed

    @property
    def compilable_in(self) -> bool:
        """Whether the folded constants can be compiled into the program: small arrays
        (``pejit._fold._cost.compiled_in``) on one device of this process (NumPy's, a
        program's own ``TypedNdArray`` among them, and typed PRNG keys, which ``jax.jit``
        compiles in as their key data), no bool holding a byte other than 0 or 1
        (``pejit._fold._values.bools_are_0_or_1``), and in ``jax.jit``'s program no
        known work that XLA would fold its own way (``AsGiven.folds_alike``)."""
        as_given = self.program.folding_program
        local = (isinstance(c, np.ndarray) or ((type(c) is _compat.ArrayImpl or is_key(c)) and c.is_fully_addressable
                                               and len(c.sharding.device_set) == 1) for c in self.consts)
        return ((not isinstance(as_given, AsGiven) or as_given.folds_alike) and all(local)
                and inlinable(self.consts) and bools_are_0_or_1(self.consts))

    @property
    def compiles_in(self) -> bool:
        """Whether ``compile_in`` compiles this value's constants in: the structure's
        first value, where they are ``compilable_in``, but not where ``jax.jit``'s own
        program folds nothing (it runs as ``jax.jit`` runs it, the constants passed)."""
        as_given = self.program.folding_program
        return (bool(self.consts) and not self.program.compiled_in
                and not (isinstance(as_given, AsGiven) and not as_given.compile_in) and self.compilable_in)

    def compile_in(self, jit_kwargs: dict) -> None:
        """Call a program with the folded constants compiled in, as ``jax.jit`` compiles
        the arrays a function closes over, where it ``compiles_in``.

        XLA then specializes the program to their values: it folds what
        depends on them, turns gathers at known indices into slices, and
        passes fewer buffers per call (a model that folds to many small
        constants, such as an MJX rollout's, then runs as fast as under
        ``jax.jit`` with the model closed over, and faster than with it
        passed). Each specialization compiles
        a program of its own, as ``jax.jit`` does for each closed-over value:
        only the first value of a structure does, the one a program serves
        until its constants change; later values share ``program.run``, so
        that constants that keep changing cost no compile (the folding
        program's point) and hold no executable each. The first call
        compiles it, the only program the first value compiles (the shared
        one is not compiled ahead for it, see
        `pejit._calls._specializer.runner_ahead`: a large program compiles
        for seconds, and a first call should compile it once, not once per
        variant).
        ``jit_kwargs``: ``jax.jit``'s options for a function of the dynamic
        arguments alone.
        """
        if self.compiles_in:
            self.program.compiled_in = True
            self._constants_in(jit_kwargs)

    def _constants_in(self, jit_kwargs: dict) -> None:
        """Call this value's program with its constants compiled in (see ``compile_in``).

        Staged into an enclosing program (``jax.jit``'s trace of the TFC form's
        call, a user's ``jax.jit`` around the function), they are closed over as
        they are, with no ``jax.jit`` of its own around them where its options are
        a plain one's: the enclosing program compiles them in, and a nested
        program is one more to trace, lower and compile (a few milliseconds of a
        small program's first call). For the same reason ``jax.jit``'s own program
        is spliced in, not called (``inline=True``), in the call-time form's first
        value too; the trace it finds is the look's, which JAX keeps by function,
        whatever ``inline`` says. Staged so (``jax_jit_in``), the call is ``jax.jit``
        closed over the constants, and is differentiated as that is, by JAX (see
        ``pejit._calls._path.CallPath._run``); where the look traced it so (``retrace``:
        :func:`pejit._calls._look.trace`), that function is the call, its trace the look's."""
        if isinstance(self.program.folding_program, AsGiven):  # jax.jit's function, inside: its trace serves
            run, consts = self.program.run, self.passed
            if not jit_kwargs:
                closed, run = run, _spliced(run.__wrapped__)
                # (not where its custom rules close over the look's tracers: JAX must not run them)
                self.jax_jit_in = not self.program.rules_close_over_constants
                if not consts:  # the look traced it closed over them (the TFC form's): it is the call
                    self.call, self.staged_call, self.on_host = closed, run, None
                    return
        else:  # the runner itself, not its jax.jit (whose options are for the outermost jit)
            run, consts = getattr(self.program.run, "__wrapped__", self.program.run), self.consts

        consts = [_copied(c) for c in consts]

        def residual(*args, **kwargs):  # closing over them (jax.jit flattens a partial's arguments)
            return run(*consts, *args, **kwargs)

        residual.__name__ = residual.__qualname__ = getattr(run, "__name__", "residual")
        self.call, self.on_host = jax.jit(residual, **jit_kwargs), None
        self.staged_call = self.call if jit_kwargs else residual

    @property
    def run(self) -> Callable:
        return self.program.run

    @property
    def out_tree(self):
        return self.program.out_tree

    @property
    def residual(self) -> Residual:
        if self._residual is None:
            program = self.program
            closed = _compat.close_jaxpr(program.jaxpr, self.consts)
            report = FoldReport.build(program.stats, closed, self.fold_seconds, fallbacks=program.fallbacks)
            self._residual = Residual(closed, report, program.stats)
        return self._residual

    @property
    def report(self) -> FoldReport:
        return self.residual.report


def _copied(c: Any) -> Any:
    """A NumPy constant ``c`` as a trace may close over it: a copy, in the type JAX gives it.

    JAX keeps the converted copy of a NumPy array that a trace closes over
    (a float64 array where 64-bit mode is off) by the array's identity (jaxlib's
    value canonicalization, 0.10 to 0.12 at least): closed over as given, a user's
    array written after the call would be read stale by every later
    ``jax.device_put`` or ``jnp.asarray`` of it, pejit's own fold of the new value
    among them. (Not a program's own ``TypedNdArray``: JAX's, weak type and all.)"""
    if type(c) is np.ndarray:
        return np.array(c, jax.dtypes.canonicalize_dtype(c.dtype))
    return c


def _spliced(fun: Callable) -> Callable:
    """``jax.jit(fun, inline=True)``, made when first called: only a call staged into an
    enclosing program runs it (a ``jax.jit`` object is tens of microseconds to make)."""
    jitted = functools.cache(lambda: jax.jit(fun, inline=True))
    return functools.wraps(fun)(lambda *args, **kwargs: jitted()(*args, **kwargs))


def why_per_value(jaxpr, traces: Sequence[weakref.ref], mark: int | None = None) -> str | None:
    """Why a residual traced with abstract constants cannot serve every value, or ``None``.

    The folding trace decides as the concrete trace would (an abstract
    constant is a known value; a decision that needs its value fails the
    trace), except in Python code that JAX runs itself:

    * a ``custom_jvp``/``custom_vjp`` function that closes over arrays: JAX
      folds known work on closed-over constants inside it (eagerly) only
      when they are concrete, so the residual would differ;
    * a residual that keeps a tracer of ``traces`` alive (the trace of the
      abstract constants, the folding trace) after they ended: a custom
      rule or a callback closes over a constant, or over a value computed
      from one, and would run on that tracer later, when differentiated or
      called.

    ``mark``, the collector's count when the traces began (:func:`pejit._fold._gc.collections`):
    where it is paused and has not run since, the tracers are all in its youngest
    generation, and only that is searched (not the heap: 10 to 300 ms of a first call).
    """
    name = _closing_custom_call(jaxpr)
    if name is not None:
        return f"the custom_jvp/custom_vjp function {name!r} closes over arrays"
    young = mark is not None and _gc.young_since(mark)
    if _holds_python(jaxpr) and any(_has_live_tracers(t, young) for t in traces):
        return "a custom rule or callback in the residual closes over a constant"
    return None


def evaluates_no_tracer(jaxpr) -> bool:
    """Whether evaluating ``jaxpr`` runs no Python function that reaches a tracer: a custom
    rule runs only where the program is differentiated (or batched), a callback on every
    call (Equinox's checks hold one), and must not close over a constant's tracer."""
    return not any(eqn.primitive.name.endswith("callback") and _reaches_tracer(eqn.params.get("callback"))
                   for eqn in all_eqns(jaxpr))


def _reaches_tracer(obj: Any, budget: int = 5000) -> bool:
    """Whether a tracer is reachable from ``obj`` through closures, defaults, partials and
    objects' attributes (not modules, classes or a function's globals). Searching past
    ``budget`` objects counts as found: the safe answer."""
    seen: set[int] = set()
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, str, bytes, int, float, np.ndarray)):
            continue
        if isinstance(o, _compat.Tracer) or len(seen) > budget:
            return True
        seen.add(id(o))
        if isinstance(o, types.FunctionType):
            stack += [c.cell_contents for c in o.__closure__ or () if c.cell_contents is not o]
            stack += [*(o.__defaults__ or ()), *(o.__kwdefaults__ or {}).values()]
        else:
            stack += gc.get_referents(o)
    return False


def _holds_python(jaxpr) -> bool:
    """Whether an equation of ``jaxpr`` (or of a sub-jaxpr) holds a Python function JAX may
    run later (a custom rule, a callback): only one can reach a tracer of an ended trace,
    and the search for live tracers scans the whole heap (10 ms of a small program's first call)."""
    return any(any(_runs_python(v) for v in eqn.params.values()) for eqn in all_eqns(jaxpr))


def _runs_python(param: Any) -> bool:
    """Whether an equation's parameter is Python that JAX may call: a function or a callable
    object (a rule, a callback, a ``WrappedFun``), not a type nor a context decorator (the
    mesh that every nested ``jax.jit`` records, callable only to decorate a function)."""
    return hasattr(param, "call_wrapped") or (
        callable(param) and not isinstance(param, (type, contextlib.ContextDecorator)))


def _has_live_tracers(trace_ref: weakref.ref, young: bool = False) -> bool:
    """Whether tracers of a trace that ended are still alive (JAX's leak check), searched
    for among the ``young`` objects alone (the collector's youngest generation, where
    all it made are: see :func:`why_per_value`) or on the whole heap."""
    if not _tracers_of(trace_ref, (0,) if young else None):
        return False
    # perhaps they only live in cycles (a young generation's collection moves what it
    # keeps to the next; one that misses an older cycle finds them alive: the safe answer)
    gc.collect(0 if young else 2)
    return _tracers_of(trace_ref, (0, 1) if young else None)


def _tracers_of(trace_ref: weakref.ref, generations: tuple | None) -> bool:
    trace = trace_ref()
    if trace is None:
        return False
    if generations is None:
        return any(isinstance(r, _compat.Tracer) for r in gc.get_referrers(trace))
    return any(isinstance(o, _compat.Tracer) and any(r is trace for r in gc.get_referents(o))
               for g in generations for o in gc.get_objects(generation=g))


def _closing_custom_call(jaxpr) -> str | None:
    """The name of a custom call in ``jaxpr`` (or in its sub-jaxprs) with closed-over inputs."""
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name in CUSTOM_CALLS and eqn.params.get("num_consts", 0):
            body = next(subjaxprs(eqn.params))
            return getattr(getattr(body, "jaxpr", body).debug_info, "func_name", eqn.primitive.name)
    return None


def runner(jaxpr, nconsts: int, out_tree, in_tree=None) -> Callable:
    """``run(*consts, *dyn_args, **dyn_kwargs)`` evaluating an open residual jaxpr.

    ``jaxpr``'s first ``nconsts`` inputs (the folded constants) are leading
    arguments, so they reach XLA as buffers, not as HLO literals; flat rather
    than in one list, which ``jax.jit``'s dispatch would flatten on every call.
    With ``in_tree``, the structure of ``(dyn_args, dyn_kwargs)`` the residual
    was traced for, other structures or leaf types raise :class:`OtherSignature`
    (checked when ``jax.jit`` traces, that is once per new type, not per call).
    """
    fun = jaxpr_as_fun(_compat.close_jaxpr(jaxpr, ()))
    # An output that is a literal (a folded Python scalar) comes back from the
    # interpreter as that scalar; jax.jit would return an array.
    literal_outs = {
        i: jax.device_put(v.val) for i, v in enumerate(jaxpr.outvars) if isinstance(v, _compat.Literal)
    }
    types = [_type(v.aval) for v in jaxpr.invars[nconsts:]]

    def run(*args, **dyn_kwargs):
        leaves, tree = _tree_flatten((args[nconsts:], dyn_kwargs))
        if in_tree is not None and (tree != in_tree or [_type(jax.typeof(leaf)) for leaf in leaves] != types):
            raise OtherSignature(
                f"this residual program was folded for dynamic arguments of types {_types_str(types)} "
                f"(structure {in_tree}); it was called with {_types_str(map(_type, map(jax.typeof, leaves)))} "
                f"(structure {tree}). Call the pejit function, which specializes again"
            )
        outs = fun(*args[:nconsts], *leaves)
        for i, value in literal_outs.items():
            outs[i] = value
        return _tree_unflatten(out_tree, outs)

    return run


def make_runner(info: PejitInfo, layout: Layout, jaxpr, nconsts: int, out_tree, in_tree) -> Callable:
    """The residual's runner (see :func:`~pejit._calls._program.runner`), named after the
    function and jitted with its options unless it is ``pe``'s."""
    run = runner(jaxpr, nconsts, out_tree, in_tree)
    # The user's name in profiles and dumps: the HLO module is jit_<name>;
    # and its parameters' names in jax.jit's messages about the arguments.
    run.__name__ = run.__qualname__ = info.name
    n = len(layout.const) + len(layout.dyn)
    run.__signature__ = _argnums.runner_signature(info.signature, nconsts, n, layout.dyn, info.fixed_names)
    if info.jit:
        run = jax.jit(run, **jit_kwargs_for(info, layout, nconsts))
    return run


def jit_kwargs_for(info: PejitInfo, layout: Layout, nconsts: int) -> dict:
    """``jax.jit`` keywords for the runner ``run(*consts, *dyn_args, **dyn_kwargs)``."""
    nargs = len(layout.const) + len(layout.dyn)
    dyn_index = {i: nconsts + j for j, i in enumerate(layout.dyn)}
    kwargs = dict(info.jit_kwargs)
    donate = [dyn_index[i % nargs] for i in info.donate_nums if -nargs <= i < nargs]
    if donate:
        kwargs["donate_argnums"] = tuple(donate)
    # names the call passes by keyword (the runner's signature takes the others by position)
    donate_names = info.donate_names - _argnums.positional_names(info.signature, nargs)
    if donate_names:
        kwargs["donate_argnames"] = tuple(donate_names)
    in_shardings = kwargs.get("in_shardings")
    if isinstance(in_shardings, (tuple, list)):
        if len(in_shardings) != nargs:
            raise ValueError(
                f"in_shardings has {len(in_shardings)} entries but {info.name} "
                f"was called with {nargs} positional arguments"
            )
        kwargs["in_shardings"] = (*[None] * nconsts, *(in_shardings[i] for i in layout.dyn))
    elif isinstance(in_shardings, jax.sharding.Sharding):
        # One sharding for every argument the user passes; the folded
        # constants keep the placement folding gave them.
        kwargs["in_shardings"] = (*[None] * nconsts, *(in_shardings for _ in layout.dyn))
    return kwargs


def _type(aval) -> tuple:
    """What a residual's input depends on: shape, dtype and weak type (a sharding
    change is ``jax.jit``'s to recompile for, the residual stays right)."""
    return aval.shape, aval.dtype, getattr(aval, "weak_type", False)


def _types_str(types) -> str:
    return "[" + ", ".join(f"{dtype}{list(shape)}{'(weak)' if weak else ''}" for shape, dtype, weak in types) + "]"
