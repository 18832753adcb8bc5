"""The matrix of an affine region, built on the host: NumPy rules keyed by primitive.

:mod:`pejit._residual._collapse` replaces a region of the residual that is affine in its
dynamic inputs by ``M @ x + c``. Built by ``jax.vmap`` of ``jax.jvp`` over the
unit basis, ``M`` of TFC's 1440-equation PDE region cost a second: tracing the
transformed region, then a compile per new shape of its batched products.
Here one loop over the region's equations carries, per value, its value at
zero and its tangents along a chunk of unit vectors (a leading batch axis),
with one NumPy rule per primitive, so nothing is traced or compiled; it takes
tens of milliseconds.

A rule ``rule(args, batched, **params)`` is the primitive with NumPy, as
``jax.vmap`` would batch it: ``batched[i]`` says whether ``args[i]`` carries
a leading batch axis. Each rule runs on the values at zero (nothing
batched; once, see `_Known`), and on the tangents, where the operands that
the output is linear in (:data:`FIXED` lists the others: the known factor of
a product, a selection's predicate, indices) carry their tangents. The rules
cover what :mod:`pejit._residual.rules.affine` admits into a region; a region with
anything else, or off one CPU device, or not in float32/float64, is left to
the ``jvp`` construction (:func:`jacobian` returns None).

Contractions and sums round as NumPy's BLAS does, not as XLA's kernels do:
the matrix, like any collapse, changes rounding (see docs/numerics.md).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import primitives as P

from .. import _compat
from .._fold import _device, _host, _offload
from .._fold._primitives import call_body

#: ``rule(args, batched, **params)``: a primitive with NumPy, as ``jax.vmap`` batches it.
LinearRule = Callable[..., Any]
#: A primitive's rule here, registered with its other facets
#: (:func:`pejit._residual.rules.registry.register_primitive`); the rules below
#: are the built-in ones.
LINEAR_RULES: dict[Any, LinearRule] = {}

#: Per primitive, ``fixed(n)``: of its ``n`` operands, those that a region's
#: output is not linear in (registered with its rule): they are known there
#: (``pejit._residual.rules.affine`` admits nothing else), and the tangent
#: pass reads their values. For ``mul`` and ``dot_general`` it is whichever
#: factor has no tangent.
FIXED: dict[Any, Callable[[int], Sequence[int]]] = {}
_PRODUCTS = (P.mul_p, P.dot_general_p)

#: At most this many bytes of a region's values at zero are kept from the
#: first batch of unit vectors for the others (see `_Known`).
KNOWN_BYTES = 64 * 2**20

#: A build is shared with the worker thread (see :func:`jacobian`) when its
#: tangents hold at least this many elements in all (unit vectors times the
#: elements of the region's values). Each pass over the region costs tens
#: of microseconds per equation in Python, and two threads on memory-bound
#: NumPy loops gain little: sharing pays only once the NumPy work dwarfs the
#: extra pass's Python, at billions of elements; below, it costs time.
SHARED_ELEMENTS = 2 * 10**9


class _Unsupported(Exception):
    """The region holds something no rule here covers."""


def elementwise(ufunc):
    def rule(args, batched, **params):
        # NumPy aligns trailing axes: an unbatched operand (its shape, or a
        # scalar) meets a batched one (B, *shape) as vmap would have it; a
        # batched scalar needs its axes spelled out
        rank = max(np.ndim(a) - b for a, b in zip(args, batched))
        args = [a.reshape(a.shape[0], *[1] * (rank - a.ndim + 1), *a.shape[1:]) if b else a
                for a, b in zip(args, batched)]
        return _with_zeros(ufunc, args)

    return rule


def _with_zeros(ufunc, args) -> np.ndarray:
    """``ufunc(*args)``, skipping the work where an operand holds only zeros:
    a sum is the other operand, a product of finite values is zeros, one
    zero broadcast (so that what reads it skips its work in turn).

    The zeros are a folded constant, compacted (a PDE's collapse multiplies
    and adds hundreds of them to its tangents), or a constant of zeros as
    the fold computed it, read here when it is small beside the result (a
    batch of tangents times a vector of zeros, whose products are then
    added and subtracted). The signs of zeros are not kept, as the collapse does not
    keep rounding (see the module docstring)."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    small = math.prod(shape) // 8
    zero = [isinstance(a, np.ndarray) and _host.only_zeros(a, small) for a in args]
    if any(zero) and ufunc in (np.add, np.subtract, np.multiply):
        if ufunc is np.multiply:
            if all(z or _host.all_finite(a) for a, z in zip(args, zero)):
                return _zeros(shape, np.result_type(*args))
        else:
            rest = [(i, a) for i, (a, z) in enumerate(zip(args, zero)) if not z]
            if not rest:
                return _zeros(shape, np.result_type(*args))
            (i, a), = rest
            if np.shape(a) == shape and np.result_type(*args) == a.dtype:
                return -a if ufunc is np.subtract and i == 1 else a
    return ufunc(*args)


