"""Fold rules for ``custom_vjp``/``custom_jvp`` calls with known and unknown inputs,
and for ``custom_linear_solve`` of a known operator.

A call whose inputs are all known is folded whole (``Folder.call_inputs``).
With mixed inputs, the call stays, so its rule keeps governing the
derivatives of the dynamic inputs, but the known work inside it is folded:
the residual keeps a new call of the same kind whose primal function is
the partially evaluated one, taking the folded values (as buffers) and the
unknown inputs. Its rule is the user's, applied to the known inputs'
values:

* ``custom_vjp``: the forward rule is partially evaluated too (traced now,
  for the usual pattern: known inputs unperturbed, unknown ones perturbed;
  with ``symbolic_zeros`` another pattern, or where the rule rejects that
  one, the user's forward rule runs later on the known values); so is the
  backward rule, on the residuals that the folded forward rule leaves
  constant. Its cotangents for the known inputs are dropped (constants).
* ``custom_jvp``: the user's JVP rule, on the known inputs' values with
  zero tangents (``lax.custom_root`` is such a call).

Libraries wrap their solvers in such calls (diffrax's and Equinox's
checkpointed loops, optimistix's implicit differentiation), so this is
where a constant matrix factored in a vector field or residual function
is met. The rules close over no values: a folding program traced with
abstract constants (``pejit._fold._abstract``) can hold such a call.
"""

from __future__ import annotations

import contextvars

import jax
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.interpreters import ad
from jax.interpreters import partial_eval as pe

from ... import _compat
from ..._fold._folding import Folder
from ._hoist import DYNAMIC, hoist


#: Whether backward rules return ``(cotangents, logs)`` (JAX 0.12's ``defvjp_with_logs``), not cotangents.
_BWD_LOGS = hasattr(jax.custom_vjp, "defvjp_with_logs")

#: Whether a forward rule is being folded (see fold_custom_vjp).
_in_forward: contextvars.ContextVar[bool] = contextvars.ContextVar("pejit_in_forward", default=False)


def _partial(folder: Folder, fun, args):
    """``fun`` (a flat ``WrappedFun``) traced as JAX traces a custom call's
    function, then its work on the known ``args`` folded.

    Returns ``(body, hoisted)``: ``body`` takes ``[*hoisted, *unknown args]``;
    or None when the function closes over unknown values or has effects
    (the call is then staged as it is).
    """
    jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(fun, [_compat.typeof(a) for a in args])[:3]
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
    return _ct_aval_of(jax.typeof(x))


def _zeros(aval):
    """Zeros of a tangent type (float0 ones are NumPy's: JAX has no float0 arrays)."""
    if aval.dtype == jax.dtypes.float0:
        return np.zeros(aval.shape, aval.dtype)
    return jax.numpy.zeros(aval.shape, aval.dtype)


def _unnamed(fun, body):
    """``fun``'s debug info for a new function computing ``body``: JAX 0.7 reads
    result paths from ``fun``'s output store, which the rule may empty."""
    return _compat.with_result_paths(fun.debug_info, ("",) * len(body.out_avals))


def _eval(body, *args):
    return _compat.eval_jaxpr(body.jaxpr, body.consts, *args)


def _reset(fun) -> None:
    """Let a traced ``WrappedFun`` be traced again (JAX does so before re-tracing a rule)."""
    for store in getattr(fun, "stores", ()):
        if store is not None:
            store.reset()


def fold_custom_vjp(folder: Folder, trace, prim, args, params):
    """Fold the known work of a ``custom_vjp`` call with some unknown inputs."""
    if not folder.options.calls or all(map(folder.is_staged, args)):
        return NotImplemented
    out = _fold_custom_vjp(folder, trace, prim, args, params)
    if out is NotImplemented:  # staged as it is: JAX traces its functions again
        for f in params["subfuns"][:2]:
            _reset(f)
    return out


