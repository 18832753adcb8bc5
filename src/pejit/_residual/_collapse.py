"""Residual algebra: collapse regions affine in the dynamic inputs into one matrix.

After folding, a residual equation whose inputs include a dynamic value stays,
even when everything it does with that value is linear: TFC's PDE step
``xi - lstsq(J, L(xi))`` leaves over a thousand such equations where one
101x101 matrix-vector product would do. :mod:`pejit._residual._affine` finds
the *affine regions* of the residual program (equations that the rules in
:mod:`pejit._residual.rules.affine` say are affine in their varying inputs, given which
inputs are known, grouped into connected components) and the cut of each;
this pass replaces a region by ``M @ concat(sources) + c`` per output where a
cost model says that pays. ``M`` is the region's Jacobian, built at fold time
by ``jax.jvp`` of the region over the unit basis of its inputs (or on the
host, :mod:`pejit._residual._linear`), and ``c`` the region at zero; both are ordinary
JAX computations on the folded constants, so they fold concretely (the TFC
form, ``specialize_jaxpr``) or are staged into a folding program when the
constants are abstract (the call-time form).

Collapsing covers reassociation too: ``C1 @ (C2 @ x)`` becomes ``(C1 @ C2)
@ x`` when the product is smaller to apply than the chain, and a sub-region
collapses on its own: in ``tanh(A @ (B @ x) + C @ x)`` the argument of
``tanh`` does.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from pejit import specialize_jaxpr
  >>> A, B = jnp.ones((8, 64)), jnp.ones((64, 8))
  >>> cj = jax.make_jaxpr(lambda A, B, x: jnp.tanh(A @ (B @ x) + 2 * x))(A, B, jnp.ones(8))
  >>> spec = specialize_jaxpr(cj, known={0: A, 1: B})
  >>> [e.primitive.name for e in spec.jaxpr.eqns]
  ['dot_general', 'tanh']
  >>> print(spec.report.collapsed[0])
  4 equations, 8 -> 8 elements: 2.06e+03 -> 128 FLOPs per call, 256 bytes stored
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import Primitive

from .. import _compat
from .._fold import _batch, _device
from . import _linear
from ._affine import CONST, Region, classify, offsets, plan_cut, regions, size
from .._fold._values import nbytes
from .._fold import _cost
from .._fold._cost import eqn_flops

# The most FLOPs building one region's matrix may take (its inputs times the
# region's FLOPs per call) are the device's (pejit._fold._device): by jax.jvp,
# compiled, ``build_flops`` (8e9 on a CPU: about a second, the order of folding
# the ``inv`` and ``cholesky`` of a 1000x1000 matrix); by the host
# (``pejit._residual._linear``: NumPy's BLAS, nothing compiled, concrete
# constants), ``host_build_flops``: a large PDE's region, whose build takes
# hundreds of times the FLOPs a call takes, builds in about a second, and its
# residual then runs an order of magnitude or more faster.

#: Memory the fold-time Jacobian may use at once (the region is evaluated
#: on this many basis vectors together).
BUILD_BYTES = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class Collapse:
    """One affine region replaced by one matrix and one offset per output.

    Attributes:
      eqns: equations of the region.
      inputs: elements of the dynamic values the region reads.
      outputs: elements of the values it produces for the rest of the program.
      flops_before: estimated FLOPs per call of the region (`pejit._fold._cost`).
      flops_after: FLOPs per call of its matrices and offsets.
      bytes_stored: bytes of the matrices and offsets.
    """

    eqns: int
    inputs: int
    outputs: int
    flops_before: float
    flops_after: float
    bytes_stored: int

    def __str__(self) -> str:
        return (
            f"{self.eqns} equations, {self.inputs} -> {self.outputs} elements: "
            f"{self.flops_before:.3g} -> {self.flops_after:.3g} FLOPs per call, "
            f"{self.bytes_stored:,} bytes stored"
        )


def _sub_jaxpr(jaxpr, n_consts: int, region: Region, kinds):
    """The region as a jaxpr of (constants it reads, its sources) to its roots.

    Known values it reads that residual equations compute (a recomputed
    expansion) are computed inside, from the constants.
    """
    producer = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    keep, stack = set(region.eqns), list(region.eqns)
    while stack:
        for a in jaxpr.eqns[stack.pop()].invars:
            if isinstance(a, _compat.Var) and kinds[a] == CONST and a in producer and producer[a] not in keep:
                keep.add(producer[a])
                stack.append(producer[a])
    eqns = [jaxpr.eqns[i] for i in sorted(keep)]
    read = {a for e in eqns for a in e.invars if isinstance(a, _compat.Var)}
    constvars = [v for v in jaxpr.invars[:n_consts] if v in read]
    sub = _compat.with_outvars(jaxpr.replace(eqns=eqns), region.roots)
    return _compat.with_invars(sub, [*constvars, *region.sources]), constvars


@dataclasses.dataclass(frozen=True, eq=False)
class _Build:
    """How to build a region's matrices and offsets from the constants it reads.

    Hashed by identity: it is the parameter of an :data:`affine_matrices_p`
    equation.
    """

    sub: Any  # the region as a jaxpr: (constants it reads, its sources) -> its roots
    region: Region
    batch: int  # unit vectors evaluated together

    @functools.cached_property
    def starts(self) -> np.ndarray:
        return np.cumsum([0, *map(size, self.region.sources)])

    def matrices(self, columns, offsets) -> list[Any]:
        """``[M, c]`` per root, from its columns (one row per unit vector) and its value at zero."""
        starts, sources, total = self.starts, self.region.sources, int(self.starts[-1])
        out = []
        for r, cols, c in zip(self.region.roots, columns, offsets):
            picked = np.concatenate([np.arange(starts[k], starts[k + 1])
                                     for k, s in enumerate(sources) if s in self.region.root_sources[r]])
            m = cols.T if len(picked) == total else cols[picked].T
            out.extend([m.astype(r.aval.dtype), c.astype(r.aval.dtype)])
        return out

    def out_avals(self) -> list[Any]:
        out = []
        for r in self.region.roots:
            n_in = sum(map(size, self.region.root_sources[r]))
            out.extend([_compat.ShapedArray((size(r), n_in), r.aval.dtype), _compat.ShapedArray(r.aval.shape, r.aval.dtype)])
        return out

    def on_host(self, consts) -> list[Any] | None:
        """By the host rules of :mod:`pejit._residual._linear`: nothing traced or compiled.

        None where they do not cover the region.
        """
        built = _linear.jacobian(self.sub, consts, self.region.sources, self.batch)
        return None if built is None else self.matrices(*zip(*built))

    def by_jvp(self, *consts, loop: bool = False) -> list[Any]:
        """With ``jax.jvp`` along each unit vector, ``batch`` at a time: by ``vmap``, or ``lax.map`` if ``loop``."""
        sources, starts = self.region.sources, self.starts
        total = int(starts[-1])

        def region_at(*xs):
            return _compat.eval_jaxpr(self.sub, [], *consts, *xs)

        zeros = [jax.numpy.zeros(s.aval.shape, s.aval.dtype) for s in sources]

        def column(j):
            unit = [(jax.numpy.arange(size(s)) == j - start).astype(s.aval.dtype).reshape(s.aval.shape)
                    for s, start in zip(sources, starts)]
            return [t.reshape(-1) for t in jax.jvp(region_at, zeros, unit)[1]]

        if loop:
            columns = lax.map(column, jax.numpy.arange(total), batch_size=self.batch)
        else:
            chunks = [jax.vmap(column)(jax.numpy.arange(i, min(i + self.batch, total)))
                      for i in range(0, total, self.batch)]
            columns = [jax.numpy.concatenate(cs) if len(cs) > 1 else cs[0] for cs in zip(*chunks)]
        return self.matrices(columns, region_at(*zeros))


def _affine_matrices_impl(*consts, build: _Build):
    built = build.on_host(consts)
    return built if built is not None else jax.jit(functools.partial(build.by_jvp, loop=True))(*consts)


#: A region's matrices and offsets as one equation of a folding program
#: (abstract constants, the call-time form): evaluated on the host for the
#: first value, compiled (by ``jax.jvp`` in a loop) when values change.
affine_matrices_p = Primitive("affine_matrices")
#: The same for a region whose build is within `HOST_BUILD_FLOPS` but over
#: `BUILD_FLOPS`: compiled by ``jax.jvp`` it would cost more than folding
#: from scratch (TFC's full-size PDE: minutes), so it has no lowering. The
#: host builds it for every value, as for the TFC form's one value, and a
#: folding program that holds one is evaluated, never compiled: each new
#: value costs what its first did, less the trace, and gets the same
#: collapsed residual the TFC form gets.
host_affine_matrices_p = Primitive("host_affine_matrices")
for _p in (affine_matrices_p, host_affine_matrices_p):
    _p.multiple_results = True
    _p.def_impl(_affine_matrices_impl)
    _p.def_abstract_eval(lambda *avals, build: build.out_avals())
_compat.lower_as(affine_matrices_p, lambda *consts, build: build.by_jvp(*consts, loop=True))


def _jacobian(
    sub, consts: Sequence[Any], region: Region, batch: int, staged: Primitive | None, backend: str
) -> list[tuple[Any, Any]]:
    """``(M, c)`` per root: the root is ``M @ concat(its sources, flattened) + c``.

    ``c`` is the region at zero and the columns of ``M`` its derivative along
    each unit vector (exact for an affine map: no differencing), ``batch``
    columns at a time. Concrete constants go to the host rules of
    :mod:`pejit._residual._linear` first; a region they do not cover is evaluated
    with ``jax.jvp``, op by op where that is cheaper than compiling (a
    region of a thousand equations under ``jvp`` takes seconds to compile;
    see :func:`pejit._fold._cost.build_compiles`) or ``backend`` (``FoldOptions.backend``) says
    so. In a folding program (abstract constants) the build is one equation
    of the primitive ``staged`` (:data:`affine_matrices_p` or
    :data:`host_affine_matrices_p`).
    """
    build = _Build(sub, region, batch)
    if staged is not None:
        built = staged.bind(*consts, build=build)
    elif backend != "compiled" and (built := build.on_host(consts)) is not None:
        pass
    elif backend == "compiled" or backend == "auto" and _cost.build_compiles(sub.eqns):
        built = jax.jit(build.by_jvp)(*consts)
    else:
        # Op by op, as a folding batch: the tangents and batches of the
        # region's equations are traced once, then evaluated by the folding
        # back end (where the host evaluates what it can: see pejit._fold._host).
        closed = jax.make_jaxpr(build.by_jvp)(*consts)
        built = _batch.run_jaxpr(closed, consts, backend)
    return list(zip(built[::2], built[1::2]))


def _peak_bytes(jaxpr, kinds) -> int:
    """Bytes of varying values live at once while ``jaxpr`` is evaluated.

    Values are freed at their last use; known ones are left out, since
    they are shared by all the basis vectors evaluated together.
    """
    last = {a: i for i, e in enumerate(jaxpr.eqns) for a in e.invars if isinstance(a, _compat.Var)}
    live = sum(nbytes(v.aval) for v in jaxpr.invars if kinds[v] != CONST)
    peak = live
    for i, e in enumerate(jaxpr.eqns):
        live += sum(nbytes(v.aval) for v in e.outvars if kinds.get(v) != CONST)
        peak = max(peak, live)
        dead = {a for a in e.invars if isinstance(a, _compat.Var) and last[a] == i and kinds[a] != CONST}
        live -= sum(nbytes(a.aval) for a in dead)
    return peak


def _apply(shape, m, c, *xs):
    """What replaces a region's root: ``M @ concat(xs) + c`` (no ``c``: zero)."""
    flat = [lax.convert_element_type(lax.reshape(x, (math.prod(x.shape),)), m.dtype) for x in xs]
    vec = flat[0] if len(flat) == 1 else lax.concatenate(flat, 0)
    y = lax.reshape(lax.dot_general(m, vec, (((1,), (0,)), ((), ()))), shape)
    return y if c is None else lax.add(y, c)