def _zeros(shape, dtype) -> np.ndarray:
    return np.broadcast_to(np.zeros((), dtype), shape)


def _lifted(args, batched) -> tuple[list[np.ndarray], bool]:
    """All ``args`` with the batch axis if any has it, and whether one did."""
    size = next((a.shape[0] for a, b in zip(args, batched) if b), None)
    if size is None:
        return list(args), False
    return [a if b else np.broadcast_to(a, (size, *np.shape(a))) for a, b in zip(args, batched)], True


def convert_element_type(args, batched, *, new_dtype, **_):
    return args[0].astype(new_dtype)


def copy(args, batched, **_):
    return args[0]


def select_n(args, batched, **_):
    which, *cases = args
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0])
    return np.choose(which.astype(np.intp), np.broadcast_arrays(*cases))


def broadcast_in_dim(args, batched, *, shape, broadcast_dimensions, **_):
    (x,), (b,) = args, batched
    kept = [1] * len(shape)
    for d, n in zip(broadcast_dimensions, x.shape[b:]):
        kept[d] = n
    lead = x.shape[:b]
    return np.broadcast_to(x.reshape((*lead, *kept)), (*lead, *shape))


def reshape(args, batched, *, new_sizes, dimensions=None, **_):
    (x,), (b,) = args, batched
    if dimensions is not None:
        raise _Unsupported("reshape with dimensions")
    return x.reshape((*x.shape[:b], *new_sizes))


def squeeze(args, batched, *, dimensions):
    (x,), (b,) = args, batched
    return np.squeeze(x, tuple(d + b for d in dimensions))


def transpose(args, batched, *, permutation):
    (x,), (b,) = args, batched
    return np.transpose(x, (*range(b), *(p + b for p in permutation)))


def slice_(args, batched, *, start_indices, limit_indices, strides=None):
    (x,), (b,) = args, batched
    strides = strides or (1,) * len(start_indices)
    return x[(slice(None),) * b + tuple(slice(s, e, k) for s, e, k in zip(start_indices, limit_indices, strides))]


def rev(args, batched, *, dimensions):
    (x,), (b,) = args, batched
    return np.flip(x, tuple(d + b for d in dimensions)) if dimensions else x


def reduce_sum(args, batched, *, axes, **_):
    (x,), (b,) = args, batched
    return np.sum(x, axis=tuple(a + b for a in axes))


def cumsum(args, batched, *, axis, reverse):
    (x,), (b,) = args, batched
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis + b), axis + b), axis + b)
    return np.cumsum(x, axis + b)


def concatenate(args, batched, *, dimension):
    xs, b = _lifted(args, batched)
    return np.concatenate(xs, dimension + b)


