"""Look before folding: whether a call's fold can pay, judged from ``jax.jit``'s own trace.

A fold costs a trace of the program under the folding policy, the
evaluation of its known work, and a folding program; a user who swaps
``jax.jit`` for pejit pays that on every program, whether or not anything
worth keeping folds. So a specialization starts as ``jax.jit`` starts: it
traces the function with the constant arrays abstract, to a jaxpr that
takes them as its leading inputs (:func:`trace`), and asks the cost model
what folding them would save per call (:func:`pejit._fold._known.known_work`,
and whether a region affine in the dynamic inputs would collapse:
:func:`pejit._residual._collapse.collapsible`) before any constant work is
evaluated or any folding program compiled (:func:`look`).

Where the fold cannot pay, the specialization runs that jaxpr with the
constants as arguments (:func:`pejit._calls._specializer.unfolded_program`):
the call costs ``jax.jit``'s trace and compile, and its report says why.
Where it can, the fold replays the jaxpr rather than tracing the function's
Python again. A trace that needs constant values (Python control flow on
them) has no jaxpr: only a fold with concrete constants runs such a
function (:class:`~pejit._calls._program.PerValue`), and nothing is left to
decide.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Container, Sequence
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr

from .. import _compat
from .._fold import _cost, _device, _gc, _host, _known, _offload
from .._fold._nonzero import GuardedDivisions
from .._fold._options import FoldOptions
from .._fold._primitives import all_eqns, called_jaxpr, folds_alike
from .._fold._staging import ClosedOverTracer
from .._fold._stats import noting
from .._fold._values import bools_are_0_or_1, nbytes
from .._residual._collapse import collapsible
from ._keys import OtherSignature, is_array
from ._program import PerValue, evaluates_no_tracer, why_per_value


@dataclasses.dataclass(frozen=True)
class Traced:
    """The function traced as ``jax.jit`` traces it: ``jaxpr`` takes the constant array
    leaves, then the dynamic leaves; ``out_tree`` is its output's structure. ``run`` is
    the ``jax.jit`` function that traced it, ``run(*constant arrays, *dynamic arguments,
    **dynamic keywords)``, or ``run(*dynamic arguments, **dynamic keywords)`` where it
    traced it ``closed`` over the constant arrays (see ``trace``'s ``retrace``): called
    for these types, it compiles ``jaxpr`` without tracing the function again
    (``jax.jit`` keeps its trace)."""

    jaxpr: ClosedJaxpr
    out_tree: Any
    arrays: int  # how many leading inputs are constant arrays
    run: Callable
    notes: tuple = ()  # what the trace noted for the report (``_stats.note``): a fold of it replays no Python
    closed: bool = False


def trace(bind: Callable, const_leaves: list, const_tree, in_tree, avals: Sequence[Any],
          jit_kwargs: dict | None = None, dynamic: tuple | None = None, name: str = "plain",
          signature: inspect.Signature | None = None,
          retrace: Callable[[tuple, dict], Any] | None = None) -> Traced | PerValue:
    """The function (``bind(const_vals, in_tree, out_trees)``, a function of the flat
    dynamic leaves) traced by ``jax.jit`` (with ``jit_kwargs``) with its constant arrays
    abstract, or why each value must be traced concretely (the trace needs their values).
    ``dynamic``, the call's ``(dyn_args, dyn_kwargs)``: traced as given (``jax.jit`` keeps
    a trace by what it is given, a NumPy array as such), else of the types ``avals``.
    ``name`` and ``signature`` (the constant arrays' parameters, then the dynamic ones:
    :func:`~pejit._calls._argnums.runner_signature`) name the program and its arguments,
    as the user's function names them under ``jax.jit``.

    With ``retrace`` (constants that never change: the TFC form's, :func:`closable`), the
    function is traced as ``jax.jit`` closed over the constant arrays traces it, the arrays
    becoming the jaxpr's constants, which ``Traced.jaxpr`` then takes as its leading
    inputs again (:func:`_constants_as_inputs`): the decisions and the fold see the
    program they see otherwise, and where the constants are compiled in, that
    ``jax.jit`` function is the program (``Traced.closed``), its trace this one,
    so that the first call traces the function once, as ``jax.jit``'s does. A trace
    of it for other dynamic types (a call with new shapes) is
    ``retrace(dyn_args, dyn_kwargs)``, the owner's call, which specializes for them.

    Any failure counts, since JAX reports a missing value in many ways
    (``ConcretizationTypeError``, but also ``TypeError`` for shapes and
    ``IndexError`` for slices) and so may user code checking values; the
    concrete trace then raises the function's real errors. So does a program
    that :func:`~pejit._calls._program.why_per_value` rejects (a custom rule or
    callback closing over a constant would see the trace's tracer).
    """
    is_arrays = [is_array(leaf) for leaf in const_leaves]
    arrays = [leaf for leaf, a in zip(const_leaves, is_arrays) if a]
    statics = [None if a else leaf for leaf, a in zip(const_leaves, is_arrays)]
    out_trees: list = []
    traces: list = []
    passed = len(arrays) if retrace is None else 0  # else closed over

    types = [_type(a) for a in avals]

    def plain(*args, **kwargs):
        traces[:] = [weakref.ref(_compat.core_trace())]
        leaves, tree = jax.tree_util.tree_flatten((args[passed:], kwargs))
        if tree != in_tree or [_type(jax.typeof(leaf)) for leaf in leaves] != types:
            if retrace is not None:
                return retrace(args, kwargs)
            raise OtherSignature(f"this program was traced for dynamic arguments of structure {in_tree}, "
                                 f"called with {tree}: call the pejit function, which specializes again")
        it = iter(arrays if retrace is not None else args[:passed])
        vals = jax.tree_util.tree_unflatten(const_tree, [next(it) if a else s for s, a in zip(statics, is_arrays)])
        out_trees.clear()  # (one per trace: jax.disable_jit calls it on every call)
        outs = bind(vals, in_tree, out_trees)(*leaves)
        return jax.tree_util.tree_unflatten(out_trees[-1], outs)

    plain.__name__ = plain.__qualname__ = name
    if signature is not None:
        plain.__signature__ = signature
    run = jax.jit(plain, **(jit_kwargs or {}))
    try:
        if dynamic is None:
            dynamic = jax.tree_util.tree_unflatten(in_tree, [_struct(a) for a in avals])
        mark = _gc.collections()
        with noting([]) as notes:
            traced = run.trace(*arrays[:passed], *dynamic[0], **dynamic[1])
    except ClosedOverTracer:  # no value would help
        raise
    except Exception as e:  # noqa: BLE001 -- see above
        first_line = (str(e).splitlines() or [""])[0]
        return PerValue(f"the trace needs constant values ({type(e).__name__}: {first_line[:120]})")
    closed = traced.jaxpr
    jaxpr = closed if retrace is None else _constants_as_inputs(closed, arrays)
    traced = Traced(jaxpr, out_trees[-1], len(arrays), run, tuple(notes), retrace is not None)
    reason = why_per_value(closed.jaxpr, traces, mark)
    if reason is not None:  # jax.jit's program still serves while a value folds beside it
        return PerValue(reason, traced if evaluates_no_tracer(closed.jaxpr) else None)
    return traced


def closable(arrays: Sequence[Any]) -> bool:
    """Whether ``trace`` can close over the constant ``arrays``: ``jax.Array``s, which JAX makes
    the jaxpr's constants as they are (a NumPy array becomes a constant of its own)."""
    return all(isinstance(a, jax.Array) and not isinstance(a, _compat.Tracer) for a in arrays)


def _constants_as_inputs(closed: ClosedJaxpr, arrays: Sequence[Any]) -> ClosedJaxpr:
    """``closed``, traced closed over ``arrays``, with them as its leading inputs again, in
    order: the jaxpr a trace with them abstract gives (the program's own constants kept).

    JAX makes each array a function closes over one of the jaxpr's constants (0.7 to
    0.12 at least), the same array once; an array nothing reads, or a second of the same,
    is an input nothing reads, as in a trace that passes it."""
    jaxpr, consts = _compat.open_jaxpr(closed)
    var_of = {id(c): v for v, c in zip(jaxpr.invars, consts)}
    leading = [var_of.pop(id(a), None) or _compat.new_var(_compat.typeof(a)) for a in arrays]
    kept = [(v, c) for v, c in zip(jaxpr.invars, consts) if var_of.get(id(c)) is v]
    invars = [v for v, _ in kept] + leading + jaxpr.invars[len(consts):]
    return _compat.close_jaxpr(_compat.with_invars(jaxpr, invars), [c for _, c in kept])


def _struct(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _type(aval) -> tuple:
    return aval.shape, aval.dtype, getattr(aval, "weak_type", False)


@dataclasses.dataclass(frozen=True)
class Look:
    """What a look at a traced function found: its known ``work``, whether folding
    it ``pays``, and whether ``jax.jit``'s program with the constants compiled in
    folds it for less (``compile_in``, see :func:`look`)."""

    traced: Traced
    work: _known.KnownWork
    pays: bool
    compile_in: bool = False
    beside: bool = False  # the fold runs beside jax.jit's first call (FoldOptions.beside)
    guarded: Container = ()  # its integer divisions that cannot divide by zero (GuardedDivisions)


def look(traced: Traced, arrays: Sequence[Any], options: FoldOptions, jitted: bool = True) -> Look:
    """Whether folding the constants of ``traced`` (``arrays``, their values) can pay
    per call, and whether compiling them into ``jax.jit``'s program folds it for less
    (``Look.compile_in``).

    Unless ``jitted`` (``pe``, whose residual runs equation by equation), any
    known equation pays: each is a dispatch a call saves. A compiled program
    can fold where the known work saves enough of a call
    (:meth:`pejit._fold._known.KnownWork.pays`, at ``FoldOptions.min_gain``) or a
    region affine in the dynamic inputs would collapse. Some programs are folded
    whatever the estimate says: one whose known work includes a primitive that
    cannot be compiled (it must be evaluated), and one that calls custom rules on
    constants (their Python, which the estimate cannot read, may hold the work:
    a derivative's backward rule, say), and one whose fold a rule needs
    (:data:`pejit._fold._known.needed_rules`) or whose work on literals XLA would
    fold otherwise than its kernels compute it (``KnownWork.needed``).

    Where the known work is small, of primitives that XLA's constant folding
    computes as its kernels do (to the same bits, or elementwise functions of
    floats to within a few ulps: :func:`pejit._fold._primitives.folds_alike`; an
    integer division only where its divisor cannot be zero), on
    constants small enough to compile in (no bool among them holding a byte other
    than 0 or 1, which a literal would make 1:
    :func:`pejit._fold._values.bools_are_0_or_1`), and no fold that pays would
    rewrite the program around them (``KnownWork.rewrites``), the first value is
    compiled with them in instead (``compile_in``), as ``jax.jit`` compiles the
    arrays a function closes over: XLA folds that work as it compiles, with no
    folding trace and no folding program, and a call passes no constants. Where
    the fold does not pay, sums and products of floats are left to XLA too, which
    adds them in its own order: what ``jax.jit`` gives for arrays a function closes
    over, whose program runs faster than one passed them.

    Where the fold pays but would cost the first call more than the compile it
    saves (:func:`pejit._fold._cost.fold_first`), it runs beside ``jax.jit``'s
    first call (``Look.beside``, ``FoldOptions.beside``): not for a program with
    effects, which must run once, in order.
    """
    jaxpr, consts = _compat.open_jaxpr(traced.jaxpr)  # what the traced program closes over, known too
    n = len(consts) + traced.arrays
    known = [i < n for i in range(len(jaxpr.invars))]
    work = _known.known_work(jaxpr, known, lazy=options.rematerialize, ratio=options.expansion_ratio,
                             min_bytes=options.expansion_min_bytes)
    pays = not options.min_gain or work.pays(options.min_gain) or (not jitted and bool(work.folded))
    constants = [v.aval for v in jaxpr.invars[:n]]
    guarded = GuardedDivisions(jaxpr)
    compile_in = (jitted and options.literals and bool(options.min_gain)
                  and not (pays and work.rewrites) and folds_alike(work.folded, not pays, guarded)
                  and _cost.compiling_in_folds(work.saved, sum(map(nbytes, constants)))
                  and bools_are_0_or_1([*consts, *arrays]))
    # asked only where it changes the decision: its walks (an affine region's search above
    # all) are a whole pass over a large program that folds anyway
    if (compile_in or not pays) and _folded_anyway(jaxpr, n, work, options):
        return Look(traced, work, True, False, guarded=guarded)
    beside = (jitted and options.beside and pays and not compile_in and not traced.jaxpr.effects
              and not _fold_first(jaxpr, len(consts), n, work) and _lowerable(jaxpr))
    return Look(traced, work, pays, compile_in, beside, guarded)


def _fold_first(jaxpr, first: int, n: int, work: _known.KnownWork) -> bool:
    """Whether the first call should wait for the fold of ``work`` (:func:`pejit._fold._cost.fold_first`),
    the constant arguments being inputs ``first`` to ``n`` of ``jaxpr``."""
    general = _general_products(jaxpr, set(jaxpr.invars[first:n]))
    return _cost.fold_first(work.folded, functools.partial(_compiles_to_fold, general))


def _compiles_to_fold(general: set[int], eqn) -> bool:
    """Whether the fold compiles a program for ``eqn`` on the folding thread: not where
    NumPy computes it on the host, nor a kernel compiled beside the trace.

    The host computes a matrix product only by an identity or by zeros (``jax.jacfwd``
    pushes its basis, a constant of the program, through products): a product of two
    values of the constant arguments (``general``: ``matrix_power``) is XLA's."""
    prim, params = eqn.primitive, eqn.params
    if _device.host_computes() and _host.covers_equation(prim, params) and id(eqn) not in general:
        return False
    return not _offload.worth_a_kernel(prim, params, sum(nbytes(v.aval) for v in eqn.outvars))


def _general_products(jaxpr, arguments: set) -> set[int]:
    """The ``id`` of each matrix product of ``jaxpr`` (open; calls' bodies too) whose
    operands both depend on ``arguments``."""
    general, depends = set(), set(arguments)
    for e in jaxpr.eqns:
        reads = [isinstance(v, _compat.Var) and v in depends for v in e.invars]
        body = called_jaxpr(e.primitive, e.params)
        if body is not None:
            general |= _general_products(body, {v for v, r in zip(body.invars, reads) if r})
        elif e.primitive.name == "dot_general" and all(reads):
            general.add(id(e))
        if any(reads):
            depends.update(e.outvars)
    return general


def _folded_anyway(jaxpr, n: int, work: _known.KnownWork, options: FoldOptions) -> bool:
    """Whether the first ``n`` inputs of ``jaxpr`` are folded by pejit whatever the estimate says."""
    return (bool(work.needed) or not _lowerable(jaxpr) or _calls_rules(jaxpr)
            or options.affine and collapsible(jaxpr, n, options.affine_max_bytes))


def _lowerable(jaxpr) -> bool:
    """Whether every primitive of ``jaxpr`` (its sub-programs' too) compiles on this backend."""
    platform = jax.default_backend()
    return all(_compat.has_lowering(e.primitive, platform) for e in all_eqns(jaxpr))


#: Primitives whose rules are Python functions a jaxpr does not show: a
#: ``custom_lin`` (what differentiating a ``custom_vjp`` call leaves) runs a
#: backward rule, whose work on constants the estimate cannot see.
_OPAQUE = frozenset(["custom_lin"])


def _calls_rules(jaxpr) -> bool:
    return any(e.primitive.name in _OPAQUE for e in all_eqns(jaxpr))


__all__ = ["Look", "Traced", "closable", "look", "trace"]
