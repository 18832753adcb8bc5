"""Fold rules for products (``dot_general``) with known operands: residual algebra done
while folding, under ``FoldOptions.affine``.

A contraction against a broadcast contracts against its source.
``jnp.broadcast_to(inv(A), (64, 3, 3)) @ x`` with ``A`` constant would store
the 64-fold expansion of ``inv(A)`` (a lazy expansion that a ``dot_general``
reads is stored, see ``FUSES_OPERANDS``), where ``inv(A)`` is all the
product needs: along a dimension the broadcast adds, the result is the same
(a free dimension: broadcast the result), or ``x``'s own (a batch dimension:
it becomes a free dimension of ``x``), or ``x`` summed (a contracting one).
One ``einsum`` over the broadcast's source says all three. A contraction
against a known transpose contracts against its source, through the
product's dimension numbers, so the transposed copy is not stored.

Products of known matrices with a dynamic vector, one at a time, become one
product: ``C @ (D @ z)`` is ``(C @ D) @ z`` with ``C @ D`` folded, where that
costs less per call. The affine collapse (``pejit._residual._collapse``)
does this for whole regions of the residual program, after folding; this
rule does it where the collapse does not reach, inside loop bodies: the
backward pass of diffrax's loop applies the vector field's transpose,
``K^T (M^-T ct)`` for a field ``-solve(M, K @ y)``, two products per step
where one would do.
"""

from __future__ import annotations

import string

import jax.numpy as jnp
from jax import lax
from jax.extend.core import primitives as P

from ... import _compat
from ..._fold import _cost
from ..._fold._folding import Folder


def fold_dot_general(folder: Folder, trace, prim, args, params):
    """``dot_general(broadcast_in_dim(C), x)`` with ``x`` dynamic: contract against ``C``;
    ``dot_general(transpose(C), x)``: against ``C``, through the dimension numbers;
    ``C @ (D @ z)`` with ``C``, ``D`` known: ``(C @ D) @ z``."""
    if not folder.options.affine or all(map(folder.is_known, args)):
        return NotImplemented
    for side in (0, 1):
        if folder.is_known(args[1 - side]):
            continue
        source = folder.expansion(args[side], P.broadcast_in_dim_p)
        if source is not None:
            with trace.as_current():
                return _contract_source(side, source[0][0], source[1], args, params)
        untransposed = _through_transpose(folder, trace, side, args, params)
        if untransposed is not None:
            with trace.as_current():
                return prim.bind(*untransposed[0], **untransposed[1])
    return _reassociate(folder, trace, args, params)


def _through_transpose(folder: Folder, trace, side: int, args, params) -> tuple | None:
    """``(args, params)`` of the same product with ``args[side]``, a known ``transpose(C)``,
    replaced by ``C`` and its dimensions renumbered; None if it is no such transpose, or
    if its free dimensions would come out in another order.

    A backward rule's ``inv(A).T @ g`` would otherwise store ``inv(A)`` and its
    transpose (Equinox's ``filter_custom_vjp``, whose forward rule reads ``inv(A)``):
    XLA reads a matrix's transpose through the product's dimension numbers, as it
    does for ``jax.jit``, at no cost.
    """
    eqn = getattr(args[side], "parent", None)  # the staged equation that made it (a TracingEqn)
    if (not folder.is_known(args[side]) or getattr(eqn, "primitive", None) is not lax.transpose_p
            or len(getattr(eqn, "in_tracers", ())) != 1):
        return None
    source = eqn.in_tracers[0]
    const = _compat.const_of(trace, source)
    source = source if const is None else const
    perm = eqn.params["permutation"]
    (contract, batch) = params["dimension_numbers"]
    contract, batch = list(contract), list(batch)
    contract[side] = tuple(perm[d] for d in contract[side])
    batch[side] = tuple(perm[d] for d in batch[side])
    free = [perm[d] for d in range(len(perm)) if d not in (*params["dimension_numbers"][0][side],
                                                           *params["dimension_numbers"][1][side])]
    if free != sorted(free):
        return None
    folder.stats.staged["dot_general (through a transpose)"] += 1
    new_args = [source, args[1]] if side == 0 else [args[0], source]
    return new_args, dict(params, dimension_numbers=(tuple(contract), tuple(batch)))


def _reassociate(folder: Folder, trace, args, params):
    """``(C @ D) @ z`` for ``C @ v``, ``v`` staged as ``D @ z``, ``C`` and ``D`` known
    matrices and ``z`` a vector, where that costs fewer FLOPs per call; in nested traces
    only (loop bodies, branches, custom rules): the collapse reassociates the rest."""
    if not folder.nested:
        return NotImplemented
    c, v = matrix_vector(folder, trace, args, params)
    d, z = known_product(folder, trace, v) if c is not None else (None, None)
    if d is None or _options(params) != _options(v.parent.params):  # the same precision
        return NotImplemented
    (m, k), n = jnp.shape(c), jnp.shape(d)[1]
    if not _cost.reassociation_pays(m, k, n):
        return NotImplemented
    folder.stats.staged["dot_general (reassociated)"] += 1
    with trace.as_current():
        cd = lax.dot_general(c, d, (((1,), (0,)), ((), ())), **_options(params))
        return lax.dot_general(cd, z, (((1,), (0,)), ((), ())), **_options(params))