def _fold_custom_vjp(folder: Folder, trace, prim, args, params):
    fun, fwd, bwd = params["subfuns"]
    unknown = [i for i, a in enumerate(args) if folder.is_staged(a)]
    dyn = [args[i] for i in unknown]
    primal = _partial(folder, fun, args)
    if primal is None:
        return NotImplemented
    body, hoisted = primal

    # The forward rule, for its usual pattern of perturbed inputs. It runs
    # later, as written, on the known values, when it fails for that pattern
    # (Equinox asserts that its non-differentiable inputs are unperturbed)
    # and inside a forward rule being folded (which calls its own custom_vjp
    # function, whose forward rule does...).
    flags = [folder.is_staged(a) for a in args]
    forward = None if _in_forward.get() else _forward(folder, fwd, args, flags)
    lazy = forward is None
    fwd_body, fwd_hoisted = forward or (None, [])
    out_tree, res_tree, input_fwds = params["out_trees"]() if forward else (None, None, [])
    # JAX reads the output tree from the primal's store or the forward's,
    # which must be the only one filled (the backward rule reads the latter).
    if forward:
        _reset(fun)

    # The backward rule, its work on the residuals that are constants folded.
    symbolic = params["symbolic_zeros"]
    backward = None if lazy or symbolic else _backward(folder, bwd, args, unknown, flags, body, forward,
                                                          res_tree.num_leaves, input_fwds)
    bwd_body, bwd_consts, known_res, ct_zeros = backward or (None, [], {}, [])
    folded_bwd, known_res = backward is not None, frozenset(known_res)  # the closures hold no values

    # The new call's inputs: folded values, known inputs the rules still
    # read, the backward rule's folded values, then the unknown inputs.
    known_read = [i for i, a in enumerate(args) if not flags[i] and (lazy or symbolic or i in input_fwds)]
    consts = [*hoisted, *fwd_hoisted, *(args[i] for i in known_read), *bwd_consts]
    n_h, n_f, n_c, n_b = len(hoisted), len(fwd_hoisted), len(consts), len(bwd_consts)
    where = {i: n_c + j for j, i in enumerate(unknown)} | {i: n_h + n_f + j for j, i in enumerate(known_read)}
    # The backward rule's values reach it as residuals forwarded from the inputs.
    new_fwds = [*(None if f is None else where[f] for f in input_fwds), *range(n_c - n_b, n_c)]
    n_res = len(input_fwds)
    new_res_tree = jax.tree_util.tree_structure([0] * (n_res + n_b)) if folded_bwd else res_tree
    n, zeros = len(args), [ad.Zero(_ct_aval(c)) for c in consts]

    def out_trees():
        if lazy:
            tree, res, fwds = params["out_trees"]()  # filled by the forward rule that ran
            return tree, res, [None if f is None else where[f] for f in fwds]
        return out_tree, new_res_tree, new_fwds

    def new_fun(*xs):
        return _eval(body, *xs[:n_h], *xs[n_c:])

    def new_fwd(*pairs):
        xs, perturbed = pairs[::2], pairs[1::2]
        if not lazy and (not symbolic or all(perturbed[n_c:])):
            return _eval(fwd_body, *xs[n_h:n_h + n_f], *xs[n_c:])
        # Another pattern of symbolic zeros: the user's rule on the known values.
        originals = dict(zip(unknown, zip(xs[n_c:], perturbed[n_c:])))
        originals.update((i, (xs[where[i]], False)) for i in known_read)
        _reset(fwd)
        return fwd.call_wrapped(*[v for i in range(n) for v in originals[i]])

    def new_bwd(*res_cts):
        if not folded_bwd:
            cts, logs = bwd.call_wrapped(*res_cts) if _BWD_LOGS else (bwd.call_wrapped(*res_cts), None)
            out = [*zeros, *(cts[i] for i in unknown)]
            return (out, logs) if _BWD_LOGS else out
        res, values, cts = res_cts[:n_res], res_cts[n_res:n_res + n_b], res_cts[n_res + n_b:]
        dyn = [r for i, r in enumerate(res) if i not in known_res]
        outs = iter(_eval(bwd_body, *values, *dyn, *cts))
        out = [*zeros, *(z if z is not None else next(outs) for z in ct_zeros)]
        return (out, None) if _BWD_LOGS else out

    folder.stats.staged[prim.name] += 1
    new_params = dict(params, out_trees=out_trees)
    del new_params["subfuns"]
    return _stage(
        trace, "process_custom_vjp_call", prim,
        _compat.wrap_init(new_fun, debug_info=_unnamed(fun, body)),
        _compat.wrap_init(new_fwd, debug_info=fwd.debug_info),
        _compat.wrap_init(new_bwd, debug_info=bwd.debug_info), [*consts, *dyn], **new_params)


def _forward(folder: Folder, fwd, args, flags):
    """The forward rule ``fwd`` partially evaluated (see :func:`_partial`) for
    the perturbed inputs ``flags``, or None if it cannot be."""
    def fwd_of(*xs):
        return fwd.call_wrapped(*[v for pair in zip(xs, flags) for v in pair])

    token = _in_forward.set(True)
    try:
        _reset(fwd)
        return _partial(folder, _compat.wrap_init(fwd_of, debug_info=fwd.debug_info), args)
    except Exception:  # the rule rejects this pattern; JAX's CustomVJPException for a perturbed closure
        _reset(fwd)
        return None
    finally:
        _in_forward.reset(token)