def pad(args, batched, *, padding_config):
    (x, value), (b, bv) = args, batched
    if bv:  # tangents: those of a known padding value are zero
        if np.any(value):
            raise _Unsupported("pad by a varying value")
        value = 0
    config = [(0, 0, 0)] * b + list(padding_config)
    # interior and positive padding by placing x in a larger array, then
    # negative padding by cropping it
    grown = [lo_ + hi_ + n + max(n - 1, 0) * k for (lo, hi, k), n in zip(config, x.shape)
             for lo_, hi_ in [(max(lo, 0), max(hi, 0))]]
    out = np.full(grown, value, dtype=x.dtype)
    out[tuple(slice(max(lo, 0), max(lo, 0) + max(n - 1, 0) * (k + 1) + 1, k + 1)
              for (lo, _, k), n in zip(config, x.shape))] = x
    return out[tuple(slice(-min(lo, 0), g + min(hi, 0)) for (lo, hi, _), g in zip(config, grown))]


def _starts(starts, shape, sizes) -> list[int]:
    # XLA clamps the slice into the operand
    return [min(max(int(s), 0), n - k) for s, n, k in zip(starts, shape, sizes)]


def dynamic_slice(args, batched, *, slice_sizes):
    x, *starts = args
    b = batched[0]
    begin = _starts(starts, x.shape[b:], slice_sizes)
    return x[(slice(None),) * b + tuple(slice(s, s + k) for s, k in zip(begin, slice_sizes))]


def dynamic_update_slice(args, batched, **_):
    (x, update), b = _lifted(args[:2], batched[:2])
    begin = _starts(args[2:], x.shape[b:], update.shape[b:])
    out = np.array(x)
    out[(slice(None),) * b + tuple(slice(s, s + k) for s, k in zip(begin, update.shape[b:]))] = update
    return out


def split(args, batched, *, sizes, axis):
    (x,), (b,) = args, batched
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis + b)


