"""pejit's support for JAX's primitives: one registration a primitive, by family.

Each block registers what pejit knows of one family of primitives with
:func:`~.registry.register_primitive`: its fold rules (in the family's
module here: :mod:`.branches`, :mod:`.calls`, :mod:`.custom`, :mod:`.loops`,
:mod:`.products`, :mod:`.transposable`), its costs (:mod:`pejit._fold._cost`), the host rules that
fold it with NumPy (:mod:`pejit._fold._host`), and whether and how an affine
region collapses through it (:mod:`.affine`, :mod:`pejit._residual._linear`).
A primitive not named here is folded by the default rule and costs the bytes
it reads. Importing this module registers them all.
"""

from __future__ import annotations

import numpy as np
from jax.extend.core import primitives as P

from ... import _compat
from ..._fold import _batch, _cost, _host
from ..._fold._primitives import ELEMENTWISE
from .. import _affine, _linear
from . import affine
from .branches import fold_cond, known_index_saving
from .calls import fold_checkpoint, fold_jit
from .custom import fold_custom_jvp, fold_custom_lin, fold_custom_vjp, fold_linear_solve
from .loops import fold_scan, fold_while, while_needs_fold
from .products import fold_dot_general, reassociation_saving
from .registry import register_primitive
from .transposable import fold_pad, pad_needs_fold

# -- elementwise arithmetic, comparisons and logic: one operation an element ------------------
_elementwise = _cost.elementwise
register_primitive(P.add_p, cost=_elementwise, host=_host.add_or_sub(np.add),
                   affine=affine.linear, additive=range, linear=_linear.elementwise(np.add))
register_primitive(P.add_jaxvals_p, host=_host.add_or_sub(np.add),
                   affine=affine.linear, additive=range, linear=_linear.elementwise(np.add))
register_primitive(P.sub_p, cost=_elementwise, host=_host.add_or_sub(np.subtract),
                   affine=affine.linear, additive=range, linear=_linear.elementwise(np.subtract))
register_primitive(P.neg_p, cost=_elementwise, host=_host.elementwise(np.negative),
                   affine=affine.linear, linear=_linear.elementwise(np.negative))
register_primitive(P.mul_p, cost=_elementwise, host=_host.elementwise(np.multiply),
                   affine=affine.bilinear, linear=_linear.elementwise(np.multiply))
register_primitive(P.div_p, cost=_elementwise,
                   affine=affine.div, linear=_linear.elementwise(np.divide), fixed=lambda n: (1,))
for _prim, _ufunc in ((P.max_p, np.maximum), (P.min_p, np.minimum), (P.abs_p, np.abs),
                      (P.eq_p, np.equal), (P.ne_p, np.not_equal), (P.lt_p, np.less), (P.le_p, np.less_equal),
                      (P.gt_p, np.greater), (P.ge_p, np.greater_equal), (P.and_p, np.bitwise_and),
                      (P.or_p, np.bitwise_or), (P.xor_p, np.bitwise_xor), (P.not_p, np.invert)):
    register_primitive(_prim, cost=_elementwise, host=_host.elementwise(_ufunc))
register_primitive(P.rem_p, cost=_elementwise, host=_host.rem)
for _prim in ELEMENTWISE - {P.add_p, P.sub_p, P.neg_p, P.mul_p, P.div_p, P.max_p, P.min_p, P.abs_p, P.eq_p, P.ne_p,
                            P.lt_p, P.le_p, P.gt_p, P.ge_p, P.and_p, P.or_p, P.xor_p, P.not_p, P.rem_p}:
    register_primitive(_prim, cost=_elementwise)  # transcendental functions and the like: JAX's

# -- data movement: moves, replicates or picks elements, costs the bytes it reads -------------
register_primitive(P.broadcast_in_dim_p, host=_host.broadcast_in_dim,
                   affine=affine.linear, linear=_linear.broadcast_in_dim)
register_primitive(P.reshape_p, host=_host.reshape, affine=affine.linear, linear=_linear.reshape)
register_primitive(P.squeeze_p, host=_host.squeeze, affine=affine.linear, linear=_linear.squeeze)
register_primitive(P.transpose_p, host=_host.transpose, affine=affine.linear, linear=_linear.transpose)
register_primitive(P.rev_p, host=_host.rev, affine=affine.linear, linear=_linear.rev)
register_primitive(P.copy_p, host=_host.copy, affine=affine.linear, linear=_linear.copy)
register_primitive(P.convert_element_type_p, host=_host.convert_element_type,
                   affine=affine.linear, linear=_linear.convert_element_type)
