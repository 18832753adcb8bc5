"""What folding the known inputs of a jaxpr would save a call, read off the jaxpr before anything is evaluated.

A fold's first step is a trace and an evaluation of the known work, paid
before anything could tell whether the fold was worth it. :func:`known_work`
tells it first: it reads the folding trace's policy off a jaxpr (what
folds, what stays lazy, what a loop body or a branch hoists, what a fold
rule's rewrite saves) and costs it with :mod:`pejit._fold._cost`, whose
:func:`~pejit._fold._cost.fold_pays` then decides. A call's first
specialization asks it (``pejit._calls._look``), and so do ``auto``'s
promotions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jax.extend.core import Literal
from jax.extend.core import primitives as P

from .. import _compat
from ._cost import ZERO, Cost, fold_pays, fold_repays, jaxpr_cost, program_cost, seconds_of, stays_lazy
from ._fold_rules import fold_rules
from ._primitives import CALLBACKS, CALLS, ELEMENTWISE, EXPANSIONS, FUSES_OPERANDS, sub_byte, subjaxprs
from ._values import nbytes


class KnownWork(NamedTuple):
    """What folding some inputs of a program would save a call (``saved``), of ``total``;
    ``folded``: the known equations that folding would evaluate (a call, a loop body
    with known work: the equations inside); ``effects``: effectful equations on known
    values alone, which stay; ``rewrites``: equations with known and unknown inputs
    whose fold rule rewrites them (a product reassociated, a branch chosen, a loop
    split), which XLA would not do so."""

    saved: Cost
    total: Cost
    folded: tuple
    effects: tuple = ()
    needed: tuple = ()  # equations pejit must fold (see needed_rules), or XLA would fold wrong (sub_byte)
    rewrites: tuple = ()

    def pays(self, min_gain: float) -> bool:
        """Whether the fold saves at least ``min_gain`` of a call and wins back what it
        adds to the first call (:func:`~pejit._fold._cost.fold_repays`; ``min_gain=0``
        folds whatever saves something), or must run."""
        return bool(self.needed) or (fold_pays(self.saved, self.total, min_gain)
                                     and (not min_gain or fold_repays(self.saved)))


def known_work(jaxpr, known: Sequence[bool], *, lazy: bool = True, ratio: float = 2.0,
               min_bytes: int = 1024) -> KnownWork:
    """What folding the inputs ``known`` of ``jaxpr`` saves a call, judged from the
    program alone, before anything is evaluated.

    The folding trace's policy, read off the jaxpr: an equation whose inputs are all
    known and that has no effects folds. With ``lazy`` (``FoldOptions.rematerialize``),
    an expansion that would stay lazy (:func:`~pejit._fold._cost.stays_lazy`, with
    ``ratio`` and ``min_bytes``) and elementwise work on one save nothing (the
    residual computes them, fused), unless an equation that cannot fuse them reads
    them (a product, a library call, a loop: then they are stored, their work
    saved). A call, a loop body, a branch or a custom rule with some known inputs
    is looked into, its known work hoisted (in a loop, saved once a call but for
    its library calls: :meth:`~pejit._fold._cost.Cost.invariant`; but what known
    carries and scanned inputs compute, on every trip). Known work nothing unknown
    reads (dead, or an output) is saved too: the program would compute it on every
    call. A fold rule that rewrites an equation with known and unknown inputs adds
    what that saves (:data:`saving_rules`), and where JAX needs the rewrite, that it
    must run (:data:`needed_rules`); so must the fold of work on literals alone that
    XLA's constant folding would compute otherwise than its kernels (types narrower
    than a byte: :func:`~pejit._fold._primitives.sub_byte`, as a NumPy scalar
    constant, a literal of the program, bitcast to ``uint4``). ``effects`` are the effectful equations
    on known values alone, which stay.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> cj = jax.make_jaxpr(lambda A, x: jnp.linalg.inv(A) @ x)(jnp.eye(50), jnp.ones(50))
      >>> w = known_work(cj, [True, False])
      >>> w.pays(0.05), w.saved.library > 0
      (True, True)
      >>> known_work(cj, [False, True]).pays(0.05)
      False
    """
    closed = jaxpr
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    walk = _Walk(lazy, ratio, min_bytes)
    saved = walk.saved(jaxpr, set(jaxpr.constvars) | {v for v, k in zip(jaxpr.invars, known) if k}, set())
    return KnownWork(saved + walk.rewritten, jaxpr_cost(closed), tuple(walk.folded), tuple(walk.effects),
                     tuple(walk.needed), tuple(walk.rewrites))


#: What a walk knows of an input: nothing, that it comes from literals alone (``STATIC``:
#: XLA folds that work itself, as ``jnp.eye(n)``), or that it comes from the known inputs.
UNKNOWN, STATIC, KNOWN = 0, 1, 2


class _Walk:
    """:func:`known_work`'s pass: the known, static, lazy and unknown values of a jaxpr.

    ``record``: this pass of a body is the one whose folded equations and rewrites
    count (a loop's body is walked again to find its known carries); ``times``: how
    often a call runs the body being walked (its enclosing loops' trips)."""

    def __init__(self, lazy: bool, ratio: float, min_bytes: int):
        self.lazy, self.ratio, self.min_bytes = lazy, ratio, min_bytes
        self.folded: list = []
        self.effects: list = []
        self.needed: list = []
        self.rewritten = ZERO  # what the fold rules' rewrites save (see saving_rules), ``times`` a call each
        self.rewrites: list = []
        self.times = 1

    def saved(self, jaxpr, known: set, static: set, speculative: bool = False, nested: bool = False,
              record: bool = True) -> Cost:
        lazy: dict = {}  # a lazy value -> the lazy equation that makes it (None: static)
        producers: dict = {}
        folded = []
        saved = ZERO
        for eqn in jaxpr.eqns:
            states = [STATIC if isinstance(a, Literal) or a in static else KNOWN if a in known else UNKNOWN
                      for a in eqn.invars]
            effectful = bool(eqn.effects) or (speculative and eqn.primitive.name in CALLBACKS)
            if eqn.primitive not in FUSES_OPERANDS:  # it reads lazy values from memory: they are stored
                folded.extend(_stored(eqn, lazy))
            if all(states) and not effectful:
                if KNOWN not in states:  # from literals alone: XLA folds it too (and it may stay lazy)
                    if record and sub_byte(eqn):  # but packs these its own way: a NumPy scalar constant's bitcast
                        self.needed.append(eqn)
                    static.update(eqn.outvars)
                    if self._lazy(eqn, lazy):
                        lazy.update((v, None) for v in eqn.outvars)
                    continue
                if self._lazy(eqn, lazy):
                    lazy.update((v, eqn) for v in eqn.outvars)
                else:
                    folded.append(eqn)
                known.update(eqn.outvars)
            elif any(True for _ in subjaxprs(eqn.params)):  # its known work is hoisted, around its effects
                saved += self._inside(eqn, states, nested, record)
                if record and KNOWN in states and eqn.primitive in fold_rules and eqn.primitive.name not in CALLS:
                    self.rewrites.append(eqn)  # a loop split, a branch's known work hoisted
            elif all(states):
                if record:
                    self.effects.append(eqn)
            if not all(states) and not effectful and record and (rule := saving_rules.get(eqn.primitive)):
                rewritten = rule(eqn, known, producers, nested)
                if rewritten != ZERO:
                    self.rewrites.append(eqn)
                self.rewritten += rewritten * self.times
            if not all(states) and record and (need := needed_rules.get(eqn.primitive)) and need(eqn, known):
                self.needed.append(eqn)
            producers.update((v, eqn) for v in eqn.outvars)
        if record:
            self.folded.extend(folded)
        return saved + program_cost(folded)

    def _lazy(self, eqn, lazy: dict) -> bool:
        if not self.lazy:
            return False
        reads_lazy = any(not isinstance(a, Literal) and a in lazy for a in eqn.invars)
        if eqn.primitive in ELEMENTWISE:
            return reads_lazy
        if eqn.primitive not in EXPANSIONS:
            return False
        in_bytes = sum(nbytes(a.aval) for a in eqn.invars)
        out_bytes = sum(nbytes(v.aval) for v in eqn.outvars)
        return reads_lazy or stays_lazy(in_bytes, out_bytes, self.ratio, self.min_bytes)

    def _inside(self, eqn, states: list[int], nested: bool, record: bool) -> Cost:
        """The known work inside an equation with a sub-program."""
        p, params = eqn.primitive, eqn.params
        if p is P.scan_p:
            return self._scan(params, states, record)
        if p is P.while_p:
            cn, bn = params["cond_nconsts"], params["body_nconsts"]
            body = params["body_jaxpr"].jaxpr
            return self._body(body, states[cn:cn + bn] + [UNKNOWN] * (len(body.invars) - bn), True, True, record)
        if p is P.linear_solve_p:  # a call solves once: its solve's known work, on the consts given to it
            lengths = params["const_lengths"]
            start = lengths.matvec + lengths.vecmat
            solve = params["jaxprs"].solve
            return ZERO if solve is None else self._body(
                solve.jaxpr, states[start:start + lengths.solve] + [UNKNOWN] * (len(solve.jaxpr.invars) - lengths.solve),
                False, True, record)
        if p is P.cond_p:  # the fold hoists each branch's known work, whichever runs: the dearest
            return max((self._body(b.jaxpr, states[1:], True, True, record) for b in params["branches"]),
                       key=seconds_of, default=ZERO)
        return sum((self._body(getattr(s, "jaxpr", s), states, False, nested, record) for s in subjaxprs(params)
                    if len(getattr(s, "jaxpr", s).invars) == len(states)), ZERO)

    def _scan(self, params, states: list[int], record: bool) -> Cost:
        """A scan's known work: what its known constants alone compute, once a call
        (loop-invariant), and what known carries and scanned inputs compute, on every
        trip (the fold splits the loop: a known loop now, a residual loop after; XLA
        folds none of that, even from literals)."""
        scan = _compat.ScanParams(params)
        body = params["jaxpr"].jaxpr
        n_consts, n_carry, trips = scan.num_consts, scan.num_carry, params["length"]
        consts = states[:n_consts]
        carry = [s and KNOWN for s in states[n_consts:n_consts + n_carry]]
        xs = [s and KNOWN for s in states[n_consts + n_carry:]]
        while any(carry):  # the carries that stay known, trip after trip (a fixpoint, as partial evaluation finds)
            known, static = self._inputs(body, consts + carry + xs)
            self.saved(body, known, static, trips == 0, True, record=False)
            out = [isinstance(v, Literal) or v in known or v in static for v in body.outvars[:n_carry]]
            if all(o or not c for c, o in zip(carry, out)):
                break
            carry = [c if o else UNKNOWN for c, o in zip(carry, out)]
        varies = any(carry) or any(xs)
        outer, self.times = self.times, self.times * trips
        try:
            invariant = self._body(body, consts + [UNKNOWN] * (n_carry + len(xs)), trips == 0, True,
                                   record and not varies)
            if not varies:
                return invariant.invariant(max(trips, 1))
            every_trip = self._body(body, consts + carry + xs, trips == 0, True, record) - invariant
        finally:
            self.times = outer
        return invariant.invariant(max(trips, 1)) + every_trip * trips

    def _body(self, body, states: Sequence[int], speculative: bool, nested: bool, record: bool) -> Cost:
        return self.saved(body, *self._inputs(body, states), speculative, nested, record)

    @staticmethod
    def _inputs(body, states: Sequence[int]) -> tuple[set, set]:
        """``(known, static)`` of a body's inputs."""
        known = {v for v, s in zip(body.invars, states) if s == KNOWN}
        return known, set(body.constvars) | {v for v, s in zip(body.invars, states) if s == STATIC}


def _stored(eqn, lazy: dict) -> list:
    """The lazy equations that make what ``eqn`` reads, which the fold stores after all
    (forgotten as lazy: stored once)."""
    stack = [a for a in eqn.invars if not isinstance(a, Literal) and a in lazy]
    found: dict = {}
    while stack:
        producer = lazy.get(stack.pop())  # (None: from literals alone, XLA's to fold)
        if producer is not None and id(producer) not in found:
            found[id(producer)] = producer
            stack.extend(a for a in producer.invars if not isinstance(a, Literal) and a in lazy)
    for producer in found.values():
        for v in producer.outvars:
            lazy.pop(v, None)
    return list(found.values())


#: ``rule(eqn, known, producers, nested) -> Cost``: what a fold rule saves a call on an
#: equation with known and unknown inputs (``known``: the known values; ``producers``:
#: the equation that made each value; ``nested``: in a loop body, a branch or a call),
#: which :func:`known_work` adds (the products rule's reassociation, say). Registered
#: with the fold rule (:func:`pejit._residual.rules.registry.register_primitive`).
SavingRule = Callable[[Any, set, dict, bool], Cost]
saving_rules: dict[Any, SavingRule] = {}

#: ``needed(eqn, known) -> bool``: whether the fold rule of an equation with known and
#: unknown inputs must run, whatever folding saves: JAX could not transform the program
#: as it stands (``pad``'s transpose rule rejects a known operand beside a linear
#: padding value; the fold restages it). Such a program is folded.
NeededRule = Callable[[Any, set], bool]
needed_rules: dict[Any, NeededRule] = {}


__all__ = ["KnownWork", "NeededRule", "SavingRule", "known_work", "needed_rules", "saving_rules"]
