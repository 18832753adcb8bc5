"""Fold rules for ``custom_vjp``/``custom_jvp`` calls with known and unknown inputs,
and for ``custom_linear_solve`` of a known operator.

A call whose inputs are all known is folded whole (``Folder.call_inputs``).
With mixed inputs, the call stays, so its rule keeps governing the
derivatives of the dynamic inputs, but the known work inside it is folded:
the residual keeps a new call of the same kind whose primal function is
the partially evaluated one, taking the folded values (as buffers) and the
unknown inputs. Its rule is the user's, applied to the known inputs'
values:

* ``custom_vjp``: the user's forward and backward rules, run later on the
  known inputs' values (the new call keeps them as inputs for its rules
  alone, where the partially evaluated function no longer reads them:
  Equinox's rules read the matrix they factor). They are not traced here
  (see :func:`fold_custom_vjp`); where JAX runs them under the folding
  trace, their constant work folds (:func:`fold_custom_lin`). Their
  cotangents for the known inputs are dropped (constants).
* ``custom_jvp``: the user's JVP rule, on the known inputs' values with
  zero tangents (``lax.custom_root`` is such a call).

Libraries wrap their solvers in such calls (diffrax's and Equinox's
checkpointed loops, optimistix's implicit differentiation), so this is
where a constant matrix factored in a vector field or residual function
is met. The rules close over no values: a folding program traced with
abstract constants (``pejit._fold._abstract``) can hold such a call.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.custom_derivatives import SymbolicZero

from ... import _compat
from ..._fold._folding import Folder, NeedsValue
from ._hoist import DYNAMIC, hoist, hoist_call
from .products import known_product


#: Whether backward rules return ``(cotangents, logs)`` (JAX 0.12's ``defvjp_with_logs``), not cotangents.
_BWD_LOGS = _compat.BWD_RETURNS_LOGS


def _partial(folder: Folder, fun, args):
    """``fun`` (a flat ``WrappedFun``) traced as JAX traces a custom call's
    function, then its work on the known ``args`` folded.

    Returns ``(body, hoisted)``: ``body`` takes ``[*hoisted, *unknown args]``;
    or None when the function closes over unknown values or has effects
    (the call is then staged as it is).
    """
    jaxpr, _, consts = _compat.trace_to_jaxpr_dynamic(fun, [_compat.typeof(a) for a in args])
    if jaxpr.effects:
        return None
    consts = [_known(folder, c) for c in consts]
    if any(folder.is_staged(c) for c in consts):
        return None  # closes over a dynamic value: JAX's rules for that stand
    body = _compat.close_jaxpr(_compat.convert_constvars_jaxpr(jaxpr), ())
    hoisted = hoist(folder, body, [*consts, *args], force=True)
    if hoisted is None:
        return None
    new_body, new_args = hoisted
    n = len(new_args) - sum(map(folder.is_staged, args))
    return new_body, new_args[:n]


def _known(folder: Folder, x):
    """``x``'s value if it is known and not lazy, else ``x``."""
    return folder.materialize(x) if folder.is_known(x) and not folder.is_lazy(x) else x


def _stage(trace, method: str, *args, **params):
    """Stage a custom call of new functions on ``trace``: JAX's staging, not the folding policy.

    Its last positional argument is the inputs: values as ``bind`` passes
    them on (folded values may be NumPy arrays), or tracers.
    """
    *args, inputs = args
    inputs = [x if isinstance(x, _compat.Tracer) else _compat.canonicalize_value(x) for x in inputs]
    with _compat.eager_constant_folding(False):
        return getattr(_compat.DynamicJaxprTrace, method)(trace, *args, inputs, **params)


def _ct_aval(x):
    """The cotangent type of ``x``'s type (float0 for integers)."""
    return _compat.cotangent_aval(jax.typeof(x))


def _zeros(aval):
    """Zeros of a tangent type (float0 ones are NumPy's: JAX has no float0 arrays)."""
    if aval.dtype == jax.dtypes.float0:
        return np.zeros(aval.shape, aval.dtype)
    return jax.numpy.zeros(aval.shape, aval.dtype)