def dot_general(args, batched, *, dimension_numbers, **_):
    # as one matmul of (batch, free, contracted) by (batch, contracted, free):
    # BLAS, with no einsum path to plan each time; the vmap axis is a free one
    (lhs, rhs), (bl, br) = args, batched
    (lc, rc), (lb, rb) = dimension_numbers
    lc, lb = [d + bl for d in lc], [d + bl for d in lb]
    rc, rb = [d + br for d in rc], [d + br for d in rb]
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    batch, contracted = [lhs.shape[d] for d in lb], math.prod(lhs.shape[d] for d in lc)
    free_l, free_r = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    left = np.transpose(lhs, lb + lf + lc).reshape(math.prod(batch), math.prod(free_l), contracted)
    right = np.transpose(rhs, rb + rc + rf).reshape(math.prod(batch), contracted, math.prod(free_r))
    out = None
    shape = (*batch, *free_l, *free_r)
    if any(_host.only_zeros(x, math.prod(shape) // 8) for x in (lhs, rhs)) and all(map(_host.all_finite, (lhs, rhs))):
        out = _zeros(shape, np.result_type(lhs, rhs))  # as in _with_zeros
    elif len(left) == 1:  # perhaps a seed of unit vectors
        out = _host.times_identity(left[0], right[0])
    out = (np.matmul(left, right) if out is None else out).reshape(shape)
    if bl or br:  # the vmap axis to the front: it is the first free axis of its operand
        out = np.moveaxis(out, len(batch) + (0 if bl else len(lf)), 0)
    return out


_CALLS = frozenset([_compat.jit_p, P.closed_call_p, P.custom_jvp_call_p])


class _Known:
    """A region's values at zero, by equation (a call's body's under
    :meth:`body`), kept from the first batch of unit vectors for the others
    while they fit in the ``room`` (bytes, shared with the bodies): they do
    not depend on the unit vectors, and computing them again for each batch
    is a large share of a large collapse."""

    def __init__(self, room: list[int]):
        self.room = room
        self.outs: dict[int, list] = {}
        self._bodies: dict[int, _Known] = {}

    def body(self, i: int) -> _Known:
        return self._bodies.setdefault(i, _Known(self.room))

    def keep(self, i: int, outs: list) -> None:
        size = sum(np.asarray(x).nbytes for x in outs)
        if i not in self.outs and size <= self.room[0]:
            self.outs[i] = outs
            self.room[0] -= size


class _Miss(Exception):
    """A value at zero not kept, met off the folding thread, where JAX's
    dispatch would not see its configuration (``enable_x64`` is per thread)."""


def _run(jaxpr, consts, values, tangents, known: _Known, alone: bool = True) -> tuple[list, list]:
    """Values and tangents (or None: zero) of ``jaxpr``'s outputs; ``known``
    gives values at zero and, on the folding thread (``alone``), keeps them."""
    env: dict[Any, tuple[Any, Any]] = {v: (x, None) for v, x in zip(jaxpr.constvars, consts)}
    env.update(zip(jaxpr.invars, zip(values, tangents)))

    def read(a):
        return (a.val, None) if isinstance(a, _compat.Literal) else env[a]

    last = {a: i for i, e in enumerate(jaxpr.eqns) for a in e.invars if isinstance(a, _compat.Var)}
    outputs = {v for v in jaxpr.outvars if isinstance(v, _compat.Var)}  # not literals: unhashable
    for i, eqn in enumerate(jaxpr.eqns):
        vals, tans = zip(*map(read, eqn.invars)) if eqn.invars else ((), ())
        varying = any(t is not None for t in tans)
        if eqn.primitive in _CALLS and varying:
            body, body_consts = call_body(eqn.params)
            outs, out_tans = _run(body, body_consts, vals, tans, known.body(i), alone)
        else:
            outs = known.outs.get(i)
            if outs is None and not alone:
                raise _Miss
            if varying:
                outs, out_tans = _linear(eqn, vals, tans, outs)
            else:
                outs, out_tans = _evaluate(eqn, vals) if outs is None else outs, [None] * len(eqn.outvars)
        if alone:
            known.keep(i, outs)
        for v, x, t in zip(eqn.outvars, outs, out_tans):
            if t is not None:
                dtype = v.aval.dtype  # possibly extended (PRNG keys): no np.dtype
                if dtype not in _host.FLOATS:
                    raise _Unsupported(f"a tangent of type {dtype}")
                x, t = np.asarray(x, dtype), np.asarray(t, dtype)
            env[v] = (x, t)
        for a in eqn.invars:  # free what no later equation reads
            if isinstance(a, _compat.Var) and last[a] == i and a not in outputs:
                env.pop(a, None)
    return [read(v)[0] for v in jaxpr.outvars], [read(v)[1] for v in jaxpr.outvars]


def _evaluate(eqn, vals) -> list:
    """Outputs of an equation on known values: by its host rule, else JAX's."""
    out = _host.on_host(eqn.primitive, vals, eqn.params)
    if out is None:
        out = _compat.bind_outside(eqn.primitive, vals, eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _linear(eqn, vals, tans, outs: list | None) -> tuple[list, list]:
    """Values (``outs`` where known) and tangents of a linear equation's outputs."""
    prim = eqn.primitive
    rule = LINEAR_RULES.get(prim)
    if rule is None:
        raise _Unsupported(prim.name)
    n = len(vals)
    if prim in _PRODUCTS:
        fixed = {i for i, t in enumerate(tans) if t is None}
        if not fixed:
            raise _Unsupported(f"{prim.name} of two varying values")
    else:
        fixed = set(FIXED.get(prim, lambda n: ())(n))
    if any(tans[i] is not None for i in fixed):
        raise _Unsupported(f"{prim.name} varying in a fixed operand")
    args, batched = [], []
    for i, (x, t) in enumerate(zip(vals, tans)):
        if i in fixed:
            args.append(np.asarray(x)), batched.append(False)
        elif t is None:  # a known operand the output is linear in adds nothing to the tangents
            args.append(np.broadcast_to(np.zeros((), np.asarray(x).dtype), np.shape(x))), batched.append(False)
        else:
            args.append(t), batched.append(True)
    tan = rule(args, batched, **eqn.params)
    if outs is None:
        out = rule([np.asarray(x) for x in vals], [False] * n, **eqn.params)
        outs = list(out) if prim.multiple_results else [out]
    return outs, list(tan) if prim.multiple_results else [tan]


def covers(eqns) -> bool:
    """Whether the rules here cover these equations of a region, where the host builds
    matrices (see :mod:`pejit._fold._device`)."""
    def covered(eqn) -> bool:
        if eqn.primitive in _CALLS:
            body, _ = call_body(eqn.params)
            return all(map(covered, body.eqns))
        return eqn.primitive in LINEAR_RULES

    return _device.current().host_build_flops > 0 and all(map(covered, eqns))


def _collect(future, chunk, lo: int, hi: int) -> list[np.ndarray]:
    """A batch's columns from the worker, or computed here: where the worker
    has not started it, or met a value at zero that was not kept."""
    if not future.cancel():
        try:
            return future.result()[1]
        except _Miss:
            pass
    return chunk(lo, hi)[1]


@_host.remembering()  # each batch of unit vectors reads the same constants: checked once
def jacobian(sub, consts: Sequence[Any], sources: Sequence[Any], batch: int) -> list[tuple[Any, Any]] | None:
    """``(columns, c)`` per output of ``sub``: the output is ``columns.T @ concat(sources, flattened) + c``.

    ``sub`` is a region as :func:`pejit._residual._collapse._sub_jaxpr` cuts it: its
    inputs are the known values it reads (``consts``, concrete) and then its
    dynamic ``sources``. Tangents are carried ``batch`` unit vectors at a
    time. None where a rule is missing (see the module docstring).
    """
    sizes = [math.prod(s.aval.shape) for s in sources]
    starts = np.cumsum([0, *sizes])
    total = int(starts[-1])
    if not total or any(s.aval.dtype not in _host.FLOATS for s in sources):
        return None
    zeros = [np.zeros(s.aval.shape, s.aval.dtype) for s in sources]
    consts = [np.asarray(c) if getattr(c, "dtype", None) in _host.FLOATS else c for c in consts]
    known = _Known([KNOWN_BYTES])

    def chunk(lo: int, hi: int, alone: bool = True) -> tuple[list, list[np.ndarray]]:
        """The offsets, and the columns ``lo:hi`` of each output."""
        seeds = []
        for s, n, start, zero in zip(sources, sizes, starts, zeros):
            a, b = max(lo, start), min(hi, start + n)
            if a >= b:
                seeds.append(None)
                continue
            seed = np.zeros((hi - lo, n), zero.dtype)
            seed[np.arange(a - lo, b - lo), np.arange(a - start, b - start)] = 1
            seeds.append(seed.reshape(hi - lo, *zero.shape))
        offsets, tans = _run(sub, (), [*consts, *zeros], [None] * len(consts) + seeds, known, alone)
        return offsets, [np.zeros((hi - lo, v.size), v.dtype) if t is None else t.reshape(hi - lo, -1)
                         for v, t in zip(offsets, tans)]

    handed: dict[int, Any] = {}
    try:
        # shared with the worker thread where a second core runs it (NumPy's
        # loops release the GIL): one unit vector first, keeping the values
        # at zero, then half of the batches each, two at a time, of half the size
        elements = total * sum(math.prod(v.aval.shape) for e in sub.eqns for v in e.outvars)
        spare = _offload.spare() if elements >= SHARED_ELEMENTS else None
        head = 1 if spare else min(batch, total)
        offsets, first = chunk(0, head)
        rest = total - head
        n = -(-rest // (max(1, batch // 2) if spare else batch))
        n += n % 2 if spare else 0
        bounds = [(head + rest * i // n, head + rest * (i + 1) // n) for i in range(n)]
        if spare is not None:
            handed = {lo: spare.submit(contextvars.copy_context().run, chunk, lo, hi, False) for lo, hi in bounds[1::2]}
        mine = {lo: chunk(lo, hi)[1] for lo, hi in bounds if lo not in handed}
        columns = [first, *(mine[lo] if lo in mine else _collect(handed[lo], chunk, lo, hi) for lo, hi in bounds)]
    except _Unsupported:
        return None
    finally:
        for future in handed.values():  # not needed now, where a batch failed
            future.cancel()
    return [(np.concatenate(cols), c) for cols, c in zip(zip(*columns), offsets)]