def _backward(folder: Folder, bwd, args, unknown, flags, body, forward, n_res: int, input_fwds):
    """The backward rule partially evaluated on the residuals the folded forward rule
    leaves known (folded values, known inputs forwarded), or None.

    Returns ``(body, consts, known, zeros)``: ``body`` takes ``consts`` (the
    call passes them to it as extra residuals), then the other residuals
    and the cotangents, and gives the unknown inputs' cotangents that are
    not ``zeros[j]`` (a symbolic zero, else None).
    """
    fwd_body, fwd_hoisted = forward
    inner = fwd_body.jaxpr
    hoisted_vars = inner.invars[:len(fwd_hoisted)]
    pruned = iter(inner.outvars)
    known, avals = {}, []
    for i, f in enumerate(input_fwds):
        if f is not None:
            avals.append(_compat.typeof(args[f]))
            if not flags[f]:
                known[i] = args[f]
            continue
        v = next(pruned)
        avals.append(_compat.var_aval(v) if isinstance(v, _compat.Var) else _compat.typeof(v.val))
        if isinstance(v, _compat.Literal):
            known[i] = v.val
        elif v in hoisted_vars:
            known[i] = fwd_hoisted[hoisted_vars.index(v)]
    if not known:
        return None
    ct_avals = [_ct_aval_of(a) for a in body.out_avals]
    zeros: list = []

    def grads(*xs):
        cts, logs = bwd.call_wrapped(*xs) if _BWD_LOGS else (bwd.call_wrapped(*xs), None)
        if logs:
            raise ValueError("a backward rule with logs is not folded")
        zeros[:] = [cts[i] if type(cts[i]) is ad.Zero else None for i in unknown]
        return [cts[i] for i in unknown if type(cts[i]) is not ad.Zero]

    try:
        fun = _compat.wrap_init(grads, debug_info=bwd.debug_info)
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(fun, [*avals, *ct_avals])[:3]
    except Exception:  # the rule needs what tracing does not give it (values, symbolic zeros)
        return None
    consts = [_known(folder, c) for c in consts]
    if jaxpr.effects or any(folder.is_staged(c) for c in consts):
        return None
    closed = _compat.close_jaxpr(_compat.convert_constvars_jaxpr(jaxpr), ())
    inputs = [*consts, *(known.get(i, DYNAMIC) for i in range(n_res)), *[DYNAMIC] * len(ct_avals)]
    hoisted = hoist(folder, closed, inputs)
    if hoisted is None:
        return None
    new_body, new_args = hoisted
    return new_body, [a for a in new_args if a is not DYNAMIC], known, zeros


def _ct_aval_of(aval):
    return aval.to_ct_aval() if hasattr(aval, "to_ct_aval") else aval.to_tangent_aval()


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
        _compat.wrap_init(new_fun, debug_info=_unnamed(fun, body)),
        _compat.wrap_init(new_jvp, debug_info=jvp.debug_info), [*consts, *(args[i] for i in unknown)],
        **new_params)


def fold_linear_solve(folder: Folder, trace, prim, args, params):
    """``lax.custom_linear_solve`` of a known operator and an unknown vector: a product.

    The operator's inverse is folded (its ``solve`` applied to the identity,
    so it is the inverse the solve computes), and the residual keeps one
    matrix-vector product where it kept the solve (``jnp.linalg.solve``'s
    pivoting and two triangular solves per call: XLA:CPU runs a
    triangular solve on a vector about 10x slower than a product). The
    derivatives agree: the solve is linear in the vector, and the operator
    is a constant. A vector that is itself ``C @ y`` for a known ``C`` is
    solved as ``(A^-1 C) @ y``: a vector field ``solve(M, K @ y)`` costs
    one product, as if ``M^-1 K`` had been computed by hand. This is
    residual algebra (docs/numerics.md): switched with
    ``FoldOptions.affine``, for inverses up to ``affine_max_bytes``.
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
    start = params["const_lengths"].matvec + params["const_lengths"].vecmat
    solve_consts = consts[start:start + params["const_lengths"].solve]
    producer, source = _known_product(folder, trace, b[0])
    folder.stats.staged["custom_linear_solve (as a product)"] += 1
    with trace.as_current():
        eye = jax.numpy.eye(aval.shape[0], dtype=aval.dtype)
        inverse = jax.vmap(lambda e: _eval(solve, *solve_consts, e)[0], out_axes=1)(eye)
        if producer is not None:
            return [(inverse @ producer) @ source]
        return [inverse @ b[0]]


def _known_product(folder: Folder, trace, x):
    """``(C, y)`` if ``x`` was staged as ``C @ y`` (a matrix-vector product) with ``C`` known; else Nones."""
    eqn = getattr(x, "parent", None)  # the staged equation that made x (a TracingEqn)
    inputs = getattr(eqn, "in_tracers", ())
    if getattr(eqn, "primitive", None) is not jax.lax.dot_general_p or len(inputs) != 2:
        return None, None
    (contract, batch) = eqn.params["dimension_numbers"]
    c, y = (t if _compat.const_of(trace, t) is None else _compat.const_of(trace, t) for t in inputs)
    if (contract != ((1,), (0,)) or batch != ((), ()) or not folder.is_known(c) or folder.is_known(y)
            or jax.numpy.ndim(c) != 2 or jax.numpy.ndim(y) != 1
            or eqn.params.get("preferred_element_type") not in (None, x.dtype)):
        return None, None
    return folder.materialize(c), y