def _renamed(fun, n_in: int, n_out: int | None = None):
    """``fun``'s debug info for a new function of ``n_in`` inputs (and ``n_out``
    results) in its place: JAX checks the counts of names it traces with, and
    JAX 0.7 reads result paths from ``fun``'s output store, which the rule may empty."""
    return _compat.with_arity(fun.debug_info, n_in, n_out)


def _eval(body, *args):
    return _compat.eval_jaxpr(body.jaxpr, body.consts, *args)


def _reset(fun) -> None:
    """Let a traced ``WrappedFun`` be traced again (JAX does so before re-tracing a rule)."""
    for store in getattr(fun, "stores", ()):
        if store is not None:
            store.reset()


def fold_custom_vjp(folder: Folder, trace, prim, args, params):
    """Fold the known work of a ``custom_vjp`` call's function, where it has some unknown inputs.

    The residual keeps a ``custom_vjp`` call of the partially evaluated
    function. Its rules are the user's, run on the known inputs' values
    (inputs of the new call), when the residual is differentiated as it is;
    their cotangents for the known inputs are dropped (constants). The
    rules are not traced here: a forward rule may reject a pattern of
    perturbed inputs that JAX never asks of it (Equinox asserts that its
    non-differentiable inputs are unperturbed), and a failed trace of one
    leaves JAX's memoized record of its output trees empty. Their constant
    work folds where JAX runs them under the folding trace: ``jax.grad``
    inside the folded function, or a derivative of a pejit function, which
    pejit folds as a function of its own (``pejit._calls._derivatives``).
    """
    if not folder.options.calls or all(map(folder.is_staged, args)):
        return NotImplemented
    fun, fwd, bwd = params["subfuns"]
    primal = _partial(folder, fun, args)
    if primal is None:
        _reset(fun)  # staged as it is: JAX traces it again
        return NotImplemented
    body, hoisted = primal
    unknown = [i for i, a in enumerate(args) if folder.is_staged(a)]
    known = [i for i, a in enumerate(args) if not folder.is_staged(a)]
    # The new call's inputs: the folded values, the known inputs, the unknown ones.
    consts = [*hoisted, *(args[i] for i in known)]
    n_h, n_c, n = len(hoisted), len(consts), len(args)
    where = {i: n_h + j for j, i in enumerate(known)} | {i: n_c + j for j, i in enumerate(unknown)}
    zeros = [_compat.Zero(_ct_aval(c)) for c in consts]  # the closures hold no values

    def out_trees():
        tree, res, fwds = params["out_trees"]()  # filled by the forward rule that ran
        return tree, res, [None if f is None else where[f] for f in fwds]

    def new_fun(*xs):
        return _eval(body, *xs[:n_h], *xs[n_c:])

    def new_fwd(*pairs):
        xs, perturbed = pairs[::2], pairs[1::2]
        flags = [where[i] >= n_c and perturbed[where[i]] for i in range(n)]  # known inputs: not perturbed
        return fwd.call_wrapped(*(v for i in range(n) for v in (xs[where[i]], flags[i])))

    def new_bwd(*res_cts):
        cts, logs = bwd.call_wrapped(*res_cts) if _BWD_LOGS else (bwd.call_wrapped(*res_cts), None)
        out = [*zeros, *(cts[i] for i in unknown)]
        return (out, logs) if _BWD_LOGS else out

    folder.stats.staged[prim.name] += 1
    new_params = dict(params, out_trees=out_trees)
    del new_params["subfuns"]
    n_in = n_c + len(unknown)
    return _stage(
        trace, "process_custom_vjp_call", prim,
        _compat.wrap_init(new_fun, debug_info=_renamed(fun, n_in, len(body.out_avals))),
        _compat.wrap_init(new_fwd, debug_info=_renamed(fwd, n_in)),
        _compat.wrap_init(new_bwd, debug_info=bwd.debug_info), [*consts, *(args[i] for i in unknown)], **new_params)


