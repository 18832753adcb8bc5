"""The cost model: what a program costs, and whether each of pejit's transformations pays.

pejit changes a program only where that makes it cheaper, and every such
decision is a function here, weighing one measure: :class:`Cost`, per
equation, from a rule per primitive (:data:`cost_rules`). A cost is
what an equation does per call (FLOPs, bytes it reads from memory, kernels it
launches on their own, library calls among them); the profile of the device
the program runs on (:mod:`pejit._fold._device`) turns it into seconds.

The decisions, and who asks:

* :func:`fold_pays`: the folding trace, for the known work of a program or
  of a loop body, branch or custom rule (``Folder``), and a scan's split
  (``rules.loops``); and before anything is evaluated, on what
  :func:`pejit._fold._known.known_work` reads off a jaxpr (a call's first
  specialization, ``auto``'s promotions), with :func:`fold_repays`: whether
  a fold wins back what it adds to the first call;
* :func:`stays_lazy`, :func:`on_the_spot`: whether a known value is stored,
  recomputed by the residual program, or computed at once;
* :func:`run_compiles`, :func:`one_program_pays`: how the fold evaluates known
  work (op by op or compiled);
* :func:`collapse_pays`, :func:`matrix_cost`, :func:`build_compiles`: the
  affine collapse (``pejit._residual._collapse``); :func:`reassociation_pays`:
  the products rule (``rules.products``);
* :func:`compiled_in`: small folded constants compiled into the program;
  :func:`share_pays`: equal and uniform ones passed once where a residual
  taking them all is compiled already (``_calls._specializer``);
* :func:`promotion_pays`: ``constant_argnums="auto"``.

Estimates are lower bounds where a primitive has no rule (it counts the
bytes it reads only), good for comparing a program before and after a
transformation, not for predicting wall-clock times. XLA's own cost analysis
needs a program it can lower and counts LAPACK custom calls as free, which
is exactly the work pejit folds.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from jax.extend.core import Literal

from . import _device
from ._primitives import FUSES_OPERANDS, called_jaxpr
from ._values import nbytes


class Cost(NamedTuple):
    """What running some equations costs per call.

    ``kernels`` counts the kernels XLA runs on their own (a product, a LAPACK
    or FFT call: never fused with their neighbours); ``library`` those of them
    that are library calls, which XLA never moves out of a loop (it hoists
    loop-invariant arithmetic and products, but not a custom call).
    """

    flops: float = 0.0
    bytes: float = 0.0
    kernels: float = 0.0
    library: float = 0.0

    def __add__(self, other: Cost) -> Cost:  # type: ignore[override]
        return Cost(self.flops + other.flops, self.bytes + other.bytes, self.kernels + other.kernels,
                    self.library + other.library)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.flops - other.flops, self.bytes - other.bytes, self.kernels - other.kernels,
                    self.library - other.library)

    def __mul__(self, times: float) -> Cost:  # type: ignore[override]
        return Cost(self.flops * times, self.bytes * times, self.kernels * times, self.library * times)

    def seconds(self, device: _device.DeviceProfile | None = None) -> float:
        """An estimate of the time a call spends on this work, on ``device`` (the current one)."""
        d = device or _device.current()
        return self.flops / d.flops_per_second + self.bytes / d.bytes_per_second + self.kernels * d.kernel_seconds

    def invariant(self, trips: int) -> Cost:
        """This work, loop-invariant in a body run ``trips`` times a call: XLA computes it
        once, but for its library calls, which run on every trip."""
        return Cost(self.flops, self.bytes, self.kernels + (trips - 1) * self.library, self.library * trips)


ZERO = Cost()

#: ``rule(eqn) -> Cost``: the FLOPs and kernels of one equation (the walk adds the bytes it reads).
CostRule = Callable[[Any], Cost]
#: A primitive's cost rule, registered with its other facets
#: (:func:`pejit._residual.rules.registry.register_primitive`); the rules below are the built-in ones.
cost_rules: dict[Any, CostRule] = {}


class Typed(NamedTuple):
    """A value as an equation's operand reads it: its type (a jaxpr's ``Var`` has one too)."""

    aval: Any


class Eqn(NamedTuple):
    """An equation not built yet (a recipe of the folding trace), as the rules read one."""

    primitive: Any
    invars: Sequence[Any]
    outvars: Sequence[Any]
    params: dict


def eqn_of(prim, in_avals: Sequence[Any], out_avals: Sequence[Any], params: dict) -> Eqn:
    """An :class:`Eqn` from its types."""
    return Eqn(prim, [Typed(a) for a in in_avals], [Typed(a) for a in out_avals], params)


def _rule_cost(eqn) -> Cost:
    rule = cost_rules.get(eqn.primitive)
    return rule(eqn) if rule is not None else ZERO


def costs(eqns: Iterable[Any]) -> list[Cost]:
    """The cost of each of ``eqns``, a program's equations in order (or equations not
    built yet, :class:`Eqn`), the bytes each reads included.

    An equation reads from memory every operand of its own when it cannot fuse
    its producers (``FUSES_OPERANDS``: a product, a library call, a loop), and
    otherwise only the operands that are in memory: the program's inputs and
    constants, and the outputs of equations XLA runs on their own. A chain of
    elementwise work on one array reads it once, as XLA fuses it.
    """
    eqns = list(eqns)
    fused = {id(v) for e in eqns if e.primitive in FUSES_OPERANDS for v in e.outvars}
    out = []
    for e in eqns:
        operands = [a for a in e.invars if not isinstance(a, Literal)]
        if e.primitive in FUSES_OPERANDS:
            operands = [a for a in operands if id(a) not in fused]
        out.append(_rule_cost(e) + Cost(bytes=sum(nbytes(a.aval) for a in operands)))  # a loop's rule counts its body's
    return out


def program_cost(eqns: Iterable[Any]) -> Cost:
    """The cost of running ``eqns`` once (see :func:`costs`)."""
    return sum(costs(eqns), ZERO)


def jaxpr_cost(jaxpr) -> Cost:
    """The cost of one evaluation of ``jaxpr`` (open or closed).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 3)), jnp.ones((3, 4)))
      >>> jaxpr_cost(cj)
      Cost(flops=48.0, bytes=72.0, kernels=1.0, library=0.0)
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    cost = _jaxpr_costs.get(jaxpr)
    if cost is None:
        cost = _jaxpr_costs[jaxpr] = program_cost(jaxpr.eqns)
    return cost