register_primitive(P.concatenate_p, host=_host.concatenate,
                   affine=affine.linear, additive=range, linear=_linear.concatenate)
register_primitive(P.pad_p, fold=fold_pad, deferred=True, known_by_default=True, needed=pad_needs_fold,
                   affine=affine.linear, additive=range, linear=_linear.pad)  # fold: rules.transposable
register_primitive(P.slice_p, host=_host.slice_, affine=affine.linear, linear=_linear.slice_)
if _compat.split_p is not None:  # where JAX has it
    register_primitive(_compat.split_p, host=_host.split, affine=affine.linear, linear=_linear.split)
if _compat.stack_p is not None:
    register_primitive(_compat.stack_p, host=_host.stack)
    register_primitive(_compat.unstack_p, host=_host.unstack)
register_primitive(P.iota_p, host=_host.iota)
register_primitive(P.select_n_p, host=_host.select_n, affine=affine.select, additive=lambda n: range(1, n),
                   linear=_linear.select_n, fixed=lambda n: (0,))
register_primitive(P.dynamic_slice_p, host=_host.dynamic_slice, affine=affine.known_indices,
                   linear=_linear.dynamic_slice, fixed=lambda n: range(1, n))
register_primitive(P.dynamic_update_slice_p, affine=affine.update_slice, additive=lambda n: range(2),
                   linear=_linear.dynamic_update_slice, fixed=lambda n: range(2, n))
register_primitive(P.gather_p, affine=affine.known_indices)
register_primitive(P.scatter_add_p, affine=affine.scatter_add, additive=lambda n: (0, 2))

# -- reductions: one operation an input element -------------------------------------------------
register_primitive(P.reduce_sum_p, cost=_cost.reduction, affine=affine.linear, linear=_linear.reduce_sum)
register_primitive(P.cumsum_p, cost=_cost.reduction, affine=affine.linear, linear=_linear.cumsum)
register_primitive(P.reduce_max_p, P.reduce_min_p, P.reduce_prod_p, P.argmax_p, P.argmin_p,
                   P.cumprod_p, P.cummax_p, P.cummin_p, P.cumlogsumexp_p, cost=_cost.reduction)

# -- products (rules.products): contractions against known matrices ------------------------------
register_primitive(P.dot_general_p, fold=fold_dot_general, deferred=True, known_by_default=True,
                   saving=reassociation_saving, cost=_cost.dot_general, host=_host.dot_general,
                   affine=affine.bilinear, linear=_linear.dot_general)

# -- linear algebra: library calls, textbook FLOPs --------------------------------------------------
register_primitive(P.cholesky_p, cost=_cost.cholesky)
register_primitive(P.lu_p, cost=_cost.lu)
register_primitive(P.triangular_solve_p, cost=_cost.triangular_solve)
register_primitive(P.qr_p, P.householder_product_p, cost=_cost.qr)
register_primitive(P.eigh_p, P.eig_p, P.svd_p, P.schur_p, cost=_cost.eigen)
register_primitive(P.fft_p, cost=_cost.fft)

# -- calls (rules.calls, rules.custom): what their bodies do --------------------------------------
register_primitive(_compat.jit_p, fold=fold_jit, deferred=True, known_by_default=True, cost=_cost.call,
                   affine=_affine.call)
register_primitive(P.closed_call_p, cost=_cost.call, affine=_affine.call)
register_primitive(_compat.remat_p, fold=fold_checkpoint, known_by_default=True, cost=_cost.call)
register_primitive(_batch.known_part_p, _batch.batch_p, cost=_cost.call)  # pejit's own, in folding programs
register_primitive(P.custom_jvp_call_p, fold=fold_custom_jvp, cost=_cost.custom_call, affine=_affine.call)
register_primitive(P.custom_vjp_call_p, fold=fold_custom_vjp, cost=_cost.custom_call)
register_primitive(_compat.custom_lin_p, fold=fold_custom_lin)
register_primitive(P.linear_solve_p, fold=fold_linear_solve, cost=_cost.linear_solve)

# -- control flow (rules.branches, rules.loops): a branch at most, a loop's trips -------------------
register_primitive(P.cond_p, fold=fold_cond, saving=known_index_saving, cost=_cost.cond)
register_primitive(P.scan_p, fold=fold_scan, known_by_default=True, cost=_cost.scan)
register_primitive(P.while_p, fold=fold_while, needed=while_needs_fold, known_by_default=True,
                   cost=_cost.while_loop)