def collapse(
    jaxpr, consts: Sequence[Any], max_bytes: int, backend: str = "auto"
) -> tuple[Any, list[Any], list[Collapse]]:
    """Collapse the affine regions of ``jaxpr`` (open: its leading inputs are ``consts``) where it pays.

    A region is collapsed when its matrices and offsets take at most
    ``max_bytes``, applying them pays per call (:func:`pejit._fold._cost.collapse_pays`:
    never when its dynamic inputs are large, since the matrix grows with
    them), and building them at most the device's ``build_flops``
    (``host_build_flops`` when the host builds them). Returns the new jaxpr (open, with its constants)
    and what was collapsed; dead equations and constants are left for
    ``pejit._fold._primitives.prune``.
    """
    n = len(consts)
    kinds = classify(jaxpr, [True] * n + [False] * (len(jaxpr.invars) - n))
    shifted = offsets(jaxpr, kinds)
    chosen = list(_chosen(jaxpr, kinds, shifted, max_bytes, backend))
    if not chosen:
        return jaxpr, list(consts), []
    staged = any(isinstance(c, _compat.Tracer) for c in consts)
    subs = [_sub_jaxpr(jaxpr, n, region, kinds) for region, _, _ in chosen]
    index = {v: i for i, v in enumerate(jaxpr.invars[:n])}
    batches = [max(1, min(c.inputs, BUILD_BYTES // max(1, _peak_bytes(sub, kinds))))
               for (sub, _), (_, _, c) in zip(subs, chosen)]
    built = [_jacobian(sub, [consts[index[v]] for v in constvars], region, batch,
                       (host_affine_matrices_p if on_host else affine_matrices_p) if staged else None, backend)
             for (sub, constvars), (region, on_host, _), batch in zip(subs, chosen, batches)]
    producer = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    inserts: dict[int, list] = {}
    rename: dict[Any, Any] = {}
    new_vars, new_consts = [], []
    for (region, _, _), pairs in zip(chosen, built):
        for r, (m, c) in zip(region.roots, pairs):
            srcs = region.root_sources[r]
            c = c if r in shifted else None
            avals = [jax.ShapeDtypeStruct(s.aval.shape, s.aval.dtype) for s in srcs]
            mini = jax.make_jaxpr(functools.partial(_apply, r.aval.shape))(m, c, *avals)
            mvar, *xvars = mini.jaxpr.invars
            if c is not None:
                cvar, *xvars = xvars
                new_vars.append(cvar)
                new_consts.append(c)
            to_source = dict(zip(xvars, srcs))
            eqns = [e.replace(invars=[to_source.get(a, a) if isinstance(a, _compat.Var) else a for a in e.invars])
                    for e in mini.jaxpr.eqns]
            inserts.setdefault(producer[r], []).extend(eqns)
            rename[r] = mini.jaxpr.outvars[0]
            new_vars.append(mvar)
            new_consts.append(m)

    def sub(atoms):
        return [rename.get(a, a) if isinstance(a, _compat.Var) else a for a in atoms]

    eqns = []
    for i, e in enumerate(jaxpr.eqns):
        eqns.append(e.replace(invars=sub(e.invars)))
        eqns.extend(inserts.get(i, ()))
    invars = [*jaxpr.invars[:n], *new_vars, *jaxpr.invars[n:]]
    out = _compat.with_invars(jaxpr.replace(eqns=eqns, outvars=sub(jaxpr.outvars)), invars)
    return out, [*consts, *new_consts], [c for _, _, c in chosen]


def _chosen(jaxpr, kinds: dict, shifted: set, max_bytes: int, backend: str):
    """``(region, on_host, Collapse)`` of each region of ``jaxpr`` worth collapsing
    (see :func:`collapse`), its values' ``kinds`` and ``shifted`` ones given."""
    device = _device.current()
    eqn_costs = _cost.costs(jaxpr.eqns)
    for plan in (plan_cut(jaxpr, region, kinds, shifted, eqn_costs) for region in regions(jaxpr, kinds)):
        region = plan.region
        inputs = sum(map(size, region.sources))
        build = inputs * sum(eqn_flops(jaxpr.eqns[i]) for i in region.eqns)
        # or the host builds it (nothing compiled), for every value: a folding
        # program then stages the build as host_affine_matrices (see there)
        on_host = (build > device.build_flops and build <= device.host_build_flops and backend != "compiled"
                   and _linear.covers(jaxpr.eqns[i] for i in region.eqns))
        affordable = build <= device.build_flops or on_host
        # zero-size sources or roots: nothing to collapse (and no columns to build)
        if (inputs and all(map(size, region.roots)) and plan.stored <= max_bytes and affordable
                and _cost.collapse_pays(plan.before, plan.after)):
            yield region, on_host, Collapse(plan.removed, inputs, sum(map(size, region.roots)),
                                            plan.flops_before, plan.flops_after, plan.stored)


def collapsible(jaxpr, n: int, max_bytes: int, backend: str = "auto") -> bool:
    """Whether :func:`collapse` would collapse a region of ``jaxpr`` (open, its first ``n``
    inputs the constants), judged before any constant is known.

    No region is searched for where none could pay (:func:`pejit._fold._cost.collapse_can_pay`,
    from the program's cost, which the look has costed already): in a few elementwise
    equations, the search was most of what the look adds to a small program's first call."""
    if not _cost.collapse_can_pay(_cost.jaxpr_cost(jaxpr)):
        return False
    kinds = classify(jaxpr, [True] * n + [False] * (len(jaxpr.invars) - n))
    return any(True for _ in _chosen(jaxpr, kinds, offsets(jaxpr, kinds), max_bytes, backend))


__all__ = ["Collapse", "collapse", "collapsible"]