#: Costs by jaxpr (immutable; held weakly): each call of a ``jnp`` function on
#: the same types binds the same body, which the folding trace costs each time.
_jaxpr_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def eqn_flops(eqn) -> float:
    """Estimated FLOPs of one equation (0 where no rule knows it): what reports count."""
    return _rule_cost(eqn).flops


def jaxpr_flops(jaxpr) -> float:
    """Estimated FLOPs of one evaluation of ``jaxpr`` (open or closed).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 3)), jnp.ones((3, 4)))
      >>> jaxpr_flops(cj)
      48.0
    """
    return jaxpr_cost(jaxpr).flops


# -- the rules ------------------------------------------------------------------------
# Textbook counts for dense linear algebra, one operation per output element for
# elementwise work; a call, a loop, a branch: what its body costs.

def _size(v) -> int:
    return math.prod(getattr(v.aval, "shape", ()))


def _matrix(v) -> tuple[int, int, int]:
    """(batch, rows, cols) of a batch of matrices."""
    *batch, m, n = v.aval.shape
    return math.prod(batch), m, n


def _library(flops: float) -> Cost:
    return Cost(flops=flops, kernels=1.0, library=1.0)


def elementwise(eqn) -> Cost:
    return Cost(flops=sum(_size(v) for v in eqn.outvars))


