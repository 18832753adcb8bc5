"""Gradient steps through library solvers (issue 63): ``pejit`` of a function that
differentiates, and ``jax.grad`` of a pejit function, both run, give ``jax.jit``'s values
and gradients, and fold the constant work of the libraries' custom rules.

The second order is pejit's derivative (``pejit._calls._derivatives``): ``jax.jvp`` of
the function folded at the same constants, where the forward and backward rules of a
``custom_vjp`` call and the JVP rule of a ``custom_jvp`` call run on the known values.
Each case is checked in both orders and both API forms against ``jax.jit``, and for
what the factorizations of its constant matrices leave in the program that runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import FoldOptions, pejit
from pejit._jit import call_path

from ._util import primitive_names

diffrax = pytest.importorskip("diffrax")
eqx = pytest.importorskip("equinox")
optx = pytest.importorskip("optimistix")
eqxi = pytest.importorskip("equinox.internal")

#: What a factorization of a matrix leaves in a jaxpr when it is not folded.
FACTORIZATIONS = {"lu", "getrf", "cholesky", "potrf"}

N = 12
_eye = lambda k: np.eye(N, k=k, dtype=np.float32)  # noqa: E731
M = jnp.asarray((4 * _eye(0) + _eye(1) + _eye(-1)) / 6)  # a mass matrix
K = jnp.asarray((2 * _eye(0) - _eye(1) - _eye(-1)) * 0.1)  # a stiffness matrix
B = jnp.asarray(np.random.default_rng(0).standard_normal((N, N)).astype(np.float32) / np.sqrt(N) + 3 * _eye(0))
Y0 = jnp.asarray(np.sin(np.linspace(0, np.pi, N)).astype(np.float32))


def ode(adjoint):
    def solve(M, K, y0):  # the vector field, made nonlinear: the gradient depends on y0
        field = diffrax.ODETerm(lambda t, y, a: -jnp.linalg.solve(a[0], a[1] @ y) + 0.1 * jnp.sin(y))
        return diffrax.diffeqsolve(field, diffrax.Tsit5(), 0.0, 1.0, 0.05, y0, args=(M, K), adjoint=adjoint).ys

    return solve


def residual_fn(B):
    return lambda y, b: jnp.linalg.inv(B) @ (y + 0.1 * y**3) - b


def root_find(B, b):  # optimistix's implicit differentiation: a custom_jvp rule
    return optx.root_find(residual_fn(B), optx.Newton(rtol=1e-6, atol=1e-6), jnp.zeros(N), args=b, max_steps=32).value


def least_squares(B, b):
    solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
    return optx.least_squares(residual_fn(B), solver, jnp.zeros(N), args=b, max_steps=64).value


@eqx.filter_custom_vjp
def _inv_apply(vjp_arg, a):
    return jnp.linalg.inv(a) @ vjp_arg


@_inv_apply.def_fwd
def _inv_apply_fwd(perturbed, vjp_arg, a):
    return jnp.linalg.inv(a) @ vjp_arg, jnp.linalg.inv(a)  # Equinox's forward rule runs later, as written


@_inv_apply.def_bwd
def _inv_apply_bwd(ainv, g, perturbed, vjp_arg, a):
    return 2.0 * ainv.T @ g  # twice the true cotangent: a rule bypassed would not match


def filter_custom_vjp(B, x):
    return _inv_apply(x, B)


def checkpointed_while(B, x):
    body = lambda c: (c[0] + 1, jnp.tanh(jnp.linalg.inv(B) @ c[1]))  # noqa: E731
    return eqxi.while_loop(lambda c: c[0] < 5, body, (0, x), max_steps=8, kind="checkpointed")[1]


CASES = {
    "diffrax, default adjoint": (ode(diffrax.RecursiveCheckpointAdjoint()), (M, K)),
    "diffrax, BacksolveAdjoint": (ode(diffrax.BacksolveAdjoint()), (M, K)),
    "optimistix root_find": (root_find, (B,)),
    "optimistix least_squares": (least_squares, (B,)),
    "Equinox filter_custom_vjp": (filter_custom_vjp, (B,)),
    "Equinox checkpointed while loop": (checkpointed_while, (B,)),
}


def loss(f):
    return lambda *args: jnp.sum(jnp.sin(f(*args)))


def close(got, want):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5),
                 got, want)


@pytest.mark.parametrize("name", CASES)
def test_gradient_steps_in_both_orders_and_forms_match_jax_jit(name):
    f, consts = CASES[name]
    n = len(consts)
    step = jax.value_and_grad(loss(f), argnums=n)
    want = jax.jit(step)(*consts, Y0)
    folded_step = pejit(step, constant_argnums=tuple(range(n)))  # pejit of the step
    close(folded_step(*consts, Y0), want)
    close(pejit(*consts, Y0, constant_arg_nums=list(range(n)))(step)(Y0), want)
    pf = pejit(f, constant_argnums=tuple(range(n)))  # the step of a pejit function
    tfc = pejit(*consts, Y0, constant_arg_nums=list(range(n)))(f)
    close(jax.value_and_grad(lambda y: loss(pf)(*consts, y))(Y0), want)
    close(jax.jit(jax.value_and_grad(lambda y: loss(pf)(*consts, y)))(Y0), want)
    close(jax.value_and_grad(loss(tfc))(Y0), want)
    # the constant matrices' factorizations are folded: none is left, or (Newton's
    # Jacobians at the iterates need theirs) fewer than jax.jit's program has
    unfolded = primitive_names(jax.make_jaxpr(step)(*consts, Y0)).count("lu")
    for names in (primitive_names(folded_step.specialize(*consts, Y0).residual.jaxpr),
                  primitive_names(jax.make_jaxpr(jax.grad(lambda y: loss(pf)(*consts, y)))(Y0))):
        assert unfolded and names.count("lu") < unfolded, name
        if not name.startswith("optimistix"):
            assert not FACTORIZATIONS & set(names), name


def test_the_backward_rule_is_the_users():
    # _inv_apply_bwd gives twice the true cotangent; both orders must use it
    pf = pejit(filter_custom_vjp, constant_argnums=0)
    true = jax.grad(lambda y: jnp.sum(jnp.linalg.inv(B) @ y))(Y0)
    close(jax.grad(lambda y: pf(B, y).sum())(Y0), 2.0 * true)
    close(pejit(jax.grad(lambda B, y: filter_custom_vjp(B, y).sum(), argnums=1), constant_argnums=0)(B, Y0), 2.0 * true)


def test_the_derivative_is_folded_once_per_constant_value():
    calls = []

    def f(B, y):
        calls.append(1)
        return filter_custom_vjp(B, y)

    pf = pejit(f, constant_argnums=0)
    grad = jax.jit(jax.grad(lambda y: pf(B, y).sum()))
    for y in (Y0, 2 * Y0):
        jax.grad(lambda y: pf(B, y).sum())(y)
        grad(y)
    assert len(calls) == 2  # the primal's trace, and jax.jvp's: each once


def test_derivatives_off_differentiate_the_residual():
    pf = pejit(filter_custom_vjp, constant_argnums=0, fold_options=FoldOptions(derivatives=False))
    grad = jax.grad(lambda y: pf(B, y).sum())
    close(grad(Y0), jax.grad(lambda y: filter_custom_vjp(B, y).sum())(Y0))
    assert "lu" in primitive_names(jax.make_jaxpr(grad)(Y0))  # the backward rule's inverse, per call


def test_higher_derivatives_and_forward_mode():
    f = lambda B, y: jnp.tanh(jnp.linalg.solve(B, y)) ** 2  # noqa: E731
    pf = pejit(f, constant_argnums=0)
    close(jax.hessian(lambda y: pf(B, y).sum())(Y0), jax.hessian(lambda y: f(B, y).sum())(Y0))
    close(jax.jacfwd(lambda y: pf(B, y))(Y0), jax.jacfwd(lambda y: f(B, y))(Y0))
    close(jax.vmap(jax.grad(lambda y: pf(B, y).sum()))(jnp.stack([Y0, -Y0])),
          jax.vmap(jax.grad(lambda y: f(B, y).sum()))(jnp.stack([Y0, -Y0])))



@eqx.filter_custom_vjp
def _inv_apply_again(vjp_arg, a):  # the benchmark's (case 16): its rules factor a again
    return jnp.linalg.inv(a) @ vjp_arg


@_inv_apply_again.def_fwd
def _inv_apply_again_fwd(perturbed, vjp_arg, a):
    return _inv_apply_again(vjp_arg, a), None


@_inv_apply_again.def_bwd
def _inv_apply_again_bwd(res, g, perturbed, vjp_arg, a):
    return jnp.linalg.inv(a).T @ g


def test_a_folded_matrix_is_stored_once_not_beside_its_transpose():
    # the backward rule's inv(a).T @ g reads inv(B) through the product's dimension
    # numbers (issue 71): the residuals hold inv(B), and B for the rules, nothing more
    f = lambda B, y: _inv_apply_again(y, B)  # noqa: E731
    step = jax.grad(loss(f), argnums=1)
    pf = pejit(f, constant_argnums=0)
    close(jax.grad(lambda y: loss(pf)(B, y))(Y0), jax.grad(lambda y: loss(f)(B, y))(Y0))
    specs = [pejit(step, constant_argnums=0).specialize(B, Y0), *call_path(pf)._derivative().caches.specializations.values()]
    inv = np.linalg.inv(np.asarray(B))
    for spec in specs:
        consts = [np.asarray(c) for c in spec.consts]
        assert sum(c.nbytes for c in consts) == 2 * B.nbytes, [c.shape for c in consts]
        assert not any(np.allclose(c, inv.T, rtol=1e-4, atol=1e-5) for c in consts)
