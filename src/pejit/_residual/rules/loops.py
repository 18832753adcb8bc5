"""Fold rules for loops: ``scan`` and ``while_loop`` (hence ``fori_loop``).

A loop whose inputs are all known is folded whole by the default policy. A
loop with some unknown inputs stays in the residual program, after two
passes (switch: ``FoldOptions.loops``):

1. **Loop-invariant hoisting** (``scan``, ``while_loop``, hence
   ``fori_loop``). The body, and a while loop's condition, are replayed under
   a nested folding trace in which the known loop constants are concrete.
   Work that depends only on them is folded once, at specialization time, and
   its results become new constants of the residual loop. Every fold rule
   applies inside, as anywhere else: a ``cond`` on a known constant keeps one
   branch, a nested ``jax.jit`` is specialized, expansions stay lazy.
2. **Known carries and scanned inputs.** A carry that stays known on every
   iteration (a fixpoint, e.g. a ``fori_loop`` counter) or a known ``xs``
   lets ``scan``'s body be split, as JAX's own scan partial evaluation does,
   into a known loop, folded now, and a residual loop that receives what it
   needs from the known one as per-iteration *stacked residuals*. Those cost
   ``length x size`` bytes of folded constants, so the split is made only
   when they total at most ``FoldOptions.loop_residual_bytes``; otherwise
   the known carries simply stay in the residual loop. For ``while_loop``
   (trip count unknown in advance, so nothing can be stacked) a condition
   that depends only on known carries lets the known carries be folded: the
   loop runs once now for them, and the residual loop still recomputes them.

Loop bodies with effects are hoisted (effects are never folded, and stay in
order) but not split.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

from jax.extend.core import ClosedJaxpr

from ... import _compat
from ..._fold._values import nbytes
from ..._fold import _cost
from ..._fold._folding import Folder, NeedsValue
from ..._fold._primitives import custom_calls, subjaxprs
from ._hoist import hoist_consts


def fold_scan(folder: Folder, trace, prim, args, params):
    """Hoist known work out of a ``scan`` with some unknown inputs."""
    if not folder.options.loops or all(folder.is_known(a) for a in args):
        return NotImplemented
    scan = _compat.ScanParams(params)
    n_consts = scan.num_consts
    consts, rest = args[:n_consts], args[n_consts:]
    length = params["length"]
    hoisted = hoist_consts(folder, params["jaxpr"], consts, speculative=length == 0, trips=max(length, 1))
    n_known = 0
    if hoisted is not None:
        body, new_consts = hoisted
        n_known = len(new_consts) - sum(map(folder.is_staged, consts))
        args = [*new_consts, *rest]
        params = scan.with_consts(body, len(new_consts))
    outs = _split_scan(folder, trace, prim, args, params, n_known)
    if outs is not None:
        return outs
    folder.stats.staged[prim.name] += 1
    return trace.stage(prim, args, params)


def _split_scan(folder: Folder, trace, prim, args, params, n_known_consts: int):
    """Fold the part of a scan driven by known carries/xs, or ``None``.

    The first ``n_known_consts`` constants are concrete; the others are
    treated as unknown. Mirrors ``jax._src.lax.control_flow.loops
    ._scan_partial_eval``, with the known loop evaluated now.
    """
    body: ClosedJaxpr = params["jaxpr"]
    scan = _compat.ScanParams(params)
    n_consts, n_carry, length = scan.num_consts, scan.num_carry, params["length"]
    n_ys = len(body.out_avals) - n_carry
    init, xs = args[n_consts : n_consts + n_carry], args[n_consts + n_carry :]
    const_uk = [i >= n_known_consts for i in range(n_consts)]
    carry_uk = [not folder.is_known(c) for c in init]
    xs_uk = [not folder.is_known(x) for x in xs]
    if (all(carry_uk) and all(xs_uk)) or body.effects:
        return None
    total, min_gain = _cost.jaxpr_cost(body), folder.options.min_gain
    varying = _known_varying_cost(body.jaxpr, const_uk, carry_uk, xs_uk)
    if varying is not None and not _cost.fold_pays(varying, total, min_gain):
        # decided before partial evaluation, which can cost seconds on a large body
        folder.stats.staged["scan (known part too small to split)"] += 1
        return None
    # Residuals forwarded from known constants or xs are passed as they are.
    fwd = [True] * n_consts + [False] * n_carry + [True] * len(xs)
    for _ in range(1 + n_carry):  # each round makes at least one carry unknown
        jk, ju, out_uk, res_avals, in_fwd = _compat.partial_eval_jaxpr_nounits_fwd(
            body, const_uk + carry_uk + xs_uk, instantiate=carry_uk + [False] * n_ys, fwd=fwd
        )
        carry_out_uk = out_uk[:n_carry]
        if carry_out_uk == carry_uk:
            break
        carry_uk = [a or b for a, b in zip(carry_uk, carry_out_uk)]
    if all(carry_uk) and all(xs_uk):
        return None
    if custom_calls(jk) + custom_calls(ju) < custom_calls(body):
        # JAX's partial evaluation inlines a custom_jvp/custom_vjp call with
        # unknown inputs (it assumes a linearized program): its rule would be lost.
        folder.stats.staged["scan (custom rules)"] += 1
        return None
    if length * sum(nbytes(a) for a in res_avals) > folder.options.loop_residual_bytes:
        folder.stats.staged["scan (residual budget)"] += 1
        return None
    if not _cost.fold_pays(_varying_cost(jk.jaxpr, [i >= n_known_consts for i in range(len(jk.in_avals))]), total,
                           min_gain):
        # the known loop would carry its results into the residual loop as
        # stacked inputs, for less work than the fold must save (FoldOptions.min_gain)
        folder.stats.staged["scan (known part too small to split)"] += 1
        return None

    unknowns = const_uk + carry_uk + xs_uk
    known_ins = [a for a, uk in zip(args, unknowns) if not uk]
    unknown_ins = [a for a, uk in zip(args, unknowns) if uk]
    n_known_carry = carry_uk.count(False)
    n_known_outs = len(jk.out_avals) - len(res_avals)
    ys_uk = out_uk[n_carry:]
    known_params = scan.split(
        jk, consts=n_known_consts, carry=_not(carry_uk), xs=_not(xs_uk), ys=_not(ys_uk), extra_ys=len(res_avals)
    )
    known_outs = _fold_now(folder, trace, prim, known_ins, known_params)
    known_outs, stacked = known_outs[:n_known_outs], iter(known_outs[n_known_outs:])
    offset = len(body.consts)  # in_fwd indexes [*body.consts, *known_ins]
    residuals = [next(stacked) if f is None else [*body.consts, *known_ins][f] for f in in_fwd]
    # Residuals computed per iteration, or forwarded from xs, are scanned over.
    per_iter = [f is None or f >= offset + n_known_consts + n_known_carry for f in in_fwd]
    ju = _compat.move_binders_to_back(ju, per_iter + [False] * len(unknown_ins))
    int_res = [r for r, p in zip(residuals, per_iter) if not p]
    ext_res = [r for r, p in zip(residuals, per_iter) if p]
    unknown_params = scan.split(
        ju, consts=len(int_res) + sum(const_uk), carry=carry_uk, xs=xs_uk, ys=ys_uk, extra_xs=len(ext_res)
    )
    folder.stats.staged[prim.name] += 1
    unknown_outs = trace.stage(prim, [*int_res, *unknown_ins, *ext_res], unknown_params)
    return _merge(out_uk, known_outs, unknown_outs)


def _varying_cost(jaxpr, varying: Sequence[bool]) -> _cost.Cost:
    """The cost of the equations of ``jaxpr`` that read, through others, an input marked ``varying``.

    In a scan's known part, the work on known carries or scanned inputs,
    which differs from trip to trip: a split saves it on every trip. The
    rest reads constants alone: loop-invariant work, on which hoisting has
    decided already (and XLA computes it once a call); a split would stack
    it once per trip, memory per trip for work XLA already does once.
    """
    live = {v for v, m in zip(jaxpr.invars, varying) if m}
    cost = _cost.ZERO
    for eqn, eqn_cost in zip(jaxpr.eqns, _cost.costs(jaxpr.eqns)):
        if any(isinstance(v, _compat.Var) and v in live for v in eqn.invars):
            live.update(eqn.outvars)
            cost += eqn_cost
    return cost


def _known_varying_cost(jaxpr, const_uk: list[bool], carry_uk: list[bool], xs_uk: list[bool]) -> _cost.Cost | None:
    """:func:`_varying_cost` of a scan body's known part, found without partial evaluation.

    Known is what reads no unknown input, carries that stay known on every
    trip included (a fixpoint, as partial evaluation finds it). ``None``
    where an equation with a sub-program reads unknown and varying known
    values both: the known part inside it is partial evaluation's to find.
    """
    n_consts, n_carry = len(const_uk), len(carry_uk)
    eqn_costs = _cost.costs(jaxpr.eqns)
    for _ in range(1 + n_carry):  # each round makes at least one carry unknown
        ins = const_uk + carry_uk + xs_uk
        unknown = {v for v, uk in zip(jaxpr.invars, ins) if uk}
        varying = {v for v, uk in zip(jaxpr.invars[n_consts:], ins[n_consts:]) if not uk}
        cost = _cost.ZERO
        for eqn, eqn_cost in zip(jaxpr.eqns, eqn_costs):
            reads = [v for v in eqn.invars if isinstance(v, _compat.Var)]
            if any(v in unknown for v in reads):
                if any(v in varying for v in reads) and any(subjaxprs(eqn.params)):
                    return None
                unknown.update(eqn.outvars)
            elif any(v in varying for v in reads):
                varying.update(eqn.outvars)
                cost += eqn_cost
        out_uk = [isinstance(v, _compat.Var) and v in unknown for v in jaxpr.outvars[:n_carry]]
        if all(a or not b for a, b in zip(carry_uk, out_uk)):
            return cost
        carry_uk = [a or b for a, b in zip(carry_uk, out_uk)]
    return cost


def fold_while(folder: Folder, trace, prim, args, params):
    """Hoist known work out of a ``while_loop``; fold its known carries."""
    if not folder.options.loops or all(folder.is_known(a) for a in args):
        return NotImplemented
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    cconsts, bconsts, init = args[:cn], args[cn : cn + bn], args[cn + bn :]
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    n_known_c = n_known_b = 0
    if (hoisted := hoist_consts(folder, cond, cconsts)) is not None:  # the condition runs at least once
        cond, new = hoisted
        n_known_c = len(new) - sum(map(folder.is_staged, cconsts))
        cconsts = new
    if (hoisted := hoist_consts(folder, body, bconsts, speculative=True)) is not None:
        body, new = hoisted
        n_known_b = len(new) - sum(map(folder.is_staged, bconsts))
        bconsts = new
    args = [*cconsts, *bconsts, *init]
    params = dict(
        params, cond_jaxpr=cond, body_jaxpr=body, cond_nconsts=len(cconsts), body_nconsts=len(bconsts)
    )
    folder.stats.staged[prim.name] += 1
    outs = trace.stage(prim, args, params)
    known = _while_known_carries(folder, trace, prim, args, params, n_known_c, n_known_b)
    if known is None:
        return outs
    carry_uk, known_outs = known
    return _merge(carry_uk, known_outs, [o for o, uk in zip(outs, carry_uk) if uk])


def _while_known_carries(folder: Folder, trace, prim, args, params, n_known_c: int, n_known_b: int):
    """``(carry_uk, values)`` of the carries a known condition keeps known.

    Mirrors ``jax._src.lax.control_flow.loops._while_partial_eval``.
    """
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    init = args[cn + bn :]
    if cond.effects or body.effects:
        return None
    cconst_uk = [i >= n_known_c for i in range(cn)]
    bconst_uk = [i >= n_known_b for i in range(bn)]
    bk, carry_uk = _unknown_carries(body, bconst_uk, [not folder.is_known(c) for c in init])
    if all(carry_uk):
        return None
    ck, _, cond_uk, _, _ = _compat.partial_eval_jaxpr_nounits_fwd(
        cond, cconst_uk + carry_uk, instantiate=False, fwd=False
    )
    if cond_uk[0]:
        return None
    n_known = carry_uk.count(False)
    bk = bk.replace(jaxpr=bk.jaxpr.replace(outvars=bk.jaxpr.outvars[:n_known]))
    ck = ck.replace(jaxpr=ck.jaxpr.replace(outvars=ck.jaxpr.outvars[:1]))
    known_args = [
        *args[:n_known_c],
        *args[cn : cn + n_known_b],
        *(c for c, uk in zip(init, carry_uk) if not uk),
    ]
    if any(map(folder.is_abstract, _trip_count_inputs(ck, bk, known_args, n_known_c, n_known_b))):
        # JAX's fori_loop makes a loop whose bounds are concrete a scan (which
        # reverse-mode differentiation needs), so the trip count matters.
        raise NeedsValue("a while loop's trip count is decided by constants")
    known_params = dict(
        cond_jaxpr=ck, body_jaxpr=bk, cond_nconsts=n_known_c, body_nconsts=n_known_b
    )
    return carry_uk, _fold_now(folder, trace, prim, known_args, known_params)


def while_needs_fold(eqn, known: set) -> bool:
    """Whether a ``while`` loop with some inputs unknown has a trip count that known
    values alone decide (its condition reads known carries only, whatever the body does
    to the others): the fold makes it a loop of known length
    (:func:`_while_known_carries`), as JAX's ``fori_loop`` makes a loop whose bounds are
    concrete a scan, which reverse-mode differentiation needs. Such a program is
    folded whatever the fold saves (``pejit._fold._known.needed_rules``)."""
    params = eqn.params
    cn, bn = params["cond_nconsts"], params["body_nconsts"]
    unknown = [not (isinstance(a, _compat.Literal) or a in known) for a in eqn.invars]
    # a condition on a value unknown from the first trip (a solver's convergence test on
    # the dynamic data): no need to trace the body again to find the carries it makes unknown
    if not any(unknown) or _surely_unknown(params["cond_jaxpr"].jaxpr, unknown[:cn] + unknown[cn + bn :]):
        return False
    _, carry_uk = _unknown_carries(params["body_jaxpr"], unknown[cn : cn + bn], unknown[cn + bn :])
    if all(carry_uk):
        return False
    _, _, cond_uk, _, _ = _compat.partial_eval_jaxpr_nounits_fwd(
        params["cond_jaxpr"], unknown[:cn] + carry_uk, instantiate=False, fwd=False
    )
    return not cond_uk[0]


def _surely_unknown(cond, unknown: Sequence[bool]) -> bool:
    """Whether a loop's condition ``cond`` (open) is surely unknown to JAX's partial
    evaluation with the inputs ``unknown`` unknown, read off without a trace.

    An equation that JAX stages whole (no rule of its own, no sub-program) makes its
    outputs unknown once one input is; any other counts as known here. So a True
    is certain, and stays so as a loop's body makes more carries unknown."""
    if len(cond.invars) != len(unknown):
        return False
    unknowns = {v for v, u in zip(cond.invars, unknown) if u}
    for e in cond.eqns:
        if (_compat.stages_whole(e.primitive) and not any(True for _ in subjaxprs(e.params))
                and any(isinstance(a, _compat.Var) and a in unknowns for a in e.invars)):
            unknowns.update(e.outvars)
    return any(isinstance(v, _compat.Var) and v in unknowns for v in cond.outvars)