def reduction(eqn) -> Cost:
    return Cost(flops=_size(eqn.invars[0]))


def dot_general(eqn) -> Cost:
    (contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    k = math.prod(lhs_shape[d] for d in contract)
    return Cost(flops=2 * _size(eqn.outvars[0]) * k, kernels=1.0)


def cholesky(eqn) -> Cost:
    b, n, _ = _matrix(eqn.invars[0])
    return _library(b * n**3 / 3)


def lu(eqn) -> Cost:
    b, m, n = _matrix(eqn.invars[0])
    k = min(m, n)
    return _library(b * (m * n * k - (m + n) * k**2 / 2 + k**3 / 3) * 2)


def triangular_solve(eqn) -> Cost:
    _, n, _ = _matrix(eqn.invars[0])
    return _library(n * _size(eqn.invars[1]))  # n^2 per right-hand side


def qr(eqn) -> Cost:
    b, m, n = _matrix(eqn.invars[0])
    return _library(b * 2 * n * n * (m - n / 3))


def eigen(eqn) -> Cost:
    b, m, n = _matrix(eqn.invars[0])
    return _library(b * 9 * max(m, n) * min(m, n) ** 2)  # Golub & Van Loan orders of magnitude


def fft(eqn) -> Cost:
    n = math.prod(eqn.params["fft_lengths"])
    return _library(5 * _size(eqn.invars[0]) * math.log2(max(n, 2)))


def call(eqn) -> Cost:
    """A call's cost: its body's (pejit's own call primitives register it too)."""
    sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
    return jaxpr_cost(sub)


def custom_call(eqn) -> Cost:
    return jaxpr_cost(eqn.params["call_jaxpr"])


def cond(eqn) -> Cost:
    return max((jaxpr_cost(b) for b in eqn.params["branches"]), key=seconds_of, default=ZERO)


def scan(eqn) -> Cost:
    return jaxpr_cost(eqn.params["jaxpr"]) * eqn.params["length"]


def while_loop(eqn) -> Cost:
    # The trip count is unknown here: one trip (a lower bound).
    return jaxpr_cost(eqn.params["cond_jaxpr"]) + jaxpr_cost(eqn.params["body_jaxpr"])


def linear_solve(eqn) -> Cost:
    return jaxpr_cost(eqn.params["jaxprs"].solve)


def seconds_of(cost: Cost) -> float:
    return cost.seconds()


# -- per call: does a transformation make the program cheaper? --------------------------

def fold_pays(saved: Cost, total: Cost, min_gain: float) -> bool:
    """Whether folding work that costs ``saved`` a call, of a program costing
    ``total``, is worth it: it saves something, and at least ``min_gain``
    (``FoldOptions.min_gain``) of the call.

    A fold that saves nothing would still store its results for every call to
    read (``jnp.ones(n)`` fed to a sparse product: the program generates it as
    cheaply), and one that saves a sliver is paid for at every specialization.
    (A call's dispatch is not counted: a fold of a tiny program's constants
    compiles its results in, and passes fewer arguments, which saves as much
    of a call as the work.)

    Examples:
      >>> fold_pays(Cost(flops=1e6), Cost(flops=1e7), min_gain=0.05)
      True
      >>> fold_pays(Cost(flops=1e4), Cost(flops=1e7), min_gain=0.05)
      False
      >>> fold_pays(ZERO, ZERO, min_gain=0.0)  # nothing saved: nothing stored
      False
    """
    s = saved.seconds()
    return s > 0 and s >= min_gain * total.seconds()


def stays_lazy(in_bytes: int, out_bytes: int, ratio: float, min_bytes: int) -> bool:
    """Whether an expansion of known values (a broadcast, an ``iota``, ...) stays in the
    residual program, recomputed where XLA fuses it, rather than stored: its output is
    over ``min_bytes`` and ``ratio`` times its inputs (``FoldOptions.expansion_*``)."""
    return out_bytes > min_bytes and out_bytes > ratio * in_bytes


#: Known results up to this size, on concrete inputs, are computed at once rather
#: than deferred to a batch: Python often asks for them, and a batch of one costs
#: more than the dispatch.
ON_THE_SPOT_BYTES = 64


def on_the_spot(out_bytes: int) -> bool:
    """Whether known results of ``out_bytes`` are computed at once (see :data:`ON_THE_SPOT_BYTES`)."""
    return out_bytes <= ON_THE_SPOT_BYTES


#: A collapse must bring the per-call cost of its region down to this fraction at
#: least: the estimate is rough, and building the matrix must be worth it.
COLLAPSE_PAYS = 0.75


def matrix_cost(n_out: int, n_in: int, offset: bool, itemsize: int) -> tuple[Cost, int]:
    """``(per-call cost, bytes stored)`` of computing ``n_out`` values as ``M @ x (+ c)`` of ``n_in`` inputs."""
    stored = (n_out * n_in + (n_out if offset else 0)) * itemsize
    return Cost(flops=2 * n_out * n_in + (n_out if offset else 0), bytes=stored, kernels=1.0), stored


def collapse_pays(before: Cost, after: Cost) -> bool:
    """Whether matrices costing ``after`` a call replace a region costing ``before``."""
    return after.seconds() <= COLLAPSE_PAYS * before.seconds()


def collapse_can_pay(program: Cost) -> bool:
    """Whether any region of a program costing ``program`` a call could collapse
    (:func:`collapse_pays`): a region costs at most the whole program, and its matrices
    at least one kernel (:func:`matrix_cost`), so a program that costs less a call than
    that kernel (elementwise work on a few values) has none worth looking for.

    Examples:
      >>> collapse_can_pay(Cost(flops=25.0, bytes=120.0))  # an outer product of two slices
      False
      >>> collapse_can_pay(Cost(flops=64.0, bytes=160.0, kernels=2.0))  # two matrix-vector products
      True
    """
    return collapse_pays(program, Cost(kernels=1.0))


def share_pays(saved_bytes: int, program: Cost, min_gain: float) -> bool:
    """Whether passing equal folded constants once, and uniform ones as broadcasts of a
    literal, pays for a residual of its own where one taking them all is compiled already:
    it saves reading ``saved_bytes`` a call of a ``program`` (as :func:`fold_pays`)."""
    return fold_pays(Cost(bytes=saved_bytes), program, min_gain)


#: The most bytes of folded constants compiled into a program (as HLO constants: a
#: second copy, and compile time that grows with them).
INLINE_BYTES = 1 << 20


def compiled_in(nbytes_total: int) -> bool:
    """Whether folded constants of ``nbytes_total`` in all are compiled into the program,
    as ``jax.jit`` compiles the arrays a function closes over (XLA specializes to their
    values: gathers at known indices become slices, fewer buffers pass per call)."""
    return nbytes_total <= INLINE_BYTES


#: Known work up to this many FLOPs XLA folds itself, in its time, when the constants
#: are compiled in (see :func:`compiling_in_folds`): its constant folding interprets it.
XLA_FOLDS_FLOPS = 1e5


def compiling_in_folds(saved: Cost, const_bytes: int) -> bool:
    """Whether compiling the constants into ``jax.jit``'s program, as ``jax.jit``
    compiles the arrays a function closes over, folds known work that saves ``saved``
    a call for less than a fold of pejit's.

    XLA folds what depends on compiled-in constants alone as it compiles: at no cost
    beyond that compile where the work is small (:data:`XLA_FOLDS_FLOPS`, which it
    interprets) and no library call (a LAPACK or FFT call is one it cannot run then).
    A fold of pejit's would add a trace and a folding program's compile to the
    first call. The constants must be small enough to compile in (:func:`compiled_in`).

    Examples:
      >>> compiling_in_folds(Cost(flops=200.0, bytes=800.0), const_bytes=800)  # a nanmin of 200 constants
      True
      >>> compiling_in_folds(Cost(flops=200.0, kernels=1.0, library=1.0), const_bytes=800)  # an inverse
      False
    """
    return compiled_in(const_bytes) and saved.library == 0 and saved.flops <= XLA_FOLDS_FLOPS


#: The default ``auto_min_flops``: promotion costs one fold and one compile (tens
#: of milliseconds on a CPU), and removing 2e6 FLOPs per call saves about 0.2 ms a
#: call there, so a promotion pays within a few hundred calls (docs/auto.md).
PROMOTION_MIN_FLOPS = 2e6


def promotion_pays(removed_flops: float, min_flops: float) -> bool:
    """Whether ``auto`` promotes arguments whose fold removes ``removed_flops`` a call
    (``auto_min_flops``, :data:`PROMOTION_MIN_FLOPS` by default)."""
    return removed_flops >= min_flops


def reassociation_pays(m: int, k: int, n: int) -> bool:
    """Whether ``C @ (D @ z)``, ``C`` of ``m x k`` and ``D`` of ``k x n`` known, costs less
    per call as ``(C @ D) @ z``: one product of ``m x n`` against two."""
    return m * n <= m * k + k * n


# -- once: how the fold evaluates known work ---------------------------------------------
# Orders of magnitude on a CPU, which the constants below encode: an elementwise
# chain of tens of equations compiles in tenths of a second; one primitive on new
# types compiles in tens of milliseconds the first time a process evaluates it.

#: Python dispatch of one primitive on cached executables.
DISPATCH_SECONDS = 40e-6
#: Compiling a program: a fixed cost, and a cost per equation.
COMPILE_SECONDS = 0.05
COMPILE_SECONDS_PER_EQN = 4e-3

#: The calls within which a fold must win back what it adds to the first call.
REPAY_CALLS = 10_000


def fold_repays(saved: Cost) -> bool:
    """Whether a fold that saves ``saved`` a call wins back its price on the first call,
    a folding program's compile (:data:`COMPILE_SECONDS`), within :data:`REPAY_CALLS`
    calls: 5 us a call on a CPU (by the estimate, reading some 5 kB, or a small
    factorization). Where it cannot, little folds, and the first call is ``jax.jit``'s
    (the program with the constants compiled in, or as arguments), for a step that
    costs at most microseconds more.

    Examples:
      >>> fold_repays(Cost(flops=148.0, bytes=964.0))  # a variance of 12 constants
      False
      >>> fold_repays(Cost(flops=1e7, bytes=4e6, library=1.0))  # a factorization
      True
    """
    return saved.seconds() * REPAY_CALLS >= COMPILE_SECONDS


def run_compiles(equations: int, traffic: int, alike: int) -> bool:
    """Whether a run of ``equations`` fusible known equations, which ``alike`` runs of
    the same structure share (an unrolled loop's steps), is compiled as one program
    rather than evaluated op by op: fusing saves a dispatch per equation and writing
    and reading back ``traffic`` bytes of intermediates; it costs a compile."""
    saved = equations * DISPATCH_SECONDS + traffic / _device.current().bandwidth
    return saved * alike > COMPILE_SECONDS + equations * COMPILE_SECONDS_PER_EQN


def one_program_pays(eqns: Sequence[Any]) -> bool:
    """Whether ``eqns`` (flat: no staged batches), evaluated once in a fresh process,
    cost less as one program than op by op.

    Op by op, each distinct primitive on distinct types compiles a program of its own
    the first time a process evaluates it; one program for all of them costs one
    compile, growing with its size. Small folds of many distinct operations, as
    ``cholesky(X.T @ X + lam * I)``, win by one program; long folds of few distinct
    ones (an unrolled loop) lose.
    """
    distinct = {(e.primitive.name, tuple(v.aval for v in e.invars), tuple(v.aval for v in e.outvars))
                for e in eqns}
    one_program = COMPILE_SECONDS + sum(map(_compiled_size, eqns)) * COMPILE_SECONDS_PER_EQN
    return len(eqns) > 1 and one_program < len(distinct) * COMPILE_SECONDS


def fold_first(eqns: Sequence[Any], compiles: Callable[[Any], bool]) -> bool:
    """Whether the first call should wait for the fold of ``eqns`` (the known work, flat)
    rather than run ``jax.jit``'s program while the fold runs beside it.

    Folded first, the call pays the fold, then compiles a residual without that work;
    ``jax.jit``'s program compiles it in (:data:`COMPILE_SECONDS_PER_EQN` an equation).
    The fold's own compiles are those of the equations ``compiles`` says it cannot
    evaluate without one: each distinct primitive and type compiles a program the
    first time (the rest is NumPy on the host, or kernels compiled beside the trace).
    A long chain of arithmetic on constants (TFC's basis, an unrolled recursion) folds
    for less than XLA compiles it; a factorization and the products around it do not,
    and wait beside the call.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> poly = jax.make_jaxpr(lambda x: sum(x ** k for k in range(40)))(jnp.ones(8)).eqns
      >>> fold_first(poly, compiles=lambda e: False)
      True
      >>> solve = jax.make_jaxpr(jnp.linalg.cholesky)(jnp.eye(8)).eqns
      >>> fold_first(solve, compiles=lambda e: True)
      False
    """
    distinct = {(e.primitive.name, tuple(v.aval for v in e.invars), tuple(v.aval for v in e.outvars))
                for e in _flat(eqns) if compiles(e)}
    return len(distinct) * COMPILE_SECONDS < sum(map(_compiled_size, eqns)) * COMPILE_SECONDS_PER_EQN


def _flat(eqns: Iterable[Any]) -> Iterator[Any]:
    """``eqns`` with each call replaced by its body's equations (a fold evaluates those)."""
    for e in eqns:
        inner = called_jaxpr(e.primitive, e.params)
        if inner is None:
            yield e
        else:
            yield from _flat(inner.eqns)


def _compiled_size(eqn) -> int:
    """Equations an XLA program for ``eqn`` compiles (a call: its body's)."""
    inner = called_jaxpr(eqn.primitive, eqn.params)
    return 1 if inner is None else max(1, sum(map(_compiled_size, inner.eqns)))


def build_compiles(eqns: Sequence[Any]) -> bool:
    """Whether a collapse's matrix (built by ``jax.jvp`` of a region of ``eqns``, in
    batches) is built by one compiled program rather than op by op: op by op, each
    distinct primitive and type compiles about three programs (primal, tangent, batch)."""
    distinct = {(e.primitive, tuple(getattr(a, "aval", None) for a in e.invars)) for e in eqns}
    one_program = COMPILE_SECONDS + 3 * COMPILE_SECONDS_PER_EQN * len(eqns)
    return one_program < 3 * COMPILE_SECONDS * len(distinct)



__all__ = [
    "COLLAPSE_PAYS", "Cost", "CostRule", "Eqn", "INLINE_BYTES", "ON_THE_SPOT_BYTES", "PROMOTION_MIN_FLOPS", "Typed",
    "XLA_FOLDS_FLOPS", "ZERO", "build_compiles", "collapse_can_pay", "collapse_pays", "compiled_in",
    "compiling_in_folds", "cost_rules", "costs", "eqn_flops", "eqn_of", "fold_first", "fold_pays", "fold_repays",
    "jaxpr_cost", "jaxpr_flops", "matrix_cost", "on_the_spot", "one_program_pays", "program_cost", "promotion_pays",
    "reassociation_pays", "run_compiles", "share_pays", "stays_lazy",
]