def fold_custom_lin(folder: Folder, trace, prim, args, params):
    """A ``custom_vjp`` call's backward rule, left by differentiation, its work on constant residuals folded.

    JAX's forward-mode differentiation of a ``custom_vjp`` call runs the
    forward rule (under the folding trace, so its constant work folds) and
    leaves a ``custom_lin`` equation of the residuals and tangents, which
    runs the backward rule when transposed. The residuals that are known
    (the constants the rule saved, forwarded known inputs) are known now:
    the rule is traced here, as the transposition traces it (cotangents as
    arrays; with ``symbolic_zeros``, zeros become arrays of zeros, the
    same values), its work on them is folded, and the new ``custom_lin``
    runs what is left. That is what pejit's derivative of a function
    (``pejit._calls._derivatives``) keeps of each ``custom_vjp`` call in it.
    """
    n_res = params["num_res"]
    res = args[:n_res]
    if not folder.options.calls or all(map(folder.is_staged, res)):
        return NotImplemented
    bwd = params["bwd"]
    in_cts: list = []  # per input: its cotangent's type where the rule gives a symbolic zero, else None

    def grads(*xs):
        cts, logs = bwd.call_wrapped(*xs) if _BWD_LOGS else (bwd.call_wrapped(*xs), None)
        if logs is not None:
            raise _Logs
        in_cts[:] = [ct.aval if type(ct) is _compat.Zero else None for ct in cts]
        return [ct for ct in cts if type(ct) is not _compat.Zero]

    cts = params["out_avals"]
    try:  # the known residuals concrete: a rule may look at them (Equinox's are Python bools too)
        body, inputs = hoist_call(folder, grads, [*res, *[DYNAMIC] * len(cts)], [*map(_compat.typeof, res), *cts])
    except _Logs:  # a rule with logs (JAX 0.12's defvjp_with_logs) runs as it is
        return NotImplemented
    except Exception:
        if params["symbolic_zeros"]:  # the rule rejects arrays where JAX may give it symbolic zeros
            return NotImplemented
        raise
    if body.jaxpr.effects:
        return NotImplemented
    dyn_res = [r for r in res if folder.is_staged(r)]
    values = inputs[:len(inputs) - len(dyn_res) - len(cts)]
    zeros = list(in_cts)

    def new_bwd(*res_cts):
        # JAX 0.12 hands a rule its zero cotangents as symbolic zeros, which the
        # rule's own wrapper instantiates; the folded body takes arrays.
        res_cts = [_zeros(x.aval) if type(x) in (SymbolicZero, _compat.Zero) else x for x in res_cts]
        outs = iter(_eval(body, *res_cts))
        cts = [next(outs) if aval is None else _compat.Zero(aval) for aval in zeros]
        return (cts, None) if _BWD_LOGS else cts

    new_params = dict(params, num_res=len(values) + len(dyn_res), symbolic_zeros=False,
                      bwd=_compat.wrap_init(new_bwd, debug_info=_renamed(bwd, len(inputs))))
    folder.stats.staged[prim.name] += 1
    return trace.stage(prim, [*values, *dyn_res, *args[n_res:]], new_params)


class _Logs(Exception):
    """A backward rule returned logs (see :func:`fold_custom_lin`)."""


