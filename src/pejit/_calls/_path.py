"""The call path of a pejit function: :class:`CallPath`, and :func:`make_path`, which chooses it.

A call goes, in order: to its argument *layout* (where the constants are
for its number of positional arguments, with the layout's generated
dispatcher, :mod:`pejit._calls._dispatch`); to its
:class:`~pejit._calls._keys.CallKey`; to the cache
(:class:`~pejit._calls._cache.Caches`), which on a miss asks the specializer
(:mod:`pejit._calls._specializer`) and checks what it folded
(:mod:`pejit._calls._errors`); and to the run: the specialization's
residual, or, under a transformation, pejit's derivative rule
(:mod:`pejit._calls._derivatives`). A specialization that its constants
select alone becomes the dispatchers' memo, so that the next such call stays
in the generated frame. Two calls run the function unfolded, as ``jax.jit``
would: one whose constant is a tracer of an outer transformation (there is
no value to fold; a warning says so, once), and one of a function closing
over a tracer.

The staged API (``lower``, ``trace``, ``eval_shape``, ``specialize``) is the
path's, on the same lookup. The API's objects are thin over a path:
``Pejitted`` is one and its options, the TFC form binds a path's constants
in a dispatcher of its own, ``constant_argnums="auto"`` keeps a path per set
of promoted arguments, and ``explain`` and ``export_folded`` ask a path for
its specialization. A function without constant arguments has a
:class:`~pejit._calls._passthrough.JitPath`, ``jax.jit`` itself, with the
same interface: :func:`make_path` chooses once, and no method asks again.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

import jax

from .. import _compat
from .._fold._room import with_room
from .._fold._staging import ClosedOverTracer, StagingTrace, specializing
from . import _beside, _errors
from ._cache import CacheInfo, Caches
from ._derivatives import jvp_of, traced_call
from ._dispatch import Layout, dispatcher, memo
from ._info import PejitInfo, jit_options, parse_pejit_arguments, positions, split_call
from ._keys import CallKey, TracedConstant, constant_key, constants_key, is_array, types_key, watched
from ._passthrough import JitPath
from ._program import OtherSignature, Specialization, jit_kwargs_for
from ._specializer import specialize
from ._stages import Lowered, Traced

#: Misses after which most calls missing is worth a warning (see ``CallPath._check_respecializing``).
RESPECIALIZING_AFTER = 16

#: The hints a function is given once each (see :mod:`pejit._calls._errors`).
HINTS = ("writable", "nothing", "respecializing")


def make_path(fun: Callable, options: Mapping[str, Any], *, quiet: tuple[str, ...] = (),
              publish: Callable[[Callable], None] | None = None) -> CallPath | JitPath:
    """The call path of ``pejit(fun, **options)`` (of ``pe`` with ``jit=False``), every option checked.

    ``jax.jit`` checks its own options as it is built: where any are given,
    ``jax.jit`` of ``fun`` is built first, so that its errors for them are the
    ones the user sees (for the function itself, pejit raises the same).
    Without constant arguments it is the call
    (:class:`~pejit._calls._passthrough.JitPath`); with them, it only stages
    constants given without values, and is built when first asked for
    (:meth:`CallPath.staged`): most functions never are, and building it is
    a tenth of a millisecond of their first call.
    ``quiet``: :data:`HINTS` not to give (where a report says them instead).
    ``publish(dispatch)``: told when the path's ``dispatch`` changes, for an
    owner that holds it (a call then costs one attribute lookup, not two).
    """
    jit = options.get("jit", True)
    constants = bool(options.get("constant_argnums") or options.get("constant_argnames"))
    jit_kwargs = jit_options(options)
    jitted = _jax_jit(fun, jit_kwargs, constants) if jit and jit_kwargs else None
    info = parse_pejit_arguments(fun, **options)
    if jit and not info.constants:
        return JitPath(info, jitted or _jax_jit(fun, {}, False))  # its dispatch never changes
    return CallPath(info, jitted, quiet=quiet, publish=publish)


class CallPath:
    """The call path of a function with constant arguments (see the module docstring).

    ``info``: the parsed options; ``caches``: its specializations and
    programs. ``dispatch(*args, **kwargs)`` is the call: the generated
    dispatcher of the first layout called twice (the only one, unless the
    function is called with varying numbers of positional arguments), or,
    until then, :meth:`route`. Calling the path calls it. ``publish``: see
    :func:`make_path`.
    """

    def __init__(self, info: PejitInfo, jitted: Callable | None, *, quiet: tuple[str, ...] = (),
                 of_derivative: bool = False, publish: Callable[[Callable], None] | None = None):
        self.info = info
        self.caches = Caches(info.cache_size, info.cache_bytes)
        self._jitted = jitted  # jax.jit of the function, for constants given without values: see staged
        self._layouts: dict[int, Layout] = {}
        self._lock = threading.RLock()  # the layouts, the warning, the derivative
        self._warned = False
        self._hints = set(quiet)  # given already (see _errors.check_constants/check_folded)
        self._jvp: CallPath | None = None  # the path of its derivative (see _run)
        self._of_derivative = of_derivative  # whether it is another path's _jvp
        self._publish = publish
        # the owner's call, where its constants never change and nobody can write them
        # (the TFC form's): the look then traces as jax.jit closed over them (see specialize)
        self.retrace: Callable[[tuple, dict], Any] | None = None
        self.dispatch = self._routing = _compat.api_boundary(lambda *args, **kwargs: self.route(args, kwargs))

    # A C-level property: calling the path is calling ``dispatch``, no frame of its own.
    __call__ = property(attrgetter("dispatch"))

    # -- calling ----------------------------------------------------------
    def route(self, args: tuple, kwargs: dict):
        """A call, through its layout's dispatcher (and so its memo) if it has one."""
        layout = self._layouts.get(len(args))
        if layout is None:
            return self.uncached(args, kwargs)
        if layout.dispatch is None:  # its second call: worth a dispatcher now
            layout = self._generated(len(args))
        return layout.dispatch(*args, **kwargs)

    @_compat.api_boundary  # an error in the user's function shows no pejit frames
    def uncached(self, args: tuple, kwargs: dict, latest: bool = True):
        """A call the memo did not serve: find (or fold) its specialization, and memoize it.

        Unless ``latest``, the last specialization of its constants is not tried first: the
        caller knows it is of other types (a trace of it for these, see ``retrace``)."""
        if self.info.jit and _compat.DISABLE_JIT.value:
            return self.info.fun(*args, **kwargs)  # as jax.jit does: no trace, no fold
        layout = self.layout(len(args))
        try:
            constants = constants_key(layout.const, self.info.fixed_names, args, kwargs)
        except TracedConstant as e:
            return self._fallback(e, args, kwargs)
        dyn_args, dyn_kwargs = self._dynamic(args, kwargs, layout)
        cache = self.caches.specializations
        axes = _compat.axis_env_key()
        key, spec = (None, None) if axes or not latest else cache.latest(constants)
        if spec is not None:
            spec = self._staged(key, spec, args, kwargs, layout)
            # The last specialization of these constants; jax.jit's dispatch
            # checks the dynamic arguments' types.
            try:
                out = self._run(spec, args, kwargs, layout, dyn_args, dyn_kwargs)
            except OtherSignature:
                cache.several(constants)
            else:
                cache.counts.hits += 1
                self._served(args, kwargs, layout, key, spec, out)
                return out
        key = CallKey(constants, types_key(layout.dyn, args, dyn_kwargs), axes)
        if key in cache:
            return self._specialized(key, args, kwargs, layout, dyn_args, dyn_kwargs)
        # a new specialization: its trace, fold and first compile, with room (see _fold._room)
        return with_room(self._specialized, key, args, kwargs, layout, dyn_args, dyn_kwargs)

    def _specialized(self, key: CallKey, args: tuple, kwargs: dict, layout: Layout, dyn_args: tuple,
                     dyn_kwargs: dict):
        """A call through the specialization of ``key`` (built if missing)."""
        try:
            spec = self._staged(key, self.caches.specialization(key, self._build, args, kwargs, layout), args, kwargs,
                                layout)
        except ClosedOverTracer:
            # As jax.jit traces again inside each outer trace: the function,
            # run under the caller's trace, sees the tracer it closes over
            # (or fails on a leaked one, as jax.jit's call does).
            return self.info.fun(*args, **kwargs)
        out = self._run(spec, args, kwargs, layout, dyn_args, dyn_kwargs)
        self._served(args, kwargs, layout, key, spec, out)
        return out

    def _run(self, spec: Specialization, args: tuple, kwargs: dict, layout: Layout, dyn_args: tuple,
             dyn_kwargs: dict):
        """Run ``spec``'s residual for a call; under a transformation, with pejit's derivative
        rule (see :mod:`pejit._calls._derivatives`). Not inside a fold (the folding trace
        differentiates nothing; the enclosing function's derivative is folded whole), nor
        under partial evaluation (the linearization of a derivative rule only splits its
        known outputs from its tangents), nor for a derivative staged into a jaxpr (the JVP of
        a ``jax.checkpoint`` or a loop body, which JAX partially evaluates as a whole: a
        ``custom_jvp`` call there would keep its outputs unknown), nor for ``pe`` staged into
        a jaxpr: ``jax.make_jaxpr`` of it shows its residual program, as of TFC's ``pe``
        (its derivatives under ``jax.grad`` or ``jax.jacfwd`` still fold). Staged into a
        jaxpr, the residual is ``spec.staged_call``, whose constants the enclosing program
        compiles in; where that is ``jax.jit``'s own program (``spec.jax_jit_in``: the
        fold did not pay, and XLA folds the constants' work as it compiles), it stages as
        ``jax.jit`` closed over them would, with no rule: whatever differentiates the
        enclosing program differentiates it as JAX does, its constants' work folded by
        XLA the same way, and the first call (the TFC form's inlined one) does not trace,
        lower and compile a ``custom_jvp`` call (a millisecond of a small program's)."""
        trace = _compat.TRACE.value
        staged = type(trace) is _compat.DynamicJaxprTrace
        call = spec.staged_call if staged else spec.call
        if (trace is _compat.eval_trace or isinstance(trace, (StagingTrace, _compat.JaxprTrace))
                or not self.info.fold_options.derivatives
                or (staged and (self._of_derivative or not self.info.jit or spec.jax_jit_in))):
            return call(*dyn_args, **dyn_kwargs)
        const_pos, const_kw, _, _ = split_call(self.info, args, kwargs, layout)
        return traced_call(self._derivative(), call, const_pos, const_kw, dyn_args, dyn_kwargs)

    def _derivative(self) -> CallPath:
        """The path of ``jax.jvp`` of this function, its argument 0 (this one's constants
        and statics) constant: this function's derivatives, folded."""
        with self._lock:
            if self._jvp is None:
                jvp = jvp_of(self.info.fun)
                options = {"constant_argnums": 0, "jit": self.info.jit, "fold_options": self.info.fold_options}
                # the hints are about the user's function (given there), not its derivative
                self._jvp = CallPath(parse_pejit_arguments(jvp, **options), None, quiet=HINTS, of_derivative=True)
            return self._jvp

    def _served(self, args: tuple, kwargs: dict, layout: Layout, key: CallKey, spec: Specialization,
                out: Any) -> None:
        """``spec`` gave this call its result ``out``: it becomes the memo, unless a later call
        must come back here: to start the work beside it (:func:`pejit._calls._beside.served`),
        or to put its constants on the device (:meth:`~pejit._calls._program.Specialization.served`)."""
        ready = spec.served()
        if spec.pending is not None and not _beside.served(spec.pending, out):
            return
        if ready:
            self._memoize(args, kwargs, layout, key, spec)

    def _memoize(self, args: tuple, kwargs: dict, layout: Layout, key: CallKey, spec: Specialization) -> None:
        """Make this call's specialization the memo, if the dispatcher can recognize its constants
        (not under named axes, nor given by keyword) and they select it alone."""
        if key.axes or (kwargs and not self.info.fixed_names.isdisjoint(kwargs)):
            return
        cache = self.caches.specializations
        if cache.index.get(key.constants) is not key:
            return  # several specializations of these constants: the full key decides
        info = self.info
        after = not (spec.program.jaxpr.effects or info.donate_nums or info.donate_names)
        cache.touch(key, spec, memo(layout, args, key.constants, spec.call, after))

    def _fallback(self, e: TracedConstant, args: tuple, kwargs: dict):
        """A call with a traced constant: the function, unfolded (a warning says so, once)."""
        what = e.args[0]
        with self._lock:
            warn, self._warned = not self._warned, True
        if warn:
            _errors.skipped_folding(self.info.name, f"argument {what if isinstance(what, int) else repr(what)}")
        return self.info.fun(*args, **kwargs)

    # -- layouts and their dispatchers ------------------------------------
    def layout(self, n: int) -> Layout:
        """The layout of calls with ``n`` positional arguments, made on the first.

        Its dispatcher waits for the second call (:meth:`_generated`): code generation
        is a measurable share of a small program's first call (half a millisecond of
        35), and a function called once never needs it."""
        layout = self._layouts.get(n)
        if layout is None:
            nargs = self.info.nargs
            if nargs is not None and n > nargs:
                raise TypeError(f"{self.info.name}() takes {nargs} positional arguments but {n} were given")
            with self._lock:
                layout = self._layouts.setdefault(n, Layout(*positions(self.info, n)))
        return layout

    def _generated(self, n: int) -> Layout:
        """The layout of calls with ``n`` positional arguments, with its dispatcher; the
        first dispatcher generated becomes the path's ``dispatch``."""
        layout = self.layout(n)
        if layout.dispatch is None:
            dispatch = self._generate(n, layout.const, layout.dyn, self.route, self.uncached)
            with self._lock:
                layout = self._layouts[n]
                if layout.dispatch is None:
                    layout = self._layouts[n] = Layout(layout.const, layout.dyn, dispatch)
                    if self.dispatch is self._routing:  # the first generated
                        self.dispatch = dispatch
                        if self._publish is not None:
                            self._publish(dispatch)
        return layout

    def dispatcher(self, n: int, route: Callable, uncached: Callable | None = None,
                   bound: dict[int, Any] | None = None) -> Callable:
        """Another dispatcher of calls with ``n`` positional arguments, on this path's cache and memo.

        Calls with another number of arguments go to ``route(args, kwargs)``,
        calls its memo does not serve to ``uncached(args, kwargs)`` (this
        path's by default). The TFC form binds its constants (``bound``, see
        :func:`~pejit._calls._dispatch.dispatcher`); ``auto`` sends the calls
        that are not its promoted arguments' back to its watch.
        """
        layout = self.layout(n)
        return self._generate(n, layout.const, layout.dyn, route, uncached or self.uncached, bound)

    def _generate(self, n: int, const: tuple, dyn: tuple, route: Callable, uncached: Callable,
                  bound: dict[int, Any] | None = None) -> Callable:
        fixed_names = self.info.fixed_names if bound is None else frozenset()
        return dispatcher(n, const, dyn, self.caches.fast_path(), route, uncached,
                          _compat.DISABLE_JIT if self.info.jit else None, fixed_names, bound)

    # -- specializing -------------------------------------------------------
    def _lookup(self, args: tuple, kwargs: dict, settle: bool = True) -> tuple[Specialization, Layout]:
        """The specialization of a call (folding on a miss), and its layout. Unless
        ``settle``, a fold that runs beside the first calls is not waited for: the
        specialization is then the program serving them."""
        layout = self.layout(len(args))
        _, dyn_kwargs = self._dynamic(args, kwargs, layout)
        key = CallKey(constants_key(layout.const, self.info.fixed_names, args, kwargs),
                      types_key(layout.dyn, args, dyn_kwargs), _compat.axis_env_key())
        # (a new specialization's trace, with room: see _fold._room)
        spec = self.caches.specialization(key, with_room, self._build, args, kwargs, layout)
        if spec.pending is not None and settle:  # the folded program, not the one serving while it folds
            spec = self._settle(key, spec, args, kwargs, layout)
        return spec, layout

    def _staged(self, key: CallKey, spec: Specialization, args: tuple, kwargs: dict, layout: Layout):
        """``spec``, but where a transformation stages a call while its fold runs beside the
        first calls: the folded program, waited for (the outer program keeps what it stages:
        ``jax.jit``, ``jax.jacfwd`` of the TFC form made a moment before)."""
        if spec.pending is None or _compat.TRACE.value is _compat.eval_trace:
            return spec
        return self._settle(key, spec, args, kwargs, layout)

    def _settle(self, key: CallKey, spec: Specialization, args: tuple, kwargs: dict, layout: Layout):
        """The folded specialization that ``spec`` serves for while its fold runs beside."""
        folded = _beside.settled(spec)
        if folded is None:  # given up or failed: fold here, as without FoldOptions.beside
            self.caches.specializations.discard(key, spec)
            folded = self.caches.specialization(key, with_room, self._build, args, kwargs, layout, False)
        return folded

    def _dynamic(self, args: tuple, kwargs: dict, layout: Layout) -> tuple[tuple, dict]:
        """The arguments of a call that its specialization takes."""
        fixed = self.info.fixed_names
        if not kwargs or not fixed:
            return layout.dynamic(args), kwargs
        return layout.dynamic(args), {k: v for k, v in kwargs.items() if k not in fixed}

    def _build(self, args: tuple, kwargs: dict, layout: Layout, beside: bool = True):
        """A new specialization for this call, the constants it dies with, and its bytes.

        With ``beside``, a fold that the look runs beside the call starts on the
        worker (see :mod:`pejit._calls._beside`); the cache swaps it in when ready."""
        info = self.info
        const_pos, const_kw, dyn_args, dyn_kwargs = split_call(info, args, kwargs, layout)
        beside = (beside and info.jit and info.constant_shardings is None and not info.donate_nums
                  and not info.donate_names and _beside.possible())
        with specializing():
            spec = specialize(info, layout, self.caches.programs, const_pos, const_kw, dyn_args, dyn_kwargs,
                              beside=beside, rules_run=self._rules_run(), retrace=self.retrace)
        const_leaves = jax.tree_util.tree_leaves(([v for _, v in const_pos], [v for _, v in const_kw]))
        _errors.check_constants(info.name, const_leaves, self._hints)
        finish = functools.partial(self._finish, layout, const_leaves)
        finish(spec)
        if spec.pending is not None:
            def finish_beside(folded: Specialization) -> None:
                finish(folded)
                _beside.compile_ahead(folded, dyn_args, dyn_kwargs)

            spec.pending = _beside.start(spec.pending, finish_beside, info.name)
        self._check_respecializing()
        return spec, watched(const_leaves), sum(getattr(c, "nbytes", 0) for c in spec.consts)

    def _rules_run(self) -> bool:
        """Whether JAX may run the custom rules inside this path's programs: where it
        differentiates them itself (see :meth:`_run`), not through pejit's rule."""
        return not (self.info.jit and self.info.fold_options.derivatives and not self._of_derivative)

    def _finish(self, layout: Layout, const_leaves: list, spec: Specialization) -> None:
        """What a new specialization needs before it serves: its small constants compiled
        in (:meth:`~pejit._calls._program.Specialization.compile_in`), and the check that
        something folded."""
        if spec.pending is not None:  # (jax.jit's program, serving while the fold runs beside it)
            return
        if self.info.jit and self.info.fold_options.literals:
            spec.compile_in(jit_kwargs_for(self.info, layout, 0))
        _errors.check_folded(self.info.name, spec, const_leaves, self._hints)

    def _check_respecializing(self) -> None:
        """Warn, once, when most calls fold (three in four, after 16 folds): a
        constant argument probably changes on each call."""
        counts = self.caches.specializations.counts
        misses = counts.misses
        most = misses >= RESPECIALIZING_AFTER and 4 * misses >= 3 * (misses + counts.hits)
        if most and "respecializing" not in self._hints:
            self._hints.add("respecializing")
            _errors.respecializing(self.info.name, misses, misses + counts.hits)

    # -- the staged API -------------------------------------------------------
    # A constant given as a type alone (a ``jax.ShapeDtypeStruct``, as
    # ``jax.export`` is usually called, or a tracer) has no value to fold:
    # staging is then ``jax.jit``'s, whose program is right for every value.
    def staged(self) -> Callable:
        """``jax.jit`` of the function, which stages a call whose constants are given
        without values (see :func:`make_path`); built on first use."""
        with self._lock:
            if self._jitted is None:
                self._jitted = _jax_jit(self.info.fun, self.info.jit_options, True)
            return self._jitted

    def specialize(self, args: tuple, kwargs: dict, settle: bool = True) -> Specialization:
        """The specialization a call selects (folding if needed); unless ``settle``, the
        program serving the first calls while the fold runs beside them (see :meth:`_lookup`)."""
        return self._lookup(args, kwargs, settle)[0]

    def lower(self, args: tuple, kwargs: dict, split: Callable | None = None) -> Lowered:
        """The residual program of a call's specialization, lowered, its folded constants bound.

        ``split(args, kwargs)`` maps a call of its compiled form to the
        residual's dynamic arguments; by default, the call is the function's,
        whose constants it checks.
        """
        self.require_jit("lower")
        if self._abstract(args, kwargs):
            return self.staged().lower(*args, **kwargs)
        spec, layout = self._lookup(args, kwargs)
        spec = self._shown(spec, layout)
        dyn_args, dyn_kwargs = self._dynamic(args, kwargs, layout)
        lowered = spec.run.lower(*spec.passed, *dyn_args, **dyn_kwargs)
        return Lowered(lowered, split or self._checker(args, kwargs), spec.passed)

    def trace(self, args: tuple, kwargs: dict) -> Traced:
        """The function traced for a call: the residual of its specialization, in the function's signature."""
        self.require_jit("trace")
        if self._abstract(args, kwargs):
            return self.staged().trace(*args, **kwargs)
        spec, layout = self._lookup(args, kwargs)
        spec = self._shown(spec, layout)
        targs, tkwargs = self._unused(args, kwargs, layout)
        traced = self._residual_jit(spec, layout).trace(*targs, **tkwargs)
        return Traced.of(traced, self._checker(args, kwargs, traced=True), _export_error(self.info.name))

    def eval_shape(self, args: tuple, kwargs: dict):
        """Output shapes and dtypes of a call, as ``jax.eval_shape`` gives them."""
        if self.info.jit and self._abstract(args, kwargs):
            return self.staged().eval_shape(*args, **kwargs)
        spec = self.specialize(args, kwargs)
        outs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                for v in spec.program.jaxpr.outvars]
        return jax.tree_util.tree_unflatten(spec.out_tree, outs)

    def folded(self, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
        """``jax.jit`` of the residual of a call's specialization, a function of its
        dynamic arguments alone, the folded constants closed over; and those arguments.

        Without constant arguments (``pe``), ``jax.jit`` of the function and the call's arguments.
        """
        if not self.info.constants:
            return jax.jit(self.info.fun), args, kwargs
        if self._abstract(args, kwargs):
            raise ValueError(
                f"{self.info.name}: a folded program needs the values of the constant arguments, "
                "not a jax.ShapeDtypeStruct"
            )
        spec, layout = self._lookup(args, kwargs)
        spec = self._shown(spec, layout)
        dyn_args, dyn_kwargs = self._dynamic(args, kwargs, layout)
        return jax.jit(spec.call, **jit_kwargs_for(self.info, layout, 0)), dyn_args, dyn_kwargs

    def _shown(self, spec: Specialization, layout: Layout) -> Specialization:
        """What the staged API shows of ``spec``: the fold asked for, where XLA folds the
        work of the program that serves (``Specialization.shown``), its constants
        compiled in as a call's would be."""
        if spec.shown is None:
            return spec
        folded = spec.shown()
        if self.info.fold_options.literals:  # (once: compile_in then finds it done)
            folded.compile_in(jit_kwargs_for(self.info, layout, 0))
        return folded

    def require_jit(self, what: str) -> None:
        """Raise for staging (``what``) a function that ``pe`` made: it does not compile."""
        if not self.info.jit:
            raise AttributeError(f"{what}() needs a compiled function: use pejit, not pe")

    def _residual_jit(self, spec: Specialization, layout: Layout) -> Callable:
        """``jax.jit`` of the function with the residual of ``spec`` as its body:
        the constant (and static) arguments unused, the folded constants closed over.

        Static arguments are unused inputs too (not ``jax.jit``'s static
        ones): the specialization already depends on their values.
        """
        dynamic = self._dynamic

        @functools.wraps(self.info.fun)  # its name (the module is jit_<name>) and argument names
        def residual(*args, **kwargs):
            dyn_args, dyn_kwargs = dynamic(args, kwargs, layout)
            return spec.call(*dyn_args, **dyn_kwargs)

        skip = {"static_argnums", "static_argnames"}
        return jax.jit(residual, **{k: v for k, v in self.info.jit_options.items() if k not in skip})

    def _unused(self, args: tuple, kwargs: dict, layout: Layout) -> tuple[tuple, dict]:
        """A call's arguments as its trace takes them: the constant and static
        ones keep their array leaves (unused inputs); other leaves become None."""

        def arrays(value):
            return jax.tree_util.tree_map(lambda leaf: leaf if is_array(leaf) else None, value)

        fixed, names = set(layout.const), self.info.fixed_names
        return (tuple(arrays(a) if i in fixed else a for i, a in enumerate(args)),
                {k: arrays(v) if k in names else v for k, v in kwargs.items()})

    def _abstract(self, args: tuple, kwargs: dict) -> bool:
        """Whether a constant (or static) argument is a type without a value."""
        layout = self.layout(len(args))
        fixed = [args[i] for i in layout.const] + [v for k, v in kwargs.items() if k in self.info.fixed_names]
        leaves = jax.tree_util.tree_leaves(fixed)
        return any(isinstance(leaf, (jax.ShapeDtypeStruct, _compat.Tracer)) for leaf in leaves)

    def _checker(self, args: tuple, kwargs: dict, traced: bool = False) -> Callable:
        """Split a call of a staged object, checking its constants: into its
        dynamic arguments, or (``traced``) the arguments of its trace."""
        const_pos, const_kw, _, _ = split_call(self.info, args, kwargs, self.layout(len(args)))
        expected = [constant_key(i, v) for i, v in const_pos] + [constant_key(k, v) for k, v in const_kw]

        def split(call_args, call_kwargs):
            layout = self.layout(len(call_args))
            c_pos, c_kw, dyn_args, dyn_kwargs = split_call(self.info, call_args, call_kwargs, layout)
            got = [constant_key(i, v) for i, v in c_pos] + [constant_key(k, v) for k, v in c_kw]
            if got != expected:
                raise ValueError(
                    "this compiled function was specialized for other constant "
                    "values; lower and compile again for the new ones"
                )
            if traced:
                return self._unused(call_args, call_kwargs, layout)
            return dyn_args, dyn_kwargs

        return split

    # -- the cache ----------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        return self.caches.info()

    def clear_cache(self) -> None:
        """Drop every specialization and program; ``jax.jit``'s caches of the function too."""
        self.caches.clear()
        if self._jitted is not None:
            self._jitted.clear_cache()

    def cache_size(self) -> int:
        """The specializations held."""
        return self.caches.info().currsize

    def __repr__(self) -> str:
        kind = "pejit" if self.info.jit else "pe"
        try:
            return f"<{kind} function of {self.info.fun!r}>"
        except Exception:  # noqa: BLE001 -- as jax.jit's: a repr that fails is left out
            return f"<{kind} function>"


def _jax_jit(fun: Callable, jit_kwargs: Mapping[str, Any], constants: bool) -> Callable:
    """``jax.jit(fun, **jit_kwargs)``.

    With ``constants`` it checks the options and stages; then a function
    that cannot be weakly referenced is wrapped in a ``functools.partial``,
    as jaxlib (0.10 to 0.12 at least) may crash when a ``jax.jit`` object of
    such a function is freed. Without constants it is the call, ``jax.jit``'s
    own (which rejects such a function when called).
    """
    if constants and callable(fun):
        try:
            weakref.ref(fun)
        except TypeError:
            fun = functools.partial(fun)
    return jax.jit(fun, **jit_kwargs)


def _export_error(name: str) -> str:
    return (
        f"jax.export of {name}: its trace folds the values of its constant arguments, so the exported "
        "program would be right for those values only. Export the folded program, specialized to these "
        "constants and taking the dynamic arguments alone, with pejit.export_folded(f)(*args); or give "
        "the constant arguments as jax.ShapeDtypeStruct to export the unfolded function, right for "
        "every value, as jax.jit's"
    )
