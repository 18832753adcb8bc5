"""What pejit knows of a primitive, in one registration: :func:`register_primitive`.

Each pass reads a primitive's support from a table of its own, in the layer
that runs it: the folding interpreter its fold rule, the back end its host
rule, the cost model its cost, the affine collapse whether it is affine and
how to build its matrix with NumPy. A lower layer never imports this one
(``tests/test_architecture.py``): its tables are plain dicts, and
:func:`register_primitive` writes each facet into the table of the layer
that reads it. pejit's own support for JAX's primitives registers here too,
one family at a time (:mod:`.builtins`), as a user's rule does
(``pejit.register_fold_rule``).

Adding a primitive, facet by facet (each is optional; a primitive without
any is still folded by the default rule, fold when every input is known and
stage otherwise, and costs the bytes it reads):

1. ``cost``: what an equation of it does per call, a
   :class:`~pejit._fold._cost.Cost` (FLOPs, kernels, library calls). Every
   decision of whether a transformation pays weighs it: without it, folding
   the primitive rarely pays.
2. ``fold``: a fold rule (:class:`~pejit._fold._fold_rules.FoldRule`), where
   the default rule is not enough: a primitive that carries sub-jaxprs
   (replay them under the trace), or one whose known part is worth a
   rewrite. ``deferred``: the rule takes deferred known values as they
   come, else they are materialized first. ``known_by_default``: the rule
   leaves an application whose inputs are all known to the default rule,
   so a call's known part may fold it with its neighbours. ``saving``:
   what the rule's rewrite of an equation with known and unknown inputs
   saves a call (a :data:`~pejit._fold._known.SavingRule`), so that the
   estimate before a fold (:func:`~pejit._fold._known.known_work`) counts
   it as the fold will. ``needed``: where the rule must run whatever it
   saves (a :data:`~pejit._fold._known.NeededRule`): JAX could not
   transform the equation as it stands, so a program holding it is folded.
3. ``host``: the primitive with NumPy, ``host(*arrays, **params)``, where
   NumPy's result is XLA's bit for bit (see :mod:`pejit._fold._host`; return
   None to decline some inputs): folded on a CPU, it then compiles nothing.
4. ``affine``: whether its outputs are affine in the inputs that are not
   known, ``affine(eqn, known) -> bool`` (:mod:`.affine`), so that an
   affine region of the residual collapses through it; ``additive(n)``: of
   its ``n`` operands, those that add into the output (a known one is an
   offset).
5. ``linear``: the primitive with NumPy on a batch of tangents,
   ``linear(args, batched, **params)`` as ``jax.vmap`` batches it
   (:mod:`pejit._residual._linear`), which builds a collapsed region's
   matrix without tracing or compiling; ``fixed(n)``: the operands its
   output is not linear in. Without it, the matrix is built by ``jax.jvp``.
6. Not a registration: if XLA fuses it with its neighbours as it fuses
   elementwise arithmetic or data movement, it belongs in the tables of
   :mod:`pejit._fold._primitives` (``ELEMENTWISE``, ``EXPANSIONS``,
   ``FUSES_OPERANDS``), which describe JAX's own primitives.
7. Tests: values against ``jax.jit``, and each facet at work (the host rule
   bit for bit against JAX's, the cost on each side of a decision, a region
   collapsed through it).

Examples:
  ``scale_p`` multiplies by 3, elementwise; it has no lowering, so a known
  application must fold:

  >>> import jax, jax.numpy as jnp
  >>> from jax.extend.core import Primitive
  >>> from pejit import pejit
  >>> from pejit._fold import _cost
  >>> from pejit._residual.rules.registry import register_primitive
  >>> scale_p = Primitive("doc_scale")
  >>> _ = scale_p.def_impl(lambda x: 3 * x)
  >>> _ = scale_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
  >>> register_primitive(
  ...     scale_p,
  ...     cost=lambda eqn: _cost.Cost(flops=eqn.outvars[0].aval.size),  # one multiply an element
  ...     host=lambda x: 3 * x,  # exact in NumPy as in XLA: folded with nothing to compile
  ...     affine=lambda eqn, known: True,  # linear in its one operand
  ...     linear=lambda args, batched: 3 * args[0],
  ... )
  >>> _cost.jaxpr_flops(jax.make_jaxpr(scale_p.bind)(jnp.ones(5)))
  5.0
  >>> f = pejit(lambda c, x: scale_p.bind(c) * x, constant_argnums=0)
  >>> f(jnp.arange(2.0), jnp.ones(2))
  Array([0., 3.], dtype=float32)
  >>> dict(f.report(jnp.arange(2.0), jnp.ones(2)).residual)
  {'mul': 1}

  Applied to a dynamic value it stays, and the affine collapse goes through
  it: ``A @ scale(A @ x)`` is one product by ``3 A A``, whose matrix the
  linear rule builds:

  >>> g = pejit(lambda A, x: A @ scale_p.bind(A @ x), constant_argnums=0)
  >>> A = jnp.arange(16.0).reshape(4, 4) / 16
  >>> bool(jnp.allclose(g(A, jnp.ones(4)), 3 * A @ A @ jnp.ones(4)))
  True
  >>> dict(g.report(A, jnp.ones(4)).residual)
  {'dot_general': 1}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax.extend.core import Primitive

from ..._fold import _cost, _fold_rules, _host, _known
from ..._fold._fold_rules import FoldRule
from .. import _linear
from . import affine as _affine_rules

#: ``operands(n) -> indices``: of a primitive's ``n`` operands, some (``additive``, ``fixed``).
Operands = Callable[[int], Sequence[int]]


def register_primitive(
    *prims: Primitive,
    fold: FoldRule | None = None,
    deferred: bool = False,
    known_by_default: bool = False,
    saving: _known.SavingRule | None = None,
    needed: _known.NeededRule | None = None,
    cost: _cost.CostRule | None = None,
    host: Callable[..., Any] | None = None,
    affine: _affine_rules.AffineRule | None = None,
    additive: Operands | None = None,
    linear: _linear.LinearRule | None = None,
    fixed: Operands | None = None,
) -> None:
    """Register the facets given of each primitive in ``prims`` (see the module docstring).

    Each facet goes into the table of the layer that reads it; a facet given
    again replaces the one before, and those not given are left as they are.
    ``deferred`` and ``known_by_default`` describe the ``fold`` rule they come
    with (registering a rule again resets them), ``additive`` the ``affine``
    rule, ``fixed`` the ``linear`` one.
    """
    facets = {"fold": fold, "saving": saving, "needed": needed, "cost": cost, "host": host, "affine": affine,
              "additive": additive, "linear": linear, "fixed": fixed}
    for prim in prims:
        if not isinstance(prim, Primitive):
            raise TypeError(f"register_primitive: prims must be jax.extend.core.Primitive, got {prim!r}")
    for name, facet in facets.items():
        if facet is not None and not callable(facet):
            raise TypeError(f"register_primitive: {name} must be callable, got {facet!r}")
    for name, needs, given in (("deferred", "fold", deferred), ("known_by_default", "fold", known_by_default),
                               ("needed", "fold", needed),
                               ("additive", "affine", additive), ("fixed", "linear", fixed)):
        if given and facets[needs] is None:
            raise ValueError(f"register_primitive: {name} describes a {needs} rule, and none is given")
    if all(facet is None for facet in facets.values()):
        raise ValueError("register_primitive: no facet given (fold, saving, cost, host, affine, linear)")
    for prim in prims:
        if fold is not None:
            _fold_rules.fold_rules[prim] = fold
            _mark(_fold_rules.deferred_ok, prim, deferred)
            _mark(_fold_rules.known_by_default, prim, known_by_default)
        _put(_known.saving_rules, prim, saving)
        _put(_known.needed_rules, prim, needed)
        _put(_cost.cost_rules, prim, cost)
        _put(_host.HOST_RULES, prim, host)
        if affine is not None:
            _affine_rules.affine_rules[prim] = affine
            _mark_operands(_affine_rules.ADDITIVE, prim, additive)
        if linear is not None:
            _linear.LINEAR_RULES[prim] = linear
            _mark_operands(_linear.FIXED, prim, fixed)


def register_fold_rule(*prims: Primitive, deferred: bool = False) -> Callable[[FoldRule], FoldRule]:
    """Register a fold rule (a `FoldRule`) for each primitive in ``prims``.

    The folding trace calls the rule for every application of those
    primitives; the rule returns the outputs, or ``NotImplemented`` to leave
    the equation to the default policy (fold it if all inputs are known,
    else stage it). Inside ``with trace.as_current():`` the rule's JAX code
    goes through the folding trace: what depends only on known values is
    folded, the rest is staged into the residual program. ``folder`` answers
    `Folder.is_known`, counts in ``folder.stats`` and reads
    ``folder.options``.

    Known values whose folding is deferred (see `Folder`) are
    materialized before the rule runs, unless ``deferred`` says the rule
    handles them itself, through `Folder.is_known`. A primitive has
    one rule: registering again replaces it. The rule is the ``fold`` facet
    of ``register_primitive`` (in ``pejit._residual.rules.registry``), which
    registers a primitive's other facets (its cost, a host rule, ...) too.

    Examples:
      A primitive of your own, ``solve(A, b)``, has no lowering; with ``A``
      constant, its rule folds the inverse and leaves one product:

      >>> import jax, jax.numpy as jnp
      >>> from jax.extend.core import Primitive
      >>> from pejit import pejit, register_fold_rule
      >>> solve_p = Primitive("doc_solve")
      >>> _ = solve_p.def_impl(jnp.linalg.solve)
      >>> _ = solve_p.def_abstract_eval(lambda A, b: jax.core.ShapedArray(b.shape, b.dtype))
      >>> @register_fold_rule(solve_p)
      ... def fold_solve(folder, trace, prim, args, params):
      ...     A, b = args
      ...     if not folder.is_known(A) or folder.is_known(b):
      ...         return NotImplemented
      ...     with trace.as_current():
      ...         return jnp.linalg.inv(A) @ b
      >>> f = pejit(solve_p.bind, constant_argnums=0)
      >>> f(2 * jnp.eye(2), jnp.ones(2))
      Array([0.5, 0.5], dtype=float32)
      >>> dict(f.report(2 * jnp.eye(2), jnp.ones(2)).residual)
      {'dot_general': 1}
    """

    def register(rule: FoldRule) -> FoldRule:
        register_primitive(*prims, fold=rule, deferred=deferred)
        return rule

    return register


def _put(table: dict, prim: Primitive, facet: Any) -> None:
    if facet is not None:
        table[prim] = facet


def _mark(members: set, prim: Primitive, member: bool) -> None:
    if member:
        members.add(prim)
    else:
        members.discard(prim)


def _mark_operands(table: dict, prim: Primitive, operands: Operands | None) -> None:
    if operands is None:
        table.pop(prim, None)
    else:
        table[prim] = operands


__all__ = ["Operands", "register_fold_rule", "register_primitive"]