def fold_custom_jvp(folder: Folder, trace, prim, args, params):
    """Fold the known work of a ``custom_jvp`` call with some unknown inputs."""
    if not folder.options.calls or all(map(folder.is_staged, args)):
        return NotImplemented
    fun, jvp = params["subfuns"]
    unknown = [i for i, a in enumerate(args) if folder.is_staged(a)]
    known = [i for i, a in enumerate(args) if not folder.is_staged(a)]
    primal = _partial(folder, fun, args)
    if primal is None:
        _reset(fun)  # staged as it is: JAX traces it again
        return NotImplemented
    body, hoisted = primal
    consts = [*hoisted, *(args[i] for i in known)]
    n_h, n_c, n = len(hoisted), len(consts), len(args)
    tangent_avals = {i: jax.typeof(args[i]).to_tangent_aval() for i in known}  # the closures hold no values
    symbolic = params["symbolic_zeros"]  # else the rule gets zeros as arrays, as JAX gives them

    def new_fun(*xs):
        return _eval(body, *xs[:n_h], *xs[n_c:])

    def new_jvp(*xs):
        primals, tangents = xs[:len(xs) // 2], xs[len(xs) // 2:]
        values = dict(zip(unknown, primals[n_c:])) | dict(zip(known, primals[n_h:n_c]))
        dots = dict(zip(unknown, tangents[n_c:]))
        dots.update((i, SymbolicZero(tangent_avals[i]) if symbolic else _zeros(tangent_avals[i])) for i in known)
        return jvp.call_wrapped(*(values[i] for i in range(n)), *(dots[i] for i in range(n)))

    folder.stats.staged[prim.name] += 1
    new_params = dict(params)
    del new_params["subfuns"]
    return _stage(
        trace, "process_custom_jvp_call", prim,
        _compat.wrap_init(new_fun, debug_info=_renamed(fun, n_c + len(unknown), len(body.out_avals))),
        _compat.wrap_init(new_jvp, debug_info=_renamed(jvp, 2 * (n_c + len(unknown)))), [*consts, *(args[i] for i in unknown)],
        **new_params)


def fold_linear_solve(folder: Folder, trace, prim, args, params):
    """``lax.custom_linear_solve`` of a known operator and an unknown vector: a product.

    The operator's inverse is folded (its ``solve`` applied to the identity,
    so it is the inverse the solve computes), and the residual keeps one
    matrix-vector product where it kept the solve (``jnp.linalg.solve``'s
    pivoting and two triangular solves per call: XLA:CPU runs a
    triangular solve on a vector many times slower than a product). The
    derivatives agree: the solve is linear in the vector, and the operator
    is a constant. A vector that is itself ``C @ y`` for a known ``C`` is
    solved as ``(A^-1 C) @ y``: a vector field ``solve(M, K @ y)`` costs
    one product, as if ``M^-1 K`` had been computed by hand. This is
    residual algebra (docs/numerics.md): switched with
    ``FoldOptions.affine``, for inverses up to ``affine_max_bytes``, of
    operators conditioned well enough that the product is as accurate as
    the solve (:data:`SOLVE_AS_PRODUCT_COND`).
    """
    n_consts = sum(params["const_lengths"])
    consts, b = args[:n_consts], args[n_consts:]
    solve = params["jaxprs"].solve
    if (not folder.options.affine or len(b) != 1 or solve is None or not all(map(folder.is_known, consts))
            or folder.is_known(b[0]) or len(solve.out_avals) != 1):
        return NotImplemented
    aval = _compat.typeof(b[0])
    if (aval.ndim != 1 or solve.out_avals[0].shape != aval.shape
            or not jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)
            or aval.size ** 2 * aval.dtype.itemsize > folder.options.affine_max_bytes):
        return NotImplemented
    lengths = params["const_lengths"]
    matvec_consts = consts[:lengths.matvec]
    solve_consts = consts[lengths.matvec + lengths.vecmat:][:lengths.solve]
    with trace.as_current():
        eye = jax.numpy.eye(aval.shape[0], dtype=aval.dtype)
        inverse = jax.vmap(lambda e: _eval(solve, *solve_consts, e)[0], out_axes=1)(eye)
        operator = jax.vmap(lambda e: _eval(params["jaxprs"].matvec, *matvec_consts, e)[0], out_axes=1)(eye)
    if not _well_conditioned(folder, operator, inverse):
        return NotImplemented  # the solve stays, on its folded factorization
    producer, source = known_product(folder, trace, b[0])
    folder.stats.staged["custom_linear_solve (as a product)"] += 1
    with trace.as_current():
        return [(inverse @ producer) @ source] if producer is not None else [inverse @ b[0]]


#: The largest 1-norm condition number of an operator whose solve becomes a product
#: with its inverse (see docs/numerics.md): measured on random matrices, the
#: product differs from the solve by about cond / 100 units in the last place of
#: the largest element, so within 100 it agrees with the solve as closely as two
#: roundings do; beyond, the rewrite would be less accurate than the solve.
SOLVE_AS_PRODUCT_COND = 100.0


def _well_conditioned(folder: Folder, operator, inverse) -> bool:
    """Whether ``cond_1(operator) <= SOLVE_AS_PRODUCT_COND``, from the operator and its folded inverse."""
    a, inv = folder.materialize(operator), folder.materialize(inverse)
    if folder.is_abstract(a) or folder.is_abstract(inv):
        raise NeedsValue("a solve's rewrite depends on its operator's conditioning")
    norm = lambda m: np.abs(np.asarray(m)).sum(axis=0).max(initial=0.0)  # noqa: E731  (the 1-norm)
    return bool(norm(a) * norm(inv) <= SOLVE_AS_PRODUCT_COND)