def reassociation_saving(eqn, known: set, producers: dict, nested: bool) -> _cost.Cost:
    """What :func:`_reassociate` saves a call on a product ``eqn`` of a jaxpr not folded yet."""
    c, v = _matrix_vector_vars(eqn, known)
    producer = producers.get(v) if nested and c is not None else None
    if producer is None or producer.primitive is not P.dot_general_p or _options(eqn.params) != _options(
            producer.params):
        return _cost.ZERO
    d, _ = _matrix_vector_vars(producer, known)
    if d is None:
        return _cost.ZERO
    (m, k), n = c, d[1]
    if not _cost.reassociation_pays(m, k, n):
        return _cost.ZERO
    itemsize = eqn.outvars[0].aval.dtype.itemsize
    before = _cost.Cost(flops=2 * (m * k + k * n), bytes=(m * k + k * n) * itemsize, kernels=2.0)
    return before - _cost.matrix_cost(m, n, False, itemsize)[0]


def _matrix_vector_vars(eqn, known: set) -> tuple:
    """``((rows, cols), v)``: the shape of the known matrix ``C`` and the unknown vector
    ``v`` of a product ``eqn`` that is ``C @ v`` (as :func:`matrix_vector` reads one); else Nones."""
    (contract, batch) = eqn.params["dimension_numbers"]
    if batch != ((), ()):
        return None, None
    for side in (0, 1):
        c, v = eqn.invars[side], eqn.invars[1 - side]
        if (isinstance(v, _compat.Literal) or v in known or not (isinstance(c, _compat.Literal) or c in known)
                or c.aval.ndim != 2 or v.aval.ndim != 1):
            continue
        rows, cols = c.aval.shape
        return ((rows, cols) if contract[side] == (1,) else (cols, rows)), v
    return None, None


def _options(params: dict) -> dict:
    return {k: params[k] for k in ("precision", "preferred_element_type") if k in params}


def matrix_vector(folder: Folder, trace, args, params) -> tuple:
    """``(C, v)`` with ``dot_general(*args, **params) == C @ v``, ``C`` a known matrix
    (``args``' or its transpose, materialized) and ``v`` a dynamic vector; else Nones."""
    (contract, batch) = params["dimension_numbers"]
    if batch != ((), ()) or params.get("preferred_element_type") not in (None, jnp.result_type(*args)):
        return None, None
    args = [a if (c := _compat.const_of(trace, a)) is None else c for a in args]
    for side in (0, 1):
        c, v = args[side], args[1 - side]
        if not folder.is_known(c) or folder.is_known(v) or jnp.ndim(c) != 2 or jnp.ndim(v) != 1:
            continue
        c = folder.materialize(c)
        if contract[side] != (1,):
            with trace.as_current():  # a rule may run where JAX set no current trace (its linearization)
                c = c.T
        return c, v
    return None, None


def known_product(folder: Folder, trace, x) -> tuple:
    """``(D, z)`` if ``x`` was staged as a product ``D @ z`` of a known matrix and a dynamic vector
    (see :func:`matrix_vector`); else Nones."""
    eqn = getattr(x, "parent", None)  # the staged equation that made x (a TracingEqn)
    if getattr(eqn, "primitive", None) is not lax.dot_general_p or len(getattr(eqn, "in_tracers", ())) != 2:
        return None, None
    return matrix_vector(folder, trace, eqn.in_tracers, eqn.params)


def _contract_source(side: int, source, bcast: dict, args, params):
    """``dot_general(*args, **params)`` where ``args[side]`` is ``broadcast_in_dim(source, **bcast)``."""
    shape, dims = bcast["shape"], bcast["broadcast_dimensions"]
    (contract_l, contract_r), (batch_l, batch_r) = params["dimension_numbers"]
    ranks = [len(jnp.shape(a)) for a in args]
    letters = iter(string.ascii_letters)
    names = [[None] * r for r in ranks]
    for dl, dr in [*zip(batch_l, batch_r), *zip(contract_l, contract_r)]:
        names[0][dl] = names[1][dr] = next(letters)
    for side_names in names:
        for d, n in enumerate(side_names):
            side_names[d] = n or next(letters)
    out = [names[0][d] for d in batch_l]
    out += [names[0][d] for d in range(ranks[0]) if d not in (*contract_l, *batch_l)]
    out += [names[1][d] for d in range(ranks[1]) if d not in (*contract_r, *batch_r)]
    # the dimensions of the expanded operand that ``source`` really has (a
    # size-1 dimension stretched by the broadcast is one it does not)
    real = [d for i, d in enumerate(dims) if jnp.shape(source)[i] == shape[d]]
    source = jnp.reshape(source, [shape[d] for d in real])
    expanded_names = [names[side][d] for d in real]
    operands = [source, args[1 - side]] if side == 0 else [args[0], source]
    subscripts = [expanded_names, names[1 - side]] if side == 0 else [names[0], expanded_names]
    kept = [n for n in out if any(n in s for s in subscripts)]
    spec = f"{''.join(subscripts[0])},{''.join(subscripts[1])}->{''.join(kept)}"
    y = jnp.einsum(spec, *operands, precision=params.get("precision"),
                   preferred_element_type=params.get("preferred_element_type"))
    out_shape = [jnp.shape(args[s])[d] for s, d in _origins(out, names)]
    return lax.broadcast_in_dim(y, out_shape, [out.index(n) for n in kept])


def _origins(out: list[str], names: list[list[str]]) -> list[tuple[int, int]]:
    """For each output dimension (by name), an operand dimension it comes from."""
    where = {n: (s, d) for s in (1, 0) for d, n in enumerate(names[s])}
    return [where[n] for n in out]