def _unknown_carries(body: ClosedJaxpr, bconst_uk: list, carry_uk: list) -> tuple[ClosedJaxpr, list]:
    """``(known body, carries unknown)``: the carries that stay unknown on every trip of
    ``body`` (a fixpoint, as JAX's partial evaluation of a while loop finds it)."""
    for _ in range(1 + len(carry_uk)):
        bk, _, out_uk, _, _ = _compat.partial_eval_jaxpr_nounits_fwd(
            body, bconst_uk + carry_uk, instantiate=carry_uk, fwd=False
        )
        if out_uk == carry_uk:
            break
        carry_uk = [a or b for a, b in zip(carry_uk, out_uk)]
    return bk, carry_uk


def _trip_count_inputs(ck: ClosedJaxpr, bk: ClosedJaxpr, known_args: Sequence[Any], n_c: int, n_b: int) -> list:
    """The inputs of a known while loop (``ck``, ``bk``) that its trip count depends on."""
    cconsts, bconsts, carries = known_args[:n_c], known_args[n_c : n_c + n_b], known_args[n_c + n_b :]
    _, used_c = _compat.dce_jaxpr(ck.jaxpr, [True])
    used_carries, used_b = used_c[n_c:], [False] * n_b
    while True:  # the carries the condition reads, and those they are computed from
        _, used = _compat.dce_jaxpr(bk.jaxpr, used_carries)
        used_b, more = used[:n_b], [a or b for a, b in zip(used_carries, used[n_b:])]
        if more == used_carries:
            break
        used_carries = more
    return [*compress(cconsts, used_c[:n_c]), *compress(bconsts, used_b), *compress(carries, used_carries)]


def _not(mask: Sequence[bool]) -> list[bool]:
    return [not m for m in mask]


def _fold_now(folder: Folder, trace, prim, args, params) -> list:
    """Evaluate a loop whose inputs are all known (staging it if it cannot)."""
    out = folder.default(trace, prim, args, params)
    return trace.stage(prim, args, params) if out is NotImplemented else out


def _merge(unknown: Sequence[bool], known_vals: Sequence[Any], unknown_vals: Sequence[Any]) -> list:
    known_it, unknown_it = iter(known_vals), iter(unknown_vals)
    return [next(unknown_it) if uk else next(known_it) for uk in unknown]
